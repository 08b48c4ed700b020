// Package integration holds beds that build the real mesh binary and drive it
// through its command line, as an operator would. It imports no mesh package.
package integration

import (
	"bytes"
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

var meshBin, dnsqBin, wgfloodBin, maxrssBin string

func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "mesh-integration-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	// The beds' agents check each incremental composition against a full
	// one (state.checkComposition): a gap stops the agent, loudly. Not
	// under a benchmark, which measures what an operator's agent costs.
	flag.Parse()
	if f := flag.Lookup("test.bench"); f == nil || f.Value.String() == "" {
		os.Setenv("MESH_CHECK_COMPOSITION", "1")
	}
	// The rootless bed's user runs this binary too.
	os.Chmod(dir, 0o755)
	meshBin = filepath.Join(dir, "mesh")
	build := exec.Command("go", "build", "-tags", "containers_image_openpgp", "-o", meshBin, "..")
	build.Env = append(os.Environ(), "CGO_ENABLED=0")
	build.Stdout, build.Stderr = os.Stderr, os.Stderr
	if err := build.Run(); err != nil {
		fmt.Fprintln(os.Stderr, "build mesh:", err)
		os.Exit(1)
	}
	dnsqBin = filepath.Join(dir, "dnsq")
	build = exec.Command("go", "build", "-o", dnsqBin, "./testdata/dnsq")
	build.Env = append(os.Environ(), "CGO_ENABLED=0")
	build.Stdout, build.Stderr = os.Stderr, os.Stderr
	if err := build.Run(); err != nil {
		fmt.Fprintln(os.Stderr, "build dnsq:", err)
		os.Exit(1)
	}
	maxrssBin = filepath.Join(dir, "maxrss")
	build = exec.Command("go", "build", "-o", maxrssBin, "./testdata/maxrss")
	build.Env = append(os.Environ(), "CGO_ENABLED=0")
	build.Stdout, build.Stderr = os.Stderr, os.Stderr
	if err := build.Run(); err != nil {
		fmt.Fprintln(os.Stderr, "build maxrss:", err)
		os.Exit(1)
	}
	wgfloodBin = filepath.Join(dir, "wgflood")
	build = exec.Command("go", "build", "-o", wgfloodBin, "../bench/wgflood")
	build.Env = append(os.Environ(), "CGO_ENABLED=0")
	build.Stdout, build.Stderr = os.Stderr, os.Stderr
	if err := build.Run(); err != nil {
		fmt.Fprintln(os.Stderr, "build wgflood:", err)
		os.Exit(1)
	}
	code := m.Run()
	os.RemoveAll(dir)
	os.Exit(code)
}

// node is one mesh data dir, driven through the CLI; an agent (bed_test.go)
// runs it.
type node struct {
	t   testing.TB
	dir string
}

func newNode(t testing.TB) *node {
	return &node{t: t, dir: filepath.Join(t.TempDir(), "data")}
}

// run runs a mesh command against this node's data dir.
func (n *node) run(args ...string) (stdout, stderr string, code int) {
	n.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, meshBin, append(args, "--data-dir", n.dir)...)
	var o, e bytes.Buffer
	cmd.Stdout, cmd.Stderr = &o, &e
	err := cmd.Run()
	code = 0
	if ee, ok := err.(*exec.ExitError); ok {
		code = ee.ExitCode()
	} else if err != nil {
		n.t.Fatalf("mesh %v: %v", args, err)
	}
	return o.String(), e.String(), code
}

// must runs a command that has to succeed and returns its stdout.
func (n *node) must(args ...string) string {
	n.t.Helper()
	out, errOut, code := n.run(args...)
	if code != 0 {
		n.t.Fatalf("mesh %s: exit %d\nstdout: %s\nstderr: %s", strings.Join(args, " "), code, out, errOut)
	}
	return out
}

func freePort(t testing.TB) string {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return fmt.Sprint(l.Addr().(*net.TCPAddr).Port)
}

func writeFile(t testing.TB, name, content string) string {
	p := filepath.Join(t.TempDir(), name)
	if err := os.WriteFile(p, []byte(content), 0o644); err != nil {
		t.Fatal(err)
	}
	return p
}

// examples is a manifest of examples/ as shipped, but for its host paths:
// /srv/ moves under root, so a bed never writes the host's /srv (where the
// README's tour, run after the tests, would meet what they left).
func examples(t testing.TB, root, name string) string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join("..", "examples", name))
	if err != nil {
		t.Fatal(err)
	}
	p := filepath.Join(t.TempDir(), name)
	if err := os.WriteFile(p, []byte(strings.ReplaceAll(string(b), "/srv/", root+"/")), 0o644); err != nil {
		t.Fatal(err)
	}
	return p
}

