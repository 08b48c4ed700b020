package manifest

import (
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"
)

const gitea = `module: gitea
routes:
  - {name: git, port: 3000}
resources:
  - directory: /srv/gitea
    owner: "1000:1000"
    mode: "0750"
  - directory: /srv/gitea/data
    owner: "1000:1000"
    mode: "0750"
  - file: /srv/gitea/app.ini
    mode: "0640"
    content: |
      [server]
      DOMAIN = git.example.org
  - binding: /srv/gitea/db.binding
    provider: postgres
  - credential: /srv/gitea/db.password
    provider: postgres
  - step: migrate
    image: docker.io/gitea/gitea:1.22
    command: ["gitea", "migrate"]
    mounts: ["/srv/gitea/data:/data"]
    restart-on: [/srv/gitea/db.binding]
  - container: gitea.server
    image: docker.io/gitea/gitea:1.22
    ports: ["3000:3000"]
    env: {USER_UID: "1000"}
    mounts: ["/srv/gitea/data:/data", "/srv/gitea/app.ini:/etc/gitea/app.ini:ro"]
    restart-on: [/srv/gitea/app.ini, migrate]
`

func TestParseDesignExample(t *testing.T) {
	m, err := Parse("gitea.yaml", []byte(gitea))
	if err != nil {
		t.Fatal(err)
	}
	if m.Module != "gitea" || len(m.Resources) != 7 || len(m.Routes) != 1 {
		t.Fatalf("parsed %+v", m)
	}
	c := m.Resources[6]
	if c.Kind() != KindContainer || c.Name() != "gitea.server" || c.Env["USER_UID"] != "1000" || len(c.RestartOn) != 2 {
		t.Fatalf("container parsed as %+v", c)
	}
	if m.Line(6) != 25 || m.Line(0) != 5 {
		t.Fatalf("lines: resource 0 at %d, resource 6 at %d", m.Line(0), m.Line(6))
	}
	if m.Resources[2].Content != "[server]\nDOMAIN = git.example.org\n" {
		t.Fatalf("content %q", m.Resources[2].Content)
	}
	if m.Digest != Digest([]byte(gitea)) || len(m.Digest) != 64 {
		t.Fatalf("digest %q", m.Digest)
	}
}

