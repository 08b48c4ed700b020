// Package restic runs Debian's restic binary (0.14, the one apt installs)
// for a mesh agent backing up a module's data directories. It owns how
// restic is called: the repository and password travel in the child's
// environment only, that environment is built from nothing (an operator's
// RESTIC_* variables never redirect a run), every value put on a command
// line is checked first, and restic's text is turned into typed errors here,
// once. It decides nothing: what to back up, when, and what to keep are the
// caller's.
package restic

import (
	"bytes"
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"math"
	"math/bits"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// StopGrace is how long a run has, after SIGINT, to remove its lock and
// exit before it is killed.
const StopGrace = 10 * time.Second

// Bounds on what is kept of a run's output.
const (
	stderrTail = 4 << 10  // the end of stderr, for errors
	maxStdout  = 64 << 20 // snapshots and forget answer in one JSON document
	maxLine    = 64 << 10 // one backup status line (current_files can be long)
)

// defaultPath is the child's PATH when the agent has none (systemd units).
const defaultPath = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"

// Errors a caller branches on, wrapped in a sentence naming the run.
// restic 0.14 has no exit codes for these, so its messages are read here.
var (
	ErrNotInstalled  = errors.New("restic is not installed (apt-get install restic)")
	ErrWrongPassword = errors.New("the repository's password is wrong (it is not the one the repository was initialised with)")
	ErrNoRepository  = errors.New("the repository does not exist yet")
	// ErrIncomplete: the snapshot was made, but some files could not be read
	// and are missing from it (restic's exit code 3).
	ErrIncomplete = errors.New("the snapshot is incomplete: some files could not be read")
)

// errExists is init's answer when another run initialised it first.
var errExists = errors.New("the repository exists already")

// Repo is one restic repository as mesh uses it.
type Repo struct {
	URL      string   // as restic takes it: a local path, sftp:..., s3:..., rest:...
	Password []byte   // passed as RESTIC_PASSWORD in the child's environment, never on its command line
	Binary   string   // "" = "restic" found on PATH
	CacheDir string   // "" = --no-cache; else RESTIC_CACHE_DIR
	Host     string   // --host for backup (the node's name); "" = the machine's hostname
	Env      []string // extra environment (AWS_ACCESS_KEY_ID=... for s3:), appended
}

// Snapshot is one snapshot as restic lists it.
type Snapshot struct {
	ID, ShortID string
	Time        time.Time
	Host        string
	Paths, Tags []string
}

// Summary is what a backup reports at its end.
type Summary struct {
	SnapshotID                              string // restic 0.14 gives the short ID
	FilesNew, FilesChanged, FilesUnmodified int
	DataAdded, TotalBytes                   int64
	TotalFiles                              int
	Duration                                time.Duration
	// Unconfined says why restic read the paths without them bound
	// without links (confineScript), "" when it did.
	Unconfined string
}

// Keep is a forget policy: how many of the newest snapshots to keep, in all
// and per hour, day, week, month and year.
type Keep struct {
	Last, Hourly, Daily, Weekly, Monthly, Yearly int
}

// Progress is a backup's status line.
type Progress struct {
	PercentDone           float64
	FilesDone, TotalFiles int
	BytesDone, TotalBytes int64
}

// Ensure initialises the repository when it does not exist yet, and tells
// whether it did. An existing one is opened, which checks the password.
func (r Repo) Ensure(ctx context.Context) (created bool, err error) {
	err = r.run(ctx, nil, "cat", "config")
	if !errors.Is(err, ErrNoRepository) {
		return false, err
	}
	err = r.run(ctx, nil, "init")
	if errors.Is(err, errExists) {
		// Another agent initialised it between the two runs: open it as ours.
		return false, r.run(ctx, nil, "cat", "config")
	}
	return err == nil, err
}

// Backup makes one snapshot of paths (absolute, existing) with tags.
// progress, when not nil, is called with each status
// line, from another goroutine, one call at a time, before Backup returns.
// A snapshot that misses files it could not read is returned with an error
// wrapping ErrIncomplete.
func (r Repo) Backup(ctx context.Context, paths []string, tags []string, progress func(Progress)) (Summary, error) {
	return r.BackupExcluding(ctx, paths, nil, tags, progress)
}

// BackupExcluding is Backup leaving out exclude (absolute paths, each
// matched as itself, not as a pattern).
func (r Repo) BackupExcluding(ctx context.Context, paths, exclude []string, tags []string, progress func(Progress)) (Summary, error) {
	if len(paths) == 0 {
		return Summary{}, errors.New("restic backup: no paths given")
	}
	for _, p := range paths {
		if !filepath.IsAbs(p) {
			return Summary{}, fmt.Errorf("restic backup: %q is not an absolute path (restic would resolve it against the agent's working directory)", p)
		}
		// restic skips a missing path with a warning and exits 0: the
		// snapshot would silently lack a data directory.
		if _, err := os.Lstat(p); errors.Is(err, fs.ErrNotExist) {
			return Summary{}, fmt.Errorf("restic backup: %s does not exist (restic would leave it out of the snapshot and succeed): %w", p, err)
		} else if err != nil {
			return Summary{}, fmt.Errorf("restic backup: %w", err)
		}
		if l := LinkIn(p); l != "" {
			return Summary{}, linkedError(p, l)
		}
	}
	if err := checkTags(tags); err != nil {
		return Summary{}, fmt.Errorf("restic backup: %w", err)
	}
	if strings.HasPrefix(r.Host, "-") {
		return Summary{}, fmt.Errorf("restic backup: host %q starts with '-'", r.Host)
	}
	args := []string{"backup", "--json"}
	if r.Host != "" {
		args = append(args, "--host="+r.Host)
	}
	if len(tags) > 0 {
		args = append(args, "--tag="+strings.Join(tags, ","))
	}
	for _, x := range exclude {
		if !filepath.IsAbs(x) {
			return Summary{}, fmt.Errorf("restic backup: the excluded %q is not an absolute path", x)
		}
		args = append(args, "--exclude="+globEscape.Replace(x))
	}
	args = append(args, "--")
	args = append(args, paths...)

	// A backup whose progress stands still for BackupStall is stopped: a
	// file it reads does not answer (a fifo a container swapped in for a
	// file between restic's lstat and its open, which restic opens
	// without O_NONBLOCK), and the node it holds would wait for hours.
	// Armed by restic's first status line (one that printed none would
	// never be stopped by it), set again by every line that moves.
	ctx, stop := context.WithCancelCause(ctx)
	defer stop(nil)
	var stall *time.Timer
	defer func() {
		if stall != nil {
			stall.Stop()
		}
	}()
	// A backup that is to read more than the paths' filesystems could
	// hold is stopped too: a sparse file (restic 0.14 reads its holes as
	// data; a container makes one of an exabyte with one call) would hold
	// the node for ever. restic counts what it will read as it walks.
	bound := readBound(paths)
	var moved Progress
	var sum *Summary
	out := &lineWriter{line: func(b []byte) {
		var l backupLine
		if json.Unmarshal(b, &l) != nil {
			if bound > 0 && bytes.Contains(b, []byte(`"message_type":"status"`)) {
				// Sizes no uint64 holds: over any bound.
				stop(&TooMuchError{Paths: paths, Total: ^uint64(0), Bound: bound})
			}
			return
		}
		switch l.MessageType {
		case "status":
			p := Progress{PercentDone: l.PercentDone, FilesDone: l.FilesDone, TotalFiles: l.TotalFiles, BytesDone: toInt64(l.BytesDone), TotalBytes: toInt64(l.TotalBytes)}
			if stall == nil {
				stall = time.AfterFunc(BackupStall, func() { stop(errStalled) })
			} else if p != moved {
				stall.Reset(BackupStall)
			}
			moved = p
			if bound > 0 && l.TotalBytes > bound {
				stop(&TooMuchError{Paths: paths, Total: l.TotalBytes, Bound: bound})
			}
			if progress != nil {
				progress(p)
			}
		case "summary":
			sum = &Summary{
				SnapshotID: l.SnapshotID, FilesNew: l.FilesNew, FilesChanged: l.FilesChanged, FilesUnmodified: l.FilesUnmodified,
				DataAdded: l.DataAdded, TotalBytes: l.TotalBytesProcessed, TotalFiles: l.TotalFilesProcessed,
				Duration: time.Duration(l.TotalDuration * float64(time.Second)),
			}
		}
	}}
	err := r.runIn(ctx, out, paths, args...)
	var rerr *runError
	unconfined := ""
	if errors.As(err, &rerr) && rerr.code == exitLinked {
		// A path (or a directory above it) could not be bound onto
		// itself: a link there, put after the look above (no fall back
		// to a run that would follow it). Nothing of restic ran.
		return Summary{}, fmt.Errorf("restic backup: %s; not backed up (a container that writes a directory above a data directory may have swapped it for a link)", cmp.Or(strings.Join(rerr.stderr, "; "), "a path could not be bound"))
	}
	if errors.As(err, &rerr) && rerr.code == exitUnconfined {
		// The paths could not be bound without links (a mount whose
		// flags a user namespace locks, no mount(8)): backed up as
		// before, and said. Nothing of restic ran.
		unconfined = cmp.Or(strings.Join(rerr.stderr, "; "), "mount(8) failed")
		out.buf, out.skip, sum = out.buf[:0], false, nil
		err = r.run(ctx, out, args...)
	}
	out.flush()
	if sum != nil {
		sum.Unconfined = unconfined
	}
	if errors.As(err, &rerr) && rerr.code == 3 && sum != nil {
		msg := strings.Join(fileErrors(rerr.stderr), "; ")
		return *sum, fmt.Errorf("restic backup: snapshot %s: %w (%s)", sum.SnapshotID, ErrIncomplete, msg)
	}
	if err != nil {
		return Summary{}, err
	}
	if sum == nil || !validID(sum.SnapshotID) {
		return Summary{}, errors.New("restic backup: it printed no summary with a snapshot ID (is this restic 0.14 or newer?)")
	}
	return *sum, nil
}

// ReadFactor and ReadSlack bound what a backup may read: the capacity of
// its paths' filesystems times ReadFactor, and at least that capacity and
// ReadSlack more (compression on the filesystem, hard links, each read
// again, leave room above the capacity itself).
var (
	ReadFactor uint64 = 4
	ReadSlack  uint64 = 1 << 40
)

// readBound is what a backup of paths may read (0: unbounded, when a
// filesystem's capacity cannot be told): the filesystems of paths and of
// the mounts under them (restic walks into those when it runs unconfined,
// holdsMounts), each once.
func readBound(paths []string) uint64 {
	b, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		return 0
	}
	at := append(slices.Clone(paths), mountPointsUnder(string(b), paths)...)
	var capacity uint64
	seen := map[uint64]bool{}
	for _, p := range at {
		var st unix.Stat_t
		var fs unix.Statfs_t
		if unix.Stat(p, &st) != nil || unix.Statfs(p, &fs) != nil {
			return 0
		}
		if seen[st.Dev] {
			continue
		}
		seen[st.Dev] = true
		capacity += fs.Blocks * uint64(fs.Frsize) // f_blocks counts f_frsize units
	}
	return max(satMul(capacity, ReadFactor), capacity+ReadSlack)
}

