package agent

import (
	"context"
	"time"

	"mesh/state"
)

// rolloutEvery is how often the leader looks at the running rollouts when
// nothing in the state changed (a healthy-for that runs out changes
// nothing in it).
const rolloutEvery = time.Second

// driveRollouts is the leader's side of rollouts (state/rollout.go): at
// each change of the state, and every second, it decides each running
// rollout's next step from the replica (state.Progress) and proposes it.
// The rollout is in the state, so a new leader goes on where the last one
// was; a step decided on an older state is refused by the FSM.
func (a *Agent) driveRollouts(ctx context.Context) {
	store, node := a.member.Store, a.member.Node
	waiting := map[string]string{} // what each rollout was last logged waiting for
	for nextChange(ctx, store, rolloutEvery) {
		if node.State() != "Leader" {
			clear(waiting)
			continue
		}
		rs, err := store.Rollouts(ctx)
		if err != nil {
			a.log.Warn("read the rollouts", "err", err)
			continue
		}
		reports, err := store.Reports(ctx)
		if err != nil {
			continue
		}
		broken := composeErrors(ctx, store)
		for _, r := range rs {
			if r.State != state.RolloutRunning {
				delete(waiting, r.Module)
				continue
			}
			plans := map[string]state.PlanVersion{}
			for _, n := range r.Nodes {
				if pv, err := store.Plan(ctx, n); err == nil {
					plans[n] = pv
				}
			}
			next := state.Progress(r, plans, reports, broken, time.Now())
			if next.Step == nil || next.Refresh {
				if waiting[r.Module] != next.Waiting {
					a.log.Info("rollout waits", "module", r.Module, "to_version", r.To, "waiting", next.Waiting)
					waiting[r.Module] = next.Waiting
				}
				if next.Step == nil {
					continue
				}
			} else {
				delete(waiting, r.Module)
			}
			pctx, cancel := context.WithTimeout(ctx, 30*time.Second)
			idx, err := node.Propose(pctx, next.Step)
			cancel()
			if err != nil {
				a.log.Warn("rollout step not taken", "module", r.Module, "step", state.Describe(next.Step), "err", err)
				continue
			}
			a.log.Info("rollout step", "module", r.Module, "step", state.Describe(next.Step), "index", idx)
		}
	}
}

// nextChange waits for the next change of the replica, or every, and says
// false once ctx ended.
func nextChange(ctx context.Context, store *state.Store, every time.Duration) bool {
	changed := store.Changed()
	select {
	case <-ctx.Done():
		return false
	case <-changed:
	case <-time.After(every):
	}
	return true
}

// composeErrors is each node's composition error, for the rollout's check
// that a reached node really has the new version's plan.
func composeErrors(ctx context.Context, store *state.Store) map[string]string {
	out := map[string]string{}
	nodes, err := store.Nodes(ctx)
	if err != nil {
		return out
	}
	for _, n := range nodes {
		if n.ComposeError != "" {
			out[n.Name] = n.ComposeError
		}
	}
	return out
}
