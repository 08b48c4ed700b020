package state

import (
	"testing"
	"time"
)

// Issue 10: which roster entries the resolver may answer with. An instance
// is left out when its node is unreachable from here or its module's
// container there is unhealthy; this node is always reachable; a node not
// heard from yet gets Within after the agent starts.
func TestFit(t *testing.T) {
	now := time.Now()
	reports := map[string]Report{
		"n2": {Node: "n2", Health: []ContainerHealth{{Module: "web", Container: "web.server", Status: HealthUnhealthy}}},
		"n3": {Node: "n3", Health: []ContainerHealth{{Module: "web", Container: "web.server", Status: HealthHealthy}}},
	}
	seen := map[string]time.Time{"n2": now, "n3": now, "n4": now.Add(-time.Minute)}
	longAgo := now.Add(-time.Hour)
	for _, tc := range []struct {
		name    string
		entry   Name
		started time.Time
		want    bool
	}{
		{"this node", Name{Name: "web.internal", Node: "n1"}, longAgo, true},
		{"unhealthy container there", Name{Name: "web.internal", Node: "n2"}, longAgo, false},
		{"another module on that node is fine", Name{Name: "db.internal", Node: "n2"}, longAgo, true},
		{"healthy and reachable", Name{Name: "web.internal", Node: "n3"}, longAgo, true},
		{"not heard from for a minute", Name{Name: "web.internal", Node: "n4"}, longAgo, false},
		{"never heard from, agent up for long", Name{Name: "web.internal", Node: "n5"}, longAgo, false},
		{"never heard from, agent just started", Name{Name: "web.internal", Node: "n5"}, now, true},
	} {
		up := Fit(reports, Reach{Self: "n1", LastSeen: seen, Now: now, Started: tc.started, Within: 6 * time.Second}, "internal")
		if got := up(tc.entry); got != tc.want {
			t.Errorf("%s: %v, want %v", tc.name, got, tc.want)
		}
	}
}
