package reconciler

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"mesh/internal/testutil"
	"mesh/state"
	"mesh/state/manifest"
)

// fake is a recording Runtime: containers in a map, every call logged.
type fake struct {
	ctrs  map[string]*Container
	specs map[string]Spec
	// mu guards ctrs, specs, calls and the images: removals, and modules
	// that share nothing, run concurrently.
	mu    sync.Mutex
	calls []string
	// removing, when set, is called at each Remove before anything else;
	// starting at each Start, with the container's name.
	starting func(name string)
	removing func()
	images   map[string]bool
	// imageIDs is the local image each ref names; registry what a pull of
	// it fetches (absent: the pull fails, as with no registry).
	imageIDs map[string]string
	registry map[string]string
	// volumes is what each image declares VOLUME.
	volumes map[string][]string
	seq     int
	// exit decides a step's exit code from its command.
	exit func(s Spec) int
	// logs is every container's last lines ("": the default line).
	logs string
	// health answers a container's health check (default: healthy).
	healthMu sync.Mutex
	health   func(name string) (HealthResult, error)
	deaths   chan death
	restarts int
	// removeErr, when set, fails every Remove (the container stays).
	removeErr error
	// nets is the runtime's networks by name (a container made on a
	// missing one fails, as with Podman).
	nets map[string]Network
}

var _ Runtime = (*fake)(nil)

func newFake() *fake {
	return &fake{ctrs: map[string]*Container{}, specs: map[string]Spec{}, images: map[string]bool{"localhost/busybox:1": true}, deaths: make(chan death)}
}

func (f *fake) Managed(ctx context.Context) ([]Container, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	var out []Container
	for _, c := range f.ctrs {
		if c.Labels[LabelManaged] == "1" {
			out = append(out, *c)
		}
	}
	return out, nil
}
func (f *fake) Lookup(ctx context.Context, name string) (Container, bool, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	for _, c := range f.ctrs {
		if c.Name == name {
			return *c, true, nil
		}
	}
	return Container{}, false, nil
}
func (f *fake) ImageExists(ctx context.Context, ref string) (bool, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.images[ref], nil
}
func (f *fake) ImageVolumes(ctx context.Context, ref string) ([]string, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.volumes[ref], nil
}
func (f *fake) Pull(ctx context.Context, ref, policy string) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.calls = append(f.calls, "pull "+ref)
	id, ok := f.registry[ref]
	if !ok {
		return fmt.Errorf("pull %s: no registry here", ref)
	}
	f.images[ref] = true
	if f.imageIDs == nil {
		f.imageIDs = map[string]string{}
	}
	f.imageIDs[ref] = id
	return nil
}
func (f *fake) ImageID(ctx context.Context, ref string) (string, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.imageID(ref), nil
}
func (f *fake) Tag(ctx context.Context, id, ref string) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.calls = append(f.calls, "tag "+ref)
	if f.imageIDs == nil {
		f.imageIDs = map[string]string{}
	}
	f.imageIDs[ref] = id
	return nil
}
func (f *fake) imageID(ref string) string {
	if id, ok := f.imageIDs[ref]; ok {
		return id
	}
	return "sha256:local-" + ref
}
func (f *fake) Create(ctx context.Context, s Spec) (string, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if _, ok := f.nets[s.Network]; s.Network != "" && !ok {
		return "", fmt.Errorf("unable to find network with name or ID %s: network not found", s.Network)
	}
	f.seq++
	id := fmt.Sprintf("id%d", f.seq)
	f.calls = append(f.calls, "create "+s.Name)
	img := f.imageID(s.Image)
	f.ctrs[id] = &Container{ID: id, Name: s.Name, Labels: s.Labels, State: "created", ImageID: img}
	f.specs[id] = s
	return id, nil
}
func (f *fake) Networks(ctx context.Context) ([]Network, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	var out []Network
	for _, n := range f.nets {
		out = append(out, n)
	}
	return out, nil
}
func (f *fake) CreateNetwork(ctx context.Context, n Network) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if _, ok := f.nets[n.Name]; ok {
		return fmt.Errorf("network name %s already used: network already exists", n.Name)
	}
	if f.nets == nil {
		f.nets = map[string]Network{}
	}
	f.calls = append(f.calls, "network create "+n.Name)
	f.nets[n.Name] = n
	return nil
}
func (f *fake) RemoveNetwork(ctx context.Context, name string) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	for id, c := range f.ctrs {
		if f.specs[id].Network == name {
			return fmt.Errorf("%q has associated containers with it (%s)", name, c.Name)
		}
	}
	f.calls = append(f.calls, "network rm "+name)
	delete(f.nets, name)
	return nil
}
func (f *fake) Restart(ctx context.Context, id string) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.calls = append(f.calls, "restart "+f.ctrs[id].Name)
	f.ctrs[id].Running, f.ctrs[id].State = true, "running"
	return nil
}

