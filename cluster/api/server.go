// Package api is a node's local API: the server on the data dir's unix
// socket, a typed client for every endpoint, and the wire types both use.
// It decides nothing: reads go to the replica, writes are typed requests
// proposed through cluster.Node. main.go never names a URL path.
package api

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"mesh/cluster"
	"mesh/internal/seal"
	"mesh/state"
	"mesh/state/manifest"
)

// Status is what `mesh status` shows.
type Status struct {
	Node         string `json:"node"`
	MeshID       string `json:"mesh_id"`
	Domain       string `json:"domain"`
	RaftState    string `json:"raft_state"`
	Leader       string `json:"leader"`
	AppliedIndex uint64 `json:"applied_index"`
	// CommitIndex is the highest index this node knows committed; Behind
	// is how many of those its replica has not applied yet, and BehindSince
	// since when it has been behind (as this node's API last saw).
	CommitIndex uint64 `json:"commit_index"`
	// DiskFloor is the free space below which a node refuses writes.
	DiskFloor   uint64     `json:"disk_floor"`
	Behind      uint64     `json:"behind"`
	BehindSince *time.Time `json:"behind_since,omitempty"`
	// Resolver is this node's resolver address (IP:PORT), when it runs one.
	Resolver string `json:"resolver,omitempty"`
	// Overlay is this node's end of the overlay, when the agent runs one.
	Overlay *OverlayStatus `json:"overlay,omitempty"`
	// CA is the mesh's CA, and a rotation of it under way.
	CA    *state.CAStatus `json:"ca,omitempty"`
	Nodes []NodeStatus    `json:"nodes"`
	// Rollouts are the modules' rollouts (issue 29), running or ended.
	Rollouts []RolloutStatus `json:"rollouts,omitempty"`
	// Moves are the modules' moves with their data (issue 30), going on,
	// done (FROM keeps its copy) or aborted.
	Moves []state.MoveInfo `json:"moves,omitempty"`
}

// RolloutStatus is a rollout and, while it runs, what it waits for.
type RolloutStatus struct {
	state.Rollout
	Waiting string `json:"waiting,omitempty"`
}

// OverlayStatus is this node's end of the mesh's overlay.
type OverlayStatus struct {
	State string                `json:"state"`
	Peers map[string]PeerStatus `json:"peers,omitempty"`
}

// PeerStatus is what this node's overlay says of a peer.
type PeerStatus struct {
	Endpoint      string     `json:"endpoint,omitempty"`
	LastHandshake *time.Time `json:"last_handshake"`
	RxBytes       uint64     `json:"rx_bytes"`
	TxBytes       uint64     `json:"tx_bytes"`
	// Stale: no handshake for three minutes (or ever).
	Stale bool `json:"stale"`
}

// NodeStatus is one node's line in `mesh status`.
type NodeStatus struct {
	state.NodeInfo
	PlanVersion    uint64        `json:"plan_version"`
	PlanDigest     string        `json:"plan_digest,omitempty"`
	Resources      int           `json:"resources"`
	AppliedVersion uint64        `json:"applied_version"`
	AppliedAt      *time.Time    `json:"applied_at,omitempty"`
	ApplyError     string        `json:"apply_error,omitempty"`
	Report         *state.Report `json:"report,omitempty"`
	// Reachable: this node heard from it within Node.ReachableWithin (itself
	// always). LastSeen is when; Version is the binary it runs.
	Reachable bool       `json:"reachable"`
	LastSeen  *time.Time `json:"last_seen"`
	Version   string     `json:"version"`
	// Overlay is this node's overlay tunnel to it (absent for itself).
	Overlay *PeerStatus `json:"overlay,omitempty"`
	// DiskFree is the space left in its data dir (as it last said; absent
	// from older binaries), DiskLow under cluster.LowFree: writes stop at
	// cluster.MinFree.
	DiskFree *uint64 `json:"disk_free,omitempty"`
	DiskLow  bool    `json:"disk_low,omitempty"`
}

// API serves the local API on a unix socket.
type API struct {
	node     *cluster.Node
	store    *state.Store
	id       cluster.Identity
	resolver string
	overlay  func() OverlayStatus
	log      *slog.Logger
	// behindSince is when status first saw the replica behind its commit
	// index, zero while it is not.
	behindMu    sync.Mutex
	behindSince time.Time
	now         func() time.Time
	srv         *http.Server
	// web is the web page's end of the local API (mesh web token, mesh
	// web logout), nil while the agent serves no page.
	web atomic.Pointer[http.Handler]
}

// SetWeb serves the web page's local end (POST /v1/web/...): the agent
// sets it when it serves the page (--web-listen).
func (a *API) SetWeb(h http.Handler) { a.web.Store(&h) }

func (a *API) serveWeb(w http.ResponseWriter, r *http.Request) {
	h := a.web.Load()
	if h == nil {
		fail(w, &state.RuleError{Kind: state.ErrInvalid, Msg: "this node serves no web page: start its agent with --web-listen ADDR (e.g. 127.0.0.1:8430)"})
		return
	}
	(*h).ServeHTTP(w, r)
}

// Config is what the local API serves from. Everything it reports exists
// before it serves: the composition root makes it last.
type Config struct {
	Node  *cluster.Node
	Store *state.Store
	ID    cluster.Identity
	// Resolver is this node's resolver address (IP:PORT), shown by status;
	// empty when the node runs none.
	Resolver string
	// Overlay, when set, says how this node's overlay is.
	Overlay func() OverlayStatus
	// Operate, when set, serves GET /v1/logs, GET /v1/exec and POST
	// /v1/backup (the agent's operate package).
	Operate http.Handler
	Logger  *slog.Logger
}

