package state

import (
	"context"
	"encoding/json"
	"reflect"
	"testing"

	"mesh/state/manifest"
)

// sameResource must compare every field of Resource but the two its src
// names (Decl and Typed): a field added to Resource and not compared would
// let planBody copy an encoding that no longer says what the resource is.
func TestSameResourceComparesEveryField(t *testing.T) {
	src := &manifest.Resource{Directory: "/srv/x"}
	base := Resource{Module: "m", Kind: "directory", Name: "/srv/x", Decl: *src, Typed: src.Typed, src: src,
		Credential: &Pair{Consumer: "a", Provider: "b"}, Secrets: map[string]string{"k": "d"}}
	if !sameResource(&base, &base) {
		t.Fatal("a resource is not the same as itself")
	}
	rt := reflect.TypeOf(base)
	for i := range rt.NumField() {
		f := rt.Field(i)
		switch f.Name {
		case "Decl", "Typed", "src":
			continue // named by src (and src compared: below)
		}
		other := base
		other.Secrets = map[string]string{"k": "d"}
		other.Credential = &Pair{Consumer: "a", Provider: "b"}
		if !sameResource(&base, &other) {
			t.Fatalf("copies with equal maps and pointers differ")
		}
		v := reflect.ValueOf(&other).Elem().Field(i)
		switch v.Kind() {
		case reflect.String:
			v.SetString(v.String() + "'")
		case reflect.Uint64:
			v.SetUint(v.Uint() + 1)
		case reflect.Pointer:
			other.Credential = &Pair{Consumer: "a", Provider: "c"}
		case reflect.Map:
			other.Secrets = map[string]string{"k": "e"}
		default:
			t.Fatalf("Resource.%s is a %s: teach sameResource and this test to compare it", f.Name, v.Kind())
		}
		if sameResource(&base, &other) {
			t.Errorf("sameResource does not compare Resource.%s", f.Name)
		}
	}
	other := base
	other.src = &manifest.Resource{Directory: "/srv/x"}
	if sameResource(&base, &other) {
		t.Error("sameResource does not compare src")
	}
	made := base
	made.src = nil
	if sameResource(&made, &made) {
		t.Error("a resource without a src is the same as another")
	}
}

// planBody gives json.Marshal's bytes and Plan.Digest's digest for each
// node's plan, however the plans change between compositions: the same
// manifests, new pulls, restarts, secrets, credentials, public domains,
// modules assigned and unassigned, and a manifest replaced.
func TestPlanBodyIsMarshal(t *testing.T) {
	s := &Store{}
	in := baseInput(t)
	in.Assignments = []Assignment{{Node: "ace", Module: "postgres", Seq: 1}, {Node: "ace", Module: "app", Seq: 2}, {Node: "novox", Module: "web", Seq: 3}, {Node: "novox", Module: "proxy", Seq: 4}}
	check := func(step string) {
		t.Helper()
		out := Compose(in)
		if len(out.Plans) == 0 {
			t.Fatalf("%s: no plan composes: %v", step, out.Errors)
		}
		for n, p := range out.Plans {
			want, _ := json.Marshal(p)
			text, d := s.planBody(p)
			got := text.bytes()
			if string(got) != string(want) {
				t.Fatalf("%s: %s's body\n got %s\nwant %s", step, n, got, want)
			}
			if d != p.Digest() {
				t.Fatalf("%s: %s's digest %s, Plan.Digest %s", step, n, d, p.Digest())
			}
			if text.size != len(want) {
				t.Fatalf("%s: %s's text says it is %d bytes, not %d", step, n, text.size, len(want))
			}
			packed := text.pack()
			if back, err := unpackPlan(packed); err != nil || string(back) != string(want) {
				t.Fatalf("%s: %s's packed text inflates to %q (%v)", step, n, back, err)
			}
			if string(packed) != string(packPlan(want)) {
				t.Fatalf("%s: %s's text packed in pieces is not the body packed whole", step, n)
			}
		}
	}
	check("first")
	check("again")
	in.Pulls = map[string]uint64{"web": 7}
	check("a pull")
	in.Restarts = map[RestartKey]uint64{{Module: "postgres", Container: "postgres.server"}: 9}
	check("a restart")
	in.Credentials[Pair{Consumer: "app", Provider: "postgres"}] = "d2"
	check("a new credential")
	in.Nodes[1].PublicDomain = "example.org"
	check("a public domain")
	in.Assignments = append(in.Assignments, Assignment{Node: "ace", Module: "web", Seq: 5})
	check("an assign")
	in.Assignments = in.Assignments[1:]
	check("an unassign")
	in.Modules["web"] = mustManifest(t, webSrc)
	check("a manifest parsed again")
}

// Composition reads the nodes through readComposeNodes, which must give
// readNodes's Node of every node, each field of Node set.
func TestComposeNodesReadAsNodes(t *testing.T) {
	s := openStore(t)
	var idx uint64
	mustApply(t, s, &idx, &InitRequest{MeshID: "m-1", Domain: "internal", Node: Node{Name: "ace", Address: "10.0.0.1", Voter: true}})
	mustApply(t, s, &idx, &NodeAddRequest{Node: Node{Name: "bee", Address: "10.0.0.2"}})
	if _, err := s.db.Exec(`UPDATE nodes SET voter = 1, public_domain = 'a.example.org b.example.org', port = 7000, seal_key = 'sk', overlay_key = 'ok', overlay_endpoint = '1.2.3.4:51820',
		overlay_address = '10.99.0.1', acme_directory = 'https://acme.example/dir', acme_email = 'ops@example.org', acme_ca_root = 'root' WHERE name = 'bee'`); err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	full, err := readNodes(ctx, s.db)
	if err != nil {
		t.Fatal(err)
	}
	got, err := readComposeNodes(ctx, s.db)
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != len(full) {
		t.Fatalf("%d nodes, readNodes reads %d", len(got), len(full))
	}
	for i := range full {
		if !reflect.DeepEqual(got[i], full[i].Node) {
			t.Errorf("node %d: %+v, readNodes reads %+v", i, got[i], full[i].Node)
		}
	}
	bee := reflect.ValueOf(got[1])
	for i := range bee.NumField() {
		if bee.Field(i).IsZero() {
			t.Errorf("Node.%s is not set in this test: set it in the UPDATE above (and read it in readComposeNodes)", bee.Type().Field(i).Name)
		}
	}
}
