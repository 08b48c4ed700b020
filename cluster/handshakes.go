package cluster

import (
	"container/list"
	"net"
	"net/netip"
	"sync"

	"mesh/internal/connlimit"
)

// Connections to the node port that have not finished their TLS handshake
// are bounded too, from one source and in all: each holds a goroutine and
// a descriptor for up to the handshake's 10 s, and anybody who reaches the
// port (the Internet, for a node with a public address) could otherwise
// open them faster than they end. Who is at the other end is not known
// before the handshake, and a container's connections leave its node with
// the node's own address, so a new connection over a bound is not turned
// away: the oldest one still in its handshake goes instead. A node's
// handshake takes milliseconds; to push it out, a flood must bring a
// source's (or the port's) whole bound of new connections within them.
const (
	handshakesPerSource = 32
	handshakesInAll     = 512
)

// handshakes are the node port's connections in their handshake, oldest
// first, in all and by source (an IPv6 source by its /64).
type handshakes struct {
	perSource, total int
	mu               sync.Mutex
	all              list.List // of *handshake
	bySource         map[netip.Addr]*list.List
	evicted          connlimit.Throttle
}

type handshake struct {
	c       net.Conn
	src     netip.Addr
	inAll   *list.Element
	inSrc   *list.Element
	counted bool
}

func newHandshakes(total, perSource int) *handshakes {
	return &handshakes{perSource: perSource, total: total, bySource: map[netip.Addr]*list.List{}}
}

func handshakeSource(c net.Conn) netip.Addr {
	src := connlimit.Source(c)
	if src.Is6() {
		if p, err := src.Prefix(64); err == nil {
			return p.Addr()
		}
	}
	return src
}

// begin counts c in and returns its entry, and the connections it pushed
// out to make room (none when there was room), which the caller closes.
func (h *handshakes) begin(c net.Conn) (*handshake, []net.Conn) {
	e := &handshake{c: c, src: handshakeSource(c), counted: true}
	h.mu.Lock()
	defer h.mu.Unlock()
	var out []net.Conn
	mine := h.bySource[e.src]
	if mine == nil {
		mine = &list.List{}
		h.bySource[e.src] = mine
	}
	if mine.Len() >= h.perSource {
		out = append(out, h.dropLocked(mine.Front().Value.(*handshake)))
	}
	if h.all.Len() >= h.total {
		out = append(out, h.dropLocked(h.all.Front().Value.(*handshake)))
	}
	e.inAll = h.all.PushBack(e)
	e.inSrc = mine.PushBack(e)
	return e, out
}

// end counts e out once its handshake is over (done or failed); a no-op
// for one pushed out.
func (h *handshakes) end(e *handshake) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if e.counted {
		h.dropLocked(e)
	}
}

func (h *handshakes) dropLocked(e *handshake) net.Conn {
	e.counted = false
	h.all.Remove(e.inAll)
	mine := h.bySource[e.src]
	mine.Remove(e.inSrc)
	if mine.Len() == 0 {
		delete(h.bySource, e.src)
	}
	return e.c
}

// open is how many connections are in their handshake.
func (h *handshakes) open() int {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.all.Len()
}
