package reconciler

import (
	"context"
	"net/netip"
	"os"
	"path/filepath"
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
	plain := describe(parse(""), dns, "", nil)
	// The declaration as it was written before these fields existed, but
	// for the log's bound, which every container has (the default when it
	// declares none): a container made before bounds is replaced once.
	if plain.Decl != `{"image":"b:2","command":["x"],"dns":"169.254.53.53","log-max-size":10485760}` {
		t.Fatalf("a container without the new fields has a new declaration (every such container would be replaced on upgrade): %s", plain.Decl)
	}
	full := parse("    user: \"1000:1000\"\n    working-dir: /srv\n    memory: 64m\n    log-max-size: 1m\n    cpus: 0.5\n    read-only: true\n    cap-drop: [ALL]\n    stop-signal: SIGQUIT\n    stop-timeout: 20s\n    tmpfs: [/run]\n    labels: {team: web}\n")
	want := describe(full, dns, "", nil)
	for _, k := range []string{`"user":"1000:1000"`, `"working-dir":"/srv"`, `"memory":67108864`, `"cpus":0.5`, `"read-only":true`, `"cap-drop":["ALL"]`, `"stop-signal":3`, `"stop-timeout":20`, `"tmpfs":["/run"]`, `"labels":{"team":"web"}`, `"log-max-size":1048576`} {
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
		s.StopSignal != 3 || s.StopTimeout == nil || *s.StopTimeout != 20 || len(s.Tmpfs) != 1 || s.Labels["team"] != "web" || s.Labels[LabelManaged] != "1" || s.LogMaxSize != 1<<20 {
		t.Fatalf("spec: %+v", s)
	}
}

// Issue 15 item 3: a binding with `healthy: true` holds the rest of its
// module until the provider's instance it points at is healthy. The wait is
// a gate, not a failure: the binding is written, nothing after it is made,
// and once the provider is healthy the next pass makes the rest.
func TestHealthGateHoldsTheRest(t *testing.T) {
	b := newBed(t)
	b.vars["gate"] = "\n    healthy: true"
	healthy := false
	var asked []string
	b.r.cfg.ProviderHealthy = func(ctx context.Context, provider, node string) (bool, string) {
		asked = append(asked, provider+"@"+node)
		if healthy {
			return true, ""
		}
		return false, "container db.main is starting"
	}
	rep := b.apply()
	if !rep.OnlyGates() || !strings.Contains(rep.Error, "waits for db on ace to be healthy: container db.main is starting") {
		t.Fatalf("report: only gates %v, error %q", rep.OnlyGates(), rep.Error)
	}
	if o := outcome(rep, "app/db.binding").Outcome; o != state.Created {
		t.Fatalf("the binding: %s", o)
	}
	for _, n := range []string{"app.server", "app.sidecar", "app.migrate", "app/db.password"} {
		if o := outcome(rep, n); o.Outcome != state.Waiting || !strings.Contains(o.Reason, "waits for its provider db to be healthy") {
			t.Fatalf("%s: %+v", n, o)
		}
	}
	if b.rt.byName("app.server") != nil || len(asked) != 1 || asked[0] != "db@ace" {
		t.Fatalf("server made behind a closed gate, or the gate asked %v", asked)
	}
	healthy = true
	rep = b.apply()
	if rep.Error != "" || outcome(rep, "app.server").Outcome != state.Created || outcome(rep, "app.migrate").Outcome != state.Ran {
		t.Fatalf("after the provider is healthy: %q, server %+v", rep.Error, outcome(rep, "app.server"))
	}
	// A gate on a failed module is a failure, not a gate.
	var r state.Report
	r.Failures = []state.ModuleFailure{{Module: "a", HealthGate: true}, {Module: "b"}}
	if r.OnlyGates() {
		t.Fatal("a report with a real failure counts as only gates")
	}
}

// A declared device is used only if it is a device node reached without a
// link: a link planted at the device's path or at a directory above it, or
// a regular file, is refused.
func TestDeviceMustBeANode(t *testing.T) {
	if msg := deviceOK("/dev/null"); msg != "" {
		t.Fatalf("/dev/null: %s", msg)
	}
	d := t.TempDir()
	os.Symlink("/dev/null", filepath.Join(d, "null"))
	os.Symlink("/dev", filepath.Join(d, "dev"))
	os.WriteFile(filepath.Join(d, "file"), nil, 0o644)
	for _, p := range []string{filepath.Join(d, "null"), filepath.Join(d, "dev", "null"), filepath.Join(d, "file"), filepath.Join(d, "none")} {
		if msg := deviceOK(p); msg == "" {
			t.Errorf("%s was taken for a device", p)
		}
	}
}

// Internal ports are published on the plan's address (the node's overlay
// address), public ones where they say; the address is part of the
// container's declaration only when it has ports, so a move of the mesh onto
// its overlay replaces exactly the containers that publish, once, saying why.
func TestPortsArePublishedOnThePlansAddress(t *testing.T) {
	dns := netip.MustParseAddr("169.254.53.53")
	parse := func(extra string) state.Resource {
		t.Helper()
		m, err := manifest.Parse("f.yaml", []byte("module: f\nresources:\n  - container: f.app\n    image: b:2\n"+extra))
		if err != nil {
			t.Fatal(err)
		}
		d := m.Resources[0]
		return state.Resource{Module: "f", Kind: d.Kind(), Name: d.Name(), Decl: d, Typed: d.Typed}
	}
	web := parse("    ports: [\"8080:80\"]\n    public-ports: [\"443:443\", \"192.0.2.7:80:8081/udp\"]\n")
	x := &run{r: &Reconciler{cfg: Config{DNS: dns}}, publishOn: "100.90.0.1"}
	s := x.spec(context.Background(), web, describe(web, dns, x.publishOn, nil))
	want := []Port{{HostIP: "100.90.0.1", HostPort: 8080, ContainerPort: 80, Protocol: "tcp"}, {HostPort: 443, ContainerPort: 443, Protocol: "tcp"}, {HostIP: "192.0.2.7", HostPort: 80, ContainerPort: 8081, Protocol: "udp"}}
	if len(s.Ports) != len(want) {
		t.Fatalf("ports %+v, want %+v", s.Ports, want)
	}
	for i := range want {
		if s.Ports[i] != want[i] {
			t.Fatalf("port %d: %+v, want %+v", i, s.Ports[i], want[i])
		}
	}
	// Before the overlay (every interface) and on it: one replacement, why.
	before, after := describe(web, dns, "", nil), describe(web, dns, "100.90.0.1", nil)
	have := &Container{Name: "f.app", Running: true, State: "running", Labels: map[string]string{LabelManaged: "1", LabelDigest: before.Digest, LabelDecl: before.Decl, LabelInputs: "{}"}}
	if act, reason, _ := decideContainer(after, have, nil); act != actReplace || reason != "publish-on changed" {
		t.Fatalf("moving onto the overlay: %s %q", act, reason)
	}
	// A container that publishes nothing is not touched by the move.
	quiet := parse("")
	if describe(quiet, dns, "", nil).Digest != describe(quiet, dns, "100.90.0.1", nil).Digest {
		t.Fatal("a container without ports changes digest with the publish address")
	}
	// ports: may not name an address: that is what public-ports: are for.
	if _, err := manifest.Parse("f.yaml", []byte("module: f\nresources:\n  - container: f.app\n    image: b:2\n    ports: [\"0.0.0.0:5432:5432\"]\n")); err == nil || !strings.Contains(err.Error(), "public-ports") {
		t.Fatalf("an address in ports: %v", err)
	}
	if _, err := manifest.Parse("f.yaml", []byte("module: f\nresources:\n  - container: f.app\n    image: b:2\n    ports: [\"80:80\"]\n    public-ports: [\"80:8080\"]\n")); err == nil || !strings.Contains(err.Error(), "published twice") {
		t.Fatalf("a host port in both: %v", err)
	}
}
