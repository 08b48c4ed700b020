package state

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"
)

// mesh assign NODE MODULE... and mesh unassign NODE MODULE... (issue "scale",
// item 2): several modules in one command, all or none. One the FSM refuses
// (an unknown module, one named twice, one not assigned) refuses the whole
// command and changes nothing; a batch assign carries format 16, a batch unassign 15 (an older node
// would take its first module alone) and a single module keeps its format.
func TestBatchAssign(t *testing.T) {
	ctx := context.Background()
	s := openStore(t)
	var idx uint64
	mustApply(t, s, &idx, &InitRequest{MeshID: "m-batch", Domain: "internal", Node: Node{Name: "ace", Address: "10.0.0.1"}})
	var specs []ModuleSpec
	for _, m := range []string{"a", "b", "c", "d"} {
		specs = append(specs, spec(m+".yaml", benchModule(m)))
	}
	mustApply(t, s, &idx, &ModuleAddRequest{Modules: specs})
	where := func() map[string][]string {
		mods, err := s.Modules(ctx)
		if err != nil {
			t.Fatal(err)
		}
		out := map[string][]string{}
		for _, m := range mods {
			out[m.Name] = m.Nodes
		}
		return out
	}
	plans := func() uint64 {
		p, err := s.Plan(ctx, "ace")
		if err != nil {
			return 0
		}
		return p.Version
	}
	before := plans()
	for name, bad := range map[string]Request{
		"an unknown module":    &AssignRequest{Assignment: Assignment{Node: "ace", Module: "a"}, More: []string{"b", "nosuch"}},
		"a module named twice": &AssignRequest{Assignment: Assignment{Node: "ace", Module: "a"}, More: []string{"b", "a"}},
		"an unknown node":      &AssignRequest{Assignment: Assignment{Node: "nosuch", Module: "a"}, More: []string{"b"}},
	} {
		err := applyErr(t, s, &idx, bad)
		if err == nil {
			t.Fatalf("%s: the batch was taken", name)
		}
		if w := where(); len(w["a"]) != 0 || len(w["b"]) != 0 {
			t.Fatalf("%s (%v): a refused batch assigned %v", name, err, w)
		}
	}
	if plans() != before {
		t.Fatal("a refused batch made a plan version")
	}
	mustApply(t, s, &idx, &AssignRequest{Assignment: Assignment{Node: "ace", Module: "a"}, More: []string{"b", "c"}})
	w := where()
	for _, m := range []string{"a", "b", "c"} {
		if !slices.Equal(w[m], []string{"ace"}) {
			t.Fatalf("after the batch: %v", w)
		}
	}
	// One command: one plan version, whose cause names every module.
	h, err := s.PlanHistory(ctx, "ace", 0)
	newer := slices.IndexFunc(h, func(v PlanVersion) bool { return v.Version <= before })
	if err != nil || newer != 1 || h[0].Cause != "mesh assign ace a b c" {
		t.Fatalf("plan history after the batch: %d new versions, the last %q (was v%d), %v", newer, h[0].Cause, before, err)
	}
	// Those assigned already are left as they are; the rest are assigned.
	mustApply(t, s, &idx, &AssignRequest{Assignment: Assignment{Node: "ace", Module: "a"}, More: []string{"d"}})
	if w := where(); !slices.Equal(w["d"], []string{"ace"}) {
		t.Fatalf("a batch with one module assigned already: %v", w)
	}
	// Unassign: all or none.
	err = applyErr(t, s, &idx, &UnassignRequest{Assignment: Assignment{Node: "ace", Module: "a"}, More: []string{"b", "nosuch"}})
	if err == nil || !strings.Contains(err.Error(), `"nosuch" is not assigned`) {
		t.Fatalf("unassign with one not assigned: %v", err)
	}
	if w := where(); len(w["a"]) != 1 || len(w["b"]) != 1 {
		t.Fatalf("a refused batch unassigned: %v", w)
	}
	if err := applyErr(t, s, &idx, &UnassignRequest{Assignment: Assignment{Node: "ace", Module: "a"}, More: []string{"b"}, PurgeData: []string{"/srv/a"}}); err == nil || !strings.Contains(err.Error(), "one module at a time") {
		t.Fatalf("a batch unassign with --purge-data: %v", err)
	}
	mustApply(t, s, &idx, &UnassignRequest{Assignment: Assignment{Node: "ace", Module: "a"}, More: []string{"b", "c"}})
	if w := where(); len(w["a"])+len(w["b"])+len(w["c"]) != 0 || len(w["d"]) != 1 {
		t.Fatalf("after the batch unassign: %v", w)
	}
	// Formats.
	single := NewCommand(&AssignRequest{Assignment: Assignment{Node: "ace", Module: "a"}}).V
	for name, tc := range map[string]struct {
		r    Request
		want int
	}{
		"assign":   {&AssignRequest{Assignment: Assignment{Node: "ace", Module: "a"}, More: []string{"b"}}, batchHostsFormat},
		"unassign": {&UnassignRequest{Assignment: Assignment{Node: "ace", Module: "a"}, More: []string{"b"}}, batchFormat},
	} {
		if v := NewCommand(tc.r).V; v != tc.want {
			t.Errorf("a batch %s has format %d, want %d", name, v, tc.want)
		}
	}
	if single >= batchFormat {
		t.Errorf("a single assign has format %d: an older node could not apply it", single)
	}
}

