package overlay

import (
	"bufio"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
	"golang.zx2c4.com/wireguard/conn"
	"golang.zx2c4.com/wireguard/device"
	"golang.zx2c4.com/wireguard/tun"

	"mesh/internal/wgkey"
)

// Config is what a node's device is made from.
type Config struct {
	// Device is the interface name (DefaultDevice).
	Device string
	Key    *wgkey.Key
	// Address is this node's overlay address with the overlay's prefix
	// length: the kernel routes the whole prefix into the device.
	Address    netip.Prefix
	ListenPort int
	// MTU is the device's MTU (the underlay's less Overhead).
	MTU int
	// Prepared: `mesh setup` made and configured the device (a rootless
	// agent may not): the agent attaches to it as it is and checks it.
	Prepared bool
	Logger   *slog.Logger
}

// Device is the node's running WireGuard device.
type Device struct {
	cfg Config
	dev *device.Device
	log *slog.Logger

	mu    sync.Mutex
	peers []Peer // as last told to WireGuard
}

// Open attaches to the node's TUN device (making it, persistent, as root),
// configures its address and MTU (as root) and starts WireGuard on it with
// the node's key. The device is persistent so that a restarted agent (an
// upgrade, a kill -9) finds its address and routes in place and the
// connections through it survive the restart.
func Open(cfg Config) (*Device, error) {
	if cfg.Device == "" {
		cfg.Device = DefaultDevice
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	log := cfg.Logger.With("component", "overlay")
	fd, err := attach(cfg.Device, !cfg.Prepared)
	if err != nil {
		if cfg.Prepared {
			return nil, fmt.Errorf("attach to the overlay device %s (made by mesh setup): %w; run mesh setup again as root", cfg.Device, err)
		}
		return nil, fmt.Errorf("make the overlay device %s: %w", cfg.Device, err)
	}
	if cfg.Prepared {
		err = checkLink(cfg.Device, cfg.Address)
	} else {
		err = configureLink(cfg.Device, cfg.Address, cfg.MTU)
	}
	if err != nil {
		unix.Close(fd)
		return nil, err
	}
	t, _, err := tun.CreateUnmonitoredTUNFromFD(fd)
	if err != nil {
		unix.Close(fd)
		return nil, fmt.Errorf("open the overlay device %s: %w", cfg.Device, err)
	}
	wl := &device.Logger{
		Verbosef: func(f string, a ...any) { log.Debug(fmt.Sprintf(f, a...)) },
		Errorf:   func(f string, a ...any) { log.Warn(fmt.Sprintf(f, a...)) },
	}
	d := &Device{cfg: cfg, dev: device.NewDevice(t, conn.NewDefaultBind(), wl), log: log}
	if err := d.dev.IpcSet(fmt.Sprintf("private_key=%s\nlisten_port=%d\nreplace_peers=true\n", cfg.Key.PrivateHex(), cfg.ListenPort)); err != nil {
		d.dev.Close()
		return nil, fmt.Errorf("configure the overlay device: %w", err)
	}
	if err := d.dev.Up(); err != nil {
		d.dev.Close()
		return nil, fmt.Errorf("bring the overlay device up: %w", err)
	}
	log.Info("overlay up", "device", cfg.Device, "address", cfg.Address, "listen_port", cfg.ListenPort, "mtu", cfg.MTU)
	return d, nil
}

// Set makes the device's peers want, telling WireGuard only what changed.
func (d *Device) Set(want []Peer) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	c := change(d.peers, want)
	if c == "" {
		return nil
	}
	if err := d.dev.IpcSet(c); err != nil {
		// What WireGuard holds is no longer known: start from none, so the
		// next Set tells it everything again.
		d.dev.IpcSet("replace_peers=true\n")
		d.peers = nil
		return fmt.Errorf("configure the overlay's peers: %w", err)
	}
	for _, p := range want {
		if !hasPeer(d.peers, p.Name) {
			d.log.Info("overlay peer added", "peer", p.Name, "address", p.Address, "endpoint", p.Endpoint)
		}
	}
	for _, p := range d.peers {
		if !hasPeer(want, p.Name) {
			d.log.Info("overlay peer removed", "peer", p.Name, "address", p.Address)
		}
	}
	d.peers = append([]Peer(nil), want...)
	return nil
}

