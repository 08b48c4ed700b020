package reconciler

import (
	"slices"
	"strings"
	"testing"

	"mesh/state"
)

// A rootful node gives each module's containers a network of their own:
// made before the first of them, replacing once (and saying why) a
// container made on the bridge every module shared, never re-running a
// step for it, costing nothing on a quiet pass, removed with the module's
// last container, and never taken from an operator who named a network so.
func TestModulesRunOnNetworksOfTheirOwn(t *testing.T) {
	b := newBed(t)
	if rep := b.apply(); rep.Error != "" {
		t.Fatal(rep.Error)
	}
	for _, s := range b.rt.specs {
		if s.Network != "" {
			t.Fatalf("%s is on network %q without module networks", s.Name, s.Network)
		}
	}

	// The upgrade meets an operator's network of the module network's
	// name: the module waits, saying so, and its containers keep running
	// (a replacement's network comes before the old container goes).
	server := b.rt.byName("app.server").ID
	b.rt.nets = map[string]Network{"mesh-app": {Name: "mesh-app", Labels: map[string]string{"owner": "operator"}}}
	b.r.cfg.ModuleNetworks = true
	made := 0
	b.r.cfg.NetworkMade = func() { made++ }
	b.r.cfg.ClearBridge = func(name string) error {
		b.rt.calls = append(b.rt.calls, "clear "+name)
		return nil
	}
	bridge := ModuleNetwork("app").Interface
	rep := b.apply()
	if o := outcome(rep, "app.server"); o.Outcome != state.Failed || !strings.Contains(o.Reason, "is not the mesh's network of module app; remove it (podman network rm mesh-app)") {
		t.Fatalf("app.server beside the operator's network: %s %q", o.Outcome, o.Reason)
	}
	if c := b.rt.byName("app.server"); c == nil || c.ID != server || !c.Running {
		t.Fatalf("the container the refused replacement would replace is gone: %+v", c)
	}
	delete(b.rt.nets, "mesh-app")

	rep = b.apply()
	if rep.Error != "" {
		t.Fatal(rep.Error)
	}
	for _, n := range []string{"app.server", "app.sidecar"} {
		if o := outcome(rep, n); o.Outcome != state.Replaced || o.Reason != "network changed" {
			t.Errorf("%s on the module's network: %s %q, want replaced, network changed", n, o.Outcome, o.Reason)
		}
	}
	if o := outcome(rep, "app.migrate"); o.Outcome != state.Unchanged {
		t.Errorf("the step ran again for the network: %s %q", o.Outcome, o.Reason)
	}
	madeAt := slices.Index(b.rt.calls, "network create mesh-app")
	first := slices.IndexFunc(b.rt.calls, func(c string) bool { return strings.HasPrefix(c, "create ") })
	if clearAt := slices.Index(b.rt.calls, "clear "+bridge); clearAt < 0 || clearAt > madeAt {
		t.Fatalf("a bridge left of the name is not cleared before the network is made: %v", b.rt.calls)
	}
	if madeAt < 0 || first < madeAt || made != 1 {
		t.Fatalf("the network is not made (and told, %d times) before the module's first container: %v", made, b.rt.calls)
	}
	if slices.Contains(b.rt.calls, "network create mesh-db") {
		t.Errorf("a network for db, which runs no container: %v", b.rt.calls)
	}
	n := b.rt.nets["mesh-app"]
	if n.Labels[LabelManaged] != "1" || n.Labels[LabelModule] != "app" || !strings.HasPrefix(n.Interface, BridgePrefix) || len(n.Interface) > 15 {
		t.Errorf("network %+v", n)
	}
	for _, name := range []string{"app.server", "app.sidecar"} {
		if c := b.rt.byName(name); c == nil || b.rt.specs[c.ID].Network != "mesh-app" {
			t.Errorf("%s is not on mesh-app", name)
		}
	}

	if rep := b.apply(); rep.Error != "" || rep.Mutations != 0 {
		t.Fatalf("a quiet pass: %d mutations, %q: %v", rep.Mutations, rep.Error, b.rt.calls)
	}

	// A step that runs again runs on its module's network.
	b.vars["stepcmd"] = "echo again"
	stepOn := "(did not run)"
	b.rt.exit = func(s Spec) int { stepOn = s.Network; return 0 }
	if rep := b.apply(); outcome(rep, "app.migrate").Outcome != state.Ran {
		t.Fatalf("the step: %+v", outcome(rep, "app.migrate"))
	}
	if stepOn != "mesh-app" {
		t.Errorf("the step ran on %q", stepOn)
	}

	// The module goes: its network goes with its last container.
	b.in.Assignments = b.in.Assignments[1:]
	if rep := b.apply(); rep.Error != "" {
		t.Fatal(rep.Error)
	}
	if _, ok := b.rt.nets["mesh-app"]; ok || !slices.Contains(b.rt.calls, "network rm mesh-app") {
		t.Fatalf("the network outlived its module: %v", b.rt.calls)
	}

	// A network of that name that is not the mesh's is neither used nor
	// removed, and the module says what to do.
	b.rt.nets["mesh-app"] = Network{Name: "mesh-app", Labels: map[string]string{"owner": "operator"}}
	b.in.Assignments = append(b.in.Assignments, state.Assignment{Node: "ace", Module: "app"})
	rep = b.apply()
	if o := outcome(rep, "app.server"); o.Outcome != state.Failed && o.Outcome != state.Waiting {
		t.Fatalf("a container on the operator's network: %+v", o)
	}
	if !strings.Contains(rep.Error, "is not the mesh's network of module app; remove it (podman network rm mesh-app)") {
		t.Fatalf("the refusal: %q", rep.Error)
	}
	b.in.Assignments = b.in.Assignments[:1]
	b.apply()
	if _, ok := b.rt.nets["mesh-app"]; !ok {
		t.Fatal("the operator's network was removed")
	}
}
