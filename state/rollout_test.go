package state

import (
	"context"
	"strconv"
	"strings"
	"testing"
)

// appOnTwo is a store whose nodes ace and bee run app (rollApp at tag),
// and the index of its last command.
func appOnTwo(t *testing.T, tag string) (*Store, uint64) {
	t.Helper()
	s := openStore(t)
	var idx uint64
	mustApply(t, s, &idx, &InitRequest{MeshID: "m-1", Node: Node{Name: "ace", Address: "10.0.0.1"}})
	mustApply(t, s, &idx, &NodeAddRequest{Node: Node{Name: "bee", Address: "10.0.0.2"}})
	mustApply(t, s, &idx, &ModuleAddRequest{Modules: []ModuleSpec{spec("app.yaml", rollApp(tag, ""))}})
	mustApply(t, s, &idx, &AssignRequest{Assignment: Assignment{Node: "ace", Module: "app"}})
	mustApply(t, s, &idx, &AssignRequest{Assignment: Assignment{Node: "bee", Module: "app"}})
	return s, idx
}

func rollApp(tag string, extra string) string {
	return `module: app
` + extra + `resources:
  - container: app.server
    image: docker.io/library/busybox:` + tag + `
    health:
      command: ["true"]
`
}

// A change to a module with a health check on several nodes reaches one
// node at a time: the others' plans keep the previous manifest until a step
// reaches them; a step decided on an older state is refused; a failed step
// puts the previous version back everywhere; the history keeps every
// version; a revert rolls back through the same rollout.
func TestRollout(t *testing.T) {
	ctx := context.Background()
	s := openStore(t)
	var idx uint64
	mustApply(t, s, &idx, &InitRequest{MeshID: "m-1", Node: Node{Name: "ace", Address: "10.0.0.1"}})
	mustApply(t, s, &idx, &NodeAddRequest{Node: Node{Name: "bee", Address: "10.0.0.2"}})
	mustApply(t, s, &idx, &NodeAddRequest{Node: Node{Name: "cat", Address: "10.0.0.3"}})
	mustApply(t, s, &idx, &ModuleAddRequest{Modules: []ModuleSpec{spec("app.yaml", rollApp("1.35", ""))}})
	v1 := idx
	for _, n := range []string{"cat", "ace", "bee"} { // assignment order: cat first
		mustApply(t, s, &idx, &AssignRequest{Assignment: Assignment{Node: n, Module: "app"}})
	}
	image := func(node string) string {
		pv, err := s.Plan(ctx, node)
		if err != nil {
			t.Fatal(err)
		}
		for _, r := range pv.Plan.Resources {
			if r.Name == "app.server" {
				return strings.TrimPrefix(r.Decl.Image, "docker.io/library/busybox:")
			}
		}
		return ""
	}
	images := func() string { return image("cat") + " " + image("ace") + " " + image("bee") }
	rollout := func() Rollout {
		rs, err := s.Rollouts(ctx)
		if err != nil || len(rs) != 1 {
			t.Fatalf("rollouts: %+v %v", rs, err)
		}
		return rs[0]
	}
	if got := images(); got != "1.35 1.35 1.35" {
		t.Fatalf("before: %s", got)
	}
	mustApply(t, s, &idx, &ModuleAddRequest{Modules: []ModuleSpec{spec("app.yaml", rollApp("1.36", ""))}})
	v2 := idx
	if got := images(); got != "1.36 1.35 1.35" {
		t.Fatalf("the rollout's first step reaches the first assigned node only: %s", got)
	}
	r := rollout()
	if r.State != RolloutRunning || r.From != v1 || r.To != v2 || strings.Join(r.Reached, " ") != "cat" || r.Policy != (Policy{1, DefaultHealthyFor, true}) {
		t.Fatalf("rollout: %+v", r)
	}
	// Refused, changing nothing: a new version mid-rollout, a stale step.
	for _, c := range []struct {
		r    Request
		want string
	}{
		{&ModuleAddRequest{Modules: []ModuleSpec{spec("app.yaml", rollApp("1.37", ""))}}, "module app is rolling out v" + itoa(v2)},
		{&RolloutStepRequest{Module: "app", To: v1, Reach: []string{"ace"}}, "is not running"},
		{&RolloutStepRequest{Module: "app", To: v2, Reach: []string{"dog"}}, "not assigned to dog"},
		{&RolloutStepRequest{Module: "app", To: v2}, "names the nodes it reaches"},
		{&RolloutStepRequest{Module: "app", To: v2, Done: true}, "has not reached ace yet"},
	} {
		before := dumpJSON(t, s)
		if err := applyErr(t, s, &idx, c.r); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Fatalf("%s: %v, want %q", c.r.describe(), err, c.want)
		} else if !sameState(before, dumpJSON(t, s)) {
			t.Fatalf("%s: refused, but it changed the state", c.r.describe())
		}
	}
	mustApply(t, s, &idx, &RolloutStepRequest{Module: "app", To: v2, Reach: []string{"ace"}, Why: "cat healthy for 10s"})
	if got := images(); got != "1.36 1.36 1.35" {
		t.Fatalf("after the second step: %s", got)
	}
	pv, _ := s.Plan(ctx, "ace")
	if !strings.Contains(pv.Cause, "rollout of app to v"+itoa(v2)+" moves on to ace (cat healthy for 10s)") {
		t.Fatalf("the plan's cause: %q", pv.Cause)
	}
	mustApply(t, s, &idx, &RolloutStepRequest{Module: "app", To: v2, Reach: []string{"bee"}, Why: "ace healthy for 10s"})
	mustApply(t, s, &idx, &RolloutStepRequest{Module: "app", To: v2, Done: true, Why: "bee healthy for 10s"})
	if got, r := images(), rollout(); got != "1.36 1.36 1.36" || r.State != RolloutDone {
		t.Fatalf("done: %s %+v", got, r)
	}

	// v3 fails on its first node: every node is back on v2.
	mustApply(t, s, &idx, &ModuleAddRequest{Modules: []ModuleSpec{spec("app.yaml", rollApp("1.37", ""))}})
	v3 := idx
	if got := images(); got != "1.37 1.36 1.36" {
		t.Fatalf("v3's first step: %s", got)
	}
	mustApply(t, s, &idx, &RolloutStepRequest{Module: "app", To: v3, Failed: "cat: container app.server is unhealthy"})
	r = rollout()
	if got := images(); got != "1.36 1.36 1.36" || r.State != RolloutReverted || r.Reason != "cat: container app.server is unhealthy" {
		t.Fatalf("after the failure: %s %+v", got, r)
	}
	if m, _ := s.Module(ctx, "app"); !strings.Contains(m.Manifest, "busybox:1.36") {
		t.Fatalf("the catalogue after a revert: %s", m.Manifest)
	}
	h, err := s.History(ctx, "app")
	if err != nil || len(h) != 3 || h[0].Version != v3 || h[1].Version != v2 || !h[1].Current || h[2].Version != v1 {
		t.Fatalf("history: %+v %v", h, err)
	}
	if !strings.Contains(h[0].Cause, "mesh module add") {
		t.Fatalf("history cause: %+v", h[0])
	}

	// mesh module revert: back to the version before (v1's manifest), as a
	// new version through a rollout.
	mustApply(t, s, &idx, &ModuleRevertRequest{Module: "app"})
	v4 := idx
	if got, r := images(), rollout(); got != "1.35 1.36 1.36" || r.To != v4 || r.From != v2 || r.State != RolloutRunning {
		t.Fatalf("revert: %s %+v", got, r)
	}
	// and a revert while it runs stops it, every node back at once.
	mustApply(t, s, &idx, &ModuleRevertRequest{Module: "app"})
	if got, r := images(), rollout(); got != "1.36 1.36 1.36" || r.State != RolloutReverted || r.Reason != "stopped by mesh module revert" {
		t.Fatalf("revert of a running rollout: %s %+v", got, r)
	}
	if err := applyErr(t, s, &idx, &ModuleRevertRequest{Module: "app", To: 12345}); err == nil || !strings.Contains(err.Error(), "no version 12345") {
		t.Fatalf("revert to an unknown version: %v", err)
	}

	// Without auto-revert, a failed rollout stops where it was; a fix rolls
	// out from the version the others still run.
	noRevert := "update: {max-parallel: 2, healthy-for: 1s, auto-revert: false}\n"
	mustApply(t, s, &idx, &ModuleAddRequest{Modules: []ModuleSpec{spec("app.yaml", rollApp("1.38", noRevert))}})
	v5 := idx
	if got := images(); got != "1.38 1.38 1.36" {
		t.Fatalf("max-parallel 2: %s", got)
	}
	mustApply(t, s, &idx, &RolloutStepRequest{Module: "app", To: v5, Failed: "ace: step failed"})
	if got, r := images(), rollout(); got != "1.38 1.38 1.36" || r.State != RolloutFailed {
		t.Fatalf("failed without revert: %s %+v", got, r)
	}
	mustApply(t, s, &idx, &ModuleAddRequest{Modules: []ModuleSpec{spec("app.yaml", rollApp("1.39", noRevert))}})
	if got, r := images(), rollout(); got != "1.39 1.39 1.36" || r.From != v2 || r.State != RolloutRunning {
		t.Fatalf("the fix: %s %+v", got, r)
	}
	mustApply(t, s, &idx, &ModuleRevertRequest{Module: "app"})
	if got, r := images(), rollout(); got != "1.36 1.36 1.36" || r.State != RolloutReverted {
		t.Fatalf("revert of a fix without auto-revert: %s %+v", got, r)
	}
	// A module without a health check or update: everywhere at once.
	mustApply(t, s, &idx, &ModuleAddRequest{Modules: []ModuleSpec{spec("app.yaml", "module: app\nresources:\n  - container: app.server\n    image: docker.io/library/busybox:1.40\n")}})
	if got := images(); got != "1.40 1.40 1.40" {
		t.Fatalf("no policy: %s", got)
	}
	if rs, _ := s.Rollouts(ctx); len(rs) != 0 {
		t.Fatalf("a change applied at once left a rollout: %+v", rs)
	}
	// A stopped rollout ends when the module is assigned nowhere: a node
	// assigned later runs the catalogue's version.
	mustApply(t, s, &idx, &ModuleAddRequest{Modules: []ModuleSpec{spec("app.yaml", rollApp("1.41", noRevert))}})
	mustApply(t, s, &idx, &RolloutStepRequest{Module: "app", To: idx, Failed: "cat: exited"})
	if r := rollout(); r.State != RolloutFailed {
		t.Fatalf("stopped: %+v", r)
	}
	mustApply(t, s, &idx, &UnassignRequest{Assignment: Assignment{Node: "ace", Module: "app"}})
	mustApply(t, s, &idx, &UnassignRequest{Assignment: Assignment{Node: "bee", Module: "app"}})
	mustApply(t, s, &idx, &UnassignRequest{Assignment: Assignment{Node: "cat", Module: "app"}})
	if rs, _ := s.Rollouts(ctx); len(rs) != 0 {
		t.Fatalf("a module assigned nowhere kept its rollout: %+v", rs)
	}
	mustApply(t, s, &idx, &ModuleRemoveRequest{Name: "app"})
	var left int
	s.db.QueryRow(`SELECT (SELECT count(*) FROM rollouts) + (SELECT count(*) FROM module_history)`).Scan(&left)
	if left != 0 {
		t.Fatalf("module remove left %d rows of rollouts and history", left)
	}
}

