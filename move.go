package main

import (
	"errors"
	"fmt"
	"strings"
	"time"

	"mesh/cluster/api"
	"mesh/state"
)

// MoveCmd is mesh move (issue 30, item 4).
type MoveCmd struct {
	Module  string        `arg:"" predictor:"module" help:"The module to move."`
	From    string        `arg:"" optional:"" predictor:"node" help:"The node it runs on now."`
	To      string        `arg:"" optional:"" predictor:"node" help:"The node to run it on."`
	Finish  bool          `help:"After a move: remove the old node's copy of the module's data (mesh move --finish MODULE); after an aborted one, forget it."`
	Abort   bool          `help:"End a move that has not finished: the module runs on the old node again, as before (mesh move --abort MODULE)."`
	DryRun  bool          `name:"dry-run" help:"Say what would be copied (files and bytes) and what each node's plan would do; change nothing."`
	Timeout time.Duration `default:"1h" help:"How long to wait for the copy and the new instance's health checks before the move is aborted."`
	JSON    bool          `name:"json" help:"Print the move's end as JSON."`
}

// Run starts the move and follows it to its end: done (the module runs on
// TO, healthy; FROM keeps its copy) or aborted (it runs on FROM again).
func (c *MoveCmd) Run(g *Globals) error {
	switch {
	case c.Finish && c.Abort:
		return usageError{errors.New("--finish and --abort do not go together")}
	case c.Finish || c.Abort:
		if c.From != "" {
			return usageError{fmt.Errorf("mesh move --finish or --abort takes the module only: mesh move --%s %s", map[bool]string{true: "finish", false: "abort"}[c.Finish], c.Module)}
		}
		return c.end(g)
	case c.To == "":
		return usageError{errors.New("name the module, the node it runs on and the node to move it to: mesh move MODULE FROM TO")}
	}
	if c.DryRun {
		return c.preview(g)
	}
	ctx, cancel := timeout()
	r, err := g.client().MoveModule(ctx, c.Module, c.From, c.To)
	cancel()
	if err != nil {
		return err
	}
	fmt.Fprintf(g.out, "moving %s from %s to %s (log index %d): %s stops it, copies its data to %s, which starts it\n", c.Module, c.From, c.To, r.Index, c.From, c.To)
	return c.follow(g, r.Index)
}

// follow prints the move's phases until it ends, aborting it at the
// timeout.
func (c *MoveCmd) follow(g *Globals, id uint64) error {
	deadline := time.Now().Add(c.Timeout)
	after := g.follow()
	last := ""
	for {
		st, err := after.next(deadline)
		if err != nil {
			return err
		}
		var mv *state.MoveInfo
		for i := range st.Moves {
			if st.Moves[i].Module == c.Module && st.Moves[i].ID == id {
				mv = &st.Moves[i]
			}
		}
		if mv == nil {
			return fmt.Errorf("the move of %s is no longer in the state (finished, or replaced by another)", c.Module)
		}
		if mv.Phase != last {
			last = mv.Phase
			switch mv.Phase {
			case state.MoveCopy:
				fmt.Fprintf(g.out, "%s: stopping %s and copying %s to %s ...\n", mv.From, c.Module, strings.Join(mv.Data, ", "), mv.To)
			case state.MoveStart:
				fmt.Fprintf(g.out, "%s: %s\n", mv.From, printable(mv.Reason))
				fmt.Fprintf(g.out, "%s: starting %s, waiting for its health checks ...\n", mv.To, c.Module)
			}
		}
		switch mv.Phase {
		case state.MoveDone:
			if c.JSON {
				return printJSON(g.out, mv)
			}
			fmt.Fprintf(g.out, "%s: %s\n", mv.To, printable(mv.Reason))
			fmt.Fprintf(g.out, "moved %s to %s; %s keeps its copy of %s until mesh move --finish %s\n", c.Module, mv.To, mv.From, strings.Join(mv.Data, ", "), c.Module)
			return nil
		case state.MoveAborted:
			if c.JSON {
				printJSON(g.out, mv)
			}
			return fmt.Errorf("the move of %s was aborted; it runs on %s again, as before: %s", c.Module, mv.From, mv.Reason)
		}
		if time.Now().After(deadline) {
			ctx, cancel := timeout()
			_, err := g.client().MoveStep(ctx, state.MoveStepRequest{Module: c.Module, ID: id, From: mv.Phase, To: state.MoveAborted, Reason: fmt.Sprintf("it did not end within --timeout %s", c.Timeout)})
			cancel()
			if err != nil {
				return fmt.Errorf("the move of %s did not end within %s, and its abort failed: %w", c.Module, c.Timeout, err)
			}
			return fmt.Errorf("the move of %s did not end within %s: aborted; it runs on %s again", c.Module, c.Timeout, mv.From)
		}
	}
}

// end finishes or aborts the module's move.
func (c *MoveCmd) end(g *Globals) error {
	ctx, cancel := timeout()
	defer cancel()
	st, err := g.status()
	if err != nil {
		return err
	}
	var mv *state.MoveInfo
	for i := range st.Moves {
		if st.Moves[i].Module == c.Module {
			mv = &st.Moves[i]
		}
	}
	if mv == nil {
		return fmt.Errorf("module %s has no move to %s", c.Module, map[bool]string{true: "finish", false: "abort"}[c.Finish])
	}
	req := state.MoveStepRequest{Module: c.Module, ID: mv.ID, Finish: c.Finish}
	if c.Abort {
		req.From, req.To, req.Reason = mv.Phase, state.MoveAborted, "aborted by mesh move --abort"
	}
	r, err := g.client().MoveStep(ctx, req)
	if err != nil {
		return err
	}
	switch {
	case c.Finish && mv.Phase == state.MoveAborted:
		fmt.Fprintf(g.out, "forgot the aborted move of %s (log index %d)\n", c.Module, r.Index)
	case c.Finish:
		fmt.Fprintf(g.out, "%s removes its copy of %s (%s) (log index %d)\n", mv.From, c.Module, strings.Join(mv.Data, ", "), r.Index)
	default:
		fmt.Fprintf(g.out, "aborted the move of %s: it runs on %s again (log index %d)\n", c.Module, mv.From, r.Index)
	}
	return nil
}

// preview says what the move would copy, measured on FROM, and what the
// plans would do at its first phase.
func (c *MoveCmd) preview(g *Globals) error {
	results, err := runBackup(g, api.BackupRequest{Op: api.BackupSize, Module: c.Module, Node: c.From}, 10*time.Minute, false)
	if err != nil && !strings.Contains(err.Error(), "holds data on no node") && !strings.Contains(err.Error(), "holds no data") {
		return err
	}
	ctx, cancel := timeout()
	defer cancel()
	r, perr := g.client().DryRun().MoveModule(ctx, c.Module, c.From, c.To)
	if perr != nil {
		return perr
	}
	if len(results) == 0 {
		fmt.Fprintf(g.out, "%s declares no data directory: the move only stops it on %s and starts it on %s\n", c.Module, c.From, c.To)
	}
	for _, res := range results {
		fmt.Fprintf(g.out, "would copy %s from %s to %s: %d files, %s\n", strings.Join(res.Dirs, ", "), c.From, c.To, res.Files, bytesText(uint64(res.Bytes)))
	}
	if r.Preview != nil {
		return printPreview(g, r.Preview)
	}
	return nil
}
