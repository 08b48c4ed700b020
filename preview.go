package main

import (
	"fmt"
	"mesh/state"
)

// printPreview prints what a write would do; nothing was written.
func printPreview(g *Globals, p *state.Preview) error {
	fmt.Fprintf(g.out, "dry run at log index %d: nothing was written\n", p.Index)
	if len(p.Nodes) == 0 && len(p.Names) == 0 {
		fmt.Fprintln(g.out, "no node's plan and no name would change")
		return nil
	}
	for _, n := range p.Nodes {
		fmt.Fprintf(g.out, "%s:\n", n.Node)
		if n.ComposeError != "" {
			fmt.Fprintf(g.out, "  ! its plan would stop composing (it keeps its last good plan): %s\n", n.ComposeError)
		}
		for _, a := range n.Actions {
			fmt.Fprintf(g.out, "  %s\n", a)
		}
	}
	if len(p.Names) > 0 {
		fmt.Fprintln(g.out, "names:")
		for _, c := range p.Names {
			fmt.Fprintf(g.out, "  %s %s -> %s\n", c.Op, c.Name, c.Address)
		}
	}
	return nil
}