func (f *fake) Start(ctx context.Context, id string) error {
	if f.starting != nil {
		f.mu.Lock()
		name := f.ctrs[id].Name
		f.mu.Unlock()
		f.starting(name)
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	f.calls = append(f.calls, "start "+f.ctrs[id].Name)
	f.ctrs[id].Running, f.ctrs[id].State = true, "running"
	return nil
}
func (f *fake) Remove(ctx context.Context, id string) error {
	if f.removing != nil {
		f.removing()
	}
	if f.removeErr != nil {
		return f.removeErr
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if c, ok := f.ctrs[id]; ok {
		f.calls = append(f.calls, "remove "+c.Name)
	}
	delete(f.ctrs, id)
	return nil
}
func (f *fake) Wait(ctx context.Context, id string) (int, error) {
	if f.exit != nil {
		f.mu.Lock()
		s := f.specs[id]
		f.mu.Unlock()
		return f.exit(s), nil
	}
	return 0, nil
}
func (f *fake) Logs(ctx context.Context, id string, n int) (string, error) {
	if f.logs != "" {
		return f.logs, nil
	}
	return "migrate: cannot reach db", nil
}

func (f *fake) HealthCheck(ctx context.Context, name string) (HealthResult, error) {
	f.healthMu.Lock()
	h := f.health
	f.healthMu.Unlock()
	if h == nil {
		return HealthResult{Status: "healthy"}, nil
	}
	return h(name)
}

func (f *fake) Died(ctx context.Context, died func(id, name string, code int)) error {
	for {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case e := <-f.deaths:
			died(e.id, e.name, e.code)
		}
	}
}

func (f *fake) Restarts(ctx context.Context, name string) (string, int, error) {
	f.healthMu.Lock()
	defer f.healthMu.Unlock()
	for _, c := range f.ctrs {
		if c.Name == name {
			return c.ID, f.restarts, nil
		}
	}
	return "", 0, fmt.Errorf("no container %s", name)
}

type death struct {
	id, name string
	code     int
}

func (f *fake) setHealth(h func(name string) (HealthResult, error)) {
	f.healthMu.Lock()
	f.health = h
	f.healthMu.Unlock()
}

func (f *fake) byName(name string) *Container {
	for _, c := range f.ctrs {
		if c.Name == name {
			return c
		}
	}
	return nil
}

const appTmpl = `module: app
resources:
  - directory: {{d}}/app
    owner: "1000:1000"
    mode: "0750"
  - directory: {{d}}/app/data
    owner: "1000:1000"
    mode: "0750"{{data}}
  - file: {{d}}/app/app.ini
    mode: "0640"
    content: "{{content}}"
  - binding: {{d}}/app/db.binding
    provider: db{{gate}}
  - credential: {{d}}/app/db.password
    provider: db
  - step: migrate
    image: localhost/busybox:1
    command: ["{{stepcmd}}"]
    mounts: ["{{d}}/app/data:/data"]
    restart-on: [{{d}}/app/db.binding]
  - container: app.server
    image: localhost/busybox:1
    mounts: ["{{d}}/app/data:/data", "{{d}}/app/app.ini:/etc/app.ini:ro"]
    restart-on: [{{d}}/app/app.ini, migrate]
  - container: app.sidecar
    image: localhost/busybox:1
`

const dbTmpl = `module: db
accepts-credentials: {{d}}/db/creds
resources:
  - directory: {{d}}/db
  - directory: {{d}}/db/creds
    mode: "0700"
`

type bed struct {
	t      *testing.T
	dir    string
	rt     *fake
	r      *Reconciler
	in     state.Input
	vars   map[string]string
	secret string
}

func newBed(t *testing.T) *bed {
	b := &bed{t: t, dir: t.TempDir(), rt: newFake(), secret: "s3cret",
		vars: map[string]string{"content": "x = 1", "stepcmd": "true", "gate": "", "data": ""}}
	r, err := New(Config{
		Node: "ace", DNS: netip.MustParseAddr("169.254.53.53"), LedgerPath: filepath.Join(b.dir, "ledger.json"),
		Secret: func(ctx context.Context, p state.Pair) (string, error) { return b.secret, nil },
	}, b.rt)
	if err != nil {
		t.Fatal(err)
	}
	b.r = r
	b.in = state.Input{Domain: "internal",
		Nodes:       []state.Node{{Name: "ace", Address: "10.0.0.1"}, {Name: "novox", Address: "10.0.0.2"}},
		Assignments: []state.Assignment{{Node: "ace", Module: "app"}, {Node: "ace", Module: "db"}},
		Credentials: map[state.Pair]string{{Consumer: "app", Provider: "db"}: state.SecretDigest("s3cret")},
	}
	return b
}

func (b *bed) plan() *state.Plan {
	b.t.Helper()
	var srcs []string
	for _, src := range []string{appTmpl, dbTmpl} {
		s := strings.ReplaceAll(src, "{{d}}", b.dir)
		for k, v := range b.vars {
			s = strings.ReplaceAll(s, "{{"+k+"}}", v)
		}
		srcs = append(srcs, s)
	}
	return composeAce(b.t, &b.in, srcs)
}

func (b *bed) apply() state.Report {
	b.t.Helper()
	b.rt.calls = nil
	return b.r.Apply(context.Background(), 1, b.plan())
}

func outcome(rep state.Report, name string) state.ResourceReport {
	for _, r := range rep.Resources {
		if r.Name == name || strings.HasSuffix(r.Name, name) {
			return r
		}
	}
	return state.ResourceReport{}
}

func TestApplyThenNothingChanges(t *testing.T) {
	b := newBed(t)
	rep := b.apply()
	if rep.Error != "" {
		t.Fatal(rep.Error)
	}
	for _, n := range []string{"/app", "/app/data", "/app/app.ini", "app.server", "app.sidecar"} {
		if o := outcome(rep, n).Outcome; o != state.Created {
			t.Errorf("%s: %s, want created", n, o)
		}
	}
	if o := outcome(rep, "app.migrate").Outcome; o != state.Ran {
		t.Errorf("step: %s", o)
	}
	fi, _ := os.Stat(filepath.Join(b.dir, "app/data"))
	if fi.Mode().Perm() != 0o750 || fi.Sys() == nil {
		t.Errorf("data dir mode %v", fi.Mode())
	}
	pw, _ := os.ReadFile(filepath.Join(b.dir, "app/db.password"))
	fi, _ = os.Stat(filepath.Join(b.dir, "app/db.password"))
	if string(pw) != "s3cret\n" || fi.Mode().Perm() != 0o600 {
		t.Errorf("credential %q mode %v", pw, fi.Mode())
	}
	delivered, _ := os.ReadFile(filepath.Join(b.dir, "db/creds/app.credential"))
	if string(delivered) != "name=app\nsecret=s3cret\n" {
		t.Errorf("delivered credential %q", delivered)
	}
	binding, _ := os.ReadFile(filepath.Join(b.dir, "app/db.binding"))
	if string(binding) != "provider=db\nname=db.internal\nnode=ace\naddress=10.0.0.1\n" {
		t.Errorf("binding %q", binding)
	}
	srv := b.rt.byName("app.server")
	spec := b.rt.specs[srv.ID]
	if spec.DNS.String() != "169.254.53.53" || len(spec.Mounts) != 2 || spec.Mounts[1].Options[0] != "ro" {
		t.Errorf("spec %+v", spec)
	}
	if strings.Contains(fmt.Sprint(spec), "10.0.0.") {
		t.Errorf("roster copied into the container: %+v", spec)
	}
	id := srv.ID

	rep = b.apply()
	if rep.Mutations != 0 || len(b.rt.calls) != 0 || rep.Error != "" {
		t.Fatalf("second apply: %d mutations, calls %v, error %q", rep.Mutations, b.rt.calls, rep.Error)
	}
	if b.rt.byName("app.server").ID != id {
		t.Fatal("container replaced on a no-op apply")
	}
}

// A credential's file, and a delivered one, that a container rewrote is
// put back, its bytes never copied aside (they may hold the secret).
func TestCredentialFilesAreNeverCopiedAside(t *testing.T) {
	b := newBed(t)
	b.apply()
	for file, want := range map[string]string{"app/db.password": "s3cret\n", "db/creds/app.credential": "name=app\nsecret=s3cret\n"} {
		p := filepath.Join(b.dir, file)
		if err := os.WriteFile(p, []byte("s3cret and more"), 0o600); err != nil {
			t.Fatal(err)
		}
		rep := b.apply()
		if got, _ := os.ReadFile(p); string(got) != want || !strings.Contains(outcome(rep, p).Reason, "never copied aside") {
			t.Fatalf("%s after a container rewrote it: %q %+v", file, got, outcome(rep, p))
		}
		if kept, _ := os.ReadDir(b.r.keptDir()); len(kept) != 0 {
			t.Fatalf("a copy of %s was kept: %v", file, kept)
		}
	}
}

// A declared file a container hard-linked to a name of its own is written
// anew, not chowned and chmoded in place: the owner and mode the manifest
// gives it (a setuid bit, a root owner) never reach the container's name.
func TestHardLinkedFileIsWrittenAnew(t *testing.T) {
	b := newBed(t)
	b.apply()
	ini, other := filepath.Join(b.dir, "app/app.ini"), filepath.Join(b.dir, "app/mine")
	if err := os.Link(ini, other); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(other, 0o777); err != nil { // the file drifts: the mesh would fix its mode
		t.Fatal(err)
	}
	rep := b.apply()
	if o := outcome(rep, ini); !strings.Contains(o.Reason, "written anew") {
		t.Fatalf("a hard-linked file: %+v", o)
	}
	fi, _ := os.Stat(ini)
	fo, _ := os.Stat(other)
	if fi.Mode().Perm() != 0o640 || fo.Mode().Perm() != 0o777 || os.SameFile(fi, fo) {
		t.Fatalf("after the apply: %s %v, the container's name %v (same file: %v)", ini, fi.Mode(), fo.Mode(), os.SameFile(fi, fo))
	}
}

func TestFileChangeReplacesOnlyItsReader(t *testing.T) {
	b := newBed(t)
	b.apply()
	side := b.rt.byName("app.sidecar").ID
	b.vars["content"] = "x = 2"
	rep := b.apply()
	o := outcome(rep, "app.server")
	if o.Outcome != state.Replaced || o.Reason != "restart-on: "+filepath.Join(b.dir, "app/app.ini")+" changed" {
		t.Fatalf("server: %+v", o)
	}
	if b.rt.byName("app.sidecar").ID != side {
		t.Fatal("sidecar replaced")
	}
	if o := outcome(rep, "app.migrate"); o.Outcome != state.Unchanged {
		t.Fatalf("step reran: %+v", o)
	}
}

// A module held stopped (a move's, a failed restore's: in the plan without
// its containers and steps) keeps the runs of its steps: forgotten, they
// ran again where it started next. One that leaves the node forgets them.
func TestHeldModuleKeepsItsStepRuns(t *testing.T) {
	b := newBed(t)
	if o := outcome(b.apply(), "app.migrate"); o.Outcome != state.Ran {
		t.Fatalf("step: %+v", o)
	}
	b.in.Stopped = map[state.HeldKey]string{{Node: "ace", Module: "app"}: state.MoveCopy}
	b.apply()
	if len(b.r.MarkersOf("app")) == 0 {
		t.Fatal("the step's run was forgotten while its module was held stopped")
	}
	b.in.Stopped = nil
	if o := outcome(b.apply(), "app.migrate"); o.Outcome != state.Unchanged {
		t.Fatalf("the step once its module starts again: %+v", o)
	}
	b.in.Assignments = []state.Assignment{{Node: "ace", Module: "db"}}
	b.apply()
	if m := b.r.MarkersOf("app"); len(m) != 0 {
		t.Fatalf("the runs of a module gone from the node are kept: %v", m)
	}
}

// The markers a move brings to its TO are kept while the module is not in
// the node's plan yet: an apply between the copy and the start (the
// resync, another module's change, a start the leader takes late) forgot
// them, and the steps ran again on the data they had run on (a review).
// They go once the move can no longer start.
func TestArrivingModuleKeepsItsStepRuns(t *testing.T) {
	b := newBed(t)
	if o := outcome(b.apply(), "app.migrate"); o.Outcome != state.Ran {
		t.Fatalf("step: %+v", o)
	}
	markers := b.r.MarkersOf("app")
	both := b.in.Assignments
	b.in.Assignments = []state.Assignment{{Node: "ace", Module: "db"}}
	b.apply()
	if m := b.r.MarkersOf("app"); len(m) != 0 {
		t.Fatalf("the runs of a module gone from the node are kept: %v", m)
	}

	now := time.Now()
	if err := b.r.Adopt("app", Arrival{Move: 9, Until: now.Add(time.Hour)}, markers, nil, nil, nil); err != nil {
		t.Fatal(err)
	}
	b.apply() // before the start: the plan holds nothing of app
	if m := b.r.MarkersOf("app"); len(m) != len(markers) {
		t.Fatalf("an apply before the move's start forgot its markers: %v, adopted %v", m, markers)
	}
	reloaded, err := LoadLedger(b.r.ledger.path)
	if err != nil {
		t.Fatal(err)
	}
	if _, ok := reloaded.Arriving["app"]; !ok || len(reloaded.Markers) == 0 {
		t.Fatalf("the ledger on disk (a kill -9 now) does not keep them: %+v", reloaded)
	}
	b.in.Assignments = both // the start
	if o := outcome(b.apply(), "app.migrate"); o.Outcome != state.Unchanged {
		t.Fatalf("the moved module's step once it starts: %+v", o)
	}
	if _, ok := b.r.ledger.Arriving["app"]; ok {
		t.Fatal("the module started and is still arriving")
	}

	// A move that never starts (aborted): kept until its time is up.
	b.in.Assignments = []state.Assignment{{Node: "ace", Module: "db"}}
	if err := b.r.Adopt("app", Arrival{Move: 9, Until: now.Add(time.Hour)}, markers, nil, nil, nil); err != nil {
		t.Fatal(err)
	}
	b.apply()
	if len(b.r.MarkersOf("app")) == 0 {
		t.Fatal("forgotten before the time is up")
	}
	b.r.cfg.Now = func() time.Time { return now.Add(2 * time.Hour) }
	b.apply()
	if m := b.r.MarkersOf("app"); len(m) != 0 || len(b.r.ledger.Arriving) != 0 {
		t.Fatalf("the markers of a move that can no longer start are kept: %v, %v", m, b.r.ledger.Arriving)
	}
}

func TestBindingChangeRerunsStepThenRecreatesServer(t *testing.T) {
	b := newBed(t)
	b.apply()
	// The provider moves: the binding's content changes.
	b.in.Assignments = []state.Assignment{{Node: "ace", Module: "app"}, {Node: "ace", Module: "db"}, {Node: "novox", Module: "db"}}
	b.in.Nodes[0].Address = "10.0.0.9"
	rep := b.apply()
	step := outcome(rep, "app.migrate")
	if step.Outcome != state.Ran || step.Reason != "restart-on: "+filepath.Join(b.dir, "app/db.binding")+" changed" {
		t.Fatalf("step: %+v", step)
	}
	srv := outcome(rep, "app.server")
	if srv.Outcome != state.Replaced || !strings.HasPrefix(srv.Reason, "step migrate ran") {
		t.Fatalf("server: %+v", srv)
	}
	// The step ran before the server was recreated, in this one apply.
	var order []string
	for _, c := range b.rt.calls {
		if strings.HasPrefix(c, "create") {
			order = append(order, c)
		}
	}
	if strings.Join(order, ",") != "create app.migrate,create app.server" {
		t.Fatalf("order %v", order)
	}
	if rep := b.apply(); rep.Mutations != 0 {
		t.Fatalf("third apply made %d mutations: %v", rep.Mutations, b.rt.calls)
	}
}

// failStep makes the bed's step fail (exit 1) until its command changes.
func (b *bed) failStep() {
	b.vars["stepcmd"] = "fail"
	b.rt.exit = func(s Spec) int {
		if len(s.Command) > 0 && s.Command[0] == "fail" {
			return 1
		}
		return 0
	}
}

// A step that prints a secret of its module (here the credential the
// mesh gave it) as it fails: the report, which every node keeps, says
// [secret] in its place.
func TestFailedStepsSecretIsNotReported(t *testing.T) {
	b := newBed(t)
	b.failStep()
	b.rt.logs = "connecting to postgres://app:s3cret@db/app\nfailed"
	rep := b.apply()
	if strings.Contains(rep.Error, "s3cret") || !strings.Contains(rep.Error, "postgres://app:[secret]@db/app") {
		t.Fatalf("error %q", rep.Error)
	}
	if o := outcome(rep, "app.migrate"); strings.Contains(o.Reason, "s3cret") {
		t.Fatalf("the step's report: %+v", o)
	}
}

func TestFailedStepStopsTheApply(t *testing.T) {
	b := newBed(t)
	b.failStep()
	rep := b.apply()
	if !strings.Contains(rep.Error, "exited with code 1; last lines:\nmigrate: cannot reach db") {
		t.Fatalf("error %q", rep.Error)
	}
	if b.rt.byName("app.server") != nil || b.rt.byName("app.migrate") != nil {
		t.Fatal("something after the failed step was created, or the step container was left")
	}
	b.vars["stepcmd"] = "true"
	rep = b.apply()
	if rep.Error != "" || b.rt.byName("app.server") == nil {
		t.Fatalf("fixed manifest did not converge: %q", rep.Error)
	}
}

func TestUnassignKeepsForeignData(t *testing.T) {
	b := newBed(t)
	b.apply()
	os.WriteFile(filepath.Join(b.dir, "app/data/user.db"), []byte("precious"), 0o600)
	b.in.Assignments = []state.Assignment{{Node: "ace", Module: "db"}}
	rep := b.apply()
	kept := outcome(rep, b.dir+"/app/data")
	if kept.Outcome != state.Kept || !strings.Contains(kept.Reason, "holds 1 entry the mesh did not put there (user.db)") {
		t.Fatalf("data dir: %+v", kept)
	}
	if o := outcome(rep, b.dir+"/app/app.ini"); o.Outcome != state.Removed {
		t.Fatalf("app.ini: %+v", o)
	}
	if _, err := os.Stat(filepath.Join(b.dir, "app/data/user.db")); err != nil {
		t.Fatal("foreign data lost")
	}
	if b.rt.byName("app.server") != nil {
		t.Fatal("container of the unassigned module kept")
	}
	// Without foreign data it all goes.
	os.Remove(filepath.Join(b.dir, "app/data/user.db"))
	b.apply()
	if _, err := os.Stat(filepath.Join(b.dir, "app")); !os.IsNotExist(err) {
		t.Fatalf("app dir still there: %v", err)
	}
}

// Issue 30: a directory declared as data is never removed when its module
// goes, even empty, and stays the module's in the ledger; the module's other
// directories go as before, and it is the module's again when it comes back.
func TestUnassignKeepsDataDirectories(t *testing.T) {
	b := newBed(t)
	b.vars["data"] = "\n    data: true"
	b.apply()
	b.in.Assignments = []state.Assignment{{Node: "ace", Module: "db"}}
	for range 2 {
		rep := b.apply()
		if kept := outcome(rep, b.dir+"/app/data"); kept.Outcome != state.Kept && kept.Outcome != "" || kept.Outcome == state.Kept && !strings.Contains(kept.Reason, "a data directory of app: the mesh never removes one; mesh unassign NODE app --purge-data removes it") {
			t.Fatalf("data dir: %+v", kept)
		}
		if st, err := os.Stat(filepath.Join(b.dir, "app/data")); err != nil || !st.IsDir() {
			t.Fatalf("the empty data directory went: %v", err)
		}
	}
	if o := outcome(b.apply(), b.dir+"/app/app.ini"); o.Outcome == state.Removed {
		t.Fatalf("app.ini removed twice: %+v", o)
	}
	if _, err := os.Stat(filepath.Join(b.dir, "app/app.ini")); !os.IsNotExist(err) {
		t.Fatalf("app.ini, not data, is still there: %v", err)
	}
	if e := b.r.ledger.Paths[b.dir+"/app/data"]; !e.Data || e.Module != "app" {
		t.Fatalf("the ledger forgot the data directory: %+v", e)
	}
	b.in.Assignments = []state.Assignment{{Node: "ace", Module: "app"}, {Node: "ace", Module: "db"}}
	rep := b.apply()
	if o := outcome(rep, b.dir+"/app/data"); o.Outcome != state.Unchanged {
		t.Fatalf("the data directory when app comes back: %+v", o)
	}
	// Declared no longer as data, it goes as any directory the mesh made.
	b.vars["data"] = ""
	b.apply()
	b.in.Assignments = []state.Assignment{{Node: "ace", Module: "db"}}
	b.apply()
	if _, err := os.Stat(filepath.Join(b.dir, "app")); !os.IsNotExist(err) {
		t.Fatalf("app dir still there: %v", err)
	}
}

// mesh unassign --purge-data: the data directory goes with all it holds,
// once the module's containers are gone, following no link (a link to a
// file outside is removed, the file kept); a directory the mesh did not
// make is named and kept; assigned again, nothing is purged.
func TestPurgeData(t *testing.T) {
	b := newBed(t)
	b.vars["data"] = "\n    data: true"
	b.apply()
	data := filepath.Join(b.dir, "app/data")
	outside := filepath.Join(t.TempDir(), "shadow")
	os.WriteFile(outside, []byte("keep me"), 0o600)
	os.MkdirAll(filepath.Join(data, "a/b/c"), 0o755)
	os.WriteFile(filepath.Join(data, "a/b/c/f"), []byte("x"), 0o600)
	os.Symlink(outside, filepath.Join(data, "link"))
	os.Symlink(filepath.Dir(outside), filepath.Join(data, "a/dirlink"))
	foreign := filepath.Join(b.dir, "foreign")
	os.Mkdir(foreign, 0o755)
	b.in.Assignments = []state.Assignment{{Node: "ace", Module: "db"}}
	b.in.Purges = map[string][]state.Purge{"ace": {{Module: "app", Path: data}, {Module: "app", Path: foreign}}}
	rep := b.apply()
	if o := outcome(rep, data); o.Outcome != state.Removed || !strings.Contains(o.Reason, "purged with its 6 entries") {
		t.Fatalf("the purged data directory: %+v", o)
	}
	if _, err := os.Lstat(data); !os.IsNotExist(err) {
		t.Fatalf("the data directory is still there: %v", err)
	}
	if b, err := os.ReadFile(outside); err != nil || string(b) != "keep me" {
		t.Fatalf("a link was followed: %q %v", b, err)
	}
	if o := outcome(rep, foreign); o.Outcome != state.Kept || !strings.Contains(o.Reason, "the mesh did not make it") {
		t.Fatalf("a directory the mesh did not make: %+v", o)
	}
	if _, err := os.Stat(foreign); err != nil {
		t.Fatal(err)
	}
	if _, ok := b.r.ledger.Paths[data]; ok {
		t.Fatal("the ledger still holds the purged directory")
	}
	// Assigned again (the FSM drops the purge then; the plan must hold
	// none), its data directory is made again and left alone.
	b.in.Purges = nil
	b.in.Assignments = []state.Assignment{{Node: "ace", Module: "app"}, {Node: "ace", Module: "db"}}
	b.apply()
	os.WriteFile(filepath.Join(data, "new"), []byte("y"), 0o600)
	b.in.Purges = map[string][]state.Purge{"ace": {{Module: "app", Path: data}}}
	if plan := b.plan(); len(plan.Purge) != 0 {
		t.Fatalf("a plan purges the data of a module it runs: %+v", plan.Purge)
	}
	b.apply()
	if _, err := os.Stat(filepath.Join(data, "new")); err != nil {
		t.Fatalf("the data of a module that runs was purged: %v", err)
	}
}

// A purge never removes what stays under the data directory: another
// module's data directory (kept when that module was unassigned without
// --purge-data) or a directory taken over; the purge waits, said, and
// goes on once that is moved out.
func TestPurgeKeepsOthersUnder(t *testing.T) {
	b := newBed(t)
	b.vars["data"] = "\n    data: true"
	b.apply()
	data := filepath.Join(b.dir, "app/data")
	for _, other := range []PathEntry{
		{Kind: manifest.KindDirectory, Module: "mail", Data: true},
		{Kind: manifest.KindDirectory, Module: "app", Data: true, Original: &Original{UID: 0, GID: 0, Mode: 0o755}},
	} {
		inner := filepath.Join(data, "inner")
		if err := os.MkdirAll(inner, 0o700); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(inner, "mailbox"), []byte("keep me"), 0o600); err != nil {
			t.Fatal(err)
		}
		b.r.ledger.Paths[inner] = other
		b.in.Assignments = []state.Assignment{{Node: "ace", Module: "db"}}
		b.in.Purges = map[string][]state.Purge{"ace": {{Module: "app", Path: data}}}
		rep := b.apply()
		if o := outcome(rep, data); o.Outcome != state.Kept || !strings.Contains(o.Reason, "it holds "+inner) {
			t.Fatalf("a purge around %+v: %+v", other, o)
		}
		if got, err := os.ReadFile(filepath.Join(inner, "mailbox")); err != nil || string(got) != "keep me" {
			t.Fatalf("what stays under the purged directory (%+v) went: %q %v", other, got, err)
		}
		// Moved out (here: the ledger lets go of it), the purge goes on.
		delete(b.r.ledger.Paths, inner)
		rep = b.apply()
		if o := outcome(rep, data); o.Outcome != state.Removed {
			t.Fatalf("once nothing stays under it: %+v", o)
		}
		b.in.Purges = nil
		b.in.Assignments = []state.Assignment{{Node: "ace", Module: "app"}, {Node: "ace", Module: "db"}}
		b.apply()
	}
}

