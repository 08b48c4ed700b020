// Package agent is the node: the composition root that builds and runs, in
// a visible order, the member (Raft and the replica), the overlay, the
// Podman client, the resolver, the reconciler, the local API and the
// metrics. Each part is
// made by one startX from only what it needs and is whole before the next
// one uses it; Close stops them in the reverse order.
//
// It decides nothing a test could not reach: what the resolver answers is
// the feed's (feed.go), what is sealed the sealer's (sealer.go), and the
// rest is the packages'. `mesh agent` parses its flags into a Config and
// calls New, Run and Close (DESIGN.md, "Layout").
package agent

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/netip"
	"os"
	"path/filepath"
	"runtime/debug"
	"slices"
	"sync"
	"time"

	"mesh/agent/metrics"
	"mesh/agent/operate"
	"mesh/agent/overlay"
	"mesh/cluster"
	"mesh/cluster/api"
	"mesh/dnsd"
	"mesh/podman"
	"mesh/reconciler"
	"mesh/state"
)

// Defaults of a Config.
const (
	DefaultDNSAddress = "169.254.53.53"
	DefaultDNSTTL     = 5 * time.Second
	DefaultResync     = 30 * time.Second
)

// Config is what a node runs from: the flags of `mesh agent`.
type Config struct {
	// DataDir is the node's data dir, made by mesh init or mesh join.
	DataDir string
	// PodmanSocket is Podman's service socket. Empty: the default socket
	// (rootful or rootless), where the agent starts Podman's service when
	// none listens; a socket named here is the operator's to run.
	PodmanSocket string
	// DNSAddress is the node's resolver address: every container's only
	// DNS server. As root the agent puts it on a port-less bridge; on a
	// rootless host `mesh setup` does.
	DNSAddress netip.Addr
	// Upstreams answer names that are not the mesh's (default: those of
	// /etc/resolv.conf).
	Upstreams []string
	// DNSTTL is the TTL of the mesh's answers.
	DNSTTL time.Duration
	// Resync is the periodic apply that catches drift.
	Resync time.Duration
	// MetricsListen, when set, serves Prometheus metrics at
	// http://MetricsListen/metrics.
	MetricsListen string
	// WebListen, when set, serves the fleet's web page at WebListen
	// (plain HTTP on loopback, TLS with the node's certificate elsewhere).
	WebListen string
	// Version is this binary's version, shown in every node's status.
	Version string
	// Binary is this program's path: the reconciler's resolver probe runs it.
	Binary string
	// OverlayDevice is the overlay's interface name (DefaultOverlayDevice).
	OverlayDevice string
	// Logger is the agent's one logger (NewLogger makes it).
	Logger *slog.Logger
}

// Agent is a running node.
type Agent struct {
	cfg Config
	dir string
	log *slog.Logger

	member       *member
	net          *network
	podman       *podman.Client
	resolver     *dnsd.Server
	resolverAddr string
	sealer       *sealer
	reconciler   *reconciler.Reconciler
	operate      *operate.Server
	backups      *backups
	// moveMu lets one move's copy into this node run at a time.
	moveMu  sync.Mutex
	api     *api.API
	metrics *metrics.Metrics

	// ctx ends when Close begins: the loops New starts (the resolver's
	// feed, the metrics server) end with it.
	ctx    context.Context
	cancel context.CancelFunc
	// closers stop what New started, in the reverse order.
	closers []func()
}

// member is the part of cluster.Member the agent uses.
type member = cluster.Member

// New builds the node and starts what answers others (Raft, the resolver,
// the local API, the metrics); Run starts its loops. On an error, whatever
// was started is stopped again.
func New(cfg Config) (_ *Agent, err error) {
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.NewTextHandler(io.Discard, nil))
	}
	if cfg.DNSTTL == 0 {
		cfg.DNSTTL = DefaultDNSTTL
	}
	if cfg.Resync == 0 {
		cfg.Resync = DefaultResync
	}
	if !cfg.DNSAddress.IsValid() {
		cfg.DNSAddress = netip.MustParseAddr(DefaultDNSAddress)
	}
	a := &Agent{cfg: cfg, dir: absDir(cfg.DataDir), log: cfg.Logger}
	a.ctx, a.cancel = context.WithCancel(context.Background())
	defer func() {
		if err != nil {
			a.Close()
		}
	}()
	if err := checkPrivate(a.dir); err != nil {
		return nil, err
	}
	if err := ensureResolverAddress(cfg.DNSAddress); err != nil {
		return nil, err
	}
	for _, start := range []func() error{a.startMember, a.startOverlay, a.startMetrics, a.startPodman, a.startResolver, a.startSealer, a.startOperate, a.startReconciler, a.startAPI, a.serveWeb, a.serveMetrics} {
		if err := start(); err != nil {
			return nil, err
		}
	}
	// Start-up (replaying the log, migrations, the manifest schema) leaves
	// garbage that the runtime would keep until the heap grows into it: give
	// it back now, so an idle node holds only what it uses.
	debug.FreeOSMemory()
	return a, nil
}

