package state

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"runtime"
	"runtime/pprof"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"
)

// BenchmarkFleet measures the replicated state of a large fleet: M modules
// over 100 nodes, each module assigned to one node. It reports the time of
// one `module add` command carrying all M; of one assign once the fleet is
// full, composing only the nodes it can change (assign-ms) and, in the same
// run, composing every node as every command did before (full-assign-ms);
// of a `module add` of one module more (add-one-ms, the mean of 20); of a
// `mesh restart` of one module (restart-ms, the mean of 20); the
// plans' and the snapshot's sizes. The assignments before the last 251
// are written straight into the table (applying M assigns one by one would
// take M recomposes); the last 251 go through Apply: one untimed composing
// every node, then 200 incremental and 50 full, and the mean of each kind
// is its assign figure (assign-p50-ms the incremental ones' median).
// bench/scale.sh runs it at several sizes and prints how each figure grows.
func BenchmarkFleet(b *testing.B) {
	defer benchRuns()()
	for _, m := range []int{1000, 2500, 5000, 10000} {
		b.Run(fmt.Sprintf("modules=%d", m), func(b *testing.B) {
			for i := 0; i < b.N; i++ {
				fleet(b, 100, m)
			}
		})
	}
}

// benchFleet is a store for the benchmarks: nodes nodes, then modules
// modules added in one command.
type benchFleet struct {
	s     *Store
	index uint64
	at    time.Time
}

// newBenchFleet makes it and says how long the module add took.
func newBenchFleet(b *testing.B, nodes, modules int) (*benchFleet, time.Duration) {
	return newBenchFleetOf(b, nodes, modules, func(j int) string { return benchModule(fmt.Sprintf("m%05d", j)) })
}

// newBenchFleetOf is newBenchFleet of module j's manifest src(j), named
// m%05d.
func newBenchFleetOf(b *testing.B, nodes, modules int, src func(j int) string) (*benchFleet, time.Duration) {
	f := &benchFleet{s: openStore(b), at: t0}
	f.apply(b, &InitRequest{MeshID: "m-scale", Domain: "internal", Node: Node{Name: "n000", Address: "10.1.0.1", Voter: true}})
	for i := 1; i < nodes; i++ {
		f.apply(b, &NodeAddRequest{Node: Node{Name: fmt.Sprintf("n%03d", i), Address: fmt.Sprintf("10.1.%d.%d", i/250, i%250+1)}})
	}
	var specs []ModuleSpec
	for j := 0; j < modules; j++ {
		specs = append(specs, spec(fmt.Sprintf("m%05d.yaml", j), src(j)))
	}
	return f, f.apply(b, &ModuleAddRequest{Modules: specs})
}

// apply applies r as the next command and says how long it took.
func (f *benchFleet) apply(b *testing.B, r Request) time.Duration {
	f.index++
	f.at = f.at.Add(time.Second)
	start := time.Now()
	if err := f.s.Apply(f.index, encodeAt(r, f.at)); err != nil {
		b.Fatalf("%s: %v", r.Op(), err)
	}
	return time.Since(start)
}

// assignStraight writes the first count modules' assignments (module j on
// node j%nodes) into the table, past the FSM: applying them one by one
// would take count recomposes.
func (f *benchFleet) assignStraight(b *testing.B, nodes, count int) {
	tx, err := f.s.db.Begin()
	if err != nil {
		b.Fatal(err)
	}
	for j := 0; j < count; j++ {
		if err := exec(tx, `INSERT INTO assignments (node, module, seq) VALUES (?, ?, ?)`, fmt.Sprintf("n%03d", j%nodes), fmt.Sprintf("m%05d", j), f.index); err != nil {
			b.Fatal(err)
		}
	}
	if err := tx.Commit(); err != nil {
		b.Fatal(err)
	}
	f.s.assigned, f.s.assignedAt = nil, nil // written past the FSM: what it keeps is not the table
}

