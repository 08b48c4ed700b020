package cluster

import (
	"net/http"
	"net/http/httptest"
	"testing"
	"time"
)

// The peer API's requests are waited for before the replica closes: close
// returns once the last in flight leaves, refuses what comes after, and
// gives up after its bound on one that does not end.
func TestInflightWaitsForRequests(t *testing.T) {
	f := newInflight()
	entered, release := make(chan struct{}), make(chan struct{})
	h := f.serve(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		close(entered)
		<-release
	}))
	go h.ServeHTTP(httptest.NewRecorder(), httptest.NewRequest("GET", "/", nil))
	<-entered
	if f.close(50 * time.Millisecond) {
		t.Fatal("close said all ended while a request was in flight")
	}
	w := httptest.NewRecorder()
	h.ServeHTTP(w, httptest.NewRequest("GET", "/", nil))
	if w.Code != http.StatusServiceUnavailable {
		t.Fatalf("a request after close: %d, want 503", w.Code)
	}
	if f.enter() {
		t.Fatal("a goroutine entered after close")
	}
	close(release)
	if !f.close(10 * time.Second) {
		t.Fatal("close did not see the last request leave")
	}
	if g := newInflight(); !g.close(time.Millisecond) {
		t.Fatal("close with nothing in flight")
	}
}
