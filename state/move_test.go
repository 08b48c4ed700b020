package state

import (
	"context"
	"errors"
	"slices"
	"strings"
	"testing"

	"mesh/state/manifest"
)

const moveDBSrc = `module: db
resources:
  - directory: /srv/db
  - directory: /srv/db/data
    data: true
  - step: migrate
    image: localhost/busybox:1
  - container: db.server
    image: localhost/busybox:1
    mounts: ["/srv/db/data:/data"]
`

const moveAppSrc = `module: app
resources:
  - directory: /srv/app
  - binding: /srv/app/db.binding
    provider: db
`

// kinds lists what node's plan holds of module, KIND NAME each.
func kindsOf(t *testing.T, s *Store, node, module string) []string {
	t.Helper()
	pv, err := s.Plan(context.Background(), node)
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, r := range pv.Plan.Resources {
		if r.Module == module {
			out = append(out, r.Kind+" "+r.Name)
		}
	}
	return out
}

func bindingOn(t *testing.T, s *Store, node string) string {
	t.Helper()
	pv, err := s.Plan(context.Background(), node)
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range pv.Plan.Resources {
		if r.Kind == manifest.KindBinding {
			return r.Provider
		}
	}
	return ""
}

// Issue 30, item 4: a move holds the module stopped on FROM (its
// directories kept, no container, step or name) while the data is copied;
// at start it is assigned to TO, which alone provides its bindings; done
// takes it off FROM; finish purges FROM's copy; an abort puts it back on
// FROM as before. Steps are taken once, in order; what would change where
// the module runs meanwhile is refused.
func TestModuleMove(t *testing.T) {
	ctx := context.Background()
	s := openStore(t)
	var idx uint64
	mustApply(t, s, &idx, &InitRequest{MeshID: "m-1", Node: Node{Name: "ace", Address: "10.0.0.1"}})
	mustApply(t, s, &idx, &NodeAddRequest{Node: Node{Name: "bee", Address: "10.0.0.2"}})
	mustApply(t, s, &idx, &NodeAddRequest{Node: Node{Name: "cat", Address: "10.0.0.3"}})
	mustApply(t, s, &idx, &ModuleAddRequest{Modules: []ModuleSpec{spec("db.yaml", moveDBSrc), spec("app.yaml", moveAppSrc)}})
	mustApply(t, s, &idx, &AssignRequest{Assignment: Assignment{Node: "ace", Module: "db"}})
	mustApply(t, s, &idx, &AssignRequest{Assignment: Assignment{Node: "cat", Module: "app"}})
	full := kindsOf(t, s, "ace", "db")

	for _, bad := range []*ModuleMoveRequest{
		{Module: "db", From: "ace", To: "ace"},
		{Module: "db", From: "bee", To: "cat"},
		{Module: "db", From: "ace", To: "dog"},
		{Module: "nope", From: "ace", To: "bee"},
	} {
		if err := applyErr(t, s, &idx, bad); err == nil {
			t.Fatalf("%+v was taken", bad)
		}
	}
	if c := NewCommand(&ModuleMoveRequest{Module: "db", From: "ace", To: "bee"}); c.V != moveFitFormat {
		t.Fatalf("module.move is written in format %d", c.V)
	}
	mustApply(t, s, &idx, &ModuleMoveRequest{Module: "db", From: "ace", To: "bee"})
	id := idx
	mv, err := s.Moves(ctx, "db")
	if err != nil || len(mv) != 1 || mv[0].Phase != MoveCopy || mv[0].ID != id || !slices.Equal(mv[0].Data, []string{"/srv/db/data"}) {
		t.Fatalf("the move: %+v %v", mv, err)
	}
	if got := kindsOf(t, s, "ace", "db"); !slices.Equal(got, []string{"directory /srv/db", "directory /srv/db/data"}) {
		t.Fatalf("ace holds of db while its data is copied: %v", got)
	}
	if got := kindsOf(t, s, "bee", "db"); len(got) != 0 {
		t.Fatalf("bee holds db before the copy: %v", got)
	}
	roster, _ := s.Roster(ctx)
	if slices.ContainsFunc(roster, func(n Name) bool { return n.Name == "db.internal" }) {
		t.Fatal("a stopped instance is answered")
	}
	if p := bindingOn(t, s, "cat"); p != "ace" {
		t.Fatalf("during the copy app's binding points at %q", p)
	}
	// Meanwhile: no second move, no assign or unassign of it.
	for _, r := range []Request{&ModuleMoveRequest{Module: "db", From: "ace", To: "cat"}, &AssignRequest{Assignment: Assignment{Node: "bee", Module: "db"}}, &UnassignRequest{Assignment: Assignment{Node: "ace", Module: "db"}}} {
		if err := applyErr(t, s, &idx, r); !errors.Is(err, ErrConflict) || !strings.Contains(err.Error(), "mesh move --abort db") {
			t.Fatalf("%T during a move: %v", r, err)
		}
	}
	// A step from the wrong phase, or of another move, changes nothing.
	mustApply(t, s, &idx, &MoveStepRequest{Module: "db", ID: id, From: MoveStart, To: MoveDone})
	mustApply(t, s, &idx, &MoveStepRequest{Module: "db", ID: id + 100, From: MoveCopy, To: MoveStart})
	if mv, _ := s.Moves(ctx, "db"); mv[0].Phase != MoveCopy {
		t.Fatalf("a stale step moved it to %s", mv[0].Phase)
	}
	mustApply(t, s, &idx, &MoveStepRequest{Module: "db", ID: id, From: MoveCopy, To: MoveStart})
	if got := kindsOf(t, s, "bee", "db"); !slices.Equal(got, full) {
		t.Fatalf("bee at start: %v, want %v", got, full)
	}
	if p := bindingOn(t, s, "cat"); p != "bee" {
		t.Fatalf("at start app's binding points at %q, not the new instance", p)
	}
	if got := kindsOf(t, s, "ace", "db"); len(got) != 2 {
		t.Fatalf("ace at start: %v", got)
	}
	mustApply(t, s, &idx, &MoveStepRequest{Module: "db", ID: id, From: MoveStart, To: MoveDone})
	if got := kindsOf(t, s, "ace", "db"); len(got) != 0 {
		t.Fatalf("ace after done: %v", got)
	}
	if err := applyErr(t, s, &idx, &MoveStepRequest{Module: "db", ID: id, From: MoveStart, To: MoveAborted}); !errors.Is(err, ErrConflict) {
		t.Fatalf("an abort of a done move: %v", err)
	}
	mustApply(t, s, &idx, &MoveStepRequest{Module: "db", Finish: true})
	pv, _ := s.Plan(ctx, "ace")
	if len(pv.Plan.Purge) != 1 || pv.Plan.Purge[0].Path != "/srv/db/data" {
		t.Fatalf("finish purges %+v on ace", pv.Plan.Purge)
	}
	if mv, _ := s.Moves(ctx, "db"); len(mv) != 0 {
		t.Fatalf("a finished move stays: %+v", mv)
	}

	// Back to ace, aborted at start: bee lets it go, ace runs it whole
	// again, and its purge is not done (it is ace's data again).
	mustApply(t, s, &idx, &ModuleMoveRequest{Module: "db", From: "bee", To: "ace"})
	id = idx
	// From the copy on: ace would otherwise remove the copy it receives.
	if pv, _ := s.Plan(ctx, "ace"); len(pv.Plan.Purge) != 0 {
		t.Fatalf("ace still purges while it receives a copy: %+v", pv.Plan.Purge)
	}
	// Its manifest, pull and revert are the move's meanwhile.
	for _, r := range []Request{&ModuleAddRequest{Modules: []ModuleSpec{spec("db.yaml", moveDBSrc+"  - directory: /srv/db/more\n    data: true\n")}}, &ModulePullRequest{Module: "db"}} {
		if err := applyErr(t, s, &idx, r); !errors.Is(err, ErrConflict) {
			t.Fatalf("%T during a move: %v", r, err)
		}
	}
	mustApply(t, s, &idx, &MoveStepRequest{Module: "db", ID: id, From: MoveCopy, To: MoveStart})
	// An abort that read an earlier phase still aborts.
	mustApply(t, s, &idx, &MoveStepRequest{Module: "db", ID: id, From: MoveCopy, To: MoveAborted, Reason: "db.server is unhealthy"})
	if got := kindsOf(t, s, "bee", "db"); !slices.Equal(got, full) {
		t.Fatalf("bee after the abort: %v", got)
	}
	if got := kindsOf(t, s, "ace", "db"); len(got) != 0 {
		t.Fatalf("ace after the abort: %v", got)
	}
	if mv, _ := s.Moves(ctx, "db"); mv[0].Phase != MoveAborted || mv[0].Reason != "db.server is unhealthy" {
		t.Fatalf("the aborted move: %+v", mv)
	}
	if p := bindingOn(t, s, "cat"); p != "bee" {
		t.Fatalf("after the abort app's binding points at %q", p)
	}
}