// New makes the local API of a running node.
func New(cfg Config) *API {
	a := &API{node: cfg.Node, store: cfg.Store, id: cfg.ID, resolver: cfg.Resolver, overlay: cfg.Overlay, log: cfg.Logger.With("component", "api"), now: time.Now}
	mux := http.NewServeMux()
	mux.HandleFunc("GET /v1/status", a.status)
	mux.HandleFunc("GET /v1/nodes", a.nodes)
	mux.HandleFunc("PUT /v1/nodes/{name}/public-domain", a.publicDomain)
	mux.HandleFunc("PUT /v1/nodes/{name}/acme", a.nodeACME)
	mux.HandleFunc("PUT /v1/nodes/{name}/drain", a.nodeDrain)
	mux.HandleFunc("DELETE /v1/nodes/{name}", a.removeNode)
	mux.HandleFunc("GET /v1/modules", a.modules)
	mux.HandleFunc("POST /v1/modules", a.addModules)
	mux.HandleFunc("GET /v1/modules/{name}", a.module)
	mux.HandleFunc("DELETE /v1/modules/{name}", a.removeModule)
	mux.HandleFunc("POST /v1/modules/{name}/pull", a.pullModule)
	mux.HandleFunc("POST /v1/modules/{name}/restart", a.restartModule)
	mux.HandleFunc("POST /v1/modules/{name}/revert", a.revertModule)
	mux.HandleFunc("GET /v1/modules/{name}/history", a.moduleHistory)
	mux.HandleFunc("POST /v1/assign", a.assign(state.OpAssign))
	mux.HandleFunc("POST /v1/unassign", a.assign(state.OpUnassign))
	mux.HandleFunc("GET /v1/roster", a.roster)
	mux.HandleFunc("GET /v1/roster/history", a.rosterHistory)
	mux.HandleFunc("GET /v1/plans/{node}", a.plans)
	mux.HandleFunc("POST /v1/history/keep", a.historyKeep)
	mux.HandleFunc("GET /v1/token", a.token)
	mux.HandleFunc("POST /v1/token/rotate", a.rotateToken)
	mux.HandleFunc("GET /v1/snapshot", a.snapshot)
	mux.HandleFunc("POST /v1/snapshot/restore", a.restore)
	mux.HandleFunc("GET /v1/ca", a.ca)
	mux.HandleFunc("POST /v1/ca/rotate", a.rotateCA)
	mux.HandleFunc("GET /v1/secrets", a.secrets)
	mux.HandleFunc("PUT /v1/secrets/{module}/{name}", a.setSecret)
	mux.HandleFunc("DELETE /v1/secrets/{module}/{name}", a.removeSecret)
	mux.HandleFunc("POST /v1/moves", a.moveModule)
	mux.HandleFunc("POST /v1/moves/{module}/step", a.moveStep)
	mux.HandleFunc("PUT /v1/backup/repo", a.setBackupRepo)
	mux.HandleFunc("GET /v1/backup/repo", a.backupRepo)
	mux.Handle("POST /v1/web/", http.HandlerFunc(a.serveWeb))
	if cfg.Operate != nil {
		mux.Handle("GET /v1/logs", cfg.Operate)
		mux.Handle("GET /v1/exec", cfg.Operate)
		mux.Handle("POST /v1/backup", cfg.Operate)
	}
	a.srv = &http.Server{Handler: refuseUnpreviewable(a.readsYourWrites(mux)), ReadHeaderTimeout: 10 * time.Second}
	return a
}

// LinearizableParam asks a read to be linearizable: answered only by the
// leader, once it committed a barrier with a quorum (cluster.Node.Linearize),
// from a replica that holds everything committed before the read began.
const LinearizableParam = "linearizable"

// DryRunParam asks a write endpoint for a preview instead of the write.
const DryRunParam = "dry-run"

func dryRun(r *http.Request) bool { return r.URL.Query().Get(DryRunParam) != "" }

// refuseUnpreviewable refuses a dry run of an endpoint that cannot preview,
// rather than make the write it was asked not to make. The writes that can
// (through a.write) are listed here.
func refuseUnpreviewable(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if dryRun(r) && r.Method != http.MethodGet {
			p := r.URL.Path
			ok := (r.Method == http.MethodPost && (p == "/v1/modules" || p == "/v1/moves" || p == "/v1/assign" || p == "/v1/unassign" || (strings.HasPrefix(p, "/v1/modules/") && (strings.HasSuffix(p, "/pull") || strings.HasSuffix(p, "/restart") || strings.HasSuffix(p, "/revert"))))) ||
				(r.Method == http.MethodDelete && (strings.HasPrefix(p, "/v1/modules/") || strings.HasPrefix(p, "/v1/secrets/"))) ||
				(r.Method == http.MethodPut && strings.HasPrefix(p, "/v1/secrets/")) ||
				(r.Method == http.MethodPut && strings.HasPrefix(p, "/v1/nodes/") && (strings.HasSuffix(p, "/public-domain") || strings.HasSuffix(p, "/acme")))
			if !ok {
				fail(w, &state.RuleError{Kind: state.ErrInvalid, Msg: fmt.Sprintf("%s %s cannot be previewed; run it without --dry-run", r.Method, p)})
				return
			}
		}
		next.ServeHTTP(w, r)
	})
}

