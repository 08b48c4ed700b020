package reconciler

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"mesh/state"
	"mesh/state/manifest"
)

// host is a reconciler on a temp dir with free-form manifests.
type host struct {
	t    *testing.T
	dir  string
	rt   *fake
	r    *Reconciler
	logs *bytes.Buffer
	in   state.Input
	src  map[string]string // module -> manifest text ({{d}} is the dir)
}

func newHost(t *testing.T) *host {
	h := &host{t: t, dir: t.TempDir(), rt: newFake(), logs: &bytes.Buffer{}, src: map[string]string{}}
	h.in = state.Input{Domain: "internal", Nodes: []state.Node{{Name: "ace", Address: "10.0.0.1"}}, Credentials: map[state.Pair]string{}}
	h.open()
	return h
}

// open (re)starts the reconciler from what is on disk, as an agent restart does.
func (h *host) open() {
	os.MkdirAll(filepath.Join(h.dir, "data"), 0o700)
	r, err := New(Config{
		Node: "ace", DNS: netip.MustParseAddr("169.254.53.53"), LedgerPath: filepath.Join(h.dir, "data", "ledger.json"),
		DataDir: filepath.Join(h.dir, "data"),
		Secret:  func(ctx context.Context, p state.Pair) (string, error) { return "s", nil },
		Logger:  slog.New(slog.NewTextHandler(h.logs, nil)),
	}, h.rt)
	if err != nil {
		h.t.Fatal(err)
	}
	h.r = r
}

func (h *host) assign(mods ...string) {
	h.in.Assignments = nil
	for _, m := range mods {
		h.in.Assignments = append(h.in.Assignments, state.Assignment{Node: "ace", Module: m})
	}
}

func (h *host) plan() *state.Plan {
	h.t.Helper()
	var srcs []string
	for _, src := range h.src {
		srcs = append(srcs, strings.ReplaceAll(src, "{{d}}", h.dir))
	}
	return composeAce(h.t, &h.in, srcs)
}

// composeAce parses the manifests into in's catalogue and returns node
// ace's plan, failing the test when it does not compose.
func composeAce(t *testing.T, in *state.Input, srcs []string) *state.Plan {
	t.Helper()
	in.Modules = map[string]*manifest.Manifest{}
	for _, src := range srcs {
		m, err := manifest.Parse("t.yaml", []byte(src))
		if err != nil {
			t.Fatal(err)
		}
		in.Modules[m.Module] = m
	}
	out := state.Compose(*in)
	if out.Errors["ace"] != "" {
		t.Fatal(out.Errors["ace"])
	}
	return out.Plans["ace"]
}

func (h *host) apply() state.Report {
	h.t.Helper()
	h.rt.calls = nil
	return h.r.Apply(context.Background(), 1, h.plan())
}

func (h *host) write(rel, content string) {
	h.t.Helper()
	p := filepath.Join(h.dir, rel)
	os.MkdirAll(filepath.Dir(p), 0o755)
	if err := os.WriteFile(p, []byte(content), 0o644); err != nil {
		h.t.Fatal(err)
	}
}

func (h *host) read(rel string) string {
	b, err := os.ReadFile(filepath.Join(h.dir, rel))
	if err != nil {
		return "<" + err.Error() + ">"
	}
	return string(b)
}

const twinTmpl = `module: {{m}}
resources:
  - directory: {{d}}/{{m}}
  - file: {{d}}/{{m}}/input
    content: "{{content}}"
  - step: migrate
    image: localhost/busybox:1
    command: ["true"]
    restart-on: [{{d}}/{{m}}/input]
  - container: {{m}}.server
    image: localhost/busybox:1
    restart-on: [migrate]
`

func twin(m, content string) string {
	return strings.NewReplacer("{{m}}", m, "{{content}}", content).Replace(twinTmpl)
}

