package cluster

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"mesh/state"
)

// peerAs is how a client holding tlsID fares against the node at addr: the
// status of GET /v1/hello on the peer API, and whether a Raft connection
// stays open (a refused one is closed at once after its handshake).
func peerAs(t *testing.T, tlsID *nodeTLS, addr string) (hello int, raftOpen bool) {
	t.Helper()
	c := &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{TLSClientConfig: tlsID.clientConfig(alpnAPI)}}
	resp, err := c.Get("https://" + addr + "/v1/hello")
	if err != nil {
		t.Fatalf("hello: %v", err)
	}
	resp.Body.Close()
	conn, err := tls.DialWithDialer(&net.Dialer{Timeout: 5 * time.Second}, "tcp", addr, tlsID.clientConfig(alpnRaft))
	if err != nil {
		t.Fatalf("dial raft: %v", err)
	}
	defer conn.Close()
	conn.SetReadDeadline(time.Now().Add(time.Second))
	_, err = conn.Read(make([]byte, 1))
	var ne net.Error
	return resp.StatusCode, errors.As(err, &ne) && ne.Timeout()
}

// dialAs is a TLS handshake from client to a server that presents server's
// certificate.
func dialAs(t *testing.T, client, server *nodeTLS) error {
	t.Helper()
	ln, err := tls.Listen("tcp", "127.0.0.1:0", &tls.Config{
		MinVersion: tls.VersionTLS13, Certificates: []tls.Certificate{*server.current()}, NextProtos: []string{alpnAPI},
	})
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	go func() {
		if c, err := ln.Accept(); err == nil {
			c.(*tls.Conn).Handshake()
			c.Close()
		}
	}()
	conn, err := tls.DialWithDialer(&net.Dialer{Timeout: 5 * time.Second}, "tcp", ln.Addr().String(), client.clientConfig(alpnAPI))
	if err != nil {
		return err
	}
	return conn.Close()
}

