package integration

import (
	"bufio"
	"bytes"
	"fmt"
	"io"
	"os"
	"os/exec"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/creack/pty"
)

// Issue 29, items 1 and 2 ("Operating the fleet from any node"): mesh logs
// and mesh exec from a node that runs none of the containers, across the
// peer API; a follow across a replacement; a container flooding its log;
// a node that cannot be read; and the exec's streams, exit code and
// terminal. testHost runs checkExec on the rootful and rootless hosts.

const bedTalk = `module: chatty
resources:
  - container: chatty.talk
    image: localhost/mesh-bed-busybox:1
    command: ["sh", "-c", "i=0; while true; do i=$((i+1)); echo {{tag}} line $i; echo {{tag}} err $i >&2; sleep 0.2; done"]
  - container: chatty.quits
    image: localhost/mesh-bed-busybox:1
    restart: "no"
    command: ["sh", "-c", "exit 0"]
`

const bedFlood = `module: flood
resources:
  - step: prep
    image: localhost/mesh-bed-busybox:1
    command: ["sh", "-c", "echo prepared the flood"]
  - container: flood.talk
    image: localhost/mesh-bed-busybox:1
    log-max-size: 200m
    command: ["sh", "-c", "yes 0123456789012345678901234567890123456789012345678901234567890123456789 | head -c 52428800; echo flood done; sleep 3600"]
`

// meshRun runs a mesh command on a, returning stdout, stderr and the exit code.
func (a *agent) meshRun(stdin io.Reader, args ...string) (string, string, int) {
	a.h.t.Helper()
	cmd := a.command(a.withDir(args)...)
	var o, e bytes.Buffer
	cmd.Stdin, cmd.Stdout, cmd.Stderr = stdin, &o, &e
	err := cmd.Run()
	code := 0
	if ee, ok := err.(*exec.ExitError); ok {
		code = ee.ExitCode()
	} else if err != nil {
		a.h.t.Fatalf("mesh %s: %v", strings.Join(args, " "), err)
	}
	return o.String(), e.String(), code
}

// withDir puts --data-dir after the command's name: what follows exec's
// -- is the container's command, all of it.
func (a *agent) withDir(args []string) []string {
	return append([]string{args[0], "--data-dir", a.n.dir}, args[1:]...)
}

// follower is a running `mesh logs -f`, its output collected.
type follower struct {
	cmd    *exec.Cmd
	mu     sync.Mutex
	out    []string // the last keepLines lines at most
	count  int      // every line
	errb   bytes.Buffer
	done   chan struct{}
	closed bool
}

func (a *agent) follow(t testing.TB, args ...string) *follower {
	f := &follower{done: make(chan struct{})}
	f.cmd = a.command(append(append([]string{"logs", "-f"}, args...), "--data-dir", a.n.dir)...)
	out, err := f.cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	f.cmd.Stderr = &syncWriter{mu: &f.mu, w: &f.errb}
	if err := f.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() {
		defer close(f.done)
		sc := bufio.NewScanner(out)
		sc.Buffer(make([]byte, 1<<20), 1<<20)
		for sc.Scan() {
			f.mu.Lock()
			f.count++
			// The last lines only: a follower of a flood holds little (the
			// beds after this one measure their children's memory, which
			// starts as this process's).
			if len(f.out) == keepLines {
				f.out = append(f.out[:0], f.out[keepLines/2:]...)
			}
			f.out = append(f.out, sc.Text())
			f.mu.Unlock()
		}
	}()
	t.Cleanup(func() { f.cmd.Process.Kill(); f.cmd.Wait() })
	return f
}

// has says whether a line holds what.
func (f *follower) has(what string) func() (bool, string) {
	return func() (bool, string) {
		ls := f.lines()
		for _, l := range ls {
			if strings.Contains(l, what) {
				return true, ""
			}
		}
		return false, fmt.Sprintf("%d lines; stderr %s; last %v", len(ls), f.stderr(), ls[max(0, len(ls)-3):])
	}
}

// keepLines bounds what a follower keeps.
const keepLines = 4096