// A purge does not cross a mount inside the data directory, a bind mount
// of the same file system included (it emptied the bind's source).
func TestPurgeDoesNotEnterABindMount(t *testing.T) {
	media, data := testutil.BindInside(t)
	_, err := purgeDir(data)
	if err == nil || !strings.Contains(err.Error(), "is a mount point") {
		t.Fatalf("a purge around a bind mount: %v", err)
	}
	if got, err := os.ReadFile(filepath.Join(media, "photo")); err != nil || string(got) != "keep me" {
		t.Fatalf("the bind's source was emptied: %q %v", got, err)
	}
}

// A container that does not go keeps its module's data, purge or not.
func TestPurgeWaitsForTheContainers(t *testing.T) {
	b := newBed(t)
	b.vars["data"] = "\n    data: true"
	b.apply()
	data := filepath.Join(b.dir, "app/data")
	os.WriteFile(filepath.Join(data, "db"), []byte("x"), 0o600)
	b.rt.removeErr = errors.New("podman is down")
	b.in.Assignments = []state.Assignment{{Node: "ace", Module: "db"}}
	b.in.Purges = map[string][]state.Purge{"ace": {{Module: "app", Path: data}}}
	b.apply()
	if _, err := os.Stat(filepath.Join(data, "db")); err != nil {
		t.Fatalf("purged while its container runs: %v", err)
	}
	b.rt.removeErr = nil
	b.apply()
	if _, err := os.Lstat(data); !os.IsNotExist(err) {
		t.Fatalf("not purged once the containers went: %v", err)
	}
}

