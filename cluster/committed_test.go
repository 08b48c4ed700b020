package cluster

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/hashicorp/raft"
)

// A follower applies a commit when the leader tells it, not when Raft next
// sends it the commit index. Raft's own pace is made slow here (a 3 s commit
// timeout, so a follower hears of a commit 3-6 s after it, or with the next
// entry): with notices off the follower is still behind after 500 ms; with
// them on it has applied well within the commit timeout. Notices that do not
// fit (another term, an entry the follower lacks, a sender that is not its
// leader) apply nothing.
func TestCommitNoticeAppliesAtOnce(t *testing.T) {
	defer func(d time.Duration) { commitTimeout = d }(commitTimeout)
	commitTimeout = 3 * time.Second
	ctx := context.Background()
	a, b := twoNodes(t)
	caughtUp := func(within time.Duration) bool {
		want, _ := a.Store.AppliedIndex()
		for deadline := time.Now().Add(within); ; time.Sleep(5 * time.Millisecond) {
			if got, _ := b.Store.AppliedIndex(); got >= want {
				return true
			}
			if time.Now().After(deadline) {
				return false
			}
		}
	}
	if !caughtUp(20 * time.Second) {
		t.Fatal("the follower never caught up after joining")
	}
	// With b a voter the leader needs its answer to commit, so b receives
	// an entry before the entry's commit (with one voter both go together).
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		if v, _ := a.Node.Voters(); v == 2 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("novox was never promoted")
		}
	}

	// The agents write a little after a join (promotion, keys); any entry
	// carries the commit index too, so each part starts once the log is
	// quiet, and a part another entry overlapped is run again.
	lastIndex := func() uint64 { i, _ := a.Node.logStore.LastIndex(); return i }
	quiet := func() {
		t.Helper()
		last, since := lastIndex(), time.Now()
		for deadline := time.Now().Add(30 * time.Second); time.Since(since) < 1500*time.Millisecond; time.Sleep(50 * time.Millisecond) {
			if i := lastIndex(); i != last {
				last, since = i, time.Now()
			}
			if time.Now().After(deadline) {
				t.Fatal("the log never went quiet")
			}
		}
	}
	noticesOn.Store(false)
	for try := 0; ; try++ {
		if try == 5 {
			t.Fatal("other entries overlapped every try")
		}
		quiet()
		idx, err := a.Node.Propose(ctx, addModule(t, fmt.Sprintf("slow%d.yaml", try), fmt.Sprintf("module: slow%d\n", try)))
		if err != nil {
			t.Fatal(err)
		}
		early := caughtUp(500 * time.Millisecond)
		if lastIndex() != idx {
			continue
		}
		if early {
			t.Fatal("with notices off the follower applied within 500 ms: Raft's commit timeout is not what this test measures against")
		}
		break
	}
	if !caughtUp(10 * time.Second) {
		t.Fatal("Raft never delivered the commit")
	}

	noticesOn.Store(true)
	quiet()
	for i := 0; i < 5; i++ {
		name := fmt.Sprintf("quick%d", i)
		if _, err := a.Node.Propose(ctx, addModule(t, name+".yaml", "module: "+name+"\n")); err != nil {
			t.Fatal(err)
		}
		if !caughtUp(2 * time.Second) {
			t.Fatalf("write %d: the follower did not apply it within 2 s of the commit, with notices on", i)
		}
		if _, err := b.Store.Module(ctx, name); err != nil {
			t.Fatalf("the follower's replica lacks %s: %v", name, err)
		}
	}

	// Notices that do not fit apply nothing. The leader's next entry is
	// written but not yet known committed on b (notices off, slow Raft).
	noticesOn.Store(false)
	quiet()
	idx, err := a.Node.Propose(ctx, addModule(t, "held.yaml", "module: held\n"))
	if err != nil {
		t.Fatal(err)
	}
	var l raft.Log
	for deadline := time.Now().Add(2 * time.Second); b.Node.logStore.GetLog(idx, &l) != nil; time.Sleep(5 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("the follower never stored the entry")
		}
	}
	before, _ := b.Store.AppliedIndex()
	if before >= idx {
		t.Fatal("Raft delivered the commit within moments, with a 3 s commit timeout")
	}
	for _, c := range []committedNotice{{Index: idx, Term: l.Term + 1}, {Index: idx + 100, Term: l.Term}} {
		if err := b.Node.applyCommitted(&c); err != errNotHeld {
			t.Fatalf("notice %+v: %v, want errNotHeld", c, err)
		}
	}
	if now, _ := b.Store.AppliedIndex(); now != before {
		t.Fatalf("a notice that does not fit applied up to %d (was %d)", now, before)
	}
	// A notice from a node that is not the receiver's leader is refused:
	// here the follower b tells the leader a.
	addr := fmt.Sprintf("127.0.0.1:%d", a.ID.Port)
	var out struct{}
	err = b.Node.call(ctx, addr, "/v1/committed", committedNotice{Index: idx, Term: l.Term}, &out)
	if err == nil || !strings.Contains(err.Error(), "not the leader this node follows") {
		t.Fatalf("a notice from a follower to the leader: %v, want it refused", err)
	}
	// The fitting notice applies it.
	if err := b.Node.applyCommitted(&committedNotice{Index: idx, Term: l.Term}); err != nil {
		t.Fatal(err)
	}
	if _, err := b.Store.Module(ctx, "held"); err != nil {
		t.Fatalf("the fitting notice did not apply the entry: %v", err)
	}
	noticesOn.Store(true)
}
