package state

import (
	"context"
	"strings"
	"time"

	"mesh/state/manifest"
)

// Reach is what a node knows of the others' reachability: when it last
// heard from each, as of Now; nodes not heard from since Started are given
// Within before they count as unreachable.
type Reach struct {
	Self     string
	LastSeen map[string]time.Time
	Now      time.Time
	Started  time.Time
	Within   time.Duration
}

// Fit says whether a roster entry is fit to answer with: its node is
// reachable (this node always is) and the module's containers there are not
// unhealthy in that node's last report. The resolver then answers the fit
// instances of a name, or all of them when none is (dnsd.Answer).
func Fit(reports map[string]Report, r Reach, domain string) func(Name) bool {
	unhealthy := make(map[string]map[string]bool, len(reports))
	for n, rep := range reports {
		unhealthy[n] = rep.Unhealthy()
	}
	return FitUnhealthy(unhealthy, r, domain)
}

// FitUnhealthy is Fit with each reported node's unhealthy modules
// (Report.Unhealthy) instead of its report: a node without an entry has
// not reported.
func FitUnhealthy(unhealthy map[string]map[string]bool, r Reach, domain string) func(Name) bool {
	return func(n Name) bool {
		if !r.Reachable(n.Node) {
			return false
		}
		u, ok := unhealthy[n.Node]
		if !ok {
			return true
		}
		return !u[strings.TrimSuffix(n.Name, "."+domain)]
	}
}

// Reachable says whether node counts as reachable: this node always does;
// another while it was heard from within r.Within, or, never heard from,
// while this node started less than r.Within ago.
func (r Reach) Reachable(node string) bool {
	if node == r.Self {
		return true
	}
	if at, ok := r.LastSeen[node]; ok {
		return r.Now.Sub(at) < r.Within
	}
	return r.Now.Sub(r.Started) < r.Within
}

// ProviderHealthy is a binding's health gate: the provider's instance on
// node passes every health check its manifest declares, as that node last
// reported. A provider that declares none passes once its node reported an
// apply without a failure of it. The string says why not.
func ProviderHealthy(man *manifest.Manifest, reports map[string]Report, node string) (bool, string) {
	rep, ok := reports[node]
	if !ok {
		return false, node + " has not reported an apply yet"
	}
	if f := rep.Failed(man.Module); f != nil {
		switch {
		case f.Backup != "" && f.Running:
			// It runs as it ran: a secret's file of it waits for a
			// backup to have read, its containers do not.
		case f.Wait():
			return false, "it waits on " + node + ": " + f.Reason
		default:
			return false, "it failed on " + node + ": " + f.Reason
		}
	}
	for i := range man.Resources {
		r := &man.Resources[i]
		if r.Kind() != manifest.KindContainer || r.Health == nil {
			continue
		}
		status := "not checked yet"
		for _, h := range rep.Health {
			if h.Module == man.Module && h.Container == r.Name() {
				status = h.Status
			}
		}
		if status != HealthHealthy {
			return false, "container " + r.Name() + " is " + status
		}
	}
	return true, ""
}

// ProviderHealthy reads the provider's manifest and the reports and says
// whether its instance on node passes (see the function of that name).
func (s *Store) ProviderHealthy(ctx context.Context, provider, node string) (bool, string) {
	man, err := s.Manifest(ctx, provider)
	if err != nil {
		return false, err.Error()
	}
	reps, err := s.Reports(ctx)
	if err != nil {
		return false, err.Error()
	}
	return ProviderHealthy(man, reps, node)
}
