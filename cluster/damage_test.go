package cluster

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// Issue 9 item 11: damaged or missing Raft data is named at start with the
// way out; never a panic, never a silent follower.
func TestDamagedRaftDataIsNamed(t *testing.T) {
	for _, tc := range []struct {
		name   string
		damage func(dir string)
	}{
		{"raft dir removed", func(dir string) { os.RemoveAll(filepath.Join(dir, RaftDir)) }},
		{"wal-meta truncated", func(dir string) {
			os.Truncate(filepath.Join(dir, RaftDir, "wal", "wal-meta.db"), 100)
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := initDir(t, LogStoreWAL)
			a := startAgent(t, dir)
			waitLeader(t, a)
			if _, err := a.Node.Propose(context.Background(), addWeb(t)); err != nil {
				t.Fatal(err)
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
