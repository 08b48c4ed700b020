package state

import (
	"fmt"
	"reflect"
	"strings"
	"testing"

	"mesh/state/manifest"
)

func mustManifest(t testing.TB, src string) *manifest.Manifest {
	t.Helper()
	m, err := manifest.Parse("test.yaml", []byte(src))
	if err != nil {
		t.Fatal(err)
	}
	return m
}

const (
	webSrc = `module: web
routes:
  - {name: www, port: 8080}
resources:
  - directory: /srv/web
  - container: web.server
    image: localhost/busybox:1
    mounts: ["/srv/web:/www"]
`
	pgSrc = `module: postgres
accepts-credentials: /srv/pg/creds
resources:
  - directory: /srv/pg
  - directory: /srv/pg/creds
    owner: "999:999"
    mode: "0700"
`
	appSrc = `module: app
resources:
  - directory: /srv/app
  - binding: /srv/app/db.binding
    provider: postgres
  - credential: /srv/app/db.password
    provider: postgres
  - step: migrate
    image: localhost/busybox:1
    restart-on: [/srv/app/db.binding]
`
	proxySrc = `module: proxy
resources:
  - directory: /srv/proxy
  - routes-file: /srv/proxy/routes.json
`
	// clash declares the same path as web.
	clashSrc = `module: clash
resources:
  - directory: /srv/web
`
)

func baseInput(t testing.TB) Input {
	return Input{
		Domain: "internal",
		Nodes: []Node{
			{Name: "ace", Address: "10.0.0.1"},
			{Name: "novox", Address: "10.0.0.2", PublicDomain: "zurag.be"},
		},
		Modules: map[string]*manifest.Manifest{
			"web":      mustManifest(t, webSrc),
			"postgres": mustManifest(t, pgSrc),
			"app":      mustManifest(t, appSrc),
			"proxy":    mustManifest(t, proxySrc),
			"clash":    mustManifest(t, clashSrc),
		},
		Credentials: map[Pair]string{{Consumer: "app", Provider: "postgres"}: "d1"},
	}
}

func names(r []Name) []string {
	var s []string
	for _, n := range r {
		s = append(s, n.Name+"="+n.Address)
	}
	return s
}

func resourceNames(p *Plan) []string {
	if p == nil {
		return nil
	}
	var s []string
	for _, r := range p.Resources {
		s = append(s, r.Kind+":"+r.Name)
	}
	return s
}

