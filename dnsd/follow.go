package dnsd

import (
	"context"
	"net/netip"
)

// Roster is one version of the names to serve.
type Roster struct {
	Domain string
	Names  map[string][]netip.Addr
	Serial uint32
}

// Follow rebuilds the index from read each time changed fires, until ctx
// ends. Queries never wait for it: the swap is one atomic store.
func (s *Server) Follow(ctx context.Context, read func(context.Context) (Roster, error), changed func() <-chan struct{}) {
	for {
		ch := changed()
		if r, err := read(ctx); err != nil {
			s.log.Warn("read roster", "err", err)
		} else {
			s.SetIndex(NewIndex(r.Domain, r.Names, r.Serial))
		}
		select {
		case <-ctx.Done():
			return
		case <-ch:
		}
	}
}

// SetAllow replaces the sources allowed to query, besides loopback and the
// resolver's own address.
func (s *Server) SetAllow(p []netip.Prefix) { s.allow.Store(&p) }
