package reconciler

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"os"
	"strings"

	"golang.org/x/sys/unix"

	"mesh/internal/safefs"
)

// The filesystem executor. Every path is walked from the root without
// following a link at any component (safefs), and changed through descriptors
// (fchown, fchmod, *at calls), so a link a container planted anywhere in a
// declared tree is refused, never followed.

// FS outcomes.
const (
	fsUnchanged = "unchanged"
	fsCreated   = "created"
	fsUpdated   = "updated"
)

func digestBytes(b []byte) string {
	s := sha256.Sum256(b)
	return hex.EncodeToString(s[:])
}

// maxFile bounds what the host reads of a file it compares (a declared file
// is at most a manifest's size; a container may have made it huge).
const maxFile = 64 << 20

// pathState is what is at a path now.
type pathState struct {
	exists bool
	isDir  bool
	// content and its digest, for a regular file
	content []byte
	digest  string
	uid     int
	gid     int
	mode    uint32 // permission, setuid, setgid and sticky bits
}

// lookBetween, when set (tests), runs between look's stat and its open:
// where a hostile container swaps the file.
var lookBetween func(path string)

// look says what is at path, following no link. A link anywhere is a
// *safefs.LinkError; a kind other than directory or regular file is an error.
func look(path string) (pathState, error) {
	var ps pathState
	dfd, base, err := safefs.OpenParent(path)
	if err != nil {
		if errors.Is(err, unix.ENOENT) {
			return ps, fmt.Errorf("%s: its parent directory does not exist; declare it above, the host applies resources in the order written", path)
		}
		return ps, err
	}
	defer unix.Close(dfd)
	var st unix.Stat_t
	if err := unix.Fstatat(dfd, base, &st, unix.AT_SYMLINK_NOFOLLOW); err != nil {
		if errors.Is(err, unix.ENOENT) {
			return ps, nil
		}
		return ps, &os.PathError{Op: "stat", Path: path, Err: err}
	}
	ps.exists = true
	ps.uid, ps.gid, ps.mode = int(st.Uid), int(st.Gid), st.Mode&0o7777
	switch st.Mode & unix.S_IFMT {
	case unix.S_IFDIR:
		ps.isDir = true
		return ps, nil
	case unix.S_IFLNK:
		return ps, &safefs.LinkError{Path: path, Link: path}
	case unix.S_IFREG:
	default:
		return ps, fmt.Errorf("%s exists and is neither a directory nor a regular file; move it aside", path)
	}
	if lookBetween != nil {
		lookBetween(path)
	}
	fd, err := unix.Openat(dfd, base, unix.O_RDONLY|unix.O_NOFOLLOW|unix.O_NONBLOCK|unix.O_CLOEXEC, 0)
	if err != nil {
		if errors.Is(err, unix.ELOOP) {
			return ps, &safefs.LinkError{Path: path, Link: path}
		}
		return ps, &os.PathError{Op: "open", Path: path, Err: err}
	}
	f := os.NewFile(uintptr(fd), path)
	defer f.Close()
	// What was opened is what was looked at: a container with the parent
	// mounted writable can swap a FIFO in between, and a FIFO it holds
	// open and never writes to kept this read, and the node's reconcile
	// loop, waiting for good.
	var fst unix.Stat_t
	if err := unix.Fstat(fd, &fst); err != nil {
		return ps, &os.PathError{Op: "stat", Path: path, Err: err}
	}
	if fst.Mode&unix.S_IFMT != unix.S_IFREG || fst.Dev != st.Dev || fst.Ino != st.Ino {
		return ps, fmt.Errorf("%s changed while it was read (a regular file was replaced); it is looked at again at the next apply", path)
	}
	ps.uid, ps.gid, ps.mode = int(fst.Uid), int(fst.Gid), fst.Mode&0o7777
	b, err := io.ReadAll(io.LimitReader(f, maxFile+1))
	if err != nil {
		return ps, fmt.Errorf("read %s: %w", path, err)
	}
	if len(b) > maxFile {
		return ps, fmt.Errorf("%s is larger than %d bytes; the mesh did not write it", path, maxFile)
	}
	ps.content, ps.digest = b, digestBytes(b)
	return ps, nil
}

