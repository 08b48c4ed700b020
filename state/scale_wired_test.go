package state

import (
	"context"
	"fmt"
	"os"
	"runtime"
	"runtime/pprof"
	"strconv"
	"testing"
	"time"
)

// wiredModule is module j of a fleet whose modules are wired to each
// other as our users' are: every tenth a database (a provider that accepts
// credentials), each other module binding to the database before it,
// taking a credential from it and reading a secret of its own.
func wiredModule(j int) string {
	name := fmt.Sprintf("m%05d", j)
	if j%10 == 0 {
		return fmt.Sprintf(`module: %[1]s
accepts-credentials: /srv/%[1]s/creds
routes:
  - {name: %[1]s, port: 5432}
resources:
  - directory: /srv/%[1]s
  - directory: /srv/%[1]s/creds
  - container: %[1]s.server
    image: localhost/busybox:1
    mounts: ["/srv/%[1]s:/data"]
`, name)
	}
	return fmt.Sprintf(`module: %[1]s
routes:
  - {name: %[1]s, port: 80}
resources:
  - directory: /srv/%[1]s
  - binding: /srv/%[1]s/db.binding
    provider: m%05[2]d
  - credential: /srv/%[1]s/db.password
    provider: m%05[2]d
  - container: %[1]s.server
    image: localhost/busybox:1
    env-secrets: {API_KEY: api}
    mounts: ["/srv/%[1]s:/data"]
    restart-on: [/srv/%[1]s/db.binding]
`, name, j-j%10)
}

// BenchmarkFleetWired is BenchmarkFleet's assign in a fleet of wired
// modules (wiredModule): each consumer's credential and secret are in
// their tables, so that an input that reads the tables whole reads a row
// of each per module of the fleet, and an assign recomposes the consumer's
// node and its database's (whose accepts-credentials directory now
// receives its credential). The assignments, credentials and secrets
// before the last 251 modules are written straight into the tables; then
// one untimed assign composing every node, 200 assigns composing the nodes
// they can change (50 were too few: one collection of the fleet's heap
// more or less moved their mean by a third), and 50 composing every node:
// the mean of each.
func BenchmarkFleetWired(b *testing.B) {
	defer benchRuns()()
	for _, m := range []int{1000, 10000} {
		b.Run(fmt.Sprintf("modules=%d", m), func(b *testing.B) {
			for i := 0; i < b.N; i++ {
				wiredFleet(b, 100, m)
			}
		})
	}
}

func wiredFleet(b *testing.B, nodes, modules int) {
	b.StopTimer()
	f, _ := newBenchFleetOf(b, nodes, modules, wiredModule)
	inc, full := 200, 50
	if n, _ := strconv.Atoi(os.Getenv("MESH_WIRED_LAST")); n > 0 {
		inc = min(n, modules/2) // for a profile: more assigns
	}
	last := inc + full
	f.assignStraight(b, nodes, modules-last-1)
	tx, err := f.s.db.Begin()
	if err != nil {
		b.Fatal(err)
	}
	for j := 0; j < modules; j++ {
		if j%10 == 0 {
			continue
		}
		c, p := fmt.Sprintf("m%05d", j), fmt.Sprintf("m%05d", j-j%10)
		if err := exec(tx, `INSERT INTO credentials (consumer, provider, secret, digest) VALUES (?, ?, 'x', ?)`, c, p, SecretDigest("x"+c)); err != nil {
			b.Fatal(err)
		}
		if err := exec(tx, `INSERT INTO secrets (module, name, sealed, digest, salt, size, set_at, set_index, recipients) VALUES (?, 'api', 'SEALED', ?, 'salt', 1, '', 1, '')`, c, SecretDigest("api"+c)); err != nil {
			b.Fatal(err)
		}
	}
	if err := tx.Commit(); err != nil {
		b.Fatal(err)
	}
	f.s.inputs = nil // written past the FSM
	check := checkComposition
	checkComposition = false // the package's tests compare; the bench measures
	defer func() { checkComposition, alwaysFull = check, false }()
	assign := func(j int) time.Duration {
		return f.apply(b, &AssignRequest{Assignment: Assignment{Node: fmt.Sprintf("n%03d", j%nodes), Module: fmt.Sprintf("m%05d", j)}})
	}
	alwaysFull = true
	assign(modules - last - 1)
	alwaysFull = false
	var errs int
	f.s.db.QueryRow(`SELECT count(*) FROM nodes WHERE compose_error != ''`).Scan(&errs)
	if errs != 0 {
		var msg string
		f.s.db.QueryRow(`SELECT compose_error FROM nodes WHERE compose_error != '' LIMIT 1`).Scan(&msg)
		b.Fatalf("%d nodes do not compose: %s", errs, msg)
	}
	timedPhase := func() string {
		if alwaysFull {
			return "full"
		}
		return "timed"
	}
	timed := func(from, to int) (d time.Duration) {
		runtime.GC()
		f.s.checkpoint() // as BenchmarkFleetProfile's
		// Labelled, so a profile can leave the set-up out (as
		// BenchmarkFleetProfile's): go tool pprof -tagfocus phase=timed.
		defer pprof.SetGoroutineLabels(context.Background())
		pprof.SetGoroutineLabels(pprof.WithLabels(context.Background(), pprof.Labels("phase", timedPhase())))
		for j := from; j < to; j++ {
			d += assign(j)
		}
		return d / time.Duration(to-from)
	}
	b.StartTimer()
	incMean := timed(modules-last, modules-full)
	alwaysFull = true
	fullMean := timed(modules-full, modules)
	alwaysFull = false
	b.StopTimer()
	b.ReportMetric(float64(incMean.Microseconds())/1000, "assign-ms")
	b.ReportMetric(float64(fullMean.Microseconds())/1000, "full-assign-ms")
}
