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
	"io/fs"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// needRoot fails a run that is not root's (CI runs as root): the copy
// restores owners, and a skip would hide the package's tests.
func needRoot(t testing.TB) {
	if os.Geteuid() != 0 {
		t.Fatal("these tests need root: the copy restores owners (run as root, as CI does)")
	}
}

// baseTime is where the tree's mtimes start: far from now, with nanoseconds.
var baseTime = time.Date(2021, 3, 4, 5, 6, 7, 123456789, time.UTC)

func setMtimePath(t testing.TB, p string, i int) {
	t.Helper()
	ts := unix.NsecToTimespec(baseTime.Add(time.Duration(i) * time.Second).UnixNano())
	if err := unix.UtimesNanoAt(unix.AT_FDCWD, p, []unix.Timespec{ts, ts}, unix.AT_SYMLINK_NOFOLLOW); err != nil {
		t.Fatal(err)
	}
}

func must(t testing.TB, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

// fixture is a source tree with everything a container can plant.
type fixture struct {
	roots   []string
	outside string // a directory the tree links to, never to be copied
	secrets [][]byte
	skipped []string // Summary.Skipped of a copy
	left    []string // what those are, in the first root
}

// hostileTree makes two data directories under dir: data, with nested
// dirs, odd modes, owners, links out of the tree, a hard link pair, a fifo,
// a 1 GiB sparse file, an empty file, odd names, a device node and a socket;
// and conf, with one file.
func hostileTree(t testing.TB, dir string) fixture {
	t.Helper()
	data := filepath.Join(dir, "src", "data")
	conf := filepath.Join(dir, "src", "conf")
	outside := filepath.Join(dir, "outside")
	for _, d := range []string{data + "/a/b/c", data + "/sub", data + "/sgid", data + "/tmp", conf, outside} {
		must(t, os.MkdirAll(d, 0o755))
	}
	secret := []byte("outside-secret-" + filepath.Base(dir) + "-do-not-copy\n")
	must(t, os.WriteFile(filepath.Join(outside, "secret"), secret, 0o600))
	w := func(rel string, content string, mode os.FileMode) {
		p := filepath.Join(data, rel)
		must(t, os.WriteFile(p, []byte(content), 0o600))
		must(t, os.Chmod(p, mode))
	}
	w("a/b/c/deep.txt", "deep\n", 0o640)
	w("owned.txt", "owned by 1234\n", 0o600)
	w("empty", "", 0o644)
	w("new\nline", "a name with a newline\n", 0o644)
	w("bad\xff\xfename", "a name that is not UTF-8\n", 0o644)
	w("hard1", "two names, one inode\n", 0o640)
	must(t, os.MkdirAll(filepath.Join(data, "bin"), 0o755))
	w("bin/tool", "#!/bin/sh\necho setuid\n", 0o755)
	must(t, os.Chmod(filepath.Join(data, "bin/tool"), 0o755|os.ModeSetuid)) // 4755
	must(t, os.Link(filepath.Join(data, "hard1"), filepath.Join(data, "sub", "hard2")))
	must(t, os.Symlink("/etc/shadow", filepath.Join(data, "shadow")))
	must(t, os.Symlink(filepath.Join(outside, "secret"), filepath.Join(data, "secret")))
	must(t, os.Symlink(outside, filepath.Join(data, "outdir")))
	must(t, os.Symlink("nowhere/at/all", filepath.Join(data, "dangling")))
	must(t, unix.Mkfifo(filepath.Join(data, "fifo"), 0o620))
	must(t, os.Chmod(filepath.Join(data, "fifo"), 0o620))
	// Hard links to a fifo and to a symlink itself (linkat without
	// AT_SYMLINK_FOLLOW) are links too.
	must(t, os.Link(filepath.Join(data, "fifo"), filepath.Join(data, "sub", "fifo-link")))
	must(t, unix.Linkat(unix.AT_FDCWD, filepath.Join(data, "dangling"), unix.AT_FDCWD, filepath.Join(data, "sub", "link-link"), 0))

	// 1 GiB with two small extents, and a file of written zeros.
	f, err := os.Create(filepath.Join(data, "sparse"))
	must(t, err)
	must(t, f.Truncate(1<<30))
	_, err = f.WriteAt(bytes.Repeat([]byte("A"), 4096), 100<<20)
	must(t, err)
	_, err = f.WriteAt(bytes.Repeat([]byte("B"), 4096), 900<<20+1234)
	must(t, err)
	must(t, f.Close())
	w("zeros", string(make([]byte, 256<<10))+"end", 0o644)

	// Owners: files, dirs and a link.
	for _, rel := range []string{"owned.txt", "a", "a/b/c/deep.txt", "shadow", "fifo", "hard1"} {
		must(t, os.Lchown(filepath.Join(data, rel), 1234, 5678))
	}
	must(t, os.Chmod(filepath.Join(data, "a"), 0o700))
	must(t, os.Chmod(filepath.Join(data, "a/b"), 0o750))
	must(t, os.Chmod(filepath.Join(data, "sgid"), 0o775|os.ModeSetgid))
	must(t, os.Chmod(filepath.Join(data, "tmp"), 0o777|os.ModeSticky))
	must(t, os.Chmod(data, 0o750))

	var skipped, left []string
	if err := unix.Mknod(filepath.Join(data, "dev0"), unix.S_IFCHR|0o600, int(unix.Mkdev(1, 3))); err == nil {
		skipped, left = append(skipped, data+"/dev0: a device node (not copied)"), append(left, "dev0")
	} else {
		t.Logf("no device node in the tree: %v", err)
	}
	sfd, err := unix.Socket(unix.AF_UNIX, unix.SOCK_STREAM, 0)
	must(t, err)
	must(t, unix.Bind(sfd, &unix.SockaddrUnix{Name: filepath.Join(data, "sock")}))
	unix.Close(sfd)
	skipped, left = append(skipped, data+"/sock: a socket (not copied)"), append(left, "sock")
	must(t, os.WriteFile(filepath.Join(conf, "app.ini"), []byte("[app]\nkey = value\n"), 0o640))

	// Mtimes: everything but the directories, then those, deepest first.
	i := 0
	var dirs []string
	for _, root := range []string{data, conf} {
		must(t, filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
			must(t, err)
			i++
			if d.IsDir() {
				dirs = append(dirs, p)
			} else {
				setMtimePath(t, p, i)
			}
			return nil
		}))
	}
	slices.Reverse(dirs)
	for _, d := range dirs {
		i++
		setMtimePath(t, d, i)
	}
	fx := fixture{roots: []string{data, conf}, outside: outside, secrets: [][]byte{secret}, skipped: skipped, left: left}
	if shadow, err := os.ReadFile("/etc/shadow"); err == nil && len(shadow) > 0 {
		fx.secrets = append(fx.secrets, shadow)
	}
	return fx
}