// Containers no longer wanted are removed concurrently (each may take its
// stop timeout), and reported in name order all the same.
func TestRemovalsRunConcurrently(t *testing.T) {
	b := newBed(t)
	b.apply()
	gate, peak := overlapGate()
	b.rt.removing = gate
	b.in.Assignments = nil
	rep := b.apply()
	var removed []string
	for _, r := range rep.Resources {
		if (r.Kind == manifest.KindContainer || r.Kind == manifest.KindStep) && r.Outcome == state.Removed {
			removed = append(removed, r.Name)
		}
	}
	if len(removed) < 2 || !sort.StringsAreSorted(removed) {
		t.Fatalf("removed containers %v: want two or more, in name order", removed)
	}
	if peak() < 2 {
		t.Fatalf("at most %d removal at once", peak())
	}
	if left, _ := b.rt.Managed(context.Background()); len(left) != 0 {
		t.Fatalf("containers left: %v", left)
	}
}

func TestSymlinksAreNeverFollowed(t *testing.T) {
	b := newBed(t)
	b.apply()
	outside := t.TempDir()
	os.WriteFile(filepath.Join(outside, "passwd"), []byte("root"), 0o644)
	os.Chmod(outside, 0o755)
	// A link planted inside a declared directory, and a declared path replaced by a link.
	os.Symlink(outside, filepath.Join(b.dir, "app/data/etc"))
	os.Remove(filepath.Join(b.dir, "app/app.ini"))
	os.Symlink(filepath.Join(outside, "passwd"), filepath.Join(b.dir, "app/app.ini"))
	rep := b.apply()
	if o := outcome(rep, b.dir+"/app/app.ini"); o.Outcome != state.Failed || !strings.Contains(o.Reason, "symbolic link") {
		t.Fatalf("app.ini: %+v", o)
	}
	b.in.Assignments = []state.Assignment{{Node: "ace", Module: "db"}}
	b.apply()
	fi, _ := os.Stat(outside)
	if b, _ := os.ReadFile(filepath.Join(outside, "passwd")); string(b) != "root" || fi.Mode().Perm() != 0o755 {
		t.Fatal("something outside was changed")
	}
}

