package agent

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"

	"golang.org/x/sys/unix"

	"mesh/internal/safefs"
)

// A journal in the data dir (a restore's, restoreJournal; a move's swap,
// moveJournal) names swaps under way. It goes durably once they are done
// or undone, or is kept beside for the operator when they could not be;
// either way the data dir is synced after, so that a power cut does not
// bring it back, or lose where it went. what names it in errors.

// removeJournal removes dir/name, durably. A removal the data dir's sync
// does not confirm is an error (a power cut could bring the journal back
// under a module that ran).
func removeJournal(dir, name, what string) error {
	path := filepath.Join(dir, name)
	if err := os.Remove(path); err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("the %s %s could not be removed: %w", what, path, err)
	}
	if err := safefs.SyncDir(dir); err != nil {
		return fmt.Errorf("the %s %s was removed, but the data dir could not be synced: %w", what, path, err)
	}
	return nil
}

// setJournalAside keeps dir/name beside, as NAME-TIME.json (never over
// another), durably, and says where.
func setJournalAside(dir, name, what string, now time.Time) (string, error) {
	path := filepath.Join(dir, name)
	kept := filepath.Join(dir, fmt.Sprintf("%s-%d.json", strings.TrimSuffix(name, ".json"), now.UnixNano()))
	if err := unix.Renameat2(unix.AT_FDCWD, path, unix.AT_FDCWD, kept, unix.RENAME_NOREPLACE); err != nil {
		return "", fmt.Errorf("the %s %s could not be set aside: %w", what, path, err)
	}
	if err := safefs.SyncDir(dir); err != nil {
		return "", fmt.Errorf("the %s %s was set aside as %s, but the data dir could not be synced: %w", what, path, kept, err)
	}
	return kept, nil
}
