package operate

import (
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/coder/websocket"

	"mesh/cluster/api"
	"mesh/podman"
	"mesh/reconciler"
)

// An exec runs in one container: a module of several containers on one
// node asks for MODULE.CONTAINER (naming them), and only the same
// container on several nodes asks for --node.
func TestOneSource(t *testing.T) {
	for _, tc := range []struct {
		name   string
		target string
		srcs   []api.Source
		want   string // the container chosen, or words the error must hold
		err    bool
	}{
		{"one", "app.server", []api.Source{{Node: "ace", Container: "app.server"}}, "app.server", false},
		{"module of two containers on one node", "app", []api.Source{{Node: "ace", Container: "app.server"}, {Node: "ace", Container: "app.worker"}},
			"app has several containers (app.server, app.worker): name one, as MODULE.CONTAINER", true},
		{"module of two containers on two nodes", "app", []api.Source{{Node: "ace", Container: "app.worker"}, {Node: "g14", Container: "app.server"}},
			"app has several containers (app.server, app.worker)", true},
		{"one container on two nodes", "app.server", []api.Source{{Node: "ace", Container: "app.server"}, {Node: "g14", Container: "app.server"}},
			"app.server runs on 2 nodes (ace, g14): say which with --node", true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			src, err := oneSource(tc.target, tc.srcs)
			switch {
			case tc.err && err == nil:
				t.Fatalf("chose %v, want an error saying %q", src, tc.want)
			case tc.err && !strings.Contains(err.Error(), tc.want):
				t.Fatalf("said %q, want it to say %q", err, tc.want)
			case tc.err && strings.Contains(tc.want, "several") && strings.Contains(err.Error(), "--node"):
				t.Fatalf("said %q: --node cannot choose among containers", err)
			case !tc.err && err != nil:
				t.Fatal(err)
			case !tc.err && src.Container != tc.want:
				t.Fatalf("chose %s, want %s", src.Container, tc.want)
			}
		})
	}
}

// fakeSession is a command that writes a line and then neither reads its
// input nor ends: a write to its input blocks, as Podman's does once the
// buffers are full, until the session is closed.
type fakeSession struct {
	closed chan struct{}
	once   sync.Once
}

var _ Session = (*fakeSession)(nil)

func newFakeSession() *fakeSession { return &fakeSession{closed: make(chan struct{})} }

func (f *fakeSession) Stdin() io.WriteCloser { return fakeStdin{f} }

func (f *fakeSession) Output(stdout, stderr io.Writer) error {
	stdout.Write([]byte("ready\n"))
	<-f.closed
	return nil
}

func (f *fakeSession) Resize(ctx context.Context, width, height uint16) error { return nil }

func (f *fakeSession) ExitCode(ctx context.Context) (int, error) {
	return -1, errors.New("the session was closed")
}

func (f *fakeSession) Close() { f.once.Do(func() { close(f.closed) }) }

type fakeStdin struct{ f *fakeSession }

func (w fakeStdin) Write(p []byte) (int, error) {
	<-w.f.closed
	return 0, net.ErrClosed
}

func (w fakeStdin) Close() error { return nil }

// execBed serves h and says when a request to it has been served.
func execBed(t *testing.T, h http.Handler) (url string, served <-chan struct{}) {
	ch := make(chan struct{})
	ts := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		h.ServeHTTP(w, r)
		close(ch)
	}))
	t.Cleanup(ts.Close)
	return "ws" + strings.TrimPrefix(ts.URL, "http"), ch
}

// dialExec starts `cat` with input and waits for its first output.
func dialExec(t *testing.T, url string) *websocket.Conn {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	ws, _, err := websocket.Dial(ctx, url+"/v1/op/exec?name=app.server&cmd=cat&stdin=1", nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ws.CloseNow() })
	_, b, err := ws.Read(ctx)
	if err != nil || len(b) == 0 || b[0] != api.KindStdout {
		t.Fatalf("the command's first output: %q, %v", b, err)
	}
	return ws
}

// flood sends the caller's input until a write has not gone through for
// a while (nothing takes it any more) and returns then.
func flood(t *testing.T, ws *websocket.Conn, ctx context.Context) {
	var last atomic.Int64
	last.Store(time.Now().UnixNano())
	go func() {
		msg := append([]byte{api.KindStdin}, make([]byte, api.Chunk)...)
		for ws.Write(ctx, websocket.MessageBinary, msg) == nil {
			last.Store(time.Now().UnixNano())
		}
	}()
	deadline := time.Now().Add(20 * time.Second)
	for time.Since(time.Unix(0, last.Load())) < 500*time.Millisecond {
		if time.Now().After(deadline) {
			t.Fatal("the input never stopped being taken")
		}
		time.Sleep(50 * time.Millisecond)
	}
}

func within(t *testing.T, ch <-chan struct{}, d time.Duration, what string) {
	t.Helper()
	select {
	case <-ch:
	case <-time.After(d):
		t.Fatalf("%s not within %s", what, d)
	}
}

