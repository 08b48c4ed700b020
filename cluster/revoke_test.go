package cluster

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/hashicorp/raft"

	"mesh/internal/seal"
	"mesh/internal/wgkey"
	"mesh/state"
)

// raftClient is a Raft transport that dials with id's certificate: what a
// node's own Raft sends its peers.
type raftClient struct {
	id   *nodeTLS
	stop chan struct{}
}

func (c *raftClient) Dial(address raft.ServerAddress, timeout time.Duration) (net.Conn, error) {
	return tls.DialWithDialer(&net.Dialer{Timeout: timeout}, "tcp", string(address), c.id.clientConfig(alpnRaft))
}
func (c *raftClient) Accept() (net.Conn, error) { <-c.stop; return nil, net.ErrClosed }
func (c *raftClient) Close() error              { return nil }
func (c *raftClient) Addr() net.Addr            { return &net.TCPAddr{IP: net.IPv4(127, 0, 0, 2), Port: 1} }

// raftAs is a Raft transport that sends with from's certificate (kept
// after from stops), and the address of to's Raft.
func raftAs(t *testing.T, from, to *Member) (*raft.NetworkTransport, raft.ServerAddress) {
	id := &nodeTLS{}
	id.trust.Store(from.Node.tls.trust.Load())
	id.cert.Store(from.Node.tls.current())
	stop := make(chan struct{})
	trans := raft.NewNetworkTransport(&raftClient{id: id, stop: stop}, 1, 5*time.Second, nil)
	t.Cleanup(func() { trans.Close(); close(stop) })
	return trans, raft.ServerAddress(net.JoinHostPort("127.0.0.1", strconv.Itoa(to.ID.Port)))
}

// A node removed from the mesh is refused by Raft from then on: not only
// on the connections it opens afterwards, but on the one it held open
// since before its removal, over which it could otherwise go on sending
// Raft's RPCs (an AppendEntries of a newer term deposes the leader and
// writes entries into its log; Raft itself does not ask who leads).
func TestRemovedNodeLosesItsRaftConnections(t *testing.T) {
	ctx := context.Background()
	// novox a voter (a non-voter's Raft connections are refused anyway:
	// TestNonVoterCannotLead), of three, so that two remove it.
	nodes, _ := threeMembers(t)
	for _, m := range nodes {
		defer m.Stop()
	}
	a, b := nodes["ace"], nodes["novox"]
	waitKey(t, a, "novox", CertKey(b.Node.tls.current().Leaf))
	waitVoter(t, a, "novox")
	b.Stop()
	trans, target := raftAs(t, b, a) // novox's certificate, as a machine that keeps it
	// A harmless RPC (of an old term) while novox is a node: its connection
	// is kept for the next.
	var resp raft.AppendEntriesResponse
	if err := trans.AppendEntries("ace", target, &raft.AppendEntriesRequest{RPCHeader: raft.RPCHeader{ProtocolVersion: raft.ProtocolVersionMax, ID: []byte("novox"), Addr: []byte("127.0.0.2:1")}}, &resp); err != nil {
		t.Fatalf("an RPC from novox while it is a node: %v", err)
	}

	if _, err := a.Node.RemoveNode(ctx, "novox", false); err != nil {
		t.Fatal(err)
	}
	if _, err := a.Store.Node(ctx, "novox"); !errors.Is(err, state.ErrNotFound) {
		t.Fatalf("novox after its removal: %v", err)
	}
	// The recheck runs on the change (at most five a second): wait until
	// ace holds no Raft connection of novox's, then send over the one
	// novox still has (its side does not know it was closed).
	deadline := time.Now().Add(10 * time.Second)
	for a.Node.mux.holdsRaftConnOf("novox") {
		if time.Now().After(deadline) {
			t.Fatal("ace still holds novox's Raft connection 10 s after its removal")
		}
		time.Sleep(20 * time.Millisecond)
	}

	term, _ := strconv.ParseUint(a.Node.Stats()["term"], 10, 64)
	req := &raft.AppendEntriesRequest{RPCHeader: raft.RPCHeader{ProtocolVersion: raft.ProtocolVersionMax, ID: []byte("novox"), Addr: []byte("127.0.0.2:1")}, Term: term + 1}
	err := trans.AppendEntries("ace", target, req, &resp)
	if err == nil {
		t.Fatalf("removed novox's Raft RPC was taken over the connection it held (ace answered term %d, was %d; ace is now %s)", resp.Term, term, a.Node.State())
	}
}