// Run says the node is ready and runs its loops (the reconciler, the
// sealer, the resolver's allow list) until ctx ends.
func (a *Agent) Run(ctx context.Context) error {
	a.log.Info("agent ready", "data_dir", a.dir, "raft", a.member.Node.Addr(), "resolver", a.resolverAddr)
	if err := sdNotify("READY=1\nSTATUS=serving " + a.member.ID.Name); err != nil {
		a.log.Warn("could not tell systemd the agent is ready", "err", err)
	}
	go followSubnets(ctx, a.podman, a.resolver, a.cfg.Resync)
	go a.sealer.run(ctx)
	go a.net.run(ctx)
	go a.driveRollouts(ctx)
	go a.backups.schedule(ctx)
	go a.driveMoves(ctx)
	done := make(chan struct{})
	go func() {
		defer close(done)
		a.reconciler.Run(ctx, reconciler.Source{
			Plan: func(ctx context.Context) (uint64, *state.Plan, error) {
				v, err := a.member.Store.Plan(ctx, a.member.ID.Name)
				if err != nil {
					return 0, nil, err
				}
				return v.Version, a.backups.holdIn(v.Plan), nil
			},
			Changed: a.member.Store.Changed,
			Report:  a.publish,
		}, reconciler.LoopConfig{Resync: a.cfg.Resync})
	}()
	<-ctx.Done()
	a.log.Info("stopping")
	sdNotify("STOPPING=1")
	<-done
	// A backup's end unpauses what it paused: let it.
	a.backups.Wait(15 * time.Second)
	return nil
}

// Close stops what New started, the last part first.
func (a *Agent) Close() {
	a.cancel()
	for i := len(a.closers) - 1; i >= 0; i-- {
		a.closers[i]()
	}
	a.closers = nil
}

func (a *Agent) onClose(f func()) { a.closers = append(a.closers, f) }

// startMember opens the data dir, the replica and Raft.
func (a *Agent) startMember() error {
	m, err := cluster.StartMember(cluster.MemberConfig{DataDir: a.dir, Logger: a.log, Version: a.cfg.Version})
	if err != nil {
		return err
	}
	a.onClose(func() { m.Stop() })
	a.member = m
	a.log = a.log.With("node", m.ID.Name)
	return nil
}

// startMetrics makes the collectors, when metrics are asked for, so that
// the parts after it can feed them; serveMetrics serves them last.
func (a *Agent) startMetrics() error {
	if a.cfg.MetricsListen != "" {
		a.metrics = metrics.New(a.member.Node.Stats)
		a.metrics.Overlay(a.net.peerStats)
		a.metrics.DataDirFree(a.member.Node.Free)
	}
	return nil
}

// startPodman connects to Podman's service, starting it only on the
// default socket (a socket the operator names is theirs to run).
func (a *Agent) startPodman() error {
	sock, start := a.cfg.PodmanSocket, false
	if sock == "" {
		sock, start = podman.DefaultSocket(Rootless()), true
	}
	a.podman = podman.New(podman.Config{Socket: sock, Start: start, Logger: a.log})
	a.onClose(func() { a.podman.Close() })
	return nil
}

