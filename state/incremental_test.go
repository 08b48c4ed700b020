package state

import (
	"cmp"
	"context"
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"
)

// A rollout's held manifest is an input too: while app rolls out from a
// version that binds to db to one that does not, the node it has not
// reached yet still binds to db, and moving db must recompose that node
// although the catalogue's app no longer names db. (checkComposition, on
// in this package's tests, compares with a full composition; without the
// held manifests in affected this test stops on the difference.)
func TestIncrementalSeesHeldManifests(t *testing.T) {
	ctx := context.Background()
	s := openStore(t)
	var idx uint64
	mustApply(t, s, &idx, &InitRequest{MeshID: "m-1", Domain: "internal", Node: Node{Name: "ace", Address: "10.0.0.1"}})
	mustApply(t, s, &idx, &NodeAddRequest{Node: Node{Name: "bee", Address: "10.0.0.2"}})
	mustApply(t, s, &idx, &NodeAddRequest{Node: Node{Name: "cat", Address: "10.0.0.3"}})
	secret := []Secret{{Pair: Pair{Consumer: "app", Provider: "db"}, Value: "s3cret"}}
	mustApply(t, s, &idx, &ModuleAddRequest{Modules: []ModuleSpec{spec("db.yaml", incModules["db"][0]), spec("app.yaml", incModules["app"][0]), spec("web.yaml", incModules["web"][1])}, Secrets: secret})
	mustApply(t, s, &idx, &AssignRequest{Assignment: Assignment{Node: "ace", Module: "db"}})
	mustApply(t, s, &idx, &AssignRequest{Assignment: Assignment{Node: "cat", Module: "web"}})
	mustApply(t, s, &idx, &AssignRequest{Assignment: Assignment{Node: "ace", Module: "app"}, Secrets: secret})
	mustApply(t, s, &idx, &AssignRequest{Assignment: Assignment{Node: "bee", Module: "app"}, Secrets: secret})
	mustApply(t, s, &idx, &ModuleAddRequest{Modules: []ModuleSpec{spec("app.yaml", incModules["app"][1])}})
	rs, err := s.Rollouts(ctx)
	if err != nil || len(rs) != 1 || rs[0].State != RolloutRunning || strings.Join(rs[0].Reached, " ") != "ace" {
		t.Fatalf("app's change should be rolling out, ace reached and bee held back: %+v %v", rs, err)
	}
	binding := func(node string) string {
		pv, err := s.Plan(ctx, node)
		if err != nil {
			t.Fatal(err)
		}
		for _, r := range pv.Plan.Resources {
			if r.Name == "/srv/app/db.binding" {
				return r.Provider
			}
		}
		return ""
	}
	if got := binding("bee"); got != "ace" {
		t.Fatalf("bee holds app's version before, bound to db on ace; got %q", got)
	}
	mustApply(t, s, &idx, &AssignRequest{Assignment: Assignment{Node: "cat", Module: "db"}})
	mustApply(t, s, &idx, &UnassignRequest{Assignment: Assignment{Node: "ace", Module: "db"}})
	if got := binding("bee"); got != "cat" {
		t.Fatalf("db left ace: bee's held binding should follow it to cat, got %q", got)
	}
}

