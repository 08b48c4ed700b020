package agent

import (
	"context"
	"fmt"
	"io"
	"math/rand/v2"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"mesh/state"
)

// movedNames steps over the runs two rosters share; what it finds must be
// what a walk of every name of both finds. The rosters are a real store's,
// before and after each of a few hundred assigns, unassigns and module
// adds in a fleet of more names than a run holds, so that most runs are
// shared and the changed ones are cut, joined and spliced.
func TestMovedNamesIsAWalkOfBoth(t *testing.T) {
	s, err := state.Open(filepath.Join(t.TempDir(), "state.db"))
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	ctx := context.Background()
	var index uint64
	at := time.Date(2026, 12, 5, 0, 0, 0, 0, time.UTC)
	apply := func(r state.Request) {
		t.Helper()
		index++
		at = at.Add(time.Second)
		c := state.NewCommand(r)
		c.Time = at
		if err := s.Apply(index, c.Encode()); err != nil {
			t.Fatalf("%s: %v", r.Op(), err)
		}
	}
	node := func(i int) string { return fmt.Sprintf("n%d", i) }
	module := func(j int) string { return fmt.Sprintf("m%04d", j) }
	const nodes, modules = 4, 1500
	apply(&state.InitRequest{MeshID: "m-moved", Domain: "internal", Node: state.Node{Name: node(0), Address: "10.2.0.1", Voter: true}})
	for i := 1; i < nodes; i++ {
		apply(&state.NodeAddRequest{Node: state.Node{Name: node(i), Address: fmt.Sprintf("10.2.0.%d", i+1)}})
	}
	var specs []state.ModuleSpec
	for j := range modules {
		sp, err := state.SpecOf(module(j)+".yaml", fmt.Sprintf("module: %s\nresources:\n  - directory: /srv/%[1]s\n", module(j)))
		if err != nil {
			t.Fatal(err)
		}
		specs = append(specs, sp)
	}
	apply(&state.ModuleAddRequest{Modules: specs})
	rnd := rand.New(rand.NewPCG(5, 6))
	on := map[int]map[int]bool{} // module -> the nodes it is assigned to
	for j := 0; j < modules*4/5; j++ {
		on[j] = map[int]bool{j % nodes: true}
	}
	for i := range nodes {
		var mods []string
		for j := i; j < modules*4/5; j += nodes {
			mods = append(mods, module(j))
		}
		apply(&state.AssignRequest{Assignment: state.Assignment{Node: node(i), Module: mods[0]}, More: mods[1:]})
	}
	before, err := s.SharedRoster(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if len(before.Runs()) < 2 {
		t.Fatalf("the roster of %d names is one run: nothing is shared", before.Len())
	}
	walk := func(b, a []state.Name) map[string]bool {
		moved := map[string]bool{}
		for _, x := range b {
			if !slices.Contains(a, x) {
				moved[x.Name] = true
			}
		}
		for _, x := range a {
			if !slices.Contains(b, x) {
				moved[x.Name] = true
			}
		}
		return moved
	}
	shared := 0
	for step := range 300 {
		// Assign a module to a node, or unassign it (a module on
		// several nodes has a name of several rows).
		j, n := rnd.IntN(modules), rnd.IntN(nodes)
		if on[j] == nil {
			on[j] = map[int]bool{}
		}
		if on[j][n] {
			apply(&state.UnassignRequest{Assignment: state.Assignment{Node: node(n), Module: module(j)}})
		} else {
			apply(&state.AssignRequest{Assignment: state.Assignment{Node: node(n), Module: module(j)}})
		}
		on[j][n] = !on[j][n]
		after, err := s.SharedRoster(ctx)
		if err != nil {
			t.Fatal(err)
		}
		got, want := movedNames(before, after), walk(before.Names(), after.Names())
		if len(want) == 0 {
			t.Fatalf("step %d moved no name", step)
		}
		if fmt.Sprint(got) != fmt.Sprint(want) {
			t.Fatalf("step %d: movedNames %v, a walk of both %v", step, got, want)
		}
		for _, r := range after.Runs() {
			if slices.ContainsFunc(before.Runs(), func(b []state.Name) bool { return state.RunsShared(b, r) }) {
				shared++
			}
		}
		before = after
	}
	if shared < 300*len(before.Runs())/2 {
		t.Fatalf("the rosters shared %d runs in 300 commands of %d runs each: each is copied", shared, len(before.Runs()))
	}
}

// A copy's idle timer stops when the stream ends: TO reads back what it
// wrote after the end, with no byte coming, and the timer cancelled that
// (every copy that took longer than moveIdle to read back failed).
func TestIdleStopsAtTheStreamsEnd(t *testing.T) {
	stall := time.AfterFunc(time.Hour, func() {})
	r := &idle{r: strings.NewReader("the stream"), t: stall}
	if b, err := io.ReadAll(r); err != nil || string(b) != "the stream" {
		t.Fatalf("read %q, %v", b, err)
	}
	if stall.Stop() {
		t.Fatal("the idle timer still runs after the stream ended")
	}
}
