package state

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

func actionStrings(p *Preview) map[string][]string {
	out := map[string][]string{}
	for _, n := range p.Nodes {
		for _, a := range n.Actions {
			out[n.Node] = append(out[n.Node], a.String())
		}
	}
	return out
}

// Issue 12 item 1: a preview says what a write would do, node by node, with
// the reconciler's reasons, and writes nothing.
func TestPreview(t *testing.T) {
	s := openStore(t)
	ctx := context.Background()
	log := commandLog()
	applyAll(t, s, log[:9]) // ace: web, app; novox: postgres, web (zurag.be)
	before := dumpJSON(t, s)
	idx, _ := s.AppliedIndex()
	preview := func(r Request) *Preview {
		t.Helper()
		p, err := s.Preview(ctx, encodeAt(r, t0.Add(time.Hour)))
		if err != nil {
			t.Fatal(err)
		}
		if after := dumpJSON(t, s); after != before {
			t.Fatal("a preview changed the replica")
		}
		if i, _ := s.AppliedIndex(); i != idx {
			t.Fatalf("a preview moved the applied index %d -> %d", idx, i)
		}
		return p
	}

	// A second postgres, on ace: created there, a name added, novox as it is.
	p := preview(&AssignRequest{Assignment: Assignment{Node: "ace", Module: "postgres"}})
	got := actionStrings(p)
	if !contains(got["ace"], "+ create directory /srv/pg (postgres)") || len(got["novox"]) != 0 {
		t.Errorf("assign: %v", got)
	}
	if !hasChange(p.Names, "+", "postgres.internal", "10.0.0.1") {
		t.Errorf("names: %+v", p.Names)
	}
	// Made for real, then the provider leaves novox: app's binding on ace is
	// rewritten, so app's step reruns (restart-on), and novox removes it.
	if err := s.Apply(idx+1, encodeAt(&AssignRequest{Assignment: Assignment{Node: "ace", Module: "postgres"}}, t0)); err != nil {
		t.Fatal(err)
	}
	before, idx = dumpJSON(t, s), idx+1
	p = preview(&UnassignRequest{Assignment: Assignment{Node: "novox", Module: "postgres"}})
	got = actionStrings(p)
	for _, w := range []string{
		"~ update binding /srv/app/db.binding (app): resolved content changed",
		"~ rerun step migrate (app): restart-on: /srv/app/db.binding changed",
	} {
		if !contains(got["ace"], w) {
			t.Errorf("ace lacks %q:\n%s", w, strings.Join(got["ace"], "\n"))
		}
	}
	if !contains(got["novox"], "- remove directory /srv/pg (postgres): kept if it holds anything the mesh did not put there") {
		t.Errorf("novox: %v", got["novox"])
	}
	if !hasChange(p.Names, "-", "postgres.internal", "10.0.0.2") {
		t.Errorf("names: %+v", p.Names)
	}

	// A web manifest with a new image: both nodes replace web.server.
	newWeb := strings.Replace(webSrc, "localhost/busybox:1", "localhost/busybox:2", 1)
	p = preview(&ModuleAddRequest{Modules: []ModuleSpec{spec("web.yaml", newWeb)}})
	got = actionStrings(p)
	for _, n := range []string{"ace", "novox"} {
		if !contains(got[n], "~ replace container web.server (web): image changed") {
			t.Errorf("%s: %v", n, got[n])
		}
	}

	// A public domain moves: names change, no resource does.
	p = preview(&PublicDomainRequest{Node: "novox", Domain: "example.org"})
	if !hasChange(p.Names, "+", "www.example.org", "10.0.0.2") || !hasChange(p.Names, "-", "www.zurag.be", "10.0.0.2") {
		t.Errorf("names: %+v", p.Names)
	}

	// Unassign: removals, containers first.
	p = preview(&UnassignRequest{Assignment: Assignment{Node: "ace", Module: "web"}})
	got = actionStrings(p)
	if len(got["ace"]) != 2 || got["ace"][0] != "- remove container web.server (web)" || !strings.HasPrefix(got["ace"][1], "- remove directory /srv/web (web): kept if") {
		t.Errorf("unassign: %v", got["ace"])
	}

	// What the state machine refuses, a preview refuses with the same words.
	_, err := s.Preview(ctx, encodeAt(&AssignRequest{Assignment: Assignment{Node: "nosuch", Module: "web"}}, t0))
	want := s.Apply(idx+1, encodeAt(&AssignRequest{Assignment: Assignment{Node: "nosuch", Module: "web"}}, t0))
	if err == nil || want == nil || err.Error() != want.Error() {
		t.Fatalf("preview error %v, write error %v", err, want)
	}

	// No copy is left beside the replica.
	if m, _ := filepath.Glob(filepath.Join(filepath.Dir(s.path), scratchPrefix+"*")); len(m) != 0 {
		t.Fatalf("left behind: %v", m)
	}
}

