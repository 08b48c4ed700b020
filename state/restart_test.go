package state

import (
	"context"
	"math/rand/v2"
	"strings"
	"testing"
)

const restartAppSrc = `module: app
resources:
  - container: app.server
    image: docker.io/library/busybox:1.36
  - container: app.sidecar
    image: docker.io/library/busybox:1.36
`

// A restart is recorded per scope and reaches the plans of the containers
// it names only; what it cannot name is refused, changing nothing.
func TestModuleRestart(t *testing.T) {
	ctx := context.Background()
	s := openStore(t)
	var idx uint64
	mustApply(t, s, &idx, &InitRequest{MeshID: "m-1", Node: Node{Name: "ace", Address: "10.0.0.1"}})
	mustApply(t, s, &idx, &NodeAddRequest{Node: Node{Name: "bee", Address: "10.0.0.2"}})
	mustApply(t, s, &idx, &ModuleAddRequest{Modules: []ModuleSpec{spec("app.yaml", restartAppSrc), spec("wiki.yaml", edgeWikiSrc),
		spec("idle.yaml", "module: idle\nresources:\n  - container: idle.web\n    image: docker.io/library/busybox:1.36\n")}})
	mustApply(t, s, &idx, &AssignRequest{Assignment: Assignment{Node: "ace", Module: "app"}})
	mustApply(t, s, &idx, &AssignRequest{Assignment: Assignment{Node: "bee", Module: "app"}})
	restartsIn := func(node string) map[string]uint64 {
		pv, err := s.Plan(ctx, node)
		if err != nil {
			t.Fatal(err)
		}
		m := map[string]uint64{}
		for _, r := range pv.Plan.Resources {
			if r.Restart > 0 {
				m[r.Name] = r.Restart
			}
		}
		return m
	}
	mustApply(t, s, &idx, &ModuleRestartRequest{Module: "app", Container: "app.server", Node: "bee"})
	at := idx
	if a, b := restartsIn("ace"), restartsIn("bee"); len(a) != 0 || len(b) != 1 || b["app.server"] != at {
		t.Fatalf("one container on bee: ace %v, bee %v", a, b)
	}
	mustApply(t, s, &idx, &ModuleRestartRequest{Module: "app"})
	if a := restartsIn("ace"); a["app.server"] != idx || a["app.sidecar"] != idx {
		t.Fatalf("the whole module: %v", a)
	}
	// The plan's diff says why it moved; the preview names a restart.
	pv, _ := s.Plan(ctx, "ace")
	h, _ := s.PlanHistory(ctx, "ace", 2)
	if acts := PlanActions(h[1].Plan, pv.Plan); len(acts) != 2 || acts[0].Do != "restart" || !strings.Contains(acts[0].Why, "mesh restart") {
		t.Fatalf("actions of a restart: %+v", acts)
	}
	for _, c := range []struct {
		r    *ModuleRestartRequest
		want string
	}{
		{&ModuleRestartRequest{Module: "nope"}, "nope"},
		{&ModuleRestartRequest{Module: "app", Container: "app.db"}, `module app has no container "app.db" (it has app.server, app.sidecar)`},
		{&ModuleRestartRequest{Module: "wiki"}, "module wiki has no container: there is nothing to restart"},
		{&ModuleRestartRequest{Module: "app", Node: "nobody"}, "nobody"},
		{&ModuleRestartRequest{Module: "idle"}, "module idle is assigned to no node: there is nothing to restart"},
	} {
		before := dumpJSON(t, s)
		if err := applyErr(t, s, &idx, c.r); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: %v, want %q", c.r.describe(), err, c.want)
		} else if !sameState(before, dumpJSON(t, s)) {
			t.Errorf("%s: refused, but it changed the state", c.r.describe())
		}
	}
	mustApply(t, s, &idx, &UnassignRequest{Assignment: Assignment{Node: "ace", Module: "app"}})
	mustApply(t, s, &idx, &UnassignRequest{Assignment: Assignment{Node: "bee", Module: "app"}})
	mustApply(t, s, &idx, &ModuleRemoveRequest{Name: "app"})
	var left int
	if err := s.db.QueryRow(`SELECT count(*) FROM restarts`).Scan(&left); err != nil || left != 0 {
		t.Fatalf("module remove left %d restarts (%v)", left, err)
	}
}

// restartOf looks up the four scopes that name a container; it gives what
// a walk of every restart gives.
func TestRestartOfIsAWalk(t *testing.T) {
	rng := rand.New(rand.NewPCG(5, 8))
	pick := func(xs ...string) string { return xs[rng.IntN(len(xs))] }
	for round := range 500 {
		in := Input{Restarts: map[RestartKey]uint64{}}
		for range rng.IntN(12) {
			in.Restarts[RestartKey{Module: pick("a", "b"), Container: pick("", "a.s", "b.s", "a.t"), Node: pick("", "n1", "n2")}] = rng.Uint64N(100)
		}
		mod, name, node := pick("a", "b"), pick("a.s", "b.s", "a.t"), pick("n1", "n2")
		var want uint64
		for k, i := range in.Restarts {
			if k.Module == mod && (k.Container == "" || k.Container == name) && (k.Node == "" || k.Node == node) {
				want = max(want, i)
			}
		}
		if got := in.restartOf(mod, name, node); got != want {
			t.Fatalf("round %d: restart of %s %s on %s: %d, a walk gives %d (%v)", round, mod, name, node, got, want, in.Restarts)
		}
	}
}
