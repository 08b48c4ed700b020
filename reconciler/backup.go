package reconciler

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"

	"mesh/state"
	"mesh/state/manifest"
)

// Backups and restores of a module's data (issue 30, item 2). The agent
// runs restic; the reconciler gives it the node to itself (Exclusive:
// never during an apply or a scheduled step, and one at a time) for a
// restore and a backup that pauses, and for the start of one that does
// not (see FenceSecrets), runs the module's before-backup steps and pauses
// its containers when it asks (Quiesce), and stops them for a restore
// (StopAll), the next pass starting them again as the plan says.

// Pauser freezes a container's processes and lets them run again
// (Podman's pause and unpause).
type Pauser interface {
	Pause(ctx context.Context, id string) error
	Unpause(ctx context.Context, id string) error
}

// pauser is Config.Pauser, or the runtime when it is one; nil if neither.
func (r *Reconciler) pauser() Pauser {
	if r.cfg.Pauser != nil {
		return r.cfg.Pauser
	}
	p, _ := r.rt.(Pauser)
	return p
}

// Exclusive runs f while no apply, scheduled step or other backup runs on
// this node; it waits for one that runs to end, or for ctx.
func (r *Reconciler) Exclusive(ctx context.Context, f func(ctx context.Context) error) error {
	select {
	case r.pass <- struct{}{}:
	case <-ctx.Done():
		return fmt.Errorf("wait for the node's apply to end: %w", ctx.Err())
	}
	defer func() { <-r.pass }()
	return f(ctx)
}

// DataDirs are the data directories (data: true) plan gives module here.
func DataDirs(plan *state.Plan, module string) []string {
	var out []string
	for _, res := range plan.Resources {
		if res.Module == module && res.Kind == manifest.KindDirectory && res.Decl.Data {
			out = append(out, res.Name)
		}
	}
	return out
}

// SecretsUnder lists the files of the plan that hold a secret (a secret's
// file, a credential, a delivered credential), of any module, inside any
// of dirs: a backup leaves them out. The repository's password is sealed
// to every node, so a node that may not open a secret could read it from
// a snapshot, and a value rotated or removed would stay in the snapshots;
// the reconciler writes them again after a restore.
func SecretsUnder(plan *state.Plan, dirs []string) []string {
	var out []string
	for _, res := range plan.Resources {
		if !holdsSecret(res.Kind) {
			continue
		}
		if slices.ContainsFunc(dirs, func(d string) bool { return manifest.Within(res.Name, d) }) {
			out = append(out, res.Name)
		}
	}
	return out
}

// SecretFilesUnder lists the files the ledger says the mesh wrote a secret
// into (a secret's file, a credential, a delivered credential), of any
// module, inside any of dirs, sorted: what is on the disk, which a plan
// read before the node was held need not say (an apply since wrote a new
// one; one the plan no longer names is not removed yet). Call it inside
// Exclusive, where no apply writes the ledger.
func (r *Reconciler) SecretFilesUnder(dirs []string) []string {
	var out []string
	for p, e := range r.ledger.Paths {
		if !holdsSecret(e.Kind) {
			continue
		}
		if slices.ContainsFunc(dirs, func(d string) bool { return manifest.Within(p, d) }) {
			out = append(out, p)
		}
	}
	slices.Sort(out)
	return out
}

// holdsSecret says a file of kind holds a secret: a secret's file, a
// credential, a delivered credential. A backup leaves them out.
func holdsSecret(kind string) bool {
	switch kind {
	case manifest.KindSecret, manifest.KindCredential, state.KindDeliveredCredential:
		return true
	}
	return false
}

// A backup whose containers are not paused reads the data while the
// node's applies go on (a backup of hundreds of gigabytes held every
// change of the node for hours). What it leaves out, the secrets' files
// under the data directories, is listed while the node is held; an apply
// meanwhile could write a new one there, or a new value of one listed
// (its temporary file beside it, which the list does not name), which
// restic would copy into a snapshot that every node can open. So the
// backup fences its directories (FenceSecrets, in the same hold as the
// list): until it lifts the fence, a secret's file that is to be written
// there waits, with the rest of its module (ModuleFailure.Backup: a wait,
// not an error, which would stop the module's rollout), and the node's
// apply goes on with its other modules (it once waited at the file, and a
// backup of hours held every change of the node behind a delivered
// credential or a rotation). A secret's file that holds its bytes already
// is gone over as ever (every apply visits it). The backup lifts its
// fence as soon as restic has read, which asks for a pass (ApplySoon):
// that pass writes what waited.

// fence is one backup's: its module and directories, and the paths that
// waited for it (said once in the log).
type fence struct {
	module string
	dirs   []string
	waited map[string]bool
}

