package cluster

import (
	"bytes"
	"context"
	"crypto/sha256"
	"crypto/tls"
	"crypto/x509"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hashicorp/raft"

	"mesh/internal/seal"
	"mesh/internal/wgkey"
	"mesh/state"
)

// The node-to-node API, on the mux's API side. Every endpoint but /v1/join
// needs a client certificate of a current node.

// applyReply is a forwarded write's outcome. Kind keeps a rule error's kind
// across the wire, so the operator gets the same exit code on every node.
type applyReply struct {
	Index uint64 `json:"index"`
	Error string `json:"error,omitempty"`
	Kind  string `json:"kind,omitempty"`
}

// JoinRequest is what a joining node sends.
type JoinRequest struct {
	MeshID  string `json:"mesh_id"`
	Secret  string `json:"secret"`
	Name    string `json:"name"`
	Address string `json:"address"`
	Port    int    `json:"port"`
	CSR     string `json:"csr"`
	// SealKey is the key credentials are sealed to for the new node.
	SealKey string `json:"seal_key,omitempty"`
	// Commands is the newest command format the new node's binary applies
	// (state.CommandVersion; absent from older binaries).
	Commands int `json:"commands,omitempty"`
	// Replace: this machine takes the place of a node of that name that
	// has run (mesh join --replace).
	Replace bool `json:"replace,omitempty"`
	// Until is the token's end (Token.Until; 0: none), which its Secret
	// is derived with. A leader of an older binary compares that secret
	// with the join secret, and refuses it.
	Until int64 `json:"until,omitempty"`
	// OverlayKey is the new node's WireGuard public key and OverlayEndpoint
	// its UDP address (absent from older binaries).
	OverlayKey      string `json:"overlay_key,omitempty"`
	OverlayEndpoint string `json:"overlay_endpoint,omitempty"`
}

// JoinReply admits it.
type JoinReply struct {
	MeshID string `json:"mesh_id"`
	CA     string `json:"ca"`
	Cert   string `json:"cert"`
	Voter  bool   `json:"voter"`
	// Overlay is the mesh's overlay setting, OverlayAddress the new node's
	// address on it ("" until it has one).
	Overlay        string `json:"overlay,omitempty"`
	OverlayAddress string `json:"overlay_address,omitempty"`
	// Voters are the voters of the leader's Raft configuration at the
	// join: while the new node's replica is empty, it takes a Raft
	// connection from them alone (Identity.Vouch). Absent from an older
	// leader's reply: then from any node the CA vouches for.
	Voters []string `json:"voters,omitempty"`
}

func kindOf(err error) string {
	switch {
	case errors.Is(err, state.ErrNotFound):
		return "not-found"
	case errors.Is(err, state.ErrConflict):
		return "conflict"
	case errors.Is(err, state.ErrInvalid):
		return "invalid"
	case errors.Is(err, ErrNoLeader):
		return "no-leader"
	case errors.Is(err, ErrDiskFull):
		return "disk-full"
	}
	return ""
}

func errOfKind(kind, msg string) error {
	switch kind {
	case "not-found":
		return &state.RuleError{Kind: state.ErrNotFound, Msg: msg}
	case "conflict":
		return &state.RuleError{Kind: state.ErrConflict, Msg: msg}
	case "invalid":
		return &state.RuleError{Kind: state.ErrInvalid, Msg: msg}
	case "disk-full":
		return fmt.Errorf("%w: %s", ErrDiskFull, strings.TrimPrefix(msg, ErrDiskFull.Error()+" "))
	case "not-leader":
		return fmt.Errorf("%w: %w: %s", ErrNoLeader, errNotApplied, msg)
	case "no-leader":
		if msg == notLeaderMsg { // a peer of an older build
			return fmt.Errorf("%w: %w: %s", ErrNoLeader, errNotApplied, msg)
		}
		return fmt.Errorf("%w: %s", ErrNoLeader, msg)
	}
	return errors.New(msg)
}

// peerName is the verified name of the node calling, "" if none.
func (n *Node) peerName(r *http.Request) string {
	if r.TLS == nil {
		return ""
	}
	name, err := n.tls.verifyPeer(r.TLS.PeerCertificates)
	if err != nil {
		return ""
	}
	node, err := n.store.Node(r.Context(), name)
	if err != nil {
		return ""
	}
	if cert := r.TLS.PeerCertificates[0]; !keyFits(node, cert) {
		n.log.Warn("refused a peer's request: its certificate for that node has another key than the one recorded for it", "from", r.RemoteAddr, "peer", name, "key", CertKey(cert))
		return ""
	}
	return name
}

func (n *Node) peerHandler() http.Handler {
	mux := http.NewServeMux()
	member := func(h http.HandlerFunc) http.HandlerFunc {
		return func(w http.ResponseWriter, r *http.Request) {
			if n.peerName(r) == "" {
				boundRest(w)
				http.Error(w, "a certificate of a current node of this mesh is required", http.StatusForbidden)
				return
			}
			h(w, r)
		}
	}
	mux.HandleFunc("POST /v1/apply", member(n.serveApply))
	mux.HandleFunc("GET /v1/hello", member(n.serveHello))
	mux.HandleFunc("POST /v1/join", n.serveJoin)
	mux.HandleFunc("GET /v1/ca", n.serveCA)
	mux.HandleFunc("GET /v1/binary", n.serveBinary)
	mux.HandleFunc("POST /v1/promote", member(n.servePromote))
	mux.HandleFunc("POST /v1/members/remove", member(n.serveRemoveMember))
	mux.HandleFunc("POST /v1/renew", member(n.serveRenew))
	mux.HandleFunc("POST /v1/committed", n.serveCommitted)
	// Logs and exec (the agent's operate package): a member may read any
	// container's output and run commands in it, as it may already assign
	// it anything to run; a machine without a node's certificate, nothing.
	mux.Handle("/v1/op/", member(func(w http.ResponseWriter, r *http.Request) {
		h := n.operate.Load()
		if h == nil {
			http.Error(w, "this node's agent is still starting; try again", http.StatusServiceUnavailable)
			return
		}
		ctx, stop := n.whileMember(r)
		defer stop()
		(*h).ServeHTTP(w, r.WithContext(ctx))
	}))
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if guestConn(r.Context()) {
			// A guest's connection ends with its answer: kept alive, one
			// request every minute held a guest's place for good.
			w.Header().Set("Connection", "close")
		}
		if _, pattern := mux.Handler(r); pattern == "" {
			// The mux's own refusal (no such path: 404; another method:
			// 405), which reads no body: the server reads what is left of
			// it before it answers, under the deadline a refused guest's
			// is read under, or a body sent a byte at a time would keep
			// the connection's guest place for as long as it is sent.
			boundRest(w)
		}
		mux.ServeHTTP(w, r)
	})
}

