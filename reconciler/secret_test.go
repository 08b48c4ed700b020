package reconciler

import (
	"context"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"mesh/state"
)

const secretTmpl = `module: mail
resources:
  - directory: {{d}}/mail
  - secret: {{d}}/mail/smtp.password
    name: smtp
  - container: mail.server
    image: localhost/busybox:1
    command: [sleep, "1000"]
    restart-on: [{{d}}/mail/smtp.password]
  - container: mail.sender
    image: localhost/busybox:1
    command: [sleep, "1000"]
    env-secrets: {SMTP_PASSWORD: smtp, API_KEY: api}
  - container: mail.other
    image: localhost/busybox:1
    command: [sleep, "1000"]
`

// secretBed is a node running mail, whose secrets are values in a map.
type secretBed struct {
	t      *testing.T
	dir    string
	rt     *fake
	r      *Reconciler
	in     state.Input
	values map[string]string
}

func newSecretBed(t *testing.T) *secretBed {
	b := &secretBed{t: t, dir: t.TempDir(), rt: newFake(), values: map[string]string{}}
	r, err := New(Config{
		Node: "ace", DNS: netip.MustParseAddr("169.254.53.53"), LedgerPath: filepath.Join(b.dir, "ledger.json"),
		OperatorSecret: func(_ context.Context, ref state.SecretRef, _ string) ([]byte, error) {
			v, ok := b.values[ref.Name]
			if !ok {
				return nil, state.ErrNotFound
			}
			return []byte(v), nil
		},
		EnvDir: filepath.Join(b.dir, "run", "env"), EnvExec: "/usr/local/bin/mesh",
	}, b.rt)
	if err != nil {
		t.Fatal(err)
	}
	b.r = r
	b.in = state.Input{Domain: "internal", Nodes: []state.Node{{Name: "ace", Address: "10.0.0.1"}},
		Assignments: []state.Assignment{{Node: "ace", Module: "mail"}}, Secrets: map[state.SecretRef]string{}}
	return b
}

// appliedSecretBed is a secret bed whose two secrets are set, applied.
func appliedSecretBed(t *testing.T, smtp, api string) *secretBed {
	t.Helper()
	b := newSecretBed(t)
	b.set("smtp", smtp)
	b.set("api", api)
	if rep := b.apply(); rep.Error != "" {
		t.Fatal(rep.Error)
	}
	return b
}

// set stands for mesh secret set: the value, and its digest in the state.
func (b *secretBed) set(name, value string) {
	b.values[name] = value
	b.in.Secrets[state.SecretRef{Module: "mail", Name: name}] = state.SecretDigest(value)
}

func (b *secretBed) rm(name string) {
	delete(b.values, name)
	delete(b.in.Secrets, state.SecretRef{Module: "mail", Name: name})
}

func (b *secretBed) apply() state.Report {
	b.t.Helper()
	b.rt.calls = nil
	return b.r.Apply(context.Background(), 1, composeAce(b.t, &b.in, []string{strings.ReplaceAll(secretTmpl, "{{d}}", b.dir)}))
}