// toInt64 is v, at most the largest int64.
func toInt64(v uint64) int64 { return int64(min(v, math.MaxInt64)) }

// satMul is a*b, at most the largest uint64.
func satMul(a, b uint64) uint64 {
	if hi, lo := bits.Mul64(a, b); hi == 0 {
		return lo
	}
	return ^uint64(0)
}

// TooMuchError: a backup stopped because it was to read more than its
// paths' filesystems could hold.
type TooMuchError struct {
	Paths        []string
	Total, Bound uint64
}

func (e *TooMuchError) Error() string {
	quoted := make([]string, len(e.Paths))
	for i, p := range e.Paths {
		quoted[i] = "'" + strings.ReplaceAll(p, "'", `'\''`) + "'"
	}
	return fmt.Sprintf("it was to read %s from %s, whose filesystems hold far less (at most %s is read): a sparse file (restic reads its holes as data) or a great many hard links, which a container can make; the backup was stopped, as it would hold the node for hours. find %s -type f -size +1G -printf '%%s %%b %%p\\n' lists the large files with their blocks",
		gib(e.Total), strings.Join(e.Paths, ", "), gib(e.Bound), strings.Join(quoted, " "))
}

// gib is a size in GiB, for messages.
func gib(b uint64) string { return fmt.Sprintf("%.1f GiB", float64(b)/(1<<30)) }

