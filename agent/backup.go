package agent

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"maps"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"mesh/cluster/api"
	"mesh/internal/restic"
	"mesh/internal/safefs"
	"mesh/reconciler"
	"mesh/state"
	"mesh/state/manifest"
)

// Backups of a module's data with restic (issue 30, item 2), on the node
// that holds it: restic runs on the host, as the agent (root, or a rootless
// agent inside Podman's user namespace, where a container's files keep
// their owners), with the repository the mesh keeps (mesh backup repo set)
// and its password opened from the replicated state. A backup holds the
// node (reconciler.Exclusive: no apply meanwhile) while it runs the
// module's before-backup steps and lists the secrets' files to leave out,
// and, when backup: pause: asks, while it pauses the containers and
// copies the data directories; without pause, applies go on while it
// copies, the directories fenced against writes of secrets' files
// (reconciler.FenceSecrets). Then it forgets what keep: does not keep. A
// restore stops the module's containers, restores each data directory
// beside it and swaps it in (the directory as it was is kept aside), and
// lets the next apply start the containers again.
type backups struct {
	node  string
	store *state.Store
	rec   *reconciler.Reconciler
	// hasContainers and dataDirs stand in for the reconciler and the plan
	// (tests).
	hasContainers func(context.Context, string) (bool, error)
	dataDirs      func(context.Context, string) ([]string, error)
	secret        func(ctx context.Context, ref state.SecretRef) ([]byte, error)
	dir           string // the node's data dir
	log           *slog.Logger
	now           func() time.Time

	// ready is closed once rec is set (the reconciler is made after the
	// peer API serves).
	ready chan struct{}

	// one lets one backup, restore or list run here at a time (each runs
	// restic, which loads the repository's index): more wait their turn.
	one chan struct{}
	// running counts what runs now, for the agent's end to wait for (a
	// backup's deferred unpause, above all).
	running sync.WaitGroup

	mu   sync.Mutex
	runs map[string]state.BackupRun // module -> its backups here, kept in backups.json
	// unremoved are, by module, the snapshots that missed files and could
	// not be removed when made (another node's run held the repository's
	// lock), kept in unremovedFile: a default restore here never takes
	// one, and the module's next backup here removes them.
	unremoved map[string][]string
	// held is the module a failed restore left on some data directories
	// restored and others not, its journal still in place (neither
	// removed nor set aside): it is kept stopped (holdIn) while the
	// journal stays, so that the next start's undo of the journal takes
	// nothing the module wrote.
	held string
}

// scheduledLimit bounds a scheduled backup: one that hangs (a backend that
// stopped answering) ends, said, and frees the node.
const scheduledLimit = 6 * time.Hour

// Wait waits, up to limit, for the backups and restores running now.
func (b *backups) Wait(limit time.Duration) {
	done := make(chan struct{})
	go func() { b.running.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(limit):
		b.log.Warn("a backup or restore is still running as the agent stops")
	}
}

// start gives the backups the node's reconciler, once a restore a kill
// cut short is undone (before the reconciler runs, so that the module does
// not start on a mix).
func (b *backups) start(ctx context.Context, rec *reconciler.Reconciler) error {
	b.rec = rec
	ctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	if err := b.undoCutRestore(ctx); err != nil {
		return err
	}
	b.sweepCutRestores(ctx)
	close(b.ready)
	return nil
}

// sweepCutRestores removes what a restore cut short before its journal
// left (a kill while restic wrote the copy): a staging directory beside a
// data directory of this node's plan, maybe a whole copy of the data,
// which waited for the module's next restore. finishSwap tells it from
// one a finished swap put the data as it was in (its mark), kept aside.
func (b *backups) sweepCutRestores(ctx context.Context) {
	if b.store == nil {
		return
	}
	if _, err := os.Lstat(filepath.Join(b.dir, restoreJournal)); !errors.Is(err, os.ErrNotExist) {
		return // its directories are the journal's to settle
	}
	pv, err := b.store.Plan(ctx, b.node)
	if err != nil || pv.Plan == nil {
		return
	}
	for _, res := range pv.Plan.Resources {
		if res.Kind != manifest.KindDirectory || !res.Decl.Data {
			continue
		}
		d := res.Name
		if _, err := os.Lstat(d + restoreStaging); err != nil {
			continue
		}
		if err := b.besideIsOurs(d); err != nil {
			b.log.Warn("restore: what a restore cut short left is not removed", "err", err)
			continue
		}
		err := finishSwap(d)
		b.log.Info("restore: removed what a restore cut short left", "dir", d, "staging", d+restoreStaging, "err", err)
	}
}

// besideIsOurs refuses when a path a restore of d writes, removes or sets
// aside (d.mesh-restoring, d.mesh-before-restore) is a module's in the
// ledger: a manifest may declare /srv/db.mesh-restoring, and a restore of
// db would remove that module's data. The caller holds the node, or runs
// before the reconciler applies.
func (b *backups) besideIsOurs(d string) error {
	if b.rec == nil {
		return nil
	}
	for _, p := range []string{d + restoreStaging, d + restoreAside} {
		if owner := b.rec.OwnerAt(p); owner != "" {
			return fmt.Errorf("%s, where a restore of %s writes, is module %s's (or holds its files): a restore would remove it; rename that module's directory", p, d, owner)
		}
	}
	return nil
}

const backupsFile = "backups.json"

// unremovedFile keeps backups.unremoved.
const unremovedFile = "backups-unremoved.json"

// forgetTries is how many times a snapshot that missed files is removed
// before it is recorded as not removed (restic 0.14 waits for no lock).
var forgetTries, forgetWait = 3, 2 * time.Second

// restoreAside is the suffix of a data directory's content before a
// restore, kept beside it until the next restore of that directory (or a
// purge of it, which the reconciler makes).
const restoreAside = reconciler.RestoreAside

// restoreStaging is the suffix of the directory a restore writes into.
const restoreStaging = ".mesh-restoring"

func newBackups(node string, store *state.Store, secret func(context.Context, state.SecretRef) ([]byte, error), dir string, log *slog.Logger) *backups {
	b := &backups{node: node, store: store, secret: secret, dir: dir, log: log, now: time.Now, runs: map[string]state.BackupRun{}, ready: make(chan struct{}), one: make(chan struct{}, 1)}
	if raw, err := os.ReadFile(filepath.Join(dir, backupsFile)); err == nil {
		if err := json.Unmarshal(raw, &b.runs); err != nil || b.runs == nil {
			log.Warn("the backups' record is damaged; starting afresh (the repository keeps every snapshot)", "file", backupsFile, "err", err)
			b.runs = map[string]state.BackupRun{}
		}
	}
	if raw, err := os.ReadFile(filepath.Join(dir, unremovedFile)); err == nil {
		if err := json.Unmarshal(raw, &b.unremoved); err != nil {
			log.Warn("the record of snapshots that missed files and were not removed is damaged: mesh backup list shows every snapshot; restore one by its ID", "file", unremovedFile, "err", err)
			b.unremoved = nil
		}
	}
	return b
}

// keepUnremoved records (or, with ids empty, forgets) the snapshots of
// module that missed files and are not removed yet.
func (b *backups) keepUnremoved(module string, ids []string) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.unremoved == nil {
		b.unremoved = map[string][]string{}
	}
	if len(ids) == 0 {
		delete(b.unremoved, module)
	} else {
		b.unremoved[module] = ids
	}
	raw, err := json.Marshal(b.unremoved)
	if err == nil {
		err = safefs.WriteFile(filepath.Join(b.dir, unremovedFile), raw, 0o600)
	}
	if err != nil {
		b.log.Warn("record the snapshots that missed files", "module", module, "err", err)
	}
}

func (b *backups) unremovedOf(module string) []string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return slices.Clone(b.unremoved[module])
}

// forgetIncomplete removes a snapshot that missed files, trying again a
// few times: restic takes the repository's lock for it, and another
// node's backup may hold it.
func forgetIncomplete(ctx context.Context, repo restic.Repo, id string) error {
	var err error
	for try := range forgetTries {
		if err = repo.ForgetID(ctx, id, false); err == nil {
			return nil
		}
		if try < forgetTries-1 {
			select {
			case <-ctx.Done():
				return err
			case <-time.After(forgetWait << try):
			}
		}
	}
	return err
}