// waitVoter waits until name is a voter of m's Raft configuration: only a
// voter's Raft connection is taken (mux.mayLead).
func waitVoter(t *testing.T, m *Member, name string) {
	t.Helper()
	eventually(t, 20*time.Second, name+" is a voter of "+m.ID.Name+"'s configuration", func() bool {
		return isVoter(m.Node.raft.GetConfiguration().Configuration(), name)
	})
}

// holdsRaftConnOf says whether m holds a Raft connection of node name.
func (m *mux) holdsRaftConnOf(name string) bool {
	m.raftMu.Lock()
	defer m.raftMu.Unlock()
	for c := range m.raftConns {
		if c.name == name {
			return true
		}
	}
	return false
}

// A join whose token is rotated under it is refused: the leader checks the
// secret against what the mesh committed (after its barrier), not only
// against what its replica held when the request came. A leader just
// elected may not have applied a rotation its predecessor acknowledged;
// here the rotation commits between the first check and the barrier.
func TestJoinRefusedWhenTheTokenIsRotatedUnderIt(t *testing.T) {
	ctx := context.Background()
	a, _ := leadingAgent(t)
	old := joinToken(t, a)
	rotated := false
	admitTokenChecked = func() {
		if rotated {
			return
		}
		rotated = true
		keys, err := a.Store.VoterKeys(ctx)
		if err != nil {
			t.Error(err)
			return
		}
		sealed, err := a.Node.SealToVoters(seal.NewSecret(), keys)
		if err != nil {
			t.Error(err)
			return
		}
		if _, err := a.Node.Propose(ctx, &state.TokenRotateRequest{Sealed: sealed}); err != nil {
			t.Error(err)
		}
	}
	defer func() { admitTokenChecked = nil }()
	err := Join(ctx, JoinConfig{DataDir: filepath.Join(t.TempDir(), "novox"), Peer: fmt.Sprintf("127.0.0.1:%d", a.ID.Port), Token: old, Name: "novox", Address: "127.0.0.2", Port: freePort(t)})
	if !rotated {
		t.Fatal("the token was not rotated under the join")
	}
	if err == nil || !strings.Contains(err.Error(), "secret is not valid") {
		t.Fatalf("a join with a token rotated under it: %v, want it refused", err)
	}
	if _, err := a.Store.Node(ctx, "novox"); !errors.Is(err, state.ErrNotFound) {
		t.Fatalf("novox in the state after a join with a rotated token: %v", err)
	}
}