// Each row is one mistake; the message must name the line and say what to do.
func TestParseErrors(t *testing.T) {
	for _, tc := range []struct {
		name string
		src  string
		line int
		want string // a substring of the message
	}{
		{"unknown key", "module: a\nresources:\n  - directory: /srv/a\n    owner: \"0:0\"\n    colour: blue\n", 5, `unknown key "colour"`},
		{"unknown top key", "module: a\nrezources: []\n", 2, `unknown key "rezources"`},
		{"wrong type", "module: a\nroutes:\n  - {name: web, port: eighty}\n", 3, "`port` must be a whole number, e.g. port: 3000; got the text \"eighty\""},
		{"number for a list", "module: a\nresources:\n  - container: a.web\n    image: x\n    ports: 8080\n", 5, "`ports` must be a list, e.g. ports: [\"8080:8080\"]; got the number 8080"},
		{"misspelt key", "module: a\nresources:\n  - container: a.web\n    imgae: x\n", 4, `unknown key "imgae"; did you mean "image"?`},
		{"list for text", "module: a\nresources:\n  - directory: [a, b]\n", 3, "`directory` must be a single value (text), not a list"},
		{"bool", "module: a\nresources:\n  - file: /srv/a\n    take-over: yes please\n", 4, "`take-over` must be true or false"},
		{"unknown health key", "module: a\nresources:\n  - container: a.web\n    image: x\n    health: {comand: [x]}\n", 5, `unknown key "comand"; did you mean "command"?`},
		{"syntax", "module: a\nresources:\n  - directory: [\n", 3, ""},
		{"undeclared mount", "module: a\nresources:\n  - directory: /srv/a\n  - container: a.web\n    image: x\n    mounts:\n      - /srv/a:/a\n      - /srv/a/data:/data\n", 8, `host path "/srv/a/data" is not declared above it; declare it as a directory or file`},
		{"mount declared after", "module: a\nresources:\n  - container: a.web\n    image: x\n    mounts: [\"/srv/a:/a\"]\n  - directory: /srv/a\n", 5, `host path "/srv/a" is not declared above it`},
		{"child before parent", "module: a\nresources:\n  - directory: /srv/a/data\n  - directory: /srv/a\n", 3, `"/srv/a/data" is declared before its parent "/srv/a" (line 4); move the parent above it`},
		{"parent is a file", "module: a\nresources:\n  - file: /srv/a\n  - file: /srv/a/b\n", 4, `which is a file (line 3), not a directory`},
		{"restart-on nothing", "module: a\nresources:\n  - container: a.web\n    image: x\n    restart-on: [/srv/a/app.ini]\n", 5, `restart-on "/srv/a/app.ini" names nothing declared above it in this manifest`},
		{"restart-on itself", "module: a\nresources:\n  - step: init\n    image: x\n    restart-on: [init]\n", 5, `restart-on "init" names nothing`},
		{"restart-on container", "module: a\nresources:\n  - container: a.one\n    image: x\n  - container: a.two\n    image: x\n    restart-on: [a.one]\n", 7, `names a container`},
		{"duplicate path", "module: a\nresources:\n  - directory: /srv/a\n  - file: /srv/a\n", 4, `"/srv/a" is declared twice (first at line 3); keep one`},
		{"duplicate container", "module: a\nresources:\n  - container: a.web\n    image: x\n  - container: a.web\n    image: y\n", 5, `"a.web" is declared twice`},
		{"relative path", "module: a\nresources:\n  - directory: srv/a\n", 3, `path must be absolute`},
		{"dotdot path", "module: a\nresources:\n  - directory: /srv/a/../etc\n", 3, `path is not clean`},
		{"trailing slash", "module: a\nresources:\n  - directory: /srv/a/\n", 3, `write "/srv/a"`},
		{"dotdot mount", "module: a\nresources:\n  - directory: /srv/a\n  - container: a.web\n    image: x\n    mounts: [\"/srv/a/../../etc:/etc\"]\n", 6, `host side: path is not clean`},
		{"no kind", "module: a\nresources:\n  - owner: \"0:0\"\n", 3, "resource has no kind"},
		{"two kinds", "module: a\nresources:\n  - directory: /srv/a\n    file: /srv/b\n", 3, "give each its own"},
		{"field of another kind", "module: a\nresources:\n  - directory: /srv/a\n    content: hi\n", 4, "a directory does not take `content`"},
		{"bad mode", "module: a\nresources:\n  - directory: /srv/a\n    mode: 750\n", 4, `mode "750" is not an octal mode`},
		{"bad owner", "module: a\nresources:\n  - directory: /srv/a\n    owner: git\n", 4, `owner "git" is not UID:GID`},
		{"missing module", "resources: []\n", 1, "`module:` is missing"},
		{"bad module name", "module: Git_Tea\n", 1, "not a DNS label"},
		{"no image", "module: a\nresources:\n  - container: a.web\n", 3, "has no `image:`"},
		{"no provider", "module: a\nresources:\n  - binding: /srv/a.binding\n", 3, "has no `provider:`"},
		{"secret without name", "module: a\nresources:\n  - directory: /srv/a\n  - secret: /srv/a/pw\n", 4, "has no `name:`; name the module's secret it holds (mesh secret set a NAME)"},
		{"bad secret name", "module: a\nresources:\n  - directory: /srv/a\n  - secret: /srv/a/pw\n    name: Smtp Pass\n", 5, `secret name "Smtp Pass": use 1 to 63`},
		{"secret others read", "module: a\nresources:\n  - directory: /srv/a\n  - secret: /srv/a/pw\n    name: pw\n    mode: \"0644\"\n", 6, "lets group or others read it"},
		{"secret content", "module: a\nresources:\n  - directory: /srv/a\n  - secret: /srv/a/pw\n    name: pw\n    content: hunter2\n", 6, "a secret does not take `content`"},
		{"env-secrets bad var", "module: a\nresources:\n  - container: a.web\n    image: x\n    env-secrets: {1X: pw}\n", 5, `env-secrets key "1X" is not a variable name`},
		{"env-secrets bad name", "module: a\nresources:\n  - container: a.web\n    image: x\n    env-secrets: {PW: \"../pw\"}\n", 5, `secret name "../pw"`},
		{"env and env-secrets", "module: a\nresources:\n  - container: a.web\n    image: x\n    env: {PW: x}\n    env-secrets: {PW: pw}\n", 6, "PW is in both env and env-secrets"},
		{"bad port", "module: a\nresources:\n  - container: a.web\n    image: x\n    ports: [\"80:99999\"]\n", 5, `"99999" is not a port`},
		{"bad route port", "module: a\nroutes:\n  - {name: web, port: 0}\n", 3, "port 0 is not between 1 and 65535"},
		{"duplicate route", "module: a\nroutes:\n  - {name: web, port: 80}\n  - {name: web, port: 81}\n", 4, `route "web" is listed twice`},
		{"upper-case container", "module: a\nresources:\n  - container: A.Web\n    image: x\n", 3, "Podman's DNS folds case"},
		{"accepts undeclared", "module: a\naccepts-credentials: /srv/a/creds\n", 2, `accepts-credentials "/srv/a/creds" is not a directory declared`},
		{"two documents", "module: a\n---\nmodule: b\n", 2, "more than one YAML document"},
		{"empty", "", 0, "manifest is empty"},
		{"not a mapping", "- a\n- b\n", 1, "a manifest is a mapping"},
		{"duplicate key", "module: a\nmodule: b\n", 2, "keep one"},
		{"bad restart", "module: a\nresources:\n  - container: a.web\n    image: x\n    restart: sometimes\n", 5, `restart "sometimes" is not one of`},
		{"bad env key", "module: a\nresources:\n  - container: a.web\n    image: x\n    env: {\"A B\": x}\n", 5, `env key "A B" is not a variable name; use letters, digits, '_', '.' and '-', starting with a letter or '_'`},
		{"self credential", "module: a\nresources:\n  - credential: /srv/a.pw\n    provider: a\n", 4, "names its own module"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := Parse("m.yaml", []byte(tc.src))
			if err == nil {
				t.Fatalf("accepted:\n%s", tc.src)
			}
			var errs Errors
			if !errors.As(err, &errs) || len(errs) == 0 {
				t.Fatalf("error %T %v is not Errors", err, err)
			}
			e := errs[0]
			if e.Line != tc.line {
				t.Errorf("line %d, want %d (%v)", e.Line, tc.line, err)
			}
			if !strings.Contains(e.Msg, tc.want) {
				t.Errorf("message %q lacks %q", e.Msg, tc.want)
			}
			prefix := "m.yaml:"
			if !strings.HasPrefix(e.Error(), prefix) {
				t.Errorf("error %q does not start with %q", e.Error(), prefix)
			}
		})
	}
}

