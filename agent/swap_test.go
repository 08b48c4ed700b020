package agent

import (
	"errors"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"testing"
	"time"

	"mesh/internal/safefs"
	"mesh/reconciler"
)

// A move's receiver that fails at any rename or sync of its swap puts
// every directory back as it was, each copy at its staging path (which the
// caller removes) and nothing left aside; FROM keeps the only durable copy
// and tries again. After a swap that worked, undo (a ledger that could not
// be saved) does the same.
func TestSwapCopiesInPutsBackOnAnyFailure(t *testing.T) {
	// One run with nothing failing counts the calls.
	var total swapCalls
	{
		dir, data := swapBed(t)
		aside := map[string]string{}
		ops := counted(&total, -1, -1)
		undo, _, err := swapCopiesIn(data, aside, nil, ops)
		if err != nil {
			t.Fatal(err)
		}
		swap := total // undo's own calls are not the swap's
		for i, d := range data {
			if got := content(d); got != "new" {
				t.Errorf("%s holds %q after the swap, want the copy", d, got)
			}
			if was, ok := aside[d]; ok != (i != 1) || ok && content(was) != old(i) {
				t.Errorf("%s's aside is %q (%v), holding %q", d, was, ok, content(was))
			}
		}
		undo()
		checkAsItWas(t, dir, data, aside)
		total = swap
	}
	if total.renames != 5 || total.syncs != 3 {
		t.Fatalf("a swap of three directories, two of them there, made %d renames and %d syncs", total.renames, total.syncs)
	}
	for k := range total.renames {
		dir, data := swapBed(t)
		aside := map[string]string{}
		var n swapCalls
		if _, _, err := swapCopiesIn(data, aside, nil, counted(&n, k, -1)); err == nil {
			t.Fatalf("rename %d failed and the swap said nothing", k)
		}
		checkAsItWas(t, dir, data, aside)
	}
	for k := range total.syncs {
		dir, data := swapBed(t)
		aside := map[string]string{}
		var n swapCalls
		if _, _, err := swapCopiesIn(data, aside, nil, counted(&n, -1, k)); err == nil {
			t.Fatalf("sync %d failed and the swap said nothing", k)
		}
		checkAsItWas(t, dir, data, aside)
	}
}

// A copy of the same move tried again (its answer was lost, or FROM
// stopped before the start) replaces the earlier copy, which never ran,
// rather than setting it aside as well: a review found every try kept
// one more whole copy of the module's data on TO, for ever. What the first
// copy set aside stays where it is.
func TestSwapCopiesInReplacesAnEarlierCopy(t *testing.T) {
	dir, data := swapBed(t)
	first := map[string]string{}
	if _, _, err := swapCopiesIn(data, first, nil, hostSwap); err != nil {
		t.Fatal(err)
	}
	for _, d := range data {
		write(t, d+moveStaging, "again")
	}
	ours := func(d string) bool { return d != data[2] } // the third is not the move's (set aside)
	aside := map[string]string{}
	undo, stale, err := swapCopiesIn(data, aside, ours, hostSwap)
	if err != nil {
		t.Fatal(err)
	}
	if want := []string{data[0] + moveStale, data[1] + moveStale}; !slices.Equal(stale, want) {
		t.Errorf("stale %v, want %v", stale, want)
	}
	for i, d := range data {
		if got := content(d); got != "again" {
			t.Errorf("%s holds %q, want the copy tried again", d, got)
		}
		if i != 1 && content(first[d]) != old(i) {
			t.Errorf("what %s held before the move is no longer at %s", d, first[d])
		}
	}
	if len(aside) != 1 || content(aside[data[2]]) != "new" {
		t.Errorf("set aside now: %v", aside)
	}
	for _, w := range stale {
		if content(w) != "new" {
			t.Errorf("%s holds %q, want the earlier copy", w, content(w))
		}
	}
	undo()
	for _, d := range data {
		if content(d) != "new" || content(d+moveStaging) != "again" {
			t.Errorf("undo: %s holds %q, its staging %q", d, content(d), content(d+moveStaging))
		}
	}
	if len(aside) != 0 {
		t.Errorf("undo left %v in the answer", aside)
	}
	ents, _ := os.ReadDir(dir)
	if len(ents) != 3+3+2 { // the copies, the tries again, the first asides
		t.Errorf("after undo %s holds %d entries", dir, len(ents))
	}
}

// swapCalls counts the operations a swap made.
type swapCalls struct{ renames, syncs int }