func fleet(b *testing.B, nodes, modules int) {
	b.StopTimer()
	f, add := newBenchFleet(b, nodes, modules)
	s, ctx := f.s, context.Background()
	apply := func(r Request) time.Duration { return f.apply(b, r) }
	// 200 incremental assigns (each node's twice), then 50 full ones: the
	// mean of 50 moved by a fifth between runs at 10,000 modules (a
	// collection, a checkpoint falling among them). Each kind starts with
	// the log checkpointed (untimed), as a replica's is within a second of
	// its last commit (checkpoint.go): see BenchmarkFleetProfile's. In
	// three runs without it, the slowest of the 200 at 10,000 modules was
	// 1.4 to 4.2 ms (assign-max-ms), so the commit that copies the log did
	// not fall among them here; the checkpoint keeps it so.
	const incremental, fulls = 200, 50
	const last = incremental + fulls
	f.assignStraight(b, nodes, modules-last-1)
	// The last modules assigned one command each: the first 200 composing
	// only the nodes an assign can change, the last 50 composing every node
	// (as every command did before incremental composition), for the
	// ratio; between them the module adds. Each kind starts after a
	// collection, untimed, so that none pays for the garbage of another
	// (a full assign leaves 100 plans' worth; alternating them made every
	// incremental figure pay part of that).
	check := checkComposition
	checkComposition = false // the package's tests compare; the bench measures
	defer func() { checkComposition, alwaysFull = check, false }()
	assignRange := func(from, to int) (d time.Duration, each []time.Duration) {
		b.StopTimer()
		runtime.GC()
		f.s.checkpoint()
		b.StartTimer()
		for j := from; j < to; j++ {
			one := apply(&AssignRequest{Assignment: Assignment{Node: fmt.Sprintf("n%03d", j%nodes), Module: fmt.Sprintf("m%05d", j)}})
			d += one
			each = append(each, one)
		}
		return d, each
	}
	// First, untimed, one assign composing every node: a replica that has
	// been running keeps each node's last plan encoded (planBody), which
	// the assignments written past the FSM did not give.
	b.StopTimer()
	alwaysFull = true
	apply(&AssignRequest{Assignment: Assignment{Node: fmt.Sprintf("n%03d", (modules-last-1)%nodes), Module: fmt.Sprintf("m%05d", modules-last-1)}})
	alwaysFull = false
	b.StartTimer()
	assign, each := assignRange(modules-last, modules-fulls)
	// One module more, once the fleet is full: the mean of 20 such
	// commands, each its own module (the specs are parsed beforehand, as
	// the proposer parses them).
	const adds = 20
	var extra []ModuleSpec
	b.StopTimer()
	for i := range adds {
		name := fmt.Sprintf("extra%02d", i)
		extra = append(extra, spec(name+".yaml", benchModule(name)))
	}
	runtime.GC()
	f.s.checkpoint()
	b.StartTimer()
	var one time.Duration
	for _, sp := range extra {
		one += apply(&ModuleAddRequest{Modules: []ModuleSpec{sp}})
	}
	one /= adds
	// A command scoped to one module (`mesh restart`; a pull, a secret's
	// value, a rollout's step are scoped alike): the mean of 20, each its
	// own module.
	b.StopTimer()
	runtime.GC()
	f.s.checkpoint()
	b.StartTimer()
	var restart time.Duration
	for i := range adds {
		restart += apply(&ModuleRestartRequest{Module: fmt.Sprintf("m%05d", i)})
	}
	restart /= adds
	alwaysFull = true
	full, _ := assignRange(modules-fulls, modules)
	alwaysFull = false
	b.StopTimer()
	var planBytes, names int
	s.db.QueryRow(`SELECT sum(length(body)) FROM plans p WHERE version = (SELECT max(version) FROM plans WHERE node = p.node)`).Scan(&planBytes)
	s.db.QueryRow(`SELECT count(*) FROM roster`).Scan(&names)
	var snap bytes.Buffer
	if err := s.WriteSnapshot(ctx, &snap); err != nil {
		b.Fatal(err)
	}
	if names < modules {
		b.Fatalf("%d names in the roster for %d assigned modules", names, modules)
	}
	b.ReportMetric(float64(add.Milliseconds()), "module-add-ms")
	b.ReportMetric(float64(one.Microseconds())/1000, "add-one-ms")
	b.ReportMetric(float64(restart.Microseconds())/1000, "restart-ms")
	b.ReportMetric(float64(assign.Microseconds())/incremental/1000, "assign-ms")
	slices.Sort(each)
	b.ReportMetric(float64(each[len(each)/2].Microseconds())/1000, "assign-p50-ms")
	b.ReportMetric(float64(each[len(each)-1].Microseconds())/1000, "assign-max-ms")
	b.ReportMetric(float64(full.Microseconds())/fulls/1000, "full-assign-ms")
	b.ReportMetric(float64(planBytes)/1e6, "plans-MB")
	b.ReportMetric(float64(snap.Len())/1e6, "snapshot-MB")
}

// BenchmarkAssignSmallMesh is bench/multi.sh's workload in the FSM alone:
// three nodes, 100 modules with one route each, assigned one at a time to
// the second node. It is the CPU each replica spends per assign.
func BenchmarkAssignSmallMesh(b *testing.B) {
	defer benchRuns()()
	for i := 0; i < b.N; i++ {
		b.StopTimer()
		s := openStore(b)
		at := t0
		index := uint64(0)
		apply := func(r Request) {
			index++
			at = at.Add(time.Second)
			if err := s.Apply(index, encodeAt(r, at)); err != nil {
				b.Fatalf("%s: %v", r.Op(), err)
			}
		}
		apply(&InitRequest{MeshID: "m-small", Domain: "internal", Node: Node{Name: "n1", Address: "10.1.0.1", Voter: true}})
		apply(&NodeAddRequest{Node: Node{Name: "n2", Address: "10.1.0.2", Voter: true}})
		apply(&NodeAddRequest{Node: Node{Name: "n3", Address: "10.1.0.3", Voter: true}})
		var specs []ModuleSpec
		for j := 0; j < 100; j++ {
			name := fmt.Sprintf("bedb%04d", j)
			specs = append(specs, spec(name+".yaml", "module: "+name+"\n"))
		}
		apply(&ModuleAddRequest{Modules: specs})
		b.StartTimer()
		for j := 0; j < 100; j++ {
			apply(&AssignRequest{Assignment: Assignment{Node: "n2", Module: fmt.Sprintf("bedb%04d", j)}})
		}
	}
}

