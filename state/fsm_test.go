package state

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"syscall"
	"testing"
	"time"

	"mesh/internal/testutil"
)

// Every op is one row of the table, and every reader of it agrees: the
// request its row makes is of that op, goes through NewCommand, Encode,
// Decode and Request as the same type and body in the row's format, and
// applies as a broken rule or a change, never a panic (the apply function
// takes what Request decodes).
func TestEveryOpRoundTrips(t *testing.T) {
	known := []string{OpInit, OpNodeAdd, OpNodeRemove, OpPublicDomain, OpModuleAdd, OpModuleRemove, OpAssign, OpUnassign,
		OpReport, OpTokenRotate, OpRestore, OpModulePull, OpSeal, OpNodeKey, OpNodeCert, OpNodeOverlay,
		OpSecretSet, OpSecretRemove, OpSecretSeal, OpCARotate, OpNodeACME, OpNodeDrain, OpModuleRestart, OpRolloutStep, OpModuleRevert, OpHistoryKeep, OpBackupRepoSet, OpModuleMove, OpMoveStep}
	if len(ops) != len(known) {
		t.Fatalf("the table has %d ops, the constants %d", len(ops), len(known))
	}
	for _, op := range known {
		t.Run(op, func(t *testing.T) {
			def, ok := ops[op]
			if !ok {
				t.Fatalf("%s is not in the table", op)
			}
			if def.format < 3 || def.format > CommandVersion {
				t.Fatalf("format %d, outside 3..%d", def.format, CommandVersion)
			}
			r := def.request()
			if r.Op() != op {
				t.Fatalf("its request says it is a %s", r.Op())
			}
			if def.request() == r {
				t.Fatal("the row gives the same request twice")
			}
			c := NewCommand(r)
			c.Time = t0
			want := def.format
			if x, ok := r.(interface{ formatNeeded() int }); ok {
				want = max(want, x.formatNeeded()) // an init sets the history's bound
			}
			if c.Op != op || c.V != want || c.NeedsVersion() != want {
				t.Fatalf("envelope %s v%d (needs v%d), want %s v%d", c.Op, c.V, c.NeedsVersion(), op, want)
			}
			if (&Command{Op: op}).NeedsVersion() != def.format {
				t.Fatalf("an envelope without a format needs v%d", (&Command{Op: op}).NeedsVersion())
			}
			data := c.Encode()
			back, err := Decode(data)
			if err != nil {
				t.Fatal(err)
			}
			got, err := back.Request()
			if err != nil {
				t.Fatal(err)
			}
			if reflect.TypeOf(got) != reflect.TypeOf(r) || got.Op() != op {
				t.Fatalf("decoded a %T (%s), want a %T", got, got.Op(), r)
			}
			if b, _ := json.Marshal(got); string(b) != string(c.Body) {
				t.Fatalf("the body changed on the way: %s, was %s", b, c.Body)
			}
			s := openStore(t)
			applyAll(t, s, commandLog())
			n := uint64(len(commandLog()) + 1)
			err = s.Apply(n, data)
			var rule *RuleError
			if err != nil && !errors.As(err, &rule) {
				t.Fatalf("applied with %v, neither a broken rule nor nothing", err)
			}
			if i, _ := s.AppliedIndex(); i != n {
				t.Fatalf("applied index %d after applying %d", i, n)
			}
		})
	}
}

// applyOrStop applies data at index and says how it ended: what Apply
// panicked with, or the error it returned. It fails t if the command waits
// as for a full disk.
func applyOrStop(t *testing.T, s *Store, index uint64, data []byte) (stopped any, err error) {
	t.Helper()
	waits := make(chan struct{}, 1)
	s.OnDiskFull = func(uint64) { waits <- struct{}{} }
	done := make(chan struct{})
	go func() {
		defer close(done)
		defer func() { stopped = recover() }()
		err = s.Apply(index, data)
	}()
	select {
	case <-done:
		return stopped, err
	case <-waits:
		t.Fatal("the command waits as for a full disk")
	case <-time.After(20 * time.Second):
		t.Fatal("Apply neither returned nor stopped")
	}
	return nil, nil
}

