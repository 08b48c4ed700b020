package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"runtime/debug"
	"strings"
	"syscall"
	"time"

	"mesh/cluster"
	"mesh/cluster/api"
	"mesh/dnsd"
	"mesh/internal/metrics"
	"mesh/internal/safefs"
	"mesh/podman"
	"mesh/reconciler"
	"mesh/state"

	"golang.org/x/sys/unix"
)

// AgentCmd runs the node.
type AgentCmd struct {
	PodmanSocket  string        `name:"podman-socket" env:"MESH_PODMAN_SOCKET" placeholder:"URL" help:"Podman service socket. Default: /run/podman/podman.sock for root, $XDG_RUNTIME_DIR/podman/podman.sock otherwise, where the agent starts Podman's service when none listens. A socket given here is the operator's to run."`
	DNSAddress    string        `name:"dns-address" default:"169.254.53.53" placeholder:"IP" help:"The node's resolver address: every container's only DNS server. As root the agent puts it on a port-less bridge; on a rootless host run mesh setup once."`
	Upstream      []string      `name:"upstream" placeholder:"HOST:PORT" help:"Resolvers for names that are not the mesh's (default: those of /etc/resolv.conf)."`
	DNSTTL        time.Duration `name:"dns-ttl" default:"5s" help:"TTL of the mesh's answers: how stale a cached answer may be, plus replication lag."`
	Resync        time.Duration `default:"30s" help:"Periodic apply that catches drift."`
	LogLevel      string        `name:"log-level" default:"info" enum:"debug,info,warn,error" help:"Log level."`
	MetricsListen string        `name:"metrics-listen" placeholder:"ADDR" help:"Serve Prometheus metrics at http://ADDR/metrics (e.g. 127.0.0.1:9430): Raft, the resolver, applies, Podman call errors. Off when empty."`
	LogFormat     string        `name:"log-format" default:"text" enum:"text,json" help:"text (key=value) or json (one object a line). Raft's and Podman's lines come through at their own levels."`
}

// rootless reports whether this process runs in a user namespace or as a
// user: then Podman is rootless and container ids map through subuids.
func rootless() bool {
	if os.Geteuid() != 0 {
		return true
	}
	b, err := os.ReadFile("/proc/self/uid_map")
	if err != nil {
		return false
	}
	f := strings.Fields(string(b))
	return !(len(f) == 3 && f[0] == "0" && f[1] == "0" && f[2] == "4294967295")
}

