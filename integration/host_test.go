package integration

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

const bedApp = `module: bedapp
resources:
  - directory: {{root}}/bedapp
    mode: "0755"
  - directory: {{root}}/bedapp/data
    owner: "1000:1000"
    mode: "0750"
  - directory: {{root}}/bedapp/www
    mode: "0755"
  - file: {{root}}/bedapp/www/index.html
    mode: "0644"
    content: "{{page}}"
  - binding: {{root}}/bedapp/db.binding
    provider: {{provider}}
  - step: init
    image: localhost/mesh-bed-busybox:1
    command: ["sh", "-c", "{{stepcmd}}"]
    mounts: ["{{root}}/bedapp/data:/data", "{{root}}/bedapp/db.binding:/db.binding:ro"]
    restart-on: [{{root}}/bedapp/db.binding]
  - container: bedapp.web
    image: localhost/mesh-bed-busybox:1
    command: ["httpd", "-f", "-p", "{{port}}", "-h", "/www"]
    ports: ["{{port}}:{{port}}"]
    mounts: ["{{root}}/bedapp/www:/www:ro"]
    restart-on: [{{root}}/bedapp/www/index.html]
  - container: bedapp.worker
    image: localhost/mesh-bed-busybox:1
    command: ["sh", "-c", "while true; do sleep 1; done"]
    mounts: ["{{root}}/bedapp/data:/data"]
    restart-on: [init]
`

const bedProvider = `module: {{name}}
resources:
  - directory: {{root}}/{{name}}
`

const stepOK = "echo run >> /data/step.log; cp /db.binding /data/seen.binding"

type status struct {
	Nodes []struct {
		Name         string `json:"name"`
		ComposeError string `json:"compose_error"`
		PlanVersion  int    `json:"plan_version"`
		Report       *struct {
			Version   int    `json:"version"`
			Error     string `json:"error"`
			Mutations int    `json:"mutations"`
			Resources []struct {
				Kind, Name, Outcome, Reason string
			} `json:"resources"`
			Health []struct {
				Container string `json:"container"`
				Status    string `json:"status"`
				Output    string `json:"output"`
			} `json:"health"`
		} `json:"report"`
	} `json:"nodes"`
}

func (a *agent) status() status {
	var st status
	if err := json.Unmarshal([]byte(a.mesh("status", "--json")), &st); err != nil {
		a.h.t.Fatal(err)
	}
	return st
}

// outcome is what this node's last report says of a resource.
func (a *agent) outcome(name string) (outcome, reason string) {
	for _, n := range a.status().Nodes {
		if n.Name != a.name || n.Report == nil {
			continue
		}
		for _, r := range n.Report.Resources {
			if r.Name == name {
				return r.Outcome, r.Reason
			}
		}
	}
	return "", ""
}

func TestHostRootful(t *testing.T)  { testHost(t, false) }
func TestHostRootless(t *testing.T) { testHost(t, true) }

