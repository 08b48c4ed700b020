package cluster

import (
	"context"
	"fmt"
	"os"
	"testing"
	"time"
)

// BenchmarkCatchUp is how long a follower stopped for a few seconds (while
// writes go on) takes, once started again, to apply what the leader had
// committed when it started: with the mesh's dial, which waits for a peer
// that refuses (mesh), and with Raft's own behaviour (raft: each refused
// dial fails at once, and Raft's backoff grows up to 10 s). Run by hand:
//
//	go test -run '^$' -bench CatchUp -benchtime 3x ./cluster/
//
// MESH_CATCHUP_DOWN (a Go duration, default 4s) is how long it is down.
func BenchmarkCatchUp(b *testing.B) {
	down := 4 * time.Second
	if d, err := time.ParseDuration(os.Getenv("MESH_CATCHUP_DOWN")); err == nil {
		down = d
	}
	for _, mode := range []struct {
		name  string
		waits bool
	}{{"mesh", true}, {"raft", false}} {
		b.Run(mode.name, func(b *testing.B) {
			dialWaits.Store(mode.waits)
			defer dialWaits.Store(true)
			nodes, dirs := threeMembers(b)
			defer func() {
				for _, m := range nodes {
					m.Stop()
				}
			}()
			ctx := context.Background()
			leader := nodes["ace"]
			deadline := time.Now().Add(30 * time.Second)
			for v, _ := leader.Node.Voters(); v < 3; v, _ = leader.Node.Voters() {
				if time.Now().After(deadline) {
					b.Fatal("three voters not within 30s")
				}
				time.Sleep(50 * time.Millisecond)
			}
			var total, worst time.Duration
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				name := []string{"novox", "g14"}[i%2]
				nodes[name].Stop()
				// Down, under writes.
				for until := time.Now().Add(down); time.Now().Before(until); {
					if _, err := leader.Node.Propose(ctx, addModule(b, "c.yaml", fmt.Sprintf("module: c%d\n", time.Now().UnixNano()%1e9))); err != nil {
						b.Fatal(err)
					}
					time.Sleep(20 * time.Millisecond)
				}
				target := leader.Node.raft.CommitIndex()
				start := time.Now()
				nodes[name] = startAgent(b, dirs[name])
				for {
					if got, _ := nodes[name].Store.AppliedIndex(); got >= target {
						break
					}
					if time.Since(start) > 60*time.Second {
						b.Fatalf("%s did not catch up within 60s", name)
					}
					time.Sleep(5 * time.Millisecond)
				}
				took := time.Since(start)
				total += took
				worst = max(worst, took)
			}
			b.ReportMetric(float64(total.Milliseconds())/float64(b.N), "ms/catchup")
			b.ReportMetric(float64(worst.Milliseconds()), "ms-worst")
		})
	}
}
