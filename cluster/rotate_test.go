package cluster

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"testing"
	"time"

	"mesh/state"
)

// accepted says whether the peer at addr takes id's certificate: its API
// answers a hello, and a Raft connection stays open.
func accepted(id *nodeTLS, addr string) bool {
	c := &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{TLSClientConfig: id.clientConfig(alpnAPI)}}
	resp, err := c.Get("https://" + addr + "/v1/hello")
	if err != nil {
		return false
	}
	resp.Body.Close()
	conn, err := tls.DialWithDialer(&net.Dialer{Timeout: 5 * time.Second}, "tcp", addr, id.clientConfig(alpnRaft))
	if err != nil {
		return false
	}
	defer conn.Close()
	conn.SetReadDeadline(time.Now().Add(time.Second))
	_, err = conn.Read(make([]byte, 1))
	ne, timeout := err.(net.Error)
	return resp.StatusCode == http.StatusOK && timeout && ne.Timeout()
}

// A rotation of the CA under a stream of writes: every write lands, every
// node renews its certificate under the new CA and the rotation ends by
// itself; then a certificate of the old CA, for a node's own key and name,
// which every node took before, is refused by every node, and the new
// CA's is what a token pins.
func TestCARotationEndsAndRefusesTheOldCA(t *testing.T) {
	ctx := context.Background()
	a, b := twoNodes(t)
	waitKey(t, a, "novox", CertKey(b.Node.tls.current().Leaf))
	waitVoter(t, a, "novox") // its Raft connection is taken (a voter's only)
	id, _ := a.Store.Identity(ctx)
	oldKey, _, err := a.Node.OpenIdentity(id)
	if err != nil {
		t.Fatal(err)
	}
	oldCA, err := ParseCA([]byte(id.CACert), []byte(oldKey))
	if err != nil {
		t.Fatal(err)
	}
	// What a voter since removed could still sign: novox's own key and
	// name, under the old CA.
	keyPEM, err := os.ReadFile(filepath.Join(b.Node.cfg.TLSDir, KeyFile))
	if err != nil {
		t.Fatal(err)
	}
	csr, err := csrFor(keyPEM, "novox", "127.0.0.2")
	if err != nil {
		t.Fatal(err)
	}
	certPEM, err := oldCA.Sign(csr, "novox", "127.0.0.2")
	if err != nil {
		t.Fatal(err)
	}
	addrA := fmt.Sprintf("127.0.0.1:%d", a.ID.Port)
	old := func() *nodeTLS {
		now, _ := a.Store.Identity(ctx)
		f := &nodeTLS{}
		ts, err := newTrust(append(trustOf(now), []byte(id.CACert))...)
		if err != nil {
			t.Fatal(err)
		}
		f.trust.Store(ts)
		c, err := f.pair(certPEM, keyPEM)
		if err != nil {
			t.Fatal(err)
		}
		f.cert.Store(c)
		return f
	}
	if !accepted(old(), addrA) {
		t.Fatal("before the rotation, novox's certificate of the mesh's CA is refused")
	}

	stop := make(chan struct{})
	done := make(chan int)
	go func() {
		n := 0
		for i := 0; ; i++ {
			select {
			case <-stop:
				done <- n
				return
			default:
			}
			if _, err := b.Node.Propose(ctx, addModule(t, "w.yaml", fmt.Sprintf("module: w%d\n", i))); err != nil {
				t.Errorf("write %d during the rotation: %v", i, err)
			}
			n++
		}
	}()
	if _, err := a.Node.RotateCA(ctx, "test"); err != nil {
		t.Fatal(err)
	}
	if _, err := a.Node.RotateCA(ctx, "test"); err == nil {
		t.Error("a second rotation was let start while one is under way")
	}
	var now state.Identity
	deadline := time.Now().Add(30 * time.Second)
	for {
		now, _ = a.Store.Identity(ctx)
		nb, _ := b.Store.Identity(ctx)
		if now.CANextCert == "" && now.CACert != id.CACert && nb.CACert == now.CACert {
			break
		}
		if time.Now().After(deadline) {
			c, _ := a.Store.CA(ctx)
			t.Fatalf("the rotation did not end within 30s: %s", c)
		}
		time.Sleep(50 * time.Millisecond)
	}
	close(stop)
	writes := <-done
	for _, m := range []*Member{a, b} {
		if got := m.Node.certCA(m.Node.tls.current().Leaf); got != state.CertDigest(now.CACert) {
			t.Fatalf("%s's certificate is of CA %q, not the new one", m.ID.Name, got)
		}
		eventually(t, 10*time.Second, m.ID.Name+" trusts the new CA alone", func() bool {
			return len(m.Node.tls.trust.Load().cas) == 1 && state.CertDigest(string(m.Node.tls.caPEM())) == state.CertDigest(now.CACert)
		})
		if f, _ := os.ReadFile(filepath.Join(m.Node.cfg.TLSDir, CAFile)); state.CertDigest(string(f)) != state.CertDigest(now.CACert) {
			t.Fatalf("%s's CA file is not the new CA", m.ID.Name)
		}
	}
	if accepted(old(), addrA) {
		t.Fatal("after the rotation, a certificate of the old CA is taken")
	}
	// The nodes still talk (their renewed certificates), and a write lands.
	if _, err := b.Node.Propose(ctx, addModule(t, "after.yaml", "module: after\n")); err != nil {
		t.Fatalf("a write after the rotation: %v", err)
	}
	t.Logf("%d writes during the rotation", writes)
}

