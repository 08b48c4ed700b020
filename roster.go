package main

import (
	"errors"
	"fmt"
	"mesh/state"
	"text/tabwriter"
	"time"
)

// RosterCmd shows the names.
type RosterCmd struct {
	JSON    bool   `name:"json" help:"Print JSON."`
	History bool   `help:"When each name appeared, moved or went, and the command that caused it (oldest first)."`
	Name    string `arg:"" optional:"" help:"With --history: only this name."`
}

// Run prints the roster, or its history.
func (c *RosterCmd) Run(g *Globals) error {
	ctx, cancel := timeout()
	defer cancel()
	if c.Name != "" && !c.History {
		return usageError{errors.New("a NAME goes with --history (mesh resolve NAME asks the resolver)")}
	}
	if c.History {
		h, err := g.client().RosterHistory(ctx, c.Name)
		if err != nil {
			return err
		}
		if c.JSON {
			return printJSON(g.out, h)
		}
		if len(h) == 0 {
			fmt.Fprintln(g.out, "no changes recorded (the history starts with this mesh version; a state restored from an older snapshot has none before it)")
			return nil
		}
		tw := tabwriter.NewWriter(g.out, 0, 4, 2, ' ', 0)
		fmt.Fprintln(tw, "INDEX\tTIME\tCHANGE\tNAME\tADDRESS\tNODE\tCAUSE")
		for i, e := range h {
			what := map[string]string{"+": "appeared", "-": "went"}[e.Op]
			// A name that went from one address and appeared at another
			// in the same command moved.
			for j := max(0, i-3); j < min(len(h), i+4); j++ {
				if j != i && h[j].Index == e.Index && h[j].Name == e.Name && h[j].Op != e.Op {
					what = map[string]string{"+": "moved to", "-": "moved from"}[e.Op]
				}
			}
			at := e.At
			if t, err := time.Parse(time.RFC3339Nano, e.At); err == nil {
				at = t.Local().Format("2006-01-02 15:04:05")
			}
			fmt.Fprintf(tw, "%d\t%s\t%s\t%s\t%s\t%s\t%s\n", e.Index, at, what, e.Name, e.Address, e.Node, e.Cause)
		}
		return tw.Flush()
	}
	ro, err := g.client().Roster(ctx)
	if err != nil {
		return err
	}
	if c.JSON {
		if ro == nil {
			ro = []state.Name{}
		}
		return printJSON(g.out, ro)
	}
	tw := tabwriter.NewWriter(g.out, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "NAME\tADDRESS\tNODE")
	for _, n := range ro {
		fmt.Fprintf(tw, "%s\t%s\t%s\n", n.Name, n.Address, n.Node)
	}
	return tw.Flush()
}
