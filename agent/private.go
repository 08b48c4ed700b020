package agent

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
)

// checkPrivate refuses a data dir that other users can read or enter: it
// holds the node's key, the replicated state (credentials among it) and the
// Raft log. Everything the mesh writes there is 0600 or 0700 (its umask is
// 077); a looser mode means someone changed it, or restored a backup
// without its modes. The error names what is open and how to close it.
func checkPrivate(dir string) error {
	st, err := os.Lstat(dir)
	if errors.Is(err, fs.ErrNotExist) {
		return nil // nothing yet: the agent says what to run first
	}
	if err != nil {
		return err
	}
	if !st.IsDir() {
		return fmt.Errorf("the data dir %s is not a directory", dir)
	}
	var open []string
	err = filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			if errors.Is(err, fs.ErrNotExist) {
				return nil // removed while we walked (a preview, a segment)
			}
			return err
		}
		if !d.Type().IsRegular() && !d.IsDir() {
			return nil // sockets and links: no secret in their mode
		}
		info, err := d.Info()
		if err != nil {
			if errors.Is(err, fs.ErrNotExist) {
				return nil
			}
			return err
		}
		if m := info.Mode().Perm(); m&0o077 != 0 {
			open = append(open, fmt.Sprintf("%s (%04o)", p, m))
		}
		return nil
	})
	if err != nil {
		return fmt.Errorf("check the modes in the data dir %s: %w", dir, err)
	}
	if len(open) == 0 {
		return nil
	}
	n := len(open)
	if n > 5 {
		open = append(open[:5], fmt.Sprintf("and %d more", n-5))
	}
	return fmt.Errorf("the data dir %s holds this node's key and the mesh's secrets, but other users can read %d of its entries: %s; "+
		"close it with: chmod -R go-rwx %s", dir, n, strings.Join(open, ", "), dir)
}
