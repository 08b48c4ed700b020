// Package datacopy copies a module's data directories from one node to
// another as one byte stream: Send on the node that holds them, Receive on
// the node that takes them; the caller carries the stream (the peer API's
// mutual-TLS HTTP) and decides what to copy, where to stage it and when to
// swap it in. It owns the wire format and the digest that checks a copy.
//
// Two sides are not trusted. The data was written by a container that may
// be hostile: it can plant links to /etc/shadow, hard links, fifos, device
// nodes, sparse files of a terabyte and names that are not text. So Send
// walks by directory descriptor, never follows a symbolic link (the link is
// sent as a link), opens files O_NOFOLLOW|O_NONBLOCK and checks that what it
// opened is what it listed, reads only data extents, and skips device nodes
// and sockets (Summary.Skipped says so). The peer may be hostile or buggy:
// Receive writes only under the staging directories it creates, through
// descriptors of directories the same stream created (a symlink entry can
// never be traversed by a later one), bounds every length before reading
// it, and keeps nothing unless what it wrote, read back from disk, hashes to
// the sender's digest.
//
// # Digest
//
// Send, Receive and Digest compute it the same way, each from its own disk,
// so it does not depend on how a filesystem allocated a file: sha256 over
// the line "mesh datacopy digest 1\n" and then, for each root in order and
// each entry in lexical WalkDir order (the root itself as path ""), one line
//
//	ROOT QPATH dir|fifo MODE UID GID
//	ROOT QPATH file MODE UID GID SIZE CONTENT
//	ROOT QPATH symlink|hardlink MODE UID GID QTARGET
//
// with ROOT the root's index, QPATH and QTARGET strconv.Quote'd, MODE the
// permission and setuid/setgid/sticky bits in octal, and a hardlink's target
// the first path of the same inode seen in that root. CONTENT is the hex
// sha256, over each 64 KiB block (BlockSize) that overlaps a data extent and
// is not all zeros, of the block's index (8 bytes, big endian) and its
// bytes, then of SIZE (8 bytes, big endian). Mtimes are not in it; skipped
// entries are not in it.
//
// # Wire format, version 1
//
// The stream starts with the 16 bytes "mesh datacopy 1\n". Then frames: a
// 4-byte big-endian length (1 to MaxHeader) and that many bytes of a JSON
// header (type header below) in the exact form encoding/json writes it (a
// header in any other form is refused, so no two streams mean the same), the
// key "k" naming its kind; byte strings (paths, targets, roots) are base64,
// since names need not be UTF-8.
//
//	begin  {"k":"begin","roots":[...],"meta":N} then N raw bytes of meta
//	entry  {"k":"entry","r":ROOT,"p":PATH,"t":KIND,"m":MODE,"u":UID,"g":GID,"s":SIZE,"l":TARGET,"mt":MTIME_NS}
//	data   {"k":"data","o":OFFSET,"n":N} then N raw bytes of the file entry before it
//	skip   {"k":"skip","r":ROOT,"p":PATH,"t":"device"|"socket"|"other"}
//	abort  {"k":"abort","why":TEXT}: the sender failed; the stream ends
//	end    {"k":"end","digest":HEX,"headers":HEX}, then the stream's end
//
// Zero values are left out (omitempty). Entries come in walk order; each
// root starts with its entry "" (a dir). A file's data frames follow it,
// in increasing offset, not overlapping, within its size, at most 1 MiB
// each; the gaps are holes (Send leaves out all-zero blocks, so a hole
// may be wider on the receiver than on the sender). A hardlink entry
// carries only its path and its target. The trailer's digest is the
// sender's (above); headers is the hex sha256 of every byte before the
// trailer frame but the data frames' file bytes (those are checked by the
// digest), so a damaged mtime or meta is noticed too.
package datacopy

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"hash"
	"io"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"sort"
	"strconv"
	"strings"
	"unicode"
	"unicode/utf8"

	"golang.org/x/sys/unix"

	"mesh/internal/safefs"
)

// Bounds on a stream; one over any of them is refused.
const (
	MaxMeta    = 1 << 20    // the caller's meta blob, in bytes
	MaxEntries = 10_000_000 // entries (skipped ones too) over all roots
	MaxPath    = 4096       // a path inside a root, or a link's target, in bytes
	MaxHeader  = 64 << 10   // one frame's JSON header, in bytes
	MaxRoots   = 256        // roots in one stream
	BlockSize  = 64 << 10   // the digest's block, and the smallest hole a copy keeps
)

const (
	magic      = "mesh datacopy 1\n"
	digestHead = "mesh datacopy digest 1\n"
	maxChunk   = 1 << 20 // file bytes in one data frame; a multiple of BlockSize
	maxName    = 255     // one path component (NAME_MAX)
	maxSize    = 1 << 60 // a file's size
	maxSkipped = 1000    // Summary.Skipped lines kept; the rest are counted
	maxWhy     = 1000    // bytes of an abort's reason
)

// Errors a caller branches on, wrapped in a sentence saying what was wrong.
var (
	// ErrRefused: the stream breaks the format's rules (a buggy or hostile
	// sender); sending the same again will not help.
	ErrRefused = errors.New("stream refused")
	// ErrTruncated: the stream ended before its trailer (the connection
	// dropped, or the sender stopped); a retry may succeed.
	ErrTruncated = errors.New("the stream ended before its trailer")
	// ErrMismatch: what was written does not hash to the sender's digest
	// (damaged on the way); a retry may succeed.
	ErrMismatch = errors.New("the copy does not match the sender's digest")
	// ErrAborted: the sender failed while sending and said why.
	ErrAborted = errors.New("the sender failed")
)

// Summary is what a copy moved.
type Summary struct {
	Digest                                  string   // sha256 hex of the canonical listing (package doc)
	Dirs, Files, Symlinks, HardLinks, Fifos int      // entries of each kind, roots counted as dirs
	Bytes                                   int64    // file data bytes carried (holes and all-zero blocks not counted)
	Skipped                                 []string // what was not copied and why, e.g. "/d/dev0: a device node (not copied)"
}

// Entry kinds, as in the digest and on the wire.
const (
	kindDir      = "dir"
	kindFile     = "file"
	kindSymlink  = "symlink"
	kindHardlink = "hardlink"
	kindFifo     = "fifo"
)

// Frame kinds.
const (
	frameBegin = "begin"
	frameEntry = "entry"
	frameData  = "data"
	frameSkip  = "skip"
	frameAbort = "abort"
	frameEnd   = "end"
)

// skipWhat is what Summary.Skipped says of each kind a copy leaves out;
// "" for a kind the format does not have.
func skipWhat(kind string) string {
	switch kind {
	case "device":
		return "a device node"
	case "socket":
		return "a socket"
	case "other":
		return "a file of an unknown type"
	}
	return ""
}

// header is every frame's JSON; each kind uses some of the fields (package
// doc) and a stream setting another is refused.
type header struct {
	K       string   `json:"k"`
	Roots   [][]byte `json:"roots,omitempty"`
	Meta    int      `json:"meta,omitempty"`
	R       int      `json:"r,omitempty"`
	P       []byte   `json:"p,omitempty"`
	T       string   `json:"t,omitempty"`
	M       uint32   `json:"m,omitempty"`
	U       uint32   `json:"u,omitempty"`
	G       uint32   `json:"g,omitempty"`
	S       int64    `json:"s,omitempty"`
	L       []byte   `json:"l,omitempty"`
	MT      int64    `json:"mt,omitempty"`
	O       int64    `json:"o,omitempty"`
	N       int      `json:"n,omitempty"`
	Digest  string   `json:"digest,omitempty"`
	Headers string   `json:"headers,omitempty"`
	Why     string   `json:"why,omitempty"`
}

