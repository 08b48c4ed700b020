package agent

import (
	"context"
	"fmt"
	"net/netip"
	"runtime/debug"
	"strings"
	"sync"
	"time"

	"mesh/agent/overlay"
	"mesh/cluster/api"
	"mesh/internal/wgkey"
	"mesh/state"
)

// network is the node's end of the overlay (DESIGN.md rule 11): it gives
// the node's key to the state when the state lacks it (a node of a mesh
// made by an earlier release, a node whose key changed), brings the device
// up once the node has an address, and keeps the device's peers at what
// the replica says, on every change of it.
type network struct {
	a      *Agent
	key    *wgkey.Key
	device string
	port   int

	mu    sync.Mutex
	dev   *overlay.Device
	state string // what status says of the overlay on this node
	// refused is the last reason the overlay could not come up, said once.
	refused string
	// lastBytes is what had crossed the device at the last look, burst
	// whether a burst of traffic was seen since memory was last given back
	// (reclaim; the run loop's alone).
	lastBytes uint64
	burst     bool
}

// DefaultOverlayDevice is the overlay's interface name.
const DefaultOverlayDevice = overlay.DefaultDevice

// startOverlay makes the node's end of the overlay, and brings the device up
// now when the node's address is known, so that the ports the reconciler
// publishes on it find it there.
func (a *Agent) startOverlay() error {
	id := a.member.ID
	st, _ := a.member.Store.Settings(a.ctx)
	setting := st.Overlay
	if setting == "" {
		setting = id.Overlay
	}
	if setting == state.OverlayOff {
		a.net = &network{a: a, state: "off (the nodes' own network carries the mesh)"}
		return nil
	}
	key, err := wgkey.LoadOrCreate(a.dir)
	if err != nil {
		return err
	}
	port := id.OverlayPort
	if port == 0 {
		port = state.DefaultOverlayPort
	}
	dev := a.cfg.OverlayDevice
	if dev == "" {
		dev = DefaultOverlayDevice
	}
	a.net = &network{a: a, key: key, device: dev, port: port, state: "waiting for this node's overlay address"}
	a.onClose(a.net.close)
	a.net.pass(a.ctx)
	return nil
}

// run keeps the overlay as the replica says, after each change of it (at
// most every 200 ms) and every 10 s; a pass that fails is tried again after
// 2 s, doubling to a minute.
func (n *network) run(ctx context.Context) {
	if n.key == nil {
		return
	}
	backoff := time.Duration(0)
	for {
		changed := n.a.member.Store.Changed()
		wait := 10 * time.Second
		n.reclaim()
		if err := n.pass(ctx); err != nil {
			if ctx.Err() != nil {
				return
			}
			backoff = min(max(2*backoff, 2*time.Second), time.Minute)
			wait = backoff
		} else {
			backoff = 0
		}
		select {
		case <-ctx.Done():
			return
		case <-changed:
		case <-time.After(wait):
		}
		select {
		case <-ctx.Done():
			return
		case <-time.After(200 * time.Millisecond):
		}
	}
}

// pass does what the replica asks of the overlay now.
func (n *network) pass(ctx context.Context) error {
	m := n.a.member
	st, err := m.Store.Settings(ctx)
	if err != nil {
		return nil // no replica yet (a node that just joined)
	}
	if st.Overlay == state.OverlayOff {
		n.setState("off (the nodes' own network carries the mesh)")
		return nil
	}
	nodes, err := m.Store.Nodes(ctx)
	if err != nil {
		return err
	}
	var me *state.NodeInfo
	for i := range nodes {
		if nodes[i].Name == m.ID.Name {
			me = &nodes[i]
		}
	}
	if me == nil {
		return nil // not in the state (yet, or any more)
	}
	endpoint := netip.AddrPortFrom(netip.MustParseAddr(m.ID.Address), uint16(n.port)).String()
	if me.OverlayKey != n.key.Public() || me.OverlayEndpoint != endpoint || me.OverlayAddress == "" {
		pctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		_, err := m.Node.Propose(pctx, &state.NodeOverlayRequest{Node: m.ID.Name, Key: n.key.Public(), Endpoint: endpoint, Prefix: state.DefaultOverlay})
		cancel()
		if err != nil {
			n.say(fmt.Sprintf("giving this node's overlay key to the mesh: %v", err))
			return err
		}
		n.a.log.Info("gave this node's overlay key to the mesh", "endpoint", endpoint, "replaced", me.OverlayKey != "")
		return nil // the next pass, on the change, goes on
	}
	if err := n.up(st.Overlay, me.OverlayAddress); err != nil {
		n.say(err.Error())
		return err
	}
	var want []overlay.Node
	for _, x := range nodes {
		want = append(want, overlay.Node{Name: x.Name, Key: x.OverlayKey, Endpoint: x.OverlayEndpoint, Address: x.OverlayAddress})
	}
	peers, problems := overlay.Want(m.ID.Name, want)
	for _, p := range problems {
		n.a.log.Warn("overlay: a node is left out", "problem", p)
	}
	n.mu.Lock()
	dev := n.dev
	n.mu.Unlock()
	return dev.Set(peers)
}

