package integration

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// The host-safety beds of issue 8, against real Podman: a module's change
// touches only that module, one failure does not stall the node, an
// operator's bytes are never lost, a planted link is never followed, and a
// hostile manifest is refused quickly and cheaply.

const twinMod = `module: {{m}}
resources:
  - directory: {{root}}/{{m}}
    mode: "0755"
  - directory: {{root}}/{{m}}/data
    mode: "0777"
  - file: {{root}}/{{m}}/input
    mode: "0644"
    content: "{{v}}"
  - step: migrate
    image: localhost/mesh-bed-busybox:1
    command: ["sh", "-c", "echo run >> /data/step.log"]
    mounts: ["{{root}}/{{m}}/data:/data", "{{root}}/{{m}}/input:/input:ro"]
    restart-on: [{{root}}/{{m}}/input]
  - container: {{m}}.server
    image: localhost/mesh-bed-busybox:1
    command: ["sh", "-c", "while true; do sleep 1; done"]
    mounts: ["{{root}}/{{m}}/data:/data"]
    restart-on: [migrate]
`

const badMod = `module: bedbad
resources:
  - directory: {{root}}/bedbad
  - container: bedbad.server
    image: localhost/mesh-bed-missing:1
`

const okMod = `module: {{m}}
resources:
  - directory: {{root}}/{{m}}
  - container: {{m}}.server
    image: localhost/mesh-bed-busybox:1
    command: ["sh", "-c", "while true; do sleep 1; done"]
`

const opMod = `module: bedop
resources:
  - directory: {{root}}/bedop
  - file: {{root}}/bedop/app.ini
    mode: "0600"
    content: "written by the mesh"
{{takeover}}`

const linkMod = `module: bedlink
resources:
  - directory: {{root}}/bedlink
    mode: "0755"
  - directory: {{root}}/bedlink/data
    mode: "0777"
  - directory: {{root}}/bedlink/data/sub
    mode: "0777"
  - file: {{root}}/bedlink/data/sub/conf
    mode: "0644"
    content: "{{v}}"
  - file: {{root}}/bedlink/data/top
    mode: "0644"
    content: "{{v}}"
  - container: bedlink.c
    image: localhost/mesh-bed-busybox:1
    command: ["sh", "-c", "while true; do sleep 1; done"]
    mounts: ["{{root}}/bedlink/data:/data"]
`

// siblingMod lets one container swap the other's mount source for a link:
// mesh check refuses it.
const siblingMod = `module: bedsib
resources:
  - directory: {{root}}/bedsib
  - directory: {{root}}/bedsib/child
  - container: bedsib.parent
    image: localhost/mesh-bed-busybox:1
    mounts: ["{{root}}/bedsib:/all"]
  - container: bedsib.child
    image: localhost/mesh-bed-busybox:1
    mounts: ["{{root}}/bedsib/child:/child"]
`

func TestSafetyRootful(t *testing.T)  { testSafety(t, false) }
func TestSafetyRootless(t *testing.T) { testSafety(t, true) }