func testHost(t testing.TB, rootless bool) {
	h := newHost(t, rootless)
	srv := filepath.Join(h.dir, "srv")
	a := h.newAgent(t)
	port := freePort(t)
	vars := map[string]string{"page": "v1", "provider": "bedpga", "stepcmd": stepOK, "port": port}
	app := func() string { return a.manifest("bedapp", bedApp, vars) }
	a.mesh("module", "add",
		a.manifest("bedpga", bedProvider, map[string]string{"name": "bedpga"}),
		a.manifest("bedpgb", bedProvider, map[string]string{"name": "bedpgb"}), app())
	a.mesh("assign", "ace", "bedpga", "--wait")
	a.mesh("assign", "ace", "bedpgb", "--wait")

	// 1. Everything is made, in order, as declared.
	out := a.mesh("assign", "ace", "bedapp", "--wait", "--timeout", "2m")
	for _, want := range []string{"step bedapp.init (bedapp): ran", "container bedapp.web (bedapp): created", "directory " + srv + "/bedapp/data (bedapp): created"} {
		if !strings.Contains(out, want) {
			t.Fatalf("assign --wait output lacks %q:\n%s", want, out)
		}
	}
	var st syscall.Stat_t
	if err := syscall.Stat(srv+"/bedapp/data", &st); err != nil || int(st.Uid) != h.hostID(1000) || st.Mode&0o7777 != 0o750 {
		t.Fatalf("data dir: uid %d (want %d) mode %o, %v", st.Uid, h.hostID(1000), st.Mode&0o7777, err)
	}
	eventually(t, 20*time.Second, "bedapp.web serves the page", func() (bool, string) {
		body, err := httpGet("127.0.0.1:" + port)
		return err == nil && strings.HasSuffix(body, "v1"), body + errString(err)
	})
	web, worker := h.containerID("bedapp.web"), h.containerID("bedapp.worker")
	if web == "" || worker == "" {
		t.Fatal("containers missing")
	}
	// Out of memory, the kernel ends a container's process before the
	// agent's, Podman's or sshd's (each at 0): rootful and rootless.
	if adj := h.oomScoreAdj("bedapp.web"); adj != "1000" {
		t.Fatalf("bedapp.web (no memory limit) has oom_score_adj %s, want 1000", adj)
	}
	// The next pass changes nothing: zero mutations, same IDs, no rerun.
	_, mutations, calls := a.nextApply(a.logLen())
	if mutations != 0 {
		t.Fatalf("a no-op apply made %d mutations (%d podman calls)\n%s", mutations, calls, a.log())
	}
	if h.containerID("bedapp.web") != web || h.containerID("bedapp.worker") != worker {
		t.Fatal("a no-op apply replaced a container")
	}
	if b, _ := os.ReadFile(srv + "/bedapp/data/step.log"); string(b) != "run\n" {
		t.Fatalf("step ran %q times", b)
	}

	// mesh exec (issue 29), here rootful and rootless: the exit code, the
	// streams, stdin and a terminal.
	checkExec(t, a, "bedapp.worker")

	// 2. The page changes: only the container naming it is replaced.
	vars["page"] = "v2"
	a.mesh("module", "add", app())
	a.mesh("assign", "ace", "bedapp", "--wait")
	if o, r := a.outcome("bedapp.web"); o != "replaced" || r != "restart-on: "+srv+"/bedapp/www/index.html changed" {
		t.Fatalf("web: %s; %s", o, r)
	}
	if h.containerID("bedapp.worker") != worker {
		t.Fatal("worker replaced by a change it does not read")
	}
	web = h.containerID("bedapp.web")

	// 3. The binding the step reads carries another provider: the step runs
	// again and the worker naming it is recreated after it, in one apply.
	vars["provider"] = "bedpgb"
	a.mesh("module", "add", app())
	a.mesh("assign", "ace", "bedapp", "--wait")
	if o, r := a.outcome("bedapp.init"); o != "ran" || r != "restart-on: "+srv+"/bedapp/db.binding changed" {
		t.Fatalf("step: %s; %s", o, r)
	}
	if o, r := a.outcome("bedapp.worker"); o != "replaced" || r != "step init ran" {
		t.Fatalf("worker: %s; %s", o, r)
	}
	if b, _ := os.ReadFile(srv + "/bedapp/data/seen.binding"); !strings.Contains(string(b), "provider=bedpgb") {
		t.Fatalf("the step saw %q", b)
	}
	if h.containerID("bedapp.web") != web {
		t.Fatal("web replaced by a change it does not read")
	}
	worker = h.containerID("bedapp.worker")
	if _, mutations, _ := a.nextApply(a.logLen()); mutations != 0 {
		t.Fatalf("the apply after the step made %d mutations", mutations)
	}

	// 4. A step that exits 1: nothing after it is made, status says so; fixed, it converges.
	vars["stepcmd"] = "echo cannot reach the database; exit 1"
	a.mesh("module", "add", app())
	out = a.meshFails("assign", "ace", "bedapp", "--wait")
	if !strings.Contains(out, "exited with code 1") || !strings.Contains(out, "cannot reach the database") {
		t.Fatalf("failed step: %s", out)
	}
	if h.containerID("bedapp.worker") != worker {
		t.Fatal("the worker after a failed step was touched")
	}
	if s := a.mesh("status"); !strings.Contains(s, "apply failed") {
		t.Fatalf("status hides the failure:\n%s", s)
	}
	// The failed run's lines, from mesh logs MODULE.STEP.
	if o, e, code := a.meshRun(nil, "logs", "bedapp.init"); code != 0 || o != "cannot reach the database\n" {
		t.Fatalf("logs of the failed step: %d %q %q", code, o, e)
	}
	vars["stepcmd"] = stepOK + "; true"
	a.mesh("module", "add", app())
	a.mesh("assign", "ace", "bedapp", "--wait")
	if o, _ := a.outcome("bedapp.worker"); o != "replaced" {
		t.Fatalf("after the fix the worker is %q", o)
	}

	// An agent restart changes nothing: same containers, no step rerun.
	web, worker = h.containerID("bedapp.web"), h.containerID("bedapp.worker")
	steps, _ := os.ReadFile(srv + "/bedapp/data/step.log")
	a.stop()
	a.start()
	if _, mutations, _ := a.nextApply(0); mutations != 0 {
		t.Fatalf("the first apply after a restart made %d mutations", mutations)
	}
	if h.containerID("bedapp.web") != web || h.containerID("bedapp.worker") != worker {
		t.Fatal("a restart replaced a container")
	}
	if b, _ := os.ReadFile(srv + "/bedapp/data/step.log"); string(b) != string(steps) {
		t.Fatal("a restart reran the step")
	}

	// 5. Podman goes away: the agent reports, retries, converges when it is back.
	h.stopService()
	vars["page"] = "v3"
	a.mesh("module", "add", app())
	eventually(t, 30*time.Second, "status shows the Podman failure", func() (bool, string) {
		s := a.mesh("status")
		return strings.Contains(s, "apply failed") && strings.Contains(s, "Podman"), s
	})
	h.startService()
	eventually(t, 60*time.Second, "the agent converges after Podman is back", func() (bool, string) {
		body, err := httpGet("127.0.0.1:" + port)
		return err == nil && strings.HasSuffix(body, "v3"), body + errString(err)
	})

	// 6. A link to /etc planted inside a declared directory, and a foreign
	// file: unassign removes what the mesh wrote and keeps the rest.
	etcBefore := statOf(t, "/etc")
	os.Symlink("/etc", srv+"/bedapp/data/etc")
	os.WriteFile(srv+"/bedapp/data/user.db", []byte("precious"), 0o600)
	a.mesh("unassign", "ace", "bedapp", "--wait")
	if o, r := a.outcome(srv + "/bedapp/data"); o != "kept" || !strings.Contains(r, "the mesh did not put there") {
		t.Fatalf("data dir: %s; %s", o, r)
	}
	if o, _ := a.outcome(srv + "/bedapp/www/index.html"); o != "removed" {
		t.Fatalf("index.html: %s", o)
	}
	if h.containerID("bedapp.web") != "" || h.containerID("bedapp.worker") != "" {
		t.Fatal("containers of an unassigned module remain")
	}
	if b, err := os.ReadFile(srv + "/bedapp/data/user.db"); err != nil || string(b) != "precious" {
		t.Fatal("foreign data lost")
	}
	if statOf(t, "/etc") != etcBefore || !exists("/etc/passwd") {
		t.Fatal("something outside the declared directories changed")
	}
	if !strings.Contains(a.log(), "kept "+srv+"/bedapp/data (bedapp): holds") {
		t.Fatalf("no kept line in the log")
	}
	// The step's own output is data the mesh did not write either: kept too.
	if _, r := a.outcome(srv + "/bedapp/data"); !strings.Contains(r, "step.log") && !strings.Contains(r, "seen.binding") && !strings.Contains(r, "...") {
		t.Fatalf("kept reason does not list what was found: %s", r)
	}
	// Emptied by hand, the next pass removes the directories.
	entries, _ := os.ReadDir(srv + "/bedapp/data")
	for _, e := range entries {
		os.Remove(filepath.Join(srv, "bedapp/data", e.Name()))
	}
	eventually(t, 30*time.Second, "the emptied directories are removed", func() (bool, string) {
		return !exists(srv + "/bedapp"), ""
	})

	// Issue 30: a data directory is kept, and purged only when asked.
	checkData(t, a)

	// 7. Issue 10, here too (rootless as well): --wait waits for a declared
	// health check, and one turned failing from inside shows as unhealthy.
	a.mesh("module", "add", a.manifest("bedhc", bedHealthy, map[string]string{"name": "bedhc", "check": `"test", "-e", "/tmp/ok"`}))
	if out := a.mesh("assign", "ace", "bedhc", "--wait"); !strings.Contains(out, "healthy: bedhc.server") {
		t.Fatalf("assign --wait did not wait for health:\n%s", out)
	}
	h.podman("exec", "bedhc.server", "rm", "/tmp/ok")
	eventually(t, 20*time.Second, "status shows bedhc.server unhealthy", func() (bool, string) {
		st := a.mesh("status")
		return strings.Contains(st, "ace: container bedhc.server (bedhc) is unhealthy"), st
	})
	a.mesh("unassign", "ace", "bedhc", "--wait")
}

func statOf(t testing.TB, p string) string {
	var st syscall.Stat_t
	if err := syscall.Lstat(p, &st); err != nil {
		t.Fatal(err)
	}
	return strconv.Itoa(int(st.Uid)) + ":" + strconv.Itoa(int(st.Gid)) + ":" + strconv.FormatUint(uint64(st.Mode), 8)
}

func exists(p string) bool { _, err := os.Lstat(p); return err == nil }

func errString(err error) string {
	if err == nil {
		return ""
	}
	return err.Error()
}
