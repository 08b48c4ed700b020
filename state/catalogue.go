package state

import (
	"context"
	"fmt"
	"maps"
	"slices"

	"mesh/state/manifest"
)

// The catalogue the FSM keeps (Store.cat) is edited by the commands that
// write a module's row, instead of being read again from the table after
// each: at 10,000 modules reading it cost a module add 30 ms, three times
// (issue "scale"). A command edits it in place, with what each module
// reads of the others (Store.deps); one that does not commit makes the
// store forget both, for the next command to read the table again (a
// copy made for each command that edits it cost a module add 0.3 ms at
// 10,000 modules, twice that at 1,000). Readers outside the FSM read a
// copy made once per change (publishedCatalogue). With checkComposition
// on, every recompose compares the kept catalogue with the table
// (checkCatalogue).

// catalogue is every module's parsed form as the command being applied
// sees it: the catalogue the FSM keeps, as this command edited it so far,
// or the table for a command that rewrote it whole.
func (ap *applier) catalogue() (map[string]*manifest.Manifest, error) {
	s := ap.s
	switch {
	case ap.catWhole:
		cat, err := s.readCatalogue(ap.ctx, ap.tx)
		if err != nil {
			return nil, fmt.Errorf("read the catalogue: %w", err)
		}
		return cat, nil
	case s.cat != nil:
		return s.cat, nil
	}
	cat, err := s.readCatalogue(ap.ctx, ap.tx)
	if err != nil {
		return nil, fmt.Errorf("read the catalogue: %w", err)
	}
	s.cat, s.deps = cat, nil
	return cat, nil
}

// catalogueChanges says the command being applied rewrites the catalogue
// table whole (a restore): what the FSM keeps of it is no longer the
// truth, whether or not the command commits.
func (ap *applier) catalogueChanges() {
	ap.catWhole = true
	ap.s.cat, ap.s.deps = nil, nil
	ap.s.catPub.Store(nil)
}

// catalogueSet says the command writes module name's row of the catalogue
// table: m is its parsed form after (as readCatalogue would give it), nil
// when the row is removed.
func (ap *applier) catalogueSet(name string, m *manifest.Manifest) error {
	if ap.catWhole {
		return nil
	}
	cat, err := ap.catalogue()
	if err != nil {
		return err
	}
	ap.catEdited = true
	old := cat[name]
	if m == nil {
		delete(cat, name)
	} else {
		cat[name] = m
	}
	if d := ap.s.deps; d != nil {
		d.remove(name, old)
		d.add(name, m)
	}
	return nil
}

// deps is what the catalogue's modules read of each other, kept with the
// catalogue the FSM keeps (edited with it by catalogueSet).
func (ap *applier) deps(cat map[string]*manifest.Manifest) *catDeps {
	s := ap.s
	switch {
	case ap.catWhole:
		return depsOf(cat)
	case s.cat != nil:
		if s.deps == nil {
			s.deps = depsOf(s.cat)
		}
		return s.deps
	}
	return depsOf(cat)
}

// catalogueCommitted settles what the command applied did to the kept
// catalogue: committed (broken nil), its edits stand and the copy
// published for other readers is stale; refused, rolled back or failed,
// the store forgets the catalogue it edited.
func (ap *applier) catalogueCommitted(broken error) {
	s := ap.s
	if !ap.catEdited {
		return
	}
	s.catPub.Store(nil)
	if broken != nil {
		s.cat, s.deps = nil, nil
	}
}

// publishedCatalogue is the catalogue as of the last commit, for readers
// outside the FSM (a proposer's checks): a copy of the one the FSM keeps,
// which it edits in place, made once per change between two commands
// (applyMu held); when a command or a restore holds applyMu, or the FSM
// keeps no catalogue, it is read from the table, as it was before the
// FSM kept one: a reader never waits on the FSM (a restore, a catch-up of
// 256 commands, a full disk's retries).
func (s *Store) publishedCatalogue(ctx context.Context) (map[string]*manifest.Manifest, error) {
	if p := s.catPub.Load(); p != nil {
		return *p, nil
	}
	if s.applyMu.TryLock() {
		if s.cat != nil {
			c := maps.Clone(s.cat)
			s.catPub.Store(&c)
			s.applyMu.Unlock()
			return c, nil
		}
		s.applyMu.Unlock()
	}
	return s.readCatalogue(ctx, s.db)
}

// remove takes what m (module name's manifest) read of other modules out
// of d: name from the consumers of each provider m names, its
// credentials, and its routes' names and hosts.
func (d *catDeps) remove(name string, m *manifest.Manifest) {
	if m == nil {
		return
	}
	for i := range m.Resources {
		r := &m.Resources[i]
		switch r.Kind() {
		case manifest.KindCredential, manifest.KindBinding:
			removeFrom(d.consumers, r.Provider, name)
		}
	}
	delete(d.credentials, name)
	for _, r := range m.Routes {
		removeFrom(d.routed, r.Name, name)
		for _, h := range r.Hosts {
			removeFrom(d.hosted, h, name)
		}
	}
}

// removeFrom takes name out of the list of key, into a copy (a list
// given out before, to affected or the rule on host names, stays as it
// was).
func removeFrom(lists map[string][]string, key, name string) {
	list, ok := lists[key]
	if !ok || !slices.Contains(list, name) {
		return
	}
	list = slices.DeleteFunc(slices.Clone(list), func(c string) bool { return c == name })
	if len(list) == 0 {
		delete(lists, key)
	} else {
		lists[key] = list
	}
}

// checkCatalogue compares the catalogue the command sees (kept, or edited
// by it) with the table's, read whole: the same modules, each with the
// same digest and file (checkComposition). A difference is a write to the
// table that catalogueSet was not told of.
func (ap *applier) checkCatalogue(cat map[string]*manifest.Manifest) error {
	table, err := ap.s.readCatalogue(ap.ctx, ap.tx)
	if err != nil {
		return fmt.Errorf("check the catalogue: %w", err)
	}
	for name, m := range table {
		k, ok := cat[name]
		switch {
		case !ok:
			return fmt.Errorf("the catalogue kept lacks module %s, which the table has", name)
		case k.Digest != m.Digest || k.File != m.File:
			return fmt.Errorf("the catalogue kept has module %s at %s (%s), the table at %s (%s)", name, shortDigest(k.Digest), k.File, shortDigest(m.Digest), m.File)
		}
	}
	for name := range cat {
		if _, ok := table[name]; !ok {
			return fmt.Errorf("the catalogue kept has module %s, which the table lacks", name)
		}
	}
	return nil
}

// sameDeps says d and e say the same of which module reads which (each
// list taken as a set: affected reads them so).
func sameDeps(d, e *catDeps) bool {
	same := func(a, b map[string][]string) bool {
		set := func(l []string) []string { return slices.Compact(slices.Sorted(slices.Values(l))) }
		for k, l := range a {
			if !slices.Equal(set(l), set(b[k])) {
				return false
			}
		}
		for k, l := range b {
			if _, ok := a[k]; !ok && len(l) > 0 {
				return false
			}
		}
		return true
	}
	return same(d.consumers, e.consumers) && same(d.credentials, e.credentials) && same(d.hosted, e.hosted) && same(d.routed, e.routed)
}
