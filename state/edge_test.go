package state

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/json"
	"encoding/pem"
	"errors"
	"math/big"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"
)

const edgeGitSrc = `module: git
routes:
  - {name: git, port: 3000, hosts: [code.example.com]}
resources:
  - directory: /srv/git
`

const edgeWikiSrc = `module: wiki
routes:
  - {name: wiki, port: 8080}
resources:
  - directory: /srv/wiki
`

const edgeProxySrc = `module: proxy
resources:
  - directory: /srv/proxy
  - routes-file: /srv/proxy/Caddyfile
    template: |
      { email {{.ACME.Email}}; acme_ca {{.ACME.Directory}} }
      {{range .Routes}}{{.Name}} -> {{.Module}}:{{.Port}}
      {{end}}domains:{{range .Domains}} {{.}}{{end}}
`

func testRoot(t *testing.T) string {
	t.Helper()
	k, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	tpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "test root"}, NotBefore: time.Now(), NotAfter: time.Now().Add(time.Hour), IsCA: true, BasicConstraintsValid: true}
	der, err := x509.CreateCertificate(rand.Reader, tpl, tpl, &k.PublicKey, k)
	if err != nil {
		t.Fatal(err)
	}
	return string(pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}))
}

func proxyFile(t *testing.T, s *Store, node string) string {
	t.Helper()
	pv, err := s.Plan(context.Background(), node)
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range pv.Plan.Resources {
		if r.Name == "/srv/proxy/Caddyfile" {
			return r.Content
		}
	}
	t.Fatalf("%s's plan has no Caddyfile: %+v", node, pv.Plan.Resources)
	return ""
}

