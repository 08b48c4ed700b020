package agent

import (
	"errors"
	"fmt"
	"io"
	"net/netip"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"strconv"
	"strings"

	"mesh/agent/overlay"
	"mesh/cluster"
	"mesh/dnsd"
	"mesh/state"
)

// SetupConfig is what mesh setup prepares a host for.
type SetupConfig struct {
	// DNSAddress is the resolver address the host's agents use.
	DNSAddress netip.Addr
	// User, when set, is the user whose rootless agent may bind the
	// resolver's port 53 (through the helper, port53.go) and owns the
	// overlay device.
	User string
	// DataDir is User's agent's data dir (default ~USER/.local/share/mesh):
	// its node's overlay address and prefix are read from there.
	DataDir string
	// OverlayDevice is the overlay's interface name.
	OverlayDevice string
	// Binary is this program: the helper is a copy of it.
	Binary string
}

// oldSysctl is the file an earlier mesh setup wrote: it let every user of
// the host bind port 53 and up.
const oldSysctl = "/etc/sysctl.d/50-mesh.conf"

// Setup does, as root, what a rootless agent cannot, and nothing that widens
// what the host's other users may do: the resolver address on a port-less
// bridge; port 53 for User's agent alone (the helper); /dev/net/tun for
// slirp4netns; and, once User's node has its overlay address, the overlay
// device (owned by User, with the node's address and routes) and the
// packet filter that keeps the overlay's prefix to the device. It says
// what it did on out, and is safe to run again (at every boot:
// contrib/mesh-setup.service).
func Setup(cfg SetupConfig, out io.Writer) error {
	if os.Geteuid() != 0 {
		return errors.New("mesh setup needs root: it creates network links and a file capability (sudo mesh setup)")
	}
	if err := dnsd.EnsureAddress(cfg.DNSAddress, dnsd.DefaultLink); err != nil {
		return err
	}
	fmt.Fprintf(out, "resolver address %s is on %s\n", cfg.DNSAddress, dnsd.DefaultLink)
	if err := undoOldSysctl(out); err != nil {
		return err
	}
	if err := os.Chmod("/dev/net/tun", 0o666); err != nil {
		return fmt.Errorf("open /dev/net/tun to users (rootless networking needs it): %w", err)
	}
	fmt.Fprintln(out, "/dev/net/tun is open to users (slirp4netns; a user can attach only to a TUN device they own)")
	if cfg.User == "" {
		fmt.Fprintln(out, "no --user given: no rootless agent may bind port 53 on this host yet; run mesh setup --user USER for the user whose agent runs here")
		return nil
	}
	helper, err := InstallHelper(cfg.Binary, cfg.User)
	if err != nil {
		return err
	}
	fmt.Fprintf(out, "port 53: only %s's agent may bind it, on %s only, through %s (mode 0750, one capability); nothing changes for other users\n", cfg.User, dnsd.DefaultLink, helper)
	if err := setupOverlay(cfg, out); err != nil {
		return err
	}
	fmt.Fprintln(out, "the bridge, the overlay device and /dev/net/tun's mode do not survive a reboot: run mesh setup at boot (contrib/mesh-setup.service)")
	return nil
}

// undoOldSysctl takes back what an earlier mesh setup did for every user.
func undoOldSysctl(out io.Writer) error {
	b, err := os.ReadFile(oldSysctl)
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		return err
	}
	if !strings.Contains(string(b), "# mesh:") {
		return nil // not ours
	}
	if err := os.Remove(oldSysctl); err != nil {
		return err
	}
	if v, err := os.ReadFile("/proc/sys/net/ipv4/ip_unprivileged_port_start"); err == nil && strings.TrimSpace(string(v)) == "53" {
		if b, err := exec.Command("sysctl", "-qw", "net.ipv4.ip_unprivileged_port_start=1024").CombinedOutput(); err != nil {
			return fmt.Errorf("sysctl: %v: %s", err, b)
		}
	}
	fmt.Fprintf(out, "removed %s (an earlier mesh setup let every user bind ports from 53) and put the limit back at 1024\n", oldSysctl)
	return nil
}

// setupOverlay prepares the overlay device and filter of User's node.
func setupOverlay(cfg SetupConfig, out io.Writer) error {
	u, err := user.Lookup(cfg.User)
	if err != nil {
		return err
	}
	dir := cfg.DataDir
	if dir == "" {
		dir = filepath.Join(u.HomeDir, ".local", "share", "mesh")
	}
	id, err := cluster.ReadIdentity(dir)
	if err != nil {
		fmt.Fprintf(out, "overlay: no node in %s yet; run mesh setup again after mesh init or mesh join there\n", dir)
		return nil
	}
	switch {
	case id.Overlay == state.OverlayOff:
		fmt.Fprintf(out, "overlay: off for node %s (mesh init --overlay off)\n", id.Name)
		return nil
	case id.OverlayAddress == "" || id.Overlay == "":
		fmt.Fprintf(out, "overlay: node %s has no overlay address yet (a mesh made by an earlier release); start its agent, then run mesh setup again\n", id.Name)
		return nil
	}
	p, err := state.ParseOverlay(id.Overlay)
	if err != nil {
		return fmt.Errorf("the overlay of %s: %w", dir, err)
	}
	// node.json is the user's to edit: what root installs from it is
	// checked (a private prefix, an address in it) before it is.
	addr, err := netip.ParseAddr(id.OverlayAddress)
	if err != nil || !p.Contains(addr) || addr == p.Addr() {
		return fmt.Errorf("the overlay address %q in %s is not a host of the overlay %s; the data dir is damaged (or was edited)", id.OverlayAddress, dir, p)
	}
	device := cfg.OverlayDevice
	if device == "" {
		device = DefaultOverlayDevice
	}
	if clash, err := overlay.Overlaps(p, device); err == nil && len(clash) > 0 {
		return fmt.Errorf("the mesh's overlay %s overlaps this host's %s; free the range here (the overlay cannot come up on this node)", p, strings.Join(clash, ", "))
	}
	uid, _ := strconv.Atoi(u.Uid)
	mtu := overlay.UnderlayMTU(netip.MustParseAddr(id.Address)) - overlay.Overhead
	ops := prepareOps{install: overlay.InstallFilter, prepare: overlay.Prepare}
	if err := prepareFiltered(p, device, uid, netip.PrefixFrom(addr, p.Bits()), mtu, ops); err != nil {
		return err
	}
	fmt.Fprintf(out, "overlay: %s holds %s/%d (MTU %d), owned by %s; traffic for %s that did not come through it is dropped (nftables table ip %s)\n",
		device, addr, p.Bits(), mtu, cfg.User, p, overlay.FilterTable)
	return nil
}

// prepareOps are what prepareFiltered does to the host (a test's fakes).
type prepareOps struct {
	install func(prefix netip.Prefix, device string) error
	prepare func(device string, uid int, addr netip.Prefix, mtu int) error
}

// prepareFiltered makes a rootless agent's overlay device with its
// address, the packet filter installed first, as openFiltered does as
// root: the device is persistent, and made before a filter that then
// failed (no nf_tables in a container or on a locked-down VPS), it kept
// the overlay address on the host with nothing to keep the LAN from the
// ports the agent then published there (the agent checks only the link).
// The filter names the device, which need not exist yet.
func prepareFiltered(p netip.Prefix, device string, uid int, addr netip.Prefix, mtu int, ops prepareOps) error {
	if err := ops.install(p, device); err != nil {
		return err
	}
	return ops.prepare(device, uid, addr, mtu)
}
