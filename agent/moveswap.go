package agent

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"golang.org/x/sys/unix"

	"mesh/internal/safefs"
	"mesh/reconciler"
)

// A copy swapped in on TO, cut by a kill. swapCopiesIn renames what each
// data directory holds aside and the copy in, one directory after the
// other, and the ledger adopts the copy after the last (Adopt): a kill in
// between left a directory half-swapped (what it held aside, the copy not
// in yet, or some directories swapped and the others not) that nothing
// recorded, and the copy FROM sent again set the first copy aside as "what
// TO held". So the swaps are journaled first (moveJournal, in the data
// dir), the journal removed once the ledger holds the copy; at the next
// start, a journal whose arrival the ledger does not hold is put back:
// each copy to its staging path (told apart from any other directory by
// its inode and birth time), what was set aside to its directory. FROM,
// whose copy failed, sends it again.

// moveJournal is the journal of a swap under way, in the data dir.
const moveJournal = "move-journal.json"

// movedDir is one directory a swap changes: Aside is where what it held
// goes ("" when it held nothing), Ino and Btime the copy's identity
// (journaledSwap's), taken at its staging path.
type movedDir struct {
	Dir   string `json:"dir"`
	Aside string `json:"aside,omitempty"`
	Ino   uint64 `json:"ino"`
	Btime int64  `json:"btime,omitempty"`
}

// moveJournalFile is the swap of a move's copy: the arrival the ledger
// adopts once it is done (its Until tells this swap's from an earlier
// copy's of the same move).
type moveJournalFile struct {
	Module string     `json:"module"`
	Move   uint64     `json:"move"`
	Until  time.Time  `json:"until"`
	Dirs   []movedDir `json:"dirs"`
}

// writeMoveJournal records the swaps plan is about to make, durably.
func writeMoveJournal(dir, module string, move uint64, until time.Time, plan []movedDir) error {
	j := moveJournalFile{Module: module, Move: move, Until: until, Dirs: slices.Clone(plan)}
	for i := range j.Dirs {
		_, ino, btime, err := fileIdentity(j.Dirs[i].Dir + moveStaging)
		if err != nil {
			return fmt.Errorf("the copy of %s: %w", j.Dirs[i].Dir, err)
		}
		j.Dirs[i].Ino, j.Dirs[i].Btime = ino, btime
	}
	raw, err := json.Marshal(j)
	if err != nil {
		return err
	}
	if err := safefs.WriteFile(filepath.Join(dir, moveJournal), raw, 0o600); err != nil {
		return fmt.Errorf("write the move's journal: %w", err)
	}
	return nil
}

// unsettledJournal is a move's journal in dir that a swap or a start left
// ("" if none): the one under way, or one kept beside because what it
// names could not be put back whole.
func unsettledJournal(dir string) string {
	if _, err := os.Lstat(filepath.Join(dir, moveJournal)); err == nil {
		return filepath.Join(dir, moveJournal)
	}
	if kept, _ := filepath.Glob(filepath.Join(dir, "move-journal-*.json")); len(kept) > 0 {
		return kept[0]
	}
	return ""
}

// removeMoveJournal removes the journal durably: the swap is done (the
// ledger holds it) or undone.
func removeMoveJournal(dir string) error { return removeJournal(dir, moveJournal, "move's journal") }

// setMoveJournalAside keeps the journal beside, as
// move-journal-TIME.json, for the operator, and says where.
func setMoveJournalAside(dir string) (string, error) {
	return setJournalAside(dir, moveJournal, "move's journal", time.Now())
}

// settleMoveJournal ends the journal of a swap that failed (cause): put
// back whole, it is removed; else (errNotPutBack) it is kept beside for
// the operator, and the log says so.
func (a *Agent) settleMoveJournal(module string, cause error) {
	if !errors.Is(cause, errNotPutBack) {
		if err := removeMoveJournal(a.dir); err != nil {
			a.log.Warn("move: a swap was put back, but its journal stays (the next start looks at it again)", "module", module, "err", err)
		}
		return
	}
	kept, err := setMoveJournalAside(a.dir)
	if err != nil {
		a.log.Error("move: a swap that failed could not be put back whole, and its journal stays: the next start puts back what it can", "module", module, "cause", cause, "err", err)
		return
	}
	a.log.Error("move: a swap that failed could not be put back whole: compare each data directory the journal names with its .mesh-moving and .mesh-before-move copies", "module", module, "journal", kept, "cause", cause)
}

