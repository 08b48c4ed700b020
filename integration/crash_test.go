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

const crashMod = `module: {{name}}
resources:
  - directory: {{root}}/{{name}}
    mode: "0755"
  - directory: {{root}}/{{name}}/data
    mode: "0777"
  - directory: {{root}}/{{name}}/www
    mode: "0755"
  - file: {{root}}/{{name}}/www/index.html
    mode: "0644"
    content: "{{v}}"
  - file: {{root}}/{{name}}/conf
    mode: "0644"
    content: "{{v}}"
  - step: init
    image: localhost/mesh-bed-busybox:1
    command: ["sh", "-c", "sleep 0.3; cat /conf >> /data/steps.log; echo >> /data/steps.log"]
    mounts: ["{{root}}/{{name}}/data:/data", "{{root}}/{{name}}/conf:/conf:ro"]
    restart-on: [{{root}}/{{name}}/conf]
  - container: {{name}}.web
    image: localhost/mesh-bed-busybox:1
    command: ["sh", "-c", "trap 'exit 0' TERM; httpd -f -p {{port}} -h /www & wait"]
    ports: ["{{port}}:{{port}}"]
    mounts: ["{{root}}/{{name}}/www:/www:ro"]
    restart-on: [{{root}}/{{name}}/www/index.html]
  - container: {{name}}.worker
    image: localhost/mesh-bed-busybox:1
    command: ["sh", "-c", "trap 'exit 0' TERM; while true; do sleep 1; done"]
    mounts: ["{{root}}/{{name}}/data:/data"]
    restart-on: [init]
`

// The containers end on SIGTERM (a shell as PID 1 ignores it otherwise, and
// each replacement would wait out Podman's 10 s stop timeout).

// TestCrashBed kills the agent with SIGKILL at 20 points of an apply (a
// growing delay after the change is committed), restarts it, and checks the
// node converges, the step ran exactly once per input change, and an
// unassign then leaves no path the mesh created. Each change is to two
// unrelated modules in one command, so the kills land while both apply at
// once (reconciler/modules.go).
func TestCrashBed(t *testing.T) {
	h := newHost(t, false)
	srv := filepath.Join(h.dir, "srv")
	a := h.newAgent(t)
	mods := map[string]string{"bedcrash": "18471", "bedcrash2": "18472"}
	mod := func(v string) []string {
		var files []string
		for _, name := range sortedKeys(mods) {
			files = append(files, a.manifest(name, crashMod, map[string]string{"v": v, "name": name, "port": mods[name]}))
		}
		return files
	}
	a.mesh(append([]string{"module", "add"}, mod("v0")...)...)
	a.mesh("assign", "ace", "bedcrash")
	a.mesh("assign", "ace", "bedcrash2")
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
			a.mesh(append([]string{"module", "add"}, mod(v)...)...)
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
		for _, name := range sortedKeys(mods) {
			b, _ := os.ReadFile(srv + "/" + name + "/data/steps.log")
			got := strings.Fields(string(b))
			if strings.Join(got, " ") != strings.Join(want, " ") {
				t.Fatalf("kill %d (%s into the apply): %s's step ran for %v, want once for each of %v\n%s", i, delay, name, got, want, a.log())
			}
			eventually(t, 20*time.Second, name+"'s web serves "+v, func() (bool, string) {
				body, err := httpGet("127.0.0.1:" + mods[name])
				return err == nil && strings.HasSuffix(body, v), body + errString(err)
			})
		}
	}
	// The step's own output is the operator's to clean; then unassign leaves
	// nothing the mesh created.
	for _, name := range sortedKeys(mods) {
		os.Remove(srv + "/" + name + "/data/steps.log")
		a.mesh("unassign", "ace", name, "--wait")
		if exists(srv + "/" + name) {
			entries, _ := filepath.Glob(srv + "/" + name + "/*")
			t.Fatalf("unassign left %s: %v", srv+"/"+name, entries)
		}
		for _, c := range []string{name + ".web", name + ".worker", name + ".init"} {
			if h.containerID(c) != "" {
				t.Fatalf("container %s left", c)
			}
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
