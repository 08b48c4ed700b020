package cluster

import (
	"testing"
	"time"

	"github.com/hashicorp/raft"
)

// Issue 9 item 5: a removal that crashed between the state and Raft heals:
// the leader removes the Raft server that is no longer a node.
func TestMembershipRepair(t *testing.T) {
	dir := initDir(t, LogStoreWAL)
	a := startAgent(t, dir)
	defer a.Stop()
	waitLeader(t, a)
	// The half-done removal: a server Raft knows and the state does not.
	if err := a.Node.raft.AddNonvoter("ghost", "127.0.0.9:1", 0, 5*time.Second).Error(); err != nil {
		t.Fatal(err)
	}
	has := func() bool {
		for _, s := range a.Node.raft.GetConfiguration().Configuration().Servers {
			if s.ID == raft.ServerID("ghost") {
				return true
			}
		}
		return false
	}
	if !has() {
		t.Fatal("the ghost was not added")
	}
	for deadline := time.Now().Add(3 * RepairInterval); has(); time.Sleep(100 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("the ghost server is still in Raft after %s", 3*RepairInterval)
		}
	}
}
