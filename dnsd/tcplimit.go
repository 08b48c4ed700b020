package dnsd

import (
	"log/slog"
	"net"
	"net/netip"
	"sync"

	"mesh/internal/connlimit"
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

// tcpLimiter is the resolver's TCP listener: it closes a new connection at
// once, before anything is read from it, when its source has PerSource
// connections open already or Total are open in all. A source that may
// not query (as the allowed sources are when it connects) is let in, to be
// answered REFUSED as over UDP, but within bounds of its own: every such
// source together holds at most PerSource connections, each at most an
// eighth of them. Counted with the containers, a few hosts of the LAN (or
// peers of the overlay) that kept connections open held every place, and
// the containers' lookups over TCP were turned away.
type tcpLimiter struct {
	net.Listener
	allowed         func(netip.Addr) bool
	inside, outside *connlimit.Bounds
	log             *slog.Logger
}

func tcpLimit(l net.Listener, total, perSource int, allowed func(netip.Addr) bool, log *slog.Logger) net.Listener {
	return &tcpLimiter{Listener: l, allowed: allowed, log: log,
		inside: connlimit.New(total, perSource), outside: connlimit.New(perSource, max(1, perSource/8))}
}

// Accept returns the next connection the bounds let in.
func (l *tcpLimiter) Accept() (net.Conn, error) {
	for {
		c, err := l.Listener.Accept()
		if err != nil {
			return nil, err
		}
		src := connlimit.Source(c)
		b, who := l.inside, "allowed"
		if !l.allowed(src) {
			b, who = l.outside, "not allowed"
		}
		if open, ok := b.Take(src); !ok {
			c.Close()
			if b.WarnNow() {
				l.log.Warn("resolver: TCP connection turned away (logged once a minute at most)",
					"from", src, "source", who, "open_from_it", open, "max_per_source", b.PerSource, "max", b.Total)
			}
			continue
		}
		return &boundConn{Conn: c, release: sync.OnceFunc(func() { b.Give(src) })}, nil
	}
}

// boundConn gives its place back when closed (once, however often Close is
// called).
type boundConn struct {
	net.Conn
	release func()
}

func (c *boundConn) Close() error {
	err := c.Conn.Close()
	c.release()
	return err
}
