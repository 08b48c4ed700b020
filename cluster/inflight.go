package cluster

import (
	"net/http"
	"sync"
	"time"
)

// inflight counts the peer API's requests being served (and the goroutines
// they start that read the replica), so that Shutdown returns only once
// none reads the replica any more: http.Server.Close does not wait for its
// handlers. Once closed, a request that comes is refused.
type inflight struct {
	mu     sync.Mutex
	n      int
	closed bool
	done   chan struct{} // closed once closed and none is left
}

func newInflight() *inflight { return &inflight{done: make(chan struct{})} }

// enter counts one in; false once closed.
func (f *inflight) enter() bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.closed {
		return false
	}
	f.n++
	return true
}

func (f *inflight) leave() {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.n--
	if f.closed && f.n == 0 {
		close(f.done)
	}
}

// close refuses what comes from now on and waits up to wait for what is
// in; it says whether all ended.
func (f *inflight) close(wait time.Duration) bool {
	f.mu.Lock()
	if f.closed {
		f.mu.Unlock()
		return f.wait(wait)
	}
	f.closed = true
	if f.n == 0 {
		close(f.done)
	}
	f.mu.Unlock()
	return f.wait(wait)
}

func (f *inflight) wait(d time.Duration) bool {
	select {
	case <-f.done:
		return true
	case <-time.After(d):
		return false
	}
}

// serve wraps h: each request counted in, refused once closed.
func (f *inflight) serve(h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if !f.enter() {
			http.Error(w, "this node is stopping", http.StatusServiceUnavailable)
			return
		}
		defer f.leave()
		h.ServeHTTP(w, r)
	})
}

// peerStopWait bounds how long Shutdown waits for the peer API's requests
// once their contexts ended.
const peerStopWait = 5 * time.Second
