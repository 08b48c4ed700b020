package agent

import (
	"errors"
	"fmt"
	"io"
	"net/netip"
	"os"
	"os/exec"

	"mesh/dnsd"
	"mesh/internal/safefs"
)

// Setup does, as root, what a rootless agent cannot: the resolver address
// on a port-less bridge, port 53 for users, and /dev/net/tun for
// slirp4netns. It says what it did on out.
func Setup(addr netip.Addr, out io.Writer) error {
	if os.Geteuid() != 0 {
		return errors.New("mesh setup needs root: it creates a network link and sets a sysctl (sudo mesh setup)")
	}
	if err := dnsd.EnsureAddress(addr, dnsd.DefaultLink); err != nil {
		return err
	}
	fmt.Fprintf(out, "resolver address %s is on %s\n", addr, dnsd.DefaultLink)
	// Persisted for the next boot; applied now.
	if err := safefs.WriteFile("/etc/sysctl.d/50-mesh.conf", []byte("# mesh: a rootless agent's resolver binds port 53\nnet.ipv4.ip_unprivileged_port_start=53\n"), 0o644); err != nil {
		return err
	}
	if b, err := exec.Command("sysctl", "-qw", "net.ipv4.ip_unprivileged_port_start=53").CombinedOutput(); err != nil {
		return fmt.Errorf("sysctl: %v: %s", err, b)
	}
	fmt.Fprintln(out, "users may bind port 53 (net.ipv4.ip_unprivileged_port_start=53, also in /etc/sysctl.d/50-mesh.conf)")
	if err := os.Chmod("/dev/net/tun", 0o666); err != nil {
		return fmt.Errorf("open /dev/net/tun to users (rootless networking needs it): %w", err)
	}
	fmt.Fprintln(out, "/dev/net/tun is open to users (slirp4netns)")
	fmt.Fprintln(out, "the bridge and /dev/net/tun do not survive a reboot: run mesh setup at boot (contrib/mesh-setup.service)")
	return nil
}
