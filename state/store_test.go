package state

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"mesh/state/manifest"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"syscall"
	"testing"
	"time"
)

var t0 = time.Date(2026, 11, 29, 12, 0, 0, 0, time.UTC)

func openStore(t testing.TB) *Store {
	t.Helper()
	return openStoreAt(t, filepath.Join(t.TempDir(), "state.db"))
}

// openStoreAt opens the store at path, closed when the test ends.
func openStoreAt(t testing.TB, path string) *Store {
	t.Helper()
	s, err := Open(path)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

// spec is a manifest as a proposer parses it.
func spec(file, text string) ModuleSpec {
	sp, err := SpecOf(file, text)
	if err != nil {
		panic(err)
	}
	return sp
}

func encodeAt(r Request, at time.Time) []byte {
	c := NewCommand(r)
	c.Time = at
	return c.Encode()
}

// history is a realistic history: init, a second node, modules, assigns,
// a move of a provider, a failing composition and its repair, a report.
func history() []Request {
	at := func(i int) time.Time { return t0.Add(time.Duration(i) * time.Second) }
	return []Request{
		&InitRequest{MeshID: "m-1", Domain: "internal", Node: Node{Name: "ace", Address: "10.0.0.1"}},
		&NodeAddRequest{Node: Node{Name: "novox", Address: "10.0.0.2", Voter: true}},
		&ModuleAddRequest{Modules: []ModuleSpec{spec("web.yaml", webSrc), spec("pg.yaml", pgSrc)}},
		&ModuleAddRequest{Modules: []ModuleSpec{spec("app.yaml", appSrc)}, Secrets: []Secret{{Pair: Pair{"app", "postgres"}, Value: "s3cret"}}},
		&AssignRequest{Assignment: Assignment{Node: "ace", Module: "web"}},
		&AssignRequest{Assignment: Assignment{Node: "novox", Module: "postgres"}},
		&AssignRequest{Assignment: Assignment{Node: "ace", Module: "app"}, Secrets: []Secret{{Pair: Pair{"app", "postgres"}, Value: "other"}}},
		&PublicDomainRequest{Node: "novox", Domain: "zurag.be"},
		&AssignRequest{Assignment: Assignment{Node: "novox", Module: "web"}},
		&AssignRequest{Assignment: Assignment{Node: "ace", Module: "nosuch"}},       // rule violation
		&UnassignRequest{Assignment: Assignment{Node: "novox", Module: "postgres"}}, // app on ace no longer composes
		&AssignRequest{Assignment: Assignment{Node: "ace", Module: "postgres"}},     // repaired, provider moved
		&ReportRequest{Report: Report{Node: "ace", Version: 12, AppliedAt: at(99)}},
	}
}

func commandLog() [][]byte {
	var log [][]byte
	for i, r := range history() {
		log = append(log, encodeAt(r, t0.Add(time.Duration(i)*time.Second)))
	}
	return log
}

// legacyLog is the same history as formats 1 and 2 wrote it: flat
// commands, manifests as text.
func legacyLog() [][]byte {
	at := func(i int) time.Time { return t0.Add(time.Duration(i) * time.Second) }
	cmds := []legacyCommand{
		{Op: OpInit, MeshID: "m-1", Domain: "internal", Node: &Node{Name: "ace", Address: "10.0.0.1"}},
		{Op: OpNodeAdd, Node: &Node{Name: "novox", Address: "10.0.0.2", Voter: true}},
		{Op: OpModuleAdd, Modules: []legacyText{{File: "web.yaml", Text: webSrc}, {File: "pg.yaml", Text: pgSrc}}},
		{Op: OpModuleAdd, Modules: []legacyText{{File: "app.yaml", Text: appSrc}}, Secrets: []Secret{{Pair: Pair{"app", "postgres"}, Value: "s3cret"}}},
		{Op: OpAssign, Assign: &Assignment{Node: "ace", Module: "web"}},
		{Op: OpAssign, Assign: &Assignment{Node: "novox", Module: "postgres"}},
		{Op: OpAssign, Assign: &Assignment{Node: "ace", Module: "app"}, Secrets: []Secret{{Pair: Pair{"app", "postgres"}, Value: "other"}}},
		{Op: OpPublicDomain, Name: "novox", Domain: "zurag.be"},
		{Op: OpAssign, Assign: &Assignment{Node: "novox", Module: "web"}},
		{Op: OpAssign, Assign: &Assignment{Node: "ace", Module: "nosuch"}},
		{Op: OpUnassign, Assign: &Assignment{Node: "novox", Module: "postgres"}},
		{Op: OpAssign, Assign: &Assignment{Node: "ace", Module: "postgres"}},
		{Op: OpReport, Report: &Report{Node: "ace", Version: 12, AppliedAt: at(99)}},
	}
	var log [][]byte
	for i := range cmds {
		cmds[i].Time = at(i)
		b, _ := json.Marshal(cmds[i])
		log = append(log, b)
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
	unparsed := spec("web.yaml", webSrc)
	unparsed.Manifest = nil
	tampered := spec("web.yaml", webSrc)
	tampered.Text += "# changed after parsing\n"
	for i, r := range []Request{
		&AssignRequest{Assignment: Assignment{Node: "nobody", Module: "web"}},
		&UnassignRequest{Assignment: Assignment{Node: "novox", Module: "web"}},
		&ModuleRemoveRequest{Name: "web"},
		&NodeRemoveRequest{Name: "ace"},
		&ModuleAddRequest{Modules: []ModuleSpec{unparsed}},
		&ModuleAddRequest{Modules: []ModuleSpec{tampered}},
		&ModuleAddRequest{Modules: []ModuleSpec{spec("web.yaml", webSrc), spec("web2.yaml", webSrc)}},
		&PublicDomainRequest{Node: "ace", Domain: "not a domain"},
		&InitRequest{MeshID: "m-2", Node: Node{Name: "x", Address: "1.1.1.1"}},
		&NodeAddRequest{},
	} {
		idx := uint64(100 + i)
		err := s.Apply(idx, encodeAt(r, t0))
		if err == nil {
			t.Errorf("%s was accepted", r.Op())
			continue
		}
		after := dumpJSON(t, s)
		// Only the applied index moves.
		var a, b Snapshot
		json.Unmarshal([]byte(before), &a)
		json.Unmarshal([]byte(after), &b)
		a.Index, b.Index = 0, 0
		if !reflect.DeepEqual(a, b) {
			t.Errorf("%s (%v) changed the state", r.Op(), err)
		}
	}
}

// Issue 9 item 4: entries written by formats 1 and 2 (flat commands that
// carried manifest text) still in a log or snapshot apply to the same state
// as the typed commands of today.
func TestLegacyEntriesApplyAsBefore(t *testing.T) {
	typed, legacy := openStore(t), openStore(t)
	et := applyAll(t, typed, commandLog())
	el := applyAll(t, legacy, legacyLog())
	if !reflect.DeepEqual(errString(et), errString(el)) {
		t.Fatalf("failures differ:\n%q\n%q", errString(et), errString(el))
	}
	if a, b := dumpJSON(t, typed), dumpJSON(t, legacy); a != b {
		t.Fatalf("legacy log gives another state:\n%s\n%s", a, b)
	}
	// A legacy entry forwarded to a leader is proposed as an envelope of
	// this format, and decodes to the same request.
	c, err := Decode(legacyLog()[2])
	if err != nil || c.V != ops[OpModuleAdd].format || c.Op != OpModuleAdd {
		t.Fatalf("decode legacy module add: %+v %v", c, err)
	}
	again, err := Decode(c.Encode())
	if err != nil {
		t.Fatal(err)
	}
	r, err := again.Request()
	if err != nil || len(r.(*ModuleAddRequest).Modules) != 2 || r.(*ModuleAddRequest).Modules[1].Manifest.Module != "postgres" {
		t.Fatalf("re-encoded legacy entry: %+v %v", r, err)
	}
}

// The FSM reads a manifest's parsed form, never its text: a spec whose
// parsed form says something else than a parse of its text is applied as
// the parsed form says (a binary with another parser cannot make this
// replica disagree with the proposer).
func TestApplyReadsTheParsedFormOnly(t *testing.T) {
	s := openStore(t)
	log := commandLog()
	applyAll(t, s, log[:2])
	sp := spec("web.yaml", webSrc)
	sp.Manifest.Resources[0].Typed.HasMode, sp.Manifest.Resources[0].Typed.Mode = true, 0o750
	if err := s.Apply(3, encodeAt(&ModuleAddRequest{Modules: []ModuleSpec{sp}}, t0)); err != nil {
		t.Fatal(err)
	}
	if err := s.Apply(4, encodeAt(&AssignRequest{Assignment: Assignment{Node: "ace", Module: "web"}}, t0)); err != nil {
		t.Fatal(err)
	}
	v, err := s.Plan(context.Background(), "ace")
	if err != nil {
		t.Fatal(err)
	}
	found := false
	for _, r := range v.Plan.Resources {
		if r.Name == "/srv/web" {
			found = true
			if !r.Typed.HasMode || r.Typed.Mode != 0o750 {
				t.Fatalf("the plan took mode %o, not the parsed form's 750", r.Typed.Mode)
			}
		}
	}
	if !found {
		t.Fatalf("no /srv/web in the plan: %+v", v.Plan.Resources)
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
		`{"op":"assign","v":99,"time":"2026-11-29T12:00:00Z","body":{"node":"ace","module":"web"}}`,
		`{"op":"frobnicate","v":3,"time":"2026-11-29T12:00:00Z","body":{}}`,
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
	// Every command says the format it needs in the log.
	if b := NewCommand(&RestoreBody{MeshID: "m-1"}).Encode(); !strings.Contains(string(b), fmt.Sprintf(`"v":%d`, ops[OpRestore].format)) {
		t.Fatalf("restore encoded without its format: %s", b)
	}
	// The newest format is needed by what only it carries: a node that
	// cannot apply it is told so before it is proposed. Without it the
	// command keeps its op's format, so a rolling upgrade goes on.
	if b := NewCommand(&NodeCertRequest{Node: "ace", Key: strings.Repeat("ab", 32)}).Encode(); !strings.Contains(string(b), `"v":6`) {
		t.Fatalf("node.cert with a key encoded without its format: %s", b)
	}
	if b := NewCommand(&NodeAddRequest{Node: Node{Name: "n2", Address: "10.0.0.2", OverlayKey: "k"}}).Encode(); !strings.Contains(string(b), `"v":7`) {
		t.Fatalf("node.add with an overlay key encoded without its format: %s", b)
	}
	if b := NewCommand(&NodeCertRequest{Node: "ace"}).Encode(); !strings.Contains(string(b), fmt.Sprintf(`"v":%d`, ops[OpNodeCert].format)) {
		t.Fatalf("node.cert without a key encoded with a newer format: %s", b)
	}
}

// Every replicated table of the schema is in snapshots: the list is read
// from the schema, so a table added later cannot be forgotten.
func TestSnapshotCoversTheSchema(t *testing.T) {
	ctx := context.Background()
	a, b := openStore(t), openStore(t)
	applyAll(t, a, commandLog())
	for _, s := range []*Store{a, b} {
		if _, err := s.db.Exec(`CREATE TABLE later (k TEXT PRIMARY KEY, v INTEGER)`); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := a.db.Exec(`INSERT INTO later VALUES ('x', 7)`); err != nil {
		t.Fatal(err)
	}
	sn, err := a.Dump(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for _, tbl := range []string{"settings", "nodes", "modules", "assignments", "credentials", "plans", "roster", "reports", "bindings", "later"} {
		if _, ok := sn.Tables[tbl]; !ok {
			t.Errorf("table %s is not in the snapshot", tbl)
		}
	}
	if _, ok := sn.Tables["applied"]; ok {
		t.Error("the node's own applied index is in the snapshot as a table")
	}
	if err := b.Restore(ctx, strings.NewReader(dumpJSON(t, a))); err != nil {
		t.Fatal(err)
	}
	var v int
	if err := b.db.QueryRow(`SELECT v FROM later WHERE k = 'x'`).Scan(&v); err != nil || v != 7 {
		t.Fatalf("the new table's row did not come back: %d %v", v, err)
	}
	if dumpJSON(t, a) != dumpJSON(t, b) {
		t.Fatal("restored replica differs")
	}
	// A replica that lacks a table of the snapshot refuses it, whole.
	c := openStore(t)
	err = c.Restore(ctx, strings.NewReader(dumpJSON(t, a)))
	if err == nil || !strings.Contains(err.Error(), `table "later" that this mesh binary does not know`) {
		t.Fatalf("restore of an unknown table: %v", err)
	}
	if n, _ := c.AppliedIndex(); n != 0 {
		t.Fatalf("a refused restore moved the index to %d", n)
	}
}

// A snapshot of format 1 (written by older binaries: a fixed list of tables)
// restores to the same state.
func TestSnapshotFormat1Restores(t *testing.T) {
	ctx := context.Background()
	a := openStore(t)
	applyAll(t, a, commandLog())
	sn, err := a.Dump(ctx)
	if err != nil {
		t.Fatal(err)
	}
	v1 := map[string]any{"format": 1, "index": sn.Index}
	var settings [][2]string
	for _, r := range sn.Rows("settings") {
		settings = append(settings, [2]string{r["key"].(string), r["value"].(string)})
	}
	v1["settings"] = settings
	for name, rows := range sn.Tables {
		if name == "settings" {
			continue
		}
		for _, r := range rows {
			if name == "modules" {
				delete(r, "spec") // format 1 had no parsed forms
			}
		}
		v1[name] = rows
	}
	// Format 1 predates the roster's history: a replica restored from one
	// has none until the next change.
	delete(v1, "roster_history")
	a.db.Exec(`DELETE FROM roster_history`)
	raw, _ := json.Marshal(v1)
	b := openStore(t)
	if err := b.Restore(ctx, bytes.NewReader(raw)); err != nil {
		t.Fatal(err)
	}
	if x, y := dumpJSON(t, a), dumpJSON(t, b); x != y {
		t.Fatalf("format 1 restores to another state:\n%s\n%s", x, y)
	}
}

// A replica written before the catalogue kept parsed forms (schema 2) gets
// them at open, from its stored text, and composes as before.
func TestOpenFillsParsedForms(t *testing.T) {
	path := filepath.Join(t.TempDir(), "state.db")
	s, err := Open(path)
	if err != nil {
		t.Fatal(err)
	}
	applyAll(t, s, commandLog())
	before := dumpJSON(t, s)
	if _, err := s.db.Exec(`UPDATE modules SET spec = ''`); err != nil {
		t.Fatal(err)
	}
	s.Close()
	s, err = Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if after := dumpJSON(t, s); after != before {
		t.Fatalf("parsed forms filled at open differ:\n%s\n%s", before, after)
	}
	var empty int
	s.db.QueryRow(`SELECT COUNT(*) FROM modules WHERE spec = ''`).Scan(&empty)
	if empty != 0 {
		t.Fatalf("%d modules left without a parsed form", empty)
	}
}

// The catalogue the FSM keeps between commands gives exactly the state a
// replica that reads it afresh for every command gets: through a module
// replaced, a module add that fails and rolls back, a removal and a
// restore.
func TestKeptCatalogueIsTheTruth(t *testing.T) {
	web2 := strings.Replace(webSrc, "localhost/busybox:1", "localhost/busybox:2", 1)
	web3 := strings.Replace(webSrc, "localhost/busybox:1", "localhost/busybox:3", 1)
	reqs := append(history(),
		&ModuleAddRequest{Modules: []ModuleSpec{spec("web.yaml", web2)}},
		&AssignRequest{Assignment: Assignment{Node: "novox", Module: "app"}},
		// Fails whole (the module is given twice): nothing of web3 stays.
		&ModuleAddRequest{Modules: []ModuleSpec{spec("web.yaml", web3), spec("web2.yaml", web3)}},
		&UnassignRequest{Assignment: Assignment{Node: "ace", Module: "web"}},
		&AssignRequest{Assignment: Assignment{Node: "ace", Module: "web"}},
		&UnassignRequest{Assignment: Assignment{Node: "ace", Module: "app"}},
		&UnassignRequest{Assignment: Assignment{Node: "novox", Module: "app"}},
		&ModuleRemoveRequest{Name: "app"},
		&AssignRequest{Assignment: Assignment{Node: "novox", Module: "postgres"}},
		// A removal deletes the node's names itself, before recompose.
		&NodeAddRequest{Node: Node{Name: "g14", Address: "10.0.0.3"}},
		&AssignRequest{Assignment: Assignment{Node: "g14", Module: "web"}},
		&NodeRemoveRequest{Name: "g14", Force: true},
		&AssignRequest{Assignment: Assignment{Node: "novox", Module: "web"}},
	)
	kept, afresh := openStore(t), openStore(t)
	forget := func() { afresh.cat = nil; afresh.roster.Store(nil) }
	ctx := context.Background()
	digests := func(c map[string]*manifest.Manifest) map[string]string {
		d := map[string]string{}
		for k, m := range c {
			d[k] = m.Digest
		}
		return d
	}
	// A copy published before a command stays as it was (the FSM edits
	// its own catalogue in place).
	var lastPub map[string]*manifest.Manifest
	var lastSaid string
	for i, r := range reqs {
		e := encodeAt(r, t0.Add(time.Duration(i)*time.Second))
		ek := kept.Apply(uint64(i+1), e)
		if lastPub != nil && fmt.Sprint(digests(lastPub)) != lastSaid {
			t.Fatalf("command %d (%s) changed the catalogue published before it: %v, was %s", i+1, r.Op(), digests(lastPub), lastSaid)
		}
		forget()
		ef := afresh.Apply(uint64(i+1), e)
		forget()
		if fmt.Sprint(ek) != fmt.Sprint(ef) {
			t.Fatalf("command %d (%s): %v with the kept catalogue, %v without", i+1, r.Op(), ek, ef)
		}
		if dk, df := dumpJSON(t, kept), dumpJSON(t, afresh); dk != df {
			t.Fatalf("after command %d (%s) the replicas differ:\n%s\n%s", i+1, r.Op(), dk, df)
		}
		// The roster the resolver reads is the table's.
		got, _ := kept.Roster(ctx)
		want, _ := readRoster(ctx, kept.db)
		if fmt.Sprint(got) != fmt.Sprint(want) {
			t.Fatalf("after command %d (%s) the kept roster is\n%v\nthe table\n%v", i+1, r.Op(), got, want)
		}
		// So is the catalogue a proposer's SealNeeds reads.
		if pub, err := kept.publishedCatalogue(ctx); err != nil {
			t.Fatal(err)
		} else {
			fresh, _ := kept.readCatalogue(ctx, kept.db)
			if g, w := fmt.Sprint(digests(pub)), fmt.Sprint(digests(fresh)); g != w {
				t.Fatalf("after command %d (%s) the published catalogue is %s, the table %s", i+1, r.Op(), g, w)
			}
			lastPub, lastSaid = pub, fmt.Sprint(digests(pub))
		}
	}
	if !strings.Contains(dumpJSON(t, kept), "localhost/busybox:2") || strings.Contains(dumpJSON(t, kept), "localhost/busybox:3") {
		t.Fatal("the plans do not run web as replaced, or the failed add left its image")
	}
	// A restore replaces what is kept.
	c := openStore(t)
	applyAll(t, c, commandLog())
	if err := kept.Restore(context.Background(), strings.NewReader(dumpJSON(t, c))); err != nil {
		t.Fatal(err)
	}
	next := encodeAt(&AssignRequest{Assignment: Assignment{Node: "novox", Module: "app"}}, t0.Add(time.Hour))
	n := uint64(len(commandLog()) + 1)
	kept.Apply(n, next)
	c.cat = nil
	c.Apply(n, next)
	if dk, dc := dumpJSON(t, kept), dumpJSON(t, c); dk != dc {
		t.Fatalf("after a restore the kept catalogue is stale:\n%s\n%s", dk, dc)
	}
}

// The state database is the file in the data directory whatever the
// directory is named, with its pragmas: SQLite reads the path as a URI, in
// which '#' and '?' end it and '%' escapes. (A directory "mesh#2" once made
// every store open the file "mesh" in its parent; one with '?' lost WAL.)
func TestOpenAnyDirectoryName(t *testing.T) {
	for _, d := range []string{"mesh#2", "mesh?x=1", "a%23b", "with space", "ä"} {
		dir := filepath.Join(t.TempDir(), d)
		s, err := Open(filepath.Join(dir, "state.db"))
		if err != nil {
			t.Fatalf("%q: %v", d, err)
		}
		var mode string
		if err := s.db.QueryRowContext(context.Background(), "PRAGMA journal_mode").Scan(&mode); err != nil || mode != "wal" {
			t.Errorf("%q: journal mode %q (%v), want wal", d, mode, err)
		}
		s.Close()
		if _, err := os.Stat(filepath.Join(dir, "state.db")); err != nil {
			t.Errorf("%q: the database is not in its directory: %v", d, err)
		}
		if ents, _ := os.ReadDir(filepath.Dir(dir)); len(ents) != 1 {
			t.Errorf("%q: files beside the directory: %v", d, ents)
		}
	}
}

// A state database that is not one (damaged, overwritten) stops the open
// with what to do: move it aside, the node makes its replica again.
func TestDamagedStateSaysWhatToDo(t *testing.T) {
	path := filepath.Join(t.TempDir(), "state.db")
	if err := os.WriteFile(path, bytes.Repeat([]byte("damaged "), 1024), 0o600); err != nil {
		t.Fatal(err)
	}
	_, err := Open(path)
	if err == nil || !IsDamaged(err) || !strings.Contains(err.Error(), "move state.db, state.db-wal and state.db-shm aside") {
		t.Fatalf("opening a damaged state db: %v", err)
	}
}

// A command refused after it edited the kept catalogue, whose
// transaction begun again to record its index fails (a full disk), is
// applied again; neither try leaves its edit in the catalogue kept or
// published (a review found the second try kept the first's: replicas
// would compose the refused manifest).
func TestRefusedEditForgottenOnAFullDisk(t *testing.T) {
	old := DiskFullRetry
	DiskFullRetry = time.Millisecond
	t.Cleanup(func() { DiskFullRetry, beginAgain = old, nil })
	s := openStore(t)
	applyAll(t, s, commandLog())
	n := uint64(len(commandLog()))
	fails := 1
	beginAgain = func() error {
		if fails > 0 {
			fails--
			return syscall.ENOSPC
		}
		return nil
	}
	// Refused: web given twice; the first is in the catalogue by then.
	web3 := strings.Replace(webSrc, "localhost/busybox:1", "localhost/busybox:3", 1)
	err := s.Apply(n+1, encodeAt(&ModuleAddRequest{Modules: []ModuleSpec{spec("web.yaml", web3), spec("web2.yaml", web3)}}, t0.Add(time.Hour)))
	if err == nil || fails != 0 {
		t.Fatalf("the refused add: %v, begins failed: %d of 1", err, 1-fails)
	}
	ctx := context.Background()
	table, err := s.readCatalogue(ctx, s.db)
	if err != nil {
		t.Fatal(err)
	}
	pub, err := s.publishedCatalogue(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if k := s.cat; k != nil && k["web"].Digest != table["web"].Digest {
		t.Errorf("the catalogue kept has the refused manifest of web")
	}
	if pub["web"].Digest != table["web"].Digest {
		t.Errorf("the catalogue published has the refused manifest of web")
	}
	// And the next command composes with the table's.
	s.Apply(n+2, encodeAt(&AssignRequest{Assignment: Assignment{Node: "novox", Module: "app"}}, t0.Add(2*time.Hour)))
	if strings.Contains(dumpJSON(t, s), "localhost/busybox:3") {
		t.Error("a plan runs the refused manifest of web")
	}
}

// A reader of the published catalogue does not wait on the FSM: with
// applyMu held (a restore, a catch-up, a full disk's retries) it reads
// the table.
func TestPublishedCatalogueDoesNotWait(t *testing.T) {
	s := openStore(t)
	applyAll(t, s, commandLog())
	s.catPub.Store(nil)
	s.applyMu.Lock()
	got := make(chan map[string]*manifest.Manifest, 1)
	go func() {
		c, err := s.publishedCatalogue(context.Background())
		if err != nil {
			t.Error(err)
		}
		got <- c
	}()
	select {
	case c := <-got:
		if c["web"] == nil || c["postgres"] == nil {
			t.Errorf("read with applyMu held: %v", c)
		}
	case <-time.After(20 * time.Second):
		t.Fatal("publishedCatalogue waits on applyMu")
	}
	s.applyMu.Unlock()
	if s.catPub.Load() != nil {
		t.Error("a catalogue read from the table while the FSM applied was published")
	}
}
