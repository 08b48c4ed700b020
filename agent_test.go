package main

import (
	"testing"
	"time"

	"mesh/cluster"
	"mesh/state"
)

// Issue 10: which roster entries the resolver may answer with. An instance
// is left out when its node is unreachable from here or its module's
// container there is unhealthy; this node is always reachable; a node not
// heard from yet gets ReachableWithin after the agent starts.
func TestInstanceUp(t *testing.T) {
	now := time.Now()
	reports := map[string]state.Report{
		"n2": {Node: "n2", Health: []state.ContainerHealth{{Module: "web", Container: "web.server", Status: state.HealthUnhealthy}}},
		"n3": {Node: "n3", Health: []state.ContainerHealth{{Module: "web", Container: "web.server", Status: state.HealthHealthy}}},
	}
	seen := map[string]cluster.Seen{
		"n2": {LastSeen: now},
		"n3": {LastSeen: now},
		"n4": {LastSeen: now.Add(-time.Minute)},
	}
	longAgo := now.Add(-time.Hour)
	for _, tc := range []struct {
		name    string
		entry   state.Name
		started time.Time
		want    bool
	}{
		{"this node", state.Name{Name: "web.internal", Node: "n1"}, longAgo, true},
		{"unhealthy container there", state.Name{Name: "web.internal", Node: "n2"}, longAgo, false},
		{"another module on that node is fine", state.Name{Name: "db.internal", Node: "n2"}, longAgo, true},
		{"healthy and reachable", state.Name{Name: "web.internal", Node: "n3"}, longAgo, true},
		{"not heard from for a minute", state.Name{Name: "web.internal", Node: "n4"}, longAgo, false},
		{"never heard from, agent up for long", state.Name{Name: "web.internal", Node: "n5"}, longAgo, false},
		{"never heard from, agent just started", state.Name{Name: "web.internal", Node: "n5"}, now, true},
	} {
		up := instanceUp("n1", reports, seen, tc.started, "internal")
		if got := up(tc.entry); got != tc.want {
			t.Errorf("%s: %v, want %v", tc.name, got, tc.want)
		}
	}
}
