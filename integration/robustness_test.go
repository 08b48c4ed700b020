package integration

import (
	"context"
	"errors"
	"fmt"
	"math"
	"math/rand"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/anishathalye/porcupine"
	"github.com/miekg/dns"

	"mesh/cluster/api"
	"mesh/state"
)

// The robustness suite (issue 34 item 3), in the style of etcd's: real
// agents in network namespaces, clients on every node writing and reading
// through the CLI's API while a fault injector kills, pauses, cuts off,
// degrades, fills the disk of and rolls back nodes, one fault at a time and
// two at once. Every operation is recorded (invocation, response, times)
// and the history is checked with porcupine against a model of the
// catalogue and its assignments: the writes and the leader's linearizable
// reads must be linearizable; follower reads may be stale but never go
// backwards on one node (a node restarted from an older copy of its data
// excepted, until it caught up); no resolver answers a module's name with a
// node it was never assigned to; and once the faults stop every replica
// holds the same catalogue and assignments, which a final linearizable
// read of each module checks against the history.
//
// MESH_ROBUSTNESS_BUDGET (default 3m) is how long faults are injected;
// MESH_ROBUSTNESS_NODES (3 or 5, default 3) how many nodes. CI runs the
// default; bench/robustness.sh runs 30 minutes and prints the figures. A
// history that fails the check is kept as porcupine's visualisation under
// MESH_ARTIFACTS (default /var/tmp/mesh-artifacts).

const robustModules = 6

// robustInput is an operation on one module; node is an index into the
// bed's nodes (0-based) for assign and unassign.
type robustInput struct {
	Op     string // add, assign, unassign, read
	Module int
	Node   int
}

// Outputs.
const (
	outOK          = "ok"
	outMissing     = "missing"      // the module is not in the catalogue
	outNotAssigned = "not-assigned" // unassign of a module the node does not run
	outUnknown     = "unknown"      // no answer: it may have been applied, now or later
)

type robustOutput struct {
	Result string
	Nodes  uint32 // a read's assignment set, as bits
}

// robustState is one module's state in the model.
type robustState struct {
	Added bool
	Nodes uint32
}

// robustModel is the catalogue and assignments, one module per partition.
// An operation with no answer may have taken effect or not.
var robustModel = porcupine.NondeterministicModel{
	Partition: func(h []porcupine.Operation) [][]porcupine.Operation {
		by := map[int][]porcupine.Operation{}
		for _, op := range h {
			m := op.Input.(robustInput).Module
			by[m] = append(by[m], op)
		}
		var out [][]porcupine.Operation
		for m := 0; m < robustModules; m++ {
			if len(by[m]) > 0 {
				out = append(out, by[m])
			}
		}
		return out
	},
	Init: func() []interface{} { return []interface{}{robustState{}} },
	Step: func(st, in, out interface{}) []interface{} {
		s, i, o := st.(robustState), in.(robustInput), out.(robustOutput)
		bit := uint32(1) << i.Node
		switch i.Op {
		case "add":
			after := robustState{Added: true, Nodes: s.Nodes}
			if o.Result == outUnknown {
				return []interface{}{s, after}
			}
			return []interface{}{after}
		case "assign":
			after := s
			if s.Added {
				after.Nodes |= bit
			}
			switch o.Result {
			case outUnknown:
				return []interface{}{s, after}
			case outOK:
				if s.Added {
					return []interface{}{after}
				}
			case outMissing:
				if !s.Added {
					return []interface{}{s}
				}
			}
			return nil
		case "unassign":
			after := s
			after.Nodes &^= bit
			switch o.Result {
			case outUnknown:
				return []interface{}{s, after}
			case outOK:
				if s.Nodes&bit != 0 {
					return []interface{}{after}
				}
			case outNotAssigned:
				if s.Nodes&bit == 0 {
					return []interface{}{s}
				}
			}
			return nil
		case "read":
			switch o.Result {
			case outOK:
				if s.Added && s.Nodes == o.Nodes {
					return []interface{}{s}
				}
			case outMissing:
				if !s.Added {
					return []interface{}{s}
				}
			}
			return nil
		}
		return nil
	},
	DescribeOperation: func(in, out interface{}) string {
		i, o := in.(robustInput), out.(robustOutput)
		switch i.Op {
		case "add":
			return fmt.Sprintf("add rb%d -> %s", i.Module, o.Result)
		case "read":
			return fmt.Sprintf("read rb%d -> %s %b", i.Module, o.Result, o.Nodes)
		}
		return fmt.Sprintf("%s n%d rb%d -> %s", i.Op, i.Node+1, i.Module, o.Result)
	},
	DescribeState: func(st interface{}) string {
		s := st.(robustState)
		return fmt.Sprintf("added=%v nodes=%b", s.Added, s.Nodes)
	},
}

func robustManifest(m int) state.ModuleText {
	return state.ModuleText{File: fmt.Sprintf("rb%d.yaml", m), Text: fmt.Sprintf("module: rb%d\n", m)}
}