func testSafety(t *testing.T, rootless bool) {
	h := newHost(t, rootless)
	srv := filepath.Join(h.dir, "srv")
	a := h.newAgent(t)
	chown := func(p string) {
		if rootless {
			os.Lchown(p, h.hostID(0), h.hostID(0))
		}
	}

	t.Log("1. two modules with a step of the same name: a change to one never touches the other")
	twin := func(m, v string) string { return a.manifest(m, twinMod, map[string]string{"m": m, "v": v}) }
	a.mesh("module", "add", twin("bedalpha", "a1"), twin("bedbeta", "b1"))
	a.mesh("assign", "ace", "bedalpha", "--wait")
	a.mesh("assign", "ace", "bedbeta", "--wait")
	beta, alpha := h.containerID("bedbeta.server"), h.containerID("bedalpha.server")
	a.mesh("module", "add", twin("bedalpha", "a2"))
	out := a.mesh("assign", "ace", "bedalpha", "--wait")
	if !strings.Contains(out, "step bedalpha.migrate (bedalpha): ran") || !strings.Contains(out, "container bedalpha.server (bedalpha): replaced; step migrate ran") {
		t.Fatalf("alpha's change:\n%s", out)
	}
	if strings.Contains(out, "bedbeta") {
		t.Fatalf("beta was touched:\n%s", out)
	}
	if h.containerID("bedbeta.server") != beta || h.containerID("bedalpha.server") == alpha {
		t.Fatal("container ids: beta's changed, or alpha's did not")
	}
	if b, _ := os.ReadFile(srv + "/bedbeta/data/step.log"); string(b) != "run\n" {
		t.Fatalf("beta's step ran %q", b)
	}
	if b, _ := os.ReadFile(srv + "/bedalpha/data/step.log"); string(b) != "run\nrun\n" {
		t.Fatalf("alpha's step ran %q", b)
	}

	t.Log("2. one module fails; another is assigned and a third unassigned on the same node: both converge")
	a.mesh("module", "add", a.manifest("bedbad", badMod, nil),
		a.manifest("bedok", okMod, map[string]string{"m": "bedok"}), a.manifest("bedgone", okMod, map[string]string{"m": "bedgone"}))
	a.mesh("assign", "ace", "bedgone", "--wait")
	out = a.meshFails("assign", "ace", "bedbad", "--wait", "--timeout", "60s")
	if !strings.Contains(out, "bedbad: container bedbad.server") {
		t.Fatalf("the failing module's wait:\n%s", out)
	}
	out = a.mesh("assign", "ace", "bedok", "--wait", "--timeout", "60s")
	if !strings.Contains(out, "container bedok.server (bedok): created") || !strings.Contains(out, "other modules there failed") {
		t.Fatalf("assign beside a failing module:\n%s", out)
	}
	a.mesh("unassign", "ace", "bedgone", "--wait", "--timeout", "60s")
	if h.containerID("bedgone.server") != "" || exists(srv+"/bedgone") {
		t.Fatal("the unassigned module was not removed beside a failing one")
	}
	st := a.mesh("status")
	if !strings.Contains(st, "module bedbad failed at container bedbad.server") {
		t.Fatalf("status does not name the failure:\n%s", st)
	}
	a.mesh("unassign", "ace", "bedbad", "--wait")

	t.Log("3. an operator's existing file: refused by default, taken over when declared, and back after unassign")
	os.MkdirAll(srv+"/bedop", 0o755)
	chown(srv + "/bedop")
	os.WriteFile(srv+"/bedop/app.ini", []byte("operator's bytes\n"), 0o640)
	chown(srv + "/bedop/app.ini")
	before := statOf(t, srv+"/bedop/app.ini")
	a.mesh("module", "add", a.manifest("bedop", opMod, map[string]string{"takeover": ""}))
	out = a.meshFails("assign", "ace", "bedop", "--wait", "--timeout", "60s")
	if !strings.Contains(out, "exists and the mesh did not write it") || !strings.Contains(out, "take-over: true") {
		t.Fatalf("refusal:\n%s", out)
	}
	a.mesh("unassign", "ace", "bedop", "--wait")
	if b, _ := os.ReadFile(srv + "/bedop/app.ini"); string(b) != "operator's bytes\n" {
		t.Fatalf("after a refused assign and an unassign the file holds %q", b)
	}
	a.mesh("module", "add", a.manifest("bedop", opMod, map[string]string{"takeover": "    take-over: true\n"}))
	out = a.mesh("assign", "ace", "bedop", "--wait", "--timeout", "60s")
	if !strings.Contains(out, "taken over; the original is kept at "+a.n.dir+"/kept/") {
		t.Fatalf("take-over:\n%s", out)
	}
	if b, _ := os.ReadFile(srv + "/bedop/app.ini"); string(b) != "written by the mesh" {
		t.Fatalf("taken over, the file holds %q", b)
	}
	a.mesh("unassign", "ace", "bedop", "--wait")
	if b, _ := os.ReadFile(srv + "/bedop/app.ini"); string(b) != "operator's bytes\n" || statOf(t, srv+"/bedop/app.ini") != before {
		t.Fatalf("after unassign the file holds %q (%s, was %s)", b, statOf(t, srv+"/bedop/app.ini"), before)
	}
	if !exists(srv + "/bedop") {
		t.Fatal("the operator's directory was removed")
	}

	t.Log("4. links planted from inside a container at each level of a declared tree are never followed")
	outside := filepath.Join(h.dir, "outside")
	os.MkdirAll(outside+"/sub", 0o755)
	os.WriteFile(outside+"/sub/conf", []byte("outside\n"), 0o644)
	os.WriteFile(outside+"/top", []byte("outside\n"), 0o644)
	os.WriteFile(outside+"/conf", []byte("outside\n"), 0o644)
	for _, p := range []string{outside, outside + "/sub", outside + "/sub/conf", outside + "/top", outside + "/conf"} {
		chown(p)
	}
	lm := func(v string) string { return a.manifest("bedlink", linkMod, map[string]string{"v": v}) }
	a.mesh("module", "add", lm("v1"))
	a.mesh("assign", "ace", "bedlink", "--wait")
	outsideBefore := treeState(t, outside)
	etcBefore := statOf(t, "/etc")
	// The container replaces a declared directory (the parent of a declared
	// file) and a declared file with links to the host's outside tree.
	h.podman("exec", "bedlink.c", "sh", "-c", "rm -rf /data/sub /data/top && ln -s "+outside+" /data/sub && ln -s "+outside+"/top /data/top")
	a.mesh("module", "add", lm("v2"))
	out = a.meshFails("assign", "ace", "bedlink", "--wait", "--timeout", "60s")
	if !strings.Contains(out, "symbolic link") {
		t.Fatalf("a planted link was not named:\n%s", out)
	}
	a.mesh("unassign", "ace", "bedlink", "--wait")
	if o, r := a.outcome(srv + "/bedlink/data/sub"); o != "kept" || !strings.Contains(r, "symbolic link") {
		t.Fatalf("the planted directory link: %s; %s", o, r)
	}
	if after := treeState(t, outside); after != outsideBefore {
		t.Fatalf("outside the declared tree changed:\n%s\n->\n%s", outsideBefore, after)
	}
	if statOf(t, "/etc") != etcBefore {
		t.Fatal("/etc changed")
	}

	t.Log("5. the sibling-mount escape is refused by mesh check, with the rule")
	out = a.runFails("check", a.manifest("bedsib", siblingMod, nil))
	if !strings.Contains(out, "its host path is inside") || !strings.Contains(out, "mounts writable") || !strings.Contains(out, "could swap it for a link") {
		t.Fatalf("sibling mounts:\n%s", out)
	}

	t.Log("6. hostile manifests: exit 1 with a message, quickly, in little memory, on the CLI and through the agent's API")
	hostile := hostileManifests(t, h.dir)
	for _, name := range sortedKeys(hostile) {
		p := hostile[name]
		chown(p)
		for _, args := range [][]string{{"check", p}, {"module", "add", p, "--data-dir", a.n.dir}} {
			start := time.Now()
			cmd := peakOf(t, a.command(args...))
			outb, err := cmd.CombinedOutput()
			took := time.Since(start)
			if err == nil || cmd.ProcessState.ExitCode() != 1 || !strings.Contains(string(outb), "mesh: ") {
				t.Fatalf("%s: mesh %s: exit %d, want 1 with a message:\n%.500s", name, args[0], cmd.ProcessState.ExitCode(), outb)
			}
			rss := cmd.peak() // KiB
			if rss > 200*1024 || took > 10*time.Second {
				t.Fatalf("%s: mesh %s took %s and %d MiB", name, args[0], took, rss/1024)
			}
			t.Logf("%s: mesh %s: exit 1 in %s, max RSS %d MiB: %.120s", name, args[0], took.Round(time.Millisecond), rss/1024, strings.TrimSpace(string(outb)))
		}
		// Straight to the agent's API, past the CLI's own check.
		if !rootless {
			body, _ := os.ReadFile(p)
			code, msg := postModule(t, filepath.Join(a.n.dir, "mesh.sock"), string(body))
			if code < 400 || code >= 500 {
				t.Fatalf("%s: the API answered %d: %.300s", name, code, msg)
			}
		}
	}
	if !rootless {
		if hwm := agentHWM(t, a); hwm > 200*1024 {
			t.Fatalf("the agent's peak RSS after the hostile manifests is %d MiB", hwm/1024)
		}
	}
	a.mesh("status") // the agent still answers

	if rootless {
		t.Log("7. SIGTERM to the process the user started stops the agent it re-ran under podman unshare")
		pattern := "mesh agent --data-dir " + a.n.dir
		out, err := exec.Command("pgrep", "-o", "-f", pattern).Output()
		if err != nil {
			t.Fatalf("no agent process: %v", err)
		}
		all, _ := exec.Command("pgrep", "-f", pattern).Output()
		if len(strings.Fields(string(all))) < 2 {
			t.Fatalf("expected the wrapper and the agent under podman unshare, found %q", all)
		}
		pid, _ := strconv.Atoi(strings.TrimSpace(string(out)))
		syscall.Kill(pid, syscall.SIGTERM)
		eventually(t, 30*time.Second, "no agent left after SIGTERM to the wrapper", func() (bool, string) {
			left, err := exec.Command("pgrep", "-f", pattern).Output()
			return err != nil, string(left)
		})
		a.cmd.Wait()
		a.cmd = nil
	}
}

