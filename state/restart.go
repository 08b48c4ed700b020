package state

// `mesh restart MODULE[.CONTAINER] [--node NODE]` (issue 29 item 2): a
// recorded command that restarts containers without changing what they
// are. Each container of the plan carries the index of the last restart
// that names it (Resource.Restart, as a pull's); an agent that has not
// handled that index restarts the container once (the same container,
// stopped as Podman stops it and started again), and `mesh why` says who
// asked and when.

// OpModuleRestart records a restart.
const OpModuleRestart = "module.restart"

// ModuleRestartRequest restarts a module's containers, or one of them
// (Container, its runtime name MODULE.NAME), on every node that runs it or
// on Node.
type ModuleRestartRequest struct {
	Module    string `json:"module"`
	Container string `json:"container,omitempty"`
	Node      string `json:"node,omitempty"`
}

func (*ModuleRestartRequest) Op() string { return OpModuleRestart }
func (r *ModuleRestartRequest) describe() string {
	s := "mesh restart " + r.Module
	if r.Container != "" {
		s = "mesh restart " + r.Container
	}
	if r.Node != "" {
		s += " --node " + r.Node
	}
	return s
}

// RestartKey is one recorded restart's scope: "" container or node is all.
type RestartKey struct{ Module, Container, Node string }

func (ap *applier) moduleRestart(r *ModuleRestartRequest) (bool, error) {
	tx := ap.tx
	if err := needModule(tx, r.Module, "mesh module list"); err != nil {
		return false, err
	}
	cat, err := ap.catalogue()
	if err != nil {
		return false, err
	}
	var names []string
	found := false
	for _, res := range cat[r.Module].Resources {
		if res.Container != "" {
			names = append(names, res.Container)
			found = found || res.Container == r.Container
		}
	}
	switch {
	case len(names) == 0:
		return false, ruleErr(ErrInvalid, "module %s has no container: there is nothing to restart", r.Module)
	case r.Container != "" && !found:
		return false, ruleErr(ErrNotFound, "module %s has no container %q (it has %s)", r.Module, r.Container, orNone(names))
	}
	q, args := `SELECT node FROM assignments WHERE module = ? ORDER BY node`, []any{r.Module}
	if r.Node != "" {
		if err := needNode(tx, r.Node); err != nil {
			return false, err
		}
		q, args = `SELECT node FROM assignments WHERE module = ? AND node = ?`, []any{r.Module, r.Node}
	}
	nodes, err := listRows(tx, q, args...)
	if err != nil {
		return false, err
	}
	if len(nodes) == 0 {
		if r.Node != "" {
			return false, ruleErr(ErrConflict, "module %s is not assigned to node %s: there is nothing to restart there", r.Module, r.Node)
		}
		return false, ruleErr(ErrConflict, "module %s is assigned to no node: there is nothing to restart", r.Module)
	}
	ap.markRestart(RestartKey{Module: r.Module, Container: r.Container, Node: r.Node})
	return true, exec(tx, `INSERT INTO restarts (module, container, node, idx) VALUES (?, ?, ?, ?)
		ON CONFLICT (module, container, node) DO UPDATE SET idx = excluded.idx`, r.Module, r.Container, r.Node, ap.index)
}

// restartOf is the last restart that names container name of mod on node.
//
// The scopes that name it are four keys (the module; the container; the
// module on node; the container on node), looked up: a walk of every
// restart the fleet was ever given, per container composed, grew with the
// fleet (issue "scale").
func (in *Input) restartOf(mod, name, node string) uint64 {
	var idx uint64
	for _, k := range [...]RestartKey{{mod, "", ""}, {mod, name, ""}, {mod, "", node}, {mod, name, node}} {
		idx = max(idx, in.Restarts[k])
	}
	return idx
}