// classify turns a write's error into the model's output: the FSM's own
// refusals are answers; anything else (no leader, a timeout, a node gone)
// leaves the write's fate unknown.
func classify(err error) string {
	switch {
	case err == nil:
		return outOK
	case strings.Contains(err.Error(), "is not in the catalogue"):
		return outMissing
	case strings.Contains(err.Error(), "is not assigned to node"):
		return outNotAssigned
	}
	return outUnknown
}

// robustHistory records operations from several clients.
type robustHistory struct {
	mu    sync.Mutex
	start time.Time
	ops   []porcupine.Operation
	// acked holds the times of acknowledged writes, for unavailability.
	acked []time.Duration
	// everAssigned[module][node]: an assign was invoked.
	everAssigned [robustModules][8]bool
	counts       map[string]int
}

func (h *robustHistory) now() int64 { return int64(time.Since(h.start)) }

func (h *robustHistory) record(client int, in robustInput, call int64, out robustOutput) {
	ret := h.now()
	if out.Result == outUnknown {
		ret = math.MaxInt64 // it may take effect any time later
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	h.ops = append(h.ops, porcupine.Operation{ClientId: client, Input: in, Call: call, Output: out, Return: ret})
	h.counts[in.Op+" "+out.Result]++
	if in.Op != "read" && out.Result != outUnknown {
		h.acked = append(h.acked, time.Duration(ret))
	}
}

// robustFault is one kind of fault: it starts on the bed and returns what
// ends it.
type robustFault struct {
	name  string
	start func(b *robustBed, r *rand.Rand) (end func())
}

type robustBed struct {
	t       *testing.T
	n       []*agent // n[0] unused
	clients []*api.Client
	// fullDisk is the node whose data dir is a small tmpfs; oldCopy the
	// node with a copy of its data dir from early in the run.
	fullDisk, oldCopy int
	netem             bool
	// readers read each node's own replica, apart from the writers (whose
	// reads would wait for their own writes).
	readers []*api.Client
	fr      followerReads
	// refusedReads counts linearizable reads refused (by a follower, or a
	// leader that could not confirm it leads).
	refusedReads atomic.Int64
}

// leader is the index of the node the others follow, 0 when none is known.
func (b *robustBed) leader() int {
	for i := 1; i < len(b.n); i++ {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		st, err := b.clients[i].Status(ctx)
		cancel()
		if err == nil && st.Leader != "" {
			for j := 1; j < len(b.n); j++ {
				if b.n[j].name == st.Leader {
					return j
				}
			}
		}
	}
	return 0
}

func (b *robustBed) pick(r *rand.Rand, leader bool) int {
	l := b.leader()
	if leader && l != 0 {
		return l
	}
	for {
		i := 1 + r.Intn(len(b.n)-1)
		if i != l || len(b.n) == 2 {
			return i
		}
	}
}

func (b *robustBed) kill(i int) func() {
	b.n[i].kill9()
	return func() { b.n[i].startAsync() }
}

// pause stops the node's agent (SIGSTOP), checked: its process is in
// state T.
func (b *robustBed) pause(i int) func() {
	pattern := "mesh agent --data-dir " + b.n[i].n.dir
	exec.Command("pkill", "-STOP", "-f", pattern).Run()
	out, _ := exec.Command("pgrep", "-f", pattern).Output()
	for _, pid := range strings.Fields(string(out)) {
		stat, _ := os.ReadFile("/proc/" + pid + "/stat")
		if f := strings.Fields(string(stat[bytesIndex(stat, ')')+1:])); len(f) == 0 || f[0] != "T" {
			b.t.Errorf("n%d's agent (pid %s) is not stopped after SIGSTOP: %q", i, pid, stat)
		}
	}
	if len(out) == 0 {
		b.t.Logf("n%d's agent was not running when it was to be paused", i)
	}
	return func() { exec.Command("pkill", "-CONT", "-f", pattern).Run() }
}

func bytesIndex(b []byte, c byte) int {
	for i := len(b) - 1; i >= 0; i-- {
		if b[i] == c {
			return i
		}
	}
	return -1
}

// cut takes the node's link down at the bridge: nothing goes in or out.
func (b *robustBed) cut(i int) func() {
	link := b.n[i].h.netns + "-h"
	sh(b.t, "ip", "link", "set", link, "down")
	if st, _ := os.ReadFile("/sys/class/net/" + link + "/operstate"); strings.TrimSpace(string(st)) != "down" {
		b.t.Errorf("n%d's link %s is %q after ip link set down", i, link, st)
	}
	return func() { sh(b.t, "ip", "link", "set", link, "up") }
}

// degrade drops 30 % of the node's packets each way (iptables' statistic
// match) and, where the kernel has netem, delays them by 200 ms.
func (b *robustBed) degrade(i int) func() {
	ns := b.n[i].h.netns
	for _, chain := range []string{"INPUT", "OUTPUT"} {
		sh(b.t, "ip", "netns", "exec", ns, "iptables", "-A", chain, "-m", "statistic", "--mode", "random", "--probability", "0.3", "-j", "DROP")
	}
	if b.netem {
		sh(b.t, "ip", "netns", "exec", ns, "tc", "qdisc", "add", "dev", "eth0", "root", "netem", "delay", "200ms")
	}
	return func() {
		for _, chain := range []string{"INPUT", "OUTPUT"} {
			sh(b.t, "ip", "netns", "exec", ns, "iptables", "-D", chain, "-m", "statistic", "--mode", "random", "--probability", "0.3", "-j", "DROP")
		}
		if b.netem {
			exec.Command("ip", "netns", "exec", ns, "tc", "qdisc", "del", "dev", "eth0", "root").Run()
		}
	}
}

// fill fills the tmpfs that holds the node's data dir.
func (b *robustBed) fill() func() {
	f := filepath.Join(b.n[b.fullDisk].n.dir, "robustness-fill")
	exec.Command("dd", "if=/dev/zero", "of="+f, "bs=1M").Run() // until ENOSPC
	var fs syscall.Statfs_t
	if err := syscall.Statfs(f, &fs); err != nil || fs.Bavail*uint64(fs.Bsize) > 1<<20 {
		b.t.Errorf("the full-disk fault left %d bytes free on n%d's data dir (%v)", fs.Bavail*uint64(fs.Bsize), b.fullDisk, err)
	}
	return func() { os.Remove(f) }
}

// rollBack restarts the node from the copy of its data dir taken early in
// the run: its log, its vote and its replica from an older index.
func (b *robustBed) rollBack() func() {
	a := b.n[b.oldCopy]
	a.kill9()
	// Its reads start again from the copy's index: from the restart on
	// they must not go back.
	b.fr.mu.Lock()
	b.fr.last[b.oldCopy] = 0
	b.fr.rolledBack++
	b.fr.mu.Unlock()
	if err := os.RemoveAll(a.n.dir); err != nil {
		b.t.Fatalf("remove n%d's data dir for the older copy: %v", b.oldCopy, err)
	}
	sh(b.t, "cp", "-a", a.n.dir+".old", a.n.dir)
	return func() { a.startAsync() }
}

var robustFaults = []robustFault{
	{"kill -9 leader", func(b *robustBed, r *rand.Rand) func() { return b.kill(b.pick(r, true)) }},
	{"kill -9 follower", func(b *robustBed, r *rand.Rand) func() { return b.kill(b.pick(r, false)) }},
	{"SIGSTOP leader", func(b *robustBed, r *rand.Rand) func() { return b.pause(b.pick(r, true)) }},
	{"SIGSTOP follower", func(b *robustBed, r *rand.Rand) func() { return b.pause(b.pick(r, false)) }},
	{"partition leader", func(b *robustBed, r *rand.Rand) func() { return b.cut(b.pick(r, true)) }},
	{"partition follower", func(b *robustBed, r *rand.Rand) func() { return b.cut(b.pick(r, false)) }},
	{"packet loss", func(b *robustBed, r *rand.Rand) func() { return b.degrade(b.pick(r, r.Intn(2) == 0)) }},
	{"full disk", func(b *robustBed, r *rand.Rand) func() { return b.fill() }},
	{"restart from an older copy", func(b *robustBed, r *rand.Rand) func() { return b.rollBack() }},
}

func envDuration(name string, def time.Duration) time.Duration {
	if d, err := time.ParseDuration(os.Getenv(name)); err == nil && d > 0 {
		return d
	}
	return def
}

// newRobustBed makes the bed's nodes; node fullDisk's data dir is a 256 MiB
// tmpfs, mounted before its mount namespace is made so that the agent and
// the test see the same one.
func newRobustBed(t *testing.T, count int) *robustBed {
	if os.Geteuid() != 0 {
		t.Fatal("the robustness suite runs as root (network namespaces); run contrib/test.sh as root")
	}
	b := &robustBed{t: t, fullDisk: count, oldCopy: 2, fr: followerReads{last: map[int]uint64{}}}
	multiCleanup() // it unmounts a tmpfs data dir a killed run left
	t.Cleanup(multiCleanup)
	os.MkdirAll(multiDir, 0o755)
	sh(t, "ip", "link", "add", multiBridge, "type", "bridge")
	sh(t, "ip", "link", "set", multiBridge, "up")
	b.n = []*agent{nil}
	for i := 1; i <= count; i++ {
		if i == b.fullDisk {
			d := fmt.Sprintf("%s/n%d/data", multiDir, i)
			os.MkdirAll(d, 0o700)
			sh(t, "mount", "-t", "tmpfs", "-o", "size=256m,mode=0700", "tmpfs", d)
		}
		b.n = append(b.n, newNetnsNode(t, i))
	}
	n := b.n
	n[1].run("init", "--name", "n1", "--address", n[1].addr(), "--data-dir", n[1].n.dir)
	n[1].start()
	token := strings.TrimSpace(n[1].mesh("token"))
	for i := 2; i <= count; i++ {
		n[i].run("join", n[1].addr(), "--token", token, "--name", n[i].name, "--address", n[i].addr(), "--data-dir", n[i].n.dir)
		n[i].start()
	}
	b.clients, b.readers = []*api.Client{nil}, []*api.Client{nil}
	for i := 1; i <= count; i++ {
		b.clients = append(b.clients, api.NewClient(n[i].n.dir))
		b.readers = append(b.readers, api.NewClient(n[i].n.dir))
	}
	eventually(t, 60*time.Second, "every node sees every node and a leader", func() (bool, string) {
		for i := 1; i <= count; i++ {
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
			st, err := b.clients[i].Status(ctx)
			cancel()
			if err != nil || len(st.Nodes) != count || st.Leader == "" {
				return false, fmt.Sprintf("n%d: %d nodes, leader %q, %v", i, len(st.Nodes), st.Leader, err)
			}
		}
		return true, ""
	})
	for i := 1; i <= count; i++ {
		n[i].oaddr()
	}
	b.netem = exec.Command("ip", "netns", "exec", n[1].h.netns, "tc", "qdisc", "add", "dev", "lo", "root", "netem", "delay", "1ms").Run() == nil
	if b.netem {
		exec.Command("ip", "netns", "exec", n[1].h.netns, "tc", "qdisc", "del", "dev", "lo", "root").Run()
	} else {
		t.Log("this kernel has no netem qdisc (tc: 'Specified qdisc kind is unknown'): the packet-loss fault drops 30 % of packets each way and adds no delay")
	}
	return b
}

// client runs one client's operations on node i until stop.
func (b *robustBed) client(id, i int, h *robustHistory, stop <-chan struct{}, r *rand.Rand) {
	c := b.clients[i]
	lin := c.Linearizable()
	for {
		select {
		case <-stop:
			return
		default:
		}
		// A little room between operations keeps a 30-minute history
		// small enough to check.
		time.Sleep(time.Duration(r.Intn(10)) * time.Millisecond)
		in := robustInput{Module: r.Intn(robustModules), Node: r.Intn(len(b.n) - 1)}
		node := b.n[in.Node+1].name
		call := h.now()
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		var out robustOutput
		var errFor error
		switch p := r.Intn(100); {
		case p < 10:
			in.Op = "add"
			_, err := c.AddModules(ctx, api.AddRequest{Modules: []state.ModuleText{robustManifest(in.Module)}})
			out.Result, errFor = classify(err), err
		case p < 45:
			in.Op = "assign"
			// Known before the call: a resolver may answer the name
			// before the call returns.
			h.mu.Lock()
			h.everAssigned[in.Module][in.Node] = true
			h.mu.Unlock()
			_, err := c.Assign(ctx, state.OpAssign, node, fmt.Sprintf("rb%d", in.Module))
			out.Result, errFor = classify(err), err
		case p < 70:
			in.Op = "unassign"
			_, err := c.Unassign(ctx, node, fmt.Sprintf("rb%d", in.Module), nil)
			out.Result, errFor = classify(err), err
		case p < 85:
			// A linearizable read: only the leader answers; another
			// node's refusal is no answer and is not recorded.
			in.Op, in.Node = "read", 0
			m, err := lin.Module(ctx, fmt.Sprintf("rb%d", in.Module))
			switch {
			case err == nil:
				out = robustOutput{Result: outOK, Nodes: b.bits(m.Nodes)}
			case strings.Contains(err.Error(), "is not in the catalogue"):
				out.Result = outMissing
			case errors.Is(err, api.ErrNoAgent):
				cancel()
				continue
			default:
				// Refused: not the leader, or one a quorum no longer follows.
				b.refusedReads.Add(1)
				cancel()
				continue
			}
		default:
			cancel()
			b.followerRead(i, h)
			continue
		}
		cancel()
		if errors.Is(errFor, api.ErrNoAgent) {
			continue // the agent is down: nothing was sent
		}
		h.record(id, in, call, out)
	}
}

func (b *robustBed) bits(nodes []string) uint32 {
	var v uint32
	for _, name := range nodes {
		for j := 1; j < len(b.n); j++ {
			if b.n[j].name == name {
				v |= 1 << (j - 1)
			}
		}
		if !slices.ContainsFunc(b.n[1:], func(a *agent) bool { return a.name == name }) {
			v |= 1 << 31 // a node that is not the bed's: no model state has it
		}
	}
	return v
}

// followerReads: the applied index each node's reads showed last.
type followerReads struct {
	mu       sync.Mutex
	last     map[int]uint64
	backward []string
	reads    int
	errors   int
	// rolledBack counts the restarts from an older copy.
	rolledBack int
}

// followerRead reads node i's own replica (status, no leader involved) and
// checks that it does not go back.
func (b *robustBed) followerRead(i int, h *robustHistory) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	st, err := b.readers[i].Status(ctx)
	fr := &b.fr
	fr.mu.Lock()
	defer fr.mu.Unlock()
	if err != nil {
		fr.errors++
		return
	}
	fr.reads++
	if last := fr.last[i]; st.AppliedIndex < last {
		fr.backward = append(fr.backward, fmt.Sprintf("n%d's replica read index %d after %d", i, st.AppliedIndex, last))
	}
	fr.last[i] = max(fr.last[i], st.AppliedIndex)
}