// stray says whether h sets a field its kind does not use: keep clears
// those it does.
func stray(h header, keep func(*header)) bool {
	keep(&h)
	h.K = ""
	return !reflect.DeepEqual(h, header{})
}

// Send writes roots (absolute directories, each the root of one data
// directory) to w, with meta (an opaque blob, at most MaxMeta bytes, given
// back by Receive: the caller's step markers). It never follows a symlink,
// sends a file's data extents only (SEEK_DATA/SEEK_HOLE, falling back to the
// whole file) less its all-zero blocks, hard links within one root as links
// to the first path seen, and ends with a trailer carrying the digest of
// what it read. It does not close w. ctx cancels it: Send then returns at
// once, and a Write blocked in w is the last one (it ends when w does).
func Send(ctx context.Context, w io.Writer, roots []string, meta []byte) (Summary, error) {
	return send(ctx, w, roots, roots, meta)
}

// send is Send with the roots named in the stream apart from where they are
// read (a test's streams name fixed roots).
func send(ctx context.Context, w io.Writer, roots, names []string, meta []byte) (Summary, error) {
	if err := checkRoots(roots); err != nil {
		return Summary{}, err
	}
	if len(meta) > MaxMeta {
		return Summary{}, fmt.Errorf("meta of %d bytes is over the %d a stream carries", len(meta), MaxMeta)
	}
	out := newAsyncWriter(ctx, w)
	sw := &streamWriter{out: out, hh: sha256.New()}
	wk := newWalker(ctx, names, sw)
	err := sw.stream(wk, roots, names, meta)
	if err != nil {
		if ctx.Err() != nil {
			out.abandon()
			return wk.sum, ctx.Err()
		}
		if !out.failed() {
			// Best effort: the receiver says why rather than "truncated".
			if sw.frame(&header{K: frameAbort, Why: why(err)}) == nil {
				out.close()
			}
		}
		out.abandon()
		return wk.sum, err
	}
	if err := out.close(); err != nil {
		return wk.sum, err
	}
	return wk.sum, nil
}

// why is err's text as an abort frame carries it: valid UTF-8 (JSON would
// change it otherwise) and bounded.
func why(err error) string {
	s := strings.ToValidUTF8(err.Error(), "\uFFFD")
	if len(s) > maxWhy {
		s = s[:maxWhy]
		for !utf8.ValidString(s) {
			s = s[:len(s)-1]
		}
	}
	return s
}

// Digest walks roots as Send does and returns the digest (and summary) of
// what they hold now: the same value Send and Receive compute.
func Digest(ctx context.Context, roots []string) (Summary, error) {
	if err := checkRoots(roots); err != nil {
		return Summary{}, err
	}
	wk := newWalker(ctx, roots, nil)
	for i, root := range roots {
		if err := wk.root(i, root); err != nil {
			return wk.sum, err
		}
	}
	return wk.finish(), nil
}

// checkRoots: roots are clean absolute paths, each named once.
func checkRoots(roots []string) error {
	if len(roots) > MaxRoots {
		return fmt.Errorf("%d roots are over the %d a stream carries", len(roots), MaxRoots)
	}
	for i, r := range roots {
		if err := checkAbs(r); err != nil {
			return fmt.Errorf("root %s: %w", show(r), err)
		}
		if slices.Contains(roots[:i], r) {
			return fmt.Errorf("root %s is named twice", show(r))
		}
	}
	return nil
}

// checkAbs: p is a clean absolute path other than "/".
func checkAbs(p string) error {
	switch {
	case !filepath.IsAbs(p):
		return errors.New("not an absolute path")
	case filepath.Clean(p) != p:
		return errors.New("not a clean path")
	case p == "/":
		return errors.New("the whole filesystem is not a data directory")
	case len(p) > MaxPath:
		return fmt.Errorf("longer than %d bytes", MaxPath)
	case strings.IndexByte(p, 0) >= 0:
		return errors.New("holds a NUL byte")
	}
	return nil
}

// checkPath: p is a path inside a root as a stream may name it: relative,
// clean, no "..", no empty component, bounded.
func checkPath(p string) error {
	if p == "" {
		return errors.New("an empty path (only a root's own entry has it)")
	}
	if len(p) > MaxPath {
		return fmt.Errorf("a path of %d bytes (at most %d)", len(p), MaxPath)
	}
	if p[0] == '/' {
		return fmt.Errorf("%s is absolute", show(p))
	}
	for c := range strings.SplitSeq(p, "/") {
		switch {
		case c == "":
			return fmt.Errorf("%s has an empty component", show(p))
		case c == "." || c == "..":
			return fmt.Errorf("%s has a %q component", show(p), c)
		case len(c) > maxName:
			return fmt.Errorf("%s has a component over %d bytes", show(p), maxName)
		case strings.IndexByte(c, 0) >= 0:
			return fmt.Errorf("%s holds a NUL byte", show(p))
		}
	}
	return nil
}

// splitPath splits a checked path into its parent ("" for the root) and
// last component.
func splitPath(p string) (string, string) {
	if i := strings.LastIndexByte(p, '/'); i >= 0 {
		return p[:i], p[i+1:]
	}
	return "", p
}

// show is a path as a message prints it: as is if it is printable text,
// quoted otherwise (a name may hold a newline or invalid UTF-8).
func show(s string) string {
	if utf8.ValidString(s) && strings.IndexFunc(s, func(r rune) bool { return !unicode.IsPrint(r) }) < 0 {
		return s
	}
	return strconv.Quote(s)
}

// skipLine is a Summary.Skipped line, the same on both sides.
func skipLine(root, path, kind string) string {
	return fmt.Sprintf("%s: %s (not copied)", show(filepath.Join(root, path)), skipWhat(kind))
}

// skipList keeps Summary.Skipped bounded: a container can make millions
// of sockets.
type skipList struct {
	lines []string
	more  int
}

func (l *skipList) add(line string) {
	if len(l.lines) < maxSkipped {
		l.lines = append(l.lines, line)
	} else {
		l.more++
	}
}

func (l *skipList) list() []string {
	if l.more > 0 {
		return append(slices.Clip(l.lines), fmt.Sprintf("and %d more device nodes, sockets or unknown files (not copied)", l.more))
	}
	return l.lines
}

// --- the walk: one for Send, Digest and Receive's check ---

// entry is one thing a walk found.
type entry struct {
	root     int
	path     string
	kind     string
	mode     uint32 // permission, setuid, setgid, sticky
	uid, gid uint32
	size     int64
	link     string // a symlink's target, a hardlink's first path
	mtime    int64  // ns since the epoch
}

// emitter is what Send does with what the walk reads; nil for a digest only.
type emitter interface {
	entry(e *entry) error
	data(off int64, b []byte) error
	skip(root int, path, kind string) error
}

type inode struct{ dev, ino uint64 }

// seen is the first path of an inode with other links, and how many of
// them are still to come (so the map forgets completed pairs).
type seen struct {
	first string
	left  uint64
}

// zeros is a block of zeros to compare with; never written.
var zeros [BlockSize]byte

type walker struct {
	ctx     context.Context
	names   []string // roots as messages name them
	emit    emitter
	digest  hash.Hash
	content hash.Hash
	sum     Summary
	skipped skipList
	entries int
	links   map[inode]*seen // the current root's
	buf     []byte
	line    []byte
}

func newWalker(ctx context.Context, names []string, emit emitter) *walker {
	w := &walker{ctx: ctx, names: names, emit: emit, digest: sha256.New(), content: sha256.New(), buf: make([]byte, maxChunk)}
	w.digest.Write([]byte(digestHead))
	return w
}

