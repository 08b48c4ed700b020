package reconciler

import (
	"context"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"mesh/state"
	"mesh/state/manifest"
)

const backupTmpl = `module: db
resources:
  - directory: {{d}}/db
    owner: "0:0"
    mode: "0700"
    data: true
  - directory: {{d}}/conf
    owner: "0:0"
    mode: "0755"
  - step: dump
    image: localhost/busybox:1
    command: ["dump"]
    mounts: ["{{d}}/db:/out"]
    before-backup: true
  - container: db.server
    image: localhost/busybox:1
    mounts: ["{{d}}/db:/data"]
backup:
  pause: true
`

// pausing is the fake with Podman's pause and unpause.
type pausing struct {
	*fake
	paused []string
}

func (p *pausing) Pause(ctx context.Context, id string) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.calls = append(p.calls, "pause "+id)
	p.paused = append(p.paused, id)
	p.state(id, "paused")
	return nil
}

func (p *pausing) Unpause(ctx context.Context, id string) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.calls = append(p.calls, "unpause "+id)
	p.paused = slices.DeleteFunc(p.paused, func(x string) bool { return x == id })
	p.state(id, "running")
	return nil
}

func (p *pausing) state(id, st string) {
	for _, c := range p.ctrs {
		if c.ID == id {
			c.State = st
		}
	}
}

// Issue 30, item 2: a before-backup step never runs in an apply (a leftover
// run's container is removed there); Quiesce runs it, then pauses the
// module's running containers, and resume unpauses them; a step that fails
// stops the backup before anything is paused; StopAll removes the
// module's containers and the next apply creates them again; Exclusive
// keeps the loop's passes out while it runs.
func TestBackupQuiesce(t *testing.T) {
	dir := t.TempDir()
	rt := &pausing{fake: newFake()}
	cfg := Config{Node: "ace", DNS: netip.MustParseAddr("169.254.53.53"), LedgerPath: filepath.Join(dir, "ledger.json")}
	r, err := New(cfg, rt)
	if err != nil {
		t.Fatal(err)
	}
	in := state.Input{Domain: "internal", Nodes: []state.Node{{Name: "ace", Address: "10.0.0.1"}}, Assignments: []state.Assignment{{Node: "ace", Module: "db"}}}
	plan := composeAce(t, &in, []string{strings.ReplaceAll(backupTmpl, "{{d}}", dir)})
	ctx := context.Background()
	created := func(name string) int {
		n := 0
		for _, c := range rt.calls {
			if c == "create "+name {
				n++
			}
		}
		return n
	}
	if rep := r.Apply(ctx, 1, plan); rep.Error != "" || created("db.dump") != 0 || created("db.server") != 1 {
		t.Fatalf("the apply: %q; calls %v", rep.Error, rt.calls)
	}
	if got := DataDirs(plan, "db"); !slices.Equal(got, []string{filepath.Join(dir, "db")}) {
		t.Fatalf("data dirs: %v", got)
	}
	server := rt.byName("db.server").ID

	rt.calls = nil
	resume, err := r.Quiesce(ctx, plan, "db", true)
	if err != nil {
		t.Fatal(err)
	}
	if created("db.dump") != 1 || rt.byName("db.dump") != nil {
		t.Fatalf("the step ran %d times, or its container stayed: %v", created("db.dump"), rt.calls)
	}
	if !slices.Equal(rt.paused, []string{server}) {
		t.Fatalf("paused %v, not the server", rt.paused)
	}
	resume()
	if len(rt.paused) != 0 {
		t.Fatalf("still paused after resume: %v", rt.paused)
	}
	// A backup the agent's end cut short left the server paused: the next
	// apply unpauses it, recreating nothing.
	if _, err := r.Quiesce(ctx, plan, "db", true); err != nil || len(rt.paused) != 1 {
		t.Fatalf("paused again: %v %v", err, rt.paused)
	}
	if rep := r.Apply(ctx, 1, plan); rep.Error != "" || len(rt.paused) != 0 || rt.byName("db.server").ID != server {
		t.Fatalf("after the apply: %q, paused %v", rep.Error, rt.paused)
	}

	// A step that fails: the backup stops, nothing is paused.
	rt.exit = func(s Spec) int {
		if slices.Contains(s.Command, "dump") {
			return 3
		}
		return 0
	}
	resume, err = r.Quiesce(ctx, plan, "db", true)
	resume()
	if err == nil || !strings.Contains(err.Error(), "before-backup step db.dump failed") || len(rt.paused) != 0 {
		t.Fatalf("a failing step: %v, paused %v", err, rt.paused)
	}
	rt.exit = nil

	// A run an agent's end cut short left its container: the apply removes it.
	if _, err := rt.Create(ctx, Spec{Name: "db.dump", Image: "localhost/busybox:1", Labels: map[string]string{LabelManaged: "1", LabelModule: "db", LabelKind: "step"}}); err != nil {
		t.Fatal(err)
	}
	if rep := r.Apply(ctx, 1, plan); rep.Error != "" || rt.byName("db.dump") != nil {
		t.Fatalf("the leftover run stayed: %q", rep.Error)
	}

	// A restore's stop, and the apply after it.
	if has, err := r.HasContainers(ctx, "db"); !has || err != nil {
		t.Fatalf("db's containers before the stop: %v %v", has, err)
	}
	stopped, err := r.StopAll(ctx, "db")
	if err != nil || !slices.Equal(stopped, []string{"db.server"}) || rt.byName("db.server") != nil {
		t.Fatalf("stop: %v %v", stopped, err)
	}
	if has, err := r.HasContainers(ctx, "db"); has || err != nil {
		t.Fatalf("db's containers after the stop: %v %v", has, err)
	}
	if rep := r.Apply(ctx, 1, plan); rep.Error != "" || rt.byName("db.server") == nil {
		t.Fatalf("the apply after the restore did not start the server again: %q", rep.Error)
	}

	// Exclusive: a second one waits for the first, and gives up with its
	// context.
	held := make(chan struct{})
	release := make(chan struct{})
	go r.Exclusive(ctx, func(context.Context) error { close(held); <-release; return nil })
	<-held
	short, cancel := context.WithTimeout(ctx, 50*time.Millisecond)
	defer cancel()
	ran := false
	if err := r.Exclusive(short, func(context.Context) error { ran = true; return nil }); err == nil || ran {
		t.Fatalf("ran beside another: %v", err)
	}
	if r.take(short) {
		t.Fatal("the loop's pass took the node during a backup")
	}
	close(release)
	if err := r.Exclusive(ctx, func(context.Context) error { ran = true; return nil }); err != nil || !ran {
		t.Fatalf("after the first: %v", err)
	}
}

