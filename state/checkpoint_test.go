package state

import (
	"testing"
	"time"
)

// walFrames checkpoints what it can and says how many frames the log held:
// what the commits before left there.
func walFrames(t *testing.T, s *Store) int {
	t.Helper()
	var busy, frames, copied int
	if err := s.db.QueryRow(`PRAGMA wal_checkpoint(PASSIVE)`).Scan(&busy, &frames, &copied); err != nil {
		t.Fatal(err)
	}
	return frames
}

// writeLog commits about 6 MB (1,500 pages), then one small row: a commit
// that checkpointed at SQLite's default 1,000 pages would leave the log
// restarted, holding only the small one.
func writeLog(t *testing.T, s *Store) {
	t.Helper()
	for _, q := range []string{`CREATE TABLE IF NOT EXISTS wal_test (x BLOB)`, `INSERT INTO wal_test VALUES (zeroblob(6000000))`, `INSERT INTO wal_test VALUES (1)`} {
		if _, err := s.db.Exec(q); err != nil {
			t.Fatal(err)
		}
	}
}

// A commit does not checkpoint at 1,000 pages: the goroutine does, later.
func TestCommitsLeaveCheckpointsToTheGoroutine(t *testing.T) {
	defer func(d time.Duration) { checkpointEvery = d }(checkpointEvery)
	checkpointEvery = time.Hour
	s := openStore(t)
	var idx uint64
	mustApply(t, s, &idx, &InitRequest{MeshID: "m-ckpt", Domain: "internal", Node: Node{Name: "ace", Address: "10.0.0.1"}})
	writeLog(t, s)
	if n := walFrames(t, s); n < 1400 {
		t.Fatalf("the log held %d frames after 6 MB of commits: a commit checkpointed", n)
	}
	s.mu.Lock()
	runs := s.ckptRuns
	s.mu.Unlock()
	if runs != 0 {
		t.Fatalf("the goroutine checkpointed %d times within its hour", runs)
	}
}

// The goroutine checkpoints what the applies committed, soon after.
func TestCheckpointsFollowApplies(t *testing.T) {
	defer func(d time.Duration) { checkpointEvery = d }(checkpointEvery)
	checkpointEvery = 10 * time.Millisecond
	s := openStore(t)
	writeLog(t, s) // past the FSM: no signal
	var idx uint64
	mustApply(t, s, &idx, &InitRequest{MeshID: "m-ckpt", Domain: "internal", Node: Node{Name: "ace", Address: "10.0.0.1"}})
	deadline := time.Now().Add(20 * time.Second)
	for {
		s.mu.Lock()
		runs, frames := s.ckptRuns, s.ckptFrames
		s.mu.Unlock()
		if runs > 0 {
			if frames < 1400 {
				t.Fatalf("the goroutine's checkpoint copied %d frames, not the 6 MB committed", frames)
			}
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("no checkpoint within 20 s of an apply")
		}
		time.Sleep(5 * time.Millisecond)
	}
}
