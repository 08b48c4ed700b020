// Package testutil holds what the in-process tests of several packages
// share (cluster and cluster/api cannot share test files across their
// boundary): a logger that writes to the test's log, a log kept to count
// its lines, a free port, a small tmpfs for tests of a full disk, and a
// directory with a bind mount inside.
package testutil

import (
	"encoding/json"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"golang.org/x/sys/unix"
)

// Log is a logger's output, written from any goroutine, kept for a test
// to read: NewLog's logger writes warn and above to it.
type Log struct {
	mu  sync.Mutex
	out strings.Builder
}

// NewLog is a logger at warn and above and what it wrote.
func NewLog() (*slog.Logger, *Log) {
	l := new(Log)
	return slog.New(slog.NewTextHandler(l, &slog.HandlerOptions{Level: slog.LevelWarn})), l
}

func (l *Log) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.out.Write(p)
}

// String is all it holds.
func (l *Log) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.out.String()
}

// Count is how many times s is in it.
func (l *Log) Count(s string) int { return strings.Count(l.String(), s) }

// Logger logs at warn and above to t's log.
func Logger(t testing.TB) *slog.Logger {
	return slog.New(slog.NewTextHandler(logWriter{t}, &slog.HandlerOptions{Level: slog.LevelWarn}))
}

type logWriter struct{ t testing.TB }

func (w logWriter) Write(p []byte) (int, error) {
	w.t.Log(strings.TrimSpace(string(p)))
	return len(p), nil
}

// FreePort is a TCP port free on 127.0.0.1 at the time of the call, taken
// below the kernel's ephemeral range: a port the kernel hands out could be
// taken as the source port of another test's outgoing connection between
// this call and the caller's bind (a CI run failed so: a node's peer port
// was in use when it started).
func FreePort(t testing.TB) int {
	t.Helper()
	lo, hi := 20000, 32767 // below Linux's default ephemeral range, 32768-60999
	if b, err := os.ReadFile("/proc/sys/net/ipv4/ip_local_port_range"); err == nil {
		var first, last int
		if _, err := fmt.Sscan(string(b), &first, &last); err == nil && first <= hi {
			hi = first - 1
		}
	}
	if hi < lo+100 {
		lo, hi = 1025, 19999
	}
	for range 200 {
		p := lo + rand.IntN(hi-lo+1)
		l, err := net.Listen("tcp", fmt.Sprintf("127.0.0.1:%d", p))
		if err == nil {
			l.Close()
			return p
		}
	}
	t.Fatal("no free TCP port on 127.0.0.1 below the ephemeral range")
	return 0
}

// JSONLines decodes a JSON log of exactly want lines, one object per line,
// failing t if it holds another number of lines or one does not decode.
func JSONLines(t testing.TB, log string, want int) []map[string]any {
	t.Helper()
	lines := strings.Split(strings.TrimSpace(log), "\n")
	if len(lines) != want {
		t.Fatalf("want %d log lines, got %q", want, log)
	}
	out := make([]map[string]any, len(lines))
	for i, l := range lines {
		if err := json.Unmarshal([]byte(l), &out[i]); err != nil {
			t.Fatalf("log line %d is not JSON (%v): %s", i+1, err, l)
		}
	}
	return out
}

// Tmpfs mounts a tmpfs with options (size=64k, nr_inodes=2, ...) on dir,
// made if missing, for tests of a full disk; it is unmounted when the test
// ends. It needs root (contrib/test.sh runs the tests as root).
func Tmpfs(t testing.TB, dir, options string) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Fatal("this test mounts a small tmpfs: run it as root (contrib/test.sh does)")
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	if out, err := exec.Command("mount", "-t", "tmpfs", "-o", options, "tmpfs", dir).CombinedOutput(); err != nil {
		t.Fatalf("mount tmpfs on %s: %v %s", dir, err, out)
	}
	t.Cleanup(func() { exec.Command("umount", "-l", dir).Run() })
}

// BindInside makes, under a temp dir, a directory dir holding a bind mount
// at dir/media of another directory, source, that holds the file photo
// ("keep me"): what a data directory with a media library bound into it
// is, for the tests that must not cross it. Every mount under the temp dir
// is undone when the test ends (wherever a rename moved it). Root only.
func BindInside(t testing.TB) (source, dir string) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Fatal("this test bind-mounts; run it as root (contrib/test.sh does)")
	}
	root := t.TempDir()
	source, dir = filepath.Join(root, "media"), filepath.Join(root, "data")
	for _, d := range []string{source, filepath.Join(dir, "media")} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.WriteFile(filepath.Join(source, "photo"), []byte("keep me"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := unix.Mount(source, filepath.Join(dir, "media"), "", unix.MS_BIND, ""); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		b, _ := os.ReadFile("/proc/self/mountinfo")
		for _, line := range strings.Split(string(b), "\n") {
			if f := strings.Fields(line); len(f) > 4 && strings.HasPrefix(f[4], root+"/") {
				unix.Unmount(f[4], unix.MNT_DETACH)
			}
		}
	})
	return source, dir
}
