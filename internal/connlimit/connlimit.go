// Package connlimit counts a server's open connections by source address
// against two bounds, one for a single source and one for all: what the
// resolver's TCP listener and the node port's guests share.
package connlimit

import (
	"net"
	"net/netip"
	"sync"
	"sync/atomic"
	"time"
)

// Bounds counts open connections. The zero value is not usable: use New.
type Bounds struct {
	Total, PerSource int

	mu   sync.Mutex
	open int
	by   map[source]int
	// v6Bits, when set, counts an IPv6 source by its prefix of that
	// length (NewByNetwork).
	v6Bits int
	warn   Throttle
}

// New bounds connections to total in all and perSource from one address.
func New(total, perSource int) *Bounds {
	return &Bounds{Total: total, PerSource: perSource, by: map[source]int{}}
}

// NewByNetwork is New counting an IPv6 source by its /64: one host
// commonly holds a whole /64, and counted by address it could hold every
// place with a few of them. For ports strangers reach (the web page,
// guests at the node port), at the price that the machines of one /64
// share a source's places (a browser holds one to a few connections, a
// join one for a moment); not for the resolver, whose clients are the
// node's containers, nor for the binary's downloads, one per source.
func NewByNetwork(total, perSource int) *Bounds {
	b := New(total, perSource)
	b.v6Bits = 64
	return b
}

// source is what a connection is counted as: its address (its network,
// for NewByNetwork), or on a loopback address the user whose socket it is
// when known (Listener.Owner); owner is NoOwner otherwise.
type source struct {
	addr  netip.Addr
	owner int
}

// NoOwner is the owner of a connection whose user is not known.
const NoOwner = -1

func (b *Bounds) source(src netip.Addr, owner int) source {
	if owner != NoOwner {
		// A local user may connect from any address of 127.0.0.0/8:
		// counted by user alone.
		return source{owner: owner}
	}
	if b.v6Bits == 0 || !src.Is6() {
		return source{src, owner}
	}
	p, err := src.Prefix(b.v6Bits)
	if err != nil {
		return source{src, owner}
	}
	return source{p.Addr(), owner}
}

// Take counts a connection from src in if both bounds allow it; it returns
// how many src (its network, for NewByNetwork) had open before.
func (b *Bounds) Take(src netip.Addr) (int, bool) { return b.TakeAs(src, NoOwner) }

// Give counts a connection from src out; call it once for each Take that
// said yes.
func (b *Bounds) Give(src netip.Addr) { b.GiveAs(src, NoOwner) }

// TakeAs is Take of a connection of user owner (NoOwner when not known),
// counted apart from other users' at the same address.
func (b *Bounds) TakeAs(src netip.Addr, owner int) (int, bool) {
	b.mu.Lock()
	defer b.mu.Unlock()
	key := b.source(src, owner)
	n := b.by[key]
	if n >= b.PerSource || b.open >= b.Total {
		return n, false
	}
	b.by[key] = n + 1
	b.open++
	return n, true
}

// GiveAs is Give of what TakeAs took.
func (b *Bounds) GiveAs(src netip.Addr, owner int) {
	b.mu.Lock()
	defer b.mu.Unlock()
	key := b.source(src, owner)
	b.open--
	if b.by[key]--; b.by[key] <= 0 {
		delete(b.by, key)
	}
}

// Open is how many connections are counted in.
func (b *Bounds) Open() int {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.open
}

// WarnNow says whether to log a connection turned away: once a minute at
// most, so that a flood does not flood the log too.
func (b *Bounds) WarnNow() bool { return b.warn.Now() }

// Throttle says yes at most once a minute: what a log line anybody on the
// network can cause is written through, so that a flood does not fill the
// log. The zero value is ready.
type Throttle struct {
	last atomic.Int64 // when Now last said yes (unix ns)
}

// Now says whether to log now.
func (t *Throttle) Now() bool {
	now := time.Now().UnixNano()
	last := t.last.Load()
	return now-last > int64(time.Minute) && t.last.CompareAndSwap(last, now)
}

// Source is the address a connection comes from (IPv4 in IPv6 unmapped);
// the zero Addr when it has none.
func Source(c net.Conn) netip.Addr {
	if a, ok := c.RemoteAddr().(*net.TCPAddr); ok {
		return a.AddrPort().Addr().Unmap()
	}
	return netip.Addr{}
}

// Listener closes a new connection at once, before anything is read from
// it, when its source has PerSource connections open already or Total are
// open in all; a connection turned away costs the client a retry, not a
// hang. TurnedAway, when set, is told of each one WarnNow lets through (at
// most once a minute). What the resolver's TCP port and the web page share.
type Listener struct {
	net.Listener
	Bounds     *Bounds
	TurnedAway func(src netip.Addr, openFromIt int)
	// Owner, when set, is asked the user of a connection from a loopback
	// address (LoopbackOwner), and each user's connections are counted
	// apart: every local user connects from the same address, and one
	// must not hold the places of the operator's `ssh -L`.
	Owner func(net.Conn) int
}

// Accept returns the next connection the bounds let in.
func (l *Listener) Accept() (net.Conn, error) {
	for {
		c, err := l.Listener.Accept()
		if err != nil {
			return nil, err
		}
		src, owner := Source(c), NoOwner
		if l.Owner != nil && src.IsLoopback() {
			owner = l.Owner(c)
		}
		if open, ok := l.Bounds.TakeAs(src, owner); !ok {
			c.Close()
			if l.TurnedAway != nil && l.Bounds.WarnNow() {
				l.TurnedAway(src, open)
			}
			continue
		}
		return &limitedConn{Conn: c, release: sync.OnceFunc(func() { l.Bounds.GiveAs(src, owner) })}, nil
	}
}

// limitedConn gives its place back when closed (once, however often Close
// is called).
type limitedConn struct {
	net.Conn
	release func()
}

func (c *limitedConn) Close() error {
	err := c.Conn.Close()
	c.release()
	return err
}