// finish returns the summary with its digest.
func (w *walker) finish() Summary {
	w.sum.Digest = hex.EncodeToString(w.digest.Sum(nil))
	w.sum.Skipped = w.skipped.list()
	return w.sum
}

func (w *walker) show(root int, p string) string { return show(filepath.Join(w.names[root], p)) }

// count bounds the entries a walk takes, as a receiver would.
func (w *walker) count() error {
	if err := w.ctx.Err(); err != nil {
		return err
	}
	w.entries++
	if w.entries > MaxEntries {
		return fmt.Errorf("the data directories hold more than %d entries, more than a copy carries", MaxEntries)
	}
	return nil
}

// root walks one root, opened with no link at any component of its path.
func (w *walker) root(i int, root string) error {
	fd, err := safefs.OpenDir(root)
	if err != nil {
		return fmt.Errorf("open data directory: %w", err)
	}
	f := os.NewFile(uintptr(fd), root)
	defer f.Close()
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		return fmt.Errorf("stat %s: %w", show(root), err)
	}
	if err := w.count(); err != nil {
		return err
	}
	w.links = make(map[inode]*seen)
	e := stEntry(i, "", kindDir, &st)
	if err := w.put(&e); err != nil {
		return err
	}
	return w.dir(i, f, fd, "")
}

func stEntry(root int, p, kind string, st *unix.Stat_t) entry {
	return entry{root: root, path: p, kind: kind, mode: st.Mode & 0o7777, uid: st.Uid, gid: st.Gid, mtime: st.Mtim.Nano()}
}

// dir walks the directory open as f (descriptor dfd) at rel, in lexical
// order, descending as it goes (WalkDir's order).
func (w *walker) dir(root int, f *os.File, dfd int, rel string) error {
	names, err := f.Readdirnames(-1)
	if err != nil {
		return fmt.Errorf("read directory %s: %w", w.show(root, rel), err)
	}
	sort.Strings(names)
	for _, name := range names {
		p := name
		if rel != "" {
			p = rel + "/" + name
		}
		if err := w.count(); err != nil {
			return err
		}
		if len(p) > MaxPath {
			return fmt.Errorf("%s: a path over %d bytes, which a copy cannot carry (shorten it)", w.show(root, p), MaxPath)
		}
		var st unix.Stat_t
		if err := unix.Fstatat(dfd, name, &st, unix.AT_SYMLINK_NOFOLLOW); err != nil {
			return fmt.Errorf("stat %s: %w", w.show(root, p), err)
		}
		switch st.Mode & unix.S_IFMT {
		case unix.S_IFDIR:
			err = w.subdir(root, dfd, name, p, &st)
		case unix.S_IFREG:
			if e, ok := w.linked(root, p, &st); ok {
				err = w.put(&e)
			} else {
				err = w.file(root, dfd, name, p, &st)
			}
		case unix.S_IFLNK:
			e, ok := w.linked(root, p, &st)
			if !ok {
				e = stEntry(root, p, kindSymlink, &st)
				e.link, err = w.readlink(dfd, name)
				if err != nil {
					return fmt.Errorf("read link %s: %w", w.show(root, p), err)
				}
			}
			err = w.put(&e)
		case unix.S_IFIFO:
			e, ok := w.linked(root, p, &st)
			if !ok {
				e = stEntry(root, p, kindFifo, &st)
			}
			err = w.put(&e)
		case unix.S_IFCHR, unix.S_IFBLK:
			err = w.skip(root, p, "device")
		case unix.S_IFSOCK:
			err = w.skip(root, p, "socket")
		default:
			err = w.skip(root, p, "other")
		}
		if err != nil {
			return err
		}
	}
	return nil
}

func (w *walker) readlink(dfd int, name string) (string, error) {
	b := w.buf[:MaxPath+1]
	n, err := unix.Readlinkat(dfd, name, b)
	if err != nil {
		return "", err
	}
	if n > MaxPath {
		return "", fmt.Errorf("a target over %d bytes", MaxPath)
	}
	return string(b[:n]), nil
}

func (w *walker) skip(root int, p, kind string) error {
	w.skipped.add(skipLine(w.names[root], p, kind))
	if w.emit != nil {
		return w.emit.skip(root, p, kind)
	}
	return nil
}

// linked returns a hardlink entry if st's inode was seen before in this
// root, and remembers it otherwise.
func (w *walker) linked(root int, p string, st *unix.Stat_t) (entry, bool) {
	if st.Nlink < 2 {
		return entry{}, false
	}
	k := inode{uint64(st.Dev), st.Ino}
	if s, ok := w.links[k]; ok {
		e := stEntry(root, p, kindHardlink, st)
		e.link = s.first
		if s.left--; s.left == 0 {
			delete(w.links, k)
		}
		return e, true
	}
	w.links[k] = &seen{first: p, left: uint64(st.Nlink) - 1}
	return entry{}, false
}

// openAt opens name in dfd never following a link, without updating its
// atime where this process may ask that.
func openAt(dfd int, name string, flags int) (int, error) {
	flags |= unix.O_RDONLY | unix.O_NOFOLLOW | unix.O_CLOEXEC | unix.O_NOCTTY
	fd, err := unix.Openat(dfd, name, flags|unix.O_NOATIME, 0)
	if errors.Is(err, unix.EPERM) {
		fd, err = unix.Openat(dfd, name, flags, 0)
	}
	return fd, err
}

// same says whether the descriptor opened is the entry listed (not swapped
// meanwhile).
func same(fd int, st *unix.Stat_t, kind uint32) (unix.Stat_t, error) {
	var fst unix.Stat_t
	if err := unix.Fstat(fd, &fst); err != nil {
		return fst, err
	}
	if fst.Mode&unix.S_IFMT != kind || fst.Ino != st.Ino || fst.Dev != st.Dev {
		return fst, errors.New("it changed while being read (is the module stopped?)")
	}
	return fst, nil
}

func (w *walker) subdir(root, dfd int, name, p string, st *unix.Stat_t) error {
	fd, err := openAt(dfd, name, unix.O_DIRECTORY)
	if err != nil {
		return fmt.Errorf("open directory %s: %w", w.show(root, p), err)
	}
	f := os.NewFile(uintptr(fd), name)
	defer f.Close()
	fst, err := same(fd, st, unix.S_IFDIR)
	if err != nil {
		return fmt.Errorf("directory %s: %w", w.show(root, p), err)
	}
	e := stEntry(root, p, kindDir, &fst)
	if err := w.put(&e); err != nil {
		return err
	}
	return w.dir(root, f, fd, p)
}

// put sends an entry that has no content and adds its line.
func (w *walker) put(e *entry) error {
	if w.emit != nil {
		if err := w.emit.entry(e); err != nil {
			return err
		}
	}
	w.record(e, nil)
	return nil
}

// record adds e's line to the digest and counts it.
func (w *walker) record(e *entry, content []byte) {
	b := w.line[:0]
	b = strconv.AppendInt(b, int64(e.root), 10)
	b = append(b, ' ')
	b = strconv.AppendQuote(b, e.path)
	b = append(b, ' ')
	b = append(b, e.kind...)
	b = append(b, ' ')
	b = strconv.AppendUint(b, uint64(e.mode), 8)
	b = append(b, ' ')
	b = strconv.AppendUint(b, uint64(e.uid), 10)
	b = append(b, ' ')
	b = strconv.AppendUint(b, uint64(e.gid), 10)
	switch e.kind {
	case kindFile:
		b = append(b, ' ')
		b = strconv.AppendInt(b, e.size, 10)
		b = append(b, ' ')
		b = hex.AppendEncode(b, content)
	case kindSymlink, kindHardlink:
		b = append(b, ' ')
		b = strconv.AppendQuote(b, e.link)
	}
	b = append(b, '\n')
	w.digest.Write(b)
	w.line = b
	switch e.kind {
	case kindDir:
		w.sum.Dirs++
	case kindFile:
		w.sum.Files++
	case kindSymlink:
		w.sum.Symlinks++
	case kindHardlink:
		w.sum.HardLinks++
	case kindFifo:
		w.sum.Fifos++
	}
}

