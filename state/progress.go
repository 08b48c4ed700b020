package state

import (
	"fmt"
	"slices"
	"strings"
	"time"

	"mesh/state/manifest"
)

// Next is what a running rollout does now: a step to propose, or what it
// waits for (status shows it, the driver logs it when it changes).
type Next struct {
	Step    *RolloutStepRequest
	Waiting string
	// Refresh: Step reaches no node anew; a reached node waits for a
	// backup to have read, and the step starts the deadline again
	// (Waiting says what it waits for).
	Refresh bool
	// backupOn is the reached node that waits for a backup, if any, and
	// backupSince since when it waits.
	backupOn    string
	backupSince time.Time
}

// Progress decides a running rollout's next step from its nodes' plans and
// reports, at now. It is pure: every node shows the same progress from the
// same state, and the leader's driver proposes what it returns.
//
// A reached node is ready when it has applied its current plan and every
// container of the module there that declares a health check has been
// healthy for the policy's healthy-for (one without: the time since the
// step); it fails when its apply failed for the module, a container of it
// is unhealthy, or one exited since the rollout started.
//
// A reached node whose plan does not compose (it keeps its old plan) fails
// the rollout; so does a wait longer than ProgressDeadline since the last
// step (a reached node that is down, a container that never starts). A
// reached node whose module waits for a backup to have read its directory
// (a backup without pause reads for hours), while every other reached node
// is ready, does not use up the deadline for BackupWaitLimit from when the
// node first saw the wait: every RefreshEvery of such a wait, the step is
// taken again for that node (a step that reaches no node anew starts the
// deadline again, with the FSM of any release), so that what follows the
// wait has a deadline of nearly its own.
func Progress(r Rollout, plans map[string]PlanVersion, reports map[string]Report, composeErrors map[string]string, now time.Time) Next {
	next := progress(r, plans, reports, composeErrors, now)
	if next.Step == nil && next.backupOn != "" && now.Sub(next.backupSince) < BackupWaitLimit {
		if now.Sub(r.StepAt) > RefreshEvery {
			next.Step = &RolloutStepRequest{Module: r.Module, To: r.To, Reach: []string{next.backupOn}, Secret: r.Secret,
				Why: fmt.Sprintf("%s still waits for a backup to have read; the step's deadline of %s starts again", next.backupOn, ProgressDeadline)}
			next.Refresh = true
		}
		return next
	}
	if next.Step == nil && now.Sub(r.StepAt) > ProgressDeadline {
		return failed(r, fmt.Sprintf("no progress for %s: %s", ProgressDeadline, next.Waiting))
	}
	return next
}

// ProgressDeadline bounds how long a rollout waits on the nodes of a step.
const ProgressDeadline = 10 * time.Minute

// RefreshEvery is how often a step that waits for a backup is taken again.
const RefreshEvery = time.Minute

// BackupWaitLimit bounds how long a step's deadline starts again for a
// node's backup: from when the node first saw the wait (ModuleFailure.Since;
// an older mesh's report: its time). A node that went down while it waited
// keeps saying it, and one whose fence is never lifted waits on. Six hours,
// a scheduled backup's own limit.
const BackupWaitLimit = 6 * time.Hour

// backupWait is a reached node that waits for a backup, what it says, and
// since when its report says so.
type backupWait struct {
	on, why string
	since   time.Time
}

