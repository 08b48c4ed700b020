package state

import (
	"iter"
	"sort"
)

// A Roster is the mesh's names, sorted as SortRoster sorts them, held in
// runs of about rosterRun rows that successive rosters share: a command
// that moves a few names makes a roster that shares every run but the ones
// those names fall in (Roster.spliced). The store keeps the roster of the
// last command, readers hold it without a copy, and nothing changes a run
// once a Roster holds it. At 10,000 modules a copy of the whole roster on
// each assign (0.4 MB) was half of what an assign allocated, and the
// collections that garbage brought made the slowest applies and answers
// (issue "scale"): an apply that overlaps a collection's marking takes two
// to four times as long.
type Roster struct {
	runs [][]Name
	n    int
}

// rosterRun is the length of the runs a roster is cut into (a var for the
// tests, which cut rosters into runs of a few names).
var rosterRun = defaultRosterRun

const defaultRosterRun = 256

// NewRoster is the roster of names, sorted as SortRoster sorts them and
// without duplicates; the roster holds names, which the caller no longer
// changes.
func NewRoster(names []Name) Roster {
	r := Roster{n: len(names)}
	for len(names) > 0 {
		k := min(len(names), rosterRun)
		r.runs = append(r.runs, names[:k:k])
		names = names[k:]
	}
	return r
}

// Len is how many names the roster holds.
func (r Roster) Len() int { return r.n }

// Names is the roster's names in one slice of the caller's.
func (r Roster) Names() []Name {
	out := make([]Name, 0, r.n)
	for _, run := range r.runs {
		out = append(out, run...)
	}
	return out
}

// Runs is the roster's runs, in order, shared: the caller changes none.
// Two rosters that hold the same run (RunsShared) hold the same names in it.
func (r Roster) Runs() [][]Name { return r.runs }

// RunsShared says runs a and b of two rosters are the same run: the same
// names, without comparing them.
func RunsShared(a, b []Name) bool {
	return len(a) == len(b) && (len(a) == 0 || &a[0] == &b[0])
}

// All is the roster's names in order.
func (r Roster) All() iter.Seq[Name] {
	return func(yield func(Name) bool) {
		for _, run := range r.runs {
			for _, x := range run {
				if !yield(x) {
					return
				}
			}
		}
	}
}

// Named is the roster's rows of one name, in order (a name's rows may
// span two runs).
func (r Roster) Named(name string) iter.Seq[Name] {
	return func(yield func(Name) bool) {
		i := sort.Search(len(r.runs), func(i int) bool { run := r.runs[i]; return run[len(run)-1].Name >= name })
		for ; i < len(r.runs); i++ {
			run := r.runs[i]
			k := sort.Search(len(run), func(k int) bool { return run[k].Name >= name })
			for ; k < len(run); k++ {
				if run[k].Name != name || !yield(run[k]) {
					return
				}
			}
		}
	}
}

// has says the roster holds a row of n's name and address.
func (r Roster) has(n Name) bool {
	notBefore := func(x Name) bool { return x.Name > n.Name || x.Name == n.Name && x.Address >= n.Address }
	i := sort.Search(len(r.runs), func(i int) bool { run := r.runs[i]; return notBefore(run[len(run)-1]) })
	if i == len(r.runs) {
		return false
	}
	run := r.runs[i]
	k := sort.Search(len(run), func(k int) bool { return notBefore(run[k]) })
	return k < len(run) && run[k].Name == n.Name && run[k].Address == n.Address
}

// spliced is the roster without theirs (rows it holds) and with mine (rows
// it does not hold, of the nodes theirs are of), both sorted: spliceNames
// of each run the change falls in, every other run shared. A run that
// grows past twice rosterRun is cut; one that shrinks under a quarter of
// it joins the run before, so that runs stay few however the names move.
func (r Roster) spliced(theirs, mine []Name) Roster {
	out := Roster{runs: make([][]Name, 0, len(r.runs)+1), n: r.n - len(theirs) + len(mine)}
	put := func(run []Name) {
		if len(run) == 0 {
			return
		}
		if k := len(out.runs) - 1; k >= 0 && (len(run) < rosterRun/4 || len(out.runs[k]) < rosterRun/4) {
			joined := make([]Name, 0, len(out.runs[k])+len(run))
			joined = append(append(joined, out.runs[k]...), run...)
			out.runs, run = out.runs[:k], joined
		}
		for len(run) > 2*rosterRun {
			out.runs = append(out.runs, run[:rosterRun:rosterRun])
			run = run[rosterRun:]
		}
		out.runs = append(out.runs, run[:len(run):len(run)])
	}
	for i, run := range r.runs {
		last := run[len(run)-1]
		upTo := func(rows []Name) int { // how many of rows sort at or before last
			return sort.Search(len(rows), func(k int) bool { return RosterLess(last, rows[k]) })
		}
		t, m := upTo(theirs), upTo(mine)
		if i == len(r.runs)-1 {
			m = len(mine)
		}
		if t == 0 && m == 0 {
			out.runs = append(out.runs, run)
			continue
		}
		put(spliceNames(run, theirs[:t], mine[:m]))
		theirs, mine = theirs[t:], mine[m:]
	}
	if len(r.runs) == 0 {
		put(append([]Name(nil), mine...))
	}
	return out
}
