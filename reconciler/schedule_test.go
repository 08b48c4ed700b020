package reconciler

import (
	"context"
	"net/netip"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"mesh/state"
)

const scheduledTmpl = `module: job
resources:
  - directory: {{d}}/job
    owner: "0:0"
    mode: "0755"
  - step: dump
    image: localhost/busybox:1
    command: ["dump"]
    mounts: ["{{d}}/job:/out"]
    schedule: every 15m
  - container: job.server
    image: localhost/busybox:1
    restart-on: [dump]
`

// Issue 30, item 3: a scheduled step runs once when the plan first holds
// it, then at each slot; those runs recreate nothing that names it; one that
// fails is reported and tried again at the next slot (not before); the
// slots are the ledger's, so a new reconciler (a restarted agent) keeps
// them.
func TestScheduledStep(t *testing.T) {
	dir := t.TempDir()
	clock := time.Date(2026, 12, 1, 10, 0, 0, 0, time.UTC)
	rt := newFake()
	cfg := Config{Node: "ace", DNS: netip.MustParseAddr("169.254.53.53"), LedgerPath: filepath.Join(dir, "ledger.json"), Now: func() time.Time { return clock }}
	r, err := New(cfg, rt)
	if err != nil {
		t.Fatal(err)
	}
	in := state.Input{Domain: "internal", Nodes: []state.Node{{Name: "ace", Address: "10.0.0.1"}}, Assignments: []state.Assignment{{Node: "ace", Module: "job"}}}
	plan := composeAce(t, &in, []string{strings.ReplaceAll(scheduledTmpl, "{{d}}", dir)})
	ctx := context.Background()
	runs := func() int {
		n := 0
		for _, c := range rt.calls {
			if c == "create job.dump" {
				n++
			}
		}
		return n
	}
	rep := r.Apply(ctx, 1, plan)
	if rep.Error != "" || runs() != 1 {
		t.Fatalf("the first apply: %v, %d runs", rep.Error, runs())
	}
	server := rt.byName("job.server").ID
	sch := r.RunScheduled(ctx, plan)
	if len(sch) != 1 || !sch[0].Next.Equal(clock.Add(15*time.Minute)) || !sch[0].OK {
		t.Fatalf("the first slot: %+v", sch)
	}
	rt.calls = nil
	clock = clock.Add(10 * time.Minute)
	r.RunScheduled(ctx, plan)
	if runs() != 0 {
		t.Fatal("ran before its slot")
	}
	clock = clock.Add(6 * time.Minute)
	sch = r.RunScheduled(ctx, plan)
	if runs() != 1 || !sch[0].OK || !sch[0].Last.Equal(clock) || !sch[0].Next.After(clock) {
		t.Fatalf("at its slot: %d runs, %+v", runs(), sch)
	}
	if rt.byName("job.server").ID != server || rt.byName("job.dump") != nil {
		t.Fatal("a scheduled run recreated what names the step, or left its container")
	}
	// An apply after it reruns nothing: no marker moved.
	rt.calls = nil
	if rep := r.Apply(ctx, 1, plan); rep.Error != "" || runs() != 0 || rt.byName("job.server").ID != server {
		t.Fatalf("an apply after a scheduled run: %v, %d runs", rep.Error, runs())
	}
	// A failing run: reported, tried at the next slot only.
	rt.exit = func(s Spec) int {
		if s.Name == "job.dump" {
			return 3
		}
		return 0
	}
	clock = sch[0].Next
	sch = r.RunScheduled(ctx, plan)
	if sch[0].OK || !strings.Contains(sch[0].Reason, "exited with code 3") {
		t.Fatalf("a failed run: %+v", sch)
	}
	rt.calls = nil
	clock = clock.Add(time.Minute)
	r.RunScheduled(ctx, plan)
	if runs() != 0 {
		t.Fatal("a failed run was tried again before the next slot")
	}
	// A restarted agent keeps the slot.
	r2, err := New(cfg, rt)
	if err != nil {
		t.Fatal(err)
	}
	if next := r2.nextSlot(plan); !next.Equal(sch[0].Next) {
		t.Fatalf("a new reconciler's next slot %s, want %s", next, sch[0].Next)
	}
	rt.exit = nil
	clock = sch[0].Next
	if sch = r2.RunScheduled(ctx, plan); !sch[0].OK {
		t.Fatalf("the retry at the next slot: %+v", sch)
	}
	// The clock set back a year (it was ahead when the slot was planned):
	// the step runs at the schedule's next slot from now, not a year on.
	clock = clock.AddDate(-1, 0, 0)
	rt.calls = nil
	sch = r2.RunScheduled(ctx, plan)
	if !sch[0].Next.After(clock) || sch[0].Next.After(clock.Add(15*time.Minute)) {
		t.Fatalf("after the clock went back: the next slot is %s, now is %s", sch[0].Next, clock)
	}
	clock = sch[0].Next
	r2.RunScheduled(ctx, plan)
	if runs() != 1 {
		t.Fatalf("after the clock went back: %d runs at the next slot, want 1", runs())
	}
	// Gone from the plan, its slots are forgotten.
	in.Assignments = nil
	r2.Apply(ctx, 2, composeAce(t, &in, []string{strings.ReplaceAll(scheduledTmpl, "{{d}}", dir)}))
	if _, ok := r2.ledger.Schedules["job.dump"]; ok {
		t.Fatal("the ledger keeps the slots of a step no longer planned")
	}
}