// undoCutMoveSwap runs when the agent starts, before the reconciler
// applies: a journal left by a swap that a kill cut before the ledger
// adopted the copy (arrived says what the ledger holds) is put back, and
// removed. One whose swap the ledger holds is only removed, and so is one
// whose swap is whole (every directory holds its copy) for a module the
// state runs here (assignedHere): it runs on that copy (a journal whose
// removal failed after the ledger adopted the copy, and whose arrival the
// ledger let go once the module ran here). One that cannot be read, or
// not be put back whole, is set aside (move-journal-TIME.json) and said;
// moves into this node are refused while it is there (receive). What it
// cannot read or write now (the journal, the state) is an error: the
// agent does not start on what it cannot tell.
func undoCutMoveSwap(dir string, arrived func(module string, move uint64) (reconciler.Arrival, bool), assignedHere func(module string) (bool, error), log interface {
	Info(string, ...any)
	Warn(string, ...any)
	Error(string, ...any)
}) error {
	path := filepath.Join(dir, moveJournal)
	raw, err := os.ReadFile(path)
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("a move's copy was cut while it was swapped in, and its journal cannot be read now: %w; the agent does not start until it can (start it again)", err)
	}
	var j moveJournalFile
	if err := json.Unmarshal(raw, &j); err != nil || !j.valid() {
		kept, aerr := setMoveJournalAside(dir)
		if aerr != nil {
			return fmt.Errorf("the move's journal %s cannot be read, and %w", path, aerr)
		}
		log.Error("a move's journal cannot be read: nothing was put back. Compare each data directory with its .mesh-moving and .mesh-before-move copies", "journal", kept, "err", errOr(err, "it names a directory that is not a move's"))
		return nil
	}
	if arr, ok := arrived(j.Module, j.Move); ok && arr.Until.Equal(j.Until) {
		// The ledger adopted the copy; only the journal's removal was cut.
		return removeMoveJournal(dir)
	}
	here, err := assignedHere(j.Module)
	if err != nil {
		return fmt.Errorf("a move's copy of %s was cut while it was swapped in, and whether the module runs here cannot be read: %w; the agent does not start until it can (start it again)", j.Module, err)
	}
	if here && j.whole() {
		log.Warn("a move's journal outlived its swap, and the module runs here on the copy: its directories are left as they are", "module", j.Module, "move", j.Move)
		return removeMoveJournal(dir)
	}
	var problems []string
	for _, md := range slices.Backward(j.Dirs) {
		problems = append(problems, putBack(md)...)
	}
	if len(problems) > 0 {
		kept, aerr := setMoveJournalAside(dir)
		if aerr != nil {
			return fmt.Errorf("a move's copy of %s cut while it was swapped in is not put back whole (%s), and %w", j.Module, strings.Join(problems, "; "), aerr)
		}
		log.Error("a move's copy was cut while it was swapped in, and not all of it could be put back: "+strings.Join(problems, "; "), "module", j.Module, "move", j.Move, "journal", kept)
		return nil
	}
	if err := removeMoveJournal(dir); err != nil {
		return err
	}
	log.Warn("a move's copy was cut while it was swapped in (the agent stopped during it): every data directory is as it was before it; FROM sends the copy again", "module", j.Module, "move", j.Move)
	return nil
}

// valid says the journal names directories as a swap does: clean and
// absolute, each aside at its directory's own name, none twice.
func (j *moveJournalFile) valid() bool {
	if j.Module == "" || len(j.Dirs) == 0 {
		return false
	}
	for i, md := range j.Dirs {
		if md.Dir != filepath.Clean(md.Dir) || !filepath.IsAbs(md.Dir) || md.Dir == "/" || md.Ino == 0 {
			return false
		}
		if md.Aside != "" && !strings.HasPrefix(md.Aside, md.Dir+moveAside) && md.Aside != md.Dir+moveStale {
			return false
		}
		if slices.ContainsFunc(j.Dirs[:i], func(o movedDir) bool { return o.Dir == md.Dir }) {
			return false
		}
	}
	return true
}

// whole says every directory the journal names holds its copy: the swap
// was made to its end.
func (j *moveJournalFile) whole() bool {
	for _, md := range j.Dirs {
		if _, ino, btime, err := fileIdentity(md.Dir); err != nil || ino != md.Ino || md.Btime != 0 && btime != md.Btime {
			return false
		}
	}
	return true
}

// putBack undoes one directory's swap, as far as it went: the copy (by
// its identity) from the directory to its staging path, then what was
// set aside to the directory. It says what it could not do.
func putBack(md movedDir) []string {
	var problems []string
	if _, ino, btime, err := fileIdentity(md.Dir); err == nil && ino == md.Ino && (md.Btime == 0 || btime == md.Btime) {
		if err := unix.Renameat2(unix.AT_FDCWD, md.Dir, unix.AT_FDCWD, md.Dir+moveStaging, unix.RENAME_NOREPLACE); err != nil {
			return append(problems, fmt.Sprintf("the copy at %s could not be moved back to %s: %v", md.Dir, md.Dir+moveStaging, err))
		}
	}
	if md.Aside != "" {
		if _, err := os.Lstat(md.Aside); err == nil {
			if err := unix.Renameat2(unix.AT_FDCWD, md.Aside, unix.AT_FDCWD, md.Dir, unix.RENAME_NOREPLACE); err != nil {
				problems = append(problems, fmt.Sprintf("what %s held, at %s, could not be put back: %v", md.Dir, md.Aside, err))
			}
		}
	}
	if err := safefs.SyncDir(filepath.Dir(md.Dir)); err != nil {
		problems = append(problems, fmt.Sprintf("%s could not be synced: %v", filepath.Dir(md.Dir), err))
	}
	return problems
}
