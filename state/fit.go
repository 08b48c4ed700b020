package state

import (
	"strings"
	"time"
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
	return func(n Name) bool {
		if n.Node != r.Self {
			at, ok := r.LastSeen[n.Node]
			switch {
			case ok && r.Now.Sub(at) >= r.Within:
				return false
			case !ok && r.Now.Sub(r.Started) >= r.Within:
				return false
			}
		}
		rep, ok := reports[n.Node]
		if !ok {
			return true
		}
		return !rep.Unhealthy()[strings.TrimSuffix(n.Name, "."+domain)]
	}
}
