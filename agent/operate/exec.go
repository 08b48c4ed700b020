package operate

import (
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"strings"
	"sync"
	"time"

	"github.com/coder/websocket"

	"mesh/cluster/api"
	"mesh/podman"
)

// serveExec is the local API's /v1/exec?target=MODULE.CONTAINER[&node=N]&cmd=...:
// a websocket to the command, on this node or relayed to the node that
// runs it.
func (s *Server) serveExec(w http.ResponseWriter, r *http.Request) {
	v := r.URL.Query()
	q, err := api.ParseExecQuery(v)
	if err != nil {
		writeError(w, err)
		return
	}
	srcs, err := s.sources(r.Context(), v.Get("target"), v.Get("node"), true)
	if err != nil {
		writeError(w, err)
		return
	}
	src, err := oneSource(v.Get("target"), srcs)
	if err != nil {
		writeError(w, err)
		return
	}
	ws, ctx, done := s.accept(w, r)
	if ws == nil {
		return
	}
	defer done()
	if src.Node == s.Node {
		s.runExec(ctx, ws, src.Container, q)
		return
	}
	s.relayExec(ctx, ws, src, q)
}

// oneSource is the one container an exec runs in, of the sources target
// named: a module of several containers is not one (--node cannot choose
// among containers of one node), and a container on several nodes needs
// --node.
func oneSource(target string, srcs []api.Source) (api.Source, error) {
	var names, nodes []string
	for _, src := range srcs {
		names = appendNew(names, src.Container)
		nodes = append(nodes, src.Node)
	}
	switch {
	case len(names) > 1:
		return api.Source{}, badRequest("%s has several containers (%s): name one, as MODULE.CONTAINER (e.g. mesh exec %s -- CMD)", target, strings.Join(names, ", "), names[0])
	case len(srcs) > 1:
		return api.Source{}, badRequest("%s runs on %d nodes (%s): say which with --node", names[0], len(srcs), strings.Join(nodes, ", "))
	}
	return srcs[0], nil
}

// serveNodeExec is a node's /v1/op/exec?name=CONTAINER&cmd=...
func (s *Server) serveNodeExec(w http.ResponseWriter, r *http.Request) {
	v := r.URL.Query()
	q, err := api.ParseExecQuery(v)
	if err != nil {
		writeError(w, err)
		return
	}
	name := v.Get("name")
	if name == "" {
		writeError(w, badRequest("name a container"))
		return
	}
	if err := s.planHolds(r.Context(), name, false); err != nil {
		writeError(w, err)
		return
	}
	ws, ctx, done := s.accept(w, r)
	if ws == nil {
		return
	}
	defer done()
	s.runExec(ctx, ws, name, q)
}

// accept takes an exec's websocket (nil if the upgrade failed), with the
// context it runs in, ended too when the agent stops; done closes both.
func (s *Server) accept(w http.ResponseWriter, r *http.Request) (*websocket.Conn, context.Context, func()) {
	ws, err := websocket.Accept(w, r, nil)
	if err != nil {
		return nil, nil, nil
	}
	ws.SetReadLimit(api.MaxMessage)
	ctx, cancel := s.streamContext(r.Context())
	return ws, ctx, func() { cancel(); ws.CloseNow() }
}

// sendExit ends a stream with the command's exit, or why it did not run.
func sendExit(ctx context.Context, ws *websocket.Conn, e api.Exit) {
	b, _ := json.Marshal(e)
	wctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	if ws.Write(wctx, websocket.MessageBinary, append([]byte{api.KindExit}, b...)) == nil {
		ws.Close(websocket.StatusNormalClosure, "")
	}
}

// runExec runs the command in a container of this node, its streams on ws.
func (s *Server) runExec(ctx context.Context, ws *websocket.Conn, name string, q api.ExecQuery) {
	sess, err := s.RT.Exec(ctx, name, podman.ExecConfig{Cmd: q.Cmd, TTY: q.TTY, Stdin: q.Stdin, Width: q.Width, Height: q.Height})
	if err != nil {
		msg := fmt.Sprintf("exec in %s on %s: %v", name, s.Node, err)
		if podman.IsNotRunning(err) {
			msg = fmt.Sprintf("%s on %s is not running, so nothing can run in it (%v); mesh status says why", name, s.Node, err)
		}
		sendExit(ctx, ws, api.Exit{Code: -1, Error: msg})
		return
	}
	closeSess := sync.OnceFunc(sess.Close)
	defer closeSess()
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	// ctx ends when the caller goes or the agent stops: then the session
	// is closed, which ends the command's streams, so Output (which takes
	// no context) returns, and a write to its input that blocks fails.
	context.AfterFunc(ctx, closeSess)
	// The caller's input and end of input, in order, through a writer of
	// their own: a command that stops reading its input blocks that
	// writer, never the read of the caller, which must go on to see the
	// caller go.
	input := make(chan []byte, inputQueue)
	go func() {
		stdin := sess.Stdin()
		broken := false
		for {
			select {
			case <-ctx.Done():
				return
			case b := <-input:
				switch {
				case b[0] == api.KindStdinEOF:
					stdin.Close()
				case !broken:
					// A command that closed its input takes no more: the
					// rest is dropped, and its output still shows.
					_, err := stdin.Write(b[1:])
					broken = err != nil
				}
			}
		}
	}()
	// The caller's messages, until it goes (then ctx ends).
	go func() {
		defer cancel()
		for {
			_, b, err := ws.Read(ctx)
			if err != nil {
				return
			}
			if len(b) == 0 {
				continue
			}
			switch b[0] {
			case api.KindStdin, api.KindStdinEOF:
				if b[0] == api.KindStdin && !q.Stdin {
					continue
				}
				if hand(ctx, ws, input, b) != nil {
					return
				}
			case api.KindResize:
				if len(b) == 5 {
					sess.Resize(ctx, binary.BigEndian.Uint16(b[1:]), binary.BigEndian.Uint16(b[3:]))
				}
			}
		}
	}()
	var mu sync.Mutex // one writer at a time keeps stdout and stderr whole
	out := &wsWriter{ctx: ctx, ws: ws, kind: api.KindStdout, mu: &mu}
	errw := &wsWriter{ctx: ctx, ws: ws, kind: api.KindStderr, mu: &mu}
	oerr := sess.Output(out, errw)
	if ctx.Err() != nil {
		return
	}
	code, err := sess.ExitCode(ctx)
	switch {
	case err != nil:
		sendExit(ctx, ws, api.Exit{Code: -1, Error: err.Error()})
	case oerr != nil && !errors.Is(oerr, errWS):
		sendExit(ctx, ws, api.Exit{Code: code, Error: "the output broke: " + oerr.Error()})
	default:
		sendExit(ctx, ws, api.Exit{Code: code})
	}
}

