package dnsd

import (
	"log/slog"
	"net"
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

// tcpLimit is the resolver's TCP listener: it closes a new connection at
// once, before anything is read from it, when its source has PerSource
// connections open already or Total are open in all. A connection turned
// away costs the client a retry, not a hang: it is closed, not left in the
// kernel's backlog. (A source that may not query is let in, within the
// bounds, to be answered REFUSED as over UDP.)
type tcpLimit struct {
	net.Listener
	bounds *connlimit.Bounds
	log    *slog.Logger
}

func (l *tcpLimit) Accept() (net.Conn, error) {
	for {
		c, err := l.Listener.Accept()
		if err != nil {
			return nil, err
		}
		src := connlimit.Source(c)
		if open, ok := l.bounds.Take(src); !ok {
			c.Close()
			if l.bounds.WarnNow() {
				l.log.Warn("resolver: TCP connection turned away (logged once a minute at most)",
					"from", src, "open_from_it", open, "max_per_source", l.bounds.PerSource, "max", l.bounds.Total)
			}
			continue
		}
		return &limitedConn{Conn: c, release: sync.OnceFunc(func() { l.bounds.Give(src) })}, nil
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
