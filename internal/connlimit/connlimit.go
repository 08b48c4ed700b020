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
	by   map[netip.Addr]int
	// warned is when WarnNow last said yes (unix ns).
	warned atomic.Int64
}

// New bounds connections to total in all and perSource from one address.
func New(total, perSource int) *Bounds {
	return &Bounds{Total: total, PerSource: perSource, by: map[netip.Addr]int{}}
}

// Take counts a connection from src in if both bounds allow it; it returns
// how many src had open before.
func (b *Bounds) Take(src netip.Addr) (int, bool) {
	b.mu.Lock()
	defer b.mu.Unlock()
	n := b.by[src]
	if n >= b.PerSource || b.open >= b.Total {
		return n, false
	}
	b.by[src] = n + 1
	b.open++
	return n, true
}

// Give counts a connection from src out; call it once for each Take that
// said yes.
func (b *Bounds) Give(src netip.Addr) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.open--
	if b.by[src]--; b.by[src] <= 0 {
		delete(b.by, src)
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
func (b *Bounds) WarnNow() bool {
	now := time.Now().UnixNano()
	last := b.warned.Load()
	return now-last > int64(time.Minute) && b.warned.CompareAndSwap(last, now)
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
}

// Accept returns the next connection the bounds let in.
func (l *Listener) Accept() (net.Conn, error) {
	for {
		c, err := l.Listener.Accept()
		if err != nil {
			return nil, err
		}
		src := Source(c)
		if open, ok := l.Bounds.Take(src); !ok {
			c.Close()
			if l.TurnedAway != nil && l.Bounds.WarnNow() {
				l.TurnedAway(src, open)
			}
			continue
		}
		return &limitedConn{Conn: c, release: sync.OnceFunc(func() { l.Bounds.Give(src) })}, nil
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