// A machine whose place as a voter another takes (mesh join --replace) is
// refused from then on, and with it the join secret it held: it does not
// join again with it, under any name. The state names the new machine's
// sealing key, and the new join secret is not sealed to the old one's.
func TestReplacedVoterLosesTheJoinSecret(t *testing.T) {
	ctx := context.Background()
	a, b, old := voterToReplace(t)
	oldSeal := b.Node.seal
	b.Stop()
	peer := fmt.Sprintf("127.0.0.1:%d", a.ID.Port)
	dir := filepath.Join(t.TempDir(), "novox-again")
	if err := Join(ctx, JoinConfig{DataDir: dir, Peer: peer, Token: old, Name: "novox", Address: "127.0.0.2", Port: freePort(t), Replace: true}); err != nil {
		t.Fatal(err)
	}
	newSeal, err := seal.LoadOrCreate(dir)
	if err != nil {
		t.Fatal(err)
	}
	if nd, err := a.Store.Node(ctx, "novox"); err != nil || nd.SealKey != newSeal.Recipient() {
		t.Errorf("novox's sealing key in the state after its place was taken: %q (%v), want the new machine's %q", nd.SealKey, err, newSeal.Recipient())
	}
	// Its overlay key too, at once: every node takes only it for novox's
	// overlay address (the replaced machine's key is no longer a peer).
	newWG, err := wgkey.LoadOrCreate(dir)
	if err != nil {
		t.Fatal(err)
	}
	if nd, err := a.Store.Node(ctx, "novox"); err != nil || nd.OverlayKey != newWG.Public() {
		t.Errorf("novox's overlay key in the state after its place was taken: %q (%v), want the new machine's %q", nd.OverlayKey, err, newWG.Public())
	}
	// The old machine, with the token of the secret it held.
	err = Join(ctx, JoinConfig{DataDir: filepath.Join(t.TempDir(), "evil"), Peer: peer, Token: old, Name: "evil", Address: "127.0.0.9", Port: freePort(t)})
	if err == nil || !strings.Contains(err.Error(), "secret is not valid") {
		t.Fatalf("a join with the join secret the replaced voter held: %v, want it refused", err)
	}
	id, err := a.Store.Identity(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := oldSeal.Open(id.JoinSecretSealed); err == nil {
		t.Error("the replaced machine's key opens the new join secret")
	}
}

// A voter's place is not taken while a node of the mesh cannot record the
// new machine's sealing key: the state would keep naming the replaced
// machine's, and the voters would seal the CA key and the join secret to
// it again. The join is refused with nothing changed (no key, no join
// secret, Raft as it was), and goes through once that node runs a binary
// that can; the replaced node's own binary is not held against it.
func TestReplaceWaitsForEveryNodeToRecordTheKey(t *testing.T) {
	ctx := context.Background()
	a, b, old := voterToReplace(t)
	if _, err := a.Node.Propose(ctx, &state.NodeAddRequest{Node: state.Node{Name: "old", Address: "10.9.9.9"}}); err != nil {
		t.Fatal(err)
	}
	key0Format := state.NewCommand(&state.NodeKeyRequest{Node: "novox", SealKey: "x"}).NeedsVersion()
	a.Node.live.mu.Lock()
	a.Node.live.seen["old"] = Seen{LastSeen: time.Now(), Version: "v0.4", Commands: key0Format - 1}
	a.Node.live.seen["novox"] = Seen{LastSeen: time.Now(), Version: "v0.4", Commands: key0Format - 1}
	a.Node.live.mu.Unlock()
	before, err := a.Store.Node(ctx, "novox")
	if err != nil {
		t.Fatal(err)
	}
	idBefore, err := a.Store.Identity(ctx)
	if err != nil {
		t.Fatal(err)
	}
	b.Stop()
	peer := fmt.Sprintf("127.0.0.1:%d", a.ID.Port)
	join := func(dir string) error {
		return Join(ctx, JoinConfig{DataDir: dir, Peer: peer, Token: old, Name: "novox", Address: "127.0.0.2", Port: freePort(t), Replace: true})
	}
	err = join(filepath.Join(t.TempDir(), "novox-again"))
	if err == nil || !strings.Contains(err.Error(), "cannot take novox's place yet") || !strings.Contains(err.Error(), "upgrade old first") {
		t.Fatalf("a voter's place taken while node old cannot record the new key: %v", err)
	}
	if nd, err := a.Store.Node(ctx, "novox"); err != nil || nd.SealKey != before.SealKey {
		t.Errorf("novox's sealing key after a refused replace: %q (%v), was %q", nd.SealKey, err, before.SealKey)
	}
	if id, err := a.Store.Identity(ctx); err != nil || id.JoinSecretSealed != idBefore.JoinSecretSealed {
		t.Errorf("the join secret changed with a refused replace (%v)", err)
	}
	// What the replaced machine said of its binary still holds: the leader
	// goes on refusing what that machine cannot apply, should it come back.
	if s := a.Node.Seen()["novox"]; s.Commands != key0Format-1 {
		t.Errorf("novox's binary after a refused replace: format %d, want the %d it said", s.Commands, key0Format-1)
	}
	// Once old runs a binary that records keys, the place is taken (novox's
	// own older binary, seen before it stopped, is not held against it).
	a.Node.live.mu.Lock()
	a.Node.live.seen["old"] = Seen{LastSeen: time.Now(), Version: "v0.5", Commands: state.CommandVersion}
	a.Node.live.mu.Unlock()
	dir := filepath.Join(t.TempDir(), "novox-third")
	if err := join(dir); err != nil {
		t.Fatalf("the replace once old can record keys: %v", err)
	}
	newSeal, err := seal.LoadOrCreate(dir)
	if err != nil {
		t.Fatal(err)
	}
	if nd, err := a.Store.Node(ctx, "novox"); err != nil || nd.SealKey != newSeal.Recipient() {
		t.Errorf("novox's sealing key after its place was taken: %q (%v), want the new machine's", nd.SealKey, err)
	}
}

// A non-voter is no leader: a Raft connection from one is refused while
// the voters lead, so its AppendEntries of a newer term neither deposes
// the leader nor writes into its log (Raft takes one from any sender).
// Once no voter has led for leaderlessGrace, a node takes it: its own
// configuration may be stale (a non-voter promoted while it was cut off).
func TestNonVoterCannotLead(t *testing.T) {
	a, b := twoNodesVoting(t, 1)
	waitKey(t, a, "novox", CertKey(b.Node.tls.current().Leaf))
	trans, target := raftAs(t, b, a) // novox's certificate, current and recorded

	term := a.Node.Stats()["term"]
	n, _ := strconv.ParseUint(term, 10, 64)
	req := &raft.AppendEntriesRequest{RPCHeader: raft.RPCHeader{ProtocolVersion: raft.ProtocolVersionMax, ID: []byte("novox"), Addr: []byte("127.0.0.2:1")}, Term: n + 1}
	var resp raft.AppendEntriesResponse
	if err := trans.AppendEntries("ace", target, req, &resp); err == nil {
		t.Errorf("non-voter novox's AppendEntries of a newer term was taken (ace answered term %d, was %s)", resp.Term, term)
	}
	if st, now := a.Node.State(), a.Node.Stats()["term"]; st != raft.Leader.String() || now != term {
		t.Fatalf("ace after novox's AppendEntries: %s at term %s (was leader at %s)", st, now, term)
	}

	m := a.Node.mux
	if !m.mayLead("ace") || m.mayLead("novox") || m.mayLead("nobody") {
		t.Errorf("while ace leads: ace %v, novox %v, a name not configured %v; want only the voter", m.mayLead("ace"), m.mayLead("novox"), m.mayLead("nobody"))
	}
	m.led.Store(int64(time.Since(m.start) - leaderlessGrace - time.Second))
	if !m.mayLead("novox") {
		t.Error("after leaderlessGrace without a voter leading, novox is still refused (a stale configuration would never catch up)")
	}
}

// A peer's hello is read up to maxHello: a value longer than that is no
// hello, not a buffer of whatever the peer sends.
func TestHelloIsBounded(t *testing.T) {
	if h, err := readHello(strings.NewReader(`{"name":"novox","version":"v1"}`)); err != nil || h.Name != "novox" {
		t.Fatalf("a hello: %+v %v", h, err)
	}
	huge := io.MultiReader(strings.NewReader(`{"name":"`), io.LimitReader(neverEnding('a'), 1<<30), strings.NewReader(`"}`))
	if _, err := readHello(huge); err == nil {
		t.Fatal("a hello of 1 GB was taken")
	}
}

type neverEnding byte

func (b neverEnding) Read(p []byte) (int, error) {
	for i := range p {
		p[i] = byte(b)
	}
	return len(p), nil
}

// A stream of the peer API's /v1/op/ (mesh logs -f, mesh exec) ends when
// the node that opened it is removed: its member check was made once, at
// the request, and a removed node went on reading or running in any
// container. A change that leaves it a node does not end it.
func TestOperateStreamEndsWithItsNode(t *testing.T) {
	ctx := context.Background()
	a, b := twoNodesVoting(t, 1)
	waitKey(t, a, "novox", CertKey(b.Node.tls.current().Leaf))
	started, ended := make(chan struct{}), make(chan struct{})
	a.Node.SetOperate(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.WriteHeader(http.StatusOK)
		w.(http.Flusher).Flush()
		close(started)
		<-r.Context().Done()
		close(ended)
	}))
	client := &http.Client{Transport: &http.Transport{TLSClientConfig: b.Node.tls.clientConfig(alpnAPI)}}
	reqCtx, cancelReq := context.WithCancel(ctx)
	defer cancelReq()
	req, _ := http.NewRequestWithContext(reqCtx, http.MethodGet, fmt.Sprintf("https://127.0.0.1:%d/v1/op/stream", a.ID.Port), nil)
	go func() {
		if resp, err := client.Do(req); err == nil {
			io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
		}
	}()
	select {
	case <-started:
	case <-time.After(10 * time.Second):
		t.Fatal("novox's stream did not start")
	}
	// A change of the replica that leaves novox a node.
	if _, err := a.Node.Propose(ctx, addModule(t, "other.yaml", "module: other\n")); err != nil {
		t.Fatal(err)
	}
	select {
	case <-ended:
		t.Fatal("novox's stream ended at a change that left it a node")
	case <-time.After(300 * time.Millisecond):
	}
	b.Stop()
	if _, err := a.Node.RemoveNode(ctx, "novox", false); err != nil {
		t.Fatal(err)
	}
	select {
	case <-ended:
	case <-time.After(10 * time.Second):
		t.Fatal("novox's stream went on 10 s after novox was removed")
	}
}

