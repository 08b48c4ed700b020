package api

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"syscall"
	"time"

	"mesh/cluster"
	"mesh/state"
)

// ErrNoAgent: nothing serves the data dir's socket.
var ErrNoAgent = errors.New("no agent is running")

// Client talks to the local agent over its unix socket.
type Client struct {
	dir    string
	http   *http.Client
	dryRun bool
	// linearizable asks every read to be linearizable (LinearizableParam).
	linearizable bool
	// written is the log index of this client's last write: every read
	// after it asks the agent to answer only once its replica holds it
	// (shared with the DryRun copy).
	written *atomic.Uint64
}

// DryRun is a client whose writes are previews: the agent answers what each
// would do (WriteResult.Preview) and writes nothing.
func (c *Client) DryRun() *Client {
	cp := *c
	cp.dryRun = true
	return &cp
}

// Linearizable is a client whose reads are linearizable: answered by the
// leader only (another node answers an ErrNoLeader error), once a barrier
// it proposed has committed with a quorum.
func (c *Client) Linearizable() *Client {
	cp := *c
	cp.linearizable = true
	return &cp
}

// NewClient makes a client for the agent of the data dir.
func NewClient(dataDir string) *Client {
	sock := filepath.Join(dataDir, cluster.SocketFile)
	return &Client{dir: dataDir, written: new(atomic.Uint64), http: &http.Client{
		// A read may wait for the caller's own write (min_index) and then
		// block (index), MaxWait each.
		Timeout: 2*MaxWait + 10*time.Second,
		Transport: &http.Transport{DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			var d net.Dialer
			return d.DialContext(ctx, "unix", sock)
		}},
	}}
}

// Streams is a client of the agent's socket with no overall timeout, for
// the streams of logs and exec (each bounded by its context).
func (c *Client) Streams() *http.Client {
	return &http.Client{Transport: c.http.Transport}
}

