package connlimit

import (
	"bufio"
	"fmt"
	"net"
	"net/netip"
	"os"
	"strconv"
	"strings"
)

// LoopbackOwner is the user whose socket is at the other end of c, a TCP
// connection over loopback, as the kernel lists it in /proc/net/tcp and
// tcp6 (the uid column of the client's socket); NoOwner when it is not
// listed (closed meanwhile) or c is not TCP. Every local user, and the
// sshd of an operator's `ssh -L`, connects from 127.0.0.1: the address
// alone cannot tell them apart.
func LoopbackOwner(c net.Conn) int {
	remote, ok1 := c.RemoteAddr().(*net.TCPAddr)
	local, ok2 := c.LocalAddr().(*net.TCPAddr)
	if !ok1 || !ok2 {
		return NoOwner
	}
	r, l := remote.AddrPort(), local.AddrPort()
	// The client's socket: its local address is c's remote one.
	for _, f := range []struct {
		path string
		v6   bool
	}{{"/proc/net/tcp", false}, {"/proc/net/tcp6", true}} {
		if !f.v6 && !(r.Addr().Unmap().Is4() && l.Addr().Unmap().Is4()) {
			continue
		}
		if uid, ok := ownerIn(f.path, procAddr(r, f.v6), procAddr(l, f.v6)); ok {
			return uid
		}
	}
	return NoOwner
}

// ownerIn is the uid of the socket at local connected to remote, as the
// kernel's table at path lists them.
func ownerIn(path, local, remote string) (int, bool) {
	f, err := os.Open(path)
	if err != nil {
		return 0, false
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		// sl local rem st queues tr retrnsmt uid ...
		fs := strings.Fields(sc.Text())
		if len(fs) < 8 || fs[1] != local || fs[2] != remote {
			continue
		}
		uid, err := strconv.Atoi(fs[7])
		return uid, err == nil
	}
	return 0, false
}

// procAddr is how /proc/net/tcp (tcp6 when v6) writes ap: the address's
// 32-bit words as the kernel holds them (little-endian on the machines
// mesh runs on: amd64, arm64), in hex, then the port.
func procAddr(ap netip.AddrPort, v6 bool) string {
	var b []byte
	if v6 {
		a := ap.Addr().As16()
		b = a[:]
	} else {
		a := ap.Addr().Unmap().As4()
		b = a[:]
	}
	var s strings.Builder
	for i := 0; i < len(b); i += 4 {
		fmt.Fprintf(&s, "%02X%02X%02X%02X", b[i+3], b[i+2], b[i+1], b[i])
	}
	fmt.Fprintf(&s, ":%04X", ap.Port())
	return s.String()
}
