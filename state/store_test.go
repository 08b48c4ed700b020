package state

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"
)

var t0 = time.Date(2026, 11, 29, 12, 0, 0, 0, time.UTC)

func openStore(t testing.TB) *Store {
	t.Helper()
	s, err := Open(filepath.Join(t.TempDir(), "state.db"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

// commandLog is a realistic history: init, a second node, modules, assigns,
// a move of a provider, a failing composition and its repair, a report.
func commandLog() [][]byte {
	at := func(i int) time.Time { return t0.Add(time.Duration(i) * time.Second) }
	cmds := []Command{
		{Op: OpInit, MeshID: "m-1", Domain: "internal", Node: &Node{Name: "ace", Address: "10.0.0.1"}},
		{Op: OpNodeAdd, Node: &Node{Name: "novox", Address: "10.0.0.2", Voter: true}},
		{Op: OpModuleAdd, Modules: []ModuleText{{File: "web.yaml", Text: webSrc}, {File: "pg.yaml", Text: pgSrc}}},
		{Op: OpModuleAdd, Modules: []ModuleText{{File: "app.yaml", Text: appSrc}}, Secrets: []Secret{{Pair{"app", "postgres"}, "s3cret"}}},
		{Op: OpAssign, Assign: &Assignment{Node: "ace", Module: "web"}},
		{Op: OpAssign, Assign: &Assignment{Node: "novox", Module: "postgres"}},
		{Op: OpAssign, Assign: &Assignment{Node: "ace", Module: "app"}, Secrets: []Secret{{Pair{"app", "postgres"}, "other"}}},
		{Op: OpPublicDomain, Name: "novox", Domain: "zurag.be"},
		{Op: OpAssign, Assign: &Assignment{Node: "novox", Module: "web"}},
		{Op: OpAssign, Assign: &Assignment{Node: "ace", Module: "nosuch"}},       // rule violation
		{Op: OpUnassign, Assign: &Assignment{Node: "novox", Module: "postgres"}}, // app on ace no longer composes
		{Op: OpAssign, Assign: &Assignment{Node: "ace", Module: "postgres"}},     // repaired, provider moved
		{Op: OpReport, Report: &Report{Node: "ace", Version: 12, AppliedAt: at(99)}},
	}
	var log [][]byte
	for i := range cmds {
		cmds[i].Time = at(i)
		log = append(log, cmds[i].Encode())
	}
	return log
}

func applyAll(t *testing.T, s *Store, log [][]byte) []error {
	var errs []error
	for i, e := range log {
		errs = append(errs, s.Apply(uint64(i+1), e))
	}
	return errs
}

func dumpJSON(t *testing.T, s *Store) string {
	t.Helper()
	var b bytes.Buffer
	if err := s.WriteSnapshot(context.Background(), &b); err != nil {
		t.Fatal(err)
	}
	return b.String()
}

func TestApplyIsDeterministic(t *testing.T) {
	log := commandLog()
	a, b := openStore(t), openStore(t)
	ea := applyAll(t, a, log)
	eb := applyAll(t, b, log)
	if !reflect.DeepEqual(errString(ea), errString(eb)) {
		t.Fatalf("replicas disagree on failures: %v vs %v", ea, eb)
	}
	if ea[9] == nil || !errors.Is(ea[9], ErrNotFound) || !strings.Contains(ea[9].Error(), `module "nosuch" is not in the catalogue (known: app, postgres, web)`) {
		t.Fatalf("assign of unknown module: %v", ea[9])
	}
	da, db := dumpJSON(t, a), dumpJSON(t, b)
	if da != db {
		t.Fatalf("replicas differ:\n%s\n%s", da, db)
	}
	// Snapshot into a third store, which must then equal the others.
	c := openStore(t)
	if err := c.Restore(context.Background(), strings.NewReader(da)); err != nil {
		t.Fatal(err)
	}
	if dc := dumpJSON(t, c); dc != da {
		t.Fatalf("restored state differs:\n%s\n%s", dc, da)
	}
	// Replaying entries that are already applied changes nothing.
	applyAll(t, c, log)
	if dc := dumpJSON(t, c); dc != da {
		t.Fatal("replay after restore changed the state")
	}
	// The first secret generated for a pair wins on every replica.
	var secret string
	a.db.QueryRow(`SELECT secret FROM credentials`).Scan(&secret)
	if secret != "s3cret" {
		t.Fatalf("secret %q", secret)
	}
	if strings.Contains(da, "s3cret\"") && strings.Count(da, "s3cret") != 1 {
		t.Fatal("secret appears outside the credentials table")
	}
}

func errString(es []error) []string {
	var s []string
	for _, e := range es {
		if e == nil {
			s = append(s, "")
		} else {
			s = append(s, e.Error())
		}
	}
	return s
}

// Rule 6: a node whose plan stops composing keeps its last good plan and its
// names; the error is stored on the node until fixed.
func TestFailedCompositionKeepsLastGoodPlan(t *testing.T) {
	s := openStore(t)
	ctx := context.Background()
	log := commandLog()
	for i, e := range log[:9] {
		if err := s.Apply(uint64(i+1), e); err != nil {
			t.Fatalf("entry %d: %v", i+1, err)
		}
	}
	before, err := s.Plan(ctx, "ace")
	if err != nil {
		t.Fatal(err)
	}
	rosterBefore, _ := s.Roster(ctx)
	// Unassign postgres: app's binding on ace no longer resolves.
	if err := s.Apply(11, log[10]); err != nil {
		t.Fatal(err)
	}
	n, _ := s.Node(ctx, "ace")
	if !strings.Contains(n.ComposeError, `provider "postgres" is not assigned to any node`) {
		t.Fatalf("compose error %q", n.ComposeError)
	}
	after, _ := s.Plan(ctx, "ace")
	if after.Version != before.Version || after.Digest != before.Digest {
		t.Fatalf("ace's plan moved from v%d to v%d while failing", before.Version, after.Version)
	}
	roster, _ := s.Roster(ctx)
	if !hasName(roster, "web.internal", "10.0.0.1") || !hasName(roster, "ace.internal", "10.0.0.1") {
		t.Fatalf("ace's names were dropped: %v (before %v)", roster, rosterBefore)
	}
	// novox composes: its postgres left the plan, and its own names follow.
	np, _ := s.Plan(ctx, "novox")
	if np.Version != 11 || hasName(roster, "postgres.internal", "10.0.0.2") {
		t.Fatalf("novox plan v%d, roster %v", np.Version, roster)
	}
	// Repair: postgres on ace. The error clears and a new plan version is made.
	if err := s.Apply(12, log[11]); err != nil {
		t.Fatal(err)
	}
	n, _ = s.Node(ctx, "ace")
	fixed, _ := s.Plan(ctx, "ace")
	if n.ComposeError != "" || fixed.Version != 12 || fixed.Cause != "mesh assign ace postgres" {
		t.Fatalf("after repair: error %q, plan v%d cause %q", n.ComposeError, fixed.Version, fixed.Cause)
	}
	h, _ := s.PlanHistory(ctx, "ace", 0)
	if len(h) < 3 {
		t.Fatalf("history keeps %d versions", len(h))
	}
}

func hasName(r []Name, name, addr string) bool {
	for _, n := range r {
		if n.Name == name && n.Address == addr {
			return true
		}
	}
	return false
}

func TestRuleViolationsChangeNothing(t *testing.T) {
	s := openStore(t)
	log := commandLog()
	applyAll(t, s, log[:5])
	before := dumpJSON(t, s)
	for i, c := range []Command{
		{Op: OpAssign, Assign: &Assignment{Node: "nobody", Module: "web"}},
		{Op: OpUnassign, Assign: &Assignment{Node: "novox", Module: "web"}},
		{Op: OpModuleRemove, Name: "web"},
		{Op: OpNodeRemove, Name: "ace"},
		{Op: OpModuleAdd, Modules: []ModuleText{{File: "bad.yaml", Text: "module: x\nbogus: 1\n"}}},
		{Op: OpPublicDomain, Name: "ace", Domain: "not a domain"},
		{Op: OpInit, MeshID: "m-2", Node: &Node{Name: "x", Address: "1.1.1.1"}},
	} {
		idx := uint64(100 + i)
		err := s.Apply(idx, c.Encode())
		if err == nil {
			t.Errorf("%s was accepted", c.Op)
			continue
		}
		after := dumpJSON(t, s)
		// Only the applied index moves.
		var a, b Snapshot
		json.Unmarshal([]byte(before), &a)
		json.Unmarshal([]byte(after), &b)
		a.Index, b.Index = 0, 0
		if !reflect.DeepEqual(a, b) {
			t.Errorf("%s (%v) changed the state", c.Op, err)
		}
	}
}

func TestApplyPanicsOnCorruptEntry(t *testing.T) {
	s := openStore(t)
	defer func() {
		if recover() == nil {
			t.Fatal("no panic on a corrupt entry")
		}
	}()
	s.Apply(1, []byte("{not json"))
}

func TestChangedWakes(t *testing.T) {
	s := openStore(t)
	ch := s.Changed()
	s.Apply(1, commandLog()[0])
	select {
	case <-ch:
	case <-time.After(5 * time.Second):
		t.Fatal("no wake-up after apply")
	}
}

// Issue 9 item 4: a node that meets a command it does not know, or a newer
// format, stops applying and says so; it never records it as a rule error and
// moves on (which would let replicas diverge in a rolling upgrade).
func TestUnknownCommandStopsTheNode(t *testing.T) {
	s := openStore(t)
	log := commandLog()
	applyAll(t, s, log)
	before, _ := s.AppliedIndex()
	for _, raw := range []string{
		`{"op":"frobnicate","time":"2026-11-29T12:00:00Z"}`,
		`{"op":"assign","v":99,"time":"2026-11-29T12:00:00Z","assign":{"node":"ace","module":"web"}}`,
	} {
		func() {
			defer func() {
				r := recover()
				if r == nil || !strings.Contains(fmt.Sprint(r), "this node stops applying rather than skip it: upgrade its mesh binary") {
					t.Fatalf("%s: %v", raw, r)
				}
			}()
			s.Apply(before+1, []byte(raw))
		}()
		if after, _ := s.AppliedIndex(); after != before {
			t.Fatalf("the applied index moved past a command it could not apply: %d -> %d", before, after)
		}
	}
	// A restore needs format 2, and says so in the log.
	c := &Command{Op: OpRestore, Restore: &RestoreBody{MeshID: "m-1"}}
	if b := c.Encode(); !strings.Contains(string(b), `"v":2`) {
		t.Fatalf("restore encoded without its format: %s", b)
	}
}

// Every replicated table of the schema is in snapshots (a new table can
// never be forgotten by the hand-kept list: Dump refuses, and so does this).
func TestSnapshotCoversTheSchema(t *testing.T) {
	s := openStore(t)
	if err := checkSnapshotCovers(context.Background(), s.db); err != nil {
		t.Fatal(err)
	}
	if _, err := s.db.Exec(`CREATE TABLE forgotten (x TEXT)`); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Dump(context.Background()); err == nil || !strings.Contains(err.Error(), `table "forgotten" is in the schema but not in snapshots`) {
		t.Fatalf("dump with a forgotten table: %v", err)
	}
}
