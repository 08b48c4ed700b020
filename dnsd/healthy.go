package dnsd

import "net/netip"

// Instance is one address a name may answer with, and whether it is fit to:
// its node is reachable and its container is not unhealthy.
type Instance struct {
	Addr netip.Addr
	Up   bool
}

// Answer is the addresses a name answers with: its instances that are up,
// or, when none is, all of them. An empty answer would turn a partial
// outage into a total one (and a wrong "down" into an outage); a client
// that reaches a bad instance still has its own retries.
func Answer(all []Instance) []netip.Addr {
	var up, every []netip.Addr
	for _, in := range all {
		every = append(every, in.Addr)
		if in.Up {
			up = append(up, in.Addr)
		}
	}
	if len(up) == 0 {
		return every
	}
	return up
}
