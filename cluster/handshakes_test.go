package cluster

import (
	"net"
	"testing"
)

type addrConn struct {
	net.Conn
	addr *net.TCPAddr
}

func (c addrConn) RemoteAddr() net.Addr { return c.addr }

// The handshakes' bounds count an IPv6 source by its /64 and an IPv4 one
// by its address, push out the oldest first, and forget a connection
// whose handshake ended.
func TestHandshakesBySource(t *testing.T) {
	h := newHandshakes(4, 2)
	conn := func(ip string) net.Conn { return addrConn{addr: &net.TCPAddr{IP: net.ParseIP(ip), Port: 1}} }
	a1, a2, a3 := conn("2001:db8:0:1::1"), conn("2001:db8:0:1::2"), conn("2001:db8:0:1:ffff::3")
	h.begin(a1)
	h.begin(a2)
	if _, out := h.begin(a3); len(out) != 1 || out[0] != a1 {
		t.Fatalf("the third of one /64 pushed out %v, want the first", out)
	}
	e, out := h.begin(conn("192.0.2.1"))
	if len(out) != 0 {
		t.Fatalf("another source pushed out %v", out)
	}
	h.end(e)
	if h.open() != 2 {
		t.Fatalf("%d open, want 2 (a2, a3)", h.open())
	}
	h.begin(conn("192.0.2.2"))
	h.begin(conn("192.0.2.3"))
	if _, out := h.begin(conn("192.0.2.4")); len(out) != 1 || out[0] != a2 {
		t.Fatalf("over the bound in all, pushed out %v, want the oldest (a2)", out)
	}
	if h.open() != 4 || len(h.bySource) != 4 {
		t.Fatalf("%d open from %d sources, want 4 from 4", h.open(), len(h.bySource))
	}
}