// stager puts root r's staging directory under dir.
func stager(dir string) func(string) string {
	return func(r string) string { return filepath.Join(dir, filepath.Base(r)+".incoming") }
}

// copyPiped sends roots through an io.Pipe into Receive, as the agent's
// HTTP request does, and returns both summaries and what Receive gave back
// as meta; capture gets every byte of the stream.
func copyPiped(t testing.TB, roots []string, stage func(string) string, meta []byte, capture io.Writer) (sent, got Summary, gotMeta []byte) {
	t.Helper()
	ctx := context.Background()
	pr, pw := io.Pipe()
	var serr error
	var wg sync.WaitGroup
	wg.Go(func() {
		sent, serr = Send(ctx, io.MultiWriter(pw, capture), roots, meta)
		pw.CloseWithError(serr)
	})
	gotMeta, got, rerr := Receive(ctx, pr, roots, stage)
	pr.Close()
	wg.Wait()
	if serr != nil || rerr != nil {
		t.Fatalf("send: %v; receive: %v", serr, rerr)
	}
	return sent, got, gotMeta
}

// lmeta is what Lstat says of one path, as the copy must keep it.
type lmeta struct {
	Mode     fs.FileMode
	UID, GID uint32
	Size     int64 // not for directories
	Nlink    uint64
	Mtime    int64
	Target   string
}

func lstatTree(t testing.TB, root string) map[string]lmeta {
	t.Helper()
	m := map[string]lmeta{}
	must(t, filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		must(t, err)
		var st unix.Stat_t
		must(t, unix.Lstat(p, &st))
		fi, err := os.Lstat(p)
		must(t, err)
		rel, _ := filepath.Rel(root, p)
		lm := lmeta{Mode: fi.Mode(), UID: st.Uid, GID: st.Gid, Nlink: uint64(st.Nlink), Mtime: st.Mtim.Nano()}
		if !fi.IsDir() {
			lm.Size = st.Size
		} else {
			lm.Nlink = 0 // a directory's count follows its subdirectories only
		}
		if fi.Mode()&fs.ModeSymlink != 0 {
			lm.Target, err = os.Readlink(p)
			must(t, err)
		}
		m[rel] = lm
		return nil
	}))
	return m
}