// Issue 8 item 1: a step named alike in two modules is two steps.
func TestStepNamesDoNotBleedAcrossModules(t *testing.T) {
	h := newHost(t)
	h.src["alpha"], h.src["beta"] = twin("alpha", "a1"), twin("beta", "b1")
	h.assign("alpha", "beta")
	if rep := h.apply(); rep.Error != "" {
		t.Fatal(rep.Error)
	}
	betaID := h.rt.byName("beta.server").ID
	alphaID := h.rt.byName("alpha.server").ID
	h.src["alpha"] = twin("alpha", "a2")
	rep := h.apply()
	if o := outcome(rep, "alpha.migrate"); o.Outcome != state.Ran {
		t.Fatalf("alpha.migrate: %+v", o)
	}
	if o := outcome(rep, "alpha.server"); o.Outcome != state.Replaced || o.Reason != "step migrate ran" {
		t.Fatalf("alpha.server: %+v", o)
	}
	if o := outcome(rep, "beta.migrate"); o.Outcome != state.Unchanged {
		t.Fatalf("beta.migrate: %+v", o)
	}
	if o := outcome(rep, "beta.server"); o.Outcome != state.Unchanged {
		t.Fatalf("beta.server: %+v", o)
	}
	if h.rt.byName("beta.server").ID != betaID || h.rt.byName("alpha.server").ID == alphaID {
		t.Fatal("container ids: beta's changed or alpha's did not")
	}
	for _, c := range h.rt.calls {
		if strings.Contains(c, "beta") {
			t.Fatalf("a Podman call touched beta: %v", h.rt.calls)
		}
	}
}

const providerTmpl = `module: db
resources:
  - directory: {{d}}/db
  - container: db.server
    image: {{image}}
`

const consumerTmpl = `module: app
resources:
  - directory: {{d}}/app
  - binding: {{d}}/app/db.binding
    provider: db
  - container: app.server
    image: localhost/busybox:1
`

const otherTmpl = `module: other
resources:
  - directory: {{d}}/other
  - container: other.server
    image: localhost/busybox:1
`

const goneTmpl = `module: gone
resources:
  - directory: {{d}}/gone
  - container: gone.server
    image: localhost/busybox:1
`

// Issue 8 item 2: failure is per module; consumers of a failed provider wait;
// other modules and removals proceed.
func TestFailureIsPerModule(t *testing.T) {
	h := newHost(t)
	h.src["db"] = strings.ReplaceAll(providerTmpl, "{{image}}", "localhost/busybox:1")
	h.src["app"], h.src["other"], h.src["gone"] = consumerTmpl, otherTmpl, goneTmpl
	h.assign("db", "app", "gone")
	if rep := h.apply(); rep.Error != "" {
		t.Fatal(rep.Error)
	}
	// db's image goes missing (no registry), other is assigned, gone unassigned.
	h.src["db"] = strings.ReplaceAll(providerTmpl, "{{image}}", "example.org/missing:1")
	h.assign("db", "app", "other")
	rep := h.apply()
	if o := outcome(rep, "db.server"); o.Outcome != state.Failed {
		t.Fatalf("db.server: %+v", o)
	}
	if o := outcome(rep, "app.server"); o.Outcome != state.Waiting || !strings.Contains(o.Reason, "provider db") {
		t.Fatalf("app.server: %+v", o)
	}
	if o := outcome(rep, "other.server"); o.Outcome != state.Created {
		t.Fatalf("other.server: %+v", o)
	}
	if h.rt.byName("gone.server") != nil {
		t.Fatal("the unassigned module's container was not removed")
	}
	if _, err := os.Stat(filepath.Join(h.dir, "gone")); !os.IsNotExist(err) {
		t.Fatal("the unassigned module's directory was not removed")
	}
	if h.rt.byName("app.server") == nil {
		t.Fatal("the waiting consumer's running container was removed")
	}
	if f := rep.Failed("db"); f == nil || !strings.Contains(f.Reason, "pull example.org/missing:1") {
		t.Fatalf("failures: %+v", rep.Failures)
	}
	if f := rep.Failed("app"); f == nil || f.Provider != "db" || len(f.Waiting) == 0 {
		t.Fatalf("failures: %+v", rep.Failures)
	}
	if rep.Failed("other") != nil || !strings.Contains(rep.Error, "db: container db.server") {
		t.Fatalf("error: %q", rep.Error)
	}
}

const fileTmpl = `module: conf
resources:
  - directory: {{d}}/conf
  - file: {{d}}/conf/app.ini
    mode: "0640"
    content: "mesh"
{{takeover}}`