func TestCompose(t *testing.T) {
	for _, tc := range []struct {
		name    string
		assign  []Assignment
		edit    func(*Input)
		roster  []string
		plans   map[string][]string
		errs    map[string]string // substring of the error per failing node
		content map[string]string // "node:path" -> resolved content substring
	}{
		{
			name:   "no assignments: node names only",
			roster: []string{"ace.internal=10.0.0.1", "novox.internal=10.0.0.2"},
			plans:  map[string][]string{"ace": nil, "novox": nil},
		},
		{
			name:   "assign",
			assign: []Assignment{{Node: "ace", Module: "web"}},
			roster: []string{"ace.internal=10.0.0.1", "novox.internal=10.0.0.2", "web.internal=10.0.0.1"},
			plans:  map[string][]string{"ace": {"directory:/srv/web", "container:web.server"}, "novox": nil},
		},
		{
			name:   "public domain gives routed names",
			assign: []Assignment{{Node: "novox", Module: "web"}},
			roster: []string{"ace.internal=10.0.0.1", "novox.internal=10.0.0.2", "web.internal=10.0.0.2", "www.zurag.be=10.0.0.2"},
		},
		{
			name:   "module on two nodes",
			assign: []Assignment{{Node: "ace", Module: "web"}, {Node: "novox", Module: "web"}},
			roster: []string{"ace.internal=10.0.0.1", "novox.internal=10.0.0.2", "web.internal=10.0.0.1", "web.internal=10.0.0.2", "www.zurag.be=10.0.0.2"},
		},
		{
			name:   "binding resolves provider on another node, credential delivered to provider",
			assign: []Assignment{{Node: "ace", Module: "app"}, {Node: "novox", Module: "postgres"}},
			plans: map[string][]string{
				"ace":   {"directory:/srv/app", "binding:/srv/app/db.binding", "credential:/srv/app/db.password", "step:migrate"},
				"novox": {"directory:/srv/pg", "directory:/srv/pg/creds", "delivered-credential:/srv/pg/creds/app.credential"},
			},
			content: map[string]string{"ace:/srv/app/db.binding": "provider=postgres\nname=postgres.internal\nnode=novox\naddress=10.0.0.2\n"},
		},
		{
			name:    "binding to a provider that moves",
			assign:  []Assignment{{Node: "ace", Module: "app"}, {Node: "ace", Module: "postgres"}},
			content: map[string]string{"ace:/srv/app/db.binding": "node=ace\naddress=10.0.0.1\n"},
		},
		{
			name:    "binding prefers the provider on the consumer's own node",
			assign:  []Assignment{{Node: "novox", Module: "app"}, {Node: "ace", Module: "postgres"}, {Node: "novox", Module: "postgres"}},
			content: map[string]string{"novox:/srv/app/db.binding": "node=novox\n"},
		},
		{
			name:   "binding to an unassigned provider does not compose",
			assign: []Assignment{{Node: "ace", Module: "app"}},
			errs:   map[string]string{"ace": `provider "postgres" is not assigned to any node`},
			roster: []string{"novox.internal=10.0.0.2"},
		},
		{
			name:   "two modules declaring one path on a node do not compose",
			assign: []Assignment{{Node: "ace", Module: "web"}, {Node: "ace", Module: "clash"}, {Node: "novox", Module: "web"}},
			errs:   map[string]string{"ace": `"/srv/web" is declared by both`},
			roster: []string{"novox.internal=10.0.0.2", "web.internal=10.0.0.2", "www.zurag.be=10.0.0.2"},
		},
		{
			name:   "missing provider in catalogue",
			assign: []Assignment{{Node: "ace", Module: "app"}, {Node: "novox", Module: "postgres"}},
			edit: func(in *Input) {
				delete(in.Modules, "postgres")
			},
			errs: map[string]string{"ace": `provider "postgres" is not in the catalogue`, "novox": `module "postgres" is assigned but not in the catalogue`},
		},
		{
			name:    "routes file holds the node's routing table",
			assign:  []Assignment{{Node: "novox", Module: "web"}, {Node: "novox", Module: "proxy"}},
			content: map[string]string{"novox:/srv/proxy/routes.json": `"name": "www.zurag.be",` + "\n    \"module\": \"web\",\n    \"port\": 8080"},
		},
		{
			name:   "a routes-file template writes the table in the proxy's format",
			assign: []Assignment{{Node: "novox", Module: "web"}, {Node: "novox", Module: "proxy"}},
			edit: func(in *Input) {
				in.Modules["proxy"] = mustManifest(t, proxySrc+"  - routes-file: /srv/proxy/Caddyfile\n    template: \"{{range .Routes}}http://{{.Name}} { reverse_proxy {{$.Address}}:{{.Port}} } # {{.Module}} on {{$.Node}}, {{$.Domain}}/{{$.MeshDomain}}\\n{{end}}\"\n")
			},
			content: map[string]string{"novox:/srv/proxy/Caddyfile": "http://www.zurag.be { reverse_proxy 10.0.0.2:8080 } # web on novox, zurag.be/internal\n"},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			in := baseInput(t)
			in.Assignments = tc.assign
			if tc.edit != nil {
				tc.edit(&in)
			}
			out := Compose(in)
			if tc.roster != nil && !reflect.DeepEqual(names(out.Roster), tc.roster) {
				t.Errorf("roster\n got %v\nwant %v", names(out.Roster), tc.roster)
			}
			for node, want := range tc.plans {
				if got := resourceNames(out.Plans[node]); !reflect.DeepEqual(got, want) {
					t.Errorf("plan %s\n got %v\nwant %v", node, got, want)
				}
			}
			if len(out.Errors) != len(tc.errs) {
				t.Errorf("errors %v, want %v", out.Errors, tc.errs)
			}
			for node, want := range tc.errs {
				if !strings.Contains(out.Errors[node], want) {
					t.Errorf("error of %s: %q lacks %q", node, out.Errors[node], want)
				}
				if out.Plans[node] != nil {
					t.Errorf("failing node %s has a plan", node)
				}
			}
			for k, want := range tc.content {
				node, path, _ := strings.Cut(k, ":")
				var got string
				for _, r := range out.Plans[node].Resources {
					if r.Name == path {
						got = r.Content
					}
				}
				if !strings.Contains(got, want) {
					t.Errorf("%s content %q lacks %q", k, got, want)
				}
			}
		})
	}
}

func TestComposeIsDeterministic(t *testing.T) {
	in := baseInput(t)
	in.Assignments = []Assignment{{Node: "ace", Module: "app"}, {Node: "novox", Module: "postgres"}, {Node: "novox", Module: "web"}, {Node: "ace", Module: "web"}}
	a := Compose(in)
	in.Assignments = []Assignment{{Node: "ace", Module: "web"}, {Node: "novox", Module: "web"}, {Node: "novox", Module: "postgres"}, {Node: "ace", Module: "app"}}
	b := Compose(in)
	if !reflect.DeepEqual(a, b) {
		t.Fatal("assignment order changed the output")
	}
	if a.Plans["ace"].Digest() != b.Plans["ace"].Digest() {
		t.Fatal("digest differs")
	}
}

