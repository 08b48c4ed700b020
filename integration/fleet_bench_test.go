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
	"sort"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/miekg/dns"
)

// The fleet bed (issue "scale", item 3): many real agents, each in a
// network namespace of its own on one bridge, three voters and the rest
// non-voters, with modules that declare only names (no containers). The
// agents share one Podman service, which serves them nothing but empty
// lists: the bed measures the mesh, not the runtime.
const (
	fleetDir    = "/var/tmp/mesh-fleet"
	fleetBridge = "mfnbr0"
	fleetNet    = "10.231.7."
	fleetMax    = 60 // the most agents a bed makes (and cleans up)
)

func fleetCleanup() {
	exec.Command("pkill", "-KILL", "-f", fleetDir).Run()
	for i := 1; i <= fleetMax; i++ {
		exec.Command("ip", "netns", "del", fmt.Sprintf("mfn%d", i)).Run()
		exec.Command("ip", "link", "del", fmt.Sprintf("mfn%d-h", i)).Run()
	}
	exec.Command("ip", "link", "del", fleetBridge).Run()
	if _, err := os.Stat(fleetDir + "/podman/root"); err == nil {
		exec.Command("umount", "-l", fleetDir+"/podman/root/overlay").Run()
	}
	os.RemoveAll(fleetDir)
}

// fleet is a running fleet bed: n[0] is unused, n[1] inits and leads.
type fleet struct {
	n     []*agent
	conns []*dns.Conn // each node's resolver, in its namespace
}

// newFleet makes count agents: n1 inits the mesh (overlay off: the bed
// measures the replicated state and the resolvers), the others join it
// through n1; the mesh makes the first three voters.
func newFleet(t testing.TB, count int) *fleet {
	if os.Geteuid() != 0 {
		t.Fatal("the fleet bed runs as root (network namespaces); run it with sudo")
	}
	if count > fleetMax {
		t.Fatalf("at most %d agents", fleetMax)
	}
	fleetCleanup()
	t.Cleanup(fleetCleanup)
	// Every namespace's neighbours count against the host's one table
	// (gc_thresh3, 1,024 by default), and each node talks to every other
	// (liveness): n*(n-1) entries, past the bound at 33 nodes, where the
	// kernel drops packets with "neighbor table overflow". Machines of a
	// real fleet have a table each; the bed raises the host's for its run.
	for _, k := range []string{"gc_thresh2", "gc_thresh3"} {
		p := "/proc/sys/net/ipv4/neigh/default/" + k
		was, err := os.ReadFile(p)
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte("16384"), 0o644); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { os.WriteFile(p, was, 0o644) })
	}
	os.MkdirAll(fleetDir, 0o755)
	sh(t, "ip", "link", "add", fleetBridge, "type", "bridge")
	sh(t, "ip", "link", "set", fleetBridge, "up")
	pm := &host{t: t, dir: fleetDir + "/podman"}
	os.MkdirAll(pm.dir, 0o755)
	pm.conf = pm.dir + "/containers.conf"
	os.WriteFile(pm.conf, []byte(rootfulConf(pm.dir)), 0o644)
	pm.sock = pm.dir + "/podman.sock"
	pm.startService()
	t.Cleanup(pm.stopService)

	// MESH_FLEET_PROFILE=n2,n7: those agents write a CPU profile to
	// /var/tmp/mesh-fleet-NAME.prof when they stop (not n1: the bench
	// kills it with -9).
	profile := map[string]bool{}
	for _, name := range strings.Split(os.Getenv("MESH_FLEET_PROFILE"), ",") {
		profile[name] = name != ""
	}
	f := &fleet{n: []*agent{nil}}
	for i := 1; i <= count; i++ {
		ns := fmt.Sprintf("mfn%d", i)
		sh(t, "ip", "netns", "add", ns)
		sh(t, "ip", "link", "add", ns+"-h", "type", "veth", "peer", "name", ns+"-n")
		sh(t, "ip", "link", "set", ns+"-h", "master", fleetBridge, "up")
		sh(t, "ip", "link", "set", ns+"-n", "netns", ns)
		sh(t, "ip", "netns", "exec", ns, "sh", "-c", fmt.Sprintf("ip link set lo up && ip link set %s-n name eth0 && ip addr add %s%d/24 dev eth0 && ip link set eth0 up", ns, fleetNet, i))
		h := &host{t: t, dir: fmt.Sprintf("%s/n%d", fleetDir, i), dnsAddr: "169.254.53.53", netns: ns, sock: pm.sock, conf: pm.conf}
		os.MkdirAll(h.dir, 0o755)
		a := &agent{name: fmt.Sprintf("n%d", i), h: h, n: &node{t: t, dir: h.dir + "/data"},
			// A resync a minute and info logs: the bench measures the
			// commands, not fifty agents polling one Podman.
			extra: []string{"--resync", "60s", "--log-level", "info"}}
		if profile[a.name] {
			a.env = []string{"MESH_CPU_PROFILE=" + fleetDir + "-" + a.name + ".prof"}
		}
		f.n = append(f.n, a)
	}
	n1 := f.n[1]
	n1.run("init", "--name", "n1", "--address", f.addr(1), "--overlay", "off", "--data-dir", n1.n.dir)
	n1.start()
	token := strings.TrimSpace(n1.mesh("token"))
	var waits []func()
	for i := 2; i <= count; i++ {
		a := f.n[i]
		t0 := time.Now()
		// A join whose commit met a change of leader may or may not have
		// been applied; the mesh takes the same join again (as an
		// operator would run it again). Once.
		for try := 1; ; try++ {
			out, err := a.command("join", f.addr(1), "--token", token, "--name", a.name, "--address", f.addr(i), "--data-dir", a.n.dir).CombinedOutput()
			if err == nil {
				break
			}
			if try == 2 || !strings.Contains(string(out), "leadership") {
				t.Fatalf("join of %s after %s: %v\n%s\nthe leader's log:\n%s", a.name, time.Since(t0).Round(time.Millisecond), err, out, lastLines(n1.log(), 60))
			}
			t.Logf("join of %s met a change of leader, joining again: %s", a.name, lastLines(string(out), 1))
		}
		if d := time.Since(t0); d > 5*time.Second {
			t.Logf("the join of %s took %s", a.name, d.Round(time.Millisecond))
		}
		waits = append(waits, a.startAsync())
	}
	for _, w := range waits {
		w()
	}
	for i := 1; i <= count; i++ {
		f.conns = append(f.conns, nsConn(t, f.n[i].h.netns))
	}
	return f
}

