package state

// Every command of every test in this package that composes incrementally
// also composes the whole fleet and compares (checkComposition): the
// package's tests of bindings, credentials, rollouts, moves and routes are
// the proof that affected misses no node.
//
// And the roster is cut into runs of three names, so that the tests' small
// fleets splice rosters of many runs (roster.go).
func init() { checkComposition, rosterRun = true, 3 }

// benchRuns gives a benchmark the runs a running node cuts its roster
// into, until the function it returns is called.
func benchRuns() func() {
	was := rosterRun
	rosterRun = defaultRosterRun
	return func() { rosterRun = was }
}
