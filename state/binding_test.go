package state

import (
	"context"
	"slices"
	"strings"
	"testing"

	"mesh/state/manifest"
)

func boundNode(t *testing.T, in Input, node string) string {
	t.Helper()
	out := Compose(in)
	if e := out.Errors[node]; e != "" {
		t.Fatal(e)
	}
	for _, r := range out.Plans[node].Resources {
		if r.Kind == "binding" {
			for _, l := range strings.Split(r.Content, "\n") {
				if n, ok := strings.CutPrefix(l, "node="); ok {
					return n
				}
			}
		}
	}
	t.Fatal("no binding in the plan of " + node)
	return ""
}

// Issue 8 item 8: a binding prefers the consumer's own node, else the
// instance assigned earliest; adding an instance never moves an existing
// consumer; removing the bound instance does.
func TestBindingChoice(t *testing.T) {
	in := baseInput(t)
	in.Nodes = append(in.Nodes, Node{Name: "aaa", Address: "10.0.0.9"})
	// The provider on novox first, the consumer on ace.
	in.Assignments = []Assignment{{Node: "novox", Module: "postgres", Seq: 5}, {Node: "ace", Module: "app", Seq: 6}}
	if got := boundNode(t, in, "ace"); got != "novox" {
		t.Fatalf("first binding: %s", got)
	}
	// A second instance on a node that sorts first: the consumer stays.
	in.Assignments = append(in.Assignments, Assignment{Node: "aaa", Module: "postgres", Seq: 7})
	in.Bound = Compose(Input{}).Bound // nothing remembered: earliest wins
	if got := boundNode(t, in, "ace"); got != "novox" {
		t.Fatalf("with no memory, the earliest instance must win over the first by name: %s", got)
	}
	in.Bound = map[BindKey]string{{Node: "ace", Module: "app", Path: "/srv/app/db.binding"}: "novox"}
	// Even an instance on the consumer's own node does not move a bound consumer.
	in.Assignments = append(in.Assignments, Assignment{Node: "ace", Module: "postgres", Seq: 8})
	if got := boundNode(t, in, "ace"); got != "novox" {
		t.Fatalf("adding an instance moved the consumer to %s", got)
	}
	// A new consumer (nothing remembered) prefers its own node.
	in.Bound = nil
	if got := boundNode(t, in, "ace"); got != "ace" {
		t.Fatalf("a new consumer did not prefer its own node: %s", got)
	}
	// Removing the bound instance moves it: to its own node when there is one.
	in.Bound = map[BindKey]string{{Node: "ace", Module: "app", Path: "/srv/app/db.binding"}: "novox"}
	in.Assignments = []Assignment{{Node: "ace", Module: "app", Seq: 6}, {Node: "aaa", Module: "postgres", Seq: 7}, {Node: "ace", Module: "postgres", Seq: 8}}
	if got := boundNode(t, in, "ace"); got != "ace" {
		t.Fatalf("after the bound instance went: %s", got)
	}
	// ... else to the earliest remaining.
	in.Assignments = []Assignment{{Node: "ace", Module: "app", Seq: 6}, {Node: "novox", Module: "postgres", Seq: 9}, {Node: "aaa", Module: "postgres", Seq: 7}}
	in.Bound = map[BindKey]string{{Node: "ace", Module: "app", Path: "/srv/app/db.binding"}: "gone"}
	if got := boundNode(t, in, "ace"); got != "aaa" {
		t.Fatalf("fallback: %s", got)
	}
}

// The FSM remembers bindings across commands: assigning a second instance
// through the store does not move the consumer.
func TestStoreKeepsBindings(t *testing.T) {
	s := openStore(t)
	cmds := []Request{
		&InitRequest{MeshID: "m-1", Domain: "internal", Node: Node{Name: "ace", Address: "10.0.0.1"}},
		&NodeAddRequest{Node: Node{Name: "novox", Address: "10.0.0.2", Voter: true}},
		&ModuleAddRequest{Modules: []ModuleSpec{spec("pg.yaml", pgSrc), spec("app.yaml", appSrc)}, Secrets: []Secret{{Pair: Pair{"app", "postgres"}, Value: "s"}}},
		&AssignRequest{Assignment: Assignment{Node: "novox", Module: "postgres"}},
		&AssignRequest{Assignment: Assignment{Node: "ace", Module: "app"}},
	}
	idx := uint64(0)
	run := func(rs ...Request) {
		for _, r := range rs {
			idx++
			if err := s.Apply(idx, encodeAt(r, t0)); err != nil {
				t.Fatalf("%s: %v", r.Op(), err)
			}
		}
	}
	planOf := func() string {
		v, err := s.Plan(context.Background(), "ace")
		if err != nil {
			t.Fatal(err)
		}
		return jsonString(v.Plan)
	}
	run(cmds...)
	before := planOf()
	run(&AssignRequest{Assignment: Assignment{Node: "ace", Module: "postgres"}})
	after := planOf()
	if !strings.Contains(before, `node=novox`) || !strings.Contains(after, `node=novox`) {
		t.Fatalf("binding moved:\n%s\n->\n%s", before, after)
	}
	run(&UnassignRequest{Assignment: Assignment{Node: "novox", Module: "postgres"}})
	if p := planOf(); !strings.Contains(p, `node=ace`) {
		t.Fatalf("removing the bound instance did not move it:\n%s", p)
	}
}

// Providers come first on a node, whatever their names.
func TestProvidersFirst(t *testing.T) {
	in := baseInput(t)
	in.Assignments = []Assignment{{Node: "ace", Module: "app"}, {Node: "ace", Module: "postgres"}}
	out := Compose(in)
	p := out.Plans["ace"]
	if p.Resources[0].Module != "postgres" {
		t.Fatalf("order: %v", resourceNames(p))
	}
	// Modules that take nothing from another keep their order by name
	// (the order without the visit), whichever module is a provider.
	cat := map[string]*manifest.Manifest{"a": mustManifest(t, "module: a\nresources: []\n"), "b": in.Modules["postgres"], "c": mustManifest(t, "module: c\nresources: []\n")}
	if got := providersFirst([]string{"a", "b", "c"}, cat); !slices.Equal(got, []string{"a", "b", "c"}) {
		t.Fatalf("no module takes from another: %v", got)
	}
	cat["a"] = in.Modules["app"] // app binds to postgres, which here is b's manifest's name: not on the node
	if got := providersFirst([]string{"a", "b", "c"}, cat); !slices.Equal(got, []string{"a", "b", "c"}) {
		t.Fatalf("a provider not on the node: %v", got)
	}
	if got := providersFirst([]string{"app", "postgres"}, in.Modules); !slices.Equal(got, []string{"postgres", "app"}) {
		t.Fatalf("a provider on the node: %v", got)
	}
}

// Nested writable mounts across modules on one node do not compose.
func TestNestedMountsAcrossModules(t *testing.T) {
	in := baseInput(t)
	in.Modules["inner"] = mustManifest(t, `module: inner
resources:
  - directory: /srv/web/inner
  - container: inner.c
    image: localhost/busybox:1
    mounts: ["/srv/web/inner:/x"]
`)
	in.Assignments = []Assignment{{Node: "ace", Module: "web"}, {Node: "ace", Module: "inner"}}
	out := Compose(in)
	if e := out.Errors["ace"]; !strings.Contains(e, `inside "/srv/web", which web.server mounts writable`) {
		t.Fatalf("error %q", e)
	}
}