// Issue 8 item 3: an operator's file is never overwritten unless the
// manifest takes it over, and then it comes back.
func TestOperatorFileIsRefusedOrTakenOverAndPutBack(t *testing.T) {
	for _, takeOver := range []bool{false, true} {
		h := newHost(t)
		os.MkdirAll(filepath.Join(h.dir, "conf"), 0o755)
		h.write("conf/app.ini", "operator's bytes")
		os.Chmod(filepath.Join(h.dir, "conf/app.ini"), 0o604)
		tv := ""
		if takeOver {
			tv = "    take-over: true\n"
		}
		h.src["conf"] = strings.ReplaceAll(fileTmpl, "{{takeover}}", tv)
		h.assign("conf")
		rep := h.apply()
		o := outcome(rep, h.dir+"/conf/app.ini")
		if !takeOver {
			if o.Outcome != state.Failed || !strings.Contains(o.Reason, "the mesh did not write it") || !strings.Contains(o.Reason, "take-over: true") {
				t.Fatalf("refused: %+v", o)
			}
			if h.read("conf/app.ini") != "operator's bytes" {
				t.Fatal("overwritten")
			}
		} else {
			if o.Outcome != state.Updated || !strings.Contains(o.Reason, "taken over; the original is kept at "+h.dir+"/data/kept/") {
				t.Fatalf("taken over: %+v", o)
			}
			if h.read("conf/app.ini") != "mesh" {
				t.Fatal("not written")
			}
		}
		h.assign()
		rep = h.apply()
		if h.read("conf/app.ini") != "operator's bytes" {
			t.Fatalf("take-over=%v: after unassign the file holds %q; report %+v", takeOver, h.read("conf/app.ini"), rep.Resources)
		}
		if fi, _ := os.Stat(filepath.Join(h.dir, "conf/app.ini")); fi.Mode().Perm() != 0o604 {
			t.Fatalf("mode %v", fi.Mode())
		}
		if _, err := os.Stat(filepath.Join(h.dir, "conf")); err != nil {
			t.Fatal("the operator's directory went")
		}
	}
}

// A taken-over file put back, its kept copy removed, whose ledger entry a
// kill (or a full disk at the ledger's write) left: the next apply finds
// the original in place and drops the entry, instead of failing on the
// missing copy at every pass.
func TestTakenOverFilePutBackBeforeTheLedgerForgotIt(t *testing.T) {
	h := newHost(t)
	os.MkdirAll(filepath.Join(h.dir, "conf"), 0o755)
	h.write("conf/app.ini", "operator's bytes")
	h.src["conf"] = strings.ReplaceAll(fileTmpl, "{{takeover}}", "    take-over: true\n")
	h.assign("conf")
	h.apply()
	p := filepath.Join(h.dir, "conf/app.ini")
	e := h.r.ledger.Paths[p]
	if e.Original == nil {
		t.Fatalf("not taken over: %+v", e)
	}
	// What restore does before the ledger's drop: the original back, the copy gone.
	h.write("conf/app.ini", "operator's bytes")
	os.Remove(e.Original.Kept)
	h.open() // the agent killed and started again
	h.assign()
	rep := h.apply()
	if o := outcome(rep, p); o.Outcome != state.Restored {
		t.Fatalf("after a kill between the put-back and the ledger: %+v", o)
	}
	if _, ok := h.r.ledger.Paths[p]; ok || h.read("conf/app.ini") != "operator's bytes" {
		t.Fatalf("the ledger keeps %s (%v), which holds %q", p, ok, h.read("conf/app.ini"))
	}
}

// A file the mesh wrote and someone then edited is kept aside before the mesh
// writes it again: no bytes are lost.
func TestEditedFileIsKeptBeforeRewrite(t *testing.T) {
	h := newHost(t)
	h.src["conf"] = strings.ReplaceAll(fileTmpl, "{{takeover}}", "")
	h.assign("conf")
	h.apply()
	h.write("conf/app.ini", "hand edit")
	rep := h.apply()
	o := outcome(rep, h.dir+"/conf/app.ini")
	if o.Outcome != state.Updated || !strings.Contains(o.Reason, "that content is kept at ") {
		t.Fatalf("%+v", o)
	}
	kept := o.Reason[strings.Index(o.Reason, "kept at ")+len("kept at "):]
	if b, _ := os.ReadFile(kept); string(b) != "hand edit" {
		t.Fatalf("kept copy %q", b)
	}
}

