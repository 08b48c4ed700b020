package reconciler

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"

	"golang.org/x/sys/unix"
)

// The filesystem executor. Every operation refuses to follow a symlink at the
// path it acts on: directories and files are opened with O_NOFOLLOW and
// changed through the descriptor (fchown, fchmod), removals look with lstat.

// FS outcomes.
const (
	fsUnchanged = "unchanged"
	fsCreated   = "created"
	fsUpdated   = "updated"
)

var errSymlink = errors.New("is a symbolic link; the mesh never follows links: remove it, or change the manifest")

func digestBytes(b []byte) string {
	s := sha256.Sum256(b)
	return hex.EncodeToString(s[:])
}

// ensureDir makes path a directory with owner and mode. It returns what it
// did and, for an update, what drifted.
func ensureDir(path string, uid, gid int, mode os.FileMode) (string, string, error) {
	outcome := fsUnchanged
	fi, err := os.Lstat(path)
	switch {
	case errors.Is(err, os.ErrNotExist):
		if err := unix.Mkdir(path, uint32(mode.Perm())); err != nil {
			return "", "", fmt.Errorf("create directory: %w", err)
		}
		outcome = fsCreated
	case err != nil:
		return "", "", err
	case fi.Mode()&os.ModeSymlink != 0:
		return "", "", errSymlink
	case !fi.IsDir():
		return "", "", fmt.Errorf("exists and is not a directory (%s); move it aside", fi.Mode().Type())
	}
	fd, err := unix.Open(path, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		if errors.Is(err, unix.ELOOP) || errors.Is(err, unix.ENOTDIR) {
			return "", "", errSymlink
		}
		return "", "", fmt.Errorf("open directory: %w", err)
	}
	defer unix.Close(fd)
	drift, err := fixOwnerMode(fd, uid, gid, mode)
	if err != nil {
		return "", "", err
	}
	if outcome == fsUnchanged && drift != "" {
		outcome = fsUpdated
	}
	return outcome, drift, nil
}

// fixOwnerMode sets owner and mode through fd, saying what differed.
func fixOwnerMode(fd, uid, gid int, mode os.FileMode) (string, error) {
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		return "", err
	}
	var drift []string
	if int(st.Uid) != uid || int(st.Gid) != gid {
		if err := unix.Fchown(fd, uid, gid); err != nil {
			return "", fmt.Errorf("chown %d:%d: %w", uid, gid, err)
		}
		drift = append(drift, fmt.Sprintf("owner %d:%d -> %d:%d", st.Uid, st.Gid, uid, gid))
	}
	// chown clears setuid/setgid bits, so the mode is checked after it.
	if err := unix.Fstat(fd, &st); err != nil {
		return "", err
	}
	if have := os.FileMode(st.Mode) & 0o7777; have != modeBits(mode) {
		if err := unix.Fchmod(fd, uint32(modeBits(mode))); err != nil {
			return "", fmt.Errorf("chmod %04o: %w", modeBits(mode), err)
		}
		drift = append(drift, fmt.Sprintf("mode %04o -> %04o", have, modeBits(mode)))
	}
	return strings.Join(drift, ", "), nil
}

func modeBits(m os.FileMode) os.FileMode {
	out := m.Perm()
	if m&os.ModeSetuid != 0 {
		out |= 0o4000
	}
	if m&os.ModeSetgid != 0 {
		out |= 0o2000
	}
	if m&os.ModeSticky != 0 {
		out |= 0o1000
	}
	return out
}

// readNoFollow reads a regular file without following a link at path. The
// caller closes the returned file (one *os.File per descriptor, so that no
// finalizer closes a descriptor that was reused).
func readNoFollow(path string) ([]byte, *os.File, error) {
	fd, err := unix.Open(path, unix.O_RDONLY|unix.O_NOFOLLOW|unix.O_CLOEXEC|unix.O_NONBLOCK, 0)
	if err != nil {
		if errors.Is(err, unix.ELOOP) {
			return nil, nil, errSymlink
		}
		return nil, nil, err
	}
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		unix.Close(fd)
		return nil, nil, err
	}
	if st.Mode&unix.S_IFMT != unix.S_IFREG {
		unix.Close(fd)
		return nil, nil, fmt.Errorf("exists and is not a regular file; move it aside")
	}
	f := os.NewFile(uintptr(fd), path)
	b, err := io.ReadAll(io.LimitReader(f, 64<<20))
	if err != nil {
		f.Close()
		return nil, nil, err
	}
	return b, f, nil
}