func TestDecideContainer(t *testing.T) {
	want := desired{Name: "a.web", Decl: `{"image":"b:2"}`, Digest: "new", Inputs: map[string]string{"/f": "2"}, RestartOn: []string{"/f", "init"}}
	mk := func(digest, decl, inputs string, running bool) *Container {
		return &Container{Name: "a.web", Running: running, State: map[bool]string{true: "running", false: "exited"}[running],
			Labels: map[string]string{LabelManaged: "1", LabelDigest: digest, LabelDecl: decl, LabelInputs: inputs}}
	}
	for _, tc := range []struct {
		name   string
		have   *Container
		ran    map[string]bool
		action string
		reason string
	}{
		{"none", nil, nil, actCreate, ""},
		{"same", mk("new", `{"image":"b:2"}`, `{"/f":"2"}`, true), nil, actKeep, ""},
		{"stopped", mk("new", `{"image":"b:2"}`, `{"/f":"2"}`, false), nil, actStart, "it was exited"},
		{"image", mk("old", `{"image":"b:1"}`, `{"/f":"2"}`, true), nil, actReplace, "image changed"},
		{"input", mk("old", `{"image":"b:2"}`, `{"/f":"1"}`, true), nil, actReplace, "restart-on: /f changed"},
		{"step ran", mk("new", `{"image":"b:2"}`, `{"/f":"2"}`, true), map[string]bool{"init": true}, actReplace, "step init ran"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			a, r, err := decideContainer(want, tc.have, tc.ran)
			if err != nil || a != tc.action || r != tc.reason {
				t.Fatalf("got %s %q %v, want %s %q", a, r, err, tc.action, tc.reason)
			}
		})
	}
	_, _, err := decideContainer(want, &Container{Name: "a.web"}, nil)
	if err == nil || !strings.Contains(err.Error(), "is not the mesh's") {
		t.Fatalf("unmanaged: %v", err)
	}
}