const treeTmpl = `module: tree
resources:
  - directory: {{d}}/tree
  - directory: {{d}}/tree/data
    owner: "1000:1000"
    mode: "0750"
  - directory: {{d}}/tree/data/sub
    mode: "0700"
  - file: {{d}}/tree/data/sub/conf
    mode: "0600"
    content: "{{c}}"
  - file: {{d}}/tree/data/top
    content: "{{c}}"
`

// Issue 8 item 4: a link planted at any level of a declared tree is never
// followed, for write, chown, chmod and remove alike.
func TestPlantedLinksAtEveryLevel(t *testing.T) {
	for _, at := range []string{"tree/data", "tree/data/sub", "tree/data/sub/conf", "tree/data/top"} {
		t.Run(strings.ReplaceAll(at, "/", "_"), func(t *testing.T) {
			h := newHost(t)
			h.src["tree"] = strings.ReplaceAll(treeTmpl, "{{c}}", "v1")
			h.assign("tree")
			if rep := h.apply(); rep.Error != "" {
				t.Fatal(rep.Error)
			}
			outside := t.TempDir()
			os.WriteFile(filepath.Join(outside, "conf"), []byte("outside"), 0o644)
			os.WriteFile(filepath.Join(outside, "top"), []byte("outside"), 0o644)
			os.Mkdir(filepath.Join(outside, "sub"), 0o755)
			os.WriteFile(filepath.Join(outside, "sub", "conf"), []byte("outside"), 0o644)
			before := snapshot(t, outside)
			p := filepath.Join(h.dir, at)
			os.RemoveAll(p)
			target := filepath.Join(outside, filepath.Base(at))
			if filepath.Base(at) == "data" {
				target = outside
			}
			if err := os.Symlink(target, p); err != nil {
				t.Fatal(err)
			}
			h.src["tree"] = strings.ReplaceAll(treeTmpl, "{{c}}", "v2")
			rep := h.apply()
			if !strings.Contains(rep.Error, "symbolic link") {
				t.Fatalf("the change did not say link: %q", rep.Error)
			}
			h.assign()
			rep = h.apply()
			if after := snapshot(t, outside); after != before {
				t.Fatalf("outside changed:\n%s\n->\n%s", before, after)
			}
			linked := false
			for _, rr := range rep.Resources {
				linked = linked || rr.Outcome == state.Kept && strings.Contains(rr.Reason, "symbolic link")
			}
			if !linked {
				t.Fatalf("the link was not reported: %+v", rep.Resources)
			}
		})
	}
}

// snapshot is every entry under dir with its mode, owner and content.
func snapshot(t *testing.T, dir string) string {
	var b strings.Builder
	filepath.Walk(dir, func(p string, fi os.FileInfo, err error) error {
		if err != nil {
			return err
		}
		c, _ := os.ReadFile(p)
		st := fi.Sys().(*syscall.Stat_t)
		fmt.Fprintf(&b, "%s %s %d:%d mtime=%v ctime=%v %q\n", p, fi.Mode(), st.Uid, st.Gid, st.Mtim, st.Ctim, c)
		return nil
	})
	return b.String()
}

// Issue 8 item 5: paths of the system and the node's data dir are refused.
func TestSystemAndDataDirPathsAreRefused(t *testing.T) {
	h := newHost(t)
	plan := &state.Plan{Node: "ace", Resources: []state.Resource{
		{Module: "evil", Kind: manifest.KindDirectory, Name: filepath.Join(h.dir, "data", "evil"), Typed: manifest.Typed{OK: true}},
		{Module: "evil2", Kind: manifest.KindFile, Name: "/etc/evil", Typed: manifest.Typed{OK: true}, Content: "x"},
		// A plan an older proposer wrote: /tmp declared would lose its
		// sticky bit to the directory's mode.
		{Module: "evil3", Kind: manifest.KindDirectory, Name: "/tmp", Typed: manifest.Typed{OK: true, HasMode: true, Mode: 0o755}, Decl: manifest.Resource{TakeOver: true}},
	}}
	rep := h.r.Apply(context.Background(), 1, plan)
	if o := outcome(rep, filepath.Join(h.dir, "data", "evil")); o.Outcome != state.Failed || !strings.Contains(o.Reason, "data dir") {
		t.Fatalf("%+v", o)
	}
	if o := outcome(rep, "/etc/evil"); o.Outcome != state.Failed || !strings.Contains(o.Reason, "belongs to the system") {
		t.Fatalf("%+v", o)
	}
	if _, err := os.Stat("/etc/evil"); err == nil {
		t.Fatal("/etc/evil written")
	}
	if o := outcome(rep, "/tmp"); o.Outcome != state.Failed || !strings.Contains(o.Reason, "shared by everything on the host") {
		t.Fatalf("%+v", o)
	}
	if fi, err := os.Stat("/tmp"); err != nil || fi.Mode()&os.ModeSticky == 0 {
		t.Fatalf("/tmp: %v %v", fi.Mode(), err)
	}
}