// file reads a regular file's data extents, hashing and sending the blocks
// that are not all zeros.
func (w *walker) file(root, dfd int, name, p string, st *unix.Stat_t) error {
	// O_NONBLOCK: a fifo swapped in after the stat does not hang the walk.
	fd, err := openAt(dfd, name, unix.O_NONBLOCK)
	if err != nil {
		return fmt.Errorf("open %s: %w", w.show(root, p), err)
	}
	f := os.NewFile(uintptr(fd), name)
	defer f.Close()
	fst, err := same(fd, st, unix.S_IFREG)
	if err != nil {
		return fmt.Errorf("%s: %w", w.show(root, p), err)
	}
	e := stEntry(root, p, kindFile, &fst)
	e.size = fst.Size
	if w.emit != nil {
		if err := w.emit.entry(&e); err != nil {
			return err
		}
	}
	w.content.Reset()
	size := e.size
	var next int64 // the first byte no block has covered yet
	for off := int64(0); off < size; {
		d, err := unix.Seek(fd, off, unix.SEEK_DATA)
		if errors.Is(err, unix.ENXIO) {
			break // only a hole is left
		}
		h := size
		if err != nil {
			d = off // no SEEK_DATA here: the rest is data
		} else if hh, err := unix.Seek(fd, d, unix.SEEK_HOLE); err == nil && hh > d {
			h = min(hh, size)
		}
		if d >= size {
			break
		}
		start := max(d&^(BlockSize-1), next)
		end := min((h+BlockSize-1)&^(BlockSize-1), size)
		if start < end {
			if err := w.blocks(f, start, end); err != nil {
				return fmt.Errorf("read %s: %w", w.show(root, p), err)
			}
			next = end
		}
		off = h
	}
	var sb [8]byte
	binary.BigEndian.PutUint64(sb[:], uint64(size))
	w.content.Write(sb[:])
	w.record(&e, w.content.Sum(nil))
	return nil
}

// blocks reads [start, end) (block aligned but for the end of the file) a
// chunk at a time, and hashes and sends its blocks that are not all zeros,
// each run of them as one data frame.
func (w *walker) blocks(f *os.File, start, end int64) error {
	var ib [8]byte
	for pos := start; pos < end; {
		if err := w.ctx.Err(); err != nil {
			return err
		}
		b := w.buf[:min(int64(len(w.buf)), end-pos)]
		if _, err := f.ReadAt(b, pos); err != nil {
			if errors.Is(err, io.EOF) {
				return errors.New("it shrank while being read (is the module stopped?)")
			}
			return err
		}
		run := -1 // where the current run of non-zero blocks starts in b
		for i := 0; i < len(b); i += BlockSize {
			blk := b[i:min(i+BlockSize, len(b))]
			if bytes.Equal(blk, zeros[:len(blk)]) {
				if run >= 0 {
					if err := w.send(pos+int64(run), b[run:i]); err != nil {
						return err
					}
					run = -1
				}
				continue
			}
			binary.BigEndian.PutUint64(ib[:], uint64((pos+int64(i))/BlockSize))
			w.content.Write(ib[:])
			w.content.Write(blk)
			w.sum.Bytes += int64(len(blk))
			if run < 0 {
				run = i
			}
		}
		if run >= 0 {
			if err := w.send(pos+int64(run), b[run:]); err != nil {
				return err
			}
		}
		pos += int64(len(b))
	}
	return nil
}

func (w *walker) send(off int64, b []byte) error {
	if w.emit == nil {
		return nil
	}
	return w.emit.data(off, b)
}

// --- Send's side of the wire ---

// streamWriter writes frames and keeps the headers hash.
type streamWriter struct {
	out *asyncWriter
	hh  hash.Hash
}

// stream writes the whole stream but for its ending.
func (s *streamWriter) stream(wk *walker, roots, names []string, meta []byte) error {
	s.hh.Write([]byte(magic))
	if err := s.out.write([]byte(magic)); err != nil {
		return err
	}
	begin := header{K: frameBegin, Meta: len(meta)}
	for _, n := range names {
		begin.Roots = append(begin.Roots, []byte(n))
	}
	if err := s.frame(&begin); err != nil {
		return err
	}
	s.hh.Write(meta)
	if err := s.out.write(meta); err != nil {
		return err
	}
	for i, root := range roots {
		if err := wk.root(i, root); err != nil {
			return err
		}
	}
	sum := wk.finish()
	// The trailer is not in the headers hash: it carries it.
	return s.frame(&header{K: frameEnd, Digest: sum.Digest, Headers: hex.EncodeToString(s.hh.Sum(nil))})
}

func (s *streamWriter) frame(h *header) error {
	js, err := json.Marshal(h)
	if err != nil {
		return fmt.Errorf("encode a %s frame: %w", h.K, err)
	}
	if len(js) > MaxHeader {
		return fmt.Errorf("a %s frame of %d bytes is over the %d the format allows", h.K, len(js), MaxHeader)
	}
	var lb [4]byte
	binary.BigEndian.PutUint32(lb[:], uint32(len(js)))
	if h.K != frameEnd {
		s.hh.Write(lb[:])
		s.hh.Write(js)
	}
	if err := s.out.write(lb[:]); err != nil {
		return err
	}
	return s.out.write(js)
}

func (s *streamWriter) entry(e *entry) error {
	h := header{K: frameEntry, R: e.root, P: []byte(e.path), T: e.kind}
	if e.kind == kindHardlink {
		h.L = []byte(e.link) // the inode's attributes came with its first path
		return s.frame(&h)
	}
	h.M, h.U, h.G, h.MT = e.mode, e.uid, e.gid, e.mtime
	switch e.kind {
	case kindFile:
		h.S = e.size
	case kindSymlink:
		h.L = []byte(e.link)
	}
	return s.frame(&h)
}

func (s *streamWriter) data(off int64, b []byte) error {
	if err := s.frame(&header{K: frameData, O: off, N: len(b)}); err != nil {
		return err
	}
	return s.out.write(b)
}

func (s *streamWriter) skip(root int, p, kind string) error {
	return s.frame(&header{K: frameSkip, R: root, P: []byte(p), T: kind})
}

// asyncWriter writes to w from its own goroutine, so that reading the disk
// and writing the network overlap and a cancelled ctx ends Send even while
// a Write is blocked.
type asyncWriter struct {
	ctx    context.Context
	w      io.Writer
	full   chan []byte
	free   chan []byte
	done   chan struct{}
	err    error // the goroutine's, read after done
	buf    []byte
	closed bool
}

const writeBuffers, writeBufSize = 3, 1 << 20

func newAsyncWriter(ctx context.Context, w io.Writer) *asyncWriter {
	a := &asyncWriter{ctx: ctx, w: w, full: make(chan []byte, writeBuffers), free: make(chan []byte, writeBuffers), done: make(chan struct{})}
	for range writeBuffers {
		a.free <- make([]byte, 0, writeBufSize)
	}
	go a.run()
	return a
}

func (a *asyncWriter) run() {
	defer close(a.done)
	for b := range a.full {
		if _, err := a.w.Write(b); err != nil {
			a.err = fmt.Errorf("write the stream: %w", err)
			return
		}
		a.free <- b[:0]
	}
}

