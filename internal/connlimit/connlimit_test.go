package connlimit

import (
	"errors"
	"net"
	"net/netip"
	"os"
	"testing"
	"time"
)

func TestBounds(t *testing.T) {
	b := New(3, 2)
	x, y, z := netip.MustParseAddr("10.0.0.1"), netip.MustParseAddr("10.0.0.2"), netip.MustParseAddr("10.0.0.3")
	for i, c := range []struct {
		src  netip.Addr
		open int
		ok   bool
	}{
		{x, 0, true}, {x, 1, true}, {x, 2, false}, // two from one source
		{y, 0, true}, {z, 0, false}, // three in all
	} {
		if open, ok := b.Take(c.src); open != c.open || ok != c.ok {
			t.Fatalf("take %d from %s: %d %v, want %d %v", i, c.src, open, ok, c.open, c.ok)
		}
	}
	if b.Open() != 3 {
		t.Fatalf("open %d, want 3", b.Open())
	}
	b.Give(x)
	if _, ok := b.Take(z); !ok {
		t.Fatal("a place given back was not taken again")
	}
	if _, ok := b.Take(x); ok {
		t.Fatal("a fourth connection in all was let in")
	}
	b.Give(x)
	b.Give(y)
	b.Give(z)
	if b.Open() != 0 || len(b.by) != 0 {
		t.Fatalf("after giving all back: open %d, by %v", b.Open(), b.by)
	}
	if !b.WarnNow() || b.WarnNow() {
		t.Fatal("WarnNow: want yes once, then no within the minute")
	}
}

// NewByNetwork counts the addresses of one IPv6 /64 as one source (one
// host can use any of them), IPv4 and other /64s apart; New counts each
// address.
func TestBoundsByNetwork(t *testing.T) {
	a1, a2, a3 := netip.MustParseAddr("2001:db8:1:2::1"), netip.MustParseAddr("2001:db8:1:2:ffff::9"), netip.MustParseAddr("2001:db8:1:2:1:2:3:4")
	other, v4 := netip.MustParseAddr("2001:db8:1:3::1"), netip.MustParseAddr("10.0.0.1")
	b := NewByNetwork(10, 2)
	for i, c := range []struct {
		src  netip.Addr
		open int
		ok   bool
	}{
		{a1, 0, true}, {a2, 1, true}, {a3, 2, false}, // one /64: two in all
		{other, 0, true}, {v4, 0, true}, {v4, 1, true}, {v4, 2, false},
	} {
		if open, ok := b.Take(c.src); open != c.open || ok != c.ok {
			t.Fatalf("take %d from %s: %d %v, want %d %v", i, c.src, open, ok, c.open, c.ok)
		}
	}
	b.Give(a2) // given back by another address of the /64
	if _, ok := b.Take(a3); !ok {
		t.Fatal("a place the /64 gave back was not taken again")
	}
	for _, src := range []netip.Addr{a1, a3, other, v4, v4} {
		b.Give(src)
	}
	if b.Open() != 0 || len(b.by) != 0 {
		t.Fatalf("after giving all back: open %d, by %v", b.Open(), b.by)
	}
	per := New(10, 2)
	for _, src := range []netip.Addr{a1, a2, a3} {
		if _, ok := per.Take(src); !ok {
			t.Fatalf("New counted %s with the other addresses of its /64", src)
		}
	}
}

// The listener turns away what is over a bound, at once, and gives a
// place back when its connection closes.
func TestListener(t *testing.T) {
	inner, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	turned := make(chan netip.Addr, 4)
	l := &Listener{Listener: inner, Bounds: New(10, 2), TurnedAway: func(src netip.Addr, _ int) { turned <- src }}
	defer l.Close()
	accepted := make(chan net.Conn, 4)
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			accepted <- c
		}
	}()
	dial := func() net.Conn {
		c, err := net.Dial("tcp", inner.Addr().String())
		if err != nil {
			t.Fatal(err)
		}
		return c
	}
	a, b := dial(), dial()
	defer a.Close()
	defer b.Close()
	first, second := <-accepted, <-accepted
	third := dial()
	defer third.Close()
	// The third from one source is closed by the server before anything is
	// read: the client reads EOF.
	third.SetReadDeadline(time.Now().Add(5 * time.Second))
	if n, err := third.Read(make([]byte, 1)); n != 0 || err == nil || errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatalf("over the bound: read %d, %v; want the connection closed", n, err)
	}
	if src := <-turned; src.String() != "127.0.0.1" {
		t.Fatalf("turned away %s", src)
	}
	// A place given back lets the next in.
	first.Close()
	first.Close() // once only
	fourth := dial()
	defer fourth.Close()
	select {
	case c := <-accepted:
		c.Close()
	case <-time.After(5 * time.Second):
		t.Fatal("a freed place did not let the next connection in")
	}
	second.Close()
	if open := l.Bounds.Open(); open != 0 {
		t.Fatalf("%d open after every accepted connection closed", open)
	}
}
