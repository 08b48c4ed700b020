package integration

import (
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

const crashMod = `module: bedcrash
resources:
  - directory: {{root}}/bedcrash
    mode: "0755"
  - directory: {{root}}/bedcrash/data
    mode: "0777"
  - directory: {{root}}/bedcrash/www
    mode: "0755"
  - file: {{root}}/bedcrash/www/index.html
    mode: "0644"
    content: "{{v}}"
  - file: {{root}}/bedcrash/conf
    mode: "0644"
    content: "{{v}}"
  - step: init
    image: localhost/mesh-bed-busybox:1
    command: ["sh", "-c", "sleep 0.3; cat /conf >> /data/steps.log; echo >> /data/steps.log"]
    mounts: ["{{root}}/bedcrash/data:/data", "{{root}}/bedcrash/conf:/conf:ro"]
    restart-on: [{{root}}/bedcrash/conf]
  - container: bedcrash.web
    image: localhost/mesh-bed-busybox:1
    command: ["sh", "-c", "trap 'exit 0' TERM; httpd -f -p 18471 -h /www & wait"]
    ports: ["18471:18471"]
    mounts: ["{{root}}/bedcrash/www:/www:ro"]
    restart-on: [{{root}}/bedcrash/www/index.html]
  - container: bedcrash.worker
    image: localhost/mesh-bed-busybox:1
    command: ["sh", "-c", "trap 'exit 0' TERM; while true; do sleep 1; done"]
    mounts: ["{{root}}/bedcrash/data:/data"]
    restart-on: [init]
`

// The containers end on SIGTERM (a shell as PID 1 ignores it otherwise, and
// each replacement would wait out Podman's 10 s stop timeout).

// TestCrashBed kills the agent with SIGKILL at 20 points of an apply (a
// growing delay after the change is committed), restarts it, and checks the
// node converges, the step ran exactly once per input change, and an
// unassign then leaves no path the mesh created.
func TestCrashBed(t *testing.T) {
	h := newHost(t, false)
	srv := filepath.Join(h.dir, "srv")
	a := h.newAgent(t)
	mod := func(v string) string { return a.manifest("bedcrash", crashMod, map[string]string{"v": v}) }
	a.mesh("module", "add", mod("v0"))
	a.mesh("assign", "ace", "bedcrash")
	want := []string{}
	points := 20
	if n, err := strconv.Atoi(os.Getenv("MESH_CRASH_POINTS")); err == nil {
		points = n
	}
	for i := 0; i < points; i++ {
		t0 := time.Now()
		v := "v" + string(rune('a'+i))
		if i == 0 {
			v = "v0"
		} else {
			a.mesh("module", "add", mod(v))
		}
		want = append(want, v)
		delay := time.Duration(i) * 180 * time.Millisecond
		time.Sleep(delay) // the kill point: how far into the apply the agent gets
		a.cmd.Process.Signal(syscall.SIGKILL)
		a.cmd.Wait()
		a.cmd = nil
		a.start()
		started := time.Since(t0)
		a.waitConverged(t, "after a kill at "+delay.String())
		t.Logf("kill %d at %s: agent ready after %s, converged after %s; re-attached to a step: %v", i, delay, started.Round(time.Millisecond), time.Since(t0).Round(time.Millisecond), strings.Contains(a.log(), "re-attached"))
		b, _ := os.ReadFile(srv + "/bedcrash/data/steps.log")
		got := strings.Fields(string(b))
		if strings.Join(got, " ") != strings.Join(want, " ") {
			t.Fatalf("kill %d (%s into the apply): the step ran for %v, want once for each of %v\n%s", i, delay, got, want, a.log())
		}
		eventually(t, 20*time.Second, "web serves "+v, func() (bool, string) {
			body, err := httpGet("127.0.0.1:18471")
			return err == nil && strings.HasSuffix(body, v), body + errString(err)
		})
	}
	// The step's own output is the operator's to clean; then unassign leaves
	// nothing the mesh created.
	os.Remove(srv + "/bedcrash/data/steps.log")
	a.mesh("unassign", "ace", "bedcrash", "--wait")
	if exists(srv + "/bedcrash") {
		entries, _ := filepath.Glob(srv + "/bedcrash/*")
		t.Fatalf("unassign left %s: %v", srv+"/bedcrash", entries)
	}
	for _, c := range []string{"bedcrash.web", "bedcrash.worker", "bedcrash.init"} {
		if h.containerID(c) != "" {
			t.Fatalf("container %s left", c)
		}
	}
}

// waitConverged waits until the node applied its latest plan without error.
func (a *agent) waitConverged(t *testing.T, what string) {
	t.Helper()
	eventually(t, 90*time.Second, "converged "+what, func() (bool, string) {
		for _, n := range a.status().Nodes {
			if n.Name == a.name {
				if n.Report == nil {
					return false, "no report"
				}
				return n.Report.Version >= n.PlanVersion && n.Report.Error == "", n.Report.Error
			}
		}
		return false, "node missing"
	})
}