// resolverWatch asks every node's resolver for every module's name and
// records an answer naming a node the module was never assigned to.
func (b *robustBed) resolverWatch(h *robustHistory, stop <-chan struct{}, bad *[]string, answers *int) {
	conns := map[int]*dns.Conn{}
	addr := map[string]int{}
	for i := 1; i < len(b.n); i++ {
		conns[i] = nsConn(b.t, b.n[i].h.netns)
		addr[b.n[i].oaddr()] = i - 1
	}
	defer func() {
		for _, c := range conns {
			c.Close()
		}
	}()
	for {
		select {
		case <-stop:
			return
		case <-time.After(200 * time.Millisecond):
		}
		for i, co := range conns {
			for m := 0; m < robustModules; m++ {
				q := new(dns.Msg)
				q.SetQuestion(dns.Fqdn(fmt.Sprintf("rb%d.internal", m)), dns.TypeA)
				co.SetDeadline(time.Now().Add(500 * time.Millisecond))
				if co.WriteMsg(q) != nil {
					continue
				}
				r, err := co.ReadMsg()
				if err != nil || r.Id != q.Id {
					continue
				}
				for _, rr := range r.Answer {
					a, ok := rr.(*dns.A)
					if !ok {
						continue
					}
					*answers++
					node, known := addr[a.A.String()]
					h.mu.Lock()
					ever := known && h.everAssigned[m][node]
					h.mu.Unlock()
					if !ever {
						*bad = append(*bad, fmt.Sprintf("n%d's resolver answered rb%d with %s, a node it was never assigned to", i, m, a.A))
					}
				}
			}
		}
	}
}

