package cluster

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"mesh/internal/testutil"
)

// fill writes zeros to path until the filesystem is full, or until it leaves
// keep bytes free.
func fill(t *testing.T, path string, keep uint64) {
	f, err := os.Create(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	buf := make([]byte, 1<<20)
	for {
		if freeBytes(filepath.Dir(path)) <= keep+uint64(len(buf)) {
			if keep == 0 {
				for len(buf) > 0 {
					if _, err := f.Write(buf); err != nil {
						buf = buf[:len(buf)/2]
					}
				}
			}
			f.Sync()
			return
		}
		if _, err := f.Write(buf); err != nil {
			f.Sync()
			return
		}
	}
}

// Issue 9 item 11: with the disk full the agent stays up, reads answer,
// writes fail with "disk full on NODE" (or wait), and everything works again
// once space returns, restart included.
func TestDiskFull(t *testing.T) {
	disk := filepath.Join(t.TempDir(), "disk")
	testutil.Tmpfs(t, disk, "size=192m")
	dir := filepath.Join(disk, "node")
	if err := Init(context.Background(), InitConfig{DataDir: dir, Name: "ace", Address: "127.0.0.1", Port: freePort(t)}); err != nil {
		t.Fatal(err)
	}
	a := startAgent(t, dir)
	waitLeader(t, a)
	ctx := context.Background()
	add := func(text string) error {
		_, err := a.Node.Propose(ctx, addModule(t, "m.yaml", text))
		return err
	}
	if err := add(webManifest); err != nil {
		t.Fatal(err)
	}
	filler := filepath.Join(disk, "filler")

	// Nearly full: the write is refused up front, naming the node.
	fill(t, filler, MinFree/2)
	err := add(dbManifest)
	if !strings.Contains(fmtErr(err), "disk full on ace") {
		t.Fatalf("write on a nearly full disk: %v", err)
	}
	if _, err := a.Store.Settings(ctx); err != nil {
		t.Fatalf("reads with the disk full: %v", err)
	}

	// Full to the last byte, past the up-front check: the write fails with
	// the reason or waits; the agent stays up and answers.
	old := MinFree
	MinFree = 0
	defer func() { MinFree = old }()
	os.Remove(filler)
	fill(t, filler, 0)
	done := make(chan error, 1)
	go func() { done <- add(dbManifest) }()
	select {
	case err := <-done:
		if err != nil && !strings.Contains(fmtErr(err), "disk full on ace") && !strings.Contains(fmtErr(err), "no space") {
			t.Fatalf("write on a full disk: %v", err)
		}
		t.Logf("write on a full disk: %v", err)
	case <-time.After(3 * time.Second):
		t.Log("the write waits for space")
	}
	if _, err := a.Store.Settings(ctx); err != nil {
		t.Fatalf("reads with the disk full: %v", err)
	}
	if ro, err := a.Store.Roster(ctx); err != nil || len(ro) == 0 {
		t.Fatalf("reads with the disk full: %v %v", ro, err)
	}
	// Space returns: writes work again, and so does a restart.
	os.Remove(filler)
	MinFree = old
	select {
	case <-done:
	case <-time.After(60 * time.Second):
		t.Fatal("the waiting write did not finish after space returned")
	}
	if err := add(dbManifest); err != nil {
		t.Fatalf("a write after space returned: %v", err)
	}
	a.Stop()
	a = startAgent(t, dir)
	defer a.Stop()
	waitLeader(t, a)
	mods, _ := a.Store.Modules(ctx)
	if len(mods) != 2 {
		t.Fatalf("modules after restart: %+v", mods)
	}
}

func fmtErr(err error) string {
	if err == nil {
		return "<nil>"
	}
	return err.Error()
}
