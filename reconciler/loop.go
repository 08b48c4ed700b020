package reconciler

import (
	"context"
	"errors"
	"fmt"
	"time"

	"mesh/state"
)

// Loop defaults.
const (
	DefaultResync     = 30 * time.Second
	DefaultDebounce   = 200 * time.Millisecond
	DefaultMaxBackoff = 2 * time.Minute
	DefaultMinBackoff = 2 * time.Second
	// DefaultHealthReportEvery: at most one report a second for changes of
	// health and exits.
	DefaultHealthReportEvery = time.Second
)

// Source is where the loop reads its plan and sends its reports.
type Source struct {
	// Plan returns the node's current plan; an error wrapping state.ErrNotFound
	// means it has none yet.
	Plan func(ctx context.Context) (uint64, *state.Plan, error)
	// Changed is closed at the next change of the replica.
	Changed func() <-chan struct{}
	// Report records an apply's report in the replicated state.
	Report func(ctx context.Context, r state.Report) error
}

// LoopConfig tunes Run.
type LoopConfig struct {
	Resync     time.Duration // periodic pass that catches drift
	Debounce   time.Duration // a burst of changes makes one apply
	MaxBackoff time.Duration // retry after a failure, doubling up to this
	MinBackoff time.Duration // the first retry after a failure
	// HealthReportEvery spaces the reports a change of health sends.
	HealthReportEvery time.Duration
}

// Run applies the plan on every change of the replica (debounced), on a
// periodic pass, and after a failure with backoff, until ctx ends.
func (r *Reconciler) Run(ctx context.Context, src Source, cfg LoopConfig) {
	if cfg.Resync == 0 {
		cfg.Resync = DefaultResync
	}
	if cfg.Debounce == 0 {
		cfg.Debounce = DefaultDebounce
	}
	if cfg.MaxBackoff == 0 {
		cfg.MaxBackoff = DefaultMaxBackoff
	}
	if cfg.MinBackoff == 0 {
		cfg.MinBackoff = DefaultMinBackoff
	}
	if cfg.HealthReportEvery == 0 {
		cfg.HealthReportEvery = DefaultHealthReportEvery
	}
	var sent *state.Report
	var applied uint64 // plan version of the last apply that succeeded
	// waited: the plan version whose last apply only waited for backups to
	// have read (their fences, lifted, ask for the pass: ApplySoon).
	var waited uint64
	backoff := time.Duration(0)
	next := time.NewTimer(0)
	defer next.Stop()
	changed := src.Changed()
	go r.health.run(ctx)
	health := r.health.Changed()
	// Health reports are spaced by HealthReportEvery: a container that
	// crash-loops (or a check that flaps) must not flood the log with
	// writes. What changes meanwhile goes out, whole, in the next one.
	var lastHealth time.Time
	healthDue := time.NewTimer(time.Hour)
	healthDue.Stop()
	defer healthDue.Stop()
	// The next slot of the plan's scheduled steps (schedule.go).
	slot := time.NewTimer(time.Hour)
	slot.Stop()
	defer slot.Stop()
	var slotPlan *state.Plan
	planSlot := func(plan *state.Plan) {
		slot.Stop()
		slotPlan = plan
		if at := r.nextSlot(plan); !at.IsZero() {
			slot.Reset(max(time.Until(at), 0))
		}
	}
	sendHealth := func() {
		if sent == nil {
			return
		}
		rep := *sent
		rep.Health = r.health.snapshot()
		rep.Exits = r.health.exitsSnapshot()
		rep.Certificates = r.health.certsSnapshot()
		rep.Backups = r.backupRuns()
		if healthKey(&rep) == healthKey(sent) {
			return
		}
		lastHealth = time.Now()
		if err := src.Report(ctx, rep); err != nil {
			r.log.Warn("send report", "err", err)
		} else {
			sent = &rep
			r.log.Debug("report applied", "version", rep.Version, "health", true)
		}
	}
	for {
		onChange := false
		select {
		case <-ctx.Done():
			return
		case <-health:
			// A container's health changed: the last report again, with it
			// (no apply: nothing else moved).
			health = r.health.Changed()
			if wait := cfg.HealthReportEvery - time.Since(lastHealth); wait > 0 {
				healthDue.Reset(wait)
				continue
			}
			sendHealth()
			continue
		case <-healthDue.C:
			sendHealth()
			continue
		case <-slot.C:
			// A scheduled step's slot: it runs here, between applies.
			if slotPlan != nil {
				if !r.take(ctx) {
					return
				}
				// The plan as it is now: a move or a backup that held the
				// node may have changed it (a module stopped for a move
				// runs no step here).
				if _, p, err := src.Plan(ctx); err == nil {
					slotPlan = p
				}
				runs := r.RunScheduled(ctx, slotPlan)
				r.give()
				if ctx.Err() != nil {
					return
				}
				if sent != nil {
					rep := *sent
					rep.Scheduled = runs
					rep.Backups = r.backupRuns()
					if healthKey(&rep) != healthKey(sent) {
						if err := src.Report(ctx, rep); err != nil {
							r.log.Warn("send report", "err", err)
						} else {
							sent = &rep
						}
					}
				}
				planSlot(slotPlan)
			}
			continue
		case <-changed:
			onChange = true
			// Let a burst settle: more changes within Debounce join this apply.
			settle := time.NewTimer(cfg.Debounce)
			for settled := false; !settled; {
				select {
				case <-ctx.Done():
					settle.Stop()
					return
				case <-src.Changed():
					settle.Reset(cfg.Debounce)
				case <-settle.C:
					settled = true
				}
			}
		case <-next.C:
		case <-r.soon:
			// A restore stopped a module's containers, or a backup ended:
			// a pass now, whose report says so.
		}
		// Taken before the plan is read: a change while this pass applies (a
		// new plan during a long step) wakes the next pass at once, rather than
		// waiting for the periodic pass or the backoff.
		changed = src.Changed()
		// The node is this pass's before the plan is read: a backup or a
		// move that held it (Exclusive) is followed by the plan as it is
		// after them, never by one read before.
		if !r.take(ctx) {
			return
		}
		version, plan, err := src.Plan(ctx)
		if err != nil {
			r.give()
			if !errors.Is(err, state.ErrNotFound) {
				r.log.Warn("read plan", "err", err)
			}
			next.Reset(cfg.Resync)
			continue
		}
		if onChange && (version == applied || version == waited || backoff > 0 && version == sentVersion(sent)) {
			// Not this node's plan that changed (another node's report, say),
			// or a failing plan whose retry the backoff already schedules,
			// or one that waits for a backup (which may read for hours: a
			// pass at every change of the replica until then was for
			// nothing).
			r.give()
			continue
		}
		began := time.Now()
		rep := r.Apply(ctx, version, plan)
		if ctx.Err() != nil {
			r.give()
			return
		}
		rep.Scheduled = r.RunScheduled(ctx, plan)
		r.give()
		if ctx.Err() != nil {
			return
		}
		rep.Backups = r.backupRuns()
		planSlot(plan)
		if r.cfg.Observe != nil {
			r.cfg.Observe(&rep, time.Since(began))
		}
		waited = 0
		if rep.OnlyBackups() {
			// Waiting for a backup to have read is not a failure: the
			// backup's fence, lifted, asks for the pass (ApplySoon).
			backoff, waited = 0, version
			r.log.Info(fmt.Sprintf("plan v%d waits for a backup; applied once it has read", version), "wait", rep.Error)
			next.Reset(cfg.Resync)
		} else if rep.OnlyGates() {
			// Waiting at a health gate is not a failure: try again soon, and
			// at every change (the provider's node reports its health).
			backoff = 0
			r.log.Info(fmt.Sprintf("plan v%d waits at a health gate; trying again as health changes", version), "wait", rep.Error)
			next.Reset(cfg.MinBackoff)
		} else if rep.Error != "" {
			backoff = min(max(cfg.MinBackoff, backoff*2), cfg.MaxBackoff)
			r.log.Warn(fmt.Sprintf("apply of plan v%d failed; retrying in %s", version, backoff), "err", rep.Error)
			next.Reset(backoff)
		} else {
			backoff = 0
			applied = version
			next.Reset(cfg.Resync)
		}
		if worthSending(sent, &rep) {
			if err := src.Report(ctx, rep); err != nil {
				r.log.Warn("send report", "err", err)
			} else {
				sent = &rep
				r.log.Debug("report applied", "version", rep.Version)
			}
		}
	}
}

