package restic

import (
	"bytes"
	"context"
	"crypto/sha256"
	"errors"
	"io/fs"
	"maps"
	"math"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// These tests run the real restic (CI installs it): a missing one fails
// them, as a missing Podman fails the integration beds.

// newRepo is an initialised repository in a temp dir.
func newRepo(t *testing.T) Repo {
	t.Helper()
	if _, err := exec.LookPath("restic"); err != nil {
		t.Fatal("restic is not on PATH (apt-get install restic); these tests run the real binary")
	}
	r := Repo{URL: filepath.Join(t.TempDir(), "repo"), Password: []byte("correct horse"), Host: "node-a"}
	if _, err := r.Ensure(t.Context()); err != nil {
		t.Fatal(err)
	}
	return r
}

// fakeRestic is a script standing in for restic: it records its arguments
// and its environment as exec gave them, writes stderr and exits with code.
func fakeRestic(t *testing.T, stderr string, code int) (bin, dir string) {
	t.Helper()
	dir = t.TempDir()
	bin = filepath.Join(dir, "restic")
	script := "#!/bin/sh\nprintf '%s\\n' \"$@\" > " + dir + "/args\ncat /proc/$$/environ > " + dir + "/env\nprintf '" + stderr + "' >&2\nexit " + string(rune('0'+code)) + "\n"
	if err := os.WriteFile(bin, []byte(script), 0o755); err != nil {
		t.Fatal(err)
	}
	return bin, dir
}

// The first Ensure creates the repository, the next finds it; a wrong
// password is told as such, not as a missing repository.
func TestEnsure(t *testing.T) {
	ctx := t.Context()
	r := Repo{URL: filepath.Join(t.TempDir(), "repo"), Password: []byte("correct horse")}
	created, err := r.Ensure(ctx)
	if err != nil || !created {
		t.Fatalf("first Ensure: created %v, %v", created, err)
	}
	if _, err := os.Stat(filepath.Join(r.URL, "config")); err != nil {
		t.Fatalf("no repository made: %v", err)
	}
	created, err = r.Ensure(ctx)
	if err != nil || created {
		t.Fatalf("second Ensure: created %v, %v", created, err)
	}

	r.Password = []byte("battery staple")
	created, err = r.Ensure(ctx)
	if !errors.Is(err, ErrWrongPassword) || created {
		t.Fatalf("wrong password: created %v, %v", created, err)
	}
	if !strings.Contains(err.Error(), "the repository's password is wrong") {
		t.Errorf("message does not say the password is wrong: %v", err)
	}
	if _, err := r.Snapshots(ctx, nil); !errors.Is(err, ErrWrongPassword) {
		t.Errorf("snapshots with a wrong password: %v", err)
	}
}

// entry is what a restore must give back of one path.
type entry struct {
	mode     fs.FileMode
	uid, gid uint32
	link     string
	digest   [32]byte
	mtime    time.Time
	ino      uint64
}

func tree(t *testing.T, root string) map[string]entry {
	t.Helper()
	m := map[string]entry{}
	err := filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		fi, err := os.Lstat(p)
		if err != nil {
			return err
		}
		st := fi.Sys().(*syscall.Stat_t)
		e := entry{mode: fi.Mode(), uid: st.Uid, gid: st.Gid, ino: st.Ino}
		switch {
		case fi.Mode()&fs.ModeSymlink != 0:
			if e.link, err = os.Readlink(p); err != nil {
				return err
			}
		case fi.Mode().IsRegular():
			b, err := os.ReadFile(p)
			if err != nil {
				return err
			}
			e.digest, e.mtime = sha256.Sum256(b), fi.ModTime()
		}
		rel, _ := filepath.Rel(root, p)
		m[rel] = e
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return m
}

// A restored tree is the tree backed up: modes, owners, times, contents,
// a link to /etc/shadow as that link (never its target's content), a hard
// link pair as one inode, a sparse file's bytes.
func TestBackupRestore(t *testing.T) {
	ctx := t.Context()
	r := newRepo(t)
	src := filepath.Join(t.TempDir(), "data")
	must := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	must(os.MkdirAll(filepath.Join(src, "sub"), 0o750))
	must(os.WriteFile(filepath.Join(src, "plain.txt"), []byte("hello\n"), 0o644))
	must(os.WriteFile(filepath.Join(src, "sub", "secret.key"), []byte("key material\n"), 0o600))
	must(os.Chmod(filepath.Join(src, "sub", "secret.key"), 0o600))
	must(os.Chown(filepath.Join(src, "sub", "secret.key"), 1234, 5678))
	must(os.Chown(filepath.Join(src, "sub"), 1234, 5678))
	must(os.Symlink("/etc/shadow", filepath.Join(src, "shadow")))
	must(os.WriteFile(filepath.Join(src, "a"), []byte("one inode, two names\n"), 0o644))
	must(os.Link(filepath.Join(src, "a"), filepath.Join(src, "sub", "b")))
	f, err := os.Create(filepath.Join(src, "sparse"))
	must(err)
	_, err = f.WriteAt([]byte("start"), 0)
	must(err)
	_, err = f.WriteAt([]byte("end"), 3<<20)
	must(err)
	must(f.Close())

	var calls int
	sum, err := r.Backup(ctx, []string{src}, []string{"mod-a"}, func(Progress) { calls++ })
	if err != nil {
		t.Fatal(err)
	}
	if sum.Unconfined != "" {
		t.Errorf("the backup ran unconfined: %s", sum.Unconfined)
	}
	if !validID(sum.SnapshotID) || sum.FilesNew != 5 || sum.TotalFiles != 5 || sum.DataAdded == 0 {
		t.Errorf("summary %+v: want a snapshot ID and 5 new files", sum)
	}
	t.Logf("summary %+v, %d progress calls", sum, calls)

	target := filepath.Join(t.TempDir(), "restored")
	if err := r.Restore(ctx, sum.SnapshotID, target); err != nil {
		t.Fatal(err)
	}
	want, got := tree(t, src), tree(t, filepath.Join(target, src))
	for p, w := range want {
		g, ok := got[p]
		switch {
		case !ok:
			t.Errorf("%s: not restored", p)
		case g.mode != w.mode || g.uid != w.uid || g.gid != w.gid:
			t.Errorf("%s: restored %v %d:%d, want %v %d:%d", p, g.mode, g.uid, g.gid, w.mode, w.uid, w.gid)
		case g.link != w.link || g.digest != w.digest:
			t.Errorf("%s: restored link %q digest %x, want %q %x", p, g.link, g.digest, w.link, w.digest)
		case !g.mtime.Equal(w.mtime):
			t.Errorf("%s: restored mtime %v, want %v", p, g.mtime, w.mtime)
		}
	}
	if len(got) != len(want) {
		t.Errorf("restored %d entries, backed up %d", len(got), len(want))
	}
	if got["shadow"].mode&fs.ModeSymlink == 0 || got["shadow"].link != "/etc/shadow" {
		t.Errorf("the link to /etc/shadow came back as %+v", got["shadow"])
	}
	if got["a"].ino != got["sub/b"].ino {
		t.Error("the hard link pair came back as two files")
	}
	if shadow, err := os.ReadFile("/etc/shadow"); err == nil {
		d := sha256.Sum256(shadow)
		for p, e := range got {
			if e.mode.IsRegular() && e.digest == d {
				t.Errorf("%s holds /etc/shadow's content: the link was followed", p)
			}
		}
	}

	// Restoring one path of the snapshot restores only it.
	part := filepath.Join(t.TempDir(), "part")
	if err := r.Restore(ctx, sum.SnapshotID, part, filepath.Join(src, "sub")); err != nil {
		t.Fatal(err)
	}
	only := tree(t, filepath.Join(part, src))
	key, wantKey := only["sub/secret.key"], want["sub/secret.key"]
	key.ino, wantKey.ino = 0, 0
	if _, ok := only["plain.txt"]; ok || key != wantKey || only["sub/b"].digest != want["sub/b"].digest {
		t.Errorf("restore of sub alone gave %v", slices.Sorted(maps.Keys(only)))
	}

	// The next backup reads the same files as unmodified.
	sum, err = r.Backup(ctx, []string{src}, []string{"mod-a"}, nil)
	if err != nil || sum.FilesUnmodified != 5 || sum.FilesNew != 0 {
		t.Errorf("second backup: %+v, %v", sum, err)
	}
}

// Snapshots with tags lists those holding all of them, oldest first.
func TestSnapshotsTags(t *testing.T) {
	ctx := t.Context()
	r := newRepo(t)
	r.CacheDir = t.TempDir() // the other tests run with --no-cache
	src := t.TempDir()
	os.WriteFile(filepath.Join(src, "f"), []byte("x"), 0o644)
	var ids []string
	for _, tags := range [][]string{{"mod-a", "daily"}, {"mod-b"}, {"mod-a"}} {
		sum, err := r.Backup(ctx, []string{src}, tags, nil)
		if err != nil {
			t.Fatal(err)
		}
		ids = append(ids, sum.SnapshotID)
	}
	for _, c := range []struct {
		tags []string
		want []string
	}{
		{nil, ids},
		{[]string{"mod-a"}, []string{ids[0], ids[2]}},
		{[]string{"mod-a", "daily"}, ids[:1]},
		{[]string{"daily", "mod-a"}, ids[:1]},
		{[]string{"mod-b", "daily"}, nil},
		{[]string{"none"}, nil},
	} {
		snaps, err := r.Snapshots(ctx, c.tags)
		if err != nil {
			t.Fatal(err)
		}
		var got []string
		for _, s := range snaps {
			got = append(got, s.ShortID)
			if s.Host != "node-a" || !slices.Equal(s.Paths, []string{src}) || !strings.HasPrefix(s.ID, s.ShortID) {
				t.Errorf("snapshot %+v: want host node-a, paths [%s]", s, src)
			}
		}
		if !slices.Equal(got, c.want) {
			t.Errorf("tags %q: got %q, want %q", c.tags, got, c.want)
		}
		if !slices.IsSortedFunc(snaps, func(a, b Snapshot) int { return a.Time.Compare(b.Time) }) {
			t.Errorf("tags %q: not oldest first", c.tags)
		}
	}
	if cached, _ := os.ReadDir(r.CacheDir); len(cached) == 0 {
		t.Error("nothing cached in CacheDir")
	}
}

// Forget with Keep{Last: 1} removes the older snapshot of the tag and no
// other; an all-zero Keep is refused and removes nothing.
func TestForget(t *testing.T) {
	ctx := t.Context()
	r := newRepo(t)
	src := t.TempDir()
	os.WriteFile(filepath.Join(src, "f"), []byte("x"), 0o644)
	var ids []string
	for _, tag := range []string{"mod-a", "mod-b", "mod-a"} {
		sum, err := r.Backup(ctx, []string{src}, []string{tag}, nil)
		if err != nil {
			t.Fatal(err)
		}
		ids = append(ids, sum.SnapshotID)
	}
	for _, keep := range []Keep{{}, {Daily: -1}} {
		if _, err := r.Forget(ctx, []string{"mod-a"}, keep, true); err == nil {
			t.Errorf("Keep %+v taken", keep)
		} else {
			t.Log(err)
		}
	}
	if snaps, _ := r.Snapshots(ctx, nil); len(snaps) != 3 {
		t.Fatalf("a refused forget removed snapshots: %d left", len(snaps))
	}

	removed, err := r.Forget(ctx, []string{"mod-a"}, Keep{Last: 1}, true)
	if err != nil {
		t.Fatal(err)
	}
	if len(removed) != 1 || !strings.HasPrefix(removed[0], ids[0]) {
		t.Errorf("removed %q, want the older mod-a snapshot %s", removed, ids[0])
	}
	snaps, err := r.Snapshots(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	var left []string
	for _, s := range snaps {
		left = append(left, s.ShortID)
	}
	if !slices.Equal(left, ids[1:]) {
		t.Errorf("left %q, want %q", left, ids[1:])
	}
	// Nothing more to forget: an empty list, not nil or an error.
	if removed, err := r.Forget(ctx, []string{"mod-a"}, Keep{Last: 1}, false); err != nil || removed == nil || len(removed) != 0 {
		t.Errorf("second forget: %q, %v", removed, err)
	}
}

// A cancelled backup ends at once (SIGINT, well within StopGrace), leaves
// no snapshot and no lock behind.
func TestBackupCancel(t *testing.T) {
	r := newRepo(t)
	src := t.TempDir()
	f, err := os.Create(filepath.Join(src, "big"))
	if err != nil {
		t.Fatal(err)
	}
	f.Truncate(8 << 30) // sparse: costs no disk, takes restic many seconds to read
	f.Close()

	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	var once sync.Once
	var at time.Time
	_, err = r.Backup(ctx, []string{src}, nil, func(p Progress) {
		if p.BytesDone > 0 {
			once.Do(func() { at = time.Now(); cancel() })
		}
	})
	if at.IsZero() {
		t.Fatalf("the backup ended before it reported progress: %v", err)
	}
	took := time.Since(at)
	if !errors.Is(err, context.Canceled) {
		t.Errorf("err %v, want context.Canceled", err)
	}
	if took > StopGrace/2 {
		t.Errorf("backup took %v to stop", took)
	}
	t.Logf("stopped in %v: %v", took, err)
	if snaps, err := r.Snapshots(t.Context(), nil); err != nil || len(snaps) != 0 {
		t.Errorf("snapshots after a cancelled backup: %v, %v", snaps, err)
	}
	if locks, _ := os.ReadDir(filepath.Join(r.URL, "locks")); len(locks) != 0 {
		t.Errorf("the interrupted run left %d locks", len(locks))
	}
}

// Without restic the error says how to install it.
func TestMissingBinary(t *testing.T) {
	t.Setenv("PATH", t.TempDir())
	r := Repo{URL: filepath.Join(t.TempDir(), "repo"), Password: []byte("pw")}
	_, err := r.Ensure(t.Context())
	if !errors.Is(err, ErrNotInstalled) || err.Error() != "restic is not installed (apt-get install restic)" {
		t.Errorf("no restic on PATH: %v", err)
	}
	r.Binary = "/nonexistent/restic"
	_, err = r.Snapshots(t.Context(), nil)
	if !errors.Is(err, ErrNotInstalled) || !strings.Contains(err.Error(), "apt-get install restic") || !strings.Contains(err.Error(), r.Binary) {
		t.Errorf("a missing Binary: %v", err)
	}
}

// The child sees only what the Repo says and the agent's PATH, HOME and
// TMPDIR: an operator's RESTIC_* and other variables never reach it, and
// the password is never an argument.
func TestEnvironment(t *testing.T) {
	bin, dir := fakeRestic(t, "", 0)
	t.Setenv("RESTIC_REPOSITORY", "/decoy")
	t.Setenv("RESTIC_PASSWORD_FILE", "/decoy/pw")
	t.Setenv("OPERATOR_TOKEN", "x")
	t.Setenv("HOME", "/home/agent")
	t.Setenv("TMPDIR", "/var/tmp")
	r := Repo{URL: "s3:s3.example.com/bucket", Password: []byte("pass word\n"), Binary: bin, CacheDir: "/var/cache/mesh-restic", Env: []string{"AWS_ACCESS_KEY_ID=key"}}
	if err := r.Restore(t.Context(), "0123abcd", "/restore/here"); err != nil {
		t.Fatal(err)
	}
	args, _ := os.ReadFile(filepath.Join(dir, "args"))
	if string(args) != "restore\n0123abcd\n--target=/restore/here\n" {
		t.Errorf("args %q", args)
	}
	env, _ := os.ReadFile(filepath.Join(dir, "env"))
	got := strings.Split(strings.TrimSuffix(string(env), "\x00"), "\x00")
	want := []string{"PATH=" + os.Getenv("PATH"), "HOME=/home/agent", "TMPDIR=/var/tmp", "RESTIC_REPOSITORY=s3:s3.example.com/bucket", "RESTIC_PASSWORD=pass word\n", "RESTIC_CACHE_DIR=/var/cache/mesh-restic", "AWS_ACCESS_KEY_ID=key"}
	if !slices.Equal(got, want) {
		t.Errorf("environment\n%q\nwant\n%q", got, want)
	}

	// Without a cache: --no-cache, and with no HOME a HOME at CacheDir only.
	t.Setenv("HOME", "")
	r.CacheDir = ""
	if _, err := r.Snapshots(t.Context(), []string{"a", "b"}); err == nil {
		t.Error("empty output taken as a snapshot list")
	}
	args, _ = os.ReadFile(filepath.Join(dir, "args"))
	env, _ = os.ReadFile(filepath.Join(dir, "env"))
	if string(args) != "--no-cache\nsnapshots\n--json\n--tag=a,b\n" || strings.Contains(string(env), "HOME=") {
		t.Errorf("no cache: args %q env %q", args, env)
	}
}

// A failed run's error is "restic NAME: " and restic's last lines, cleaned
// of terminal sequences.
func TestRunError(t *testing.T) {
	bin, _ := fakeRestic(t, `loading\n\033[2Ksignal interrupt received\nFatal: unable to create target directory: permission denied\n`, 1)
	r := Repo{URL: "/r", Password: []byte("pw"), Binary: bin}
	err := r.Restore(t.Context(), "0123abcd", "/restore/here")
	want := "restic restore 0123abcd: loading; signal interrupt received; Fatal: unable to create target directory: permission denied"
	if err == nil || err.Error() != want {
		t.Errorf("got %v\nwant %s", err, want)
	}
}

// What restic would misread, or what would do harm, is refused before
// restic runs.
func TestRefused(t *testing.T) {
	bin, dir := fakeRestic(t, "", 0)
	good := Repo{URL: "/r", Password: []byte("pw"), Binary: bin}
	ctx := t.Context()
	abs := t.TempDir()
	backup := func(r Repo, paths, tags []string) error {
		_, err := r.Backup(ctx, paths, tags, nil)
		return err
	}
	withRepo := func(f func(*Repo)) Repo { r := good; f(&r); return r }
	for name, err := range map[string]error{
		"no paths":         backup(good, nil, nil),
		"relative path":    backup(good, []string{"data"}, nil),
		"dash path":        backup(good, []string{"-rf"}, nil),
		"missing path":     backup(good, []string{filepath.Join(abs, "missing")}, nil),
		"comma tag":        backup(good, []string{abs}, []string{"a,b"}),
		"dash tag":         backup(good, []string{abs}, []string{"--exclude=x"}),
		"empty tag":        backup(good, []string{abs}, []string{""}),
		"dash host":        backup(withRepo(func(r *Repo) { r.Host = "-h" }), []string{abs}, nil),
		"snapshots tag":    func() error { _, err := good.Snapshots(ctx, []string{"x,y"}); return err }(),
		"id latest":        good.Restore(ctx, "latest", abs),
		"id flag":          good.Restore(ctx, "--help", abs),
		"id upper":         good.Restore(ctx, "DEADBEEF", abs),
		"id short":         good.Restore(ctx, "abc", abs),
		"id long":          good.Restore(ctx, strings.Repeat("a", 65), abs),
		"relative target":  good.Restore(ctx, "0123abcd", "out"),
		"relative include": good.Restore(ctx, "0123abcd", abs, "srv/db"),
		"dash target":      good.Restore(ctx, "0123abcd", "-x"),
		"keep nothing":     func() error { _, err := good.Forget(ctx, nil, Keep{}, true); return err }(),
		"keep negative":    func() error { _, err := good.Forget(ctx, nil, Keep{Last: 1, Weekly: -1}, false); return err }(),
		"forget tag":       func() error { _, err := good.Forget(ctx, []string{"-a"}, Keep{Last: 1}, false); return err }(),
		"env owned":        withRepo(func(r *Repo) { r.Env = []string{"RESTIC_PASSWORD_FILE=/x"} }).Restore(ctx, "0123abcd", abs),
		"env not an entry": withRepo(func(r *Repo) { r.Env = []string{"AWS"} }).Restore(ctx, "0123abcd", abs),
		"no password":      withRepo(func(r *Repo) { r.Password = nil }).Restore(ctx, "0123abcd", abs),
		"no url":           withRepo(func(r *Repo) { r.URL = "" }).Restore(ctx, "0123abcd", abs),
	} {
		if err == nil {
			t.Errorf("%s: taken", name)
		} else {
			t.Logf("%s: %v", name, err)
		}
	}
	if _, err := os.Stat(filepath.Join(dir, "args")); err == nil {
		t.Error("a refused call ran restic")
	}
	// The same Repo and arguments, made right, do run it; a path's pattern
	// characters are escaped, so --include matches that path only.
	if err := good.Restore(ctx, "0123abcd", abs, "/srv/d[1]*?"); err != nil {
		t.Fatal(err)
	}
	if args, err := os.ReadFile(filepath.Join(dir, "args")); err != nil || string(args) != "--no-cache\nrestore\n0123abcd\n--target="+abs+"\n--include=/srv/d\\[1]\\*\\?\n" {
		t.Errorf("the good call: %q, %v", args, err)
	}
}

// restic's stderr becomes message lines: a JSON error in words, terminal
// sequences gone, a cut first line dropped.
func TestStderrLines(t *testing.T) {
	for _, c := range []struct {
		name string
		in   string
		want []string
	}{
		{"json path error", `{"message_type":"error","error":{"Op":"open","Path":"/proc/1/mem","Err":13},"during":"archival","item":"/proc/1/mem"}` + "\nWarning: at least one source file could not be read\n",
			[]string{"open /proc/1/mem: permission denied", "Warning: at least one source file could not be read"}},
		{"json text error", `{"message_type":"error","error":"boom","during":"scan","item":"/x"}`, []string{"/x: boom"}},
		{"terminal", "\x1b[2Ksignal interrupt received, cleaning up\r\n\n", []string{"signal interrupt received, cleaning up"}},
		{"not json", "{not json\n", []string{"{not json"}},
	} {
		if got := stderrLines([]byte(c.in)); !slices.Equal(got, c.want) {
			t.Errorf("%s: got %q, want %q", c.name, got, c.want)
		}
	}
	tb := &tailBuffer{max: 16}
	tb.Write([]byte(strings.Repeat("x", 40) + "\nlast\n"))
	if got := string(tb.Bytes()); got != "last\n" {
		t.Errorf("tail %q", got)
	}
}

// A backup's restic reads its paths bound without links: a link swapped
// in under a path (a container racing the backup) is not followed when a
// file under it is opened, while files and links are read as they are.
// Here the probe is cat, in restic's place, opening a file through a link
// to /etc in the data directory, as restic would have once a container
// swapped the link in between its look at a directory and its open.
func TestBackupReadsNoLinkUnderItsPaths(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Fatal("binding paths in a mount namespace of its own needs root: run the tests as root, as CI does (a rootless agent does it in Podman's user namespace)")
	}
	data := filepath.Join(t.TempDir(), "data")
	if err := os.MkdirAll(data, 0o755); err != nil {
		t.Fatal(err)
	}
	os.WriteFile(filepath.Join(data, "plain"), []byte("mine\n"), 0o644)
	if err := os.Symlink("/etc", filepath.Join(data, "sub")); err != nil {
		t.Fatal(err)
	}
	cat, err := exec.LookPath("cat")
	if err != nil {
		t.Fatal(err)
	}
	r := Repo{URL: t.TempDir(), Password: []byte("x"), Binary: cat, CacheDir: t.TempDir()}
	read := func(confine []string, path string) (string, error) {
		var out bytes.Buffer
		err := r.runIn(t.Context(), &out, confine, path)
		return out.String(), err
	}
	through := filepath.Join(data, "sub", "hostname")
	if _, err := read(nil, through); err != nil {
		t.Fatalf("unconfined, cat %s: %v (the probe itself)", through, err)
	}
	if out, err := read([]string{data}, through); err == nil || !strings.Contains(err.Error(), "symbolic links") {
		t.Fatalf("confined, a file under a link in the data directory was read: %q, %v", out, err)
	}
	if out, err := read([]string{data}, filepath.Join(data, "plain")); err != nil || out != "mine\n" {
		t.Fatalf("confined, a file of the data directory: %q, %v", out, err)
	}
	// The namespace was the probe's: the host's path still follows its link.
	if _, err := os.ReadFile(through); err != nil {
		t.Fatalf("after the run, the host follows the link no more: %v", err)
	}
	// A path holding another mount is not bound (the bind would hide
	// that mount from the snapshot): made as before, and said.
	inner := filepath.Join(data, "mnt")
	os.Mkdir(inner, 0o755)
	if err := syscall.Mount("tmpfs", inner, "tmpfs", 0, "size=1m"); err != nil {
		t.Fatal(err)
	}
	os.WriteFile(filepath.Join(inner, "on-the-mount"), []byte("x"), 0o644)
	repo := newRepo(t)
	sum, err := repo.Backup(t.Context(), []string{data}, nil, nil)
	syscall.Unmount(inner, 0)
	if err != nil || !strings.Contains(sum.Unconfined, "holds another mount") || sum.TotalFiles != 2 {
		t.Fatalf("a backup of a directory holding a mount: %+v, %v (want it unconfined, with plain and on-the-mount)", sum, err)
	}
	// A mount(8) that takes nosymfollow without a word and does not apply
	// it (an older util-linux, a kernel before 5.10): made as before, and
	// said.
	fake := t.TempDir()
	os.WriteFile(filepath.Join(fake, "mount"), []byte(`#!/bin/sh
for a; do shift; [ "$a" = "remount,bind,nosymfollow" ] && a="remount,bind"; set -- "$@" "$a"; done
exec /usr/bin/mount "$@"
`), 0o755)
	if repo.Binary, err = exec.LookPath("restic"); err != nil {
		t.Fatal(err)
	}
	t.Setenv("PATH", fake+":/usr/bin:/bin")
	sum, err = repo.Backup(t.Context(), []string{data}, nil, nil)
	if err != nil || !strings.Contains(sum.Unconfined, "nosymfollow did not take") {
		t.Fatalf("a backup where nosymfollow does not take: %+v, %v", sum, err)
	}
	// A temporary directory reached through a link (TMPDIR) does not
	// make the binds look impossible.
	// (Outside the test's directory, whose parents the backup binds
	// without links: restic writes its temporary packs there.)
	outside, err := os.MkdirTemp("", "mesh-tmpdir-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(outside) })
	linked := outside + "-link"
	if err := os.Symlink(outside, linked); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.Remove(linked) })
	t.Setenv("TMPDIR", linked)
	t.Setenv("PATH", "/usr/bin:/bin")
	sum, err = repo.Backup(t.Context(), []string{data}, nil, nil)
	if err != nil || sum.Unconfined != "" {
		t.Fatalf("a backup with TMPDIR through a link: %+v, %v (want it confined)", sum, err)
	}
	// Where the paths cannot be bound (here no mount(8) on PATH), the
	// backup is made as before, and says so.
	t.Setenv("PATH", t.TempDir())
	sum, err = repo.Backup(t.Context(), []string{data}, nil, nil)
	if err != nil || !validID(sum.SnapshotID) || !strings.Contains(sum.Unconfined, "mount") {
		t.Fatalf("a backup whose paths cannot be bound: %+v, %v", sum, err)
	}
}

