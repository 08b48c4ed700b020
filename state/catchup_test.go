package state

import (
	"errors"
	"sync"
	"testing"
)

// raftLog is commandLog laid out as Raft would hold it: a Raft entry of its
// own (a barrier, a configuration) before every third command.
func raftLog() (entries [][]byte, command []bool) {
	for i, c := range commandLog() {
		if i%3 == 0 {
			entries, command = append(entries, nil), append(command, false)
		}
		entries, command = append(entries, c), append(command, true)
	}
	return entries, command
}

// raftAlone is the replica Raft's Apply alone makes of the log.
func raftAlone(t *testing.T, entries [][]byte, command []bool) string {
	ref := openStore(t)
	for i, e := range entries {
		if command[i] {
			ref.Apply(uint64(i+1), e)
		}
	}
	return dumpJSON(t, ref)
}

// CatchUp applies what a leader's notice says is committed, from the log;
// Raft's own Apply of the same entries afterwards changes nothing, and the
// replica ends as one that only Raft fed. A hole in the log stops it there,
// and a replica too far behind is left to Raft.
func TestCatchUpThenRaftApply(t *testing.T) {
	entries, command := raftLog()
	want := raftAlone(t, entries, command)

	s := openStore(t)
	hole := uint64(0)
	entry := func(i uint64) ([]byte, bool, error) {
		if i == 0 || i > uint64(len(entries)) || i == hole {
			return nil, false, errors.New("not in the log")
		}
		return entries[i-1], command[i-1], nil
	}
	last := uint64(len(entries))
	hole = last - 2
	n, err := s.CatchUp(last, entry)
	if err == nil {
		t.Fatal("a hole in the log did not stop the catch-up")
	}
	if got, _ := s.AppliedIndex(); got >= hole || got == 0 {
		t.Fatalf("applied up to %d with a hole at %d (%d commands)", got, hole, n)
	}
	hole = 0
	if _, err := s.CatchUp(last, entry); err != nil {
		t.Fatal(err)
	}
	if got, _ := s.AppliedIndex(); got != last {
		t.Fatalf("caught up to %d, want %d", got, last)
	}
	changed := s.Changed()
	for i, e := range entries {
		if command[i] {
			if err := s.Apply(uint64(i+1), e); err != nil {
				t.Fatalf("Raft's apply of %d after the catch-up: %v", i+1, err)
			}
		}
	}
	select {
	case <-changed:
		t.Fatal("Raft's apply of entries already caught up changed the replica")
	default:
	}
	if got := dumpJSON(t, s); got != want {
		t.Fatalf("caught up then applied:\n%s\nwant (Raft alone):\n%s", got, want)
	}

	far := openStore(t)
	if n, err := far.CatchUp(maxCatchUp+1, func(uint64) ([]byte, bool, error) { return nil, false, nil }); n != 0 || err != nil {
		t.Fatalf("a replica %d entries behind caught up %d (%v); Raft brings it up", maxCatchUp+1, n, err)
	}
}

// Raft's Apply and catch-ups from notices run at once on a follower: every
// command applies exactly once, in order, whoever gets there first.
func TestCatchUpRacesRaftApply(t *testing.T) {
	entries, command := raftLog()
	want := raftAlone(t, entries, command)
	for round := 0; round < 10; round++ {
		s := openStore(t)
		var wg sync.WaitGroup
		wg.Add(2)
		go func() {
			defer wg.Done()
			for i, e := range entries {
				if command[i] {
					s.Apply(uint64(i+1), e)
				}
			}
		}()
		go func() {
			defer wg.Done()
			for upTo := uint64(round%3 + 1); upTo <= uint64(len(entries)); upTo += 2 {
				s.CatchUp(upTo, func(i uint64) ([]byte, bool, error) { return entries[i-1], command[i-1], nil })
			}
		}()
		wg.Wait()
		if got := dumpJSON(t, s); got != want {
			t.Fatalf("round %d: the replica differs from Raft's alone:\n%s\nwant:\n%s", round, got, want)
		}
	}
}
