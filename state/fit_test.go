package state

import (
	"strings"
	"testing"
	"time"

	"mesh/state/manifest"
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

// A binding's health gate: the provider on that node passes every health
// check it declares, as that node last reported; one with none passes once
// its node reported an apply without a failure of it.
func TestProviderHealthy(t *testing.T) {
	checked, err := manifest.Parse("db.yaml", []byte("module: db\nresources:\n  - container: db.main\n    image: postgres:16\n    health:\n      command: [pg_isready]\n      interval: 5s\n  - container: db.side\n    image: busybox\n"))
	if err != nil {
		t.Fatal(err)
	}
	plain, err := manifest.Parse("cache.yaml", []byte("module: cache\nresources:\n  - container: cache.main\n    image: redis\n"))
	if err != nil {
		t.Fatal(err)
	}
	healthy := ContainerHealth{Module: "db", Container: "db.main", Status: HealthHealthy}
	for _, tc := range []struct {
		name    string
		man     *manifest.Manifest
		reports map[string]Report
		want    bool
		why     string
	}{
		{"no report from the node", checked, map[string]Report{"n2": {Health: []ContainerHealth{healthy}}}, false, "n1 has not reported an apply yet"},
		{"healthy there", checked, map[string]Report{"n1": {Health: []ContainerHealth{healthy}}}, true, ""},
		{"healthy on another node only", checked, map[string]Report{"n1": {}, "n2": {Health: []ContainerHealth{healthy}}}, false, "container db.main is not checked yet"},
		{"unhealthy", checked, map[string]Report{"n1": {Health: []ContainerHealth{{Module: "db", Container: "db.main", Status: HealthUnhealthy}}}}, false, "container db.main is " + HealthUnhealthy},
		{"another module's container of that name", checked, map[string]Report{"n1": {Health: []ContainerHealth{{Module: "x", Container: "db.main", Status: HealthHealthy}}}}, false, "not checked yet"},
		{"failed there", checked, map[string]Report{"n1": {Health: []ContainerHealth{healthy}, Failures: []ModuleFailure{{Module: "db", Reason: "pull failed"}}}}, false, "it failed on n1: pull failed"},
		{"waits for its backup, running, healthy", checked, map[string]Report{"n1": {Health: []ContainerHealth{healthy}, Failures: []ModuleFailure{{Module: "db", Reason: "the backup of db reads /srv/db", Backup: "db", Running: true}}}}, true, ""},
		{"waits for its backup, running, unchecked", checked, map[string]Report{"n1": {Failures: []ModuleFailure{{Module: "db", Reason: "the backup of db reads /srv/db", Backup: "db", Running: true}}}}, false, "container db.main is not checked yet"},
		// Before its containers ever ran (assigned while the backup
		// reads), or as an older mesh reported it: not healthy.
		{"waits for its backup, never ran", plain, map[string]Report{"n1": {Failures: []ModuleFailure{{Module: "cache", Reason: "the backup of cache reads /srv/c", Backup: "cache"}}}}, false, "it waits on n1: the backup of cache reads /srv/c"},
		{"waits behind its provider's backup, never ran", plain, map[string]Report{"n1": {Failures: []ModuleFailure{{Module: "cache", Reason: "waits for its provider db, which waits", Provider: "db", Backup: "db"}}}}, false, "it waits on n1"},
		{"no checks, waits for its backup, running", plain, map[string]Report{"n1": {Failures: []ModuleFailure{{Module: "cache", Reason: "the backup of cache reads /srv/c", Backup: "cache", Running: true}}}}, true, ""},
		{"waits for a gate", plain, map[string]Report{"n1": {Failures: []ModuleFailure{{Module: "cache", Reason: "gated", Provider: "db", HealthGate: true}}}}, false, "it waits on n1: gated"},
		{"no checks, applied", plain, map[string]Report{"n1": {}}, true, ""},
		{"no checks, another module failed", plain, map[string]Report{"n1": {Failures: []ModuleFailure{{Module: "db", Reason: "x"}}}}, true, ""},
		{"no checks, failed", plain, map[string]Report{"n1": {Failures: []ModuleFailure{{Module: "cache", Reason: "x"}}}}, false, "it failed on n1: x"},
	} {
		ok, why := ProviderHealthy(tc.man, tc.reports, "n1")
		if ok != tc.want || !strings.Contains(why, tc.why) || (tc.want && why != "") {
			t.Errorf("%s: %v %q, want %v %q", tc.name, ok, why, tc.want, tc.why)
		}
	}
}