// removeUnremoved removes module's snapshots that missed files and could
// not be removed when made; those the repository no longer holds are
// forgotten, those it still cannot remove stay recorded.
func (b *backups) removeUnremoved(ctx context.Context, repo restic.Repo, module string) {
	ids := b.unremovedOf(module)
	if len(ids) == 0 {
		return
	}
	snaps, err := repo.Snapshots(ctx, []string{"mesh", "module=" + module})
	if err != nil {
		return // the backup says what is wrong with the repository
	}
	var left []string
	for _, id := range ids {
		if !slices.ContainsFunc(snaps, func(s restic.Snapshot) bool { return strings.HasPrefix(s.ID, id) }) {
			continue // removed since (by hand, or by keep:)
		}
		if err := repo.ForgetID(ctx, id, false); err != nil {
			b.log.Warn("a snapshot that missed files is still not removed", "module", module, "snapshot", id, "err", err)
			left = append(left, id)
		}
	}
	b.keepUnremoved(module, left)
}

// save writes the record (a kill after a backup keeps it).
func (b *backups) save() {
	raw, err := json.Marshal(b.runs)
	if err == nil {
		err = safefs.WriteFile(filepath.Join(b.dir, backupsFile), raw, 0o600)
	}
	if err != nil {
		b.log.Warn("record the backups", "err", err)
	}
}

// Runs is what the node's reports say of its backups, by module.
func (b *backups) Runs() []state.BackupRun {
	b.mu.Lock()
	defer b.mu.Unlock()
	out := make([]state.BackupRun, 0, len(b.runs))
	for _, r := range b.runs {
		out = append(out, r)
	}
	slices.SortFunc(out, func(x, y state.BackupRun) int { return strings.Compare(x.Module, y.Module) })
	return out
}

// repo is the mesh's repository, its password opened here.
func (b *backups) repo(ctx context.Context) (restic.Repo, error) {
	r, err := b.store.BackupRepo(ctx)
	if err != nil {
		return restic.Repo{}, err
	}
	if r.URL == "" {
		return restic.Repo{}, errors.New("no backup repository is set: mesh backup repo set URL --password-file FILE")
	}
	pw, err := b.secret(ctx, state.BackupPassword)
	if errors.Is(err, state.ErrNotFound) {
		return restic.Repo{}, errors.New("the backup repository's password is not in the state: mesh backup repo set URL --password-file FILE")
	}
	if err != nil {
		return restic.Repo{}, fmt.Errorf("the backup repository's password: %w", err)
	}
	cache := filepath.Join(b.dir, "restic-cache")
	if err := os.MkdirAll(cache, 0o700); err != nil {
		return restic.Repo{}, err
	}
	return restic.Repo{URL: r.URL, Password: pw, CacheDir: cache, Host: b.node, Env: backendEnv(os.Environ())}, nil
}

// backendEnv is what of the agent's environment restic's backends read:
// the credentials of s3:, b2:, azure:, gs: and swift: repositories. The
// rest (an operator's RESTIC_REPOSITORY, say) never reaches restic.
func backendEnv(env []string) []string {
	var out []string
	for _, kv := range env {
		for _, p := range []string{"AWS_", "B2_", "AZURE_", "GOOGLE_", "OS_", "ST_"} {
			if strings.HasPrefix(kv, p) {
				out = append(out, kv)
				break
			}
		}
	}
	return out
}

// Run is operate.Backups: req on this node.
func (b *backups) Run(ctx context.Context, req api.BackupRequest, progress func(string)) (api.BackupResult, error) {
	select {
	case <-b.ready:
	case <-ctx.Done():
		return api.BackupResult{}, ctx.Err()
	}
	b.running.Add(1)
	defer b.running.Done()
	select {
	case b.one <- struct{}{}:
	default:
		progress("waiting for the backup or restore running on this node")
		select {
		case b.one <- struct{}{}:
		case <-ctx.Done():
			return api.BackupResult{}, ctx.Err()
		}
	}
	defer func() { <-b.one }()
	switch req.Op {
	case api.BackupRun:
		return b.backup(ctx, req.Module, req.By, progress)
	case api.BackupRestore:
		return b.restore(ctx, req.Module, req.Snapshot, progress)
	case api.BackupList:
		return b.list(ctx, req.Module)
	case api.BackupSize:
		return b.measure(ctx, req.Module)
	}
	return api.BackupResult{}, fmt.Errorf("unknown backup op %q", req.Op)
}

// here is the module's part of this node's plan: its data directories,
// the plan's version, and the manifest's backup policy and digest.
type here struct {
	plan     *state.Plan
	version  uint64
	dirs     []string
	policy   manifest.Backup
	manifest string
}

// notMoving refuses a module being moved, which is its move's: a restore
// here would be lost at its end (FROM sends what it held), a backup copy
// data that is being copied away. Asked again once the node is held: a
// move may begin while a backup or restore waits its turn.
func (b *backups) notMoving(ctx context.Context, module string) error {
	l, err := b.store.Moves(ctx, module)
	if err != nil {
		return fmt.Errorf("cannot tell whether module %s is being moved: %w", module, err)
	}
	if len(l) == 1 && (l[0].Phase == state.MoveCopy || l[0].Phase == state.MoveStart) {
		return fmt.Errorf("module %s is being moved from %s to %s: back it up or restore it once the move ends", module, l[0].From, l[0].To)
	}
	return nil
}

func (b *backups) here(ctx context.Context, module string) (here, error) {
	if err := b.notMoving(ctx, module); err != nil {
		return here{}, err
	}
	pv, err := b.store.Plan(ctx, b.node)
	if err != nil || pv.Plan == nil {
		return here{}, fmt.Errorf("node %s has no plan yet", b.node)
	}
	h := here{plan: pv.Plan, version: pv.Version, dirs: reconciler.DataDirs(pv.Plan, module)}
	if len(h.dirs) == 0 {
		return h, fmt.Errorf("module %s holds no data directory (data: true) on %s", module, b.node)
	}
	// What the host does not touch for a module is neither read into the
	// repository nor restored over (as a move does not send it): a data
	// directory around this node's data dir, which the state cannot know,
	// would copy the node's keys, its state and its ledger into snapshots
	// that every node can open.
	for _, d := range h.dirs {
		if why := b.rec.RefusedPath(d); why != "" {
			return h, fmt.Errorf("data directory %s of %s is neither backed up nor restored here: %s", d, module, why)
		}
	}
	info, err := b.store.Module(ctx, module)
	if err != nil {
		return h, err
	}
	h.manifest = info.Digest
	if m, err := b.store.Manifest(ctx, module); err == nil && m.Backup != nil {
		h.policy = *m.Backup
	}
	return h, nil
}

// tags are a snapshot's: the module's and node's (what list, restore and
// forget select by), the plan version and the manifest's digest.
func moduleTags(module, node string) []string {
	return []string{"mesh", "module=" + module, "node=" + node}
}