// Run serves until SIGINT or SIGTERM.
func (c *AgentCmd) Run(g *Globals) error {
	if os.Geteuid() != 0 {
		// A rootless agent runs inside Podman's user namespace, where a
		// container's uid n is uid n: owners are set as the container sees
		// them, and the mesh can manage directories owned by subuids.
		return c.reexecUnshared(g)
	}
	if os.Getenv(unsharedEnv) == "1" {
		// Started by the wrapper through `podman unshare`: end with it, so
		// stopping what the operator started always stops the agent.
		unix.Prctl(unix.PR_SET_PDEATHSIG, uintptr(syscall.SIGTERM), 0, 0, 0)
	}
	privateUmask()
	if err := checkPrivate(g.dir()); err != nil {
		return err
	}
	var lvl slog.Level
	lvl.UnmarshalText([]byte(c.LogLevel))
	log := newLogger(os.Stderr, c.LogFormat, lvl)
	ctx, cancel := signalContext()
	defer cancel()

	dnsAddr, err := netip.ParseAddr(c.DNSAddress)
	if err != nil {
		return usageError{fmt.Errorf("--dns-address %q is not an IP address", c.DNSAddress)}
	}
	if rootless() {
		if !dnsd.HasAddress(dnsAddr) {
			return fmt.Errorf("the resolver address %s is on no interface; run `mesh setup` once as root on this host", dnsAddr)
		}
	} else if err := dnsd.EnsureAddress(dnsAddr, dnsd.DefaultLink); err != nil {
		return fmt.Errorf("put the resolver address %s on %s: %w", dnsAddr, dnsd.DefaultLink, err)
	}

	// The composition root: everything is made here, in order, and each
	// part is whole before the next one uses it. The local API comes last,
	// so whatever it reports (the resolver's address) exists when it serves.
	dir := absDir(g.dir())
	m, err := cluster.StartMember(cluster.MemberConfig{DataDir: dir, Logger: log, Version: version})
	if err != nil {
		return err
	}
	defer m.Stop()
	log = log.With("node", m.ID.Name)
	var met *metrics.Metrics
	var observeQuery func(int, bool, time.Duration)
	var observeApply func(*state.Report, time.Duration)
	if c.MetricsListen != "" {
		met = metrics.New(m.Node.Stats)
		observeQuery, observeApply = met.ObserveQuery, met.ObserveApply
	}

	// The agent starts Podman's service only on the default socket; a socket
	// named with --podman-socket is the operator's to run.
	sock, start := c.PodmanSocket, false
	if sock == "" {
		sock, start = podman.DefaultSocket(rootless()), true
	}
	pm := podman.New(podman.Config{Socket: sock, Start: start, Logger: log})
	defer pm.Close()
	// A query from a source not yet allowed reads Podman's subnets anew, so a
	// network created since the last pass may ask at once.
	refresh := func() []netip.Prefix {
		rctx, cancel := context.WithTimeout(ctx, 2*time.Second)
		defer cancel()
		p, err := pm.Subnets(rctx)
		if err != nil {
			return nil
		}
		return p
	}
	resolver, resolverAddr, err := startResolver(ctx, m.ID.Name, m.Store, m.Node.Seen, dnsAddr, c.Upstream, uint32(c.DNSTTL.Seconds()), refresh, observeQuery, log)
	if err != nil {
		return err
	}
	defer resolver.Close()

	sealing := &sealer{id: m.Node.Seal(), store: m.Store, node: m.Node, name: m.ID.Name, log: log}

	self, err := os.Executable()
	if err != nil {
		return fmt.Errorf("find this binary (the resolver probe runs it): %w", err)
	}
	var rt reconciler.Runtime = pm
	if met != nil {
		rt = met.Runtime(pm)
	}
	rec, err := reconciler.New(reconciler.Config{
		Node: m.ID.Name, DNS: dnsAddr, LedgerPath: filepath.Join(dir, "ledger.json"), DataDir: dir,
		Secret: sealing.Secret, Logger: log, Observe: observeApply,
		ProviderHealthy: m.Store.ProviderHealthy,
		Domain: func(ctx context.Context) string {
			if st, err := m.Store.Settings(ctx); err == nil {
				return st.Domain
			}
			return ""
		},
		Probe: &reconciler.ProbeConfig{Binary: self, Name: func(ctx context.Context) string {
			domain := state.DefaultDomain
			if st, err := m.Store.Settings(ctx); err == nil {
				domain = st.Domain
			}
			return m.ID.Name + "." + domain
		}},
	}, rt)
	if err != nil {
		return err
	}

	srv := api.New(api.Config{Node: m.Node, Store: m.Store, ID: m.ID, Resolver: resolverAddr, Logger: log})
	if err := srv.Start(filepath.Join(dir, cluster.SocketFile)); err != nil {
		return err
	}
	defer func() {
		sctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		srv.Shutdown(sctx)
	}()
	if met != nil {
		at, err := met.Serve(ctx, c.MetricsListen)
		if err != nil {
			return fmt.Errorf("--metrics-listen %s: %w", c.MetricsListen, err)
		}
		log.Info("metrics listening", "addr", "http://"+at.String()+"/metrics")
	}
	// Start-up (replaying the log, migrations, the manifest schema) leaves
	// garbage that the runtime would keep until the heap grows into it: give
	// it back now, so an idle node holds only what it uses.
	debug.FreeOSMemory()
	log.Info("agent ready", "data_dir", dir, "raft", m.Node.Addr(), "resolver", resolverAddr)
	if err := sdNotify("READY=1\nSTATUS=serving " + m.ID.Name); err != nil {
		log.Warn("could not tell systemd the agent is ready", "err", err)
	}

	go followSubnets(ctx, pm, resolver, c.Resync)
	go sealing.run(ctx)
	done := make(chan struct{})
	go func() {
		defer close(done)
		rec.Run(ctx, reconciler.Source{
			Plan: func(ctx context.Context) (uint64, *state.Plan, error) {
				v, err := m.Store.Plan(ctx, m.ID.Name)
				if err != nil {
					return 0, nil, err
				}
				return v.Version, v.Plan, nil
			},
			Changed: m.Store.Changed,
			Report: func(ctx context.Context, r state.Report) error {
				_, err := m.Node.Propose(ctx, &state.ReportRequest{Report: r})
				return err
			},
		}, reconciler.LoopConfig{Resync: c.Resync})
	}()
	<-ctx.Done()
	log.Info("stopping")
	sdNotify("STOPPING=1")
	<-done
	return nil
}