// Of nested data directories a move carries the outer one only (it holds
// the inner).
func TestModuleMoveNested(t *testing.T) {
	s := openStore(t)
	var idx uint64
	mustApply(t, s, &idx, &InitRequest{MeshID: "m-1", Node: Node{Name: "ace", Address: "10.0.0.1"}})
	mustApply(t, s, &idx, &NodeAddRequest{Node: Node{Name: "bee", Address: "10.0.0.2"}})
	src := "module: app\nresources:\n  - directory: /srv/app\n    data: true\n  - directory: /srv/app/db\n    data: true\n  - directory: /srv/other\n    data: true\n"
	mustApply(t, s, &idx, &ModuleAddRequest{Modules: []ModuleSpec{spec("app.yaml", src)}})
	mustApply(t, s, &idx, &AssignRequest{Assignment: Assignment{Node: "ace", Module: "app"}})
	mustApply(t, s, &idx, &ModuleMoveRequest{Module: "app", From: "ace", To: "bee"})
	mv, _ := s.Moves(context.Background(), "app")
	if !slices.Equal(mv[0].Data, []string{"/srv/app", "/srv/other"}) {
		t.Fatalf("the move carries %v", mv[0].Data)
	}
}

// A move to a node where the module would not compose is refused before
// any data travels: here its data directory lies inside a directory
// another module on TO mounts writable. Taken (format 17), TO received
// the data inside that module's mount, where its container read it, and
// its plan refused the module only at the move's start (a review found it).
func TestModuleMoveRefusedWhereItWouldNotCompose(t *testing.T) {
	ctx := context.Background()
	s := openStore(t)
	var idx uint64
	mustApply(t, s, &idx, &InitRequest{MeshID: "m-1", Node: Node{Name: "ace", Address: "10.0.0.1"}})
	mustApply(t, s, &idx, &NodeAddRequest{Node: Node{Name: "bee", Address: "10.0.0.2"}})
	x := "module: x\nresources:\n  - directory: /srv/shared\n    data: true\n  - container: x.c\n    image: localhost/busybox:1\n    mounts: [\"/srv/shared:/d\"]\n"
	m := "module: m\nresources:\n  - directory: /srv/shared/m\n    data: true\n  - container: m.c\n    image: localhost/busybox:1\n    mounts: [\"/srv/shared/m:/d\"]\n"
	mustApply(t, s, &idx, &ModuleAddRequest{Modules: []ModuleSpec{spec("x.yaml", x), spec("m.yaml", m)}})
	mustApply(t, s, &idx, &AssignRequest{Assignment: Assignment{Node: "bee", Module: "x"}})
	mustApply(t, s, &idx, &AssignRequest{Assignment: Assignment{Node: "ace", Module: "m"}})
	before, _ := s.Node(ctx, "bee")
	err := applyErr(t, s, &idx, &ModuleMoveRequest{Module: "m", From: "ace", To: "bee"})
	if err == nil || !strings.Contains(err.Error(), "module m would not run on bee") || !strings.Contains(err.Error(), "/srv/shared") {
		t.Fatalf("the move into x's mounted directory: %v", err)
	}
	if mv, _ := s.Moves(ctx, "m"); len(mv) != 0 {
		t.Fatalf("a refused move was written: %+v", mv)
	}
	if after, _ := s.Node(ctx, "bee"); after.ComposeError != before.ComposeError || after.ComposeError != "" {
		t.Fatalf("bee's composition changed: %q", after.ComposeError)
	}
	// A log written before format 18 applies as it did (every replica
	// takes that entry alike): the move is taken.
	c := NewCommand(&ModuleMoveRequest{Module: "m", From: "ace", To: "bee"})
	c.V = moveFitFormat - 1
	idx++
	if err := s.Apply(idx, c.Encode()); err != nil {
		t.Fatalf("a move of format 17: %v", err)
	}
	if mv, _ := s.Moves(ctx, "m"); len(mv) != 1 || mv[0].To != "bee" {
		t.Fatalf("a move of format 17: %+v", mv)
	}
	mustApply(t, s, &idx, &MoveStepRequest{Module: "m", ID: idx, From: MoveCopy, To: MoveAborted})
	// Where it composes, the move is taken.
	mustApply(t, s, &idx, &NodeAddRequest{Node: Node{Name: "cat", Address: "10.0.0.3"}})
	mustApply(t, s, &idx, &ModuleMoveRequest{Module: "m", From: "ace", To: "cat"})
	if mv, _ := s.Moves(ctx, "m"); len(mv) != 1 || mv[0].To != "cat" {
		t.Fatalf("the move to cat: %+v", mv)
	}
	mustApply(t, s, &idx, &MoveStepRequest{Module: "m", ID: idx, From: MoveCopy, To: MoveAborted})
	// A node whose plan fails for a reason of its own (two modules there
	// declare one path) refuses a move too, naming its own error: that
	// first error would hide the module's (here m's data directory inside
	// x's mount, which composition checks last; a review found the move
	// taken when only an error the module brought refused).
	y := "module: y\nresources:\n  - directory: /srv/both\n"
	z := "module: z\nresources:\n  - directory: /srv/both\n"
	mustApply(t, s, &idx, &ModuleAddRequest{Modules: []ModuleSpec{spec("y.yaml", y), spec("z.yaml", z)}})
	mustApply(t, s, &idx, &AssignRequest{Assignment: Assignment{Node: "bee", Module: "y"}})
	mustApply(t, s, &idx, &AssignRequest{Assignment: Assignment{Node: "bee", Module: "z"}})
	if n, _ := s.Node(ctx, "bee"); !strings.Contains(n.ComposeError, "declared by both") {
		t.Fatalf("bee's composition: %q", n.ComposeError)
	}
	err = applyErr(t, s, &idx, &ModuleMoveRequest{Module: "m", From: "ace", To: "bee"})
	if err == nil || !strings.Contains(err.Error(), "bee's plan does not compose now") || !strings.Contains(err.Error(), "declared by both") {
		t.Fatalf("the move into x's mount, on a bee that fails for y and z: %v", err)
	}
	if mv, _ := s.Moves(ctx, "m"); len(mv) != 1 || mv[0].Phase != MoveAborted {
		t.Fatalf("a refused move was written: %+v", mv)
	}
}