// Serve listens on the unix socket at path (mode 0600) until Shutdown.
func (a *API) Serve(path string) error {
	if c, err := net.DialTimeout("unix", path, time.Second); err == nil {
		c.Close()
		return fmt.Errorf("an agent already serves %s; stop it first", path)
	}
	os.Remove(path)
	// The socket is never reachable by others between creation and chmod.
	old := syscall.Umask(0o177)
	l, err := net.Listen("unix", path)
	syscall.Umask(old)
	if err != nil {
		return fmt.Errorf("listen on %s: %w", path, err)
	}
	if err := os.Chmod(path, 0o600); err != nil {
		l.Close()
		return err
	}
	a.log.Info("local API listening", "socket", path)
	if err := a.srv.Serve(l); !errors.Is(err, http.ErrServerClosed) {
		return err
	}
	return nil
}

// Start serves on the unix socket at path in the background and returns once
// the socket answers, or with the reason it does not.
func (a *API) Start(path string) error {
	errc := make(chan error, 1)
	go func() { errc <- a.Serve(path) }()
	deadline := time.Now().Add(10 * time.Second)
	for {
		select {
		case err := <-errc:
			if err == nil {
				err = errors.New("the local API stopped at once")
			}
			return err
		default:
		}
		if c, err := net.DialTimeout("unix", path, 100*time.Millisecond); err == nil {
			c.Close()
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("the local API did not come up on %s within 10s", path)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// Shutdown stops the API, waiting for requests in flight.
func (a *API) Shutdown(ctx context.Context) error { return a.srv.Shutdown(ctx) }

type apiError struct {
	Error string `json:"error"`
}

func reply(w http.ResponseWriter, v any) {
	w.Header().Set("Content-Type", "application/json")
	json.NewEncoder(w).Encode(v)
}

func fail(w http.ResponseWriter, err error) {
	code := http.StatusInternalServerError
	switch {
	case errors.Is(err, state.ErrNotFound):
		code = http.StatusNotFound
	case errors.Is(err, state.ErrConflict):
		code = http.StatusConflict
	case errors.Is(err, state.ErrInvalid):
		code = http.StatusBadRequest
	case errors.Is(err, cluster.ErrNoLeader):
		code = http.StatusServiceUnavailable
	case errors.Is(err, cluster.ErrDiskFull):
		code = http.StatusInsufficientStorage
	}
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(code)
	json.NewEncoder(w).Encode(apiError{Error: err.Error()})
}

func decode(r *http.Request, v any) error {
	dec := json.NewDecoder(http.MaxBytesReader(nil, r.Body, 8<<20))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		return &state.RuleError{Kind: state.ErrInvalid, Msg: "bad request body: " + err.Error()}
	}
	return nil
}

// propose applies a request through Raft, stamping the proposer's time.
func (a *API) propose(ctx context.Context, req state.Request) (uint64, error) {
	c := state.NewCommand(req)
	c.Time = a.now().UTC()
	ctx, cancel := context.WithTimeout(ctx, cluster.ApplyTimeout+cluster.LargeWrite(int64(len(c.Body))))
	defer cancel()
	return a.node.Apply(ctx, c)
}

// write proposes req and answers with the index it was applied at, or the error.
func (a *API) write(w http.ResponseWriter, r *http.Request, req state.Request) {
	a.writeThen(w, r, req, WriteResult{})
}

// writeThen proposes req and answers with res and the index; asked for a dry
// run, it answers with the preview instead and proposes nothing.
func (a *API) writeThen(w http.ResponseWriter, r *http.Request, req state.Request, res WriteResult) {
	if err := a.writeInto(r, req, &res); err != nil {
		fail(w, err)
		return
	}
	reply(w, res)
}

// writeInto proposes req and sets res's index or, asked for a dry run,
// its preview (proposing nothing).
func (a *API) writeInto(r *http.Request, req state.Request, res *WriteResult) error {
	// The rule on host names, checked here for every command (the FSM
	// holds commands of formats older than it to the rules of their day).
	if err := a.store.CheckHosts(r.Context(), req); err != nil {
		return err
	}
	if dryRun(r) {
		c := state.NewCommand(req)
		c.Time = a.now().UTC()
		p, err := a.store.Preview(r.Context(), c.Encode())
		res.Preview = p
		return err
	}
	idx, err := a.propose(r.Context(), req)
	res.Index = idx
	return err
}

// MinIndexParam asks a read to answer only once this replica has applied
// that index: the index of the caller's own last write.
const MinIndexParam = "min_index"

// readsYourWrites holds a read with min_index until this replica has
// applied it, within MaxWait; past that it fails, saying how far behind the
// replica is, rather than answer with a state older than the caller's own
// write.
func (a *API) readsYourWrites(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method == http.MethodGet && r.URL.Query().Get(LinearizableParam) != "" {
			// A read no acknowledged write can be missing from: on the
			// leader, once a barrier it proposed has committed and so
			// everything before it is applied (the robustness suite checks
			// these reads).
			ctx, cancel := context.WithTimeout(r.Context(), readWait)
			err := a.node.Linearize(ctx)
			cancel()
			if err != nil {
				fail(w, err)
				return
			}
		}
		v := r.URL.Query().Get(MinIndexParam)
		if v == "" || r.Method != http.MethodGet {
			next.ServeHTTP(w, r)
			return
		}
		want, err := strconv.ParseUint(v, 10, 64)
		if err != nil {
			fail(w, &state.RuleError{Kind: state.ErrInvalid, Msg: fmt.Sprintf("%s %q is not a log index", MinIndexParam, v)})
			return
		}
		if applied, ok := a.waitApplied(r.Context(), want, readWait); !ok {
			fail(w, fmt.Errorf("%w: this node's replica has applied up to index %d, not yet the write at %d, after %s (it catches up from the leader: try again, or ask another node)", cluster.ErrNoLeader, applied, want, readWait))
			return
		}
		next.ServeHTTP(w, r)
	})
}

