package operate

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync"
	"time"

	"mesh/cluster/api"
	"mesh/state/manifest"
)

// Backups is a node's end of mesh backup and mesh restore (the agent's
// restic runner): it runs req on this node.
type Backups interface {
	Run(ctx context.Context, req api.BackupRequest, progress func(string)) (api.BackupResult, error)
}

// maxBackupBody bounds a request's body.
const maxBackupBody = 64 << 10

// backupRequest reads r's request, answering the error itself when it is
// bad or this agent runs no backups.
func (s *Server) backupRequest(w http.ResponseWriter, r *http.Request) (api.BackupRequest, bool) {
	req, err := readBackupRequest(r)
	if err == nil && s.Backups == nil {
		err = errors.New("this agent runs no backups")
	}
	if err != nil {
		writeError(w, err)
		return req, false
	}
	return req, true
}

func readBackupRequest(r *http.Request) (api.BackupRequest, error) {
	var req api.BackupRequest
	if err := json.NewDecoder(io.LimitReader(r.Body, maxBackupBody)).Decode(&req); err != nil {
		return req, badRequest("the request does not decode: %v", err)
	}
	switch req.Op {
	case api.BackupRun, api.BackupRestore, api.BackupList, api.BackupSize:
	default:
		return req, badRequest("unknown backup op %q", req.Op)
	}
	if req.Module == "" || len(req.Module) > 63 {
		return req, badRequest("name a module")
	}
	return req, nil
}

// events writes a stream of events, one at a time.
type events struct {
	mu sync.Mutex
	w  http.ResponseWriter
	f  http.Flusher
}

func newEvents(w http.ResponseWriter) *events {
	w.Header().Set("Content-Type", "application/x-ndjson")
	w.WriteHeader(http.StatusOK)
	f, _ := w.(http.Flusher)
	if f != nil {
		f.Flush() // the caller knows at once that this node took it
	}
	return &events{w: w, f: f}
}

func (e *events) send(ev api.BackupEvent) error {
	e.mu.Lock()
	defer e.mu.Unlock()
	b, err := json.Marshal(ev)
	if err != nil {
		return err
	}
	if _, err := e.w.Write(append(b, '\n')); err != nil {
		return err
	}
	if e.f != nil {
		e.f.Flush()
	}
	return nil
}

// serveBackup is the local API's /v1/backup: the op on each node that
// holds the module's data (a list on this node: every node can read the
// repository), one node after the other.
func (s *Server) serveBackup(w http.ResponseWriter, r *http.Request) {
	req, ok := s.backupRequest(w, r)
	if !ok {
		return
	}
	var err error
	ctx, cancel := s.streamContext(r.Context())
	defer cancel()
	var nodes []string
	if req.Op == api.BackupList {
		// Listed where the module's data is (a repository at a local path
		// is that node's own), or here when it is nowhere now.
		if _, err := s.Store.Module(ctx, req.Module); err != nil {
			writeError(w, notFound("%v", err))
			return
		}
		if nodes, err = s.dataNodes(ctx, req.Module, ""); err != nil {
			nodes = []string{s.Node}
		}
	} else if nodes, err = s.dataNodes(ctx, req.Module, req.Node); err != nil {
		writeError(w, err)
		return
	}
	if req.Op == api.BackupRestore && len(nodes) > 1 {
		writeError(w, badRequest("module %s holds data on %s: name one with --node", req.Module, strings.Join(nodes, ", ")))
		return
	}
	ev := newEvents(w)
	for _, n := range nodes {
		one := req
		one.Node = n
		if n == s.Node {
			s.runHere(ctx, one, ev)
		} else if err := s.runThere(ctx, one, ev); err != nil {
			ev.send(api.BackupEvent{Node: n, Error: err.Error()})
		}
	}
}

// runHere runs req on this node, its progress and end sent as events.
func (s *Server) runHere(ctx context.Context, req api.BackupRequest, ev *events) {
	res, err := s.Backups.Run(ctx, req, func(p string) { ev.send(api.BackupEvent{Node: s.Node, Progress: p}) })
	if err != nil {
		ev.send(api.BackupEvent{Node: s.Node, Error: err.Error()})
		return
	}
	ev.send(api.BackupEvent{Node: s.Node, Result: &res})
}

// runThere runs req on another node through its peer API, relaying its
// events.
func (s *Server) runThere(ctx context.Context, req api.BackupRequest, ev *events) error {
	addr := s.Peers.PeerAddr(req.Node)
	if addr == "" {
		return fmt.Errorf("node %s: no address is known for it", req.Node)
	}
	b, err := json.Marshal(req)
	if err != nil {
		return err
	}
	hctx, hcancel := context.WithCancel(ctx)
	defer hcancel()
	timer := time.AfterFunc(10*time.Second, hcancel)
	hr, err := http.NewRequestWithContext(hctx, http.MethodPost, "https://"+addr+"/v1/op/backup", strings.NewReader(string(b)))
	if err != nil {
		return err
	}
	resp, err := s.Peers.StreamClient().Do(hr)
	if !timer.Stop() && err == nil {
		resp.Body.Close()
		err = errors.New("no answer within 10s")
	}
	if err != nil {
		return fmt.Errorf("node %s did not answer (%s): %v", req.Node, addr, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("node %s: %s", req.Node, api.ErrorBody(resp))
	}
	ended := false
	err = api.ReadBackupEvents(resp.Body, "node "+req.Node, func(e api.BackupEvent) error {
		e.Node = req.Node // a node speaks for itself only
		ended = ended || e.Result != nil || e.Error != ""
		return ev.send(e)
	})
	if err == nil && !ended {
		err = fmt.Errorf("node %s ended its stream without a result", req.Node)
	}
	return err
}

// serveNodeBackup is a node's /v1/op/backup: req on this node.
func (s *Server) serveNodeBackup(w http.ResponseWriter, r *http.Request) {
	req, ok := s.backupRequest(w, r)
	if !ok {
		return
	}
	if req.Node != s.Node {
		writeError(w, badRequest("this is node %s, not %s", s.Node, req.Node))
		return
	}
	ctx, cancel := s.streamContext(r.Context())
	defer cancel()
	s.runHere(ctx, req, newEvents(w))
}

// dataNodes are the nodes whose plans hold module's data directories (only
// node, when set).
func (s *Server) dataNodes(ctx context.Context, module, node string) ([]string, error) {
	if _, err := s.Store.Module(ctx, module); err != nil {
		return nil, notFound("%v", err)
	}
	nodes, err := s.Store.Nodes(ctx)
	if err != nil {
		return nil, err
	}
	var all, out []string
	for _, n := range nodes {
		all = append(all, n.Name)
		pv, err := s.Store.Plan(ctx, n.Name)
		if err != nil || pv.Plan == nil {
			continue
		}
		for _, res := range pv.Plan.Resources {
			if res.Module == module && res.Kind == manifest.KindDirectory && res.Decl.Data {
				out = append(out, n.Name)
				break
			}
		}
	}
	if node != "" && !contains(all, node) {
		return nil, notFound("no node %q in this mesh (its nodes: %s)", node, strings.Join(all, ", "))
	}
	if len(out) == 0 {
		return nil, notFound("module %s holds data on no node: it declares no data directory (directory: ... with data: true), or runs nowhere (mesh assign NODE %s)", module, module)
	}
	if node != "" {
		if !contains(out, node) {
			return nil, notFound("module %s holds no data on %s (it does on %s)", module, node, strings.Join(out, ", "))
		}
		return []string{node}, nil
	}
	return out, nil
}
