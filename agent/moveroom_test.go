package agent

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"mesh/cluster"
	"mesh/reconciler"
	"mesh/state"
)

// fakeFS makes filesystemOf answer free() for every path, on the filesystem
// devOf(path) (1 when nil), for the test.
func fakeFS(t *testing.T, devOf func(string) uint64, free func() uint64) {
	old := filesystemOf
	filesystemOf = func(p string) (uint64, uint64, error) {
		dev := uint64(1)
		if devOf != nil {
			dev = devOf(p)
		}
		return dev, free(), nil
	}
	t.Cleanup(func() { filesystemOf = old })
}

// A copy TO has not the room for is refused by the sizes FROM announces,
// summed by filesystem, before anything is written; one that takes a
// filesystem under the floor while it is written stops there. Either
// leaves cluster.LowFree.
func TestCopyKeepsTheNodesRoom(t *testing.T) {
	data := []string{"/srv/db/data", "/srv/db/dump", "/etc/db"}
	onRoot := func(p string) uint64 {
		if strings.HasPrefix(p, "/srv") {
			return 2
		}
		return 1
	}
	fakeFS(t, onRoot, func() uint64 { return cluster.LowFree + 100<<20 })
	// 60 + 30 MiB on /srv's filesystem, 10 on the root's: each fits.
	if err := roomFor("bee", data, []uint64{60 << 20, 30 << 20, 10 << 20}); err != nil {
		t.Fatalf("90 MiB and 10 MiB on two filesystems of 100 MiB over the floor: %v", err)
	}
	err := roomFor("bee", data, []uint64{60 << 20, 50 << 20, 10 << 20})
	if !errors.Is(err, errNoRoom) || !strings.Contains(err.Error(), "on bee: the filesystem of /srv/db has") || !strings.Contains(err.Error(), "a copy of 110.0 MiB") {
		t.Fatalf("110 MiB on a filesystem of 100 MiB over the floor: %v", err)
	}
	if err := roomFor("bee", data, []uint64{^uint64(0), 1, 0}); !errors.Is(err, errNoRoom) {
		t.Fatalf("an announce of 2^64 bytes: %v", err)
	}
	if got := parseSizes(sizesParam([]uint64{1, 2, 3}), 3); !slices.Equal(got, []uint64{1, 2, 3}) {
		t.Fatalf("sizes read back: %v", got)
	}
	for _, bad := range []string{"", "1,2", "1,x,3", "1,2,3,4"} {
		if got := parseSizes(bad, 3); got != nil {
			t.Errorf("parseSizes(%q) = %v, want none", bad, got)
		}
	}

	// While it is written: the free space falls as the stream is read.
	var read atomic.Int64
	fakeFS(t, nil, func() uint64 { return cluster.LowFree + 150<<20 - uint64(read.Load()) })
	g := &roomGuard{r: countReader{io.LimitReader(zeros{}, 1<<30), &read}, node: "bee", data: data}
	n, err := io.Copy(io.Discard, g)
	if !errors.Is(err, errNoRoom) || !errors.Is(g.failed(), errNoRoom) || !strings.Contains(err.Error(), "a copy of what is left") {
		t.Fatalf("a stream of 1 GiB into 150 MiB over the floor: %d bytes, %v (failed: %v)", n, err, g.failed())
	}
	if n < 150<<20 || n > 150<<20+roomEvery+1<<20 {
		t.Fatalf("the stream was stopped after %d MiB, not within a look (%d MiB) of 150 MiB", n>>20, roomEvery>>20)
	}
	if _, err := g.Read(make([]byte, 10)); !errors.Is(err, errNoRoom) {
		t.Fatalf("a read after the stop: %v", err)
	}
}

type zeros struct{}

func (zeros) Read(p []byte) (int, error) { clear(p); return len(p), nil }

type countReader struct {
	r io.Reader
	n *atomic.Int64
}

