package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"mesh/cluster/api"
	"mesh/state"
	"sort"
	"strings"
	"time"
)

// waitChanged waits for every node whose plan the write at index changed to
// apply it, and for the health checks of the containers that apply changed.
func waitChanged(g *Globals, index uint64, limit time.Duration) error {
	st, err := g.status()
	if err != nil {
		return err
	}
	var errs []string
	waited := 0
	for _, n := range st.Nodes {
		if n.PlanVersion != index {
			continue
		}
		waited++
		if err := waitApplied(g, n.Name, "", index, limit); err != nil {
			errs = append(errs, err.Error())
		}
	}
	if waited == 0 {
		fmt.Fprintln(g.out, "no node's plan changed; nothing to wait for")
	}
	if len(errs) > 0 {
		return errors.New(strings.Join(errs, "\n"))
	}
	return nil
}

// waitApplied follows the node's reports until it applied version, or
// failed. With a module, only that module's failure fails the wait; other
// modules' failures on the node are printed. Each read is a blocking query:
// the agent answers once its replica moved past what the last answer showed
// (a report is a replicated write), so nothing is polled.
func waitApplied(g *Globals, node, module string, version uint64, limit time.Duration) error {
	fmt.Fprintf(g.out, "waiting for %s to apply plan v%d ...\n", node, version)
	start := time.Now().Add(-time.Second) // a little slack for clocks
	deadline := time.Now().Add(limit)
	gated := ""
	after := g.follow()
	for {
		st, err := after.next(deadline)
		if err != nil {
			return err
		}
		for _, n := range st.Nodes {
			if n.Name != node || n.Report == nil || n.Report.Version < version {
				continue
			}
			if n.Report.Error != "" && n.Report.AppliedAt.Before(start) {
				continue // a failure from before this command; wait for the retry
			}
			if f := n.Report.UnsetSecret(); f != nil && (module == "" || f.Module == module) {
				// Only an operator ends this wait: say so now.
				return fmt.Errorf("%s applied plan v%d up to %s, which waits for secret %s: %s", node, n.Report.Version, f.Resource, f.Secret, printable(f.Reason))
			}
			if f := n.Report.Failed(module); n.Report.OnlyGates() && (module == "" || f != nil) {
				// A wait (a health gate, a secret sealed, a backup that
				// reads): the node goes on as they change; say so once
				// per reason.
				if n.Report.Error != gated {
					gated = n.Report.Error
					fmt.Fprintf(g.out, "%s: %s\n", node, printableLines(gated, "\n  "))
				}
				if time.Now().After(deadline) {
					what := "at a health gate"
					if n.Report.OnlyBackups() {
						what = "for a backup to have read"
					}
					return fmt.Errorf("%s still waits %s after %s:\n  %s", node, what, limit, printableLines(gated, "\n  "))
				}
				continue
			}
			if n.Report.Error != "" && (module == "" || n.Report.Failed(module) != nil || len(n.Report.Failures) == 0) {
				return fmt.Errorf("%s failed to apply plan v%d:\n  %s", node, n.Report.Version, printableLines(n.Report.Error, "\n  "))
			}
			printOutcomes(g.out, n.Report)
			if n.Report.Error != "" {
				others := "failed"
				if n.Report.OnlyGates() {
					others = "wait"
				}
				fmt.Fprintf(g.out, "%s applied plan v%d for %s; other modules there %s:\n  %s\n", node, n.Report.Version, module, others, strings.ReplaceAll(n.Report.Error, "\n", "\n  "))
			} else {
				fmt.Fprintf(g.out, "%s applied plan v%d\n", node, n.Report.Version)
			}
			return waitHealthy(g, node, module, n.Report, deadline)
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%s did not apply plan v%d within %s; `mesh status` shows its last report (is its agent running?)", node, version, limit)
		}
	}
}