func TestAllErrorsReported(t *testing.T) {
	src := "module: a\nresources:\n  - directory: srv\n  - container: a.web\n    image: x\n    mounts: [\"/x:/x\"]\n"
	_, err := Parse("m.yaml", []byte(src))
	var errs Errors
	if !errors.As(err, &errs) || len(errs) != 2 || errs[0].Line != 3 || errs[1].Line != 6 {
		t.Fatalf("want two errors at lines 3 and 6, got %v", err)
	}
}

func TestCheckProviders(t *testing.T) {
	m, err := Parse("gitea.yaml", []byte(gitea))
	if err != nil {
		t.Fatal(err)
	}
	none := func(string) (*Manifest, bool) { return nil, false }
	err = CheckProviders(m, none)
	if err == nil || !strings.Contains(err.Error(), `gitea.yaml:16: binding "/srv/gitea/db.binding": provider "postgres" is not in the catalogue; add it first with `+"`mesh module add`") {
		t.Fatalf("got %v", err)
	}
	pgNoAccept := &Manifest{Module: "postgres"}
	err = CheckProviders(m, func(string) (*Manifest, bool) { return pgNoAccept, true })
	if err == nil || !strings.Contains(err.Error(), `gitea.yaml:18: credential "/srv/gitea/db.password": provider "postgres" does not declare`) {
		t.Fatalf("got %v", err)
	}
	pg := &Manifest{Module: "postgres", AcceptsCredentials: "/srv/postgres/credentials"}
	if err := CheckProviders(m, func(string) (*Manifest, bool) { return pg, true }); err != nil {
		t.Fatal(err)
	}
}