func TestDriftIsCorrectedAndEditedFilesKept(t *testing.T) {
	b := newBed(t)
	b.apply()
	os.Chmod(filepath.Join(b.dir, "app/data"), 0o777)
	os.Chown(filepath.Join(b.dir, "app/data"), 0, 0)
	rep := b.apply()
	o := outcome(rep, b.dir+"/app/data")
	if o.Outcome != state.Updated || o.Reason != "owner 0:0 -> 1000:1000, mode 0777 -> 0750" {
		t.Fatalf("drift: %+v", o)
	}
	// A file someone edited is no longer what the mesh wrote: when the module
	// goes away it is kept, and so is the directory holding it.
	os.WriteFile(filepath.Join(b.dir, "app/app.ini"), []byte("edited by hand"), 0o640)
	b.in.Assignments = []state.Assignment{{Node: "ace", Module: "db"}}
	rep = b.apply()
	if o := outcome(rep, b.dir+"/app/app.ini"); o.Outcome != state.Kept || !strings.Contains(o.Reason, "content changed since the mesh wrote it") {
		t.Fatalf("edited file: %+v", o)
	}
	if got, _ := os.ReadFile(filepath.Join(b.dir, "app/app.ini")); string(got) != "edited by hand" {
		t.Fatal("edited file lost")
	}
}

// Issue 12 item 10: mesh module pull makes each container of the module
// pull its image once; a container is replaced only when the image it runs
// is not the one its name now gives, with that reason; a failed pull fails
// the container and is tried again.
func TestModulePullReplacesOnlyWhatChanged(t *testing.T) {
	b := newBed(t)
	b.apply()
	srv, side := b.rt.byName("app.server").ID, b.rt.byName("app.sidecar").ID
	pulls := func() int {
		n := 0
		for _, c := range b.rt.calls {
			if strings.HasPrefix(c, "pull ") {
				n++
			}
		}
		return n
	}

	// The registry has the same image: pulled, nothing replaced.
	b.rt.registry = map[string]string{"localhost/busybox:1": "sha256:local-localhost/busybox:1"}
	b.in.Pulls = map[string]uint64{"app": 5}
	rep := b.apply()
	if pulls() != 2 || outcome(rep, "app.server").Outcome != state.Unchanged || b.rt.byName("app.server").ID != srv || b.rt.byName("app.sidecar").ID != side {
		t.Fatalf("same image: pulls %d, %+v", pulls(), rep.Resources)
	}
	// Handled: the next pass does not pull again.
	if rep = b.apply(); pulls() != 0 || rep.Mutations != 0 {
		t.Fatalf("a handled pull ran again: %v", b.rt.calls)
	}

	// A new image behind the name: both containers running it are replaced.
	b.rt.registry["localhost/busybox:1"] = "sha256:0123456789abcdef0123"
	b.in.Pulls["app"] = 7
	rep = b.apply()
	for _, n := range []string{"app.server", "app.sidecar"} {
		o := outcome(rep, n)
		if o.Outcome != state.Replaced || !strings.Contains(o.Reason, "image localhost/busybox:1 updated by mesh module pull (local-localh -> 0123456789ab)") {
			t.Fatalf("%s: %+v", n, o)
		}
	}
	if o := outcome(rep, "app.migrate"); o.Outcome != state.Unchanged {
		t.Fatalf("a step reran on a pull: %+v", o)
	}

	// The registry is gone: the pull fails the container, which keeps
	// running, and the pull is tried again at the next apply.
	delete(b.rt.registry, "localhost/busybox:1")
	b.in.Pulls["app"] = 9
	before := b.rt.byName("app.server").ID
	rep = b.apply()
	if o := outcome(rep, "app.server"); o.Outcome != state.Failed || !strings.Contains(o.Reason, "tried again at the next apply") || b.rt.byName("app.server").ID != before {
		t.Fatalf("failed pull: %+v", o)
	}
	b.rt.registry = map[string]string{"localhost/busybox:1": "sha256:0123456789abcdef0123"}
	if rep = b.apply(); pulls() == 0 || outcome(rep, "app.server").Outcome != state.Unchanged {
		t.Fatalf("retried pull: calls %v, %+v", b.rt.calls, outcome(rep, "app.server"))
	}
}

// The pull policy: missing pulls only an absent image; always and newer
// ask the registry at each create or replace, and never on a pass that
// keeps the container.
func TestPullPolicy(t *testing.T) {
	for _, tc := range []struct {
		policy   string
		present  bool
		wantPull bool
	}{
		{"", true, false}, {"missing", true, false}, {"missing", false, true},
		{"always", true, true}, {"newer", true, true},
	} {
		t.Run(tc.policy+fmt.Sprint(tc.present), func(t *testing.T) {
			rt := newFake()
			rt.registry = map[string]string{"localhost/web:1": "sha256:web"}
			rt.images["localhost/web:1"] = tc.present
			r, err := New(Config{Node: "ace", LedgerPath: filepath.Join(t.TempDir(), "ledger.json")}, rt)
			if err != nil {
				t.Fatal(err)
			}
			src := "module: web\nresources:\n  - container: web.server\n    image: localhost/web:1\n"
			if tc.policy != "" {
				src += "    pull: " + tc.policy + "\n"
			}
			in := state.Input{Domain: "internal", Nodes: []state.Node{{Name: "ace", Address: "10.0.0.1"}}, Assignments: []state.Assignment{{Node: "ace", Module: "web"}}}
			plan := composeAce(t, &in, []string{src})
			rep := r.Apply(context.Background(), 1, plan)
			pulled := strings.Contains(strings.Join(rt.calls, ","), "pull localhost/web:1")
			if rep.Error != "" || pulled != tc.wantPull {
				t.Fatalf("pulled %v, want %v (%v, %q)", pulled, tc.wantPull, rt.calls, rep.Error)
			}
			rt.calls = nil
			if r.Apply(context.Background(), 1, plan); len(rt.calls) != 0 {
				t.Fatalf("a pass that keeps the container called %v", rt.calls)
			}
		})
	}
}