// replaceNames, rosterChangesAmong and rosterDiff, which find a command's
// roster and its changes from the recomposed nodes' names alone, against a
// sort of the whole roster, RosterChanges and set differences, on random
// rosters with names shared between nodes and addresses between names.
func TestRosterChangesAmong(t *testing.T) {
	rnd := rand.New(rand.NewPCG(3, 4))
	defer func(n int) { rosterRun = n }(rosterRun)
	names := func(n int, nodes ...string) []Name {
		var r []Name
		for range n {
			r = append(r, Name{Name: fmt.Sprint("m", rnd.IntN(15)), Address: fmt.Sprint("10.0.0.", rnd.IntN(3)), Node: nodes[rnd.IntN(len(nodes))]})
		}
		SortRoster(r)
		return slices.Compact(r)
	}
	var all []string
	for i := range 12 {
		all = append(all, fmt.Sprint("n", i))
	}
	for round := range 3000 {
		nodes := all[:2+round%10] // more than 8 nodes in only too
		before := names(rnd.IntN(60), nodes...)
		only := map[string]bool{}
		var mineNodes []string
		for _, n := range nodes {
			if rnd.IntN(2) == 0 {
				only[n] = true
				mineNodes = append(mineNodes, n)
			}
		}
		var mine []Name
		if len(mineNodes) > 0 {
			mine = names(rnd.IntN(30), mineNodes...)
		}
		after, theirs := replaceNames(before, only, mine)
		var want, wantTheirs []Name
		for _, r := range before {
			if only[r.Node] {
				wantTheirs = append(wantTheirs, r)
			} else {
				want = append(want, r)
			}
		}
		want = append(want, mine...)
		SortRoster(want)
		if !slices.Equal(after, want) || !slices.Equal(theirs, wantTheirs) {
			t.Fatalf("%v with the names of %v replaced by %v: %v (theirs %v), want %v (theirs %v)", before, only, mine, after, theirs, want, wantTheirs)
		}
		// The same through the index of rows by node, and the index after,
		// on rosters cut into runs of one to a few names, and the roster
		// spliced run by run.
		rosterRun = []int{1, 2, 3, 5, 8, 256}[round%6]
		bk := NewRoster(before)
		by := &rosterByNode{of: &bk, by: splitByNode(slices.Values(before))}
		byTheirs := by.theirNames(only)
		spliced := spliceNames(before, byTheirs, mine)
		if !slices.Equal(spliced, want) || !slices.Equal(byTheirs, wantTheirs) {
			t.Fatalf("%v with the names of %v spliced by %v: %v (theirs %v), want %v (theirs %v)", before, only, mine, spliced, byTheirs, want, wantTheirs)
		}
		// Spliced twice: the second splice starts from runs a splice cut
		// and joined.
		roster := bk.spliced(byTheirs, mine)
		if got := roster.Names(); !slices.Equal(got, want) {
			t.Fatalf("runs of %d: %v with the names of %v spliced by %v: %v, want %v", rosterRun, before, only, mine, got, want)
		}
		if err := checkSplice(before, only, mine, roster, byTheirs, by.edited(&roster, only, mine)); err != nil {
			t.Fatal(err)
		}
		back := roster.spliced(mine, byTheirs)
		if got := back.Names(); !slices.Equal(got, before) {
			t.Fatalf("runs of %d: %v spliced back: %v, want %v", rosterRun, want, got, before)
		}
		if err := checkSplice(want, only, byTheirs, back, mine, by); err != nil {
			t.Fatal(err)
		}
		for i, run := range roster.Runs() {
			if i > 0 && len(run) < rosterRun/4 && !slices.ContainsFunc(bk.Runs(), func(r []Name) bool { return RunsShared(r, run) }) {
				t.Fatalf("runs of %d: a run the splice made holds %d names: %v", rosterRun, len(run), roster.Runs())
			}
		}
		// What a reader finds in it: each name's rows, whether it holds a row.
		for _, x := range append(slices.Clone(before), mine...) {
			var rows, wantRows []Name
			for r := range roster.Named(x.Name) {
				rows = append(rows, r)
			}
			for _, r := range want {
				if r.Name == x.Name {
					wantRows = append(wantRows, r)
				}
			}
			if !slices.Equal(rows, wantRows) {
				t.Fatalf("runs of %d: the rows of %s in %v: %v, want %v", rosterRun, x.Name, roster.Runs(), rows, wantRows)
			}
			if got, wantHas := roster.has(x), slices.ContainsFunc(want, func(r Name) bool { return r.Name == x.Name && r.Address == x.Address }); got != wantHas {
				t.Fatalf("runs of %d: %v holds %v: %v, want %v", rosterRun, roster.Runs(), x, got, wantHas)
			}
		}
		if want := RosterChanges(before, after); !slices.Equal(rosterChangesAmong(NewRoster(before), NewRoster(after), theirs, mine), want) {
			t.Fatalf("changes from %v to %v among %v: %v, want %v", before, after, only, rosterChangesAmong(NewRoster(before), NewRoster(after), theirs, mine), want)
		}
		added, removed := rosterDiff(theirs, mine)
		// Given only the rows that differ, as recompose gives them.
		if want := RosterChanges(before, after); !slices.Equal(rosterChangesAmong(NewRoster(before), NewRoster(after), removed, added), want) {
			t.Fatalf("changes from %v to %v among the rows removed %v and added %v: %v, want %v", before, after, removed, added, rosterChangesAmong(NewRoster(before), NewRoster(after), removed, added), want)
		}
		var wantAdded, wantRemoved []Name
		for _, r := range after {
			if !slices.Contains(before, r) {
				wantAdded = append(wantAdded, r)
			}
		}
		for _, r := range before {
			if !slices.Contains(after, r) {
				wantRemoved = append(wantRemoved, r)
			}
		}
		if !slices.Equal(added, wantAdded) || !slices.Equal(removed, wantRemoved) {
			t.Fatalf("diff from %v to %v among %v: +%v -%v, want +%v -%v", before, after, only, added, removed, wantAdded, wantRemoved)
		}
	}
}