// The whole copy: what the receiver holds is what the sender held, link
// for link, hole for hole, owner for owner, mtime for mtime; nothing a link
// points at outside the tree travels; the digests agree everywhere.
func TestCopyKeepsEverything(t *testing.T) {
	needRoot(t)
	dir := t.TempDir()
	fx := hostileTree(t, dir)
	stages := filepath.Join(dir, "stage")
	must(t, os.Mkdir(stages, 0o755))
	stage := stager(stages)
	before, err := Digest(context.Background(), fx.roots)
	must(t, err)

	meta := []byte(`{"markers":{"init":"done"}}`)
	var stream bytes.Buffer
	sent, got, gotMeta := copyPiped(t, fx.roots, stage, meta, &stream)
	if !bytes.Equal(gotMeta, meta) {
		t.Fatalf("meta %q, sent %q", gotMeta, meta)
	}
	staged := []string{stage(fx.roots[0]), stage(fx.roots[1])}
	after, err := Digest(context.Background(), staged)
	must(t, err)
	if sent.Digest != before.Digest || got.Digest != sent.Digest || after.Digest != sent.Digest {
		t.Fatalf("digests: source %s, sent %s, received %s, staging %s", before.Digest, sent.Digest, got.Digest, after.Digest)
	}
	if !slices.Equal(sent.Skipped, fx.skipped) || !slices.Equal(got.Skipped, fx.skipped) {
		t.Fatalf("skipped: sent %q, received %q, want %q", sent.Skipped, got.Skipped, fx.skipped)
	}
	sent.Skipped, got.Skipped = nil, nil
	if fmt.Sprint(sent) != fmt.Sprint(got) || fmt.Sprint(got) != fmt.Sprint(after) {
		t.Fatalf("summaries differ:\nsent     %+v\nreceived %+v\nstaging  %+v", sent, got, after)
	}
	if got.Dirs != 9 || got.Files != 10 || got.Symlinks != 4 || got.HardLinks != 3 || got.Fifos != 1 {
		t.Fatalf("counts %+v", got)
	}
	if got.Bytes > 1<<20 {
		t.Fatalf("%d bytes carried: the holes travelled", got.Bytes)
	}

	for i, root := range fx.roots {
		want, have := lstatTree(t, root), lstatTree(t, staged[i])
		if i == 0 {
			for _, rel := range fx.left {
				delete(want, rel)
			}
		}
		for rel, w := range want {
			if h, ok := have[rel]; !ok || h != w {
				t.Errorf("%s %q: have %+v, want %+v", filepath.Base(root), rel, h, w)
			}
		}
		for rel := range have {
			if _, ok := want[rel]; !ok {
				t.Errorf("%s %q: received but not sent", filepath.Base(root), rel)
			}
		}
	}

	data := staged[0]
	var st unix.Stat_t
	must(t, unix.Stat(filepath.Join(data, "sparse"), &st))
	if st.Size != 1<<30 || st.Blocks*512 > 1<<20 {
		t.Fatalf("sparse file: size %d, %d bytes allocated", st.Size, st.Blocks*512)
	}
	f, err := os.Open(filepath.Join(data, "sparse"))
	must(t, err)
	b := make([]byte, 4096)
	_, err = f.ReadAt(b, 900<<20+1234)
	f.Close()
	must(t, err)
	if !bytes.Equal(b, bytes.Repeat([]byte("B"), 4096)) {
		t.Fatal("the second extent did not arrive")
	}
	if l, err := os.Readlink(filepath.Join(data, "shadow")); err != nil || l != "/etc/shadow" {
		t.Fatalf("shadow: %q, %v", l, err)
	}
	// No byte of what the links point at travelled or landed.
	for _, s := range fx.secrets {
		if bytes.Contains(stream.Bytes(), s) {
			t.Fatal("the stream carries a link's target's content")
		}
	}
	for _, root := range staged {
		must(t, filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
			if d.Type().IsRegular() {
				c, err := os.ReadFile(p)
				must(t, err)
				for _, s := range fx.secrets {
					if bytes.Contains(c, s) {
						t.Fatalf("%s holds a link's target's content", p)
					}
				}
			}
			return nil
		}))
	}
	if es, _ := os.ReadDir(fx.outside); len(es) != 1 {
		t.Fatalf("outside changed: %v", es)
	}
}

// The digest is of what a file holds, not of how it is allocated: written
// zeros and a hole hash the same, so a receiver that keeps holes agrees.
func TestDigestIgnoresAllocation(t *testing.T) {
	dir := t.TempDir()
	a, b := filepath.Join(dir, "a"), filepath.Join(dir, "b")
	must(t, os.Mkdir(a, 0o755))
	must(t, os.Mkdir(b, 0o755))
	content := append(make([]byte, 3*BlockSize+17), "tail"...)
	must(t, os.WriteFile(filepath.Join(a, "f"), content, 0o644))
	f, err := os.Create(filepath.Join(b, "f"))
	must(t, err)
	must(t, f.Truncate(int64(len(content))))
	_, err = f.WriteAt([]byte("tail"), int64(len(content)-4))
	must(t, err)
	must(t, f.Close())
	for _, p := range []string{a, b, a + "/f", b + "/f"} {
		setMtimePath(t, p, 1)
	}
	da, err := Digest(context.Background(), []string{a})
	must(t, err)
	db, err := Digest(context.Background(), []string{b})
	must(t, err)
	if da.Digest != db.Digest || da.Bytes != db.Bytes {
		t.Fatalf("written zeros %+v, a hole %+v", da, db)
	}
	must(t, os.WriteFile(filepath.Join(b, "f"), append(content[:len(content)-1], 'X'), 0o644))
	if db, _ = Digest(context.Background(), []string{b}); db.Digest == da.Digest {
		t.Fatal("a changed byte did not change the digest")
	}
}

