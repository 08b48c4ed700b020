package cluster

import (
	"context"
	"time"

	"github.com/hashicorp/raft"
)

// RepairInterval is how often the leader aligns Raft's configuration with the
// nodes of the replicated state.
const RepairInterval = 5 * time.Second

// repairMembership runs on every node and acts while it leads: a Raft server
// that is no longer a node of the state (a removal that crashed between its
// two steps: the state, then Raft) is removed from Raft. The other direction
// (a node in the state that Raft lacks, after a join that crashed between
// them) is left to the operator: Raft needs the node's port, which only the
// joiner knew, and `mesh node remove` clears the row so it can join again.
func (n *Node) repairMembership(ctx context.Context) {
	t := time.NewTicker(RepairInterval)
	defer t.Stop()
	// A server is removed only when two passes in a row find it missing from
	// a replica that has applied all Raft committed (a new leader may still be
	// applying the entry that added a node).
	suspect := map[raft.ServerID]bool{}
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		if n.raft.State() != raft.Leader {
			clear(suspect)
			continue
		}
		if n.raft.AppliedIndex() < n.raft.CommitIndex() {
			continue
		}
		f := n.raft.GetConfiguration()
		if f.Error() != nil {
			continue
		}
		nodes, err := n.store.Nodes(ctx)
		if err != nil || len(nodes) == 0 {
			continue
		}
		known := map[string]bool{}
		for _, nd := range nodes {
			known[nd.Name] = true
		}
		next := map[raft.ServerID]bool{}
		for _, s := range f.Configuration().Servers {
			if string(s.ID) == n.cfg.ID || known[string(s.ID)] {
				continue
			}
			if !suspect[s.ID] {
				next[s.ID] = true
				continue
			}
			if err := n.raft.RemoveServer(s.ID, 0, ApplyTimeout).Error(); err != nil {
				n.log.Warn("remove a raft server that is no longer a node", "server", s.ID, "err", err)
				continue
			}
			n.log.Warn("removed a raft server that is no longer a node of the mesh (a removal had stopped half-way)", "server", s.ID)
		}
		suspect = next
	}
}
