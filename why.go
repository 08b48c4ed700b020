package main

import (
	"fmt"

	"mesh/state"
)

// WhyCmd explains a resource's last change.
type WhyCmd struct {
	Node     string `arg:"" predictor:"node" help:"The node."`
	Resource string `arg:"" help:"A path, a container, or a step (STEP or MODULE.STEP)."`
	JSON     bool   `name:"json" help:"Print JSON."`
}

// Run finds the plan version that last changed the resource, the command
// that made it, and what moved, down to the input whose digest changed;
// then what the node's last apply did with it.
func (c *WhyCmd) Run(g *Globals) error {
	ctx, cancel := timeout()
	defer cancel()
	p, err := g.client().Plans(ctx, c.Node, 0)
	if err != nil {
		return err
	}
	e, err := state.Explain(c.Node, p.Versions, c.Resource)
	if err != nil {
		return err
	}
	st, err := g.client().Status(ctx)
	if err != nil {
		return err
	}
	var last *state.ResourceReport
	var lastVersion uint64
	for _, n := range st.Nodes {
		if n.Name != c.Node || n.Report == nil {
			continue
		}
		lastVersion = n.Report.Version
		for i, r := range n.Report.Resources {
			if r.Name == c.Resource || r.Name == e.Module+"."+c.Resource { // a step reports MODULE.STEP
				last = &n.Report.Resources[i]
			}
		}
	}
	if c.JSON {
		return printJSON(g.out, struct {
			*state.Explanation
			LastApply *state.ResourceReport `json:"last_apply,omitempty"`
		}{e, last})
	}
	fmt.Fprint(g.out, e)
	if last != nil {
		line := string(last.Outcome)
		if last.Reason != "" {
			line += "; " + printable(last.Reason)
		}
		fmt.Fprintf(g.out, "last apply on %s (plan v%d): %s\n", c.Node, lastVersion, line)
	}
	return nil
}
