package cluster

import (
	"errors"
	"net"
	"net/netip"
	"sync/atomic"
	"testing"
	"time"

	"mesh/internal/testutil"
)

type addrConn struct {
	net.Conn
	addr     *net.TCPAddr
	deadline *time.Time
}

func (c addrConn) RemoteAddr() net.Addr { return c.addr }

func (c addrConn) SetDeadline(t time.Time) error { *c.deadline = t; return nil }

// The handshakes' bounds count an IPv6 source by its /64 and an IPv4 one
// by its address, push out the oldest first (its deadline set to now),
// forget a connection whose handshake ended, and keep a node's address
// apart: strangers never push out its handshakes, and it has a bound of
// its own.
func TestHandshakesBySource(t *testing.T) {
	node := netip.MustParseAddr("192.0.2.100")
	h := newHandshakes(4, 2, 3, func(a netip.Addr) bool { return a == node })
	var pushed []string
	conn := func(ip string) addrConn {
		c := addrConn{addr: &net.TCPAddr{IP: net.ParseIP(ip), Port: 1}, deadline: new(time.Time)}
		return c
	}
	begin := func(c addrConn) *handshake {
		e, out := h.begin(c)
		for _, a := range out {
			pushed = append(pushed, a.(*net.TCPAddr).IP.String())
		}
		return e
	}
	expect := func(what string, want ...string) {
		t.Helper()
		if len(pushed) != len(want) {
			t.Fatalf("%s: pushed out %v, want %v", what, pushed, want)
		}
		for i := range want {
			if pushed[i] != want[i] {
				t.Fatalf("%s: pushed out %v, want %v", what, pushed, want)
			}
		}
		pushed = nil
	}
	a1, a2, a3 := conn("2001:db8:0:1::1"), conn("2001:db8:0:1::2"), conn("2001:db8:0:1:ffff::3")
	e1 := begin(a1)
	begin(a2)
	begin(a3)
	expect("the third of one /64", "2001:db8:0:1::1")
	if a1.deadline.IsZero() || time.Until(*a1.deadline) > 0 {
		t.Fatalf("the connection pushed out has the deadline %v, want now", *a1.deadline)
	}
	h.end(e1) // its route ends it too: a no-op
	e := begin(conn("192.0.2.1"))
	expect("another source")
	h.end(e)
	if h.open() != 2 {
		t.Fatalf("%d open, want 2 (a2, a3)", h.open())
	}
	n1 := begin(conn("192.0.2.100"))
	begin(conn("192.0.2.100"))
	begin(conn("192.0.2.2"))
	begin(conn("192.0.2.3"))
	begin(conn("192.0.2.4"))
	expect("strangers over the bound in all, beside a node's", "2001:db8:0:1::2")
	if !n1.counted {
		t.Fatal("a stranger pushed out a node's handshake")
	}
	begin(conn("192.0.2.100"))
	expect("a node's third, under its own bound")
	begin(conn("192.0.2.100"))
	expect("a node's fourth", "192.0.2.100")
	if n1.counted {
		t.Fatal("the node's oldest was not the one pushed out")
	}
	if h.open() != 7 || h.all.Len() != 4 {
		t.Fatalf("%d open, %d of strangers; want 7 and 4", h.open(), h.all.Len())
	}
}

// failingListener fails every Accept, as a process out of descriptors sees.
type failingListener struct {
	net.Listener
	calls atomic.Int64
}

func (l *failingListener) Accept() (net.Conn, error) {
	l.calls.Add(1)
	return nil, errors.New("accept tcp: too many open files")
}
func (l *failingListener) Close() error   { return nil }
func (l *failingListener) Addr() net.Addr { return &net.TCPAddr{} }

// An accept that keeps failing is tried again after a wait that grows, not
// at once in a loop that takes a core.
func TestAcceptErrorsAreWaitedOut(t *testing.T) {
	ln := &failingListener{}
	logger, out := testutil.NewLog()
	m := newMux(ln, nil, nil, nil, logger)
	time.Sleep(300 * time.Millisecond)
	m.Close()
	// 5, 10, 20, 40, 80, 160 ms: 6 or 7 tries in 300 ms.
	if n := ln.calls.Load(); n > 10 {
		t.Fatalf("%d accepts in 300 ms", n)
	}
	if n := out.Count("accept on the node port failed"); n != 1 {
		t.Fatalf("the failure logged %d times, want once", n)
	}
}