func (b *backups) backup(ctx context.Context, module, by string, progress func(string)) (api.BackupResult, error) {
	res := api.BackupResult{Module: module, Node: b.node}
	if by == "" {
		by = "a command"
	}
	h, err := b.here(ctx, module)
	if err != nil {
		return res, err
	}
	res.Dirs = h.dirs
	run := func() (api.BackupResult, error) {
		repo, err := b.repo(ctx)
		if err != nil {
			return res, err
		}
		progress("opening the repository")
		if res.Created, err = repo.Ensure(ctx); err != nil {
			return res, err
		}
		if res.Created {
			progress("initialised the repository")
		}
		b.removeUnremoved(ctx, repo, module)
		tags := append(moduleTags(module, b.node), "plan="+strconv.FormatUint(h.version, 10), "manifest="+short(h.manifest))
		var sum restic.Summary
		var exclude []string
		read := func(ctx context.Context) (err error) {
			progress("copying " + strings.Join(h.dirs, ", "))
			last := time.Time{}
			sum, err = repo.BackupExcluding(ctx, h.dirs, exclude, tags, func(p restic.Progress) {
				if time.Since(last) < 2*time.Second {
					return
				}
				last = time.Now()
				progress(fmt.Sprintf("%.0f%%: %d of %d files, %s of %s", p.PercentDone*100, p.FilesDone, p.TotalFiles, size(p.BytesDone), size(p.TotalBytes)))
			})
			return err
		}
		// With its containers paused, the node is held while restic
		// reads (an apply would start them again); else only while the
		// before-backup steps run and what to leave out is listed, and
		// the directories are fenced against writes of secrets' files
		// (reconciler.FenceSecrets) while applies go on.
		lift := func() {}
		defer func() { lift() }() // whatever happens: an apply may wait on it
		err = b.rec.Exclusive(ctx, func(ctx context.Context) error {
			if err := b.notMoving(ctx, module); err != nil {
				return err
			}
			if h.hasBefore(module) {
				progress("running the before-backup steps")
			}
			resume, err := b.rec.Quiesce(ctx, h.plan, module, h.policy.Pause)
			defer resume()
			if err != nil {
				return err
			}
			// The secrets' files the plan names, and those on the disk
			// now (the node is held: the ledger is what was written).
			exclude = b.secretsUnder(h.plan, h.dirs)
			if !h.policy.Pause {
				lift = b.rec.FenceSecrets(module, h.dirs)
				return nil
			}
			progress("paused the module's containers")
			return read(ctx)
		})
		if err == nil && !h.policy.Pause {
			func() {
				defer lift() // an apply that waits at it goes on
				err = read(ctx)
			}()
		}
		if errors.Is(err, restic.ErrIncomplete) && sum.SnapshotID != "" {
			// Never a default restore's choice, nor counted by keep:.
			if ferr := forgetIncomplete(context.WithoutCancel(ctx), repo, sum.SnapshotID); ferr != nil {
				b.keepUnremoved(module, append(b.unremovedOf(module), sum.SnapshotID))
				return res, fmt.Errorf("%w; it could not be removed (%v): a restore on %s takes it only when named, and the next backup of %s here removes it; do not restore it", err, ferr, b.node, module)
			}
			return res, fmt.Errorf("%w; that snapshot was removed", err)
		}
		if err != nil {
			return res, err
		}
		res.Snapshot, res.Files, res.Bytes, res.Added, res.Duration = sum.SnapshotID, sum.TotalFiles, sum.TotalBytes, sum.DataAdded, sum.Duration.Round(time.Millisecond).String()
		if sum.Unconfined != "" && !h.policy.Pause {
			// Said where the operator looks (the command's answer, mesh
			// status), not in the log alone.
			res.Warning = unconfinedWarning(sum.Unconfined)
			b.log.Warn("backed up with links under the data directories followable: a container that swaps one in while restic reads could get a host file into its snapshot (backup: pause closes that)", "module", module, "why", sum.Unconfined)
		}
		if left := b.unremovedOf(module); h.policy.Keep != nil && len(left) > 0 {
			// keep: would count a snapshot that missed files as one of
			// its day's (or its last N), and forget a whole one for it.
			progress("keep: waits: a snapshot that missed files is not removed yet")
			b.log.Warn("keep: not applied while a snapshot that missed files is not removed (the next backup tries again)", "module", module, "snapshots", left)
		} else if k := h.policy.Keep; k != nil {
			progress("forgetting what keep: does not keep")
			gone, err := repo.Forget(ctx, moduleTags(module, b.node), restic.Keep{Last: k.Last, Hourly: k.Hourly, Daily: k.Daily, Weekly: k.Weekly, Monthly: k.Monthly, Yearly: k.Yearly}, true)
			if err != nil {
				return res, fmt.Errorf("snapshot %s made, but keep: failed: %w", res.Snapshot, err)
			}
			res.Forgotten = gone
		}
		return res, nil
	}
	res, err = run()
	b.record(module, h.policy.Schedule, by, res.Snapshot, res.Warning, err)
	return res, err
}

// unconfinedWarning is what a backup that read unconfined (why) while its
// module ran says.
func unconfinedWarning(why string) string {
	return "read with links under the data directories followable (" + state.Tail(why, 300) + "): a container that swaps one in while restic reads could put a host file into the snapshot; backup: {pause: true} closes that"
}

// record keeps a backup's outcome and has it reported; one that succeeded
// keeps its warning ("": none) as its reason.
func (b *backups) record(module, schedule, by, snapshot, warning string, err error) {
	b.mu.Lock()
	now := b.now().UTC()
	r := b.runs[module]
	r.Module, r.Last, r.By, r.Schedule = module, now, by, schedule
	r.OK, r.Reason, r.Snapshot = err == nil, warning, snapshot
	if err != nil {
		r.Reason = err.Error()
	} else {
		r.LastOK = now
	}
	b.runs[module] = r
	b.save()
	b.mu.Unlock()
	if err != nil {
		b.log.Warn("backup failed", "module", module, "by", by, "err", err)
	} else {
		b.log.Info("backed up", "module", module, "snapshot", snapshot, "by", by)
	}
	b.rec.ApplySoon()
}

func (h here) hasBefore(module string) bool {
	for _, res := range h.plan.Resources {
		if res.Module == module && res.Kind == manifest.KindStep && res.Decl.BeforeBackup {
			return true
		}
	}
	return false
}

func (b *backups) list(ctx context.Context, module string) (api.BackupResult, error) {
	res := api.BackupResult{Module: module, Node: b.node}
	repo, err := b.repo(ctx)
	if err != nil {
		return res, err
	}
	snaps, err := repo.Snapshots(ctx, []string{"mesh", "module=" + module})
	if errors.Is(err, restic.ErrNoRepository) {
		return res, nil // nothing backed up yet
	}
	if err != nil {
		return res, err
	}
	for _, s := range snaps {
		res.Snapshots = append(res.Snapshots, toSnapshot(s))
	}
	return res, nil
}

func toSnapshot(s restic.Snapshot) api.Snapshot {
	out := api.Snapshot{ID: s.ShortID, Time: s.Time, Node: s.Host, Paths: s.Paths}
	for _, t := range s.Tags {
		k, v, _ := strings.Cut(t, "=")
		switch k {
		case "node":
			out.Node = v
		case "plan":
			out.Plan = v
		case "manifest":
			out.Manifest = v
		}
	}
	return out
}