func sentVersion(r *state.Report) uint64 {
	if r == nil {
		return 0
	}
	return r.Version
}

// worthSending: a report is replicated when it says something new, so a
// quiet periodic pass writes nothing. Every failed attempt is sent (they are
// spaced by the backoff), so a waiting `mesh assign --wait` sees a fresh one.
func worthSending(last, rep *state.Report) bool {
	if last == nil || last.Version != rep.Version || last.Error != rep.Error || rep.Error != "" && !rep.OnlyGates() {
		return true
	}
	if healthKey(last) != healthKey(rep) {
		return true
	}
	c := changes(rep)
	return c != "" && c != changes(last)
}

func healthKey(r *state.Report) string {
	s := ""
	for _, h := range r.Health {
		s += h.Container + " " + h.Status + " " + h.Output + "\n"
	}
	for _, e := range r.Exits {
		s += fmt.Sprintf("%s exited %d at %s after %d restarts\n", e.Container, e.ExitCode, e.At, e.Restarts)
	}
	for _, c := range r.Scheduled {
		s += fmt.Sprintf("scheduled %s %s %v %s %s\n", c.Step, c.Last, c.OK, c.Reason, c.Next)
	}
	return s + certKey(r.Certificates) + backupKey(r.Backups)
}

// take waits for the node to be this pass's alone (no backup runs, see
// Exclusive); false when ctx ended first.
func (r *Reconciler) take(ctx context.Context) bool {
	select {
	case r.pass <- struct{}{}:
		return true
	case <-ctx.Done():
		return false
	}
}

func (r *Reconciler) give() { <-r.pass }

// backupRuns is what the agent says of its modules' backups (nil without
// Config.Backups).
func (r *Reconciler) backupRuns() []state.BackupRun {
	if r.cfg.Backups == nil {
		return nil
	}
	return r.cfg.Backups()
}

func changes(r *state.Report) string {
	s := ""
	for _, rr := range r.Resources {
		if rr.Outcome != state.Unchanged {
			s += rr.Kind + " " + rr.Name + " " + string(rr.Outcome) + " " + rr.Reason + "\n"
		}
	}
	return s
}
