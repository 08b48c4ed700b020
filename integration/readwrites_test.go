package integration

import (
	"encoding/json"
	"strings"
	"syscall"
	"testing"
	"time"
)

// Robustness, item 1: a command on a node that just restarted reports on
// the state its own write made, never an older one. An instance of a module
// is unhealthy on n2; n1's agent is killed -9 and started again; then, on
// n1, an assign --wait of that module to n1, whose health check never
// passes, must fail naming the check (before, n1's replica lagged the
// write and the wait reported an older plan applied, exit 0).
func TestWaitReadsItsOwnWrite(t *testing.T) {
	n, _ := startThree(t)
	n[1].mesh("module", "add", n[1].manifest("bedsick", bedHealthy, map[string]string{"name": "bedsick", "check": `"test", "-e", "/tmp/never"`}))
	n[1].mesh("assign", "n2", "bedsick")
	eventually(t, 60*time.Second, "bedsick is unhealthy on n2", func() (bool, string) {
		out := n[1].mesh("status")
		return strings.Contains(out, "container bedsick.server (bedsick) is unhealthy"), out
	})
	kill := func() {
		n[1].cmd.Process.Signal(syscall.SIGKILL)
		n[1].cmd.Wait()
		n[1].cmd = nil
	}
	// n1 (the first leader) goes, comes back as a follower, and goes again
	// for long enough that the leader's replication to it backs off (Raft
	// waits longer after each failure): then it comes back behind.
	kill()
	eventually(t, 30*time.Second, "another node leads", func() (bool, string) {
		var st struct{ Leader string }
		json.Unmarshal([]byte(n[2].mesh("status", "--json")), &st)
		return st.Leader != "" && st.Leader != "n1", st.Leader
	})
	n[1].start()
	kill()
	time.Sleep(8 * time.Second) // the outage whose backoff the restart meets
	n[1].start()
	out := n[1].meshFails("assign", "n1", "bedsick", "--wait", "--timeout", "90s")
	if !strings.Contains(out, "bedsick.server on n1 is unhealthy") || !strings.Contains(out, `["test","-e","/tmp/never"]`) {
		t.Fatalf("assign --wait on the restarted n1:\n%s", out)
	}
	// The plan version it waited for is the one its own write made.
	var idx string
	for _, l := range strings.Split(out, "\n") {
		if strings.HasPrefix(l, "assigned bedsick to n1 (log index ") {
			idx = strings.TrimSuffix(strings.TrimPrefix(l, "assigned bedsick to n1 (log index "), ")")
		}
	}
	if idx == "" || !strings.Contains(out, "waiting for n1 to apply plan v"+idx+" ") {
		t.Fatalf("the wait is not for the plan of its own write (index %q):\n%s", idx, out)
	}
}