// restore puts snapshot id (the module's latest when "") back into the
// module's data directories on this node. The module's containers stop
// first, so nothing of it writes beside a directory while it is staged
// there. Each directory is restored into DIR.mesh-restoring, then swapped
// with what is at DIR in one atomic exchange (there is never a moment
// without DIR, which an apply would make again, empty), and what was there
// is kept as DIR.mesh-before-restore (until the next restore of DIR, or a
// purge of DIR).
func (b *backups) restore(ctx context.Context, module, id string, progress func(string)) (api.BackupResult, error) {
	res := api.BackupResult{Module: module, Node: b.node, Kept: map[string]string{}}
	if id != "" && !snapshotID.MatchString(id) {
		return res, fmt.Errorf("%q is not a snapshot ID: give at least 8 of its hex digits (mesh backup list %s)", id, module)
	}
	h, err := b.here(ctx, module)
	if err != nil {
		return res, err
	}
	repo, err := b.repo(ctx)
	if err != nil {
		return res, err
	}
	snaps, err := repo.Snapshots(ctx, []string{"mesh", "module=" + module})
	if err != nil {
		return res, err
	}
	snap, err := pickSnapshot(snaps, id, b.node, module, b.unremovedOf(module))
	if err != nil {
		return res, err
	}
	res.Snapshot = snap.ShortID
	// Only the directories both the snapshot and the plan hold (a snapshot
	// never writes where the module declares no data now), and of nested
	// ones the outer (it holds the inner).
	for _, d := range h.dirs {
		if slices.Contains(snap.Paths, d) && !slices.ContainsFunc(h.dirs, func(o string) bool { return o != d && manifest.Within(d, o) }) {
			res.Dirs = append(res.Dirs, d)
		}
	}
	if len(res.Dirs) == 0 {
		return res, fmt.Errorf("snapshot %s holds %s, none of which is a data directory of %s on %s now (%s)", snap.ShortID, strings.Join(snap.Paths, ", "), module, b.node, strings.Join(h.dirs, ", "))
	}
	for _, d := range res.Dirs {
		// The module's containers are stopped; a link above the data
		// directory (put before) would have the copy staged and swapped
		// in where it leads.
		if l := restic.LinkIn(d); l != "" {
			return res, fmt.Errorf("%s: %s is a link; nothing was restored (a data directory's path holds none: a container that writes the directory above it may have put it there; put the directory back)", d, l)
		}
		if err := sameDevice(d); err != nil {
			return res, err
		}
	}
	// The copies an earlier restore kept aside are removed by this one.
	check := slices.Clone(res.Dirs)
	for _, d := range res.Dirs {
		check = append(check, d+restoreAside)
	}
	if err := mountsInside(check); err != nil {
		return res, err
	}
	// The copy is written while the data it replaces is still there: one
	// that fills the disk stops the node's writes and the other modules'
	// until restic fails on it.
	progress("measuring what snapshot " + snap.ShortID + " restores")
	if sizes, err := restoreSizes(ctx, repo, snap, res.Dirs); err != nil {
		b.log.Warn("restoring without knowing whether it fits: what the snapshot holds could not be measured", "module", module, "snapshot", snap.ShortID, "err", err)
		progress("warning: " + err.Error() + "; restoring without the free-space check")
	} else if err := roomOn(b.node, res.Dirs, sizes, restoreFix(res.Dirs)); err != nil {
		return res, fmt.Errorf("nothing was restored (the module was not stopped): %w", err)
	}
	err = b.rec.Exclusive(ctx, func(ctx context.Context) error {
		if err := b.notMoving(ctx, module); err != nil {
			return err
		}
		// A journal outlives its restore only when neither removing nor
		// setting it aside could be done (said then); this restore does
		// not go over it.
		if _, err := os.Lstat(filepath.Join(b.dir, restoreJournal)); !errors.Is(err, os.ErrNotExist) {
			return fmt.Errorf("nothing was restored: %s, the journal of an earlier restore, is still there (%v): the agent's log says what became of the directories it names; check them, remove it by hand, then restore", filepath.Join(b.dir, restoreJournal), err)
		}
		for _, d := range res.Dirs {
			if err := b.besideIsOurs(d); err != nil {
				return fmt.Errorf("nothing was restored (the module was not stopped): %w", err)
			}
		}
		progress("stopping the module's containers")
		stopped, err := b.rec.StopAll(ctx, module)
		res.Stopped = stopped
		// No apply runs while the node is held: the one that starts
		// them again begins after this.
		res.StoppedAt = time.Now().UTC()
		if err != nil {
			return err
		}
		for _, d := range res.Dirs {
			if err := finishSwap(d); err != nil {
				return fmt.Errorf("nothing was restored: what an earlier restore of %s left: %w", d, err)
			}
			s := d + restoreStaging
			if err := os.RemoveAll(s); err != nil {
				return err
			}
			if err := os.Mkdir(s, 0o700); err != nil {
				return err
			}
			progress("restoring " + d + " from " + snap.ShortID)
			if err := repo.Restore(ctx, snap.ID, s, d); err != nil {
				os.RemoveAll(s)
				return err
			}
			if fi, err := os.Lstat(s + d); err != nil || !fi.IsDir() {
				os.RemoveAll(s)
				return fmt.Errorf("snapshot %s restored no directory %s", snap.ShortID, d)
			}
			// restic writes without a sync: a power cut after the swap
			// would leave the files it wrote empty or torn, under a
			// restore the operator was told is done.
			if err := safefs.SyncFS(s); err != nil {
				os.RemoveAll(s)
				return fmt.Errorf("nothing was restored: the restored copy of %s cannot be made durable: %w", d, err)
			}
		}
		// The swaps are all or none across a kill too: the journal
		// names them until the last is done, and a start that finds it
		// puts every directory back as it was (undoCutRestore).
		j, err := b.writeRestoreJournal(module, res.Dirs)
		if err != nil {
			// The write may have failed after its rename (the sync of
			// the data dir): no journal stays for swaps never made.
			if rerr := b.removeRestoreJournal(); rerr != nil {
				b.log.Error("a restore's journal, written for swaps never made, stays; the next start removes only what it can tell for the restored copies", "err", rerr)
			}
			for _, d := range res.Dirs {
				os.RemoveAll(d + restoreStaging)
			}
			return fmt.Errorf("nothing was restored: %w", err)
		}
		kept, err := swapAllIn(res.Dirs, swapIn, func(d string, err error) {
			// Restored: a power cut may bring the data before back.
			b.log.Warn("restored, but the swap may not survive a power cut", "dir", d, "err", err)
		})
		maps.Copy(res.Kept, kept)
		if err != nil {
			// swapAllIn put back what it could; the journal puts back
			// the rest now, while the module is stopped, and goes.
			return b.settleJournal(j, err)
		}
		// Left, the journal would undo, at the next start, a restore the
		// operator is told is done: when it cannot be removed, the
		// restore is undone now, while the module is still stopped.
		if rerr := b.removeRestoreJournal(); rerr != nil {
			return b.settleJournal(j, fmt.Errorf("the restore cannot be kept: %w", rerr))
		}
		secrets := b.secretsUnder(h.plan, res.Dirs)
		for d, aside := range kept {
			dropSecretsAside(d, aside, secrets)
		}
		return nil
	})
	// The next pass starts the containers again (and sets each data
	// directory's owner and mode to the manifest's).
	b.rec.ApplySoon()
	if err != nil {
		return res, err
	}
	b.log.Info("restored", "module", module, "snapshot", snap.ShortID, "dirs", res.Dirs)
	return res, nil
}

// errUnmeasured: what a snapshot restores could not be told.
var errUnmeasured = errors.New("what the snapshot restores could not be measured")

// restoreSizes is what restoring snap takes on the disk in each of dirs:
// the snapshot whole when it is all restored into the one directory (a
// file hard-linked twice counted once: restic restores the link), else
// each directory's files (a link counted at each name: each directory is
// restored by itself, and a file linked into two is written in both),
// never more than the whole. Each entry counts a block more than its
// bytes (entryBlock): a file takes whole blocks, a directory one of its
// own, and a million small files take gigabytes where their bytes say
// megabytes. A failure is errUnmeasured.
func restoreSizes(ctx context.Context, repo restic.Repo, snap *restic.Snapshot, dirs []string) ([]uint64, error) {
	total, err := repo.RestoreSize(ctx, snap.ID)
	if err != nil {
		return nil, fmt.Errorf("%w: %v", errUnmeasured, err)
	}
	sizes := make([]uint64, len(dirs))
	whole := len(dirs) == 1 && !slices.ContainsFunc(snap.Paths, func(p string) bool { return !manifest.Within(p, dirs[0]) })
	if whole {
		sizes[0] = onDisk(total)
		return sizes, nil
	}
	for i, d := range dirs {
		n, err := repo.SizeUnder(ctx, snap.ID, d)
		if err != nil {
			return nil, fmt.Errorf("%w: %v", errUnmeasured, err)
		}
		sizes[i] = min(onDisk(n), onDisk(total))
	}
	return sizes, nil
}

// entryBlock is the most an entry takes on the disk beyond its bytes: a
// block of ext4 and xfs as they are made by default (a filesystem of
// larger blocks is counted short).
const entryBlock = 4 << 10

// onDisk is s in bytes with a block for each entry.
func onDisk(s restic.Size) uint64 { return s.OnDisk(entryBlock) }

// restoreFix is what a restore refused for room tells to do.
func restoreFix(dirs []string) string {
	fix := "free some space there and restore again"
	for _, d := range dirs {
		if safefs.IsDir(d + restoreAside) {
			fix += "; " + d + restoreAside + ", what the last restore replaced, takes room there: remove it if it is not needed"
		}
	}
	return fix
}

// snapshotID is what --snapshot takes: 8 to 64 hex digits.
var snapshotID = regexp.MustCompile(`^[0-9a-f]{8,64}$`)

