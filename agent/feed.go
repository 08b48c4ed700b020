package agent

import (
	"context"
	"maps"
	"net/netip"
	"strings"
	"time"

	"mesh/cluster"
	"mesh/dnsd"
	"mesh/state"
)

// replica is what the feed reads of the local replica.
type replica interface {
	Settings(ctx context.Context) (state.Settings, error)
	// SharedRoster is the roster, which the feed never changes.
	SharedRoster(ctx context.Context) (state.Roster, error)
	ReportBodies(ctx context.Context) (map[string]string, error)
	AppliedIndex() (uint64, error)
}

// feed turns the replica into what the resolver answers: every name of the
// roster with the addresses of its instances that are fit to answer with.
// An instance is fit when its node is reachable (this node always is; a
// node not heard from within within() (three of liveness's rounds) is not, nor one never
// heard from that long after this node started) and its module is not
// unhealthy in that node's last report (state.Fit). A name whose instances
// are all unfit answers all of them, never nothing (dnsd.Answer).
//
// After a change that moved names only (an assign: no node's reachability
// or report changed), the next index is the last one with those names
// answered anew (dnsd.Index.With), not every name of the fleet again
// (issue "scale"); any other change builds it whole.
//
// The index also answers the reverse names of the overlay's prefix
// (dnsd.Index.WithOverlay): each node's overlay address with the node's
// name, every other name inside the prefix NXDOMAIN, so that the PTR
// lookups servers make of their peers never leave the node.
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

	// reports are the nodes' reports as last read, each with what the
	// feed reads of it (decoded again only when its body changed).
	reports map[string]feedReport
	// last is what the last index was built from, nil before the first;
	// lastPatched says that index was the one before with names changed.
	last        *feedInput
	lastPatched bool
}

type feedReport struct {
	body      string
	unhealthy map[string]bool
}

// feedInput is what one index was built from: the names with their nodes,
// what decides which instances are fit, and the overlay's prefix (invalid
// when the overlay is off or the mesh has none yet) with the node names
// its addresses answer.
type feedInput struct {
	domain  string
	roster  state.Roster
	fit     fitInputs
	overlay netip.Prefix
	nodes   map[netip.Addr]string
}

// fitInputs is what state.Fit reads: which nodes are reachable (of those
// heard from, and whether one never heard from is) and each report's body.
type fitInputs struct {
	reachable map[string]bool
	unheard   bool
	bodies    map[string]string
}

