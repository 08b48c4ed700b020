package dnsd

import (
	"fmt"
	"net"
	"net/netip"
	"os/exec"
	"strings"
)

// DefaultAddress is the node's resolver address: link-local, fixed, and the
// same on every node, so it never changes with the roster.
const DefaultAddress = "169.254.53.53"

// DefaultLink is the port-less bridge that carries the resolver address. This
// kernel has no dummy links; a bridge without ports works the same
// (ENVIRONMENT.md §2).
const DefaultLink = "meshdns0"

// HasAddress reports whether addr is configured on some interface.
func HasAddress(addr netip.Addr) bool {
	ifaddrs, err := net.InterfaceAddrs()
	if err != nil {
		return false
	}
	for _, a := range ifaddrs {
		if p, err := netip.ParsePrefix(a.String()); err == nil && p.Addr() == addr {
			return true
		}
	}
	return false
}

// EnsureAddress puts addr/32 on a port-less bridge named link, creating the
// bridge if needed (needs root). It does nothing when addr is already there.
func EnsureAddress(addr netip.Addr, link string) error {
	if HasAddress(addr) {
		return nil
	}
	run := func(args ...string) error {
		out, err := exec.Command("ip", args...).CombinedOutput()
		if err != nil {
			return fmt.Errorf("ip %s: %v: %s", strings.Join(args, " "), err, strings.TrimSpace(string(out)))
		}
		return nil
	}
	if _, err := net.InterfaceByName(link); err != nil {
		if err := run("link", "add", link, "type", "bridge"); err != nil {
			return err
		}
	}
	bits := 32
	if addr.Is6() {
		bits = 128
	}
	if err := run("addr", "add", fmt.Sprintf("%s/%d", addr, bits), "dev", link); err != nil {
		return err
	}
	return run("link", "set", link, "up")
}