// An error inside Apply that is not a broken rule stops the node, naming
// the entry: it is never recorded as the command's refusal (another replica
// applied it), never read as "no such row", and a message that merely
// says the disk is full does not make it wait.
func TestIOErrorInApplyStopsTheNode(t *testing.T) {
	for _, tc := range []struct {
		name   string
		damage string
		req    Request
		want   string
	}{
		{"a table the op writes is gone", `DROP TABLE pulls`, &ModulePullRequest{Module: "web"}, "no such table: pulls"},
		{"a table a rule reads is gone", `DROP TABLE nodes`, &UnassignRequest{Assignment: Assignment{Node: "ace", Module: "web"}}, "no such table: nodes"},
		{"composition cannot read", `DROP TABLE bindings`, &AssignRequest{Assignment: Assignment{Node: "novox", Module: "postgres"}}, "no such table: bindings"},
		{"a statement fails saying the disk is full", `CREATE TRIGGER full BEFORE UPDATE ON settings BEGIN SELECT RAISE(ABORT, 'database or disk is full'); END`,
			&TokenRotateRequest{JoinSecret: "new"}, "database or disk is full"},
		{"the database is closed", "", &ReportRequest{Report: Report{Node: "ace", Version: 1, AppliedAt: t0}}, "database is closed"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := openStore(t)
			applyAll(t, s, commandLog())
			before, _ := s.AppliedIndex()
			if tc.damage != "" {
				if _, err := s.db.Exec(tc.damage); err != nil {
					t.Fatal(err)
				}
			} else {
				s.db.Close()
			}
			stopped, err := applyOrStop(t, s, before+1, encodeAt(tc.req, t0))
			if stopped == nil {
				t.Fatalf("Apply returned %v instead of stopping", err)
			}
			msg := fmt.Sprint(stopped)
			if !strings.Contains(msg, fmt.Sprintf("apply log entry %d (%s)", before+1, tc.req.Op())) || !strings.Contains(msg, tc.want) {
				t.Fatalf("stopped with %q, want the entry %d and %q", msg, before+1, tc.want)
			}
			if tc.damage == "" {
				return
			}
			if after, _ := s.AppliedIndex(); after != before {
				t.Fatalf("the applied index moved past the failed command: %d -> %d", before, after)
			}
		})
	}
}

// sqliteFull is a real SQLITE_FULL from the driver: a database whose pages
// may not grow (max_page_count) refusing an insert.
func sqliteFull(t *testing.T) error {
	db, err := sql.Open("sqlite", filepath.Join(t.TempDir(), "full.db"))
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	db.SetMaxOpenConns(1) // max_page_count is the connection's
	if _, err := db.Exec(`CREATE TABLE t (b BLOB)`); err != nil {
		t.Fatal(err)
	}
	if _, err := db.Exec(`PRAGMA max_page_count = 3`); err != nil {
		t.Fatal(err)
	}
	_, err = db.Exec(`INSERT INTO t VALUES (zeroblob(1000000))`)
	if err == nil {
		t.Fatal("the insert past max_page_count succeeded")
	}
	return err
}

// sqliteOther is a real driver error that is not a full disk.
func sqliteOther(t *testing.T) error {
	db, err := sql.Open("sqlite", filepath.Join(t.TempDir(), "other.db"))
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	_, err = db.Exec(`INSERT INTO nosuch VALUES (1)`)
	if err == nil {
		t.Fatal("an insert into no table succeeded")
	}
	return err
}

