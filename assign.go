package main

import (
	"fmt"
	"mesh/state"
	"time"
)

// AssignCmd assigns a module to a node.
type AssignCmd struct {
	Node    string        `arg:"" predictor:"node" help:"The node."`
	Module  string        `arg:"" predictor:"module" help:"The module."`
	Wait    bool          `help:"Return when the node has applied the new plan and the health checks of the containers it changed pass; exit 1 if either fails."`
	Timeout time.Duration `default:"5m" help:"How long --wait waits."`
	DryRun  bool          `name:"dry-run" help:"Print, per node, what would be created, replaced (and why), run again or removed, and which names would change; write nothing."`
}

// Run assigns it.
func (c *AssignCmd) Run(g *Globals) error {
	return assign(g, state.OpAssign, c.Node, c.Module, c.Wait, c.DryRun, c.Timeout)
}

// UnassignCmd unassigns a module from a node.
type UnassignCmd struct {
	Node    string        `arg:"" predictor:"node" help:"The node."`
	Module  string        `arg:"" predictor:"module" help:"The module."`
	Wait    bool          `help:"Return when the node has applied the new plan and the health checks of the containers it changed pass; exit 1 if either fails."`
	Timeout time.Duration `default:"5m" help:"How long --wait waits."`
	DryRun  bool          `name:"dry-run" help:"Print, per node, what would be created, replaced (and why), run again or removed, and which names would change; write nothing."`
}

// Run unassigns it.
func (c *UnassignCmd) Run(g *Globals) error {
	return assign(g, state.OpUnassign, c.Node, c.Module, c.Wait, c.DryRun, c.Timeout)
}

func assign(g *Globals, op, node, module string, wait, dryRun bool, limit time.Duration) error {
	ctx, cancel := timeout()
	defer cancel()
	r, err := g.writer(dryRun).Assign(ctx, op, node, module)
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
	fmt.Fprintf(g.out, verb+" (log index %d)\n", module, node, r.Index)
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
	return waitApplied(g, node, module, p.Versions[0].Version, limit)
}