// A backup leaves out the files of a secret a data directory holds (of
// any module): every node can open the repository.
func TestSecretsUnder(t *testing.T) {
	plan := &state.Plan{Resources: []state.Resource{
		{Module: "db", Kind: manifest.KindDirectory, Name: "/srv/db"},
		{Module: "db", Kind: manifest.KindSecret, Name: "/srv/db/admin.pw"},
		{Module: "db", Kind: manifest.KindDirectory, Name: "/srv/db/creds"},
		{Module: "db", Kind: state.KindDeliveredCredential, Name: "/srv/db/creds/app.credential"},
		{Module: "app", Kind: manifest.KindCredential, Name: "/srv/db/app/db.password"},
		{Module: "db", Kind: manifest.KindFile, Name: "/srv/db/db.conf"},
		{Module: "db", Kind: manifest.KindSecret, Name: "/srv/dbx/pw"},
		{Module: "db", Kind: manifest.KindSecret, Name: "/etc/db.pw"},
	}}
	got := SecretsUnder(plan, []string{"/srv/db"})
	want := []string{"/srv/db/admin.pw", "/srv/db/creds/app.credential", "/srv/db/app/db.password"}
	if !slices.Equal(got, want) {
		t.Fatalf("%v, want %v", got, want)
	}
}

// What the ledger says holds a secret inside the directories, whatever
// the plan says now: a file an apply wrote after the plan was read, or one
// a plan no longer names and no apply has removed yet.
func TestSecretFilesUnder(t *testing.T) {
	ledger := filepath.Join(t.TempDir(), "ledger.json")
	os.WriteFile(ledger, []byte(`{"paths": {
		"/srv/db": {"kind": "directory", "module": "db"},
		"/srv/db/admin.pw": {"kind": "secret", "module": "db"},
		"/srv/db/creds/app.credential": {"kind": "delivered-credential", "module": "db"},
		"/srv/db/app/db.password": {"kind": "credential", "module": "app"},
		"/srv/db/db.conf": {"kind": "file", "module": "db"},
		"/srv/dbx/pw": {"kind": "secret", "module": "db"},
		"/etc/db.pw": {"kind": "secret", "module": "db"}}}`), 0o600)
	r, err := New(Config{Node: "ace", LedgerPath: ledger}, nil)
	if err != nil {
		t.Fatal(err)
	}
	got := r.SecretFilesUnder([]string{"/srv/db"})
	want := []string{"/srv/db/admin.pw", "/srv/db/app/db.password", "/srv/db/creds/app.credential"}
	if !slices.Equal(got, want) {
		t.Fatalf("%v, want %v", got, want)
	}
}
