package state

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"testing"

	"mesh/state/manifest"
)

// A node composed with the checks kept from its compositions before gives
// what a composition that keeps nothing gives, error included, over
// random changes of its modules (some of which clash by name, route, host
// or nested mount), their manifests parsed again, stopped modules, the
// node's domains and a provider's consumers.
func TestKeptChecksAreAFullComposition(t *testing.T) {
	srcs := map[string]string{
		"a": `module: a
routes:
  - {name: a, port: 80}
resources:
  - directory: /srv/m/a
  - container: a.c
    image: localhost/busybox:1
    mounts: ["/srv/m/a:/a"]
`,
		"inner": `module: inner
resources:
  - file: /srv/m/a/f
    content: x
  - container: inner.c
    image: localhost/busybox:1
    mounts: ["/srv/m/a/f:/f:ro"]
`,
		"samedir": `module: samedir
resources:
  - directory: /srv/m/a
`,
		"route": `module: route
routes:
  - {name: a, port: 81}
resources:
  - directory: /srv/m/route
`,
		"host1": `module: host1
routes:
  - {name: h1, port: 80, hosts: [x.example.org]}
resources:
  - directory: /srv/m/h1
`,
		"host2": `module: host2
routes:
  - {name: h2, port: 80, hosts: [x.example.org, h2.example.org]}
resources:
  - directory: /srv/m/h2
`,
		"root": `module: root
resources:
  - directory: /srv/m
    take-over: true
  - container: root.c
    image: localhost/busybox:1
    mounts: ["/srv/m:/s"]
`,
		"g": `module: g
routes:
  - {name: g, port: 80, hosts: [g.example.org]}
resources:
  - directory: /srv/m/g
  - step: s
    image: localhost/busybox:1
    mounts: ["/srv/m/g:/g"]
  - container: g.c
    image: localhost/busybox:1
    mounts: ["/srv/m/g:/g:ro"]
`,
		"gs": `module: gs
resources:
  - container: g.s
    image: localhost/busybox:1
`,
		"db": `module: db
accepts-credentials: /srv/m/db/creds
resources:
  - directory: /srv/m/db
  - directory: /srv/m/db/creds
`,
		"user": `module: user
resources:
  - directory: /srv/m/user
  - credential: /srv/m/user/db.pw
    provider: db
`,
		"clashcred": `module: clashcred
resources:
  - file: /srv/m/db/creds/user.credential
    content: x
`,
	}
	names := make([]string, 0, len(srcs))
	for n := range srcs {
		names = append(names, n)
	}
	slices.Sort(names)
	in := Input{Domain: "internal", Nodes: []Node{{Name: "ace", Address: "10.0.0.1"}, {Name: "bee", Address: "10.0.0.2"}},
		Modules: map[string]*manifest.Manifest{}, Credentials: map[Pair]string{{Consumer: "user", Provider: "db"}: "d1"}, Stopped: map[HeldKey]string{}}
	for _, n := range names {
		in.Modules[n] = mustManifest(t, srcs[n])
	}
	rng := rand.New(rand.NewPCG(7, 33))
	checks := map[string]*nodeChecks{}
	only := map[string]bool{"ace": true}
	composed, failed := 0, 0
	for step := range 3000 {
		switch r := rng.IntN(20); {
		case r < 12: // one module more or less on ace
			m := names[rng.IntN(len(names))]
			i := slices.IndexFunc(in.Assignments, func(a Assignment) bool { return a.Node == "ace" && a.Module == m })
			if i >= 0 {
				in.Assignments = slices.Delete(in.Assignments, i, i+1)
			} else {
				in.Assignments = append(in.Assignments, Assignment{Node: "ace", Module: m, Seq: uint64(step)})
			}
		case r < 14: // the user runs elsewhere, or not (db's delivered credential)
			if i := slices.IndexFunc(in.Assignments, func(a Assignment) bool { return a.Node == "bee" }); i >= 0 {
				in.Assignments = slices.Delete(in.Assignments, i, i+1)
			} else {
				in.Assignments = append(in.Assignments, Assignment{Node: "bee", Module: "user", Seq: uint64(step)})
			}
		case r < 16: // a manifest parsed again: another pointer, the same module
			m := names[rng.IntN(len(names))]
			in.Modules[m] = mustManifest(t, srcs[m])
		case r < 18: // stopped or not
			k := HeldKey{Node: "ace", Module: names[rng.IntN(len(names))]}
			if _, ok := in.Stopped[k]; ok {
				delete(in.Stopped, k)
			} else {
				in.Stopped[k] = MoveCopy
			}
		default: // the node's domains
			in.Nodes[0].PublicDomain = []string{"", "example.org", "x.example.org"}[rng.IntN(3)]
		}
		want := ComposeNodes(in, only)
		got := composeKept(in, only, checks)
		if got.Errors["ace"] != want.Errors["ace"] {
			t.Fatalf("step %d: error %q, a composition keeping nothing says %q", step, got.Errors["ace"], want.Errors["ace"])
		}
		if e := want.Errors["ace"]; e != "" {
			failed++
			if checks["ace"] != nil {
				t.Fatalf("step %d: a node that does not compose keeps its checks", step)
			}
			continue
		}
		composed++
		if g, w := got.Plans["ace"].Digest(), want.Plans["ace"].Digest(); g != w {
			t.Fatalf("step %d: plan %s, a composition keeping nothing gives %s", step, g[:12], w[:12])
		}
		if !slices.Equal(got.Roster, want.Roster) {
			t.Fatalf("step %d: roster %v, want %v", step, got.Roster, want.Roster)
		}
		// What is kept is what a composition that kept nothing keeps.
		fresh := map[string]*nodeChecks{}
		composeKept(in, only, fresh)
		if err := sameChecks(checks["ace"], fresh["ace"]); err != nil {
			t.Fatalf("step %d: %v", step, err)
		}
	}
	if composed < 300 || failed < 300 {
		t.Fatalf("%d compositions and %d errors: the sequence does not exercise both", composed, failed)
	}
}

