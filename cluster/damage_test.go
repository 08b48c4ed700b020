package cluster

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"mesh/internal/seal"
)

// Issue 9 item 11: damaged or missing Raft data is named at start with the
// way out; never a panic, never a silent follower.
func TestDamagedRaftDataIsNamed(t *testing.T) {
	for _, tc := range []struct {
		name     string
		damage   func(dir string)
		snapshot bool
	}{
		{"raft dir removed", func(dir string) { os.RemoveAll(filepath.Join(dir, RaftDir)) }, false},
		{"wal-meta truncated", func(dir string) {
			os.Truncate(filepath.Join(dir, RaftDir, "wal", "wal-meta.db"), 100)
		}, false},
		// Hardening, item 13: rm raft/wal/* beside a snapshot, and 4 KB of
		// garbage over the log's entries.
		{"wal emptied beside a snapshot", func(dir string) {
			files, _ := filepath.Glob(filepath.Join(dir, RaftDir, "wal", "*"))
			for _, f := range files {
				os.Remove(f)
			}
		}, true},
		{"garbage in a segment", func(dir string) {
			segs, _ := filepath.Glob(filepath.Join(dir, RaftDir, "wal", "*.wal"))
			if len(segs) == 0 {
				panic("no wal segment")
			}
			f, err := os.OpenFile(segs[0], os.O_WRONLY, 0)
			if err != nil {
				panic(err)
			}
			garbage := make([]byte, 4096)
			for i := range garbage {
				garbage[i] = byte(i*7 + 1)
			}
			f.WriteAt(garbage, 64)
			f.Close()
		}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := initDir(t, LogStoreWAL)
			a := startAgent(t, dir)
			waitLeader(t, a)
			if _, err := a.Node.Propose(context.Background(), addWeb(t)); err != nil {
				t.Fatal(err)
			}
			if tc.snapshot {
				if err := a.Node.Snapshot(); err != nil {
					t.Fatal(err)
				}
			}
			a.Stop()
			tc.damage(dir)
			_, err := StartMember(MemberConfig{DataDir: dir, Logger: testLogger(t)})
			if !errors.Is(err, ErrDamaged) || !strings.Contains(err.Error(), "mesh join") || !strings.Contains(err.Error(), "snapshot restore") {
				t.Fatalf("start on damaged raft data: %v", err)
			}
		})
	}
}

// Hardening, item 10: a deleted seal.key is named at start with the way
// out, never replaced in silence (on a one-voter mesh a new key would leave
// mesh token failing for good).
func TestMissingSealKeyIsNamed(t *testing.T) {
	dir := initDir(t, LogStoreWAL)
	a := startAgent(t, dir)
	waitLeader(t, a)
	// The node's sealing key reaches the state (init gives it).
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		if me, err := a.Store.Node(context.Background(), "ace"); err == nil && me.SealKey != "" {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the sealing key never reached the state")
		}
	}
	a.Stop()
	if err := os.Remove(filepath.Join(dir, seal.IdentityFile)); err != nil {
		t.Fatal(err)
	}
	_, err := StartMember(MemberConfig{DataDir: dir, Logger: testLogger(t), Version: "test"})
	if err == nil || !strings.Contains(err.Error(), "seal.key is missing") || !strings.Contains(err.Error(), "backup of the data dir") {
		t.Fatalf("a start without seal.key: %v", err)
	}
	if _, err := os.Stat(filepath.Join(dir, seal.IdentityFile)); !os.IsNotExist(err) {
		t.Fatal("a new seal.key was made")
	}
}

// Hardening, item 13: a name changed in node.json is named at start,
// instead of a follower that never finds its place.
func TestRenamedNodeIsNamed(t *testing.T) {
	dir := initDir(t, LogStoreWAL)
	a := startAgent(t, dir)
	waitLeader(t, a)
	a.Stop()
	id, err := ReadIdentity(dir)
	if err != nil {
		t.Fatal(err)
	}
	id.Name = "someone"
	if err := writeIdentity(dir, id); err != nil {
		t.Fatal(err)
	}
	_, err = StartMember(MemberConfig{DataDir: dir, Logger: testLogger(t), Version: "test"})
	if !errors.Is(err, ErrDamaged) || !strings.Contains(err.Error(), `names this node "someone"`) || !strings.Contains(err.Error(), `is for "ace"`) {
		t.Fatalf("a start under another name: %v", err)
	}
}