// Raft dials a node's address and takes only that node there: another
// member's certificate, however valid, is refused (it would acknowledge
// entries in that node's place).
func TestRaftDialTakesOnlyTheNodeThere(t *testing.T) {
	a, b := twoNodesVoting(t, 1)
	waitKey(t, a, "novox", CertKey(b.Node.tls.current().Leaf))
	at := net.JoinHostPort(b.ID.Address, strconv.Itoa(b.ID.Port))
	b.Stop()
	// What answers at novox's address shows ace's certificate (a node of
	// the mesh, its key recorded) instead of novox's.
	serveAs(t, a, at, alpnRaft, func(c *tls.Conn) { c.Handshake(); io.Copy(io.Discard, c) })
	sl := &streamLayer{m: a.Node.mux, nodeAt: nodeAt(a.Store)}
	c, err := sl.Dial(raft.ServerAddress(at), 5*time.Second)
	if err == nil {
		c.Close()
		t.Fatal("a dial of novox's address took ace's certificate")
	}
	if !strings.Contains(err.Error(), "answered as ace, not as novox") {
		t.Fatalf("a dial of novox's address answered by ace: %v", err)
	}
	// The node there is taken: ace, at its own address.
	c, err = sl.Dial(raft.ServerAddress(net.JoinHostPort(a.ID.Address, strconv.Itoa(a.ID.Port))), 5*time.Second)
	if err != nil {
		t.Fatalf("a dial of ace's address, where ace answers: %v", err)
	}
	c.Close()
}