func (a *asyncWriter) write(p []byte) error {
	for len(p) > 0 {
		if a.buf == nil {
			select {
			case a.buf = <-a.free:
			case <-a.done:
				return a.err
			case <-a.ctx.Done():
				return a.ctx.Err()
			}
		}
		n := copy(a.buf[len(a.buf):cap(a.buf)], p)
		a.buf, p = a.buf[:len(a.buf)+n], p[n:]
		if len(a.buf) == cap(a.buf) {
			if err := a.flush(); err != nil {
				return err
			}
		}
	}
	return nil
}

func (a *asyncWriter) flush() error {
	if len(a.buf) == 0 {
		return nil
	}
	select {
	case a.full <- a.buf:
		a.buf = nil
		return nil
	case <-a.done:
		return a.err
	case <-a.ctx.Done():
		return a.ctx.Err()
	}
}

// failed says whether a Write to w failed.
func (a *asyncWriter) failed() bool {
	select {
	case <-a.done:
		return a.err != nil
	default:
		return false
	}
}

// close writes what is buffered and waits for the writes to end.
func (a *asyncWriter) close() error {
	err := a.flush()
	a.abandon()
	if err != nil {
		return err
	}
	select {
	case <-a.done:
		return a.err
	case <-a.ctx.Done():
		return a.ctx.Err()
	}
}

// abandon lets the goroutine end after the Write it is in, if any.
func (a *asyncWriter) abandon() {
	if !a.closed {
		a.closed = true
		close(a.full)
	}
}

// --- Receive ---

// limits are Receive's bounds that a test lowers.
type limits struct {
	entries int
}

// Receive reads a stream from r, to its end. want lists the roots the
// caller accepts, in order: a stream naming other roots is refused before
// anything is written. Root i is written into stage(want[i]), an absolute
// path that must not exist and whose parent must (Receive creates it, mode
// 0700 until the end). It restores types, modes (setuid, setgid and sticky
// too), owners (also of links), mtimes (of directories last, deepest
// first), symlinks as links, hard links, fifos and holes, writing only
// through directories this stream created. Then it walks what it wrote as
// Send walks (reading files back from disk), compares the digest with the
// sender's trailer and syncs the filesystems. A mismatch, a truncated
// stream or any error removes every staging directory it made and returns
// an error saying what was wrong (wrapping ErrRefused, ErrTruncated,
// ErrMismatch or ErrAborted when the stream is at fault). It returns meta
// and the summary of what it wrote; Skipped is what the sender left out.
// ctx cancels it: Receive returns at once and a Read blocked in r is the
// last one (it ends when r does).
func Receive(ctx context.Context, r io.Reader, want []string, stage func(root string) string) (meta []byte, s Summary, err error) {
	return receive(ctx, r, want, stage, limits{entries: MaxEntries})
}

func receive(ctx context.Context, r io.Reader, want []string, stage func(string) string, lim limits) ([]byte, Summary, error) {
	if err := checkRoots(want); err != nil {
		return nil, Summary{}, err
	}
	in := newAsyncReader(ctx, r)
	defer in.stop()
	rc := &receiver{ctx: ctx, in: in, hh: sha256.New(), want: want, stage: stage, lim: lim, cur: -1}
	meta, s, err := rc.run()
	rc.closeAll()
	if err != nil {
		for _, sd := range rc.roots {
			if rerr := os.RemoveAll(sd.path); rerr != nil {
				err = fmt.Errorf("%w (and removing the staging directory failed: %v)", err, rerr)
			}
		}
		return nil, Summary{}, err
	}
	return meta, s, nil
}

func refused(format string, args ...any) error {
	return fmt.Errorf("%w: "+format, append([]any{ErrRefused}, args...)...)
}

// stageDir is one root's staging directory.
type stageDir struct {
	path   string
	parent int // its parent's descriptor, for its mtime
	base   string
	fd     int
	// From the root's entry, set at the end.
	mode  uint32
	mtime int64
}

// dirState is a directory of the current root still open for entries.
type dirState struct {
	path  string
	fd    int
	mode  uint32
	mtime int64
}

// fileState is the file whose data frames come next.
type fileState struct {
	path      string
	f         *os.File
	fd        int // f's, for fchown and fchmod
	parent    int
	name      string
	size, end int64
	mode      uint32
	uid, gid  uint32
	mtime     int64
}

type receiver struct {
	ctx   context.Context
	in    *asyncReader
	hh    hash.Hash
	want  []string
	stage func(string) string
	lim   limits

	roots   []*stageDir // made so far; removed on failure
	cur     int         // the root being received; -1 before the first
	stack   []*dirState // the current root's open directories, its root first
	file    *fileState
	entries int
	skipped skipList
	buf     []byte // file data, grown to the largest frame (at most maxChunk)
	hdr     []byte // a frame's header, grown likewise (at most MaxHeader)
}

// grow returns b with room for n bytes, reusing it when it has.
func grow(b []byte, n int) []byte {
	if cap(b) < n {
		b = make([]byte, n, max(n, 2*cap(b)))
	}
	return b[:n]
}

func (r *receiver) run() ([]byte, Summary, error) {
	meta, err := r.begin()
	if err != nil {
		return nil, Summary{}, err
	}
	for {
		if err := r.ctx.Err(); err != nil {
			return nil, Summary{}, err
		}
		h, err := r.frame()
		if err != nil {
			return nil, Summary{}, err
		}
		if h.K != frameData && r.file != nil {
			if err := r.endFile(); err != nil {
				return nil, Summary{}, err
			}
		}
		switch h.K {
		case frameEntry:
			err = r.entry(h)
		case frameData:
			err = r.data(h)
		case frameSkip:
			err = r.skip(h)
		case frameAbort:
			if stray(*h, func(h *header) { h.Why = "" }) {
				return nil, Summary{}, refused("an abort frame with fields it does not use")
			}
			return nil, Summary{}, fmt.Errorf("%w: %s", ErrAborted, show(h.Why))
		case frameEnd:
			s, err := r.end(h)
			return meta, s, err
		default:
			err = refused("a frame of unknown kind %s", show(h.K))
		}
		if err != nil {
			return nil, Summary{}, err
		}
	}
}

func (r *receiver) readErr(err error) error {
	if errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) {
		return fmt.Errorf("%w (the connection dropped, or the sender stopped)", ErrTruncated)
	}
	if r.ctx.Err() != nil {
		return r.ctx.Err()
	}
	return fmt.Errorf("read the stream: %w", err)
}

func (r *receiver) read(b []byte) error {
	if _, err := io.ReadFull(r.in, b); err != nil {
		return r.readErr(err)
	}
	return nil
}

// frame reads one frame's header, bounded before it is read, and adds it
// to the headers hash but for the trailer.
func (r *receiver) frame() (*header, error) {
	var lb [4]byte
	if err := r.read(lb[:]); err != nil {
		return nil, err
	}
	n := binary.BigEndian.Uint32(lb[:])
	if n == 0 || n > MaxHeader {
		return nil, refused("a frame header of %d bytes (the format allows 1 to %d)", n, MaxHeader)
	}
	r.hdr = grow(r.hdr, int(n))
	raw := r.hdr
	if err := r.read(raw); err != nil {
		return nil, err
	}
	var h header
	if err := json.Unmarshal(raw, &h); err != nil {
		return nil, refused("a frame header that is not the format's JSON: %v", err)
	}
	// One meaning, one form: a header is what a sender's json.Marshal
	// writes, so case-folded keys, duplicates or stray fields never pass.
	if canon, err := json.Marshal(&h); err != nil || !bytes.Equal(canon, raw) {
		return nil, refused("a frame header not in the form a sender writes: %s", show(string(raw[:min(len(raw), 200)])))
	}
	if h.K != frameEnd {
		r.hh.Write(lb[:])
		r.hh.Write(raw)
	}
	return &h, nil
}

