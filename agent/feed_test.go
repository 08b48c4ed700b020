package agent

import (
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"math/rand/v2"
	"net/netip"
	"slices"
	"testing"
	"time"

	"github.com/miekg/dns"

	"mesh/dnsd"
	"mesh/state"
)

// fakeReplica is a replica of fixed rows.
type fakeReplica struct {
	roster  []state.Name
	reports map[string]state.Report
	overlay string
}

func (f *fakeReplica) Settings(context.Context) (state.Settings, error) {
	return state.Settings{Domain: "internal", Overlay: f.overlay}, nil
}
func (f *fakeReplica) SharedRoster(context.Context) (state.Roster, error) {
	return state.NewRoster(slices.Clone(f.roster)), nil
}
func (f *fakeReplica) ReportBodies(context.Context) (map[string]string, error) {
	out := map[string]string{}
	for n, r := range f.reports {
		b, err := json.Marshal(r)
		if err != nil {
			return nil, err
		}
		out[n] = string(b)
	}
	return out, nil
}
func (f *fakeReplica) AppliedIndex() (uint64, error) { return 42, nil }

func addrs(ss ...string) []netip.Addr {
	var out []netip.Addr
	for _, s := range ss {
		out = append(out, netip.MustParseAddr(s))
	}
	return out
}

// What the resolver answers for a name: the instances on reachable nodes
// whose module is not unhealthy there, and never nothing.
func TestFeedAnswersFitInstances(t *testing.T) {
	now := time.Date(2026, 12, 1, 12, 0, 0, 0, time.UTC)
	// web runs on n1 (this node), n2 and n3.
	roster := []state.Name{
		{Name: "web.internal", Address: "10.0.0.1", Node: "n1"},
		{Name: "web.internal", Address: "10.0.0.2", Node: "n2"},
		{Name: "web.internal", Address: "10.0.0.3", Node: "n3"},
		{Name: "n2.internal", Address: "10.0.0.2", Node: "n2"},
	}
	unhealthy := func(module string) state.Report {
		return state.Report{Health: []state.ContainerHealth{{Module: module, Container: module + ".server", Status: state.HealthUnhealthy}}}
	}
	fresh, stale := now.Add(-time.Second), now.Add(-time.Minute)
	cases := []struct {
		name    string
		seen    map[string]time.Time
		reports map[string]state.Report
		started time.Time
		want    []netip.Addr
	}{
		{"all reachable and healthy", map[string]time.Time{"n2": fresh, "n3": fresh}, nil, now.Add(-time.Hour),
			addrs("10.0.0.1", "10.0.0.2", "10.0.0.3")},
		{"n3 not heard from within the limit drops out", map[string]time.Time{"n2": fresh, "n3": stale}, nil, now.Add(-time.Hour),
			addrs("10.0.0.1", "10.0.0.2")},
		{"a node never heard from, long after start, drops out", map[string]time.Time{"n2": fresh}, nil, now.Add(-time.Hour),
			addrs("10.0.0.1", "10.0.0.2")},
		{"a node never heard from just after start is given time", map[string]time.Time{"n2": fresh}, nil, now.Add(-time.Second),
			addrs("10.0.0.1", "10.0.0.2", "10.0.0.3")},
		{"unhealthy on n2 drops out", map[string]time.Time{"n2": fresh, "n3": fresh}, map[string]state.Report{"n2": unhealthy("web")}, now.Add(-time.Hour),
			addrs("10.0.0.1", "10.0.0.3")},
		{"another module's health does not count", map[string]time.Time{"n2": fresh, "n3": fresh}, map[string]state.Report{"n2": unhealthy("db")}, now.Add(-time.Hour),
			addrs("10.0.0.1", "10.0.0.2", "10.0.0.3")},
		{"all unfit: every instance, never nothing", map[string]time.Time{"n2": stale, "n3": stale}, map[string]state.Report{"n1": unhealthy("web")}, now.Add(-time.Hour),
			addrs("10.0.0.1", "10.0.0.2", "10.0.0.3")},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			f := &feed{self: "n1", replica: &fakeReplica{roster: roster, reports: tc.reports}, seen: func() map[string]time.Time { return tc.seen },
				started: tc.started, within: func() time.Duration { return 6 * time.Second }, now: func() time.Time { return now }}
			r, err := f.Roster(context.Background())
			if err != nil {
				t.Fatal(err)
			}
			if got := r.Names["web.internal"]; !slices.Equal(got, tc.want) {
				t.Fatalf("web.internal answers %v, want %v", got, tc.want)
			}
			if r.Domain != "internal" || r.Serial != 42 {
				t.Fatalf("domain %q serial %d", r.Domain, r.Serial)
			}
		})
	}
}