// waitApplied waits until this replica has applied index, within limit;
// it says the applied index and whether it got there.
func (a *API) waitApplied(ctx context.Context, index uint64, limit time.Duration) (uint64, bool) {
	timer := time.NewTimer(limit)
	defer timer.Stop()
	for {
		changed := a.store.Changed()
		applied, err := a.store.AppliedIndex()
		if err == nil && applied >= index {
			return applied, true
		}
		select {
		case <-changed:
		case <-timer.C:
			return applied, false
		case <-ctx.Done():
			return applied, false
		}
	}
}

// readWait bounds how long a read waits for the caller's write (a variable
// for tests).
var readWait = MaxWait

// MaxWait bounds a blocking query's wait.
const MaxWait = 20 * time.Second

// block holds a blocking query (`?index=N&wait=D`, as Nomad's are) until
// this replica has applied an entry past N, D passes (at most MaxWait), or
// the request ends. Without index it returns at once. A report is a
// replicated write, so a node's new apply or a change of its containers'
// health moves the index.
func (a *API) block(r *http.Request) error {
	q := r.URL.Query()
	if q.Get("index") == "" {
		return nil
	}
	index, err := strconv.ParseUint(q.Get("index"), 10, 64)
	if err != nil {
		return &state.RuleError{Kind: state.ErrInvalid, Msg: fmt.Sprintf("index %q is not a log index", q.Get("index"))}
	}
	wait := MaxWait
	if v := q.Get("wait"); v != "" {
		if wait, err = time.ParseDuration(v); err != nil || wait < 0 {
			return &state.RuleError{Kind: state.ErrInvalid, Msg: fmt.Sprintf("wait %q is not a duration", v)}
		}
	}
	timer := time.NewTimer(min(wait, MaxWait))
	defer timer.Stop()
	for {
		// The channel first: a change between the read and the wait is
		// not missed.
		changed := a.store.Changed()
		if applied, err := a.store.AppliedIndex(); err != nil || applied > index {
			return nil
		}
		select {
		case <-changed:
		case <-timer.C:
			return nil
		case <-r.Context().Done():
			return nil
		}
	}
}

func (a *API) status(w http.ResponseWriter, r *http.Request) {
	ctx := r.Context()
	if err := a.block(r); err != nil {
		fail(w, err)
		return
	}
	st, err := a.store.Settings(ctx)
	if err != nil {
		fail(w, err)
		return
	}
	applied, _ := a.store.AppliedIndex()
	out := Status{Node: a.id.Name, MeshID: st.MeshID, Domain: st.Domain, RaftState: a.node.State(), Leader: a.node.Leader(), AppliedIndex: applied, Resolver: a.resolver}
	out.CommitIndex, _ = strconv.ParseUint(a.node.Stats()["commit_index"], 10, 64)
	out.DiskFloor = cluster.MinFree
	if c, err := a.store.CA(ctx); err == nil {
		out.CA = &c
	}
	a.behindMu.Lock()
	if out.CommitIndex > applied {
		out.Behind = out.CommitIndex - applied
		if a.behindSince.IsZero() {
			a.behindSince = a.now()
		}
		since := a.behindSince
		out.BehindSince = &since
	} else {
		a.behindSince = time.Time{}
	}
	a.behindMu.Unlock()
	nodes, err := a.store.Nodes(ctx)
	if err != nil {
		fail(w, err)
		return
	}
	reports, err := a.store.Reports(ctx)
	if err != nil {
		fail(w, err)
		return
	}
	heads, err := a.store.PlanHeads(ctx)
	if err != nil {
		fail(w, err)
		return
	}
	seen := a.node.Seen()
	now := a.now()
	var peers map[string]PeerStatus
	if a.overlay != nil {
		o := a.overlay()
		out.Overlay, peers = &o, o.Peers
	}
	for _, n := range nodes {
		ns := NodeStatus{NodeInfo: n}
		if n.Name == a.id.Name {
			ns.Reachable, ns.LastSeen, ns.Version = true, &now, a.node.Version()
			free := a.node.Free()
			ns.DiskFree = &free
		} else if s, ok := seen[n.Name]; ok {
			at := s.LastSeen
			ns.Reachable, ns.LastSeen, ns.Version = now.Sub(at) < a.node.ReachableWithin(), &at, s.Version
			if s.Free > 0 {
				free := s.Free
				ns.DiskFree = &free
			}
		}
		ns.DiskLow = ns.DiskFree != nil && *ns.DiskFree < cluster.LowFree
		if p, ok := peers[n.Name]; ok {
			ns.Overlay = &p
		}
		if h, ok := heads[n.Name]; ok {
			ns.PlanVersion, ns.PlanDigest, ns.Resources = h.Version, h.Digest, h.Resources
		}
		if rep, ok := reports[n.Name]; ok {
			rep := rep
			ns.AppliedVersion, ns.ApplyError, ns.Report = rep.Version, rep.Error, &rep
			at := rep.AppliedAt
			ns.AppliedAt = &at
		}
		out.Nodes = append(out.Nodes, ns)
	}
	broken := map[string]string{}
	for _, n := range nodes {
		if n.ComposeError != "" {
			broken[n.Name] = n.ComposeError
		}
	}
	if out.Rollouts, err = a.rollouts(ctx, reports, broken); err != nil {
		fail(w, err)
		return
	}
	if out.Moves, err = a.store.Moves(ctx, ""); err != nil {
		fail(w, err)
		return
	}
	reply(w, out)
}