// treeState is every entry under dir: type, mode, owner, size and content.
func treeState(t *testing.T, dir string) string {
	var b strings.Builder
	filepath.Walk(dir, func(p string, fi os.FileInfo, err error) error {
		if err != nil {
			return err
		}
		st := fi.Sys().(*syscall.Stat_t)
		c, _ := os.ReadFile(p)
		fmt.Fprintf(&b, "%s %s %d:%d %q mtime=%v ctime=%v\n", p, fi.Mode(), st.Uid, st.Gid, c, st.Mtim, st.Ctim)
		return nil
	})
	return b.String()
}

func hostileManifests(t *testing.T, dir string) map[string]string {
	d := filepath.Join(dir, "hostile")
	os.MkdirAll(d, 0o755)
	deep := "module: a\nx: " + strings.Repeat("{a: ", 5000) + strings.Repeat("}", 5000) + "\n"
	var nested strings.Builder
	nested.WriteString("module: a\nx:\n")
	for i := 1; nested.Len() < 500<<10; i++ {
		nested.WriteString(strings.Repeat(" ", i%400+1) + "a:\n")
	}
	big := "module: a\nresources:\n" + strings.Repeat("  - directory: /srv/aaaaaaaaaaaaaaaaaaaa\n", (1<<20)/30)
	files := map[string]string{
		"tag":          "resources: !!map {}\n",
		"tag-routes":   "module: a\nroutes: !!map {}\n",
		"alias-bomb":   "a: &a [\"lol\",\"lol\",\"lol\",\"lol\",\"lol\",\"lol\",\"lol\",\"lol\",\"lol\"]\nb: &b [*a,*a,*a,*a,*a,*a,*a,*a,*a]\nc: &c [*b,*b,*b,*b,*b,*b,*b,*b,*b]\nd: &d [*c,*c,*c,*c,*c,*c,*c,*c,*c]\nmodule: x\n",
		"nest-5000":    deep,
		"nest-500KB":   nested.String(),
		"size-1MB":     big[:1<<20-1],
		"size-10MB":    strings.Repeat("#", 10<<20),
		"nul-bytes":    "module: a\x00\x00\n",
		"invalid-utf8": "module: \xff\xfe\n",
	}
	out := map[string]string{}
	for name, body := range files {
		p := filepath.Join(d, name+".yaml")
		if err := os.WriteFile(p, []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
		out[name] = p
	}
	return out
}

func sortedKeys(m map[string]string) []string {
	var ks []string
	for k := range m {
		ks = append(ks, k)
	}
	for i := range ks {
		for j := i + 1; j < len(ks); j++ {
			if ks[j] < ks[i] {
				ks[i], ks[j] = ks[j], ks[i]
			}
		}
	}
	return ks
}

// postModule sends a manifest to the agent's API as `mesh module add` would.
func postModule(t *testing.T, sock, text string) (int, string) {
	c := &http.Client{Timeout: 30 * time.Second, Transport: &http.Transport{DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
		return (&net.Dialer{}).DialContext(ctx, "unix", sock)
	}}}
	body, _ := json.Marshal(map[string]any{"modules": []map[string]string{{"file": "hostile.yaml", "text": text}}})
	resp, err := c.Post("http://mesh/v1/modules", "application/json", bytes.NewReader(body))
	if err != nil {
		t.Fatalf("post to the API: %v", err)
	}
	defer resp.Body.Close()
	var b bytes.Buffer
	b.ReadFrom(resp.Body)
	return resp.StatusCode, b.String()
}