// Every shape error of a file is reported at once, in line order, with the
// key and the line; a key far from any known one gets no guess.
func TestShapeErrorsAllAtOnce(t *testing.T) {
	src := "module: a\nroutes:\n  - {name: web, port: \"80\"}\nresources:\n  - container: a.web\n    image: x\n    ports: 8080\n    imgae: y\n    restrat: always\n    zzzzzzzz: 1\n    env: [A]\n"
	_, err := Parse("m.yaml", []byte(src))
	var errs Errors
	if !errors.As(err, &errs) {
		t.Fatalf("%v", err)
	}
	want := []string{
		"m.yaml:3: `port` must be a whole number",
		"m.yaml:7: `ports` must be a list",
		`m.yaml:8: unknown key "imgae"; did you mean "image"?`,
		`m.yaml:9: unknown key "restrat"; did you mean "restart"?`,
		`m.yaml:10: unknown key "zzzzzzzz"; ` + "`mesh schema` lists",
		"m.yaml:11: `env` must be a mapping",
	}
	if len(errs) != len(want) {
		t.Fatalf("%d errors, want %d:\n%v", len(errs), len(want), err)
	}
	for i, w := range want {
		if !strings.HasPrefix(errs[i].Error(), w) {
			t.Errorf("error %d: %q, want it to start with %q", i, errs[i].Error(), w)
		}
	}
	if strings.Contains(err.Error(), "Go struct") || strings.Contains(err.Error(), "sequence") {
		t.Fatalf("a decoder's words leaked: %v", err)
	}
}

func TestEditDistance(t *testing.T) {
	for _, tc := range []struct {
		a, b string
		d    int
	}{{"image", "image", 0}, {"imgae", "image", 1}, {"restrat", "restart", 1}, {"mounts", "mount", 1}, {"", "abc", 3}, {"kitten", "sitting", 3}} {
		if d := editDistance(tc.a, tc.b); d != tc.d {
			t.Errorf("editDistance(%q, %q) = %d, want %d", tc.a, tc.b, d, tc.d)
		}
	}
}

// The manifests shipped in examples/ must pass the checks.
func TestExamplesParse(t *testing.T) {
	files, _ := filepath.Glob("../../examples/*.yaml")
	if len(files) == 0 {
		t.Fatal("no examples found in ../../examples")
	}
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := Parse(f, b); err != nil {
			t.Errorf("%v", err)
		}
	}
}

func FuzzParse(f *testing.F) {
	f.Add([]byte(gitea))
	f.Add([]byte(pgBackup))
	f.Add([]byte("module: a\nresources:\n  - directory: /srv/a\n"))
	f.Add([]byte("module: a\n---\n"))
	f.Add([]byte("- [\n"))
	f.Add([]byte("module: &x a\nroutes: *x\n"))
	f.Fuzz(func(t *testing.T, b []byte) {
		m, err := Parse("fuzz.yaml", b)
		if err == nil && m == nil {
			t.Fatal("nil manifest without error")
		}
		if err != nil {
			var errs Errors
			if !errors.As(err, &errs) || len(errs) == 0 {
				t.Fatalf("error %T is not Errors: %v", err, err)
			}
			// Parse recovers a panic of the YAML library as a last resort; the
			// fuzzer still reports it, so that the bound that should have
			// refused the input first is added.
			if strings.Contains(err.Error(), "the YAML library failed") {
				t.Fatalf("the YAML library panicked: %v", err)
			}
			return
		}
		for i := range m.Resources {
			if !m.Resources[i].Typed.OK {
				t.Fatalf("resource %d of a valid manifest has no typed values", i)
			}
		}
		checkHeads(t, m)
		// As the FSM decodes it from its parsed form.
		j, err := json.Marshal(m)
		if err != nil {
			t.Fatal(err)
		}
		var d Manifest
		if err := json.Unmarshal(j, &d); err != nil {
			t.Fatal(err)
		}
		d.IndexProviders()
		checkHeads(t, &d)
	})
}