// waitKey waits until the state records want as node name's certificate key.
func waitKey(t *testing.T, m *Member, name, want string) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for {
		n, err := m.Store.Node(context.Background(), name)
		if err == nil && n.CertKey == want {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s's certificate key in %s's replica: %q, want %q", name, m.ID.Name, n.CertKey, want)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// A certificate from the mesh CA under a node's name but with another key
// (what a voter since removed, which still holds the CA key, could sign) is
// refused by Raft and by the peer API once the node's key is recorded; the
// node's own certificate goes on working. A node that joins again, with a
// new key, is let in with that one, and its old one is refused.
//
// novox does not vote: it stops below, and with two voters ace would lose its
// quorum (and step down while novox joins again) whenever novox was promoted
// first.
func TestPinnedCertificateKey(t *testing.T) {
	ctx := context.Background()
	a, b := twoNodesVoting(t, 1)
	waitKey(t, a, "ace", CertKey(a.Node.tls.current().Leaf))
	waitKey(t, a, "novox", CertKey(b.Node.tls.current().Leaf))
	addr := fmt.Sprintf("127.0.0.1:%d", a.ID.Port)

	id, err := a.Store.Identity(ctx)
	if err != nil {
		t.Fatal(err)
	}
	caKey, _, err := a.Node.OpenIdentity(id)
	if err != nil {
		t.Fatal(err)
	}
	ca, err := ParseCA([]byte(id.CACert), []byte(caKey))
	if err != nil {
		t.Fatal(err)
	}
	forge := func(name, address string) *nodeTLS {
		keyPEM, csrPEM, err := NewKey(name, address)
		if err != nil {
			t.Fatal(err)
		}
		certPEM, err := ca.Sign(csrPEM, name, address)
		if err != nil {
			t.Fatal(err)
		}
		f := &nodeTLS{}
		f.trust.Store(a.Node.tls.trust.Load())
		c, err := f.pair(certPEM, keyPEM)
		if err != nil {
			t.Fatal(err)
		}
		f.cert.Store(c)
		return f
	}
	// novox's own certificate is taken by the peer API; Raft takes only
	// a voter's (novox votes not here: TestNonVoterCannotLead), ace's own.
	if hello, open := peerAs(t, b.Node.tls, addr); hello != http.StatusOK || open {
		t.Fatalf("novox's own certificate: hello %d, raft open %v (a non-voter)", hello, open)
	}
	if hello, open := peerAs(t, a.Node.tls, addr); hello != http.StatusOK || !open {
		t.Fatalf("ace's own certificate: hello %d, raft open %v", hello, open)
	}
	forged := forge("novox", "127.0.0.2")
	if hello, open := peerAs(t, forged, addr); hello != http.StatusForbidden || open {
		t.Fatalf("a certificate for novox with another key: hello %d, raft open %v", hello, open)
	}
	// A voter's name with another key is refused by Raft too (novox's
	// refusal above is also a non-voter's).
	if hello, open := peerAs(t, forge("ace", "127.0.0.1"), addr); hello != http.StatusForbidden || open {
		t.Fatalf("a certificate for ace with another key: hello %d, raft open %v", hello, open)
	}
	// And ace, dialling what poses as novox, refuses its certificate.
	if err := dialAs(t, a.Node.tls, b.Node.tls); err != nil {
		t.Fatalf("ace dialling novox: %v", err)
	}
	if err := dialAs(t, a.Node.tls, forged); err == nil || !strings.Contains(err.Error(), "not the one the mesh recorded") {
		t.Fatalf("ace dialling a server with a certificate for novox with another key: %v", err)
	}

	// novox loses its data dir and joins again, with a new key. (It ran:
	// the leader heard from it.)
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		if _, ok := a.Node.Seen()["novox"]; ok {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the leader never heard from novox")
		}
	}
	b.Stop()
	oldTLS := &nodeTLS{} // its certificate, without its stopped node's checks
	oldTLS.trust.Store(b.Node.tls.trust.Load())
	oldTLS.cert.Store(b.Node.tls.current())
	token := joinToken(t, a)
	dir := filepath.Join(t.TempDir(), "novox-again")
	// Without --replace the name of a node that ran is refused.
	if err := Join(ctx, JoinConfig{DataDir: filepath.Join(t.TempDir(), "novox-taken"), Peer: addr, Token: token, Name: "novox", Address: "127.0.0.2", Port: freePort(t)}); err == nil || !strings.Contains(err.Error(), "already in the mesh") || !strings.Contains(err.Error(), "--replace") {
		t.Fatalf("a join under the name of a node that ran: %v", err)
	}
	if err := Join(ctx, JoinConfig{DataDir: dir, Peer: addr, Token: token, Name: "novox", Address: "127.0.0.2", Port: freePort(t), Replace: true}); err != nil {
		t.Fatal(err)
	}
	newTLS, err := loadNodeTLS(dir)
	if err != nil {
		t.Fatal(err)
	}
	waitKey(t, a, "novox", CertKey(newTLS.current().Leaf))
	b2 := startAgent(t, dir)
	t.Cleanup(func() { b2.Stop() })
	// Until novox hears from the leader, a write says no leader is
	// reachable (within LeaderWait); under load that can outlast one wait.
	wctx, cancel := context.WithTimeout(ctx, 20*time.Second)
	defer cancel()
	for {
		_, err := b2.Node.Propose(wctx, addModule(t, "again.yaml", "module: again\n"))
		if err == nil {
			break
		}
		if !strings.Contains(err.Error(), "no leader is reachable") || wctx.Err() != nil {
			t.Fatalf("a write from novox after it joined again: %v", err)
		}
	}
	if hello, _ := peerAs(t, oldTLS, addr); hello != http.StatusForbidden {
		t.Fatalf("novox's certificate from before it joined again: hello %d", hello)
	}
	// The leader renews a certificate only for the key recorded.
	_, otherCSR, err := NewKey("novox", "127.0.0.2")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := a.Node.signRenewal(ctx, "novox", otherCSR); err == nil || !strings.Contains(err.Error(), "must be for the key recorded") {
		t.Fatalf("a renewal for novox with another key: %v", err)
	}
	keyPEM, err := os.ReadFile(filepath.Join(dir, KeyFile))
	if err != nil {
		t.Fatal(err)
	}
	ownCSR, err := csrFor(keyPEM, "novox", "127.0.0.2")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := a.Node.signRenewal(ctx, "novox", ownCSR); err != nil {
		t.Fatalf("a renewal for novox's own key: %v", err)
	}
}

// A certificate key goes into the log only through a leader known to apply
// it (an older leader would append it and stop every node of its binary),
// and never for a joiner that says it runs an older format.
func TestKeyWaitsForTheLeader(t *testing.T) {
	a, b := twoNodes(t)
	waitKey(t, a, "novox", CertKey(b.Node.tls.current().Leaf))
	c := state.NewCommand(&state.NodeCertRequest{Node: "novox", Expires: time.Now(), Key: CertKey(b.Node.tls.current().Leaf)})
	if !a.Node.keyMayGo(c, "", 0) {
		t.Fatal("the leader, which applies it, may not propose a key")
	}
	if a.Node.keyMayGo(c, "newbie", c.NeedsVersion()-1) {
		t.Fatal("a key went for a joiner of an older format")
	}
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		if _, id := b.Node.raft.LeaderWithID(); id == "ace" {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("novox does not know its leader")
		}
	}
	// What novox heard from ace, as its probe records it (the probe may
	// record ace's real hello meanwhile: then the case is tried again).
	set := func(s *Seen) {
		b.Node.live.mu.Lock()
		if s == nil {
			delete(b.Node.live.seen, "ace")
		} else {
			b.Node.live.seen["ace"] = *s
		}
		b.Node.live.mu.Unlock()
	}
	still := func(s *Seen) bool {
		b.Node.live.mu.Lock()
		defer b.Node.live.mu.Unlock()
		got, ok := b.Node.live.seen["ace"]
		return s == nil && !ok || s != nil && ok && got == *s
	}
	older := &Seen{LastSeen: time.Now(), Version: "older", Commands: c.NeedsVersion() - 1}
	for _, s := range []*Seen{older, nil} {
		for try := 0; ; try++ {
			set(s)
			may := b.Node.keyMayGo(c, "", 0)
			if still(s) {
				if may {
					t.Fatalf("a follower may propose a key through a leader it heard %+v from", s)
				}
				break
			}
			if try == 10 {
				t.Fatal("the probe keeps overwriting what novox heard")
			}
		}
	}
	set(&Seen{LastSeen: time.Now(), Version: "this", Commands: state.CommandVersion})
	if !b.Node.keyMayGo(c, "", 0) {
		t.Fatal("a follower may not propose a key through a leader of this format")
	}
}