// rollouts reads the rollouts and says what each running one waits for,
// as the leader's driver decides it (state.Progress).
func (a *API) rollouts(ctx context.Context, reports map[string]state.Report, broken map[string]string) ([]RolloutStatus, error) {
	rs, err := a.store.Rollouts(ctx)
	if err != nil {
		return nil, err
	}
	var out []RolloutStatus
	for _, r := range rs {
		st := RolloutStatus{Rollout: r}
		if r.State == state.RolloutRunning {
			plans := map[string]state.PlanVersion{}
			for _, n := range r.Nodes {
				if pv, err := a.store.Plan(ctx, n); err == nil {
					plans[n] = pv
				}
			}
			next := state.Progress(r, plans, reports, broken, a.now())
			st.Waiting = next.Waiting
			if next.Step != nil && !next.Refresh {
				st.Waiting = "next: " + state.Describe(next.Step)
			}
		}
		out = append(out, st)
	}
	return out, nil
}

func (a *API) moduleHistory(w http.ResponseWriter, r *http.Request) {
	h, err := a.store.History(r.Context(), r.PathValue("name"))
	if err != nil {
		fail(w, err)
		return
	}
	reply(w, h)
}

// RevertRequest names the version a revert goes back to (0: the one before).
type RevertRequest struct {
	To uint64 `json:"to,omitempty"`
}

func (a *API) revertModule(w http.ResponseWriter, r *http.Request) {
	var req RevertRequest
	if err := decode(r, &req); err != nil {
		fail(w, err)
		return
	}
	a.write(w, r, &state.ModuleRevertRequest{Module: r.PathValue("name"), To: req.To})
}

func (a *API) nodes(w http.ResponseWriter, r *http.Request) {
	nodes, err := a.store.Nodes(r.Context())
	if err != nil {
		fail(w, err)
		return
	}
	reply(w, nodes)
}

// DomainRequest sets or clears a node's public domains (Domains), or adds
// or removes some.
type DomainRequest struct {
	Domain  string   `json:"domain,omitempty"`
	Domains []string `json:"domains,omitempty"`
	Add     []string `json:"add,omitempty"`
	Remove  []string `json:"remove,omitempty"`
}

func (a *API) publicDomain(w http.ResponseWriter, r *http.Request) {
	var req DomainRequest
	if err := decode(r, &req); err != nil {
		fail(w, err)
		return
	}
	if len(req.Domains) > 0 && (len(req.Add) > 0 || len(req.Remove) > 0) {
		fail(w, &state.RuleError{Kind: state.ErrInvalid, Msg: "give the node's domains, or domains to add or remove, not both"})
		return
	}
	pr := &state.PublicDomainRequest{Node: r.PathValue("name"), Domain: req.Domain, Domains: req.Domains, Add: req.Add, Remove: req.Remove}
	// One domain set is the op older binaries apply the same (format 3).
	if len(pr.Domains) == 1 {
		pr.Domain, pr.Domains = pr.Domains[0], nil
	}
	a.write(w, r, pr)
}

// DrainRequest marks a node draining, or (Undo) ends it.
type DrainRequest struct {
	Undo bool `json:"undo,omitempty"`
}

func (a *API) nodeDrain(w http.ResponseWriter, r *http.Request) {
	var req DrainRequest
	if err := decode(r, &req); err != nil {
		fail(w, err)
		return
	}
	a.write(w, r, &state.NodeDrainRequest{Node: r.PathValue("name"), Undo: req.Undo})
}

// ACMERequest sets a node's ACME settings (or, with Clear, the defaults).
type ACMERequest struct {
	state.ACME
	Clear bool `json:"clear,omitempty"`
}

func (a *API) nodeACME(w http.ResponseWriter, r *http.Request) {
	var req ACMERequest
	if err := decode(r, &req); err != nil {
		fail(w, err)
		return
	}
	if !req.Clear {
		if err := req.ACME.CheckFull(); err != nil {
			fail(w, err)
			return
		}
	}
	a.write(w, r, &state.NodeACMERequest{Node: r.PathValue("name"), ACME: req.ACME, Clear: req.Clear})
}

func (a *API) removeNode(w http.ResponseWriter, r *http.Request) {
	name := r.PathValue("name")
	if name == a.id.Name {
		fail(w, &state.RuleError{Kind: state.ErrConflict, Msg: fmt.Sprintf("node %q is the one serving this request; remove it from another node", name)})
		return
	}
	force, _ := strconv.ParseBool(r.URL.Query().Get("force"))
	was, _ := a.store.Node(r.Context(), name)
	var lost []string
	if l, err := a.store.Secrets(r.Context(), ""); err == nil {
		for _, s := range l {
			if len(s.SealedTo) == 1 && s.SealedTo[0] == name {
				lost = append(lost, s.Module+"/"+s.Name)
			}
		}
	}
	rm, err := a.node.RemoveNode(r.Context(), name, force)
	if err != nil {
		fail(w, err)
		return
	}
	idx := rm.Index
	res := WriteResult{Index: idx, Voter: was.Voter, SecretsLost: lost}
	if rm.Told {
		// The leader replaced the join secret a voter held.
		res.Voter, res.JoinSecretRotated, res.JoinSecretError = rm.Voter, rm.Rotated, rm.RotateError
	} else if was.Voter {
		// A leader of before: a new one from here, sealed to the voters
		// left (as this replica knows them once it holds the removal).
		if _, ok := a.waitApplied(r.Context(), idx, readWait); !ok {
			res.JoinSecretError = "this node's replica has not applied the removal yet"
		} else if err := a.rotateJoinSecret(r.Context()); err != nil {
			res.JoinSecretError = err.Error()
		} else {
			res.JoinSecretRotated = true
		}
	}
	reply(w, res)
}

