// Package safefs is the one way mesh touches a path it was told about: every
// path is walked from the root without following a symbolic link at any
// component (openat2 with RESOLVE_NO_SYMLINKS), and every write is atomic and
// durable (a temp file in the same directory, fsync of the file, rename, fsync
// of the directory). It decides nothing; callers say what to write where.
package safefs

import (
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"

	"golang.org/x/sys/unix"
)

// ErrLink is returned, wrapped in a sentence naming the link, when a path
// holds a symbolic link at any component.
var ErrLink = errors.New("symbolic link")

// LinkError names the link found on a path.
type LinkError struct {
	Path string // the path asked for
	Link string // the component that is a link ("" if it could not be named)
}

func (e *LinkError) Error() string {
	if e.Link == "" || e.Link == e.Path {
		return fmt.Sprintf("%s is a symbolic link; the mesh never follows links: remove it, or change the manifest", e.Path)
	}
	return fmt.Sprintf("%s is a symbolic link inside %s; the mesh never follows links: remove it, or change the manifest", e.Link, e.Path)
}

func (e *LinkError) Unwrap() error { return ErrLink }

// linkError names the first component of path that is a link, for messages.
func linkError(path string) error {
	p := "/"
	for _, c := range strings.Split(strings.Trim(path, "/"), "/") {
		p = filepath.Join(p, c)
		fi, err := os.Lstat(p)
		if err != nil {
			break
		}
		if fi.Mode()&os.ModeSymlink != 0 {
			return &LinkError{Path: path, Link: p}
		}
	}
	return &LinkError{Path: path}
}

// resolve is how every path is opened: no link at any component, no magic
// links (/proc/self/...), and no crossing into /proc.
const resolve = unix.RESOLVE_NO_SYMLINKS | unix.RESOLVE_NO_MAGICLINKS

// OpenDir opens directory path for use as a dirfd, following no link on the
// way. The caller closes it.
func OpenDir(path string) (int, error) {
	if !filepath.IsAbs(path) {
		return -1, fmt.Errorf("%s is not an absolute path", path)
	}
	fd, err := unix.Openat2(unix.AT_FDCWD, filepath.Clean(path), &unix.OpenHow{
		Flags:   unix.O_RDONLY | unix.O_DIRECTORY | unix.O_CLOEXEC,
		Resolve: resolve,
	})
	if err != nil {
		if errors.Is(err, unix.ELOOP) {
			return -1, linkError(path)
		}
		if errors.Is(err, unix.ENOTDIR) {
			return -1, fmt.Errorf("%s: a component is not a directory", path)
		}
		return -1, &os.PathError{Op: "open", Path: path, Err: err}
	}
	return fd, nil
}

// OpenParent opens the directory that holds path and returns it with the
// last component's name. The caller closes the descriptor.
func OpenParent(path string) (int, string, error) {
	path = filepath.Clean(path)
	dir, base := filepath.Split(path)
	if base == "" || base == "." || base == ".." {
		return -1, "", fmt.Errorf("%s names no file", path)
	}
	fd, err := OpenDir(dir)
	return fd, base, err
}

// Open opens path (any kind but a link) with flags, following no link on the
// way; O_NOFOLLOW is always added, so a link at the last component is ELOOP,
// reported as a *LinkError.
func Open(path string, flags int) (int, error) {
	dfd, base, err := OpenParent(path)
	if err != nil {
		return -1, err
	}
	defer unix.Close(dfd)
	fd, err := unix.Openat(dfd, base, flags|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return -1, nameErr(path, "open", err)
	}
	return fd, nil
}

// nameErr turns ELOOP (and ENOTDIR from O_DIRECTORY|O_NOFOLLOW on a link)
// into a *LinkError and wraps the rest with the path.
func nameErr(path, op string, err error) error {
	if errors.Is(err, unix.ELOOP) {
		return &LinkError{Path: path, Link: path}
	}
	return &os.PathError{Op: op, Path: path, Err: err}
}

// IsDir says whether path is a directory itself, not a link to one.
func IsDir(path string) bool {
	fi, err := os.Lstat(path)
	return err == nil && fi.IsDir()
}

// Lstat stats path's last component without following it, and no link on
// the way.
func Lstat(path string) (unix.Stat_t, error) {
	var st unix.Stat_t
	dfd, base, err := OpenParent(path)
	if err != nil {
		return st, err
	}
	defer unix.Close(dfd)
	if err := unix.Fstatat(dfd, base, &st, unix.AT_SYMLINK_NOFOLLOW); err != nil {
		return st, &os.PathError{Op: "stat", Path: path, Err: err}
	}
	return st, nil
}

// Attr is an owner and mode to give a written file; Mode holds permission
// bits and may hold setuid, setgid and sticky (as 04000, 02000, 01000).
type Attr struct {
	UID, GID int
	Mode     uint32
	// Chown is false to leave the owner as the writer's.
	Chown bool
}