// ensureDir makes path a directory with owner and mode. It returns what it
// did and, for an update, what drifted.
func ensureDir(path string, uid, gid int, mode uint32) (string, string, error) {
	dfd, base, err := safefs.OpenParent(path)
	if err != nil {
		return "", "", err
	}
	defer unix.Close(dfd)
	outcome := fsUnchanged
	if err := unix.Mkdirat(dfd, base, mode&0o777); err == nil {
		outcome = fsCreated
		if err := unix.Fsync(dfd); err != nil {
			return "", "", fmt.Errorf("sync %s: %w", path, err)
		}
	} else if !errors.Is(err, unix.EEXIST) {
		return "", "", fmt.Errorf("create directory: %w", err)
	}
	fd, err := unix.Openat(dfd, base, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		var st unix.Stat_t
		if errors.Is(err, unix.ELOOP) || unix.Fstatat(dfd, base, &st, unix.AT_SYMLINK_NOFOLLOW) == nil && st.Mode&unix.S_IFMT == unix.S_IFLNK {
			return "", "", &safefs.LinkError{Path: path, Link: path}
		}
		if errors.Is(err, unix.ENOTDIR) {
			return "", "", fmt.Errorf("exists and is not a directory; move it aside")
		}
		return "", "", fmt.Errorf("open directory: %w", err)
	}
	defer unix.Close(fd)
	drift, err := fixOwnerMode(fd, uid, gid, mode)
	if err != nil {
		return "", "", err
	}
	if outcome == fsCreated {
		// Made just now (mkdir applies the umask): setting its owner and
		// mode is part of creating it, not a drift to report.
		return outcome, "", nil
	}
	if drift != "" {
		outcome = fsUpdated
	}
	return outcome, drift, nil
}

// fixOwnerMode sets owner and mode through fd, saying what differed.
func fixOwnerMode(fd, uid, gid int, mode uint32) (string, error) {
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
	if have := st.Mode & 0o7777; have != mode {
		if err := unix.Fchmod(fd, mode); err != nil {
			return "", fmt.Errorf("chmod %04o: %w", mode, err)
		}
		drift = append(drift, fmt.Sprintf("mode %04o -> %04o", have, mode))
	}
	return strings.Join(drift, ", "), nil
}

// writeFile makes path hold content with owner and mode: replaced atomically
// and durably when the content differs, owner and mode fixed in place when
// only they drifted. have is what look found there. With sweep, or when it
// writes, the temp files a write of path cut short left beside it are
// removed (safefs.SweepAt): a kill -9 in a write left the value it was
// writing, a secret's too, in the module's directory for good.
func writeFile(path string, have pathState, content []byte, uid, gid int, mode uint32, sweep bool) (string, string, error) {
	dfd, base, err := safefs.OpenParent(path)
	if err != nil {
		return "", "", err
	}
	defer unix.Close(dfd)
	if sweep || !have.exists || have.digest != digestBytes(content) {
		if _, err := safefs.SweepAt(dfd, base); err != nil {
			return "", "", err
		}
	}
	if have.exists && have.digest == digestBytes(content) {
		fd, err := unix.Openat(dfd, base, unix.O_RDONLY|unix.O_NOFOLLOW|unix.O_NONBLOCK|unix.O_CLOEXEC, 0)
		if err != nil {
			return "", "", nameErr(path, err)
		}
		defer unix.Close(fd)
		var st unix.Stat_t
		if err := unix.Fstat(fd, &st); err != nil {
			return "", "", nameErr(path, err)
		}
		if st.Mode&unix.S_IFMT != unix.S_IFREG || st.Nlink != 1 {
			// Swapped since look, or a hard link a container made to a
			// file of its own (which a chown and a setuid mode would
			// give it under another name): written anew, a file of its
			// own.
			if err := safefs.WriteAt(dfd, base, content, safefs.Attr{UID: uid, GID: gid, Mode: mode, Chown: true}); err != nil {
				return "", "", err
			}
			return fsUpdated, "written anew: it was a link to another name (or no longer a file)", nil
		}
		drift, err := fixOwnerMode(fd, uid, gid, mode)
		if err != nil {
			return "", "", err
		}
		if drift != "" {
			return fsUpdated, drift, nil
		}
		return fsUnchanged, "", nil
	}
	if err := safefs.WriteAt(dfd, base, content, safefs.Attr{UID: uid, GID: gid, Mode: mode, Chown: true}); err != nil {
		return "", "", err
	}
	if !have.exists {
		return fsCreated, "", nil
	}
	return fsUpdated, "content changed", nil
}

func nameErr(path string, err error) error {
	if errors.Is(err, unix.ELOOP) {
		return &safefs.LinkError{Path: path, Link: path}
	}
	return &os.PathError{Op: "open", Path: path, Err: err}
}

