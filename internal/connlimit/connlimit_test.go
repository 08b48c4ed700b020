package connlimit

import (
	"net/netip"
	"testing"
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
