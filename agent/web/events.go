package web

import (
	"fmt"
	"net/http"
	"sync/atomic"
	"time"
)

// Bounds of the page's event streams.
const (
	// eventGap is the least time between two events of one stream: a burst
	// of commits makes one refresh, not one per entry.
	eventGap = 250 * time.Millisecond
	// keepAlive is how often an idle stream says it lives (a proxy or a
	// NAT that drops idle connections keeps it).
	keepAlive = 20 * time.Second
	// maxStreams bounds the open streams of all sessions together: each
	// holds a connection and a goroutine.
	maxStreams = 64
)

var openStreams atomic.Int64

// events streams server-sent events: "changed" with the replica's applied
// index each time the replica changes (at most one per eventGap). It
// ends with the session: a stream whose session was logged out stops at
// its next event or keep-alive.
func (s *Server) events(w http.ResponseWriter, r *http.Request, _ *session) {
	fl, ok := w.(http.Flusher)
	if !ok {
		http.Error(w, "streaming is not supported here", http.StatusInternalServerError)
		return
	}
	if openStreams.Add(1) > maxStreams {
		openStreams.Add(-1)
		http.Error(w, "too many open event streams", http.StatusServiceUnavailable)
		return
	}
	defer openStreams.Add(-1)
	c, _ := r.Cookie(CookieName)
	h := w.Header()
	h.Set("Content-Type", "text/event-stream")
	h.Set("X-Accel-Buffering", "no")
	w.WriteHeader(http.StatusOK)
	fmt.Fprint(w, "retry: 2000\n\n")
	fl.Flush()
	tick := time.NewTicker(keepAlive)
	defer tick.Stop()
	for {
		changed := s.cfg.Changed()
		select {
		case <-r.Context().Done():
			return
		case <-tick.C:
			if s.access.session(c.Value) == nil {
				return
			}
			fmt.Fprint(w, ": alive\n\n")
			fl.Flush()
			continue
		case <-changed:
		}
		// Let a burst settle, then say where the replica is.
		select {
		case <-r.Context().Done():
			return
		case <-time.After(eventGap):
		}
		if s.access.session(c.Value) == nil {
			return
		}
		idx, err := s.cfg.Applied()
		if err != nil {
			continue
		}
		fmt.Fprintf(w, "event: changed\ndata: %d\n\n", idx)
		fl.Flush()
	}
}