// up brings the device up on address (of prefix), unless it is up.
func (n *network) up(prefix, address string) error {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.dev != nil {
		return nil
	}
	p, err := state.ParseOverlay(prefix)
	if err != nil {
		return fmt.Errorf("the mesh's overlay setting: %w", err)
	}
	addr, err := netip.ParseAddr(address)
	if err != nil || !p.Contains(addr) {
		return fmt.Errorf("this node's overlay address %q is not in the overlay %s", address, p)
	}
	if clash, err := overlay.Overlaps(p, n.device); err == nil && len(clash) > 0 {
		return fmt.Errorf("the mesh's overlay %s overlaps this host's %s; the overlay stays down on this node (its names and ports are unreachable from the others): free the range here, or start the mesh over with mesh init --overlay CIDR", p, strings.Join(clash, ", "))
	}
	rootless := Rootless()
	dev, err := openFiltered(p, overlay.Config{
		Device: n.device, Key: n.key, Address: netip.PrefixFrom(addr, p.Bits()), ListenPort: n.port,
		MTU: overlay.UnderlayMTU(netip.MustParseAddr(n.a.member.ID.Address)) - overlay.Overhead, Prepared: rootless, Logger: n.a.log,
	}, overlayOps{install: overlay.InstallFilter, open: overlay.Open})
	if err != nil {
		return err
	}
	n.dev = dev
	n.state = fmt.Sprintf("up: %s on %s, UDP port %d", netip.PrefixFrom(addr, p.Bits()), n.device, n.port)
	n.refused = ""
	return nil
}

// overlayOps are what openFiltered does to the host (a test's fakes).
type overlayOps struct {
	install func(prefix netip.Prefix, device string) error
	open    func(overlay.Config) (*overlay.Device, error)
}

// openFiltered opens the overlay's device, the packet filter installed
// first: the device is persistent and keeps its address when closed, so
// opened before a filter that then failed, it left the overlay address on
// the host with nothing to keep the LAN from the ports published there.
// As root the agent keeps the filter itself; on a rootless host (cfg
// Prepared) mesh setup installed it.
func openFiltered(p netip.Prefix, cfg overlay.Config, ops overlayOps) (*overlay.Device, error) {
	if !cfg.Prepared {
		if err := ops.install(p, cfg.Device); err != nil {
			return nil, err
		}
	}
	return ops.open(cfg)
}

// Under load WireGuard's buffer pools grow (a stream of a few Gbit/s took
// the agent from 48 to 195 MB), and the runtime gives the memory back to
// the system only over minutes. Once the traffic that grew them is over,
// reclaim gives it back at once.
const (
	// reclaimAfter is how much must have crossed for a burst to count.
	reclaimAfter = 256 << 20
	// quietBelow is how little may cross between two looks for the burst to
	// be over.
	quietBelow = 1 << 20
)

// reclaim returns the memory of a burst of traffic once it is over.
func (n *network) reclaim() {
	var total uint64
	for _, s := range n.peerStats() {
		total += s.RxBytes + s.TxBytes
	}
	crossed := total - n.lastBytes
	if total < n.lastBytes {
		crossed = total // a device opened anew
	}
	n.lastBytes = total
	switch {
	case crossed >= reclaimAfter:
		n.burst = true
	case n.burst && crossed < quietBelow:
		n.burst = false
		// Twice: a pool's buffers outlive one collection.
		debug.FreeOSMemory()
		debug.FreeOSMemory()
	}
}

// say logs why the overlay is not up, once per reason, and shows it in
// status.
func (n *network) say(why string) {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.dev == nil {
		n.state = "down: " + why
	}
	if why != n.refused {
		n.refused = why
		n.a.log.Error("overlay: " + why)
	}
}

func (n *network) setState(s string) {
	n.mu.Lock()
	n.state = s
	n.mu.Unlock()
}

func (n *network) close() {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.dev != nil {
		n.dev.Close()
		n.dev = nil
	}
}

// status is what the local API shows of the overlay: this node's state and
// each peer's last handshake and bytes.
func (n *network) status() api.OverlayStatus {
	n.mu.Lock()
	out := api.OverlayStatus{State: n.state, Peers: map[string]api.PeerStatus{}}
	dev := n.dev
	n.mu.Unlock()
	if dev == nil {
		return out
	}
	stats, err := dev.Stats()
	if err != nil {
		out.State += "; its peers cannot be read: " + err.Error()
		return out
	}
	now := time.Now()
	for name, s := range stats {
		ps := api.PeerStatus{Endpoint: s.Endpoint, RxBytes: s.RxBytes, TxBytes: s.TxBytes, Stale: true}
		if !s.LastHandshake.IsZero() {
			at := s.LastHandshake
			ps.LastHandshake = &at
			ps.Stale = now.Sub(at) > overlay.StaleAfter*time.Second
		}
		out.Peers[name] = ps
	}
	return out
}

// peerStats is the overlay's peers for the metrics.
func (n *network) peerStats() map[string]overlay.PeerStats {
	n.mu.Lock()
	dev := n.dev
	n.mu.Unlock()
	if dev == nil {
		return nil
	}
	s, _ := dev.Stats()
	return s
}

// CheckOverlay says whether prefix can be this host's overlay: a CIDR that
// overlaps none of the host's addresses and routes (mesh init checks the
// first node's host; every agent checks its own at start).
func CheckOverlay(prefix string) error {
	if prefix == state.OverlayOff {
		return nil
	}
	p, err := state.ParseOverlay(prefix)
	if err != nil {
		return err
	}
	clash, err := overlay.Overlaps(p, DefaultOverlayDevice)
	if err != nil {
		return fmt.Errorf("read this host's addresses and routes: %w", err)
	}
	if len(clash) > 0 {
		return fmt.Errorf("the overlay %s overlaps this host's %s; choose another with --overlay CIDR (or --overlay off where the nodes already share a private network)", p, strings.Join(clash, ", "))
	}
	return nil
}