// rotateJoinSecret seals a new join secret to the voters and proposes it,
// on a voter only: a node that makes the secret knows it, and a non-voter
// holds no join secret (the leader refuses its token.rotate).
func (a *API) rotateJoinSecret(ctx context.Context) error {
	id, err := a.store.Identity(ctx)
	if err == nil {
		_, err = a.node.JoinSecret(id)
	}
	if err != nil {
		return fmt.Errorf("this node does not hold the join secret (only voters do: mesh node list shows them), so it does not make the next one: %w", err)
	}
	keys, err := a.store.VoterKeys(ctx)
	if err != nil {
		return err
	}
	sealed, err := a.node.SealToVoters(seal.NewSecret(), keys)
	if err != nil {
		return err
	}
	_, err = a.propose(ctx, &state.TokenRotateRequest{Sealed: sealed})
	return err
}

// rotateCA starts a rotation of the mesh's CA (cluster/rotate.go).
func (a *API) rotateCA(w http.ResponseWriter, r *http.Request) {
	ctx, cancel := context.WithTimeout(r.Context(), cluster.ApplyTimeout)
	defer cancel()
	idx, err := a.node.RotateCA(ctx, "mesh ca rotate")
	if err != nil {
		fail(w, err)
		return
	}
	reply(w, WriteResult{Index: idx})
}

func (a *API) ca(w http.ResponseWriter, r *http.Request) {
	c, err := a.store.CA(r.Context())
	if err != nil {
		fail(w, err)
		return
	}
	reply(w, c)
}

// TokenReply is a join token, and the lines a new machine runs with it to
// join through this node: where mesh is installed (JoinLine), and where it
// is not (InstallLine; empty, with InstallError saying why, when this node
// cannot offer its binary).
type TokenReply struct {
	Token        string `json:"token"`
	Until        string `json:"until,omitempty"` // when it stops joining (RFC 3339); none without --ttl
	JoinLine     string `json:"join_line"`
	InstallLine  string `json:"install_line,omitempty"`
	InstallError string `json:"install_error,omitempty"`
}

// MaxTokenTTL bounds mesh token --ttl (TokenTTLRange says it).
const (
	MaxTokenTTL   = 365 * 24 * time.Hour
	TokenTTLRange = "between 1m and 8760h"
)

// tokenTTL is the request's ttl query (0 when none), checked.
func tokenTTL(r *http.Request) (time.Duration, error) {
	s := r.URL.Query().Get("ttl")
	if s == "" {
		return 0, nil
	}
	ttl, err := time.ParseDuration(s)
	if err != nil || ttl < time.Minute || ttl > MaxTokenTTL {
		return 0, &state.RuleError{Kind: state.ErrInvalid, Msg: fmt.Sprintf("ttl %q: give a duration %s", s, TokenTTLRange)}
	}
	return ttl, nil
}

func (a *API) token(w http.ResponseWriter, r *http.Request) {
	id, err := a.store.Identity(r.Context())
	if err != nil {
		fail(w, err)
		return
	}
	if id.CANextCert != "" {
		fail(w, &state.RuleError{Kind: state.ErrConflict, Msg: "a rotation of the mesh's CA is under way: a token made now would pin the CA it replaces; make one once it ends (mesh status shows it)"})
		return
	}
	ttl, err := tokenTTL(r)
	if err != nil {
		fail(w, err)
		return
	}
	var until int64
	if ttl != 0 {
		until = time.Now().Add(ttl).Unix()
	}
	secret, err := a.node.JoinSecret(id)
	if err != nil {
		fail(w, err)
		return
	}
	token := cluster.Token{MeshID: id.MeshID, CADigest: cluster.CADigest([]byte(id.CACert)), Secret: cluster.TokenSecret(secret, until), Until: until}.String()
	// The new machine reaches this node at its mesh address (the port only
	// when it is not the default).
	peer := a.id.Address
	if a.id.Port != 0 && a.id.Port != cluster.DefaultPort {
		peer = net.JoinHostPort(a.id.Address, strconv.Itoa(a.id.Port))
	}
	out := TokenReply{Token: token, JoinLine: fmt.Sprintf("MESH_TOKEN=%s mesh join %s", token, peer)}
	if until != 0 {
		out.Until = time.Unix(until, 0).UTC().Format(time.RFC3339)
	}
	if out.InstallLine, err = cluster.InstallLine(peer, token, "/usr/local/bin/mesh"); err != nil {
		out.InstallError = err.Error()
	}
	reply(w, out)
}

// rotateToken seals a new join secret to the voters; any node may propose
// it, and only a voter can print the new token.
func (a *API) rotateToken(w http.ResponseWriter, r *http.Request) {
	// A node that could not print the new token does not rotate it.
	if _, err := tokenTTL(r); err != nil {
		fail(w, err)
		return
	}
	if err := a.rotateJoinSecret(r.Context()); err != nil {
		fail(w, err)
		return
	}
	a.token(w, r)
}