func progress(r Rollout, plans map[string]PlanVersion, reports map[string]Report, composeErrors map[string]string, now time.Time) Next {
	var reached, left []string
	for _, n := range r.Nodes {
		if slices.Contains(r.Reached, n) {
			reached = append(reached, n)
		} else {
			left = append(left, n)
		}
	}
	progress := fmt.Sprintf("%d/%d nodes", len(reached), len(r.Nodes))
	least := time.Duration(-1)
	var backup backupWait // the first reached node that waits for a backup
	for _, n := range reached {
		if msg := composeErrors[n]; msg != "" {
			return failed(r, fmt.Sprintf("%s: its plan does not compose: %s", n, Tail(msg, 300)))
		}
		pv, ok := plans[n]
		if !ok || pv.Plan == nil {
			return Next{Waiting: fmt.Sprintf("%s, waiting on %s: it has no plan", progress, n)}
		}
		rep, ok := reports[n]
		if !ok || rep.Version < pv.Version {
			return Next{Waiting: fmt.Sprintf("%s, waiting on %s to apply plan v%d", progress, n, pv.Version)}
		}
		waits := false
		for _, f := range rep.Failures {
			if f.Module == r.Module && f.Backup != "" {
				// A secret's file waits for a backup to have read
				// its directory: written then. The other reached
				// nodes are looked at all the same: a failure there
				// stops the rollout now.
				if backup.on == "" {
					since := f.Since
					if since.IsZero() { // a report of an older mesh
						since = rep.AppliedAt
					}
					backup = backupWait{n, fmt.Sprintf("%s, waiting on %s: %s waits, %s", progress, n, f.Resource, f.Reason), since}
				}
				waits = true
				continue
			}
			if f.Module == r.Module {
				return failed(r, fmt.Sprintf("%s: %s failed: %s", n, f.Resource, f.Reason))
			}
		}
		for _, e := range rep.Exits {
			if e.Module == r.Module && e.At.After(r.StartedAt) {
				return failed(r, fmt.Sprintf("%s: container %s exited with code %d", n, e.Container, e.ExitCode))
			}
		}
		if waits {
			// Its containers run on through the wait (followed, their
			// health reported): one that goes unhealthy stops the
			// rollout now, not once the backup has read.
			for _, res := range pv.Plan.Resources {
				if res.Module != r.Module || res.Kind != manifest.KindContainer || res.Typed.Health == nil {
					continue
				}
				if h := healthOf(rep, res.Name); h != nil && h.Status == HealthUnhealthy {
					return unhealthy(r, n, res.Name, h)
				}
			}
			continue
		}
		for _, res := range pv.Plan.Resources {
			if res.Module != r.Module || res.Kind != manifest.KindContainer {
				continue
			}
			if res.Typed.Health == nil {
				least = minDur(least, now.Sub(r.StepAt))
				continue
			}
			h := healthOf(rep, res.Name)
			switch {
			case h == nil || h.Status == HealthStarting:
				return Next{Waiting: fmt.Sprintf("%s, waiting on %s: %s starting", progress, n, res.Name)}
			case h.Status == HealthUnhealthy:
				return unhealthy(r, n, res.Name, h)
			}
			for_ := now.Sub(h.Since)
			if for_ < r.Policy.HealthyFor {
				return Next{Waiting: fmt.Sprintf("%s, waiting on %s: %s healthy %s/%s", progress, n, res.Name, round(for_), r.Policy.HealthyFor)}
			}
			least = minDur(least, for_)
		}
		if least >= 0 && least < r.Policy.HealthyFor {
			return Next{Waiting: fmt.Sprintf("%s, waiting on %s: up %s/%s", progress, n, round(least), r.Policy.HealthyFor)}
		}
	}
	if backup.on != "" {
		return Next{Waiting: backup.why, backupOn: backup.on, backupSince: backup.since}
	}
	why := fmt.Sprintf("%s healthy for %s", strings.Join(reached, ", "), r.Policy.HealthyFor)
	if len(reached) == 0 {
		why = "no node reached runs it any more"
	}
	if len(left) == 0 {
		return Next{Step: &RolloutStepRequest{Module: r.Module, To: r.To, Done: true, Why: why, Secret: r.Secret}}
	}
	return Next{Step: &RolloutStepRequest{Module: r.Module, To: r.To, Reach: left[:min(max(r.Policy.MaxParallel, 1), len(left))], Why: why, Secret: r.Secret}}
}

// unhealthy stops the rollout for a reached node's unhealthy container,
// with the tail of its check's output.
func unhealthy(r Rollout, node, container string, h *ContainerHealth) Next {
	why := fmt.Sprintf("%s: container %s is unhealthy", node, container)
	if h.Output != "" {
		why += ": " + Tail(h.Output, 200)
	}
	return failed(r, why)
}

func failed(r Rollout, why string) Next {
	return Next{Step: &RolloutStepRequest{Module: r.Module, To: r.To, Failed: why, Secret: r.Secret}}
}

func healthOf(rep Report, container string) *ContainerHealth {
	for i := range rep.Health {
		if rep.Health[i].Container == container {
			return &rep.Health[i]
		}
	}
	return nil
}

func minDur(a, b time.Duration) time.Duration {
	if a < 0 || b < a {
		return b
	}
	return a
}

func round(d time.Duration) time.Duration { return max(d, 0).Truncate(time.Second) }
