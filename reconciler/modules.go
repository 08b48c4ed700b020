package reconciler

import (
	"context"
	"fmt"
	"strings"
	"sync"

	"mesh/state"
	"mesh/state/manifest"
)

// ApplyConcurrency is how many modules apply at once. A module's own
// resources always apply one after the other, in the order written.
const ApplyConcurrency = 4

// applyModules applies the plan's resources and returns their reports in
// plan order. Each module applies in its own goroutine, its resources in the
// order written; a module waits for every module before it in the plan that
// it relates to (related), so every order the plan could rely on holds as
// when all ran one after the other: a provider before its consumers, a
// parent directory before what is under it, a path before the containers
// that mount it. Unrelated modules overlap their Podman calls, the slow part
// of an apply (a container's start takes a quarter of a second); all else
// stays one at a time under x.mu.
func (x *run) applyModules(ctx context.Context, plan *state.Plan) []state.ResourceReport {
	type group struct {
		module string
		idx    []int
		deps   []*group
		refs   moduleRefs
		done   chan struct{}
	}
	var groups []*group
	byModule := map[string]*group{}
	for i, res := range plan.Resources {
		g := byModule[res.Module]
		if g == nil {
			g = &group{module: res.Module, done: make(chan struct{})}
			byModule[res.Module] = g
			groups = append(groups, g)
		}
		g.idx = append(g.idx, i)
	}
	for _, g := range groups {
		g.refs = refsOf(plan, g.idx)
	}
	for i, later := range groups {
		for _, earlier := range groups[:i] {
			if related(earlier.module, earlier.refs, later.module, later.refs) {
				later.deps = append(later.deps, earlier)
			}
		}
	}
	outs := make([]state.ResourceReport, len(plan.Resources))
	x.rt = unlocking(x.counted, &x.mu)
	defer func() { x.rt = x.counted }()
	sem := make(chan struct{}, ApplyConcurrency)
	var wg sync.WaitGroup
	var crash panicked
	for _, g := range groups {
		wg.Add(1)
		go func() {
			defer wg.Done()
			defer close(g.done)
			defer crash.catch()
			for _, d := range g.deps {
				<-d.done
			}
			sem <- struct{}{}
			defer func() { <-sem }()
			x.mu.Lock()
			defer x.mu.Unlock()
			for _, i := range g.idx {
				if crash.happened() {
					return
				}
				outs[i] = x.applyOne(ctx, plan.Resources[i])
			}
		}()
	}
	wg.Wait()
	crash.rethrow()
	return outs
}

// panicked carries a panic out of the goroutines of an apply to the one
// that called Apply, as if they had been one: nothing more starts once one
// panicked, and Apply panics with the first value.
type panicked struct {
	mu  sync.Mutex
	val any
	set bool
}

func (p *panicked) catch() {
	if r := recover(); r != nil {
		p.mu.Lock()
		if !p.set {
			p.val, p.set = r, true
		}
		p.mu.Unlock()
	}
}

func (p *panicked) happened() bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.set
}

func (p *panicked) rethrow() {
	if p.happened() {
		panic(p.val)
	}
}

// applyOne applies one resource, or reports it waiting behind a failure of
// its module or of its provider; x.mu is held.
func (x *run) applyOne(ctx context.Context, res state.Resource) state.ResourceReport {
	var out state.ResourceReport
	if f := x.blocked(res); f != nil {
		out = report(res, state.Waiting, f.WaitReason(res.Module)+x.takeBack(ctx, res))
		f.Waiting = append(f.Waiting, res.RuntimeName())
	} else {
		out = x.apply(ctx, res)
	}
	if out.Outcome != state.Unchanged && out.Outcome != state.Waiting {
		x.r.logLine(out)
	}
	if out.Outcome == state.Failed {
		x.failed[res.Module] = &state.ModuleFailure{Module: res.Module, Resource: res.Kind + " " + res.RuntimeName(), Reason: out.Reason}
	} else if out.Outcome != state.Waiting && res.Kind == manifest.KindBinding && res.Decl.Healthy {
		x.gate(ctx, res)
	}
	return out
}

// gate holds the rest of a module at a binding with `healthy: true` until
// the provider's instance it points at is healthy. The wait is a failure of
// its own kind (HealthGate): the node tries again as health changes,
// without backing off, and --wait waits through it.
func (x *run) gate(ctx context.Context, res state.Resource) {
	if x.r.cfg.ProviderHealthy == nil {
		return
	}
	node := ""
	for _, l := range strings.Split(res.Content, "\n") {
		if v, ok := strings.CutPrefix(l, "node="); ok {
			node = v
		}
	}
	ok, why := x.r.cfg.ProviderHealthy(ctx, res.Decl.Provider, node)
	if ok {
		return
	}
	x.failed[res.Module] = &state.ModuleFailure{Module: res.Module, Resource: res.Kind + " " + res.Name,
		Reason: fmt.Sprintf("waits for %s on %s to be healthy: %s", res.Decl.Provider, node, why), Provider: res.Decl.Provider, HealthGate: true}
}

// moduleRefs is what a module's resources touch outside Podman: the paths
// it declares, the paths its containers and steps mount or restart on, and
// the modules it takes a binding or a credential from (or delivers one to).
type moduleRefs struct {
	paths   []string
	modules map[string]bool
	// unknown: a resource whose values were never parsed (a plan written
	// before typed values travelled in plans): relate it to everything.
	unknown bool
}

func refsOf(plan *state.Plan, idx []int) moduleRefs {
	r := moduleRefs{modules: map[string]bool{}}
	for _, i := range idx {
		res := plan.Resources[i]
		if !res.Typed.OK {
			r.unknown = true
		}
		switch res.Kind {
		case manifest.KindStep, manifest.KindContainer:
			for _, m := range res.Typed.Mounts {
				r.paths = append(r.paths, m.Source)
			}
		default:
			r.paths = append(r.paths, res.Name)
		}
		for _, p := range res.Decl.RestartOn {
			if strings.HasPrefix(p, "/") {
				r.paths = append(r.paths, p)
			}
		}
		if res.Decl.Provider != "" {
			r.modules[res.Decl.Provider] = true
		}
		if c := res.Credential; c != nil {
			r.modules[c.Consumer] = true
			r.modules[c.Provider] = true
		}
	}
	return r
}

// related says whether two modules of a plan must not apply at once: one
// names the other (a binding, a credential), or a path of one is, or is
// under or above, a path of the other.
func related(a string, ra moduleRefs, b string, rb moduleRefs) bool {
	if ra.unknown || rb.unknown || ra.modules[b] || rb.modules[a] {
		return true
	}
	for _, p := range ra.paths {
		for _, q := range rb.paths {
			if overlaps(p, q) {
				return true
			}
		}
	}
	return false
}

// overlaps: p and q are the same path, or one is under the other.
func overlaps(p, q string) bool {
	p, q = strings.TrimSuffix(p, "/"), strings.TrimSuffix(q, "/")
	if len(p) > len(q) {
		p, q = q, p
	}
	return p == q || strings.HasPrefix(q, p+"/") || p == ""
}

// unlocking lets go of the apply's lock for the length of each Podman call,
// so that another module's work goes on meanwhile.
func unlocking(rt Runtime, mu *sync.Mutex) Runtime {
	return &Around{Runtime: rt,
		Before: func(string, bool) { mu.Unlock() },
		After:  func(context.Context, string, error) { mu.Lock() }}
}