// A secret is delivered as a file (0600) and as an environment file that
// only its container mounts, never in the container's spec; a module whose
// secret is not set applies up to it and waits, saying what to run; a new
// value replaces exactly the containers that read it, for the secret; the
// same value changes nothing; rm takes the file and the reader away.
func TestSecretsReachOnlyTheirReaders(t *testing.T) {
	b := newSecretBed(t)
	file := filepath.Join(b.dir, "mail/smtp.password")

	rep := b.apply()
	o := outcome(rep, file)
	if o.Outcome != state.Waiting || !strings.Contains(o.Reason, "mesh secret set mail smtp") {
		t.Fatalf("before set: %+v", o)
	}
	if outcome(rep, "mail.server").Outcome != state.Waiting || b.rt.byName("mail.server") != nil {
		t.Fatalf("what comes after an unset secret ran: %+v", rep.Resources)
	}
	if f := rep.UnsetSecret(); !rep.OnlyGates() || f == nil || f.Secret != "smtp" || !strings.Contains(rep.Error, "mesh secret set mail smtp") {
		t.Fatalf("the report does not say which secret to set: %q %+v", rep.Error, f)
	}

	b.set("smtp", "pa\x00ss\n")
	rep = b.apply()
	if o := outcome(rep, "mail.sender"); o.Outcome != state.Waiting || !strings.Contains(o.Reason, "mesh secret set mail api") {
		t.Fatalf("sender without api: %+v (error %q)", o, rep.Error)
	}
	b.set("api", "k3y=with=equals")
	rep = b.apply()
	// smtp holds a NUL: a file can hold it, an environment cannot.
	if o := outcome(rep, "mail.sender"); o.Outcome != state.Failed || !strings.Contains(o.Reason, "NUL") {
		t.Fatalf("a NUL into the environment: %+v", o)
	}
	got, _ := os.ReadFile(file)
	fi, _ := os.Stat(file)
	if string(got) != "pa\x00ss\n" || fi.Mode().Perm() != 0o600 {
		t.Fatalf("file %q mode %v", got, fi.Mode())
	}
	b.set("smtp", "hunter2")
	rep = b.apply()
	if rep.Error != "" {
		t.Fatal(rep.Error)
	}
	sender := b.rt.byName("mail.sender")
	sp := b.rt.specs[sender.ID]
	env := filepath.Join(b.dir, "run", "env", "mail.sender")
	if sp.EnvFile != env || sp.EnvExec != "/usr/local/bin/mesh" || len(sp.Env) != 0 {
		t.Fatalf("sender spec %+v", sp)
	}
	for _, s := range []Spec{sp, b.rt.specs[b.rt.byName("mail.server").ID]} {
		if blob := strings.Join(append(s.Command, s.Labels[LabelDecl], s.Labels[LabelInputs]), " "); strings.Contains(blob, "hunter2") || strings.Contains(blob, "k3y") {
			t.Fatalf("a value in the container's configuration: %s", blob)
		}
	}
	eb, _ := os.ReadFile(env)
	if string(eb) != "API_KEY=k3y=with=equals\x00SMTP_PASSWORD=hunter2\x00" {
		t.Fatalf("env file %q", eb)
	}
	if fi, _ := os.Stat(filepath.Dir(env)); fi.Mode().Perm() != 0o700 {
		t.Fatalf("env dir mode %v", fi.Mode())
	}
	// A container that rewrote the file: put back, never copied aside.
	os.WriteFile(file, []byte("hunter2 and more"), 0o600)
	rep = b.apply()
	if got, _ := os.ReadFile(file); string(got) != "hunter2" || !strings.Contains(outcome(rep, file).Reason, "never copied") {
		t.Fatalf("after drift: %q %+v", got, outcome(rep, file))
	}
	if kept, _ := os.ReadDir(b.r.keptDir()); len(kept) != 0 {
		t.Fatalf("a copy of the secret's file was kept: %v", kept)
	}
	ids := map[string]string{}
	for _, n := range []string{"mail.server", "mail.sender", "mail.other"} {
		ids[n] = b.rt.byName(n).ID
	}

	// The same value: nothing.
	b.set("smtp", "hunter2")
	if rep := b.apply(); rep.Mutations != 0 {
		t.Fatalf("the same value made %d mutations: %v", rep.Mutations, b.rt.calls)
	}
	// A new value of smtp: the file, and both its readers, for the secret.
	b.set("smtp", "correct horse")
	rep = b.apply()
	for _, n := range []string{"mail.server", "mail.sender"} {
		if o := outcome(rep, n); o.Outcome != state.Replaced || o.Reason != "secret smtp changed" {
			t.Fatalf("%s: %+v", n, o)
		}
	}
	if b.rt.byName("mail.other").ID != ids["mail.other"] {
		t.Fatal("a container that reads no secret was replaced")
	}
	// A new value of api: only the sender.
	ids["mail.server"] = b.rt.byName("mail.server").ID
	b.set("api", "other")
	rep = b.apply()
	if o := outcome(rep, "mail.sender"); o.Outcome != state.Replaced || o.Reason != "secret api changed" {
		t.Fatalf("sender: %+v", o)
	}
	if b.rt.byName("mail.server").ID != ids["mail.server"] {
		t.Fatal("the server, which does not read api, was replaced")
	}

	// rm: the file goes (even edited by a container), and the container
	// whose environment held it.
	os.WriteFile(file, []byte("hunter2, edited"), 0o600)
	b.rm("smtp")
	rep = b.apply()
	if _, err := os.Stat(file); !os.IsNotExist(err) {
		t.Fatalf("the removed secret's file is still there: %v", err)
	}
	if b.rt.byName("mail.sender") != nil || b.rt.byName("mail.other") == nil {
		t.Fatalf("after rm: sender %v, other %v", b.rt.byName("mail.sender"), b.rt.byName("mail.other"))
	}
	if _, err := os.Stat(env); !os.IsNotExist(err) {
		t.Fatalf("the removed container's environment is still there: %v", err)
	}
}

