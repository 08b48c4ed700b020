// Package operate is `mesh logs` and `mesh exec` from any node (issue 29,
// "Operating the fleet from any node"): the local API's /v1/logs and
// /v1/exec find, in the replicated plans, the nodes that run what was
// named, and read each node's containers there: this node's through its own
// Podman, another's through that node's peer API (/v1/op/..., mutual TLS,
// members only), the same handlers on both ends.
//
// Logs travel as NDJSON records, one per line, merged by time; exec as a
// websocket whose binary messages carry a one-byte kind (stdin, stdout,
// stderr, end of stdin, a window size, the exit) before their data. The
// agent holds a bounded number of lines per stream and blocks on a slow
// reader, so a container that logs as fast as it can slows only its own
// stream.
package operate

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"sort"
	"strings"

	"mesh/cluster/api"
	"mesh/podman"
	"mesh/reconciler"
	"mesh/state"
	"mesh/state/manifest"
)

// Runtime is what a node's end needs of its Podman.
type Runtime interface {
	Lookup(ctx context.Context, name string) (reconciler.Container, bool, error)
	StreamLogs(ctx context.Context, id string, o podman.LogOptions, each func(podman.LogLine) error) error
	Exec(ctx context.Context, name string, cfg podman.ExecConfig) (Session, error)
}

// Session is a command running in a container (podman.ExecSession).
type Session interface {
	Stdin() io.WriteCloser
	Output(stdout, stderr io.Writer) error
	Resize(ctx context.Context, width, height uint16) error
	ExitCode(ctx context.Context) (int, error)
	Close()
}

// Peers reaches the other nodes' peer APIs.
type Peers interface {
	// PeerAddr is where the node called name listens ("" if unknown).
	PeerAddr(name string) string
	// StreamClient is a mutual-TLS client with no overall timeout (each
	// stream is bounded by its context).
	StreamClient() *http.Client
}

// Server is a node's end of logs and exec.
type Server struct {
	// Node is this node's name.
	Node  string
	Store *state.Store
	RT    Runtime
	Peers Peers
	// StepLogs is the directory of the steps' last runs' lines.
	StepLogs string
	Log      *slog.Logger
	// Stop ends every stream (the agent stops): a follower is not left
	// holding the API's shutdown.
	Stop context.Context
	// Backups runs this node's backups and restores (nil: none).
	Backups Backups
}

// planHolds refuses a container (a step, for its lines) that this node's
// plan does not run: a peer's exec or logs names it as the caller's
// replica resolved it, and Podman takes any name or ID, the mesh's or
// not, so a member could exec into any container of the host (a review).
func (s *Server) planHolds(ctx context.Context, name string, step bool) error {
	pv, err := s.Store.Plan(ctx, s.Node)
	if err != nil && !errors.Is(err, state.ErrNotFound) {
		return err
	}
	if pv.Plan != nil {
		for _, r := range pv.Plan.Resources {
			if !step && r.Kind == manifest.KindContainer && r.Name == name || step && r.Kind == manifest.KindStep && r.RuntimeName() == name {
				return nil
			}
		}
	}
	return notFound("%s is not in %s's plan: a peer reaches only what the mesh runs on this node (a module assigned here a moment ago may not have reached it yet)", name, s.Node)
}

// streamContext is a request's context, ended too when the agent stops.
func (s *Server) streamContext(ctx context.Context) (context.Context, context.CancelFunc) {
	ctx, cancel := context.WithCancel(ctx)
	if s.Stop != nil {
		stop := context.AfterFunc(s.Stop, cancel)
		return ctx, func() { stop(); cancel() }
	}
	return ctx, cancel
}

// PeerHandler serves /v1/op/logs and /v1/op/exec to the mesh's members
// (cluster.Node checks who calls).
func (s *Server) PeerHandler() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("GET /v1/op/logs", s.serveNodeLogs)
	mux.HandleFunc("GET /v1/op/exec", s.serveNodeExec)
	mux.HandleFunc("POST /v1/op/backup", s.serveNodeBackup)
	return mux
}