// A Raft connection taken on the CA's word alone (this node's replica
// empty: it just joined) is left to its certificate's checks by recheck
// until the replica holds this node's join (caughtUp): the replica that
// fills from it names its peer only once it has caught up to that peer's
// own join. From then on it is checked as any other: one taken by a
// removed node that raced the real leader would otherwise be kept for as
// long as that node liked (a review). One taken from a known node that
// stops being one that may lead is closed.
func TestRecheckLeavesWhatTheCAVouchedFor(t *testing.T) {
	a, b := twoNodesVoting(t, 1)
	waitKey(t, a, "novox", CertKey(b.Node.tls.current().Leaf))
	// ace's checks, in a mux of the test's own (ace's runs its rechecks).
	var joined atomic.Bool
	m := &mux{tls: a.Node.mux.tls, member: a.Node.mux.member, log: a.Node.mux.log, start: time.Now(), caughtUp: joined.Load}
	m.raft.Store(a.Node.raft)
	m.markLed()
	certs := []*x509.Certificate{b.Node.tls.current().Leaf}
	if name, err := m.tls.verifyPeer(certs); err != nil || name != "novox" {
		t.Fatalf("novox's certificate: %q %v", name, err)
	}
	p1, q1 := net.Pipe()
	p2, q2 := net.Pipe()
	defer q1.Close()
	defer q2.Close()
	vouched := &raftConn{Conn: tls.Client(p1, &tls.Config{}), m: m, name: "novox", certs: certs, vouched: true}
	known := &raftConn{Conn: tls.Client(p2, &tls.Config{}), m: m, name: "novox", certs: certs}
	m.raftMu.Lock()
	if m.raftConns == nil {
		m.raftConns = map[*raftConn]struct{}{}
	}
	m.raftConns[vouched], m.raftConns[known] = struct{}{}, struct{}{}
	m.raftMu.Unlock()
	m.recheck() // novox is a non-voter while ace leads: it may not lead
	m.raftMu.Lock()
	_, keptVouched := m.raftConns[vouched]
	_, keptKnown := m.raftConns[known]
	m.raftMu.Unlock()
	if !keptVouched || keptKnown {
		t.Fatalf("after a recheck: the connection the CA vouched for kept %v (want true), the known node's kept %v (want false)", keptVouched, keptKnown)
	}
	joined.Store(true)
	m.recheck() // the replica holds this node's join: novox is checked
	m.raftMu.Lock()
	_, keptVouched = m.raftConns[vouched]
	m.raftMu.Unlock()
	if keptVouched {
		t.Fatal("the connection the CA vouched for was kept once the replica held this node's join, from a node that may not lead")
	}
}

