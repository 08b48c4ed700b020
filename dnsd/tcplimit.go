package dnsd

import (
	"net"
	"net/netip"
	"sync"
	"sync/atomic"
	"time"
)

// DefaultMaxTCP and DefaultMaxTCPPerSource bound the resolver's open TCP
// connections, in all and from one address. Every container can reach the
// resolver, and each connection it keeps open holds one of the agent's file
// descriptors and a goroutine: without a bound, a container that opens
// connections faster than they time out takes the descriptors the agent
// needs for its state, its log and its API. (Unbound keeps 10 per thread.)
const (
	DefaultMaxTCP          = 256
	DefaultMaxTCPPerSource = 32
)

// tcpLimit is the resolver's TCP listener: it closes a new connection at
// once, before anything is read from it, when its source has perSource
// connections open already or total are open in all. A connection turned
// away costs the client a retry, not a hang: it is closed, not left in the
// kernel's backlog. (A source that may not query is let in, within the
// bounds, to be answered REFUSED as over UDP.)
type tcpLimit struct {
	net.Listener
	total, perSource int
	warn             func(src netip.Addr, open, perSource, total int)

	mu   sync.Mutex
	open int
	by   map[netip.Addr]int
	// warned is when a turned-away connection was last logged (unix ns).
	warned atomic.Int64
}

func newTCPLimit(l net.Listener, total, perSource int, warn func(netip.Addr, int, int, int)) *tcpLimit {
	return &tcpLimit{Listener: l, total: total, perSource: perSource, warn: warn, by: map[netip.Addr]int{}}
}

func (l *tcpLimit) Accept() (net.Conn, error) {
	for {
		c, err := l.Listener.Accept()
		if err != nil {
			return nil, err
		}
		src := netip.Addr{}
		if a, ok := c.RemoteAddr().(*net.TCPAddr); ok {
			src = a.AddrPort().Addr().Unmap()
		}
		if open, ok := l.take(src); !ok {
			c.Close()
			now := time.Now().UnixNano()
			if last := l.warned.Load(); now-last > int64(time.Minute) && l.warned.CompareAndSwap(last, now) && l.warn != nil {
				l.warn(src, open, l.perSource, l.total)
			}
			continue
		}
		return &limitedConn{Conn: c, release: sync.OnceFunc(func() { l.give(src) })}, nil
	}
}

// take counts a connection from src in, if the bounds allow it; it returns
// how many src had open.
func (l *tcpLimit) take(src netip.Addr) (int, bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	n := l.by[src]
	if n >= l.perSource || l.open >= l.total {
		return n, false
	}
	l.by[src] = n + 1
	l.open++
	return n, true
}

func (l *tcpLimit) give(src netip.Addr) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.open--
	if l.by[src]--; l.by[src] <= 0 {
		delete(l.by, src)
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