// LocalHandler serves /v1/logs and /v1/exec on the local API's socket.
func (s *Server) LocalHandler() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("GET /v1/logs", s.serveLogs)
	mux.HandleFunc("GET /v1/exec", s.serveExec)
	mux.HandleFunc("POST /v1/backup", s.serveBackup)
	return mux
}

// httpError is an error with the status the local API answers it with.
type httpError struct {
	code int
	msg  string
}

func (e *httpError) Error() string { return e.msg }

func notFound(format string, a ...any) error {
	return &httpError{http.StatusNotFound, fmt.Sprintf(format, a...)}
}

func badRequest(format string, a ...any) error {
	return &httpError{http.StatusBadRequest, fmt.Sprintf(format, a...)}
}

func writeError(w http.ResponseWriter, err error) {
	code := http.StatusInternalServerError
	var he *httpError
	if errors.As(err, &he) {
		code = he.code
	}
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(code)
	json.NewEncoder(w).Encode(struct {
		Error string `json:"error"`
	}{err.Error()})
}

// sources are the containers (and steps) target names, as the replicated
// plans place them: MODULE is every container of the module, MODULE.NAME
// the container of that name or the step NAME; node, when set, keeps that
// node's. Containers only, when exec.
func (s *Server) sources(ctx context.Context, target, node string, exec bool) ([]api.Source, error) {
	module, _, _ := strings.Cut(target, ".")
	name := ""
	if module != target {
		name = target
	}
	if module == "" {
		return nil, badRequest("name a module, or MODULE.CONTAINER")
	}
	if _, err := s.Store.Module(ctx, module); err != nil {
		return nil, notFound("%v", err)
	}
	nodes, err := s.Store.Nodes(ctx)
	if err != nil {
		return nil, err
	}
	var names []string
	for _, n := range nodes {
		names = append(names, n.Name)
	}
	if node != "" && !contains(names, node) {
		return nil, notFound("no node %q in this mesh (its nodes: %s)", node, strings.Join(names, ", "))
	}
	var out []api.Source
	var runsOn, known []string
	for _, n := range names {
		pv, err := s.Store.Plan(ctx, n)
		if err != nil || pv.Plan == nil {
			continue
		}
		runs := false
		for _, r := range pv.Plan.Resources {
			if r.Module != module {
				continue
			}
			switch {
			case r.Kind == manifest.KindContainer:
				runs = true
				known = appendNew(known, r.Name)
				if (name == "" || r.Name == name) && (node == "" || n == node) {
					out = append(out, api.Source{Node: n, Container: r.Name})
				}
			case r.Kind == manifest.KindStep && !exec:
				known = appendNew(known, r.RuntimeName())
				if name == r.RuntimeName() && (node == "" || n == node) {
					out = append(out, api.Source{Node: n, Container: r.RuntimeName(), Step: true})
				}
			}
		}
		if runs {
			runsOn = append(runsOn, n)
		}
	}
	if len(out) > 0 {
		return out, nil
	}
	switch {
	case len(runsOn) == 0:
		return nil, notFound("module %s runs on no node (mesh assign NODE %s)", module, module)
	case node != "" && !contains(runsOn, node):
		return nil, notFound("module %s does not run on %s (it runs on %s)", module, node, strings.Join(runsOn, ", "))
	case exec && name == "":
		return nil, badRequest("name one container: MODULE.CONTAINER (%s has %s)", module, strings.Join(known, ", "))
	default:
		what := "container"
		if !exec {
			what = "container or step"
		}
		return nil, notFound("module %s has no %s %s (it has %s)", module, what, name, strings.Join(known, ", "))
	}
}

func contains(list []string, s string) bool {
	for _, x := range list {
		if x == s {
			return true
		}
	}
	return false
}

func appendNew(list []string, s string) []string {
	if contains(list, s) {
		return list
	}
	list = append(list, s)
	sort.Strings(list)
	return list
}