// Several domains, hosts and the ACME settings reach a node's routes-file
// and its roster; each change is one FSM op (--add and --remove change the
// list in the FSM); what is refused changes nothing.
func TestPublicEdge(t *testing.T) {
	ctx := context.Background()
	s := openStore(t)
	var idx uint64
	mustApply(t, s, &idx, &InitRequest{MeshID: "m-1", Node: Node{Name: "ace", Address: "10.0.0.1"}})
	mustApply(t, s, &idx, &NodeAddRequest{Node: Node{Name: "bee", Address: "10.0.0.2"}})
	mustApply(t, s, &idx, &ModuleAddRequest{Modules: []ModuleSpec{spec("git.yaml", edgeGitSrc), spec("wiki.yaml", edgeWikiSrc), spec("proxy.yaml", edgeProxySrc)}})
	mustApply(t, s, &idx, &PublicDomainRequest{Node: "ace", Domains: []string{"example.org", "example.net"}})
	mustApply(t, s, &idx, &AssignRequest{Assignment: Assignment{Node: "ace", Module: "git"}})
	mustApply(t, s, &idx, &AssignRequest{Assignment: Assignment{Node: "ace", Module: "proxy"}})

	got := proxyFile(t, s, "ace")
	for _, w := range []string{
		"acme_ca " + LetsEncrypt + " }", // the default directory
		"code.example.com -> git:3000", "git.example.net -> git:3000", "git.example.org -> git:3000",
		"domains: example.org example.net",
	} {
		if !strings.Contains(got, w) {
			t.Errorf("the Caddyfile lacks %q:\n%s", w, got)
		}
	}
	roster, _ := s.Roster(ctx)
	for _, n := range []string{"code.example.com", "git.example.org", "git.example.net"} {
		if !hasName(roster, n, "10.0.0.1") {
			t.Errorf("the roster lacks %s -> ace: %v", n, roster)
		}
	}

	// ACME settings, then --remove and --add, each as the FSM applies it.
	root := testRoot(t)
	mustApply(t, s, &idx, &NodeACMERequest{Node: "ace", ACME: ACME{Directory: "https://10.0.0.9:14000/dir", Email: "ops@example.org", CARoot: root}})
	mustApply(t, s, &idx, &PublicDomainRequest{Node: "ace", Remove: []string{"example.net"}})
	mustApply(t, s, &idx, &PublicDomainRequest{Node: "ace", Add: []string{"example.io"}})
	got = proxyFile(t, s, "ace")
	if !strings.Contains(got, "{ email ops@example.org; acme_ca https://10.0.0.9:14000/dir }") || strings.Contains(got, "example.net") ||
		!strings.Contains(got, "git.example.io -> git:3000") || !strings.Contains(got, "domains: example.org example.io") {
		t.Fatalf("after acme, --remove and --add:\n%s", got)
	}
	n, err := s.Node(ctx, "ace")
	if err != nil {
		t.Fatal(err)
	}
	if n.PublicDomain != "example.org" || !slices.Equal(n.PublicDomains, []string{"example.org", "example.io"}) || n.ACME.CARoot != root {
		t.Fatalf("node ace reads %q %v %+v", n.PublicDomain, n.PublicDomains, n.ACME)
	}

	// Refused, each with a message that names what to do, changing nothing.
	for _, c := range []struct {
		r    Request
		want string
	}{
		{&NodeACMERequest{Node: "ace", ACME: ACME{Directory: "http://plain/dir"}}, "is not an https URL"},
		{&NodeACMERequest{Node: "ace", ACME: ACME{Directory: "https://x/dir }\n import evil"}}, "is not an https URL"},
		{&NodeACMERequest{Node: "ace", ACME: ACME{Email: "a@b }\n{ admin 0.0.0.0:2019"}}, "is not an address"},
		{&NodeACMERequest{Node: "ace", ACME: ACME{CARoot: "-----BEGIN PRIVATE KEY-----\nAAAA\n-----END PRIVATE KEY-----\n"}}, "holds a PRIVATE KEY block; give certificates only"},
		{&NodeACMERequest{Node: "ace", ACME: ACME{CARoot: root + "trailing text"}}, "is not PEM certificates"},
		{&NodeACMERequest{Node: "ace", ACME: ACME{CARoot: "}\nimport evil\n" + root}}, "is not PEM certificates"},
		{&NodeACMERequest{Node: "ace", ACME: ACME{CARoot: root + "between\n" + root}}, "is not PEM certificates"},
		{&NodeACMERequest{Node: "nobody", ACME: ACME{}}, "nobody"},
		{&PublicDomainRequest{Node: "ace", Remove: []string{"example.net"}}, "does not serve example.net (it serves example.org, example.io)"},
		{&PublicDomainRequest{Node: "ace", Domains: []string{"example.org", "example.org"}}, "given twice"},
		{&PublicDomainRequest{Node: "ace", Add: []string{"Bad Domain"}}, "is not a domain name"},
		// wiki.example.org would be served by wiki on bee and claimed as
		// a host by a new manifest: refused at module add, naming both.
		{&ModuleAddRequest{Modules: []ModuleSpec{spec("other.yaml", "module: other\nroutes:\n  - {name: o, port: 80, hosts: [code.example.com]}\n")}}, "host code.example.com is claimed by both git and other"},
	} {
		before := dumpJSON(t, s)
		if err := applyErr(t, s, &idx, c.r); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: got %v, want an error with %q", c.r.describe(), err, c.want)
		} else if !sameState(before, dumpJSON(t, s)) {
			t.Errorf("%s: refused, but it changed the state", c.r.describe())
		} else if !errors.Is(err, ErrInvalid) && !errors.Is(err, ErrNotFound) && !errors.Is(err, ErrConflict) {
			t.Errorf("%s: %v is not a rule error", c.r.describe(), err)
		}
	}
	// A name under a domain clashes with another module's host where both
	// are assigned: at assign, and at a new public domain.
	mustApply(t, s, &idx, &ModuleAddRequest{Modules: []ModuleSpec{spec("wiki.yaml", "module: wiki\nroutes:\n  - {name: wiki, port: 8080, hosts: [git.example.com]}\n")}})
	mustApply(t, s, &idx, &PublicDomainRequest{Node: "bee", Domain: "example.org"})
	mustApply(t, s, &idx, &AssignRequest{Assignment: Assignment{Node: "bee", Module: "wiki"}})
	before := dumpJSON(t, s)
	if err := applyErr(t, s, &idx, &PublicDomainRequest{Node: "ace", Add: []string{"example.com"}}); err == nil || !strings.Contains(err.Error(), "host git.example.com is claimed by both git and wiki") {
		t.Fatalf("a domain that makes git.example.com clash: %v", err)
	}
	if !sameState(before, dumpJSON(t, s)) {
		t.Fatal("a refused public domain changed the state")
	}
	if err := applyErr(t, s, &idx, &AssignRequest{Assignment: Assignment{Node: "bee", Module: "git"}}); err != nil {
		t.Fatalf("the same module on a second node is no clash: %v", err)
	}
	if err := applyErr(t, s, &idx, &UnassignRequest{Assignment: Assignment{Node: "bee", Module: "git"}}); err != nil {
		t.Fatal(err)
	}
	// An assign is a command of format 3, which replicas of older binaries
	// apply too, without the rule: the FSM takes it as they do, and the
	// proposer (Store.CheckHosts, the API's) is what refuses it.
	mustApply(t, s, &idx, &ModuleAddRequest{Modules: []ModuleSpec{spec("blog.yaml", "module: blog\nroutes:\n  - {name: wiki, port: 80}\n")}})
	blog := &AssignRequest{Assignment: Assignment{Node: "ace", Module: "blog"}}
	if err := s.CheckHosts(ctx, blog); err == nil || !strings.Contains(err.Error(), "host wiki.example.org is claimed by both blog and wiki") {
		t.Fatalf("the proposer's check of an assign that makes wiki.example.org clash across nodes: %v", err)
	}
	mustApply(t, s, &idx, blog)
	// A clash older than a command does not refuse it: only what the
	// command itself breaks does.
	mustApply(t, s, &idx, &PublicDomainRequest{Node: "bee", Add: []string{"example.dev"}})
	if err := s.CheckHosts(ctx, &PublicDomainRequest{Node: "bee", Add: []string{"example.info"}}); err != nil {
		t.Fatalf("an unrelated domain, with an older clash in the state: %v", err)
	}
	mustApply(t, s, &idx, &NodeACMERequest{Node: "ace", Clear: true})
	if n, _ := s.Node(ctx, "ace"); n.ACME != (ACME{}) {
		t.Fatalf("--clear left %+v", n.ACME)
	}
}