// checkHeads fails unless m's heads say what its resources say: composition
// reads the heads instead of the declarations (a wrong head would be in
// every composition, the full one the FSM compares with too).
func checkHeads(t *testing.T, m *Manifest) {
	t.Helper()
	hs := m.Heads()
	if len(hs) != len(m.Resources) {
		t.Fatalf("%d heads for %d resources", len(hs), len(m.Resources))
	}
	for i := range m.Resources {
		r := &m.Resources[i]
		want := Head{Kind: r.Kind(), Name: r.Name(), Secrets: r.SecretNames(), Content: r.Content}
		if !reflect.DeepEqual(hs[i], want) {
			t.Fatalf("resource %d's head %+v, its declaration says %+v", i, hs[i], want)
		}
	}
}

// Every kind of resource, secrets in files and in the environment.
func TestHeadsAreTheDeclarations(t *testing.T) {
	for _, src := range []string{gitea, pgBackup, `module: s
accepts-credentials: /srv/s/creds
resources:
  - directory: /srv/s
  - directory: /srv/s/creds
  - file: /srv/s/conf
    content: "x = 1\n"
  - secret: /srv/s/token
    name: token
  - binding: /srv/s/db.env
    provider: other
  - routes-file: /srv/s/routes.json
  - step: init
    image: localhost/busybox:1
    command: [true]
    env-secrets: {A: token, B: other}
  - container: s
    image: localhost/busybox:1
    env-secrets: {A: token}
`} {
		m, err := Parse("heads.yaml", []byte(src))
		if err != nil {
			t.Fatal(err)
		}
		if len(m.heads) != len(m.Resources) {
			t.Fatalf("a parsed manifest keeps %d heads for %d resources", len(m.heads), len(m.Resources))
		}
		checkHeads(t, m)
		seen := map[string]bool{}
		for _, h := range m.Heads() {
			seen[h.Kind] = true
		}
		if src != gitea && src != pgBackup && len(seen) != 7 {
			t.Fatalf("the test manifest has kinds %v, not all seven", seen)
		}
	}
}

// The schema lists exactly the keys Parse accepts, and refuses others.
func TestSchemaMatchesParser(t *testing.T) {
	b, err := Schema()
	if err != nil {
		t.Fatal(err)
	}
	s := string(b)
	for _, k := range []string{`"accepts-credentials"`, `"restart-on"`, `"routes-file"`, `"additionalProperties": false`, `"module"`, `"backup"`, `"before-backup"`, `"keep"`} {
		if !strings.Contains(s, k) {
			t.Errorf("schema lacks %s", k)
		}
	}
	if strings.Contains(s, `"Digest"`) || strings.Contains(s, `"File"`) {
		t.Error("schema exposes internal fields")
	}
}

// Issue 10: a health check is checked, and its defaults filled, at parse.
func TestHealthCheck(t *testing.T) {
	m, err := Parse("hc.yaml", []byte("module: hc\nresources:\n  - container: hc.server\n    image: busybox\n    health:\n      command: [\"true\"]\n      interval: 2s\n"))
	if err != nil {
		t.Fatal(err)
	}
	h := m.Resources[0].Typed.Health
	if h == nil || h.Interval != 2*time.Second || h.Timeout != 2*time.Second || h.Retries != DefaultHealthRetries || h.StartPeriod != DefaultHealthStartPeriod {
		t.Fatalf("health: %+v", h)
	}
	for _, tc := range []struct{ body, want string }{
		{"      command: []\n", "`command:` is missing"},
		{"      command: [\"true\"]\n      interval: soon\n", `interval "soon" is not a duration`},
		{"      command: [\"true\"]\n      interval: 10ms\n", "interval 10ms is out of range"},
		{"      command: [\"true\"]\n      retries: 0\n      timeout: 20s\n", "timeout 20s is longer than the interval 10s"},
		{"      command: [\"true\"]\n      retries: 500\n", "retries 500 is out of range"},
		{"      command: [\"true\"]\n      every: 1s\n", "every"},
	} {
		_, err := Parse("hc.yaml", []byte("module: hc\nresources:\n  - container: hc.server\n    image: busybox\n    health:\n"+tc.body))
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%q: %v, want %q", tc.body, err, tc.want)
		}
	}
	// Only a container has a health check.
	if _, err := Parse("hc.yaml", []byte("module: hc\nresources:\n  - step: s\n    image: busybox\n    health:\n      command: [\"true\"]\n")); err == nil || !strings.Contains(err.Error(), "health") {
		t.Errorf("a step with a health check: %v", err)
	}
}