// doneMove is a store where db moved from ace to bee, done; and its last
// index.
func doneMove(t *testing.T) (*Store, uint64) {
	t.Helper()
	s := openStore(t)
	var idx uint64
	mustApply(t, s, &idx, &InitRequest{MeshID: "m-1", Node: Node{Name: "ace", Address: "10.0.0.1"}})
	mustApply(t, s, &idx, &NodeAddRequest{Node: Node{Name: "bee", Address: "10.0.0.2"}})
	mustApply(t, s, &idx, &ModuleAddRequest{Modules: []ModuleSpec{spec("db.yaml", moveDBSrc)}})
	mustApply(t, s, &idx, &AssignRequest{Assignment: Assignment{Node: "ace", Module: "db"}})
	mustApply(t, s, &idx, &ModuleMoveRequest{Module: "db", From: "ace", To: "bee"})
	id := idx
	mustApply(t, s, &idx, &MoveStepRequest{Module: "db", ID: id, From: MoveCopy, To: MoveStart})
	mustApply(t, s, &idx, &MoveStepRequest{Module: "db", ID: id, From: MoveStart, To: MoveDone})
	return s, idx
}

// A finish purges FROM's copy of the data only while TO runs the module:
// unassigned from TO since (with --purge-data, maybe), FROM's copy may be
// the last one (a review: finish checked nothing of TO). Assigning the
// module back to FROM runs it on that copy, and ends the move.
func TestMoveFinishKeepsTheLastCopy(t *testing.T) {
	ctx := context.Background()
	s, idx := doneMove(t)

	// Purging bee's copy while ace keeps its own is refused (format 20):
	// an assign there again and a finish would leave no copy.
	purge := &UnassignRequest{Assignment: Assignment{Node: "bee", Module: "db"}, PurgeData: []string{"/srv/db/data"}}
	if c := NewCommand(purge); c.V != purgeMovedFormat {
		t.Fatalf("an unassign --purge-data is written in format %d", c.V)
	}
	err := applyErr(t, s, &idx, purge)
	if !errors.Is(err, ErrConflict) || !strings.Contains(err.Error(), "mesh move --finish db first") || !strings.Contains(err.Error(), "mesh assign ace db") {
		t.Fatalf("a purge of bee's copy while ace keeps its own: %v", err)
	}
	if pv, _ := s.Plan(ctx, "bee"); len(pv.Plan.Purge) != 0 || !slices.ContainsFunc(pv.Plan.Resources, func(r Resource) bool { return r.Module == "db" }) {
		t.Fatalf("the refused unassign changed bee's plan: purges %+v", pv.Plan.Purge)
	}
	// A log written before format 20 applies as it did.
	c := NewCommand(purge)
	c.V = purgeMovedFormat - 1
	idx++
	if err := s.Apply(idx, c.Encode()); err != nil {
		t.Fatalf("an unassign --purge-data of format 19: %v", err)
	}
	if pv, _ := s.Plan(ctx, "bee"); len(pv.Plan.Purge) != 1 {
		t.Fatalf("an unassign --purge-data of format 19 purges %+v on bee", pv.Plan.Purge)
	}

	finish := &MoveStepRequest{Module: "db", Finish: true}
	if c := NewCommand(finish); c.V != finishFormat {
		t.Fatalf("a finish is written in format %d", c.V)
	}
	err = applyErr(t, s, &idx, finish)
	if !errors.Is(err, ErrConflict) || !strings.Contains(err.Error(), "no longer runs on bee") || !strings.Contains(err.Error(), "mesh assign ace db") {
		t.Fatalf("a finish once bee no longer runs db: %v", err)
	}
	if pv, _ := s.Plan(ctx, "ace"); len(pv.Plan.Purge) != 0 {
		t.Fatalf("ace purges %+v", pv.Plan.Purge)
	}
	if mv, _ := s.Moves(ctx, "db"); len(mv) != 1 || mv[0].Phase != MoveDone {
		t.Fatalf("the refused finish changed the move: %+v", mv)
	}
	// A log written before format 19 applies as it did.
	c = NewCommand(finish)
	c.V = finishFormat - 1
	idx++
	if err := s.Apply(idx, c.Encode()); err != nil {
		t.Fatalf("a finish of format 18: %v", err)
	}
	if pv, _ := s.Plan(ctx, "ace"); len(pv.Plan.Purge) != 1 {
		t.Fatalf("a finish of format 18 purges %+v on ace", pv.Plan.Purge)
	}
}

