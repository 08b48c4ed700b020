package cluster

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/hashicorp/raft"

	"mesh/internal/seal"
	"mesh/state"
)

// A node of the mesh may forward any operator's command, but not one that
// says, of another node, what only that node says of itself, nor one only
// a voter proposes. A non-voter
// that gave a voter a sealing key of its own would have the voters seal the
// CA key and the join secret to it (a non-voter holds neither); a report,
// an overlay key or a certificate key for another node are refused alike,
// and the state keeps what it had. Its own report still goes through.
func TestForwardedCommandsSpeakForTheirNode(t *testing.T) {
	a, b := twoNodesVoting(t, 1) // ace leads and votes; novox does not
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	// ace records its own certificate's key once it runs: read its keys
	// after that, or the comparison below sees that change.
	waitKey(t, a, "ace", CertKey(a.Node.tls.current().Leaf))
	before, err := a.Store.Node(ctx, "ace")
	if err != nil {
		t.Fatal(err)
	}
	if before.SealKey == "" {
		t.Fatal("ace has no sealing key in the state")
	}
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		if _, err := b.Node.leaderAddr(); err == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("novox knows no leader after 10 s")
		}
	}
	mine, err := seal.LoadOrCreate(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	for _, req := range []state.Request{
		&state.NodeKeyRequest{Node: "ace", SealKey: mine.Recipient()},
		&state.ReportRequest{Report: state.Report{Node: "ace", Version: 1, AppliedAt: time.Now()}},
		&state.NodeOverlayRequest{Node: "ace", Key: strings.Repeat("ab", 32), Endpoint: "127.0.0.2:51820", Prefix: state.DefaultOverlay},
		&state.NodeCertRequest{Node: "ace", Expires: time.Now().Add(time.Hour), Key: strings.Repeat("cd", 32)},
	} {
		c := state.NewCommand(req)
		c.Time = time.Now().UTC()
		_, err := b.Node.forward(ctx, c)
		if err == nil || !strings.Contains(err.Error(), "only a node says that of itself") {
			t.Errorf("novox forwarded a %s for ace: %v, want it refused", req.Op(), err)
		}
	}
	// What only a voter proposes: a node's admission (a voter of its own,
	// with its key), a new CA, a new join secret (which its maker knows),
	// the CA key or the join secret sealed again.
	for _, req := range []state.Request{
		&state.NodeAddRequest{Node: state.Node{Name: "ghost", Address: "127.0.0.9", Port: 9, Voter: true, SealKey: mine.Recipient()}},
		&state.CARotateRequest{NextCert: "x", NextKey: &state.VoterSecret{}},
		&state.SealRequest{JoinSecret: &state.VoterSecret{}},
		&state.TokenRotateRequest{Sealed: &state.VoterSecret{}},
	} {
		c := state.NewCommand(req)
		c.Time = time.Now().UTC()
		_, err := b.Node.forward(ctx, c)
		if err == nil || !strings.Contains(err.Error(), "only a voter does") {
			t.Errorf("novox forwarded a %s: %v, want it refused", req.Op(), err)
		}
	}
	if _, err := a.Store.Node(ctx, "ghost"); err == nil {
		t.Fatal("novox added a node")
	}
	after, err := a.Store.Node(ctx, "ace")
	if err != nil {
		t.Fatal(err)
	}
	if after.SealKey != before.SealKey || after.CertKey != before.CertKey || after.OverlayKey != before.OverlayKey {
		t.Fatalf("ace's keys changed: sealing %q -> %q, certificate %q -> %q, overlay %q -> %q", before.SealKey, after.SealKey, before.CertKey, after.CertKey, before.OverlayKey, after.OverlayKey)
	}
	if reps, err := a.Store.Reports(ctx); err != nil || reps["ace"].Version == 1 {
		t.Fatalf("ace's report after novox's was refused: %+v, %v", reps["ace"], err)
	}
	own := state.NewCommand(&state.ReportRequest{Report: state.Report{Node: "novox", Version: 1, AppliedAt: time.Now()}})
	own.Time = time.Now().UTC()
	if _, err := b.Node.forward(ctx, own); err != nil {
		t.Fatalf("novox's own report: %v", err)
	}
}