func (f *follower) total() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.count
}

func (f *follower) lines() []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]string(nil), f.out...)
}

func (f *follower) stderr() string {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.errb.String()
}

// stop sends Ctrl-C and returns the exit code, which must come soon.
func (f *follower) stop(t testing.TB) int {
	t.Helper()
	f.cmd.Process.Signal(os.Interrupt)
	exited := make(chan error, 1)
	go func() { <-f.done; exited <- f.cmd.Wait() }()
	select {
	case err := <-exited:
		if ee, ok := err.(*exec.ExitError); ok {
			return ee.ExitCode()
		}
		return 0
	case <-time.After(10 * time.Second):
		t.Fatal("mesh logs -f did not end within 10 s of Ctrl-C")
		return -1
	}
}

type syncWriter struct {
	mu *sync.Mutex
	w  io.Writer
}

func (s *syncWriter) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.w.Write(p)
}

func agentPID(t testing.TB, a *agent) int {
	out, err := exec.Command("pgrep", "-f", "^"+regexp.QuoteMeta(meshBin)+" agent --data-dir "+regexp.QuoteMeta(a.n.dir)).Output()
	if err != nil {
		t.Fatalf("no agent process for %s: %v", a.n.dir, err)
	}
	pid, _ := strconv.Atoi(strings.Fields(string(out))[0])
	return pid
}

// rssKiB reads a process's resident set (VmRSS) and its peak (VmHWM).
func rssKiB(pid int) (rss, hwm int) {
	b, _ := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	for _, l := range strings.Split(string(b), "\n") {
		f := strings.Fields(l)
		if len(f) >= 2 && f[0] == "VmRSS:" {
			rss, _ = strconv.Atoi(f[1])
		}
		if len(f) >= 2 && f[0] == "VmHWM:" {
			hwm, _ = strconv.Atoi(f[1])
		}
	}
	return
}

// checkExec runs the exec checks on a container that runs sh: the exit
// code, stdout and stderr apart, stdin, and a terminal of the size asked.
func checkExec(t testing.TB, a *agent, target string, extra ...string) {
	t.Helper()
	args := func(more ...string) []string {
		return append(append([]string{"exec", target}, extra...), more...)
	}
	if _, e, code := a.meshRun(nil, args("--", "sh", "-c", "exit 7")...); code != 7 {
		t.Fatalf("exec exit 7: mesh exited %d\n%s", code, e)
	}
	if o, e, code := a.meshRun(nil, args("--", "sh", "-c", "echo out; echo err >&2")...); code != 0 || o != "out\n" || e != "err\n" {
		t.Fatalf("exec streams: %d stdout %q stderr %q", code, o, e)
	}
	if o, e, code := a.meshRun(strings.NewReader("hello\nworld\n"), args("-i", "--", "sh", "-c", "cat; echo end")...); code != 0 || o != "hello\nworld\nend\n" {
		t.Fatalf("exec -i: %d stdout %q stderr %q", code, o, e)
	}
	cmd := a.command(a.withDir(args("-i", "-t", "--", "sh"))...)
	f, err := pty.StartWithSize(cmd, &pty.Winsize{Rows: 33, Cols: 101})
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	saw, seen := readPty(f)
	fmt.Fprintf(f, "stty size; echo tty=$(tty)\n")
	eventually(t, 20*time.Second, "the terminal's size in the container", saw("33 101"))
	eventually(t, 5*time.Second, "a terminal in the container", saw("tty=/dev/pts/"))
	fmt.Fprintf(f, "exit 3\n")
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	select {
	case err := <-done:
		if ee, ok := err.(*exec.ExitError); !ok || ee.ExitCode() != 3 {
			t.Fatalf("exec -it ended with %v, want exit 3\n%s", err, seen())
		}
	case <-time.After(20 * time.Second):
		t.Fatal("exec -it did not end after exit 3")
	}
}

