package cluster

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/hashicorp/raft"

	"mesh/internal/seal"
	"mesh/state"
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

// snapshotsOf lists the data dir's Raft snapshots, newest first, and the
// damaged ones set aside.
func snapshotsOf(t *testing.T, dir string) (snaps []*raft.SnapshotMeta, aside []string) {
	t.Helper()
	fs, err := raft.NewFileSnapshotStore(filepath.Join(dir, RaftDir, "snapshots"), 3, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	if snaps, err = fs.List(); err != nil {
		t.Fatal(err)
	}
	aside, _ = filepath.Glob(filepath.Join(dir, RaftDir, "snapshots", "damaged-*"))
	return snaps, aside
}

// truncateNewestSnapshot cuts the newest snapshot's state in half, as a
// disk that lost its tail would, and says which it was.
func truncateNewestSnapshot(t *testing.T, dir string) string {
	t.Helper()
	snaps, _ := snapshotsOf(t, dir)
	if len(snaps) == 0 {
		t.Fatal("no snapshot")
	}
	p := filepath.Join(dir, RaftDir, "snapshots", "snapshots", snaps[0].ID, "state.bin")
	fi, err := os.Stat(p)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.Truncate(p, fi.Size()/2); err != nil {
		t.Fatal(err)
	}
	return snaps[0].ID
}

// A Raft snapshot damaged on disk is found at start (its CRC is read), not
// the day a follower needs it: set aside when the node can do without it,
// else named with the ways out.
func TestDamagedSnapshotIsFoundAtStart(t *testing.T) {
	modules := func(t *testing.T, m *Member) []string {
		infos, err := m.Store.Modules(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		var names []string
		for _, i := range infos {
			names = append(names, i.Name)
		}
		return names
	}
	// setup proposes one module, snapshots, and does that again for each
	// more; after says whether one more command follows the last
	// snapshot.
	setup := func(t *testing.T, more int, after bool) string {
		dir := initDir(t, LogStoreWAL)
		a := startAgent(t, dir)
		waitLeader(t, a)
		for i := 0; i <= more; i++ {
			if _, err := a.Node.Propose(context.Background(), addModule(t, fmt.Sprintf("m%d.yaml", i), fmt.Sprintf("module: m%d\n", i))); err != nil {
				t.Fatal(err)
			}
			if err := a.Node.Snapshot(); err != nil {
				t.Fatal(err)
			}
		}
		if after {
			if _, err := a.Node.Propose(context.Background(), addModule(t, "last.yaml", "module: last\n")); err != nil {
				t.Fatal(err)
			}
		}
		a.Stop()
		return dir
	}

	// The log holds the entry the replica stands at: a snapshot is
	// written there from state.db, holding the state, and the node goes on.
	for _, tc := range []struct {
		name        string
		more        int
		after       bool
		snaps       int      // listed after the start
		held, later []string // the modules the new snapshot holds; then all
	}{
		{"written again from state.db", 0, false, 1, []string{"m0"}, []string{"m0", "next"}},
		{"after more commands", 1, true, 2, []string{"last", "m0", "m1"}, []string{"last", "m0", "m1", "next"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := setup(t, tc.more, tc.after)
			damaged := truncateNewestSnapshot(t, dir)
			a := startAgent(t, dir)
			defer a.Stop()
			snaps, aside := snapshotsOf(t, dir)
			if len(aside) != 1 || filepath.Base(aside[0]) != "damaged-"+damaged || len(snaps) != tc.snaps || snaps[0].ID == damaged {
				t.Fatalf("snapshots %v, aside %v (damaged %s)", snaps, aside, damaged)
			}
			// The snapshot written again reads back whole and holds the
			// state at the index its meta says.
			fs, _ := raft.NewFileSnapshotStore(filepath.Join(dir, RaftDir, "snapshots"), 3, io.Discard)
			_, rc, err := fs.Open(snaps[0].ID)
			if err != nil {
				t.Fatal(err)
			}
			fresh, err := state.Open(filepath.Join(t.TempDir(), "state.db"))
			if err != nil {
				t.Fatal(err)
			}
			defer fresh.Close()
			if err := fresh.Restore(context.Background(), rc); err != nil {
				t.Fatal(err)
			}
			rc.Close()
			if applied, _ := fresh.AppliedIndex(); applied != snaps[0].Index {
				t.Fatalf("the snapshot written again is at %d, its meta says %d", applied, snaps[0].Index)
			}
			if got := modules(t, &Member{Store: fresh}); !slices.Equal(got, tc.held) {
				t.Fatalf("the snapshot written again holds %v", got)
			}
			waitLeader(t, a)
			if _, err := a.Node.Propose(context.Background(), addModule(t, "next.yaml", "module: next\n")); err != nil {
				t.Fatal(err)
			}
			if got := modules(t, a); !slices.Equal(got, tc.later) {
				t.Fatalf("modules after the snapshot was written again: %v", got)
			}
		})
	}
}

// When the log no longer holds the entry the replica stands at (a fresh
// replica here), a damaged snapshot gives way to an older intact one whose
// entries after it the log holds; without one the start is refused. A
// meta that cannot be read is damage too (Raft would pass over that
// snapshot in silence), a state that cannot be read for another reason is
// no damage (nothing is set aside), and a log that begins past the newest
// snapshot is refused.
func TestCheckSnapshotsWithoutTheReplicasEntry(t *testing.T) {
	conf := raft.Configuration{Servers: []raft.Server{{ID: "ace", Address: "127.0.0.1:1"}}}
	for _, tc := range []struct {
		name        string
		snapshots   []uint64  // indexes, oldest first; the newest is damaged
		damage      string    // "state" (cut short), "meta", "dir" (state.bin a directory), "" (none)
		first, last uint64    // the log's
		gap         [2]uint64 // entries the log lacks, from and to (a follower's bolt store below a snapshot installed)
		applied     uint64    // the replica's (0: fresh)
		ok          bool
		want        string // in the error; for one that is ok, "written again" (else an older stands in)
	}{
		{"an older snapshot stands in", []uint64{20, 40}, "state", 15, 50, [2]uint64{}, 0, true, ""},
		{"the log starts after the older one", []uint64{20, 40}, "state", 30, 50, [2]uint64{}, 0, false, "CRC"},
		{"the log ends before the damaged one", []uint64{20, 40}, "state", 15, 39, [2]uint64{}, 0, false, "CRC"},
		{"no older snapshot", []uint64{40}, "state", 15, 50, [2]uint64{}, 0, false, "CRC"},
		{"a meta that cannot be read, an older stands in", []uint64{20, 40}, "meta", 15, 50, [2]uint64{}, 0, true, ""},
		{"a meta that cannot be read, the only one", []uint64{150}, "meta", 100, 200, [2]uint64{}, 0, false, "meta.json cannot be read"},
		{"a state that cannot be read otherwise", []uint64{20, 40}, "dir", 15, 50, [2]uint64{}, 0, false, "cannot be read"},
		{"the log begins past the newest snapshot", []uint64{20, 40}, "", 45, 50, [2]uint64{}, 0, false, "begins at entry 45, past its newest snapshot's 40"},
		{"behind three snapshots", []uint64{20, 30, 40}, "state", 10, 39, [2]uint64{}, 12, false, "behind 3 snapshots"},
		// A follower's bolt log with a gap up to a snapshot installed:
		// the configuration is read after the damaged one's index (a read
		// from the log's first entry stopped at the gap, and the older
		// one stood in, on which Raft panicked at start), and no older
		// one stands in across the gap.
		{"a gap below the damaged one, written again", []uint64{5, 20}, "state", 2, 30, [2]uint64{9, 20}, 25, true, "written again"},
		{"a gap after the older one", []uint64{5, 20}, "state", 2, 30, [2]uint64{9, 20}, 0, false, "CRC"},
		{"a gap after the newest snapshot", []uint64{20, 40}, "", 15, 50, [2]uint64{43, 44}, 0, false, "has no entry 43"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			snaps, err := raft.NewFileSnapshotStore(filepath.Join(dir, "snapshots"), 3, io.Discard)
			if err != nil {
				t.Fatal(err)
			}
			ids := makeSnapshots(t, snaps, conf, tc.snapshots...)
			newest := ids[len(ids)-1]
			at := filepath.Join(dir, "snapshots", "snapshots", newest)
			switch tc.damage {
			case "state":
				err = os.Truncate(filepath.Join(at, "state.bin"), 100)
			case "meta":
				err = os.WriteFile(filepath.Join(at, "meta.json"), []byte("{garbage"), 0o600)
			case "dir":
				if err = os.Remove(filepath.Join(at, "state.bin")); err == nil {
					err = os.Mkdir(filepath.Join(at, "state.bin"), 0o700)
				}
			}
			if err != nil {
				t.Fatal(err)
			}
			logs := raft.NewInmemStore()
			for i := tc.first; i <= tc.last; i++ {
				if i < tc.gap[0] || i > tc.gap[1] {
					logs.StoreLog(&raft.Log{Index: i, Term: 2, Type: raft.LogNoop})
				}
			}
			store, err := state.Open(filepath.Join(dir, "state.db"))
			if err != nil {
				t.Fatal(err)
			}
			defer store.Close()
			if tc.applied > 0 {
				c := state.NewCommand(&state.InitRequest{MeshID: "m", Domain: "internal", Node: state.Node{Name: "ace", Address: "127.0.0.1", Voter: true}})
				if err := store.Apply(tc.applied, c.Encode()); err != nil {
					t.Fatal(err)
				}
			}
			err = checkSnapshots(dir, snaps, logs, store, testLogger(t))
			list, _ := snaps.List()
			_, aside := os.Stat(filepath.Join(dir, "snapshots", "damaged-"+newest))
			if tc.ok && tc.want == "written again" {
				if err != nil || aside != nil || len(list) != len(ids) || list[0].Index != tc.applied || list[1].ID != ids[len(ids)-2] {
					t.Fatalf("err %v, set aside: %v, snapshots %d, the newest at %d", err, aside == nil, len(list), list[0].Index)
				}
				return
			}
			if tc.ok {
				if err != nil || aside != nil || len(list) != len(ids)-1 || list[0].ID != ids[len(ids)-2] {
					t.Fatalf("err %v, set aside: %v, snapshots %d", err, aside == nil, len(list))
				}
				return
			}
			if !errors.Is(err, ErrDamaged) || !strings.Contains(err.Error(), tc.want) ||
				!strings.Contains(err.Error(), "mesh join") || !strings.Contains(err.Error(), "snapshot restore") {
				t.Fatalf("a start beside a damaged snapshot it needs: %v", err)
			}
			if tc.damage != "" && !strings.Contains(err.Error(), newest) {
				t.Fatalf("the error does not name the snapshot %s: %v", newest, err)
			}
			if aside == nil {
				t.Fatal("refused, yet the snapshot was set aside")
			}
		})
	}
}

// Two snapshots damaged, the newest's meta and the next one's state, with
// the replica behind both: each is set aside in turn, the second after a
// snapshot written again at the replica's entry, and Raft starts from an
// intact one (before, it started from the second, unchecked).
func TestCheckSnapshotsSetsEveryDamagedOneAside(t *testing.T) {
	dir := t.TempDir()
	snaps, err := raft.NewFileSnapshotStore(filepath.Join(dir, "snapshots"), 3, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	conf := raft.Configuration{Servers: []raft.Server{{ID: "ace", Address: "127.0.0.1:1"}}}
	ids := makeSnapshots(t, snaps, conf, 20, 40, 50)
	at := func(id string) string { return filepath.Join(dir, "snapshots", "snapshots", id) }
	if err := os.WriteFile(filepath.Join(at(ids[2]), "meta.json"), []byte("{garbage"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Truncate(filepath.Join(at(ids[1]), "state.bin"), 100); err != nil {
		t.Fatal(err)
	}
	logs := raft.NewInmemStore()
	for i := uint64(15); i <= 60; i++ {
		logs.StoreLog(&raft.Log{Index: i, Term: 2, Type: raft.LogNoop})
	}
	store, err := state.Open(filepath.Join(dir, "state.db"))
	if err != nil {
		t.Fatal(err)
	}
	defer store.Close()
	c := state.NewCommand(&state.InitRequest{MeshID: "m", Domain: "internal", Node: state.Node{Name: "ace", Address: "127.0.0.1", Voter: true}})
	if err := store.Apply(30, c.Encode()); err != nil {
		t.Fatal(err)
	}
	if err := checkSnapshots(dir, snaps, logs, store, testLogger(t)); err != nil {
		t.Fatal(err)
	}
	for _, id := range ids[1:] {
		if _, err := os.Stat(filepath.Join(dir, "snapshots", "damaged-"+id)); err != nil {
			t.Errorf("%s is not set aside: %v", id, err)
		}
	}
	list, err := snaps.List()
	if err != nil || len(list) == 0 || list[0].Index != 30 {
		t.Fatalf("the snapshots left: %v %v", list, err)
	}
	if _, rc, err := snaps.Open(list[0].ID); err != nil {
		t.Fatalf("the newest left does not read: %v", err)
	} else {
		rc.Close()
	}
}

// makeSnapshots writes a snapshot at each of indexes (term 2, conf as of
// entry 1), oldest first, and returns their IDs.
func makeSnapshots(t *testing.T, snaps *raft.FileSnapshotStore, conf raft.Configuration, indexes ...uint64) []string {
	t.Helper()
	var ids []string
	for _, i := range indexes {
		sink, err := snaps.Create(1, i, 2, conf, 1, peerEncoder{})
		if err != nil {
			t.Fatal(err)
		}
		sink.Write(bytes.Repeat([]byte{byte(i)}, 4096))
		if err := sink.Close(); err != nil {
			t.Fatal(err)
		}
		ids = append(ids, sink.ID())
		time.Sleep(2 * time.Millisecond) // IDs end in the millisecond
	}
	return ids
}

// A bolt log store keeps, on a follower, the entries before a snapshot
// installed past them and appends after it: the gap up to the snapshot's
// index is no damage (Raft never reads it); one past it is.
func TestVerifyLogPassesTheGapBelowTheSnapshot(t *testing.T) {
	logs := raft.NewInmemStore()
	for _, i := range []uint64{1, 2, 3, 4, 5, 11, 12, 13} {
		logs.StoreLog(&raft.Log{Index: i, Term: 2, Type: raft.LogNoop})
	}
	if err := verifyLog(logs, 10); err != nil {
		t.Fatalf("a gap below the snapshot: %v", err)
	}
	if err := verifyLog(logs, 8); !errors.Is(err, ErrDamaged) || !strings.Contains(err.Error(), "entry 9") {
		t.Fatalf("a gap past the snapshot: %v", err)
	}
}

// TestCutSnapshotIsRemovedAtStart: a snapshot a kill cut while Raft wrote
// it (ID.tmp) is removed at the next start; Raft itself never removes one,
// so each such kill kept a copy of the state for good. The intact
// snapshot stays and the node starts from it.
func TestCutSnapshotIsRemovedAtStart(t *testing.T) {
	dir := initDir(t, LogStoreWAL)
	a := startAgent(t, dir)
	waitLeader(t, a)
	if _, err := a.Node.Propose(context.Background(), addModule(t, "m0.yaml", "module: m0\n")); err != nil {
		t.Fatal(err)
	}
	if err := a.Node.Snapshot(); err != nil {
		t.Fatal(err)
	}
	a.Stop()
	before, _ := snapshotsOf(t, dir)
	if len(before) != 1 {
		t.Fatalf("snapshots before: %v", before)
	}
	store := filepath.Join(dir, RaftDir, "snapshots", "snapshots")
	cut := filepath.Join(store, "9-999-1234.tmp")
	if err := os.MkdirAll(cut, 0o700); err != nil {
		t.Fatal(err)
	}
	for _, f := range []string{"state.bin", "meta.json"} {
		if err := os.WriteFile(filepath.Join(cut, f), bytes.Repeat([]byte("x"), 1<<16), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	// A file of that name is no snapshot Raft wrote: left as it is.
	other := filepath.Join(store, "notes.tmp")
	if err := os.WriteFile(other, []byte("mine"), 0o600); err != nil {
		t.Fatal(err)
	}
	a = startAgent(t, dir)
	defer a.Stop()
	if _, err := os.Stat(cut); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("the cut snapshot is still there: %v", err)
	}
	if _, err := os.Stat(other); err != nil {
		t.Fatalf("a file named .tmp was removed: %v", err)
	}
	if after, _ := snapshotsOf(t, dir); len(after) != 1 || after[0].ID != before[0].ID {
		t.Fatalf("snapshots after the start: %v (before %v)", after, before)
	}
	waitLeader(t, a)
	infos, err := a.Store.Modules(context.Background())
	if err != nil || len(infos) != 1 || infos[0].Name != "m0" {
		t.Fatalf("modules after the start: %+v %v", infos, err)
	}
}

// A commit that ends as its node stops tells the others of it after
// Shutdown closed the log: it read the closed log, and raft-wal panicked
// (a unit run of the cluster package died of it). Once stopped, nothing
// is told.
func TestCommitNoticeAfterShutdown(t *testing.T) {
	a := startAgent(t, initDir(t, LogStoreWAL))
	waitLeader(t, a)
	idx, err := a.Node.Propose(context.Background(), addModule(t, "m0.yaml", "module: m0\n"))
	if err != nil {
		t.Fatal(err)
	}
	a.Stop()
	a.Node.logStore = closedLog{t} // what a closed log is to raft-wal
	a.Node.tellCommitted(idx)
}

// closedLog is a log store that is closed: any read fails the test.
type closedLog struct{ t *testing.T }

func (c closedLog) GetLog(index uint64, _ *raft.Log) error {
	c.t.Errorf("the closed log was read at %d", index)
	return errors.New("closed")
}
func (c closedLog) FirstIndex() (uint64, error)      { return 0, errors.New("closed") }
func (c closedLog) LastIndex() (uint64, error)       { return 0, errors.New("closed") }
func (c closedLog) StoreLog(*raft.Log) error         { return errors.New("closed") }
func (c closedLog) StoreLogs([]*raft.Log) error      { return errors.New("closed") }
func (c closedLog) DeleteRange(uint64, uint64) error { return errors.New("closed") }