// A move of an unrelated module does not change a node's plan digest: the
// roster is not part of any plan.
func TestPlanDigestIgnoresRoster(t *testing.T) {
	in := baseInput(t)
	in.Assignments = []Assignment{{Node: "ace", Module: "web"}}
	before := Compose(in).Plans["ace"].Digest()
	in.Assignments = append(in.Assignments, Assignment{Node: "novox", Module: "web"}, Assignment{Node: "novox", Module: "proxy"})
	in.Nodes[1].PublicDomain = "other.org"
	if after := Compose(in).Plans["ace"].Digest(); after != before {
		t.Fatal("ace's plan changed when only novox changed")
	}
}

func TestDiff(t *testing.T) {
	in := baseInput(t)
	in.Assignments = []Assignment{{Node: "ace", Module: "web"}}
	a := Compose(in).Plans["ace"]
	m := mustManifest(t, strings.Replace(webSrc, "localhost/busybox:1", "localhost/busybox:2", 1))
	in.Modules["web"] = m
	in.Assignments = append(in.Assignments, Assignment{Node: "ace", Module: "proxy"})
	b := Compose(in).Plans["ace"]
	var got []string
	for _, c := range Diff(a, b) {
		got = append(got, c.String())
	}
	want := []string{
		"+ directory /srv/proxy (proxy)",
		"+ routes-file /srv/proxy/routes.json (proxy)",
		"~ container web.server (web): image changed",
	}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("diff\n got %q\nwant %q", got, want)
	}
}

// BenchmarkRecompose measures composition of 100 nodes and a catalogue of 50
// modules (49 of them assigned to 4 nodes each) after one more assign.
func BenchmarkRecompose(b *testing.B) {
	defer benchRuns()()
	in := benchInput(b, 100, 50)
	base := len(in.Assignments)
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		in.Assignments = append(in.Assignments[:base], Assignment{Node: fmt.Sprintf("n%03d", i%100), Module: "m049"})
		out := Compose(in)
		if len(out.Plans) != 100 {
			b.Fatalf("%d plans, errors %v", len(out.Plans), out.Errors)
		}
	}
}

// benchModule is a module of the benchmarks: a route, two directories, a
// file, a step and a container that restarts on both.
func benchModule(name string) string {
	return fmt.Sprintf(`module: %[1]s
routes:
  - {name: %[1]s, port: 80}
resources:
  - directory: /srv/%[1]s
  - directory: /srv/%[1]s/data
  - file: /srv/%[1]s/config
    content: "x = 1"
  - step: init
    image: localhost/busybox:1
    mounts: ["/srv/%[1]s/data:/data"]
  - container: %[1]s.server
    image: localhost/busybox:1
    mounts: ["/srv/%[1]s/data:/data", "/srv/%[1]s/config:/etc/config:ro"]
    restart-on: [/srv/%[1]s/config, init]
`, name)
}

func benchInput(b testing.TB, nodes, modules int) Input {
	in := Input{Domain: "internal", Modules: map[string]*manifest.Manifest{}, Credentials: map[Pair]string{}}
	for i := 0; i < nodes; i++ {
		in.Nodes = append(in.Nodes, Node{Name: fmt.Sprintf("n%03d", i), Address: fmt.Sprintf("10.1.%d.%d", i/250, i%250+1), PublicDomain: fmt.Sprintf("n%d.example.org", i)})
	}
	for j := 0; j < modules; j++ {
		name := fmt.Sprintf("m%03d", j)
		src := benchModule(name)
		in.Modules[name] = mustManifest(b, src)
	}
	// The last module is left for the benchmark to assign; the others run on
	// 4 nodes each.
	for j := 0; j < modules-1; j++ {
		for k := 0; k < 4; k++ {
			in.Assignments = append(in.Assignments, Assignment{Node: fmt.Sprintf("n%03d", (j*2+k*25)%nodes), Module: fmt.Sprintf("m%03d", j)})
		}
	}
	return in
}

// Setting a public domain changes only routes; --diff must show them.
func TestDiffShowsRoutes(t *testing.T) {
	in := baseInput(t)
	in.Assignments = []Assignment{{Node: "ace", Module: "web"}}
	a := Compose(in).Plans["ace"]
	in.Nodes[0].PublicDomain = "example.org"
	b := Compose(in).Plans["ace"]
	var got []string
	for _, c := range Diff(a, b) {
		got = append(got, c.String())
	}
	want := []string{"+ route www.example.org -> port 8080 (web)", "- route www -> port 8080 (web)"}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("diff\n got %q\nwant %q", got, want)
	}
}