func (f *fleet) addr(i int) string { return fleetNet + strconv.Itoa(i) }

// kill stops agent i with kill -9 and says when.
func (f *fleet) kill(i int) time.Time {
	a := f.n[i]
	a.cmd.Process.Signal(syscall.SIGKILL)
	a.cmd.Wait()
	a.cmd = nil
	return time.Now()
}

// assignOnceAccepted asks via to assign module to target until a write
// is accepted (a leader's kill leaves none for a while), at most 60 s
// after since, and says how long after since it was.
func (f *fleet) assignOnceAccepted(t testing.TB, via *http.Client, target int, module string, since time.Time) time.Duration {
	for {
		err := f.assign(via, target, module)
		if err == nil {
			return time.Since(since)
		}
		if time.Since(since) > 60*time.Second {
			t.Fatalf("no write accepted within 60 s of the leader's kill: %v", err)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// client is an HTTP client of node i's local API.
func (f *fleet) client(i int) *http.Client {
	sock := filepath.Join(f.n[i].n.dir, "mesh.sock")
	return &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
		return (&net.Dialer{}).DialContext(ctx, "unix", sock)
	}}}
}

// assign asks node via's local API to assign module to node target.
func (f *fleet) assign(c *http.Client, target int, module string) error {
	resp, err := c.Post("http://mesh/v1/assign", "application/json", bytes.NewReader([]byte(`{"node":"n`+strconv.Itoa(target)+`","module":"`+module+`"}`)))
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode != 200 {
		var b bytes.Buffer
		b.ReadFrom(resp.Body)
		return fmt.Errorf("%s: %s", resp.Status, strings.TrimSpace(b.String()))
	}
	return nil
}

// allAnswered waits until every resolver but those of skip answers name
// with addr, and returns how long after since each first did (sorted).
func (f *fleet) allAnswered(t testing.TB, name, addr string, since time.Time, within time.Duration, skip map[int]bool) []time.Duration {
	var at []time.Duration
	pending := map[int]bool{}
	for i := range f.conns {
		if !skip[i+1] {
			pending[i] = true
		}
	}
	for len(pending) > 0 {
		for i := range pending {
			if has, ok := answerHas(f.conns[i], name, addr); ok && has {
				at = append(at, time.Since(since))
				delete(pending, i)
			}
		}
		if time.Since(since) > within {
			t.Fatalf("%s: %d resolvers did not answer %s within %s", name, len(pending), addr, within)
		}
		if len(pending) > 0 {
			time.Sleep(time.Millisecond)
		}
	}
	sort.Slice(at, func(i, j int) bool { return at[i] < at[j] })
	return at
}

// cpuOf is the CPU time a process has used (user and system).
func cpuOf(t testing.TB, pid int) time.Duration {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		t.Fatal(err)
	}
	// The fields after the command's closing parenthesis; utime and
	// stime are the 14th and 15th of the line, in clock ticks (100 a second).
	fs := strings.Fields(string(b[bytes.LastIndexByte(b, ')')+2:]))
	u, _ := strconv.ParseUint(fs[11], 10, 64)
	s, _ := strconv.ParseUint(fs[12], 10, 64)
	return time.Duration(u+s) * 10 * time.Millisecond
}