// ensureFile makes path hold content with owner and mode, replacing it
// atomically (temp file in the same directory, then rename) when the content
// differs, and fixing owner and mode in place when only they drifted.
func ensureFile(path string, content []byte, uid, gid int, mode os.FileMode) (string, string, error) {
	old, f, err := readNoFollow(path)
	exists := err == nil
	switch {
	case exists:
		defer f.Close()
		if digestBytes(old) == digestBytes(content) {
			drift, err := fixOwnerMode(int(f.Fd()), uid, gid, mode)
			if err != nil {
				return "", "", err
			}
			if drift != "" {
				return fsUpdated, drift, nil
			}
			return fsUnchanged, "", nil
		}
	case errors.Is(err, os.ErrNotExist):
	default:
		return "", "", err
	}
	if err := writeAtomic(path, content, uid, gid, mode); err != nil {
		return "", "", err
	}
	if !exists {
		return fsCreated, "", nil
	}
	return fsUpdated, "content changed", nil
}

func writeAtomic(path string, content []byte, uid, gid int, mode os.FileMode) error {
	dir, base := filepath.Split(path)
	f, err := os.CreateTemp(dir, "."+base+".mesh-*")
	if err != nil {
		return fmt.Errorf("write %s: %w", path, err)
	}
	tmp := f.Name()
	ok := false
	defer func() {
		if !ok {
			f.Close()
			os.Remove(tmp)
		}
	}()
	if _, err := f.Write(content); err != nil {
		return fmt.Errorf("write %s: %w", path, err)
	}
	if _, err := fixOwnerMode(int(f.Fd()), uid, gid, mode); err != nil {
		return err
	}
	if err := f.Sync(); err != nil {
		return fmt.Errorf("write %s: %w", path, err)
	}
	if err := f.Close(); err != nil {
		return fmt.Errorf("write %s: %w", path, err)
	}
	if err := os.Rename(tmp, path); err != nil {
		return fmt.Errorf("replace %s: %w", path, err)
	}
	ok = true
	return nil
}

// removeFile removes path only if it still holds what the mesh wrote.
// It returns a reason when it keeps it.
func removeFile(path, digest string) (removed bool, kept string, err error) {
	b, f, err := readNoFollow(path)
	if errors.Is(err, os.ErrNotExist) {
		return true, "", nil
	}
	if err != nil {
		return false, "no longer what the mesh wrote (" + err.Error() + ")", nil
	}
	f.Close()
	if digestBytes(b) != digest {
		return false, "its content changed since the mesh wrote it", nil
	}
	if err := unix.Unlink(path); err != nil && !errors.Is(err, unix.ENOENT) {
		return false, "", fmt.Errorf("remove: %w", err)
	}
	return true, "", nil
}

// removeDir removes path if it is an empty directory (the mesh's own children
// are removed before it); otherwise it says what it holds.
func removeDir(path string) (removed bool, kept string, err error) {
	fi, err := os.Lstat(path)
	if errors.Is(err, os.ErrNotExist) {
		return true, "", nil
	}
	if err != nil {
		return false, "", err
	}
	if fi.Mode()&os.ModeSymlink != 0 || !fi.IsDir() {
		return false, "it is no longer a directory the mesh made", nil
	}
	entries, err := os.ReadDir(path)
	if err != nil {
		return false, "", err
	}
	if len(entries) > 0 {
		names := make([]string, 0, 3)
		for i, e := range entries {
			if i == 3 {
				names = append(names, "...")
				break
			}
			names = append(names, e.Name())
		}
		word := "entries"
		if len(entries) == 1 {
			word = "entry"
		}
		return false, fmt.Sprintf("holds %d %s the mesh did not put there (%s)", len(entries), word, strings.Join(names, ", ")), nil
	}
	if err := unix.Rmdir(path); err != nil && !errors.Is(err, unix.ENOENT) {
		return false, "", fmt.Errorf("remove: %w", err)
	}
	return true, "", nil
}
