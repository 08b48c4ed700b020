package cluster

import (
	"context"
	"errors"
	"fmt"
	"net"
	"path/filepath"
	"testing"
	"time"

	"mesh/state"
)

// Issue 9 item 1: a join sent the moment the first agent started (before it
// elected itself) waits for the election instead of failing with "no leader
// is known". Issue 9 item 2 is the same wait on every write.
func TestJoinRightAfterFirstStart(t *testing.T) {
	dir := initDir(t, LogStoreWAL)
	id, err := ReadIdentity(dir)
	if err != nil {
		t.Fatal(err)
	}
	// The agent starts in the background; the join and a write go out the
	// moment its socket exists, before it elected itself.
	type result struct {
		a   *Agent
		err error
	}
	started := make(chan result, 1)
	go func() {
		a, err := StartAgent(context.Background(), AgentConfig{DataDir: dir, Logger: testLogger(t)})
		started <- result{a, err}
	}()
	t.Cleanup(func() {
		if r := <-started; r.a != nil {
			r.a.Stop()
		}
	})
	sock := filepath.Join(dir, SocketFile)
	// (The socket file appears at bind(), before listen(): dial, not stat.)
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(time.Millisecond) {
		if c, err := net.Dial("unix", sock); err == nil {
			c.Close()
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("no socket within 10s")
		}
	}
	c := NewClient(dir)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	tok, err := c.Token(ctx, false)
	if err != nil {
		t.Fatal(err)
	}
	wrote := make(chan error, 1)
	go func() {
		_, err := c.AddModules(ctx, AddRequest{Modules: []state.ModuleText{{File: "web.yaml", Text: webManifest}}})
		wrote <- err
	}()
	err = Join(ctx, JoinConfig{
		DataDir: filepath.Join(t.TempDir(), "novox"), Peer: fmt.Sprintf("127.0.0.1:%d", id.Port),
		Token: tok, Name: "novox", Address: "127.0.0.2", Port: freePort(t),
	})
	if err != nil {
		t.Fatalf("join right after the first start: %v", err)
	}
	if err := <-wrote; err != nil {
		t.Fatalf("a write right after the first start: %v", err)
	}
}

// A peer's "not the leader any more" means the write was never applied, so it
// is sent again; other failures after the request left are not retried.
func TestNotLeaderIsRetriedOthersAreNot(t *testing.T) {
	for _, tc := range []struct {
		kind, msg string
		retry     bool
	}{
		{"not-leader", notLeaderMsg, true},
		{"no-leader", notLeaderMsg, true}, // an older peer
		{"no-leader", "no leader is known", false},
		{"", "commit assign: leadership lost while committing log", false},
	} {
		err := errOfKind(tc.kind, tc.msg)
		if got := errors.Is(err, errNotApplied); got != tc.retry {
			t.Errorf("%s %q: retry %v, want %v", tc.kind, tc.msg, got, tc.retry)
		}
	}
}