// pickSnapshot is the snapshot a restore on node takes: the one id names
// (exactly one must match), or, by default, the newest this node made, or
// the newest of any node when it made none (the module was elsewhere). A
// snapshot tagged incomplete, or one of unremoved (this node's record of
// those that missed files and were not removed), is taken only when named.
func pickSnapshot(snaps []restic.Snapshot, id, node, module string, unremoved []string) (*restic.Snapshot, error) {
	var match, mine, any *restic.Snapshot
	n := 0
	for i := range snaps {
		s := &snaps[i]
		if id != "" {
			if strings.HasPrefix(s.ID, id) {
				match = s
				n++
			}
			continue
		}
		if slices.Contains(s.Tags, "incomplete") || slices.ContainsFunc(unremoved, func(u string) bool { return strings.HasPrefix(s.ID, u) }) {
			continue
		}
		any = s // oldest first: the last is the newest
		if slices.Contains(s.Tags, "node="+node) {
			mine = s
		}
	}
	switch {
	case id != "" && n == 1:
		return match, nil
	case id != "" && n > 1:
		return nil, fmt.Errorf("%s names %d snapshots of %s; give more of its digits (mesh backup list %s)", id, n, module, module)
	case id != "":
		return nil, fmt.Errorf("module %s has no snapshot %s (mesh backup list %s)", module, id, module)
	case mine != nil:
		return mine, nil
	case any != nil:
		return any, nil
	}
	return nil, fmt.Errorf("module %s has no snapshot in the repository yet (mesh backup %s)", module, module)
}

// mountsInside refuses data directories that hold a mount: it would go
// with the directory swapped aside, and the next restore removes what is
// aside, through the mount (a media library bound into a photos module's
// data directory, emptied).
func mountsInside(dirs []string) error {
	if why := restic.MountsUnder(dirs); why != "" {
		return fmt.Errorf("%s: a restore swaps a data directory whole and keeps the one before aside, to be removed at the next restore, with what is mounted in it; unmount it, restore, and mount it again", why)
	}
	return nil
}

// sameDevice refuses a data directory that is a mount point: its copy
// could not be swapped in by a rename.
func sameDevice(d string) error {
	var st, pt syscall.Stat_t
	if err := syscall.Lstat(d, &st); err != nil {
		return err
	}
	if err := syscall.Lstat(filepath.Dir(d), &pt); err != nil {
		return err
	}
	if st.Dev != pt.Dev {
		return fmt.Errorf("%s is a mount point: a restore stages beside it and swaps it in, which cannot cross filesystems; restore it with restic by hand, or mount its parent instead", d)
	}
	return nil
}

// swapped marks a staging directory whose copy was exchanged with the data
// directory: what it holds is the data as it was before, to be kept.
const swapped = ".mesh-swapped"

// markSwap writes DIR's swap mark, naming its restored copy by its inode:
// a kill between the mark and the exchange leaves that copy at the staging
// path, which finishSwap then knows for the snapshot's, not the data as it
// was. Written again, it says the same.
func markSwap(d string) error {
	s := d + restoreStaging
	var st unix.Stat_t
	if err := unix.Lstat(s+d, &st); err != nil {
		return fmt.Errorf("the restored copy of %s: %w", d, err)
	}
	// Written whole or not at all: an empty mark (a full disk, a kill
	// between its create and its write) would not say which copy is which.
	if err := safefs.WriteFile(filepath.Join(s, swapped), []byte(strconv.FormatUint(st.Ino, 10)), 0o600); err != nil {
		return err
	}
	return safefs.SyncDir(s)
}

// swapIn exchanges DIR with its restored copy in one step, then keeps what
// was at DIR as DIR.mesh-before-restore. A kill at any point leaves DIR in
// place (restored, or as it was); a kill after the exchange leaves the old
// data in the staging directory, marked, which finishSwap keeps. What an
// earlier restore kept aside goes only once the mark is written, right
// before the exchange: a swap that fails before it (a disk restic filled)
// leaves it.
func swapIn(d string) (string, error) {
	s := d + restoreStaging
	aside := d + restoreAside
	if mark, err := os.ReadFile(filepath.Join(s, swapped)); err != nil || !restoredCopyStill(s+d, mark) {
		if err := markSwap(d); err != nil { // not marked yet (swapAllIn marks all first)
			return "", err
		}
	}
	if err := os.RemoveAll(aside); err != nil {
		return "", err
	}
	if err := unix.Renameat2(unix.AT_FDCWD, s+d, unix.AT_FDCWD, d, unix.RENAME_EXCHANGE); err != nil {
		return "", fmt.Errorf("swap %s with its restored copy: %w", d, err)
	}
	// Durable before the restore is said done (a power cut must not bring
	// back the data as it was, once the operator was told otherwise). The
	// swap is done whatever the sync says: a failure is said, not taken
	// for the restore's (which would leave the module started on the
	// restored data, told it failed, without its copy aside).
	synced := safefs.SyncDir(filepath.Dir(d))
	if err := finishSwap(d); errors.Is(err, errUnsynced) && synced == nil {
		synced = err
	} else if err != nil && !errors.Is(err, errUnsynced) {
		return "", err
	}
	if synced != nil && !errors.Is(synced, errUnsynced) {
		synced = fmt.Errorf("%w: %w", errUnsynced, synced)
	}
	if synced != nil {
		return aside, synced
	}
	return aside, nil
}

// secretsUnder are the secrets' and credentials' files under dirs that the
// plan names, and those the ledger has on the disk now, sorted, once each.
func (b *backups) secretsUnder(plan *state.Plan, dirs []string) []string {
	out := append(reconciler.SecretsUnder(plan, dirs), b.rec.SecretFilesUnder(dirs)...)
	slices.Sort(out)
	return slices.Compact(out)
}

// dropSecretsAside removes, from aside (what DIR held before a restore,
// kept for the operator), the files of secrets and credentials under d:
// a value removed or replaced since must not stay on the disk in plain
// text (a backup leaves them out for the same reason). No link is
// followed; what cannot be removed stays.
func dropSecretsAside(d, aside string, secrets []string) {
	for _, p := range secrets {
		if p == d || !manifest.Within(p, d) {
			continue
		}
		dfd, base, err := safefs.OpenParent(aside + strings.TrimPrefix(p, d))
		if err != nil {
			continue
		}
		unix.Unlinkat(dfd, base, 0)
		unix.Close(dfd)
	}
}

// swapAllIn swaps each of dirs in with its restored copy (swap: swapIn),
// all or none: when one fails, those swapped before it get their data as
// it was back (swapBack), so the module never starts on some directories
// restored and others not (a database's data and its log, of two points in
// time). kept is where each directory's data as it was is, when all were
// swapped in. unsynced is told of a swap done that may not survive a power
// cut.
//
// Every directory's mark is written before the first exchange: a mark that
// fails (a disk the restore filled) ends the restore before any directory
// lost what an earlier restore kept aside, and the restored copies go.
func swapAllIn(dirs []string, swap func(string) (string, error), unsynced func(string, error)) (kept map[string]string, err error) {
	for _, d := range dirs {
		if err := markSwap(d); err != nil {
			for _, d := range dirs { // nothing exchanged: each staging holds a restored copy
				os.RemoveAll(d + restoreStaging)
			}
			return nil, fmt.Errorf("%w (no directory of the module was restored)", err)
		}
	}
	kept = map[string]string{}
	var done []string
	for _, d := range dirs {
		aside, err := swap(d)
		if errors.Is(err, errUnsynced) {
			unsynced(d, err)
			err = nil
		}
		if err != nil {
			// This one too, if its exchange was made before it failed.
			back := true
			for i := len(done); i >= 0; i-- {
				x, isDone := d, false
				if i < len(done) {
					x, isDone = done[i], true
				}
				if berr := swapBack(x, isDone); berr != nil {
					back = false
					err = fmt.Errorf("%w; and %s could not be put back as it was (%v): its data before the restore is at %s or %s", err, x, berr, x+restoreAside, x+restoreStaging+x)
				}
			}
			if back {
				err = fmt.Errorf("%w (no directory of the module was restored)", err)
			}
			return nil, err
		}
		kept[d] = aside
		done = append(done, d)
	}
	return kept, nil
}

