package cluster

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/hashicorp/raft"

	"mesh/state"
)

// A join that meets a mesh without a leader (its leader lost its quorum:
// the other of its two voters stopped) goes on trying, says so, and
// completes once a leader is back: the operator is not left with an error
// that says the join may or may not have been applied (fleet.sh met that
// at 47 agents).
func TestJoinWaitsOutAnElection(t *testing.T) {
	ctx := context.Background()
	a, b := twoNodes(t)
	token := joinToken(t, a)
	addr := fmt.Sprintf("127.0.0.1:%d", a.ID.Port)
	dirB := b.Node.cfg.TLSDir // novox's data dir
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		if v, _ := a.Node.Voters(); v == 2 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("novox was never promoted")
		}
	}
	b.Stop()
	for deadline := time.Now().Add(10 * time.Second); a.Node.raft.State() == raft.Leader; time.Sleep(20 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("ace still leads with one of two voters")
		}
	}

	notes := make(chan string, 100)
	done := make(chan error, 1)
	go func() {
		done <- Join(ctx, JoinConfig{DataDir: filepath.Join(t.TempDir(), "third"), Peer: addr, Token: token, Name: "third", Address: "127.0.0.3", Port: freePort(t),
			Note: func(s string) {
				select {
				case notes <- s:
				default:
				}
			}})
	}()
	select {
	case n := <-notes:
		if !strings.Contains(n, "no leader") || !strings.Contains(n, "trying the same join again") {
			t.Fatalf("what the join says while it waits: %q", n)
		}
	case err := <-done:
		t.Fatalf("the join ended while the mesh had no leader: %v", err)
	case <-time.After(30 * time.Second):
		t.Fatal("the join said nothing while the mesh had no leader")
	}
	b2 := startAgent(t, dirB)
	t.Cleanup(func() { b2.Stop() })
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("the join once a leader was back: %v", err)
		}
	case <-time.After(joinWait + 10*time.Second):
		t.Fatal("the join never ended")
	}
	for deadline := time.Now().Add(20 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		_, err := a.Store.Node(ctx, "third")
		inRaft := false
		if f := a.Node.raft.GetConfiguration(); f.Error() == nil {
			for _, s := range f.Configuration().Servers {
				inRaft = inRaft || s.ID == "third"
			}
		}
		if err == nil && inRaft {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("third after its join: in the state: %v; in Raft: %v", err, inRaft)
		}
	}
}

// The leader that stops leading in the middle of a join (its commit of the
// node's certificate lost, or Raft refusing to add the node) answers with
// the kind the joiner tries again on; other errors keep theirs.
func TestJoinLeaderLostIsNoLeader(t *testing.T) {
	lost := fmt.Errorf("record x's certificate: commit node.cert: leadership changed while it committed: %w", raft.ErrLeadershipLost)
	notLeader := fmt.Errorf("add x to raft: %w", raft.ErrNotLeader)
	for _, err := range []error{lost, notLeader} {
		sent := leaderLostUnder(err)
		if kindOf(sent) != "no-leader" {
			t.Fatalf("%v: kind %q", err, kindOf(sent))
		}
		if got := errOfKind(kindOf(sent), sent.Error()); !errors.Is(got, ErrNoLeader) {
			t.Fatalf("%v: the joiner reads %v", err, got)
		}
	}
	other := &state.RuleError{Kind: state.ErrConflict, Msg: "node x is already in the mesh"}
	if got := leaderLostUnder(other); got != error(other) || kindOf(got) != "conflict" {
		t.Fatalf("a conflict became %v (%q)", got, kindOf(got))
	}
}