// unlink removes the file at path if it still holds one of digests; it
// returns a reason when it keeps it.
func unlink(path string, digests ...string) (removed bool, kept string, err error) {
	have, err := look(path)
	switch {
	case err != nil:
		return false, keptReason(err), nil
	case !have.exists:
		// What a write cut short left beside it goes all the same.
		if dfd, base, err := safefs.OpenParent(path); err == nil {
			_, err = safefs.SweepAt(dfd, base)
			unix.Close(dfd)
			if err != nil {
				return false, "", err
			}
		}
		return true, "", nil
	case have.isDir:
		return false, "it is now a directory, not the file the mesh wrote", nil
	}
	match := false
	for _, d := range digests {
		match = match || d != "" && d == have.digest
	}
	if !match {
		return false, "its content changed since the mesh wrote it", nil
	}
	dfd, base, err := safefs.OpenParent(path)
	if err != nil {
		return false, keptReason(err), nil
	}
	defer unix.Close(dfd)
	if err := unix.Unlinkat(dfd, base, 0); err != nil && !errors.Is(err, unix.ENOENT) {
		return false, "", fmt.Errorf("remove: %w", err)
	}
	if _, err := safefs.SweepAt(dfd, base); err != nil {
		return false, "", err
	}
	if err := unix.Fsync(dfd); err != nil {
		return false, "", fmt.Errorf("sync directory of %s: %w", path, err)
	}
	return true, "", nil
}

// keptReason is why a path is kept when looking at it failed.
func keptReason(err error) string {
	var le *safefs.LinkError
	if errors.As(err, &le) {
		if le.Link == "" || le.Link == le.Path {
			return "it is a symbolic link the mesh did not make; not followed"
		}
		return le.Link + " is a symbolic link the mesh did not make; not followed"
	}
	return "no longer what the mesh made (" + err.Error() + ")"
}

