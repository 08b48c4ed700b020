package reconciler

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// A container with the parent directory mounted writable swaps a FIFO in
// for a file the mesh delivers, between look's stat and its open, and
// holds the FIFO's other end without writing: look says so at once. It
// read the FIFO, and the node's reconcile loop waited, for good.
func TestLookRefusesAFileSwappedForAFIFO(t *testing.T) {
	dir := t.TempDir()
	p := filepath.Join(dir, "config.json")
	if err := os.WriteFile(p, []byte("{}"), 0o644); err != nil {
		t.Fatal(err)
	}
	var writer int = -1
	lookBetween = func(path string) {
		if path != p {
			return
		}
		os.Remove(p)
		if err := unix.Mkfifo(p, 0o644); err != nil {
			t.Error(err)
			return
		}
		fd, err := unix.Open(p, unix.O_RDWR|unix.O_NONBLOCK|unix.O_CLOEXEC, 0) // an end held, nothing written
		if err != nil {
			t.Error(err)
			return
		}
		writer = fd
	}
	t.Cleanup(func() {
		lookBetween = nil
		if writer >= 0 {
			unix.Close(writer)
		}
	})
	done := make(chan error, 1)
	go func() {
		_, err := look(p)
		done <- err
	}()
	select {
	case err := <-done:
		if err == nil || !strings.Contains(err.Error(), "changed while it was read") {
			t.Fatalf("look of a file swapped for a FIFO: %v, want it refused", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("look of a file swapped for a FIFO held open by a writer did not return within 10 s")
	}
}