// A module that stops taking a credential changes its provider's plan
// (the provider's accepts-credentials directory lists it no more), though
// the new manifest no longer names the provider: module add recomposes the
// nodes of the providers before as well.
func TestIncrementalSeesProvidersBefore(t *testing.T) {
	s := openStore(t)
	var idx uint64
	mustApply(t, s, &idx, &InitRequest{MeshID: "m-1", Domain: "internal", Node: Node{Name: "ace", Address: "10.0.0.1"}})
	mustApply(t, s, &idx, &NodeAddRequest{Node: Node{Name: "bee", Address: "10.0.0.2"}})
	secret := []Secret{{Pair: Pair{Consumer: "app", Provider: "db"}, Value: "s3cret"}}
	mustApply(t, s, &idx, &ModuleAddRequest{Modules: []ModuleSpec{spec("db.yaml", incModules["db"][0]), spec("app.yaml", incModules["app"][0]), spec("web.yaml", incModules["web"][1])}, Secrets: secret})
	mustApply(t, s, &idx, &AssignRequest{Assignment: Assignment{Node: "ace", Module: "db"}})
	mustApply(t, s, &idx, &AssignRequest{Assignment: Assignment{Node: "ace", Module: "web"}})
	mustApply(t, s, &idx, &AssignRequest{Assignment: Assignment{Node: "bee", Module: "app"}, Secrets: secret})
	delivered := func() bool { return deliveredTo(t, s, "ace", "app") }
	if !delivered() {
		t.Fatal("db's node should receive app's credential")
	}
	mustApply(t, s, &idx, &ModuleAddRequest{Modules: []ModuleSpec{spec("app.yaml", incModules["app"][1])}})
	if delivered() {
		t.Fatal("app takes no credential from db any more: db's node should not receive it")
	}
}

// node.key composes nothing, yet a held secret follows the nodes' keys: a
// node held back by a secret's rollout whose key changes can no longer
// open the value before, and a full composition gives it the new one. The
// next incremental command must give the same (the nodes of every module
// whose secret rolls out recompose), as the full recompose every command
// did before gave it.
func TestIncrementalAfterNodeKey(t *testing.T) {
	s := openStore(t)
	var idx uint64
	mustApply(t, s, &idx, &InitRequest{MeshID: "m-1", Node: Node{Name: "ace", Address: "10.0.0.1", SealKey: "kA"}})
	mustApply(t, s, &idx, &NodeAddRequest{Node: Node{Name: "bee", Address: "10.0.0.2", SealKey: "kB"}})
	mustApply(t, s, &idx, &NodeAddRequest{Node: Node{Name: "cat", Address: "10.0.0.3", SealKey: "kC"}})
	mustApply(t, s, &idx, &ModuleAddRequest{Modules: []ModuleSpec{spec("mail.yaml", rollMail("")), spec("web.yaml", incModules["web"][1])}})
	for _, n := range []string{"ace", "bee"} {
		mustApply(t, s, &idx, &AssignRequest{Assignment: Assignment{Node: n, Module: "mail"}})
	}
	set := func(value string) *SecretSetRequest {
		r := setReq("mail", "smtp", value, "kA", "kB")
		r.Rollout = true
		return r
	}
	digest := func(node string) string { return secretsIn(t, s, node)["/srv/mail/smtp.password"]["smtp"] }
	mustApply(t, s, &idx, set("pw1"))
	mustApply(t, s, &idx, set("pw2"))
	d1, d2 := set("pw1").Digest, set("pw2").Digest
	if a, b := digest("ace"), digest("bee"); a != d2 || b != d1 {
		t.Fatalf("the rollout of pw2 reaches ace first, bee keeps pw1: ace %s bee %s", a, b)
	}
	mustApply(t, s, &idx, &NodeKeyRequest{Node: "bee", SealKey: "kB2"})
	// An assign elsewhere: the check compares it with a full composition.
	mustApply(t, s, &idx, &AssignRequest{Assignment: Assignment{Node: "cat", Module: "web"}})
	if b := digest("bee"); b != d2 {
		t.Fatalf("bee's key changed: it cannot open pw1 any more and takes pw2; its plan says %s", b)
	}
}

