package state

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"
)

// Issue 30, item 5: 1,000 commands that each make a new plan leave at most
// the bound of plan versions per node, of roster events per name, and of
// versions per module, on two replicas alike (their whole state is equal);
// a version older than the bound's days goes even under the count; the
// newest always stays.
func TestHistoryIsBounded(t *testing.T) {
	ctx := context.Background()
	a, b := openStore(t), openStore(t)
	var idx uint64
	at := t0
	both := func(r Request) {
		t.Helper()
		idx++
		for _, s := range []*Store{a, b} {
			if err := s.Apply(idx, encodeAt(r, at)); err != nil {
				t.Fatalf("%s: %v", r.describe(), err)
			}
		}
	}
	both(&InitRequest{MeshID: "m-1", Node: Node{Name: "ace", Address: "10.0.0.1"}})
	both(&NodeAddRequest{Node: Node{Name: "bob", Address: "10.0.0.2"}})
	for i := range 1000 {
		at = at.Add(time.Minute)
		src := fmt.Sprintf("module: web\nresources:\n  - container: web.main\n    image: busybox:%d\n", i)
		both(&ModuleAddRequest{Modules: []ModuleSpec{spec("web.yaml", src)}})
		if i == 0 {
			both(&AssignRequest{Assignment: Assignment{Node: "ace", Module: "web"}})
		}
		if i%2 == 0 {
			both(&AssignRequest{Assignment: Assignment{Node: "bob", Module: "web"}})
		} else {
			both(&UnassignRequest{Assignment: Assignment{Node: "bob", Module: "web"}})
		}
	}
	for _, s := range []*Store{a, b} {
		for _, n := range []string{"ace", "bob"} {
			h, err := s.PlanHistory(ctx, n, 0)
			if err != nil || len(h) == 0 || len(h) > DefaultHistoryVersions {
				t.Fatalf("%s keeps %d plan versions (%v), want 1 to %d", n, len(h), err, DefaultHistoryVersions)
			}
		}
		ev, err := s.RosterHistory(ctx, "web.internal")
		if err != nil || len(ev) > DefaultHistoryVersions {
			t.Fatalf("web.internal keeps %d roster events (%v)", len(ev), err)
		}
	}
	da, _ := a.Dump(ctx)
	db, _ := b.Dump(ctx)
	ja, _ := json.Marshal(da.Tables)
	jb, _ := json.Marshal(db.Tables)
	if string(ja) != string(jb) {
		t.Fatal("two replicas pruned differently")
	}

	// Days: a bound of 10 versions and 1 day; a day later one command
	// leaves its plan and the one it replaced (a diff, a rollout's revert
	// need it), however old: a version's age is from when it was replaced.
	idx++
	for _, s := range []*Store{a, b} {
		if err := s.Apply(idx, encodeAt(&HistoryKeepRequest{Versions: 10, Days: 1}, at)); err != nil {
			t.Fatal(err)
		}
	}
	if h, _ := a.PlanHistory(ctx, "ace", 0); len(h) != 10 {
		t.Fatalf("history.keep 10 leaves %d versions of ace", len(h))
	}
	at = at.Add(25 * time.Hour)
	both(&ModuleAddRequest{Modules: []ModuleSpec{spec("web.yaml", "module: web\nresources:\n  - container: web.main\n    image: busybox:late\n")}})
	if h, _ := a.PlanHistory(ctx, "ace", 0); len(h) != 2 || !strings.Contains(h[0].Plan.Resources[0].Decl.Image, "late") {
		t.Fatalf("a day later %d versions are kept, want the newest and the one it replaced", len(h))
	}

	b2, _ := a.HistoryBound(ctx)
	if b2 != (HistoryBound{Set: true, Versions: 10, Days: 1}) {
		t.Fatalf("the bound: %+v", b2)
	}
	for _, bad := range []HistoryKeepRequest{{Versions: 9, Days: 1}, {Versions: 10, Days: 0}, {Versions: MaxHistoryVersions + 1, Days: 1}} {
		idx++
		if err := a.Apply(idx, encodeAt(&bad, at)); err == nil || !strings.Contains(err.Error(), "is not between") {
			t.Fatalf("history.keep %+v: %v", bad, err)
		}
	}
}

// A mesh made before the bound (an init of an older format) keeps
// everything, as the older replicas do, until history.keep.
func TestHistoryUnboundedBeforeKeep(t *testing.T) {
	ctx := context.Background()
	s := openStore(t)
	var idx uint64
	c := NewCommand(&InitRequest{MeshID: "m-1", Node: Node{Name: "ace", Address: "10.0.0.1"}})
	c.V, c.Time = 5, t0
	idx++
	if err := s.Apply(idx, c.Encode()); err != nil {
		t.Fatal(err)
	}
	if b, _ := s.HistoryBound(ctx); b.Set {
		t.Fatalf("an init of format 5 set a bound: %+v", b)
	}
	for i := range 120 {
		mustApply(t, s, &idx, &ModuleAddRequest{Modules: []ModuleSpec{spec("w.yaml", fmt.Sprintf("module: w\nresources:\n  - container: w.main\n    image: b:%d\n", i))}})
		if i == 0 {
			mustApply(t, s, &idx, &AssignRequest{Assignment: Assignment{Node: "ace", Module: "w"}})
		}
	}
	if h, _ := s.PlanHistory(ctx, "ace", 0); len(h) < 120 {
		t.Fatalf("pruned without a bound: %d versions", len(h))
	}
}

// A module's versions (kept for rollouts) are pruned alike, but never the
// two newest nor a version its rollout goes from or to, however old.
func TestModuleHistoryPruning(t *testing.T) {
	s := openStore(t)
	tx, err := s.db.Begin()
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback()
	at := t0.Add(200 * 24 * time.Hour)
	ap := &applier{s: s, ctx: context.Background(), tx: tx, q: txStmts{s, tx}, at: at.Format(timeLayout)}
	for v := 1; v <= 30; v++ {
		when := t0.Add(time.Duration(v) * time.Hour) // all replaced long before the cutoff
		if _, err := tx.Exec(`INSERT INTO module_history (module, version, file, manifest, digest, spec, at, cause) VALUES ('m', ?, 'm.yaml', '', '', '', ?, '')`, v, when.Format(timeLayout)); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := tx.Exec(`INSERT INTO rollouts (module, from_version, to_version, state, reached, reason, started_at, step_index, step_at) VALUES ('m', 7, 30, 'running', '', '', '', 0, '')`); err != nil {
		t.Fatal(err)
	}
	if err := ap.pruneModule(HistoryBound{Set: true, Versions: 10, Days: 90}, "m"); err != nil {
		t.Fatal(err)
	}
	kept, err := listRowsQ(tx, `SELECT version FROM module_history WHERE module = 'm' ORDER BY version`)
	if err != nil || strings.Join(kept, " ") != "7 29 30" {
		t.Fatalf("kept %v (%v), want the rollout's from (7) and the two newest", kept, err)
	}
}