// A command that stops reading its input does not outlive its caller:
// when the caller goes, the session is closed (the command loses its
// streams) and the stream ends, whether the caller sent a little input or
// more than the agent queues.
func TestExecCallerGoesWhileInputBlocks(t *testing.T) {
	for _, tc := range []struct {
		name  string
		flood bool
	}{{"a line of input", false}, {"more input than is queued", true}} {
		t.Run(tc.name, func(t *testing.T) {
			sess := newFakeSession()
			s := testServer(t, &fakeRuntime{exec: func(string, podman.ExecConfig) (Session, error) { return sess, nil }})
			url, served := execBed(t, s.PeerHandler())
			ws := dialExec(t, url)
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			if tc.flood {
				flood(t, ws, ctx)
			} else if err := ws.Write(ctx, websocket.MessageBinary, []byte{api.KindStdin, 'x', '\n'}); err != nil {
				t.Fatal(err)
			}
			time.Sleep(100 * time.Millisecond) // the input reaches the blocked write
			ws.CloseNow()
			within(t, sess.closed, 10*time.Second, "the session closed after the caller went")
			within(t, served, 5*time.Second, "the stream ended after the caller went")
		})
	}
}

// The agent stopping ends an exec whose command takes no input.
func TestExecAgentStopsWhileInputBlocks(t *testing.T) {
	sess := newFakeSession()
	s := testServer(t, &fakeRuntime{exec: func(string, podman.ExecConfig) (Session, error) { return sess, nil }})
	stop, stopAgent := context.WithCancel(context.Background())
	s.Stop = stop
	url, served := execBed(t, s.PeerHandler())
	ws := dialExec(t, url)
	if err := ws.Write(context.Background(), websocket.MessageBinary, []byte{api.KindStdin, 'x', '\n'}); err != nil {
		t.Fatal(err)
	}
	time.Sleep(100 * time.Millisecond)
	stopAgent()
	within(t, sess.closed, 5*time.Second, "the session closed when the agent stopped")
	within(t, served, 5*time.Second, "the stream ended when the agent stopped")
}

// fakePeers is one other node, at a test server.
type fakePeers struct{ ts *httptest.Server }

func (p fakePeers) PeerAddr(string) string     { return p.ts.Listener.Addr().String() }
func (p fakePeers) StreamClient() *http.Client { return p.ts.Client() }

// A relaying node does not outlive the caller either when the node that
// runs the command takes no more input: the caller going ends the relay.
func TestExecRelayCallerGoesWhilePeerTakesNothing(t *testing.T) {
	peerDone := make(chan struct{})
	peer := httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		ws, err := websocket.Accept(w, r, nil)
		if err != nil {
			return
		}
		defer ws.CloseNow()
		ws.Write(r.Context(), websocket.MessageBinary, []byte{api.KindStdout, 'r', '\n'})
		<-peerDone // reads nothing: its input waits
	}))
	defer peer.Close()
	defer close(peerDone)
	s := testServer(t, &fakeRuntime{})
	s.Peers = fakePeers{peer}
	url, served := execBed(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		ws, ctx, done := s.accept(w, r)
		if ws == nil {
			return
		}
		defer done()
		s.relayExec(ctx, ws, api.Source{Node: "g14", Container: "app.server"}, api.ExecQuery{Cmd: []string{"cat"}, Stdin: true})
	}))
	ws := dialExec(t, url)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	flood(t, ws, ctx)
	ws.CloseNow()
	within(t, served, 10*time.Second, "the relay ended after the caller went")
}

// A peer's exec and logs reach only what this node's plan runs: Podman
// takes any container's name or ID, the mesh's or not, and a member (a
// hostile one) could otherwise exec into any container of the host.
func TestPeerReachesOnlyThePlansContainers(t *testing.T) {
	var mu sync.Mutex
	var asked []string
	ask := func(name string) { mu.Lock(); asked = append(asked, name); mu.Unlock() }
	seen := func() []string { mu.Lock(); defer mu.Unlock(); return slices.Clone(asked) }
	s := testServer(t, &fakeRuntime{
		exec:   func(name string, _ podman.ExecConfig) (Session, error) { ask(name); return newFakeSession(), nil },
		lookup: func(name string) (reconciler.Container, bool, error) { ask(name); return running(name) },
		logs: func(ctx context.Context, id string, o podman.LogOptions, each func(podman.LogLine) error) error {
			return nil
		},
	})
	ts := httptest.NewServer(s.PeerHandler())
	defer ts.Close()
	for _, path := range []string{
		"/v1/op/exec?name=operators-own&cmd=sh",
		"/v1/op/exec?name=c1abcdef&cmd=sh", // an ID
		"/v1/op/logs?name=operators-own",
		"/v1/op/logs?name=app.server&step=1", // a container, asked as a step
		"/v1/op/logs?name=app.migrate",       // a step, asked as a container
	} {
		resp, err := http.Get(ts.URL + path)
		if err != nil {
			t.Fatal(err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusNotFound || !strings.Contains(string(body), "not in ace's plan") {
			t.Errorf("%s: %s %s", path, resp.Status, body)
		}
	}
	if a := seen(); len(a) > 0 {
		t.Fatalf("Podman was asked for %v", a)
	}
	// What the plan runs is reached.
	resp, err := http.Get(ts.URL + "/v1/op/logs?name=app.server")
	if err != nil {
		t.Fatal(err)
	}
	io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	if a := seen(); resp.StatusCode != http.StatusOK || !slices.Contains(a, "app.server") {
		t.Fatalf("logs of app.server: %s, Podman asked for %v", resp.Status, a)
	}
	dialExec(t, "ws"+strings.TrimPrefix(ts.URL, "http"))
}