func eventually(t *testing.T, within time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(within)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("%s: not within %s", what, within)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// A CA certificate with a third of its life left is rotated by the leader
// by itself, long before it expires; one with more is not.
func TestLeaderRotatesAnAgeingCA(t *testing.T) {
	now := time.Now()
	young := &x509.Certificate{NotBefore: now.Add(-time.Hour), NotAfter: now.Add(20 * 365 * 24 * time.Hour)}
	old := &x509.Certificate{NotBefore: now.Add(-15 * 365 * 24 * time.Hour), NotAfter: now.Add(5 * 365 * 24 * time.Hour)}
	if caRenewDue(young, now) || !caRenewDue(old, now) {
		t.Fatalf("due: young %v, old %v", caRenewDue(young, now), caRenewDue(old, now))
	}
	// A mesh whose CA lives an hour and a minute (backdated an hour): a
	// third of that is left from the start. (Restored after the agent
	// stopped: cleanups run last first.)
	t.Cleanup(func() { testCALife.Store(0); testCACheck.Store(0) })
	testCALife.Store(int64(time.Minute))
	testCACheck.Store(int64(100 * time.Millisecond))
	a, _ := leadingAgent(t)
	ctx := context.Background()
	first, _ := a.Store.Identity(ctx)
	eventually(t, 20*time.Second, "the leader rotated the ageing CA", func() bool {
		c, _ := a.Store.CA(ctx)
		return c.RotatedAt != "" && c.Digest != state.CertDigest(first.CACert)
	})
}

// A node that was down when a rotation started (its CA file trusts the old
// CA alone) comes back: it verifies the others' certificates of the new CA
// through the cross certificate they present, catches up, renews, and the
// rotation ends.
func TestNodeDownAtRotationStartCatchesUp(t *testing.T) {
	ctx := context.Background()
	nodes, dirs := threeMembers(t)
	defer func() {
		for _, m := range nodes {
			if m != nil {
				m.Stop()
			}
		}
	}()
	a := nodes["ace"]
	eventually(t, 30*time.Second, "three voters", func() bool { v, _ := a.Node.Voters(); return v == 3 })
	nodes["g14"].Stop()
	nodes["g14"] = nil
	if _, err := a.Node.RotateCA(ctx, "test"); err != nil {
		t.Fatal(err)
	}
	eventually(t, 30*time.Second, "ace and novox renewed, the rotation waits for g14", func() bool {
		c, _ := a.Store.CA(ctx)
		return len(c.Renewed) == 2 && len(c.Waiting) == 1 && c.Waiting[0] == "g14"
	})
	if f, _ := os.ReadFile(filepath.Join(dirs["g14"], CAFile)); len(f) == 0 || bytes.Count(f, []byte("BEGIN CERTIFICATE")) != 1 {
		t.Fatalf("g14's CA file should hold the old CA alone:\n%s", f)
	}
	nodes["g14"] = startAgent(t, dirs["g14"])
	g := nodes["g14"]
	eventually(t, 30*time.Second, "the rotation ended, with g14 renewed", func() bool {
		ida, _ := a.Store.Identity(ctx)
		idg, _ := g.Store.Identity(ctx)
		return ida.CANextCert == "" && idg.CACert == ida.CACert && g.Node.certCA(g.Node.tls.current().Leaf) == state.CertDigest(ida.CACert)
	})
	if _, err := g.Node.Propose(ctx, addModule(t, "g.yaml", "module: afterg\n")); err != nil {
		t.Fatalf("a write from g14 after the rotation: %v", err)
	}
}
