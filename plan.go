package main

import (
	"errors"
	"fmt"
	"io"
	"mesh/cluster/api"
	"mesh/state"
	"text/tabwriter"
	"time"
)

// PlanCmd shows a node's plan.
type PlanCmd struct {
	Node    string `arg:"" predictor:"node" help:"The node."`
	Diff    bool   `help:"Show what changed between the last two plan versions."`
	History bool   `help:"List every plan version, newest first."`
	JSON    bool   `name:"json" help:"Print JSON."`
}

// Run prints the plan, its diff or its history.
func (c *PlanCmd) Run(g *Globals) error {
	if c.Diff && c.History {
		return usageError{errors.New("give --diff or --history, not both")}
	}
	ctx, cancel := timeout()
	defer cancel()
	limit := 1
	if c.Diff {
		limit = 2
	}
	if c.History {
		limit = 0
	}
	p, err := g.client().Plans(ctx, c.Node, limit)
	if err != nil {
		return err
	}
	w := g.out
	if c.Diff {
		var older, newer *state.Plan
		if len(p.Versions) > 0 {
			newer = p.Versions[0].Plan
		}
		if len(p.Versions) > 1 {
			older = p.Versions[1].Plan
		}
		changes := state.Diff(older, newer)
		if c.JSON {
			return printJSON(w, changes)
		}
		switch len(p.Versions) {
		case 0:
			fmt.Fprintf(w, "%s has no plan yet\n", c.Node)
		case 1:
			fmt.Fprintf(w, "%s: v%d is its first plan (%s)\n", c.Node, p.Versions[0].Version, p.Versions[0].Cause)
		default:
			fmt.Fprintf(w, "%s: v%d -> v%d (%s)\n", c.Node, p.Versions[1].Version, p.Versions[0].Version, p.Versions[0].Cause)
		}
		for _, ch := range changes {
			fmt.Fprintln(w, ch.String())
		}
		printComposeError(w, p)
		return nil
	}
	if c.JSON {
		return printJSON(w, p)
	}
	if c.History {
		tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
		fmt.Fprintln(tw, "VERSION\tWHEN\tDIGEST\tRESOURCES\tCAUSE")
		for _, v := range p.Versions {
			fmt.Fprintf(tw, "v%d\t%s\t%.12s\t%d\t%s\n", v.Version, v.CreatedAt.Format(time.RFC3339), v.Digest, len(v.Plan.Resources), v.Cause)
		}
		tw.Flush()
		switch {
		case !p.Kept.Set:
			fmt.Fprintln(w, "kept: every version (a mesh made before the bound; mesh history keep sets one)")
		case len(p.Versions) > 0:
			oldest := p.Versions[len(p.Versions)-1]
			fmt.Fprintf(w, "kept: the last %d versions younger than %d days (the newest always); the kept history starts at v%d, %s\n",
				p.Kept.Versions, p.Kept.Days, oldest.Version, oldest.CreatedAt.Format(time.RFC3339))
		}
		printComposeError(w, p)
		return nil
	}
	if len(p.Versions) == 0 {
		fmt.Fprintf(w, "%s has no plan yet\n", c.Node)
		printComposeError(w, p)
		return nil
	}
	v := p.Versions[0]
	fmt.Fprintf(w, "%s: plan v%d, digest %.12s, %s (%s)\n", c.Node, v.Version, v.Digest, v.CreatedAt.Format(time.RFC3339), v.Cause)
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	for _, r := range v.Plan.Resources {
		fmt.Fprintf(tw, "  %s\t%s\t(%s)\n", r.Kind, r.Name, r.Module)
	}
	tw.Flush()
	if st, err := g.client().Status(ctx); err == nil {
		for _, n := range st.Nodes {
			if n.Name == c.Node && n.Report != nil {
				fmt.Fprintf(w, "last apply: plan v%d at %s, %d mutations (Podman calls and file writes)\n", n.Report.Version, n.Report.AppliedAt.Format(time.RFC3339), n.Report.Mutations)
				printOutcomes(w, n.Report)
				if n.Report.Error != "" {
					fmt.Fprintf(w, "  failed: %s\n", n.Report.Error)
				}
			}
		}
	}
	if len(v.Plan.Routes) > 0 {
		fmt.Fprintln(w, "routes:")
		for _, r := range v.Plan.Routes {
			fmt.Fprintf(w, "  %s -> %s:%d\n", r.Name, r.Module, r.Port)
		}
	}
	printComposeError(w, p)
	return nil
}

func printComposeError(w io.Writer, p api.PlansReply) {
	if p.Error != "" {
		fmt.Fprintf(w, "error: the plan does not compose; the node keeps the plan above:\n  %s\n", p.Error)
	}
}