// BackupStall is how long a backup's progress may stand still before it
// is stopped (a var for tests).
var BackupStall = 15 * time.Minute

// errStalled: a backup stopped by BackupStall.
var errStalled = errors.New("its progress stood still: a file it reads does not answer (a fifo or a device a container put in a data directory?); the backup was stopped")

// backupLine is any line restic backup --json prints: status or summary.
type backupLine struct {
	MessageType string  `json:"message_type"`
	PercentDone float64 `json:"percent_done"`
	TotalFiles  int     `json:"total_files"`
	FilesDone   int     `json:"files_done"`
	TotalBytes  uint64  `json:"total_bytes"` // restic's own type: a sparse file of 8 EiB is over int64
	BytesDone   uint64  `json:"bytes_done"`

	FilesNew            int     `json:"files_new"`
	FilesChanged        int     `json:"files_changed"`
	FilesUnmodified     int     `json:"files_unmodified"`
	DataAdded           int64   `json:"data_added"`
	TotalFilesProcessed int     `json:"total_files_processed"`
	TotalBytesProcessed int64   `json:"total_bytes_processed"`
	TotalDuration       float64 `json:"total_duration"` // seconds
	SnapshotID          string  `json:"snapshot_id"`
}

// Snapshots lists the snapshots holding every one of tags (none: all),
// oldest first.
func (r Repo) Snapshots(ctx context.Context, tags []string) ([]Snapshot, error) {
	if err := checkTags(tags); err != nil {
		return nil, fmt.Errorf("restic snapshots: %w", err)
	}
	args := []string{"snapshots", "--json"}
	if len(tags) > 0 {
		// One --tag with a comma list: all must match (repeated --tag ORs).
		args = append(args, "--tag="+strings.Join(tags, ","))
	}
	out := &boundedBuffer{max: maxStdout}
	if err := r.run(ctx, out, args...); err != nil {
		return nil, err
	}
	if out.over {
		return nil, fmt.Errorf("restic snapshots: its answer is over %d MiB (forget old snapshots)", maxStdout>>20)
	}
	var list []jsonSnapshot
	if err := json.Unmarshal(out.Bytes(), &list); err != nil {
		return nil, fmt.Errorf("restic snapshots: read its answer: %w", err)
	}
	snaps := make([]Snapshot, len(list))
	for i, s := range list {
		snaps[i] = s.snapshot()
	}
	sort.SliceStable(snaps, func(i, j int) bool { return snaps[i].Time.Before(snaps[j].Time) })
	return snaps, nil
}

// jsonSnapshot is a snapshot as restic prints it.
type jsonSnapshot struct {
	ID       string    `json:"id"`
	ShortID  string    `json:"short_id"`
	Time     time.Time `json:"time"`
	Hostname string    `json:"hostname"`
	Paths    []string  `json:"paths"`
	Tags     []string  `json:"tags"`
}

func (s jsonSnapshot) snapshot() Snapshot {
	return Snapshot{ID: s.ID, ShortID: s.ShortID, Time: s.Time, Host: s.Hostname, Paths: s.Paths, Tags: s.Tags}
}

// Restore writes snapshot id (full or short) under target, each path at its
// absolute path below target (/srv/db in the snapshot is target/srv/db);
// with paths (absolute, as backed up) only those and what is below them.
// Owners, modes and times are restored, symbolic links as links (never
// followed), hard links as links. restic 0.14 writes a sparse file's holes
// as zeros.
func (r Repo) Restore(ctx context.Context, id, target string, paths ...string) error {
	if !validID(id) {
		return fmt.Errorf("restic restore: %q is not a snapshot ID (8 to 64 lower-case hex digits)", id)
	}
	if !filepath.IsAbs(target) {
		return fmt.Errorf("restic restore: target %q is not an absolute path", target)
	}
	args := []string{"restore", id, "--target=" + target}
	for _, p := range paths {
		if !filepath.IsAbs(p) {
			return fmt.Errorf("restic restore: %q is not an absolute path (give it as it was backed up)", p)
		}
		// --include takes a pattern: a path's own *, ? and [ are escaped.
		args = append(args, "--include="+globEscape.Replace(p))
	}
	return r.run(ctx, nil, args...)
}