// Issue 29 item 2: mesh restart restarts the containers it names once,
// the same containers (IDs kept), and a handled restart is not done again;
// a container made after the restart was asked is not restarted for it.
func TestRestartOnce(t *testing.T) {
	b := newBed(t)
	b.apply()
	srv, side := b.rt.byName("app.server").ID, b.rt.byName("app.sidecar").ID
	restarts := func() []string {
		var out []string
		for _, c := range b.rt.calls {
			if strings.HasPrefix(c, "restart ") {
				out = append(out, c)
			}
		}
		return out
	}
	b.in.Restarts = map[state.RestartKey]uint64{{Module: "app", Container: "app.server"}: 5}
	rep := b.apply()
	if r := restarts(); len(r) != 1 || r[0] != "restart app.server" || outcome(rep, "app.server").Outcome != state.Restarted ||
		outcome(rep, "app.sidecar").Outcome != state.Unchanged || b.rt.byName("app.server").ID != srv {
		t.Fatalf("restart of one container: calls %v, %+v", b.rt.calls, rep.Resources)
	}
	if rep = b.apply(); len(restarts()) != 0 || rep.Mutations != 0 {
		t.Fatalf("a handled restart ran again: %v", b.rt.calls)
	}
	// The whole module, on this node.
	b.in.Restarts[state.RestartKey{Module: "app", Node: "ace"}] = 7
	b.apply()
	if r := restarts(); len(r) != 2 || b.rt.byName("app.sidecar").ID != side {
		t.Fatalf("restart of the module: %v", r)
	}
	// Another node's restart is not this one's.
	b.in.Restarts[state.RestartKey{Module: "app", Node: "elsewhere"}] = 9
	if b.apply(); len(restarts()) != 0 {
		t.Fatalf("another node's restart ran here: %v", restarts())
	}
	// Made after the restart was asked: nothing to restart, then or later.
	fresh := newBed(t)
	fresh.in.Restarts = map[state.RestartKey]uint64{{Module: "app"}: 3}
	fresh.apply()
	if rep := fresh.apply(); rep.Mutations != 0 || strings.Contains(fmt.Sprint(fresh.rt.calls), "restart ") {
		t.Fatalf("a container made after the restart was restarted for it: %v", fresh.rt.calls)
	}
}

// A pull's rollout reverted (the plan's pull index back below the one a
// container handled): the name gives the image from before that pull
// again, and the containers the pull replaced run it, saying why; the
// next pass changes nothing.
func TestPullRevertPutsBackTheImage(t *testing.T) {
	b, before := pulledBed(t)
	delete(b.in.Pulls, "app")
	rep := b.apply()
	o := outcome(rep, "app.server")
	if o.Outcome != state.Replaced || !strings.Contains(o.Reason, "image localhost/busybox:1 back to "+shortID(before)+" (the rollout of mesh module pull was reverted)") {
		t.Fatalf("revert: %+v", o)
	}
	if got := b.rt.byName("app.server").ImageID; got != before {
		t.Fatalf("after the revert the container runs %s, not %s", got, before)
	}
	if rep = b.apply(); rep.Mutations != 0 {
		t.Fatalf("the pass after a revert made %d mutations: %v", rep.Mutations, b.rt.calls)
	}
	// A later pull pulls again.
	b.in.Pulls = map[string]uint64{"app": 9}
	if rep = b.apply(); outcome(rep, "app.server").Outcome != state.Replaced {
		t.Fatalf("a pull after the revert: %+v", outcome(rep, "app.server"))
	}
}

// A revert whose replacement fails is tried again at the next pass: the
// ledger says the pull is taken back only once the container runs the
// image from before it.
func TestPullRevertRetriedAfterAFailure(t *testing.T) {
	b, before := pulledBed(t)
	delete(b.in.Pulls, "app")
	b.rt.removeErr = errors.New("the Podman service went away")
	if rep := b.apply(); outcome(rep, "app.server").Outcome != state.Failed {
		t.Fatalf("a revert whose replacement fails: %+v", outcome(rep, "app.server"))
	}
	b.rt.removeErr = nil
	rep := b.apply()
	if o := outcome(rep, "app.server"); o.Outcome != state.Replaced || b.rt.byName("app.server").ImageID != before {
		t.Fatalf("the revert tried again: %+v, image %s (want %s)", o, b.rt.byName("app.server").ImageID, before)
	}
}

// pulledBed is a bed whose containers a pull (index 7) moved to a new
// image; before is the image app.server ran until then.
func pulledBed(t *testing.T) (b *bed, before string) {
	t.Helper()
	b = newBed(t)
	b.apply()
	before = b.rt.byName("app.server").ImageID
	b.rt.registry = map[string]string{"localhost/busybox:1": "sha256:0123456789abcdef0123"}
	b.in.Pulls = map[string]uint64{"app": 7}
	b.apply()
	if got := b.rt.byName("app.server").ImageID; got != "sha256:0123456789abcdef0123" {
		t.Fatalf("after the pull: %s", got)
	}
	return b, before
}

// A purge cut short (a kill -9 after the rename aside, or midway through the
// removal) is finished by the next apply: the ledger still holds the path,
// and what was set aside goes first, following no link.
func TestPurgeCutShortIsFinished(t *testing.T) {
	b := newBed(t)
	b.vars["data"] = "\n    data: true"
	b.apply()
	data := filepath.Join(b.dir, "app/data")
	outside := filepath.Join(t.TempDir(), "keep")
	os.WriteFile(outside, []byte("keep me"), 0o600)
	b.in.Assignments = []state.Assignment{{Node: "ace", Module: "db"}}
	b.apply() // app's containers go; its data is kept
	// As a purge killed after its rename left it: aside, half removed.
	aside := data + purgeSuffix
	if err := os.Rename(data, aside); err != nil {
		t.Fatal(err)
	}
	os.MkdirAll(filepath.Join(aside, "x/y"), 0o755)
	os.Symlink(outside, filepath.Join(aside, "x/link"))
	b.in.Purges = map[string][]state.Purge{"ace": {{Module: "app", Path: data}}}
	if o := outcome(b.apply(), data); o.Outcome != state.Removed {
		t.Fatalf("the purge's second pass: %+v", o)
	}
	if _, err := os.Lstat(aside); !os.IsNotExist(err) {
		t.Fatalf("what the first pass set aside is still there: %v", err)
	}
	if b, err := os.ReadFile(outside); err != nil || string(b) != "keep me" {
		t.Fatalf("a link was followed: %q %v", b, err)
	}
	if _, ok := b.r.ledger.Paths[data]; ok {
		t.Fatal("the ledger still holds the purged directory")
	}
}

