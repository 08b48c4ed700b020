package dnsd

import (
	"log/slog"
	"net"
	"net/netip"

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

// tcpLimit is the resolver's TCP listener (connlimit.Listener): it closes
// a new connection at once, before anything is read from it, when its
// source has PerSource connections open already or Total are open in all.
// (A source that may not query is let in, within the bounds, to be
// answered REFUSED as over UDP.)
func tcpLimit(l net.Listener, bounds *connlimit.Bounds, log *slog.Logger) net.Listener {
	return &connlimit.Listener{Listener: l, Bounds: bounds, TurnedAway: func(src netip.Addr, open int) {
		log.Warn("resolver: TCP connection turned away (logged once a minute at most)",
			"from", src, "open_from_it", open, "max_per_source", bounds.PerSource, "max", bounds.Total)
	}}
}