// Size is what restoring (some of) a snapshot writes: the files' bytes,
// and how many entries (files, directories, links) it makes, each of
// which takes a little more than its bytes on the disk.
type Size struct {
	Bytes, Entries int64
}

// OnDisk is s's bytes with block more for each entry, at most the largest
// uint64 (the figures are what restic says of a repository, which may be
// anyone's).
func (s Size) OnDisk(block uint64) uint64 {
	sum, carry := bits.Add64(uint64(max(s.Bytes, 0)), satMul(uint64(max(s.Entries, 0)), block), 0)
	if carry != 0 {
		return ^uint64(0)
	}
	return sum
}

// RestoreSize is what restoring snapshot id whole writes (restic stats'
// restore-size: a file hard-linked twice counts its bytes once; every
// entry counts, the directories above the paths backed up too).
func (r Repo) RestoreSize(ctx context.Context, id string) (Size, error) {
	if !validID(id) {
		return Size{}, fmt.Errorf("restic stats: %q is not a snapshot ID (8 to 64 lower-case hex digits)", id)
	}
	out := &boundedBuffer{max: maxLine}
	if err := r.run(ctx, out, "stats", "--json", "--mode=restore-size", id); err != nil {
		return Size{}, err
	}
	var st struct {
		TotalSize  *int64 `json:"total_size"`
		TotalFiles int64  `json:"total_file_count"`
		Snapshots  int    `json:"snapshots_count"`
	}
	if err := json.Unmarshal(out.Bytes(), &st); err != nil || out.over || st.TotalSize == nil || *st.TotalSize < 0 || st.TotalFiles < 0 {
		return Size{}, fmt.Errorf("restic stats: its answer holds no size (%.200q)", out.Bytes())
	}
	// restic 0.14 passes over an ID it does not find, and exits 0.
	if st.Snapshots != 1 {
		return Size{}, fmt.Errorf("restic stats: the repository has no snapshot %s", id)
	}
	return Size{Bytes: *st.TotalSize, Entries: st.TotalFiles}, nil
}

// SizeUnder is what restoring path (absolute, as backed up) of snapshot id
// writes: the sizes of the files restic ls lists under it (a file
// hard-linked twice counts twice), and the entries there, path's own too.
// Its listing is read line by line, however many files the snapshot holds.
func (r Repo) SizeUnder(ctx context.Context, id, path string) (Size, error) {
	if !validID(id) {
		return Size{}, fmt.Errorf("restic ls: %q is not a snapshot ID (8 to 64 lower-case hex digits)", id)
	}
	if !filepath.IsAbs(path) || path != filepath.Clean(path) {
		return Size{}, fmt.Errorf("restic ls: %q is not a clean absolute path", path)
	}
	var total Size
	var bad error
	found := false
	lw := &lineWriter{line: func(line []byte) {
		var n struct {
			StructType string `json:"struct_type"`
			ID         string `json:"id"`
			Type       string `json:"type"`
			Path       string `json:"path"`
			Size       int64  `json:"size"`
		}
		if json.Unmarshal(line, &n) != nil {
			return
		}
		if n.StructType == "snapshot" && strings.HasPrefix(n.ID, id) {
			found = true
		}
		if n.StructType != "node" || !within(n.Path, path) {
			return
		}
		total.Entries++
		if n.Type != "file" {
			return
		}
		if n.Size < 0 || total.Bytes+n.Size < total.Bytes {
			bad = fmt.Errorf("restic ls: a file of %s has a size of %d", path, n.Size)
			return
		}
		total.Bytes += n.Size
	}}
	err := r.run(ctx, lw, "ls", "--json", "--recursive", id, path)
	lw.flush()
	if err != nil {
		return Size{}, err
	}
	if !found { // restic 0.14 passes over an ID it does not find, and exits 0
		return Size{}, fmt.Errorf("restic ls: the repository has no snapshot %s", id)
	}
	return total, bad
}