func (c countReader) Read(p []byte) (int, error) {
	n, err := c.r.Read(p)
	c.n.Add(int64(n))
	return n, err
}

// dataSizes counts what each directory's files take (a sparse file's
// holes do not; a file of two hard links once), follows no link, and
// leaves out what it cannot read.
func TestDataSizesCountWhatFilesTake(t *testing.T) {
	d, e := t.TempDir(), t.TempDir()
	if err := os.WriteFile(filepath.Join(d, "a"), bytes.Repeat([]byte("x"), 1<<20), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Link(filepath.Join(d, "a"), filepath.Join(d, "a2")); err != nil {
		t.Fatal(err)
	}
	sparse, err := os.Create(filepath.Join(d, "sparse"))
	if err != nil {
		t.Fatal(err)
	}
	sparse.Truncate(1 << 30)
	sparse.Close()
	outside := t.TempDir()
	os.WriteFile(filepath.Join(outside, "big"), bytes.Repeat([]byte("y"), 4<<20), 0o600)
	os.Symlink(outside, filepath.Join(d, "link"))
	os.WriteFile(filepath.Join(e, "b"), bytes.Repeat([]byte("z"), 2<<20), 0o600)
	n := dataSizes([]string{d, filepath.Join(d, "missing"), e})
	if n[0] < 1<<20 || n[0] > 3<<19 || n[1] != 0 || n[2] < 2<<20 || n[2] > 5<<19 {
		t.Fatalf("dataSizes: %v, want about 1 MiB, 0, 2 MiB", n)
	}
}

// Once a move is past its copy, what a copy into this node cut short left
// at its staging path (TO's agent killed while it wrote) is removed;
// nothing else is.
func TestStagingOfAnEndedMoveIsRemoved(t *testing.T) {
	root := t.TempDir()
	d := filepath.Join(root, "srv", "db", "data")
	for _, p := range []string{d, d + moveStaging + "/sub"} {
		if err := os.MkdirAll(p, 0o700); err != nil {
			t.Fatal(err)
		}
	}
	os.WriteFile(filepath.Join(d, "PG_VERSION"), []byte("15"), 0o600)
	// Another module's path beside a data directory (a manifest may
	// declare /srv/other.mesh-moving) is never removed as a leftover.
	theirs := filepath.Join(root, "srv", "other")
	if err := os.MkdirAll(theirs+moveStaging, 0o700); err != nil {
		t.Fatal(err)
	}
	owner := func(_ context.Context, p string) (string, error) {
		if p == theirs+moveStaging {
			return "other", nil
		}
		return "", nil
	}
	m := &movers{a: &Agent{log: slog.New(slog.NewTextHandler(io.Discard, nil))}, removing: map[string]bool{}, owner: owner}
	m.sweepStaging(context.Background(), state.MoveInfo{ID: 3, Module: "db", Phase: state.MoveAborted, Data: []string{d, "relative/x", theirs}})
	deadline := time.Now().Add(10 * time.Second)
	for {
		if _, err := os.Lstat(d + moveStaging); errors.Is(err, os.ErrNotExist) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the staging directory of an aborted move is still there")
		}
		time.Sleep(10 * time.Millisecond)
	}
	if b, err := os.ReadFile(filepath.Join(d, "PG_VERSION")); err != nil || string(b) != "15" {
		t.Fatalf("the data directory itself: %q %v", b, err)
	}
	for { // the sweep of theirs has ended once nothing is being removed
		m.mu.Lock()
		busy := len(m.removing)
		m.mu.Unlock()
		if busy == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the sweep did not end")
		}
		time.Sleep(10 * time.Millisecond)
	}
	if _, err := os.Lstat(theirs + moveStaging); err != nil {
		t.Fatalf("module other's path was removed: %v", err)
	}
}