// The index the feed patches after a change of names only answers what an
// index built whole from the same replica answers, through assigns,
// unassigns, names that move between nodes, nodes that join and leave
// (their PTRs among them), reports that turn a module unhealthy and back,
// and nodes that stop being heard from; and it is patched, not built
// whole, when only names moved.
func TestFeedIndexPatchesNames(t *testing.T) {
	rnd := rand.New(rand.NewPCG(7, 8))
	now := time.Date(2026, 12, 1, 12, 0, 0, 0, time.UTC)
	nodes := []string{"n1", "n2", "n3", "n4"}
	seen := map[string]time.Time{"n2": now, "n3": now, "n4": now}
	rep := &fakeReplica{reports: map[string]state.Report{}, overlay: state.DefaultOverlay}
	f := &feed{self: "n1", replica: rep, seen: func() map[string]time.Time { return maps.Clone(seen) },
		started: now.Add(-time.Hour), within: func() time.Duration { return 6 * time.Second }, now: func() time.Time { return now }}
	placed := map[[2]string]bool{} // module, node
	joined := map[string]bool{}    // nodes with their own name
	var last *dnsd.Index
	patched := 0
	for round := range 400 {
		onlyNames := true
		switch k := rnd.IntN(10); {
		case k < 7: // assign or unassign
			p := [2]string{fmt.Sprint("m", rnd.IntN(30)), nodes[rnd.IntN(len(nodes))]}
			placed[p] = !placed[p]
		case k == 7: // a module turns unhealthy on a node, or well again
			n := nodes[rnd.IntN(len(nodes))]
			if _, ok := rep.reports[n]; ok {
				delete(rep.reports, n)
			} else {
				rep.reports[n] = state.Report{Health: []state.ContainerHealth{{Module: fmt.Sprint("m", rnd.IntN(30)), Status: state.HealthUnhealthy}}}
			}
			onlyNames = false
		case k == 8: // a node stops being heard from, or is heard again
			n := nodes[1+rnd.IntN(len(nodes)-1)]
			if seen[n].Equal(now) {
				seen[n] = now.Add(-time.Minute)
			} else {
				seen[n] = now
			}
			onlyNames = false
		case k == 9: // a node joins or leaves: its own name, and its PTR
			n := nodes[rnd.IntN(len(nodes))]
			joined[n] = !joined[n]
		}
		rep.roster = nil
		for p, on := range placed {
			if on {
				rep.roster = append(rep.roster, state.Name{Name: p[0] + ".internal", Address: "100.90.0." + p[1][1:], Node: p[1]})
			}
		}
		for n, on := range joined {
			if on {
				rep.roster = append(rep.roster, state.Name{Name: n + ".internal", Address: "100.90.0." + n[1:], Node: n})
			}
		}
		state.SortRoster(rep.roster)
		ix, err := f.Index(context.Background(), last)
		if err != nil {
			t.Fatal(err)
		}
		whole := &feed{self: "n1", replica: rep, seen: f.seen, started: f.started, within: f.within, now: f.now}
		want, err := whole.Index(context.Background(), nil)
		if err != nil {
			t.Fatal(err)
		}
		if !ix.Equal(want) {
			t.Fatalf("round %d: the feed's index answers other names than one built whole", round)
		}
		if last != nil && onlyNames && ix != last && f.lastPatched {
			patched++
		}
		if !onlyNames && f.lastPatched {
			t.Fatalf("round %d: patched after a change of fitness", round)
		}
		last = ix
	}
	if patched < 200 {
		t.Fatalf("patched %d of 400 indexes: a change of names only should patch", patched)
	}
}

