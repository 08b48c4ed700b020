package integration

import (
	"fmt"
	"strings"
	"testing"
	"time"
)

const bedHealthy = `module: {{name}}
resources:
  - container: {{name}}.server
    image: localhost/mesh-bed-busybox:1
    command: ["sh", "-c", "touch /tmp/ok; while true; do sleep 1; done"]
    health:
      command: [{{check}}]
      interval: 1s
      retries: 2
      start-period: 2s
`

// Issue 10: containers declare health checks; --wait means healthy; status
// shows what is not; every resolver leaves out an instance that is unhealthy
// or whose node is unreachable, and never answers nothing.
func TestHealthBed(t *testing.T) {
	n, _ := startThree(t)
	hc := n[1].manifest("bedhc", bedHealthy, map[string]string{"name": "bedhc", "check": `"test", "-e", "/tmp/ok"`})
	n[1].mesh("module", "add", hc)
	for _, on := range []string{"n1", "n2"} {
		out := n[1].mesh("assign", on, "bedhc", "--wait")
		if !strings.Contains(out, "healthy: bedhc.server") {
			t.Fatalf("assign %s --wait did not wait for health:\n%s", on, out)
		}
	}
	// module add --wait: a changed check replaces both instances, one node
	// at a time (issue 29: a module with a health check on two nodes rolls
	// out), and the command returns once both checks pass.
	hc = n[1].manifest("bedhc", bedHealthy, map[string]string{"name": "bedhc", "check": `"test", "-f", "/tmp/ok"`})
	if out := n[1].mesh("module", "add", hc, "--wait"); !strings.Contains(out, "healthy: bedhc.server") || !strings.Contains(out, "2/2 nodes, waiting on n2: bedhc.server") ||
		!strings.Contains(out, "done: n1, n2 healthy for 10s") {
		t.Fatalf("module add --wait did not wait for both nodes' checks:\n%s", out)
	}
	n[1].mesh("node", "public-domain", "n3", "bed.example", "--wait")
	answers := func(i int) string { return n[i].resolve("bedhc.internal") }
	has := func(out string, i int) bool {
		return strings.Contains(out, "\tA\t"+n[i].oaddr()+"\n") || strings.HasSuffix(out, "\tA\t"+n[i].oaddr())
	}
	for i := 1; i <= 3; i++ {
		i := i
		eventually(t, 15*time.Second, fmt.Sprintf("n%d answers both healthy instances", i), func() (bool, string) {
			out := answers(i)
			return has(out, 1) && has(out, 2), out
		})
	}

	// n2's instance turns unhealthy from inside its container: left out on
	// every resolver within seconds, and status says so.
	start := time.Now()
	n[2].h.podman("exec", "bedhc.server", "rm", "/tmp/ok")
	for i := 1; i <= 3; i++ {
		i := i
		eventually(t, 20*time.Second, fmt.Sprintf("n%d leaves out the unhealthy instance", i), func() (bool, string) {
			out := answers(i)
			return has(out, 1) && !has(out, 2), out
		})
	}
	t.Logf("unhealthy instance left out on every resolver %s after the check started failing (interval 1s, retries 2)", time.Since(start).Round(100*time.Millisecond))
	if st := n[3].mesh("status"); !strings.Contains(st, "n2: container bedhc.server (bedhc) is unhealthy") {
		t.Fatalf("status does not show the unhealthy container:\n%s", st)
	}
	st := n[3].status()
	found := false
	for _, nd := range st.Nodes {
		if nd.Name == "n2" && nd.Report != nil {
			for _, h := range nd.Report.Health {
				found = found || h.Container == "bedhc.server" && h.Status == "unhealthy"
			}
		}
	}
	if !found {
		t.Fatalf("status --json does not carry n2's unhealthy container: %+v", st.Nodes)
	}

	// n1, whose instance is the healthy one, is killed: with no instance up,
	// every resolver answers all of them, and never nothing.
	n[1].stop()
	deadline := time.Now().Add(15 * time.Second)
	for time.Now().Before(deadline) {
		out := answers(3)
		if !has(out, 1) && !has(out, 2) {
			t.Fatalf("n3 answered no instance with one unhealthy and the other's node killed:\n%s", out)
		}
		time.Sleep(200 * time.Millisecond)
	}
	eventually(t, 10*time.Second, "n3 answers both when none is up", func() (bool, string) {
		out := answers(3)
		return has(out, 1) && has(out, 2), out
	})

	// A container that exits in a loop shows as such in status, with its
	// exit code, the restart count and its last lines.
	crash := n[2].manifest("bedcrash", "module: bedcrash\nresources:\n  - container: bedcrash.server\n    image: localhost/mesh-bed-busybox:1\n    command: [\"sh\", \"-c\", \"echo crashing-now; sleep 1; exit 3\"]\n", nil)
	n[2].mesh("module", "add", crash)
	n[2].mesh("assign", "n3", "bedcrash", "--wait")
	eventually(t, 30*time.Second, "status shows the crash loop", func() (bool, string) {
		st := n[2].mesh("status")
		return strings.Contains(st, "n3: container bedcrash.server (bedcrash) exited with code 3") && strings.Contains(st, "crashing-now") && !strings.Contains(st, "restarted it 0 time(s)"), st
	})

	// --wait on a check that never passes fails within start period +
	// retries x interval and a few seconds, naming the check.
	sick := n[2].manifest("bedsick", bedHealthy, map[string]string{"name": "bedsick", "check": `"false"`})
	n[2].mesh("module", "add", sick)
	start = time.Now()
	out := n[2].meshFails("assign", "n3", "bedsick", "--wait")
	took := time.Since(start)
	if !strings.Contains(out, `bedsick.server on n3 is unhealthy: its health check ["false"] failed`) {
		t.Fatalf("--wait on a failing check:\n%s", out)
	}
	if took > 20*time.Second || took < 3*time.Second {
		t.Fatalf("--wait took %s to fail a check of start period 2s, 2 retries 1s apart (Podman keeps failures within the start period from counting)", took)
	}
	t.Logf("--wait failed %s after the assign (start period 2s + 2 x 1s)", took.Round(100*time.Millisecond))
}