// A path beside a data directory that a module owns (a manifest may
// declare /srv/db.mesh-restoring or /srv/db.mesh-moving) is never taken
// for a restore's or a move's: the ledger names its module (OwnerAt), and
// a restore of db refuses rather than remove it.
func TestPathsBesideADataDirectoryMayBeAModules(t *testing.T) {
	dir := t.TempDir()
	ledger := filepath.Join(dir, "ledger.json")
	os.WriteFile(ledger, []byte(`{"paths": {
		"/srv/db.mesh-restoring": {"kind": "directory", "module": "other"},
		"/srv/db.mesh-moving/inner": {"kind": "directory", "module": "third"},
		"/srv/db/data": {"kind": "directory", "module": "db"}}}`), 0o600)
	rec, err := reconciler.New(reconciler.Config{Node: "ace", LedgerPath: ledger}, nil)
	if err != nil {
		t.Fatal(err)
	}
	for p, want := range map[string]string{
		"/srv/db.mesh-restoring":      "other",
		"/srv/db.mesh-moving":         "third", // holds a path of its
		"/srv/db/data.mesh-moving":    "",
		"/srv/db/data.mesh-restoring": "",
	} {
		if got := rec.OwnerAt(p); got != want {
			t.Errorf("OwnerAt(%s) = %q, want %q", p, got, want)
		}
	}
	b := &backups{rec: rec}
	if err := b.besideIsOurs("/srv/db"); err == nil || !strings.Contains(err.Error(), "/srv/db.mesh-restoring, where a restore of /srv/db writes, is module other's") {
		t.Fatalf("a restore of /srv/db beside module other's path: %v", err)
	}
	if err := b.besideIsOurs("/srv/db/data"); err != nil {
		t.Fatalf("a restore of /srv/db/data: %v", err)
	}
}

// The parents a copy made for its data directories are removed when it
// does not come in: the deepest first, only while empty, never a module's
// path, and none above one that stays.
func TestParentsMadeForACopyAreRemoved(t *testing.T) {
	root := t.TempDir()
	makeParents := func(p string) ([]string, error) {
		missing, err := missingParents(p)
		for _, q := range missing {
			if err == nil {
				err = os.Mkdir(q, 0o755)
			}
		}
		return missing, err
	}
	made, err := makeParents(filepath.Join(root, "srv", "a", "b", "c"))
	if err != nil || len(made) != 4 {
		t.Fatalf("parents made: %v %v", made, err)
	}
	removeEmptyParents(made, func(string) string { return "" })
	if _, err := os.Lstat(filepath.Join(root, "srv")); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("the parents made are still there: %v", err)
	}
	// Something put in one since, or a module's path: it stays, and so
	// do the parents above it.
	made, _ = makeParents(filepath.Join(root, "srv", "a", "b", "c"))
	os.WriteFile(filepath.Join(root, "srv", "a", "b", "note"), []byte("mine"), 0o600)
	removeEmptyParents(made, func(string) string { return "" })
	if _, err := os.Lstat(filepath.Join(root, "srv", "a", "b", "c")); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("the empty deepest parent: %v", err)
	}
	if _, err := os.Lstat(filepath.Join(root, "srv", "a", "b", "note")); err != nil {
		t.Fatalf("a file put in a parent made: %v", err)
	}
	os.Remove(filepath.Join(root, "srv", "a", "b", "note"))
	os.Mkdir(filepath.Join(root, "srv", "a", "b", "c"), 0o755)
	theirs := filepath.Join(root, "srv", "a", "b")
	removeEmptyParents(made, func(p string) string {
		if p == theirs {
			return "other"
		}
		return ""
	})
	if _, err := os.Lstat(theirs); err != nil {
		t.Fatalf("module other's path: %v", err)
	}
	if _, err := os.Lstat(filepath.Join(theirs, "c")); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("the empty parent below it: %v", err)
	}
}

