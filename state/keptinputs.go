package state

import (
	"context"
	"database/sql"
	"fmt"
	"maps"
	"slices"
)

// The tables an input reads whole, as the FSM keeps them (issue "scale",
// item 1). A composition reads each credential's digest, each secret's,
// each container's restart and each module's last pull, and inputWith
// read the four tables whole for every command that recomposes: in a
// fleet of 10,000 modules that bind to databases, take credentials and
// read secrets, that is tens of thousands of rows for an assign that
// changes one (BenchmarkFleet's wired fleet). The store keeps them in
// memory as the last committed command left them; a command marks each
// key it writes (markCredential, markSecret, markRestart, markPull, or
// forgetInputs where it rewrites a table whole), and the keys it marked
// are read again from the table, inside the command's transaction, before
// an input is made of them (ap.inputs) and before the command commits
// (settleInputs). The table stays the truth: a mark says only "read this
// row again", never what was written. As with the assignments, the
// command edits the store's maps in place and the store keeps none until
// it commits: after a broken rule or a failure the next command reads the
// tables whole. With checkComposition on (the tests, the beds, the fuzz
// targets), every input made of the kept maps is compared with the tables
// read whole: a write that does not mark its key fails there.

// keptInputs are the four tables an input reads whole, by key.
type keptInputs struct {
	credentials map[Pair]string
	// consumers are each provider's consumers with a credential, sorted
	// (consumersOf's index).
	consumers map[string][]string
	secrets   map[SecretRef]string
	restarts  map[RestartKey]uint64
	pulls     map[string]uint64
}

// inputMarks are the keys a command wrote and has not read again.
type inputMarks struct {
	credentials map[Pair]bool
	secrets     map[SecretRef]bool
	restarts    map[RestartKey]bool
	pulls       map[string]bool
	// all: a table was rewritten whole (or a key could not be named): read
	// the four again.
	all bool
}

func (m *inputMarks) empty() bool {
	return !m.all && len(m.credentials) == 0 && len(m.secrets) == 0 && len(m.restarts) == 0 && len(m.pulls) == 0
}

func (ap *applier) markCredential(p Pair)    { mark(&ap.marks.credentials, p) }
func (ap *applier) markSecret(r SecretRef)   { mark(&ap.marks.secrets, r) }
func (ap *applier) markRestart(k RestartKey) { mark(&ap.marks.restarts, k) }
func (ap *applier) markPull(module string)   { mark(&ap.marks.pulls, module) }

// mark adds k to the set *set, made at its first mark.
func mark[K comparable](set *map[K]bool, k K) {
	if *set == nil {
		*set = map[K]bool{}
	}
	(*set)[k] = true
}

// markRestartsOf follows a DELETE of every restart of module: each kept
// key of it is marked (the restarts are few: one per scope restarted).
func (ap *applier) markRestartsOf(module string) {
	k := ap.inputs
	if !ap.inputsTaken {
		k = ap.s.inputs
	}
	if k == nil {
		return // nothing kept: the next input reads the table
	}
	for r := range k.restarts {
		if r.Module == module {
			ap.markRestart(r)
		}
	}
}

// forgetInputs follows a write whose keys are not named one by one.
func (ap *applier) forgetInputs() { ap.marks.all = true }

// keptInputsNow is the four tables as this command left them so far: the
// kept maps with the keys it marked read again, or the tables read whole.
// The maps are the command's own from here on (the store keeps none until
// it commits).
func (ap *applier) keptInputsNow() (*keptInputs, error) {
	if !ap.inputsTaken {
		ap.inputsTaken = true
		ap.inputs, ap.s.inputs = ap.s.inputs, nil
	}
	k, m := ap.inputs, &ap.marks
	var err error
	if k == nil || m.all {
		k, err = readInputs(ap.ctx, ap.q)
	} else {
		err = ap.readMarked(k)
	}
	if err != nil {
		ap.inputs = nil
		return nil, err
	}
	ap.inputs, ap.marks = k, inputMarks{}
	return k, nil
}