func (a *API) modules(w http.ResponseWriter, r *http.Request) {
	mods, err := a.store.Modules(r.Context())
	if err != nil {
		fail(w, err)
		return
	}
	reply(w, mods)
}

func (a *API) module(w http.ResponseWriter, r *http.Request) {
	m, err := a.store.Module(r.Context(), r.PathValue("name"))
	if err != nil {
		fail(w, err)
		return
	}
	reply(w, m)
}

// AddRequest carries manifests to add or replace.
type AddRequest struct {
	Modules []state.ModuleText `json:"modules"`
}

func (r *WriteResult) writtenAt() uint64   { return r.Index }
func (r *RestoreResult) writtenAt() uint64 { return r.Index }

// WriteResult says at which log index a write was applied.
type WriteResult struct {
	Index   uint64   `json:"index"`
	Modules []string `json:"modules,omitempty"`
	// Voter and JoinSecretRotated, on a node removal: the node was a
	// voter (it held the CA key and the join secret), and the join secret
	// was rotated for that (JoinSecretError says why not).
	Voter             bool   `json:"voter,omitempty"`
	JoinSecretRotated bool   `json:"join_secret_rotated,omitempty"`
	JoinSecretError   string `json:"join_secret_error,omitempty"`
	// SecretsLost, on a node removal: the operator's secrets that were
	// sealed to that node alone, which no node can open now.
	SecretsLost []string `json:"secrets_lost,omitempty"`
	// Preview is set, and nothing was written, when a dry run was asked for.
	Preview *state.Preview `json:"preview,omitempty"`
}

func (a *API) addModules(w http.ResponseWriter, r *http.Request) {
	var req AddRequest
	if err := decode(r, &req); err != nil {
		fail(w, err)
		return
	}
	// The proposer parses and checks; the log carries the parsed form.
	c := &state.ModuleAddRequest{}
	var names []string
	var mans []*manifest.Manifest
	for _, mt := range req.Modules {
		sp, err := state.SpecOf(mt.File, mt.Text)
		if err != nil {
			fail(w, &state.RuleError{Kind: state.ErrInvalid, Msg: err.Error()})
			return
		}
		c.Modules = append(c.Modules, sp)
		names = append(names, sp.Manifest.Module)
		mans = append(mans, sp.Manifest)
	}
	// A replaced manifest of an assigned module may consume a new
	// credential: the proposer seals its secret to the nodes that deliver it.
	secrets, err := a.sealed(r.Context(), nil, mans)
	if err != nil {
		fail(w, err)
		return
	}
	c.Secrets = secrets
	a.writeThen(w, r, c, WriteResult{Modules: names})
}

// RestartRequest restarts a module's containers, or one (Container), on
// every node running it or on Node.
type RestartRequest struct {
	Container string `json:"container,omitempty"`
	Node      string `json:"node,omitempty"`
}

func (a *API) restartModule(w http.ResponseWriter, r *http.Request) {
	var req RestartRequest
	if err := decode(r, &req); err != nil {
		fail(w, err)
		return
	}
	a.write(w, r, &state.ModuleRestartRequest{Module: r.PathValue("name"), Container: req.Container, Node: req.Node})
}

func (a *API) pullModule(w http.ResponseWriter, r *http.Request) {
	name := r.PathValue("name")
	rolls, err := a.store.RollsOut(r.Context(), name)
	if err != nil {
		fail(w, err)
		return
	}
	a.write(w, r, &state.ModulePullRequest{Module: name, Rollout: rolls})
}

func (a *API) removeModule(w http.ResponseWriter, r *http.Request) {
	a.write(w, r, &state.ModuleRemoveRequest{Name: r.PathValue("name")})
}

func (a *API) assign(op string) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		var body struct {
			state.Assignment
			// More is further modules on the same node (mesh assign NODE
			// MODULE...): one command, all or none.
			More      []string `json:"more,omitempty"`
			PurgeData []string `json:"purge_data,omitempty"`
		}
		if err := decode(r, &body); err != nil {
			fail(w, err)
			return
		}
		if len(body.More) > maxBatch-1 {
			fail(w, &state.RuleError{Kind: state.ErrInvalid, Msg: fmt.Sprintf("%d modules in one %s: at most %d; split them", len(body.More)+1, op, maxBatch)})
			return
		}
		req := body.Assignment
		if op == state.OpUnassign {
			a.write(w, r, &state.UnassignRequest{Assignment: req, More: body.More, PurgeData: body.PurgeData})
			return
		}
		// The proposer seals a secret for each credential the assign makes
		// some node deliver that it cannot open: a new one, or a rotation
		// when the consumer or the provider moves (the FSM takes it only if
		// the credential is still stale when the command applies).
		c := &state.AssignRequest{Assignment: req, More: body.More}
		secrets, err := a.sealed(r.Context(), c.All(), nil)
		if err != nil {
			fail(w, err)
			return
		}
		c.Secrets = secrets
		a.write(w, r, c)
	}
}

// maxBatch bounds the modules of one assign or unassign: a command is one
// Raft entry, and the operator's command line gives no more.
const maxBatch = 1000

// sealed seals the secrets a command needs, as this replica sees them.
func (a *API) sealed(ctx context.Context, extra []state.Assignment, added []*manifest.Manifest) ([]state.Secret, error) {
	needs, err := a.store.SealNeeds(ctx, extra, added)
	if err != nil {
		return nil, err
	}
	return seal.Secrets(needs)
}

