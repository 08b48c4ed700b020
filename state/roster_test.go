package state

import (
	"context"
	"fmt"
	"slices"
	"testing"
)

// Through the FSM, a run that unassigns leave with fewer than a quarter of
// rosterRun names joins the run before, and every roster the store keeps
// is the table's.
func TestRosterRunsJoinThroughTheFSM(t *testing.T) {
	defer func(n int) { rosterRun = n }(rosterRun)
	rosterRun = 8 // runs of one name join
	ctx := context.Background()
	s := openStore(t)
	var idx uint64
	mustApply(t, s, &idx, &InitRequest{MeshID: "m-1", Domain: "internal", Node: Node{Name: "ace", Address: "10.0.0.1"}})
	var specs []ModuleSpec
	var names []string
	for j := range 30 {
		name := fmt.Sprintf("m%02d", j)
		names = append(names, name)
		specs = append(specs, spec(name+".yaml", fmt.Sprintf("module: %s\n", name)))
	}
	for from := 0; from < len(specs); from += 10 {
		mustApply(t, s, &idx, &ModuleAddRequest{Modules: specs[from : from+10]})
	}
	mustApply(t, s, &idx, &AssignRequest{Assignment: Assignment{Node: "ace", Module: names[0]}, More: names[1:10]})
	mustApply(t, s, &idx, &AssignRequest{Assignment: Assignment{Node: "ace", Module: names[10]}, More: names[11:20]})
	mustApply(t, s, &idx, &AssignRequest{Assignment: Assignment{Node: "ace", Module: names[20]}, More: names[21:30]})
	joined := false
	for j := 8; j < 24; j++ { // the names of the runs after the first, one by one
		before, err := s.SharedRoster(ctx)
		if err != nil {
			t.Fatal(err)
		}
		mustApply(t, s, &idx, &UnassignRequest{Assignment: Assignment{Node: "ace", Module: names[j]}})
		r, err := s.SharedRoster(ctx)
		if err != nil {
			t.Fatal(err)
		}
		table, err := readRoster(ctx, s.db)
		if err != nil {
			t.Fatal(err)
		}
		if !slices.Equal(r.Names(), table) {
			t.Fatalf("unassign %s: the store's roster %v, the table's %v", names[j], r.Names(), table)
		}
		for i, run := range r.Runs() {
			if i > 0 && len(run) < rosterRun/4 && !slices.ContainsFunc(before.Runs(), func(b []Name) bool { return RunsShared(b, run) }) {
				t.Fatalf("unassign %s: run %d of %v holds %d names", names[j], i, r.Runs(), len(run))
			}
		}
		if len(r.Runs()) < len(before.Runs()) {
			joined = true
		}
	}
	if !joined {
		t.Fatal("no run was joined to the one before")
	}
}