// A directory an older mesh took over before the host refused it (/tmp,
// its mode then the module's 0755) gets its owner and mode back when the
// module lets go of it: the host refuses to touch such a path for a
// module, not to mend it. (Here /tmp's own owner and mode are recorded, so
// that putting them back changes nothing.)
func TestRefusedTakenOverDirectoryIsMended(t *testing.T) {
	h := newHost(t)
	var st syscall.Stat_t
	if err := syscall.Stat("/tmp", &st); err != nil {
		t.Fatal(err)
	}
	orig := &Original{UID: int(st.Uid), GID: int(st.Gid), Mode: st.Mode & 0o7777}
	if err := h.r.ledger.Put("/tmp", PathEntry{Kind: manifest.KindDirectory, Module: "old", Original: orig}); err != nil {
		t.Fatal(err)
	}
	rep := h.r.Apply(context.Background(), 1, &state.Plan{Node: "ace"})
	if o := outcome(rep, "/tmp"); o.Outcome != state.Restored {
		t.Fatalf("/tmp let go of: %+v", o)
	}
	if _, ok := h.r.ledger.Paths["/tmp"]; ok {
		t.Fatal("the ledger still holds /tmp")
	}
	var now syscall.Stat_t
	if err := syscall.Stat("/tmp", &now); err != nil || now.Mode != st.Mode || now.Uid != st.Uid || now.Gid != st.Gid {
		t.Fatalf("/tmp changed: %o %d:%d -> %o %d:%d", st.Mode, st.Uid, st.Gid, now.Mode, now.Uid, now.Gid)
	}
	// A file there is not the host's to touch, put back or not.
	if err := h.r.ledger.Put("/tmp", PathEntry{Kind: manifest.KindFile, Module: "old", Digest: "x"}); err != nil {
		t.Fatal(err)
	}
	if o := outcome(h.r.Apply(context.Background(), 2, &state.Plan{Node: "ace"}), "/tmp"); o.Outcome != state.Kept || !strings.Contains(o.Reason, "shared by everything on the host") {
		t.Fatalf("a file at /tmp let go of: %+v", o)
	}
}

// ledgerOnDisk reads the ledger as a crash would leave it.
func (h *host) ledgerOnDisk() *Ledger {
	l, err := LoadLedger(filepath.Join(h.dir, "data", "ledger.json"))
	if err != nil {
		h.t.Fatal(err)
	}
	return l
}

// crashRT stops the apply at its n-th mutating call, as a kill -9 there would.
type crashRT struct {
	*fake
	n     int
	check func()
}

var errCrash = errors.New("crash")

func (c *crashRT) hit() error {
	c.check()
	c.n--
	if c.n == 0 {
		panic(errCrash)
	}
	return nil
}
func (c *crashRT) Create(ctx context.Context, s Spec) (string, error) {
	c.hit()
	return c.fake.Create(ctx, s)
}
func (c *crashRT) Remove(ctx context.Context, id string) error {
	c.hit()
	return c.fake.Remove(ctx, id)
}
func (c *crashRT) Start(ctx context.Context, id string) error {
	c.hit()
	return c.fake.Start(ctx, id)
}

const crashTmpl = `module: app
resources:
  - directory: {{d}}/app
  - directory: {{d}}/app/data
  - file: {{d}}/app/conf
    content: "{{c}}"
  - step: init
    image: localhost/busybox:1
    command: ["init"]
    mounts: ["{{d}}/app/data:/data"]
    restart-on: [{{d}}/app/conf]
  - container: app.server
    image: localhost/busybox:1
    mounts: ["{{d}}/app/data:/data"]
    restart-on: [init]
`