// swapBed is three data directories' copies written, the first and the
// last with a directory already at their path.
func swapBed(t *testing.T) (string, []string) {
	dir := t.TempDir()
	var data []string
	for i := range 3 {
		d := filepath.Join(dir, string(rune('a'+i)))
		data = append(data, d)
		write(t, d+moveStaging, "new")
		if i != 1 {
			write(t, d, old(i))
		}
	}
	return dir, data
}

func old(i int) string { return "old" + string(rune('0'+i)) }

func write(t *testing.T, d, s string) {
	t.Helper()
	if err := os.MkdirAll(d, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(d, "f"), []byte(s), 0o644); err != nil {
		t.Fatal(err)
	}
}

func content(d string) string {
	b, err := os.ReadFile(filepath.Join(d, "f"))
	if err != nil {
		return "(none)"
	}
	return string(b)
}

// counted is the host's operations, the failRename-th rename and the
// failSync-th sync (from 0; -1 none) failing without doing anything.
func counted(n *swapCalls, failRename, failSync int) swapOps {
	return swapOps{
		rename: func(from, to string) error {
			i := n.renames
			n.renames++
			if i == failRename {
				return errors.New("injected rename failure")
			}
			return os.Rename(from, to)
		},
		syncDir: func(d string) error {
			i := n.syncs
			n.syncs++
			if i == failSync {
				return errors.New("injected sync failure")
			}
			return safefs.SyncDir(d)
		},
	}
}

func checkAsItWas(t *testing.T, dir string, data []string, aside map[string]string) {
	t.Helper()
	for i, d := range data {
		want := old(i)
		if i == 1 {
			want = "(none)"
		}
		if got := content(d); got != want {
			t.Errorf("%s holds %q, want %q as before", d, got, want)
		}
		if got := content(d + moveStaging); got != "new" {
			t.Errorf("%s's copy is not back at its staging path (%q)", d, got)
		}
		if _, err := os.Lstat(d + moveAside); err == nil {
			t.Errorf("%s is left aside", d)
		}
	}
	if len(aside) != 0 {
		t.Errorf("the answer names directories set aside: %v", aside)
	}
	ents, _ := os.ReadDir(dir)
	if len(ents) != 2*len(data)-1 {
		var names []string
		for _, e := range ents {
			names = append(names, e.Name())
		}
		t.Errorf("%s holds %v", dir, names)
	}
}

