package reconciler

import (
	"context"
	"sort"
	"time"

	"mesh/state"
	"mesh/state/manifest"
)

// Scheduled steps (issue 30, item 3). A step with schedule: runs once as
// any step does, when the plan first holds it; then, on the node that holds
// it, again at each slot of its schedule. Those runs go through the loop,
// one at a time and never during an apply, so runs of a step never overlap
// (a slot that passes while one runs is not run twice). They record no
// marker: nothing that names the step (restart-on) is recreated by them. A
// run that fails is reported, and tried again at the next slot. The slots
// are kept in the ledger, so a restarted agent keeps them.

// nextSlot is the earliest slot of the plan's scheduled steps, as the
// ledger has them (zero: none). A step the ledger has not planned yet is due
// now (RunScheduled plans it); one whose schedule does not parse, or has no
// slot to come, is left out, so the loop's timer never spins.
func (r *Reconciler) nextSlot(plan *state.Plan) time.Time {
	var next time.Time
	for _, res := range plan.Resources {
		if res.Kind != manifest.KindStep || res.Decl.Schedule == "" {
			continue
		}
		if _, err := manifest.ParseSchedule(res.Decl.Schedule); err != nil {
			continue
		}
		st, ok := r.ledger.Schedules[res.RuntimeName()]
		at := st.Next
		if !ok || st.Schedule != res.Decl.Schedule {
			at = r.cfg.Now()
		}
		if at.IsZero() {
			continue
		}
		if next.IsZero() || at.Before(next) {
			next = at
		}
	}
	return next
}

// RunScheduled runs each scheduled step of plan whose slot has come, and
// plans the next slot of each; it returns each scheduled step's state for
// the report. A step whose first run has not succeeded, or whose module
// failed in the last apply, is not run: its slot passes, said.
func (r *Reconciler) RunScheduled(ctx context.Context, plan *state.Plan) []state.ScheduledRun {
	x := r.newRun(plan)
	for _, res := range plan.Resources {
		if res.Kind != manifest.KindStep && res.Kind != manifest.KindContainer {
			x.kinds[res.Name] = res.Kind
		}
	}
	if r.ledger.Schedules == nil {
		r.ledger.Schedules = map[string]Scheduled{}
	}
	for _, res := range plan.Resources {
		if res.Kind != manifest.KindStep || res.Decl.Schedule == "" {
			continue
		}
		sch, err := manifest.ParseSchedule(res.Decl.Schedule)
		if err != nil {
			continue // the manifest's check refuses it; an older plan's text
		}
		name := res.RuntimeName()
		now := r.cfg.Now()
		st, ok := r.ledger.Schedules[name]
		if !ok || st.Schedule != res.Decl.Schedule {
			// First seen (its first run is the apply's): the next slot.
			r.ledger.Schedules[name] = Scheduled{Next: sch.Next(now), Schedule: res.Decl.Schedule, OK: st.OK, Last: st.Last, Reason: st.Reason}
			r.saveSchedules()
			continue
		}
		if next := sch.Next(now); !st.Next.IsZero() && !next.IsZero() && next.Before(st.Next) {
			// The clock went back (or was ahead when the slot was
			// planned): the slot kept is further than the schedule's next,
			// and waiting for it stopped the step for as long.
			st.Next = next
			r.ledger.Schedules[name] = st
			r.saveSchedules()
		}
		if st.Next.IsZero() || now.Before(st.Next) {
			continue
		}
		skip := ""
		if _, ran := r.ledger.Markers[name]; !ran {
			skip = "its first run (the apply's) has not succeeded; not run at this slot"
		} else if f := r.lastFailed[res.Module]; f != nil && f.Backup != "" {
			skip = "its module waited in the last apply (" + f.Reason + "); not run at this slot"
		} else if f != nil {
			skip = "its module failed in the last apply; not run at this slot"
		}
		if skip != "" {
			r.ledger.Schedules[name] = Scheduled{Schedule: st.Schedule, Last: now.UTC(), OK: false, Reason: skip, Next: sch.Next(now)}
			r.saveSchedules()
			continue
		}
		want := describe(res, r.cfg.DNS, plan.PublishAddress, r.networkOf(res.Module), nil)
		// A container of the step's name left by an agent killed mid-run
		// goes first: this run starts afresh.
		if c, found, err := r.rt.Lookup(ctx, want.Name); err == nil && found && c.Labels[LabelManaged] == "1" {
			r.rt.Remove(context.WithoutCancel(ctx), c.ID)
		}
		id, rr, ok := x.stepRun(ctx, res, want, "")
		if ctx.Err() != nil {
			return r.scheduledRuns(plan)
		}
		if ok {
			r.rt.Remove(context.WithoutCancel(ctx), id)
		}
		// The next slot after the run: a slot that passed while it ran is
		// not run twice.
		st = Scheduled{Schedule: res.Decl.Schedule, Last: now.UTC(), OK: ok, Reason: rr.Reason, Next: sch.Next(r.cfg.Now())}
		r.ledger.Schedules[name] = st
		r.saveSchedules() // each run's, at once: a kill does not run it again
		if ok {
			r.log.Info("ran scheduled step", "step", name, "next", st.Next.UTC().Format(time.RFC3339))
		} else {
			r.log.Warn("scheduled step failed; tried again at its next slot", "step", name, "err", rr.Reason, "next", st.Next.UTC().Format(time.RFC3339))
		}
	}
	return r.scheduledRuns(plan)
}

func (r *Reconciler) saveSchedules() {
	if err := r.ledger.Save(); err != nil {
		r.log.Warn("record the scheduled steps' runs", "err", err)
	}
}

// scheduledRuns is what the report says of the plan's scheduled steps.
func (r *Reconciler) scheduledRuns(plan *state.Plan) []state.ScheduledRun {
	var out []state.ScheduledRun
	for _, res := range plan.Resources {
		if res.Kind != manifest.KindStep || res.Decl.Schedule == "" {
			continue
		}
		st, ok := r.ledger.Schedules[res.RuntimeName()]
		if !ok {
			continue
		}
		out = append(out, state.ScheduledRun{Module: res.Module, Step: res.Name, Last: st.Last, OK: st.OK || st.Last.IsZero(), Reason: st.Reason, Next: st.Next.UTC()})
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Step < out[j].Step })
	return out
}