// removeDir removes path if it is an empty directory (the mesh's own children
// are removed before it); otherwise it says what it holds.
func removeDir(path string) (removed bool, kept string, err error) {
	dfd, base, err := safefs.OpenParent(path)
	if errors.Is(err, unix.ENOENT) {
		return true, "", nil
	}
	if err != nil {
		return false, keptReason(err), nil
	}
	defer unix.Close(dfd)
	fd, err := unix.Openat(dfd, base, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if errors.Is(err, unix.ENOENT) {
		return true, "", nil
	}
	if err != nil {
		var st unix.Stat_t
		if unix.Fstatat(dfd, base, &st, unix.AT_SYMLINK_NOFOLLOW) == nil && st.Mode&unix.S_IFMT == unix.S_IFLNK {
			return false, "it is a symbolic link the mesh did not make; not followed", nil
		}
		return false, "it is no longer a directory the mesh made", nil
	}
	d := os.NewFile(uintptr(fd), path)
	names, count, err := listSome(d, 3, 100000)
	d.Close()
	if err != nil {
		return false, "", err
	}
	if count > 0 {
		if count > len(names) {
			names = append(names, "...")
		}
		n := fmt.Sprint(count)
		if count >= 100000 {
			n = "100000 or more"
		}
		word := "entries"
		if count == 1 {
			word = "entry"
		}
		return false, fmt.Sprintf("holds %s %s the mesh did not put there (%s)", n, word, strings.Join(names, ", ")), nil
	}
	if err := unix.Unlinkat(dfd, base, unix.AT_REMOVEDIR); err != nil {
		if errors.Is(err, unix.ENOENT) {
			return true, "", nil
		}
		if errors.Is(err, unix.ENOTEMPTY) || errors.Is(err, unix.EEXIST) {
			return false, "something was put in it while the mesh removed it", nil
		}
		return false, "", fmt.Errorf("remove: %w", err)
	}
	if err := unix.Fsync(dfd); err != nil {
		return false, "", fmt.Errorf("sync directory of %s: %w", path, err)
	}
	return true, "", nil
}

// listSome counts a directory's entries (up to limit) and returns the first
// few names, in the order the directory gives them.
func listSome(d *os.File, few, limit int) ([]string, int, error) {
	var names []string
	count := 0
	for count < limit {
		batch, err := d.Readdirnames(1024)
		for _, n := range batch {
			if len(names) < few {
				names = append(names, n)
			}
		}
		count += len(batch)
		if err == io.EOF || len(batch) == 0 {
			return names, count, nil
		}
		if err != nil {
			return nil, 0, err
		}
	}
	return names, count, nil
}

// restoreOwnerMode puts back a directory's owner and mode, following no
// link; one gone already is nothing to put back.
func restoreOwnerMode(path string, uid, gid int, mode uint32) error {
	dfd, base, err := safefs.OpenParent(path)
	if errors.Is(err, unix.ENOENT) {
		return nil
	}
	if err != nil {
		return err
	}
	defer unix.Close(dfd)
	fd, err := unix.Openat(dfd, base, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if errors.Is(err, unix.ENOENT) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("open %s to put its owner and mode back: %w", path, err)
	}
	defer unix.Close(fd)
	_, err = fixOwnerMode(fd, uid, gid, mode)
	return err
}

// purgeDir removes the directory path and everything in it, following no
// link (path's own components included: safefs.OpenParent refuses a link),
// and says how many entries it removed. A tree nested past maxPurgeDepth is
// an error, not a stack of open directories.
func purgeDir(path string) (int, error) {
	dfd, base, err := safefs.OpenParent(path)
	if errors.Is(err, unix.ENOENT) {
		return 0, nil
	}
	if err != nil {
		return 0, err
	}
	defer unix.Close(dfd)
	var st unix.Stat_t
	// What a purge cut short left aside goes first.
	if err := unix.Fstatat(dfd, base+purgeSuffix, &st, unix.AT_SYMLINK_NOFOLLOW); err == nil && st.Mode&unix.S_IFMT == unix.S_IFDIR {
		if _, err := removeTree(dfd, base+purgeSuffix, 0, st.Dev); err != nil {
			return 0, err
		}
	}
	if err := unix.Fstatat(dfd, base, &st, unix.AT_SYMLINK_NOFOLLOW); errors.Is(err, unix.ENOENT) {
		return 0, nil
	} else if err != nil {
		return 0, err
	}
	if st.Mode&unix.S_IFMT != unix.S_IFDIR {
		return 0, fmt.Errorf("%s is no longer a directory; the mesh removes only the directory it made", path)
	}
	// Renamed aside first: cut short, what is left is not the data
	// directory a module assigned there again would find half emptied.
	aside := base + purgeSuffix
	if err := unix.Renameat(dfd, base, dfd, aside); err != nil {
		return 0, fmt.Errorf("rename %s aside: %w", path, err)
	}
	if err := unix.Fsync(dfd); err != nil {
		return 0, fmt.Errorf("sync directory of %s: %w", path, err)
	}
	n, err := removeTree(dfd, aside, 0, st.Dev)
	if err != nil {
		return n, err
	}
	if err := unix.Fsync(dfd); err != nil {
		return n, fmt.Errorf("sync directory of %s: %w", path, err)
	}
	return n, nil
}

const maxPurgeDepth = 256

// purgeSuffix names a data directory a purge renamed aside.
const purgeSuffix = ".mesh-purging"

// removeTree removes name in dfd: a file or a link is unlinked, a directory
// emptied first, each opened with O_NOFOLLOW relative to its parent; a
// mount inside (a directory on another device than dev, or a bind mount)
// is not entered.
func removeTree(dfd int, name string, depth int, dev uint64) (int, error) {
	err := unix.Unlinkat(dfd, name, 0)
	if err == nil || errors.Is(err, unix.ENOENT) {
		return 0, nil
	}
	if !errors.Is(err, unix.EISDIR) && !errors.Is(err, unix.EPERM) {
		return 0, fmt.Errorf("remove %s: %w", name, err)
	}
	if depth >= maxPurgeDepth {
		return 0, fmt.Errorf("nested more than %d directories deep; remove the rest by hand", maxPurgeDepth)
	}
	// Not across a mount, a bind mount of the same file system included
	// (the same st_dev as the tree: /srv/media bound onto a directory in
	// the data was emptied through it).
	fd, err := unix.Openat2(dfd, name, &unix.OpenHow{
		Flags:   unix.O_RDONLY | unix.O_DIRECTORY | unix.O_NOFOLLOW | unix.O_CLOEXEC,
		Resolve: unix.RESOLVE_NO_XDEV | unix.RESOLVE_NO_SYMLINKS | unix.RESOLVE_NO_MAGICLINKS,
	})
	if errors.Is(err, unix.EXDEV) {
		return 0, fmt.Errorf("%s is a mount point; the purge does not cross it: unmount it, then the next apply goes on", name)
	}
	if err != nil {
		return 0, fmt.Errorf("open %s: %w", name, err)
	}
	d := os.NewFile(uintptr(fd), name)
	defer d.Close()
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		return 0, fmt.Errorf("stat %s: %w", name, err)
	}
	if st.Dev != dev {
		return 0, fmt.Errorf("%s is a mount point (another file system); the purge does not cross it: unmount it, then the next apply goes on", name)
	}
	n := 0
	// Read whole, then removed, until it reads empty: a directory read
	// while entries go may skip some.
	for {
		if _, err := d.Seek(0, io.SeekStart); err != nil {
			return n, fmt.Errorf("read %s: %w", name, err)
		}
		names, err := d.Readdirnames(-1)
		if err != nil {
			return n, fmt.Errorf("read %s: %w", name, err)
		}
		if len(names) == 0 {
			break
		}
		for _, c := range names {
			m, err := removeTree(int(d.Fd()), c, depth+1, dev)
			n += m + 1
			if err != nil {
				return n, fmt.Errorf("%s/%w", name, err)
			}
		}
	}
	if err := unix.Unlinkat(dfd, name, unix.AT_REMOVEDIR); err != nil && !errors.Is(err, unix.ENOENT) {
		return n, fmt.Errorf("remove %s: %w", name, err)
	}
	return n, nil
}
