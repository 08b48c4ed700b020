package reconciler

import (
	"context"
	"net/netip"
	"strings"
	"testing"

	"mesh/state"
	"mesh/state/manifest"
)

// Issue 15 item 4: a container's compose-style fields are part of its
// declaration (a change replaces it, and says which field), reach the
// runtime's spec, and a manifest that sets none of them keeps the digests
// its containers had before the fields existed.
func TestContainerFieldsAreDeclared(t *testing.T) {
	dns := netip.MustParseAddr("169.254.53.53")
	parse := func(extra string) state.Resource {
		t.Helper()
		m, err := manifest.Parse("f.yaml", []byte("module: f\nresources:\n  - container: f.app\n    image: b:2\n    command: [x]\n"+extra))
		if err != nil {
			t.Fatal(err)
		}
		d := m.Resources[0]
		return state.Resource{Module: "f", Kind: d.Kind(), Name: d.Name(), Decl: d, Typed: d.Typed}
	}
	plain := describe(parse(""), dns, nil)
	// The declaration as it was written before these fields existed.
	if plain.Decl != `{"image":"b:2","command":["x"],"dns":"169.254.53.53"}` {
		t.Fatalf("a container without the new fields has a new declaration (every such container would be replaced on upgrade): %s", plain.Decl)
	}
	full := parse("    user: \"1000:1000\"\n    working-dir: /srv\n    memory: 64m\n    cpus: 0.5\n    read-only: true\n    cap-drop: [ALL]\n    stop-signal: SIGQUIT\n    stop-timeout: 20s\n    tmpfs: [/run]\n    labels: {team: web}\n")
	want := describe(full, dns, nil)
	for _, k := range []string{`"user":"1000:1000"`, `"working-dir":"/srv"`, `"memory":67108864`, `"cpus":0.5`, `"read-only":true`, `"cap-drop":["ALL"]`, `"stop-signal":3`, `"stop-timeout":20`, `"tmpfs":["/run"]`, `"labels":{"team":"web"}`} {
		if !strings.Contains(want.Decl, k) {
			t.Errorf("declaration lacks %s: %s", k, want.Decl)
		}
	}
	if want.Digest == plain.Digest {
		t.Fatal("the fields do not change the digest")
	}
	have := &Container{Name: "f.app", Running: true, State: "running", Labels: map[string]string{LabelManaged: "1", LabelDigest: plain.Digest, LabelDecl: plain.Decl, LabelInputs: "{}"}}
	act, reason, err := decideContainer(want, have, nil)
	if err != nil || act != actReplace || !strings.Contains(reason, "memory changed") || !strings.Contains(reason, "user changed") {
		t.Fatalf("adding fields: %s %q %v", act, reason, err)
	}

	x := &run{r: &Reconciler{cfg: Config{DNS: dns, Domain: func(context.Context) string { return "internal" }}}}
	s := x.spec(context.Background(), full, want)
	if len(s.DNSSearch) != 1 || s.DNSSearch[0] != "internal" {
		t.Fatalf("search domains: %v", s.DNSSearch)
	}
	if s.User != "1000:1000" || s.WorkingDir != "/srv" || s.Memory != 64<<20 || s.CPUs != 0.5 || !s.ReadOnly || len(s.CapDrop) != 1 ||
		s.StopSignal != 3 || s.StopTimeout == nil || *s.StopTimeout != 20 || len(s.Tmpfs) != 1 || s.Labels["team"] != "web" || s.Labels[LabelManaged] != "1" {
		t.Fatalf("spec: %+v", s)
	}
}