// A copy left by a killed preview is removed when the replica is opened.
func TestPreviewLeftoversRemovedAtOpen(t *testing.T) {
	dir := t.TempDir()
	left := filepath.Join(dir, scratchPrefix+"0123.db")
	os.WriteFile(left, []byte("x"), 0o600)
	os.WriteFile(left+"-wal", []byte("x"), 0o600)
	s, err := Open(filepath.Join(dir, "state.db"))
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if m, _ := filepath.Glob(filepath.Join(dir, scratchPrefix+"*")); len(m) != 0 {
		t.Fatalf("left behind: %v", m)
	}
}

func contains(l []string, s string) bool {
	for _, x := range l {
		if x == s {
			return true
		}
	}
	return false
}

func hasChange(l []NameChange, op, name, addr string) bool {
	for _, c := range l {
		if c.Op == op && c.Name == name && c.Address == addr {
			return true
		}
	}
	return false
}

// mesh module pull is a command of its own: every node running the module
// gets a plan whose containers of it carry the pull's index, nothing else
// in the plan moves, and a preview names the containers that will pull.
func TestModulePullInPlans(t *testing.T) {
	s := openStore(t)
	ctx := context.Background()
	applyAll(t, s, commandLog()[:9]) // web on ace and novox
	idx, _ := s.AppliedIndex()
	before, _ := s.Plan(ctx, "ace")
	p, err := s.Preview(ctx, encodeAt(&ModulePullRequest{Module: "web"}, t0))
	if err != nil {
		t.Fatal(err)
	}
	got := actionStrings(p)
	for _, n := range []string{"ace", "novox"} {
		if len(got[n]) != 1 || got[n][0] != "~ pull container web.server (web): mesh module pull: replaced only if its image changed" {
			t.Fatalf("%s: %v", n, got[n])
		}
	}
	if err := s.Apply(idx+1, encodeAt(&ModulePullRequest{Module: "web"}, t0)); err != nil {
		t.Fatal(err)
	}
	after, _ := s.Plan(ctx, "ace")
	if after.Version != idx+1 || after.Cause != "mesh module pull web" {
		t.Fatalf("plan v%d %q", after.Version, after.Cause)
	}
	for i, r := range after.Plan.Resources {
		want := uint64(0)
		if r.Kind == "container" && r.Module == "web" {
			want = idx + 1
		}
		if r.Pull != want {
			t.Fatalf("%s pull %d, want %d", r.Name, r.Pull, want)
		}
		r.Pull = 0
		if jsonString(r) != jsonString(before.Plan.Resources[i]) {
			t.Fatalf("%s changed beyond its pull", r.Name)
		}
	}
	if d := Diff(before.Plan, after.Plan); len(d) != 1 || d[0].What != "pull (mesh module pull) changed" {
		t.Fatalf("diff %v", d)
	}
	// A module that runs nowhere, or is not known: refused.
	if err := s.Apply(idx+2, encodeAt(&ModuleAddRequest{Modules: []ModuleSpec{spec("lone.yaml", "module: lone\n")}}, t0)); err != nil {
		t.Fatal(err)
	}
	next := idx + 2
	for req, want := range map[*ModulePullRequest]string{{Module: "lone"}: "assigned to no node", {Module: "nosuch"}: "not in the catalogue"} {
		next++
		if err := s.Apply(next, encodeAt(req, t0)); err == nil || !strings.Contains(err.Error(), want) {
			t.Fatalf("%s: %v", req.Module, err)
		}
	}
}
