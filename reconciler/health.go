package reconciler

import (
	"context"
	"log/slog"
	"sort"
	"strings"
	"sync"
	"time"

	"mesh/state"
	"mesh/state/manifest"
)

// Podman runs a container's health check from systemd timers; hosts without
// systemd (and rootless sessions without a user manager) never run them. So
// the agent runs each declared check itself, on the check's own interval,
// through Podman (`healthcheck run`): Podman still applies the start period
// and the retries and keeps the status and the log. Nothing polls faster
// than a check's interval, and checks never wait on each other.

// healthFirstRun is how soon after a container starts its check first runs,
// so that `--wait` learns early that a container is healthy.
var healthFirstRun = time.Second

// healthOutputMax bounds the output a report carries per container.
const healthOutputMax = 512

type healthCheck struct {
	module, name string
	check        manifest.HealthCheck
	status       state.ContainerHealth
	next         time.Time
	running      bool
}

// monitor runs the health checks of the containers the last apply left,
// and follows Podman's events for the ones that exit.
type monitor struct {
	rt  Runtime
	log *slog.Logger
	now func() time.Time
	// secrets are taken out of health output and exit logs (redact.go).
	secrets *secretValues

	mu       sync.Mutex
	checks   map[string]*healthCheck // by container name
	followed map[string]string       // container name -> module
	exits    map[string]*state.ContainerExit
	changed  chan struct{} // closed at the next change of status
	wake     chan struct{}

	// The certificates the node's route proxy serves (certs.go): probed at
	// certDial ("" probes nothing).
	certDial string
	certT    certTargets
	certs    []state.CertStatus
	certWake chan struct{}

	// restarting holds, per container the mesh restarts in place (`mesh
	// restart`), until when an exit of it is the restart's own stop, not
	// a crash: the container keeps its ID, so the check on IDs below
	// cannot tell.
	restarting map[string]time.Time
}

// restartGrace is how long after a restart in place its stop's event may
// still arrive (Podman's event stream lags the call).
var restartGrace = 5 * time.Second

// expectRestart says container name is about to be restarted in place.
func (m *monitor) expectRestart(name string) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.restarting[name] = time.Date(9999, 1, 1, 0, 0, 0, 0, time.UTC)
}

// restartDone says its restart returned: exits within restartGrace are
// still its own.
func (m *monitor) restartDone(name string) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.restarting[name] = m.now().Add(restartGrace)
}

func newMonitor(rt Runtime, log *slog.Logger, now func() time.Time, secrets *secretValues) *monitor {
	return &monitor{rt: rt, log: log, now: now, secrets: secrets, checks: map[string]*healthCheck{}, followed: map[string]string{}, exits: map[string]*state.ContainerExit{},
		changed: make(chan struct{}), wake: make(chan struct{}, 1), certWake: make(chan struct{}, 1), restarting: map[string]time.Time{}}
}

// watch is one container to follow, and its health check, if it has one.
type watch struct {
	Module, Name string
	Check        *manifest.HealthCheck
	// Fresh: the container was (re)created by this apply; what was known
	// of the one before does not hold.
	Fresh bool
}

// following is the watch of a container followed now, as the last set
// made it: its check is the one the running container was made with.
func (m *monitor) following(name string) (watch, bool) {
	m.mu.Lock()
	defer m.mu.Unlock()
	mod, ok := m.followed[name]
	if !ok {
		return watch{}, false
	}
	w := watch{Module: mod, Name: name}
	if c := m.checks[name]; c != nil {
		check := c.check
		w.Check = &check
	}
	return w, true
}

// set replaces what is followed after an apply.
func (m *monitor) set(ws []watch) {
	m.mu.Lock()
	now := m.now()
	next := map[string]*healthCheck{}
	moved := false
	followed := map[string]string{}
	for _, w := range ws {
		followed[w.Name] = w.Module
		if _, ok := m.exits[w.Name]; ok && w.Fresh {
			delete(m.exits, w.Name) // a new container: the old one's exits are history
			moved = true
		}
		if w.Check == nil {
			continue
		}
		c, ok := m.checks[w.Name]
		if !ok || w.Fresh || c.check.Interval != w.Check.Interval {
			c = &healthCheck{module: w.Module, name: w.Name, check: *w.Check, next: now.Add(healthFirstRun),
				status: state.ContainerHealth{Module: w.Module, Container: w.Name, Status: state.HealthStarting, Since: now}}
			moved = true
		}
		c.check = *w.Check
		next[w.Name] = c
	}
	if len(next) != len(m.checks) {
		moved = true
	}
	for name := range m.exits {
		if _, ok := followed[name]; !ok {
			delete(m.exits, name)
			moved = true
		}
	}
	m.checks, m.followed = next, followed
	if moved {
		m.notifyLocked()
	}
	m.mu.Unlock()
	select {
	case m.wake <- struct{}{}:
	default:
	}
}

func (m *monitor) notifyLocked() {
	close(m.changed)
	m.changed = make(chan struct{})
}

// Changed is closed at the next change of any container's health.
func (m *monitor) Changed() <-chan struct{} {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.changed
}

// snapshot is every followed container's health, by name.
func (m *monitor) snapshot() []state.ContainerHealth {
	m.mu.Lock()
	defer m.mu.Unlock()
	out := make([]state.ContainerHealth, 0, len(m.checks))
	for _, c := range m.checks {
		out = append(out, c.status)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Container < out[j].Container })
	if len(out) == 0 {
		return nil
	}
	return out
}