// begin checks the stream's start and roots, reads meta and only then
// makes the staging directories.
func (r *receiver) begin() ([]byte, error) {
	m := make([]byte, len(magic))
	if err := r.read(m); err != nil {
		return nil, err
	}
	if string(m) != magic {
		if bytes.HasPrefix(m, []byte(magic[:len(magic)-2])) {
			return nil, refused("a datacopy stream of format %s; this node reads %s (upgrade the older node)", show(string(m[len(magic)-2:])), show(magic[len(magic)-2:]))
		}
		return nil, refused("not a datacopy stream (it starts %s)", show(string(m)))
	}
	r.hh.Write(m)
	h, err := r.frame()
	if err != nil {
		return nil, err
	}
	if h.K != frameBegin || stray(*h, func(h *header) { h.Roots, h.Meta = nil, 0 }) {
		return nil, refused("the first frame is not a begin frame")
	}
	got := make([]string, len(h.Roots))
	for i, b := range h.Roots {
		got[i] = string(b)
	}
	if !slices.Equal(got, r.want) {
		q := make([]string, len(got))
		for i, g := range got {
			q[i] = show(g)
		}
		return nil, refused("the stream carries [%s], this node takes [%s]", strings.Join(q, " "), strings.Join(r.want, " "))
	}
	if h.Meta < 0 || h.Meta > MaxMeta {
		return nil, refused("meta of %d bytes (at most %d)", h.Meta, MaxMeta)
	}
	meta := make([]byte, h.Meta)
	if err := r.read(meta); err != nil {
		return nil, err
	}
	r.hh.Write(meta)
	return meta, r.makeStages()
}

// within says whether p is q or inside it.
func within(p, q string) bool {
	return p == q || strings.HasPrefix(p, q+"/")
}