// ptrOf is what ix answers to a PTR of addr.
func ptrOf(t *testing.T, ix *dnsd.Index, addr string) dnsd.Result {
	t.Helper()
	name, err := dns.ReverseAddr(addr)
	if err != nil {
		t.Fatal(err)
	}
	return ix.Lookup(dns.Question{Name: name, Qtype: dns.TypePTR, Qclass: dns.ClassINET}, 5)
}

// The resolver answers the PTRs of the overlay's addresses itself, with
// the node's own name (not a module's that answers the same address),
// and never forwards them; with the overlay off, nothing changes.
func TestFeedAnswersTheOverlaysReverseNames(t *testing.T) {
	now := time.Date(2026, 12, 1, 12, 0, 0, 0, time.UTC)
	onOverlay := []state.Name{
		{Name: "db.internal", Address: "100.90.0.2", Node: "n2"},
		{Name: "n1.internal", Address: "100.90.0.1", Node: "n1"},
		{Name: "n2.internal", Address: "100.90.0.2", Node: "n2"},
		{Name: "web.internal", Address: "100.90.0.2", Node: "n2"},
	}
	// While a mesh made by an earlier release upgrades, the nodes' names
	// answer their mesh addresses.
	upgrading := []state.Name{
		{Name: "n1.internal", Address: "10.0.0.1", Node: "n1"},
		{Name: "n2.internal", Address: "10.0.0.2", Node: "n2"},
	}
	cases := []struct {
		name    string
		overlay string
		roster  []state.Name
		addr    string
		forward bool
		answer  string // the PTR's target, "" for NXDOMAIN
	}{
		{"a node's address", state.DefaultOverlay, onOverlay, "100.90.0.2", false, "n2.internal."},
		{"this node's address", state.DefaultOverlay, onOverlay, "100.90.0.1", false, "n1.internal."},
		{"an unused address", state.DefaultOverlay, onOverlay, "100.90.7.9", false, ""},
		{"just outside the prefix", state.DefaultOverlay, onOverlay, "100.91.0.1", true, ""},
		{"a public address", state.DefaultOverlay, onOverlay, "192.0.2.1", true, ""},
		{"a /12 overlay", "172.16.0.0/12", []state.Name{{Name: "n1.internal", Address: "172.20.0.1", Node: "n1"}}, "172.20.0.1", false, "n1.internal."},
		{"beside a /12 overlay", "172.16.0.0/12", []state.Name{{Name: "n1.internal", Address: "172.20.0.1", Node: "n1"}}, "172.32.0.1", true, ""},
		{"upgrading: no name yet, still answered here", state.DefaultOverlay, upgrading, "100.90.0.2", false, ""},
		{"overlay off", state.OverlayOff, upgrading, "100.90.0.2", true, ""},
		{"a mesh without an overlay yet", "", upgrading, "100.90.0.2", true, ""},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			f := &feed{self: "n1", replica: &fakeReplica{roster: tc.roster, overlay: tc.overlay}, seen: func() map[string]time.Time { return nil },
				started: now, within: func() time.Duration { return 6 * time.Second }, now: func() time.Time { return now }}
			ix, err := f.Index(context.Background(), nil)
			if err != nil {
				t.Fatal(err)
			}
			r := ptrOf(t, ix, tc.addr)
			if r.Forward != tc.forward {
				t.Fatalf("PTR %s forwarded %v, want %v", tc.addr, r.Forward, tc.forward)
			}
			if tc.forward {
				return
			}
			var got string
			if len(r.Answer) == 1 {
				got = r.Answer[0].(*dns.PTR).Ptr
			}
			if got != tc.answer || len(r.Answer) > 1 || (tc.answer == "") != (r.Rcode == dns.RcodeNameError) {
				t.Fatalf("PTR %s: %s %v, want %q", tc.addr, dns.RcodeToString[r.Rcode], r.Answer, tc.answer)
			}
		})
	}
}