// globEscape makes a path a pattern that matches only itself.
var globEscape = strings.NewReplacer(`\`, `\\`, `*`, `\*`, `?`, `\?`, `[`, `\[`)

// Forget removes the snapshots holding every one of tags that keep does not
// keep, and with prune their data too; it returns the IDs removed. keep
// applies to each group of the same host and paths (restic's default), so a
// module moved to another node keeps its last snapshots of the old one.
func (r Repo) Forget(ctx context.Context, tags []string, keep Keep, prune bool) ([]string, error) {
	if err := checkTags(tags); err != nil {
		return nil, fmt.Errorf("restic forget: %w", err)
	}
	flags := []struct {
		name string
		n    int
	}{{"last", keep.Last}, {"hourly", keep.Hourly}, {"daily", keep.Daily}, {"weekly", keep.Weekly}, {"monthly", keep.Monthly}, {"yearly", keep.Yearly}}
	args := []string{"forget", "--json"}
	if len(tags) > 0 {
		args = append(args, "--tag="+strings.Join(tags, ","))
	}
	for _, f := range flags {
		if f.n < 0 {
			return nil, fmt.Errorf("restic forget: keep %s is %d (a count of snapshots cannot be negative)", f.name, f.n)
		}
		if f.n > 0 {
			args = append(args, "--keep-"+f.name+"="+strconv.Itoa(f.n))
		}
	}
	if keep == (Keep{}) {
		return nil, errors.New("restic forget: the keep policy is all zero, which would forget every snapshot (set at least one of Last, Hourly, Daily, Weekly, Monthly, Yearly)")
	}
	if prune {
		args = append(args, "--prune")
	}
	out := &boundedBuffer{max: maxStdout}
	if err := r.run(ctx, out, args...); err != nil {
		return nil, err
	}
	// The JSON comes first; with --prune, prune's text report follows it.
	var groups []struct {
		Remove []jsonSnapshot `json:"remove"`
	}
	if err := json.NewDecoder(bytes.NewReader(out.Bytes())).Decode(&groups); err != nil {
		return nil, fmt.Errorf("restic forget: read its answer: %w", err)
	}
	removed := []string{}
	for _, g := range groups {
		for _, s := range g.Remove {
			removed = append(removed, s.ID)
		}
	}
	return removed, nil
}

// No run unlocks the repository by itself: restic takes a lock for stale
// when its host name is this machine's and its process is not running
// here, so on two machines of one host name (cloned from one image) an
// unlock would remove a live run's lock, and a prune under a running backup
// loses its data. A lock left by a run killed with SIGKILL is restic's own
// error, saying to run restic unlock when no other run is going on.

// ForgetID removes one snapshot (and with prune its data): a snapshot that
// missed files is not kept to be restored by default.
func (r Repo) ForgetID(ctx context.Context, id string, prune bool) error {
	if !validID(id) {
		return fmt.Errorf("restic forget: %q is not a snapshot ID (8 to 64 lower-case hex digits)", id)
	}
	args := []string{"forget", id}
	if prune {
		args = append(args, "--prune")
	}
	return r.run(ctx, nil, args...)
}

// checkTags refuses a tag restic would read otherwise: a comma splits it
// into two, and a leading '-' reads as a flag.
func checkTags(tags []string) error {
	for _, t := range tags {
		switch {
		case t == "":
			return errors.New("a tag is empty")
		case strings.Contains(t, ","):
			return fmt.Errorf("tag %q holds a comma (restic would split it in two)", t)
		case strings.HasPrefix(t, "-"):
			return fmt.Errorf("tag %q starts with '-'", t)
		}
	}
	return nil
}

// validID is a snapshot ID as restic prints it, short (8) or full (64).
func validID(id string) bool {
	if len(id) < 8 || len(id) > 64 {
		return false
	}
	for _, c := range id {
		if (c < '0' || c > '9') && (c < 'a' || c > 'f') {
			return false
		}
	}
	return true
}

// A backup's restic walks paths a module's containers write as it reads
// them, and it opens a file by its path (the last component without
// following a link, the others as the kernel resolves them): a container
// that swaps a directory it owns for a link to /etc between restic's
// look at it and its open of a file under it would have the host's file
// read into its snapshot, and a restore would give it to the container.
// A backup runs restic in a mount namespace of its own where each path
// is bound onto itself with nosymfollow (Linux 5.10): no link under it is
// followed, while links are still read and kept as links. So is each
// directory above a path but the top one (/srv, /home: no module may
// declare or mount one), bound first, top down, with what is mounted in
// it: a container that writes /srv/app, where /srv/app/x/data is a data
// directory, could swap x for a link to another module's directory, which
// the bind would resolve and restic read (BackupExcluding looks for a link
// first; the binds close the time between). confineScript does it with
// mount(8), then becomes restic; exitUnconfined is its exit when the
// binds cannot be made without links at all here (checked first on a
// directory of the mesh's own, which no container reaches: no mount(8),
// or no nosymfollow), exitLinked when a path's bind, remount or check
// fails once they can (a link swapped into the path; a run without the
// binds would follow it).
//
// The remount takes the options of the mount it binds (mtab's, not
// fstab's, which could add ro), and is checked to carry nosymfollow: an
// older mount(8) or kernel takes an option it does not know without a
// word. The trap ends the script on a cancel's SIGINT while a mount runs
// (bash would go on to restic, which would then be killed, its lock
// left). A path holding other mounts is not bound (a bind that is not
// recursive would hide them from the snapshot): the backup runs as
// before (holdsMounts). mount(8) and findmnt are told not to resolve a
// path themselves: they would read a link above it (readlink works
// under nosymfollow) and bind where it leads; the kernel refuses it.
const confineScript = `trap 'exit 130' INT TERM
command -v mount >/dev/null || { echo "no mount(8) here" >&2; exit 97; }
command -v findmnt >/dev/null || { echo "no findmnt(8) here" >&2; exit 97; }
nofollow() { # HOW PATH: PATH bound onto itself (HOW: --bind, --rbind) with nosymfollow, checked
	mount --no-canonicalize "$1" -- "$2" "$2" &&
		mount --no-canonicalize --options-source=mtab -o remount,bind,nosymfollow -- "$2" &&
		findmnt --nocanonicalize -n -o VFS-OPTIONS -M "$2" | tail -n 1 | grep -qw nosymfollow
}
nofollow --bind "$1" ||
	{ echo "nosymfollow did not take on a directory of the mesh's own, or it could not be bound (mount(8) or the kernel does not know it)" >&2; exit 97; }
shift
n=$1; shift
while [ "$n" -gt 0 ]; do
	nofollow "$1" "$2" || { echo "$2 could not be bound onto itself without links" >&2; exit 98; }
	shift 2; n=$((n-1))
done
exec "$@"`

// exitLinked is confineScript's exit when a bind fails.
const exitLinked = 98

// confineArgs is confineScript's arguments for paths: the count, then per
// bind its mount(8) option and its path, the directories above the paths
// (but the top one) first, top down, each once, with what is mounted in
// them (--rbind), then each path (--bind).
func confineArgs(paths []string) []string {
	var above []string
	for _, p := range paths {
		for d := filepath.Dir(p); strings.Count(d, "/") >= 2; d = filepath.Dir(d) {
			if !slices.Contains(above, d) && !slices.Contains(paths, d) {
				above = append(above, d)
			}
		}
	}
	slices.SortFunc(above, func(a, b string) int {
		return cmp.Or(cmp.Compare(strings.Count(a, "/"), strings.Count(b, "/")), strings.Compare(a, b))
	})
	args := []string{strconv.Itoa(len(above) + len(paths))}
	for _, d := range above {
		args = append(args, "--rbind", d)
	}
	for _, p := range paths {
		args = append(args, "--bind", p)
	}
	return args
}

// LinkIn is the first component of p (absolute, clean) that is a link, ""
// when none is (or one cannot be looked at: restic then says so). A data
// directory's path holds none (the host refuses one it would follow).
func LinkIn(p string) string {
	for i := 1; i <= len(p); i++ {
		if i < len(p) && p[i] != '/' {
			continue
		}
		if fi, err := os.Lstat(p[:i]); err == nil && fi.Mode()&fs.ModeSymlink != 0 {
			return p[:i]
		}
	}
	return ""
}

func linkedError(p, link string) error {
	return fmt.Errorf("restic backup: %s: %s is a link; not backed up (a data directory's path holds none: a container that writes the directory above it may have put it there)", p, link)
}

const exitUnconfined = 97

// holdsMounts says which of paths holds a mount point under it ("" when
// none does), from /proc/self/mountinfo; one that cannot be read counts
// as holding one.
func holdsMounts(paths []string) string {
	b, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		return "the mounts could not be read: " + err.Error()
	}
	if msg := mountsUnder(string(b), paths); msg != "" {
		return msg + ", which a bind onto it would hide"
	}
	return ""
}

// MountsUnder says which of paths holds a mount point under it (not at
// it), "" when none does, from /proc/self/mountinfo; one that cannot be
// read counts as holding one.
func MountsUnder(paths []string) string {
	b, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		return "the mounts could not be read: " + err.Error()
	}
	return mountsUnder(string(b), paths)
}

// mountsUnder is MountsUnder of a mountinfo text: the first mount point
// under one of paths, with the first of paths it is under.
func mountsUnder(mountinfo string, paths []string) string {
	at := mountPointsUnder(mountinfo, paths)
	if len(at) == 0 {
		return ""
	}
	i := slices.IndexFunc(paths, func(p string) bool { return below(at[0], p) })
	return paths[i] + " holds another mount (" + at[0] + ")"
}

// mountPointsUnder is the mount points of a mountinfo text (its fifth
// field, escapes undone) that are below one of paths, in its order.
func mountPointsUnder(mountinfo string, paths []string) []string {
	var at []string
	for _, line := range strings.Split(mountinfo, "\n") {
		f := strings.Fields(line)
		if len(f) < 5 {
			continue
		}
		m := unescapeMount(f[4])
		if slices.ContainsFunc(paths, func(p string) bool { return below(m, p) }) {
			at = append(at, m)
		}
	}
	return at
}

// within reports whether p is dir or under it: the rule of
// manifest.Within (which this package cannot import), for the clean
// absolute paths SizeUnder takes.
func within(p, dir string) bool { return p == dir || below(p, dir) }

// below reports whether m is under p, not p itself (but every absolute
// path, "/" too, is below "/").
func below(m, p string) bool {
	return strings.HasPrefix(m, strings.TrimSuffix(p, "/")+"/")
}

// unescapeMount undoes mountinfo's octal escapes (\040 for a space).
func unescapeMount(s string) string {
	if !strings.Contains(s, "\\") {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] == '\\' && i+3 < len(s) {
			if n, err := strconv.ParseUint(s[i+1:i+4], 8, 8); err == nil {
				b.WriteByte(byte(n))
				i += 3
				continue
			}
		}
		b.WriteByte(s[i])
	}
	return b.String()
}

// run runs restic with args, stdout to out (nil: discarded). A run that
// fails is a *runError naming it by its leading words ("restic backup").
func (r Repo) run(ctx context.Context, out io.Writer, args ...string) error {
	return r.runIn(ctx, out, nil, args...)
}

// runIn is run with the paths confine names bound without links
// (confineScript); none: as run.
func (r Repo) runIn(ctx context.Context, out io.Writer, confine []string, args ...string) error {
	name := runName(args)
	bin, err := r.binary()
	if err != nil {
		return err
	}
	env, err := r.environ()
	if err != nil {
		return fmt.Errorf("restic %s: %w", name, err)
	}
	if r.CacheDir == "" {
		args = append([]string{"--no-cache"}, args...)
	}
	cmd := exec.CommandContext(ctx, bin, args...)
	if len(confine) > 0 {
		if msg := holdsMounts(confine); msg != "" {
			return newRunError(name, exitUnconfined, []byte(msg))
		}
		// The probe: a directory of the mesh's own, bound first, which
		// says whether binds without links can be made here at all.
		probe, err := os.MkdirTemp("", "mesh-confine-")
		if err != nil {
			return newRunError(name, exitUnconfined, []byte("a directory to try the binds on: "+err.Error()))
		}
		defer os.Remove(probe)
		// As the kernel finds it: the script binds paths as written, and
		// a temporary directory reached through a link (TMPDIR, /tmp on
		// another disk) would not be found where it was bound.
		if real, err := filepath.EvalSymlinks(probe); err == nil {
			probe = real
		}
		sh := append([]string{"-c", confineScript, "sh", probe}, confineArgs(confine)...)
		cmd = exec.CommandContext(ctx, "/bin/sh", append(append(sh, bin), args...)...)
		// Go makes the new namespace's mounts private before the exec.
		cmd.SysProcAttr = &syscall.SysProcAttr{Unshareflags: syscall.CLONE_NEWNS}
	}
	if cmd.SysProcAttr == nil {
		cmd.SysProcAttr = &syscall.SysProcAttr{}
	}
	// restic ends with the agent: one that outlived a kill -9 of it went
	// on writing a restore's copy while the agent, started again, removed
	// what the cut restore had left (the examples bed). SIGINT, as below.
	cmd.SysProcAttr.Pdeathsig = syscall.SIGINT
	cmd.Env = env
	cmd.Stdout = out
	stderr := &tailBuffer{max: stderrTail}
	cmd.Stderr = stderr
	// SIGINT lets restic remove its lock; a kill would leave it behind.
	cmd.Cancel = func() error { return cmd.Process.Signal(os.Interrupt) }
	cmd.WaitDelay = StopGrace
	err = cmd.Run()
	if err == nil {
		return nil
	}
	if len(confine) > 0 && ctx.Err() == nil && errors.Is(err, syscall.EPERM) {
		// No mount namespace for this process (unshare refused).
		return newRunError(name, exitUnconfined, []byte("a mount namespace of its own was refused: "+err.Error()))
	}
	if ctx.Err() != nil {
		return fmt.Errorf("restic %s: stopped: %w", name, context.Cause(ctx))
	}
	var exit *exec.ExitError
	if !errors.As(err, &exit) {
		return fmt.Errorf("restic %s: %w", name, err)
	}
	return newRunError(name, exit.ExitCode(), stderr.Bytes())
}

// runName is a run's leading words, for messages: "cat config",
// "restore 1a2b3c4d".
func runName(args []string) string {
	var words []string
	for _, a := range args {
		if strings.HasPrefix(a, "-") || len(words) == 2 {
			break
		}
		words = append(words, a)
	}
	return strings.Join(words, " ")
}

// binary is the restic to run, as an absolute path.
func (r Repo) binary() (string, error) {
	name := r.Binary
	if name == "" {
		name = "restic"
	}
	path, err := exec.LookPath(name)
	if err != nil {
		if r.Binary == "" {
			return "", ErrNotInstalled
		}
		return "", fmt.Errorf("%w: %s is no executable", ErrNotInstalled, r.Binary)
	}
	return filepath.Abs(path)
}

// owned are the variables the Repo's fields set; Env may not set them too.
var owned = []string{"RESTIC_REPOSITORY", "RESTIC_REPOSITORY_FILE", "RESTIC_PASSWORD", "RESTIC_PASSWORD_FILE", "RESTIC_PASSWORD_COMMAND", "RESTIC_CACHE_DIR"}

// environ is the child's whole environment: PATH, HOME and TMPDIR of the
// agent, the repository, password and cache, and Env. Nothing else of the
// agent's is passed, so no RESTIC_* of an operator's shell reaches it.
func (r Repo) environ() ([]string, error) {
	if r.URL == "" {
		return nil, errors.New("the repository URL is empty")
	}
	if len(r.Password) == 0 {
		return nil, errors.New("the repository password is empty (restic would ask for one on its terminal)")
	}
	if bytes.IndexByte(r.Password, 0) >= 0 || strings.IndexByte(r.URL, 0) >= 0 {
		return nil, errors.New("the repository URL or password holds a NUL byte")
	}
	path := os.Getenv("PATH")
	if path == "" {
		path = defaultPath
	}
	env := []string{"PATH=" + path}
	if home := os.Getenv("HOME"); home != "" {
		env = append(env, "HOME="+home)
	} else if r.CacheDir != "" {
		env = append(env, "HOME="+r.CacheDir)
	}
	if tmp := os.Getenv("TMPDIR"); tmp != "" {
		env = append(env, "TMPDIR="+tmp) // where restic stages packs before upload
	}
	env = append(env, "RESTIC_REPOSITORY="+r.URL, "RESTIC_PASSWORD="+string(r.Password))
	if r.CacheDir != "" {
		env = append(env, "RESTIC_CACHE_DIR="+r.CacheDir)
	}
	for _, kv := range r.Env {
		k, _, ok := strings.Cut(kv, "=")
		if !ok || k == "" || strings.IndexByte(kv, 0) >= 0 {
			return nil, fmt.Errorf("environment entry %q is not NAME=value", k)
		}
		for _, o := range owned {
			if k == o {
				return nil, fmt.Errorf("Env sets %s, which the Repo's URL, Password and CacheDir set (set those instead)", k)
			}
		}
		env = append(env, kv)
	}
	return env, nil
}

// runError is a restic run that exited non-zero.
type runError struct {
	name   string
	code   int
	stderr []string // its last lines, cleaned
	kind   error    // one of the Err values, or nil
}

func newRunError(name string, code int, stderr []byte) *runError {
	e := &runError{name: name, code: code, stderr: stderrLines(stderr)}
	all := strings.Join(e.stderr, "\n")
	switch {
	case strings.Contains(all, "wrong password or no key found"):
		e.kind = ErrWrongPassword
	case strings.Contains(all, "config file already exists"):
		e.kind = errExists
	case strings.Contains(all, "unable to open config file"), strings.Contains(all, "Is there a repository at the following location?"):
		e.kind = ErrNoRepository
	}
	return e
}

func (e *runError) Error() string {
	said := lastLines(e.stderr, 3)
	if said == "" {
		said = "exit status " + strconv.Itoa(e.code)
	}
	if e.kind != nil {
		return fmt.Sprintf("restic %s: %v; restic says: %s", e.name, e.kind, said)
	}
	return fmt.Sprintf("restic %s: %s", e.name, said)
}

func (e *runError) Unwrap() error { return e.kind }

// lastLines joins the last n lines, for a message.
func lastLines(lines []string, n int) string {
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "; ")
}

// csi is a terminal control sequence (restic clears its status line with one).
var csi = regexp.MustCompile("\x1b\\[[0-9;?]*[ -/]*[@-~]")

// stderrLines is restic's stderr as lines fit for a message: control
// sequences and characters gone, a JSON error line told in words, empty
// lines dropped.
func stderrLines(b []byte) []string {
	s := csi.ReplaceAllString(string(b), "")
	var lines []string
	for _, l := range strings.FieldsFunc(s, func(c rune) bool { return c == '\n' || c == '\r' }) {
		l = strings.TrimSpace(strings.Map(func(c rune) rune {
			if c < ' ' || c == 0x7f {
				return -1
			}
			return c
		}, l))
		if l == "" {
			continue
		}
		if msg, ok := jsonError(l); ok {
			l = msg
		}
		lines = append(lines, l)
	}
	return lines
}

// fileErrors are the lines about files that could not be read.
func fileErrors(lines []string) []string {
	var errs []string
	for _, l := range lines {
		if strings.HasPrefix(l, "Warning: at least one source file could not be read") {
			continue
		}
		errs = append(errs, l)
	}
	if len(errs) == 0 {
		return lines
	}
	return errs
}

// jsonError tells in words an error line of restic backup --json:
// {"message_type":"error","error":{"Op":"open","Path":"/x","Err":13},"item":"/x"}
// is "open /x: permission denied".
func jsonError(line string) (string, bool) {
	var m struct {
		MessageType string          `json:"message_type"`
		Error       json.RawMessage `json:"error"`
		During      string          `json:"during"`
		Item        string          `json:"item"`
	}
	if !strings.HasPrefix(line, "{") || json.Unmarshal([]byte(line), &m) != nil || m.MessageType != "error" {
		return "", false
	}
	var text string
	var pathErr struct {
		Op   string
		Path string
		Err  *int
	}
	switch {
	case json.Unmarshal(m.Error, &text) == nil && text != "":
	case json.Unmarshal(m.Error, &pathErr) == nil && pathErr.Op != "" && pathErr.Err != nil:
		text = fmt.Sprintf("%s %s: %v", pathErr.Op, pathErr.Path, syscall.Errno(*pathErr.Err))
	default:
		text = string(m.Error)
	}
	if m.Item != "" && !strings.Contains(text, m.Item) {
		text = m.Item + ": " + text
	}
	return text, true
}

// tailBuffer keeps the last max bytes written to it.
type tailBuffer struct {
	max  int
	buf  []byte
	lost bool // bytes before buf were dropped
}

func (t *tailBuffer) Write(p []byte) (int, error) {
	t.buf = append(t.buf, p...)
	if len(t.buf) > 2*t.max {
		t.buf = append(t.buf[:0], t.buf[len(t.buf)-t.max:]...)
		t.lost = true
	}
	return len(p), nil
}

// Bytes is the tail, from the first whole line when the start was dropped.
func (t *tailBuffer) Bytes() []byte {
	b := t.buf
	if len(b) > t.max {
		b, t.lost = b[len(b)-t.max:], true
	}
	if t.lost {
		if i := bytes.IndexByte(b, '\n'); i >= 0 {
			b = b[i+1:]
		}
	}
	return b
}

// boundedBuffer keeps up to max bytes and notes that more came; it keeps
// accepting, so restic is never blocked or broken on a full pipe.
type boundedBuffer struct {
	bytes.Buffer
	max  int
	over bool
}

func (b *boundedBuffer) Write(p []byte) (int, error) {
	if room := b.max - b.Len(); len(p) > room {
		b.over = true
		b.Buffer.Write(p[:max(room, 0)])
		return len(p), nil
	}
	return b.Buffer.Write(p)
}

// lineWriter calls line with each whole line written to it; a line longer
// than maxLine is dropped.
type lineWriter struct {
	line func([]byte)
	buf  []byte
	skip bool // inside a line too long to keep
}

func (w *lineWriter) Write(p []byte) (int, error) {
	n := len(p)
	for len(p) > 0 {
		i := bytes.IndexByte(p, '\n')
		if i < 0 {
			if !w.skip {
				w.buf = append(w.buf, p...)
				if len(w.buf) > maxLine {
					w.buf, w.skip = w.buf[:0], true
				}
			}
			break
		}
		if !w.skip && len(w.buf)+i <= maxLine {
			w.buf = append(w.buf, p[:i]...)
			w.line(w.buf)
		}
		w.buf, w.skip = w.buf[:0], false
		p = p[i+1:]
	}
	return n, nil
}

// flush hands over a last line that had no newline.
func (w *lineWriter) flush() {
	if len(w.buf) > 0 && !w.skip {
		w.line(w.buf)
	}
	w.buf, w.skip = w.buf[:0], false
}