// smallTree is a tree whose stream is small enough to damage at many places.
func smallTree(t testing.TB, dir string) []string {
	t.Helper()
	root := filepath.Join(dir, "src", "data")
	must(t, os.MkdirAll(filepath.Join(root, "d"), 0o750))
	must(t, os.WriteFile(filepath.Join(root, "d", "f"), bytes.Repeat([]byte("data "), 3000), 0o640))
	must(t, os.WriteFile(filepath.Join(root, "g"), []byte("g"), 0o600))
	must(t, os.Symlink("../../outside", filepath.Join(root, "up")))
	must(t, os.Link(filepath.Join(root, "g"), filepath.Join(root, "h")))
	must(t, unix.Mkfifo(filepath.Join(root, "p"), 0o600))
	f, err := os.Create(filepath.Join(root, "sparse"))
	must(t, err)
	must(t, f.Truncate(10<<20))
	_, err = f.WriteAt([]byte("x"), 5<<20)
	must(t, err)
	must(t, f.Close())
	return []string{root}
}

func sendAll(t testing.TB, roots []string, meta []byte) []byte {
	t.Helper()
	var b bytes.Buffer
	if _, err := Send(context.Background(), &b, roots, meta); err != nil {
		t.Fatal(err)
	}
	return b.Bytes()
}

// isStreamFault says whether err is one of the errors a damaged stream gives.
func isStreamFault(err error) bool {
	return errors.Is(err, ErrRefused) || errors.Is(err, ErrMismatch) || errors.Is(err, ErrTruncated)
}

func gone(t testing.TB, p string) {
	t.Helper()
	if _, err := os.Lstat(p); !errors.Is(err, fs.ErrNotExist) {
		t.Fatalf("%s is still there (%v)", p, err)
	}
}

// A byte damaged anywhere (a header, file data, meta, the trailer) is
// noticed, and nothing of the copy is kept.
func TestDamagedStreamIsRemoved(t *testing.T) {
	needRoot(t)
	dir := t.TempDir()
	roots := smallTree(t, dir)
	stream := sendAll(t, roots, []byte("meta"))
	stages := filepath.Join(dir, "stage")
	must(t, os.Mkdir(stages, 0o755))
	stage := stager(stages)
	if _, _, err := Receive(context.Background(), bytes.NewReader(stream), roots, stage); err != nil {
		t.Fatalf("the undamaged stream: %v", err)
	}
	must(t, os.RemoveAll(stage(roots[0])))

	positions := []int{len(stream) / 2}
	for i := 1; i < 40; i++ {
		positions = append(positions, i*len(stream)/40)
	}
	for i := 1; i <= 70; i++ {
		positions = append(positions, len(stream)-i) // the trailer
	}
	for i := 16; i < 80; i++ {
		positions = append(positions, i) // the begin frame and meta
	}
	for _, pos := range positions {
		bad := bytes.Clone(stream)
		bad[pos] ^= 0x20
		_, _, err := Receive(context.Background(), bytes.NewReader(bad), roots, stage)
		if !isStreamFault(err) {
			t.Fatalf("byte %d of %d damaged: %v", pos, len(stream), err)
		}
		gone(t, stage(roots[0]))
	}
}

// A stream cut short anywhere is an error, and nothing of it is kept.
func TestTruncatedStreamIsRemoved(t *testing.T) {
	needRoot(t)
	dir := t.TempDir()
	roots := smallTree(t, dir)
	stream := sendAll(t, roots, nil)
	stages := filepath.Join(dir, "stage")
	must(t, os.Mkdir(stages, 0o755))
	stage := stager(stages)
	for _, n := range []int{0, 5, 16, 17, 40, len(stream) / 4, len(stream) / 2, len(stream) - 30, len(stream) - 1} {
		_, _, err := Receive(context.Background(), bytes.NewReader(stream[:n]), roots, stage)
		if !errors.Is(err, ErrTruncated) {
			t.Fatalf("cut at %d of %d: %v", n, len(stream), err)
		}
		gone(t, stage(roots[0]))
	}
}

// A stream of other roots, or the same in another order, is refused before
// anything is made.
func TestOtherRootsAreRefused(t *testing.T) {
	dir := t.TempDir()
	roots := smallTree(t, dir)
	other := filepath.Join(dir, "src", "other")
	must(t, os.Mkdir(other, 0o755))
	stream := sendAll(t, []string{roots[0], other}, nil)
	for _, want := range [][]string{{"/srv/elsewhere"}, {roots[0]}, {other, roots[0]}} {
		called := false
		_, _, err := Receive(context.Background(), bytes.NewReader(stream), want, func(r string) string {
			called = true
			return filepath.Join(dir, "stage")
		})
		if !errors.Is(err, ErrRefused) || !strings.Contains(err.Error(), "this node takes") || called {
			t.Fatalf("want %q: %v (stage asked: %v)", want, err, called)
		}
	}
	gone(t, filepath.Join(dir, "stage"))
}