// While a node's replica is empty (it just joined), it takes a Raft
// connection from the voters when it joined alone (JoinReply.Voters), not
// from any node the CA vouches for: a removed node's certificate stays
// valid, and a replica that knows no node cannot tell. A joiner through
// an older leader (no voters said) takes any, as before.
func TestEmptyReplicaTakesTheVotersItJoinedWith(t *testing.T) {
	nodes, dirs := threeMembers(t)
	for _, m := range nodes {
		defer m.Stop()
	}
	id, err := ReadIdentity(dirs["g14"])
	if err != nil || !slices.Equal(id.Vouch, []string{"ace"}) {
		t.Fatalf("g14's identity: vouch %v (%v), want the voters when it joined, [ace]", id.Vouch, err)
	}
	empty, err := state.Open(filepath.Join(t.TempDir(), "state.db"))
	if err != nil {
		t.Fatal(err)
	}
	defer empty.Close()
	novox, ace := nodes["novox"].Node.tls.current().Leaf, nodes["ace"].Node.tls.current().Leaf
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	soon := time.Now().Add(time.Hour)
	if member := replicaMember(empty, []string{"ace"}, soon, log); member("novox", novox) || !member("ace", ace) {
		t.Fatalf("an empty replica that joined with voter ace: takes novox %v (want false), ace %v (want true)", member("novox", novox), member("ace", ace))
	}
	if !replicaMember(empty, nil, soon, log)("novox", novox) {
		t.Fatal("an empty replica that joined through an older leader refuses novox")
	}
	// Still empty once the time is past (the voters it joined with are
	// gone, another leads): it takes what the CA vouches for.
	if !replicaMember(empty, []string{"ace"}, time.Now().Add(-time.Second), log)("novox", novox) {
		t.Fatal("an empty replica past its time with the voters it joined with refuses novox")
	}
	// A replica that holds nodes goes by their keys, whatever it joined with.
	waitKey(t, nodes["g14"], "novox", CertKey(novox))
	if full := replicaMember(nodes["g14"].Store, []string{"ace"}, soon, log); !full("novox", novox) || full("novox", ace) {
		t.Fatalf("g14's replica: novox with its certificate %v (want true), with ace's %v (want false)", full("novox", novox), full("novox", ace))
	}
}