// A directory above a data directory that a container writes (it mounts
// /srv/app; /srv/app/x/data is the data directory) swapped for a link to
// another module's directory: before the backup, it is refused (nothing
// read, no fall back to a run that follows it); during it, after the
// binds, the link is not followed, the directories above bound without
// links too (a probe in restic's place swaps it in, then reads through it).
func TestBackupFollowsNoLinkAboveItsPaths(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Fatal("binding paths in a mount namespace of its own needs root: run the tests as root, as CI does")
	}
	root := t.TempDir()
	app, victim := filepath.Join(root, "app"), filepath.Join(root, "victim")
	for _, d := range []string{filepath.Join(app, "x", "data"), filepath.Join(victim, "data")} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	os.WriteFile(filepath.Join(app, "x", "data", "mine"), []byte("mine\n"), 0o644)
	os.WriteFile(filepath.Join(victim, "data", "secret"), []byte("the other module's\n"), 0o600)
	data := filepath.Join(app, "x", "data")
	swap := func() {
		t.Helper()
		os.RemoveAll(filepath.Join(app, "y"))
		if err := os.Rename(filepath.Join(app, "x"), filepath.Join(app, "y")); err != nil {
			t.Fatal(err)
		}
		if err := os.Symlink(victim, filepath.Join(app, "x")); err != nil {
			t.Fatal(err)
		}
	}
	swapOut := func() { // from another goroutine: no t.Fatal
		os.RemoveAll(filepath.Join(app, "y"))
		os.Rename(filepath.Join(app, "x"), filepath.Join(app, "y"))
		os.Symlink(victim, filepath.Join(app, "x"))
	}
	unswap := func() {
		os.Remove(filepath.Join(app, "x"))
		os.Rename(filepath.Join(app, "y"), filepath.Join(app, "x"))
	}

	// Swapped in before the backup: refused, with the link named.
	repo := newRepo(t)
	swap()
	sum, err := repo.Backup(t.Context(), []string{data}, nil, nil)
	if err == nil || !strings.Contains(err.Error(), filepath.Join(app, "x")+" is a link; not backed up") || sum.SnapshotID != "" {
		t.Fatalf("a backup through a link above its path: %+v, %v", sum, err)
	}
	// The binds refuse it too (the look above and the binds are apart):
	// exitLinked, never a run unconfined.
	cat, err := exec.LookPath("cat")
	if err != nil {
		t.Fatal(err)
	}
	r := Repo{URL: t.TempDir(), Password: []byte("x"), Binary: cat, CacheDir: t.TempDir()}
	var out bytes.Buffer
	err = r.runIn(t.Context(), &out, []string{data}, filepath.Join(data, "secret"))
	var rerr *runError
	if !errors.As(err, &rerr) || rerr.code != exitLinked || strings.Contains(out.String(), "the other module's") {
		t.Fatalf("bound through a link above the path: %q, %v", out.String(), err)
	}
	unswap()

	// Swapped in once the paths are bound: the probe swaps, then reads.
	probe := filepath.Join(t.TempDir(), "probe")
	os.WriteFile(probe, []byte(`#!/bin/sh
mv "$1/x" "$1/y" && ln -s "$2" "$1/x" && exec cat "$1/x/data/secret"
`), 0o755)
	r.Binary = probe
	out.Reset()
	err = r.runIn(t.Context(), &out, []string{data}, app, victim)
	unswap()
	if err == nil || strings.Contains(out.String(), "the other module's") {
		t.Fatalf("confined, a file through a link swapped in above the path was read: %q, %v", out.String(), err)
	}
	// Without the binds (the probe itself), the same swap reads it.
	out.Reset()
	err = r.runIn(t.Context(), &out, nil, app, victim)
	unswap()
	if err != nil || !strings.Contains(out.String(), "the other module's") {
		t.Fatalf("unconfined, the probe: %q, %v", out.String(), err)
	}
	// Swapped in between a directory's bind and its remount (by the test,
	// outside the backup's namespace, as a container would, while a
	// mount(8) in restic's place waits): the remount fails, and the
	// backup ends; it is not made again without the binds, which would
	// follow the link.
	fake, sig := t.TempDir(), t.TempDir()
	os.WriteFile(filepath.Join(fake, "mount"), []byte(`#!/bin/sh
for a; do last=$a; done
case "$*" in *remount*) if [ "$last" = "`+filepath.Join(app, "x")+`" ]; then
	touch "`+sig+`/now"; i=0; while [ ! -e "`+sig+`/done" ] && [ $i -lt 200 ]; do sleep 0.05; i=$((i+1)); done
fi;; esac
exec /usr/bin/mount "$@"
`), 0o755)
	if repo.Binary, err = exec.LookPath("restic"); err != nil {
		t.Fatal(err)
	}
	go func() {
		for i := 0; i < 400; i++ {
			if _, err := os.Stat(filepath.Join(sig, "now")); err == nil {
				swapOut()
				os.WriteFile(filepath.Join(sig, "done"), nil, 0o600)
				return
			}
			time.Sleep(25 * time.Millisecond)
		}
	}()
	t.Setenv("PATH", fake+":/usr/bin:/bin")
	sum, err = repo.Backup(t.Context(), []string{data}, nil, nil)
	unswap()
	if _, serr := os.Stat(filepath.Join(sig, "done")); serr != nil {
		t.Fatalf("the swap was not made at the remount: %v (backup: %+v, %v)", serr, sum, err)
	}
	if err == nil || !strings.Contains(err.Error(), "could not be bound onto itself without links") || sum.SnapshotID != "" {
		t.Fatalf("a link swapped in at the remount: %+v, %v (want the backup ended, never made unconfined)", sum, err)
	}
}

