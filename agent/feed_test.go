package agent

import (
	"context"
	"net/netip"
	"slices"
	"testing"
	"time"

	"mesh/state"
)

// fakeReplica is a replica of fixed rows.
type fakeReplica struct {
	roster  []state.Name
	reports map[string]state.Report
}

func (f *fakeReplica) Settings(context.Context) (state.Settings, error) {
	return state.Settings{Domain: "internal"}, nil
}
func (f *fakeReplica) Roster(context.Context) ([]state.Name, error) { return f.roster, nil }
func (f *fakeReplica) Reports(context.Context) (map[string]state.Report, error) {
	return f.reports, nil
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
