package integration

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	meshagent "mesh/agent"
	"net"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"
)

// Beds share these names; each bed cleans up what a crashed run of it left.
const (
	bedImage = "localhost/mesh-bed-busybox:1"
	// bedVolumeImage is bedImage declaring a VOLUME (/cache/data).
	bedVolumeImage = "localhost/mesh-bed-volume:1"
	bedUser        = "meshbed" // contrib/test.sh creates it, with subuids
	bedLink        = "mbeddns0"
	bedNet         = "mbednet"
	bedNetns       = "mbedq"
	bedRootful     = "/var/tmp/mesh-bed"
	bedDNSRoot     = "169.254.53.61"
	bedDNSUser     = "169.254.53.62"
	bedDNSOne      = "169.254.53.63"
	containersC    = `[containers]
default_ulimits = []

[engine]
runtime = "runc"
cgroup_manager = "cgroupfs"
events_logger = "file"
`
)

// rootfulConf is containersC for a rootful bed's Podman in dir: its
// networks (each module's, the mesh's) are kept in the bed's own directory,
// so they go with it, not into the host's /etc/containers/networks.
func rootfulConf(dir string) string {
	return containersC + fmt.Sprintf("\n[network]\nnetwork_config_dir = %q\n", filepath.Join(dir, "networks"))
}