// A write of a secret's file cut short by a kill -9 leaves its temp file,
// the value in it, beside the file: the next run removes it, and so does
// the file's removal; names that only look alike, and a directory of such
// a name, stay. Before, nothing removed it: after mesh secret rm and an
// unassign the value stayed in the module's directory, which the mesh then
// kept for the entry it did not put there (a review found it).
func TestLeftoverOfACutWriteIsRemoved(t *testing.T) {
	b := appliedSecretBed(t, "hunter2", "k")
	mail := filepath.Join(b.dir, "mail")
	plant := func(name string) string {
		p := filepath.Join(mail, name)
		if err := os.WriteFile(p, []byte("hunter2"), 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	leftover := plant(".smtp.password.mesh-0a1b2c3d4e5f")
	alike := []string{plant(".smtp.password.mesh-0a1b2c3d4e5"), plant(".smtp.password.mesh-0a1b2c3d4e5f0"), plant(".smtp.password.mesh-0A1B2C3D4E5F"), plant(".smtp.passwor.mesh-0a1b2c3d4e5f")}
	dir := filepath.Join(mail, ".smtp.password.mesh-abcdefabcdef")
	if err := os.Mkdir(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	alike = append(alike, dir)
	// The same run swept the file's directory when it wrote it: a file
	// that holds what it should is not listed again at every pass.
	b.apply()
	if _, err := os.Stat(leftover); err != nil {
		t.Fatalf("swept at a pass of the same run: %v", err)
	}
	// The next run (a new reconciler on the same ledger) removes it at
	// its first pass, the file unchanged.
	r, err := New(b.r.cfg, b.rt)
	if err != nil {
		t.Fatal(err)
	}
	b.r = r
	if rep := b.apply(); rep.Error != "" {
		t.Fatal(rep.Error)
	}
	if _, err := os.Stat(leftover); err == nil {
		t.Fatal("the next run's first pass kept the leftover")
	}
	for _, p := range alike {
		if _, err := os.Stat(p); err != nil {
			t.Fatalf("%s, not a leftover of the file, was removed: %v", p, err)
		}
	}
	// One left while the run goes on (its write cut short by a failure of
	// the disk, say) goes with the file.
	leftover = plant(".smtp.password.mesh-ffffffffffff")
	b.rm("smtp")
	b.apply()
	if _, err := os.Stat(leftover); err == nil {
		t.Fatal("mesh secret rm removed the file and kept the leftover beside it")
	}
}

// env-secrets within what exec takes: a variable over 128 KiB, or more
// than 1 MiB in all (a manifest naming one large secret under many
// variables), fails the container, saying what to do, and writes nothing.
// Before, the agent wrote 70 MiB of environment to /run for 70 variables
// naming a 1 MiB secret, reported the container created, and it could
// never start (a review found it).
func TestEnvSecretsWithinWhatExecTakes(t *testing.T) {
	for _, tc := range []struct {
		name, value string
		vars        int
		want        string
	}{
		{"a variable too large", strings.Repeat("a", 128<<10), 1, "more than the 128 KiB a variable may hold"},
		{"too many in all", strings.Repeat("a", 100<<10), 11, "an environment of more than 1024 KiB"},
		{"within", strings.Repeat("a", 100<<10), 10, ""},
	} {
		b := newSecretBed(t)
		var sb strings.Builder
		sb.WriteString("module: mail\nresources:\n  - container: mail.sender\n    image: localhost/busybox:1\n    command: [sleep, \"1000\"]\n    env-secrets:\n")
		for i := 0; i < tc.vars; i++ {
			fmt.Fprintf(&sb, "      V%02d: big\n", i)
		}
		b.set("big", tc.value)
		b.rt.calls = nil
		rep := b.r.Apply(context.Background(), 1, composeAce(t, &b.in, []string{sb.String()}))
		o := outcome(rep, "mail.sender")
		env := filepath.Join(b.dir, "run", "env", "mail.sender")
		_, err := os.Stat(env)
		if tc.want == "" {
			if o.Outcome != state.Created || err != nil {
				t.Fatalf("%s: %+v; the environment file: %v", tc.name, o, err)
			}
			continue
		}
		if o.Outcome != state.Failed || !strings.Contains(o.Reason, tc.want) || !strings.Contains(o.Reason, "deliver") {
			t.Fatalf("%s: %+v", tc.name, o)
		}
		if err == nil || b.rt.byName("mail.sender") != nil {
			t.Fatalf("%s: an environment file (%v) or a container was made", tc.name, err)
		}
	}
}

// mesh secret rm takes the value back from a container that mounts the
// secret's file itself (the shape mesh import compose writes): a file
// mount keeps the file it found, so the container read the removed value
// for as long as it ran (a review found it). One that mounts the
// directory sees the file go and stays, and so does one that mounts
// nothing of it; a new value replaces the mounting one (restart-on).
func TestSecretRmTakesTheFileBackFromItsMounts(t *testing.T) {
	const tmpl = `module: mail
resources:
  - directory: {{d}}/mail
  - secret: {{d}}/mail/smtp.password
    name: smtp
  - container: mail.reader
    image: localhost/busybox:1
    command: [sleep, "1000"]
    mounts: ["{{d}}/mail/smtp.password:/run/secrets/smtp:ro"]
    restart-on: [{{d}}/mail/smtp.password]
  - container: mail.dir
    image: localhost/busybox:1
    command: [sleep, "1000"]
    mounts: ["{{d}}/mail:/mail:ro"]
`
	b := newSecretBed(t)
	apply := func() state.Report {
		b.rt.calls = nil
		return b.r.Apply(context.Background(), 1, composeAce(t, &b.in, []string{strings.ReplaceAll(tmpl, "{{d}}", b.dir)}))
	}
	b.set("smtp", "hunter2")
	if rep := apply(); rep.Error != "" {
		t.Fatal(rep.Error)
	}
	reader, dir := b.rt.byName("mail.reader").ID, b.rt.byName("mail.dir").ID
	b.set("smtp", "hunter3")
	apply()
	if c := b.rt.byName("mail.reader"); c == nil || c.ID == reader {
		t.Fatal("a new value did not replace the container that mounts the file")
	}
	if _, ok := b.r.health.following("mail.reader"); !ok {
		t.Fatal("mail.reader is not followed")
	}
	b.rm("smtp")
	rep := apply()
	// Removed, it waits for the secret: followed no more (it would be
	// reported unhealthy, or running, while there is none).
	if _, ok := b.r.health.following("mail.reader"); ok {
		t.Fatalf("mail.reader, removed, is still followed: %+v", outcome(rep, "mail.reader"))
	}
	if c := b.rt.byName("mail.reader"); c != nil {
		t.Fatalf("after mesh secret rm, mail.reader still mounts the removed file: %+v", outcome(rep, filepath.Join(b.dir, "mail/smtp.password")))
	}
	if o := outcome(rep, filepath.Join(b.dir, "mail/smtp.password")); o.Outcome != state.Waiting || !strings.Contains(o.Reason, "mail.reader, which mounted the file, removed") {
		t.Fatalf("the secret's outcome: %+v", o)
	}
	if c := b.rt.byName("mail.dir"); c == nil || c.ID != dir {
		t.Fatal("the container that mounts the directory was touched")
	}
	// Set again, it is made again.
	b.set("smtp", "hunter4")
	if rep := apply(); rep.Error != "" || b.rt.byName("mail.reader") == nil {
		t.Fatalf("set again: %s, %+v", rep.Error, b.rt.byName("mail.reader"))
	}
}

// While a backup reads mail's directory with the node's applies going on,
// no secret's file is written there (restic would copy it, or the
// temporary file of a new value, into the snapshot): the apply leaves it,
// and the rest of mail, waiting (a wait, not a failure, which would stop a
// rollout) and goes on with the node's other modules, without waiting
// itself (a backup of hours held every change of the node); the lifted
// fence asks for a pass, which writes it. A rotation waits the same; a
// file that holds its value already does not.
func TestFencedDirectoryGetsNoSecretFile(t *testing.T) {
	b := newSecretBed(t)
	clock := time.Date(2026, 12, 7, 20, 0, 0, 0, time.UTC)
	b.r.cfg.Now = func() time.Time { return clock }
	b.set("smtp", "first")
	b.set("api", "key")
	dir := filepath.Join(b.dir, "mail")
	file := filepath.Join(dir, "smtp.password")
	other := filepath.Join(b.dir, "other.txt")
	b.in.Assignments = append(b.in.Assignments, state.Assignment{Node: "ace", Module: "other"})
	manifests := func(content string) []string {
		return []string{strings.ReplaceAll(secretTmpl, "{{d}}", b.dir), "module: other\nresources:\n  - file: " + other + "\n    content: " + content + "\n"}
	}
	apply := func(what string, plan *state.Plan) state.Report {
		t.Helper()
		done := make(chan state.Report, 1)
		go func() { done <- b.r.Apply(context.Background(), 1, plan) }()
		select {
		case rep := <-done:
			return rep
		case <-time.After(time.Minute):
			t.Fatalf("%s: the apply waited at the fence", what)
		}
		return state.Report{}
	}
	soon := func() bool {
		select {
		case <-b.r.soon:
			return true
		default:
			return false
		}
	}
	// waitsThenWrites applies under a fence of mail's directory, checks
	// that the file waits with nothing written while other changes apply,
	// lifts the fence, and checks the value written by the pass it asks for.
	// running: mail's containers ran before the fence; they run on under
	// it, followed still (their exits and health reported through a
	// backup of hours), and the wait says so (Running: a health gate on
	// mail elsewhere stays open). Before they ever ran, it does not.
	waitsThenWrites := func(what, before, value, otherContent string, running bool) {
		t.Helper()
		lift := b.r.FenceSecrets("mail", []string{dir})
		defer lift()
		soon()
		rep := apply(what, composeAce(t, &b.in, manifests(otherContent)))
		f := rep.Failed("mail")
		if f == nil || f.Backup != "mail" || !f.Wait() || !rep.OnlyBackups() || !rep.OnlyGates() || !strings.Contains(f.Reason, "the backup of mail reads "+dir) {
			t.Fatalf("%s: under the fence: %+v", what, rep.Failures)
		}
		if f.Running != running {
			t.Fatalf("%s: under the fence, running %v, want %v", what, f.Running, running)
		}
		// Another pass under the fence, an hour on: the wait is as old as
		// the pass that first saw it (a rollout's refreshes are bounded
		// from it), though the report is new.
		first := rep.AppliedAt
		if !f.Since.Equal(first) {
			t.Fatalf("%s: the wait since %v, its pass at %v", what, f.Since, first)
		}
		clock = clock.Add(time.Hour)
		if again := apply(what, composeAce(t, &b.in, manifests(otherContent))); !again.Failed("mail").Since.Equal(first) || !again.AppliedAt.After(first) {
			t.Fatalf("%s: a second pass under the fence: since %v, applied at %v; first %v", what, again.Failed("mail").Since, again.AppliedAt, first)
		}
		for _, c := range []string{"mail.server", "mail.sender", "mail.other"} {
			if w, ok := b.r.health.following(c); ok != running || ok && w.Module != "mail" {
				t.Fatalf("%s: %s followed under the fence: %v %+v", what, c, ok, w)
			}
		}
		if o := outcome(rep, file); o.Outcome != state.Waiting || !strings.Contains(o.Reason, "once restic has read it") {
			t.Fatalf("%s: the secret's outcome under the fence: %+v", what, o)
		}
		if o := outcome(rep, "mail.sender"); o.Outcome != state.Waiting {
			t.Fatalf("%s: the rest of mail under the fence: %+v", what, o)
		}
		if got, err := os.ReadFile(other); err != nil || string(got) != otherContent {
			t.Fatalf("%s: another module's change under the fence: %q %v", what, got, err)
		}
		if got, _ := os.ReadFile(file); string(got) != before {
			t.Fatalf("%s: the secret's file holds %q under the fence, want %q", what, got, before)
		}
		if left, _ := filepath.Glob(filepath.Join(dir, ".*")); len(left) > 0 {
			t.Fatalf("%s: written beside it under the fence: %v", what, left)
		}
		if soon() {
			t.Fatalf("%s: a pass asked for before the fence was lifted", what)
		}
		lift()
		if !soon() {
			t.Fatalf("%s: the lifted fence asked for no pass", what)
		}
		lift() // a second call does nothing
		if soon() {
			t.Fatalf("%s: a second lift asked for a pass again", what)
		}
		rep = apply(what, composeAce(t, &b.in, manifests(otherContent)))
		if rep.Error != "" || len(rep.Failures) > 0 {
			t.Fatalf("%s: after the fence: %s %+v", what, rep.Error, rep.Failures)
		}
		if got, err := os.ReadFile(file); err != nil || string(got) != value {
			t.Fatalf("%s: after the fence: %q, %v; want %q", what, got, err, value)
		}
	}
	waitsThenWrites("a new secret's file", "", "first", "one", false)
	b.set("smtp", "second")
	waitsThenWrites("a rotation", "first", "second", "two", true)

	// A secret's file that holds its value already does not wait: every
	// apply goes over it.
	lift := b.r.FenceSecrets("mail", []string{dir})
	defer lift()
	if rep := apply("the same value", composeAce(t, &b.in, manifests("three"))); rep.Error != "" || len(rep.Failures) > 0 {
		t.Fatalf("an apply that writes no secret under the fence: %s %+v", rep.Error, rep.Failures)
	}
}

// A provider whose delivered credential waits for its backup makes its
// consumer on the node wait too, and a wait it is (the report only waits:
// no backoff, no rollout stopped), said as the provider's; lifted, the
// next apply delivers and the consumer goes on.
func TestConsumerWaitsWithItsFencedProvider(t *testing.T) {
	b := newBed(t)
	creds := filepath.Join(b.dir, "db", "creds")
	lift := b.r.FenceSecrets("db", []string{creds})
	defer lift()
	rep := b.apply()
	db, app := rep.Failed("db"), rep.Failed("app")
	if db == nil || db.Backup != "db" || app == nil || app.Backup != "db" || app.Provider != "db" || !rep.OnlyBackups() {
		t.Fatalf("under db's fence: %+v", rep.Failures)
	}
	if !strings.Contains(app.Reason, "waits for its provider db, which waits: the backup of db reads "+creds) {
		t.Fatalf("the consumer's reason: %q", app.Reason)
	}
	if o := outcome(rep, "app.server"); o.Outcome != state.Waiting {
		t.Fatalf("app.server under db's fence: %+v", o)
	}
	if _, err := os.Stat(filepath.Join(creds, "app.credential")); err == nil {
		t.Fatal("the delivered credential was written under the fence")
	}
	// app never ran: as a provider elsewhere, it is not healthy.
	if app.Running {
		t.Fatalf("app waits before it ever ran, said running: %+v", app)
	}
	lift()
	if rep := b.apply(); rep.Error != "" || len(rep.Failures) > 0 {
		t.Fatalf("after the fence: %s %+v", rep.Error, rep.Failures)
	}
	if got, err := os.ReadFile(filepath.Join(creds, "app.credential")); err != nil || !strings.Contains(string(got), "secret="+b.secret) {
		t.Fatalf("the delivered credential after the fence: %q %v", got, err)
	}
}

// A module that mounts another module's directory read-only (which
// composes: only a writable mount around another module's path does not)
// is refused when that directory holds the other module's secret: its
// container would read a value sealed to the node for the other module.
func TestMountOfAnotherModulesSecretIsRefused(t *testing.T) {
	b := newSecretBed(t)
	b.set("smtp", "v4lue")
	mail := strings.ReplaceAll(`module: mail
resources:
  - directory: {{d}}/shared/mail
  - secret: {{d}}/shared/mail/smtp.password
    name: smtp
  - container: mail.server
    image: localhost/busybox:1
    command: [sleep, "1000"]
    mounts: ["{{d}}/shared/mail:/data"]
`, "{{d}}", b.dir)
	snoop := strings.ReplaceAll(`module: snoop
resources:
  - directory: {{d}}/shared
  - container: snoop.app
    image: localhost/busybox:1
    command: [sleep, "1000"]
    mounts: ["{{d}}/shared:/all:ro"]
`, "{{d}}", b.dir)
	b.in.Assignments = append(b.in.Assignments, state.Assignment{Node: "ace", Module: "snoop"})
	plan := composeAce(t, &b.in, []string{mail, snoop})
	b.r.Apply(context.Background(), 1, plan) // mail's directory waits for snoop's above it
	rep := b.r.Apply(context.Background(), 1, plan)
	if o := outcome(rep, "snoop.app"); o.Outcome != state.Failed || !strings.Contains(o.Reason, "holds "+filepath.Join(b.dir, "shared", "mail", "smtp.password")+", a secret or credential of module mail") {
		t.Fatalf("snoop.app: %+v", o)
	}
	if b.rt.byName("snoop.app") != nil {
		t.Fatal("snoop.app was created")
	}
	if o := outcome(rep, "mail.server"); o.Outcome != state.Created {
		t.Fatalf("mail.server, its own secret under its mount: %+v", o)
	}
	// One that runs when the secret comes (the manifest had none before)
	// is not stopped by the mesh; it is said, and not started again.
	noSecret := strings.Replace(mail, "  - secret: "+filepath.Join(b.dir, "shared", "mail", "smtp.password")+"\n    name: smtp\n", "", 1)
	if noSecret == mail {
		t.Fatal("the manifest without its secret is the same")
	}
	plan = composeAce(t, &b.in, []string{noSecret, snoop})
	b.r.Apply(context.Background(), 1, plan)
	running := b.rt.byName("snoop.app")
	if running == nil {
		t.Fatal("snoop.app, no secret under its mount, was not created")
	}
	plan = composeAce(t, &b.in, []string{mail, snoop})
	rep = b.r.Apply(context.Background(), 1, plan)
	if o := outcome(rep, "snoop.app"); o.Outcome != state.Failed || !strings.Contains(o.Reason, "it runs as it was started") {
		t.Fatalf("snoop.app, running when the secret came: %+v", o)
	}
	if c := b.rt.byName("snoop.app"); c == nil || c.ID != running.ID {
		t.Fatalf("snoop.app, running when the secret came, was removed: %+v", c)
	}
}

// What a write of a secret's file cut by a kill left beside it (the
// temporary file, holding the value) is removed when the reconciler starts
// again, whether or not its module's apply comes to that file: a backup or
// a move's copy of the directory would read it.
func TestStartSweepsACutSecretWrite(t *testing.T) {
	b := appliedSecretBed(t, "v4lue", "k3y!")
	left := filepath.Join(b.dir, "mail", ".smtp.password.mesh-0123456789ab")
	other := filepath.Join(b.dir, "mail", ".notes.mesh-0123456789ab")
	for _, p := range []string{left, other} {
		if err := os.WriteFile(p, []byte("v4lue"), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := New(Config{Node: "ace", DNS: netip.MustParseAddr("169.254.53.53"), LedgerPath: filepath.Join(b.dir, "ledger.json")}, newFake()); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Lstat(left); !os.IsNotExist(err) {
		t.Fatalf("the cut write's temporary file stays: %v", err)
	}
	if _, err := os.Lstat(other); err != nil {
		t.Fatalf("a file of another name went: %v", err)
	}
}