// One module at one name twice (a label under a domain that is also one of
// its hosts) is no clash; at one name for two ports, or at a name under the
// mesh's own domain, it is.
func TestHostRules(t *testing.T) {
	s := openStore(t)
	var idx uint64
	mustApply(t, s, &idx, &InitRequest{MeshID: "m-1", Node: Node{Name: "ace", Address: "10.0.0.1"}})
	mustApply(t, s, &idx, &PublicDomainRequest{Node: "ace", Domains: []string{"example.org", "example.net"}})
	mustApply(t, s, &idx, &ModuleAddRequest{Modules: []ModuleSpec{spec("git.yaml", "module: git\nroutes:\n  - {name: git, port: 3000, hosts: [git.example.org]}\n")}})
	mustApply(t, s, &idx, &AssignRequest{Assignment: Assignment{Node: "ace", Module: "git"}})
	pv, err := s.Plan(context.Background(), "ace")
	if err != nil {
		t.Fatal(err)
	}
	if n, _ := s.Node(context.Background(), "ace"); n.ComposeError != "" || len(pv.Plan.Routes) != 2 {
		t.Fatalf("a route at its own host under its node's domain: compose error %q, routes %v", n.ComposeError, pv.Plan.Routes)
	}
	for _, c := range []struct{ src, want string }{
		{"module: git\nroutes:\n  - {name: git, port: 1}\n  - {name: b, port: 2, hosts: [git.example.org]}\n", "host git.example.org is claimed twice by module git (ports 1 and 2)"},
		{"module: sly\nroutes:\n  - {name: a, port: 1, hosts: [git.internal]}\n", "host git.internal of module sly is under the mesh's own domain internal"},
	} {
		if err := applyErr(t, s, &idx, &ModuleAddRequest{Modules: []ModuleSpec{spec("x.yaml", c.src)}}); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("got %v, want %q", err, c.want)
		}
	}
}

// The FSM's check of ACME settings reads characters and PEM's structure
// only; the proposer's also parses the URL and the certificates.
func TestACMEChecks(t *testing.T) {
	root := testRoot(t)
	bad := "-----BEGIN CERTIFICATE-----\nAAAA\n-----END CERTIFICATE-----\n"
	for _, c := range []struct {
		a          ACME
		fsm, proxy bool // accepted by Check, by CheckFull
	}{
		{ACME{Directory: "https://acme.example/dir", Email: "ops+mesh@example.org", CARoot: root}, true, true},
		{ACME{Directory: "https://acme.example/dir\u00a0x"}, false, false},
		{ACME{Directory: "https://acme.example/{$HOME}"}, false, false},
		{ACME{Email: "#ops@example.org"}, false, false},
		{ACME{Email: "ops@example"}, false, false},
		{ACME{Email: "ops@exa\vmple.org"}, false, false},
		{ACME{CARoot: bad}, true, false},
	} {
		if got := c.a.Check() == nil; got != c.fsm {
			t.Errorf("Check(%+v) accepted: %v, want %v", c.a, got, c.fsm)
		}
		if got := c.a.CheckFull() == nil; got != c.proxy {
			t.Errorf("CheckFull(%+v) accepted: %v, want %v", c.a, got, c.proxy)
		}
	}
}