// eventually polls cond until it holds or the deadline passes.
func eventually(t testing.TB, within time.Duration, what string, cond func() (bool, string)) {
	t.Helper()
	deadline := time.Now().Add(within)
	last := ""
	for {
		ok, state := cond()
		if ok {
			return
		}
		last = state
		if time.Now().After(deadline) {
			t.Fatalf("%s: not within %s; last seen: %s", what, within, last)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

func sh(t testing.TB, name string, args ...string) string {
	t.Helper()
	out, err := exec.Command(name, args...).CombinedOutput()
	if err != nil {
		t.Fatalf("%s %s: %v\n%s", name, strings.Join(args, " "), err, out)
	}
	return string(out)
}

// host is where a bed's node runs: as root with its own Podman storage, or as
// the rootless bed user.
type host struct {
	t        testing.TB
	rootless bool
	usr      *user.User
	dir      string // the bed's own directory; manifests' paths live under it
	sock     string
	conf     string
	runtime  string // XDG_RUNTIME_DIR for the rootless user
	svc      *exec.Cmd
	dnsAddr  string
	// netns, when set, is the network namespace the node's agent and Podman
	// service run in (the multi-node beds).
	netns string
	// tunMode is /dev/net/tun's mode before mesh setup; madeLink: setup
	// made meshdns0 for the bed.
	tunMode  os.FileMode
	madeLink bool
	// env is more environment for the Podman service and CLI.
	env []string
}

func newHost(t testing.TB, rootless bool) *host {
	if os.Geteuid() != 0 {
		t.Fatal("the host beds run as root (they create users' runtime dirs, bridges and Podman services); run contrib/test.sh as root")
	}
	for _, bin := range []string{"podman", "runc", "ip", "busybox"} {
		if _, err := exec.LookPath(bin); err != nil {
			t.Fatalf("%s is missing; contrib/test.sh installs what the beds need", bin)
		}
	}
	h := &host{t: t, rootless: rootless, dnsAddr: bedDNSRoot}
	if rootless {
		u, err := user.Lookup(bedUser)
		if err != nil {
			t.Fatalf("user %s is missing; contrib/test.sh creates it (useradd -m %s)", bedUser, bedUser)
		}
		h.usr = u
		h.dir = filepath.Join(u.HomeDir, "mesh-bed")
		h.runtime = "/run/user/" + u.Uid
		h.dnsAddr = bedDNSUser
	} else {
		h.dir = bedRootful
	}
	h.cleanup()
	t.Cleanup(h.cleanup)
	if err := os.MkdirAll(filepath.Join(h.dir, "srv"), 0o755); err != nil {
		t.Fatal(err)
	}
	h.conf = filepath.Join(h.dir, "containers.conf")
	if rootless {
		os.WriteFile(h.conf, []byte(containersC), 0o644)
	} else {
		os.WriteFile(h.conf, []byte(rootfulConf(h.dir)), 0o644)
	}
	if rootless {
		uid, _ := strconv.Atoi(h.usr.Uid)
		gid, _ := strconv.Atoi(h.usr.Gid)
		for _, d := range []string{h.dir, filepath.Join(h.dir, "srv"), h.runtime} {
			os.MkdirAll(d, 0o700)
			os.Chown(d, uid, gid)
		}
		os.Chown(h.conf, uid, gid)
		h.sock = filepath.Join(h.runtime, "mesh-bed-podman.sock")
		// A rootless host is prepared once, as root, by mesh setup (on the
		// bed's own address): the address on its bridge, port 53 for the
		// bed user's agent alone (the helper), /dev/net/tun.
		if fi, err := os.Stat("/dev/net/tun"); err == nil {
			h.tunMode = fi.Mode().Perm()
		}
		h.madeLink = exec.Command("ip", "link", "show", "meshdns0").Run() != nil
		out := sh(t, meshBin, "setup", "--dns-address", h.dnsAddr, "--user", bedUser, "--data-dir", filepath.Join(h.dir, "data"))
		if !strings.Contains(out, "port 53: only "+bedUser+"'s agent may bind it") || !dnsAddrUp(h.dnsAddr) {
			t.Fatalf("mesh setup:\n%s", out)
		}
	} else {
		h.sock = filepath.Join(h.dir, "podman.sock")
		// The resolver address on the bed's own port-less bridge.
		sh(t, "ip", "link", "add", bedLink, "type", "bridge")
		sh(t, "ip", "addr", "add", h.dnsAddr+"/32", "dev", bedLink)
		sh(t, "ip", "link", "set", bedLink, "up")
	}
	h.importImage()
	h.startService()
	return h
}

// cleanup removes what this bed (or a crashed run of it) left: processes,
// containers, storage mounts, the bridge.
func (h *host) cleanup() {
	exec.Command("pkill", "-f", h.dir).Run()
	if h.rootless {
		h.podmanCmd("rm", "-af", "-t", "0").Run()
		h.podmanCmd("system", "migrate").Run()
		exec.Command("pkill", "-u", bedUser).Run()
	} else if _, err := os.Stat(filepath.Join(h.dir, "root")); err == nil {
		h.podmanCmd("rm", "-af", "-t", "0").Run()
		// The bridges of the modules' networks: Podman's CNI backend
		// leaves them, with their subnets, when the networks go with the
		// bed's directory, and a later bed's network of the same module,
		// given another subnet, could not use its bridge.
		out, _ := h.podmanCmd("network", "ls", "--filter", "label=mesh.managed=1", "--format", "{{.NetworkInterface}}").Output()
		for _, i := range strings.Fields(string(out)) {
			exec.Command("ip", "link", "del", i).Run()
		}
		exec.Command("umount", "-l", filepath.Join(h.dir, "root", "overlay")).Run()
	}
	exec.Command("ip", "link", "del", bedLink).Run()
	h.podmanCmd("network", "rm", "-f", bedNet).Run()
	exec.Command("ip", "netns", "del", bedNetns).Run()
	exec.Command("ip", "link", "del", bedNetns+"-h").Run()
	killConmons(h.dir)
	// Directories the bed's modules made may be owned by subuids; root removes them.
	os.RemoveAll(h.dir)
	if h.rootless {
		// The rootless agent's runtime directory is the bed user's.
		os.RemoveAll(filepath.Join(h.runtime, "mesh"))
	} else {
		os.RemoveAll(filepath.Dir(meshagent.EnvDir(filepath.Join(h.dir, "data"))))
	}
	if h.rootless {
		// Only what mesh setup added for the bed: its address (and the link,
		// unless a real agent of this host had it) and the bed user's helper.
		exec.Command("ip", "addr", "del", h.dnsAddr+"/32", "dev", "meshdns0").Run()
		if h.madeLink {
			exec.Command("ip", "link", "del", "meshdns0").Run()
		}
		os.RemoveAll(filepath.Dir(agentHelper))
		if h.tunMode != 0 {
			os.Chmod("/dev/net/tun", h.tunMode)
		}
	}
}

// killConmons kills what is left of the containers of the Podman stores
// under dir once podman rm has run: a conmon that outlived it (a store
// another Podman made, a service killed mid-call) and its container's
// processes, which would otherwise outlive the bed.
func killConmons(dir string) {
	out, _ := exec.Command("pgrep", "-f", "conmon .*"+dir).Output()
	for _, pid := range strings.Fields(string(out)) {
		exec.Command("pkill", "-KILL", "-P", pid).Run()
		exec.Command("kill", "-KILL", pid).Run()
	}
}

func dnsAddrUp(addr string) bool {
	out, _ := exec.Command("ip", "-o", "addr", "show", "dev", "meshdns0").Output()
	return strings.Contains(string(out), " "+addr+"/32")
}

// asUser wraps a command to run as the bed user with its runtime dir.
func (h *host) asUser(name string, args ...string) *exec.Cmd {
	full := append([]string{"-u", bedUser, "--", "env", "XDG_RUNTIME_DIR=" + h.runtime, "HOME=" + h.usr.HomeDir,
		"CONTAINERS_CONF=" + h.conf, name}, args...)
	cmd := exec.Command("runuser", full...)
	cmd.Dir = "/"
	return cmd
}

// podmanCmd runs the podman CLI against the bed's storage.
func (h *host) podmanCmd(args ...string) *exec.Cmd {
	cmd := h.podmanHere(args...)
	// A node in a namespace runs podman there, as its service does: a
	// container removed from outside would leave its port forwarding in
	// the node's network namespace, and a node with a mount namespace of
	// its own (multi_test.go) has its storage and its containers'
	// namespaces mounted there only.
	if !h.rootless && h.netns != "" {
		return inNetns(h.netns, cmd)
	}
	return cmd
}

// podmanHere is podmanCmd in the caller's own namespaces.
func (h *host) podmanHere(args ...string) *exec.Cmd {
	if h.rootless {
		return h.asUser("podman", args...)
	}
	full := append([]string{"--root", filepath.Join(h.dir, "root"), "--runroot", filepath.Join(h.dir, "runroot")}, args...)
	cmd := exec.Command("podman", full...)
	cmd.Env = append(append(os.Environ(), "CONTAINERS_CONF="+h.conf), h.env...)
	return cmd
}

// oomScoreAdj is the kernel's oom_score_adj of a container's process, read
// from /proc (the beds share the host's PID namespace).
func (h *host) oomScoreAdj(name string) string {
	h.t.Helper()
	pid := strings.TrimSpace(h.podman("inspect", "--format", "{{.State.Pid}}", name))
	b, err := os.ReadFile("/proc/" + pid + "/oom_score_adj")
	if err != nil {
		h.t.Fatalf("the oom_score_adj of %s (pid %q): %v", name, pid, err)
	}
	return strings.TrimSpace(string(b))
}

func (h *host) podman(args ...string) string {
	h.t.Helper()
	out, err := h.podmanCmd(args...).CombinedOutput()
	if err != nil {
		h.t.Fatalf("podman %s: %v\n%s", strings.Join(args, " "), err, out)
	}
	return string(out)
}

func (h *host) importImage() {
	h.t.Helper()
	tar := filepath.Join(h.dir, "rootfs.tar")
	sh(h.t, "bash", "../contrib/busybox-rootfs.sh", tar)
	h.podman("import", "--change", `CMD ["/bin/sh"]`, tar, bedImage)
	h.podman("import", "--change", `CMD ["/bin/sh"]`, "--change", "VOLUME /cache/data", tar, bedVolumeImage)
}

func (h *host) startService() {
	h.t.Helper()
	var cmd *exec.Cmd
	if h.rootless {
		cmd = h.asUser("podman", "system", "service", "--time", "0", "unix://"+h.sock)
	} else {
		cmd = h.podmanHere("system", "service", "--time", "0", "unix://"+h.sock)
	}
	if h.netns != "" {
		cmd = inNetns(h.netns, cmd)
	}
	logName := filepath.Join(h.t.TempDir(), "podman.log")
	logf, _ := os.OpenFile(logName, os.O_CREATE|os.O_WRONLY, 0o644)
	cmd.Stdout, cmd.Stderr = logf, logf
	if err := cmd.Start(); err != nil {
		h.t.Fatal(err)
	}
	h.svc = cmd
	eventually(h.t, 30*time.Second, "podman service listens on "+h.sock, func() (bool, string) {
		c, err := net.Dial("unix", h.sock)
		if err != nil {
			b, _ := os.ReadFile(logName)
			return false, err.Error() + "; its log: " + lastLines(string(b), 5)
		}
		c.Close()
		return true, ""
	})
}

// stopService kills the Podman service (the agent must cope).
func (h *host) stopService() {
	if h.svc == nil {
		return
	}
	h.svc.Process.Kill()
	h.svc.Wait()
	h.svc = nil
	os.Remove(h.sock)
}

// containerID is the ID of a running or stopped container, "" if none.
func (h *host) containerID(name string) string {
	out, err := h.podmanCmd("ps", "-a", "--filter", "name=^"+regexp.QuoteMeta(name)+"$", "--format", "{{.ID}} {{.State}}").Output()
	if err != nil {
		return ""
	}
	if f := strings.Fields(string(out)); len(f) > 0 {
		return f[0]
	}
	return ""
}

// hostID maps a container-side uid to the host's, as the bed sees files.
func (h *host) hostID(id int) int {
	if !h.rootless || id == 0 {
		if h.rootless {
			uid, _ := strconv.Atoi(h.usr.Uid)
			return uid
		}
		return id
	}
	b, _ := os.ReadFile("/etc/subuid")
	for _, l := range strings.Split(string(b), "\n") {
		f := strings.Split(l, ":")
		if len(f) == 3 && f[0] == bedUser {
			start, _ := strconv.Atoi(f[1])
			return start + id - 1
		}
	}
	h.t.Fatalf("no subuid range for %s", bedUser)
	return -1
}

// agent is a mesh node on a host.
type agent struct {
	name  string // the mesh node's name
	h     *host
	n     *node
	cmd   *exec.Cmd
	mu    sync.Mutex
	lines []string
	// logged is closed when the running agent's output ended (it exited).
	logged chan struct{}
	// json: the agent logs with --log-format json.
	json bool
	// extra: more flags for mesh agent.
	extra []string
	// bin, when set, is the mesh binary this node runs (else meshBin).
	bin string
	// overlay is the node's overlay address, once oaddr read it.
	overlay string
	// env: more environment for mesh agent.
	env []string
}

func (h *host) newAgent(t testing.TB) *agent { return h.newAgentAt(t, "127.0.0.1") }

// newAgentAt is a node whose mesh address is addr: what its names answer.
func (h *host) newAgentAt(t testing.TB, addr string) *agent {
	n := &node{t: t, dir: filepath.Join(h.dir, "data")}
	a := &agent{name: "ace", h: h, n: n}
	// The one-node beds are about the host, not the network: their ports
	// are published on the node's address (127.0.0.1), as with --overlay off
	// (the overlay beds are overlay_test.go).
	args := []string{"init", "--name", "ace", "--address", addr, "--port", freePort(t), "--data-dir", n.dir, "--overlay", "off"}
	a.run(args...)
	a.start()
	return a
}

func (a *agent) command(args ...string) *exec.Cmd {
	bin := meshBin
	if a.bin != "" {
		bin = a.bin
	}
	if a.h.rootless {
		if a.h.netns != "" {
			return inNetns(a.h.netns, a.h.asUser(bin, args...))
		}
		return a.h.asUser(bin, args...)
	}
	if a.h.netns != "" {
		return inNetns(a.h.netns, exec.Command(bin, args...))
	}
	return exec.Command(bin, args...)
}

// inNetns runs cmd inside a network namespace, and the node's mount
// namespace when it has one (multi_test.go). nsenter, not ip netns exec:
// that one remounts /sys and hides the cgroup mounts runc needs.
func inNetns(ns string, cmd *exec.Cmd) *exec.Cmd {
	args := []string{"--net=/run/netns/" + ns}
	if _, err := os.Stat(filepath.Join(multiMnt, ns)); err == nil {
		// Entering a mount namespace moves to its root: stay where we are.
		args = append(args, "--mount="+filepath.Join(multiMnt, ns), "--wd="+cwd())
	}
	c := exec.Command("nsenter", append(args, cmd.Args...)...)
	c.Env = cmd.Env
	return c
}

// run runs a mesh command (as the bed's user) and fails the test on error.
func (a *agent) run(args ...string) string {
	a.h.t.Helper()
	out, err := a.try(args...)
	if err != nil {
		a.h.t.Fatalf("mesh %s: %v\n%s", strings.Join(args, " "), err, out)
	}
	return string(out)
}

// try runs a mesh command (as given), killed after 2 minutes, and returns
// its output and how it ended.
func (a *agent) try(args ...string) ([]byte, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cmd := a.command(args...)
	ctxCmd := exec.CommandContext(ctx, cmd.Path, cmd.Args[1:]...)
	ctxCmd.Env, ctxCmd.Dir = cmd.Env, cmd.Dir
	return ctxCmd.CombinedOutput()
}

func (a *agent) mesh(args ...string) string { return a.run(append(args, "--data-dir", a.n.dir)...) }

// meshFails runs a command that must fail and returns its output.
func (a *agent) meshFails(args ...string) string {
	a.h.t.Helper()
	return a.runFails(append(args, "--data-dir", a.n.dir)...)
}

// runFails runs a mesh command (as given) that must fail.
func (a *agent) runFails(args ...string) string {
	a.h.t.Helper()
	out, err := a.command(args...).CombinedOutput()
	if err == nil {
		a.h.t.Fatalf("mesh %s succeeded:\n%s", strings.Join(args, " "), out)
	}
	return string(out)
}

func (a *agent) start() {
	a.h.t.Helper()
	a.startAsync()()
}

// startAsync starts the agent and returns a function that waits until it is
// ready (the lines "agent ready" says once it has a leader).
func (a *agent) startAsync() (waitReady func()) {
	t := a.h.t
	t.Helper()
	args := []string{"agent", "--data-dir", a.n.dir, "--dns-address", a.h.dnsAddr, "--podman-socket", a.h.sock, "--resync", "1s", "--log-level", "debug"}
	if a.json {
		args = append(args, "--log-format", "json")
	}
	args = append(args, a.extra...)
	cmd := a.command(args...)
	if a.h.netns != "" {
		cmd.Env = append(os.Environ(), "CONTAINERS_CONF="+a.h.conf)
	}
	if len(a.env) > 0 {
		if cmd.Env == nil {
			cmd.Env = os.Environ()
		}
		cmd.Env = append(cmd.Env, a.env...)
	}
	pr, pw, _ := os.Pipe()
	cmd.Stderr, cmd.Stdout = pw, pw
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	pw.Close()
	a.cmd = cmd
	logged := make(chan struct{})
	a.mu.Lock()
	a.lines = nil // a restart's log starts afresh
	a.logged = logged
	a.mu.Unlock()
	t.Cleanup(a.stop)
	ready := make(chan struct{})
	go func() {
		defer close(logged)
		sc := bufio.NewScanner(pr)
		sc.Buffer(make([]byte, 1<<20), 1<<20)
		once := sync.Once{}
		for sc.Scan() {
			a.mu.Lock()
			a.lines = append(a.lines, sc.Text())
			a.mu.Unlock()
			if strings.Contains(sc.Text(), `msg="agent ready"`) || strings.Contains(sc.Text(), `"msg":"agent ready"`) {
				once.Do(func() { close(ready) })
			}
		}
	}()
	return func() {
		t.Helper()
		select {
		case <-ready:
		case <-time.After(60 * time.Second):
			t.Fatalf("agent not ready within 60s:\n%s", a.log())
		}
	}
}

func (a *agent) stop() {
	if a.cmd == nil || a.cmd.Process == nil {
		return
	}
	// The rootless agent runs under runuser and podman unshare: signal the group.
	a.cmd.Process.Signal(os.Interrupt)
	exec.Command("pkill", "-INT", "-f", "mesh agent --data-dir "+a.n.dir).Run()
	done := make(chan struct{})
	go func() { a.cmd.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(20 * time.Second):
		a.cmd.Process.Kill()
		exec.Command("pkill", "-KILL", "-f", "mesh agent --data-dir "+a.n.dir).Run()
		<-done
	}
	a.cmd = nil
}

// exitedLog is the log of an agent found exited, once its output ended
// (its last lines, why it exited, may still be in the pipe), waiting up to
// 5 s for that.
func (a *agent) exitedLog() string {
	a.mu.Lock()
	logged := a.logged
	a.mu.Unlock()
	if logged != nil {
		select {
		case <-logged:
		case <-time.After(5 * time.Second):
		}
	}
	return a.log()
}

func (a *agent) log() string {
	a.mu.Lock()
	defer a.mu.Unlock()
	return strings.Join(a.lines, "\n")
}

// linesAfter is the agent's log from line i on.
func (a *agent) linesAfter(i int) []string {
	a.mu.Lock()
	defer a.mu.Unlock()
	return append([]string(nil), a.lines[min(i, len(a.lines)):]...)
}

func (a *agent) logLen() int {
	a.mu.Lock()
	defer a.mu.Unlock()
	return len(a.lines)
}

var appliedRE = regexp.MustCompile(`msg="applied plan".* version=(\d+) mutations=(\d+) podman_calls=(\d+)`)

// nextApply waits for an apply logged after line `after` and returns its
// plan version, mutations and Podman calls.
func (a *agent) nextApply(after int) (version, mutations, calls int) {
	t := a.h.t
	t.Helper()
	eventually(t, 30*time.Second, "an apply after log line "+strconv.Itoa(after), func() (bool, string) {
		a.mu.Lock()
		defer a.mu.Unlock()
		for _, l := range a.lines[min(after, len(a.lines)):] {
			if m := appliedRE.FindStringSubmatch(l); m != nil {
				version, _ = strconv.Atoi(m[1])
				mutations, _ = strconv.Atoi(m[2])
				calls, _ = strconv.Atoi(m[3])
				return true, ""
			}
		}
		return false, fmt.Sprintf("%d lines", len(a.lines))
	})
	return
}

// manifest writes a module's manifest with the bed's paths and values.
func (a *agent) manifest(name, tmpl string, vars map[string]string) string {
	s := strings.ReplaceAll(tmpl, "{{root}}", filepath.Join(a.h.dir, "srv"))
	for k, v := range vars {
		s = strings.ReplaceAll(s, "{{"+k+"}}", v)
	}
	p := filepath.Join(a.h.dir, name+".yaml")
	if err := os.WriteFile(p, []byte(s), 0o644); err != nil {
		a.h.t.Fatal(err)
	}
	return p
}

func httpGet(addr string) (string, error) {
	c, err := net.DialTimeout("tcp", addr, 2*time.Second)
	if err != nil {
		return "", err
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(3 * time.Second))
	fmt.Fprintf(c, "GET / HTTP/1.0\r\n\r\n")
	var b bytes.Buffer
	b.ReadFrom(c)
	return b.String(), nil
}

func cwd() string {
	d, _ := os.Getwd()
	return d
}
