package reconciler

import (
	"context"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"mesh/state"
	"mesh/state/manifest"
)

// Moves (issue 30, item 4). FROM's reconciler stops the module while its
// data is copied (StopAll, inside Exclusive) and gives its steps' markers
// to the copy (MarkersOf); TO's takes them, and the data directories the
// copy made, into its ledger (Adopt), so its first apply of the module
// reruns no step that ran on FROM and treats the directories as the
// mesh's own data.

// StopAll removes every container of module this node's runtime holds
// (the plan of a stopped module names none of them any more); it says
// which.
func (r *Reconciler) StopAll(ctx context.Context, module string) ([]string, error) {
	list, err := r.rt.Managed(ctx)
	if err != nil {
		return nil, err
	}
	var stopped []string
	for _, c := range list {
		if c.Labels[LabelModule] != module {
			continue
		}
		if err := r.rt.Remove(ctx, c.ID); err != nil {
			return stopped, err
		}
		stopped = append(stopped, c.Name)
	}
	return stopped, nil
}

// HasContainers says module has containers here, running or not (StopAll
// removes them all).
func (r *Reconciler) HasContainers(ctx context.Context, module string) (bool, error) {
	list, err := r.rt.Managed(ctx)
	if err != nil {
		return false, err
	}
	return slices.ContainsFunc(list, func(c Container) bool { return c.Labels[LabelModule] == module }), nil
}

// MarkersOf are the markers of module's steps (MODULE.STEP -> marker).
func (r *Reconciler) MarkersOf(module string) map[string]Marker {
	out := map[string]Marker{}
	for name, m := range r.ledger.Markers {
		if strings.HasPrefix(name, module+".") {
			out[name] = m
		}
	}
	return out
}

// Adopt records, inside Exclusive, what a move brought: markers of
// module's steps, the data directories it wrote and the parents it made
// for them, each the mesh's own from now on (never removed but for
// --purge-data, as data made here would be). The markers are kept until
// the module's steps are in the plan, or until arr.Until passes (the move
// ended without starting here: it was aborted). within are the paths the
// module declares inside its data directories that came with the copy
// (path -> kind): each is the module's, as one its node made, with no
// digest of what the mesh wrote (DeclaredInData), so that the first apply
// here neither refuses it (exists and the mesh did not write it) nor
// overwrites it without a copy when it differs from the manifest's.
func (r *Reconciler) Adopt(module string, arr Arrival, markers map[string]Marker, data, parents []string, within map[string]string) error {
	// What the ledger held at each key this writes, to put back when the
	// save fails (a full disk): the ledger in memory never claims more
	// than the one on disk (Ledger.Put), and the caller puts back the
	// directories it swapped in.
	type was[T any] struct {
		v   T
		had bool
	}
	oldMarkers, oldPaths := map[string]was[Marker]{}, map[string]was[PathEntry]{}
	setPath := func(p string, e PathEntry) {
		if _, seen := oldPaths[p]; !seen {
			v, had := r.ledger.Paths[p]
			oldPaths[p] = was[PathEntry]{v, had}
		}
		r.ledger.Paths[p] = e
	}
	for name, m := range markers {
		if !strings.HasPrefix(name, module+".") {
			continue // a peer gives markers of its module's steps only
		}
		v, had := r.ledger.Markers[name]
		oldMarkers[name] = was[Marker]{v, had}
		r.ledger.Markers[name] = m
	}
	oldArriving, hadArriving := r.ledger.Arriving[module]
	if r.ledger.Arriving == nil {
		r.ledger.Arriving = map[string]Arrival{}
	}
	arr.Until = arr.Until.UTC()
	arr.Aside = maps.Clone(arr.Aside)
	r.ledger.Arriving[module] = arr
	for _, p := range parents {
		if _, ok := r.ledger.Paths[p]; !ok {
			setPath(p, PathEntry{Kind: manifest.KindDirectory, Module: module})
		}
	}
	for _, d := range data {
		setPath(d, PathEntry{Kind: manifest.KindDirectory, Module: module, Data: true})
	}
	for p, kind := range within {
		// An entry there already (the module's, from when it ran here:
		// what the mesh wrote, an original it took over) is kept whole.
		if _, ok := r.ledger.Paths[p]; !ok && slices.ContainsFunc(data, func(d string) bool { return p != d && manifest.Within(p, d) }) {
			setPath(p, PathEntry{Kind: kind, Module: module})
		}
	}
	if err := r.ledger.Save(); err != nil {
		for name, w := range oldMarkers {
			if w.had {
				r.ledger.Markers[name] = w.v
			} else {
				delete(r.ledger.Markers, name)
			}
		}
		for p, w := range oldPaths {
			if w.had {
				r.ledger.Paths[p] = w.v
			} else {
				delete(r.ledger.Paths, p)
			}
		}
		if hadArriving {
			r.ledger.Arriving[module] = oldArriving
		} else {
			delete(r.ledger.Arriving, module)
		}
		return err
	}
	return nil
}

