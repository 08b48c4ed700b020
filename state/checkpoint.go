package state

import (
	"context"
	"time"
)

// When the write-ahead log is copied into state.db (issue "scale", item 1).
// SQLite checkpoints by default in the commit that takes the log past 1,000
// pages: that commit copies them into the database file and syncs it. At
// 10,000 modules an assign writes enough for that every 60 to 90 commits,
// and those applies took 20 to 30 ms against 4.5 (bench/scale.sh's fleet,
// each apply timed: the spikes went with the checkpoints, and away with
// them). The FSM applies the log one command at a time, so the resolver's
// answer to an assign waited as long. The store checkpoints in a goroutine
// of its own instead: PASSIVE, which waits for no reader or writer, at most
// once every checkpointEvery after a commit (a page that many commits
// changed is copied once). A commit still checkpoints once the log passes
// walAutoCheckpoint pages, should this goroutine fall behind (a burst of
// commits, or a checkpoint that fails on a full disk): the log stays
// bounded as before, only later.
//
// Checkpointing moves nothing that is not durable already: a committed
// transaction is in the log, which a restart (or a kill -9) replays.

const walAutoCheckpoint = 16000 // pages: 64 MB with SQLite's 4 kB pages

// checkpointEvery is how long the goroutine gathers commits before it
// checkpoints them (a var for tests).
var checkpointEvery = time.Second

// startCheckpoints starts the goroutine; Close stops it.
func (s *Store) startCheckpoints() {
	s.ckpt = make(chan struct{}, 1)
	s.ckptStop = make(chan struct{})
	s.ckptDone = make(chan struct{})
	go s.checkpoints(checkpointEvery)
}

// committed tells the goroutine that a commit wrote to the log.
func (s *Store) committed() {
	select {
	case s.ckpt <- struct{}{}:
	default:
	}
}

func (s *Store) checkpoints(every time.Duration) {
	defer close(s.ckptDone)
	for {
		select {
		case <-s.ckptStop:
			return
		case <-s.ckpt:
		}
		t := time.NewTimer(every)
		select {
		case <-s.ckptStop:
			t.Stop()
			return
		case <-t.C:
		}
		s.checkpoint()
	}
}

// checkpoint copies what the log holds into state.db, as far as no reader
// still needs it. A failure (a full disk) is left to the next one, or to
// the commit that passes walAutoCheckpoint.
func (s *Store) checkpoint() {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	var busy, frames, copied int
	err := s.db.QueryRowContext(ctx, `PRAGMA wal_checkpoint(PASSIVE)`).Scan(&busy, &frames, &copied)
	s.mu.Lock()
	s.ckptRuns++
	if err == nil {
		s.ckptFrames = copied
	}
	s.mu.Unlock()
}

// stopCheckpoints stops the goroutine and waits for it: the database is
// closed next.
func (s *Store) stopCheckpoints() {
	if s.ckptStop == nil {
		return
	}
	s.ckptOnce.Do(func() { close(s.ckptStop) })
	<-s.ckptDone
}