// 200 modules assigned to a node and taken off again: in one command
// each way, and one command per module (what a migration did before).
func BenchmarkBatchAssign(b *testing.B) {
	defer benchRuns()()
	for _, batched := range []bool{true, false} {
		b.Run(fmt.Sprintf("batch=%v", batched), func(b *testing.B) {
			s := openStore(b)
			var idx uint64
			apply := func(r Request) {
				idx++
				if err := s.Apply(idx, encodeAt(r, t0)); err != nil {
					b.Fatal(err)
				}
			}
			apply(&InitRequest{MeshID: "m-batchb", Domain: "internal", Node: Node{Name: "ace", Address: "10.0.0.1"}})
			var specs []ModuleSpec
			var names []string
			for j := range 200 {
				n := fmt.Sprintf("m%03d", j)
				specs = append(specs, spec(n+".yaml", benchModule(n)))
				names = append(names, n)
			}
			apply(&ModuleAddRequest{Modules: specs})
			for b.Loop() {
				if batched {
					apply(&AssignRequest{Assignment: Assignment{Node: "ace", Module: names[0]}, More: names[1:]})
					apply(&UnassignRequest{Assignment: Assignment{Node: "ace", Module: names[0]}, More: names[1:]})
					continue
				}
				for _, n := range names {
					apply(&AssignRequest{Assignment: Assignment{Node: "ace", Module: n}})
				}
				for _, n := range names {
					apply(&UnassignRequest{Assignment: Assignment{Node: "ace", Module: n}})
				}
			}
		})
	}
}

// The rule on host names holds for a batch: two modules of one batch that
// would serve one name under a node's public domain refuse the whole
// batch, whether the batch checks it once (format 16) or after each module
// (format 15, as the binaries that wrote it did), and assign nothing.
func TestBatchHostRule(t *testing.T) {
	for _, v := range []int{batchFormat, batchHostsFormat} {
		t.Run(fmt.Sprint("format=", v), func(t *testing.T) {
			ctx := context.Background()
			s := openStore(t)
			var idx uint64
			mustApply(t, s, &idx, &InitRequest{MeshID: "m-1", Domain: "internal", Node: Node{Name: "ace", Address: "10.0.0.1"}})
			mustApply(t, s, &idx, &PublicDomainRequest{Node: "ace", Domain: "example.org"})
			var specs []ModuleSpec
			for _, m := range []string{"a", "b", "c"} {
				route := m
				if m != "c" {
					route = "www" // a and b both want www.example.org
				}
				specs = append(specs, spec(m+".yaml", fmt.Sprintf("module: %s\nroutes:\n  - {name: %s, port: 80}\n", m, route)))
			}
			mustApply(t, s, &idx, &ModuleAddRequest{Modules: specs})
			batch := func(mods ...string) error {
				c := NewCommand(&AssignRequest{Assignment: Assignment{Node: "ace", Module: mods[0]}, More: mods[1:]})
				c.V, c.Time = v, t0
				idx++
				return s.Apply(idx, c.Encode())
			}
			err := batch("c", "a", "b")
			if err == nil || !strings.Contains(err.Error(), "www.example.org") {
				t.Fatalf("a batch whose a and b claim www.example.org: %v", err)
			}
			mods, err := s.Modules(ctx)
			if err != nil {
				t.Fatal(err)
			}
			for _, m := range mods {
				if len(m.Nodes) != 0 {
					t.Fatalf("a refused batch assigned %s to %v", m.Name, m.Nodes)
				}
			}
			if err := batch("c", "a"); err != nil {
				t.Fatal(err)
			}
			if err := batch("b"); err == nil || !strings.Contains(err.Error(), "www.example.org") {
				t.Fatalf("b beside a: %v", err)
			}
		})
	}
}