// The README's tour, through the real binary: init, agent, add, assign, read.
func TestOneNodeMesh(t *testing.T) {
	h := newHost(t, false)
	n := newNode(t)
	a := &agent{name: "ace", h: h, n: n}

	// Before init: commands say there is no agent and how to start one.
	_, errOut, code := n.run("status")
	if code != 1 || !strings.Contains(errOut, "no agent is running") || !strings.Contains(errOut, "mesh agent --data-dir "+n.dir) {
		t.Fatalf("status without agent: exit %d, %q", code, errOut)
	}

	n.must("init", "--name", "ace", "--address", "127.0.0.1", "--port", freePort(t), "--overlay", "off")
	if _, errOut, code := n.run("init", "--name", "ace", "--address", "127.0.0.1"); code != 1 || !strings.Contains(errOut, "already holds node") {
		t.Fatalf("second init: exit %d %q", code, errOut)
	}
	a.start()
	fi, err := os.Stat(filepath.Join(n.dir, "mesh.sock"))
	if err != nil || fi.Mode().Perm() != 0o600 {
		t.Fatalf("socket: %v %v", fi.Mode(), err)
	}

	// A malformed manifest is refused and changes nothing.
	bad := writeFile(t, "bad.yaml", "module: bad\nresources:\n  - directory: /srv/bad\n  - container: bad.web\n    image: x\n    mounts: [\"/srv/other:/x\"]\n")
	srv := filepath.Join(h.dir, "srv")
	_, errOut, code = n.run("module", "add", examples(t, srv, "whoami.yaml"), bad)
	if code != 1 || !strings.Contains(errOut, "bad.yaml:6: mount \"/srv/other:/x\"") || !strings.Contains(errOut, "nothing was added") {
		t.Fatalf("bad manifest: exit %d %q", code, errOut)
	}
	if out := n.must("module", "list"); strings.Contains(out, "whoami") {
		t.Fatalf("a refused add left modules behind:\n%s", out)
	}
	if _, errOut, code := n.run("check", bad); code != 1 || !strings.Contains(errOut, "bad.yaml:6:") {
		t.Fatalf("check: exit %d %q", code, errOut)
	}
	if out := n.must("check", examples(t, srv, "whoami.yaml"), examples(t, srv, "postgres.yaml"), examples(t, srv, "postgres-exporter.yaml")); !strings.Contains(out, "3 manifest(s) ok") {
		t.Fatalf("check examples: %q", out)
	}

	n.must("module", "add", examples(t, srv, "whoami.yaml"), examples(t, srv, "postgres.yaml"), examples(t, srv, "postgres-exporter.yaml"))
	n.must("assign", "ace", "whoami")
	// Completion offers the nodes and modules the agent knows.
	for line, want := range map[string]string{"mesh assign ": "ace", "mesh assign ace ": "postgres-exporter"} {
		c := exec.Command(meshBin)
		c.Env = append(os.Environ(), "COMP_LINE="+line, "MESH_DATA_DIR="+n.dir)
		if out, _ := c.CombinedOutput(); !strings.Contains(string(out), want) {
			t.Fatalf("completing %q: %q, want %q", line, out, want)
		}
	}

	// Unknown node and module: exit 1, naming what exists. Usage: exit 2.
	if _, errOut, code := n.run("assign", "nope", "whoami"); code != 1 || !strings.Contains(errOut, `node "nope" is not in the mesh (known: ace)`) {
		t.Fatalf("unknown node: exit %d %q", code, errOut)
	}
	if _, errOut, code := n.run("assign", "ace", "nope"); code != 1 || !strings.Contains(errOut, "known: postgres, postgres-exporter, whoami") {
		t.Fatalf("unknown module: exit %d %q", code, errOut)
	}
	if _, _, code := n.run("assign", "ace"); code != 2 {
		t.Fatalf("usage error: exit %d", code)
	}
	if _, _, code := n.run("frobnicate"); code != 2 {
		t.Fatalf("unknown command: exit %d", code)
	}

	var roster []struct{ Name, Address, Node string }
	if err := json.Unmarshal([]byte(n.must("roster", "--json")), &roster); err != nil {
		t.Fatal(err)
	}
	want := map[string]bool{"ace.internal=127.0.0.1": true, "whoami.internal=127.0.0.1": true}
	if len(roster) != len(want) {
		t.Fatalf("roster %v", roster)
	}
	for _, r := range roster {
		if !want[r.Name+"="+r.Address] {
			t.Fatalf("roster %v", roster)
		}
	}

	// status --watch prints again when a plan changes (issue 12 item 6).
	watchOut := filepath.Join(t.TempDir(), "watch.out")
	wf, _ := os.Create(watchOut)
	watch := exec.Command(meshBin, "status", "--watch", "--interval", "200ms", "--data-dir", n.dir)
	watch.Stdout, watch.Stderr = wf, wf
	if err := watch.Start(); err != nil {
		t.Fatal(err)
	}
	eventually(t, 10*time.Second, "status --watch draws the status", func() (bool, string) {
		b, _ := os.ReadFile(watchOut)
		return strings.Contains(string(b), "NODE"), string(b)
	})
	// A public domain adds the routed name, and plan --diff shows the route.
	n.must("node", "public-domain", "ace", "zurag.be")
	eventually(t, 10*time.Second, "status --watch redraws with the public domain", func() (bool, string) {
		b, _ := os.ReadFile(watchOut)
		return strings.Count(string(b), "\n--- ") >= 1 && strings.Contains(string(b), "zurag.be"), string(b)
	})
	watch.Process.Signal(os.Interrupt)
	if err := watch.Wait(); err != nil {
		t.Fatalf("status --watch did not end cleanly on SIGINT: %v", err)
	}
	wf.Close()
	if out := n.must("roster"); !strings.Contains(out, "whoami.zurag.be") {
		t.Fatalf("routed name missing:\n%s", out)
	}
	n.must("assign", "ace", "postgres")
	diff := n.must("plan", "ace", "--diff")
	for _, w := range []string{"(mesh assign ace postgres)", "+ directory " + srv + "/postgres (postgres)", "+ container postgres.server (postgres)"} {
		if !strings.Contains(diff, w) {
			t.Fatalf("plan --diff lacks %q:\n%s", w, diff)
		}
	}
	if strings.Contains(diff, "whoami") {
		t.Fatalf("diff shows unchanged resources:\n%s", diff)
	}

	// postgres-exporter binds to postgres and gets a credential; the secret
	// stays out of plans.
	n.must("assign", "ace", "postgres-exporter")
	plan := n.must("plan", "ace", "--json")
	if !strings.Contains(plan, "provider=postgres\\nname=postgres.internal\\nnode=ace\\naddress=127.0.0.1\\n") {
		t.Fatalf("binding not resolved in plan:\n%s", plan)
	}
	if !strings.Contains(plan, srv+"/postgres/credentials/postgres-exporter.credential") {
		t.Fatalf("credential not delivered to the provider:\n%s", plan)
	}

	// A plan that stops composing: error shown, last good plan and names kept.
	n.must("unassign", "ace", "postgres")
	var st struct {
		Node  string
		Nodes []struct {
			Name         string
			ComposeError string `json:"compose_error"`
			PlanVersion  uint64 `json:"plan_version"`
		}
	}
	if err := json.Unmarshal([]byte(n.must("status", "--json")), &st); err != nil {
		t.Fatal(err)
	}
	if st.Node != "ace" || len(st.Nodes) != 1 || !strings.Contains(st.Nodes[0].ComposeError, `provider "postgres" is not assigned to any node`) {
		t.Fatalf("status: %+v", st)
	}
	if out := n.must("roster"); !strings.Contains(out, "postgres.internal") {
		t.Fatalf("names of a failing node were dropped:\n%s", out)
	}
	if out := n.must("status"); !strings.Contains(out, "plan does not compose") {
		t.Fatalf("status text hides the error:\n%s", out)
	}
	n.must("assign", "ace", "postgres")
	hist := n.must("plan", "ace", "--history")
	if strings.Count(hist, "\nv") < 4 {
		t.Fatalf("history keeps too few versions:\n%s", hist)
	}

	// Refusals change nothing.
	if _, errOut, code := n.run("module", "remove", "postgres"); code != 1 || !strings.Contains(errOut, "assigned to ace; unassign it first") {
		t.Fatalf("remove assigned module: exit %d %q", code, errOut)
	}

	// Restart the agent: the replica and plan history are intact.
	before := n.must("plan", "ace", "--history")
	a.stop()
	a.start()
	if after := n.must("plan", "ace", "--history"); after != before {
		t.Fatalf("history changed across restart:\n%s\n%s", before, after)
	}
}