// WriteAt replaces name in the directory dfd with content, atomically and
// durably: a new file is written under a fresh temp name, given attr, synced,
// renamed over name, and the directory synced. A crash leaves either the old
// file or the new one, never a mix; a leftover temp file has a name that
// starts with "." and contains ".mesh-".
func WriteAt(dfd int, name string, content []byte, attr Attr) error {
	var rnd [6]byte
	rand.Read(rnd[:])
	tmp := tempName(name, hex.EncodeToString(rnd[:]))
	fd, err := unix.Openat(dfd, tmp, unix.O_WRONLY|unix.O_CREAT|unix.O_EXCL|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0o600)
	if err != nil {
		return fmt.Errorf("create temp file for %s: %w", name, err)
	}
	f := os.NewFile(uintptr(fd), tmp)
	ok := false
	defer func() {
		if !ok {
			f.Close()
			unix.Unlinkat(dfd, tmp, 0)
		}
	}()
	if _, err := f.Write(content); err != nil {
		return fmt.Errorf("write %s: %w", name, err)
	}
	if attr.Chown {
		if err := unix.Fchown(fd, attr.UID, attr.GID); err != nil {
			return fmt.Errorf("chown %s %d:%d: %w", name, attr.UID, attr.GID, err)
		}
	}
	// chown clears setuid and setgid, so the mode is set after it.
	if err := unix.Fchmod(fd, attr.Mode); err != nil {
		return fmt.Errorf("chmod %s %04o: %w", name, attr.Mode, err)
	}
	if err := f.Sync(); err != nil {
		return fmt.Errorf("sync %s: %w", name, err)
	}
	if err := f.Close(); err != nil {
		return fmt.Errorf("close %s: %w", name, err)
	}
	if err := unix.Renameat(dfd, tmp, dfd, name); err != nil {
		return fmt.Errorf("replace %s: %w", name, err)
	}
	ok = true
	if err := unix.Fsync(dfd); err != nil {
		return fmt.Errorf("sync directory of %s: %w", name, err)
	}
	return nil
}

// tempName is WriteAt's temp file for name, with the random part rnd (12
// hex digits).
func tempName(name, rnd string) string {
	if tmp := "." + name + ".mesh-" + rnd; len(tmp) <= 255 {
		return tmp
	}
	return ".mesh-" + rnd
}

// isTempOf says entry is a temp file WriteAt made for name.
func isTempOf(entry, name string) bool {
	full := tempName(name, "000000000000") // the form its length gives
	rest, ok := strings.CutPrefix(entry, full[:len(full)-12])
	if !ok || len(rest) != 12 {
		return false
	}
	for _, c := range rest {
		if !('0' <= c && c <= '9' || 'a' <= c && c <= 'f') {
			return false
		}
	}
	return true
}

// isTemp says entry is a temp file WriteAt made, for any name.
func isTemp(entry string) bool {
	if len(entry) < len(".mesh-")+12 || entry[0] != '.' {
		return false
	}
	rest := entry[len(entry)-12:]
	head := entry[:len(entry)-12]
	if head != ".mesh-" && (!strings.HasSuffix(head, ".mesh-") || len(head) <= len("..mesh-")) {
		return false
	}
	for _, c := range rest {
		if !('0' <= c && c <= '9' || 'a' <= c && c <= 'f') {
			return false
		}
	}
	return true
}

// SweepTemps removes, from dir, the temp files WriteAt calls cut short
// left for any name: each holds what was being written (a key, a
// certificate, a ledger), which nothing else would ever remove. It is for
// the mesh's own data dir, swept by the process that holds its lock, so no
// write of its own is under way. Directories and other entries are left.
// It says what it removed.
func SweepTemps(dir string) ([]string, error) {
	dfd, err := unix.Open(dir, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, &os.PathError{Op: "open", Path: dir, Err: err}
	}
	f := os.NewFile(uintptr(dfd), dir)
	defer f.Close()
	var removed []string
	for {
		entries, err := f.Readdirnames(1024)
		for _, e := range entries {
			if !isTemp(e) {
				continue
			}
			var st unix.Stat_t
			if unix.Fstatat(dfd, e, &st, unix.AT_SYMLINK_NOFOLLOW) != nil || st.Mode&unix.S_IFMT != unix.S_IFREG {
				continue
			}
			if err := unix.Unlinkat(dfd, e, 0); err == nil {
				removed = append(removed, e)
			} else if !errors.Is(err, unix.ENOENT) {
				return removed, fmt.Errorf("remove %s, left by a write cut short: %w", filepath.Join(dir, e), err)
			}
		}
		if err == io.EOF || len(entries) == 0 {
			break
		}
		if err != nil {
			return removed, fmt.Errorf("list %s: %w", dir, err)
		}
	}
	if len(removed) > 0 {
		if err := unix.Fsync(dfd); err != nil {
			return removed, fmt.Errorf("sync %s: %w", dir, err)
		}
	}
	return removed, nil
}