// BenchmarkFleetProfile is one kind of command, b.N times, in a full fleet
// of MESH_PROFILE_MODULES modules (10,000 unless set) over 100 nodes, for a
// CPU profile of what it costs once the fleet is built (the set-up is
// outside the timer):
//
//	MESH_PROFILE_OP=assign go test -run '^$' -bench FleetProfile -benchtime 1000x -cpuprofile cpu.prof ./state/
//
// assign: each op assigns one of the last 1,000 modules (half of them
// below 2,000 modules; at most that many ops); add: each op is a module add of one new module (its parse, the
// proposer's work, is in the loop too); add-hosts: the same with a public
// host on its route, which makes the command of the format that checks the
// rule on host names in the FSM (edgeFormat).
func BenchmarkFleetProfile(b *testing.B) {
	defer benchRuns()()
	m, _ := strconv.Atoi(os.Getenv("MESH_PROFILE_MODULES"))
	if m == 0 {
		m = 10000
	}
	left := min(1000, m/2) // the modules assigned one command each
	f, _ := newBenchFleet(b, 100, m)
	f.assignStraight(b, 100, m-left-1)
	check := checkComposition
	checkComposition = false // the package's tests compare; the bench measures
	defer func() { checkComposition, alwaysFull = check, false }()
	// One assign composing every node first, as in BenchmarkFleet: without
	// it the first command on each node encoded its whole plan, a tenth of
	// 1,000 assigns, which a running replica does not (it kept p90 at 10 ms).
	alwaysFull = true
	f.apply(b, &AssignRequest{Assignment: Assignment{Node: fmt.Sprintf("n%03d", (m-left-1)%100), Module: fmt.Sprintf("m%05d", m-left-1)}})
	alwaysFull = false
	runtime.GC()
	// The log checkpointed (untimed), as a replica's is within a second of
	// its last commit (checkpoint.go). The set-up writes about 11,000 pages
	// of log at 10,000 modules and the timed commands follow at once:
	// without it, the commit that took the log past walAutoCheckpoint, and
	// copied it all, was op 339 of every run, at 120 to 290 ms: from
	// 0.24 to 0.58 ms on the mean of 500.
	f.s.checkpoint()
	op := os.Getenv("MESH_PROFILE_OP")
	add, hosts := op == "add" || op == "add-hosts", op == "add-hosts"
	if !add && b.N > left {
		b.Fatalf("at most %d assigns (-benchtime %dx)", left, left)
	}
	var ds []time.Duration
	// The timed commands carry a label, so a profile can leave the set-up
	// out: go tool pprof -tagfocus phase=timed ...
	defer pprof.SetGoroutineLabels(context.Background())
	pprof.SetGoroutineLabels(pprof.WithLabels(context.Background(), pprof.Labels("phase", "timed")))
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		if add {
			name := fmt.Sprintf("x%05d", i)
			src := benchModule(name)
			if hosts {
				src = strings.Replace(src, "port: 80}", "port: 80, hosts: ["+name+".example.org]}", 1)
			}
			sp := spec(name+".yaml", src)
			if v := NewCommand(&ModuleAddRequest{Modules: []ModuleSpec{sp}}).V; hosts && v < edgeFormat {
				b.Fatalf("a module add with a host is of format %d, before the rule's (%d)", v, edgeFormat)
			}
			ds = append(ds, f.apply(b, &ModuleAddRequest{Modules: []ModuleSpec{sp}}))
			continue
		}
		j := m - left + i
		ds = append(ds, f.apply(b, &AssignRequest{Assignment: Assignment{Node: fmt.Sprintf("n%03d", j%100), Module: fmt.Sprintf("m%05d", j)}}))
	}
	b.StopTimer()
	// The applies alone (the timer also counts an add's parse).
	slices.Sort(ds)
	at := func(q float64) float64 { return float64(ds[int(q*float64(len(ds)-1))].Microseconds()) / 1000 }
	b.ReportMetric(at(0.5), "apply-p50-ms")
	b.ReportMetric(at(0.9), "apply-p90-ms")
	b.ReportMetric(at(0.99), "apply-p99-ms")
}
