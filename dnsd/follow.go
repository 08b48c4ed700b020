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

// Follow builds the next index with build each time changed fires, until
// ctx ends; build is given the index it built last (nil at first), which
// it may return changed by a few names (Index.With). Queries never wait
// for it: the swap is one atomic store.
func (s *Server) Follow(ctx context.Context, build func(ctx context.Context, last *Index) (*Index, error), changed func() <-chan struct{}) {
	var last *Index
	for {
		ch := changed()
		if ix, err := build(ctx, last); err != nil {
			s.log.Warn("read roster", "err", err)
		} else {
			last = ix
			s.SetIndex(ix)
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
