package agent

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"mesh/cluster"
	"mesh/internal/restic"
	"mesh/internal/testutil"
	"mesh/reconciler"
	"mesh/state"
	"mesh/state/manifest"
)

// A restore's default is the newest snapshot this node made, else any
// node's; an incomplete one only when named; a named one must be one.
func TestPickSnapshot(t *testing.T) {
	at := func(m int) time.Time { return time.Date(2026, 12, 1, 10, m, 0, 0, time.UTC) }
	snaps := []restic.Snapshot{
		{ID: "aaaa1111bbbb", ShortID: "aaaa1111", Time: at(1), Tags: []string{"mesh", "module=db", "node=ace"}},
		{ID: "aaaa2222bbbb", ShortID: "aaaa2222", Time: at(2), Tags: []string{"mesh", "module=db", "node=bee"}},
		{ID: "cccc3333dddd", ShortID: "cccc3333", Time: at(3), Tags: []string{"mesh", "module=db", "node=ace", "incomplete"}},
	}
	for _, c := range []struct{ id, node, want, err string }{
		{"", "ace", "aaaa1111", ""},
		{"", "bee", "aaaa2222", ""},
		{"", "cat", "aaaa2222", ""},
		{"cccc3333", "ace", "cccc3333", ""},
		{"aaaa", "ace", "", "names 2 snapshots"},
		{"eeee5555", "ace", "", "has no snapshot eeee5555"},
	} {
		got, err := pickSnapshot(snaps, c.id, c.node, "db", nil)
		switch {
		case c.err != "" && (err == nil || !strings.Contains(err.Error(), c.err)):
			t.Errorf("%q on %s: %v, want %q", c.id, c.node, err, c.err)
		case c.err == "" && (err != nil || got.ShortID != c.want):
			t.Errorf("%q on %s: %v %v, want %s", c.id, c.node, got, err, c.want)
		}
	}
	// A snapshot this node recorded as missing files (its removal failed)
	// is not a default restore's either; named, it is taken.
	if got, err := pickSnapshot(snaps, "", "ace", "db", []string{"aaaa1111"}); err != nil || got.ShortID != "aaaa2222" {
		t.Errorf("with aaaa1111 unremoved: %v %v, want aaaa2222", got, err)
	}
	if got, err := pickSnapshot(snaps, "aaaa1111", "ace", "db", []string{"aaaa1111"}); err != nil || got.ShortID != "aaaa1111" {
		t.Errorf("aaaa1111 named: %v %v", got, err)
	}
	if _, err := pickSnapshot(nil, "", "ace", "db", nil); err == nil || !strings.Contains(err.Error(), "no snapshot in the repository yet") {
		t.Errorf("none: %v", err)
	}
}