func TestRobustnessBed(t *testing.T) {
	count := 3
	if v, err := strconv.Atoi(os.Getenv("MESH_ROBUSTNESS_NODES")); err == nil && v >= 3 && v <= 5 {
		count = v
	}
	budget := envDuration("MESH_ROBUSTNESS_BUDGET", 3*time.Minute)
	b := newRobustBed(t, count)
	h := &robustHistory{start: time.Now(), counts: map[string]int{}}
	r := rand.New(rand.NewSource(time.Now().UnixNano()))
	seed := r.Int63()
	t.Logf("seed %d, %d nodes, faults for %s", seed, count, budget)

	stop := make(chan struct{})
	var wg sync.WaitGroup
	for i := 1; i <= count; i++ {
		wg.Add(1)
		go func(i int) {
			defer wg.Done()
			b.client(i-1, i, h, stop, rand.New(rand.NewSource(seed+int64(i))))
		}(i)
	}
	var badAnswers []string
	var answers int
	wg.Add(1)
	go func() { defer wg.Done(); b.resolverWatch(h, stop, &badAnswers, &answers) }()

	// Some history first, then the copy of a node's data dir to roll back to.
	time.Sleep(5 * time.Second)
	end := b.pause(b.oldCopy)
	sh(t, "cp", "-a", b.n[b.oldCopy].n.dir, b.n[b.oldCopy].n.dir+".old")
	end()
	t.Cleanup(func() { os.RemoveAll(b.n[b.oldCopy].n.dir + ".old") })

	// Faults: each kind once in a shuffled round, then at random, and from
	// the second round on sometimes two at once.
	type window struct {
		kind     string
		from, to time.Duration
	}
	var windows []window
	var exits []string
	deadline := time.Now().Add(budget)
	var order []int
	round := 0
	// Every kind at least once: the first round ends whatever the budget.
	for time.Now().Before(deadline) || round == 0 || round == 1 && len(order) > 0 {
		if len(order) == 0 {
			order = r.Perm(len(robustFaults))
			round++
		}
		f := robustFaults[order[0]]
		order = order[1:]
		kinds := []robustFault{f}
		if round > 1 && r.Intn(3) == 0 {
			g := robustFaults[r.Intn(len(robustFaults))]
			if g.name != f.name && !strings.Contains(g.name+f.name, "restart from") {
				kinds = append(kinds, g)
			}
		}
		from := time.Since(h.start)
		var ends []func()
		var names []string
		for _, k := range kinds {
			ends = append(ends, k.start(b, r))
			names = append(names, k.name)
		}
		hold := time.Duration(5+r.Intn(11)) * time.Second
		t.Logf("%6.1fs fault: %s for %s", from.Seconds(), strings.Join(names, " + "), hold)
		time.Sleep(hold)
		for j := len(ends) - 1; j >= 0; j-- {
			ends[j]()
		}
		// An agent that exited during the fault is restarted, as systemd
		// would; it is a failure unless its disk was full.
		for i := 1; i <= count; i++ {
			if exec.Command("pgrep", "-f", "mesh agent --data-dir "+b.n[i].n.dir).Run() == nil {
				continue
			}
			full := i == b.fullDisk && slices.Contains(names, "full disk")
			exits = append(exits, fmt.Sprintf("n%d during %s", i, strings.Join(names, " + ")))
			// Its last lines may still be on their way through the pipe
			// (a CI run said only "exited:", another ended on a line from
			// its start): wait for its output to end.
			tail := b.n[i].exitedLog()
			tail = tail[max(0, len(tail)-3000):]
			if !full {
				t.Errorf("n%d's agent exited during %s:\n%s", i, strings.Join(names, " + "), tail)
			} else {
				t.Logf("n%d's agent exited while its disk was full (restarted, as systemd would):\n%s", i, tail)
			}
			b.n[i].kill9()
			b.n[i].startAsync()
		}
		to := time.Since(h.start)
		for _, n := range names {
			windows = append(windows, window{n, from, to})
		}
		// Let the cluster settle before the next fault: a leader, and
		// every agent process up.
		eventually(t, 2*time.Minute, "every node up and following a leader after the fault", func() (bool, string) {
			for i := 1; i <= count; i++ {
				ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
				st, err := b.readers[i].Status(ctx)
				cancel()
				if err != nil || st.Leader == "" {
					return false, fmt.Sprintf("n%d: leader %q, %v", i, st.Leader, err)
				}
			}
			return true, ""
		})
		time.Sleep(2 * time.Second)
	}
	close(stop)
	wg.Wait()

	// Healed: every replica holds the same catalogue and assignments as a
	// linearizable read on the leader, which the history must explain.
	lin := func() *api.Client {
		var c *api.Client
		eventually(t, time.Minute, "a leader that answers linearizable reads", func() (bool, string) {
			l := b.leader()
			if l == 0 {
				return false, "no leader"
			}
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			_, err := b.clients[l].Linearizable().Status(ctx)
			c = b.clients[l].Linearizable()
			return err == nil, fmt.Sprint(err)
		})
		return c
	}()
	final := map[int]robustOutput{}
	for m := 0; m < robustModules; m++ {
		call := h.now()
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		mi, err := lin.Module(ctx, fmt.Sprintf("rb%d", m))
		cancel()
		out := robustOutput{Result: outOK, Nodes: b.bits(mi.Nodes)}
		if err != nil {
			if !strings.Contains(err.Error(), "is not in the catalogue") {
				t.Fatalf("the final read of rb%d: %v", m, err)
			}
			out = robustOutput{Result: outMissing}
		}
		final[m] = out
		h.record(len(b.n), robustInput{Op: "read", Module: m}, call, out)
	}
	eventually(t, 2*time.Minute, "every replica holds what the leader holds", func() (bool, string) {
		for i := 1; i <= count; i++ {
			for m := 0; m < robustModules; m++ {
				ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
				mi, err := b.clients[i].Module(ctx, fmt.Sprintf("rb%d", m))
				cancel()
				got := robustOutput{Result: outOK, Nodes: b.bits(mi.Nodes)}
				if err != nil {
					got = robustOutput{Result: outMissing}
					if !strings.Contains(err.Error(), "is not in the catalogue") {
						return false, fmt.Sprintf("n%d rb%d: %v", i, m, err)
					}
				}
				if got != final[m] {
					return false, fmt.Sprintf("n%d holds rb%d as %+v, the leader %+v", i, m, got, final[m])
				}
			}
		}
		return true, ""
	})

	// Every resolver answers each module's name with exactly the nodes the
	// final read shows.
	eventually(t, time.Minute, "every resolver answers what the final state holds", func() (bool, string) {
		for i := 1; i <= count; i++ {
			co := nsConn(t, b.n[i].h.netns)
			defer co.Close()
			for m := 0; m < robustModules; m++ {
				want := map[string]bool{}
				for j := 1; j <= count; j++ {
					if final[m].Nodes&(1<<(j-1)) != 0 {
						want[b.n[j].oaddr()] = true
					}
				}
				q := new(dns.Msg)
				q.SetQuestion(dns.Fqdn(fmt.Sprintf("rb%d.internal", m)), dns.TypeA)
				co.SetDeadline(time.Now().Add(time.Second))
				if co.WriteMsg(q) != nil {
					return false, "write"
				}
				r, err := co.ReadMsg()
				if err != nil {
					return false, err.Error()
				}
				got := map[string]bool{}
				for _, rr := range r.Answer {
					if a, ok := rr.(*dns.A); ok {
						got[a.A.String()] = true
					}
				}
				if fmt.Sprint(got) != fmt.Sprint(want) {
					return false, fmt.Sprintf("n%d answers rb%d with %v, the final state holds %v", i, m, got, want)
				}
			}
		}
		return true, ""
	})

	// A history that checks nothing passes every check: make sure it holds
	// each kind of answer.
	nonEmptyReads := 0
	for _, op := range h.ops {
		if in, out := op.Input.(robustInput), op.Output.(robustOutput); in.Op == "read" && out.Result == outOK && out.Nodes != 0 {
			nonEmptyReads++
		}
	}
	for what, n := range map[string]int{"acknowledged adds": h.counts["add ok"], "acknowledged assigns": h.counts["assign ok"], "acknowledged unassigns": h.counts["unassign ok"],
		"linearizable reads of assigned modules": nonEmptyReads, "follower reads": fr0(b).reads, "resolver A records": answers, "restarts from an older copy": fr0(b).rolledBack} {
		if n == 0 {
			t.Errorf("the history holds no %s: the checks would pass on nothing", what)
		}
	}

	res, info := porcupine.CheckOperationsVerbose(robustModel.ToModel(), h.ops, 5*time.Minute)
	if res != porcupine.Ok {
		dir := os.Getenv("MESH_ARTIFACTS")
		if dir == "" {
			dir = "/var/tmp/mesh-artifacts"
		}
		os.MkdirAll(dir, 0o755)
		p := filepath.Join(dir, fmt.Sprintf("robustness-%d.html", seed))
		if err := porcupine.VisualizePath(robustModel.ToModel(), info, p); err != nil {
			t.Log(err)
		}
		if res == porcupine.Unknown {
			t.Errorf("porcupine could not decide on the history of %d operations within its 5 minutes: the visualisation of what it reached is %s", len(h.ops), p)
		} else {
			t.Errorf("the history of %d operations is not linearizable: porcupine's visualisation is %s", len(h.ops), p)
		}
	}
	fr := &b.fr
	if len(fr.backward) > 0 {
		t.Errorf("follower reads went back: %s", strings.Join(fr.backward, "; "))
	}
	if len(badAnswers) > 0 {
		t.Errorf("resolvers answered names never assigned: %s", strings.Join(slices.Compact(badAnswers), "; "))
	}

	// The figures.
	acked := slices.Clone(h.acked)
	sort.Slice(acked, func(i, j int) bool { return acked[i] < acked[j] })
	longest := map[string]time.Duration{}
	seen := map[string]bool{}
	for _, w := range windows {
		seen[w.kind] = true
		// The longest gap between acknowledged writes that overlaps the
		// window (from the last write before it to the first after its start).
		var gap time.Duration
		prev := time.Duration(-1)
		for _, a := range acked {
			if prev >= 0 && a > w.from && prev < w.to {
				gap = max(gap, a-prev)
			}
			prev = a
		}
		longest[w.kind] = max(longest[w.kind], gap)
	}
	for _, f := range robustFaults {
		if !seen[f.name] {
			t.Errorf("fault %q was never injected", f.name)
		}
	}
	var keys []string
	for k, v := range h.counts {
		keys = append(keys, fmt.Sprintf("%s=%d", k, v))
	}
	sort.Strings(keys)
	if b.refusedReads.Load() == 0 {
		t.Error("no linearizable read was refused, though clients on followers asked for them")
	}
	lost := lostWrites(h.ops, final)
	if lost > 0 {
		t.Errorf("%d acknowledged writes are not in the final state", lost)
	}
	t.Logf("robustness nodes=%d budget=%s operations=%d faults=%d violations=%d lost_writes=%d follower_reads=%d backward=%d resolver_answers=%d bad_answers=%d agent_exits=%d refused_linearizable_reads=%d", count, budget, len(h.ops), len(windows), boolInt(res != porcupine.Ok), lost, fr.reads, len(fr.backward), answers, len(badAnswers), len(exits), b.refusedReads.Load())
	t.Logf("operations: %s", strings.Join(keys, " "))
	for _, f := range robustFaults {
		t.Logf("robustness fault=%q longest_unavailability=%s", f.name, longest[f.name].Round(100*time.Millisecond))
	}
}