// The loop's timer never spins: a step whose first run failed lets its slot
// pass (said), a step of a module that failed in the last apply is not run,
// and a schedule with no slot to come is left out of the next slot.
func TestScheduledStepNeverSpins(t *testing.T) {
	dir := t.TempDir()
	clock := time.Date(2026, 12, 1, 10, 0, 0, 0, time.UTC)
	rt := newFake()
	rt.exit = func(s Spec) int { return 1 } // the first run fails
	r, err := New(Config{Node: "ace", DNS: netip.MustParseAddr("169.254.53.53"), LedgerPath: filepath.Join(dir, "ledger.json"), Now: func() time.Time { return clock }}, rt)
	if err != nil {
		t.Fatal(err)
	}
	in := state.Input{Domain: "internal", Nodes: []state.Node{{Name: "ace", Address: "10.0.0.1"}}, Assignments: []state.Assignment{{Node: "ace", Module: "job"}}}
	plan := composeAce(t, &in, []string{strings.ReplaceAll(scheduledTmpl, "{{d}}", dir)})
	ctx := context.Background()
	r.Apply(ctx, 1, plan)
	r.RunScheduled(ctx, plan)
	clock = clock.Add(16 * time.Minute)
	sch := r.RunScheduled(ctx, plan)
	if len(sch) != 1 || sch[0].OK || !strings.Contains(sch[0].Reason, "its first run (the apply's) has not succeeded") || !sch[0].Next.After(clock) {
		t.Fatalf("a slot of a step whose first run failed: %+v", sch)
	}
	if next := r.nextSlot(plan); !next.After(clock) {
		t.Fatalf("the next slot %s is not after now (%s): the loop would spin", next, clock)
	}
	// A cron line with no day to come (30 February) is no slot at all:
	// the manifest check refuses one now, but a plan an older mesh made
	// may hold it.
	never := composeAce(t, &in, []string{strings.ReplaceAll(scheduledTmpl, "{{d}}", dir)})
	for i := range never.Resources {
		if never.Resources[i].Decl.Schedule != "" {
			never.Resources[i].Decl.Schedule = "0 0 30 2 *"
		}
	}
	r.RunScheduled(ctx, never)
	if next := r.nextSlot(never); !next.IsZero() {
		t.Fatalf("a schedule that never comes has a next slot %s", next)
	}
}