// crafted builds streams a hostile sender would write: well framed, with a
// right headers hash, so that only the rule a case breaks refuses it.
type crafted struct {
	b  bytes.Buffer
	hh hash.Hash
}

// newCraft starts a stream: its magic only.
func newCraft() *crafted {
	c := &crafted{hh: sha256.New()}
	c.b.WriteString(magic)
	c.hh.Write([]byte(magic))
	return c
}

// craft starts a stream of roots with no meta.
func craft(roots ...string) *crafted {
	c := newCraft()
	h := header{K: frameBegin}
	for _, r := range roots {
		h.Roots = append(h.Roots, []byte(r))
	}
	return c.frame(h)
}

func (c *crafted) rawFrame(js []byte) *crafted {
	var lb [4]byte
	binary.BigEndian.PutUint32(lb[:], uint32(len(js)))
	c.b.Write(lb[:])
	c.b.Write(js)
	c.hh.Write(lb[:])
	c.hh.Write(js)
	return c
}

func (c *crafted) frame(h header) *crafted {
	js, err := json.Marshal(&h)
	if err != nil {
		panic(err)
	}
	return c.rawFrame(js)
}

func (c *crafted) dir(p string) *crafted {
	return c.frame(header{K: frameEntry, P: []byte(p), T: kindDir, M: 0o755})
}

func (c *crafted) file(p, content string) *crafted {
	c.frame(header{K: frameEntry, P: []byte(p), T: kindFile, M: 0o644, S: int64(len(content))})
	if content != "" {
		c.frame(header{K: frameData, N: len(content)})
		c.b.WriteString(content)
	}
	return c
}

func (c *crafted) symlink(p, target string) *crafted {
	return c.frame(header{K: frameEntry, P: []byte(p), T: kindSymlink, M: 0o777, L: []byte(target)})
}

func (c *crafted) end() []byte {
	digest := strings.Repeat("0", 64)
	js, _ := json.Marshal(&header{K: frameEnd, Digest: digest, Headers: hex.EncodeToString(c.hh.Sum(nil))})
	var lb [4]byte
	binary.BigEndian.PutUint32(lb[:], uint32(len(js)))
	return append(append(bytes.Clone(c.b.Bytes()), lb[:]...), js...)
}

