package state

import (
	"context"
	"strings"
	"testing"
	"time"

	"mesh/state/manifest"
)

// Progress waits for the reached nodes to apply and stay healthy for
// healthy-for, then reaches the next nodes (max-parallel of them) or ends;
// it stops the rollout on an unhealthy container, a failed apply or an
// exit since the rollout started.
func TestProgress(t *testing.T) {
	now := time.Date(2026, 12, 1, 12, 0, 0, 0, time.UTC)
	checked := Resource{Module: "app", Kind: manifest.KindContainer, Name: "app.server", Typed: manifest.Typed{Health: &manifest.HealthCheck{}}}
	plan := func(v uint64) PlanVersion {
		return PlanVersion{Version: v, Plan: &Plan{Resources: []Resource{checked}}}
	}
	r := Rollout{Module: "app", To: 50, State: RolloutRunning, Nodes: []string{"c", "a", "b"}, Reached: []string{"c"},
		StartedAt: now.Add(-time.Minute), StepAt: now.Add(-time.Minute), Policy: Policy{MaxParallel: 2, HealthyFor: 10 * time.Second, AutoRevert: true}}
	plans := map[string]PlanVersion{"c": plan(50), "a": plan(40), "b": plan(40)}
	healthy := func(v uint64, since time.Duration) Report {
		return Report{Version: v, Health: []ContainerHealth{{Module: "app", Container: "app.server", Status: HealthHealthy, Since: now.Add(-since)}}}
	}
	for _, c := range []struct {
		what    string
		rep     Report
		waiting string
		step    string
	}{
		{"not applied yet", healthy(49, time.Hour), "1/3 nodes, waiting on c to apply plan v50", ""},
		{"starting", Report{Version: 50}, "1/3 nodes, waiting on c: app.server starting", ""},
		{"healthy 4s", healthy(50, 4*time.Second), "1/3 nodes, waiting on c: app.server healthy 4s/10s", ""},
		{"healthy 10s", healthy(50, 10*time.Second), "", "rollout of app to v50 moves on to a, b (c healthy for 10s)"},
		{"unhealthy", Report{Version: 50, Health: []ContainerHealth{{Module: "app", Container: "app.server", Status: HealthUnhealthy, Output: "connection refused"}}},
			"", "rollout of app to v50 stopped: c: container app.server is unhealthy: connection refused"},
		{"apply failed", Report{Version: 50, Failures: []ModuleFailure{{Module: "app", Resource: "step app.migrate", Reason: "exited with code 1"}}},
			"", "rollout of app to v50 stopped: c: step app.migrate failed: exited with code 1"},
		{"waits for a backup", Report{Version: 50, Failures: []ModuleFailure{{Module: "app", Resource: "secret /srv/app/data/token", Reason: "the backup of app reads /srv/app/data", Backup: "app"}}},
			"1/3 nodes, waiting on c: secret /srv/app/data/token waits, the backup of app reads /srv/app/data", ""},
		{"exited", Report{Version: 50, Exits: []ContainerExit{{Module: "app", Container: "app.server", ExitCode: 137, At: now}}},
			"", "rollout of app to v50 stopped: c: container app.server exited with code 137"},
		{"an exit before the rollout", func() Report {
			rep := healthy(50, time.Hour)
			rep.Exits = []ContainerExit{{Module: "app", Container: "app.server", ExitCode: 1, At: now.Add(-time.Hour)}}
			return rep
		}(), "", "rollout of app to v50 moves on to a, b (c healthy for 10s)"},
	} {
		got := Progress(r, plans, map[string]Report{"c": c.rep}, nil, now)
		step := ""
		if got.Step != nil {
			step = got.Step.describe()
		}
		if got.Waiting != c.waiting || step != c.step {
			t.Errorf("%s: waiting %q step %q; want %q %q", c.what, got.Waiting, step, c.waiting, c.step)
		}
	}
	// A reached node whose plan does not compose, and a wait past the
	// deadline, stop the rollout.
	if got := Progress(r, plans, map[string]Report{"c": healthy(50, time.Hour)}, map[string]string{"c": "a secret is not sealed yet"}, now); got.Step == nil || !strings.Contains(got.Step.Failed, "c: its plan does not compose: a secret is not sealed yet") {
		t.Fatalf("compose error: %+v", got)
	}
	late := r
	late.StepAt = now.Add(-ProgressDeadline - time.Second)
	if got := Progress(late, plans, map[string]Report{"c": healthy(49, time.Hour)}, nil, now); got.Step == nil || !strings.Contains(got.Step.Failed, "no progress for 10m0s: 1/3 nodes, waiting on c to apply plan v50") {
		t.Fatalf("deadline: %+v", got)
	}
	// A reached node that waits for a backup (which reads for hours) does
	// not use up the deadline: the step is taken again for it every
	// RefreshEvery (it reaches no node anew: the FSM only starts the
	// deadline again), for up to BackupWaitLimit from its report.
	backup := Report{Version: 50, AppliedAt: now.Add(-5 * time.Hour), Failures: []ModuleFailure{{Module: "app", Resource: "secret /srv/app/data/token", Reason: "the backup of app reads /srv/app/data", Backup: "app"}}}
	for _, ago := range []time.Duration{RefreshEvery + time.Second, ProgressDeadline + time.Second, 5 * time.Hour} {
		waited := r
		waited.StepAt = now.Add(-ago)
		got := Progress(waited, plans, map[string]Report{"c": backup}, nil, now)
		if got.Step == nil || !got.Refresh || got.Step.Failed != "" || got.Step.Done || len(got.Step.Reach) != 1 || got.Step.Reach[0] != "c" ||
			!strings.Contains(got.Waiting, "waiting on c: secret /srv/app/data/token waits, the backup of app reads /srv/app/data") {
			t.Fatalf("a backup's wait for %s: %+v %+v", ago, got, got.Step)
		}
	}
	if got := Progress(r, plans, map[string]Report{"c": backup}, nil, now); got.Step != nil || got.Refresh {
		t.Fatalf("a backup's wait of less than %s: %+v", RefreshEvery, got.Step)
	}
	// Past the limit (a node that went down while it waited keeps saying
	// so; a fence never lifted), the deadline stops it: counted from when
	// the node first saw the wait, though a later report of it (a new plan
	// for another module) is recent.
	stale := backup
	stale.AppliedAt = now.Add(-BackupWaitLimit - time.Second)
	seen := backup
	seen.AppliedAt = now.Add(-time.Minute)
	seen.Failures = []ModuleFailure{backup.Failures[0]}
	seen.Failures[0].Since = now.Add(-BackupWaitLimit - time.Second)
	for what, rep := range map[string]Report{"an older mesh's report": stale, "a wait seen long ago, reported again": seen} {
		if got := Progress(late, plans, map[string]Report{"c": rep}, nil, now); got.Step == nil || !strings.Contains(got.Step.Failed, "no progress for 10m0s: 1/3 nodes, waiting on c: secret /srv/app/data/token waits") {
			t.Fatalf("%s: a backup's wait past %s: %+v", what, BackupWaitLimit, got.Step)
		}
	}
	// The node's own exit, and the other reached nodes' failures, stop it
	// while it waits.
	two := late
	two.Reached = []string{"c", "a"}
	twoPlans := map[string]PlanVersion{"c": plan(50), "a": plan(50), "b": plan(40)}
	exited := backup
	exited.Exits = []ContainerExit{{Module: "app", Container: "app.server", ExitCode: 137, At: now}}
	for _, c := range []struct {
		what string
		reps map[string]Report
		want string
	}{
		{"its own exit", map[string]Report{"c": exited, "a": healthy(50, time.Hour)}, "c: container app.server exited with code 137"},
		{"unhealthy on itself", map[string]Report{"c": func() Report {
			rep := backup
			rep.Health = []ContainerHealth{{Module: "app", Container: "app.server", Status: HealthUnhealthy}}
			return rep
		}(), "a": healthy(50, time.Hour)}, "c: container app.server is unhealthy"},
		{"unhealthy on another", map[string]Report{"c": backup, "a": {Version: 50, Health: []ContainerHealth{{Module: "app", Container: "app.server", Status: HealthUnhealthy}}}}, "a: container app.server is unhealthy"},
		{"failed on another", map[string]Report{"c": backup, "a": {Version: 50, Failures: []ModuleFailure{{Module: "app", Resource: "step app.migrate", Reason: "exited with code 1"}}}}, "a: step app.migrate failed"},
		{"another starts past the deadline", map[string]Report{"c": backup, "a": {Version: 50}}, "no progress for 10m0s: 2/3 nodes, waiting on a: app.server starting"},
	} {
		if got := Progress(two, twoPlans, c.reps, nil, now); got.Step == nil || got.Refresh || !strings.Contains(got.Step.Failed, c.want) {
			t.Errorf("%s while c waits for a backup: %+v %+v", c.what, got, got.Step)
		}
	}
	if got := Progress(two, twoPlans, map[string]Report{"c": backup, "a": healthy(50, time.Hour)}, nil, now); got.Step == nil || !got.Refresh || got.Step.Reach[0] != "c" {
		t.Fatalf("c waits for a backup, a healthy: %+v %+v", got, got.Step)
	}
	// The FSM takes the step again: the deadline starts anew, nothing else moves.
	ctx := context.Background()
	st, idx := appOnTwo(t, "1.35")
	mustApply(t, st, &idx, &ModuleAddRequest{Modules: []ModuleSpec{spec("app.yaml", rollApp("1.36", ""))}})
	ros, err := st.Rollouts(ctx)
	if err != nil || len(ros) != 1 || ros[0].State != RolloutRunning || len(ros[0].Reached) != 1 {
		t.Fatalf("the rollout: %+v %v", ros, err)
	}
	ro := ros[0]
	later := ro.StepAt.Add(2 * RefreshEvery)
	pv, err := st.Plan(ctx, ro.Reached[0])
	if err != nil {
		t.Fatal(err)
	}
	refresh := Progress(ro, map[string]PlanVersion{ro.Reached[0]: pv}, map[string]Report{ro.Reached[0]: {Version: 1 << 40, AppliedAt: later, Failures: []ModuleFailure{{Module: "app", Resource: "secret /srv/app/t", Reason: "the backup of app reads /srv/app", Backup: "app"}}}}, nil, later)
	if refresh.Step == nil || !refresh.Refresh {
		t.Fatalf("no refresh: %+v", refresh)
	}
	idx++
	if err := st.Apply(idx, encodeAt(refresh.Step, later)); err != nil {
		t.Fatal(err)
	}
	ros, _ = st.Rollouts(ctx)
	if after := ros[0]; after.State != RolloutRunning || strings.Join(after.Reached, " ") != strings.Join(ro.Reached, " ") || !after.StepAt.Equal(later) {
		t.Fatalf("after the refresh: %+v, before %+v", after, ro)
	}

	// Every node reached and healthy: done.
	r.Reached = []string{"c", "a", "b"}
	plans["a"], plans["b"] = plan(50), plan(50)
	reps := map[string]Report{"c": healthy(50, time.Hour), "a": healthy(50, time.Hour), "b": healthy(51, 20*time.Second)}
	if got := Progress(r, plans, reps, nil, now); got.Step == nil || !got.Step.Done || !strings.Contains(got.Step.Why, "c, a, b healthy") {
		t.Fatalf("all healthy: %+v", got)
	}
}