// BenchmarkParseResources: mesh check must be linear in resources (issue 13
// item 5); compare ns/op across the sizes.
func BenchmarkParseResources(b *testing.B) {
	for _, n := range []int{2500, 5000, 10000} {
		var sb strings.Builder
		sb.WriteString("module: big\nresources:\n  - directory: /srv/big\n")
		for i := 0; i < n; i++ {
			fmt.Fprintf(&sb, "  - file: /srv/big/f%d\n    content: x\n", i)
		}
		src := []byte(sb.String())
		b.Run(fmt.Sprint(n), func(b *testing.B) {
			for i := 0; i < b.N; i++ {
				if _, err := Parse("big.yaml", src); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// NestedMounts finds exactly the pairs, in exactly the order, that comparing
// every pair finds: composition errors (and so replicas) depend on both.
func TestNestedMountsIsEveryPair(t *testing.T) {
	naive := func(ms []MountAt) []Nesting {
		var out []Nesting
		for _, outer := range ms {
			if outer.Mount.ReadOnly {
				continue
			}
			for _, inner := range ms {
				if inner.Mount.Source != outer.Mount.Source && Within(inner.Mount.Source, outer.Mount.Source) {
					out = append(out, Nesting{Outer: outer, Inner: inner})
				}
			}
		}
		return out
	}
	parts := []string{"srv", "srv-a", "a", "a.b", "b", "srv0", "x"}
	rng := rand.New(rand.NewPCG(1, 2))
	for round := 0; round < 2000; round++ {
		var ms []MountAt
		for i := rng.IntN(12); i > 0; i-- {
			p := ""
			for d := rng.IntN(4); d >= 0; d-- {
				p += "/" + parts[rng.IntN(len(parts))]
			}
			if rng.IntN(20) == 0 {
				p = "/"
			}
			ms = append(ms, MountAt{Module: "m", Resource: len(ms), Mount: Mount{Source: p, ReadOnly: rng.IntN(3) == 0}})
		}
		if got, want := NestedMounts(ms), naive(ms); !reflect.DeepEqual(got, want) {
			t.Fatalf("mounts %+v:\n got %+v\nwant %+v", ms, got, want)
		}
	}
	// Within, allocation-free, still means "is or is inside".
	for _, c := range []struct {
		p, dir string
		want   bool
	}{{"/srv", "/srv", true}, {"/srv/a", "/srv", true}, {"/srv-a", "/srv", false}, {"/srv", "/srv/a", false}, {"/sr", "/srv", false}, {"/x", "/", true}, {"/srvx/a", "/srv", false}} {
		if got := Within(c.p, c.dir); got != c.want {
			t.Errorf("Within(%q, %q) = %v", c.p, c.dir, got)
		}
	}
}

// Issue 30, item 3: a step's schedule is daily, hourly, weekly, every
// DURATION (10s at least) or a cron line in UTC; anything else, or one on
// another kind, is an error naming the line.
func TestStepSchedule(t *testing.T) {
	for _, c := range []struct{ sched, err string }{
		{"daily", ""}, {"hourly", ""}, {"weekly", ""}, {"every 15m", ""}, {"every 10s", ""}, {"30 3 * * *", ""}, {"*/5 * * * 1-5", ""},
		{"every 5s", "between 10s and 366 days"}, {"every soon", "between 10s and 366 days"}, {"@every 1m", "write daily"},
		{"61 * * * *", "cron line"}, {"* * *", "cron line"}, {"CRON_TZ=Europe/Paris 0 3 * * *", "write daily"},
		{"0 0 30 2 *", "no day matches it"}, {"0 0 31 4 *", "no day matches it"},
	} {
		_, err := Parse("s.yaml", []byte("module: s\nresources:\n  - step: run\n    image: b:1\n    schedule: \""+c.sched+"\"\n"))
		if c.err == "" && err != nil || c.err != "" && (err == nil || !strings.Contains(err.Error(), c.err) || !strings.Contains(err.Error(), "s.yaml:5")) {
			t.Errorf("schedule %q: %v, want %q", c.sched, err, c.err)
		}
	}
	if _, err := Parse("s.yaml", []byte("module: s\nresources:\n  - container: s.main\n    image: b:1\n    schedule: daily\n")); err == nil || !strings.Contains(err.Error(), "schedule") {
		t.Errorf("a container's schedule: %v", err)
	}
	s, _ := ParseSchedule("30 3 * * *")
	if n := s.Next(time.Date(2026, 12, 1, 4, 0, 0, 0, time.FixedZone("X", 5*3600))); !n.Equal(time.Date(2026, 12, 1, 3, 30, 0, 0, time.UTC)) { // 04:00 at +05:00 is 23:00 UTC the day before
		t.Errorf("a cron line is read in UTC: next %s", n)
	}
}

// kindName is the first of kinds() that is set, for every combination of
// kind keys set (a parsed resource sets one; the switch must keep the
// list's order and miss none).
func TestKindNameIsKindsFirst(t *testing.T) {
	n := len((&Resource{}).kinds())
	for mask := range 1 << n {
		var r Resource
		set := []*string{&r.Directory, &r.File, &r.RoutesFile, &r.Binding, &r.Credential, &r.Secret, &r.Step, &r.Container}
		if len(set) != n {
			t.Fatalf("kinds() lists %d kinds, the test sets %d", n, len(set))
		}
		for i, p := range set {
			if mask&(1<<i) != 0 {
				*p = fmt.Sprintf("v%d", i)
			}
		}
		wantK, wantV := "", ""
		for _, kv := range r.kinds() {
			if kv[1] != "" {
				wantK, wantV = kv[0], kv[1]
				break
			}
		}
		if k, v := r.kindName(); k != wantK || v != wantV {
			t.Fatalf("mask %b: kindName = %q %q, kinds() gives %q %q", mask, k, v, wantK, wantV)
		}
	}
}

// The providers a manifest's bindings and credentials name are the same
// whether Parse kept them, IndexProviders found them after a decode of the
// parsed form, or they are walked (a manifest made otherwise).
func TestProvidersAreTheResourcesOnes(t *testing.T) {
	src := `module: app
resources:
  - directory: /srv/app
  - binding: /srv/app/db.binding
    provider: pg
  - credential: /srv/app/db.password
    provider: pg
  - binding: /srv/app/cache.binding
    provider: redis
  - credential: /srv/app/mail.password
    provider: mail
  - binding: /srv/app/db2.binding
    provider: pg
`
	m, err := Parse("app.yaml", []byte(src))
	if err != nil {
		t.Fatal(err)
	}
	wantB, wantC := []string{"pg", "redis", "pg"}, []string{"pg", "mail"}
	b, _ := json.Marshal(m)
	var back Manifest
	if err := json.Unmarshal(b, &back); err != nil {
		t.Fatal(err)
	}
	walked := back // not indexed: walked
	for _, c := range []struct {
		what string
		m    *Manifest
	}{{"parsed", m}, {"decoded, walked", &walked}} {
		if got := c.m.BindingProviders(); !slices.Equal(got, wantB) {
			t.Errorf("%s: binding providers %v, want %v", c.what, got, wantB)
		}
		if got := c.m.CredentialProviders(); !slices.Equal(got, wantC) {
			t.Errorf("%s: credential providers %v, want %v", c.what, got, wantC)
		}
	}
	back.IndexProviders()
	if !back.indexed || !slices.Equal(back.BindingProviders(), wantB) || !slices.Equal(back.CredentialProviders(), wantC) {
		t.Errorf("decoded and indexed: %v %v", back.BindingProviders(), back.CredentialProviders())
	}
}