// The peer API's client (writes forwarded to the leader, joins, renewals,
// hellos, exec and logs streams) dials a node's address and takes only
// that node there too: another member that took novox's address is sent
// nothing, not even the request's head, and the call fails as one that
// was not sent (safe to try again).
func TestPeerCallsTakeOnlyTheNodeThere(t *testing.T) {
	a, b := twoNodesVoting(t, 1)
	waitKey(t, a, "novox", CertKey(b.Node.tls.current().Leaf))
	at := net.JoinHostPort(b.ID.Address, strconv.Itoa(b.ID.Port))
	b.Stop()
	var got atomic.Int64
	served := make(chan struct{}, 16)
	serveAs(t, a, at, alpnAPI, func(c *tls.Conn) {
		c.SetDeadline(time.Now().Add(10 * time.Second))
		n, _ := io.Copy(io.Discard, c)
		got.Add(n)
		served <- struct{}{}
	})
	ctx := context.Background()
	var out applyReply
	err := a.Node.call(ctx, at, "/v1/apply", map[string]string{"value": "the operator's secret"}, &out)
	if err == nil || !strings.Contains(err.Error(), "answered as ace, not as novox") {
		t.Fatalf("a call to novox's address answered by ace: %v", err)
	}
	if !errors.Is(err, errNotSent) {
		t.Fatalf("a call refused at the handshake is not known as not sent: %v", err)
	}
	select {
	case <-served: // the connection the call made, and closed
	case <-time.After(10 * time.Second):
		t.Fatal("the call's connection to the member at novox's address did not end")
	}
	if n := got.Load(); n != 0 {
		t.Fatalf("the member at novox's address was sent %d bytes after the handshake", n)
	}
	// ace, at its own address, is called.
	req, _ := http.NewRequestWithContext(ctx, "GET", "https://"+net.JoinHostPort(a.ID.Address, strconv.Itoa(a.ID.Port))+"/v1/hello", nil)
	resp, err := a.Node.peers.Do(req)
	if err != nil {
		t.Fatalf("a hello to ace at its own address: %v", err)
	}
	resp.Body.Close()
}

// serveAs listens at address with as's certificate, offering proto, and
// hands each connection to serve (closed after it), until the test ends.
func serveAs(t *testing.T, as *Member, address, proto string, serve func(*tls.Conn)) {
	t.Helper()
	ln, err := tls.Listen("tcp", address, &tls.Config{MinVersion: tls.VersionTLS13, Certificates: []tls.Certificate{*as.Node.tls.current()}, NextProtos: []string{proto},
		ClientAuth: tls.RequireAnyClientCert})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() { serve(c.(*tls.Conn)); c.Close() }()
		}
	}()
}

// voterToReplace is three members, ace leading, its join token, and novox,
// a voter ace has heard from (its place to be taken).
func voterToReplace(t *testing.T) (a, b *Member, token string) {
	t.Helper()
	nodes, _ := threeMembers(t)
	for _, m := range nodes {
		t.Cleanup(func() { m.Stop() })
	}
	a, b = nodes["ace"], nodes["novox"]
	token = joinToken(t, a)
	eventually(t, 10*time.Second, "ace hears from novox", func() bool { _, ok := a.Node.Seen()["novox"]; return ok })
	return a, b, token
}

// A voter removed is refused with the join secret it held, whichever node
// asked: the leader replaces it, so a member that calls the peer API
// itself (not through a voter's mesh node remove) cannot remove a voter
// and leave the secret as it was.
func TestRemovedVoterLosesTheJoinSecretWhoeverAsks(t *testing.T) {
	ctx := context.Background()
	nodes, _ := threeMembers(t)
	for _, m := range nodes {
		t.Cleanup(func() { m.Stop() })
	}
	a, g := nodes["ace"], nodes["g14"]
	eventually(t, 20*time.Second, "novox and g14 are voters", func() bool {
		v, err1 := a.Store.Node(ctx, "novox")
		w, err2 := a.Store.Node(ctx, "g14")
		return err1 == nil && err2 == nil && v.Voter && w.Voter && a.Node.State() == "Leader"
	})
	old := joinToken(t, a)
	peer := fmt.Sprintf("127.0.0.1:%d", a.ID.Port)
	var rep removeReply
	if err := g.Node.call(ctx, peer, "/v1/members/remove", removeRequest{Name: "novox"}, &rep); err != nil || rep.Error != "" {
		t.Fatalf("g14 removes voter novox through the peer API: %v %s", err, rep.Error)
	}
	if !rep.Told || !rep.Voter || !rep.Rotated || rep.RotateError != "" || rep.Index == 0 {
		t.Fatalf("the leader's answer: %+v", rep)
	}
	err := Join(ctx, JoinConfig{DataDir: filepath.Join(t.TempDir(), "evil"), Peer: peer, Token: old, Name: "evil", Address: "127.0.0.9", Port: freePort(t)})
	if err == nil || !strings.Contains(err.Error(), "secret is not valid") {
		t.Fatalf("a join with the join secret removed voter novox held: %v, want it refused", err)
	}
}