func (a fitInputs) equal(b fitInputs) bool {
	return a.unheard == b.unheard && maps.Equal(a.reachable, b.reachable) && maps.Equal(a.bodies, b.bodies)
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

// read reads the replica once: the names, and what decides their fitness.
func (f *feed) read(ctx context.Context) (*feedInput, func(state.Name) bool, uint32, error) {
	st, err := f.replica.Settings(ctx)
	if err != nil {
		return nil, nil, 0, err
	}
	ro, err := f.replica.SharedRoster(ctx)
	if err != nil {
		return nil, nil, 0, err
	}
	bodies, err := f.replica.ReportBodies(ctx)
	if err != nil {
		return nil, nil, 0, err
	}
	idx, _ := f.replica.AppliedIndex()
	reach := state.Reach{Self: f.self, LastSeen: f.seen(), Now: f.now(), Started: f.started, Within: f.within()}
	in := &feedInput{domain: st.Domain, roster: ro, fit: fitInputs{reachable: map[string]bool{}, unheard: reach.Reachable(""), bodies: bodies}}
	// OverlayOff and "" (a mesh made before the overlay) are no prefix;
	// nor is a damaged setting, on which no node brings its overlay up.
	if p, err := state.ParseOverlay(st.Overlay); err == nil {
		in.overlay = p
	}
	for n := range reach.LastSeen {
		in.fit.reachable[n] = reach.Reachable(n)
	}
	// Decode only the reports that changed; a report that does not decode
	// counts as none (the node is judged by its reachability alone), as
	// the replica holds only what the FSM took.
	reports := make(map[string]feedReport, len(bodies))
	unhealthy := make(map[string]map[string]bool, len(bodies))
	for n, body := range bodies {
		r, ok := f.reports[n]
		if !ok || r.body != body {
			rep, err := state.DecodeReport(body)
			if err != nil {
				continue
			}
			r = feedReport{body: body, unhealthy: rep.Unhealthy()}
		}
		reports[n], unhealthy[n] = r, r.unhealthy
	}
	f.reports = reports
	return in, state.FitUnhealthy(unhealthy, reach, st.Domain), uint32(idx), nil
}

// Roster reads the replica once and says what the resolver answers.
func (f *feed) Roster(ctx context.Context) (dnsd.Roster, error) {
	in, up, serial, err := f.read(ctx)
	if err != nil {
		return dnsd.Roster{}, err
	}
	return dnsd.Roster{Domain: in.domain, Names: answers(in.roster, up, nil), Serial: serial}, nil
}

// Index is the index the resolver answers from next, given the one it
// answers from now (nil at first): that one with the names that moved
// answered anew when only names moved since it was built, else one built
// whole.
func (f *feed) Index(ctx context.Context, last *dnsd.Index) (*dnsd.Index, error) {
	in, up, serial, err := f.read(ctx)
	if err != nil {
		return nil, err
	}
	prev := f.last
	f.last, f.lastPatched = in, false
	if last != nil && prev != nil && prev.domain == in.domain && prev.overlay == in.overlay && prev.fit.equal(in.fit) {
		moved := movedNames(prev.roster, in.roster)
		changes := answers(in.roster, up, moved)
		for n := range moved {
			if _, ok := changes[n]; !ok {
				changes[n] = nil // gone
			}
		}
		f.lastPatched = true
		next := last.With(changes, serial)
		// A node's own name moves when a node joins or leaves, or when
		// its names turn to its overlay address; an assign moves only
		// modules' names, and the reverse names stay as they were.
		if in.nodes = prev.nodes; nodeNameMoved(moved, prev.roster, in.roster, in.domain) {
			in.nodes = overlayNames(in.roster, in.domain, in.overlay)
			next = next.WithOverlay(in.overlay, in.nodes)
		}
		return next, nil
	}
	in.nodes = overlayNames(in.roster, in.domain, in.overlay)
	return dnsd.NewIndex(in.domain, answers(in.roster, up, nil), serial).WithOverlay(in.overlay, in.nodes), nil
}

// overlayNames is the name each node's overlay address answers a PTR with:
// the node's own name (NODE.DOMAIN), where that name answers an address of
// prefix. The roster says which: while a mesh made by an earlier release
// upgrades, the nodes' names still answer their mesh addresses, and then
// the overlay's addresses have no name (NXDOMAIN, still answered here), as
// a PTR to a name that does not answer the address back fails the check
// servers make of it (sshd's UseDNS, postfix's "unknown" clients).
func overlayNames(roster state.Roster, domain string, prefix netip.Prefix) map[netip.Addr]string {
	if !prefix.IsValid() {
		return nil
	}
	out := map[netip.Addr]string{}
	for n := range roster.All() {
		if !isNodeName(n, domain) {
			continue
		}
		if a, err := netip.ParseAddr(n.Address); err == nil && prefix.Contains(a) {
			out[a] = n.Name
		}
	}
	return out
}

// isNodeName says n is its node's own name, NODE.DOMAIN (state composes
// one for each node), not a module's name that answers the node's address.
func isNodeName(n state.Name, domain string) bool {
	return len(n.Name) == len(n.Node)+1+len(domain) && n.Name[len(n.Node)] == '.' &&
		strings.HasPrefix(n.Name, n.Node) && strings.HasSuffix(n.Name, domain)
}

// nodeNameMoved says a name of moved is a node's own name in either
// roster: a look-up of each name moved, not a walk of the roster.
func nodeNameMoved(moved map[string]bool, before, after state.Roster, domain string) bool {
	for name := range moved {
		for _, r := range []state.Roster{before, after} {
			for n := range r.Named(name) {
				if isNodeName(n, domain) {
					return true
				}
			}
		}
	}
	return false
}

// answers is each name's answer in roster (only those of only, unless it
// is nil): its fit instances, or all of them when none is. A name without
// a valid address is left out.
func answers(roster state.Roster, up func(state.Name) bool, only map[string]bool) map[string][]netip.Addr {
	byName := map[string][]dnsd.Instance{}
	var order []string
	add := func(n state.Name) {
		ip, err := netip.ParseAddr(n.Address)
		if err != nil {
			return
		}
		if _, ok := byName[n.Name]; !ok {
			order = append(order, n.Name)
		}
		byName[n.Name] = append(byName[n.Name], dnsd.Instance{Addr: ip, Up: up(n)})
	}
	if only == nil {
		for n := range roster.All() {
			add(n)
		}
	} else {
		for name := range only {
			for n := range roster.Named(name) {
				add(n)
			}
		}
	}
	out := make(map[string][]netip.Addr, len(order))
	for _, name := range order {
		out[name] = dnsd.Answer(byName[name])
	}
	return out
}

// movedNames are the names with an entry in one roster and not the other,
// both sorted as SortRoster sorts: a walk of both together that steps over
// each run the two share whole (a command shares all but the runs its
// names fall in), so it costs what moved, not the roster.
func movedNames(before, after state.Roster) map[string]bool {
	moved := map[string]bool{}
	b, a := before.Runs(), after.Runs()
	var bi, bk, ai, ak int // run and row in each
	for {
		for bi < len(b) && bk == len(b[bi]) {
			bi, bk = bi+1, 0
		}
		for ai < len(a) && ak == len(a[ai]) {
			ai, ak = ai+1, 0
		}
		switch {
		case bi == len(b) && ai == len(a):
			return moved
		case bi == len(b):
			moved[a[ai][ak].Name], ak = true, ak+1
		case ai == len(a):
			moved[b[bi][bk].Name], bk = true, bk+1
		case bk == 0 && ak == 0 && state.RunsShared(b[bi], a[ai]):
			bi, ai = bi+1, ai+1
		case b[bi][bk] == a[ai][ak]:
			bk, ak = bk+1, ak+1
		case state.RosterLess(a[ai][ak], b[bi][bk]):
			moved[a[ai][ak].Name], ak = true, ak+1
		default:
			moved[b[bi][bk].Name], bk = true, bk+1
		}
	}
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