// whileMember is r's context, ended once the node that made r is no longer
// a current node with that certificate (removed, another key recorded for
// it, its certificate expired or its CA ended), looked at on each change
// of the replica and once a minute. A stream (mesh logs -f, mesh exec)
// outlived the check of its request otherwise: a node removed went on
// reading any container's output, or running a shell in it.
func (n *Node) whileMember(r *http.Request) (context.Context, context.CancelFunc) {
	ctx, cancel := context.WithCancel(r.Context())
	if !n.serving.enter() { // the node stops: so does the stream
		cancel()
		return ctx, cancel
	}
	go func() {
		defer n.serving.leave()
		defer cancel()
		for {
			changed := n.store.Changed()
			if n.peerName(r.WithContext(ctx)) == "" {
				return
			}
			select {
			case <-ctx.Done():
				return
			case <-changed:
			case <-time.After(time.Minute):
			}
		}
	}()
	return ctx, cancel
}

// PeerName is the node whose certificate made request r ("" for none of
// this mesh's nodes).
func (n *Node) PeerName(r *http.Request) string { return n.peerName(r) }

// SetOperate serves h at the peer API's /v1/op/ (members only).
func (n *Node) SetOperate(h http.Handler) { n.operate.Store(&h) }

// PeerAddr is where the node called name listens, from the Raft
// configuration ("" if it is not in it).
func (n *Node) PeerAddr(name string) string { return n.peerAddr(name) }

// StreamClient is a mutual-TLS client of the other nodes' peer APIs with no
// overall timeout: each stream is bounded by its request's context.
func (n *Node) StreamClient() *http.Client { return n.streams }

func writeJSON(w http.ResponseWriter, code int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(code)
	json.NewEncoder(w).Encode(v)
}

// MaxCommand bounds a command forwarded to the leader: what the largest
// restore the local API takes (256 MiB of snapshot) encodes to. A follower
// refuses a larger one itself, saying so, rather than send it cut short.
const MaxCommand = 320 << 20

// A forwarded command over smallCommand (nearly none is: an assign is a
// few hundred bytes) is read in one of largeCommands places, one a node,
// waiting for one at most largeCommandWait: each may hold MaxCommand, and
// a node that sent many at once (a hostile one) took the leader's memory
// many times over. A node has at most peerReads bodies being read at once
// (a small one is read in microseconds), and each body is read whole
// within commandReadTime, and LargeWrite more for the size it announces:
// a body sent a byte at a time held its goroutine, and its place, for as
// long as the sender liked.
const (
	smallCommand  = 1 << 20
	largeCommands = 2
	peerReads     = 4
)

var (
	largeCommandWait = newTunable(10 * time.Second)
	commandReadTime  = newTunable(time.Minute)
)

// readers are the forwarded commands' bodies being read, by node, and the
// nodes holding a large place.
type readers struct {
	mu      sync.Mutex
	reading map[string]int
	large   map[string]bool
}

// begin counts one more body of peer's, if it has fewer than peerReads.
func (rs *readers) begin(peer string) bool {
	rs.mu.Lock()
	defer rs.mu.Unlock()
	if rs.reading[peer] >= peerReads {
		return false
	}
	if rs.reading == nil {
		rs.reading = map[string]int{}
	}
	rs.reading[peer]++
	return true
}

func (rs *readers) end(peer string) {
	rs.mu.Lock()
	defer rs.mu.Unlock()
	if rs.reading[peer]--; rs.reading[peer] <= 0 {
		delete(rs.reading, peer)
	}
}

// holdLarge marks peer as holding (or waiting for) a large place, if it
// does not already.
func (rs *readers) holdLarge(peer string, hold bool) bool {
	rs.mu.Lock()
	defer rs.mu.Unlock()
	if !hold {
		delete(rs.large, peer)
		return true
	}
	if rs.large[peer] {
		return false
	}
	if rs.large == nil {
		rs.large = map[string]bool{}
	}
	rs.large[peer] = true
	return true
}

// readCommand reads a forwarded command's body (see smallCommand); release
// gives its place back once the command is done with. A refusal is an
// applyReply and its status; it leaves the read deadline set, for what the
// server reads of the rest of the body before it answers.
func (n *Node) readCommand(w http.ResponseWriter, r *http.Request) (raw []byte, release func(), code int, refused applyReply) {
	none := func() {}
	peer := n.peerName(r)
	rc := http.NewResponseController(w)
	// A body that says it is large is given the time its sender's Apply
	// gives it (LargeWrite) on top: one of 300 MiB has eleven minutes, not
	// one (5 MiB/s, more than a home uplink carries).
	rc.SetReadDeadline(time.Now().Add(commandReadTime.get() + LargeWrite(min(r.ContentLength, MaxCommand))))
	bad := func(err error) ([]byte, func(), int, applyReply) {
		return nil, none, http.StatusBadRequest, applyReply{Error: "bad command: " + err.Error(), Kind: "invalid"}
	}
	busy := func(why string) ([]byte, func(), int, applyReply) {
		n.log.Warn("refused a forwarded command", "peer", peer, "why", why)
		return nil, none, http.StatusServiceUnavailable, applyReply{Error: why + "; try again"}
	}
	if r.ContentLength > MaxCommand {
		return nil, none, http.StatusBadRequest, applyReply{Error: fmt.Sprintf("the command is over the %d MiB a leader takes", MaxCommand>>20), Kind: "invalid"}
	}
	if !n.reads.begin(peer) {
		return busy(fmt.Sprintf("the leader is reading %d commands from %s already", peerReads, peer))
	}
	defer n.reads.end(peer)
	raw, err := io.ReadAll(io.LimitReader(r.Body, smallCommand+1))
	if err != nil {
		return bad(err)
	}
	if len(raw) <= smallCommand {
		rc.SetReadDeadline(time.Time{})
		return raw, none, 0, refused
	}
	if !n.reads.holdLarge(peer, true) {
		return busy(fmt.Sprintf("the leader is reading a command over %d MiB from %s already", smallCommand>>20, peer))
	}
	wait := time.NewTimer(largeCommandWait.get())
	defer wait.Stop()
	select {
	case n.large <- struct{}{}:
	case <-wait.C:
		n.reads.holdLarge(peer, false)
		return busy(fmt.Sprintf("the leader is reading %d commands over %d MiB already", largeCommands, smallCommand>>20))
	case <-r.Context().Done():
		n.reads.holdLarge(peer, false)
		return bad(r.Context().Err())
	}
	release = func() {
		<-n.large
		n.reads.holdLarge(peer, false)
	}
	// Read into a buffer of the size the body announces, or of the most
	// it may hold (a buffer grown by doubling held about twice that at
	// its peak; pages not written to are not taken).
	size := MaxCommand + 1
	if cl := r.ContentLength; cl > int64(len(raw)) {
		size = int(cl)
	}
	buf := bytes.NewBuffer(make([]byte, 0, size+bytes.MinRead))
	buf.Write(raw)
	if _, err := buf.ReadFrom(io.LimitReader(r.Body, MaxCommand+1-int64(len(raw)))); err != nil {
		release()
		return bad(err)
	}
	if buf.Len() > MaxCommand {
		release()
		return nil, none, http.StatusBadRequest, applyReply{Error: fmt.Sprintf("the command is over the %d MiB a leader takes", MaxCommand>>20), Kind: "invalid"}
	}
	rc.SetReadDeadline(time.Time{})
	return buf.Bytes(), release, 0, refused
}