// DeclaredInData is what Adopt takes as within: each path m declares
// strictly inside one of data (but a data directory itself), and each
// file the accepts-credentials directory holds there (a consumer's
// credential, delivered), that exists now, as the kind it is declared
// (or delivered) as; a path whose kind is not what is there is left out
// (the apply says so).
func DeclaredInData(m *manifest.Manifest, data []string) map[string]string {
	inside := func(p string) bool {
		return slices.ContainsFunc(data, func(d string) bool { return p != d && manifest.Within(p, d) })
	}
	out := map[string]string{}
	add := func(p, kind string) {
		if !inside(p) || slices.Contains(data, p) {
			return
		}
		fi, err := os.Lstat(p)
		if err != nil || fi.IsDir() != (kind == manifest.KindDirectory) || !fi.IsDir() && !fi.Mode().IsRegular() {
			return
		}
		out[p] = kind
	}
	for _, h := range m.Heads() {
		switch h.Kind {
		case manifest.KindContainer, manifest.KindStep:
		default:
			add(h.Name, h.Kind)
		}
	}
	if dir := m.AcceptsCredentials; dir != "" && (inside(dir) || slices.Contains(data, dir)) {
		if ents, err := os.ReadDir(dir); err == nil {
			for _, e := range ents {
				if strings.HasSuffix(e.Name(), ".credential") {
					add(filepath.Join(dir, e.Name()), state.KindDeliveredCredential)
				}
			}
		}
	}
	return out
}

// Arrived is, inside Exclusive, the copy of module's move swapped in here
// (Adopt) and not started yet, if it is move's.
func (r *Reconciler) Arrived(module string, move uint64) (Arrival, bool) {
	a, ok := r.ledger.Arriving[module]
	return a, ok && a.Move == move
}

// RefusedPath says why the host will not touch a path ("" when it will).
func (r *Reconciler) RefusedPath(p string) string { return r.refusedPath(p) }

// PathModule is the module the ledger gives path to ("" if none).
func (r *Reconciler) PathModule(path string) string { return r.ledger.Paths[path].Module }

// OwnerAt is the module the ledger gives path, or the first path under it,
// to ("" if none).
func (r *Reconciler) OwnerAt(path string) string {
	if e, ok := r.ledger.Paths[path]; ok {
		return e.Module
	}
	first := ""
	for p := range r.ledger.Paths {
		if manifest.Within(p, path) && (first == "" || p < first) {
			first = p
		}
	}
	return r.ledger.Paths[first].Module
}

// OthersUnder is a path the ledger gives to a module other than module at
// or under path ("" if none), the first in order: a move that set path's
// directory aside to swap its copy in would take that path with it, from
// under the other module's running containers.
func (r *Reconciler) OthersUnder(path, module string) string {
	var found []string
	for p, e := range r.ledger.Paths {
		if e.Module != module && manifest.Within(p, path) {
			found = append(found, p)
		}
	}
	slices.Sort(found)
	if len(found) == 0 {
		return ""
	}
	return found[0] + " (module " + r.ledger.Paths[found[0]].Module + ")"
}