// lostWrites counts the acknowledged writes the final state does not hold:
// an add of a module that is missing, an assign that is not held with no
// unassign of the same pair that may come after it (one that returned
// after it was invoked, or never did), an unassign likewise. (porcupine's check, with the final reads, covers these
// too; this says how many.)
func lostWrites(ops []porcupine.Operation, final map[int]robustOutput) int {
	lost := 0
	for _, op := range ops {
		in, out := op.Input.(robustInput), op.Output.(robustOutput)
		if out.Result != outOK || in.Op == "read" {
			continue
		}
		f := final[in.Module]
		bit := uint32(1) << in.Node
		later := func(kind string) bool {
			for _, o := range ops {
				i := o.Input.(robustInput)
				if i.Op == kind && i.Module == in.Module && i.Node == in.Node && o.Return > op.Call && o.Output.(robustOutput).Result != outNotAssigned && o.Output.(robustOutput).Result != outMissing {
					return true
				}
			}
			return false
		}
		switch in.Op {
		case "add":
			if f.Result != outOK {
				lost++
			}
		case "assign":
			if f.Nodes&bit == 0 && !later("unassign") {
				lost++
			}
		case "unassign":
			if f.Nodes&bit != 0 && !later("assign") {
				lost++
			}
		}
	}
	return lost
}