// sameChecks says how two nodes' checks differ (the mounts in any order).
func sameChecks(a, b *nodeChecks) error {
	if a.domains != b.domains || len(a.mods) != len(b.mods) || len(a.owner) != len(b.owner) || len(a.routes) != len(b.routes) || len(a.hosts) != len(b.hosts) || len(a.mounts) != len(b.mounts) {
		return fmt.Errorf("kept checks of %d modules, %d names, %d routes, %d hosts, %d mounts; made afresh %d, %d, %d, %d, %d",
			len(a.mods), len(a.owner), len(a.routes), len(a.hosts), len(a.mounts), len(b.mods), len(b.owner), len(b.routes), len(b.hosts), len(b.mounts))
	}
	for k, v := range b.owner {
		if a.owner[k] != v {
			return fmt.Errorf("name %s: kept %q, afresh %q", k, a.owner[k], v)
		}
	}
	for k, v := range b.routes {
		if a.routes[k] != v {
			return fmt.Errorf("route %s: kept %q, afresh %q", k, a.routes[k], v)
		}
	}
	for k, v := range b.hosts {
		if a.hosts[k] != v {
			return fmt.Errorf("host %s: kept %v, afresh %v", k, a.hosts[k], v)
		}
	}
	for m, c := range b.mods {
		if k, ok := a.mods[m]; !ok || k.m != c.m || k.stopped != c.stopped {
			return fmt.Errorf("module %s: kept %v, afresh %v", m, ok, c.stopped)
		}
	}
	if !slices.Equal(a.mounts, b.mounts) {
		return fmt.Errorf("mounts kept %v, afresh %v", a.mounts, b.mounts)
	}
	return nil
}