// Issue 8 item 6: a crash at any Podman call of an apply forgets nothing: every
// path made is already in the ledger on disk, a step that succeeded has its
// marker, and after the restart the step has run once per input change and an
// unassign leaves nothing the mesh made.
func TestCrashAtEveryPointForgetsNothing(t *testing.T) {
	for n := 1; n <= 12; n++ {
		h := newHost(t)
		runs := 0
		h.rt.exit = func(s Spec) int { runs++; return 0 }
		h.src["app"] = strings.ReplaceAll(crashTmpl, "{{c}}", "v1")
		h.assign("app")
		crt := &crashRT{fake: h.rt, n: n}
		crt.check = func() {
			l := h.ledgerOnDisk()
			for _, p := range []string{"app", "app/data", "app/conf"} {
				if _, err := os.Lstat(filepath.Join(h.dir, p)); err == nil {
					if _, ok := l.Paths[filepath.Join(h.dir, p)]; !ok {
						t.Fatalf("crash %d: %s exists but the ledger on disk does not know it", n, p)
					}
				}
			}
			if runs > 0 && len(l.Markers) == 0 && h.rt.byName("app.init") == nil {
				t.Fatalf("crash %d: the step ran and its container is gone, but no marker is on disk", n)
			}
		}
		h.r.rt = crt
		func() {
			defer func() {
				if r := recover(); r != nil && r != errCrash {
					panic(r)
				}
			}()
			h.r.Apply(context.Background(), 1, h.plan())
		}()
		// Restart: a fresh reconciler from disk, against the same containers.
		h.open()
		// A run cut short between create and wait re-attaches: make the
		// leftover look exited as Podman would show it.
		for _, c := range h.rt.ctrs {
			if c.Labels[LabelKind] == manifest.KindStep && c.State == "running" {
				c.State, c.Running = "exited", false
			}
		}
		if rep := h.apply(); rep.Error != "" {
			t.Fatalf("crash %d: did not converge: %s", n, rep.Error)
		}
		if runs != 1 {
			t.Fatalf("crash %d: the step ran %d times for one input", n, runs)
		}
		h.src["app"] = strings.ReplaceAll(crashTmpl, "{{c}}", "v2")
		h.apply()
		if runs != 2 {
			t.Fatalf("crash %d: the step ran %d times for two inputs", n, runs)
		}
		h.assign()
		if rep := h.apply(); rep.Error != "" {
			t.Fatalf("crash %d: unassign: %s", n, rep.Error)
		}
		if _, err := os.Stat(filepath.Join(h.dir, "app")); !os.IsNotExist(err) {
			t.Fatalf("crash %d: unassign left %s/app", n, h.dir)
		}
		if len(h.rt.ctrs) != 0 {
			t.Fatalf("crash %d: containers left: %v", n, h.rt.ctrs)
		}
	}
}

// lossyRT loses Podman for a few calls of Wait, as a service restart does.
type lossyRT struct {
	*fake
	lose int
}

func (l *lossyRT) Wait(ctx context.Context, id string) (int, error) {
	if l.lose > 0 {
		l.lose--
		return 0, errors.New("unexpected EOF")
	}
	return l.fake.Wait(ctx, id)
}

// Issue 8 item 11: Podman going away mid-step neither reruns the step nor
// says it timed out.
func TestPodmanLostMidStepReattaches(t *testing.T) {
	h := newHost(t)
	runs := 0
	h.rt.exit = func(s Spec) int { runs++; return 0 }
	h.src["app"] = strings.ReplaceAll(crashTmpl, "{{c}}", "v1")
	h.assign("app")
	h.r.rt = &lossyRT{fake: h.rt, lose: 2}
	rep := h.apply()
	if rep.Error != "" || outcome(rep, "app.init").Outcome != state.Ran || runs != 1 {
		t.Fatalf("runs %d, report %q %+v", runs, rep.Error, outcome(rep, "app.init"))
	}
	if strings.Count(strings.Join(h.rt.calls, "\n"), "create app.init") != 1 {
		t.Fatalf("calls: %v", h.rt.calls)
	}
}

