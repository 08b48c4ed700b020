package main

import (
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"text/tabwriter"
	"time"

	"mesh/cluster/api"
	"mesh/state"
)

// ModuleHistoryCmd lists a module's versions (issue 29).
type ModuleHistoryCmd struct {
	Name string `arg:"" name:"MODULE" predictor:"module" help:"The module."`
	JSON bool   `name:"json" help:"Print JSON."`
}

// Run prints the versions, the newest first, with the command that made each.
func (c *ModuleHistoryCmd) Run(g *Globals) error {
	ctx, cancel := timeout()
	defer cancel()
	h, err := g.client().ModuleHistory(ctx, c.Name)
	if err != nil {
		return err
	}
	if c.JSON {
		return json.NewEncoder(g.out).Encode(h)
	}
	tw := tabwriter.NewWriter(g.out, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "VERSION\tDIGEST\tWHEN\tBY\t")
	for _, v := range h {
		mark := ""
		if v.Current {
			mark = " (current)"
		}
		cause := v.Cause
		if cause == "" {
			cause = "(before the history was kept)"
		}
		fmt.Fprintf(tw, "%d%s\t%s\t%s\t%s\t\n", v.Version, mark, short(v.Digest), v.At.Local().Format(time.DateTime), cause)
	}
	return tw.Flush()
}

func short(s string) string {
	if len(s) > 12 {
		return s[:12]
	}
	return s
}

// ModuleRevertCmd gives a module back an earlier version.
type ModuleRevertCmd struct {
	Name    string        `arg:"" name:"MODULE" predictor:"module" help:"The module."`
	To      uint64        `placeholder:"VERSION" help:"The version to go back to (mesh module history MODULE); default: the one before the current."`
	Wait    bool          `help:"Return when the rollout back has ended; exit 1 if it stopped."`
	Timeout time.Duration `default:"10m" help:"How long --wait waits."`
	DryRun  bool          `name:"dry-run" help:"Print, per node, what the revert would change; write nothing."`
}

// Run records the revert: the earlier manifest as a new version, rolled out
// as any change; during a rollout, it stops it and every node goes back.
func (c *ModuleRevertCmd) Run(g *Globals) error {
	ctx, cancel := timeout()
	defer cancel()
	r, err := g.writer(c.DryRun).RevertModule(ctx, c.Name, api.RevertRequest{To: c.To})
	if err != nil {
		return err
	}
	if r.Preview != nil {
		return printPreview(g, r.Preview)
	}
	fmt.Fprintf(g.out, "reverted %s (log index %d)\n", c.Name, r.Index)
	if !c.Wait {
		return nil
	}
	return waitAndRollouts(g, []string{c.Name}, r.Index, c.Timeout)
}

// waitAndRollouts waits for the nodes the command at index changed, then
// for the rollouts it started: a first node that fails its health check
// is the rollout's to stop and revert, and what the rollout says of it is
// the answer.
func waitAndRollouts(g *Globals, modules []string, index uint64, limit time.Duration) error {
	werr := waitChanged(g, index, limit)
	if err := waitRollouts(g, modules, index, limit); err != nil {
		return err
	}
	return werr
}

// waitRollouts follows the rollouts the command at index started, for the
// modules named, until they end; it fails when one stopped.
func waitRollouts(g *Globals, modules []string, index uint64, limit time.Duration) error {
	deadline := time.Now().Add(limit)
	shown := map[string]string{}
	after := g.follow()
	for {
		st, err := after.next(deadline)
		if err != nil {
			return err
		}
		running := 0
		var errs []string
		for _, r := range st.Rollouts {
			if !contains(modules, r.Module) || r.StartedAt.IsZero() || r.StepIndex < index && r.To < index {
				continue
			}
			line := ""
			name, before, after := rolloutWords(r.Rollout)
			switch r.State {
			case state.RolloutRunning:
				running++
				line = fmt.Sprintf("%s: %s", name, r.Waiting)
			case state.RolloutDone:
				line = fmt.Sprintf("%s done: %s", name, printable(r.Reason))
			case state.RolloutReverted:
				if r.StepIndex == index && r.Reason == "stopped by mesh module revert" {
					// This very command stopped it: what was asked is done.
					line = fmt.Sprintf("%s stopped; every node is back on %s", name, before)
					break
				}
				errs = append(errs, fmt.Sprintf("%s stopped and reverted to %s: %s", name, before, printable(r.Reason)))
			case state.RolloutFailed:
				errs = append(errs, fmt.Sprintf("%s stopped (the nodes it reached keep %s): %s", name, after, printable(r.Reason)))
			}
			if line != "" && shown[r.Module] != line {
				fmt.Fprintln(g.out, line)
				shown[r.Module] = line
			}
		}
		if running == 0 {
			if len(errs) > 0 {
				return errors.New(strings.Join(errs, "\n"))
			}
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("the rollout did not end within %s (mesh status shows where it is)", limit)
		}
	}
}

func contains(list []string, s string) bool {
	for _, x := range list {
		if x == s {
			return true
		}
	}
	return false
}

// renderRollouts is status's part on rollouts: running ones, and the last
// stopped ones with their reason.
func renderRollouts(w *strings.Builder, rs []api.RolloutStatus) {
	for _, r := range rs {
		name, before, after := rolloutWords(r.Rollout)
		switch r.State {
		case state.RolloutRunning:
			fmt.Fprintf(w, "%s (from %s): %s\n", name, before, r.Waiting)
		case state.RolloutReverted:
			fmt.Fprintf(w, "%s failed and was reverted to %s: %s\n", name, before, printable(r.Reason))
		case state.RolloutFailed:
			fmt.Fprintf(w, "%s failed and stopped (%s keep %s, the others %s): %s\n", name, strings.Join(r.Reached, ", "), after, before, printable(r.Reason))
		}
	}
}

// rolloutWords names a rollout, what it goes from and what it goes to:
// "rollout of gitea to v812", "v790", "v812"; for a secret's new value
// "rollout of gitea's secret smtp (v812)", "the value before", "the new value".
func rolloutWords(r state.Rollout) (name, before, after string) {
	name = state.RolloutName(r.Module, r.To, r.Secret)
	if r.Secret != "" {
		return name, "the value before", "the new value"
	}
	return name, fmt.Sprintf("v%d", r.From), fmt.Sprintf("v%d", r.To)
}