var errWS = errors.New("the caller's stream ended")

// inputQueue is how many of the caller's messages (each at most
// api.MaxMessage) wait for the command, or the node that runs it, to take
// them before the caller is read no further.
const inputQueue = 16

// probeEvery is how often a caller that is not read (its input waits on
// a full queue) is checked for still being there.
const probeEvery = 2 * time.Second

// hand puts the caller's message b in queue for its writer. While the
// queue is full the caller is not read, so its going would not be seen
// (a close is a message, and a closed socket shows in a read): it is
// probed instead, every probeEvery, with an empty message (which the CLI
// and a relaying node pass over), whose write fails once it went.
func hand(ctx context.Context, ws *websocket.Conn, queue chan<- []byte, b []byte) error {
	t := time.NewTicker(probeEvery)
	defer t.Stop()
	for {
		select {
		case queue <- b:
			return nil
		case <-ctx.Done():
			return ctx.Err()
		case <-t.C:
			if err := ws.Write(ctx, websocket.MessageBinary, nil); err != nil {
				return err
			}
		}
	}
}

// wsWriter sends what it is given as messages of one kind.
type wsWriter struct {
	ctx  context.Context
	ws   *websocket.Conn
	kind byte
	mu   *sync.Mutex
	buf  []byte
}

func (w *wsWriter) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	n := 0
	for len(p) > 0 {
		c := min(len(p), api.Chunk)
		w.buf = append(append(w.buf[:0], w.kind), p[:c]...)
		if err := w.ws.Write(w.ctx, websocket.MessageBinary, w.buf); err != nil {
			return n, errWS
		}
		n += c
		p = p[c:]
	}
	return n, nil
}

// relayExec carries an exec to the node that runs the container and back.
func (s *Server) relayExec(ctx context.Context, ws *websocket.Conn, src api.Source, q api.ExecQuery) {
	addr := s.Peers.PeerAddr(src.Node)
	if addr == "" {
		sendExit(ctx, ws, api.Exit{Code: -1, Error: fmt.Sprintf("node %s: no address is known for it", src.Node)})
		return
	}
	v := url.Values{}
	v.Set("name", src.Container)
	q.Values(v)
	dctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	peer, resp, err := websocket.Dial(dctx, "https://"+addr+"/v1/op/exec?"+v.Encode(), &websocket.DialOptions{HTTPClient: s.Peers.StreamClient()})
	cancel()
	if err != nil {
		msg := fmt.Sprintf("node %s did not answer (%s): %v", src.Node, addr, err)
		if resp != nil && resp.StatusCode != http.StatusSwitchingProtocols {
			msg = fmt.Sprintf("node %s: %s", src.Node, api.ErrorBody(resp))
		}
		sendExit(ctx, ws, api.Exit{Code: -1, Error: msg})
		return
	}
	peer.SetReadLimit(api.MaxMessage)
	defer peer.CloseNow()
	// The caller's messages to the peer, until the caller goes (then the
	// peer's end goes too, and the command loses its streams). A peer that
	// takes nothing (its command reads no input) blocks the writer, never
	// the read of the caller, which must go on to see the caller go.
	inCtx, stopIn := context.WithCancel(ctx)
	defer stopIn()
	toPeer := make(chan []byte, inputQueue)
	go func() {
		defer peer.CloseNow()
		for {
			select {
			case <-inCtx.Done():
				return
			case b := <-toPeer:
				if err := peer.Write(inCtx, websocket.MessageBinary, b); err != nil {
					return
				}
			}
		}
	}()
	go func() {
		defer stopIn()
		for {
			_, b, err := ws.Read(inCtx)
			if err != nil {
				return
			}
			if hand(inCtx, ws, toPeer, b) != nil {
				return
			}
		}
	}()
	// The peer's messages to the caller, until its exit. The caller's end
	// stays open after the peer's broke, to say so.
	for {
		typ, b, err := peer.Read(ctx)
		if err != nil {
			break
		}
		if err := ws.Write(ctx, typ, b); err != nil {
			return
		}
		if len(b) > 0 && b[0] == api.KindExit {
			ws.Close(websocket.StatusNormalClosure, "")
			return
		}
	}
	if inCtx.Err() == nil {
		sendExit(ctx, ws, api.Exit{Code: -1, Error: fmt.Sprintf("the stream from node %s broke before the command ended", src.Node)})
	}
}
