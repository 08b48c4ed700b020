package main

import (
	"fmt"
	"strings"
	"time"

	"mesh/cluster/api"
)

// RestartCmd restarts a module's containers (issue 29 item 2).
type RestartCmd struct {
	Target  string        `arg:"" name:"MODULE[.CONTAINER]" predictor:"module" help:"The module, or one of its containers (e.g. gitea.server)."`
	Node    string        `predictor:"node" help:"Only on this node."`
	Wait    bool          `help:"Return when the nodes have restarted them and their health checks pass; exit 1 if either fails."`
	Timeout time.Duration `default:"5m" help:"How long --wait waits."`
	DryRun  bool          `name:"dry-run" help:"Print, per node, the containers that would restart; write nothing."`
}

// Run records the restart; each node running them restarts them once.
func (c *RestartCmd) Run(g *Globals) error {
	module, container := splitTarget(c.Target)
	ctx, cancel := timeout()
	defer cancel()
	r, err := g.writer(c.DryRun).RestartModule(ctx, module, api.RestartRequest{Container: container, Node: c.Node})
	if err != nil {
		return err
	}
	if r.Preview != nil {
		return printPreview(g, r.Preview)
	}
	where := "every node running it"
	if c.Node != "" {
		where = c.Node
	}
	fmt.Fprintf(g.out, "%s restarts on %s (log index %d)\n", c.Target, where, r.Index)
	if !c.Wait {
		return nil
	}
	return waitChanged(g, r.Index, c.Timeout)
}

// splitTarget reads MODULE[.CONTAINER]: the module, and the container's
// name as its manifest declares it (MODULE.NAME, the usual form); "" for
// all of the module's.
func splitTarget(s string) (module, container string) {
	if m, _, ok := strings.Cut(s, "."); ok {
		return m, s
	}
	return s, ""
}