// FenceSecrets fences dirs for module's backup until lift is called
// (once, or more: the later calls do nothing). Call it inside Exclusive,
// in the hold that listed what the backup leaves out, and lift it
// whatever happens after: a module may wait on it.
func (r *Reconciler) FenceSecrets(module string, dirs []string) (lift func()) {
	f := &fence{module: module, dirs: slices.Clone(dirs), waited: map[string]bool{}}
	r.fenceMu.Lock()
	if r.fences == nil {
		r.fences = map[*fence]bool{}
	}
	r.fences[f] = true
	r.fenceMu.Unlock()
	var once sync.Once
	return func() {
		once.Do(func() {
			r.fenceMu.Lock()
			delete(r.fences, f)
			r.fenceMu.Unlock()
			// A pass now writes what waited for the fence.
			r.ApplySoon()
		})
	}
}

// firstWait says whether path waits for f for the first time, and marks
// that it did.
func (r *Reconciler) firstWait(f *fence, path string) bool {
	r.fenceMu.Lock()
	defer r.fenceMu.Unlock()
	if f.waited[path] {
		return false
	}
	f.waited[path] = true
	return true
}

// fencedAt is a fence that keeps a secret's file from path now, and the
// directory of it that holds path; nil when none does.
func (r *Reconciler) fencedAt(path string) (*fence, string) {
	r.fenceMu.Lock()
	defer r.fenceMu.Unlock()
	for f := range r.fences {
		for _, d := range f.dirs {
			if manifest.Within(path, d) {
				return f, d
			}
		}
	}
	return nil, ""
}

// Quiesce readies module's data for a copy, inside Exclusive: its
// before-backup steps run, in the plan's order (one that fails stops the
// backup, said), then, with pause, its running containers are paused.
// resume unpauses them; it is safe to call once whatever Quiesce returned.
func (r *Reconciler) Quiesce(ctx context.Context, plan *state.Plan, module string, pause bool) (resume func(), err error) {
	resume = func() {}
	x := r.newRun(plan)
	for _, res := range plan.Resources {
		if res.Kind != manifest.KindStep && res.Kind != manifest.KindContainer {
			x.kinds[res.Name] = res.Kind
		}
	}
	for _, res := range plan.Resources {
		if res.Module != module || res.Kind != manifest.KindStep || !res.Decl.BeforeBackup {
			continue
		}
		want := describe(res, r.cfg.DNS, plan.PublishAddress, r.networkOf(res.Module), nil)
		if c, found, err := r.rt.Lookup(ctx, want.Name); err == nil && found && c.Labels[LabelManaged] == "1" {
			r.rt.Remove(context.WithoutCancel(ctx), c.ID) // left by a run an agent's end cut short
		}
		id, rr, ok := x.stepRun(ctx, res, want, "")
		if id != "" {
			r.rt.Remove(context.WithoutCancel(ctx), id)
		}
		if !ok {
			return resume, fmt.Errorf("before-backup step %s failed: %s", res.RuntimeName(), rr.Reason)
		}
		r.log.Info("ran before-backup step", "step", res.RuntimeName())
	}
	if !pause {
		return resume, nil
	}
	p := r.pauser()
	if p == nil {
		return resume, errors.New("this node's runtime cannot pause containers")
	}
	var paused []string
	resume = func() {
		for _, id := range paused {
			if err := p.Unpause(context.WithoutCancel(ctx), id); err != nil {
				r.log.Warn("unpause after the backup", "container", id, "err", err)
			}
		}
	}
	// Every running container of the module, by its label: the plan read
	// before the node was this backup's may name fewer.
	list, err := r.rt.Managed(ctx)
	if err != nil {
		return resume, err
	}
	for _, c := range list {
		if c.Labels[LabelModule] != module || !c.Running {
			continue
		}
		if err := p.Pause(ctx, c.ID); err != nil {
			resume()
			return func() {}, err
		}
		paused = append(paused, c.ID)
	}
	return resume, nil
}

// unpauseLeftovers unpauses the mesh's containers found paused at an
// apply: no backup runs meanwhile (Exclusive), so each was left paused by a
// backup that the agent's end cut short (or paused by hand, which the mesh
// does not keep, as it keeps no other drift).
func (r *Reconciler) unpauseLeftovers(ctx context.Context, x *run) {
	p := r.pauser()
	if p == nil {
		return
	}
	for name, c := range x.managed {
		if c.State != "paused" {
			continue
		}
		if err := p.Unpause(ctx, c.ID); err != nil {
			r.log.Warn("unpause a container left paused", "container", name, "err", err)
			continue
		}
		r.log.Info("unpaused a container a backup left paused", "container", name)
		c.State, c.Running = "running", true
		x.managed[name] = c
	}
}

// ApplySoon makes the loop run a pass now (after a restore), and send a
// report with the backups' latest (Config.Backups).
func (r *Reconciler) ApplySoon() {
	select {
	case r.soon <- struct{}{}:
	default:
	}
}

// backupKey is what of the backups' state a report is sent again for.
func backupKey(runs []state.BackupRun) string {
	var b strings.Builder
	for _, x := range runs {
		fmt.Fprintf(&b, "backup %s %s %v %s %s %s\n", x.Module, x.Last, x.OK, x.Snapshot, x.Reason, x.Next)
	}
	return b.String()
}