func hasPeer(ps []Peer, name string) bool {
	for _, p := range ps {
		if p.Name == name {
			return true
		}
	}
	return false
}

// PeerStats is what WireGuard says of one peer.
type PeerStats struct {
	Endpoint string
	// LastHandshake is zero when no handshake was ever completed.
	LastHandshake time.Time
	RxBytes       uint64
	TxBytes       uint64
}

// Stats is each peer's stats, by node name.
func (d *Device) Stats() (map[string]PeerStats, error) {
	d.mu.Lock()
	byKey := map[string]string{}
	for _, p := range d.peers {
		byKey[p.KeyHex] = p.Name
	}
	d.mu.Unlock()
	s, err := d.dev.IpcGet()
	if err != nil {
		return nil, err
	}
	return parseStats(s, byKey), nil
}

// parseStats reads WireGuard's get reply into stats per node name.
func parseStats(s string, byKey map[string]string) map[string]PeerStats {
	out := map[string]PeerStats{}
	var name string
	var cur PeerStats
	var sec, nsec int64
	flush := func() {
		if name != "" {
			if sec > 0 {
				cur.LastHandshake = time.Unix(sec, nsec)
			}
			out[name] = cur
		}
	}
	sc := bufio.NewScanner(strings.NewReader(s))
	for sc.Scan() {
		k, v, ok := strings.Cut(sc.Text(), "=")
		if !ok {
			continue
		}
		switch k {
		case "public_key":
			flush()
			name, cur, sec, nsec = byKey[v], PeerStats{}, 0, 0
		case "endpoint":
			cur.Endpoint = v
		case "last_handshake_time_sec":
			sec, _ = strconv.ParseInt(v, 10, 64)
		case "last_handshake_time_nsec":
			nsec, _ = strconv.ParseInt(v, 10, 64)
		case "rx_bytes":
			cur.RxBytes, _ = strconv.ParseUint(v, 10, 64)
		case "tx_bytes":
			cur.TxBytes, _ = strconv.ParseUint(v, 10, 64)
		}
	}
	flush()
	return out
}

// Close stops WireGuard; the device, its address and routes stay for the
// next start.
func (d *Device) Close() { d.dev.Close() }

// attach opens the TUN device name, making it persistent if create.
func attach(name string, create bool) (int, error) {
	fd, err := unix.Open("/dev/net/tun", unix.O_RDWR|unix.O_CLOEXEC, 0)
	if err != nil {
		return -1, err
	}
	ifr, err := unix.NewIfreq(name)
	if err != nil {
		unix.Close(fd)
		return -1, err
	}
	// As wireguard-go's own CreateTUN: with a virtio header, so the device
	// takes and gives batches with offloads.
	ifr.SetUint16(unix.IFF_TUN | unix.IFF_NO_PI | unix.IFF_VNET_HDR)
	if err := unix.IoctlIfreq(fd, unix.TUNSETIFF, ifr); err != nil {
		unix.Close(fd)
		return -1, err
	}
	if create {
		if err := unix.IoctlSetInt(fd, unix.TUNSETPERSIST, 1); err != nil {
			unix.Close(fd)
			return -1, fmt.Errorf("make it persistent: %w", err)
		}
	}
	return fd, nil
}

// configureLink gives the device its address (and so the route of the
// prefix) and MTU, and brings it up; each is done only when not so already.
func configureLink(name string, addr netip.Prefix, mtu int) error {
	l, err := netlink.LinkByName(name)
	if err != nil {
		return fmt.Errorf("find the overlay device %s: %w", name, err)
	}
	if mtu > 0 && l.Attrs().MTU != mtu {
		if err := netlink.LinkSetMTU(l, mtu); err != nil {
			return fmt.Errorf("set the MTU of %s to %d: %w", name, mtu, err)
		}
	}
	addrs, err := netlink.AddrList(l, unix.AF_INET)
	if err != nil {
		return err
	}
	for _, a := range addrs {
		p, _ := netip.AddrFromSlice(a.IP)
		ones, _ := a.Mask.Size()
		if p.Unmap() != addr.Addr() || ones != addr.Bits() {
			// An address of an earlier overlay (or someone else's) on the
			// mesh's own device goes.
			netlink.AddrDel(l, &a)
		}
	}
	na := &netlink.Addr{IPNet: &net.IPNet{IP: addr.Addr().AsSlice(), Mask: net.CIDRMask(addr.Bits(), 32)}}
	if err := netlink.AddrReplace(l, na); err != nil {
		return fmt.Errorf("put %s on %s: %w", addr, name, err)
	}
	if err := netlink.LinkSetUp(l); err != nil {
		return fmt.Errorf("bring %s up: %w", name, err)
	}
	return nil
}

