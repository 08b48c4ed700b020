package reconciler

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"mesh/state"
)

const healthTmpl = `module: web
resources:
  - container: web.server
    image: localhost/busybox:1
    health:
      command: [{{cmd}}]
      interval: 1s
      retries: 2
      start-period: 3s
  - container: web.plain
    image: localhost/busybox:1
`

func healthOf(rep []state.ContainerHealth, name string) *state.ContainerHealth {
	for i := range rep {
		if rep[i].Container == name {
			return &rep[i]
		}
	}
	return nil
}

// waitHealth waits (with a deadline) until the monitor says name is status.
func waitHealth(t *testing.T, r *Reconciler, name, status string) state.ContainerHealth {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		ch := r.HealthChanged()
		if h := healthOf(r.Health(), name); h != nil && h.Status == status {
			return *h
		}
		select {
		case <-ch:
		case <-time.After(time.Until(deadline)):
			t.Fatalf("%s is not %s within 10s: %+v", name, status, r.Health())
		}
	}
}

// Issue 10: a declared health check is Podman's (part of the container's
// declaration), the agent runs it, and its status follows the check.
func TestHealthIsFollowed(t *testing.T) {
	old := healthFirstRun
	healthFirstRun = 10 * time.Millisecond
	defer func() { healthFirstRun = old }()
	h := newHost(t)
	h.src["web"] = strings.ReplaceAll(healthTmpl, "{{cmd}}", `"test", "-e", "/tmp/ok"`)
	h.assign("web")
	rep := h.apply()
	if rep.Error != "" {
		t.Fatal(rep.Error)
	}
	spec := h.rt.specs[h.rt.byName("web.server").ID]
	if spec.Health == nil || strings.Join(spec.Health.Command, " ") != "test -e /tmp/ok" || spec.Health.Interval != time.Second || spec.Health.Retries != 2 || spec.Health.StartPeriod != 3*time.Second || spec.Health.Timeout != time.Second {
		t.Fatalf("the health check given to Podman: %+v", spec.Health)
	}
	if p := h.rt.specs[h.rt.byName("web.plain").ID]; p.Health != nil {
		t.Fatalf("a container without a check got one: %+v", p.Health)
	}
	if got := healthOf(rep.Health, "web.server"); got == nil || got.Status != state.HealthStarting {
		t.Fatalf("the report's health right after create: %+v", rep.Health)
	}
	if healthOf(rep.Health, "web.plain") != nil {
		t.Fatal("a container without a check is in the report's health")
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go h.r.health.run(ctx)
	waitHealth(t, h.r, "web.server", state.HealthHealthy)

	// The check fails: unhealthy, with its output.
	h.rt.setHealth(func(name string) (HealthResult, error) {
		return HealthResult{Status: state.HealthUnhealthy, FailingStreak: 2, ExitCode: 1, Output: "curl: (7) connection refused\n"}, nil
	})
	got := waitHealth(t, h.r, "web.server", state.HealthUnhealthy)
	if got.Output != "curl: (7) connection refused" || got.FailingStreak != 2 {
		t.Fatalf("unhealthy without its output: %+v", got)
	}
	// An apply that changes nothing keeps what is known.
	if rep := h.apply(); healthOf(rep.Health, "web.server").Status != state.HealthUnhealthy {
		t.Fatalf("a quiet apply forgot the health: %+v", rep.Health)
	}
	// A new check is a new container, whose health starts over.
	h.rt.setHealth(nil)
	h.src["web"] = strings.ReplaceAll(healthTmpl, "{{cmd}}", `"true"`)
	rep = h.apply()
	if o := outcome(rep, "web.server"); o.Outcome != state.Replaced || !strings.Contains(o.Reason, "health changed") {
		t.Fatalf("a changed check: %+v", o)
	}
	if o := outcome(rep, "web.plain"); o.Outcome != state.Unchanged {
		t.Fatalf("the other container: %+v", o)
	}
	if got := healthOf(rep.Health, "web.server"); got == nil || got.Status != state.HealthStarting {
		t.Fatalf("after replace: %+v", rep.Health)
	}
	waitHealth(t, h.r, "web.server", state.HealthHealthy)
	// A container that is not running is unhealthy once its start period is over.
	h.rt.setHealth(func(name string) (HealthResult, error) {
		return HealthResult{}, errors.New("container web.server is not running")
	})
	got = waitHealth(t, h.r, "web.server", state.HealthUnhealthy)
	if !strings.Contains(got.Output, "not running") {
		t.Fatalf("a stopped container: %+v", got)
	}
	// Unassigned: no longer followed.
	h.assign()
	if rep := h.apply(); len(rep.Health) != 0 {
		t.Fatalf("health of removed containers: %+v", rep.Health)
	}
}

// Declaring no health check changes no container's declaration: upgrading
// the agent replaces nothing.
func TestNoHealthKeepsDigests(t *testing.T) {
	h := newHost(t)
	h.src["web"] = strings.ReplaceAll(healthTmpl, "{{cmd}}", `"true"`)
	h.assign("web")
	h.apply()
	if d := h.rt.byName("web.plain").Labels[LabelDecl]; strings.Contains(d, "health") {
		t.Fatalf("a container without a check has one in its declaration: %s", d)
	}
	if d := h.rt.byName("web.server").Labels[LabelDecl]; !strings.Contains(d, `"health":{"command":["true"]`) {
		t.Fatalf("the check is not in the declaration: %s", d)
	}
}

// Issue 10 item 6: a container that exits (or restarts in a loop) is in the
// report with its exit code, Podman's restart count and its last lines; an
// exit event of a container the mesh replaced is not.
func TestExitsAreReported(t *testing.T) {
	h := newHost(t)
	h.src["web"] = strings.ReplaceAll(healthTmpl, "{{cmd}}", `"true"`)
	h.assign("web")
	if rep := h.apply(); rep.Error != "" || len(rep.Exits) != 0 {
		t.Fatalf("%s %+v", rep.Error, rep.Exits)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go h.r.health.run(ctx)
	plain := h.rt.byName("web.plain")
	ch := h.r.HealthChanged()
	h.rt.healthMu.Lock()
	h.rt.restarts = 4
	h.rt.healthMu.Unlock()
	h.rt.deaths <- death{id: "stale-id", name: "web.plain", code: 1} // an older container's
	h.rt.deaths <- death{id: plain.ID, name: "web.plain", code: 3}
	select {
	case <-ch:
	case <-time.After(10 * time.Second):
		t.Fatal("no change after an exit")
	}
	ex := h.r.health.exitsSnapshot()
	if len(ex) != 1 || ex[0].Container != "web.plain" || ex[0].ExitCode != 3 || ex[0].Restarts != 4 || ex[0].Logs != "migrate: cannot reach db" || ex[0].Module != "web" {
		t.Fatalf("exits: %+v", ex)
	}
	if rep := h.apply(); len(rep.Exits) != 1 {
		t.Fatalf("the next report lost the exit: %+v", rep.Exits)
	}
	// Replaced (a new declaration): the old container's exits are history.
	h.src["web"] = strings.ReplaceAll(strings.ReplaceAll(healthTmpl, "{{cmd}}", `"true"`), "web.plain\n    image: localhost/busybox:1", "web.plain\n    image: localhost/busybox:1\n    env: {A: b}")
	if rep := h.apply(); len(rep.Exits) != 0 || outcome(rep, "web.plain").Outcome != state.Replaced {
		t.Fatalf("after replace: %+v %+v", rep.Exits, outcome(rep, "web.plain"))
	}
}

// A container that crash-loops must not flood the log with reports: changes
// of health and exits go out at most once per HealthReportEvery, and the
// last one says the latest.
func TestCrashLoopDoesNotFloodReports(t *testing.T) {
	// Every exit is looked at here (the spacing under test is the reports').
	old := exitRefresh
	exitRefresh = 0
	defer func() { exitRefresh = old }()
	h := newHost(t)
	h.src["web"] = strings.ReplaceAll(healthTmpl, "{{cmd}}", `"true"`)
	h.assign("web")
	s := newSrc()
	s.set(1, h.plan())
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		h.r.Run(ctx, s.source(), LoopConfig{Resync: time.Hour, HealthReportEvery: time.Second})
	}()
	defer func() { cancel(); <-done }()
	s.waitReport(t, 1)
	id := h.rt.byName("web.plain").ID
	start := time.Now()
	for i := 1; i <= 50; i++ {
		h.rt.healthMu.Lock()
		h.rt.restarts = i
		h.rt.healthMu.Unlock()
		h.rt.deaths <- death{id: id, name: "web.plain", code: 3}
		time.Sleep(20 * time.Millisecond)
	}
	var got []state.Report
	for quiet := time.After(2500 * time.Millisecond); ; {
		select {
		case r := <-s.reports:
			got = append(got, r)
			continue
		case <-quiet:
		}
		break
	}
	took := time.Since(start)
	if max := int(took/time.Second) + 2; len(got) > max || len(got) == 0 {
		t.Fatalf("%d reports for 50 exits in %s (at most %d)", len(got), took, max)
	}
	last := got[len(got)-1]
	if len(last.Exits) != 1 || last.Exits[0].Restarts != 50 {
		t.Fatalf("the last report: %+v", last.Exits)
	}
}

// The stop inside a restart in place (mesh restart) is no exit: the
// container keeps its ID, so only the monitor's window tells it from a
// crash; an exit after the window is one.
func TestRestartIsNoExit(t *testing.T) {
	h := newHost(t)
	h.src["web"] = strings.ReplaceAll(healthTmpl, "{{cmd}}", `"true"`)
	h.assign("web")
	h.apply()
	plain := h.rt.byName("web.plain")
	now := time.Now()
	m := h.r.health
	m.now = func() time.Time { return now }
	ctx := context.Background()
	m.expectRestart("web.plain")
	m.died(ctx, plain.ID, "web.plain", 143) // during the restart
	m.restartDone("web.plain")
	now = now.Add(restartGrace / 2)
	m.died(ctx, plain.ID, "web.plain", 143) // its event, late
	if ex := m.exitsSnapshot(); len(ex) != 0 {
		t.Fatalf("the restart's own stop was reported as an exit: %+v", ex)
	}
	now = now.Add(restartGrace)
	m.died(ctx, plain.ID, "web.plain", 3)
	if ex := m.exitsSnapshot(); len(ex) != 1 || ex[0].ExitCode != 3 {
		t.Fatalf("a crash after the restart's window: %+v", ex)
	}
}
