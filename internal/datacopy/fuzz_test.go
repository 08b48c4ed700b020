package datacopy

import (
	"bytes"
	"context"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

var writeSeeds = flag.Bool("datacopy.writeseeds", false, "write FuzzReceive's seed streams to testdata/fuzz/FuzzReceive")

// fuzzRoots are the roots FuzzReceive's streams name, wherever the seed
// tree was.
var fuzzRoots = []string{"/r0", "/r1"}

// fuzzOutside is where the seeds' absolute links point: fixed (not under
// $TMPDIR), so that a kept seed still aims at it, and shared by fuzz
// workers, which only check that it stays empty.
func fuzzOutside(t testing.TB) string {
	const p = "/tmp/datacopy-fuzz-outside"
	must(t, os.MkdirAll(p, 0o755))
	return p
}

// seedStream is a real Send stream of a small tree with a bit of
// everything, its roots named fuzzRoots.
func seedStream(t testing.TB) []byte {
	dir := t.TempDir()
	r0, r1 := filepath.Join(dir, "r0"), filepath.Join(dir, "r1")
	must(t, os.MkdirAll(filepath.Join(r0, "d"), 0o750))
	must(t, os.MkdirAll(r1, 0o700))
	must(t, os.WriteFile(filepath.Join(r0, "d", "f"), []byte("hello"), 0o640))
	must(t, os.Link(filepath.Join(r0, "d", "f"), filepath.Join(r0, "g")))
	must(t, os.Symlink("../outside", filepath.Join(r0, "up")))
	must(t, os.Symlink(fuzzOutside(t), filepath.Join(r0, "abs")))
	must(t, unix.Mkfifo(filepath.Join(r0, "p"), 0o600))
	must(t, os.WriteFile(filepath.Join(r0, "new\nline"), nil, 0o4755))
	f, err := os.Create(filepath.Join(r0, "sparse"))
	must(t, err)
	must(t, f.Truncate(3*BlockSize+10))
	_, err = f.WriteAt([]byte("tail"), 3*BlockSize+6)
	must(t, err)
	must(t, f.Close())
	sfd, err := unix.Socket(unix.AF_UNIX, unix.SOCK_STREAM, 0)
	must(t, err)
	must(t, unix.Bind(sfd, &unix.SockaddrUnix{Name: filepath.Join(r0, "sock")}))
	unix.Close(sfd)
	must(t, os.WriteFile(filepath.Join(r1, "x"), []byte("x"), 0o600))
	var b bytes.Buffer
	if _, err := send(context.Background(), &b, []string{r0, r1}, fuzzRoots, []byte(`{"markers":{}}`)); err != nil {
		t.Fatal(err)
	}
	return b.Bytes()
}

// seeds are the real stream and hostile ones around it.
func seeds(t testing.TB) [][]byte {
	start := func() *crafted { return craft(fuzzRoots...).dir("") }
	return [][]byte{
		seedStream(t),
		start().symlink("a", "../outside").file("a/x", "pwn").end(),
		start().symlink("a", fuzzOutside(t)).dir("a/d").end(),
		start().file("f", "data").frame(header{K: frameEntry, P: []byte("h"), T: kindHardlink, L: []byte("f")}).
			frame(header{K: frameEntry, R: 1, T: kindDir}).end(),
	}
}

// Any bytes a peer sends end in an error or a copy, never a panic, and
// nothing is made outside the staging directories: an error leaves none of
// them either.
func FuzzReceive(f *testing.F) {
	needRoot(f)
	for _, s := range seeds(f) {
		f.Add(s)
	}
	outside := fuzzOutside(f)
	f.Fuzz(func(t *testing.T, data []byte) {
		base := t.TempDir()
		must(t, os.Mkdir(filepath.Join(base, "outside"), 0o755))
		stages := map[string]string{"/r0": filepath.Join(base, "s0"), "/r1": filepath.Join(base, "s1")}
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		defer cancel()
		_, _, err := Receive(ctx, bytes.NewReader(data), fuzzRoots, func(r string) string { return stages[r] })
		es, _ := os.ReadDir(base)
		for _, e := range es {
			switch e.Name() {
			case "outside":
			case "s0", "s1":
				if err != nil {
					t.Fatalf("%s is left after %v", e.Name(), err)
				}
			default:
				t.Fatalf("%s was made beside the staging directories", e.Name())
			}
		}
		for _, o := range []string{outside, filepath.Join(base, "outside")} {
			if es, _ := os.ReadDir(o); len(es) > 0 {
				t.Fatalf("%s was written: %v", o, es)
			}
		}
	})
}

// TestWriteFuzzSeeds checks that the seeds are kept in testdata, where
// plain go test runs them through FuzzReceive; with -datacopy.writeseeds
// (go test -run WriteFuzzSeeds -datacopy.writeseeds) it writes them again.
func TestWriteFuzzSeeds(t *testing.T) {
	needRoot(t)
	dir := filepath.Join("testdata", "fuzz", "FuzzReceive")
	if !*writeSeeds {
		for i := range seeds(t) {
			b, err := os.ReadFile(filepath.Join(dir, fmt.Sprintf("seed%d", i)))
			if err != nil || !strings.HasPrefix(string(b), "go test fuzz v1\n") {
				t.Fatalf("seed%d is not kept in %s (%v): go test -run WriteFuzzSeeds -datacopy.writeseeds ./internal/datacopy", i, dir, err)
			}
		}
		return
	}
	must(t, os.MkdirAll(dir, 0o755))
	for i, s := range seeds(t) {
		body := "go test fuzz v1\n[]byte(" + strconv.Quote(string(s)) + ")\n"
		must(t, os.WriteFile(filepath.Join(dir, fmt.Sprintf("seed%d", i)), []byte(body), 0o644))
	}
}