// unsharedEnv marks the agent that runs inside `podman unshare`.
const unsharedEnv = "MESH_UNSHARED"

// reexecUnshared runs the agent again inside Podman's user namespace, as a
// child in its own process group: SIGINT, SIGTERM and SIGHUP sent to this
// process (`kill $!`, Ctrl-C, systemd) are passed to the whole group, and the
// child ends if this process dies, so no agent is ever left running alone.
func (c *AgentCmd) reexecUnshared(g *Globals) error {
	podmanPath, err := exec.LookPath("podman")
	if err != nil {
		return errors.New("a rootless agent needs podman on PATH (apt-get install podman)")
	}
	self, err := os.Executable()
	if err != nil {
		return err
	}
	cmd := exec.Command(podmanPath, append([]string{"unshare", self}, os.Args[1:]...)...)
	cmd.Env = append(os.Environ(), "MESH_DATA_DIR="+g.dir(), unsharedEnv+"=1")
	cmd.Stdin, cmd.Stdout, cmd.Stderr = os.Stdin, os.Stdout, os.Stderr
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGTERM}
	sigs := make(chan os.Signal, 4)
	signal.Notify(sigs, os.Interrupt, syscall.SIGTERM, syscall.SIGHUP)
	defer signal.Stop(sigs)
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("start the agent under podman unshare: %w", err)
	}
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	for {
		select {
		case s := <-sigs:
			syscall.Kill(-cmd.Process.Pid, s.(syscall.Signal))
		case err := <-done:
			var ee *exec.ExitError
			if errors.As(err, &ee) {
				os.Exit(ee.ExitCode())
			}
			return err
		}
	}
}

func startResolver(ctx context.Context, self string, store *state.Store, live func() map[string]cluster.Seen, addr netip.Addr, upstreams []string, ttl uint32, refresh func() []netip.Prefix, observe func(int, bool, time.Duration), log *slog.Logger) (*dnsd.Server, string, error) {
	if len(upstreams) == 0 {
		var err error
		if upstreams, err = dnsd.UpstreamsFromResolvConf("/etc/resolv.conf", addr); err != nil {
			log.Warn("no upstream resolvers; names outside the mesh get SERVFAIL", "err", err)
		}
	}
	// A node that just joined has no replica yet; Follow sets the domain once
	// the state arrives.
	domain := "internal"
	if st, err := store.Settings(ctx); err == nil {
		domain = st.Domain
	}
	srv, err := dnsd.New(dnsd.Config{Addr: net.JoinHostPort(addr.String(), "53"), Upstreams: upstreams, TTL: ttl, Refresh: refresh, Observe: observe, Logger: log,
		// What a flood took is given back at once, not over minutes.
		AfterFlood: debug.FreeOSMemory}, domain)
	if err != nil {
		return nil, "", err
	}
	bound, err := srv.Start()
	if err != nil {
		return nil, "", fmt.Errorf("%w (another resolver on %s:53? on a rootless host, has `mesh setup` run?)", err, addr)
	}
	started := time.Now()
	go srv.Follow(ctx, func(ctx context.Context) (dnsd.Roster, error) {
		st, err := store.Settings(ctx)
		if err != nil {
			return dnsd.Roster{}, err
		}
		ro, err := store.Roster(ctx)
		if err != nil {
			return dnsd.Roster{}, err
		}
		reports, err := store.Reports(ctx)
		if err != nil {
			return dnsd.Roster{}, err
		}
		reach := state.Reach{Self: self, LastSeen: map[string]time.Time{}, Now: time.Now(), Started: started, Within: cluster.ReachableWithin}
		for name, seen := range live() {
			reach.LastSeen[name] = seen.LastSeen
		}
		up := state.Fit(reports, reach, st.Domain)
		idx, _ := store.AppliedIndex()
		r := dnsd.Roster{Domain: st.Domain, Names: map[string][]netip.Addr{}, Serial: uint32(idx)}
		byName := map[string][]dnsd.Instance{}
		var order []string
		for _, n := range ro {
			ip, err := netip.ParseAddr(n.Address)
			if err != nil {
				continue
			}
			if _, ok := byName[n.Name]; !ok {
				order = append(order, n.Name)
			}
			byName[n.Name] = append(byName[n.Name], dnsd.Instance{Addr: ip, Up: up(n)})
		}
		for _, name := range order {
			r.Names[name] = dnsd.Answer(byName[name])
		}
		return r, nil
	}, func() <-chan struct{} {
		// A change of the replica (an assign, a report with new health), or
		// the next liveness probe (a node that stopped answering).
		ch := make(chan struct{})
		changed := store.Changed()
		go func() {
			defer close(ch)
			select {
			case <-changed:
			case <-time.After(cluster.ProbeInterval):
			case <-ctx.Done():
			}
		}()
		return ch
	})
	return srv, bound, nil
}

