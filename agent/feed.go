package agent

import (
	"context"
	"net/netip"
	"time"

	"mesh/cluster"
	"mesh/dnsd"
	"mesh/state"
)

// replica is what the feed reads of the local replica.
type replica interface {
	Settings(ctx context.Context) (state.Settings, error)
	Roster(ctx context.Context) ([]state.Name, error)
	Reports(ctx context.Context) (map[string]state.Report, error)
	AppliedIndex() (uint64, error)
}

// feed turns the replica into what the resolver answers: every name of the
// roster with the addresses of its instances that are fit to answer with.
// An instance is fit when its node is reachable (this node always is; a
// node not heard from within within() (three of liveness's rounds) is not, nor one never
// heard from that long after this node started) and its module is not
// unhealthy in that node's last report (state.Fit). A name whose instances
// are all unfit answers all of them, never nothing (dnsd.Answer).
type feed struct {
	self    string
	replica replica
	// seen is when this node last heard from each other node.
	seen    func() map[string]time.Time
	started time.Time
	// within is how long a node not heard from stays reachable, and every
	// how often liveness says hello (both grow with a fleet past 21 nodes).
	within, every func() time.Duration
	now           func() time.Time
}

func newFeed(self string, r replica, n *cluster.Node) *feed {
	return &feed{self: self, replica: r, seen: seenTimes(n), started: time.Now(), within: n.ReachableWithin, every: n.ProbeEvery, now: time.Now}
}

// seenTimes is when n last heard from each node.
func seenTimes(n *cluster.Node) func() map[string]time.Time {
	return func() map[string]time.Time {
		out := map[string]time.Time{}
		for name, s := range n.Seen() {
			out[name] = s.LastSeen
		}
		return out
	}
}

// Roster reads the replica once and says what the resolver answers.
func (f *feed) Roster(ctx context.Context) (dnsd.Roster, error) {
	st, err := f.replica.Settings(ctx)
	if err != nil {
		return dnsd.Roster{}, err
	}
	ro, err := f.replica.Roster(ctx)
	if err != nil {
		return dnsd.Roster{}, err
	}
	reports, err := f.replica.Reports(ctx)
	if err != nil {
		return dnsd.Roster{}, err
	}
	reach := state.Reach{Self: f.self, LastSeen: f.seen(), Now: f.now(), Started: f.started, Within: f.within()}
	up := state.Fit(reports, reach, st.Domain)
	idx, _ := f.replica.AppliedIndex()
	r := dnsd.Roster{Domain: st.Domain, Names: map[string][]netip.Addr{}, Serial: uint32(idx)}
	byName := map[string][]dnsd.Instance{}
	var order []string
	for _, n := range ro {
		ip, err := netip.ParseAddr(n.Address)
		if err != nil {
			continue
		}
		if _, ok := byName[n.Name]; !ok {
			order = append(order, n.Name)
		}
		byName[n.Name] = append(byName[n.Name], dnsd.Instance{Addr: ip, Up: up(n)})
	}
	for _, name := range order {
		r.Names[name] = dnsd.Answer(byName[name])
	}
	return r, nil
}

// changed fires on a change of the replica (an assign, a report with new
// health) or at the next liveness probe (a node that stopped answering
// drops out without any write).
func (f *feed) changed(ctx context.Context, replicaChanged func() <-chan struct{}) func() <-chan struct{} {
	return func() <-chan struct{} {
		ch := make(chan struct{})
		changed := replicaChanged()
		go func() {
			defer close(ch)
			select {
			case <-changed:
			case <-time.After(f.every()):
			case <-ctx.Done():
			}
		}()
		return ch
	}
}