// The exception: a voter forwards a node's admission and its certificate's
// key for another node (the leader that admitted a node and lost the lead
// under the join does so), and the leader takes them.
func TestAVoterForwardsAnAdmission(t *testing.T) {
	a, b := twoNodesVoting(t, 2) // both vote; ace leads
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	for deadline := time.Now().Add(20 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		n, err := a.Store.Node(ctx, "novox")
		_, lerr := b.Node.leaderAddr()
		if err == nil && n.Voter && lerr == nil && b.Node.State() == "Follower" {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("novox is not a voting follower that knows the leader after 20 s: %+v %v %v", n, err, lerr)
		}
	}
	mine, err := seal.LoadOrCreate(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	key := strings.Repeat("ef", 32)
	for _, req := range []state.Request{
		&state.NodeAddRequest{Node: state.Node{Name: "ghost", Address: "127.0.0.9", Port: 9, SealKey: mine.Recipient()}},
		&state.NodeCertRequest{Node: "ghost", Expires: time.Now().Add(time.Hour), Key: key},
	} {
		c := state.NewCommand(req)
		c.Time = time.Now().UTC()
		if _, err := b.Node.forward(ctx, c); err != nil {
			t.Fatalf("novox, a voter, forwarded a %s for ghost: %v", req.Op(), err)
		}
	}
	g, err := a.Store.Node(ctx, "ghost")
	if err != nil || g.CertKey != key {
		t.Fatalf("ghost in the leader's replica: %+v, %v", g, err)
	}
}

// A node of the mesh that forwards what no replica can read (an op no
// binary knows, a known op whose body does not decode) is refused by the
// leader before anything is appended: committed, it stopped every node at
// apply, and again at each start. The mesh goes on applying.
func TestForwardedCommandsThatDoNotDecodeAreRefused(t *testing.T) {
	a, b := twoNodesVoting(t, 1) // ace leads and votes; novox does not
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	addr, err := b.Node.leaderAddr()
	for deadline := time.Now().Add(10 * time.Second); err != nil; addr, err = b.Node.leaderAddr() {
		if time.Now().After(deadline) {
			t.Fatalf("novox knows no leader after 10 s: %v", err)
		}
		time.Sleep(20 * time.Millisecond)
	}
	for _, raw := range []string{
		`{"op":"nosuch","v":3,"body":{}}`,
		`{"op":"assign","v":18,"body":{"node":1}}`,
	} {
		last := a.Node.raft.LastIndex()
		var rep applyReply
		err := b.Node.call(ctx, addr, "/v1/apply", json.RawMessage(raw), &rep)
		if err != nil || rep.Kind != "invalid" || !strings.Contains(rep.Error, "bad command") {
			t.Errorf("novox forwarded %s: %v %+v, want it refused as a bad command", raw, err, rep)
		}
		// What the nodes propose of themselves meanwhile (a certificate's
		// key) may be appended; no command that does not decode is.
		for i := last + 1; i <= a.Node.raft.LastIndex(); i++ {
			var l raft.Log
			if err := a.Node.logStore.GetLog(i, &l); err != nil || l.Type != raft.LogCommand {
				continue
			}
			if c, err := state.Decode(l.Data); err != nil {
				t.Errorf("entry %d of the leader's log is no command: %v", i, err)
			} else if _, err := c.Request(); err != nil {
				t.Errorf("entry %d of the leader's log, after %s: %v", i, raw, err)
			}
		}
	}
	c := state.NewCommand(&state.ReportRequest{Report: state.Report{Node: "novox", Version: 1, AppliedAt: time.Now()}})
	c.Time = time.Now().UTC()
	if _, err := b.Node.forward(ctx, c); err != nil {
		t.Fatalf("a command after the refused ones: %v", err)
	}
}

// A node of the mesh that sends the leader many large commands at once (a
// hostile one) takes no more than one of largeCommands places of
// MaxCommand, and every node together no more than largeCommands: a
// review found each forwarded command could hold 320 MiB of the leader's
// memory, with no bound across requests. The others wait for a place, and
// are refused when none comes; a node reads no more than peerReads bodies
// at once; small commands go on; a body that is not sent whole within
// commandReadTime gives its place back.
func TestLargeForwardedCommandsAreBounded(t *testing.T) {
	defer largeCommandWait.set(300 * time.Millisecond)()
	defer commandReadTime.set(8 * time.Second)()
	nodes, _ := threeMembers(t)
	for _, m := range nodes {
		defer m.Stop()
	}
	ace := nodes["ace"]
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	addr := fmt.Sprintf("127.0.0.1:%d", ace.ID.Port)
	eventually(t, 10*time.Second, "ace leads", func() bool { return ace.Node.raft.State() == raft.Leader })
	large := bytes.Repeat([]byte("x"), smallCommand+10)
	send := func(from *Member, body io.Reader) (int, applyReply, error) {
		req, err := http.NewRequestWithContext(ctx, "POST", "https://"+addr+"/v1/apply", body)
		if err != nil {
			return 0, applyReply{}, err
		}
		resp, err := from.Node.streams.Do(req)
		if err != nil {
			return 0, applyReply{}, err
		}
		defer resp.Body.Close()
		var rep applyReply
		err = json.NewDecoder(resp.Body).Decode(&rep)
		return resp.StatusCode, rep, err
	}
	type answer struct {
		code int
		rep  applyReply
		err  error
	}
	// stall sends from a body that stops after what it holds.
	stall := func(from *Member, what []byte, answers chan<- answer) {
		pr, pw := io.Pipe()
		t.Cleanup(func() { pw.Close() })
		go pw.Write(what) // and nothing more
		go func() {
			code, rep, err := send(from, pr)
			answers <- answer{code, rep, err}
		}()
	}
	refusedBusy := func(what string, code int, rep applyReply, err error, why string) {
		t.Helper()
		if err != nil || code != http.StatusServiceUnavailable || !strings.Contains(rep.Error, why) || !strings.Contains(rep.Error, "try again") {
			t.Errorf("%s: %d %+v %v, want refused: %s", what, code, rep, err, why)
		}
	}
	stalled := make(chan answer, 2)
	stall(nodes["novox"], large, stalled)
	eventually(t, 10*time.Second, "novox's stalled command holds a place", func() bool { return len(ace.Node.large) == 1 })
	code, rep, err := send(nodes["novox"], bytes.NewReader(large))
	refusedBusy("novox's second large command", code, rep, err, "over 1 MiB from novox already")
	stall(nodes["g14"], large, stalled)
	eventually(t, 10*time.Second, "g14's stalled command holds the other place", func() bool { return len(ace.Node.large) == 2 })
	code, rep, err = send(ace, bytes.NewReader(large))
	refusedBusy("ace's large command while every place is held", code, rep, err, "reading 2 commands over 1 MiB already")
	c := state.NewCommand(&state.ReportRequest{Report: state.Report{Node: "novox", Version: 1, AppliedAt: time.Now()}})
	c.Time = time.Now().UTC()
	if _, err := nodes["novox"].Node.forward(ctx, c); err != nil {
		t.Fatalf("a small command while every place is held: %v", err)
	}
	// Small bodies that stall: novox has one large being read, and
	// peerReads-1 more; the next is refused.
	smalls := make(chan answer, peerReads)
	for range peerReads - 1 {
		stall(nodes["novox"], []byte(`{"op":`), smalls)
	}
	eventually(t, 10*time.Second, "novox's stalled bodies are being read", func() bool {
		ace.Node.reads.mu.Lock()
		defer ace.Node.reads.mu.Unlock()
		return ace.Node.reads.reading["novox"] == peerReads
	})
	code, rep, err = send(nodes["novox"], bytes.NewReader([]byte(`{}`)))
	refusedBusy("novox's command past its bodies being read", code, rep, err, "reading 4 commands from novox already")

	for range 2 {
		got := <-stalled
		if got.err != nil || got.code != http.StatusBadRequest || !strings.Contains(got.rep.Error, "timeout") {
			t.Errorf("a large command whose body stalled: %d %+v %v", got.code, got.rep, got.err)
		}
	}
	for range peerReads - 1 {
		if got := <-smalls; got.err != nil || got.code != http.StatusBadRequest || !strings.Contains(got.rep.Error, "timeout") {
			t.Errorf("a small command whose body stalled: %d %+v %v", got.code, got.rep, got.err)
		}
	}
	eventually(t, 10*time.Second, "the stalled commands give their places back", func() bool { return len(ace.Node.large) == 0 })
	// Each node that was refused a place, or held one, has a place again
	// (read, then refused as no command).
	for _, name := range []string{"novox", "g14", "ace"} {
		if code, rep, err := send(nodes[name], bytes.NewReader(large)); err != nil || code != http.StatusBadRequest || rep.Kind != "invalid" {
			t.Fatalf("a large command from %s once places are free: %d %+v %v", name, code, rep, err)
		}
	}
	// A body trickled, a byte a second, is refused once commandReadTime
	// has passed: an idle deadline alone would read it for ever.
	pr, pw := io.Pipe()
	go func() {
		defer pw.Close()
		pw.Write(large)
		for range 30 {
			time.Sleep(time.Second)
			if _, err := pw.Write([]byte("x")); err != nil {
				return
			}
		}
	}()
	began := time.Now()
	code, rep, err = send(nodes["g14"], pr)
	if took := time.Since(began); err != nil || code != http.StatusBadRequest || !strings.Contains(rep.Error, "timeout") || took > 20*time.Second {
		t.Fatalf("a trickled body: %d %+v %v after %s", code, rep, err, took)
	}
	// A body that says it is over MaxCommand is refused unread.
	held, hold := io.Pipe()
	defer hold.Close()
	go hold.Write([]byte("{")) // and nothing more: it is not read
	req, _ := http.NewRequestWithContext(ctx, "POST", "https://"+addr+"/v1/apply", held)
	req.ContentLength = MaxCommand + 1
	resp, err := nodes["novox"].Node.streams.Do(req)
	if err != nil {
		t.Fatalf("a body announced over MaxCommand: %v", err)
	}
	json.NewDecoder(resp.Body).Decode(&rep)
	resp.Body.Close()
	if resp.StatusCode != http.StatusBadRequest || !strings.Contains(rep.Error, "over the 320 MiB") {
		t.Fatalf("a body announced over MaxCommand: %d %+v", resp.StatusCode, rep)
	}
}

// TestLargeForwardedCommandOutlivesThePeersBound: a forwarded command
// over smallCommand is bounded by what Apply gives it (LargeWrite), not by
// the peers' client's bound for small calls (peerCallTime): a restore of
// tens of MiB sent from a node behind a home uplink took longer than that
// and failed, "may or may not have been applied".
func TestLargeForwardedCommandOutlivesThePeersBound(t *testing.T) {
	defer peerCallTime.set(time.Second)()
	// novox's link carries 1 MiB a second (set as it starts: its clients
	// are in use from then on).
	wrapPeerTransport = func(id string, rt http.RoundTripper) http.RoundTripper {
		if id != "novox" {
			return rt
		}
		return throttled{next: rt, perSecond: 1 << 20}
	}
	defer func() { wrapPeerTransport = nil }()
	nodes, _ := threeMembers(t)
	for _, m := range nodes {
		defer m.Stop()
	}
	ace, novox := nodes["ace"], nodes["novox"]
	eventually(t, 10*time.Second, "ace leads", func() bool { return ace.Node.raft.State() == raft.Leader })
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	report := func(text int) *state.Command {
		c := state.NewCommand(&state.ReportRequest{Report: state.Report{Node: "novox", Version: 1, AppliedAt: time.Now(), Error: strings.Repeat("x", text)}})
		c.Time = time.Now().UTC()
		return c
	}
	began := time.Now()
	if _, err := novox.Node.Apply(ctx, report(2<<20+1000)); err != nil {
		t.Fatalf("a command of 2 MiB over a link of 1 MiB/s: %v", err)
	}
	// Else this test proves nothing: the command took longer than the
	// peers' client would have waited.
	if took := time.Since(began); took < 2*peerCallTime.get() {
		t.Fatalf("the command crossed in %s: the link was not slow", took)
	}
	if _, err := novox.Node.Apply(ctx, report(10)); err != nil {
		t.Fatalf("a small command: %v", err)
	}
}

// throttled sends requests' bodies at perSecond bytes a second at most.
type throttled struct {
	next      http.RoundTripper
	perSecond int
}

func (t throttled) RoundTrip(r *http.Request) (*http.Response, error) {
	if r.Body == nil {
		return t.next.RoundTrip(r)
	}
	r2 := r.Clone(r.Context())
	r2.Body = &slowBody{ReadCloser: r.Body, perSecond: t.perSecond}
	return t.next.RoundTrip(r2)
}

type slowBody struct {
	io.ReadCloser
	perSecond int
}

func (b *slowBody) Read(p []byte) (int, error) {
	chunk := b.perSecond / 16
	if len(p) > chunk {
		p = p[:chunk]
	}
	n, err := b.ReadCloser.Read(p)
	time.Sleep(time.Duration(n) * time.Second / time.Duration(b.perSecond))
	return n, err
}
