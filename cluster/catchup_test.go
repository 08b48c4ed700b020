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
		for _, victim := range []string{"follower", "leader"} {
			b.Run(mode.name+"/"+victim, func(b *testing.B) {
				dialWaits.Store(mode.waits)
				defer dialWaits.Store(true)
				nodes, dirs := threeMembers(b)
				defer func() {
					for _, m := range nodes {
						m.Stop()
					}
				}()
				deadline := time.Now().Add(30 * time.Second)
				for v, _ := nodes["ace"].Node.Voters(); v < 3; v, _ = nodes["ace"].Node.Voters() {
					if time.Now().After(deadline) {
						b.Fatal("three voters not within 30s")
					}
					time.Sleep(50 * time.Millisecond)
				}
				var total, worst time.Duration
				b.ResetTimer()
				for i := 0; i < b.N; i++ {
					took := catchUp(b, nodes, dirs, victim, i, down)
					total += took
					worst = max(worst, took)
				}
				b.ReportMetric(float64(total.Milliseconds())/float64(b.N), "ms/catchup")
				b.ReportMetric(float64(worst.Milliseconds()), "ms-worst")
			})
		}
	}
}

// catchUp stops a follower (or the leader), writes through a node still up
// for down, starts it again and returns how long it took to apply what was
// committed when it started.
func catchUp(b *testing.B, nodes map[string]*Member, dirs map[string]string, victim string, i int, down time.Duration) time.Duration {
	ctx := context.Background()
	leaderName := func() string {
		for n, m := range nodes {
			if m != nil && m.Node.State() == "Leader" {
				return n
			}
		}
		return ""
	}
	name := leaderName()
	if victim == "follower" {
		for n := range nodes {
			if n != name && (i%2 == 0) == (n < name) {
				name = n
				break
			}
		}
	}
	nodes[name].Stop()
	nodes[name] = nil
	var writer *Member
	for n, m := range nodes {
		if n != name {
			writer = m
		}
	}
	for until := time.Now().Add(down); time.Now().Before(until); {
		// Through a node still up (it forwards to the leader, a new one
		// once elected: a write in the election is retried).
		if _, err := writer.Node.Propose(ctx, addModule(b, "c.yaml", fmt.Sprintf("module: c%d\n", time.Now().UnixNano()%1e9))); err != nil {
			time.Sleep(50 * time.Millisecond)
			continue
		}
		time.Sleep(20 * time.Millisecond)
	}
	l := nodes[leaderName()]
	if l == nil {
		b.Fatal("no leader among the nodes up")
	}
	target := l.Node.raft.CommitIndex()
	start := time.Now()
	nodes[name] = startAgent(b, dirs[name])
	for {
		if got, _ := nodes[name].Store.AppliedIndex(); got >= target {
			return time.Since(start)
		}
		if time.Since(start) > 60*time.Second {
			b.Fatalf("%s did not catch up within 60s", name)
		}
		time.Sleep(5 * time.Millisecond)
	}
}
