package api

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"mesh/cluster"
	"mesh/state"
)

// A blocking status query answers once the replica applied an entry past
// the index it was given, not before, and not later than its wait.
func TestStatusBlocksUntilTheIndexMoves(t *testing.T) {
	dir := initDir(t, cluster.LogStoreWAL)
	a := startAgent(t, dir)
	t.Cleanup(func() { a.Stop() })
	waitLeader(t, a)
	c := NewClient(dir)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()

	// The node's own first writes (its keys, its certificate) settle.
	st, err := c.Status(ctx)
	for quiet := false; err == nil && !quiet; {
		var next Status
		next, err = c.StatusAfter(ctx, st.AppliedIndex, time.Second)
		quiet, st = next.AppliedIndex == st.AppliedIndex, next
	}
	if err != nil {
		t.Fatal(err)
	}
	// Nothing is written: the query waits its whole wait, then answers
	// with the same index.
	start := time.Now()
	same, err := c.StatusAfter(ctx, st.AppliedIndex, 700*time.Millisecond)
	if err != nil {
		t.Fatal(err)
	}
	if took := time.Since(start); took < 600*time.Millisecond || same.AppliedIndex != st.AppliedIndex {
		t.Fatalf("with nothing written it answered after %s at index %d (was %d); want the whole wait and the same index", took, same.AppliedIndex, st.AppliedIndex)
	}

	// A write while it waits: it answers with the write's index, before
	// its wait ends.
	got := make(chan Status, 1)
	errc := make(chan error, 1)
	go func() {
		s, err := c.StatusAfter(ctx, st.AppliedIndex, 15*time.Second)
		if err != nil {
			errc <- err
			return
		}
		got <- s
	}()
	select {
	case s := <-got:
		t.Fatalf("answered at index %d before anything was written", s.AppliedIndex)
	case err := <-errc:
		t.Fatal(err)
	case <-time.After(300 * time.Millisecond):
	}
	w, err := c.AddModules(ctx, AddRequest{Modules: []state.ModuleText{{File: "db.yaml", Text: dbManifest}}})
	if err != nil {
		t.Fatal(err)
	}
	select {
	case s := <-got:
		if s.AppliedIndex < w.Index {
			t.Fatalf("answered at index %d, before the write at %d", s.AppliedIndex, w.Index)
		}
	case err := <-errc:
		t.Fatal(err)
	case <-time.After(10 * time.Second):
		t.Fatal("the write did not end the wait")
	}

	// A bad index is the caller's mistake, said so.
	if err := c.do(ctx, "GET", "/v1/status?index=x", nil, nil); err == nil || !strings.Contains(err.Error(), "not a log index") {
		t.Fatalf("index=x: %v", err)
	}
}

// agentWithWrite starts a one-node mesh's agent and adds a module through
// a client: the data dir, the agent, the client and the write.
func agentWithWrite(t *testing.T) (string, *agent, *Client, WriteResult) {
	t.Helper()
	dir := initDir(t, cluster.LogStoreWAL)
	a := startAgent(t, dir)
	t.Cleanup(func() { a.Stop() })
	waitLeader(t, a)
	c := NewClient(dir)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	w, err := c.AddModules(ctx, AddRequest{Modules: []state.ModuleText{{File: "db.yaml", Text: dbManifest}}})
	if err != nil {
		t.Fatal(err)
	}
	return dir, a, c, w
}

// A read after a write answers only once the replica holds that write: the
// client sends the index of its last write with every read, and a replica
// that does not reach it in time says so rather than answer older.
func TestReadsWaitForTheirWrite(t *testing.T) {
	dir, _, c, w := agentWithWrite(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if got := c.written.Load(); got != w.Index {
		t.Fatalf("the client remembers write %d, want %d", got, w.Index)
	}
	st, err := c.Status(ctx)
	if err != nil || st.AppliedIndex < w.Index {
		t.Fatalf("a read after the write: applied %d (write at %d), %v", st.AppliedIndex, w.Index, err)
	}
	// A write the replica does not hold (as a restarted node's, behind).
	old := readWait
	readWait = 300 * time.Millisecond
	t.Cleanup(func() { readWait = old })
	c.wrote(w.Index + 1000)
	if _, err := c.Modules(ctx); err == nil || !strings.Contains(err.Error(), "not yet the write at") {
		t.Fatalf("a read behind its write: %v", err)
	}
	// A fresh client (another command) does not wait.
	if _, err := NewClient(dir).Modules(ctx); err != nil {
		t.Fatal(err)
	}
}

// A linearizable read is answered by the leader once a quorum confirmed
// it, with everything it had committed; a node that is not the leader
// (here: one that has lost its quorum's confirmation, stopped) refuses.
func TestLinearizableRead(t *testing.T) {
	dir, a, _, w := agentWithWrite(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	// A fresh client carries no write of its own: the read-index alone
	// makes it see the write.
	st, err := NewClient(dir).Linearizable().Status(ctx)
	if err != nil || st.AppliedIndex < w.Index {
		t.Fatalf("a linearizable read: applied %d (write at %d), %v", st.AppliedIndex, w.Index, err)
	}
	if err := a.Node.Linearize(ctx); err != nil {
		t.Fatal(err)
	}
	a.Node.Shutdown()
	if err := a.Node.Linearize(ctx); !errors.Is(err, cluster.ErrNoLeader) {
		t.Fatalf("a node that is not the leader any more: %v", err)
	}
}
