package cluster

import (
	"context"
	"fmt"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"
)

// Issue 9, in one process: three nodes on 127.0.0.1 join, are promoted,
// forward writes to the leader, refuse a removal that would leave no
// majority, and go on through a leadership change during writes: every
// acknowledged write is on every surviving replica.
func TestThreeNodes(t *testing.T) {
	ctx := context.Background()
	nodes, dirs := threeMembers(t)
	a := nodes["ace"]
	defer func() {
		for _, m := range nodes {
			if m != nil {
				m.Stop()
			}
		}
	}()
	eventually := func(what string, within time.Duration, ok func() bool) {
		t.Helper()
		for deadline := time.Now().Add(within); !ok(); time.Sleep(50 * time.Millisecond) {
			if time.Now().After(deadline) {
				t.Fatalf("%s: not within %s", what, within)
			}
		}
	}
	eventually("three voters", 30*time.Second, func() bool { v, _ := a.Node.Voters(); return v == 3 })

	// Forwarding: a write on a follower is applied by the leader, and the
	// follower reads it at once (read your writes).
	if _, err := nodes["g14"].Node.Propose(ctx, addModule(t, "f.yaml", "module: fwd\nresources:\n  - directory: /srv/fwd\n")); err != nil {
		t.Fatalf("write through a follower: %v", err)
	}
	if _, err := nodes["g14"].Store.Module(ctx, "fwd"); err != nil {
		t.Fatalf("the follower does not read its own write: %v", err)
	}

	// Quorum guard: with one follower stopped, removing the other would
	// leave one reachable voter of two.
	leaderOf := func() string {
		for name, m := range nodes {
			if m != nil && m.Node.State() == "Leader" {
				return name
			}
		}
		return ""
	}
	stopped := ""
	for name, m := range nodes {
		if m.Node.State() != "Leader" {
			stopped = name
			break
		}
	}
	nodes[stopped].Stop()
	nodes[stopped] = nil
	var last error
	eventually("the removal refused for lack of a majority", 30*time.Second, func() bool {
		l := leaderOf()
		if l == "" {
			return false
		}
		for name, m := range nodes {
			if m != nil && name != l {
				_, last = nodes[l].Node.RemoveNode(ctx, name, false)
			}
		}
		t.Logf("leader %q: %v", l, last)
		return last != nil && strings.Contains(last.Error(), "less than the 2 a majority needs")
	})
	if v, _ := a.Node.Voters(); v != 3 {
		t.Fatalf("a refused removal changed the voters: %d", v)
	}
	nodes[stopped] = startAgent(t, dirs[stopped])

	// Leadership change during writes: writes go through novox while the
	// leader is stopped; each acknowledged one must be on every replica
	// that remains, and writes resume once a new leader is elected.
	// The writer is a follower, so its writes are forwarded, and it stays.
	var writer *Member
	for _, m := range nodes {
		if m.Node.State() != "Leader" {
			writer = m
			break
		}
	}
	var mu sync.Mutex
	acked := []string{}
	failed := 0
	done := make(chan struct{})
	go func() {
		defer close(done)
		for i := 0; i < 40; i++ {
			name := fmt.Sprintf("m%d", i)
			wctx, cancel := context.WithTimeout(ctx, 20*time.Second)
			_, err := writer.Node.Propose(wctx, addModule(t, name+".yaml", "module: "+name+"\nresources:\n  - directory: /srv/"+name+"\n"))
			cancel()
			mu.Lock()
			if err == nil {
				acked = append(acked, name)
			} else {
				failed++
				t.Logf("write %s: %v", name, err)
			}
			mu.Unlock()
		}
	}()
	eventually("writes under way", 20*time.Second, func() bool { mu.Lock(); defer mu.Unlock(); return len(acked) >= 5 })
	leader := leaderOf()
	if leader == "" {
		t.Fatal("no leader")
	}
	nodes[leader].Stop()
	nodes[leader] = nil
	<-done
	if len(acked) < 30 {
		t.Fatalf("only %d of 40 writes acknowledged through a leadership change (%d failed)", len(acked), failed)
	}
	for name, m := range nodes {
		if m == nil {
			continue
		}
		eventually(name+" holds every acknowledged write", 20*time.Second, func() bool {
			for _, mod := range acked {
				if _, err := m.Store.Module(ctx, mod); err != nil {
					return false
				}
			}
			return true
		})
	}
	t.Logf("leader %s stopped mid-way: %d writes acknowledged, %d failed", leader, len(acked), failed)
}

// threeMembers starts ace, which leads, and joins novox and g14 through it
// (127.0.0.1, .2, .3): the members by name, and their data dirs. The caller
// stops them.
func threeMembers(t testing.TB) (map[string]*Member, map[string]string) {
	t.Helper()
	ctx := context.Background()
	dirA := initDir(t, LogStoreWAL)
	a := startAgent(t, dirA)
	waitLeader(t, a)
	// The join secret is sealed to the voters: the first node opens it.
	token := joinToken(t, a)
	nodes := map[string]*Member{"ace": a}
	dirs := map[string]string{"ace": dirA}
	for i, name := range []string{"novox", "g14"} {
		d := filepath.Join(t.TempDir(), name)
		if err := Join(ctx, JoinConfig{DataDir: d, Peer: fmt.Sprintf("127.0.0.1:%d", a.ID.Port), Token: token, Name: name, Address: fmt.Sprintf("127.0.0.%d", i+2), Port: freePort(t)}); err != nil {
			t.Fatal(err)
		}
		nodes[name], dirs[name] = startAgent(t, d), d
	}
	return nodes, dirs
}
