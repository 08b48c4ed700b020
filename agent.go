package main

import (
	"fmt"
	"log/slog"
	"net/netip"
	"os"
	"runtime/pprof"
	"time"

	"mesh/agent"
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
	WebListen     string        `name:"web-listen" placeholder:"ADDR" help:"Serve the fleet's web page at ADDR: a loopback address (127.0.0.1:8430, plain HTTP) or the overlay's (TLS with a self-signed certificate of its own, whose fingerprint mesh web token prints). Off when empty. Log in with a link from mesh web token."`
	LogFormat     string        `name:"log-format" default:"text" enum:"text,json" help:"text (key=value) or json (one object a line). Raft's and Podman's lines come through at their own levels."`
	OverlayDevice string        `name:"overlay-device" default:"meshwg0" placeholder:"NAME" help:"The overlay's network interface (WireGuard in this process, over /dev/net/tun). As root the agent makes it; on a rootless host mesh setup does."`
}

// Run serves until SIGINT or SIGTERM.
func (c *AgentCmd) Run(g *Globals) error {
	dns, err := netip.ParseAddr(c.DNSAddress)
	if err != nil {
		return usageError{fmt.Errorf("--dns-address %q is not an IP address", c.DNSAddress)}
	}
	if agent.NeedsUnshare() {
		return agent.Unshare(g.dir(), dns)
	}
	agent.EndWithParent()
	privateUmask()
	var lvl slog.Level
	lvl.UnmarshalText([]byte(c.LogLevel))
	self, err := os.Executable()
	if err != nil {
		return fmt.Errorf("find this binary (the resolver probe runs it): %w", err)
	}
	a, err := agent.New(agent.Config{
		DataDir: g.dir(), PodmanSocket: c.PodmanSocket, DNSAddress: dns, Upstreams: c.Upstream,
		DNSTTL: c.DNSTTL, Resync: c.Resync, MetricsListen: c.MetricsListen, WebListen: c.WebListen,
		Version: version, Binary: self, OverlayDevice: c.OverlayDevice, Logger: agent.NewLogger(os.Stderr, c.LogFormat, lvl),
	})
	if err != nil {
		return err
	}
	defer a.Close()
	if stop, err := cpuProfile(os.Getenv("MESH_CPU_PROFILE")); err != nil {
		return err
	} else {
		defer stop()
	}
	ctx, cancel := signalContext()
	defer cancel()
	return a.Run(ctx)
}

// cpuProfile writes a CPU profile of the agent to path until it stops (a
// bench's aid: MESH_CPU_PROFILE=FILE mesh agent ...; go tool pprof FILE).
// Nothing without a path.
func cpuProfile(path string) (stop func(), err error) {
	if path == "" {
		return func() {}, nil
	}
	f, err := os.OpenFile(path, os.O_CREATE|os.O_WRONLY|os.O_TRUNC, 0o600)
	if err != nil {
		return nil, fmt.Errorf("MESH_CPU_PROFILE: %w", err)
	}
	if err := pprof.StartCPUProfile(f); err != nil {
		f.Close()
		return nil, fmt.Errorf("MESH_CPU_PROFILE: %w", err)
	}
	return func() { pprof.StopCPUProfile(); f.Close() }, nil
}

// SetupCmd prepares a host for a rootless agent.
type SetupCmd struct {
	DNSAddress    string `name:"dns-address" default:"169.254.53.53" placeholder:"IP" help:"The resolver address the agents on this host will use."`
	User          string `placeholder:"USER" help:"The user whose rootless agent runs here: it alone may bind the resolver's port 53, and owns the overlay device. Run mesh setup again after that user's mesh init or mesh join, to prepare the overlay."`
	OverlayDevice string `name:"overlay-device" default:"meshwg0" placeholder:"NAME" help:"The overlay's network interface."`
}

// Run does, as root, what a rootless agent cannot.
func (c *SetupCmd) Run(g *Globals) error {
	addr, err := netip.ParseAddr(c.DNSAddress)
	if err != nil {
		return usageError{fmt.Errorf("--dns-address %q is not an IP address", c.DNSAddress)}
	}
	self, err := os.Executable()
	if err != nil {
		return err
	}
	return agent.Setup(agent.SetupConfig{DNSAddress: addr, User: c.User, DataDir: g.DataDir, OverlayDevice: c.OverlayDevice, Binary: self}, g.out)
}