// TestPurgeOnToOnceFromRunsItAgain: the refusal of a purge on the TO of a
// done move (TestMoveFinishKeepsTheLastCopy) ends when the move does: an
// assign on FROM again makes FROM's copy its data, and TO's can go.
func TestPurgeOnToOnceFromRunsItAgain(t *testing.T) {
	ctx := context.Background()
	s, idx := doneMove(t)
	purge := &UnassignRequest{Assignment: Assignment{Node: "bee", Module: "db"}, PurgeData: []string{"/srv/db/data"}}
	if err := applyErr(t, s, &idx, purge); !errors.Is(err, ErrConflict) {
		t.Fatalf("a purge on bee while ace keeps its copy: %v", err)
	}
	mustApply(t, s, &idx, &AssignRequest{Assignment: Assignment{Node: "ace", Module: "db"}})
	if mv, _ := s.Moves(ctx, "db"); len(mv) != 0 {
		t.Fatalf("an assign on FROM again kept the move: %+v", mv)
	}
	mustApply(t, s, &idx, purge)
	if pv, _ := s.Plan(ctx, "bee"); len(pv.Plan.Purge) != 1 {
		t.Fatalf("bee purges %+v", pv.Plan.Purge)
	}
	if pv, _ := s.Plan(ctx, "ace"); len(pv.Plan.Purge) != 0 || !slices.ContainsFunc(pv.Plan.Resources, func(r Resource) bool { return r.Module == "db" }) {
		t.Fatalf("ace's plan after the purge on bee: purges %+v", pv.Plan.Purge)
	}
	// A purge of a module never moved is not refused.
	mustApply(t, s, &idx, &UnassignRequest{Assignment: Assignment{Node: "ace", Module: "db"}, PurgeData: []string{"/srv/db/data"}})
}
