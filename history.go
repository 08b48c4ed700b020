package main

import (
	"fmt"

	"mesh/state"
)

// HistoryCmd sets how much history the mesh keeps.
type HistoryCmd struct {
	Keep HistoryKeepCmd `cmd:"" help:"Keep, per node, module and name, the last N versions of its history that are younger than D days (the newest always); the rest is pruned on every replica alike."`
}

// HistoryKeepCmd is mesh history keep.
type HistoryKeepCmd struct {
	Versions int `default:"100" help:"Versions kept of each node's plans, each module's manifests and each name's roster events (10 to 100000)."`
	Days     int `default:"90" help:"Days a version is kept, the newest always (1 to 36500)."`
}

// Run sets it.
func (c *HistoryKeepCmd) Run(g *Globals) error {
	if c.Versions < state.MinHistoryVersions || c.Versions > state.MaxHistoryVersions {
		return usageError{fmt.Errorf("--versions %d is not between %d and %d", c.Versions, state.MinHistoryVersions, state.MaxHistoryVersions)}
	}
	if c.Days < 1 || c.Days > state.MaxHistoryDays {
		return usageError{fmt.Errorf("--days %d is not between 1 and %d", c.Days, state.MaxHistoryDays)}
	}
	ctx, cancel := timeout()
	defer cancel()
	r, err := g.writer(false).HistoryKeep(ctx, c.Versions, c.Days)
	if err != nil {
		return err
	}
	fmt.Fprintf(g.out, "the mesh keeps the last %d versions younger than %d days of each history (log index %d)\n", c.Versions, c.Days, r.Index)
	return nil
}