// What a hostile or buggy sender can write is refused, nothing is written
// outside the staging directory, and the staging directory goes.
func TestHostileStreamsAreRefused(t *testing.T) {
	needRoot(t)
	const root = "/srv/mesh/web/data"
	base := t.TempDir()
	outside := filepath.Join(base, "outside")
	must(t, os.Mkdir(outside, 0o755))
	must(t, os.WriteFile(filepath.Join(outside, "keep"), []byte("keep"), 0o644))
	stages := filepath.Join(base, "stage")
	must(t, os.Mkdir(stages, 0o755))
	stage := stager(stages)
	huge := func(n uint32) []byte {
		var lb [4]byte
		binary.BigEndian.PutUint32(lb[:], n)
		return append([]byte(magic), lb[:]...)
	}
	start := func() *crafted { return craft(root).dir("") }
	cases := []struct {
		name   string
		stream []byte
		want   error
		lim    int
	}{
		{"a symlink then a file through it", start().symlink("a", outside).file("a/x", "pwn").end(), ErrRefused, 0},
		{"a symlink then a dir through it", start().symlink("a", outside).dir("a/d").end(), ErrRefused, 0},
		{"a relative symlink then a file through it", start().symlink("a", "../../outside").file("a/x", "pwn").end(), ErrRefused, 0},
		{"a hard link through a symlink", start().symlink("a", outside).frame(header{K: frameEntry, P: []byte("h"), T: kindHardlink, L: []byte("a/keep")}).end(), ErrRefused, 0},
		{"a hard link out of the root", start().frame(header{K: frameEntry, P: []byte("h"), T: kindHardlink, L: []byte("../outside/keep")}).end(), ErrRefused, 0},
		{"a hard link to an absolute path", start().frame(header{K: frameEntry, P: []byte("h"), T: kindHardlink, L: []byte(outside + "/keep")}).end(), ErrRefused, 0},
		{"a hard link to a directory", start().dir("d").frame(header{K: frameEntry, P: []byte("h"), T: kindHardlink, L: []byte("d")}).end(), ErrRefused, 0},
		{"a hard link to nothing", start().frame(header{K: frameEntry, P: []byte("h"), T: kindHardlink, L: []byte("nothing")}).end(), ErrRefused, 0},
		{"../x", start().file("../x", "pwn").end(), ErrRefused, 0},
		{"d/../../x", start().dir("d").file("d/../../x", "pwn").end(), ErrRefused, 0},
		{"an absolute path", start().file(outside+"/x", "pwn").end(), ErrRefused, 0},
		{"an empty component", start().dir("d").file("d//x", "x").end(), ErrRefused, 0},
		{"a dot component", start().file("./x", "x").end(), ErrRefused, 0},
		{"a trailing slash", start().dir("d/").end(), ErrRefused, 0},
		{"a NUL byte", start().file("x\x00y", "x").end(), ErrRefused, 0},
		{"a path over 4096 bytes", start().file(strings.Repeat("a/", 2048)+"x", "x").end(), ErrRefused, 0},
		{"a component over 255 bytes", start().file(strings.Repeat("a", 256), "x").end(), ErrRefused, 0},
		{"a huge header length", huge(0xffffffff), ErrRefused, 0},
		{"a header of 64 KiB and one byte", huge(MaxHeader + 1), ErrRefused, 0},
		{"a header of no bytes", huge(0), ErrRefused, 0},
		{"an extent beyond the size", start().frame(header{K: frameEntry, P: []byte("f"), T: kindFile, S: 10}).frame(header{K: frameData, O: 5, N: 10}).end(), ErrRefused, 0},
		{"an extent at a negative offset", start().frame(header{K: frameEntry, P: []byte("f"), T: kindFile, S: 10}).frame(header{K: frameData, O: -1, N: 1}).end(), ErrRefused, 0},
		{"overlapping extents", start().frame(header{K: frameEntry, P: []byte("f"), T: kindFile, S: 10}).frame(header{K: frameData, N: 5}).rawData("aaaaa").frame(header{K: frameData, O: 3, N: 5}).rawData("bbbbb").end(), ErrRefused, 0},
		{"an extent of no bytes", start().frame(header{K: frameEntry, P: []byte("f"), T: kindFile, S: 10}).frame(header{K: frameData, O: 1}).end(), ErrRefused, 0},
		{"an extent over 1 MiB", start().frame(header{K: frameEntry, P: []byte("f"), T: kindFile, S: 4 << 20}).frame(header{K: frameData, N: 2 << 20}).end(), ErrRefused, 0},
		{"data after a directory", start().dir("d").frame(header{K: frameData, N: 1}).rawData("x").end(), ErrRefused, 0},
		{"a negative size", start().frame(header{K: frameEntry, P: []byte("f"), T: kindFile, S: -1}).end(), ErrRefused, 0},
		{"a size past 2^60", start().frame(header{K: frameEntry, P: []byte("f"), T: kindFile, S: 1<<60 + 1}).end(), ErrRefused, 0},
		{"a mode with type bits", start().frame(header{K: frameEntry, P: []byte("f"), T: kindFile, M: 0o100644}).end(), ErrRefused, 0},
		{"an owner of -1", start().frame(header{K: frameEntry, P: []byte("f"), T: kindFile, U: 0xffffffff}).end(), ErrRefused, 0},
		{"a size on a directory", start().frame(header{K: frameEntry, P: []byte("d"), T: kindDir, S: 5}).end(), ErrRefused, 0},
		{"a target on a fifo", start().frame(header{K: frameEntry, P: []byte("p"), T: kindFifo, L: []byte("x")}).end(), ErrRefused, 0},
		{"an unknown entry type", start().frame(header{K: frameEntry, P: []byte("c"), T: "chardev"}).end(), ErrRefused, 0},
		{"an empty symlink target", start().frame(header{K: frameEntry, P: []byte("l"), T: kindSymlink}).end(), ErrRefused, 0},
		{"a NUL in a symlink target", start().symlink("l", "a\x00b").end(), ErrRefused, 0},
		{"an entry twice", start().file("f", "1").file("f", "2").end(), ErrRefused, 0},
		{"a directory over a file", start().file("f", "1").dir("f").end(), ErrRefused, 0},
		{"an entry in a directory left", start().dir("a").file("a/x", "1").dir("b").file("a/y", "2").end(), ErrRefused, 0},
		{"an entry in a file", start().file("f", "1").file("f/x", "2").end(), ErrRefused, 0},
		{"an entry before its root's", craft(root).file("f", "1").end(), ErrRefused, 0},
		{"a root that is a file", craft(root).frame(header{K: frameEntry, T: kindFile}).end(), ErrRefused, 0},
		{"a root twice", start().dir("").end(), ErrRefused, 0},
		{"an entry of another root", start().frame(header{K: frameEntry, R: 1, P: []byte("x"), T: kindDir}).end(), ErrRefused, 0},
		{"no root entry", craft(root).end(), ErrRefused, 0},
		{"meta over 1 MiB", newCraft().rawFrame([]byte(fmt.Sprintf(`{"k":"begin","roots":["%s"],"meta":%d}`, b64(root), MaxMeta+1))).end(), ErrRefused, 0},
		{"a header not as a sender writes it", craft(root).rawFrame([]byte(`{"k":"entry", "t":"dir"}`)).end(), ErrRefused, 0},
		{"a header with a folded key", craft(root).rawFrame([]byte(`{"K":"entry","t":"dir"}`)).end(), ErrRefused, 0},
		{"a header with a field twice", craft(root).rawFrame([]byte(`{"k":"entry","t":"file","t":"dir"}`)).end(), ErrRefused, 0},
		{"a header with an unknown field", craft(root).rawFrame([]byte(`{"k":"entry","t":"dir","x":1}`)).end(), ErrRefused, 0},
		{"a header that is not JSON", craft(root).rawFrame([]byte(`entry dir`)).end(), ErrRefused, 0},
		{"an unknown frame", start().frame(header{K: "exec", Why: "rm -rf /"}).end(), ErrRefused, 0},
		{"a skip of an unknown kind", start().frame(header{K: frameSkip, P: []byte("x"), T: "file"}).end(), ErrRefused, 0},
		{"bytes after the trailer", append(start().file("f", "1").end(), 'x'), ErrRefused, 0},
		{"not a stream", []byte("HTTP/1.1 500 Internal Server Error\r\n\r\n"), ErrRefused, 0},
		{"a later format", []byte("mesh datacopy 2\n"), ErrRefused, 0},
		{"more entries than the bound", start().dir("a").dir("b").dir("c").end(), ErrRefused, 3},
		{"a wrong digest", start().file("f", "1").end(), ErrMismatch, 0},
		{"a wrong headers hash", craft(root).dir("").frame(header{K: frameEnd, Digest: strings.Repeat("0", 64), Headers: strings.Repeat("1", 64)}).b.Bytes(), ErrMismatch, 0},
		{"a sender that gave up", start().frame(header{K: frameAbort, Why: "disk on fire"}).end(), ErrAborted, 0},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			lim := limits{entries: MaxEntries}
			if c.lim > 0 {
				lim.entries = c.lim
			}
			_, _, err := receive(context.Background(), bytes.NewReader(c.stream), []string{root}, stage, lim)
			if !errors.Is(err, c.want) {
				t.Fatalf("got %v, want %v", err, c.want)
			}
			t.Log(err)
			gone(t, stage(root))
			es, _ := os.ReadDir(outside)
			if len(es) != 1 || es[0].Name() != "keep" {
				t.Fatalf("outside holds %v", es)
			}
			if b, _ := os.ReadFile(filepath.Join(outside, "keep")); string(b) != "keep" {
				t.Fatalf("outside/keep holds %q", b)
			}
			if es, _ := os.ReadDir(stages); len(es) != 0 {
				t.Fatalf("staging holds %v", es)
			}
		})
	}
}