// rssOf is a process's resident memory, in MB.
func rssOf(pid int) float64 {
	b, _ := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	for _, l := range strings.Split(string(b), "\n") {
		if rest, ok := strings.CutPrefix(l, "VmRSS:"); ok {
			kb, _ := strconv.ParseFloat(strings.TrimSuffix(strings.TrimSpace(rest), " kB"), 64)
			return kb / 1024
		}
	}
	return 0
}

// linkBytes is what node i's namespace sent and received, read on the
// host's end of its link (what it receives is what the node sent).
func linkBytes(i int) uint64 {
	var sum uint64
	for _, d := range []string{"rx_bytes", "tx_bytes"} {
		b, _ := os.ReadFile(fmt.Sprintf("/sys/class/net/mfn%d-h/statistics/%s", i, d))
		v, _ := strconv.ParseUint(strings.TrimSpace(string(b)), 10, 64)
		sum += v
	}
	return sum
}

// BenchmarkFleetAgents starts a fleet of real agents at each size (10, 25,
// 50; MESH_FLEET_SIZES overrides) and measures, over b.N assigns through
// the leader's local API, each to another node: the commit (request to
// answer); the time until every resolver answers the name (p50 and p99
// over the assigns); the leader's CPU and link bytes per command, idle
// traffic included (and its bytes per second idle and busy, to tell them
// apart); the CPU the leader and the whole fleet take idle (in cores of
// this machine, which runs every agent); each agent's RSS. Then a
// kill -9 of the leader: the time until a write through another voter is
// accepted again, and until every other resolver answers it.
// bench/fleet.sh runs it and prints how each figure grows.
func BenchmarkFleetAgents(b *testing.B) {
	sizes := []int{10, 25, 50}
	if s := os.Getenv("MESH_FLEET_SIZES"); s != "" {
		sizes = nil
		for _, f := range strings.Split(s, ",") {
			n, err := strconv.Atoi(f)
			if err != nil {
				b.Fatalf("MESH_FLEET_SIZES: %v", err)
			}
			sizes = append(sizes, n)
		}
	}
	for _, size := range sizes {
		b.Run(fmt.Sprintf("agents=%d", size), func(b *testing.B) { benchFleet(b, size) })
	}
}

