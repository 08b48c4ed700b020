package reconciler

import (
	"context"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"mesh/state"
)

// src is a Source whose plan the test changes.
type src struct {
	mu      sync.Mutex
	version uint64
	plan    *state.Plan
	changed chan struct{}
	reports chan state.Report
}

func newSrc() *src {
	return &src{changed: make(chan struct{}), reports: make(chan state.Report, 100)}
}

func (s *src) set(v uint64, p *state.Plan) {
	s.mu.Lock()
	s.version, s.plan = v, p
	close(s.changed)
	s.changed = make(chan struct{})
	s.mu.Unlock()
}

func (s *src) source() Source {
	return Source{
		Plan: func(ctx context.Context) (uint64, *state.Plan, error) {
			s.mu.Lock()
			defer s.mu.Unlock()
			if s.plan == nil {
				return 0, nil, state.ErrNotFound
			}
			return s.version, s.plan, nil
		},
		Changed: func() <-chan struct{} {
			s.mu.Lock()
			defer s.mu.Unlock()
			return s.changed
		},
		Report: func(ctx context.Context, r state.Report) error { s.reports <- r; return nil },
	}
}

// waitReport waits for a report of version v (the deadline only bounds a hang).
func (s *src) waitReport(t *testing.T, v uint64) state.Report {
	t.Helper()
	deadline := time.After(30 * time.Second)
	for {
		select {
		case r := <-s.reports:
			if r.Version == v {
				return r
			}
		case <-deadline:
			t.Fatalf("no report of plan v%d", v)
		}
	}
}

// Issue 8 item 12: a node backing off after a failed apply takes a new plan
// at once. The backoff is an hour here, so only the new plan can wake it.
func TestNewPlanEndsBackoff(t *testing.T) {
	h := newHost(t)
	h.rt.exit = func(s Spec) int {
		if strings.Contains(strings.Join(s.Command, " "), "fail") {
			return 1
		}
		return 0
	}
	h.src["bad"] = `module: bad
resources:
  - step: s
    image: localhost/busybox:1
    command: ["fail"]
`
	h.src["other"] = otherTmpl
	h.assign("bad")
	s := newSrc()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done := make(chan struct{})
	go func() {
		h.r.Run(ctx, s.source(), LoopConfig{Resync: time.Hour, MinBackoff: time.Hour, Debounce: time.Millisecond})
		close(done)
	}()
	s.set(1, h.plan())
	if r := s.waitReport(t, 1); r.Error == "" {
		t.Fatal("the failing plan did not fail")
	}
	h.assign("other")
	s.set(2, h.plan())
	if r := s.waitReport(t, 2); r.Error != "" {
		t.Fatal(r.Error)
	}
	cancel()
	<-done
}

// blockRT blocks the first Create until released.
type blockRT struct {
	*fake
	once    sync.Once
	entered chan struct{}
	release chan struct{}
}

func (b *blockRT) Create(ctx context.Context, s Spec) (string, error) {
	b.once.Do(func() { close(b.entered); <-b.release })
	return b.fake.Create(ctx, s)
}

// A plan that changes while an apply runs is applied right after it, not at
// the next periodic pass (an hour here).
func TestChangeDuringApplyIsNotLost(t *testing.T) {
	h := newHost(t)
	h.src["other"] = otherTmpl
	h.src["gone"] = goneTmpl
	h.assign("other")
	b := &blockRT{fake: h.rt, entered: make(chan struct{}), release: make(chan struct{})}
	h.r.rt = b
	s := newSrc()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done := make(chan struct{})
	go func() {
		h.r.Run(ctx, s.source(), LoopConfig{Resync: time.Hour, Debounce: time.Millisecond})
		close(done)
	}()
	s.set(1, h.plan())
	<-b.entered
	h.assign("other", "gone")
	s.set(2, h.plan())
	close(b.release)
	s.waitReport(t, 1)
	if r := s.waitReport(t, 2); r.Error != "" || h.rt.byName("gone.server") == nil {
		t.Fatalf("v2 not applied: %q", r.Error)
	}
	cancel()
	<-done
}

// A plan that only waits for a backup to have read is applied again when
// the fence is lifted (or the plan changes), not at every change of the
// replica meanwhile: other nodes' reports come every few seconds, and a
// backup reads for hours.
func TestBackupWaitIsNotRetriedAtEveryChange(t *testing.T) {
	b := newSecretBed(t)
	b.set("smtp", "first")
	b.set("api", "key")
	var passes atomic.Int32
	b.r.cfg.Observe = func(*state.Report, time.Duration) { passes.Add(1) }
	plan := composeAce(t, &b.in, []string{strings.ReplaceAll(secretTmpl, "{{d}}", b.dir)})
	lift := b.r.FenceSecrets("mail", []string{filepath.Join(b.dir, "mail")})
	defer lift()
	s := newSrc()
	var reads atomic.Int32
	source := s.source()
	read := source.Plan
	source.Plan = func(ctx context.Context) (uint64, *state.Plan, error) {
		defer reads.Add(1)
		return read(ctx)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done := make(chan struct{})
	go func() {
		b.r.Run(ctx, source, LoopConfig{Resync: time.Hour, MinBackoff: time.Hour, Debounce: time.Millisecond})
		close(done)
	}()
	s.set(1, plan)
	if r := s.waitReport(t, 1); !r.OnlyBackups() {
		t.Fatalf("under the fence: %q %+v", r.Error, r.Failures)
	}
	// Changes of the replica that leave this node's plan as it was: each
	// is read (the loop looked), none applied.
	for i := 0; i < 5; i++ {
		before := reads.Load()
		s.set(1, plan)
		for deadline := time.Now().Add(30 * time.Second); reads.Load() == before; time.Sleep(time.Millisecond) {
			if time.Now().After(deadline) {
				t.Fatal("the loop did not look at the change within 30 s")
			}
		}
	}
	lift()
	for r := s.waitReport(t, 1); r.Error != ""; r = s.waitReport(t, 1) {
		// (a report of a pass under the fence: counted below)
	}
	cancel()
	<-done
	if n := passes.Load(); n != 2 {
		t.Fatalf("%d passes; want 2 (under the fence, and once it was lifted)", n)
	}
}