// SweepAt removes, from the directory dfd, the temp files a WriteAt of
// name cut short left (a kill -9 or a power cut before its rename): each
// holds what was being written, a secret's value as well, which nothing
// else would ever remove. A directory of that name is left (WriteAt never
// makes one). It says how many it removed.
func SweepAt(dfd int, name string) (int, error) {
	d, err := unix.Openat(dfd, ".", unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return 0, fmt.Errorf("open the directory of %s: %w", name, err)
	}
	f := os.NewFile(uintptr(d), ".")
	defer f.Close()
	n := 0
	for {
		entries, err := f.Readdirnames(1024)
		for _, e := range entries {
			if !isTempOf(e, name) {
				continue
			}
			if err := unix.Unlinkat(dfd, e, 0); err == nil {
				n++
			} else if !errors.Is(err, unix.ENOENT) && !errors.Is(err, unix.EISDIR) {
				return n, fmt.Errorf("remove %s, left by a write of %s cut short: %w", e, name, err)
			}
		}
		if err == io.EOF || len(entries) == 0 {
			break
		}
		if err != nil {
			return n, fmt.Errorf("list the directory of %s: %w", name, err)
		}
	}
	if n > 0 {
		if err := unix.Fsync(dfd); err != nil {
			return n, fmt.Errorf("sync the directory of %s: %w", name, err)
		}
	}
	return n, nil
}

// WriteFile replaces path with content (mode perm, owner unchanged),
// atomically and durably. It is for the mesh's own files (its data dir, which
// the operator chose and no container can reach), so the directory is opened
// as the system resolves it; the last component is never followed.
func WriteFile(path string, content []byte, perm os.FileMode) error {
	dir, base := filepath.Split(filepath.Clean(path))
	if dir == "" {
		dir = "."
	}
	dfd, err := unix.Open(dir, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return &os.PathError{Op: "open", Path: dir, Err: err}
	}
	defer unix.Close(dfd)
	if err := WriteAt(dfd, base, content, Attr{Mode: uint32(perm.Perm())}); err != nil {
		return fmt.Errorf("%s: %w", path, err)
	}
	return nil
}

// ReadFile reads one of the mesh's own files, as WriteFile writes them: the
// directory as the system resolves it, the last component never followed
// (a link there is ELOOP), a regular file of at most limit bytes.
func ReadFile(path string, limit int64) ([]byte, error) {
	fd, err := unix.Open(path, unix.O_RDONLY|unix.O_NOFOLLOW|unix.O_NONBLOCK|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, nameErr(path, "open", err)
	}
	f := os.NewFile(uintptr(fd), path)
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return nil, err
	}
	if !fi.Mode().IsRegular() {
		return nil, fmt.Errorf("%s is not a regular file (%s)", path, fi.Mode().Type())
	}
	if fi.Size() > limit {
		return nil, fmt.Errorf("%s is %d bytes, over the %d read: %w", path, fi.Size(), limit, ErrTooLarge)
	}
	b, err := io.ReadAll(io.LimitReader(f, limit+1))
	if err != nil {
		return nil, fmt.Errorf("read %s: %w", path, err)
	}
	if int64(len(b)) > limit {
		return nil, fmt.Errorf("%s grew past the %d bytes read: %w", path, limit, ErrTooLarge)
	}
	return b, nil
}

// SyncDir makes a directory's entries (a create, rename or removal in it)
// durable.
func SyncDir(path string) error {
	fd, err := OpenDir(path)
	if err != nil {
		return err
	}
	defer unix.Close(fd)
	return unix.Fsync(fd)
}

// SyncFS makes durable everything written to the filesystem that holds
// path (syncfs(2)): a tree a child process wrote (restic's restore), whose
// files no one here holds open to fsync one by one.
func SyncFS(path string) error {
	fd, err := OpenDir(path)
	if err != nil {
		return err
	}
	defer unix.Close(fd)
	if err := unix.Syncfs(fd); err != nil {
		return &os.PathError{Op: "syncfs", Path: path, Err: err}
	}
	return nil
}

// ErrTooLarge: a file given to read is larger than its bound.
var ErrTooLarge = errors.New("file too large")

// ReadRegular reads a file an operator named (a manifest, a snapshot, a
// token file): it must be a regular file, is opened without blocking (a
// FIFO given by mistake does not hang the command) and is read up to limit
// bytes; a larger one is ErrTooLarge, never read whole. Links are followed:
// the path is the operator's own.
func ReadRegular(path string, limit int64) ([]byte, error) {
	fd, err := unix.Open(path, unix.O_RDONLY|unix.O_NONBLOCK|unix.O_CLOEXEC|unix.O_NOCTTY, 0)
	if err != nil {
		return nil, &os.PathError{Op: "open", Path: path, Err: err}
	}
	f := os.NewFile(uintptr(fd), path)
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return nil, err
	}
	if !fi.Mode().IsRegular() {
		return nil, fmt.Errorf("%s is not a regular file (%s)", path, fi.Mode().Type())
	}
	if fi.Size() > limit {
		return nil, fmt.Errorf("%s is %d bytes, over the %d this command reads: %w", path, fi.Size(), limit, ErrTooLarge)
	}
	b, err := io.ReadAll(io.LimitReader(f, limit+1))
	if err != nil {
		return nil, fmt.Errorf("read %s: %w", path, err)
	}
	if int64(len(b)) > limit {
		return nil, fmt.Errorf("%s grew past the %d bytes this command reads: %w", path, limit, ErrTooLarge)
	}
	return b, nil
}