// nodesRunning, and its lookup in each node's run, find the nodes a walk of
// every assignment finds.
func TestNodesRunning(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	for round := 0; round < 300; round++ {
		var in Input
		for i := range 1 + rng.IntN(12) {
			in.Nodes = append(in.Nodes, Node{Name: fmt.Sprintf("n%02d", i)})
		}
		for _, n := range in.Nodes {
			for j := range 40 {
				if rng.IntN(3) == 0 {
					in.Assignments = append(in.Assignments, Assignment{Node: n.Name, Module: fmt.Sprintf("m%02d", j), Seq: rng.Uint64N(50)})
				}
			}
		}
		in.assignedByNode = true
		modules := map[string]bool{}
		for range rng.IntN(4) {
			modules[fmt.Sprintf("m%02d", rng.IntN(45))] = true
		}
		var want []string
		for _, a := range in.Assignments {
			if modules[a.Module] && !slices.Contains(want, a.Node) {
				want = append(want, a.Node)
			}
		}
		// Indexed by module (the FSM's inputs) or not.
		if rng.IntN(2) == 0 {
			in.assignedAt = indexModules(in.Assignments)
		}
		for _, f := range []func(Input, map[string]bool) []string{nodesRunning, nodesRunningByRun} {
			got := f(in, modules)
			slices.Sort(got)
			if !slices.Equal(got, want) {
				t.Fatalf("round %d: nodes running %v: %v, a walk finds %v", round, modules, got, want)
			}
		}
		// groupFor's assignments of its bindings' providers, the same way.
		var walked []Assignment
		for _, a := range in.Assignments {
			if modules[a.Module] {
				walked = append(walked, a)
			}
		}
		for _, f := range []func(Input, map[string]bool) []Assignment{assignmentsOf, assignmentsOfByRun} {
			got := f(in, modules)
			slices.SortFunc(got, func(a, b Assignment) int {
				return cmp.Or(strings.Compare(a.Node, b.Node), strings.Compare(a.Module, b.Module))
			})
			if !slices.Equal(got, walked) {
				t.Fatalf("round %d: assignments of %v: %v, a walk finds %v", round, modules, got, walked)
			}
		}
	}
}