// What the public edge adds needs format 9, so a node whose binary is
// older never applies it differently; the rest keeps its old format.
func TestEdgeFormats(t *testing.T) {
	for _, c := range []struct {
		r    Request
		want int
	}{
		{&PublicDomainRequest{Node: "a", Domain: "example.org"}, 3},
		{&PublicDomainRequest{Node: "a", Domains: []string{"example.org"}}, 3},
		{&PublicDomainRequest{Node: "a", Domains: []string{"example.org", "example.net"}}, edgeFormat},
		{&PublicDomainRequest{Node: "a", Add: []string{"example.org"}}, edgeFormat},
		{&NodeACMERequest{Node: "a"}, edgeFormat},
		{&ModuleAddRequest{Modules: []ModuleSpec{spec("g.yaml", edgeGitSrc)}}, edgeFormat},
		{&ModuleAddRequest{Modules: []ModuleSpec{spec("w.yaml", edgeWikiSrc)}}, 3},
		{&RestoreBody{ACME: map[string]ACME{"a": {Email: "a@b.c"}}}, edgeFormat},
		{&RestoreBody{PublicDomains: map[string]string{"a": "example.org example.net"}}, edgeFormat},
		{&RestoreBody{PublicDomains: map[string]string{"a": "example.org\texample.net"}}, edgeFormat},
		{&RestoreBody{PublicDomains: map[string]string{"a": "example.org"}}, 3},
		{&ModuleAddRequest{Modules: []ModuleSpec{spec("p.yaml", edgeProxySrc)}}, edgeFormat},
	} {
		if v := NewCommand(c.r).V; v != c.want {
			t.Errorf("%s: format %d, want %d", c.r.describe(), v, c.want)
		}
	}
}

// A restore carries every node's domains and ACME settings.
func TestRestoreKeepsTheEdge(t *testing.T) {
	ctx := context.Background()
	s := openStore(t)
	var idx uint64
	mustApply(t, s, &idx, &InitRequest{MeshID: "m-1", Node: Node{Name: "ace", Address: "10.0.0.1"}})
	mustApply(t, s, &idx, &PublicDomainRequest{Node: "ace", Domains: []string{"example.org", "example.net"}})
	mustApply(t, s, &idx, &NodeACMERequest{Node: "ace", ACME: ACME{Directory: "https://ca.example/dir", Email: "ops@example.org"}})
	sn, err := s.Dump(ctx)
	if err != nil {
		t.Fatal(err)
	}
	b, err := sn.RestoreBody()
	if err != nil {
		t.Fatal(err)
	}
	mustApply(t, s, &idx, &PublicDomainRequest{Node: "ace"})
	mustApply(t, s, &idx, &NodeACMERequest{Node: "ace", Clear: true})
	mustApply(t, s, &idx, b)
	n, _ := s.Node(ctx, "ace")
	if !slices.Equal(n.PublicDomains, []string{"example.org", "example.net"}) || n.ACME.Directory != "https://ca.example/dir" || n.ACME.Email != "ops@example.org" {
		t.Fatalf("after the restore: %v %+v", n.PublicDomains, n.ACME)
	}
}

// sameState says whether two dumps differ in more than the applied index.
func sameState(before, after string) bool {
	var a, b Snapshot
	json.Unmarshal([]byte(before), &a)
	json.Unmarshal([]byte(after), &b)
	a.Index, b.Index = 0, 0
	return reflect.DeepEqual(a, b)
}

// A public domain that is the mesh's own domain (or lies under it) would
// put every route's NAME.DOMAIN among the mesh's names: a module's route
// named db or novox would add its node's address to the module db's name
// and the node novox's, and take part of their traffic. The proposer
// refuses it, as it refuses a route's host under the mesh's domain.
func TestPublicDomainIsNotTheMeshDomain(t *testing.T) {
	ctx := context.Background()
	s := openStore(t)
	var idx uint64
	mustApply(t, s, &idx, &InitRequest{MeshID: "m-1", Domain: "example.org", Node: Node{Name: "ace", Address: "10.0.0.1"}})
	mustApply(t, s, &idx, &NodeAddRequest{Node: Node{Name: "novox", Address: "10.0.0.2"}})
	mustApply(t, s, &idx, &ModuleAddRequest{Modules: []ModuleSpec{spec("db.yaml", "module: db\n"), spec("sly.yaml", "module: sly\nroutes:\n  - {name: db, port: 5432}\n  - {name: novox, port: 22}\n")}})
	mustApply(t, s, &idx, &AssignRequest{Assignment: Assignment{Node: "novox", Module: "db"}})
	mustApply(t, s, &idx, &AssignRequest{Assignment: Assignment{Node: "ace", Module: "sly"}})
	for _, r := range []*PublicDomainRequest{
		{Node: "ace", Domains: []string{"example.org"}},
		{Node: "ace", Add: []string{"pub.example.org"}},
		{Node: "ace", Domain: "example.org"},
	} {
		err := s.CheckHosts(ctx, r)
		if err == nil || !strings.Contains(err.Error(), "the mesh's own domain example.org") {
			t.Errorf("%+v: got %v, want a refusal naming the mesh's own domain", r, err)
		}
	}
	if err := s.CheckHosts(ctx, &PublicDomainRequest{Node: "ace", Domains: []string{"example.com", "myexample.org"}}); err != nil {
		t.Errorf("a public domain outside the mesh's: %v", err)
	}
}
