package safefs

import (
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// A link at any component is refused and named, for opening and writing.
func TestLinksAreRefusedAtEveryComponent(t *testing.T) {
	root := t.TempDir()
	outside := t.TempDir()
	os.WriteFile(filepath.Join(outside, "f"), []byte("outside"), 0o644)
	os.MkdirAll(filepath.Join(root, "a"), 0o755)
	os.Symlink(outside, filepath.Join(root, "a", "link"))
	os.Symlink(filepath.Join(outside, "f"), filepath.Join(root, "a", "flink"))

	for _, p := range []string{filepath.Join(root, "a", "link", "f"), filepath.Join(root, "a", "flink")} {
		_, err := Open(p, os.O_RDONLY)
		var le *LinkError
		if !errors.As(err, &le) || !errors.Is(err, ErrLink) || !strings.Contains(err.Error(), "symbolic link") {
			t.Fatalf("open %s: %v", p, err)
		}
	}
	dfd, _, err := OpenParent(filepath.Join(root, "a", "link", "new"))
	if err == nil || !strings.Contains(err.Error(), filepath.Join(root, "a", "link")+" is a symbolic link") {
		t.Fatalf("open parent through a link: fd %d, %v", dfd, err)
	}
	if b, _ := os.ReadFile(filepath.Join(outside, "f")); string(b) != "outside" {
		t.Fatal("outside changed")
	}
}

// WriteAt replaces atomically, leaves no temp file, and sets the mode.
func TestWriteFile(t *testing.T) {
	p := filepath.Join(t.TempDir(), "f")
	for _, c := range []string{"one", "two"} {
		if err := WriteFile(p, []byte(c), 0o600); err != nil {
			t.Fatal(err)
		}
		if b, _ := os.ReadFile(p); string(b) != c {
			t.Fatalf("holds %q", b)
		}
	}
	fi, _ := os.Stat(p)
	if fi.Mode().Perm() != 0o600 {
		t.Fatalf("mode %v", fi.Mode())
	}
	entries, _ := os.ReadDir(filepath.Dir(p))
	if len(entries) != 1 {
		t.Fatalf("temp files left: %v", entries)
	}
	// The last component is never followed: a link there is replaced, its
	// target untouched.
	target := filepath.Join(t.TempDir(), "target")
	os.WriteFile(target, []byte("target"), 0o644)
	os.Remove(p)
	os.Symlink(target, p)
	if err := WriteFile(p, []byte("new"), 0o600); err != nil {
		t.Fatal(err)
	}
	if b, _ := os.ReadFile(target); string(b) != "target" {
		t.Fatal("the link's target was written")
	}
}

// What the CLI reads is a regular file within its bound: a FIFO does not
// block it, a device does not feed it without end, a large file is not read.
func TestReadRegular(t *testing.T) {
	dir := t.TempDir()
	fifo := filepath.Join(dir, "fifo")
	if err := unix.Mkfifo(fifo, 0o600); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { _, err := ReadRegular(fifo, 1<<20); done <- err }()
	select {
	case err := <-done:
		if err == nil || !strings.Contains(err.Error(), "not a regular file") {
			t.Fatalf("a FIFO: %v", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("reading a FIFO blocked")
	}
	if _, err := ReadRegular("/dev/zero", 1<<20); err == nil || !strings.Contains(err.Error(), "not a regular file") {
		t.Fatalf("/dev/zero: %v", err)
	}
	big := filepath.Join(dir, "big")
	os.WriteFile(big, make([]byte, 2048), 0o600)
	if _, err := ReadRegular(big, 1024); !errors.Is(err, ErrTooLarge) {
		t.Fatalf("a file over the bound: %v", err)
	}
	if b, err := ReadRegular(big, 4096); err != nil || len(b) != 2048 {
		t.Fatalf("a file within it: %d %v", len(b), err)
	}
}

// ReadFile reads the mesh's own regular files, never through a link at
// the last component, and never past its bound.
func TestReadFile(t *testing.T) {
	dir := t.TempDir()
	p := filepath.Join(dir, "f")
	if err := os.WriteFile(p, []byte("hello"), 0o600); err != nil {
		t.Fatal(err)
	}
	if b, err := ReadFile(p, 16); err != nil || string(b) != "hello" {
		t.Fatalf("ReadFile: %q %v", b, err)
	}
	if _, err := ReadFile(p, 4); !errors.Is(err, ErrTooLarge) {
		t.Fatalf("over the bound: %v", err)
	}
	link := filepath.Join(dir, "link")
	os.Symlink(p, link)
	var le *LinkError
	if _, err := ReadFile(link, 16); !errors.As(err, &le) {
		t.Fatalf("through a link: %v", err)
	}
	if _, err := ReadFile(dir, 16); err == nil {
		t.Fatal("a directory was read")
	}
}

// SweepAt takes exactly WriteAt's temp names for the name it is given,
// the short form for a name too long to carry.
func TestSweepAtTakesWriteAtsTempNames(t *testing.T) {
	dir := t.TempDir()
	long := strings.Repeat("n", 250)
	for _, tc := range []struct {
		name, entry string
		want        bool
	}{
		{"f", ".f.mesh-0123456789ab", true},
		{"f", ".f.mesh-0123456789a", false},
		{"f", ".f.mesh-0123456789abc", false},
		{"f", ".f.mesh-0123456789aB", false},
		{"f", ".g.mesh-0123456789ab", false},
		{"f", "f.mesh-0123456789ab", false},
		{long, ".mesh-0123456789ab", true},
		{long, "." + long[:240] + ".mesh-0123456789ab", false},
		// Names of 237 to 248 bytes: WriteAt's long form would pass 255,
		// so it takes the short one (a review found them missed).
		{long[:236], "." + long[:236] + ".mesh-0123456789ab", true},
		{long[:237], ".mesh-0123456789ab", true},
		{long[:248], ".mesh-0123456789ab", true},
		{long[:249], ".mesh-0123456789ab", true},
	} {
		if got := isTempOf(tc.entry, tc.name); got != tc.want {
			t.Errorf("isTempOf(%q, %.10q...) = %v", tc.entry, tc.name, got)
		}
		if tc.want && !isTempOf(tempName(tc.name, "0123456789ab"), tc.name) {
			t.Errorf("WriteAt's own temp name for %.10q... is not taken", tc.name)
		}
	}
	// In a directory: the leftover goes, the file and the rest stay.
	for _, n := range []string{"f", ".f.mesh-0123456789ab", ".f.mesh-zzzzzzzzzzzz", "g"} {
		os.WriteFile(filepath.Join(dir, n), []byte("x"), 0o600)
	}
	dfd, err := OpenDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(dfd)
	if n, err := SweepAt(dfd, "f"); n != 1 || err != nil {
		t.Fatalf("SweepAt: %d, %v", n, err)
	}
	left, _ := os.ReadDir(dir)
	var names []string
	for _, e := range left {
		names = append(names, e.Name())
	}
	if strings.Join(names, " ") != ".f.mesh-zzzzzzzzzzzz f g" {
		t.Fatalf("left: %v", names)
	}
}

// SweepTemps takes every name WriteAt's temp files have, for any file,
// and nothing else: not the files, not a directory or a link of that
// form, not names that only look alike.
func TestSweepTempsTakesOnlyWriteAtsTemps(t *testing.T) {
	long := strings.Repeat("n", 250)
	for _, tc := range []struct {
		entry string
		want  bool
	}{
		{".node.key.mesh-0123456789ab", true},
		{".mesh-0123456789ab", true},
		{"..x.mesh-0123456789ab", true},
		{tempName("ledger.json", "a0b1c2d3e4f5"), true},
		{tempName(long, "a0b1c2d3e4f5"), true},
		{"..mesh-0123456789ab", false},
		{"node.key.mesh-0123456789ab", false},
		{".node.key.mesh-0123456789a", false},
		{".node.key.mesh-0123456789abc", false},
		{".node.key.mesh-0123456789aB", false},
		{".node.key-mesh-0123456789ab", false},
		{"mesh-0123456789ab", false},
		{".mesh-", false},
		{"state.db", false},
	} {
		if got := isTemp(tc.entry); got != tc.want {
			t.Errorf("isTemp(%.40q) = %v", tc.entry, got)
		}
	}
	dir := t.TempDir()
	files := []string{"node.key", ".node.key.mesh-0123456789ab", ".mesh-a0b1c2d3e4f5", "ledger.json", ".ledger.json.mesh-zzzzzzzzzzzz"}
	for _, n := range files {
		if err := os.WriteFile(filepath.Join(dir, n), []byte("secret"), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	os.Mkdir(filepath.Join(dir, ".d.mesh-0123456789ab"), 0o700)
	outside := filepath.Join(t.TempDir(), "kept")
	os.WriteFile(outside, []byte("x"), 0o600)
	os.Symlink(outside, filepath.Join(dir, ".l.mesh-0123456789ab"))
	removed, err := SweepTemps(dir)
	if err != nil {
		t.Fatal(err)
	}
	slices.Sort(removed)
	if want := []string{".mesh-a0b1c2d3e4f5", ".node.key.mesh-0123456789ab"}; !slices.Equal(removed, want) {
		t.Fatalf("removed %q, want %q", removed, want)
	}
	left, _ := os.ReadDir(dir)
	var names []string
	for _, e := range left {
		names = append(names, e.Name())
	}
	if want := []string{".d.mesh-0123456789ab", ".l.mesh-0123456789ab", ".ledger.json.mesh-zzzzzzzzzzzz", "ledger.json", "node.key"}; !slices.Equal(names, want) {
		t.Fatalf("left %q, want %q", names, want)
	}
	if _, err := os.Stat(outside); err != nil {
		t.Fatalf("the link's target: %v", err)
	}
	if _, err := SweepTemps(filepath.Join(dir, "missing")); err == nil {
		t.Fatal("a missing dir swept without an error")
	}
}