// checkLink checks that a prepared device holds addr and is up.
func checkLink(name string, addr netip.Prefix) error {
	l, err := netlink.LinkByName(name)
	if err != nil {
		return fmt.Errorf("the overlay device %s is missing (%v); run mesh setup as root", name, err)
	}
	addrs, err := netlink.AddrList(l, unix.AF_INET)
	if err != nil {
		return err
	}
	for _, a := range addrs {
		p, _ := netip.AddrFromSlice(a.IP)
		ones, _ := a.Mask.Size()
		if p.Unmap() == addr.Addr() && ones == addr.Bits() {
			if l.Attrs().Flags&net.FlagUp == 0 {
				return fmt.Errorf("the overlay device %s is down; run mesh setup as root", name)
			}
			return nil
		}
	}
	return fmt.Errorf("the overlay device %s does not hold this node's address %s; run mesh setup as root (it reads the address from the data dir)", name, addr)
}

// Prepare makes and configures the device for a rootless agent of uid:
// persistent, owned by uid, with addr and mtu, up. `mesh setup` calls it
// as root.
func Prepare(name string, uid int, addr netip.Prefix, mtu int) error {
	fd, err := attach(name, true)
	if err != nil {
		return fmt.Errorf("make the overlay device %s: %w", name, err)
	}
	defer unix.Close(fd)
	if err := unix.IoctlSetInt(fd, unix.TUNSETOWNER, uid); err != nil {
		return fmt.Errorf("give %s to uid %d: %w", name, uid, err)
	}
	return configureLink(name, addr, mtu)
}

// UnderlayMTU is the MTU of the interface that holds addr (the node's mesh
// address), or 1500 when none does (an address behind a NAT).
func UnderlayMTU(addr netip.Addr) int {
	ifs, err := net.Interfaces()
	if err != nil {
		return 1500
	}
	for _, i := range ifs {
		as, _ := i.Addrs()
		for _, a := range as {
			if n, ok := a.(*net.IPNet); ok {
				if p, _ := netip.AddrFromSlice(n.IP); p.Unmap() == addr {
					return i.MTU
				}
			}
		}
	}
	return 1500
}

// Overlaps says which of the host's addresses and routes, outside the
// mesh's own device, overlap prefix: a prefix that does would take traffic
// away from them (or they from the overlay).
func Overlaps(prefix netip.Prefix, device string) ([]string, error) {
	var out []string
	links, err := netlink.LinkList()
	if err != nil {
		return nil, err
	}
	skip := map[int]bool{}
	for _, l := range links {
		if l.Attrs().Name == device {
			skip[l.Attrs().Index] = true
		}
	}
	addrs, err := netlink.AddrList(nil, unix.AF_INET)
	if err != nil {
		return nil, err
	}
	for _, a := range addrs {
		if skip[a.LinkIndex] {
			continue
		}
		p, _ := netip.AddrFromSlice(a.IP)
		ones, _ := a.Mask.Size()
		if q := netip.PrefixFrom(p.Unmap(), ones).Masked(); q.Overlaps(prefix) {
			out = append(out, "address "+a.IPNet.String())
		}
	}
	routes, err := netlink.RouteList(nil, unix.AF_INET)
	if err != nil {
		return nil, err
	}
	for _, r := range routes {
		if r.Dst == nil || skip[r.LinkIndex] {
			continue
		}
		p, _ := netip.AddrFromSlice(r.Dst.IP)
		ones, _ := r.Dst.Mask.Size()
		if ones == 0 {
			continue // the default route overlaps everything and takes nothing
		}
		if q := netip.PrefixFrom(p.Unmap(), ones); q.Overlaps(prefix) {
			out = append(out, "route "+r.Dst.String())
		}
	}
	return dedupe(out), nil
}

func dedupe(s []string) []string {
	seen := map[string]bool{}
	var out []string
	for _, x := range s {
		if !seen[x] {
			seen[x] = true
			out = append(out, x)
		}
	}
	return out
}