func boolInt(b bool) int {
	if b {
		return 1
	}
	return 0
}

// The model refuses what the suite must catch: a read that misses an
// acknowledged assign, a read showing a write that never happened, an
// acknowledged write lost by the final read, and a refusal that
// contradicts the state; it accepts an unanswered write either way.
func TestRobustModel(t *testing.T) {
	m := robustModel.ToModel()
	op := func(c int, op string, mod, node int, call, ret int64, res string, nodes uint32) porcupine.Operation {
		return porcupine.Operation{ClientId: c, Input: robustInput{Op: op, Module: mod, Node: node}, Call: call, Output: robustOutput{Result: res, Nodes: nodes}, Return: ret}
	}
	add := op(0, "add", 0, 0, 0, 1, outOK, 0)
	for _, c := range []struct {
		name string
		h    []porcupine.Operation
		ok   bool
	}{
		{"assign then read", []porcupine.Operation{add, op(0, "assign", 0, 1, 2, 3, outOK, 0), op(1, "read", 0, 0, 4, 5, outOK, 0b10)}, true},
		{"a read misses an acknowledged assign", []porcupine.Operation{add, op(0, "assign", 0, 1, 2, 3, outOK, 0), op(1, "read", 0, 0, 4, 5, outOK, 0)}, false},
		{"a read shows an assign never made", []porcupine.Operation{add, op(1, "read", 0, 0, 4, 5, outOK, 0b100)}, false},
		{"a lost unassign", []porcupine.Operation{add, op(0, "assign", 0, 1, 2, 3, outOK, 0), op(0, "unassign", 0, 1, 4, 5, outOK, 0), op(1, "read", 0, 0, 6, 7, outOK, 0b10)}, false},
		{"missing after an acknowledged add", []porcupine.Operation{add, op(0, "assign", 0, 1, 2, 3, outMissing, 0)}, false},
		{"not-assigned though it is", []porcupine.Operation{add, op(0, "assign", 0, 1, 2, 3, outOK, 0), op(0, "unassign", 0, 1, 4, 5, outNotAssigned, 0)}, false},
		{"an unanswered assign that took effect", []porcupine.Operation{add, op(0, "assign", 0, 1, 2, math.MaxInt64, outUnknown, 0), op(1, "read", 0, 0, 4, 5, outOK, 0b10)}, true},
		{"an unanswered assign that did not", []porcupine.Operation{add, op(0, "assign", 0, 1, 2, math.MaxInt64, outUnknown, 0), op(1, "read", 0, 0, 4, 5, outOK, 0)}, true},
		{"a stale read after a newer one", []porcupine.Operation{add, op(0, "assign", 0, 1, 2, 10, outOK, 0), op(1, "read", 0, 0, 3, 4, outOK, 0b10), op(1, "read", 0, 0, 5, 6, outOK, 0)}, false},
		{"concurrent assign and read either way", []porcupine.Operation{add, op(0, "assign", 0, 1, 2, 10, outOK, 0), op(1, "read", 0, 0, 3, 4, outOK, 0)}, true},
	} {
		if got := porcupine.CheckOperations(m, c.h); got != c.ok {
			t.Errorf("%s: linearizable=%v, want %v", c.name, got, c.ok)
		}
	}
}