// agentHWM is the agent's peak resident memory in KiB.
func agentHWM(t *testing.T, a *agent) int {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(a.cmd.Process.Pid) + "/status")
	if err != nil {
		t.Fatal(err)
	}
	for _, l := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(l, "VmHWM:"); ok {
			n, _ := strconv.Atoi(strings.TrimSuffix(strings.TrimSpace(v), " kB"))
			return n
		}
	}
	t.Fatal("no VmHWM")
	return 0
}

// measured is a command run under testdata/maxrss, which says its peak
// resident set: measured straight from this test process, the peak would
// start at this process's own (Go starts children with vfork, and the
// peak is kept across exec).
type measured struct {
	*exec.Cmd
	t   testing.TB
	out string
}

func peakOf(t testing.TB, cmd *exec.Cmd) *measured {
	out := filepath.Join(t.TempDir(), "maxrss")
	m := exec.Command(maxrssBin, append([]string{cmd.Path}, cmd.Args[1:]...)...)
	env := cmd.Env
	if env == nil {
		env = os.Environ()
	}
	m.Env, m.Dir = append(env, "MAXRSS_OUT="+out), cmd.Dir
	return &measured{Cmd: m, t: t, out: out}
}

func (m *measured) peak() int64 {
	b, err := os.ReadFile(m.out)
	if err != nil {
		m.t.Fatalf("maxrss wrote no figure: %v", err)
	}
	n, _ := strconv.ParseInt(strings.TrimSpace(string(b)), 10, 64)
	return n
}
