package state

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"
)

// PlanHeads (what mesh status shows of every node's plan, read in one
// query) says what each node's newest plan says, and Node finds a node
// by its name alone.
func TestPlanHeadsMatchPlans(t *testing.T) {
	s := openStore(t)
	ctx := context.Background()
	var idx uint64
	mustApply(t, s, &idx, &InitRequest{MeshID: "m-heads", Domain: "internal", Node: Node{Name: "n0", Address: "10.0.0.1", Voter: true}})
	for i := 1; i < 4; i++ {
		mustApply(t, s, &idx, &NodeAddRequest{Node: Node{Name: fmt.Sprintf("n%d", i), Address: fmt.Sprintf("10.0.0.%d", i+1)}})
	}
	var specs []ModuleSpec
	for j := range 5 {
		specs = append(specs, spec(fmt.Sprintf("m%d.yaml", j), benchModule(fmt.Sprintf("m%d", j))))
	}
	mustApply(t, s, &idx, &ModuleAddRequest{Modules: specs})
	for j := range 5 {
		mustApply(t, s, &idx, &AssignRequest{Assignment: Assignment{Node: fmt.Sprintf("n%d", j%3), Module: fmt.Sprintf("m%d", j)}})
	}
	heads, err := s.PlanHeads(ctx)
	if err != nil {
		t.Fatal(err)
	}
	nodes, _ := s.Nodes(ctx)
	for _, n := range nodes {
		p, err := s.Plan(ctx, n.Name)
		h, ok := heads[n.Name]
		if err != nil {
			if ok {
				t.Errorf("%s: a head %+v and no plan (%v)", n.Name, h, err)
			}
			continue
		}
		if !ok || h.Version != p.Version || h.Digest != p.Digest || h.Resources != len(p.Plan.Resources) {
			t.Errorf("%s: head %+v, plan v%d %s with %d resources", n.Name, h, p.Version, p.Digest, len(p.Plan.Resources))
		}
		if h.Resources == 0 && n.Name != "n3" {
			t.Errorf("%s: no resources in its head", n.Name)
		}
		got, err := s.Node(ctx, n.Name)
		if err != nil || got.Name != n.Name || got.Address != n.Address {
			t.Errorf("Node(%s) = %+v, %v", n.Name, got, err)
		}
	}
	// Modules and Module say the same of where each module runs, sorted.
	mustApply(t, s, &idx, &AssignRequest{Assignment: Assignment{Node: "n2", Module: "m0"}})
	mods, _ := s.Modules(ctx)
	if len(mods) != 5 || !slices.Equal(mods[0].Nodes, []string{"n0", "n2"}) {
		t.Fatalf("modules %+v", mods)
	}
	for _, m := range mods {
		one, err := s.Module(ctx, m.Name)
		if err != nil || !slices.Equal(one.Nodes, m.Nodes) || one.Digest != m.Digest || one.Manifest == "" {
			t.Errorf("Module(%s) = %+v, %v; Modules says %+v", m.Name, one, err, m)
		}
	}
	var re *RuleError
	if _, err := s.Module(ctx, "nosuch"); !errors.As(err, &re) || re.Kind != ErrNotFound || !strings.Contains(err.Error(), "m3") {
		t.Errorf("Module(nosuch): %v", err)
	}
	if _, err := s.Node(ctx, "nosuch"); !errors.As(err, &re) || re.Kind != ErrNotFound || !strings.Contains(err.Error(), "n1") {
		t.Errorf("Node(nosuch): %v", err)
	}
}

// The history's pruning reads each kept plan's version and time from the
// index alone: without it, each new plan version read every kept plan's
// body (the time sits after it in the row).
func TestPlanPruningReadsNoBodies(t *testing.T) {
	s := openStore(t)
	rows, err := s.db.Query(`EXPLAIN QUERY PLAN SELECT version, created_at FROM plans WHERE node = ? ORDER BY version DESC`, "n0")
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	var plan []string
	for rows.Next() {
		var id, parent, notused int
		var detail string
		if err := rows.Scan(&id, &parent, &notused, &detail); err != nil {
			t.Fatal(err)
		}
		plan = append(plan, detail)
	}
	if !slices.ContainsFunc(plan, func(d string) bool { return strings.Contains(d, "COVERING INDEX plans_created") }) {
		t.Fatalf("the pruning's query plan: %q", plan)
	}
}