func (c *crafted) rawData(s string) *crafted {
	c.b.WriteString(s)
	return c
}

func b64(s string) string {
	js, _ := json.Marshal([]byte(s))
	return strings.Trim(string(js), `"`)
}

// Receive refuses a staging directory that exists (a copy cut short left
// it), and touches nothing in it.
func TestExistingStagingIsRefused(t *testing.T) {
	needRoot(t)
	dir := t.TempDir()
	roots := smallTree(t, dir)
	stream := sendAll(t, roots, nil)
	stage := stager(dir)
	must(t, os.Mkdir(stage(roots[0]), 0o755))
	must(t, os.WriteFile(filepath.Join(stage(roots[0]), "old"), []byte("old"), 0o644))
	_, _, err := Receive(context.Background(), bytes.NewReader(stream), roots, stage)
	if err == nil || !strings.Contains(err.Error(), "exists already") {
		t.Fatal(err)
	}
	if b, _ := os.ReadFile(filepath.Join(stage(roots[0]), "old")); string(b) != "old" {
		t.Fatal("the existing staging directory was changed")
	}
}

// A cancelled ctx ends Send while its writes are blocked, and Receive while
// its reads are, removing what it made.
func TestCancelEndsPromptly(t *testing.T) {
	needRoot(t)
	dir := t.TempDir()
	roots := smallTree(t, dir)
	big := make([]byte, 16<<20)
	rnd := rand.NewChaCha8([32]byte{1})
	rnd.Read(big)
	must(t, os.WriteFile(filepath.Join(roots[0], "big"), big, 0o644))

	t.Run("send", func(t *testing.T) {
		pr, pw := io.Pipe() // nobody reads
		defer pr.Close()
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan error, 1)
		go func() {
			_, err := Send(ctx, pw, roots, nil)
			done <- err
		}()
		time.Sleep(100 * time.Millisecond)
		cancel()
		select {
		case err := <-done:
			if !errors.Is(err, context.Canceled) {
				t.Fatal(err)
			}
		case <-time.After(2 * time.Second):
			t.Fatal("Send did not end after its ctx was cancelled")
		}
	})

	t.Run("receive", func(t *testing.T) {
		stream := sendAll(t, roots, nil)
		stage := stager(dir)
		pr, pw := io.Pipe()
		defer pw.Close()
		go pw.Write(stream[:len(stream)/2]) // then nothing more
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan error, 1)
		go func() {
			_, _, err := Receive(ctx, pr, roots, stage)
			done <- err
		}()
		for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(10 * time.Millisecond) {
			if _, err := os.Stat(filepath.Join(stage(roots[0]), "big")); err == nil {
				break
			}
			if time.Now().After(deadline) {
				t.Fatal("Receive did not start writing")
			}
		}
		cancel()
		select {
		case err := <-done:
			if !errors.Is(err, context.Canceled) {
				t.Fatal(err)
			}
		case <-time.After(2 * time.Second):
			t.Fatal("Receive did not end after its ctx was cancelled")
		}
		gone(t, stage(roots[0]))
	})
}