// swapBack undoes swapIn(d): the data as it was goes back to d, and the
// restored copy is removed. done says swapIn(d) returned (its data as it
// was is at d's aside path); else swapIn(d) failed, and its mark says
// whether its exchange was made (the data as it was is then at the
// staging path, or at the aside path once finishSwap moved it).
func swapBack(d string, done bool) error {
	s, aside := d+restoreStaging, d+restoreAside
	before := aside
	if !done {
		mark, merr := os.ReadFile(filepath.Join(s, swapped))
		if merr != nil && !errors.Is(merr, os.ErrNotExist) {
			return fmt.Errorf("its swap mark cannot be read (%w); nothing was moved", merr)
		}
		_, serr := os.Lstat(s + d)
		if _, perr := strconv.ParseUint(string(mark), 10, 64); merr == nil && perr != nil {
			// A mark that names no copy (an earlier release's): which
			// of the two is the data as it was is not known, so
			// neither moves.
			return fmt.Errorf("its swap mark names no copy; nothing was moved")
		}
		switch {
		case merr == nil && restoredCopyStill(s+d, mark), merr != nil && serr == nil:
			// The exchange was not made (it follows the mark): d is as it
			// was, the restored copy still staged.
			return os.RemoveAll(s)
		case serr == nil:
			before = s + d // exchanged, not yet moved aside
		}
	}
	if err := unix.Renameat2(unix.AT_FDCWD, before, unix.AT_FDCWD, d, unix.RENAME_EXCHANGE); err != nil {
		return fmt.Errorf("swap %s back with its data as it was: %w", d, err)
	}
	if err := safefs.SyncDir(filepath.Dir(d)); err != nil {
		return err
	}
	// What is at before now is the restored copy.
	if err := os.RemoveAll(before); err != nil {
		return err
	}
	return os.RemoveAll(s)
}

// restoreJournal names the data directories a restore is swapping, from
// before the first swap until the last is done: a kill between two swaps
// would otherwise start the module on some directories restored and others
// not (a database's data and its log of two points in time). It lives no
// longer than its restore and, after a kill, than the next start: once the
// module may run again, undoing the journal would lose what it writes.
const restoreJournal = "restore-journal.json"

type restoreJournalFile struct {
	Module string          `json:"module"`
	Dirs   []journaledSwap `json:"dirs"`
}

// journaledSwap is a data directory a restore swaps, and what tells its
// restored copy from any other directory: its inode and, where the
// filesystem keeps one, its birth time (a directory keeps both through a
// rename), on the filesystem of the directory's parent. The directory
// holding the copy says whether the swap was made, whatever else a kill
// left (a swap undone in full looks like one never made).
type journaledSwap struct {
	Dir   string `json:"dir"`
	Ino   uint64 `json:"ino"`
	Btime int64  `json:"btime,omitempty"` // ns; 0 when not kept
}

// fileIdentity is p's device, inode and birth time (0 when not kept).
func fileIdentity(p string) (dev, ino uint64, btime int64, err error) {
	var st unix.Statx_t
	if err := unix.Statx(unix.AT_FDCWD, p, unix.AT_SYMLINK_NOFOLLOW, unix.STATX_INO|unix.STATX_BTIME, &st); err != nil {
		return 0, 0, 0, err
	}
	if st.Mask&unix.STATX_BTIME != 0 {
		btime = st.Btime.Sec*1e9 + int64(st.Btime.Nsec)
	}
	return unix.Mkdev(st.Dev_major, st.Dev_minor), st.Ino, btime, nil
}

// writeRestoreJournal names dirs, their restored copies staged.
func (b *backups) writeRestoreJournal(module string, dirs []string) (restoreJournalFile, error) {
	j := restoreJournalFile{Module: module}
	for _, d := range dirs {
		_, ino, btime, err := fileIdentity(d + restoreStaging + d)
		if err != nil {
			return j, fmt.Errorf("the restored copy of %s: %w", d, err)
		}
		j.Dirs = append(j.Dirs, journaledSwap{Dir: d, Ino: ino, Btime: btime})
	}
	raw, err := json.Marshal(j)
	if err != nil {
		return j, err
	}
	if err := safefs.WriteFile(filepath.Join(b.dir, restoreJournal), raw, 0o600); err != nil {
		return j, fmt.Errorf("write the restore's journal: %w", err)
	}
	return j, nil
}

// removeRestoreJournal removes the journal, durably: the restore is done
// (or undone).
func (b *backups) removeRestoreJournal() error {
	return removeJournal(b.dir, restoreJournal, "restore's journal")
}

// setJournalAside keeps the journal beside, as restore-journal-TIME.json,
// for the operator: what it names is not undone, and the module may run
// from here on, so no start may undo it later. It says where.
func (b *backups) setJournalAside() (string, error) {
	return setJournalAside(b.dir, restoreJournal, "restore's journal", b.now())
}

// settleJournal ends a restore that failed (cause) after its journal was
// written, the module still stopped: what was swapped is put back
// (undoAll) and the journal goes; when not all could be put back, the
// journal is set aside and the log says where each copy is, since the
// module starts again on what its directories hold.
func (b *backups) settleJournal(j restoreJournalFile, cause error) error {
	warnings, uerr := undoAll(j)
	for _, w := range warnings {
		b.log.Warn("a failed restore was put back: "+w, "module", j.Module)
	}
	if uerr == nil {
		if rerr := b.removeRestoreJournal(); rerr != nil {
			kept, aerr := b.setJournalAside()
			if aerr != nil {
				b.log.Error("a failed restore was put back, but its journal stays: the next start looks at it again (it moves nothing it cannot tell apart)", "module", j.Module, "err", aerr)
				return fmt.Errorf("nothing was restored (every data directory is as it was): %w; and %w", cause, aerr)
			}
			b.log.Warn("a failed restore was put back; its journal is set aside", "module", j.Module, "journal", kept)
		}
		return fmt.Errorf("nothing was restored (every data directory is as it was): %w", cause)
	}
	b.log.Error("a failed restore could not be put back: the module starts on some data directories restored and others not", "module", j.Module, "err", uerr)
	kept, aerr := b.setJournalAside()
	if aerr != nil {
		// Started on the mix, the module would write into directories the
		// next start's undo puts aside: it stays stopped instead.
		b.mu.Lock()
		b.held = j.Module
		b.mu.Unlock()
		b.log.Error("and its journal stays: the module is kept stopped while it does; the agent's next start undoes the restore, or, removed by hand, the module starts on the directories as they are",
			"module", j.Module, "journal", filepath.Join(b.dir, restoreJournal), "err", aerr)
		return fmt.Errorf("some data directories were restored and others not: %w; putting them back failed: %w; and %w: the module is kept stopped while the journal stays (the agent's next start undoes the restore; remove the journal by hand to start the module on the directories as they are)", cause, uerr, aerr)
	}
	return fmt.Errorf("some data directories were restored and others not, and the module starts on them: %w; putting them back failed: %w (the journal is kept as %s)", cause, uerr, kept)
}

// holds says module is held stopped by a failed restore (holdIn).
func (b *backups) holds(module string) bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.held == module
}

// holdIn is plan without the containers, steps and routes of the module held
// (backups.held), as if stopped, while the journal of its failed restore
// stays; plan itself once there is none.
func (b *backups) holdIn(plan *state.Plan) *state.Plan {
	b.mu.Lock()
	held := b.held
	b.mu.Unlock()
	if held == "" || plan == nil {
		return plan
	}
	if _, err := os.Lstat(filepath.Join(b.dir, restoreJournal)); errors.Is(err, os.ErrNotExist) {
		b.mu.Lock()
		if b.held == held {
			b.held = ""
		}
		b.mu.Unlock()
		b.log.Warn("the journal of a failed restore is gone: the module starts again, on its directories as they are", "module", held)
		return plan
	}
	q := *plan
	q.Resources = slices.DeleteFunc(slices.Clone(plan.Resources), func(r state.Resource) bool {
		return r.Module == held && (r.Kind == manifest.KindContainer || r.Kind == manifest.KindStep)
	})
	// Its routes go too, as a stopped module's: nothing answers them.
	q.Routes = slices.DeleteFunc(slices.Clone(plan.Routes), func(r state.Route) bool { return r.Module == held })
	return &q
}

