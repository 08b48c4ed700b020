package state

// Every command of every test in this package that composes incrementally
// also composes the whole fleet and compares (checkComposition): the
// package's tests of bindings, credentials, rollouts, moves and routes are
// the proof that affected misses no node.
func init() { checkComposition = true }
