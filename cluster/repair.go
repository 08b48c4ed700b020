package cluster

import (
	"context"
	"net"
	"strconv"
	"time"

	"github.com/hashicorp/raft"

	"mesh/state"
)

// RepairInterval is how often the leader aligns Raft's configuration with the
// nodes of the replicated state.
const RepairInterval = 5 * time.Second

// repairMembership runs on every node and acts while it leads, so that
// Raft's configuration follows the nodes of the replicated state whatever
// step a change stopped at:
//   - a Raft server that is no longer a node of the state (a removal that
//     stopped between its two steps: the state, then Raft) is removed;
//   - a node of the state that Raft lacks (a join that stopped between the
//     state and Raft) is added as a non-voter at the Raft port it joined
//     with (nodes that joined before the port was kept have none: they
//     join again, which admit accepts for the same name and address);
//   - promotions are healed by the node itself: EnsureVoter asks the leader
//     until Raft holds it as the voter the state says, and only once it has
//     caught up (a leader promoting a node that lags could stall commits).
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
		known := map[string]state.NodeInfo{}
		for _, nd := range nodes {
			known[nd.Name] = nd
		}
		inRaft := map[string]raft.Server{}
		next := map[raft.ServerID]bool{}
		for _, s := range f.Configuration().Servers {
			inRaft[string(s.ID)] = s
			if _, ok := known[string(s.ID)]; string(s.ID) == n.cfg.ID || ok {
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
		for _, nd := range nodes {
			id := raft.ServerID(nd.Name)
			if _, ok := inRaft[nd.Name]; !ok && nd.Port > 0 {
				if !suspect[id] {
					next[id] = true
					continue
				}
				addr := raft.ServerAddress(net.JoinHostPort(nd.Address, strconv.Itoa(nd.Port)))
				if err := n.raft.AddNonvoter(id, addr, 0, ApplyTimeout).Error(); err != nil {
					n.log.Warn("add a node of the mesh that raft lacks", "node", nd.Name, "err", err)
					continue
				}
				n.log.Warn("added a node of the mesh that raft lacked (a join had stopped half-way)", "node", nd.Name, "address", addr)
			}
		}
		suspect = next
	}
}