// undoCutRestore runs when the agent starts, before the reconciler: it
// puts back every directory of a restore a kill cut short (its journal is
// still there), so that the module starts on its data as it was, never on
// a mix. It moves nothing, and says why, when the journal cannot be read,
// when the journal's module has containers (it ran since; a restore
// removes them all), or when a directory the journal names is not one of
// the module's data directories in this node's plan. Either way the
// journal goes now (kept beside as restore-journal-TIME.json when not
// undone, for the operator): the module may run from here on. Only a
// journal that cannot be removed is an error, which stops the agent.
func (b *backups) undoCutRestore(ctx context.Context) error {
	path := filepath.Join(b.dir, restoreJournal)
	raw, err := os.ReadFile(path)
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		// A read that fails (an I/O error, no file descriptor left) is
		// no reason to let the module start on a mix: start again.
		return fmt.Errorf("a restore was cut short, and its journal cannot be read now: %w; the agent does not start until it can (start it again)", err)
	}
	var j restoreJournalFile
	err = json.Unmarshal(raw, &j)
	for i, js := range j.Dirs {
		switch {
		case err != nil:
		case js.Dir == "" || js.Ino == 0:
			err = errors.New("an entry names no directory or no inode")
		case slices.ContainsFunc(j.Dirs[:i], func(o journaledSwap) bool { return manifest.Within(js.Dir, o.Dir) || manifest.Within(o.Dir, js.Dir) }):
			// A restore swaps each directory once, none inside another:
			// undone twice, the second exchange would put the restored
			// copy back and the first's data as it was be removed.
			err = fmt.Errorf("it names %s twice, or inside another", js.Dir)
		}
	}
	if err != nil {
		err = fmt.Errorf("it cannot be read (%v); nothing was moved", err)
	}
	if err == nil {
		var again error
		err, again = b.mayUndo(ctx, j)
		if again != nil {
			// Podman or the plan not there yet is no reason to let
			// the module start on a mix: the agent stops, to try again.
			return fmt.Errorf("a restore of module %s was cut short and is not undone yet: %w; the agent does not start until it can tell (start it again)", j.Module, again)
		}
	}
	var warnings []string
	if err == nil {
		warnings, err = undoAll(j)
	}
	for _, w := range warnings {
		b.log.Warn("a restore cut short was put back: "+w, "module", j.Module)
	}
	if err == nil {
		if err := b.removeRestoreJournal(); err != nil {
			return fmt.Errorf("a restore of module %s cut short was undone, but %w; the agent does not start while it is there", j.Module, err)
		}
		b.log.Warn("a restore was cut short (the agent stopped during it); every data directory of the module is as it was before it: restore again", "module", j.Module)
		return nil
	}
	kept, aerr := b.setJournalAside()
	if aerr != nil {
		return fmt.Errorf("a restore cut short is not undone (%v), and %w; the agent does not start while it is there", err, aerr)
	}
	b.log.Error("a restore was cut short and is not undone: the module may start on some data directories restored and others not. Compare each directory the journal names with its .mesh-before-restore and .mesh-restoring copies; a restore of the module again removes its .mesh-before-restore copies, which may hold the data as it was",
		"module", j.Module, "journal", kept, "err", err)
	return nil
}

// mayUndo refuses to undo j (refused) when its module has containers here
// (it ran since the restore was cut) or when a directory j names is not
// one of its data directories in this node's plan; again is an error to
// try again on (Podman or the plan not answering), not a refusal. Each is
// asked once.
func (b *backups) mayUndo(ctx context.Context, j restoreJournalFile) (refused, again error) {
	has, err := b.containersOf(ctx, j.Module)
	if err != nil {
		return nil, fmt.Errorf("whether module %s has containers here cannot be told (%v)", j.Module, err)
	}
	dirs, err := b.dataDirsOf(ctx, j.Module)
	if err != nil {
		return nil, fmt.Errorf("the data directories of module %s here cannot be read (%v)", j.Module, err)
	}
	if has {
		return fmt.Errorf("module %s has containers here again, so it may have run on what its data directories hold; nothing was moved under it", j.Module), nil
	}
	for _, js := range j.Dirs {
		if !slices.Contains(dirs, js.Dir) {
			return fmt.Errorf("the journal names %s, which is no data directory of module %s in this node's plan; nothing was moved", js.Dir, j.Module), nil
		}
	}
	return nil, nil
}

// undoAll undoes the swaps j names, the module stopped, in two passes:
// first each directory is told apart (undoState), and when one cannot be
// (a staged copy not known to be the restored one, a directory gone),
// nothing is moved; then each swapped directory is exchanged back, and
// the restored copies are removed. A failed exchange stops it, saying
// which directories were put back; a copy that cannot be removed is a
// warning (returned), not a stop, so the undo never leaves a mix of its
// own.
func undoAll(j restoreJournalFile) (warnings []string, err error) {
	states := make([]undoState, len(j.Dirs))
	for i, js := range j.Dirs {
		if states[i], err = tellApart(js); err != nil {
			return nil, err
		}
	}
	var back []string
	for i, st := range states {
		if st.before == "" {
			continue
		}
		d := j.Dirs[i].Dir
		if err := unix.Renameat2(unix.AT_FDCWD, st.before, unix.AT_FDCWD, d, unix.RENAME_EXCHANGE); err != nil {
			return warnings, fmt.Errorf("%s holds the restored copy and its data as it was is at %s; they could not be swapped back (%w); put back before this: %v", d, st.before, err, back)
		}
		back = append(back, d)
		if err := safefs.SyncDir(filepath.Dir(d)); err != nil {
			warnings = append(warnings, fmt.Sprintf("%s holds its data as it was again, but its directory could not be synced: %v", d, err))
		}
	}
	for i, st := range states {
		for _, p := range st.remove {
			if err := os.RemoveAll(p); err != nil {
				warnings = append(warnings, fmt.Sprintf("%s holds its data as it was; the restored copy or staging at %s could not be removed: %v", j.Dirs[i].Dir, p, err))
			}
		}
	}
	return warnings, nil
}

// undoState is what undoing one swap does: exchange before (the data as
// it was) back with the directory, when set, then remove what remove
// names (the restored copy, the staging).
type undoState struct {
	before string
	remove []string
}

// tellApart says how to undo the swap js names: when the directory holds
// the restored copy (the exchange was made), its data as it was, staged
// (not yet moved aside) or aside, goes back and the copy, then at that
// path, goes; else it was never swapped (or was put back), and only the
// restored copy, staged or aside, goes, when it is that copy for sure. A
// copy is told by its inode and birth time on the filesystem of the
// directory's parent (a device number changes across a reboot).
func tellApart(js journaledSwap) (undoState, error) {
	d := js.Dir
	s := d + restoreStaging
	pdev, _, _, err := fileIdentity(filepath.Dir(d))
	if err != nil {
		return undoState{}, fmt.Errorf("%s: %w; nothing was moved", filepath.Dir(d), err)
	}
	is := func(p string) bool {
		dev, ino, btime, err := fileIdentity(p)
		return err == nil && dev == pdev && ino == js.Ino && (js.Btime == 0 || btime == js.Btime)
	}
	if _, err := os.Lstat(d); err != nil {
		return undoState{}, fmt.Errorf("%s: %w; nothing was moved", d, err)
	}
	if is(d) {
		before := d + restoreAside
		if _, err := os.Lstat(s + d); err == nil {
			before = s + d // exchanged, not yet moved aside
		} else if _, err := os.Lstat(before); err != nil {
			return undoState{}, fmt.Errorf("%s holds the restored copy, and its data as it was is neither at %s nor at %s; nothing was moved", d, s+d, before)
		}
		return undoState{before: before, remove: []string{before, s}}, nil
	}
	var st undoState
	if is(d + restoreAside) {
		// A kill in an undo, after its exchange back, left the restored
		// copy aside, where it would pass for the data as it was.
		st.remove = append(st.remove, d+restoreAside)
	}
	if _, err := os.Lstat(s + d); err == nil && !is(s+d) {
		return undoState{}, fmt.Errorf("%s holds neither the restored copy nor, staged at %s, anything known to be it; nothing was moved: compare %s, %s and %s", d, s+d, d, s+d, d+restoreAside)
	}
	st.remove = append(st.remove, s)
	return st, nil
}