func (n *Node) serveApply(w http.ResponseWriter, r *http.Request) {
	raw, release, code, refused := n.readCommand(w, r)
	defer release()
	if code != 0 {
		writeJSON(w, code, refused)
		return
	}
	// A follower of an older binary sends a flat command: Decode converts it.
	c, err := state.Decode(raw)
	if err != nil {
		writeJSON(w, http.StatusBadRequest, applyReply{Error: "bad command: " + err.Error(), Kind: "invalid"})
		return
	}
	if n.raft.State() != raft.Leader {
		// Never forward twice: the caller retries against the leader it sees.
		writeJSON(w, http.StatusServiceUnavailable, applyReply{Error: notLeaderMsg, Kind: "not-leader"})
		return
	}
	// A command no replica can read stops every one at apply, and again
	// at each start (the FSM stops rather than skip one): what a node
	// sends is read whole here, never taken on its envelope. One of a
	// format this leader does not know is refused by commit, saying so.
	req, err := c.Request()
	if err != nil && c.NeedsVersion() <= state.CommandVersion {
		n.log.Warn("refused a forwarded command that does not decode", "op", c.Op, "peer", n.peerName(r), "err", err)
		writeJSON(w, http.StatusBadRequest, applyReply{Error: "bad command: " + err.Error(), Kind: "invalid"})
		return
	}
	if err := n.speaksForItself(r, c, req); err != nil {
		n.log.Warn("refused a forwarded command", "op", c.Op, "err", err)
		writeJSON(w, http.StatusForbidden, applyReply{Error: err.Error(), Kind: kindOf(err)})
		return
	}
	timeout := ApplyTimeout
	if d, ok := r.Context().Deadline(); ok {
		timeout = time.Until(d)
	}
	idx, err := n.commit(c, timeout)
	if errors.Is(err, errNotApplied) {
		writeJSON(w, http.StatusServiceUnavailable, applyReply{Error: notLeaderMsg, Kind: "not-leader"})
		return
	}
	rep := applyReply{Index: idx}
	if err != nil {
		rep.Error, rep.Kind = err.Error(), kindOf(err)
	}
	writeJSON(w, http.StatusOK, rep)
}

// speaksForItself refuses a forwarded command in which a node says, of
// another node, what only that node may say of itself (its report, its
// sealing key, its overlay key, its certificate's key), or one that only a
// voter proposes (a node's admission, a new CA, a new join secret, the CA
// key and the join secret sealed again). A node of the mesh may propose
// any operator's command, but the voters seal the CA key and the join
// secret to the sealing keys the state gives its voters: a non-voter that
// named its own key as a voter's, or added a voter of its own with it,
// would come to hold both (a non-voter holds neither: cluster/DESIGN.md),
// and one that made a join secret would know it and could join in a
// voter's place; a certificate key
// named for a voter would have every peer refuse it, and quorum go. The
// one such command a voter proposes for another node is the admission of
// a joiner and the pinning of its certificate's key (admit), which the
// leader forwards when it lost the lead under the join. req is c decoded
// (nil for a format this leader does not know, which commit refuses).
func (n *Node) speaksForItself(r *http.Request, c *state.Command, req state.Request) error {
	switch c.Op {
	case state.OpReport, state.OpNodeKey, state.OpNodeOverlay, state.OpNodeCert, state.OpNodeAdd, state.OpCARotate, state.OpTokenRotate, state.OpSeal:
	default:
		return nil
	}
	if req == nil {
		return nil
	}
	peer := n.peerName(r)
	voter := func() bool {
		me, err := n.store.Node(r.Context(), peer)
		return err == nil && me.Voter
	}
	var about string
	switch x := req.(type) {
	case *state.ReportRequest:
		about = x.Report.Node
	case *state.NodeKeyRequest:
		about = x.Node
	case *state.NodeOverlayRequest:
		about = x.Node
	case *state.NodeCertRequest:
		if x.Node != peer && voter() {
			return nil
		}
		about = x.Node
	case *state.NodeAddRequest, *state.CARotateRequest, *state.TokenRotateRequest:
		if voter() {
			return nil
		}
		return &state.RuleError{Kind: state.ErrInvalid, Msg: fmt.Sprintf("node %s may not send a %s: only a voter does (a node joins with mesh join; mesh ca rotate and mesh token --rotate run on a voter)", peer, c.Op)}
	case *state.SealRequest:
		if x.CAKey == nil && x.JoinSecret == nil && x.CANextKey == nil || voter() {
			return nil
		}
		return &state.RuleError{Kind: state.ErrInvalid, Msg: fmt.Sprintf("node %s may not seal the CA key or the join secret: only a voter does", peer)}
	default:
		return nil
	}
	if about == peer {
		return nil
	}
	return &state.RuleError{Kind: state.ErrInvalid, Msg: fmt.Sprintf("node %s may not send a %s for node %s: only a node says that of itself", peer, c.Op, about)}
}

// leaderAddr is the leader's address, or an error saying there is none.
func (n *Node) leaderAddr() (string, error) {
	addr, _ := n.raft.LeaderWithID()
	if addr == "" {
		return "", fmt.Errorf("%w: no leader is known", ErrNoLeader)
	}
	return string(addr), nil
}

// notLeaderMsg is a peer's answer to a write it did not apply because it no
// longer leads; the write is sent again to the next leader.
const notLeaderMsg = "this node is no longer the leader"

// errNotApplied: the peer said it did not apply the write.
var errNotApplied = errors.New("not applied")

// errNotSent: a call failed before its request left (dial, TLS handshake),
// so it is safe to try again; after that a retry could apply a write twice.
var errNotSent = errors.New("request not sent")

// call POSTs to a peer's API and decodes the answer.
func (n *Node) call(ctx context.Context, addr, path string, in, out any) error {
	b, _ := json.Marshal(in)
	return n.callWith(ctx, n.peers, addr, path, b, out)
}