// review: cases TestRobustModel does not cover: unknown outcomes that are
// seen then unseen, an assign acknowledged while its add's fate is
// unknown, already-assigned no-ops, refusals before the add.
func TestReviewRobustModel(t *testing.T) {
	m := robustModel.ToModel()
	op := func(c int, op string, mod, node int, call, ret int64, res string, nodes uint32) porcupine.Operation {
		return porcupine.Operation{ClientId: c, Input: robustInput{Op: op, Module: mod, Node: node}, Call: call, Output: robustOutput{Result: res, Nodes: nodes}, Return: ret}
	}
	inf := int64(math.MaxInt64)
	add := op(0, "add", 0, 0, 0, 1, outOK, 0)
	for _, c := range []struct {
		name string
		h    []porcupine.Operation
		ok   bool
	}{
		{"an already-assigned assign is an ok no-op", []porcupine.Operation{add, op(0, "assign", 0, 1, 2, 3, outOK, 0), op(0, "assign", 0, 1, 4, 5, outOK, 0), op(1, "read", 0, 0, 6, 7, outOK, 0b10)}, true},
		{"an unknown assign seen, then unseen with no unassign", []porcupine.Operation{add, op(0, "assign", 0, 1, 2, inf, outUnknown, 0), op(1, "read", 0, 0, 4, 5, outOK, 0b10), op(1, "read", 0, 0, 6, 7, outOK, 0)}, false},
		{"an unknown add, missing, then there", []porcupine.Operation{op(0, "add", 0, 0, 0, inf, outUnknown, 0), op(1, "read", 0, 0, 2, 3, outMissing, 0), op(1, "read", 0, 0, 4, 5, outOK, 0)}, true},
		{"there, then missing", []porcupine.Operation{op(0, "add", 0, 0, 0, inf, outUnknown, 0), op(1, "read", 0, 0, 2, 3, outOK, 0), op(1, "read", 0, 0, 4, 5, outMissing, 0)}, false},
		{"an acknowledged assign while the add is unknown, then missing", []porcupine.Operation{op(0, "add", 0, 0, 0, inf, outUnknown, 0), op(1, "assign", 0, 2, 2, 3, outOK, 0), op(1, "read", 0, 0, 4, 5, outMissing, 0)}, false},
		{"an assign before the add is missing", []porcupine.Operation{op(0, "assign", 0, 1, 0, 1, outMissing, 0), op(0, "add", 0, 0, 2, 3, outOK, 0), op(1, "read", 0, 0, 4, 5, outOK, 0)}, true},
		{"an unassign before the add is not-assigned", []porcupine.Operation{op(0, "unassign", 0, 1, 0, 1, outNotAssigned, 0), add}, true},
		{"an acknowledged unassign undone with no assign", []porcupine.Operation{add, op(0, "assign", 0, 1, 2, 3, outOK, 0), op(1, "read", 0, 0, 4, 5, outOK, 0b10), op(0, "unassign", 0, 1, 6, 7, outOK, 0), op(1, "read", 0, 0, 8, 9, outOK, 0b10)}, false},
	} {
		if got := porcupine.CheckOperations(m, c.h); got != c.ok {
			t.Errorf("%s: linearizable=%v, want %v", c.name, got, c.ok)
		}
	}
}

func fr0(b *robustBed) *followerReads { return &b.fr }