func (a *API) rosterHistory(w http.ResponseWriter, r *http.Request) {
	h, err := a.store.RosterHistory(r.Context(), r.URL.Query().Get("name"))
	if err != nil {
		fail(w, err)
		return
	}
	reply(w, h)
}

func (a *API) roster(w http.ResponseWriter, r *http.Request) {
	ro, err := a.store.Roster(r.Context())
	if err != nil {
		fail(w, err)
		return
	}
	reply(w, ro)
}

// PlansReply is a node's plan history, newest first.
type PlansReply struct {
	Node     string              `json:"node"`
	Error    string              `json:"compose_error,omitempty"`
	Versions []state.PlanVersion `json:"versions"`
	// Kept is how much history the mesh keeps (not set: all of it).
	Kept state.HistoryBound `json:"kept"`
}

func (a *API) historyKeep(w http.ResponseWriter, r *http.Request) {
	var req state.HistoryKeepRequest
	if err := decode(r, &req); err != nil {
		fail(w, err)
		return
	}
	a.write(w, r, &req)
}

func (a *API) plans(w http.ResponseWriter, r *http.Request) {
	node := r.PathValue("node")
	limit, _ := strconv.Atoi(r.URL.Query().Get("limit"))
	n, err := a.store.Node(r.Context(), node)
	if err != nil {
		fail(w, err)
		return
	}
	h, err := a.store.PlanHistory(r.Context(), node, limit)
	if err != nil {
		fail(w, err)
		return
	}
	if h == nil {
		h = []state.PlanVersion{}
	}
	kept, err := a.store.HistoryBound(r.Context())
	if err != nil {
		fail(w, err)
		return
	}
	reply(w, PlansReply{Node: node, Error: n.ComposeError, Versions: h, Kept: kept})
}

// snapshot answers with a consistent copy of the replicated state (one read
// transaction of this node's replica).
func (a *API) snapshot(w http.ResponseWriter, r *http.Request) {
	var b bytes.Buffer
	if err := a.store.WriteSnapshot(r.Context(), &b); err != nil {
		fail(w, err)
		return
	}
	w.Header().Set("Content-Type", "application/json")
	w.Write(b.Bytes())
}

// MaxRestore bounds a snapshot given to restore.
const MaxRestore = 256 << 20

// RestoreRequest is a snapshot's state to put back.
type RestoreRequest struct {
	Restore *state.RestoreBody `json:"restore"`
	// Force restores a snapshot of another mesh.
	Force bool `json:"force,omitempty"`
}

// RestoreResult says where the restore was applied and what it left out.
type RestoreResult struct {
	Index   uint64   `json:"index"`
	Dropped []string `json:"dropped,omitempty"`
	// Unsealed lists the credentials the snapshot held in plain text that
	// no node delivers: left out, never kept in plain text.
	Unsealed []string `json:"unsealed,omitempty"`
}

// restore proposes the snapshot's state through Raft, so every node applies it.
func (a *API) restore(w http.ResponseWriter, r *http.Request) {
	var req RestoreRequest
	dec := json.NewDecoder(http.MaxBytesReader(nil, r.Body, MaxRestore))
	if err := dec.Decode(&req); err != nil || req.Restore == nil {
		fail(w, &state.RuleError{Kind: state.ErrInvalid, Msg: fmt.Sprintf("bad restore request: %v", err)})
		return
	}
	st, err := a.store.Settings(r.Context())
	if err != nil {
		fail(w, err)
		return
	}
	if req.Restore.MeshID != st.MeshID && !req.Force {
		fail(w, &state.RuleError{Kind: state.ErrConflict, Msg: fmt.Sprintf("the snapshot is of mesh %s, and this is mesh %s; pass --force to restore it here anyway", req.Restore.MeshID, st.MeshID)})
		return
	}
	nodes, err := a.store.Nodes(r.Context())
	if err != nil {
		fail(w, err)
		return
	}
	var names []string
	for _, n := range nodes {
		names = append(names, n.Name)
	}
	// A snapshot is text on disk: the proposer parses its manifests.
	if err := req.Restore.ParseSpecs(); err != nil {
		fail(w, &state.RuleError{Kind: state.ErrInvalid, Msg: err.Error()})
		return
	}
	// A secret in plain text in the snapshot is sealed here, to the nodes
	// that deliver it, or left out: the state never holds one in plain text.
	needs, unsealed, err := a.store.PlainNeeds(r.Context(), req.Restore)
	if err != nil {
		fail(w, err)
		return
	}
	sealed, err := seal.Secrets(needs)
	if err != nil {
		fail(w, err)
		return
	}
	byPair := map[state.Pair]state.Secret{}
	for _, sc := range sealed {
		byPair[sc.Pair] = sc
	}
	drop := map[state.Pair]bool{}
	for _, p := range unsealed {
		drop[p] = true
	}
	var creds []state.Secret
	for _, c := range req.Restore.Credentials {
		if c.Sealed != "" {
			c.Value = "" // a sealed row carries no plain copy (a crafted one might)
		}
		if sc, ok := byPair[c.Pair]; ok && c.Sealed == "" {
			c = sc
		}
		if drop[c.Pair] && c.Sealed == "" {
			continue
		}
		creds = append(creds, c)
	}
	req.Restore.Credentials = creds
	idx, err := a.propose(r.Context(), req.Restore)
	if err != nil {
		fail(w, err)
		return
	}
	res := RestoreResult{Index: idx, Dropped: req.Restore.Dropped(names)}
	for _, p := range unsealed {
		res.Unsealed = append(res.Unsealed, p.Consumer+" -> "+p.Provider)
	}
	reply(w, res)
}