// The swap of a restored copy is one exchange: DIR is never missing; the
// data as it was is kept aside; a kill after the exchange leaves it in the
// staging directory, marked, and the next restore keeps it rather than
// removing it; a staging directory without the mark (a restore cut short)
// goes.
func TestSwapIn(t *testing.T) {
	root := t.TempDir()
	d := filepath.Join(root, "srv", "db")
	write := func(p, s string) {
		os.MkdirAll(filepath.Dir(p), 0o755)
		if err := os.WriteFile(p, []byte(s), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	read := func(p string) string { b, _ := os.ReadFile(p); return string(b) }
	write(d+"/v", "old")
	write(d+restoreStaging+d+"/v", "restored")
	aside, err := swapIn(d)
	if err != nil {
		t.Fatal(err)
	}
	if read(d+"/v") != "restored" || read(aside+"/v") != "old" || aside != d+restoreAside {
		t.Fatalf("after the swap: %q, aside %q", read(d+"/v"), read(aside+"/v"))
	}
	if _, err := os.Lstat(d + restoreStaging); !os.IsNotExist(err) {
		t.Fatalf("the staging directory stays: %v", err)
	}

	// Killed after the exchange: the old data waits, marked, in staging.
	write(d+restoreStaging+d+"/v", "second")
	write(filepath.Join(d+restoreStaging, swapped), "")
	if err := unix.Renameat2(unix.AT_FDCWD, d+restoreStaging+d, unix.AT_FDCWD, d, unix.RENAME_EXCHANGE); err != nil {
		t.Fatal(err)
	}
	if err := finishSwap(d); err != nil {
		t.Fatal(err)
	}
	if read(d+"/v") != "second" || read(d+restoreAside+"/v") != "restored" {
		t.Fatalf("after a cut swap: %q, aside %q", read(d+"/v"), read(d+restoreAside+"/v"))
	}
	// Killed after the mark, before the exchange: the staging copy is the
	// snapshot's, and is not kept as the data as it was (a review found
	// it kept so, which an operator rolling back would have taken).
	write(d+restoreStaging+d+"/v", "third")
	var st unix.Stat_t
	if err := unix.Lstat(d+restoreStaging+d, &st); err != nil {
		t.Fatal(err)
	}
	write(filepath.Join(d+restoreStaging, swapped), strconv.FormatUint(st.Ino, 10))
	if err := finishSwap(d); err != nil {
		t.Fatal(err)
	}
	if read(d+"/v") != "second" || read(d+restoreAside+"/v") != "restored" {
		t.Fatalf("after a swap cut before its exchange: %q, aside %q", read(d+"/v"), read(d+restoreAside+"/v"))
	}
	if _, err := os.Lstat(d + restoreStaging); !os.IsNotExist(err) {
		t.Fatalf("the staging of a swap cut before its exchange stays: %v", err)
	}
	// A restore cut short (no mark): its staging goes, nothing else moves.
	write(d+restoreStaging+d+"/v", "partial")
	if err := finishSwap(d); err != nil {
		t.Fatal(err)
	}
	if read(d+"/v") != "second" || read(d+restoreAside+"/v") != "restored" {
		t.Fatal("a cut restore moved something")
	}
	if _, err := os.Lstat(d + restoreStaging); !os.IsNotExist(err) {
		t.Fatalf("a cut restore's staging stays: %v", err)
	}
	// Killed after the data as it was moved aside, before its staging
	// directory (the mark in it) went: the aside path is kept, the mark
	// goes (a review found the next finishSwap, at the agent's start or
	// the next restore, removed the data as it was).
	write(filepath.Join(d+restoreStaging, swapped), "")
	if err := finishSwap(d); err != nil {
		t.Fatal(err)
	}
	if read(d+"/v") != "second" || read(d+restoreAside+"/v") != "restored" {
		t.Fatalf("after a swap cut once moved aside: %q, aside %q", read(d+"/v"), read(d+restoreAside+"/v"))
	}
	if _, err := os.Lstat(d + restoreStaging); !os.IsNotExist(err) {
		t.Fatalf("the staging of a swap cut once moved aside stays: %v", err)
	}
	// A mount point is refused before anything is staged.
	if err := sameDevice(d); err != nil {
		t.Fatalf("a plain directory: %v", err)
	}
	if err := sameDevice("/proc"); err == nil || !strings.Contains(err.Error(), "mount point") {
		t.Fatalf("/proc: %v", err)
	}
}

// stagedDirs makes three data directories (data, wal, conf), each holding
// v "old NAME" and staged with a restored copy whose v is "restored NAME".
func stagedDirs(t *testing.T) []string {
	root := t.TempDir()
	var dirs []string
	for _, n := range []string{"data", "wal", "conf"} {
		d := filepath.Join(root, "srv", n)
		for p, v := range map[string]string{d + "/v": "old " + n, d + restoreStaging + d + "/v": "restored " + n} {
			os.MkdirAll(filepath.Dir(p), 0o755)
			if err := os.WriteFile(p, []byte(v), 0o600); err != nil {
				t.Fatal(err)
			}
		}
		dirs = append(dirs, d)
	}
	return dirs
}

// A restore of several data directories is all or none: when the swap of
// one fails (before its exchange, after it, or once its data as it was is
// aside), those swapped before it get their data back and the module is
// not started on a mix of two points in time.
func TestSwapAllInIsAllOrNone(t *testing.T) {
	for _, at := range []string{"before the exchange", "after the exchange", "once aside"} {
		t.Run(strings.ReplaceAll(at, " ", "_"), func(t *testing.T) {
			dirs := stagedDirs(t)
			last := dirs[2]
			swap := func(d string) (string, error) {
				if d != last {
					return swapIn(d)
				}
				switch at {
				case "after the exchange":
					s := d + restoreStaging
					var st unix.Stat_t
					if err := unix.Lstat(s+d, &st); err != nil {
						t.Fatal(err)
					}
					if err := os.WriteFile(filepath.Join(s, swapped), []byte(strconv.FormatUint(st.Ino, 10)), 0o600); err != nil {
						t.Fatal(err)
					}
					if err := unix.Renameat2(unix.AT_FDCWD, s+d, unix.AT_FDCWD, d, unix.RENAME_EXCHANGE); err != nil {
						t.Fatal(err)
					}
				case "once aside":
					if _, err := swapIn(d); err != nil {
						t.Fatal(err)
					}
				}
				return "", errors.New("no space left on device")
			}
			kept, err := swapAllIn(dirs, swap, func(string, error) {})
			if err == nil || !strings.Contains(err.Error(), "no space left on device") || !strings.Contains(err.Error(), "no directory of the module was restored") || kept != nil {
				t.Fatalf("swapAllIn: %v, kept %v", err, kept)
			}
			for _, d := range dirs {
				if b, _ := os.ReadFile(d + "/v"); string(b) != "old "+filepath.Base(d) {
					t.Errorf("%s holds %q after the failed restore, want its data as it was", d, b)
				}
				for _, p := range []string{d + restoreAside, d + restoreStaging} {
					if _, err := os.Lstat(p); !os.IsNotExist(err) {
						t.Errorf("%s stays after the failed restore: %v", p, err)
					}
				}
			}
		})
	}
	// A mark left empty (a full disk under an earlier release's plain
	// write, before the exchange): which copy is which is not known, and
	// neither moves; the live data stays in place.
	t.Run("empty_mark", func(t *testing.T) {
		root := t.TempDir()
		d := filepath.Join(root, "srv", "db")
		for p, v := range map[string]string{d + "/v": "old", d + restoreStaging + d + "/v": "restored"} {
			os.MkdirAll(filepath.Dir(p), 0o755)
			os.WriteFile(p, []byte(v), 0o600)
		}
		swap := func(d string) (string, error) {
			os.WriteFile(filepath.Join(d+restoreStaging, swapped), nil, 0o600)
			return "", errors.New("no space left on device")
		}
		_, err := swapAllIn([]string{d}, swap, func(string, error) {})
		if err == nil || !strings.Contains(err.Error(), "could not be put back") {
			t.Fatalf("swapAllIn: %v", err)
		}
		if b, _ := os.ReadFile(d + "/v"); string(b) != "old" {
			t.Fatalf("%s holds %q, want its data as it was", d, b)
		}
		if b, _ := os.ReadFile(d + restoreStaging + d + "/v"); string(b) != "restored" {
			t.Fatalf("the restored copy went: %q", b)
		}
	})
	// All swapped: each one's data as it was is aside.
	root := t.TempDir()
	d := filepath.Join(root, "srv", "db")
	for p, v := range map[string]string{d + "/v": "old", d + restoreStaging + d + "/v": "restored"} {
		os.MkdirAll(filepath.Dir(p), 0o755)
		os.WriteFile(p, []byte(v), 0o600)
	}
	kept, err := swapAllIn([]string{d}, swapIn, func(string, error) {})
	if b, _ := os.ReadFile(d + "/v"); err != nil || kept[d] != d+restoreAside || string(b) != "restored" {
		t.Fatalf("swapAllIn: %v, kept %v, %s holds %q", err, kept, d, b)
	}
}

// What an earlier restore kept aside stays when a restore fails before
// its exchanges: the second directory has no restored copy (its mark
// cannot be written), and neither directory loses its copy from before the
// earlier restore.
func TestFailedSwapKeepsTheEarlierRestoresCopy(t *testing.T) {
	root := t.TempDir()
	d1, d2 := filepath.Join(root, "srv", "data"), filepath.Join(root, "srv", "wal")
	for p, v := range map[string]string{
		d1 + "/v": "now data", d1 + restoreAside + "/v": "before data",
		d2 + "/v": "now wal", d2 + restoreAside + "/v": "before wal",
		d1 + restoreStaging + d1 + "/v": "restored data", // d2's copy is missing
	} {
		os.MkdirAll(filepath.Dir(p), 0o755)
		if err := os.WriteFile(p, []byte(v), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	kept, err := swapAllIn([]string{d1, d2}, swapIn, func(string, error) {})
	if err == nil || !strings.Contains(err.Error(), "no directory of the module was restored") || kept != nil {
		t.Fatalf("swapAllIn: %v, kept %v", err, kept)
	}
	for _, d := range []string{d1, d2} {
		n := filepath.Base(d)
		if b, _ := os.ReadFile(d + "/v"); string(b) != "now "+n {
			t.Errorf("%s holds %q, want its data as it was", d, b)
		}
		if b, err := os.ReadFile(d + restoreAside + "/v"); string(b) != "before "+n {
			t.Errorf("what the earlier restore kept aside of %s: %q, %v", d, b, err)
		}
		if _, err := os.Lstat(d + restoreStaging); !os.IsNotExist(err) {
			t.Errorf("the staging of %s stays: %v", d, err)
		}
	}
}

// A snapshot that missed files and could not be removed (another node's
// run held the repository's lock) is tried a few times, then recorded: the
// record outlives the agent, a default restore here passes over it, and
// the module's next backup removes it (with the real restic; a stand-in
// that cannot take the lock for the failing removal).
func TestUnremovedSnapshots(t *testing.T) {
	ctx := t.Context()
	repo := realRepo(t)
	data := t.TempDir()
	if err := os.WriteFile(filepath.Join(data, "v"), []byte("x"), 0o600); err != nil {
		t.Fatal(err)
	}
	sum, err := repo.Backup(ctx, []string{data}, []string{"mesh", "module=db", "node=ace"}, nil)
	if err != nil {
		t.Fatal(err)
	}

	// The removal fails every time: tried forgetTries times, then said.
	dir := t.TempDir()
	calls := filepath.Join(dir, "calls")
	locked := repo
	locked.Binary = filepath.Join(dir, "restic")
	script := "#!/bin/sh\necho \"$*\" >> " + calls + "\necho 'unable to create lock in backend: repository is already locked exclusively' >&2\nexit 1\n"
	if err := os.WriteFile(locked.Binary, []byte(script), 0o755); err != nil {
		t.Fatal(err)
	}
	defer func(n int, w time.Duration) { forgetTries, forgetWait = n, w }(forgetTries, forgetWait)
	forgetWait = time.Millisecond
	if err := forgetIncomplete(ctx, locked, sum.SnapshotID); err == nil || !strings.Contains(err.Error(), "locked") {
		t.Fatalf("forget under a lock: %v", err)
	}
	if b, _ := os.ReadFile(calls); strings.Count(string(b), "forget") != forgetTries {
		t.Fatalf("forget tried %d times, want %d (calls: %q)", strings.Count(string(b), "forget"), forgetTries, b)
	}

	state := t.TempDir()
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	b := newBackups("ace", nil, nil, state, log)
	b.keepUnremoved("db", []string{sum.SnapshotID, "0123abcd"}) // the second: gone from the repository since
	b = newBackups("ace", nil, nil, state, log)                 // the agent restarted
	if got := b.unremovedOf("db"); len(got) != 2 || got[0] != sum.SnapshotID {
		t.Fatalf("the record after a restart: %v", got)
	}
	snaps, err := repo.Snapshots(ctx, []string{"mesh", "module=db"})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := pickSnapshot(snaps, "", "ace", "db", b.unremovedOf("db")); err == nil {
		t.Fatal("a default restore took the snapshot that missed files")
	}

	// Still locked at the next backup: it stays recorded.
	b.removeUnremoved(ctx, locked, "db")
	if got := b.unremovedOf("db"); len(got) != 2 {
		t.Fatalf("a removal that failed again dropped the record: %v", got)
	}
	b.removeUnremoved(ctx, repo, "db")
	if got := newBackups("ace", nil, nil, state, log).unremovedOf("db"); len(got) != 0 {
		t.Fatalf("after the next backup's removal the record holds %v", got)
	}
	if snaps, err := repo.Snapshots(ctx, []string{"mesh", "module=db"}); err != nil || len(snaps) != 0 {
		t.Fatalf("the snapshot that missed files stays: %v %v", snaps, err)
	}
}

// A restore refuses a data directory that holds a mount (a bind of the
// same file system included): swapped aside with it, the next restore
// would remove the mount's files.
func TestRestoreRefusesMountsInside(t *testing.T) {
	if err := mountsInside([]string{t.TempDir()}); err != nil {
		t.Fatalf("no mount: %v", err)
	}
	_, data := testutil.BindInside(t)
	if err := mountsInside([]string{data}); err == nil || !strings.Contains(err.Error(), data+" holds another mount ("+filepath.Join(data, "media")+")") {
		t.Fatalf("a data directory holding a bind mount: %v", err)
	}
}

// A kill between two swaps of a restore (or anywhere in them, or in the
// undo itself) never starts the module on a mix: the journal written
// before the first swap makes the next start put every directory back as
// it was, and leaves an earlier restore's copy aside alone where the
// restore did not reach it.
func TestCutRestoreIsUndoneAtStart(t *testing.T) {
	read := func(p string) string { b, _ := os.ReadFile(p); return string(b) }
	exchange := func(t *testing.T, a, b string) {
		if err := unix.Renameat2(unix.AT_FDCWD, a, unix.AT_FDCWD, b, unix.RENAME_EXCHANGE); err != nil {
			t.Fatal(err)
		}
	}
	mark := func(t *testing.T, d string) {
		os.RemoveAll(d + restoreAside) // as swapIn does first
		var st unix.Stat_t
		if err := unix.Lstat(d+restoreStaging+d, &st); err != nil {
			t.Fatal(err)
		}
		os.WriteFile(filepath.Join(d+restoreStaging, swapped), []byte(strconv.FormatUint(st.Ino, 10)), 0o600)
	}
	for _, tc := range []struct {
		name string
		cut  func(t *testing.T, dirs []string)
		// reached: the restore reached the conf directory (its swap
		// removes an earlier restore's copy aside).
		reached bool
	}{
		{"before any swap", func(t *testing.T, dirs []string) {}, false},
		{"after the first swap", func(t *testing.T, dirs []string) {
			if _, err := swapIn(dirs[0]); err != nil {
				t.Fatal(err)
			}
		}, false},
		{"in the second swap, between its mark and its exchange", func(t *testing.T, dirs []string) {
			if _, err := swapIn(dirs[0]); err != nil {
				t.Fatal(err)
			}
			mark(t, dirs[1])
		}, false},
		{"in the third swap, after its exchange", func(t *testing.T, dirs []string) {
			for _, d := range dirs[:2] {
				if _, err := swapIn(d); err != nil {
					t.Fatal(err)
				}
			}
			mark(t, dirs[2])
			exchange(t, dirs[2]+restoreStaging+dirs[2], dirs[2])
		}, true},
		{"after every swap, before the journal went", func(t *testing.T, dirs []string) {
			for _, d := range dirs {
				if _, err := swapIn(d); err != nil {
					t.Fatal(err)
				}
			}
		}, true},
		{"after a failed swap was put back, before the journal went", func(t *testing.T, dirs []string) {
			swap := func(d string) (string, error) {
				if d == dirs[1] {
					return "", errors.New("no space left on device")
				}
				return swapIn(d)
			}
			if _, err := swapAllIn(dirs, swap, func(string, error) {}); err == nil {
				t.Fatal("the failing swap did not fail")
			}
		}, false},
		{"in an undo, after its exchange back", func(t *testing.T, dirs []string) {
			if _, err := swapIn(dirs[0]); err != nil {
				t.Fatal(err)
			}
			exchange(t, dirs[0]+restoreAside, dirs[0])
		}, false},
	} {
		t.Run(strings.ReplaceAll(tc.name, " ", "_"), func(t *testing.T) {
			dirs := stagedDirs(t)
			b := cutRestore(t, dirs)
			tc.cut(t, dirs)
			if err := b.undoCutRestore(context.Background()); err != nil {
				t.Fatal(err)
			}
			for _, d := range dirs {
				if got := read(d + "/v"); got != "old "+filepath.Base(d) {
					t.Errorf("%s holds %q, want its data as it was", d, got)
				}
				if _, err := os.Lstat(d + restoreStaging); !os.IsNotExist(err) {
					t.Errorf("%s's staging stays: %v", d, err)
				}
				if got := read(d + restoreAside + "/v"); strings.HasPrefix(got, "restored") {
					t.Errorf("%s's copy aside is the restored one", d)
				}
			}
			if got := read(dirs[2] + restoreAside + "/v"); !tc.reached && got != "before an earlier restore" {
				t.Errorf("an earlier restore's copy aside holds %q", got)
			}
			if _, err := os.Lstat(filepath.Join(b.dir, restoreJournal)); !os.IsNotExist(err) {
				t.Errorf("the journal stays: %v", err)
			}
		})
	}
}

// cutRestore is a restore of dirs (stagedDirs) by module db, its journal
// written, the conf directory's copy aside an earlier restore's; the
// module has no containers, and dirs are its data directories.
func cutRestore(t *testing.T, dirs []string) *backups {
	os.MkdirAll(dirs[2]+restoreAside, 0o755)
	os.WriteFile(dirs[2]+restoreAside+"/v", []byte("before an earlier restore"), 0o600)
	b := newBackups("n1", nil, nil, t.TempDir(), testutil.Logger(t))
	b.hasContainers = func(context.Context, string) (bool, error) { return false, nil }
	b.dataDirs = func(_ context.Context, module string) ([]string, error) {
		if module != "db" {
			return nil, nil
		}
		return dirs, nil
	}
	if _, err := b.writeRestoreJournal("db", dirs); err != nil {
		t.Fatal(err)
	}
	return b
}

// A journal the undo cannot trust, or a module it must not act under,
// moves nothing and says why in the log; the journal is set aside for the
// operator all the same (the module may run from here on, and a journal
// undone under it later would lose what it wrote): the module running
// again, a runtime that cannot say, a path that is none of its data
// directories, a journal that cannot be read, one that names a directory
// twice (undone twice, the second exchange would put the restored copy
// back), a staged copy that is not the one the journal names.
func TestCutRestoreUndoRefuses(t *testing.T) {
	for _, tc := range []struct {
		name string
		set  func(t *testing.T, b *backups, dirs []string)
		// swapped: the directories hold the restored copies (else the
		// cut came before the first swap)
		swapped bool
	}{
		{"the module runs again", func(_ *testing.T, b *backups, _ []string) {
			b.hasContainers = func(context.Context, string) (bool, error) { return true, nil }
		}, true},
		{"no data directory of the module", func(_ *testing.T, b *backups, dirs []string) {
			b.dataDirs = func(context.Context, string) ([]string, error) { return dirs[:2], nil }
		}, true},
		{"a damaged journal", func(_ *testing.T, b *backups, _ []string) {
			os.WriteFile(filepath.Join(b.dir, restoreJournal), []byte(`{"module":"db","dirs":[{"dir":`), 0o600)
		}, true},
		{"a staged copy that is not the restored one", func(_ *testing.T, b *backups, dirs []string) {
			d := dirs[0]
			replaceDir(d+restoreStaging+d, "restored data")
		}, false},
		{"a directory named twice", func(t *testing.T, b *backups, _ []string) {
			j := mustJournal(t, b)
			j.Dirs = append(j.Dirs, j.Dirs[0])
			writeJournal(t, b, j)
		}, true},
		{"an entry without an inode (an earlier format)", func(_ *testing.T, b *backups, dirs []string) {
			os.WriteFile(filepath.Join(b.dir, restoreJournal), []byte(`{"module":"db","dirs":[{"dir":"`+dirs[0]+`","restored":12,"dev":3}]}`), 0o600)
		}, true},
	} {
		t.Run(strings.ReplaceAll(tc.name, " ", "_"), func(t *testing.T) {
			dirs := stagedDirs(t)
			b := cutRestore(t, dirs)
			want := "old "
			if tc.swapped {
				want = "restored "
				for _, d := range dirs {
					if _, err := swapIn(d); err != nil {
						t.Fatal(err)
					}
				}
			}
			tc.set(t, b, dirs)
			if err := b.undoCutRestore(context.Background()); err != nil {
				t.Fatal(err)
			}
			for _, d := range dirs {
				if b, _ := os.ReadFile(d + "/v"); string(b) != want+filepath.Base(d) {
					t.Errorf("%s holds %q: the refused undo moved it", d, b)
				}
			}
			if !tc.swapped {
				if b, _ := os.ReadFile(dirs[0] + restoreStaging + dirs[0] + "/v"); string(b) != "restored data" {
					t.Errorf("the staged copy not known went: %q", b)
				}
			}
			if _, err := os.Lstat(filepath.Join(b.dir, restoreJournal)); !os.IsNotExist(err) {
				t.Errorf("the journal stays where a start would undo it: %v", err)
			}
			if kept, _ := filepath.Glob(filepath.Join(b.dir, "restore-journal-*.json")); len(kept) != 1 {
				t.Errorf("the journal is not kept beside for the operator: %v", kept)
			}
		})
	}
}

// Podman or the plan not answering at start is no reason to let the module
// start on a mix: the agent does not start (to try again), and nothing
// moves or goes.
func TestCutRestoreWaitsForTheRuntime(t *testing.T) {
	dirs := stagedDirs(t)
	b := cutRestore(t, dirs)
	swapIn(dirs[0])
	dataDirs := b.dataDirs
	b.dataDirs = func(context.Context, string) ([]string, error) { return nil, errors.New("no plan yet") }
	err := b.undoCutRestore(context.Background())
	if err == nil || !strings.Contains(err.Error(), "no plan yet") || !strings.Contains(err.Error(), "does not start") {
		t.Fatalf("undo without the plan: %v", err)
	}
	b.dataDirs = dataDirs
	b.hasContainers = func(context.Context, string) (bool, error) { return false, errors.New("podman socket down") }
	err = b.undoCutRestore(context.Background())
	if err == nil || !strings.Contains(err.Error(), "podman socket down") || !strings.Contains(err.Error(), "does not start") {
		t.Fatalf("undo without the runtime: %v", err)
	}
	if b, _ := os.ReadFile(dirs[0] + "/v"); string(b) != "restored data" {
		t.Fatalf("%s holds %q: moved without the runtime", dirs[0], b)
	}
	if _, err := os.Lstat(filepath.Join(b.dir, restoreJournal)); err != nil {
		t.Fatalf("the journal went: %v", err)
	}
	b.hasContainers = func(context.Context, string) (bool, error) { return false, nil }
	if err := b.undoCutRestore(context.Background()); err != nil {
		t.Fatal(err)
	}
	if b, _ := os.ReadFile(dirs[0] + "/v"); string(b) != "old data" {
		t.Fatalf("%s holds %q once the runtime answers", dirs[0], b)
	}
}

// The undo tells every directory apart before it moves any: a staged copy
// it cannot tell for the restored one, met after swapped directories,
// leaves those as they are too (the undo makes no mix of its own).
func TestCutRestoreUndoMovesNothingUnlessAll(t *testing.T) {
	dirs := stagedDirs(t)
	b := cutRestore(t, dirs)
	for _, d := range dirs[:2] {
		if _, err := swapIn(d); err != nil {
			t.Fatal(err)
		}
	}
	d := dirs[2]
	replaceDir(d+restoreStaging+d, "restored conf")
	if _, err := undoAll(mustJournal(t, b)); err == nil || !strings.Contains(err.Error(), "nothing was moved") {
		t.Fatalf("undo: %v", err)
	}
	for _, d := range dirs[:2] {
		if b, _ := os.ReadFile(d + "/v"); string(b) != "restored "+filepath.Base(d) {
			t.Errorf("%s holds %q: moved before the undo knew it could do all", d, b)
		}
	}
}

func mustJournal(t *testing.T, b *backups) restoreJournalFile {
	raw, err := os.ReadFile(filepath.Join(b.dir, restoreJournal))
	if err != nil {
		t.Fatal(err)
	}
	var j restoreJournalFile
	if err := json.Unmarshal(raw, &j); err != nil {
		t.Fatal(err)
	}
	return j
}

// writeJournal writes j as b's journal.
func writeJournal(t *testing.T, b *backups, j restoreJournalFile) {
	raw, err := json.Marshal(j)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(b.dir, restoreJournal), raw, 0o600); err != nil {
		t.Fatal(err)
	}
}

// replaceDir puts at p a new directory, surely not the one there (made
// before that one goes, so it cannot take its inode), holding v "text".
func replaceDir(p, text string) {
	tmp := p + ".new"
	os.MkdirAll(tmp, 0o755)
	os.WriteFile(tmp+"/v", []byte(text), 0o600)
	os.RemoveAll(p)
	os.Rename(tmp, p)
}

// A restore that fails after its journal is written settles it at once,
// the module still stopped: put back whole, the journal goes and the error
// says nothing was restored; not put back, the journal is set aside (no
// start undoes it under the module) and the error says the module starts
// on a mix.
func TestFailedRestoreSettlesItsJournal(t *testing.T) {
	dirs := stagedDirs(t)
	b := cutRestore(t, dirs)
	swapIn(dirs[0])
	err := b.settleJournal(mustJournal(t, b), errors.New("no space left on device"))
	if err == nil || !strings.Contains(err.Error(), "nothing was restored (every data directory is as it was)") {
		t.Fatalf("settled: %v", err)
	}
	if v, _ := os.ReadFile(dirs[0] + "/v"); string(v) != "old data" {
		t.Fatalf("%s holds %q", dirs[0], v)
	}
	if _, err := os.Lstat(filepath.Join(b.dir, restoreJournal)); !os.IsNotExist(err) {
		t.Fatalf("the journal stays: %v", err)
	}

	dirs = stagedDirs(t)
	b = cutRestore(t, dirs)
	j := mustJournal(t, b)
	swapIn(dirs[0])
	replaceDir(dirs[1]+restoreStaging+dirs[1], "unknown")
	err = b.settleJournal(j, errors.New("no space left on device"))
	if err == nil || !strings.Contains(err.Error(), "some data directories were restored and others not") {
		t.Fatalf("settled: %v", err)
	}
	if _, err := os.Lstat(filepath.Join(b.dir, restoreJournal)); !os.IsNotExist(err) {
		t.Fatalf("the journal stays where a start would undo it: %v", err)
	}
	if kept, _ := filepath.Glob(filepath.Join(b.dir, "restore-journal-*.json")); len(kept) != 1 {
		t.Fatalf("the journal is not kept beside: %v", kept)
	}

	// Not put back, and the journal cannot be set aside either (the name
	// it would take is taken): the module is kept stopped while the
	// journal stays, since the next start undoes it and would take what
	// the module wrote into the restored directories; and starts again
	// once the journal is gone.
	dirs = stagedDirs(t)
	b = cutRestore(t, dirs)
	b.now = func() time.Time { return time.Unix(0, 1234) }
	if err := os.WriteFile(filepath.Join(b.dir, "restore-journal-1234.json"), nil, 0o600); err != nil {
		t.Fatal(err)
	}
	j = mustJournal(t, b)
	swapIn(dirs[0])
	replaceDir(dirs[1]+restoreStaging+dirs[1], "unknown")
	err = b.settleJournal(j, errors.New("no space left on device"))
	if err == nil || !strings.Contains(err.Error(), "the module is kept stopped while the journal stays") {
		t.Fatalf("settled: %v", err)
	}
	plan := &state.Plan{Node: "n1", Resources: []state.Resource{
		{Module: "db", Kind: manifest.KindDirectory, Name: dirs[0]},
		{Module: "db", Kind: manifest.KindStep, Name: "migrate"},
		{Module: "db", Kind: manifest.KindContainer, Name: "server"},
		{Module: "web", Kind: manifest.KindContainer, Name: "server"},
	}, Routes: []state.Route{{Name: "db", Module: "db", Port: 5432}, {Name: "web", Module: "web", Port: 80}}}
	held := b.holdIn(plan)
	var kinds []string
	for _, r := range held.Resources {
		kinds = append(kinds, r.Module+" "+r.Kind)
	}
	for _, r := range held.Routes {
		kinds = append(kinds, r.Module+" route")
	}
	if strings.Join(kinds, ", ") != "db directory, web container, web route" || len(plan.Resources) != 4 || len(plan.Routes) != 2 {
		t.Fatalf("the plan while the journal stays: %v (the node's plan itself holds %d resources, %d routes)", kinds, len(plan.Resources), len(plan.Routes))
	}
	if err := os.Remove(filepath.Join(b.dir, restoreJournal)); err != nil {
		t.Fatal(err)
	}
	if got := b.holdIn(plan); got != plan || b.held != "" {
		t.Fatalf("the plan once the journal is gone: %d resources, held %q", len(got.Resources), b.held)
	}
}

// A journal that cannot be read now (an I/O error, not a damaged file)
// is no reason to let the module start on a mix: the agent does not start,
// and nothing moves or goes.
func TestUnreadableJournalStopsTheStart(t *testing.T) {
	dirs := stagedDirs(t)
	b := cutRestore(t, dirs)
	swapIn(dirs[0])
	path := filepath.Join(b.dir, restoreJournal)
	os.Remove(path)
	if err := os.Mkdir(path, 0o700); err != nil { // read(2) says EISDIR
		t.Fatal(err)
	}
	err := b.undoCutRestore(context.Background())
	if err == nil || !strings.Contains(err.Error(), "cannot be read now") || !strings.Contains(err.Error(), "does not start") {
		t.Fatalf("a journal that cannot be read now: %v", err)
	}
	if v, _ := os.ReadFile(dirs[0] + "/v"); string(v) != "restored data" {
		t.Fatalf("%s holds %q", dirs[0], v)
	}
	if kept, _ := filepath.Glob(filepath.Join(b.dir, "restore-journal-*.json")); len(kept) != 0 {
		t.Fatalf("the journal was set aside: %v", kept)
	}
}

// A swap mark that cannot be read (an I/O error) is not taken for no mark:
// the staging directory may hold the data as it was, and nothing there is
// removed or moved.
func TestUnreadableSwapMarkMovesNothing(t *testing.T) {
	dirs := stagedDirs(t)
	d := dirs[0]
	s := d + restoreStaging
	// The exchange made, the mark then unreadable: the staging path
	// holds the data as it was.
	if err := unix.Renameat2(unix.AT_FDCWD, s+d, unix.AT_FDCWD, d, unix.RENAME_EXCHANGE); err != nil {
		t.Fatal(err)
	}
	if err := os.Mkdir(filepath.Join(s, swapped), 0o700); err != nil {
		t.Fatal(err)
	}
	if err := finishSwap(d); err == nil || !strings.Contains(err.Error(), "nothing there was removed") {
		t.Fatalf("finishSwap: %v", err)
	}
	if err := swapBack(d, false); err == nil || !strings.Contains(err.Error(), "nothing was moved") {
		t.Fatalf("swapBack: %v", err)
	}
	if v, _ := os.ReadFile(s + d + "/v"); string(v) != "old data" {
		t.Fatalf("the data as it was: %q", v)
	}
	if v, _ := os.ReadFile(d + "/v"); string(v) != "restored data" {
		t.Fatalf("%s holds %q", d, v)
	}
}

// A restore measures what it writes and refuses, before it stops the
// module, one whose copy would leave a filesystem under cluster.LowFree
// (the data it replaces stays until the copy is whole): the snapshot
// whole when all of it comes to one filesystem, else each directory's
// files. A size that cannot be told is errUnmeasured (the restore goes on,
// warned).
func TestRestoreMeasuresItsRoom(t *testing.T) {
	ctx := t.Context()
	repo := realRepo(t)
	root := t.TempDir()
	data, dump := filepath.Join(root, "data"), filepath.Join(root, "dump")
	for d, n := range map[string]int{data: 3 << 20, dump: 1 << 20} {
		os.Mkdir(d, 0o700)
		if err := os.WriteFile(filepath.Join(d, "f"), bytes.Repeat([]byte{'x'}, n), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	sum, err := repo.Backup(ctx, []string{data, dump}, []string{"mesh"}, nil)
	if err != nil {
		t.Fatal(err)
	}
	snap := &restic.Snapshot{ID: sum.SnapshotID, ShortID: sum.SnapshotID[:8], Paths: []string{data, dump}}

	// Each entry a block more: the directories above root, data, dump and
	// their files.
	whole, err := restoreSizes(ctx, repo, snap, []string{data, dump})
	if err != nil || !slices.Equal(whole, []uint64{3<<20 + 2*entryBlock, 1<<20 + 2*entryBlock}) {
		t.Fatalf("the whole snapshot into two directories: %v, %v", whole, err)
	}
	// Only data restored (dump no longer declared): its own files.
	if sizes, err := restoreSizes(ctx, repo, snap, []string{data}); err != nil || !slices.Equal(sizes, []uint64{3<<20 + 2*entryBlock}) {
		t.Fatalf("one directory of two: %v, %v", sizes, err)
	}
	// On two filesystems: each directory's files.
	fakeFS(t, func(p string) uint64 {
		if strings.HasPrefix(p, dump) {
			return 2
		}
		return 1
	}, func() uint64 { return cluster.LowFree + 5<<20 })
	if sizes, err := restoreSizes(ctx, repo, snap, []string{data, filepath.Join(dump, "inner")}); err != nil || !slices.Equal(sizes, []uint64{3<<20 + 2*entryBlock, 0}) {
		t.Fatalf("two filesystems: %v, %v", sizes, err)
	}

	if err := roomOn("ace", []string{data, dump}, whole, restoreFix([]string{data, dump})); err != nil {
		t.Fatalf("4 MiB with 5 MiB over the floor: %v", err)
	}
	fakeFS(t, nil, func() uint64 { return cluster.LowFree + 3<<20 })
	os.Mkdir(data+restoreAside, 0o700)
	err = roomOn("ace", []string{data, dump}, whole, restoreFix([]string{data, dump}))
	if !errors.Is(err, errNoRoom) || !strings.Contains(err.Error(), "a copy of 4.0 MiB") || !strings.Contains(err.Error(), "restore again") ||
		!strings.Contains(err.Error(), data+restoreAside+", what the last restore replaced") || strings.Contains(err.Error(), dump+restoreAside) {
		t.Fatalf("4 MiB with 3 MiB over the floor: %v", err)
	}

	// A file linked twice in one directory restored is written once (restic
	// restores the link); one linked into two directories restored is
	// written in each, which are restored one by one.
	a, b := filepath.Join(root, "a"), filepath.Join(root, "b")
	os.Mkdir(a, 0o700)
	os.Mkdir(b, 0o700)
	os.WriteFile(filepath.Join(a, "f"), bytes.Repeat([]byte{'y'}, 1<<20), 0o600)
	for _, l := range []string{filepath.Join(a, "g"), filepath.Join(b, "f")} {
		if err := os.Link(filepath.Join(a, "f"), l); err != nil {
			t.Fatal(err)
		}
	}
	one, err := repo.Backup(ctx, []string{a}, []string{"mesh"}, nil)
	if err != nil {
		t.Fatal(err)
	}
	sizes, err := restoreSizes(ctx, repo, &restic.Snapshot{ID: one.SnapshotID, Paths: []string{a}}, []string{a})
	if want := uint64(1<<20 + (strings.Count(root, "/")+3)*entryBlock); err != nil || !slices.Equal(sizes, []uint64{want}) {
		t.Fatalf("a file linked twice in the one directory restored: %v, %v; want %d (the link once, the directories above root an entry each)", sizes, err, want)
	}
	two, err := repo.Backup(ctx, []string{a, b}, []string{"mesh"}, nil)
	if err != nil {
		t.Fatal(err)
	}
	sizes, err = restoreSizes(ctx, repo, &restic.Snapshot{ID: two.SnapshotID, Paths: []string{a, b}}, []string{a, b})
	// a's files count f and g (never more than the snapshot whole, which
	// counts them once), b's f again.
	if err != nil || !slices.Equal(sizes, []uint64{uint64(1<<20 + (strings.Count(root, "/")+5)*entryBlock), 1<<20 + 2*entryBlock}) {
		t.Fatalf("a file linked into two directories: %v, %v; want it counted in both", sizes, err)
	}

	wrong := repo
	wrong.Password = []byte("wrong")
	if _, err := restoreSizes(ctx, wrong, snap, []string{data}); !errors.Is(err, errUnmeasured) {
		t.Fatalf("a repository that cannot be read: %v", err)
	}
	gone := *snap
	gone.ID = strings.Repeat("ab", 32)
	if _, err := restoreSizes(ctx, repo, &gone, []string{data}); !errors.Is(err, errUnmeasured) {
		t.Fatalf("a snapshot that is not there: %v", err)
	}
}

// Small files are measured by the blocks they take, not their bytes: two
// thousand files of a byte hold 2 kB and take 8 MB, which a filesystem
// with 5 MiB over the floor has not.
func TestRestoreCountsSmallFilesByTheirBlocks(t *testing.T) {
	ctx := t.Context()
	repo := realRepo(t)
	data := filepath.Join(t.TempDir(), "data")
	os.Mkdir(data, 0o700)
	for i := range 2000 {
		if err := os.WriteFile(filepath.Join(data, strconv.Itoa(i)), []byte{'x'}, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	sum, err := repo.Backup(ctx, []string{data}, []string{"mesh"}, nil)
	if err != nil {
		t.Fatal(err)
	}
	snap := &restic.Snapshot{ID: sum.SnapshotID, ShortID: sum.SnapshotID[:8], Paths: []string{data}}
	sizes, err := restoreSizes(ctx, repo, snap, []string{data})
	if err != nil || len(sizes) != 1 || sizes[0] < 2000*entryBlock {
		t.Fatalf("2,000 files of a byte: %v, %v; want at least %d", sizes, err, 2000*entryBlock)
	}
	fakeFS(t, nil, func() uint64 { return cluster.LowFree + 5<<20 })
	if err := roomOn("ace", []string{data}, sizes, restoreFix([]string{data})); !errors.Is(err, errNoRoom) {
		t.Fatalf("8 MB of blocks with 5 MiB over the floor: %v", err)
	}
	if got := onDisk(restic.Size{Bytes: 1, Entries: 1 << 62}); got != ^uint64(0) {
		t.Fatalf("entries past the largest size: %d, want it saturated", got)
	}
}

// realRepo is a new repository of the real restic, of host ace.
func realRepo(t *testing.T) restic.Repo {
	t.Helper()
	if _, err := exec.LookPath("restic"); err != nil {
		t.Fatal("restic is not on PATH (apt-get install restic); this test runs the real binary")
	}
	repo := restic.Repo{URL: filepath.Join(t.TempDir(), "repo"), Password: []byte("correct horse"), Host: "ace"}
	if _, err := repo.Ensure(t.Context()); err != nil {
		t.Fatal(err)
	}
	return repo
}

// A data directory around the node's data dir (which the state cannot
// know) is neither backed up nor restored: its snapshots, which every
// node opens, would hold the node's keys, state and ledger.
func TestBackupRefusesTheNodesDataDir(t *testing.T) {
	s, err := state.Open(filepath.Join(t.TempDir(), "state.db"))
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	var index uint64
	apply := func(r state.Request) {
		t.Helper()
		index++
		if err := s.Apply(index, state.NewCommand(r).Encode()); err != nil {
			t.Fatalf("%s: %v", r.Op(), err)
		}
	}
	apply(&state.InitRequest{MeshID: "m-here", Domain: "internal", Node: state.Node{Name: "ace", Address: "10.2.0.1", Voter: true}})
	sp, err := state.SpecOf("x.yaml", "module: x\nresources:\n  - directory: /srv/x\n    data: true\n")
	if err != nil {
		t.Fatal(err)
	}
	apply(&state.ModuleAddRequest{Modules: []state.ModuleSpec{sp}})
	apply(&state.AssignRequest{Assignment: state.Assignment{Node: "ace", Module: "x"}})
	for dataDir, refused := range map[string]bool{"/srv/x/mesh": true, "/var/lib/mesh": false} {
		rec, err := reconciler.New(reconciler.Config{Node: "ace", DataDir: dataDir, LedgerPath: filepath.Join(t.TempDir(), "ledger.json")}, nil)
		if err != nil {
			t.Fatal(err)
		}
		b := &backups{node: "ace", store: s, rec: rec}
		h, err := b.here(t.Context(), "x")
		if refused && (err == nil || !strings.Contains(err.Error(), "data directory /srv/x of x is neither backed up nor restored here: /srv/x/mesh is this node's data dir")) {
			t.Fatalf("the node's data dir at %s, inside x's: %v", dataDir, err)
		}
		if !refused && (err != nil || !slices.Equal(h.dirs, []string{"/srv/x"})) {
			t.Fatalf("the node's data dir at %s: %v %v", dataDir, h.dirs, err)
		}
	}
}

// What a restore keeps aside of a data directory holds no secret's or
// credential's file: a value removed or replaced since stays nowhere in
// plain text. No link in the copy aside is followed.
func TestRestoreKeepsNoSecretAside(t *testing.T) {
	root := t.TempDir()
	d := filepath.Join(root, "srv", "db")
	aside := d + restoreAside
	outside := filepath.Join(root, "elsewhere")
	for p, v := range map[string]string{aside + "/pw": "hunter2", aside + "/data": "rows", outside + "/cred": "not the copy's"} {
		os.MkdirAll(filepath.Dir(p), 0o755)
		if err := os.WriteFile(p, []byte(v), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.Symlink(outside, aside+"/sub"); err != nil {
		t.Fatal(err)
	}
	dropSecretsAside(d, aside, []string{d + "/pw", d + "/sub/cred", "/srv/other/pw", d})
	if _, err := os.Lstat(aside + "/pw"); !os.IsNotExist(err) {
		t.Errorf("the secret's file stays aside: %v", err)
	}
	if b, _ := os.ReadFile(aside + "/data"); string(b) != "rows" {
		t.Errorf("the data aside: %q", b)
	}
	if b, _ := os.ReadFile(outside + "/cred"); string(b) != "not the copy's" {
		t.Errorf("a file through a link in the copy aside was removed: %q", b)
	}
}