// exitsSnapshot is every followed container that exited, by name.
func (m *monitor) exitsSnapshot() []state.ContainerExit {
	m.mu.Lock()
	defer m.mu.Unlock()
	var out []state.ContainerExit
	for _, e := range m.exits {
		out = append(out, *e)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Container < out[j].Container })
	return out
}

// exitRefresh is how often a container that keeps exiting is looked at.
var exitRefresh = time.Second

// exitLogLines is how many lines of a container's output an exit keeps.
const exitLogLines = 10

// followExits records each followed container that exits, from Podman's
// events (a stream, not a poll), until ctx ends; a broken stream is opened
// again.
func (m *monitor) followExits(ctx context.Context) {
	for ctx.Err() == nil {
		err := m.rt.Died(ctx, func(id, name string, code int) { m.died(ctx, id, name, code) })
		if ctx.Err() != nil {
			return
		}
		m.log.Debug("Podman's event stream broke; opening it again", "err", err)
		select {
		case <-ctx.Done():
		case <-time.After(2 * time.Second):
		}
	}
}

func (m *monitor) died(ctx context.Context, id, name string, code int) {
	m.mu.Lock()
	module, ok := m.followed[name]
	last := m.exits[name]
	until, restarting := m.restarting[name]
	if restarting && !m.now().Before(until) {
		delete(m.restarting, name)
		restarting = false
	}
	m.mu.Unlock()
	if !ok || restarting {
		return
	}
	if last != nil && m.now().Sub(last.At) < exitRefresh {
		// A tight restart loop: the next exit after exitRefresh says the
		// count and the lines; until then Podman is not asked on every one.
		return
	}
	cctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	// An event of a container the mesh just replaced or removed names the
	// old one: only an exit of the container that has the name now counts.
	cur, restarts, err := m.rt.Restarts(cctx, name)
	if err != nil || cur != id {
		return
	}
	logs, _ := m.rt.Logs(cctx, id, exitLogLines)
	logs = m.secrets.redact(module, logs)
	if len(logs) > 4*healthOutputMax {
		logs = logs[len(logs)-4*healthOutputMax:]
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.followed[name] != module {
		return
	}
	m.exits[name] = &state.ContainerExit{Module: module, Container: name, ExitCode: code, Restarts: restarts, At: m.now().UTC(), Logs: strings.TrimSpace(logs)}
	m.log.Warn("container exited", "module", module, "container", name, "exit_code", code, "restarts", restarts)
	m.notifyLocked()
}

// run runs each check when it is due until ctx ends.
func (m *monitor) run(ctx context.Context) {
	go m.followExits(ctx)
	go m.runCerts(ctx)
	timer := time.NewTimer(time.Hour)
	defer timer.Stop()
	for {
		m.mu.Lock()
		now := m.now()
		soonest := now.Add(time.Hour)
		for _, c := range m.checks {
			if c.running {
				continue
			}
			if !c.next.After(now) {
				c.running = true
				c.next = now.Add(c.check.Interval)
				go m.runOne(ctx, c)
				continue
			}
			if c.next.Before(soonest) {
				soonest = c.next
			}
		}
		m.mu.Unlock()
		timer.Reset(soonest.Sub(now))
		select {
		case <-ctx.Done():
			return
		case <-m.wake:
		case <-timer.C:
		}
	}
}

func (m *monitor) runOne(ctx context.Context, c *healthCheck) {
	m.mu.Lock()
	name, timeout, module := c.name, c.check.Timeout, c.module
	m.mu.Unlock()
	cctx, cancel := context.WithTimeout(ctx, timeout+10*time.Second)
	res, err := m.rt.HealthCheck(cctx, name)
	cancel()
	if ctx.Err() != nil {
		return
	}
	if err != nil {
		res = HealthResult{Status: state.HealthUnhealthy, Output: err.Error()}
	}
	out := strings.TrimSpace(m.secrets.redact(module, res.Output))
	if len(out) > healthOutputMax {
		out = out[len(out)-healthOutputMax:]
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	c.running = false
	// The scheduler skips a running check: tell it this one is due again.
	select {
	case m.wake <- struct{}{}:
	default:
	}
	if m.checks[c.name] != c {
		return // no longer followed, or replaced
	}
	st := c.status
	if err != nil && st.Status == state.HealthStarting && m.now().Sub(st.Since) < c.check.StartPeriod {
		// Not running (exited, restarting) or gone: unhealthy once the
		// start period is over (Podman keeps no streak for it).
		res.Status = state.HealthStarting
	}
	if res.Status == "" {
		res.Status = state.HealthStarting
	}
	if res.Status != st.Status {
		m.log.Info("container health changed", "module", c.module, "container", c.name, "from", st.Status, "to", res.Status, "output", out)
		st.Status, st.Since = res.Status, m.now()
		st.Output, st.FailingStreak = out, res.FailingStreak
		c.status = st
		m.notifyLocked()
		return
	}
	// The same status: a new output of an unhealthy check is news; a
	// healthy check's output and streak are not worth a report.
	if res.Status == state.HealthUnhealthy && out != st.Output {
		st.Output, st.FailingStreak = out, res.FailingStreak
		c.status = st
		m.notifyLocked()
		return
	}
	c.status.FailingStreak = res.FailingStreak
}
