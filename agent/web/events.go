package web

import (
	"fmt"
	"net/http"
	"time"
)

// Bounds of the page's event streams (variables: tests shorten them).
var (
	// keepAlive is how often an idle stream says it lives (a proxy or a
	// NAT that drops idle connections keeps it).
	keepAlive = 20 * time.Second
	// writeWait bounds one write of a stream: a browser that stops reading
	// loses its stream rather than holding a goroutine for ever. The
	// deadline is lifted once the write is out: over HTTP/2 a deadline
	// that passes resets the stream even with no write under way.
	writeWait = 10 * time.Second
)

const (
	// eventGap is the least time between two events of one stream: a burst
	// of commits makes one refresh, not one per entry.
	eventGap = 250 * time.Millisecond
	// maxStreams bounds the open streams of all sessions together, and
	// maxSessionStreams those of one session (a browser holds one per open
	// tab): each holds a connection and a goroutine.
	maxStreams        = 64
	maxSessionStreams = 8
)

// events streams server-sent events: "changed" with the replica's applied
// index, once at the start (the page compares it with the index it was
// rendered at) and then each time the replica changes (at most one per
// eventGap). It ends with the session: a stream whose session was logged
// out or went idle stops at its next event or keep-alive, and its checks
// do not keep the session alive.
func (s *Server) events(w http.ResponseWriter, r *http.Request, _ *session) {
	c, err := r.Cookie(s.cookie)
	if err != nil {
		s.unauthorized(w, r)
		return
	}
	sd := digest(c.Value)
	if msg := s.openStream(sd); msg != "" {
		http.Error(w, msg, http.StatusServiceUnavailable)
		return
	}
	defer s.closeStream(sd)
	rc := http.NewResponseController(w)
	// The server's read and write timeouts bound a page's request; a
	// stream lives on, each write bounded by writeWait instead.
	rc.SetReadDeadline(time.Time{})
	h := w.Header()
	h.Set("Content-Type", "text/event-stream")
	h.Set("X-Accel-Buffering", "no")
	send := func(text string) bool {
		rc.SetWriteDeadline(time.Now().Add(writeWait))
		if _, err := fmt.Fprint(w, text); err != nil {
			return false
		}
		if rc.Flush() != nil {
			return false
		}
		rc.SetWriteDeadline(time.Time{})
		return true
	}
	from := remoteAddr(r)
	live := func() bool {
		sess, _ := s.access.session(c.Value, from, false)
		return sess != nil
	}
	// Take the next change's channel before reading the index: a change
	// after the read closes it, so none is lost between the two.
	changed := s.cfg.Changed()
	first := "retry: 2000\n\n"
	if idx, err := s.cfg.Applied(); err == nil {
		first += fmt.Sprintf("event: changed\ndata: %d\n\n", idx)
	}
	w.WriteHeader(http.StatusOK)
	if !send(first) {
		return
	}
	tick := time.NewTicker(keepAlive)
	defer tick.Stop()
	for {
		select {
		case <-r.Context().Done():
			return
		case <-tick.C:
			if !live() || !send(": alive\n\n") {
				return
			}
			continue
		case <-changed:
		}
		// Let a burst settle, then say where the replica is.
		select {
		case <-r.Context().Done():
			return
		case <-time.After(eventGap):
		}
		if !live() {
			return
		}
		changed = s.cfg.Changed()
		idx, err := s.cfg.Applied()
		if err != nil {
			continue
		}
		if !send(fmt.Sprintf("event: changed\ndata: %d\n\n", idx)) {
			return
		}
	}
}

// openStream counts a new stream of the session whose id has digest sd,
// or says why it may not open.
func (s *Server) openStream(sd [32]byte) string {
	s.streamsMu.Lock()
	defer s.streamsMu.Unlock()
	switch {
	case s.allStreams >= maxStreams:
		return "too many open event streams on this agent: close some of the page's tabs"
	case s.streams[sd] >= maxSessionStreams:
		return fmt.Sprintf("this session has %d event streams open already: close some of the page's tabs", maxSessionStreams)
	}
	s.allStreams++
	s.streams[sd]++
	return ""
}

func (s *Server) closeStream(sd [32]byte) {
	s.streamsMu.Lock()
	defer s.streamsMu.Unlock()
	s.allStreams--
	if s.streams[sd]--; s.streams[sd] <= 0 {
		delete(s.streams, sd)
	}
}