// A full disk is known by its errno or SQLite's result code, however
// wrapped, and never by what a message says.
func TestIsDiskFull(t *testing.T) {
	full, other := sqliteFull(t), sqliteOther(t)
	for _, tc := range []struct {
		name string
		err  error
		want bool
	}{
		{"ENOSPC", syscall.ENOSPC, true},
		{"a write's ENOSPC, wrapped", fmt.Errorf("store logs: %w", &os.PathError{Op: "write", Path: "/data/wal/00001.wal", Err: syscall.ENOSPC}), true},
		{"SQLITE_FULL", full, true},
		{"SQLITE_FULL, wrapped", fmt.Errorf("apply: %w", fmt.Errorf("exec INSERT: %w", full)), true},
		{"another SQLite error", fmt.Errorf("exec INSERT: %w", other), false},
		{"another errno", &os.PathError{Op: "write", Path: "/data/state.db", Err: syscall.EIO}, false},
		{"SQLite's words only", errors.New("database or disk is full"), false},
		{"the errno's words only", errors.New("write /data/x: no space left on device"), false},
		{"an unrelated error", io.ErrUnexpectedEOF, false},
		{"no error", nil, false},
	} {
		if got := IsDiskFull(tc.err); got != tc.want {
			t.Errorf("%s (%v): IsDiskFull = %v, want %v", tc.name, tc.err, got, tc.want)
		}
	}
}

// fillDisk writes to path until its filesystem has no byte left.
func fillDisk(t *testing.T, path string) {
	t.Helper()
	f, err := os.Create(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	for buf := make([]byte, 1<<16); len(buf) > 0; {
		if _, err := f.Write(buf); err != nil {
			if !errors.Is(err, syscall.ENOSPC) {
				t.Fatal(err)
			}
			buf = buf[:len(buf)/2]
		}
	}
}

// On a real full disk (a small tmpfs) a command waits, whole, and says so
// once; reads answer meanwhile; once there is space it applies as it
// would have.
func TestFullDiskWaitsForSpace(t *testing.T) {
	disk := filepath.Join(t.TempDir(), "disk")
	testutil.Tmpfs(t, disk, "size=8m")
	s := openStoreAt(t, filepath.Join(disk, "state.db"))
	applyAll(t, s, commandLog()[:2])
	old := DiskFullRetry
	DiskFullRetry = 20 * time.Millisecond
	waits := make(chan uint64, 8)
	s.OnDiskFull = func(index uint64) { waits <- index }
	filler := filepath.Join(disk, "filler")
	fillDisk(t, filler)

	// A report too large for the pages the replica already holds.
	// A large report (each of its texts is bounded: many resources).
	big := &ReportRequest{Report: Report{Node: "ace", Version: 1, AppliedAt: t0}}
	for i := 0; i < 256; i++ {
		big.Report.Resources = append(big.Report.Resources, ResourceReport{Name: fmt.Sprint("r", i), Reason: strings.Repeat("x", MaxText)})
	}
	done := make(chan any, 1)
	go func() {
		defer func() {
			if r := recover(); r != nil {
				done <- r
			}
		}()
		done <- s.Apply(3, encodeAt(big, t0))
	}()
	t.Cleanup(func() { DiskFullRetry = old })
	select {
	case i := <-waits:
		if i != 3 {
			t.Fatalf("told of a wait at %d, want 3", i)
		}
	case r := <-done:
		t.Fatalf("the command on a full disk did not wait: %v", r)
	case <-time.After(20 * time.Second):
		t.Fatal("the command on a full disk neither waited nor ended")
	}
	if i, err := s.AppliedIndex(); err != nil || i != 2 {
		t.Fatalf("reads with the disk full: applied %d, %v", i, err)
	}
	if _, err := s.Settings(context.Background()); err != nil {
		t.Fatalf("reads with the disk full: %v", err)
	}
	if err := os.Remove(filler); err != nil {
		t.Fatal(err)
	}
	select {
	case r := <-done:
		if r != nil {
			t.Fatalf("once there was space: %v", r)
		}
	case <-time.After(20 * time.Second):
		t.Fatal("the command still waits with space again")
	}
	if len(waits) != 0 {
		t.Fatalf("told of the wait %d more times", len(waits))
	}
	reps, err := s.Reports(context.Background())
	if err != nil || len(reps["ace"].Resources) != 256 {
		t.Fatalf("the report after the wait: %d resources, %v", len(reps["ace"].Resources), err)
	}
	if i, _ := s.AppliedIndex(); i != 3 {
		t.Fatalf("applied index %d after the wait, want 3", i)
	}
}