// mountsUnder finds a mount point under a path, mountinfo's escapes
// undone, and not the path itself or a sibling that shares its prefix.
func TestMountsUnder(t *testing.T) {
	info := `22 1 8:1 / / rw - ext4 /dev/sda1 rw
30 22 0:40 / /srv/app rw - tmpfs tmpfs rw
31 22 0:41 / /srv/app2/x rw - tmpfs tmpfs rw
32 22 0:42 / /srv/my\040data/inner rw - tmpfs tmpfs rw
`
	for _, tc := range []struct {
		path string
		want bool
	}{
		{"/srv/app", false}, {"/srv/app2", true}, {"/srv/my data", true}, {"/srv", true}, {"/srv/ap", false},
	} {
		if got := mountsUnder(info, []string{tc.path}) != ""; got != tc.want {
			t.Errorf("mountsUnder(%s) = %v, want %v", tc.path, got, tc.want)
		}
	}
}

// mountPointsUnder lists every mount point under one of the paths, in
// mountinfo's order (readBound counts their filesystems); mountsUnder
// names the first, with the first path it is under.
func TestMountPointsUnder(t *testing.T) {
	info := `22 1 8:1 / / rw - ext4 /dev/sda1 rw
30 22 0:40 / /srv/app rw - tmpfs tmpfs rw
31 22 0:41 / /srv/app2/x rw - tmpfs tmpfs rw
32 22 0:42 / /srv/my\040data/inner rw - tmpfs tmpfs rw
33 31 0:43 / /srv/app2/x/y rw - tmpfs tmpfs rw
`
	paths := []string{"/srv/app", "/srv/my data", "/srv/app2"}
	want := []string{"/srv/app2/x", "/srv/my data/inner", "/srv/app2/x/y"}
	if got := mountPointsUnder(info, paths); !slices.Equal(got, want) {
		t.Errorf("mountPointsUnder = %q, want %q", got, want)
	}
	if got := mountPointsUnder(info, []string{"/srv/app"}); len(got) != 0 {
		t.Errorf("mountPointsUnder(/srv/app) = %q, want none", got)
	}
	for _, tc := range []struct {
		paths []string
		want  string
	}{
		{[]string{"/srv/my data", "/srv"}, "/srv holds another mount (/srv/app)"},
		{[]string{"/srv/app2/x", "/srv/app2"}, "/srv/app2 holds another mount (/srv/app2/x)"},
		{[]string{"/srv/app2", "/srv/app2/x"}, "/srv/app2 holds another mount (/srv/app2/x)"},
		{[]string{"/srv/app2/x", "/srv/my data"}, "/srv/my data holds another mount (/srv/my data/inner)"},
	} {
		if got := mountsUnder(info, tc.paths); got != tc.want {
			t.Errorf("mountsUnder(%q) = %q, want %q", tc.paths, got, tc.want)
		}
	}
}