func benchFleet(b *testing.B, count int) {
	b.StopTimer()
	f := newFleet(b, count)
	n1 := f.n[1]
	var files []string
	for i := 0; i < b.N+2; i++ {
		name := fmt.Sprintf("fb%04d", i)
		files = append(files, n1.manifest(name, "module: {{name}}\n", map[string]string{"name": name}))
	}
	// A commit that met a change of leader may or may not have been
	// applied: the same add again (as an operator would run it) is then
	// applied or changes nothing. Three times at most.
	for try := 1; ; try++ {
		out, err := n1.try(append(append([]string{"module", "add"}, files...), "--data-dir", n1.n.dir)...)
		if err == nil {
			break
		}
		if try == 3 || !strings.Contains(string(out), "leader") {
			b.Fatalf("module add: %v\n%s\nthe voters' warnings:\n%s", err, out, f.warnings(1, 2, 3))
		}
		b.Logf("module add met a change of leader, adding again: %s", lastLines(string(out), 1))
	}
	// Every agent has caught up once every resolver answers the first name.
	if err := f.assign(f.client(1), 2, "fb0000"); err != nil {
		b.Fatal(err)
	}
	f.allAnswered(b, "fb0000.internal", f.addr(2), time.Now(), 120*time.Second, nil)
	// The figures are the leader's, whichever node leads now: on 2 cores
	// shared by every agent, a voter may miss the leader's lease while the
	// fleet forms, and another voter lead.
	lead := f.leader(b)
	formed := f.elections()
	if lead != 1 {
		b.Logf("n%d leads, not n1 (%d elections while the fleet formed)", lead, formed)
	}
	leader := f.client(lead)

	pid := f.n[lead].cmd.Process.Pid
	// The fleet idle, over a window of its own: the leader's traffic
	// (Raft's appends and heartbeats to every follower, liveness), its CPU
	// and every agent's, so that the per-command figures can be told from
	// them, and so that one can see how much of the machine's two cores
	// the fleet takes before any command.
	fleetCPU := func() (sum time.Duration) {
		for _, a := range f.n[1:] {
			sum += cpuOf(b, a.cmd.Process.Pid)
		}
		return sum
	}
	idle0, idleCPU0, idleFleet0, idleAt := linkBytes(lead), cpuOf(b, pid), fleetCPU(), time.Now()
	time.Sleep(10 * time.Second)
	window := time.Since(idleAt).Seconds()
	idleRate := float64(linkBytes(lead)-idle0) / window
	idleLeader := (cpuOf(b, pid) - idleCPU0).Seconds() / window
	idleFleet := (fleetCPU() - idleFleet0).Seconds() / window

	var commit, all, each []time.Duration
	cpu0, bytes0, start := cpuOf(b, pid), linkBytes(lead), time.Now()
	b.StartTimer()
	for i := 1; i <= b.N; i++ {
		module := fmt.Sprintf("fb%04d", i)
		target := i%count + 1
		t0 := time.Now()
		if err := f.assign(leader, target, module); err != nil {
			b.Fatalf("assign %s: %v", module, err)
		}
		t1 := time.Now()
		commit = append(commit, t1.Sub(t0))
		at := f.allAnswered(b, module+".internal", f.addr(target), t1, 60*time.Second, nil)
		all = append(all, at[len(at)-1])
		each = append(each, at...)
	}
	b.StopTimer()
	elapsed := time.Since(start)
	cpu := cpuOf(b, pid) - cpu0
	sent := float64(linkBytes(lead) - bytes0)
	measured := f.elections() - formed

	var rss []float64
	for _, a := range f.n[1:] {
		rss = append(rss, rssOf(a.cmd.Process.Pid))
	}
	sort.Float64s(rss)

	// A kill -9 of the leader; writes go through another voter, which
	// forwards them to whoever leads.
	lead = f.leader(b)
	via := 1
	for via == lead {
		via++
	}
	module := fmt.Sprintf("fb%04d", b.N+1)
	killed := f.kill(lead)
	writable := f.assignOnceAccepted(b, f.client(via), via, module, killed)
	caught := f.allAnswered(b, module+".internal", f.addr(via), killed, 60*time.Second, map[int]bool{lead: true})

	b.ReportMetric(percentile(commit, 0.5), "commit-p50-ms")
	b.ReportMetric(percentile(commit, 0.99), "commit-p99-ms")
	b.ReportMetric(percentile(all, 0.5), "all-answer-p50-ms")
	b.ReportMetric(percentile(all, 0.99), "all-answer-p99-ms")
	b.ReportMetric(percentile(each, 0.5), "one-answer-p50-ms")
	b.ReportMetric(ms(cpu)/float64(b.N), "leader-cpu-ms/op")
	b.ReportMetric(sent/float64(b.N)/1000, "leader-kB/op")
	b.ReportMetric(idleRate/1000, "leader-idle-kB/s")
	b.ReportMetric(sent/elapsed.Seconds()/1000, "leader-busy-kB/s")
	b.ReportMetric(idleLeader, "leader-idle-cores")
	b.ReportMetric(idleFleet, "fleet-idle-cores")
	b.ReportMetric(rss[len(rss)/2], "rss-p50-MB")
	b.ReportMetric(rss[len(rss)-1], "rss-max-MB")
	b.ReportMetric(ms(writable), "failover-write-ms")
	b.ReportMetric(ms(caught[len(caught)-1]), "failover-caught-up-ms")
	b.ReportMetric(float64(formed), "elections-forming")
	b.ReportMetric(float64(measured), "elections-measured")
}

// leader is the index of the node that leads, as n1 (or, killed, n2) knows.
func (f *fleet) leader(t testing.TB) int {
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(100 * time.Millisecond) {
		for _, via := range []int{1, 2} {
			if f.n[via].cmd == nil {
				continue
			}
			resp, err := f.client(via).Get("http://mesh/v1/status")
			if err != nil {
				continue
			}
			var st struct {
				Leader string `json:"leader"`
			}
			err = json.NewDecoder(resp.Body).Decode(&st)
			resp.Body.Close()
			if i, perr := strconv.Atoi(strings.TrimPrefix(st.Leader, "n")); err == nil && perr == nil && i >= 1 && i < len(f.n) {
				return i
			}
		}
		if time.Now().After(deadline) {
			t.Fatal("no node knows a leader")
		}
	}
}

// elections counts the terms a node won, in every agent's log.
func (f *fleet) elections() int {
	n := 0
	for _, a := range f.n[1:] {
		n += strings.Count(a.log(), "entering leader state")
	}
	return n
}

// warnings is the last warnings and errors of the nodes' logs.
func (f *fleet) warnings(nodes ...int) string {
	var all []string
	for _, i := range nodes {
		var keep []string
		for _, l := range strings.Split(f.n[i].log(), "\n") {
			if strings.Contains(l, "level=WARN") || strings.Contains(l, "level=ERROR") {
				keep = append(keep, l)
			}
		}
		all = append(all, fmt.Sprintf("n%d:", i))
		all = append(all, keep[max(0, len(keep)-20):]...)
	}
	return strings.Join(all, "\n")
}