// containersOf says module has containers on this node (a restore removes
// them all first).
func (b *backups) containersOf(ctx context.Context, module string) (bool, error) {
	if b.hasContainers != nil {
		return b.hasContainers(ctx, module)
	}
	return b.rec.HasContainers(ctx, module)
}

// dataDirsOf are module's data directories in this node's plan.
func (b *backups) dataDirsOf(ctx context.Context, module string) ([]string, error) {
	if b.dataDirs != nil {
		return b.dataDirs(ctx, module)
	}
	pv, err := b.store.Plan(ctx, b.node)
	if err != nil {
		return nil, err
	}
	if pv.Plan == nil {
		return nil, fmt.Errorf("node %s has no plan", b.node)
	}
	return reconciler.DataDirs(pv.Plan, module), nil
}

// errUnsynced is swapIn's when the swap is done but the directory that
// holds it could not be synced.
var errUnsynced = errors.New("swapped, but the directory was not synced")

// finishSwap keeps what a swap put in DIR's staging directory (the data as
// it was, once exchanged) as DIR.mesh-before-restore, and removes the
// staging directory; one without the mark holds a restore cut short, and
// goes.
func finishSwap(d string) error {
	s := d + restoreStaging
	mark, err := os.ReadFile(filepath.Join(s, swapped))
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		// Not knowing which copy the staging directory holds, nothing
		// there is removed: it may be the data as it was.
		return fmt.Errorf("the swap mark in %s cannot be read (%w); nothing there was removed", s, err)
	}
	_, staged := os.Lstat(s + d)
	if err == nil && staged == nil && !restoredCopyStill(s+d, mark) {
		// The exchange was made: what is staged is the data as it was.
		// Without it (moved aside before a kill), the aside path holds
		// the data as it was, and is kept: this removed it.
		if err := os.RemoveAll(d + restoreAside); err != nil {
			return err
		}
		if err := os.Rename(s+d, d+restoreAside); err != nil {
			return err
		}
		// The data as it was is at its aside path for good before the
		// staging directory (its mark with it) goes; a sync that fails
		// is said (errUnsynced), not taken for the swap's failure: the
		// rename is made.
		unsynced := safefs.SyncDir(filepath.Dir(d))
		if err := os.RemoveAll(s); err != nil {
			return err
		}
		if unsynced != nil {
			return fmt.Errorf("%w: %w", errUnsynced, unsynced)
		}
		return nil
	}
	return os.RemoveAll(s)
}

// restoredCopyStill says the staging path holds the restored copy the
// mark names by its inode: the exchange never happened (a kill between
// the two), and what is there is the snapshot's data, not the data as it
// was. A mark without an inode (an earlier release's) is taken as done.
func restoredCopyStill(path string, mark []byte) bool {
	ino, err := strconv.ParseUint(string(mark), 10, 64)
	if err != nil {
		return false
	}
	var st unix.Stat_t
	return unix.Lstat(path, &st) == nil && st.Ino == ino
}

func short(digest string) string {
	if len(digest) > 12 {
		return digest[:12]
	}
	return digest
}

func size(n int64) string {
	const unit = 1024
	if n < unit {
		return fmt.Sprintf("%d B", n)
	}
	div, exp := int64(unit), 0
	for m := n / unit; m >= unit; m /= unit {
		div *= unit
		exp++
	}
	return fmt.Sprintf("%.1f %ciB", float64(n)/float64(div), "KMGTPE"[exp])
}

// schedule runs the backups of the modules whose manifest has backup:
// schedule:, on this node, one at a time, until ctx ends. A slot that
// passes while the agent is down is run when it is back (once); a backup
// that fails is reported and tried at the next slot.
func (b *backups) schedule(ctx context.Context) {
	<-b.ready // Run comes after New
	t := time.NewTimer(time.Second)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		t.Reset(b.runDue(ctx))
	}
}

// scheduleCheck is how often the plan is read again for schedules.
const scheduleCheck = 30 * time.Second

// runDue runs each backup whose slot has come, and says how long until
// the next look.
func (b *backups) runDue(ctx context.Context) time.Duration {
	wait := scheduleCheck
	pv, err := b.store.Plan(ctx, b.node)
	if err != nil || pv.Plan == nil {
		return wait
	}
	mods := map[string]bool{}
	for _, res := range pv.Plan.Resources {
		if res.Kind == manifest.KindDirectory && res.Decl.Data {
			mods[res.Module] = true
		}
	}
	b.mu.Lock()
	for m := range b.runs {
		if !mods[m] {
			delete(b.runs, m) // the module holds no data here any more
			b.save()
		}
	}
	b.mu.Unlock()
	for _, m := range slices.Sorted(maps.Keys(mods)) {
		man, err := b.store.Manifest(ctx, m)
		if err != nil || man.Backup == nil || man.Backup.Schedule == "" {
			b.unschedule(m)
			continue
		}
		sch, err := manifest.ParseSchedule(man.Backup.Schedule)
		if err != nil {
			continue
		}
		now := b.now()
		next := sch.Next(now).UTC()
		if next.IsZero() {
			b.unschedule(m) // a schedule with no slot to come (Feb 30)
			continue
		}
		b.mu.Lock()
		r := b.runs[m]
		// A new schedule, or a slot later than the schedule's next (the
		// clock went back): planned again.
		first := r.Schedule != man.Backup.Schedule || r.Next.IsZero() || r.Next.After(next)
		if first {
			r.Module, r.Schedule, r.Next = m, man.Backup.Schedule, next
			b.runs[m] = r
			b.save()
		}
		b.mu.Unlock()
		if first {
			b.rec.ApplySoon() // reported
		} else if !now.Before(r.Next) {
			// The next slot is planned before the run (status never calls a
			// running backup overdue) and again after it (a slot that
			// passes while it runs is not run twice).
			b.plan(m, next)
			bctx, cancel := context.WithTimeout(ctx, scheduledLimit)
			b.Run(bctx, api.BackupRequest{Op: api.BackupRun, Module: m, By: "schedule"}, func(string) {})
			cancel()
			if ctx.Err() != nil {
				return wait
			}
			r = b.plan(m, sch.Next(b.now()).UTC())
			b.rec.ApplySoon()
		}
		if d := time.Until(r.Next); d < wait {
			wait = max(d, time.Second)
		}
	}
	return wait
}

// plan sets module's next slot.
func (b *backups) plan(module string, next time.Time) state.BackupRun {
	b.mu.Lock()
	defer b.mu.Unlock()
	r := b.runs[module]
	r.Module, r.Next = module, next
	b.runs[module] = r
	b.save()
	return r
}

// unschedule forgets module's next slot (its schedule is gone), keeping
// its last backup.
func (b *backups) unschedule(module string) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if r, ok := b.runs[module]; ok && (r.Schedule != "" || !r.Next.IsZero()) {
		r.Schedule, r.Next = "", time.Time{}
		b.runs[module] = r
		b.save()
	}
}

// measure counts what module's data directories hold here: files and
// their bytes (a sparse file's allocated ones), walked without following
// a link.
func (b *backups) measure(ctx context.Context, module string) (api.BackupResult, error) {
	res := api.BackupResult{Module: module, Node: b.node}
	h, err := b.here(ctx, module)
	if err != nil {
		return res, err
	}
	res.Dirs = h.dirs
	for _, d := range h.dirs {
		err := filepath.WalkDir(d, func(p string, e fs.DirEntry, err error) error {
			if err != nil {
				return err
			}
			if ctx.Err() != nil {
				return ctx.Err()
			}
			if e.Type().IsRegular() {
				fi, err := e.Info()
				if err != nil {
					return err
				}
				res.Files++
				n := fi.Size()
				if st, ok := fi.Sys().(*syscall.Stat_t); ok && st.Blocks*512 < n {
					n = st.Blocks * 512
				}
				res.Bytes += n
			}
			return nil
		})
		if err != nil {
			return res, err
		}
	}
	return res, nil
}
