package cluster

import (
	"container/list"
	"net"
	"net/netip"
	"sync"
	"time"

	"mesh/internal/connlimit"
)

// Connections to the node port that have not finished their TLS handshake
// are bounded too: each holds a goroutine and a descriptor for up to the
// handshake's 10 s, and anybody who reaches the port (the Internet, for a
// node with a public address) could otherwise open them faster than they
// end. Who is at the other end is known only after the handshake, but
// where from is known before it: an address of a node of the mesh (its
// address or its overlay address) has a bound of its own, which no other
// source's connections count against, so a flood from the Internet cannot
// push out a node's handshake at all. A container's connections leave its
// machine with its node's address, so within a source a new connection
// over the bound is not turned away: the oldest still in its handshake
// goes instead. To push out a node's own handshake, a container on it must
// bring handshakesPerNode new connections within that handshake's round
// trip (about 5,000 a second at 50 ms).
const (
	handshakesPerSource = 32
	handshakesInAll     = 512 // from sources that are not nodes
	handshakesPerNode   = 256
)

// handshakes are the node port's connections in their handshake, oldest
// first, by source (an IPv6 source by its /64) and, for sources that are
// not nodes, in all.
type handshakes struct {
	perSource, total, perNode int
	// node says whether an address is a node's.
	node     func(netip.Addr) bool
	mu       sync.Mutex
	all      list.List // of *handshake, from sources that are not nodes
	bySource map[netip.Addr]*list.List
	evicted  connlimit.Throttle
}

type handshake struct {
	c       net.Conn
	src     netip.Addr
	inAll   *list.Element // nil for a node's
	inSrc   *list.Element
	counted bool
}

func newHandshakes(total, perSource, perNode int, node func(netip.Addr) bool) *handshakes {
	if node == nil {
		node = func(netip.Addr) bool { return false }
	}
	return &handshakes{perSource: perSource, total: total, perNode: perNode, node: node, bySource: map[netip.Addr]*list.List{}}
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

// begin counts c in and returns its entry. A connection it pushes out to
// make room has its deadline set to now: its handshake fails, and its
// route closes it; one whose handshake has just ended (its route not yet
// at end) keeps going, since the route clears the deadline then. It
// returns the addresses of those it pushed out.
func (h *handshakes) begin(c net.Conn) (*handshake, []net.Addr) {
	e := &handshake{c: c, src: handshakeSource(c), counted: true}
	node := h.node(connlimit.Source(c))
	h.mu.Lock()
	defer h.mu.Unlock()
	var out []net.Addr
	mine := h.bySource[e.src]
	if mine == nil {
		mine = &list.List{}
		h.bySource[e.src] = mine
	}
	bound := h.perSource
	if node {
		bound = h.perNode
	}
	if mine.Len() >= bound {
		out = append(out, h.pushOutLocked(mine.Front().Value.(*handshake)))
	}
	if !node && h.all.Len() >= h.total {
		out = append(out, h.pushOutLocked(h.all.Front().Value.(*handshake)))
	}
	if !node {
		e.inAll = h.all.PushBack(e)
	}
	e.inSrc = mine.PushBack(e)
	return e, out
}

func (h *handshakes) pushOutLocked(e *handshake) net.Addr {
	h.dropLocked(e)
	e.c.SetDeadline(time.Now())
	return e.c.RemoteAddr()
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

func (h *handshakes) dropLocked(e *handshake) {
	e.counted = false
	if e.inAll != nil {
		h.all.Remove(e.inAll)
	}
	mine := h.bySource[e.src]
	mine.Remove(e.inSrc)
	if mine.Len() == 0 {
		delete(h.bySource, e.src)
	}
}

// endAll ends every handshake under way (their deadline set to now), as
// the port closes.
func (h *handshakes) endAll() {
	h.mu.Lock()
	defer h.mu.Unlock()
	for _, l := range h.bySource {
		for el := l.Front(); el != nil; el = el.Next() {
			el.Value.(*handshake).c.SetDeadline(time.Now())
		}
	}
}

// open is how many connections are in their handshake.
func (h *handshakes) open() int {
	h.mu.Lock()
	defer h.mu.Unlock()
	n := 0
	for _, l := range h.bySource {
		n += l.Len()
	}
	return n
}

// nodeAddresses says whether an address is a node's (its address or its
// overlay address) in the replica, read again only after the replica
// changed (changed is closed then): the accept loop asks at every
// connection, a flood's included.
type nodeAddresses struct {
	load    func() (map[netip.Addr]bool, error)
	changed func() <-chan struct{}
	mu      sync.Mutex
	next    <-chan struct{} // closed at the next change since set was read
	set     map[netip.Addr]bool
}

func (n *nodeAddresses) has(a netip.Addr) bool {
	n.mu.Lock()
	defer n.mu.Unlock()
	stale := n.next == nil
	if !stale {
		select {
		case <-n.next:
			stale = true
		default:
		}
	}
	if stale {
		// Taken before the read: a change during it is seen next time.
		next := n.changed()
		if set, err := n.load(); err == nil {
			n.set, n.next = set, next
		}
	}
	return n.set[a.Unmap()]
}