// followSubnets keeps the resolver's allow list at the node's Podman subnets.
func followSubnets(ctx context.Context, pm *podman.Client, srv *dnsd.Server, every time.Duration) {
	for {
		if p, err := pm.Subnets(ctx); err == nil {
			srv.SetAllow(p)
		}
		select {
		case <-ctx.Done():
			return
		case <-time.After(every):
		}
	}
}

// SetupCmd prepares a host for a rootless agent.
type SetupCmd struct {
	DNSAddress string `name:"dns-address" default:"169.254.53.53" placeholder:"IP" help:"The resolver address the agents on this host will use."`
}

// Run does, as root, what a rootless agent cannot: the resolver address on a
// port-less bridge, port 53 for users, and /dev/net/tun for slirp4netns.
func (c *SetupCmd) Run(g *Globals) error {
	if os.Geteuid() != 0 {
		return errors.New("mesh setup needs root: it creates a network link and sets a sysctl (sudo mesh setup)")
	}
	addr, err := netip.ParseAddr(c.DNSAddress)
	if err != nil {
		return usageError{fmt.Errorf("--dns-address %q is not an IP address", c.DNSAddress)}
	}
	if err := dnsd.EnsureAddress(addr, dnsd.DefaultLink); err != nil {
		return err
	}
	fmt.Fprintf(g.out, "resolver address %s is on %s\n", addr, dnsd.DefaultLink)
	// Persisted for the next boot; applied now.
	if err := safefs.WriteFile("/etc/sysctl.d/50-mesh.conf", []byte("# mesh: a rootless agent's resolver binds port 53\nnet.ipv4.ip_unprivileged_port_start=53\n"), 0o644); err != nil {
		return err
	}
	if out, err := exec.Command("sysctl", "-qw", "net.ipv4.ip_unprivileged_port_start=53").CombinedOutput(); err != nil {
		return fmt.Errorf("sysctl: %v: %s", err, out)
	}
	fmt.Fprintln(g.out, "users may bind port 53 (net.ipv4.ip_unprivileged_port_start=53, also in /etc/sysctl.d/50-mesh.conf)")
	if err := os.Chmod("/dev/net/tun", 0o666); err != nil {
		return fmt.Errorf("open /dev/net/tun to users (rootless networking needs it): %w", err)
	}
	fmt.Fprintln(g.out, "/dev/net/tun is open to users (slirp4netns)")
	fmt.Fprintln(g.out, "the bridge and /dev/net/tun do not survive a reboot: run mesh setup at boot (contrib/mesh-setup.service)")
	return nil
}

// absDir is dir made absolute (the reconciler compares paths with it).
func absDir(dir string) string {
	if abs, err := filepath.Abs(dir); err == nil {
		return abs
	}
	return dir
}

// newLogger is the agent's one logger. Everything else that logs is routed
// into it: the standard library's log package (slog.SetDefault), Raft
// (cluster's hclog adapter) and the Podman bindings' logrus (podman.RouteLogs).
func newLogger(w io.Writer, format string, lvl slog.Level) *slog.Logger {
	opts := &slog.HandlerOptions{Level: lvl}
	var h slog.Handler = slog.NewTextHandler(w, opts)
	if format == "json" {
		h = slog.NewJSONHandler(w, opts)
	}
	log := slog.New(h)
	slog.SetDefault(log)
	podman.RouteLogs(log)
	return log
}