// A sender that fails says why, and the receiver says it.
func TestSenderFailureReachesReceiver(t *testing.T) {
	needRoot(t)
	dir := t.TempDir()
	roots := smallTree(t, dir)
	missing := filepath.Join(dir, "src", "missing")
	var b bytes.Buffer
	_, err := Send(context.Background(), &b, []string{roots[0], missing}, nil)
	if err == nil {
		t.Fatal("sent a root that does not exist")
	}
	_, _, rerr := Receive(context.Background(), &b, []string{roots[0], missing}, stager(dir))
	if !errors.Is(rerr, ErrAborted) || !strings.Contains(rerr.Error(), "missing") {
		t.Fatalf("receiver: %v", rerr)
	}
	gone(t, stager(dir)(roots[0]))
}

// Send refuses what no stream can carry, before writing anything.
func TestSendRefusesBadArguments(t *testing.T) {
	dir := t.TempDir()
	for _, c := range []struct {
		roots []string
		meta  []byte
	}{
		{[]string{"relative"}, nil},
		{[]string{"/"}, nil},
		{[]string{dir + "/../x"}, nil},
		{[]string{dir, dir}, nil},
		{[]string{dir}, make([]byte, MaxMeta+1)},
	} {
		var b bytes.Buffer
		if _, err := Send(context.Background(), &b, c.roots, c.meta); err == nil || b.Len() > 0 {
			t.Fatalf("%q: %v, wrote %d bytes", c.roots, err, b.Len())
		}
	}
	link := filepath.Join(dir, "link")
	must(t, os.Symlink(dir, link))
	if _, err := Digest(context.Background(), []string{link}); err == nil || !strings.Contains(err.Error(), "symbolic link") {
		t.Fatalf("a root that is a link: %v", err)
	}
}

// BenchmarkSendReceive copies about 200 MB, many small files and a few
// large ones, from Send through a pipe into Receive (staged, read back and
// synced).
func BenchmarkSendReceive(b *testing.B) {
	needRoot(b)
	dir := b.TempDir()
	root := filepath.Join(dir, "src", "data")
	rnd := rand.NewChaCha8([32]byte{2})
	var total int64
	small := make([]byte, 8<<10)
	for d := range 100 {
		sub := filepath.Join(root, fmt.Sprintf("d%03d", d))
		must(b, os.MkdirAll(sub, 0o755))
		for f := range 100 {
			rnd.Read(small)
			must(b, os.WriteFile(filepath.Join(sub, fmt.Sprintf("f%03d", f)), small, 0o644))
			total += int64(len(small))
		}
	}
	large := make([]byte, 30<<20)
	for f := range 4 {
		rnd.Read(large)
		must(b, os.WriteFile(filepath.Join(root, fmt.Sprintf("large%d", f)), large, 0o644))
		total += int64(len(large))
	}
	stages := filepath.Join(dir, "stage")
	must(b, os.Mkdir(stages, 0o755))
	roots := []string{root}
	b.SetBytes(total)
	for i := 0; b.Loop(); i++ {
		stage := func(string) string { return filepath.Join(stages, fmt.Sprint(i)) }
		sent, got, _ := copyPiped(b, roots, stage, nil, io.Discard)
		if sent.Digest != got.Digest || got.Files != 10_004 {
			b.Fatalf("sent %+v, received %+v", sent, got)
		}
		b.StopTimer()
		must(b, os.RemoveAll(stage(root)))
		b.StartTimer()
	}
}

// Summary.Skipped stays bounded however many sockets a container makes.
func TestSkippedIsBounded(t *testing.T) {
	var l skipList
	for i := range maxSkipped + 2 {
		l.add(fmt.Sprint(i))
	}
	got := l.list()
	if len(got) != maxSkipped+1 || got[maxSkipped-1] != fmt.Sprint(maxSkipped-1) || got[maxSkipped] != "and 2 more device nodes, sockets or unknown files (not copied)" {
		t.Fatalf("%d lines, ending %q", len(got), got[len(got)-2:])
	}
}