func TestOperateBed(t *testing.T) {
	n, _ := startThree(t)
	chatty := func(tag string) string { return n[1].manifest("chatty", bedTalk, map[string]string{"tag": tag}) }
	n[1].mesh("module", "add", chatty("v1"), n[1].manifest("flood", bedFlood, nil))
	n[1].mesh("assign", "n1", "chatty", "--wait")
	n[1].mesh("assign", "n2", "chatty", "--wait")

	// A remote container that prints nothing is followed, not taken for a
	// node that does not answer (checked once what follows has run).
	quiet := n[3].follow(t, "chatty.quits", "--node", "n1")
	quietSince := time.Now()

	// From n3, which runs neither: both nodes' lines, prefixed, in time order,
	// stderr on stderr.
	eventually(t, 30*time.Second, "n3 reads both nodes' lines", func() (bool, string) {
		o, e, code := n[3].meshRun(nil, "logs", "chatty.talk", "--tail", "6", "--timestamps")
		return code == 0 && strings.Contains(o, "n1 chatty.talk | ") && strings.Contains(o, "n2 chatty.talk | ") && strings.Contains(e, " v1 err "), o + e
	})
	o, _, _ := n[3].meshRun(nil, "logs", "chatty.talk", "--tail", "20", "--timestamps")
	var last time.Time
	for _, l := range strings.Split(strings.TrimSpace(o), "\n") {
		_, rest, _ := strings.Cut(l, " | ")
		ts, _, _ := strings.Cut(rest, " ")
		at, err := time.Parse(time.RFC3339, ts)
		if err != nil || at.Before(last) {
			t.Fatalf("lines out of time order or without a time at %q:\n%s", l, o)
		}
		last = at
	}
	// One node's: no prefix.
	if o, e, code := n[3].meshRun(nil, "logs", "chatty.talk", "--node", "n2", "--tail", "4"); code != 0 || !strings.HasPrefix(o, "v1 line ") || strings.Contains(o, " | ") {
		t.Fatalf("logs --node n2: %d\n%s\n%s", code, o, e)
	}

	// -f follows both, and on across a replacement of both containers: the
	// new containers' lines follow the old ones'; Ctrl-C ends it with 0.
	f := n[3].follow(t, "chatty.talk")
	has := f.has
	eventually(t, 30*time.Second, "the follower shows n1's lines", has("n1 chatty.talk | v1 line"))
	eventually(t, 30*time.Second, "the follower shows n2's lines", has("n2 chatty.talk | v1 line"))
	n[1].mesh("module", "add", chatty("v2"))
	eventually(t, 60*time.Second, "the follower shows n1's new container", has("n1 chatty.talk | v2 line"))
	eventually(t, 60*time.Second, "the follower shows n2's new container", has("n2 chatty.talk | v2 line"))
	if code := f.stop(t); code != 0 {
		t.Fatalf("mesh logs -f ended with %d after Ctrl-C\n%s", code, f.stderr())
	}
	if !strings.Contains(f.stderr(), "chatty.talk was replaced") {
		t.Fatalf("the follower did not say the container was replaced: %s", f.stderr())
	}
	for _, node := range []string{"n1", "n2"} {
		sawNew := false
		for _, l := range f.lines() {
			if strings.HasPrefix(l, node+" chatty.talk | v2") {
				sawNew = true
			} else if sawNew && strings.HasPrefix(l, node+" chatty.talk | v1") {
				t.Fatalf("%s: an old container's line after the new one's: %q", node, l)
			}
		}
	}

	// Bad input: clear errors, exit 1.
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"logs", "nosuch"}, `module "nosuch" is not in the catalogue`},
		{[]string{"logs", "chatty.nope"}, "module chatty has no container or step chatty.nope (it has chatty.quits, chatty.talk)"},
		{[]string{"logs", "chatty", "--node", "n9"}, `no node "n9" in this mesh`},
		{[]string{"exec", "chatty.talk", "--node", "n3", "--", "true"}, "module chatty does not run on n3 (it runs on n1, n2)"},
		{[]string{"exec", "chatty.talk", "--", "true"}, "say which with --node"},
		{[]string{"exec", "chatty.talk"}, `expected "<CMD> ..."`},
	} {
		_, e, code := n[3].meshRun(nil, c.args...)
		if code == 0 || !strings.Contains(e, c.want) {
			t.Fatalf("mesh %v: exit %d, want an error saying %q:\n%s", c.args, code, c.want, e)
		}
	}
	// exec in a container that is not running says so (chatty.quits exits
	// at once; the reconciler starts it again at each pass).
	eventually(t, 30*time.Second, "exec in a stopped container is refused, saying so", func() (bool, string) {
		_, e, code := n[3].meshRun(nil, "exec", "chatty.quits", "--node", "n1", "--", "true")
		return code == 1 && strings.Contains(e, "chatty.quits on n1 is not running"), e
	})

	// A machine without a node's certificate gets nothing of either.
	for _, path := range []string{"/v1/op/logs?name=chatty.talk", "/v1/op/exec?name=chatty.talk&cmd=id"} {
		c := inNetns(n[3].h.netns, exec.Command("curl", "-sk", "--http1.1", "--max-time", "5", "-o", "/dev/null", "-w", "%{http_code}",
			fmt.Sprintf("https://%s:%d%s", n[1].addr(), 7430, path)))
		if out, _ := c.Output(); strings.TrimSpace(string(out)) != "403" {
			t.Fatalf("%s without a node's certificate: HTTP %s", path, out)
		}
	}
	// exec from n3 into n1's and n2's containers (a terminal too, resized).
	checkExec(t, n[3], "chatty.talk", "--node", "n1")
	if o, e, code := n[3].meshRun(nil, "exec", "chatty.talk", "--node", "n2", "--", "sh", "-c", "echo from $(hostname)"); code != 0 || !strings.HasPrefix(o, "from ") {
		t.Fatalf("exec on n2: %d %q %q", code, o, e)
	}
	checkResize(t, n[3], "chatty.talk", "--node", "n2")

	if time.Since(quietSince) < 12*time.Second {
		t.Fatalf("the checks took %s, less than the 10 s a quiet stream must outlast", time.Since(quietSince))
	}
	if e := quiet.stderr(); strings.Contains(e, "did not answer") || strings.Contains(e, "could not be read") {
		t.Fatalf("following a quiet remote container failed: %s", e)
	}
	if code := quiet.stop(t); code != 0 {
		t.Fatalf("the quiet follower ended with %d: %s", code, quiet.stderr())
	}

	// A node that cannot be read is named; the others' lines still show.
	n[2].stop()
	o, e, code := n[3].meshRun(nil, "logs", "chatty.talk", "--tail", "3")
	if code != 1 || !strings.Contains(e, "chatty.talk on n2: node n2 did not answer") || !strings.Contains(o, "n1 chatty.talk | v2 line") {
		t.Fatalf("logs with n2 down: exit %d\nstdout:\n%s\nstderr:\n%s", code, o, e)
	}
	n[2].start()

	// A step's last run.
	n[1].mesh("assign", "n1", "flood", "--wait")
	if o, e, code := n[3].meshRun(nil, "logs", "flood.prep"); code != 0 || o != "prepared the flood\n" {
		t.Fatalf("logs of a step: %d %q %q", code, o, e)
	}

	// 50 MB written as fast as the container can: followed from n3 while it
	// is written, n1's agent stays small and answers.
	pid := agentPID(t, n[1])
	rss0, _ := rssKiB(pid)
	start := time.Now()
	ff := n[3].follow(t, "flood.talk")
	var maxRSS int
	var slowest time.Duration
	for {
		if ok, _ := ff.has("flood done")(); ok {
			break
		}
		if time.Since(start) > 5*time.Minute {
			t.Fatalf("the flood did not reach n3 within 5 minutes: %d lines", ff.total())
		}
		if rss, _ := rssKiB(pid); rss > maxRSS {
			maxRSS = rss
		}
		t0 := time.Now()
		n[1].mesh("status", "--json")
		slowest = max(slowest, time.Since(t0))
	}
	followed := time.Since(start)
	ff.stop(t)
	if got := ff.total(); got < 52428800/71 {
		t.Fatalf("the follower got %d lines of the flood's %d", got, 52428800/71)
	}
	if maxRSS > 100<<10 {
		t.Fatalf("n1's agent grew to %d MiB while a container flooded its log", maxRSS>>10)
	}
	if slowest > 5*time.Second {
		t.Fatalf("n1's API took %s to answer status during the flood", slowest)
	}
	// Read again whole, beside podman logs on n1 itself.
	cw := &countWriter{}
	rd := n[3].command("logs", "flood.talk", "--data-dir", n[3].n.dir)
	rd.Stdout = cw
	t0 := time.Now()
	if err := rd.Run(); err != nil {
		t.Fatalf("mesh logs flood.talk: %v", err)
	}
	meshTook := time.Since(t0)
	pw := &countWriter{}
	pl := n[1].h.podmanCmd("logs", "flood.talk")
	pl.Stdout = pw
	t0 = time.Now()
	if err := pl.Run(); err != nil {
		t.Fatalf("podman logs: %v", err)
	}
	podmanTook := time.Since(t0)
	if cw.lines != pw.lines {
		t.Fatalf("mesh logs gave %d lines, podman logs %d", cw.lines, pw.lines)
	}
	t.Logf("flood: followed from n3 in %s; n1's agent RSS %d MiB before, at most %d MiB during; its slowest status %s",
		followed.Round(10*time.Millisecond), rss0>>10, maxRSS>>10, slowest.Round(time.Millisecond))
	t.Logf("mesh logs from n3: %d lines, %.1f MB in %s: %.0f lines/s, %.1f MB/s; podman logs on n1: %.0f lines/s, %.1f MB/s; ratio %.2f",
		cw.lines, float64(cw.n)/1e6, meshTook.Round(time.Millisecond), float64(cw.lines)/meshTook.Seconds(), float64(cw.n)/1e6/meshTook.Seconds(),
		float64(pw.lines)/podmanTook.Seconds(), float64(pw.n)/1e6/podmanTook.Seconds(), podmanTook.Seconds()/meshTook.Seconds())
}