// startResolver binds the resolver on the node's address and has it
// follow the replica through the feed.
func (a *Agent) startResolver() error {
	upstreams := a.cfg.Upstreams
	if len(upstreams) == 0 {
		var err error
		if upstreams, err = dnsd.UpstreamsFromResolvConf("/etc/resolv.conf", a.cfg.DNSAddress); err != nil {
			a.log.Warn("no upstream resolvers; names outside the mesh get SERVFAIL", "err", err)
		}
	}
	// A node that just joined has no replica yet; Follow sets the domain
	// once the state arrives.
	domain := state.DefaultDomain
	if st, err := a.member.Store.Settings(a.ctx); err == nil {
		domain = st.Domain
	}
	var observe func(int, bool, time.Duration)
	if a.metrics != nil {
		observe = a.metrics.ObserveQuery
	}
	sockets, err := inheritedSockets()
	if err != nil {
		return err
	}
	srv, err := dnsd.New(dnsd.Config{Sockets: sockets,
		Addr: netip.AddrPortFrom(a.cfg.DNSAddress, 53).String(), Upstreams: upstreams, TTL: uint32(a.cfg.DNSTTL.Seconds()),
		Refresh: a.subnets, Observe: observe, Logger: a.log,
		// What a flood took is given back at once, not over minutes.
		AfterFlood: debug.FreeOSMemory,
	}, domain)
	if err != nil {
		return err
	}
	bound, err := srv.Start()
	if err != nil {
		return fmt.Errorf("%w (another resolver on %s:53? on a rootless host, has `mesh setup --user USER` run as root?)", err, a.cfg.DNSAddress)
	}
	a.onClose(func() { srv.Close() })
	a.resolver, a.resolverAddr = srv, bound
	f := newFeed(a.member.ID.Name, a.member.Store, a.member.Node)
	go srv.Follow(a.ctx, f.Index, f.changed(a.ctx, a.member.Store.Changed))
	return nil
}

// subnets reads Podman's subnets anew: a query from a source not yet
// allowed may come from a network created since the last pass.
func (a *Agent) subnets() []netip.Prefix {
	ctx, cancel := context.WithTimeout(a.ctx, 2*time.Second)
	defer cancel()
	p, err := a.podman.Subnets(ctx)
	if err != nil {
		return nil
	}
	return p
}

// startSealer makes the node's side of sealed credentials.
func (a *Agent) startSealer() error {
	m := a.member
	a.sealer = &sealer{id: m.Node.Seal(), store: m.Store, node: m.Node, name: m.ID.Name, log: a.log}
	return nil
}

// startOperate makes this node's end of `mesh logs` and `mesh exec` and
// serves it to the other nodes (the local API serves it to the CLI).
func (a *Agent) startOperate() error {
	m := a.member
	a.backups = newBackups(m.ID.Name, m.Store, func(ctx context.Context, ref state.SecretRef) ([]byte, error) {
		return a.sealer.OperatorSecret(ctx, ref, "")
	}, a.dir, a.log.With("component", "backup"))
	a.operate = &operate.Server{Node: m.ID.Name, Store: m.Store, RT: operateRuntime{a.podman}, Peers: m.Node,
		StepLogs: filepath.Join(a.dir, "step-logs"), Log: a.log.With("component", "operate"), Stop: a.ctx, Backups: a.backups}
	peer := http.NewServeMux()
	peer.Handle("/", a.operate.PeerHandler())
	peer.HandleFunc("POST /v1/op/move/receive", a.receiveMove)
	m.Node.SetOperate(peer)
	return nil
}

// operateRuntime is the Podman client as operate uses it.
type operateRuntime struct{ *podman.Client }

func (r operateRuntime) Exec(ctx context.Context, name string, cfg podman.ExecConfig) (operate.Session, error) {
	s, err := r.Client.Exec(ctx, name, cfg)
	if err != nil {
		return nil, err
	}
	return s, nil
}