// readMarked reads again the rows of the keys marked, into k.
func (ap *applier) readMarked(k *keptInputs) error {
	m, q, ctx := &ap.marks, ap.q, ap.ctx
	for p := range m.credentials {
		var d string
		switch err := q.QueryRowContext(ctx, `SELECT digest FROM credentials WHERE consumer = ? AND provider = ?`, p.Consumer, p.Provider).Scan(&d); err {
		case nil:
			if _, had := k.credentials[p]; !had {
				cs := k.consumers[p.Provider]
				i, _ := slices.BinarySearch(cs, p.Consumer)
				k.consumers[p.Provider] = slices.Insert(slices.Clip(cs), i, p.Consumer)
			}
			k.credentials[p] = d
		case sql.ErrNoRows:
			if _, had := k.credentials[p]; had {
				cs := slices.Clone(k.consumers[p.Provider])
				if i, found := slices.BinarySearch(cs, p.Consumer); found {
					cs = slices.Delete(cs, i, i+1)
				}
				if len(cs) == 0 {
					delete(k.consumers, p.Provider)
				} else {
					k.consumers[p.Provider] = cs
				}
			}
			delete(k.credentials, p)
		default:
			return fmt.Errorf("read the credential %s -> %s: %w", p.Consumer, p.Provider, err)
		}
	}
	for r := range m.secrets {
		var d string
		switch err := q.QueryRowContext(ctx, `SELECT digest FROM secrets WHERE module = ? AND name = ?`, r.Module, r.Name).Scan(&d); err {
		case nil:
			k.secrets[r] = d
		case sql.ErrNoRows:
			delete(k.secrets, r)
		default:
			return fmt.Errorf("read the secret %s: %w", r, err)
		}
	}
	for r := range m.restarts {
		var i uint64
		switch err := q.QueryRowContext(ctx, `SELECT idx FROM restarts WHERE module = ? AND container = ? AND node = ?`, r.Module, r.Container, r.Node).Scan(&i); err {
		case nil:
			k.restarts[r] = i
		case sql.ErrNoRows:
			delete(k.restarts, r)
		default:
			return fmt.Errorf("read the restart of %s: %w", r.Container, err)
		}
	}
	for mod := range m.pulls {
		var i uint64
		switch err := q.QueryRowContext(ctx, `SELECT idx FROM pulls WHERE module = ?`, mod).Scan(&i); err {
		case nil:
			k.pulls[mod] = i
		case sql.ErrNoRows:
			delete(k.pulls, mod)
		default:
			return fmt.Errorf("read the last pull of %s: %w", mod, err)
		}
	}
	return nil
}

// settleInputs reads again, before the command commits, the keys it
// marked since its last input, so that what the store keeps once it
// commits is the tables. A command that took nothing and marked nothing
// leaves the store's maps alone.
func (ap *applier) settleInputs() error {
	if ap.marks.empty() {
		return nil
	}
	if !ap.inputsTaken && ap.s.inputs == nil {
		ap.marks = inputMarks{} // nothing kept to settle
		return nil
	}
	_, err := ap.keptInputsNow()
	return err
}

// inputsCommitted is the end of a command for the kept maps: those it
// took go back to the store when it committed and broke no rule.
func (s *Store) inputsCommitted(ap *applier, broken error) {
	if ap.inputsTaken && broken == nil {
		s.inputs = ap.inputs
	}
}

// readInputs reads the four tables whole.
func readInputs(ctx context.Context, q queryer) (*keptInputs, error) {
	k := &keptInputs{credentials: map[Pair]string{}, restarts: map[RestartKey]uint64{}, pulls: map[string]uint64{}}
	err := eachRow(ctx, q, "credentials", `SELECT consumer, provider, digest FROM credentials`, func(rows *sql.Rows) error {
		var p Pair
		var d string
		if err := rows.Scan(&p.Consumer, &p.Provider, &d); err != nil {
			return err
		}
		k.credentials[p] = d
		return nil
	})
	if err != nil {
		return nil, err
	}
	k.consumers = consumersIndex(k.credentials)
	if k.secrets, err = secretDigests(ctx, q); err != nil {
		return nil, err
	}
	err = eachRow(ctx, q, "restarts", `SELECT module, container, node, idx FROM restarts`, func(rows *sql.Rows) error {
		var r RestartKey
		var i uint64
		if err := rows.Scan(&r.Module, &r.Container, &r.Node, &i); err != nil {
			return err
		}
		k.restarts[r] = i
		return nil
	})
	if err != nil {
		return nil, err
	}
	err = eachRow(ctx, q, "pulls", `SELECT module, idx FROM pulls`, func(rows *sql.Rows) error {
		var m string
		var i uint64
		if err := rows.Scan(&m, &i); err != nil {
			return err
		}
		k.pulls[m] = i
		return nil
	})
	if err != nil {
		return nil, err
	}
	return k, nil
}

// consumersIndex is keptInputs.consumers of credentials.
func consumersIndex(credentials map[Pair]string) map[string][]string {
	out := map[string][]string{}
	for p := range credentials {
		out[p.Provider] = append(out[p.Provider], p.Consumer)
	}
	for _, cs := range out {
		slices.Sort(cs)
	}
	return out
}

// checkInputs compares kept maps with the tables read whole.
func checkInputs(ctx context.Context, q queryer, k *keptInputs) error {
	read, err := readInputs(ctx, q)
	if err != nil {
		return err
	}
	for _, c := range []struct {
		what string
		same bool
	}{
		{"credentials", maps.Equal(k.credentials, read.credentials)},
		{"secrets", maps.Equal(k.secrets, read.secrets)},
		{"restarts", maps.Equal(k.restarts, read.restarts)},
		{"pulls", maps.Equal(k.pulls, read.pulls)},
		{"consumers of each provider", maps.EqualFunc(k.consumers, read.consumers, slices.Equal)},
	} {
		if !c.same {
			return fmt.Errorf("the kept %s are not the table's: a write to it did not mark its key", c.what)
		}
	}
	return nil
}
