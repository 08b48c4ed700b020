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
	plain := describe(parse(""), dns, "", "", nil)
	// The declaration as it was written before these fields existed, but
	// for the log's bound, which every container has (the default when it
	// declares none): a container made before bounds is replaced once.
	if plain.Decl != `{"image":"b:2","command":["x"],"dns":"169.254.53.53","log-max-size":10485760}` {
		t.Fatalf("a container without the new fields has a new declaration (every such container would be replaced on upgrade): %s", plain.Decl)
	}
	full := parse("    user: \"1000:1000\"\n    working-dir: /srv\n    memory: 64m\n    log-max-size: 1m\n    cpus: 0.5\n    read-only: true\n    cap-drop: [ALL]\n    stop-signal: SIGQUIT\n    stop-timeout: 20s\n    tmpfs: [/run]\n    labels: {team: web}\n")
	want := describe(full, dns, "", "", nil)
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
	s := x.spec(context.Background(), web, describe(web, dns, x.publishOn, "", nil))
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
	before, after := describe(web, dns, "", "", nil), describe(web, dns, "100.90.0.1", "", nil)
	have := &Container{Name: "f.app", Running: true, State: "running", Labels: map[string]string{LabelManaged: "1", LabelDigest: before.Digest, LabelDecl: before.Decl, LabelInputs: "{}"}}
	if act, reason, _ := decideContainer(after, have, nil); act != actReplace || reason != "publish-on changed" {
		t.Fatalf("moving onto the overlay: %s %q", act, reason)
	}
	// A container that publishes nothing is not touched by the move.
	quiet := parse("")
	if describe(quiet, dns, "", "", nil).Digest != describe(quiet, dns, "100.90.0.1", "", nil).Digest {
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

// Every key a container or step takes is part of what it is: set, it
// changes the declaration (a running container is replaced, the reason
// naming the key) and reaches the runtime's spec. The rows are checked
// against the keys the manifest takes, so a key added there and not here,
// in describe or in spec fails this test. pull is the one key that is not
// part of the declaration: a policy, not what runs.
func TestEveryContainerKeyIsDeclared(t *testing.T) {
	dns := netip.MustParseAddr("169.254.53.53")
	const pre = "module: f\nresources:\n  - directory: /srv/f\n  - container: f.app\n"
	parse := func(lines string) state.Resource {
		t.Helper()
		m, err := manifest.Parse("f.yaml", []byte(pre+lines))
		if err != nil {
			t.Fatal(err)
		}
		d := m.Resources[1]
		return state.Resource{Module: "f", Kind: d.Kind(), Name: d.Name(), Decl: d, Typed: d.Typed}
	}
	const image = "    image: b:2\n"
	for _, row := range []struct {
		key   string
		lines string
		spec  func(Spec) bool // nil: the key is an input, not a field of the spec
	}{
		{"image", "    image: b:3\n", func(s Spec) bool { return s.Image == "b:3" }},
		{"command", image + "    command: [y]\n", func(s Spec) bool { return len(s.Command) == 1 && s.Command[0] == "y" }},
		{"env", image + "    env: {discovery.type: single-node}\n", func(s Spec) bool { return s.Env["discovery.type"] == "single-node" }},
		{"env-secrets", image + "    env-secrets: {xpack.password: pw}\n", func(s Spec) bool { return s.EnvFile != "" && s.EnvExec == "/mesh" }},
		{"mounts", image + "    mounts: [\"/srv/f:/data:ro,z\"]\n", func(s Spec) bool {
			return len(s.Mounts) == 1 && s.Mounts[0].Destination == "/data" && strings.Join(s.Mounts[0].Options, ",") == "ro,z"
		}},
		{"ports", image + "    ports: [\"8080:80\"]\n", func(s Spec) bool { return len(s.Ports) == 1 && s.Ports[0].HostPort == 8080 }},
		{"public-ports", image + "    public-ports: [\"443:443\"]\n", func(s Spec) bool { return len(s.Ports) == 1 && s.Ports[0].HostPort == 443 }},
		{"restart", image + "    restart: on-failure\n", func(s Spec) bool { return s.Restart == "on-failure" }},
		{"restart-on", image + "    restart-on: [/srv/f]\n", nil},
		{"health", image + "    health: {command: [\"true\"]}\n", func(s Spec) bool { return s.Health != nil && s.Health.Command[0] == "true" }},
		{"pull", image + "    pull: always\n", nil},
		{"user", image + "    user: \"1000:1000\"\n", func(s Spec) bool { return s.User == "1000:1000" }},
		{"entrypoint", image + "    entrypoint: [/bin/sh]\n", func(s Spec) bool { return len(s.Entrypoint) == 1 }},
		{"working-dir", image + "    working-dir: /srv\n", func(s Spec) bool { return s.WorkingDir == "/srv" }},
		{"cap-add", image + "    cap-add: [NET_ADMIN]\n", func(s Spec) bool { return len(s.CapAdd) == 1 }},
		{"cap-drop", image + "    cap-drop: [ALL]\n", func(s Spec) bool { return len(s.CapDrop) == 1 }},
		{"devices", image + "    devices: [/dev/fuse]\n", func(s Spec) bool { return len(s.Devices) == 1 && s.Devices[0].Host == "/dev/fuse" }},
		{"read-only", image + "    read-only: true\n", func(s Spec) bool { return s.ReadOnly }},
		{"tmpfs", image + "    tmpfs: [/run]\n", func(s Spec) bool { return len(s.Tmpfs) == 1 }},
		{"memory", image + "    memory: 64m\n", func(s Spec) bool { return s.Memory == 64<<20 }},
		{"cpus", image + "    cpus: 0.5\n", func(s Spec) bool { return s.CPUs == 0.5 }},
		{"stop-signal", image + "    stop-signal: SIGQUIT\n", func(s Spec) bool { return s.StopSignal == 3 }},
		{"stop-timeout", image + "    stop-timeout: 20s\n", func(s Spec) bool { return s.StopTimeout != nil && *s.StopTimeout == 20 }},
		{"labels", image + "    labels: {team: web}\n", func(s Spec) bool { return s.Labels["team"] == "web" }},
		{"log-max-size", image + "    log-max-size: 1m\n", func(s Spec) bool { return s.LogMaxSize == 1<<20 }},
		{"tty", image + "    tty: true\n", func(s Spec) bool { return s.TTY }},
		{"init", image + "    init: true\n", func(s Spec) bool { return s.Init }},
		{"pids-limit", image + "    pids-limit: 512\n", func(s Spec) bool { return s.PidsLimit == 512 }},
		{"group-add", image + "    group-add: [\"1000\", video]\n", func(s Spec) bool { return strings.Join(s.GroupAdd, " ") == "1000 video" }},
	} {
		t.Run(row.key, func(t *testing.T) {
			plain := describe(parse(image), dns, "", "", nil)
			res := parse(row.lines)
			want := describe(res, dns, "", "", nil)
			have := &Container{Name: "f.app", Running: true, State: "running", Labels: map[string]string{LabelManaged: "1", LabelDigest: plain.Digest, LabelDecl: plain.Decl, LabelInputs: "{}"}}
			act, reason, err := decideContainer(want, have, nil)
			if row.key == "pull" {
				if want.Digest != plain.Digest || act != actKeep {
					t.Fatalf("a pull policy changed the container: %s %q", act, reason)
				}
				return
			}
			if err != nil || act != actReplace || reason != row.key+" changed" {
				t.Fatalf("%s: %s %q %v, want a replacement because %s changed", row.lines, act, reason, err, row.key)
			}
			x := &run{r: &Reconciler{cfg: Config{DNS: dns, EnvExec: "/mesh"}}}
			if s := x.spec(context.Background(), res, want); row.spec != nil && !row.spec(s) {
				t.Fatalf("%s: spec %+v", row.lines, s)
			}
		})
	}
	// The rows are every key a step or a container takes.
	rows := map[string]bool{}
	for _, k := range []string{"image", "command", "env", "env-secrets", "mounts", "ports", "public-ports", "restart", "restart-on", "health", "pull",
		"user", "entrypoint", "working-dir", "cap-add", "cap-drop", "devices", "read-only", "tmpfs", "memory", "cpus", "stop-signal", "stop-timeout", "labels", "log-max-size",
		"tty", "init", "pids-limit", "group-add", "schedule", "before-backup"} {
		rows[k] = true
	}
	// A step's schedule is when it runs again, not what it is: a changed
	// one reruns nothing.
	step := func(extra string) state.Resource {
		m, err := manifest.Parse("f.yaml", []byte("module: f\nresources:\n  - step: s\n    image: b:2\n    command: [x]\n"+extra))
		if err != nil {
			t.Fatal(err)
		}
		d := m.Resources[0]
		return state.Resource{Module: "f", Kind: d.Kind(), Name: d.Name(), Decl: d, Typed: d.Typed}
	}
	if a, b := describe(step(""), dns, "", "", nil), describe(step("    schedule: every 15m\n"), dns, "", "", nil); a.Digest != b.Digest || a.Decl != b.Decl {
		t.Fatal("a step's schedule is part of its declaration: a new schedule would rerun it")
	}
	// So is before-backup: (an apply never runs such a step, backup.go).
	if a, b := describe(step(""), dns, "", "", nil), describe(step("    before-backup: true\n  - directory: /srv/f\n    data: true\n"), dns, "", "", nil); a.Digest != b.Digest {
		t.Fatal("a step's before-backup is part of its digest")
	}
	for _, kind := range []string{manifest.KindContainer, manifest.KindStep} {
		for _, k := range manifest.Keys(kind) {
			if !rows[k] {
				t.Errorf("a %s takes %q, which this test (and maybe describe and spec) does not know", kind, k)
			}
		}
	}
}

// tty:, init:, pids-limit: and group-add:, and a mount's label, on a
// running container: each change replaces it once, saying which key; the
// runtime gets the values; the next pass keeps it.
func TestComposeKeysReplaceOnce(t *testing.T) {
	b := newBed(t)
	const sidecar = "  - container: app.sidecar\n    image: localhost/busybox:1\n"
	if !strings.HasSuffix(appTmpl, sidecar) {
		t.Fatal("appTmpl no longer ends with the sidecar")
	}
	apply := func(extra string) state.Report {
		t.Helper()
		var srcs []string
		for _, src := range []string{appTmpl + extra, dbTmpl} {
			s := strings.ReplaceAll(src, "{{d}}", b.dir)
			for k, v := range b.vars {
				s = strings.ReplaceAll(s, "{{"+k+"}}", v)
			}
			srcs = append(srcs, s)
		}
		return b.r.Apply(context.Background(), 1, composeAce(t, &b.in, srcs))
	}
	if rep := apply(""); rep.Error != "" {
		t.Fatal(rep.Error)
	}
	before := b.rt.byName("app.sidecar").ID
	keys := "    tty: true\n    init: true\n    pids-limit: 64\n    group-add: [video]\n"
	rep := apply(keys)
	o := outcome(rep, "app.sidecar")
	if rep.Error != "" || o.Outcome != state.Replaced || o.Reason != "group-add changed; init changed; pids-limit changed; tty changed" {
		t.Fatalf("%q: %+v", rep.Error, o)
	}
	c := b.rt.byName("app.sidecar")
	if s := b.rt.specs[c.ID]; c.ID == before || !s.TTY || !s.Init || s.PidsLimit != 64 || len(s.GroupAdd) != 1 || s.GroupAdd[0] != "video" {
		t.Fatalf("id %s (was %s), spec %+v", c.ID, before, b.rt.specs[c.ID])
	}
	if o := outcome(apply(keys), "app.sidecar"); o.Outcome != state.Unchanged || b.rt.byName("app.sidecar").ID != c.ID {
		t.Fatalf("the pass after: %+v", o)
	}
	// Back to none of them: replaced again, the keys gone from the spec.
	if o := outcome(apply(""), "app.sidecar"); o.Outcome != state.Replaced {
		t.Fatalf("dropping the keys: %+v", o)
	}
	if s := b.rt.specs[b.rt.byName("app.sidecar").ID]; s.TTY || s.Init || s.PidsLimit != 0 || s.GroupAdd != nil {
		t.Fatalf("spec after dropping the keys: %+v", s)
	}
	// A label on a mount is a change of the mount.
	server := b.rt.byName("app.server").ID
	apply("    mounts: [\"{{d}}/app/data:/data:z\"]\n")
	o = outcome(apply("    mounts: [\"{{d}}/app/data:/data:Z\"]\n"), "app.sidecar")
	if o.Outcome != state.Replaced || o.Reason != "mounts changed" {
		t.Fatalf("z to Z: %+v", o)
	}
	if s := b.rt.specs[b.rt.byName("app.sidecar").ID]; len(s.Mounts) != 1 || strings.Join(s.Mounts[0].Options, ",") != "Z" {
		t.Fatalf("mount options: %+v", s.Mounts)
	}
	if b.rt.byName("app.server").ID != server {
		t.Fatal("a change of the sidecar replaced the server")
	}
}