// callWith is call of the body b, through client.
func (n *Node) callWith(ctx context.Context, client *http.Client, addr, path string, b []byte, out any) error {
	req, err := http.NewRequestWithContext(ctx, "POST", "https://"+addr+path, bytes.NewReader(b))
	if err != nil {
		return err
	}
	start := time.Now()
	resp, err := client.Do(req)
	n.log.Debug("peer call", "addr", addr, "path", path, "took", time.Since(start), "err", err)
	if err != nil {
		var op *net.OpError
		if errors.As(err, &op) && op.Op == "dial" { // every failure of peerTransport.dialTLS
			return fmt.Errorf("%w: reach the leader at %s: %w", ErrNoLeader, addr, errors.Join(errNotSent, err))
		}
		return fmt.Errorf("%w: reach the leader at %s: %v", ErrNoLeader, addr, err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(io.LimitReader(resp.Body, 16<<20))
	if err := json.Unmarshal(body, out); err != nil {
		return fmt.Errorf("leader at %s answered %s: %s", addr, resp.Status, bytes.TrimSpace(body))
	}
	return nil
}

// forward sends a write to the leader.
func (n *Node) forward(ctx context.Context, c *state.Command) (uint64, error) {
	if size := len(c.Encode()); size > MaxCommand {
		return 0, &state.RuleError{Kind: state.ErrInvalid, Msg: fmt.Sprintf("the %s command is %d MiB, over the %d MiB a leader takes from a follower", c.Op, size>>20, MaxCommand>>20)}
	}
	addr, err := n.leaderAddr()
	if err != nil {
		return 0, err
	}
	// A large command is bounded by ctx alone (Apply gives it LargeWrite
	// more): the peers' client gives up after peerCallTime, however
	// large the body (a restore of 50 MiB from a home uplink takes more).
	b, _ := json.Marshal(c)
	client := n.peers
	if len(b) > smallCommand {
		if _, ok := ctx.Deadline(); ok {
			client = n.streams
		}
	}
	var rep applyReply
	if err := n.callWith(ctx, client, addr, "/v1/apply", b, &rep); err != nil {
		return 0, err
	}
	// Read your writes: return once this replica holds the entry too, so the
	// next read on this node sees it (bounded: replication is usually ms).
	deadline := time.Now().Add(LeaderWait)
	for {
		if idx, err := n.store.AppliedIndex(); err == nil && idx >= rep.Index {
			break
		}
		if time.Now().After(deadline) || ctx.Err() != nil {
			n.log.Warn("forwarded write not yet replicated here", "index", rep.Index)
			break
		}
		time.Sleep(5 * time.Millisecond)
	}
	if rep.Error != "" {
		return rep.Index, errOfKind(rep.Kind, rep.Error)
	}
	return rep.Index, nil
}

// joinBodyTime bounds the reading of a guest's request body: the port
// serves without a read timeout (the API's streams outlive any), and a
// guest that sent a body a byte at a time held its place for as long as
// it liked.
var joinBodyTime = newTunable(10 * time.Second)

// tunable is a duration a test may shorten: atomic, because the handlers
// of a test's nodes may still read it while the test puts it back.
type tunable struct{ ns atomic.Int64 }

func newTunable(d time.Duration) *tunable {
	t := &tunable{}
	t.ns.Store(int64(d))
	return t
}

func (t *tunable) get() time.Duration { return time.Duration(t.ns.Load()) }

// set makes the duration d and returns what puts it back (for t.Cleanup).
func (t *tunable) set(d time.Duration) (restore func()) {
	old := t.ns.Swap(int64(d))
	return func() { t.ns.Store(old) }
}

// boundRest bounds, by joinBodyTime from now, the reading of what a
// request still holds: a handler that answers a guest before reading its
// body (a refusal, a GET) leaves the server to read the rest before it
// answers, and it would wait for a trickle without end.
func boundRest(w http.ResponseWriter) {
	http.NewResponseController(w).SetReadDeadline(time.Now().Add(joinBodyTime.get()))
}

// hasBody says r comes with a body (a guest's GET must not).
func hasBody(r *http.Request) bool { return r.ContentLength != 0 || len(r.TransferEncoding) > 0 }

// maxJoinRequest bounds a join request's body.
const maxJoinRequest = 1 << 20

func (n *Node) serveJoin(w http.ResponseWriter, r *http.Request) {
	boundRest(w)
	rc := http.NewResponseController(w)
	var req JoinRequest
	body := &io.LimitedReader{R: r.Body, N: maxJoinRequest + 1}
	err := json.NewDecoder(body).Decode(&req)
	if err == nil {
		// The rest (nothing but space) too: the server reads what a
		// handler left before it answers, and must not wait for it
		// without the deadline.
		_, err = io.Copy(io.Discard, body)
	}
	if err == nil && body.N == 0 {
		// More than the bound: the rest is read under the deadline.
		err = fmt.Errorf("over the %d kB a join request takes", maxJoinRequest>>10)
	}
	if err != nil {
		// The deadline stays: what is left is read under it, and the
		// connection closed.
		writeJSON(w, http.StatusBadRequest, applyReply{Error: "bad join request: " + err.Error(), Kind: "invalid"})
		return
	}
	// Lifted once read: it bounds the body only, not the admit (which can
	// take seconds in an election, and has its own bounds) nor the
	// server's read for a closed connection that runs meanwhile.
	rc.SetReadDeadline(time.Time{})
	var rep JoinReply
	// A join sent the moment the first agent starts finds no leader yet:
	// wait for the election, within the write deadline.
	wctx, cancel := context.WithTimeout(r.Context(), LeaderWait)
	n.WaitLeader(wctx)
	cancel()
	if n.raft.State() == raft.Leader {
		rep, err = n.admit(r.Context(), req)
		err = leaderLostUnder(err)
	} else {
		// Any node admits: it hands the request to the leader, as a member.
		var addr string
		if addr, err = n.leaderAddr(); err == nil {
			var out struct {
				JoinReply
				applyReply
			}
			if err = n.call(r.Context(), addr, "/v1/join", req, &out); err == nil && out.Error != "" {
				err = errOfKind(out.Kind, out.Error)
			}
			rep = out.JoinReply
		}
	}
	if err != nil {
		writeJSON(w, http.StatusOK, applyReply{Error: err.Error(), Kind: kindOf(err)})
		return
	}
	writeJSON(w, http.StatusOK, rep)
}

// leaderLostUnder is an error of admit's, of kind no-leader when this node
// stopped leading under the join (a commit it lost, a Raft change it may
// no longer make): the joiner tries again (joinThroughElections), and the
// next leader admits the same request.
func leaderLostUnder(err error) error {
	if errors.Is(err, raft.ErrLeadershipLost) || errors.Is(err, raft.ErrNotLeader) {
		return fmt.Errorf("%w: %w", ErrNoLeader, err)
	}
	return err
}

// checkToken checks a join request's token against the replica: its mesh,
// no rotation of the CA under way (the token pins the old one), and its
// secret. It returns the identity and the CA key.
func (n *Node) checkToken(ctx context.Context, req JoinRequest) (state.Identity, string, error) {
	id, err := n.checkTokenSecret(ctx, req)
	if err != nil {
		return id, "", err
	}
	caKey, _, err := n.OpenIdentity(id)
	if err != nil {
		return id, "", err
	}
	return id, caKey, nil
}

// checkTokenSecret is checkToken without the CA key: the token is this
// mesh's, valid now.
func (n *Node) checkTokenSecret(ctx context.Context, req JoinRequest) (state.Identity, error) {
	id, err := n.store.Identity(ctx)
	if err != nil {
		return id, err
	}
	if req.MeshID != id.MeshID {
		return id, &state.RuleError{Kind: state.ErrConflict, Msg: fmt.Sprintf("this is mesh %s; the token is for mesh %s", id.MeshID, req.MeshID)}
	}
	if id.CANextCert != "" {
		return id, &state.RuleError{Kind: state.ErrConflict, Msg: "a rotation of the mesh's CA is under way, and the token pins the CA it replaces; join once it ends (mesh status shows it), with a token made then (mesh token)"}
	}
	// The secret first: a stranger's guess never has the CA key opened.
	joinSecret, err := n.JoinSecret(id)
	if err != nil {
		return id, err
	}
	if req.Until < 0 || !secretEqual(req.Secret, TokenSecret(joinSecret, req.Until)) {
		if n.refusedJoin.Now() {
			n.log.Warn("refused a join token: its secret is not this mesh's (logged once a minute at most)", "name", req.Name, "address", req.Address)
		}
		return id, &state.RuleError{Kind: state.ErrInvalid, Msg: "the join token's secret is not valid (was it rotated? get a new one with `mesh token`)"}
	}
	// Its end after its secret: a stranger learns nothing of a token.
	if req.Until != 0 && time.Now().Unix() > req.Until {
		return id, &state.RuleError{Kind: state.ErrInvalid, Msg: fmt.Sprintf("the join token ended at %s; get a new one with `mesh token` on a voter", time.Unix(req.Until, 0).UTC().Format(time.RFC3339))}
	}
	return id, nil
}

// admitTokenChecked, when set (tests), runs between admit's first check of
// the token and its barrier.
var admitTokenChecked func()

// admit runs on the leader: it checks the token, records the node, signs its
// certificate and adds it to Raft as a non-voter (promoted once it runs).
func (n *Node) admit(ctx context.Context, req JoinRequest) (JoinReply, error) {
	id, _, err := n.checkToken(ctx, req)
	if err != nil {
		return JoinReply{}, err
	}
	if !nodeNameRE.MatchString(req.Name) || net.ParseIP(req.Address) == nil || req.Port <= 0 || req.Port > 65535 {
		return JoinReply{}, &state.RuleError{Kind: state.ErrInvalid, Msg: "join needs a node name (a DNS label), an IP address and a port"}
	}
	// What it reads from here on must be what the mesh committed: a leader
	// just elected may not yet have applied its predecessor's last
	// commits, among them this node's row from a join its predecessor lost
	// leadership under, which the joiner sends again; read without the
	// barrier, the row was missing, and the node added again was refused
	// as already in the mesh (bench/fleet.sh at 50 agents). After the
	// token's checks: only a token holder makes the leader write.
	if admitTokenChecked != nil {
		admitTokenChecked()
	}
	if err := n.Linearize(ctx); err != nil {
		return JoinReply{}, err
	}
	// And the token again, against what the mesh committed: a rotation
	// of the join secret (or the start of one of the CA) acknowledged
	// before this barrier, which the first check did not see applied, ends
	// the old token's use here.
	id, caKey, err := n.checkToken(ctx, req)
	if err != nil {
		return JoinReply{}, err
	}
	settings, err := n.store.Settings(ctx)
	if err != nil {
		return JoinReply{}, err
	}
	if settings.Overlay != "" && settings.Overlay != state.OverlayOff && req.OverlayKey == "" {
		// A node without a key would take every name off the overlay and put
		// every internal port back on every interface.
		return JoinReply{}, &state.RuleError{Kind: state.ErrInvalid, Msg: "this mesh's nodes talk over their own overlay, which the joining node's mesh binary does not know; install this mesh's binary there (mesh token --install-line) and join again"}
	}
	if req.OverlayKey != "" {
		if _, err := wgkey.PublicHex(req.OverlayKey); err != nil {
			return JoinReply{}, &state.RuleError{Kind: state.ErrInvalid, Msg: "the joining node's overlay key: " + err.Error()}
		}
		if _, err := netip.ParseAddrPort(req.OverlayEndpoint); err != nil {
			return JoinReply{}, &state.RuleError{Kind: state.ErrInvalid, Msg: fmt.Sprintf("the joining node's overlay endpoint %q is not IP:PORT", req.OverlayEndpoint)}
		}
	}
	if req.SealKey != "" {
		if err := seal.CheckRecipient(req.SealKey); err != nil {
			return JoinReply{}, &state.RuleError{Kind: state.ErrInvalid, Msg: "the joining node's sealing key is not an age recipient: " + err.Error()}
		}
	}
	ca, err := ParseCA([]byte(id.CACert), []byte(caKey))
	if err != nil {
		return JoinReply{}, fmt.Errorf("read the mesh CA: %w", err)
	}
	cert, err := ca.Sign([]byte(req.CSR), req.Name, req.Address)
	if err != nil {
		return JoinReply{}, &state.RuleError{Kind: state.ErrInvalid, Msg: err.Error()}
	}
	nodes, err := n.store.Nodes(ctx)
	if err != nil {
		return JoinReply{}, err
	}
	voters := 0
	var again *state.NodeInfo
	for i, x := range nodes {
		if x.Voter {
			voters++
		}
		if x.Name == req.Name && x.Address == req.Address {
			again = &nodes[i]
		}
	}
	voter := voters < id.Voters
	replaced := false // a node of that name that ran, whose place this one takes
	for _, x := range nodes {
		if x.Name != req.Name {
			continue
		}
		// A token holder must not take the place of a node that runs: a
		// node of that name that has ever been heard from, reported, or
		// answers now is replaced only when the joiner says so (--replace).
		// One that never ran is a join whose answer was lost, tried again.
		if ran, err := n.hasRun(ctx, x.Name); err != nil {
			return JoinReply{}, err
		} else if ran && !req.Replace {
			return JoinReply{}, &state.RuleError{Kind: state.ErrConflict, Msg: fmt.Sprintf("node %q is already in the mesh (at %s) and has run; if this machine is to take its place, run `mesh node remove %s` on a node of the mesh first, or join with --replace (the mesh then takes this machine's keys for %s, and the machine that had them is refused)", x.Name, x.Address, x.Name, x.Name)}
		} else if ran {
			replaced = true
		}
		if x.Address != req.Address {
			return JoinReply{}, &state.RuleError{Kind: state.ErrConflict, Msg: fmt.Sprintf("node %q is already in the mesh at %s, not at %s; run `mesh node remove %s` on a node of the mesh first, then join again", x.Name, x.Address, req.Address, x.Name)}
		}
	}
	if again != nil {
		// The same node joins again: a join that stopped half-way (the state
		// has it, Raft may not), or a node whose data dir was lost. The token
		// proved it may; it keeps its row, and Raft gets it (back) below.
		voter = again.Voter
		n.log.Warn("a node that is already in the state joins again", "name", req.Name, "address", req.Address)
		// The machine replaced is refused from now on: nothing is sealed
		// to its key any more (a voter's CA key and join secret, a node's
		// credentials), but to this machine's; and every node takes only
		// this machine's overlay key for the node's overlay address (the
		// replaced machine's was taken from wherever it came until this
		// machine's agent said its own).
		var k *state.NodeKeyRequest
		var o *state.NodeOverlayRequest
		if replaced && req.SealKey != "" && req.SealKey != again.SealKey {
			k = &state.NodeKeyRequest{Node: req.Name, SealKey: req.SealKey}
		}
		if replaced && req.OverlayKey != "" && req.OverlayKey != again.OverlayKey && settings.Overlay != "" && settings.Overlay != state.OverlayOff {
			o = &state.NodeOverlayRequest{Node: req.Name, Key: req.OverlayKey, Endpoint: req.OverlayEndpoint}
		}
		if k != nil || o != nil {
			if n.raft.State() != raft.Leader {
				return JoinReply{}, fmt.Errorf("%w: %s stopped leading under the join", ErrNoLeader, n.cfg.ID)
			}
			// A node that cannot apply node.key yet would leave the old
			// key in the state, and the voters would seal the CA key and
			// the join secret to it again (VoterSealStale): refused, with
			// nothing changed.
			if k != nil {
				if need := state.NewCommand(k).NeedsVersion(); req.Commands < need {
					return JoinReply{}, &state.RuleError{Kind: state.ErrConflict, Msg: fmt.Sprintf("this machine's mesh cannot take %s's place: it does not apply the command that records its sealing key (format %d); upgrade mesh here and join again", req.Name, need)}
				}
			}
			// What the replaced machine said of its binary is no longer
			// the node's once this machine's key is recorded: this
			// machine's is what its request says (until it says hello).
			// Until then it stays, so that a refused replace leaves the
			// leader refusing commands the old machine cannot apply.
			// Both commands are checked before either is proposed: a
			// refusal changes nothing.
			err := n.asReplaced(req.Name, req.Commands, func() error {
				if k != nil {
					if err := n.canApply(state.NewCommand(k)); err != nil {
						return &state.RuleError{Kind: state.ErrConflict, Msg: fmt.Sprintf("%s cannot take %s's place yet: the mesh must record this machine's sealing key instead of the replaced one's, so that nothing is sealed to that machine any more, and %s", req.Name, req.Name, err)}
					}
				}
				if o != nil {
					if err := n.canApply(state.NewCommand(o)); err != nil {
						return &state.RuleError{Kind: state.ErrConflict, Msg: fmt.Sprintf("%s cannot take %s's place yet: the mesh must record this machine's overlay key instead of the replaced one's, and %s", req.Name, req.Name, err)}
					}
				}
				if k != nil {
					if _, err := n.Propose(ctx, k); err != nil {
						return fmt.Errorf("record %s's new sealing key: %w", req.Name, err)
					}
				}
				if o != nil {
					if _, err := n.Propose(ctx, o); err != nil {
						return fmt.Errorf("record %s's new overlay key: %w", req.Name, err)
					}
				}
				return nil
			})
			if err != nil {
				return JoinReply{}, err
			}
		}
	} else {
		nd := state.Node{Name: req.Name, Address: req.Address, Voter: voter, Port: req.Port, SealKey: req.SealKey, OverlayKey: req.OverlayKey, OverlayEndpoint: req.OverlayEndpoint}
		if settings.Overlay != "" && settings.Overlay != state.OverlayOff {
			// Added without its key (nodeAdd drops what an older node
			// could not store), it would take every name off the overlay
			// and every internal port back onto every interface.
			if err := n.canApply(state.NewCommand(&state.NodeAddRequest{Node: nd})); err != nil {
				return JoinReply{}, &state.RuleError{Kind: state.ErrConflict, Msg: "this mesh's nodes talk over their own overlay, and a new node's overlay key cannot be recorded yet: " + err.Error()}
			}
		}
		add := n.nodeAdd(nd)
		if _, err := n.Propose(ctx, add); err != nil {
			return JoinReply{}, err
		}
	}
	rep := JoinReply{MeshID: id.MeshID, CA: id.CACert, Voter: voter, Overlay: settings.Overlay}
	if f := n.raft.GetConfiguration(); f.Error() == nil {
		for _, s := range f.Configuration().Servers {
			if s.Suffrage == raft.Voter {
				rep.Voters = append(rep.Voters, string(s.ID))
			}
		}
	}
	if me, err := n.store.Node(ctx, req.Name); err == nil {
		rep.OverlayAddress = me.OverlayAddress
	}
	if err := n.pinCert(ctx, req.Name, req.Commands, cert); err != nil {
		return JoinReply{}, fmt.Errorf("record %s's certificate: %w", req.Name, err)
	}
	addr := net.JoinHostPort(req.Address, strconv.Itoa(req.Port))
	if err := n.raft.AddNonvoter(raft.ServerID(req.Name), raft.ServerAddress(addr), 0, ApplyTimeout).Error(); err != nil {
		return JoinReply{}, fmt.Errorf("add %s to raft: %w", req.Name, err)
	}
	n.log.Info("node joined", "name", req.Name, "address", addr, "voter", voter)
	if replaced && again.Voter {
		// The voter replaced held the join secret, and would join again
		// with it at will (under a new name, or with --replace in any
		// node's place): a new one, as mesh node remove of a voter makes,
		// sealed to the voters as they are now (this machine's key, not
		// the replaced one's). Last, so that a join that fails before it
		// (the leader lost under it) is sent again with the same token.
		if err := n.rotateJoinSecret(ctx); err != nil {
			return JoinReply{}, fmt.Errorf("%s joined in the place of voter %s, but the join secret that machine held was not replaced (join again, or run mesh token --rotate on a voter): %w", req.Name, req.Name, err)
		}
		n.log.Warn("a voter's place was taken by another machine: the join secret was replaced (mesh token prints the new token)", "name", req.Name)
	}
	rep.Cert = string(cert)
	return rep, nil
}

// asReplaced runs record (the checks and the commands that record a
// replacing machine's sealing and overlay keys) with node's last hello
// saying the binary format the replacing machine's join request says,
// commands: what the replaced machine said is not held against the
// machine that takes its place. If record fails, what the replaced
// machine said is put back (unless a hello changed it since), so that a
// refused replace leaves the leader refusing what that machine cannot
// apply (when the sealing key was recorded and the overlay key then was
// not, that is only more careful: the new machine's first hello says its
// own).
func (n *Node) asReplaced(node string, commands int, record func() error) error {
	n.live.mu.Lock()
	prev, had := n.live.seen[node]
	mine := prev
	if had {
		mine.Commands = commands
		n.live.seen[node] = mine
	}
	n.live.mu.Unlock()
	err := record()
	if err != nil && had {
		n.live.mu.Lock()
		if n.live.seen[node] == mine {
			n.live.seen[node] = prev
		}
		n.live.mu.Unlock()
	}
	return err
}

// rotateJoinSecret (a voter) makes a new join secret, sealed to the voters'
// keys of the replica.
func (n *Node) rotateJoinSecret(ctx context.Context) error {
	keys, err := n.store.VoterKeys(ctx)
	if err != nil {
		return err
	}
	sealed, err := n.SealToVoters(seal.NewSecret(), keys)
	if err != nil {
		return err
	}
	_, err = n.Propose(ctx, &state.TokenRotateRequest{Sealed: sealed})
	return err
}

func (n *Node) servePromote(w http.ResponseWriter, r *http.Request) {
	name := n.peerName(r)
	err := n.promote(r.Context(), name)
	rep := applyReply{}
	if err != nil {
		rep.Error, rep.Kind = err.Error(), kindOf(err)
	}
	writeJSON(w, http.StatusOK, rep)
}

// nodeAdd is the command that records a joining node. In a mesh halfway
// through an upgrade, whose older nodes cannot apply a node with a sealing
// key yet, the key is left out: the node gives it (node.key) once they can.
func (n *Node) nodeAdd(nd state.Node) *state.NodeAddRequest {
	r := &state.NodeAddRequest{Node: nd}
	if nd.OverlayKey != "" && n.canApply(state.NewCommand(r)) != nil {
		// The same for the overlay key (the node gives it, node.overlay).
		r.Node.OverlayKey, r.Node.OverlayEndpoint = "", ""
	}
	if nd.SealKey != "" && n.canApply(state.NewCommand(r)) != nil {
		r.Node.SealKey = ""
	}
	return r
}

// promote makes a node that the state says is a voter a Raft voter (leader only).
func (n *Node) promote(ctx context.Context, name string) error {
	if n.raft.State() != raft.Leader {
		return fmt.Errorf("%w: not the leader", ErrNoLeader)
	}
	node, err := n.store.Node(ctx, name)
	if err != nil {
		return err
	}
	if !node.Voter {
		return nil
	}
	f := n.raft.GetConfiguration()
	if err := f.Error(); err != nil {
		return err
	}
	for _, s := range f.Configuration().Servers {
		if s.ID == raft.ServerID(name) {
			if s.Suffrage == raft.Voter {
				return nil
			}
			n.log.Info("promoting to voter", "name", name)
			return n.raft.AddVoter(s.ID, s.Address, 0, ApplyTimeout).Error()
		}
	}
	return fmt.Errorf("%s is not in the raft configuration", name)
}

// EnsureVoter asks the leader, once this node has caught up, to make it the
// voter the state says it is. It returns when done, or when ctx ends.
func (n *Node) EnsureVoter(ctx context.Context) {
	for {
		if n.isVoterOrNeedNot(ctx) {
			return
		}
		if addr, err := n.leaderAddr(); err == nil && n.raft.State() != raft.Leader {
			var rep applyReply
			if err := n.call(ctx, addr, "/v1/promote", struct{}{}, &rep); err == nil && rep.Error == "" {
				continue
			}
		}
		select {
		case <-ctx.Done():
			return
		case <-time.After(2 * time.Second):
		}
	}
}

func (n *Node) isVoterOrNeedNot(ctx context.Context) bool {
	node, err := n.store.Node(ctx, n.cfg.ID)
	if err != nil {
		return false // not replicated here yet
	}
	if !node.Voter {
		return true
	}
	f := n.raft.GetConfiguration()
	if f.Error() != nil {
		return false
	}
	for _, s := range f.Configuration().Servers {
		if s.ID == raft.ServerID(n.cfg.ID) {
			return s.Suffrage == raft.Voter
		}
	}
	return false
}

type removeRequest struct {
	Name  string `json:"name"`
	Force bool   `json:"force"`
}

// removeReply is a removal's answer: Removal's fields, then applyReply's,
// written out (embedded, its Index and Removal's were two of one name; the
// JSON is the same, Removal's Index being "-"). Index is the removal's.
type removeReply struct {
	Removal
	Index uint64 `json:"index"`
	Error string `json:"error,omitempty"`
	Kind  string `json:"kind,omitempty"`
}

func (n *Node) serveRemoveMember(w http.ResponseWriter, r *http.Request) {
	var req removeRequest
	json.NewDecoder(io.LimitReader(r.Body, 1<<16)).Decode(&req)
	rm, err := n.RemoveNode(r.Context(), req.Name, req.Force)
	rep := removeReply{Removal: rm, Index: rm.Index}
	if err != nil {
		rep.Error, rep.Kind = err.Error(), kindOf(err)
	}
	writeJSON(w, http.StatusOK, rep)
}

// checkRemovable (leader) refuses a removal after which the voters that
// answer right now could not form a majority of the voters left. Each is
// asked at once (a hello, RemoveTimeout): a voter that died a moment ago
// still looks healthy to Raft's heartbeats and to the periodic probe, and
// removing the other one then would leave a configuration that can commit
// nothing, the removal itself included.
func (n *Node) checkRemovable(ctx context.Context, name string) error {
	f := n.raft.GetConfiguration()
	if err := f.Error(); err != nil {
		return err
	}
	var others []string
	left, isVoter := 0, false
	for _, s := range f.Configuration().Servers {
		if s.Suffrage != raft.Voter {
			continue
		}
		if s.ID == raft.ServerID(name) {
			isVoter = true
			continue
		}
		left++
		if string(s.ID) != n.cfg.ID {
			others = append(others, string(s.ID))
		}
	}
	if !isVoter {
		return nil
	}
	if left == 0 {
		return &state.RuleError{Kind: state.ErrConflict, Msg: fmt.Sprintf("%s is the only voter", name)}
	}
	hctx, cancel := context.WithTimeout(ctx, RemoveTimeout)
	defer cancel()
	answered := make(chan bool, len(others))
	for _, o := range others {
		go func(o string) { answered <- n.hello(hctx, o) }(o)
	}
	reachable := left - len(others) // this node, the leader
	for range others {
		if <-answered {
			reachable++
		}
	}
	if need := left/2 + 1; reachable < need {
		return &state.RuleError{Kind: state.ErrConflict, Msg: fmt.Sprintf("removing voter %s would leave %d voters of which %d are reachable, less than the %d a majority needs; bring the others back first, or remove an unreachable one", name, left, reachable, need)}
	}
	return nil
}

// RemoveTimeout bounds how long a removal waits for the voters it keeps to
// answer.
const RemoveTimeout = 2 * time.Second

// Removal is what RemoveNode did.
type Removal struct {
	Index uint64 `json:"-"` // (sent as removeReply's)
	// Voter: the node removed was a voter, and held the join secret;
	// Rotated: the leader replaced it, sealed to the voters left;
	// RotateError: why it could not.
	Voter       bool   `json:"voter,omitempty"`
	Rotated     bool   `json:"join_secret_rotated,omitempty"`
	RotateError string `json:"join_secret_error,omitempty"`
	// Told: the leader said the above (one before it rotated nothing,
	// and said nothing of it).
	Told bool `json:"told,omitempty"`
}

// RemoveNode takes a node out of the mesh: out of the state (so its
// certificate stops being accepted), then out of Raft; a voter's join
// secret is replaced then. It runs on the leader, which knows which voters
// are reachable; other nodes hand it over.
func (n *Node) RemoveNode(ctx context.Context, name string, force bool) (Removal, error) {
	if n.raft.State() != raft.Leader {
		addr, err := n.leaderAddr()
		if err != nil {
			return Removal{}, err
		}
		var rep removeReply
		if err := n.call(ctx, addr, "/v1/members/remove", removeRequest{Name: name, Force: force}, &rep); err != nil {
			return Removal{}, err
		}
		if rep.Error != "" {
			return Removal{Index: rep.Index}, errOfKind(rep.Kind, rep.Error)
		}
		rep.Removal.Index = rep.Index
		return rep.Removal, nil
	}
	if name == n.cfg.ID {
		return Removal{}, &state.RuleError{Kind: state.ErrConflict, Msg: fmt.Sprintf("%s leads the mesh; remove it from another node after it hands over (stop its agent)", name)}
	}
	if err := n.checkRemovable(ctx, name); err != nil {
		return Removal{}, err
	}
	was, _ := n.store.Node(ctx, name)
	idx, err := n.Propose(ctx, &state.NodeRemoveRequest{Name: name, Force: force})
	rm := Removal{Index: idx, Voter: was.Voter, Told: true}
	if err != nil {
		return rm, err
	}
	// The secret is replaced once the state has the removal, whatever
	// Raft does next: a removal tried again would find no voter to name.
	if was.Voter {
		// It held the join secret, and could join again with it at will
		// (under a new name): a new one, sealed to the voters left. Here,
		// whichever node asked: a member that called the peer API itself
		// would otherwise remove a voter with the secret left as it was.
		if err := n.rotateJoinSecret(ctx); err != nil {
			rm.RotateError = err.Error()
			n.log.Warn("removed a voter, but the join secret it held was not replaced: run mesh token --rotate on a voter", "node", name, "err", err)
		} else {
			rm.Rotated = true
		}
	}
	if err := n.raft.RemoveServer(raft.ServerID(name), 0, ApplyTimeout).Error(); err != nil {
		said := ""
		if rm.Rotated {
			said = " (the join secret it held was replaced)"
		}
		return rm, fmt.Errorf("node %s left the state but not raft%s: %w", name, said, err)
	}
	return rm, nil
}

// joinClient asks a node of the mesh to admit this one, pinning the CA digest
// from the token: no trust on first use.
func joinClient(ctx context.Context, address string, tok Token, req JoinRequest) (JoinReply, error) {
	cfg := &tls.Config{
		MinVersion:         tls.VersionTLS13,
		NextProtos:         []string{alpnAPI},
		InsecureSkipVerify: true, // checked against the pinned CA below
		VerifyPeerCertificate: func(raw [][]byte, _ [][]*x509.Certificate) error {
			return verifyPinned(raw, tok.CADigest)
		},
	}
	// One request: no connection is kept, neither here nor as a guest at the
	// node (which bounds connections without a node's certificate).
	client := &http.Client{Timeout: 30 * time.Second, Transport: &http.Transport{TLSClientConfig: cfg, DisableKeepAlives: true}}
	b, _ := json.Marshal(req)
	hreq, err := http.NewRequestWithContext(ctx, "POST", "https://"+address+"/v1/join", bytes.NewReader(b))
	if err != nil {
		return JoinReply{}, err
	}
	resp, err := client.Do(hreq)
	if err != nil {
		return JoinReply{}, fmt.Errorf("reach %s: %w", address, err)
	}
	defer resp.Body.Close()
	var out struct {
		JoinReply
		applyReply
	}
	if err := json.NewDecoder(io.LimitReader(resp.Body, 1<<20)).Decode(&out); err != nil {
		return JoinReply{}, fmt.Errorf("%s answered %s", address, resp.Status)
	}
	if out.Error != "" {
		return JoinReply{}, errOfKind(out.Kind, out.Error)
	}
	if CADigest([]byte(out.CA)) != tok.CADigest {
		return JoinReply{}, errors.New("the CA the node sent is not the one the token pins")
	}
	return out.JoinReply, nil
}

// verifyPinned accepts a server whose chain holds the pinned CA and whose
// certificate that CA signed.
func verifyPinned(raw [][]byte, digest string) error {
	certs, err := parseCerts(raw)
	if err != nil || len(certs) == 0 {
		return errors.New("the node sent no certificate")
	}
	for i, r := range raw {
		if sha256Hex(r) != digest || !certs[i].IsCA {
			continue
		}
		pool := x509.NewCertPool()
		pool.AddCert(certs[i])
		if _, err := certs[0].Verify(x509.VerifyOptions{Roots: pool, KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageAny}}); err != nil {
			return fmt.Errorf("the node's certificate is not signed by the pinned CA: %w", err)
		}
		return nil
	}
	return errors.New("the node does not present the CA the token pins: it is not of that mesh")
}

func sha256Hex(b []byte) string {
	s := sha256.Sum256(b)
	return hex.EncodeToString(s[:])
}

// hasRun says whether node name has run: this node heard from it, it
// reported an apply, or it answers a hello now (an agent that just started,
// not heard from yet).
func (n *Node) hasRun(ctx context.Context, name string) (bool, error) {
	if _, ok := n.Seen()[name]; ok {
		return true, nil
	}
	if n.hello(ctx, name) {
		return true, nil
	}
	reports, err := n.store.Reports(ctx)
	if err != nil {
		return false, err
	}
	_, ok := reports[name]
	return ok, nil
}