type countWriter struct{ n, lines int }

func (c *countWriter) Write(p []byte) (int, error) {
	c.n += len(p)
	c.lines += bytes.Count(p, []byte{'\n'})
	return len(p), nil
}

// checkResize: a terminal resized while the command runs is resized in
// the container too.
func checkResize(t *testing.T, a *agent, target string, extra ...string) {
	t.Helper()
	cmd := a.command(a.withDir(append(append([]string{"exec", target}, extra...), "-it", "--", "sh"))...)
	f, err := pty.StartWithSize(cmd, &pty.Winsize{Rows: 20, Cols: 70})
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	saw, _ := readPty(f)
	fmt.Fprintf(f, "stty size\n")
	eventually(t, 20*time.Second, "the first size", saw("20 70"))
	pty.Setsize(f, &pty.Winsize{Rows: 41, Cols: 133})
	eventually(t, 20*time.Second, "the new size in the container", func() (bool, string) {
		fmt.Fprintf(f, "stty size\n")
		return saw("41 133")()
	})
	fmt.Fprintf(f, "exit\n")
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	select {
	case <-done:
	case <-time.After(20 * time.Second):
		cmd.Process.Signal(syscall.SIGKILL)
		t.Fatal("exec -it did not end after exit")
	}
}

// readPty collects what a pty shows; saw(what) is a condition for
// eventually, seen the whole of it so far.
func readPty(f *os.File) (saw func(what string) func() (bool, string), seen func() string) {
	var mu sync.Mutex
	var b bytes.Buffer
	go func() {
		buf := make([]byte, 4096)
		for {
			n, err := f.Read(buf)
			mu.Lock()
			b.Write(buf[:n])
			mu.Unlock()
			if err != nil {
				return
			}
		}
	}()
	seen = func() string {
		mu.Lock()
		defer mu.Unlock()
		return b.String()
	}
	saw = func(what string) func() (bool, string) {
		return func() (bool, string) {
			out := seen()
			return strings.Contains(out, what), out
		}
	}
	return saw, seen
}