// removeReply's JSON is the one of before it wrote applyReply's fields out
// (Removal and applyReply embedded), byte for byte, both ways: nodes of
// either side of that change ask each other for removals.
func TestRemoveReplyWireIsUnchanged(t *testing.T) {
	type before struct {
		Removal
		applyReply
	}
	for _, rm := range []Removal{
		{},
		{Index: 42, Voter: true, Rotated: true, Told: true},
		{Index: 7, Voter: true, RotateError: "no voter answered", Told: true},
	} {
		for _, e := range []applyReply{{Index: rm.Index}, {Index: rm.Index, Error: "node x left the state but not raft", Kind: "conflict"}} {
			old, err1 := json.Marshal(before{rm, e})
			now, err2 := json.Marshal(removeReply{Removal: rm, Index: e.Index, Error: e.Error, Kind: e.Kind})
			if err1 != nil || err2 != nil || string(old) != string(now) {
				t.Fatalf("removeReply's JSON: %s (%v), before: %s (%v)", now, err2, old, err1)
			}
			var got removeReply
			var back before
			if json.Unmarshal(old, &got) != nil || json.Unmarshal(now, &back) != nil {
				t.Fatalf("%s does not decode", now)
			}
			want := removeReply{Removal: rm, Index: e.Index, Error: e.Error, Kind: e.Kind}
			want.Removal.Index = 0 // not sent
			if got != want {
				t.Errorf("%s decoded: %+v, want %+v", old, got, want)
			}
			if back.applyReply != e || back.Voter != rm.Voter || back.Rotated != rm.Rotated || back.RotateError != rm.RotateError || back.Told != rm.Told {
				t.Errorf("%s decoded by a node of before: %+v", now, back)
			}
		}
	}
}

// In a mesh without the overlay (mesh init --overlay off), a machine takes
// a node's place as before: no overlay key is recorded (the state would
// refuse it), and nothing is half changed.
func TestReplaceWithoutTheOverlay(t *testing.T) {
	ctx := context.Background()
	dir := filepath.Join(t.TempDir(), "node")
	if err := Init(ctx, InitConfig{DataDir: dir, Name: "ace", Address: "127.0.0.1", Port: freePort(t), LogStore: LogStoreWAL, Overlay: state.OverlayOff}); err != nil {
		t.Fatal(err)
	}
	a := startAgent(t, dir)
	t.Cleanup(func() { a.Stop() })
	waitLeader(t, a)
	token := joinToken(t, a)
	peer := fmt.Sprintf("127.0.0.1:%d", a.ID.Port)
	first := filepath.Join(t.TempDir(), "novox")
	if err := Join(ctx, JoinConfig{DataDir: first, Peer: peer, Token: token, Name: "novox", Address: "127.0.0.2", Port: freePort(t)}); err != nil {
		t.Fatal(err)
	}
	b := startAgent(t, first)
	eventually(t, 10*time.Second, "ace hears from novox", func() bool { _, ok := a.Node.Seen()["novox"]; return ok })
	b.Stop()
	again := filepath.Join(t.TempDir(), "novox-again")
	if err := Join(ctx, JoinConfig{DataDir: again, Peer: peer, Token: token, Name: "novox", Address: "127.0.0.2", Port: freePort(t), Replace: true}); err != nil {
		t.Fatalf("join --replace in a mesh without the overlay: %v", err)
	}
	newSeal, err := seal.LoadOrCreate(again)
	if err != nil {
		t.Fatal(err)
	}
	if nd, err := a.Store.Node(ctx, "novox"); err != nil || nd.SealKey != newSeal.Recipient() {
		t.Errorf("novox's sealing key after its place was taken: %q (%v)", nd.SealKey, err)
	}
}
