package cluster

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"
)

// LockFile is the lock every process that opens a data dir's stores takes
// first: agent, init, join, recover.
const LockFile = "lock"

// ErrLocked: another mesh process holds the data dir.
var ErrLocked = errors.New("data dir is in use")

// Lock takes the data dir's lock (creating the dir, 0700, if need be) and
// records who holds it. A second holder is refused at once, naming the first.
// The lock goes with the process, so a kill -9 never leaves it stuck.
func Lock(dir, what string) (unlock func(), err error) {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("create data dir: %w", err)
	}
	p := filepath.Join(dir, LockFile)
	f, err := os.OpenFile(p, os.O_RDWR|os.O_CREATE|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0o600)
	if err != nil {
		return nil, fmt.Errorf("open %s: %w", p, err)
	}
	if err := unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB); err != nil {
		b := make([]byte, 256)
		n, _ := f.ReadAt(b, 0)
		f.Close()
		holder := strings.TrimSpace(string(b[:n]))
		if holder == "" {
			holder = "another process"
		}
		return nil, fmt.Errorf("%w: %s holds %s; stop it first (one agent per data dir)", ErrLocked, holder, dir)
	}
	f.Truncate(0)
	f.WriteAt([]byte("pid "+strconv.Itoa(os.Getpid())+" (mesh "+what+")\n"), 0)
	return func() { f.Close() }, nil
}

// Tighten makes the data dir and everything in it private: directories 0700,
// files 0600 (a data dir made beforehand with wider modes, or files a library
// created 0644, would let any local user read the CA key and the join
// secret). Links are not followed.
func Tighten(dir string) error {
	return filepath.WalkDir(dir, func(p string, d os.DirEntry, err error) error {
		if err != nil {
			if p == dir {
				return err
			}
			return nil // gone meanwhile
		}
		switch {
		case d.Type()&os.ModeSymlink != 0:
			return nil
		case d.IsDir():
			return chmodIfWider(p, 0o700)
		case d.Type().IsRegular() || d.Type()&os.ModeSocket != 0:
			return chmodIfWider(p, 0o600)
		}
		return nil
	})
}

func chmodIfWider(p string, perm os.FileMode) error {
	fi, err := os.Lstat(p)
	if err != nil {
		return nil
	}
	if fi.Mode().Perm()&^perm != 0 {
		if err := os.Chmod(p, fi.Mode().Perm()&perm); err != nil {
			return fmt.Errorf("tighten %s: %w", p, err)
		}
	}
	return nil
}