// The parents a copy made are recorded before they are made: a copy of
// the same move sent again (this node killed under the first) takes them
// as its own, for the ledger; a copy of another move removes what an
// earlier one recorded (while empty and no module's), and the record.
func TestParentsMadeAreRecordedForTheCopySentAgain(t *testing.T) {
	dir := t.TempDir()
	rec, err := reconciler.New(reconciler.Config{Node: "ace", LedgerPath: filepath.Join(dir, "ledger.json")}, nil)
	if err != nil {
		t.Fatal(err)
	}
	a := &Agent{dir: dir, reconciler: rec, log: slog.New(slog.NewTextHandler(io.Discard, nil))}
	ctx := context.Background()
	root := t.TempDir()
	made := []string{filepath.Join(root, "srv"), filepath.Join(root, "srv", "pg")}
	for _, p := range made {
		os.Mkdir(p, 0o755)
	}
	if err := writeMadeParents(dir, madeParents{Module: "pg", Move: 7, Paths: append(made, filepath.Join(root, "gone"), "relative")}); err != nil {
		t.Fatal(err)
	}
	if got, stale := a.parentsMadeBefore(ctx, "pg", 7); !slices.Equal(got, made) || len(stale) != 0 {
		t.Fatalf("the same move's copy sent again takes %v (stale %v), want %v", got, stale, made)
	}
	if _, err := os.Stat(filepath.Join(dir, moveParents)); err != nil {
		t.Fatalf("the record of the same move: %v", err)
	}
	// Another move's copy while the node is held (an apply under way):
	// nothing removed, and the directories stay recorded, as stale, through
	// that copy's own record and its end.
	held, release := make(chan struct{}), make(chan struct{})
	go rec.Exclusive(ctx, func(context.Context) error { close(held); <-release; return nil })
	<-held
	defer func(w time.Duration) { removeParentsWait = w }(removeParentsWait)
	removeParentsWait = 50 * time.Millisecond
	got, stale := a.parentsMadeBefore(ctx, "pg", 8)
	if len(got) != 0 || !slices.Equal(stale, made) {
		t.Fatalf("another move's copy takes %v, stale %v; want none, %v", got, stale, made)
	}
	for _, p := range made {
		if _, err := os.Lstat(p); err != nil {
			t.Fatalf("%s removed without holding the node: %v", p, err)
		}
	}
	other := filepath.Join(root, "other")
	os.Mkdir(other, 0o755)
	if err := writeMadeParents(dir, madeParents{Module: "web", Move: 8, Paths: []string{other}, Stale: stale}); err != nil {
		t.Fatal(err)
	}
	a.settleMadeParents(ctx, stale) // move 8's copy came in (its own parents in the ledger)
	raw, err := os.ReadFile(filepath.Join(dir, moveParents))
	var left madeParents
	if err == nil {
		err = json.Unmarshal(raw, &left)
	}
	if err != nil || !slices.Equal(left.Stale, made) || len(left.Paths) != 0 {
		t.Fatalf("the record after move 8's copy, the node held: %+v %v", left, err)
	}
	close(release)
	if got, stale := a.parentsMadeBefore(ctx, "pg", 9); len(got) != 0 || len(stale) != 0 {
		t.Fatalf("the next move's copy takes %v, stale %v", got, stale)
	}
	for _, p := range made {
		if _, err := os.Lstat(p); !errors.Is(err, os.ErrNotExist) {
			t.Fatalf("%s, made by an earlier move's copy, is still there: %v", p, err)
		}
	}
	if _, err := os.Stat(filepath.Join(dir, moveParents)); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("the earlier moves' record: %v", err)
	}
	// A damaged record: nothing taken, nothing removed, the record gone.
	os.Mkdir(made[0], 0o755)
	os.WriteFile(filepath.Join(dir, moveParents), []byte("{"), 0o600)
	if got, stale := a.parentsMadeBefore(ctx, "pg", 7); len(got) != 0 || len(stale) != 0 {
		t.Fatalf("a damaged record gave %v, %v", got, stale)
	}
	if _, err := os.Stat(made[0]); err != nil {
		t.Fatalf("a damaged record removed %s: %v", made[0], err)
	}
}