// The roster SharedRoster gives is never changed by the commands after
// it: each keeps a new one (the resolver's feed reads it without a copy).
func TestSharedRosterStaysAsGiven(t *testing.T) {
	ctx := context.Background()
	s := openStore(t)
	var idx uint64
	mustApply(t, s, &idx, &InitRequest{MeshID: "m-1", Domain: "internal", Node: Node{Name: "ace", Address: "10.0.0.1"}})
	mustApply(t, s, &idx, &NodeAddRequest{Node: Node{Name: "bee", Address: "10.0.0.2"}})
	mustApply(t, s, &idx, &ModuleAddRequest{Modules: []ModuleSpec{spec("db.yaml", incModules["db"][0]), spec("web.yaml", incModules["web"][1])}})
	defer func(n int) { rosterRun = n }(rosterRun)
	rosterRun = 2 // runs shared between rosters, and runs spliced
	var given []Roster
	var copies [][]Name
	take := func() {
		shared, err := s.SharedRoster(ctx)
		if err != nil {
			t.Fatal(err)
		}
		r := shared.Names()
		want, err := s.Roster(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if !slices.Equal(r, want) {
			t.Fatalf("SharedRoster %v, Roster %v", r, want)
		}
		if s.roster.Load() == nil {
			t.Fatal("the store keeps no roster: SharedRoster read the table")
		}
		given, copies = append(given, shared), append(copies, r)
	}
	take()
	for _, r := range []Request{
		&AssignRequest{Assignment: Assignment{Node: "ace", Module: "db"}},
		&AssignRequest{Assignment: Assignment{Node: "bee", Module: "web"}},
		&AssignRequest{Assignment: Assignment{Node: "ace", Module: "web"}},
		&UnassignRequest{Assignment: Assignment{Node: "bee", Module: "web"}},
		&AssignRequest{Assignment: Assignment{Node: "bee", Module: "db"}},
		&UnassignRequest{Assignment: Assignment{Node: "ace", Module: "db"}},
		&NodeAddRequest{Node: Node{Name: "cat", Address: "10.0.0.3"}},
		&AssignRequest{Assignment: Assignment{Node: "cat", Module: "db"}},
	} {
		mustApply(t, s, &idx, r)
		take()
	}
	if len(copies[len(copies)-1]) == len(copies[0]) {
		t.Fatalf("the commands moved no name: %v", copies[len(copies)-1])
	}
	for i := range given {
		if !slices.Equal(given[i].Names(), copies[i]) {
			t.Fatalf("the roster given after command %d changed since: %v, was %v", i, given[i].Names(), copies[i])
		}
	}
}

// A revert (or a rollout stopped with auto-revert) puts another version of
// a module back: the providers its manifest took a credential from before
// are affected too, as by a module add (TestIncrementalSeesProvidersBefore),
// though the op names only the module. proxy's second version takes a
// credential from db, its first none; proxy has no health check, so no
// rollout holds a version back.
func TestIncrementalRevertSeesProvidersBefore(t *testing.T) {
	ctx := context.Background()
	s := openStore(t)
	var idx uint64
	mustApply(t, s, &idx, &InitRequest{MeshID: "m-1", Domain: "internal", Node: Node{Name: "ace", Address: "10.0.0.1"}})
	mustApply(t, s, &idx, &NodeAddRequest{Node: Node{Name: "bee", Address: "10.0.0.2"}})
	secret := []Secret{{Pair: Pair{Consumer: "proxy", Provider: "db"}, Value: "s3cret"}}
	mustApply(t, s, &idx, &ModuleAddRequest{Modules: []ModuleSpec{spec("db.yaml", incModules["db"][0]), spec("proxy.yaml", incModules["proxy"][0])}})
	mustApply(t, s, &idx, &AssignRequest{Assignment: Assignment{Node: "ace", Module: "db"}})
	mustApply(t, s, &idx, &AssignRequest{Assignment: Assignment{Node: "bee", Module: "proxy"}})
	delivered := func() bool { return deliveredTo(t, s, "ace", "proxy") }
	mustApply(t, s, &idx, &ModuleAddRequest{Modules: []ModuleSpec{spec("proxy.yaml", incModules["proxy"][1])}, Secrets: secret})
	if !delivered() {
		t.Fatal("proxy takes a credential from db: db's node should receive it")
	}
	ros, err := s.Rollouts(ctx)
	if err != nil || len(ros) > 0 && ros[0].State == RolloutRunning {
		t.Fatalf("proxy rolls out: %+v %v", ros, err)
	}
	mustApply(t, s, &idx, &ModuleRevertRequest{Module: "proxy"})
	if delivered() {
		t.Fatal("reverted, proxy takes no credential from db: db's node should not receive it")
	}
	mustApply(t, s, &idx, &ModuleRevertRequest{Module: "proxy"})
	if !delivered() {
		t.Fatal("reverted again, proxy takes a credential from db: db's node should receive it")
	}
}

// deliveredTo says whether node's plan delivers consumer's credential.
func deliveredTo(t *testing.T, s *Store, node, consumer string) bool {
	t.Helper()
	pv, err := s.Plan(context.Background(), node)
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range pv.Plan.Resources {
		if r.Kind == KindDeliveredCredential && r.Credential != nil && r.Credential.Consumer == consumer {
			return true
		}
	}
	return false
}
