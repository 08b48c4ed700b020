package cluster

import (
	"errors"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
)

// Issue 9 item 8: a second process on a data dir is refused at once, naming
// the holder; the lock goes with the holder.
func TestLockRefusesASecondHolder(t *testing.T) {
	dir := t.TempDir()
	unlock, err := Lock(dir, "agent")
	if err != nil {
		t.Fatal(err)
	}
	_, err = Lock(dir, "agent")
	if !errors.Is(err, ErrLocked) || !strings.Contains(err.Error(), "pid "+strconv.Itoa(os.Getpid())+" (mesh agent) holds "+dir) {
		t.Fatalf("second lock: %v", err)
	}
	unlock()
	if u, err := Lock(dir, "agent"); err != nil {
		t.Fatalf("the lock outlived its holder: %v", err)
	} else {
		u()
	}
	// A second agent on a node's data dir is refused before it opens a store.
	node := initDir(t, LogStoreWAL)
	u, err := Lock(node, "agent")
	if err != nil {
		t.Fatal(err)
	}
	defer u()
	if _, err := StartMember(MemberConfig{DataDir: node, Logger: testLogger(t)}); !errors.Is(err, ErrLocked) {
		t.Fatalf("agent on a locked dir: %v", err)
	}
}

// Issue 9 item 12: a data dir made beforehand with wide modes is tightened.
func TestTighten(t *testing.T) {
	dir := t.TempDir()
	os.Chmod(dir, 0o755)
	os.MkdirAll(filepath.Join(dir, "raft", "wal"), 0o755)
	os.WriteFile(filepath.Join(dir, "state.db"), nil, 0o644)
	os.WriteFile(filepath.Join(dir, "raft", "wal", "seg"), nil, 0o664)
	outside := filepath.Join(t.TempDir(), "outside")
	os.WriteFile(outside, nil, 0o644)
	os.Symlink(outside, filepath.Join(dir, "link"))
	if err := Tighten(dir); err != nil {
		t.Fatal(err)
	}
	for p, want := range map[string]os.FileMode{dir: 0o700, dir + "/raft": 0o700, dir + "/raft/wal": 0o700, dir + "/state.db": 0o600, dir + "/raft/wal/seg": 0o600, outside: 0o644} {
		fi, _ := os.Stat(p)
		if fi.Mode().Perm() != want {
			t.Errorf("%s: %v, want %v", p, fi.Mode().Perm(), want)
		}
	}
}

// A kill -9 in a write of the node's own files leaves a temp file holding
// what was being written (a key); the agent removes it when it starts,
// once it holds the lock, and nothing else.
func TestAgentSweepsTempFilesOfWritesCutShort(t *testing.T) {
	dir := initDir(t, LogStoreWAL)
	left := filepath.Join(dir, ".node.key.mesh-0123456789ab")
	if err := os.WriteFile(left, []byte("-----BEGIN PRIVATE KEY-----"), 0o600); err != nil {
		t.Fatal(err)
	}
	mine := filepath.Join(dir, "notes.mesh-0123456789ab") // not of that form: kept
	if err := os.WriteFile(mine, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	m := startAgent(t, dir)
	defer m.Stop()
	if _, err := os.Stat(left); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("the temp file of a write cut short is still there: %v", err)
	}
	if _, err := os.Stat(mine); err != nil {
		t.Fatalf("a file of another form was removed: %v", err)
	}
	if _, err := ReadIdentity(dir); err != nil {
		t.Fatalf("the node's own files: %v", err)
	}
}