// A kill at any point of a copy's swap (after its journal, before the
// ledger adopted the copy) is put back at the next start: every directory
// holds what it held before, each copy is at its staging path, nothing is
// left aside, and the journal is gone. A journal whose swap the ledger
// adopted moves nothing; one that cannot be read is set aside, moving
// nothing.
func TestCutSwapIsPutBackAtStart(t *testing.T) {
	none := func(string, uint64) (reconciler.Arrival, bool) { return reconciler.Arrival{}, false }
	notHere := func(string) (bool, error) { return false, nil }
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	until := time.Now().Add(time.Hour).Round(0)
	// killedAt runs the swap in a goroutine that ends at its op-th rename
	// or sync (from 0), as a kill -9 there; -1: none.
	killedAt := func(dataDir string, data []string, op int) (ran int) {
		done := make(chan struct{})
		go func() {
			defer close(done)
			step := func() {
				if ran == op {
					runtime.Goexit()
				}
				ran++
			}
			ops := swapOps{
				rename:  func(from, to string) error { step(); return os.Rename(from, to) },
				syncDir: func(d string) error { step(); return safefs.SyncDir(d) },
				journal: func(plan []movedDir) error { return writeMoveJournal(dataDir, "db", 7, until, plan) },
			}
			if _, _, err := swapCopiesIn(data, map[string]string{}, nil, ops); err != nil {
				t.Error(err)
			}
		}()
		<-done
		return ran
	}
	total := killedAt(t.TempDir(), func() []string { _, d := swapBed(t); return d }(), -1)
	if total != 5+3 {
		t.Fatalf("a swap of three directories made %d renames and syncs, want 8", total)
	}
	for op := range total + 1 {
		dataDir := t.TempDir()
		dir, data := swapBed(t)
		killedAt(dataDir, data, op)
		if _, err := os.Stat(filepath.Join(dataDir, moveJournal)); err != nil {
			t.Fatalf("killed at op %d: no journal: %v", op, err)
		}
		if err := undoCutMoveSwap(dataDir, none, notHere, log); err != nil {
			t.Fatalf("killed at op %d: %v", op, err)
		}
		checkAsItWas(t, dir, data, map[string]string{})
		if _, err := os.Stat(filepath.Join(dataDir, moveJournal)); !errors.Is(err, os.ErrNotExist) {
			t.Fatalf("killed at op %d: the journal is still there: %v", op, err)
		}
	}
	// The ledger holds the swap (the kill came after Adopt): kept.
	dataDir := t.TempDir()
	_, data := swapBed(t)
	killedAt(dataDir, data, total) // past the last op: the swap is whole, the journal stays
	adopted := func(m string, id uint64) (reconciler.Arrival, bool) {
		return reconciler.Arrival{Move: id, Until: until}, m == "db" && id == 7
	}
	if err := undoCutMoveSwap(dataDir, adopted, notHere, log); err != nil {
		t.Fatal(err)
	}
	for _, d := range data {
		if content(d) != "new" {
			t.Errorf("%s holds %q once the ledger adopted the copy", d, content(d))
		}
	}
	if _, err := os.Stat(filepath.Join(dataDir, moveJournal)); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("the journal of an adopted swap is still there: %v", err)
	}
	// The journal outlived an adopted swap whose arrival the ledger let go
	// (the module ran here since): the module runs on what its
	// directories hold, which is left as it is.
	dataDir = t.TempDir()
	_, data = swapBed(t)
	killedAt(dataDir, data, total)
	runsHere := func(m string) (bool, error) { return m == "db", nil }
	if err := undoCutMoveSwap(dataDir, none, runsHere, log); err != nil {
		t.Fatal(err)
	}
	for _, d := range data {
		if content(d) != "new" {
			t.Errorf("%s holds %q: the data of a module that runs here was put back", d, content(d))
		}
	}
	if _, err := os.Stat(filepath.Join(dataDir, moveJournal)); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("the journal of a module that runs here is still there: %v", err)
	}
	// A swap cut part way, of a module the state runs here since (FROM
	// aborted, the operator assigned it here): put back all the same,
	// not left half made under the module.
	dataDir = t.TempDir()
	dir, data := swapBed(t)
	killedAt(dataDir, data, 1) // what the first directory held is aside, its copy not in
	if err := undoCutMoveSwap(dataDir, none, runsHere, log); err != nil {
		t.Fatal(err)
	}
	checkAsItWas(t, dir, data, map[string]string{})
	// A journal naming what no swap makes is set aside; nothing moves.
	dataDir = t.TempDir()
	os.WriteFile(filepath.Join(dataDir, moveJournal), []byte(`{"module":"db","move":7,"dirs":[{"dir":"/etc","aside":"/tmp/x","ino":5}]}`), 0o600)
	if err := undoCutMoveSwap(dataDir, none, notHere, log); err != nil {
		t.Fatal(err)
	}
	if kept, _ := filepath.Glob(filepath.Join(dataDir, "move-journal-*.json")); len(kept) != 1 {
		t.Fatalf("a journal that cannot be read: set aside as %v", kept)
	}
	// Kept beside, it stops moves into this node until it is settled.
	if j := unsettledJournal(dataDir); !strings.Contains(j, "move-journal-") {
		t.Fatalf("a journal kept beside is not seen: %q", j)
	}
	if j := unsettledJournal(t.TempDir()); j != "" {
		t.Fatalf("a data dir without a journal: %q", j)
	}
}

// A swap whose failure could not be put back whole (a rename back fails
// too) says so (errNotPutBack), and its journal is kept beside for the
// operator rather than removed: the node is not as it was.
func TestSwapNotPutBackKeepsItsJournal(t *testing.T) {
	dataDir := t.TempDir()
	_, data := swapBed(t)
	n := 0
	ops := swapOps{
		rename: func(from, to string) error {
			n++
			if n >= 4 { // the second directory's copy, then every rename back
				return errors.New("injected rename failure")
			}
			return os.Rename(from, to)
		},
		syncDir: safefs.SyncDir,
		journal: func(plan []movedDir) error { return writeMoveJournal(dataDir, "db", 7, time.Now(), plan) },
	}
	_, _, err := swapCopiesIn(data, map[string]string{}, nil, ops)
	if !errors.Is(err, errNotPutBack) {
		t.Fatalf("a swap whose put back failed: %v", err)
	}
	a := &Agent{dir: dataDir, log: slog.New(slog.NewTextHandler(io.Discard, nil))}
	a.settleMoveJournal("db", err)
	if _, err := os.Stat(filepath.Join(dataDir, moveJournal)); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("the journal is still at its place: %v", err)
	}
	if kept, _ := filepath.Glob(filepath.Join(dataDir, "move-journal-*.json")); len(kept) != 1 {
		t.Fatalf("the journal was not kept beside: %v", kept)
	}
}
