package state

import (
	"context"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"reflect"
	"slices"
	"testing"
	"unsafe"

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
		case "Decl", "Typed", "src", "via":
			continue // named by src or via (and those compared: below)
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
	// A delivered credential (no src): the same as another only with the
	// same directory's declaration via.
	dir := &manifest.Resource{Directory: "/srv/pg/creds"}
	d1 := Resource{Module: "pg", Kind: KindDeliveredCredential, Name: "/srv/pg/creds/app.credential", Credential: &Pair{Consumer: "app", Provider: "pg"}, Digest: "d", via: dir}
	d2 := d1
	if !sameResource(&d1, &d2) {
		t.Error("a delivered credential is not the same as itself")
	}
	d2.via = &manifest.Resource{Directory: "/srv/pg/creds"}
	if sameResource(&d1, &d2) {
		t.Error("sameResource does not compare via")
	}
	d2.via = nil
	if sameResource(&d2, &d2) {
		t.Error("a resource without a src or a via is the same as another")
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
		// planBody is given the plans as the FSM composes them: their
		// declarations named, not copied (Input.named).
		named := in
		named.named = true
		nout := Compose(named)
		for n, p := range out.Plans {
			want, _ := json.Marshal(p)
			text, d := s.planBody(nout.Plans[n])
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
			// What is kept is this plan's resources, in its order, no more.
			kept, srcs := s.encoded[n], 0
			for i, r := range p.Resources {
				if r.src == nil {
					continue
				}
				srcs++
				if k := kept.order[i]; k == nil || k.src != r.src || k.at != i || kept.of[r.src] != k {
					t.Fatalf("%s: %s's kept resource %d is not the plan's", step, n, i)
				}
			}
			if len(kept.of) != srcs || len(kept.order) != len(p.Resources) {
				t.Fatalf("%s: %s keeps %d resources (%d in order), its plan has %d of %d", step, n, len(kept.of), len(kept.order), srcs, len(p.Resources))
			}
			packed := text.pack()
			if back, err := unpackPlan(packed); err != nil || string(back) != string(want) {
				t.Fatalf("%s: %s's packed text inflates to %q (%v)", step, n, back, err)
			}
			fresh, _ := (&Store{}).planBody(p)
			if string(packed) != string(fresh.pack()) {
				t.Fatalf("%s: %s's text packed with what was kept is not its text packed by a store that kept nothing", step, n)
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

// A plan's stored bytes are a function of its text alone: each replica
// stores the same bytes for the same plan, whatever it kept of the plans
// before (a replica that restarted keeps nothing), and the digest is
// Plan.Digest's. Plans of 30 to 90 modules of one to four resources (so
// of many chunks) are edited at random, as commands edit them: a module
// assigned or unassigned anywhere, a resource's content changed, a
// module's manifest parsed again, the routes changed (the tail), the
// resources reordered; after each edit the kept store's body and digest
// are compared with json.Marshal's and Plan.Digest's, and its packed
// bytes with a store's that kept nothing, and inflated.
func TestPackedPlanIsItsTextAlone(t *testing.T) {
	rng := rand.New(rand.NewPCG(7, 33))
	type module struct {
		name string
		decl []*manifest.Resource
	}
	newModule := func(name string) module {
		m := module{name: name}
		for j := range 1 + rng.IntN(4) {
			m.decl = append(m.decl, &manifest.Resource{File: fmt.Sprintf("/srv/%s/f%d", name, j), Content: fmt.Sprintf("line %d of %s\n", rng.IntN(1000), name)})
		}
		return m
	}
	var mods []module
	for i := range 30 + rng.IntN(60) {
		mods = append(mods, newModule(fmt.Sprintf("mod-%03d", i)))
	}
	content := map[*manifest.Resource]string{}
	routes := []Route(nil)
	plan := func() *Plan {
		p := &Plan{Node: "ace", Routes: routes, PublishAddress: "10.0.0.1"}
		for _, m := range mods {
			for _, d := range m.decl {
				r := Resource{Module: m.name, Kind: manifest.KindFile, Name: d.File, Decl: *d, Typed: d.Typed, Content: d.Content, src: d}
				if c, ok := content[d]; ok {
					r.Content = c
				}
				p.Resources = append(p.Resources, r)
			}
		}
		return p
	}
	kept := &Store{}
	reusedSeen, prefixSeen, mostChunks := 0, 0, 0
	var last *planText
	for step := range 600 {
		switch op := rng.IntN(9); op {
		case 0, 7, 8: // an assign
			at := rng.IntN(len(mods) + 1)
			mods = slices.Insert(mods, at, newModule(fmt.Sprintf("new-%d", step)))
		case 1: // an unassign
			if len(mods) > 1 {
				at := rng.IntN(len(mods))
				mods = slices.Delete(mods, at, at+1)
			}
		case 2: // new content (a binding moved, a routes file)
			m := mods[rng.IntN(len(mods))]
			content[m.decl[rng.IntN(len(m.decl))]] = fmt.Sprintf("moved at %d", step)
		case 3: // a manifest parsed again: same text, new declarations
			i := rng.IntN(len(mods))
			m := module{name: mods[i].name}
			for _, d := range mods[i].decl {
				c := *d
				m.decl = append(m.decl, &c)
			}
			mods[i] = m
		case 4: // the routes (the tail): one more anywhere, one fewer,
			// one changed in place, or several more in a row
			if len(routes) > 0 && rng.IntN(3) == 0 {
				at := rng.IntN(len(routes))
				routes = slices.Delete(slices.Clone(routes), at, at+1)
				break
			}
			if len(routes) > 0 && rng.IntN(3) == 0 {
				routes = slices.Clone(routes)
				routes[rng.IntN(len(routes))].Port++
				break
			}
			more := []Route{}
			for range 1 + rng.IntN(2)*rng.IntN(12) {
				more = append(more, Route{Name: fmt.Sprintf("r%d-%d.example.org", step, len(more)), Module: mods[rng.IntN(len(mods))].name, Port: 80 + rng.IntN(3)})
			}
			routes = slices.Insert(slices.Clone(routes), rng.IntN(len(routes)+1), more...)
		case 5: // nothing changed
		case 6: // a batch unassign of one chunk's modules, so that the
			// chunks after it are the same at other places
			if last == nil || len(last.chunks) < 4 {
				break
			}
			c := last.chunks[1+rng.IntN(len(last.chunks)-3)]
			next := last.chunks[slices.Index(last.chunks, c)+1].key
			from := slices.IndexFunc(mods, func(m module) bool { return m.name == c.key })
			to := slices.IndexFunc(mods, func(m module) bool { return m.name == next })
			if from >= 0 && to > from {
				mods = slices.Delete(mods, from, to)
			}
		}
		p := plan()
		want, _ := json.Marshal(p)
		text, d := kept.planBody(p)
		if got := text.bytes(); string(got) != string(want) {
			t.Fatalf("step %d: body\n got %s\nwant %s", step, got, want)
		}
		if d != p.Digest() {
			t.Fatalf("step %d: digest %s, Plan.Digest %s", step, d, p.Digest())
		}
		for _, c := range text.chunks {
			if c.packed != nil {
				reusedSeen++
			}
		}
		if text.hashedFrom > 0 {
			prefixSeen++
		}
		mostChunks = max(mostChunks, len(text.chunks))
		last = text
		packed := text.pack()
		fresh, fd := (&Store{}).planBody(p)
		if fd != d {
			t.Fatalf("step %d: a store that kept nothing gives digest %s, not %s", step, fd, d)
		}
		if string(packed) != string(fresh.pack()) {
			t.Fatalf("step %d: the bytes stored depend on what the store kept", step)
		}
		back, err := unpackPlan(packed)
		if err != nil || string(back) != string(want) {
			t.Fatalf("step %d: the stored bytes inflate to %.80q (%v)", step, back, err)
		}
	}
	if reusedSeen == 0 || prefixSeen == 0 || mostChunks < 5 {
		t.Fatalf("the edits reused %d chunks' streams and hashed %d plans from a kept state, in plans of up to %d chunks: this tests nothing", reusedSeen, prefixSeen, mostChunks)
	}
	t.Logf("%d chunks' streams reused, %d plans hashed from a kept state, up to %d chunks a plan", reusedSeen, prefixSeen, mostChunks)
}

// clearNamed leaves zero a resource composed with its declaration named
// (Decl and Typed never written), whatever other field it set: a field
// added to Resource and not cleared would keep what it points at alive
// in a released array, and be taken by the next composition's resource.
func TestClearNamedClearsAll(t *testing.T) {
	rt := reflect.TypeOf(Resource{})
	for i := range rt.NumField() {
		f := rt.Field(i)
		if f.Name == "Decl" || f.Name == "Typed" {
			continue
		}
		var r Resource
		v := reflect.ValueOf(&r).Elem().Field(i)
		v = reflect.NewAt(f.Type, unsafe.Pointer(v.UnsafeAddr())).Elem() // settable, even unexported
		switch v.Kind() {
		case reflect.String:
			v.SetString("x")
		case reflect.Uint64:
			v.SetUint(1)
		case reflect.Pointer:
			v.Set(reflect.New(f.Type.Elem()))
		case reflect.Map:
			v.Set(reflect.MakeMap(f.Type))
		default:
			t.Fatalf("Resource.%s is a %s: teach this test to set it", f.Name, v.Kind())
		}
		r.clearNamed()
		if !reflect.ValueOf(r).IsZero() {
			t.Errorf("clearNamed leaves Resource.%s set", f.Name)
		}
	}
}