// A purge never takes the path it sets the directory aside at when a
// module owns it (a manifest may declare /srv/app/data.mesh-purging): it
// keeps both and says why, rather than remove that module's files first.
func TestPurgeLeavesAModulesPathBesideIt(t *testing.T) {
	b := newBed(t)
	b.vars["data"] = "\n    data: true"
	b.apply()
	data := filepath.Join(b.dir, "app/data")
	theirs := data + purgeSuffix
	if err := os.MkdirAll(theirs, 0o755); err != nil {
		t.Fatal(err)
	}
	os.WriteFile(filepath.Join(theirs, "f"), []byte("db's"), 0o600)
	b.r.ledger.Paths[theirs] = PathEntry{Kind: manifest.KindDirectory, Module: "db"}
	b.in.Assignments = []state.Assignment{{Node: "ace", Module: "db"}}
	b.in.Purges = map[string][]state.Purge{"ace": {{Module: "app", Path: data}}}
	o := outcome(b.apply(), data)
	if o.Outcome != state.Kept || !strings.Contains(o.Reason, "is module db's") {
		t.Fatalf("a purge beside module db's path: %+v", o)
	}
	if got, err := os.ReadFile(filepath.Join(theirs, "f")); err != nil || string(got) != "db's" {
		t.Fatalf("module db's file: %q %v", got, err)
	}
	if _, err := os.Stat(data); err != nil {
		t.Fatalf("the data directory: %v", err)
	}
}

// A purge removes the copy a restore kept beside the data directory
// (DIR.mesh-before-restore: the module's data as it was), first, never
// following a link; a module's path there stops it, said, and nothing is
// removed.
func TestPurgeRemovesTheCopyARestoreKept(t *testing.T) {
	b := newBed(t)
	b.vars["data"] = "\n    data: true"
	b.apply()
	data := filepath.Join(b.dir, "app/data")
	before := data + RestoreAside
	outside := filepath.Join(t.TempDir(), "shadow")
	os.WriteFile(outside, []byte("keep me"), 0o600)
	os.MkdirAll(filepath.Join(before, "base"), 0o700)
	os.WriteFile(filepath.Join(before, "base", "1"), []byte("old rows"), 0o600)
	os.Symlink(outside, filepath.Join(before, "link"))
	b.in.Assignments = []state.Assignment{{Node: "ace", Module: "db"}}
	b.in.Purges = map[string][]state.Purge{"ace": {{Module: "app", Path: data}}}

	// Module db declares the path: nothing is removed.
	b.r.ledger.Paths[before] = PathEntry{Kind: manifest.KindDirectory, Module: "db"}
	if o := outcome(b.apply(), data); o.Outcome != state.Kept || !strings.Contains(o.Reason, "is module db's path") {
		t.Fatalf("a purge beside module db's path: %+v", o)
	}
	if _, err := os.Stat(filepath.Join(before, "base", "1")); err != nil {
		t.Fatalf("module db's path: %v", err)
	}
	if _, err := os.Stat(data); err != nil {
		t.Fatalf("the data directory: %v", err)
	}

	delete(b.r.ledger.Paths, before)
	o := outcome(b.apply(), data)
	if o.Outcome != state.Removed || !strings.Contains(o.Reason, "and the copy a restore kept beside it") {
		t.Fatalf("the purge: %+v", o)
	}
	for _, p := range []string{data, before} {
		if _, err := os.Lstat(p); !os.IsNotExist(err) {
			t.Fatalf("%s is still there: %v", p, err)
		}
	}
	if got, err := os.ReadFile(outside); err != nil || string(got) != "keep me" {
		t.Fatalf("a link was followed: %q %v", got, err)
	}

	// A purge of the copy cut short (a kill while it was removed, the
	// directory renamed aside): the next purge finishes it.
	b.in.Purges = nil
	b.in.Assignments = []state.Assignment{{Node: "ace", Module: "app"}, {Node: "ace", Module: "db"}}
	b.apply()
	cut := before + purgeSuffix
	os.MkdirAll(filepath.Join(cut, "base"), 0o700)
	os.WriteFile(filepath.Join(cut, "base", "2"), []byte("half removed"), 0o600)
	b.in.Assignments = []state.Assignment{{Node: "ace", Module: "db"}}
	b.in.Purges = map[string][]state.Purge{"ace": {{Module: "app", Path: data}}}
	if o := outcome(b.apply(), data); o.Outcome != state.Removed {
		t.Fatalf("the purge after one cut short: %+v", o)
	}
	if _, err := os.Lstat(cut); !os.IsNotExist(err) {
		t.Fatalf("what a cut purge of the restore's copy left is still there: %v", err)
	}
}

// An image's VOLUME that no mount or tmpfs of the container holds is
// refused before the container it would replace goes, saying what to
// write; one under a mount is let be (Podman is told to make no volume of
// its own there), as is a step's, and a container already running is not
// looked at.
func TestImageVolumeNothingHoldsIsRefused(t *testing.T) {
	b := newBed(t)
	if rep := b.apply(); rep.Error != "" {
		t.Fatal(rep.Error)
	}
	side := b.rt.byName("app.sidecar").ID
	b.rt.volumes = map[string][]string{"localhost/busybox:1": {"/data/db"}}
	b.vars["content"] = "x = 2"
	rep := b.apply()
	if o := outcome(rep, "app.server"); o.Outcome != state.Replaced {
		t.Fatalf("server, its image's VOLUME under its mount of /data: %+v", o)
	}
	if o := outcome(rep, "app.sidecar"); o.Outcome != state.Unchanged || b.rt.byName("app.sidecar").ID != side {
		t.Fatalf("sidecar, running: %+v", o)
	}
	srv := b.rt.byName("app.server").ID
	b.rt.volumes["localhost/busybox:1"] = []string{"/data/db", "/var/lib/app/"}
	b.vars["content"], b.vars["stepcmd"] = "x = 3", "echo again"
	rep = b.apply()
	o := outcome(rep, "app.server")
	if o.Outcome != state.Failed || !strings.Contains(o.Reason, "keeps data at /var/lib/app (VOLUME), which no mount of app.server holds") || !strings.Contains(o.Reason, `tmpfs: ["/var/lib/app"]`) {
		t.Fatalf("server, its image's VOLUME held by nothing: %+v", o)
	}
	if c := b.rt.byName("app.server"); c == nil || c.ID != srv {
		t.Fatalf("the container the refused one would replace went: %+v", c)
	}
	if o := outcome(rep, "app.migrate"); o.Outcome != state.Ran {
		t.Fatalf("step, its image's VOLUME held by nothing: %+v", o)
	}
}
