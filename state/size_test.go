package state

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"strconv"
	"testing"
	"time"
)

// BenchmarkStateSize is the size of the state (issue "scale", item 4): a
// fleet of MESH_STATE_MODULES modules (10,000) over 100 nodes, each assigned
// to one node, then MESH_STATE_COMMANDS commands (100,000) through Apply:
// pairs of an unassign and the assign back of one module, a different
// module each pair, so that every command makes a new plan version of a
// node and a roster event, as a long-lived fleet's changes do. Under the
// default history bound (mesh init's: 100 versions, 90 days) it reports
// state.db (after a checkpoint of its WAL; the file, what the disk holds)
// and the snapshot before the commands and after them, and logs both at
// every tenth of the way, to show where they level off.
// bench/statesize.sh runs it.
func BenchmarkStateSize(b *testing.B) {
	defer benchRuns()()
	modules, commands := envInt(b, "MESH_STATE_MODULES", 10000), envInt(b, "MESH_STATE_COMMANDS", 100000)
	for i := 0; i < b.N; i++ {
		stateSize(b, 100, modules, commands)
	}
}

func envInt(b *testing.B, key string, def int) int {
	s := os.Getenv(key)
	if s == "" {
		return def
	}
	v, err := strconv.Atoi(s)
	if err != nil || v < 1 {
		b.Fatalf("%s=%q: want a count", key, s)
	}
	return v
}

func stateSize(b *testing.B, nodes, modules, commands int) {
	b.StopTimer()
	f, _ := newBenchFleet(b, nodes, modules)
	s, ctx := f.s, context.Background()
	apply := func(r Request) { f.apply(b, r) }
	node := func(j int) string { return fmt.Sprintf("n%03d", j%nodes) }
	module := func(j int) string { return fmt.Sprintf("m%05d", j) }
	// Every assignment but the last straight into the table, then the last
	// through Apply composing every node: the fleet, full.
	f.assignStraight(b, nodes, modules-1)
	check := checkComposition
	checkComposition = false // the package's tests compare; the bench measures
	defer func() { checkComposition, alwaysFull = check, false }()
	alwaysFull = true
	apply(&AssignRequest{Assignment: Assignment{Node: node(modules - 1), Module: module(modules - 1)}})
	alwaysFull = false

	sizes := func() (db, snap float64) {
		if _, err := s.db.Exec(`PRAGMA wal_checkpoint(TRUNCATE)`); err != nil {
			b.Fatal(err)
		}
		fi, err := os.Stat(s.path)
		if err != nil {
			b.Fatal(err)
		}
		var buf bytes.Buffer
		if err := s.WriteSnapshot(ctx, &buf); err != nil {
			b.Fatal(err)
		}
		return float64(fi.Size()) / 1e6, float64(buf.Len()) / 1e6
	}
	db0, snap0 := sizes()
	b.Logf("modules=%d nodes=%d commands=0 db_mb=%.1f snapshot_mb=%.1f", modules, nodes, db0, snap0)
	start := time.Now()
	b.StartTimer()
	for c := 0; c < commands; c++ {
		j := (c / 2 * 7919) % modules // 7919 is prime: every module in turn
		a := Assignment{Node: node(j), Module: module(j)}
		if c%2 == 0 {
			apply(&UnassignRequest{Assignment: a})
		} else {
			apply(&AssignRequest{Assignment: a})
		}
		if (c+1)%max(commands/10, 1) == 0 && c+1 < commands {
			b.StopTimer()
			db, snap := sizes()
			b.Logf("modules=%d nodes=%d commands=%d db_mb=%.1f snapshot_mb=%.1f ms_per_command=%.1f", modules, nodes, c+1, db, snap, float64(time.Since(start).Milliseconds())/float64(c+1))
			b.StartTimer()
		}
	}
	b.StopTimer()
	elapsed := time.Since(start)
	db, snap := sizes()
	var versions int
	s.db.QueryRow(`SELECT count(*) FROM plans`).Scan(&versions)
	b.Logf("modules=%d nodes=%d commands=%d db_mb=%.1f snapshot_mb=%.1f plan_versions=%d", modules, nodes, commands, db, snap, versions)
	b.ReportMetric(db0, "db-start-MB")
	b.ReportMetric(snap0, "snapshot-start-MB")
	b.ReportMetric(db, "db-MB")
	b.ReportMetric(snap, "snapshot-MB")
	b.ReportMetric(float64(versions), "plan-versions")
	b.ReportMetric(float64(elapsed.Milliseconds())/float64(commands), "ms/command")
}