func (r *receiver) makeStages() error {
	for _, root := range r.want {
		s := r.stage(root)
		if err := checkAbs(s); err != nil {
			return fmt.Errorf("staging directory %s for %s: %w", show(s), root, err)
		}
		for _, o := range r.roots {
			if within(s, o.path) || within(o.path, s) {
				return fmt.Errorf("staging directories %s and %s overlap", show(s), show(o.path))
			}
		}
		pfd, base, err := safefs.OpenParent(s)
		if err != nil {
			return fmt.Errorf("open the parent of staging directory %s (it must exist): %w", show(s), err)
		}
		if err := unix.Mkdirat(pfd, base, 0o700); err != nil {
			unix.Close(pfd)
			if errors.Is(err, unix.EEXIST) {
				return fmt.Errorf("staging directory %s exists already (left by an earlier copy?): remove it and copy again", show(s))
			}
			return fmt.Errorf("create staging directory %s: %w", show(s), err)
		}
		sd := &stageDir{path: s, parent: pfd, base: base, fd: -1}
		r.roots = append(r.roots, sd)
		fd, err := unix.Openat(pfd, base, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
		if err != nil {
			return fmt.Errorf("open staging directory %s: %w", show(s), err)
		}
		sd.fd = fd
		// Exactly 0700: a setgid parent would have added setgid.
		if err := unix.Fchmod(fd, 0o700); err != nil {
			return fmt.Errorf("chmod staging directory %s: %w", show(s), err)
		}
	}
	return nil
}

func (r *receiver) closeAll() {
	if r.file != nil {
		r.file.f.Close()
		r.file = nil
	}
	for _, d := range r.stack[min(1, len(r.stack)):] { // stack[0] is a root's fd
		unix.Close(d.fd)
	}
	r.stack = nil
	for _, sd := range r.roots {
		if sd.fd >= 0 {
			unix.Close(sd.fd)
			sd.fd = -1
		}
		if sd.parent >= 0 {
			unix.Close(sd.parent)
			sd.parent = -1
		}
	}
}

// show is a path of the stream as a message names it.
func (r *receiver) show(p string) string {
	if r.cur < 0 {
		return show(p)
	}
	return show(filepath.Join(r.want[r.cur], p))
}

func (r *receiver) count() error {
	r.entries++
	if r.entries > r.lim.entries {
		return refused("more than %d entries", r.lim.entries)
	}
	return nil
}

// checkAttrs: a mode holds permission and special bits only, and an id is
// not the -1 that chown reads as "unchanged".
func checkAttrs(h *header) error {
	if h.M&^0o7777 != 0 {
		return fmt.Errorf("mode %o has bits beyond 07777", h.M)
	}
	if h.U == ^uint32(0) || h.G == ^uint32(0) {
		return errors.New("an owner of 4294967295 (-1)")
	}
	return nil
}

func (r *receiver) entry(h *header) error {
	if err := r.count(); err != nil {
		return err
	}
	p := string(h.P)
	keep := func(h *header) { h.R, h.P, h.T, h.M, h.U, h.G, h.MT = 0, nil, "", 0, 0, 0, 0 }
	switch h.T {
	case kindDir, kindFifo:
	case kindFile:
		keep = func(h *header) { h.R, h.P, h.T, h.M, h.U, h.G, h.MT, h.S = 0, nil, "", 0, 0, 0, 0, 0 }
	case kindSymlink:
		keep = func(h *header) { h.R, h.P, h.T, h.M, h.U, h.G, h.MT, h.L = 0, nil, "", 0, 0, 0, 0, nil }
	case kindHardlink:
		keep = func(h *header) { h.R, h.P, h.T, h.L = 0, nil, "", nil }
	default:
		return refused("entry %s of unknown type %s", r.show(p), show(h.T))
	}
	if stray(*h, keep) {
		return refused("entry %s (%s) sets fields a %s does not have", r.show(p), h.T, h.T)
	}
	if err := checkAttrs(h); err != nil {
		return refused("entry %s: %v", r.show(p), err)
	}
	if p == "" {
		return r.rootEntry(h)
	}
	if r.cur < 0 {
		return refused("entry %s comes before its root's entry", show(p))
	}
	if h.R != r.cur {
		return refused("entry %s is for root %d, inside root %d", r.show(p), h.R, r.cur)
	}
	if err := checkPath(p); err != nil {
		return refused("entry: %v", err)
	}
	pfd, name, err := r.enter(p)
	if err != nil {
		return err
	}
	switch h.T {
	case kindDir:
		return r.mkdir(h, p, pfd, name)
	case kindFile:
		return r.create(h, p, pfd, name)
	case kindSymlink:
		return r.symlink(h, p, pfd, name)
	case kindFifo:
		return r.mkfifo(h, p, pfd, name)
	default:
		return r.link(h, p, pfd, name)
	}
}

// rootEntry starts root cur+1: its staging directory takes the entry's
// owner now and its mode and mtime at the end.
func (r *receiver) rootEntry(h *header) error {
	if h.T != kindDir {
		return refused("root %d's entry is a %s, not a dir", h.R, h.T)
	}
	if h.R != r.cur+1 || h.R >= len(r.roots) {
		return refused("an entry for root %d where root %d's is due (of %d roots)", h.R, r.cur+1, len(r.roots))
	}
	if err := r.popTo(0); err != nil {
		return err
	}
	r.cur = h.R
	sd := r.roots[r.cur]
	if err := unix.Fchown(sd.fd, int(h.U), int(h.G)); err != nil {
		return chownErr(show(sd.path), h.U, h.G, err)
	}
	sd.mode, sd.mtime = h.M, h.MT
	r.stack = []*dirState{{path: "", fd: sd.fd}}
	return nil
}

// enter returns the descriptor of p's parent, which must be a directory
// this stream created and still open: directories left are done (their
// mode and mtime set), so entries come in walk order.
func (r *receiver) enter(p string) (int, string, error) {
	parent, name := splitPath(p)
	for len(r.stack) > 1 && r.stack[len(r.stack)-1].path != parent {
		if err := r.popTo(len(r.stack) - 1); err != nil {
			return -1, "", err
		}
	}
	if len(r.stack) == 0 || r.stack[len(r.stack)-1].path != parent {
		return -1, "", refused("%s: its parent %s is not a directory this stream created (or entries are out of order)", r.show(p), show(parent))
	}
	return r.stack[len(r.stack)-1].fd, name, nil
}

// popTo closes the open directories deeper than n, deepest first, giving
// each its mode and then its mtime.
func (r *receiver) popTo(n int) error {
	for len(r.stack) > max(n, 1) {
		d := r.stack[len(r.stack)-1]
		r.stack = r.stack[:len(r.stack)-1]
		err := unix.Fchmod(d.fd, d.mode)
		unix.Close(d.fd)
		if err != nil {
			return fmt.Errorf("chmod %s: %w", r.show(d.path), err)
		}
		_, name := splitPath(d.path)
		if err := setMtime(r.stack[len(r.stack)-1].fd, name, d.mtime); err != nil {
			return fmt.Errorf("set mtime of %s: %w", r.show(d.path), err)
		}
	}
	if n == 0 {
		r.stack = nil
	}
	return nil
}

// chownErr says why an owner could not be given; a rootless agent can
// give only the ids its user namespace maps.
func chownErr(path string, uid, gid uint32, err error) error {
	if errors.Is(err, unix.EINVAL) {
		return fmt.Errorf("chown %s %d:%d: %w (an id this agent's user namespace does not map: give it more subordinate ids, or run the agent as root)", path, uid, gid, err)
	}
	return fmt.Errorf("chown %s %d:%d: %w", path, uid, gid, err)
}

// setMtime sets name's mtime in dfd, never following a link; its atime is
// left as it is.
func setMtime(dfd int, name string, ns int64) error {
	ts := []unix.Timespec{{Nsec: unix.UTIME_OMIT}, unix.NsecToTimespec(ns)}
	return unix.UtimesNanoAt(dfd, name, ts, unix.AT_SYMLINK_NOFOLLOW)
}

// createErr turns a name this stream made already into a refusal.
func (r *receiver) createErr(p, what string, err error) error {
	if errors.Is(err, unix.EEXIST) {
		return refused("%s appears twice", r.show(p))
	}
	return fmt.Errorf("create %s %s: %w", what, r.show(p), err)
}

func (r *receiver) mkdir(h *header, p string, pfd int, name string) error {
	if err := unix.Mkdirat(pfd, name, 0o700); err != nil {
		return r.createErr(p, "directory", err)
	}
	fd, err := unix.Openat(pfd, name, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("open directory %s: %w", r.show(p), err)
	}
	r.stack = append(r.stack, &dirState{path: p, fd: fd, mode: h.M, mtime: h.MT})
	if err := unix.Fchown(fd, int(h.U), int(h.G)); err != nil {
		return chownErr(r.show(p), h.U, h.G, err)
	}
	return nil
}

func (r *receiver) create(h *header, p string, pfd int, name string) error {
	if h.S < 0 || h.S > maxSize {
		return refused("file %s of size %d", r.show(p), h.S)
	}
	fd, err := unix.Openat(pfd, name, unix.O_WRONLY|unix.O_CREAT|unix.O_EXCL|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0o600)
	if err != nil {
		return r.createErr(p, "file", err)
	}
	r.file = &fileState{path: p, f: os.NewFile(uintptr(fd), name), fd: fd, parent: pfd, name: name,
		size: h.S, mode: h.M, uid: h.U, gid: h.G, mtime: h.MT}
	return nil
}

// data writes one data frame at its offset; it must follow the last one
// of the same file and lie within its size.
func (r *receiver) data(h *header) error {
	f := r.file
	if f == nil {
		return refused("file data where no file entry is open")
	}
	if stray(*h, func(h *header) { h.O, h.N = 0, 0 }) {
		return refused("a data frame of %s with fields it does not use", r.show(f.path))
	}
	if h.N <= 0 || h.N > maxChunk {
		return refused("a data frame of %d bytes for %s (1 to %d)", h.N, r.show(f.path), maxChunk)
	}
	if h.O < f.end || h.O > f.size-int64(h.N) {
		return refused("data at [%d, %d) of %s, which has %d bytes and data up to %d already (extents lie within the size, in order, without overlap)",
			h.O, h.O+int64(h.N), r.show(f.path), f.size, f.end)
	}
	r.buf = grow(r.buf, h.N)
	b := r.buf
	if err := r.read(b); err != nil {
		return err
	}
	if _, err := f.f.WriteAt(b, h.O); err != nil {
		return fmt.Errorf("write %s: %w", r.show(f.path), err)
	}
	f.end = h.O + int64(h.N)
	return nil
}

// endFile gives the file its size (the holes), owner, mode and mtime, in
// that order: chown clears setuid, a write moves the mtime.
func (r *receiver) endFile() error {
	f := r.file
	r.file = nil
	err := func() error {
		if err := f.f.Truncate(f.size); err != nil {
			return fmt.Errorf("size %s: %w", r.show(f.path), err)
		}
		if err := unix.Fchown(f.fd, int(f.uid), int(f.gid)); err != nil {
			return chownErr(r.show(f.path), f.uid, f.gid, err)
		}
		if err := unix.Fchmod(f.fd, f.mode); err != nil {
			return fmt.Errorf("chmod %s: %w", r.show(f.path), err)
		}
		return nil
	}()
	if cerr := f.f.Close(); err == nil && cerr != nil {
		err = fmt.Errorf("close %s: %w", r.show(f.path), cerr)
	}
	if err != nil {
		return err
	}
	if err := setMtime(f.parent, f.name, f.mtime); err != nil {
		return fmt.Errorf("set mtime of %s: %w", r.show(f.path), err)
	}
	return nil
}

func checkTarget(l []byte) error {
	if len(l) == 0 || len(l) > MaxPath {
		return fmt.Errorf("a target of %d bytes (1 to %d)", len(l), MaxPath)
	}
	if bytes.IndexByte(l, 0) >= 0 {
		return errors.New("a target holding a NUL byte")
	}
	return nil
}

func (r *receiver) symlink(h *header, p string, pfd int, name string) error {
	if err := checkTarget(h.L); err != nil {
		return refused("symlink %s: %v", r.show(p), err)
	}
	// The target is stored, never resolved: not here, not by a later entry.
	if err := unix.Symlinkat(string(h.L), pfd, name); err != nil {
		return r.createErr(p, "symlink", err)
	}
	if err := unix.Fchownat(pfd, name, int(h.U), int(h.G), unix.AT_SYMLINK_NOFOLLOW); err != nil {
		return chownErr(r.show(p), h.U, h.G, err)
	}
	if err := setMtime(pfd, name, h.MT); err != nil {
		return fmt.Errorf("set mtime of %s: %w", r.show(p), err)
	}
	return nil
}

func (r *receiver) mkfifo(h *header, p string, pfd int, name string) error {
	if err := unix.Mkfifoat(pfd, name, 0o600); err != nil {
		return r.createErr(p, "fifo", err)
	}
	// Opened (without blocking) so that owner and mode go to it by
	// descriptor, whatever the name holds by then.
	fd, err := unix.Openat(pfd, name, unix.O_RDONLY|unix.O_NONBLOCK|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("open fifo %s: %w", r.show(p), err)
	}
	defer unix.Close(fd)
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil || st.Mode&unix.S_IFMT != unix.S_IFIFO {
		return fmt.Errorf("fifo %s is not the fifo made (%v)", r.show(p), err)
	}
	if err := unix.Fchown(fd, int(h.U), int(h.G)); err != nil {
		return chownErr(r.show(p), h.U, h.G, err)
	}
	if err := unix.Fchmod(fd, h.M); err != nil {
		return fmt.Errorf("chmod %s: %w", r.show(p), err)
	}
	if err := setMtime(pfd, name, h.MT); err != nil {
		return fmt.Errorf("set mtime of %s: %w", r.show(p), err)
	}
	return nil
}

// link makes p a hard link to an earlier entry of the same root, found
// under the root without following a link (RESOLVE_BENEATH and
// RESOLVE_NO_SYMLINKS) and linked without following it either.
func (r *receiver) link(h *header, p string, pfd int, name string) error {
	target := string(h.L)
	if err := checkPath(target); err != nil {
		return refused("hard link %s: target: %v", r.show(p), err)
	}
	if target == p {
		return refused("hard link %s to itself", r.show(p))
	}
	tdir, tname := splitPath(target)
	tfd := r.roots[r.cur].fd
	if tdir != "" {
		fd, err := unix.Openat2(tfd, tdir, &unix.OpenHow{
			Flags:   unix.O_PATH | unix.O_DIRECTORY | unix.O_CLOEXEC,
			Resolve: unix.RESOLVE_BENEATH | unix.RESOLVE_NO_SYMLINKS | unix.RESOLVE_NO_MAGICLINKS | unix.RESOLVE_NO_XDEV,
		})
		if err != nil {
			return refused("hard link %s to %s, not an earlier file of this root (%v)", r.show(p), show(target), err)
		}
		defer unix.Close(fd)
		tfd = fd
	}
	if err := unix.Linkat(tfd, tname, pfd, name, 0); err != nil {
		if errors.Is(err, unix.EEXIST) {
			return refused("%s appears twice", r.show(p))
		}
		if errors.Is(err, unix.ENOENT) || errors.Is(err, unix.EPERM) || errors.Is(err, unix.ENOTDIR) {
			return refused("hard link %s to %s, not an earlier file of this root (%v)", r.show(p), show(target), err)
		}
		return fmt.Errorf("hard link %s to %s: %w", r.show(p), show(target), err)
	}
	return nil
}

func (r *receiver) skip(h *header) error {
	if err := r.count(); err != nil {
		return err
	}
	p := string(h.P)
	if stray(*h, func(h *header) { h.R, h.P, h.T = 0, nil, "" }) || skipWhat(h.T) == "" {
		return refused("a skip frame for %s that is not the format's", r.show(p))
	}
	if r.cur < 0 || h.R != r.cur {
		return refused("skip %s is for root %d, inside root %d", show(p), h.R, r.cur)
	}
	if err := checkPath(p); err != nil {
		return refused("skip: %v", err)
	}
	if _, _, err := r.enter(p); err != nil {
		return err
	}
	r.skipped.add(skipLine(r.want[r.cur], p, h.T))
	return nil
}

// end checks the trailer and the stream's end, finishes the directories,
// and compares what is on disk now with the sender's digest.
func (r *receiver) end(h *header) (Summary, error) {
	if stray(*h, func(h *header) { h.Digest, h.Headers = "", "" }) || !isHex(h.Digest) || !isHex(h.Headers) {
		return Summary{}, refused("a trailer that is not the format's")
	}
	if r.cur != len(r.want)-1 {
		return Summary{}, refused("the stream ended after %d of its %d roots", r.cur+1, len(r.want))
	}
	if err := r.popTo(0); err != nil {
		return Summary{}, err
	}
	if got := hex.EncodeToString(r.hh.Sum(nil)); got != h.Headers {
		return Summary{}, fmt.Errorf("%w: the stream's headers hash to %s, the sender wrote %s (damaged on the way)", ErrMismatch, got[:12], h.Headers[:12])
	}
	var one [1]byte
	if n, err := r.in.Read(one[:]); n > 0 {
		return Summary{}, refused("bytes after the trailer")
	} else if !errors.Is(err, io.EOF) {
		return Summary{}, r.readErr(err)
	}
	for _, sd := range r.roots {
		if err := unix.Fchmod(sd.fd, sd.mode); err != nil {
			return Summary{}, fmt.Errorf("chmod %s: %w", show(sd.path), err)
		}
		if err := setMtime(sd.parent, sd.base, sd.mtime); err != nil {
			return Summary{}, fmt.Errorf("set mtime of %s: %w", show(sd.path), err)
		}
	}
	paths := make([]string, len(r.roots))
	for i, sd := range r.roots {
		paths[i] = sd.path
	}
	wk := newWalker(r.ctx, r.want, nil)
	for i, p := range paths {
		if err := wk.root(i, p); err != nil {
			return Summary{}, fmt.Errorf("read back the copy: %w", err)
		}
	}
	s := wk.finish()
	if s.Digest != h.Digest {
		return Summary{}, fmt.Errorf("%w: what was written hashes to %s, the sender read %s", ErrMismatch, s.Digest[:12], h.Digest[:12])
	}
	for _, sd := range r.roots {
		if err := unix.Syncfs(sd.fd); err != nil {
			return Summary{}, fmt.Errorf("sync %s: %w", show(sd.path), err)
		}
	}
	s.Skipped = r.skipped.list()
	return s, nil
}

func isHex(s string) bool {
	if len(s) != 2*sha256.Size {
		return false
	}
	for _, c := range []byte(s) {
		if !('0' <= c && c <= '9' || 'a' <= c && c <= 'f') {
			return false
		}
	}
	return true
}

// asyncReader reads r from its own goroutine, so that a cancelled ctx ends
// Receive even while a Read is blocked, and the network and the disk
// overlap.
type asyncReader struct {
	ctx    context.Context
	chunks chan chunk
	free   chan []byte
	quit   chan struct{}
	cur    []byte // what is left of the chunk being read
	held   []byte // that chunk's buffer, returned when it is used up
	err    error
}

type chunk struct {
	b   []byte
	err error
}

const readBuffers, readBufSize = 4, 256 << 10

func newAsyncReader(ctx context.Context, r io.Reader) *asyncReader {
	a := &asyncReader{ctx: ctx, chunks: make(chan chunk, readBuffers), free: make(chan []byte, readBuffers), quit: make(chan struct{})}
	for range readBuffers {
		a.free <- nil // made when first needed: most refusals need one
	}
	go a.run(r)
	return a
}

func (a *asyncReader) run(r io.Reader) {
	for {
		var b []byte
		select {
		case b = <-a.free:
		case <-a.quit:
			return
		}
		if b == nil {
			b = make([]byte, readBufSize)
		}
		n, err := r.Read(b)
		select {
		case a.chunks <- chunk{b[:n], err}:
		case <-a.quit:
			return
		}
		if err != nil {
			return
		}
	}
}

func (a *asyncReader) Read(p []byte) (int, error) {
	for len(a.cur) == 0 {
		if a.held != nil {
			a.free <- a.held[:cap(a.held)]
			a.held = nil
		}
		if a.err != nil {
			return 0, a.err
		}
		select {
		case c := <-a.chunks:
			a.cur, a.held, a.err = c.b, c.b, c.err
		case <-a.ctx.Done():
			return 0, a.ctx.Err()
		}
	}
	n := copy(p, a.cur)
	a.cur = a.cur[n:]
	return n, nil
}

// stop lets the goroutine end after the Read it is in, if any.
func (a *asyncReader) stop() { close(a.quit) }
