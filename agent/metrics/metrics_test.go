package metrics

import (
	"bufio"
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/miekg/dns"

	"mesh/agent/overlay"
	"mesh/reconciler"
	"mesh/state"
)

func scrape(t *testing.T, m *Metrics) string {
	t.Helper()
	rec := httptest.NewRecorder()
	m.Handler().ServeHTTP(rec, httptest.NewRequest("GET", "/metrics", nil))
	b, _ := io.ReadAll(rec.Body)
	return string(b)
}

func TestMetricsMove(t *testing.T) {
	m := New(func() map[string]string {
		return map[string]string{"state": "Leader", "term": "4", "commit_index": "20", "applied_index": "18", "last_log_index": "21"}
	})
	m.ObserveQuery(dns.RcodeSuccess, false, time.Millisecond)
	m.ObserveQuery(dns.RcodeNameError, false, time.Millisecond)
	m.ObserveQuery(dns.RcodeServerFailure, true, time.Second)
	m.ObserveApply(&state.Report{Mutations: 5, Resources: []state.ResourceReport{
		{Kind: "container", Name: "a", Outcome: state.Replaced, Reason: "step certificate ran"},
		{Kind: "container", Name: "b", Outcome: state.Replaced, Reason: "restart-on: /srv/b/x changed"},
		{Kind: "container", Name: "c", Outcome: state.Replaced, Reason: "image changed"},
		{Kind: "step", Name: "m.s", Outcome: state.Ran},
		{Kind: "directory", Name: "/srv/old", Outcome: state.Kept},
	}}, 2*time.Second)
	m.ObserveApply(&state.Report{Error: "x failed"}, time.Second)
	out := scrape(t, m)
	for _, want := range []string{
		`mesh_dns_queries_total{forwarded="false",rcode="NOERROR"} 1`,
		`mesh_dns_queries_total{forwarded="false",rcode="NXDOMAIN"} 1`,
		`mesh_dns_queries_total{forwarded="true",rcode="SERVFAIL"} 1`,
		`mesh_apply_mutations_total 5`,
		`mesh_container_replacements_total{reason="step"} 1`,
		`mesh_container_replacements_total{reason="restart-on"} 1`,
		`mesh_container_replacements_total{reason="declaration"} 1`,
		`mesh_steps_run_total 1`,
		`mesh_kept_paths 0`, // the last apply kept nothing
		`mesh_applies_total{result="ok"} 1`,
		`mesh_applies_total{result="failed"} 1`,
		`mesh_apply_duration_seconds_count 2`,
		`mesh_raft_state{state="leader"} 1`,
		`mesh_raft_term 4`,
		`mesh_raft_apply_lag 2`,
	} {
		if !strings.Contains(out, want+"\n") {
			t.Errorf("missing %q", want)
		}
	}
}

type failing struct{ reconciler.Runtime }

func (failing) Pull(context.Context, string, string) error { return errors.New("no registry") }

func TestRuntimeCountsErrors(t *testing.T) {
	m := New(nil)
	rt := m.Runtime(failing{})
	rt.Pull(context.Background(), "x", "missing")
	rt.Pull(context.Background(), "x", "always")
	if out := scrape(t, m); !strings.Contains(out, `mesh_podman_call_errors_total{call="pull"} 2`+"\n") {
		t.Fatalf("%s", out)
	}
}

func TestOverlayMetrics(t *testing.T) {
	m := New(nil)
	up := false
	m.Overlay(func() map[string]overlay.PeerStats {
		if !up {
			return nil
		}
		return map[string]overlay.PeerStats{"n2": {LastHandshake: time.Unix(1764590000, 0), RxBytes: 1200, TxBytes: 3400}, "n3": {}}
	})
	if s := scrape(t, m); !strings.Contains(s, "mesh_overlay_peers 0") {
		t.Fatalf("no overlay yet:\n%s", s)
	}
	up = true
	s := scrape(t, m)
	for _, want := range []string{`mesh_overlay_peers 2`, `mesh_overlay_peer_last_handshake_seconds{peer="n2"} 1.76459e+09`, `mesh_overlay_peer_received_bytes_total{peer="n2"} 1200`,
		`mesh_overlay_peer_sent_bytes_total{peer="n2"} 3400`, `mesh_overlay_peer_last_handshake_seconds{peer="n3"} 0`} {
		if !strings.Contains(s, want) {
			t.Errorf("scrape lacks %s", want)
		}
	}
}

// The metrics port bounds who reaches it: a connection left idle after a
// scrape is closed, and past the bound on one source's connections, a new
// one is closed before anything is read (it was held for ever, each a
// descriptor and a goroutine of the agent).
func TestServeBoundsConnections(t *testing.T) {
	defer func(d time.Duration) { serveIdle = d }(serveIdle)
	serveIdle = 200 * time.Millisecond
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	addr, err := New(func() map[string]string { return nil }).Serve(ctx, "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	closed := func(c net.Conn) bool {
		c.SetReadDeadline(time.Now().Add(3 * time.Second))
		_, err := io.Copy(io.Discard, c)
		return err == nil // EOF: the server closed it
	}
	c, err := net.Dial("tcp", addr.String())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	io.WriteString(c, "GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n")
	if !closed(c) {
		t.Errorf("an idle connection after a scrape is still open after 3 s")
	}
	// The bound, on a server whose idle connections stay (the default
	// idle time): each held connection is served once, so the server has
	// taken it before the one past the bound is made.
	serveIdle = time.Minute
	addr, err = New(func() map[string]string { return nil }).Serve(ctx, "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var held []net.Conn
	defer func() {
		for _, h := range held {
			h.Close()
		}
	}()
	for i := range serveMaxConnsPerSource {
		h, err := net.Dial("tcp", addr.String())
		if err != nil {
			t.Fatal(err)
		}
		held = append(held, h)
		h.SetReadDeadline(time.Now().Add(10 * time.Second))
		io.WriteString(h, "GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n")
		if resp, err := http.ReadResponse(bufio.NewReader(h), nil); err != nil || resp.StatusCode != http.StatusOK {
			t.Fatalf("connection %d within the bound: %v %v", i+1, resp, err)
		}
	}
	extra, err := net.Dial("tcp", addr.String())
	if err != nil {
		t.Fatal(err)
	}
	defer extra.Close()
	extra.SetReadDeadline(time.Now().Add(10 * time.Second))
	if _, err := extra.Read(make([]byte, 1)); err != io.EOF {
		t.Errorf("a connection past %d from one source: read %v, want it closed at once", serveMaxConnsPerSource, err)
	}
}
