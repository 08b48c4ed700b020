package reconciler

import (
	"context"
	"strings"
	"sync"
	"testing"
	"time"

	"mesh/state"
)

const soloTmpl = `module: {{name}}
resources:
  - directory: {{d}}/{{name}}
  - container: {{name}}.server
    image: localhost/busybox:1
    mounts: ["{{d}}/{{name}}:/data"]
`

func solo(dir, name string) string {
	return strings.ReplaceAll(strings.ReplaceAll(soloTmpl, "{{d}}", dir), "{{name}}", name)
}

// Modules that share nothing apply at once: their containers' starts
// overlap. Related ones (app takes a binding and a credential from db) keep
// the plan's order.
func TestUnrelatedModulesOverlap(t *testing.T) {
	b := newBed(t)
	gate, peak := overlapGate()
	b.rt.starting = func(name string) {
		if strings.HasPrefix(name, "solo") {
			gate()
		}
	}
	b.in.Assignments = append(b.in.Assignments, state.Assignment{Node: "ace", Module: "solo1"}, state.Assignment{Node: "ace", Module: "solo2"})
	var srcs []string
	for _, src := range []string{appTmpl, dbTmpl} {
		srcs = append(srcs, strings.NewReplacer("{{d}}", b.dir, "{{gate}}", "", "{{data}}", "").Replace(src))
	}
	srcs = append(srcs, solo(b.dir, "solo1"), solo(b.dir, "solo2"))
	plan := composeAce(t, &b.in, srcs)
	rep := b.r.Apply(context.Background(), 1, plan)
	if rep.Error != "" {
		t.Fatal(rep.Error)
	}
	if peak() < 2 {
		t.Fatalf("the two unrelated modules' starts never overlapped (peak %d)", peak())
	}
	// The reports come in plan order, whatever order the work finished in.
	if len(rep.Resources) < len(plan.Resources) {
		t.Fatalf("%d reports for %d resources", len(rep.Resources), len(plan.Resources))
	}
	for i, res := range plan.Resources {
		if got := rep.Resources[i]; got.Name != res.RuntimeName() || got.Module != res.Module {
			t.Fatalf("report %d is %s %s, want %s %s", i, got.Module, got.Name, res.Module, res.RuntimeName())
		}
	}
	for _, name := range []string{"solo1.server", "solo2.server", "app.server", "app.sidecar"} {
		if c := b.rt.byName(name); c == nil || !c.Running {
			t.Fatalf("%s not running", name)
		}
	}
	// A second pass changes nothing.
	if rep := b.r.Apply(context.Background(), 1, plan); rep.Mutations != 0 || rep.Error != "" {
		t.Fatalf("second pass: %d mutations, %q", rep.Mutations, rep.Error)
	}
}

// overlapGate returns a call that holds its caller until a second caller is
// in it too (or a second has passed: then they came one after the other),
// and the most callers that were in it at once.
func overlapGate() (gate func(), peak func() int) {
	var mu sync.Mutex
	inFlight, most := 0, 0
	both := make(chan struct{})
	gate = func() {
		mu.Lock()
		inFlight++
		most = max(most, inFlight)
		if inFlight == 2 {
			close(both)
		}
		mu.Unlock()
		select {
		case <-both:
		case <-time.After(time.Second):
		}
		mu.Lock()
		inFlight--
		mu.Unlock()
	}
	return gate, func() int { mu.Lock(); defer mu.Unlock(); return most }
}

// related decides which modules wait for which.
func TestRelatedModules(t *testing.T) {
	dir := t.TempDir()
	in := state.Input{Domain: "internal", Nodes: []state.Node{{Name: "ace", Address: "10.0.0.1"}},
		Assignments: []state.Assignment{{Node: "ace", Module: "app"}, {Node: "ace", Module: "db"}, {Node: "ace", Module: "solo1"}, {Node: "ace", Module: "nested"}, {Node: "ace", Module: "reader"}},
		Credentials: map[state.Pair]string{{Consumer: "app", Provider: "db"}: state.SecretDigest("s")},
	}
	nested := `module: nested
resources:
  - directory: ` + dir + `/solo1/sub
`
	// A mount's host path is always declared above it in its own module
	// (mesh check refuses others), so modules relate through their paths.
	reader := `module: reader
resources:
  - directory: ` + dir + `/reader
  - container: reader.server
    image: localhost/busybox:1
    mounts: ["` + dir + `/reader:/in:ro"]
`
	var srcs []string
	for _, src := range []string{appTmpl, dbTmpl} {
		srcs = append(srcs, strings.NewReplacer("{{d}}", dir, "{{content}}", "x", "{{stepcmd}}", "true", "{{gate}}", "", "{{data}}", "").Replace(src))
	}
	srcs = append(srcs, solo(dir, "solo1"), nested, reader)
	plan := composeAce(t, &in, srcs)
	refs := map[string]moduleRefs{}
	for _, m := range []string{"app", "db", "solo1", "nested", "reader"} {
		var idx []int
		for i, r := range plan.Resources {
			if r.Module == m {
				idx = append(idx, i)
			}
		}
		refs[m] = refsOf(plan, idx)
	}
	for _, tc := range []struct {
		a, b string
		want bool
	}{
		{"app", "db", true},       // a binding and a credential
		{"solo1", "nested", true}, // a directory under another module's
		{"app", "solo1", false},
		{"db", "reader", false},
		{"solo1", "reader", false},
		{"nested", "reader", false},
	} {
		if got := related(tc.a, refs[tc.a], tc.b, refs[tc.b]); got != tc.want {
			t.Errorf("related(%s, %s) = %v, want %v", tc.a, tc.b, got, tc.want)
		}
		if got := related(tc.b, refs[tc.b], tc.a, refs[tc.a]); got != tc.want {
			t.Errorf("related(%s, %s) = %v, want %v", tc.b, tc.a, got, tc.want)
		}
	}
	// A plan whose values were never parsed relates to everything.
	u := refs["solo1"]
	u.unknown = true
	if !related("solo1", u, "app", refs["app"]) {
		t.Error("an unparsed module is not related to everything")
	}
}