// Issue 8 item 7: a kept directory is said once, until what is found changes.
func TestKeptIsLoggedOnce(t *testing.T) {
	h := newHost(t)
	h.src["tree"] = strings.ReplaceAll(treeTmpl, "{{c}}", "v1")
	h.assign("tree")
	h.apply()
	h.write("tree/data/user.db", "precious")
	h.assign()
	for i := 0; i < 3; i++ {
		rep := h.apply()
		if o := outcome(rep, h.dir+"/tree/data"); o.Outcome != state.Kept {
			t.Fatalf("pass %d: %+v", i, o)
		}
	}
	if n := strings.Count(h.logs.String(), "kept "+h.dir+"/tree/data "); n != 1 {
		t.Fatalf("kept logged %d times:\n%s", n, h.logs)
	}
	h.write("tree/data/other.db", "more")
	h.apply()
	if n := strings.Count(h.logs.String(), "kept "+h.dir+"/tree/data "); n != 2 {
		t.Fatalf("a change of what is kept was not logged (%d)", n)
	}
}

// Issue 8 item 9: the resolver is probed from Podman's network before the
// first container starts; a probe that fails keeps the container from
// starting, and a probe that passes is not repeated.
func TestResolverProbeGatesTheFirstStart(t *testing.T) {
	h := newHost(t)
	h.r.cfg.Probe = &ProbeConfig{Binary: "/usr/local/bin/mesh", Name: func(context.Context) string { return "ace.internal" }}
	h.r.cfg.ModuleNetworks = true
	answers := false
	probes := 0
	h.rt.exit = func(s Spec) int {
		if len(s.Entrypoint) > 0 && s.Entrypoint[0] == "/mesh-probe" {
			probes++
			if s.Labels[LabelProbe] != "1" || s.Labels[LabelManaged] != "" || s.Mounts[0].Source != "/usr/local/bin/mesh" || strings.Join(s.Command, " ") != "resolve --server 169.254.53.53 --timeout 3s ace.internal" || s.Network != "mesh-other" {
				t.Fatalf("probe spec %+v", s)
			}
			if answers {
				return 0
			}
			return 1
		}
		return 0
	}
	h.src["other"] = otherTmpl
	h.assign("other")
	rep := h.apply()
	if o := outcome(rep, "other.server"); o.Outcome != state.Failed || !strings.Contains(o.Reason, "does not answer from Podman's network") {
		t.Fatalf("%+v", o)
	}
	if h.rt.byName("other.server") != nil || h.rt.byName("mesh-probe-ace") != nil {
		t.Fatal("a container started with no resolver, or the probe was left")
	}
	answers = true
	if rep := h.apply(); rep.Error != "" || h.rt.byName("other.server") == nil {
		t.Fatalf("after the resolver answers: %q", rep.Error)
	}
	h.src["gone"] = goneTmpl
	h.assign("other", "gone")
	h.apply()
	if probes != 2 {
		t.Fatalf("%d probes, want 2 (one failed, one passed, none after)", probes)
	}
}

// A probe that an agent's end cut short is removed at the next agent's
// first apply, with no container to start: left on a module's network it
// would keep the network from going with its module.
func TestLeftoverProbeIsRemoved(t *testing.T) {
	h := newHost(t)
	h.rt.Create(context.Background(), Spec{Name: "mesh-probe-ace", Image: "localhost/busybox:1", Labels: map[string]string{LabelProbe: "1"}})
	h.apply()
	if h.rt.byName("mesh-probe-ace") != nil {
		t.Fatal("the probe an earlier run left is still there")
	}
	// Once per agent run: a container of that name made since is the
	// next probe's business, not every apply's.
	h.rt.Create(context.Background(), Spec{Name: "mesh-probe-ace", Image: "localhost/busybox:1", Labels: map[string]string{LabelProbe: "1"}})
	h.apply()
	if h.rt.byName("mesh-probe-ace") == nil {
		t.Fatal("every apply looks for a leftover probe")
	}
}

// A directory made under a strict umask reports "created", not a mode drift.
func TestCreatedDirectoryReportsNoDrift(t *testing.T) {
	old := syscall.Umask(0o077)
	defer syscall.Umask(old)
	h := newHost(t)
	h.src["other"] = otherTmpl
	h.assign("other")
	rep := h.apply()
	if o := outcome(rep, h.dir+"/other"); o.Outcome != state.Created || o.Reason != "" {
		t.Fatalf("%+v", o)
	}
	if fi, _ := os.Stat(filepath.Join(h.dir, "other")); fi.Mode().Perm() != 0o755 {
		t.Fatalf("mode %v", fi.Mode())
	}
}