// startReconciler loads the node's ledger and makes the reconciler, which
// Run starts.
func (a *Agent) startReconciler() error {
	m := a.member
	var rt reconciler.Runtime = a.podman
	var observe func(*state.Report, time.Duration)
	if a.metrics != nil {
		rt, observe = a.metrics.Runtime(a.podman), a.metrics.ObserveApply
	}
	domain := func(ctx context.Context) string {
		if st, err := m.Store.Settings(ctx); err == nil {
			return st.Domain
		}
		return ""
	}
	// Rootful, each module's containers get a bridge of their own, and
	// the filter that keeps the others out of it is in place before the
	// first is made (rootless, each container has a namespace of its own).
	rootful := !Rootless()
	if rootful {
		if err := overlay.InstallIsolation(); err != nil {
			return err
		}
	}
	rec, err := reconciler.New(reconciler.Config{
		ModuleNetworks: rootful,
		ClearBridge:    overlay.DeleteIdleBridge,
		NetworkMade: func() {
			if p := a.subnets(); p != nil && a.resolver != nil {
				a.resolver.SetAllow(p)
			}
		},
		Node: m.ID.Name, CertProbe: m.ID.Address, DNS: a.cfg.DNSAddress, LedgerPath: filepath.Join(a.dir, "ledger.json"), DataDir: a.dir,
		Secret: a.sealer.Secret, OperatorSecret: a.sealer.OperatorSecret, EnvDir: envDir(a.dir), EnvExec: a.cfg.Binary,
		Logger: a.log, Observe: observe, StepEnded: a.operate.SaveStepLog, Backups: a.backups.Runs, Pauser: a.podman,
		ProviderHealthy: m.Store.ProviderHealthy,
		Domain:          domain,
		Probe: &reconciler.ProbeConfig{Binary: a.cfg.Binary, Name: func(ctx context.Context) string {
			d := domain(ctx)
			if d == "" {
				d = state.DefaultDomain
			}
			return m.ID.Name + "." + d
		}},
	}, rt)
	if err != nil {
		return err
	}
	a.reconciler = rec
	assignedHere := func(module string) (bool, error) {
		mi, err := m.Store.Module(a.ctx, module)
		if errors.Is(err, state.ErrNotFound) {
			return false, nil
		}
		return slices.Contains(mi.Nodes, m.ID.Name), err
	}
	if err := undoCutMoveSwap(a.dir, rec.Arrived, assignedHere, a.log); err != nil {
		return err
	}
	return a.backups.start(a.ctx, rec)
}

// startAPI serves the local API on the data dir's socket. It comes after
// everything it reports on (the resolver's address), so that exists when
// it serves.
func (a *Agent) startAPI() error {
	m := a.member
	srv := api.New(api.Config{Node: m.Node, Store: m.Store, ID: m.ID, Resolver: a.resolverAddr, Overlay: a.net.status, Operate: a.operate.LocalHandler(), Logger: a.log})
	if err := srv.Start(filepath.Join(a.dir, cluster.SocketFile)); err != nil {
		return err
	}
	a.onClose(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		srv.Shutdown(ctx)
	})
	a.api = srv
	return nil
}

// serveMetrics serves the metrics, last.
func (a *Agent) serveMetrics() error {
	if a.metrics == nil {
		return nil
	}
	at, err := a.metrics.Serve(a.ctx, a.cfg.MetricsListen)
	if err != nil {
		return fmt.Errorf("--metrics-listen %s: %w", a.cfg.MetricsListen, err)
	}
	a.log.Info("metrics listening", "addr", "http://"+at.String()+"/metrics")
	return nil
}

// publish replicates one of the reconciler's reports.
func (a *Agent) publish(ctx context.Context, r state.Report) error {
	r.Bound() // whatever its containers printed
	_, err := a.member.Node.Propose(ctx, &state.ReportRequest{Report: r})
	return err
}

// ensureResolverAddress puts the resolver address on its bridge (as root),
// or checks that `mesh setup` did (rootless).
func ensureResolverAddress(addr netip.Addr) error {
	if Rootless() {
		if !dnsd.HasAddress(addr) {
			return fmt.Errorf("the resolver address %s is on no interface; run `mesh setup` once as root on this host", addr)
		}
		return nil
	}
	if err := dnsd.EnsureAddress(addr, dnsd.DefaultLink); err != nil {
		return fmt.Errorf("put the resolver address %s on %s: %w", addr, dnsd.DefaultLink, err)
	}
	return nil
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

// absDir is dir made absolute (the reconciler compares paths with it).
func absDir(dir string) string {
	if abs, err := filepath.Abs(dir); err == nil {
		return abs
	}
	return dir
}

// Rootless reports whether this process runs in a user namespace or as a
// user: then Podman is rootless and container ids map through subuids.
func Rootless() bool {
	if os.Geteuid() != 0 {
		return true
	}
	b, err := os.ReadFile("/proc/self/uid_map")
	if err != nil {
		return false
	}
	return !isIdentityMap(string(b))
}