func itoa(v uint64) string { return strconv.FormatUint(v, 10) }

// A pull of a module that rolls out reaches its nodes as a new manifest
// does: the others' plans keep the pull index they had; a failure with
// auto-revert puts the index back everywhere (the reached nodes then put
// back their previous image: the reconciler's side).
func TestPullRollout(t *testing.T) {
	ctx := context.Background()
	s, idx := appOnTwo(t, "1.36")
	pulls := func() string {
		var out []string
		for _, n := range []string{"ace", "bee"} {
			pv, _ := s.Plan(ctx, n)
			for _, r := range pv.Plan.Resources {
				if r.Name == "app.server" {
					out = append(out, strconv.FormatUint(r.Pull, 10))
				}
			}
		}
		return strings.Join(out, " ")
	}
	if ok, err := s.RollsOut(ctx, "app"); !ok || err != nil {
		t.Fatalf("RollsOut: %v %v", ok, err)
	}
	mustApply(t, s, &idx, &ModulePullRequest{Module: "app", Rollout: true})
	p1 := idx
	if got := pulls(); got != itoa(p1)+" 0" {
		t.Fatalf("the pull's first step: %s", got)
	}
	mustApply(t, s, &idx, &RolloutStepRequest{Module: "app", To: p1, Reach: []string{"bee"}, Why: "ace healthy"})
	mustApply(t, s, &idx, &RolloutStepRequest{Module: "app", To: p1, Done: true, Why: "all healthy"})
	if got := pulls(); got != itoa(p1)+" "+itoa(p1) {
		t.Fatalf("the pull everywhere: %s", got)
	}
	mustApply(t, s, &idx, &ModulePullRequest{Module: "app", Rollout: true})
	p2 := idx
	if got := pulls(); got != itoa(p2)+" "+itoa(p1) {
		t.Fatalf("the second pull's first step: %s", got)
	}
	mustApply(t, s, &idx, &RolloutStepRequest{Module: "app", To: p2, Failed: "ace: container app.server is unhealthy"})
	rs, _ := s.Rollouts(ctx)
	if got := pulls(); got != itoa(p1)+" "+itoa(p1) || len(rs) != 1 || rs[0].State != RolloutReverted || rs[0].FromPull != p1 {
		t.Fatalf("after the failed pull: %s %+v", got, rs)
	}
	if m, _ := s.Module(ctx, "app"); !strings.Contains(m.Manifest, "busybox:1.36") {
		t.Fatalf("a pull's revert changed the manifest: %s", m.Manifest)
	}
	// What the revert does, as preview and mesh why say it.
	h, _ := s.PlanHistory(ctx, "ace", 2)
	if acts := PlanActions(h[1].Plan, h[0].Plan); len(acts) != 1 || acts[0].Do != "pull" || !strings.Contains(acts[0].Why, "a pull taken back") || !strings.Contains(h[0].Cause, "stopped: ace: container app.server is unhealthy") {
		t.Fatalf("the revert's actions: %+v (%s)", acts, h[0].Cause)
	}

	// Without auto-revert a failed pull stays where it stopped; mesh module
	// revert then takes the pull back (not the manifest).
	mustApply(t, s, &idx, &ModuleAddRequest{Modules: []ModuleSpec{spec("app.yaml", rollApp("1.36", "update: {auto-revert: false}\n"))}})
	v := idx
	mustApply(t, s, &idx, &RolloutStepRequest{Module: "app", To: v, Reach: []string{"bee"}, Why: "ace healthy"})
	mustApply(t, s, &idx, &RolloutStepRequest{Module: "app", To: v, Done: true, Why: "all healthy"})
	mustApply(t, s, &idx, &ModulePullRequest{Module: "app", Rollout: true})
	p3 := idx
	mustApply(t, s, &idx, &RolloutStepRequest{Module: "app", To: p3, Failed: "ace: exited"})
	if got := pulls(); got != itoa(p3)+" "+itoa(p1) {
		t.Fatalf("a failed pull without auto-revert: %s", got)
	}
	mustApply(t, s, &idx, &ModuleRevertRequest{Module: "app"})
	rs, _ = s.Rollouts(ctx)
	if got := pulls(); got != itoa(p1)+" "+itoa(p1) || rs[0].State != RolloutReverted {
		t.Fatalf("mesh module revert of a stopped pull: %s %+v", got, rs)
	}
	if m, _ := s.Module(ctx, "app"); !strings.Contains(m.Manifest, "auto-revert: false") {
		t.Fatalf("the revert of a pull changed the manifest: %s", m.Manifest)
	}
}