// Hardening, item 11: a directory that was there before is not re-owned or
// re-moded in silence: without take-over its module fails, naming what is
// there and the two ways forward; taken over it changes, is reported, and
// gets its owner and mode back when the module lets go of it.
func TestExistingDirectoryIsNotTakenOverSilently(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Fatal("this test changes owners; run it as root (contrib/test.sh does)")
	}
	dir := t.TempDir()
	rt := newFake()
	r, err := New(Config{Node: "ace", DNS: netip.MustParseAddr("169.254.53.53"), LedgerPath: filepath.Join(dir, "ledger.json")}, rt)
	if err != nil {
		t.Fatal(err)
	}
	x := filepath.Join(dir, "x")
	if err := os.Mkdir(x, 0o700); err != nil {
		t.Fatal(err)
	}
	syscall.Chmod(x, 0o1777) // the operator's, open to all (sticky)
	in := state.Input{Domain: "internal", Nodes: []state.Node{{Name: "ace", Address: "10.0.0.1"}}, Assignments: []state.Assignment{{Node: "ace", Module: "m"}}}
	src := func(takeOver string) []string {
		return []string{"module: m\nresources:\n  - directory: " + x + "\n    owner: \"1234:1234\"\n    mode: \"0700\"\n" + takeOver}
	}
	mode := func() (uint32, uint32) {
		var st syscall.Stat_t
		syscall.Stat(x, &st)
		return st.Uid, st.Mode & 0o7777
	}
	rep := r.Apply(context.Background(), 1, composeAce(t, &in, src("")))
	o := outcome(rep, x)
	if o.Outcome != state.Failed || !strings.Contains(o.Reason, "the mesh did not make it") || !strings.Contains(o.Reason, "take-over: true") || !strings.Contains(o.Reason, `owner: "0:0", mode: "1777"`) {
		t.Fatalf("an existing directory declared otherwise: %+v", o)
	}
	if uid, m := mode(); uid != 0 || m != 0o1777 {
		t.Fatalf("changed without take-over: uid %d mode %o", uid, m)
	}
	rep = r.Apply(context.Background(), 2, composeAce(t, &in, src("    take-over: true\n")))
	if o := outcome(rep, x); o.Outcome != state.Updated || !strings.Contains(o.Reason, "taken over") || !strings.Contains(o.Reason, "0:0 1777") {
		t.Fatalf("taken over: %+v", o)
	}
	if uid, m := mode(); uid != 1234 || m != 0o700 {
		t.Fatalf("taken over: uid %d mode %o", uid, m)
	}
	in.Assignments = nil
	rep = r.Apply(context.Background(), 3, composeAce(t, &in, src("    take-over: true\n")))
	if o := outcome(rep, x); o.Outcome != state.Restored {
		t.Fatalf("let go: %+v", o)
	}
	if uid, m := mode(); uid != 0 || m != 0o1777 {
		t.Fatalf("let go: uid %d mode %o, want its own back", uid, m)
	}
	if _, err := os.Stat(x); err != nil {
		t.Fatal("a directory the mesh did not make was removed")
	}
}

// Hardening, item 3: a container that rewrites a declared file it mounts
// makes the mesh keep a copy of each edit before it writes the file again;
// those copies are bounded per file, and go when the module does.
func TestKeptCopiesAreBounded(t *testing.T) {
	b := newBed(t)
	b.apply()
	ini := filepath.Join(b.dir, "app/app.ini")
	kept := func() []string {
		m, _ := filepath.Glob(filepath.Join(b.dir, "kept", keptPrefix(ini)+"*"))
		return m
	}
	for i := 0; i < 8; i++ {
		os.WriteFile(ini, []byte(fmt.Sprintf("edited by the container, %d", i)), 0o640)
		b.apply()
	}
	if k := kept(); len(k) != MaxKeptPerPath {
		t.Fatalf("%d copies of app.ini's edits kept, want the newest %d: %v", len(k), MaxKeptPerPath, k)
	}
	if b, _ := os.ReadFile(kept()[0]); !strings.Contains(string(b), "edited by the container") {
		t.Fatalf("a kept copy holds %q", b)
	}
	b.in.Assignments = []state.Assignment{{Node: "ace", Module: "db"}}
	b.apply()
	if k := kept(); len(k) != 0 {
		t.Fatalf("the module went, and %d copies of its file's edits stayed", len(k))
	}
}