// BackupExcluding leaves out the paths it is given, each as itself (a
// name with a pattern's characters matches only that name).
func TestBackupExcluding(t *testing.T) {
	ctx := t.Context()
	r := newRepo(t)
	src := filepath.Join(t.TempDir(), "data")
	if err := os.MkdirAll(filepath.Join(src, "sub"), 0o750); err != nil {
		t.Fatal(err)
	}
	for _, f := range []string{"db", "pw[1]", "pw1", "sub/db.password", "sub/other"} {
		if err := os.WriteFile(filepath.Join(src, f), []byte(f), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	sum, err := r.BackupExcluding(ctx, []string{src}, []string{filepath.Join(src, "pw[1]"), filepath.Join(src, "sub/db.password")}, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	target := t.TempDir()
	if err := r.Restore(ctx, sum.SnapshotID, target); err != nil {
		t.Fatal(err)
	}
	for f, want := range map[string]bool{"db": true, "pw[1]": false, "pw1": true, "sub/db.password": false, "sub/other": true} {
		if _, err := os.Lstat(filepath.Join(target, src, f)); (err == nil) != want {
			t.Errorf("%s in the snapshot: %v, want %v", f, err == nil, want)
		}
	}
	if _, err := r.BackupExcluding(ctx, []string{src}, []string{"pw1"}, nil, nil); err == nil {
		t.Error("a relative path to leave out was taken")
	}
}

// A backup whose progress stands still for BackupStall is stopped, said;
// one whose progress moves runs on past it; one that prints no status
// line is not stopped by it.
func TestBackupStopsWhenItsProgressStandsStill(t *testing.T) {
	defer func(d time.Duration) { BackupStall = d }(BackupStall)
	BackupStall = time.Second
	src := t.TempDir()
	fake := func(body string) Repo {
		dir := t.TempDir()
		bin := filepath.Join(dir, "restic")
		if err := os.WriteFile(bin, []byte("#!/bin/sh\n"+body), 0o755); err != nil {
			t.Fatal(err)
		}
		return Repo{URL: filepath.Join(dir, "repo"), Password: []byte("pw"), Binary: bin}
	}
	const summary = `echo '{"message_type":"summary","snapshot_id":"0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef"}'`
	// One line, then nothing while it waits (on a fifo, say).
	start := time.Now()
	_, err := fake(`echo '{"message_type":"status","files_done":1,"bytes_done":10}'; exec sleep 30`+"\n").BackupExcluding(t.Context(), []string{src}, nil, nil, nil)
	if err == nil || !strings.Contains(err.Error(), "progress stood still") {
		t.Fatalf("a backup that stands still: %v", err)
	}
	if took := time.Since(start); took > 10*time.Second {
		t.Fatalf("stopped after %v", took)
	}
	// Lines that move every 100 ms for 3 s, then the summary.
	moving := `i=0; while [ $i -lt 30 ]; do i=$((i+1)); echo "{\"message_type\":\"status\",\"bytes_done\":$i}"; sleep 0.1; done; ` + summary + "\n"
	if _, err := fake(moving).BackupExcluding(t.Context(), []string{src}, nil, nil, nil); err != nil {
		t.Fatalf("a backup whose progress moves: %v", err)
	}
	// Lines that stand still but for their time (restic's every second).
	still := `i=0; while [ $i -lt 25 ]; do i=$((i+1)); echo '{"message_type":"status","bytes_done":5}'; sleep 0.1; done; ` + summary + "\n"
	if _, err := fake(still).BackupExcluding(t.Context(), []string{src}, nil, nil, nil); err == nil || !strings.Contains(err.Error(), "progress stood still") {
		t.Fatalf("a backup whose lines do not move: %v", err)
	}
	// No status line at all: not stopped by it.
	if _, err := fake("sleep 2; "+summary+"\n").BackupExcluding(t.Context(), []string{src}, nil, nil, nil); err != nil {
		t.Fatalf("a backup that prints no status line: %v", err)
	}
}

// What a restore writes is measured before it: the snapshot whole (a
// hard link counted once), and under one of its paths (each link counted;
// a sibling whose name extends it is not under it).
func TestRestoreSizes(t *testing.T) {
	r := newRepo(t)
	ctx := t.Context()
	root := t.TempDir()
	db, dbx := filepath.Join(root, "db"), filepath.Join(root, "db-extra")
	for _, d := range []string{filepath.Join(db, "base"), dbx} {
		if err := os.MkdirAll(d, 0o700); err != nil {
			t.Fatal(err)
		}
	}
	write := func(p string, n int) {
		if err := os.WriteFile(p, bytes.Repeat([]byte{'x'}, n), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	write(filepath.Join(db, "base", "big"), 300_000)
	write(filepath.Join(db, "small"), 1_000)
	write(filepath.Join(dbx, "other"), 50_000)
	if err := os.Link(filepath.Join(db, "base", "big"), filepath.Join(db, "linked")); err != nil {
		t.Fatal(err)
	}
	sum, err := r.Backup(ctx, []string{db, dbx}, []string{"mesh"}, nil)
	if err != nil {
		t.Fatal(err)
	}
	// Entries: the directories above root (restic keeps each), then db,
	// base, big, small, linked, db-extra and other.
	above := int64(strings.Count(root, "/"))
	if got, err := r.RestoreSize(ctx, sum.SnapshotID); err != nil || got != (Size{Bytes: 351_000, Entries: above + 7}) {
		t.Fatalf("RestoreSize = %+v, %v; want 351000 bytes (the link once) in %d entries", got, err, above+7)
	}
	if got, err := r.SizeUnder(ctx, sum.SnapshotID, db); err != nil || got != (Size{Bytes: 601_000, Entries: 5}) {
		t.Fatalf("SizeUnder(db) = %+v, %v; want 601000 bytes (the link twice, not db-extra) in 5 entries", got, err)
	}
	if got, err := r.SizeUnder(ctx, sum.SnapshotID, dbx); err != nil || got != (Size{Bytes: 50_000, Entries: 2}) {
		t.Fatalf("SizeUnder(db-extra) = %+v, %v; want 50000 bytes in 2 entries", got, err)
	}
	if _, err := r.SizeUnder(ctx, sum.SnapshotID, "relative"); err == nil {
		t.Fatal("a relative path was measured")
	}
	if _, err := r.RestoreSize(ctx, "deadbeef"); err == nil {
		t.Fatal("a snapshot that is not there has a size")
	}
	if _, err := r.SizeUnder(ctx, "deadbeef", db); err == nil {
		t.Fatal("a snapshot that is not there has a size under a path")
	}
}

// A backup that is to read more than its paths' filesystems hold is
// stopped, naming what it was to read, without a snapshot: a sparse file
// a container made of (nearly) any size is read by restic 0.14 hole by
// hole, for hours with the node held. With the real restic.
func TestBackupStopsBeforeReadingASparseFileForEver(t *testing.T) {
	r := newRepo(t)
	src := t.TempDir()
	defer func(f, s uint64) { ReadFactor, ReadSlack = f, s }(ReadFactor, ReadSlack)
	ReadFactor, ReadSlack = 1, 1<<30
	bound := readBound([]string{src})
	if bound == 0 {
		t.Fatalf("no bound for %s", src)
	}
	os.WriteFile(filepath.Join(src, "real"), []byte("data"), 0o600)
	hole := filepath.Join(src, "hole")
	f, err := os.Create(hole)
	if err != nil {
		t.Fatal(err)
	}
	if err := f.Truncate(int64(bound + 2<<30)); err != nil {
		t.Fatalf("make a sparse file of %d bytes (the filesystem's capacity and 3 GiB): %v", bound+2<<30, err)
	}
	f.Close()
	_, err = r.BackupExcluding(t.Context(), []string{src}, nil, []string{"mesh"}, nil)
	var tooMuch *TooMuchError
	if !errors.As(err, &tooMuch) || !strings.Contains(err.Error(), "restic backup: stopped: it was to read") || !strings.Contains(err.Error(), "find '"+src+"' -type f") {
		t.Fatalf("a backup of a sparse file larger than its filesystem: %v", err)
	}
	if snaps, err := r.Snapshots(t.Context(), nil); err != nil || len(snaps) != 0 {
		t.Fatalf("the stopped backup left snapshots %v (%v)", snaps, err)
	}
	// Without the file: backed up.
	os.Remove(hole)
	if _, err := r.BackupExcluding(t.Context(), []string{src}, nil, []string{"mesh"}, nil); err != nil {
		t.Fatalf("the backup without the sparse file: %v", err)
	}
}

// A size over int64 (a sparse file of 8 EiB: restic's counters are
// uint64), or over any uint64, is over the bound too, not a line passed
// over.
func TestBackupStopsOnSizesOverInt64(t *testing.T) {
	src := t.TempDir()
	for _, total := range []string{"9223372036854775808", "99999999999999999999"} {
		dir := t.TempDir()
		bin := filepath.Join(dir, "restic")
		os.WriteFile(bin, []byte("#!/bin/sh\necho '{\"message_type\":\"status\",\"total_bytes\":"+total+"}'; exec sleep 30\n"), 0o755)
		_, err := Repo{URL: filepath.Join(dir, "repo"), Password: []byte("pw"), Binary: bin}.BackupExcluding(t.Context(), []string{src}, nil, nil, nil)
		var tooMuch *TooMuchError
		if !errors.As(err, &tooMuch) {
			t.Fatalf("total_bytes %s: %v", total, err)
		}
	}
}

// within is manifest.Within's rule: the path itself or under it, not a
// sibling that shares its prefix.
func TestWithin(t *testing.T) {
	for _, tc := range []struct {
		p, dir string
		want   bool
	}{
		{"/srv/db", "/srv/db", true}, {"/srv/db/x", "/srv/db", true}, {"/srv/db-extra", "/srv/db", false},
		{"/srv", "/srv/db", false}, {"/srv/db", "/", true}, {"/", "/", true},
	} {
		if got := within(tc.p, tc.dir); got != tc.want {
			t.Errorf("within(%s, %s) = %v, want %v", tc.p, tc.dir, got, tc.want)
		}
	}
}

func TestReadBound(t *testing.T) {
	if got := readBound([]string{"/nonexistent-mesh-path"}); got != 0 {
		t.Fatalf("the bound of a path that is not there: %d", got)
	}
	a, b := t.TempDir(), t.TempDir() // one filesystem: counted once
	if one, two := readBound([]string{a}), readBound([]string{a, b}); one == 0 || one != two {
		t.Fatalf("two paths of one filesystem: %d, one: %d", two, one)
	}
	if satMul(1<<40, 1<<40) != ^uint64(0) || satMul(3, 4) != 12 {
		t.Fatal("satMul")
	}
}

// TestSizeOnDisk: a block for each entry, and figures past the largest
// uint64 (a repository's word is anyone's) saturate, by the multiply or by
// the sum, negative ones counting nothing.
func TestSizeOnDisk(t *testing.T) {
	for _, c := range []struct {
		s    Size
		want uint64
	}{
		{Size{Bytes: 10, Entries: 2}, 10 + 2*4096},
		{Size{Bytes: -5, Entries: -1}, 0},
		{Size{Bytes: 1, Entries: 1 << 62}, ^uint64(0)},
		{Size{Bytes: math.MaxInt64, Entries: math.MaxInt64/4096 + 2}, ^uint64(0)}, // by the sum
		{Size{Bytes: math.MaxInt64, Entries: 0}, math.MaxInt64},
	} {
		if got := c.s.OnDisk(4096); got != c.want {
			t.Errorf("%+v.OnDisk(4096) = %d, want %d", c.s, got, c.want)
		}
	}
}
