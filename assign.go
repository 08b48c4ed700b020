package main

import (
	"bufio"
	"fmt"
	"io"
	"mesh/cluster/api"
	"mesh/state"
	"mesh/state/manifest"
	"os"
	"strings"
	"time"

	"golang.org/x/term"
)

// AssignCmd assigns a module to a node.
type AssignCmd struct {
	Node    string        `arg:"" predictor:"node" help:"The node."`
	Modules []string      `arg:"" name:"module" predictor:"module" help:"The modules: several make one command, all or none."`
	Wait    bool          `help:"Return when the node has applied the new plan and the health checks of the containers it changed pass; exit 1 if either fails."`
	Timeout time.Duration `default:"5m" help:"How long --wait waits."`
	DryRun  bool          `name:"dry-run" help:"Print, per node, what would be created, replaced (and why), run again or removed, and which names would change; write nothing."`
}

// Run assigns it.
func (c *AssignCmd) Run(g *Globals) error {
	return assign(g, state.OpAssign, c.Node, c.Modules, c.Wait, c.DryRun, c.Timeout)
}

// UnassignCmd unassigns a module from a node.
type UnassignCmd struct {
	Node      string        `arg:"" predictor:"node" help:"The node."`
	Modules   []string      `arg:"" name:"module" predictor:"module" help:"The modules: several make one command, all or none."`
	Wait      bool          `help:"Return when the node has applied the new plan and the health checks of the containers it changed pass; exit 1 if either fails."`
	Timeout   time.Duration `default:"5m" help:"How long --wait waits."`
	DryRun    bool          `name:"dry-run" help:"Print, per node, what would be created, replaced (and why), run again or removed, and which names would change; write nothing."`
	PurgeData bool          `name:"purge-data" help:"Also remove the module's data directories (data: true) on NODE, with everything in them, once its containers there are gone; says which and asks first (type the module's name), or takes --yes. Without it data directories are always kept."`
	Yes       bool          `help:"With --purge-data: do not ask."`
}

// Run unassigns it.
func (c *UnassignCmd) Run(g *Globals) error {
	if c.Yes && !c.PurgeData {
		return usageError{fmt.Errorf("--yes confirms --purge-data, which was not given")}
	}
	var purge []string
	if c.PurgeData {
		if len(c.Modules) > 1 {
			return usageError{fmt.Errorf("--purge-data takes one module at a time; nothing was changed")}
		}
		var err error
		if purge, err = c.confirmPurge(g); err != nil {
			return err
		}
	}
	return assign(g, state.OpUnassign, c.Node, c.Modules, c.Wait, c.DryRun, c.Timeout, purge...)
}

// confirmPurge lists the module's data directories, says they go from NODE
// with all they hold, and asks (unless --yes or --dry-run).
func (c *UnassignCmd) confirmPurge(g *Globals) ([]string, error) {
	ctx, cancel := timeout()
	defer cancel()
	module := c.Modules[0]
	m, err := g.client().Module(ctx, module)
	if err != nil {
		return nil, err
	}
	pm, err := manifest.Parse(m.File, []byte(m.Manifest))
	if err != nil {
		return nil, err
	}
	data := pm.DataDirs()
	if len(data) == 0 {
		return nil, usageError{fmt.Errorf("module %s declares no data directory (data: true), so --purge-data has nothing to remove; nothing was changed", module)}
	}
	fmt.Fprintf(g.out, "--purge-data removes from %s, with everything in them, once %s's containers there are gone:\n  %s\n", c.Node, module, strings.Join(data, "\n  "))
	if c.Yes || c.DryRun {
		return data, nil
	}
	if !term.IsTerminal(int(os.Stdin.Fd())) {
		return nil, usageError{fmt.Errorf("not asked: the input is not a terminal; pass --yes to remove them; nothing was changed")}
	}
	fmt.Fprintf(g.out, "type the module's name (%s) to remove them: ", module)
	line, _ := bufio.NewReader(io.LimitReader(os.Stdin, 1024)).ReadString('\n')
	if strings.TrimSpace(line) != module {
		return nil, fmt.Errorf("not confirmed; nothing was changed")
	}
	return data, nil
}

func assign(g *Globals, op, node string, modules []string, wait, dryRun bool, limit time.Duration, purge ...string) error {
	ctx, cancel := timeout()
	defer cancel()
	var r api.WriteResult
	var err error
	switch {
	case op == state.OpUnassign && len(purge) > 0:
		r, err = g.writer(dryRun).Unassign(ctx, node, modules[0], purge)
	default:
		r, err = g.writer(dryRun).AssignAll(ctx, op, node, modules)
	}
	if err != nil {
		return err
	}
	if r.Preview != nil {
		return printPreview(g, r.Preview)
	}
	verb := "assigned %s to %s"
	if op == state.OpUnassign {
		verb = "unassigned %s from %s"
	}
	fmt.Fprintf(g.out, verb+" (log index %d)\n", strings.Join(modules, ", "), node, r.Index)
	p, err := g.client().Plans(ctx, node, 1)
	if err != nil {
		return err
	}
	if p.Error != "" {
		if wait {
			return fmt.Errorf("the plan of %s does not compose, so there is nothing new to apply: %s", node, p.Error)
		}
		fmt.Fprintf(g.out, "warning: the plan of %s does not compose; it keeps its last good plan:\n  %s\n", node, p.Error)
	}
	if !wait || len(p.Versions) == 0 {
		return nil
	}
	module := ""
	if len(modules) == 1 {
		module = modules[0] // several: wait for the node's whole plan
	}
	return waitApplied(g, node, module, p.Versions[0].Version, limit)
}