func (c *Client) do(ctx context.Context, method, path string, body, out any) error {
	var rd io.Reader
	if body != nil {
		b, err := json.Marshal(body)
		if err != nil {
			return err
		}
		rd = bytes.NewReader(b)
	}
	sep := "?"
	if strings.Contains(path, "?") {
		sep = "&"
	}
	if c.dryRun && method != http.MethodGet {
		path += sep + DryRunParam + "=1"
	} else if w := c.written.Load(); method == http.MethodGet && w > 0 {
		path += fmt.Sprintf("%s%s=%d", sep, MinIndexParam, w)
		sep = "&"
	}
	if c.linearizable && method == http.MethodGet {
		path += sep + LinearizableParam + "=1"
	}
	req, err := http.NewRequestWithContext(ctx, method, "http://mesh"+path, rd)
	if err != nil {
		return err
	}
	resp, err := c.http.Do(req)
	if err != nil {
		if errors.Is(err, syscall.ENOENT) || errors.Is(err, syscall.ECONNREFUSED) || errors.Is(err, os.ErrNotExist) {
			return fmt.Errorf("%w for data dir %s (no socket at %s); start it with `mesh agent --data-dir %s`", ErrNoAgent, c.dir, filepath.Join(c.dir, cluster.SocketFile), c.dir)
		}
		if errors.Is(err, syscall.EACCES) {
			return fmt.Errorf("cannot reach the agent's socket in %s: permission denied (run as the agent's user)", c.dir)
		}
		return fmt.Errorf("talk to the agent: %w", err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(io.LimitReader(resp.Body, 64<<20))
	if err != nil {
		return fmt.Errorf("read the agent's answer: %w", err)
	}
	if resp.StatusCode >= 300 {
		var e apiError
		if json.Unmarshal(b, &e) == nil && e.Error != "" {
			return errors.New(e.Error)
		}
		return fmt.Errorf("agent answered %s", resp.Status)
	}
	if out != nil {
		if err := json.Unmarshal(b, out); err != nil {
			return err
		}
		if w, ok := out.(interface{ writtenAt() uint64 }); ok {
			c.wrote(w.writtenAt())
		}
	}
	return nil
}

// wrote records a write at index, for the reads that follow it.
func (c *Client) wrote(index uint64) {
	for {
		old := c.written.Load()
		if index <= old || c.written.CompareAndSwap(old, index) {
			return
		}
	}
}

// CA reads the mesh's CA and any rotation of it under way.
func (c *Client) CA(ctx context.Context) (state.CAStatus, error) {
	var s state.CAStatus
	return s, c.do(ctx, "GET", "/v1/ca", nil, &s)
}

// RotateCA starts a rotation of the mesh's CA.
func (c *Client) RotateCA(ctx context.Context) (WriteResult, error) {
	var r WriteResult
	return r, c.do(ctx, "POST", "/v1/ca/rotate", nil, &r)
}

// Status reads the mesh's status as this node sees it.
func (c *Client) Status(ctx context.Context) (Status, error) {
	var s Status
	return s, c.do(ctx, "GET", "/v1/status", nil, &s)
}

// StatusAfter is a blocking read of the status: the agent answers once its
// replica has applied an entry past index, or after wait (at most MaxWait).
func (c *Client) StatusAfter(ctx context.Context, index uint64, wait time.Duration) (Status, error) {
	var s Status
	return s, c.do(ctx, "GET", fmt.Sprintf("/v1/status?index=%d&wait=%s", index, wait), nil, &s)
}

// Nodes lists the mesh's nodes.
func (c *Client) Nodes(ctx context.Context) ([]state.NodeInfo, error) {
	var n []state.NodeInfo
	return n, c.do(ctx, "GET", "/v1/nodes", nil, &n)
}

// Modules lists the catalogue.
func (c *Client) Modules(ctx context.Context) ([]state.ModuleInfo, error) {
	var m []state.ModuleInfo
	return m, c.do(ctx, "GET", "/v1/modules", nil, &m)
}

// Module reads one catalogue entry.
func (c *Client) Module(ctx context.Context, name string) (state.ModuleInfo, error) {
	var m state.ModuleInfo
	return m, c.do(ctx, "GET", "/v1/modules/"+url.PathEscape(name), nil, &m)
}

// Roster reads every name the mesh answers.
func (c *Client) Roster(ctx context.Context) ([]state.Name, error) {
	var r []state.Name
	return r, c.do(ctx, "GET", "/v1/roster", nil, &r)
}

// RosterHistory lists when names appeared or went (only name's if set).
func (c *Client) RosterHistory(ctx context.Context, name string) ([]state.RosterEvent, error) {
	var h []state.RosterEvent
	return h, c.do(ctx, "GET", "/v1/roster/history?name="+url.QueryEscape(name), nil, &h)
}

// AddModules adds or replaces manifests.
func (c *Client) AddModules(ctx context.Context, req AddRequest) (WriteResult, error) {
	var r WriteResult
	return r, c.do(ctx, "POST", "/v1/modules", req, &r)
}

// PullModule asks every node running the module to pull its images and
// replace the containers whose image changed.
// RestartModule restarts a module's containers (or one) on every node
// running it (or on one).
func (c *Client) RestartModule(ctx context.Context, name string, req RestartRequest) (WriteResult, error) {
	var r WriteResult
	return r, c.do(ctx, "POST", "/v1/modules/"+url.PathEscape(name)+"/restart", req, &r)
}

// RevertModule gives a module back an earlier version (or stops its rollout).
func (c *Client) RevertModule(ctx context.Context, name string, req RevertRequest) (WriteResult, error) {
	var r WriteResult
	return r, c.do(ctx, "POST", "/v1/modules/"+url.PathEscape(name)+"/revert", req, &r)
}

// ModuleHistory lists a module's versions, the newest first.
func (c *Client) ModuleHistory(ctx context.Context, name string) ([]state.Version, error) {
	var h []state.Version
	return h, c.do(ctx, "GET", "/v1/modules/"+url.PathEscape(name)+"/history", nil, &h)
}

func (c *Client) PullModule(ctx context.Context, name string) (WriteResult, error) {
	var r WriteResult
	return r, c.do(ctx, "POST", "/v1/modules/"+url.PathEscape(name)+"/pull", nil, &r)
}

// RemoveModule removes a module from the catalogue.
func (c *Client) RemoveModule(ctx context.Context, name string) (WriteResult, error) {
	var r WriteResult
	return r, c.do(ctx, "DELETE", "/v1/modules/"+url.PathEscape(name), nil, &r)
}

// Assign assigns (op "assign") or unassigns (op "unassign") a module.
func (c *Client) Assign(ctx context.Context, op, node, module string) (WriteResult, error) {
	return c.AssignAll(ctx, op, node, []string{module})
}

// AssignAll assigns (op "assign") or unassigns (op "unassign") modules on
// one node in one command: all or none.
func (c *Client) AssignAll(ctx context.Context, op, node string, modules []string) (WriteResult, error) {
	var r WriteResult
	if len(modules) == 0 {
		return r, errors.New("no module given")
	}
	body := map[string]any{"node": node, "module": modules[0]}
	if len(modules) > 1 {
		body["more"] = modules[1:]
	}
	return r, c.do(ctx, "POST", "/v1/"+op, body, &r)
}

// HistoryKeep sets how much history the mesh keeps.
func (c *Client) HistoryKeep(ctx context.Context, versions, days int) (WriteResult, error) {
	var r WriteResult
	return r, c.do(ctx, "POST", "/v1/history/keep", state.HistoryKeepRequest{Versions: versions, Days: days}, &r)
}

// Unassign takes module off node; purge names the module's data
// directories the node removes with all they hold (--purge-data).
func (c *Client) Unassign(ctx context.Context, node, module string, purge []string) (WriteResult, error) {
	var r WriteResult
	return r, c.do(ctx, "POST", "/v1/unassign", map[string]any{"node": node, "module": module, "purge_data": purge}, &r)
}

// PublicDomain sets a node's public domains (none clears them), or adds or
// removes those of req.
func (c *Client) PublicDomain(ctx context.Context, node string, req DomainRequest) (WriteResult, error) {
	var r WriteResult
	return r, c.do(ctx, "PUT", "/v1/nodes/"+url.PathEscape(node)+"/public-domain", req, &r)
}

// Drain marks a node draining, or (undo) ends it.
func (c *Client) Drain(ctx context.Context, node string, undo bool) (WriteResult, error) {
	var r WriteResult
	return r, c.do(ctx, "PUT", "/v1/nodes/"+url.PathEscape(node)+"/drain", DrainRequest{Undo: undo}, &r)
}

// ACME sets a node's ACME settings.
func (c *Client) ACME(ctx context.Context, node string, req ACMERequest) (WriteResult, error) {
	var r WriteResult
	return r, c.do(ctx, "PUT", "/v1/nodes/"+url.PathEscape(node)+"/acme", req, &r)
}

// RemoveNode removes a node from the mesh.
func (c *Client) RemoveNode(ctx context.Context, node string, force bool) (WriteResult, error) {
	var r WriteResult
	q := ""
	if force {
		q = "?force=true"
	}
	return r, c.do(ctx, "DELETE", "/v1/nodes/"+url.PathEscape(node)+q, nil, &r)
}

// Plans reads a node's plan history (limit 0: all).
func (c *Client) Plans(ctx context.Context, node string, limit int) (PlansReply, error) {
	var r PlansReply
	return r, c.do(ctx, "GET", fmt.Sprintf("/v1/plans/%s?limit=%d", url.PathEscape(node), limit), nil, &r)
}

// Token reads (rotate: first replaces) the join token and the lines that
// join with it; one made with a ttl (0: none) stops joining once it has
// passed.
func (c *Client) Token(ctx context.Context, rotate bool, ttl time.Duration) (TokenReply, error) {
	var r TokenReply
	q := ""
	if ttl != 0 {
		q = "?ttl=" + url.QueryEscape(ttl.String())
	}
	if rotate {
		return r, c.do(ctx, "POST", "/v1/token/rotate"+q, struct{}{}, &r)
	}
	return r, c.do(ctx, "GET", "/v1/token"+q, nil, &r)
}

// Snapshot reads a consistent copy of the replicated state (JSON).
func (c *Client) Snapshot(ctx context.Context) ([]byte, error) {
	var raw json.RawMessage
	if err := c.do(ctx, "GET", "/v1/snapshot", nil, &raw); err != nil {
		return nil, err
	}
	return raw, nil
}

// Restore puts a snapshot's state back, through Raft. It is bounded by
// ctx alone: a large state takes longer than the client's own bound
// (cluster.LargeWrite).
func (c *Client) Restore(ctx context.Context, req RestoreRequest) (RestoreResult, error) {
	var r RestoreResult
	unbound := *c
	unbound.http = c.Streams()
	return r, unbound.do(ctx, "POST", "/v1/snapshot/restore", req, &r)
}

// WebTokenRequest asks the node's web page for a one-time login link
// (TTL 0: the page's default).
type WebTokenRequest struct {
	TTL time.Duration `json:"ttl,omitempty"`
}

// WebTokenReply is a login link and when it stops working.
type WebTokenReply struct {
	URL     string    `json:"url"`
	Expires time.Time `json:"expires"`
	// Fingerprint is the SHA-256 of the page's certificate when it is
	// served over TLS: check it in the browser once.
	Fingerprint string `json:"fingerprint,omitempty"`
}

// WebLogoutReply says how many of the page's sessions a logout ended.
type WebLogoutReply struct {
	Sessions int `json:"sessions"`
}

// WebToken asks for a one-time link that logs a browser in to the node's
// web page (mesh web token).
func (c *Client) WebToken(ctx context.Context, ttl time.Duration) (WebTokenReply, error) {
	var r WebTokenReply
	return r, c.do(ctx, "POST", "/v1/web/token", WebTokenRequest{TTL: ttl}, &r)
}

// WebLogout ends every session of the node's web page and every link not
// used yet (mesh web logout --all).
func (c *Client) WebLogout(ctx context.Context) (WebLogoutReply, error) {
	var r WebLogoutReply
	return r, c.do(ctx, "POST", "/v1/web/logout", struct{}{}, &r)
}