// waitHealthy waits until every health-checked container that the apply of
// rep created, replaced or restarted (of module, when given) is healthy; it fails once
// one is unhealthy (Podman says so only after the start period and the
// retries), naming the check and its output.
func waitHealthy(g *Globals, node, module string, rep *state.Report, deadline time.Time) error {
	changed := map[string]bool{}
	for _, rr := range rep.Resources {
		if rr.Kind == "container" && (rr.Outcome == "created" || rr.Outcome == state.Replaced || rr.Outcome == state.Restarted) && (module == "" || rr.Module == module) {
			changed[rr.Name] = true
		}
	}
	return waitChecks(g, node, changed, rep, deadline)
}

// waitChecks waits until those of containers that rep says have a health
// check are healthy, in reports from rep's apply on; it fails once one is
// unhealthy.
func waitChecks(g *Globals, node string, changed map[string]bool, rep *state.Report, deadline time.Time) error {
	wait := map[string]bool{}
	for _, h := range rep.Health {
		if changed[h.Container] {
			wait[h.Container] = true
		}
	}
	if len(wait) == 0 {
		return nil
	}
	names := make([]string, 0, len(wait))
	for n := range wait {
		names = append(names, n)
	}
	sort.Strings(names)
	fmt.Fprintf(g.out, "waiting for the health checks of %s ...\n", strings.Join(names, ", "))
	after := g.follow()
	for {
		st, err := after.next(deadline)
		if err != nil {
			return err
		}
		healthy := 0
		for _, n := range st.Nodes {
			if n.Name != node || n.Report == nil || n.Report.AppliedAt.Before(rep.AppliedAt) {
				continue // (an apply of before: its containers' health is not theirs)
			}
			for _, h := range n.Report.Health {
				if !wait[h.Container] {
					continue
				}
				switch h.Status {
				case state.HealthHealthy:
					healthy++
				case state.HealthUnhealthy:
					return fmt.Errorf("%s on %s is unhealthy: its health check %s failed %d time(s) in a row; last output: %q (mesh status shows it; podman healthcheck run %s runs it by hand)",
						h.Container, node, checkOf(g, node, h.Container), h.FailingStreak, h.Output, h.Container)
				}
			}
		}
		if healthy == len(wait) {
			fmt.Fprintf(g.out, "healthy: %s\n", strings.Join(names, ", "))
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("the health checks of %s on %s did not pass before the --timeout; mesh status shows them", strings.Join(names, ", "), node)
		}
	}
}

// checkOf is a container's declared health check command, for messages.
func checkOf(g *Globals, node, container string) string {
	ctx, cancel := timeout()
	defer cancel()
	p, err := g.client().Plans(ctx, node, 1)
	if err != nil || len(p.Versions) == 0 || p.Versions[0].Plan == nil {
		return "(unknown)"
	}
	for _, r := range p.Versions[0].Plan.Resources {
		if r.RuntimeName() == container && r.Typed.Health != nil {
			b, _ := json.Marshal(r.Typed.Health.Command)
			return string(b)
		}
	}
	return "(unknown)"
}

// printOutcomes prints a report's changes, one line each.
func printOutcomes(w io.Writer, r *state.Report) {
	for _, rr := range r.Resources {
		if rr.Outcome == state.Unchanged {
			continue
		}
		line := fmt.Sprintf("  %s %s (%s): %s", rr.Kind, printable(rr.Name), rr.Module, rr.Outcome)
		if rr.Reason != "" {
			line += "; " + printable(rr.Reason)
		}
		fmt.Fprintln(w, line)
	}
}

// follower reads the status as it changes: each next is a blocking query
// that the agent answers once its replica has applied more than the last
// answer showed, or when the deadline (at most api.MaxWait away) passes.
type follower struct {
	g     *Globals
	index uint64
	first bool
}

func (g *Globals) follow() *follower { return &follower{g: g, first: true} }

func (f *follower) next(deadline time.Time) (api.Status, error) {
	wait := time.Duration(0)
	if !f.first {
		wait = min(max(time.Until(deadline), 0), api.MaxWait)
	}
	f.first = false
	ctx, cancel := context.WithTimeout(context.Background(), wait+30*time.Second)
	defer cancel()
	st, err := f.g.client().StatusAfter(ctx, f.index, wait)
	if err == nil {
		f.index = st.AppliedIndex
	}
	return st, err
}
