// Package reconciler makes a node hold its plan: directories, files,
// bindings, credentials, steps and containers, in the order written. It
// touches the machine (the filesystem, and Podman through Runtime) and keeps
// node-local facts in a Ledger; it never decides placement, which is state's.
package reconciler

import (
	"bytes"
	"cmp"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"net/netip"
	"os"
	"path"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/sys/unix"

	"mesh/internal/safefs"
	"mesh/state"
	"mesh/state/manifest"
)

// RemoveConcurrency is how many unwanted containers are removed at once.
const RemoveConcurrency = 8

// DefaultStepTimeout bounds one run of a step.
const DefaultStepTimeout = 30 * time.Minute

// Config is what a Reconciler needs to know about its node.
type Config struct {
	Node string
	// CertProbe is the address the node's public ports answer at: the
	// certificates its route proxy serves are looked at there and reported
	// (certs.go). Empty, none are.
	CertProbe string
	// DNS is the node's resolver address, every container's only DNS server.
	DNS netip.Addr
	// Domain, when set, gives the mesh's domain: every container's resolver
	// search domain, so a short name (`db`) resolves as `db.internal`. It is
	// not part of a container's digest (a mesh's domain never changes).
	Domain func(ctx context.Context) string
	// LedgerPath is the node-local ledger file.
	LedgerPath string
	// DataDir is the node's data dir: no resource may be inside it, and the
	// originals of files taken over are kept under it.
	DataDir string
	// ProviderHealthy says whether a provider's instance on a node passes
	// its health checks, and if not why (a binding's health gate). Unset:
	// gates are open.
	ProviderHealthy func(ctx context.Context, provider, node string) (bool, string)
	// Secret returns a credential's secret from the local replica.
	Secret func(ctx context.Context, p state.Pair) (string, error)
	// OperatorSecret opens one of the operator's secrets (mesh secret set)
	// from the local replica, the value whose digest the plan gives (a
	// rollout of a new value keeps the one before for the nodes it has not
	// reached); state.ErrNotFound when it is not set.
	OperatorSecret func(ctx context.Context, ref state.SecretRef, digest string) ([]byte, error)
	// EnvDir is where the environment of the containers with env-secrets
	// is kept while they exist: a directory on a tmpfs (/run), never on
	// disk, mode 0700. EnvExec is a static mesh binary, mounted read-only
	// into those containers: it sets that environment and execs their
	// command, so that Podman never holds the values (podman inspect shows
	// the container's env, and Podman 4.3's env secrets too).
	EnvDir      string
	EnvExec     string
	StepTimeout time.Duration
	// PodmanBack is how long a step waits for a Podman service that went
	// away to answer again, before it says so (default 2 minutes).
	PodmanBack time.Duration
	// ModuleNetworks gives each module's containers a bridge network of
	// their own (network.go); rootful Podman only. NetworkMade, when set,
	// is called once one is made (the resolver takes queries from it at
	// once, not after its next look at Podman's subnets).
	// ClearBridge, when set, removes a bridge of that name before the
	// network is made: one left of a network whose configuration went
	// without Podman's removing it (Podman's CNI backend deletes a
	// network's bridge at `podman network rm` only), which kept that
	// network's subnet and could not serve the new one.
	ModuleNetworks bool
	NetworkMade    func()
	ClearBridge    func(name string) error
	// Probe, when set, checks once per agent run that the resolver answers
	// from a container, before the first step or container starts.
	Probe  *ProbeConfig
	Logger *slog.Logger
	Now    func() time.Time
	// Observe, when set, is told of every apply's report and duration.
	Observe func(rep *state.Report, took time.Duration)
	// StepEnded, when set, is called with a step's runtime name and
	// container once its run has ended, before the container goes: `mesh
	// logs MODULE.STEP` keeps its lines from there.
	StepEnded func(ctx context.Context, name, id string)
	// Backups, when set, is what every report says of the node's backups
	// (the agent runs them, backup.go).
	Backups func() []state.BackupRun
	// Pauser pauses containers for a backup (backup: pause:); by default
	// the runtime, when it can.
	Pauser Pauser
}

// Reconciler applies plans on one node.
type Reconciler struct {
	cfg    Config
	rt     Runtime
	ledger *Ledger
	log    *slog.Logger
	// secrets are the values given to each module, taken out of what its
	// containers print before it is reported (redact.go).
	secrets *secretValues
	// kept is what the last apply said of each kept path, so that a kept
	// path is logged when what was found changes, not on every pass.
	kept map[string]string
	// probed says the resolver was seen to answer from a container;
	// swept that a probe an earlier run left (its end cut short) is gone.
	probed, swept bool
	// sweptTemps are the files whose leftover temp files were removed in
	// this run (writeFile's sweep).
	sweptTemps map[string]bool
	// health runs the declared health checks of the containers in place.
	health *monitor
	// lastFailed is the modules that failed (or waited) in the last
	// apply: their scheduled steps wait for one that succeeds
	// (schedule.go).
	lastFailed map[string]*state.ModuleFailure
	// pass is held by an apply (with its scheduled steps) and by a backup
	// or restore (Exclusive): one at a time. soon asks the loop for a pass.
	pass, soon chan struct{}
	// fences are the backups that read data directories while applies go
	// on (FenceSecrets); fenceMu guards them, since a backup lifts its
	// fence outside the node's hold.
	fenceMu sync.Mutex
	fences  map[*fence]bool
}

// New loads the ledger and returns a reconciler.
func New(cfg Config, rt Runtime) (*Reconciler, error) {
	if cfg.StepTimeout == 0 {
		cfg.StepTimeout = DefaultStepTimeout
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.NewTextHandler(io.Discard, nil))
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	l, err := LoadLedger(cfg.LedgerPath)
	if err != nil {
		return nil, err
	}
	if cfg.PodmanBack == 0 {
		cfg.PodmanBack = 2 * time.Minute
	}
	log := cfg.Logger.With("component", "reconciler")
	secrets := &secretValues{}
	r := &Reconciler{cfg: cfg, rt: rt, ledger: l, log: log, secrets: secrets, kept: map[string]string{}, health: newMonitor(rt, log, cfg.Now, secrets),
		pass: make(chan struct{}, 1), soon: make(chan struct{}, 1)}
	r.health.certDial = cfg.CertProbe
	r.sweepSecretTemps()
	return r, nil
}

// sweepSecretTemps removes, at start, what a write of a secret's or a
// credential's file cut by a kill left beside it (safefs's temporary
// file, holding the value): a write sweeps only its own file's, when it
// comes to it, and a module whose earlier resource fails never comes to
// it, while a backup or a move's copy of the directory would read it.
// No link is followed; what cannot be looked at stays for the write.
func (r *Reconciler) sweepSecretTemps() {
	for p, e := range r.ledger.Paths {
		if !holdsSecret(e.Kind) {
			continue
		}
		dfd, base, err := safefs.OpenParent(p)
		if err != nil {
			continue
		}
		if n, err := safefs.SweepAt(dfd, base); n > 0 || err != nil {
			r.log.Info("removed what a cut write of a secret's file left", "path", p, "files", n, "err", err)
		}
		unix.Close(dfd)
	}
}

// counting counts the calls an apply makes through a Runtime: n the
// mutating ones, calls the others. Removals run concurrently, so the counts
// are atomic.
type counting struct {
	n, calls atomic.Int64
}

func (c *counting) count(_ string, mutating bool) {
	if mutating {
		c.n.Add(1)
	} else {
		c.calls.Add(1)
	}
}

// run is the state of one apply.
type run struct {
	r *Reconciler
	// rt is what the resources' code calls Podman through: counted, or,
	// while modules apply concurrently, counted and unlocking (modules.go).
	rt      Runtime
	counted Runtime
	count   *counting
	// mu is held by the module applying now; it is let go only for the
	// length of a Podman call (unlocking), so the modules' other work (the
	// ledger, the maps below, the filesystem) stays one at a time.
	mu sync.Mutex
	// inputs and ran are per module: a resource's name is the module's own
	// (a step `migrate` in two modules is two steps).
	inputs  map[string]map[string]string // module -> resource name -> digest, for restart-on
	ran     map[string]map[string]bool   // module -> steps that ran in this apply
	managed map[string]Container
	// failed holds each module that failed in this apply, with why.
	failed map[string]*state.ModuleFailure
	// kinds maps every path of the plan to its kind, for the mount guard.
	kinds map[string]string
	// secretFiles are the plan's secrets', credentials' and delivered
	// credentials' paths, by module, for the mount guard.
	secretFiles [][2]string
	writes      int
	// publishOn is where containers' ports are published (the plan's
	// PublishAddress: the overlay address; every interface when empty).
	publishOn string
	// nets is the runtime's networks by name, listed once (network.go).
	nets map[string]Network
	// undoing holds the containers whose last pull is taken back in this
	// apply (a pull's rollout reverted): the ledger says so only once the
	// container runs the image from before it, and no policy pull fetches
	// the name's image again over it meanwhile.
	undoing map[string]bool
}

func (x *run) inputsOf(module string) map[string]string {
	m, ok := x.inputs[module]
	if !ok {
		m = map[string]string{}
		x.inputs[module] = m
	}
	return m
}

func (x *run) ranOf(module string) map[string]bool {
	m, ok := x.ran[module]
	if !ok {
		m = map[string]bool{}
		x.ran[module] = m
	}
	return m
}

// newRun is one pass over plan: an apply, or a scheduled step's run.
func (r *Reconciler) newRun(plan *state.Plan) *run {
	count := &counting{}
	counted := &Around{Runtime: r.rt, Before: count.count}
	return &run{r: r, rt: counted, counted: counted, count: count, inputs: map[string]map[string]string{}, ran: map[string]map[string]bool{},
		managed: map[string]Container{}, failed: map[string]*state.ModuleFailure{}, kinds: map[string]string{}, publishOn: plan.PublishAddress}
}

// Apply makes the node hold plan (version is the plan's version) and reports
// each resource's outcome. Failure is per module: a module stops at its own
// first failure (its later resources wait, and so do the modules on this node
// that bind to it or take a credential from it), while the other modules and
// the removals proceed.
func (r *Reconciler) Apply(ctx context.Context, version uint64, plan *state.Plan) state.Report {
	start := time.Now()
	rep := state.Report{Node: r.cfg.Node, Version: version, AppliedAt: r.cfg.Now().UTC()}
	x := r.newRun(plan)
	list, err := x.rt.Managed(ctx)
	if err != nil {
		rep.Error = "podman: " + err.Error()
		r.log.Warn("apply failed", "version", version, "err", err)
		return rep
	}
	for _, c := range list {
		x.managed[c.Name] = c
	}
	r.unpauseLeftovers(ctx, x)
	if !r.swept {
		// A probe left on a module's network would keep the network.
		r.swept = x.removeProbe(ctx, x.rt) == ""
	}
	// What the plan wants, whole: a resource that waits behind a failure is
	// still wanted, so nothing of a failed module is removed.
	wantPaths := map[string]bool{}
	wantCtrs := map[string]bool{}
	for _, res := range plan.Resources {
		switch res.Kind {
		case manifest.KindStep, manifest.KindContainer:
			wantCtrs[res.RuntimeName()] = true
		default:
			wantPaths[res.Name] = true
			x.kinds[res.Name] = res.Kind
			if holdsSecret(res.Kind) {
				x.secretFiles = append(x.secretFiles, [2]string{res.Name, res.Module})
			}
		}
	}
	rep.Resources = x.applyModules(ctx, plan)
	rep.Resources = append(rep.Resources, x.removeUnwanted(ctx, plan, wantPaths, wantCtrs)...)
	x.pruneEnv(plan)
	x.pruneNetworks(ctx, plan)
	if err := r.ledger.Save(); err != nil {
		rep.Failures = append(rep.Failures, state.ModuleFailure{Resource: "ledger " + r.cfg.LedgerPath, Reason: err.Error()})
	}
	r.follow(plan, rep.Resources, x.managed)
	mods := make([]string, 0, len(x.failed))
	for m, f := range x.failed {
		mods = append(mods, m)
		if f.Backup != "" {
			// Whether it runs as it ran (a provider's health gate
			// elsewhere opens on it), or waits before its containers
			// ever ran (a module assigned while the backup reads).
			f.Running = r.runsAll(plan, m)
			// Since the pass that first saw it wait, while it waits: a
			// report of this node (a new plan for another module) must
			// not make the wait look new.
			f.Since = rep.AppliedAt
			if prev := r.lastFailed[m]; prev != nil && prev.Backup != "" && !prev.Since.IsZero() {
				f.Since = prev.Since
			}
		}
	}
	sort.Strings(mods)
	r.lastFailed = map[string]*state.ModuleFailure{}
	for _, m := range mods {
		rep.Failures = append(rep.Failures, *x.failed[m])
		r.lastFailed[m] = x.failed[m]
	}
	for _, rr := range rep.Resources {
		if rr.Outcome == state.Failed && x.failed[rr.Module] == nil {
			// A removal that failed belongs to no module of the plan.
			rep.Failures = append(rep.Failures, state.ModuleFailure{Module: rr.Module, Resource: rr.Kind + " " + rr.Name, Reason: rr.Reason})
		}
	}
	r.health.setCerts(plan)
	rep.Health = r.health.snapshot()
	rep.Exits = r.health.exitsSnapshot()
	rep.Certificates = r.health.certsSnapshot()
	rep.Error = rep.FailureSummary()
	rep.Mutations = int(x.count.n.Load()) + x.writes
	lvl := slog.LevelInfo
	if rep.Mutations == 0 && rep.Error == "" {
		lvl = slog.LevelDebug // a quiet periodic pass
	}
	r.log.Log(ctx, lvl, "applied plan", "version", version, "mutations", rep.Mutations, "podman_calls", x.count.calls.Load(), "took", time.Since(start).Round(time.Millisecond), "error", rep.Error)
	return rep
}

// follow makes the monitor follow the plan's containers that this apply
// left in place (not those that failed): their exits, and the health of
// those with a check. One that waits (its module waits for a backup to
// have read, for a gate, behind a failure) runs as it ran: followed still
// if it was, as it was, so that its health and exits are reported through
// the wait (a backup reads for hours); not one this pass removed (a secret
// it read no longer set): only those in managed, as the pass left it.
func (r *Reconciler) follow(plan *state.Plan, outs []state.ResourceReport, managed map[string]Container) {
	outcome := map[string]state.Outcome{}
	for _, o := range outs {
		if o.Kind == manifest.KindContainer {
			outcome[o.Name] = o.Outcome
		}
	}
	var ws []watch
	for _, res := range plan.Resources {
		if res.Kind != manifest.KindContainer {
			continue
		}
		o := outcome[res.RuntimeName()]
		if o == state.Waiting {
			_, there := managed[res.RuntimeName()]
			if w, ok := r.health.following(res.RuntimeName()); ok && there && w.Module == res.Module {
				ws = append(ws, w)
			}
			continue
		}
		if o == state.Failed || o == "" {
			continue
		}
		ws = append(ws, watch{Module: res.Module, Name: res.RuntimeName(), Check: res.Typed.Health, Fresh: o == state.Created || o == state.Replaced || o == state.Restarted})
	}
	r.health.set(ws)
}

// runsAll says whether each container the plan gives module is followed:
// it ran, and was not stopped for a failure since.
func (r *Reconciler) runsAll(plan *state.Plan, module string) bool {
	for _, res := range plan.Resources {
		if res.Module == module && res.Kind == manifest.KindContainer {
			if w, ok := r.health.following(res.RuntimeName()); !ok || w.Module != module {
				return false
			}
		}
	}
	return true
}

// HealthChanged is closed at the next change of a followed container's health.
func (r *Reconciler) HealthChanged() <-chan struct{} { return r.health.Changed() }

// Health is the followed containers' health now.
func (r *Reconciler) Health() []state.ContainerHealth { return r.health.snapshot() }

// blocked returns the failure a resource must wait behind: its own module's,
// or, for a binding or credential, the failure of its provider on this node.
func (x *run) blocked(res state.Resource) *state.ModuleFailure {
	if f := x.failed[res.Module]; f != nil {
		return f
	}
	if res.Kind == manifest.KindBinding || res.Kind == manifest.KindCredential {
		if f := x.failed[res.Decl.Provider]; f != nil {
			// The consumer's module waits from here on, for its provider:
			// a wait too when the provider waits for a backup (its
			// credential's file, say), a failure otherwise.
			why := "waits for its provider " + res.Decl.Provider + ", which failed"
			if f.Backup != "" {
				why = "waits for its provider " + res.Decl.Provider + ", which waits: " + f.Reason
			}
			x.failed[res.Module] = &state.ModuleFailure{Module: res.Module, Resource: res.Kind + " " + res.Name, Reason: why, Provider: res.Decl.Provider, Backup: f.Backup}
			return x.failed[res.Module]
		}
	}
	return nil
}

// logLine writes the seeds' one line per change.
func (r *Reconciler) logLine(out state.ResourceReport) {
	verb := "updated"
	switch out.Outcome {
	case state.Kept:
		r.log.Info(fmt.Sprintf("kept %s (%s): %s", out.Name, out.Module, out.Reason))
		return
	case state.Failed:
		verb = "failed"
	}
	line := fmt.Sprintf("%s %s (%s): %s", verb, out.Name, out.Module, out.Outcome)
	if out.Reason != "" {
		line += "; " + out.Reason
	}
	if out.Outcome == state.Failed {
		r.log.Warn(line)
	} else {
		r.log.Info(line)
	}
}

// report is one resource's outcome; its reason is bounded (a step's output
// may be of any size), before the log line and the report carry it.
func report(res state.Resource, outcome state.Outcome, reason string) state.ResourceReport {
	return state.ResourceReport{Module: res.Module, Kind: res.Kind, Name: res.RuntimeName(), Outcome: outcome, Reason: state.Tail(reason, state.MaxText)}
}

func (x *run) apply(ctx context.Context, res state.Resource) state.ResourceReport {
	if !res.Typed.OK {
		// A plan written before typed values travelled in plans.
		t, err := manifest.TypeOf(&res.Decl)
		if err != nil {
			return report(res, state.Failed, "its declaration does not parse: "+err.Error())
		}
		res.Typed = t
	}
	if res.Kind != manifest.KindStep && res.Kind != manifest.KindContainer {
		if msg := x.r.refusedPath(res.Name); msg != "" {
			return report(res, state.Failed, msg)
		}
	}
	switch res.Kind {
	case manifest.KindDirectory:
		return x.directory(res)
	case manifest.KindFile, manifest.KindRoutesFile, manifest.KindBinding, manifest.KindCredential, state.KindDeliveredCredential, manifest.KindSecret:
		return x.file(ctx, res)
	case manifest.KindStep:
		return x.step(ctx, res)
	case manifest.KindContainer:
		return x.container(ctx, res)
	}
	return report(res, state.Failed, "unknown resource kind "+res.Kind+" (is this mesh older than the plan?)")
}

// refusedPath says why the host will not touch a path, "" when it will.
func (r *Reconciler) refusedPath(p string) string {
	if tree, shared := manifest.SystemTree(p); shared {
		return tree + " is shared by everything on the host, not a module's; the host does not touch it"
	} else if tree != "" {
		return tree + " belongs to the system, not to a module; the host does not touch it"
	}
	if d := r.cfg.DataDir; d != "" && (manifest.Within(p, d) || manifest.Within(d, p)) {
		return d + " is this node's data dir; the host does not touch it for a module"
	}
	return ""
}

func (x *run) directory(res state.Resource) state.ResourceReport {
	uid, gid := res.Typed.UID, res.Typed.GID
	mode := res.Typed.ModeOr(0o755)
	have, err := look(res.Name)
	if err != nil {
		return report(res, state.Failed, err.Error())
	}
	if have.exists && !have.isDir {
		return report(res, state.Failed, "exists and is not a directory; move it aside")
	}
	var entry *PathEntry
	if e, ok := x.r.ledger.Paths[res.Name]; ok {
		entry = &e
	}
	note := ""
	switch d := decideDir(res.Name, have, entry, uid, gid, mode, res.Decl.TakeOver); d.Action {
	case dirRefuse:
		return report(res, state.Failed, d.Message)
	case dirMake:
		// Recorded before it is made: only a directory the mesh created is the
		// mesh's to remove later, and a crash after mkdir must not forget it.
		if err := x.r.ledger.Put(res.Name, PathEntry{Kind: res.Kind, Module: res.Module, Data: res.Decl.Data}); err != nil {
			return report(res, state.Failed, err.Error())
		}
	case dirTakeOver:
		// Its owner and mode are recorded before they change, to be put
		// back; the directory itself is never the mesh's to remove.
		orig := &Original{UID: have.uid, GID: have.gid, Mode: have.mode}
		if err := x.r.ledger.Put(res.Name, PathEntry{Kind: res.Kind, Module: res.Module, Original: orig, Data: res.Decl.Data}); err != nil {
			return report(res, state.Failed, err.Error())
		}
		note = fmt.Sprintf("taken over; its owner and mode before (%d:%d %04o) are put back when the module lets go of it", have.uid, have.gid, have.mode)
	case dirOurs:
		if entry.Module != res.Module || entry.Data != res.Decl.Data {
			e := *entry
			e.Module, e.Data = res.Module, res.Decl.Data
			if err := x.r.ledger.Put(res.Name, e); err != nil {
				return report(res, state.Failed, err.Error())
			}
		}
	}
	outcome, drift, err := ensureDir(res.Name, uid, gid, mode)
	if err != nil {
		if !have.exists {
			// Not made (a full disk, say): not the mesh's either, whoever
			// makes it later.
			if now, lerr := look(res.Name); lerr == nil && !now.exists {
				x.r.ledger.Drop(res.Name)
			}
		}
		return report(res, state.Failed, err.Error())
	}
	x.inputsOf(res.Module)[res.Name] = digestBytes([]byte(fmt.Sprintf("dir %d:%d %o", uid, gid, mode)))
	if outcome != fsUnchanged {
		x.writes++
	}
	if note != "" {
		drift = strings.TrimSuffix(note+"; "+drift, "; ")
	}
	return report(res, outcomeOf(outcome), drift)
}

func outcomeOf(fs string) state.Outcome {
	switch fs {
	case fsCreated:
		return state.Created
	case fsUpdated:
		return state.Updated
	}
	return state.Unchanged
}

func (x *run) file(ctx context.Context, res state.Resource) state.ResourceReport {
	var content string
	mode := res.Typed.ModeOr(0o644)
	switch res.Kind {
	case manifest.KindCredential, state.KindDeliveredCredential:
		if res.Credential == nil {
			return report(res, state.Failed, "the plan carries no credential for it")
		}
		secret, err := x.r.cfg.Secret(ctx, *res.Credential)
		if err != nil {
			return report(res, state.Failed, "read its secret from the replica: "+err.Error())
		}
		x.r.secrets.add(res.Credential.Consumer, []byte(secret))
		x.r.secrets.add(res.Credential.Provider, []byte(secret))
		if res.Kind == manifest.KindCredential {
			content = secret + "\n"
		} else {
			content = "name=" + res.Credential.Consumer + "\nsecret=" + secret + "\n"
		}
		// A secret is never readable by group or others (DESIGN.md rule 7).
		mode = res.Typed.ModeOr(0o600) &^ 0o077
		x.inputsOf(res.Module)[res.Name] = res.Digest
	case manifest.KindSecret:
		name := res.Decl.SecretName
		v, wait := x.secretValue(ctx, res, name)
		if wait != nil {
			if e, ours := x.r.ledger.Paths[res.Name]; ours && res.Secrets[name] == "" {
				// Removed (mesh secret rm): the value it held goes too.
				if rr := x.removePath(res.Name, e); rr.Outcome == state.Removed {
					if err := x.r.ledger.Drop(res.Name); err == nil {
						x.writes++
						wait.Reason += "; the file that held it was removed"
					}
				}
			}
			if res.Secrets[name] == "" {
				wait.Reason += x.takeBackMounted(ctx, res)
			}
			return *wait
		}
		content = string(v)
		mode = res.Typed.ModeOr(0o600) &^ 0o077
		// What restart-on names it by: the secret, so that a container
		// replaced for it says "secret NAME changed".
		x.inputsOf(res.Module)[res.Name] = secretInput(name, res.Secrets[name])
	default:
		content = res.Content
		x.inputsOf(res.Module)[res.Name] = digestBytes([]byte(content))
	}
	uid, gid := res.Typed.UID, res.Typed.GID
	have, err := look(res.Name)
	if err != nil {
		return report(res, state.Failed, err.Error())
	}
	want := digestBytes([]byte(content))
	e, ours := x.r.ledger.Paths[res.Name]
	var entry *PathEntry
	if ours {
		cur := e
		entry = &cur
	}
	d := decideFile(res.Name, have, entry, want, res.Decl.TakeOver, x.r.keptDir())
	if holdsSecret(res.Kind) && d.Action != fileRefuse && (!have.exists || have.digest != want || d.Action == fileCopyAside || d.Action == fileTakeOver) {
		// A secret's bytes to write where a backup reads (FenceSecrets):
		// the module waits there, and the rest of the node goes on; the
		// pass after the fence is lifted writes it. What holds its bytes
		// already is not waited for: every apply goes over it.
		if f, dir := x.r.fencedAt(res.Name); f != nil {
			why := fmt.Sprintf("the backup of %s reads %s; a secret's file is written there once restic has read it (restic would copy it into the snapshot)", f.module, dir)
			if x.r.firstWait(f, res.Name) { // (every pass meets it again)
				x.r.log.Warn("a secret's file waits for the backup that reads its directory", "path", res.Name, "backup", f.module, "dir", dir)
			}
			x.failed[res.Module] = &state.ModuleFailure{Module: res.Module, Resource: res.Kind + " " + res.RuntimeName(), Reason: why, Backup: f.module}
			return report(res, state.Waiting, "waits: "+why)
		}
	}
	var note string
	switch d.Action {
	case fileRefuse:
		return report(res, state.Failed, d.Message)
	case fileCopyAside:
		if holdsSecret(res.Kind) {
			// What a secret's or a credential's file held is never copied
			// anywhere: what a container wrote there may hold the secret
			// too (a copy outlived the secret's rotation and the module).
			note = "its content had changed on the host; put back (a secret's or a credential's file is never copied aside)"
			break
		}
		fallthrough
	case fileTakeOver:
		// Bytes the mesh did not write: a copy is kept before they go.
		kept, err := x.r.keep(res, have)
		if err != nil {
			return report(res, state.Failed, d.Message+err.Error())
		}
		if d.Action == fileTakeOver {
			e = PathEntry{Original: &Original{Kept: kept, Digest: have.digest, UID: have.uid, GID: have.gid, Mode: have.mode}}
		} else {
			x.r.pruneKept(res.Name)
		}
		note = d.Note + kept
	}
	// Recorded before the write: a crash between the two leaves a file that
	// holds either digest, and both are the mesh's.
	ne := e
	ne.Kind, ne.Module, ne.Digest, ne.Prev = res.Kind, res.Module, want, d.Prev
	if !ours || ne != e {
		if err := x.r.ledger.Put(res.Name, ne); err != nil {
			return report(res, state.Failed, err.Error())
		}
	}
	// Once a run, what a write cut short by a kill left beside the file is
	// removed, even when the file holds what it should.
	outcome, drift, err := writeFile(res.Name, have, []byte(content), uid, gid, mode, !x.r.sweptTemps[res.Name])
	if err != nil {
		return report(res, state.Failed, err.Error())
	}
	if x.r.sweptTemps == nil {
		x.r.sweptTemps = map[string]bool{}
	}
	x.r.sweptTemps[res.Name] = true
	if outcome != fsUnchanged {
		x.writes++
	}
	if note != "" {
		drift = strings.TrimPrefix(drift+"; "+note, "; ")
	}
	return report(res, outcomeOf(outcome), drift)
}

// keptDir is where the originals of files the mesh replaced are kept.
func (r *Reconciler) keptDir() string {
	if r.cfg.DataDir == "" {
		return filepath.Join(filepath.Dir(r.cfg.LedgerPath), "kept")
	}
	return filepath.Join(r.cfg.DataDir, "kept")
}

// What the kept dir holds of the edits a file went through is bounded: a
// container that rewrites a declared file it mounts would otherwise grow it
// at every pass. The originals of files taken over are never pruned.
const (
	// MaxKeptPerPath is how many copies of a file's edits are kept.
	MaxKeptPerPath = 3
	// MaxKeptBytes bounds all the copies of edits, oldest first out.
	MaxKeptBytes = 64 << 20
)

// keptName is the kept dir's name for a copy of path with digest: a digest
// of the path (so two paths never share a prefix, however long or alike),
// the content's digest, and the file's own name for whoever looks.
func keptName(path, digest string) string {
	base := filepath.Base(path)
	if len(base) > 64 {
		base = base[len(base)-64:]
	}
	return keptPrefix(path) + digest + "-" + base
}

// keptPrefix is what every copy of path's name starts with.
func keptPrefix(path string) string {
	h := sha256.Sum256([]byte(path))
	return hex.EncodeToString(h[:8]) + "@"
}

// pruneKept drops copies of edits beyond the bounds: for path, all but
// the newest MaxKeptPerPath, and then, oldest first, whatever passes
// MaxKeptBytes in all.
func (r *Reconciler) pruneKept(path string) { r.pruneKeptOf(path, MaxKeptPerPath) }

// pruneKeptOf keeps the newest keepN copies of path's edits (0: its module
// let go of it) within the bounds of all.
func (r *Reconciler) pruneKeptOf(path string, keepN int) {
	dir := r.keptDir()
	entries, err := os.ReadDir(dir)
	if err != nil {
		return
	}
	protect := map[string]bool{}
	for _, e := range r.ledger.Paths {
		if e.Original != nil && e.Original.Kept != "" {
			protect[filepath.Base(e.Original.Kept)] = true
		}
	}
	type copyOf struct {
		name string
		at   time.Time
		size int64
	}
	var mine, all []copyOf
	prefix := keptPrefix(path)
	for _, en := range entries {
		if protect[en.Name()] || !en.Type().IsRegular() {
			continue
		}
		fi, err := en.Info()
		if err != nil {
			continue
		}
		c := copyOf{en.Name(), fi.ModTime(), fi.Size()}
		all = append(all, c)
		if strings.HasPrefix(en.Name(), prefix) {
			mine = append(mine, c)
		}
	}
	gone := map[string]bool{}
	sort.Slice(mine, func(i, j int) bool { return mine[i].at.After(mine[j].at) })
	for _, c := range mine[min(keepN, len(mine)):] {
		if os.Remove(filepath.Join(dir, c.name)) == nil {
			gone[c.name] = true
		}
	}
	var total int64
	sort.Slice(all, func(i, j int) bool { return all[i].at.After(all[j].at) })
	for _, c := range all {
		if gone[c.name] {
			continue
		}
		total += c.size
		if total > MaxKeptBytes {
			os.Remove(filepath.Join(dir, c.name))
		}
	}
}

// keep copies what is at a path into the kept dir, durably, and returns
// where. Its name says the path and the content's digest.
func (r *Reconciler) keep(res state.Resource, have pathState) (string, error) {
	dir := r.keptDir()
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return "", err
	}
	p := filepath.Join(dir, keptName(res.Name, have.digest[:16]))
	if err := safefs.WriteFile(p, have.content, 0o600); err != nil {
		return "", err
	}
	return p, nil
}

// ensureImage makes ref present before a create, under the resource's pull
// policy: missing pulls only an absent image; always and newer ask the
// registry at each create or replace (never on a pass that keeps the
// container).
func (x *run) ensureImage(ctx context.Context, res state.Resource) error {
	ref, policy := res.Decl.Image, res.Decl.Pull
	if (policy == manifest.PullAlways || policy == manifest.PullNewer) && !x.undoing[res.RuntimeName()] {
		return x.rt.Pull(ctx, ref, policy)
	}
	ok, err := x.rt.ImageExists(ctx, ref)
	if err != nil {
		return err
	}
	if ok {
		return nil
	}
	return x.rt.Pull(ctx, ref, manifest.PullMissing)
}

func labels(want desired) map[string]string {
	in, _ := json.Marshal(want.Inputs)
	return map[string]string{
		LabelManaged: "1", LabelModule: want.Module, LabelKind: want.Kind,
		LabelDigest: want.Digest, LabelDecl: want.Decl, LabelInputs: string(in),
	}
}

func (x *run) spec(ctx context.Context, res state.Resource, want desired) Spec {
	d := res.Decl
	s := Spec{Name: want.Name, Image: d.Image, Command: d.Command, Env: d.Env, Labels: labels(want), DNS: x.r.cfg.DNS, Network: x.r.networkOf(res.Module), Restart: d.Restart, Health: res.Typed.Health,
		Entrypoint: d.Entrypoint, User: d.User, WorkingDir: d.WorkingDir, CapAdd: d.CapAdd, CapDrop: d.CapDrop, Devices: res.Typed.Devices, ReadOnly: d.ReadOnly,
		Tmpfs: res.Typed.Tmpfs, Memory: res.Typed.Memory, CPUs: d.CPUs, StopSignal: res.Typed.StopSignal, StopTimeout: res.Typed.StopTimeout, LogMaxSize: logMaxSize(res.Typed),
		TTY: d.TTY, Init: d.Init, PidsLimit: res.Typed.PidsLimit, GroupAdd: d.GroupAdd}
	for k, v := range d.Labels {
		if _, ours := s.Labels[k]; !ours {
			s.Labels[k] = v
		}
	}
	if x.r.cfg.Domain != nil {
		if dom := x.r.cfg.Domain(ctx); dom != "" {
			s.DNSSearch = []string{dom}
		}
	}
	if res.Kind == manifest.KindContainer && s.Restart == "" {
		s.Restart = "always"
	}
	for _, m := range res.Typed.Mounts {
		s.Mounts = append(s.Mounts, Mount{Source: m.Source, Destination: m.Destination, Options: m.Options})
	}
	for _, p := range res.Typed.Ports {
		// Internal ports are on the node's overlay address only (DESIGN.md
		// rule 11), whatever address an older manifest named.
		ip := p.HostIP
		if x.publishOn != "" {
			ip = x.publishOn
		}
		s.Ports = append(s.Ports, Port{HostIP: ip, HostPort: p.HostPort, ContainerPort: p.ContainerPort, Protocol: p.Protocol})
	}
	for _, p := range res.Typed.PublicPorts {
		s.Ports = append(s.Ports, Port{HostIP: p.HostIP, HostPort: p.HostPort, ContainerPort: p.ContainerPort, Protocol: p.Protocol})
	}
	if len(d.EnvSecrets) > 0 {
		s.EnvFile, s.EnvExec = x.r.envPath(want.Name), x.r.cfg.EnvExec
	}
	return s
}

// volumesKept refuses a container whose image declares a VOLUME that no
// mount or tmpfs of the manifest holds (at the path or above it). Podman
// would have made it an anonymous volume of its own (and inside a
// module's directory mounted above it, the data went there instead);
// every container is now created with image volumes ignored (podman's
// generator), so what the container wrote there would be its own and go
// with it at the next replacement: the operator says where it goes. A
// step is let be: it runs once and keeps nothing of its own.
func (x *run) volumesKept(ctx context.Context, res state.Resource) string {
	if res.Kind != manifest.KindContainer {
		return ""
	}
	vols, err := x.rt.ImageVolumes(ctx, res.Decl.Image)
	if err != nil {
		return err.Error()
	}
	var loose []string
	for _, v := range vols {
		v = path.Clean("/" + v)
		if !slices.ContainsFunc(res.Typed.Mounts, func(m manifest.Mount) bool { return manifest.Within(v, path.Clean(m.Destination)) }) &&
			!slices.ContainsFunc(res.Typed.Tmpfs, func(t manifest.Tmpfs) bool { return manifest.Within(v, path.Clean(t.Path)) }) {
			loose = append(loose, v)
		}
	}
	if len(loose) == 0 {
		return ""
	}
	return fmt.Sprintf("image %s keeps data at %s (VOLUME), which no mount of %s holds: it would be lost at the container's next replacement, outside the module's backups and moves; mount a directory of the module there (mounts: [\"/srv/%s/...:%s\"]), or a tmpfs if it holds nothing to keep (tmpfs: [\"%s\"])",
		res.Decl.Image, strings.Join(loose, ", "), res.RuntimeName(), res.Module, loose[0], loose[0])
}

// othersSecretsOK is the guard before every create and start of a
// container or step: no mount holds another module's secret, credential
// or delivered credential (read-only: a writable mount around another
// module's path does not compose), which its container would read: what
// is sealed to the node for that module is not this one's.
func (x *run) othersSecretsOK(res state.Resource) string {
	for _, m := range res.Typed.Mounts {
		for _, f := range x.secretFiles {
			if f[1] != res.Module && manifest.Within(f[0], m.Source) {
				return fmt.Sprintf("mount source %s holds %s, a secret or credential of module %s, which %s would read; mount a directory that holds no other module's secrets", m.Source, f[0], f[1], res.RuntimeName())
			}
		}
	}
	return ""
}

// mountsOK is the guard before every create and start: each mount's source
// is still what the plan declared (a directory or a regular file, no link
// anywhere on its path). A container whose source a link replaced would have
// Podman mount the link's target.
func (x *run) mountsOK(res state.Resource) string {
	for _, m := range res.Typed.Mounts {
		have, err := look(m.Source)
		switch {
		case err != nil:
			return fmt.Sprintf("mount source %s is no longer what was declared (%s)", m.Source, keptReason(err))
		case !have.exists:
			return fmt.Sprintf("mount source %s does not exist; declare it above the %s", m.Source, res.Kind)
		case have.isDir != (x.kinds[m.Source] == manifest.KindDirectory):
			return fmt.Sprintf("mount source %s is no longer what was declared (a %s)", m.Source, x.kinds[m.Source])
		}
	}
	for _, d := range res.Typed.Devices {
		if msg := deviceOK(d.Host); msg != "" {
			return msg
		}
	}
	return ""
}

// deviceOK says what is wrong with a declared device: the mesh never makes
// one, and never follows a link to one.
func deviceOK(p string) string {
	dfd, base, err := safefs.OpenParent(p)
	if err != nil {
		return fmt.Sprintf("device %s: %v", p, err)
	}
	defer unix.Close(dfd)
	var st unix.Stat_t
	if err := unix.Fstatat(dfd, base, &st, unix.AT_SYMLINK_NOFOLLOW); err != nil {
		return fmt.Sprintf("device %s does not exist on this host (%v)", p, err)
	}
	if f := st.Mode & unix.S_IFMT; f != unix.S_IFCHR && f != unix.S_IFBLK {
		return fmt.Sprintf("device %s is not a device node (a link or a file); name the device itself", p)
	}
	return ""
}

func (x *run) step(ctx context.Context, res state.Resource) state.ResourceReport {
	want := describe(res, x.r.cfg.DNS, x.publishOn, x.r.networkOf(res.Module), x.inputsOf(res.Module))
	x.inputsOf(res.Module)[res.Name] = want.Digest
	if res.Decl.BeforeBackup {
		// It runs before each backup of its module (backup.go), never in
		// an apply; a run that an agent's end cut short left its container.
		if c, ok := x.managed[want.Name]; ok {
			x.rt.Remove(ctx, c.ID)
			delete(x.managed, want.Name)
		}
		return report(res, state.Unchanged, "")
	}
	var marker *Marker
	if m, ok := x.r.ledger.Markers[want.Name]; ok {
		marker = &m
	}
	run, reason := decideStep(want, marker, x.ranOf(res.Module))
	leftover, found := x.managed[want.Name]
	if !found {
		c, ok, err := x.rt.Lookup(ctx, want.Name)
		if err != nil {
			return report(res, state.Failed, err.Error())
		}
		if ok && c.Labels[LabelManaged] != "1" {
			_, _, err := decideContainer(want, &c, nil)
			return report(res, state.Failed, err.Error())
		}
		leftover, found = c, ok
	}
	var left *Container
	if found {
		left = &leftover
	}
	d := decideLeftover(want, run, reason, left)
	switch d.Action {
	case stepSkip:
		return report(res, state.Unchanged, "")
	case stepTidy:
		// The run finished; only its container was left. Its marker may be
		// in memory only (the disk was full when it was recorded): the
		// container is then the only record on this host that the step ran,
		// which a restarted agent re-attaches to, so it goes only once the
		// marker is on disk.
		if err := x.r.ledger.Save(); err != nil {
			return report(res, state.Failed, "the step ran, but its marker could not be recorded: "+err.Error())
		}
		x.rt.Remove(ctx, leftover.ID)
		delete(x.managed, want.Name)
		return report(res, state.Unchanged, "")
	}
	reattach := ""
	if d.Action == stepReattach {
		// The same run, started before the agent stopped or Podman went
		// away: waited for, not run twice.
		reattach = leftover.ID
	} else if d.Action == stepClearAndRun {
		if err := x.rt.Remove(ctx, leftover.ID); err != nil {
			return report(res, state.Failed, err.Error())
		}
	}
	id, rr, ok := x.stepRun(ctx, res, want, reattach)
	if !ok {
		return rr
	}
	// The marker is durable before anything else happens, so a crash from
	// here on never reruns the step.
	if err := x.r.ledger.Mark(want.Name, Marker{Digest: want.Digest, Decl: want.Decl, Inputs: want.Inputs}); err != nil {
		return report(res, state.Failed, "the step ran, but its marker could not be recorded: "+err.Error())
	}
	x.rt.Remove(context.WithoutCancel(ctx), id)
	x.ranOf(res.Module)[res.Name] = true
	return report(res, state.Ran, d.Reason)
}

// stepRun runs a step's container to its end (or waits on the one started
// before, reattach): ok when it exited 0, its container left for the caller
// to remove once the run is recorded; else removed, and the report says
// why.
func (x *run) stepRun(ctx context.Context, res state.Resource, want desired, reattach string) (string, state.ResourceReport, bool) {
	if msg := cmp.Or(x.mountsOK(res), x.othersSecretsOK(res)); msg != "" {
		return "", report(res, state.Failed, msg+"; not run"), false
	}
	if stop := x.writeEnv(ctx, res, want.Name); stop != nil {
		return "", *stop, false
	}
	// Its environment is kept only while it runs.
	defer x.dropEnv(want.Name)
	id := reattach
	if id == "" {
		delete(x.managed, want.Name)
		if err := x.ensureImage(ctx, res); err != nil {
			return "", report(res, state.Failed, err.Error()), false
		}
		if msg := x.ensureNetwork(ctx, res.Module); msg != "" {
			return "", report(res, state.Failed, msg), false
		}
		if msg := x.reachable(ctx, res); msg != "" {
			return "", report(res, state.Failed, msg), false
		}
		var err error
		id, err = x.rt.Create(ctx, x.spec(ctx, res, want))
		if err != nil {
			return "", report(res, state.Failed, err.Error()), false
		}
		if err := x.rt.Start(ctx, id); err != nil {
			x.rt.Remove(context.WithoutCancel(ctx), id)
			return "", report(res, state.Failed, err.Error()), false
		}
	}
	code, err := x.waitStep(ctx, id)
	if err != nil {
		if ctx.Err() != nil {
			// The agent is stopping: the run goes on, and the next start
			// re-attaches to it.
			return "", report(res, state.Failed, "the agent stopped while it ran; it is re-attached at the next start"), false
		}
		if x.r.cfg.StepEnded != nil {
			x.r.cfg.StepEnded(context.WithoutCancel(ctx), want.Name, id)
		}
		x.rt.Remove(context.WithoutCancel(ctx), id)
		return "", report(res, state.Failed, err.Error()), false
	}
	if x.r.cfg.StepEnded != nil {
		x.r.cfg.StepEnded(ctx, want.Name, id)
	}
	if code != 0 {
		logs, _ := x.rt.Logs(ctx, id, 10)
		logs = state.Tail(x.r.secrets.redact(res.Module, logs), state.MaxText)
		x.rt.Remove(context.WithoutCancel(ctx), id)
		msg := fmt.Sprintf("exited with code %d", code)
		if logs != "" {
			msg += "; last lines:\n"
			msg += state.Tail(logs, state.MaxText-len(msg)) // the code stays in
		}
		return "", report(res, state.Failed, msg), false
	}
	return id, state.ResourceReport{}, true
}

// waitStep waits for a step's container to exit, within the step timeout. A
// Podman service that goes away and comes back is waited for (up to
// PodmanBack), then the same container is waited on again.
func (x *run) waitStep(ctx context.Context, id string) (int, error) {
	wctx, cancel := context.WithTimeout(ctx, x.r.cfg.StepTimeout)
	defer cancel()
	var lost time.Time
	for {
		code, err := x.rt.Wait(wctx, id)
		if err == nil {
			return code, nil
		}
		if ctx.Err() != nil {
			return 0, ctx.Err()
		}
		if wctx.Err() != nil {
			return 0, fmt.Errorf("did not finish within %s; stopped", x.r.cfg.StepTimeout)
		}
		if lost.IsZero() {
			lost = time.Now()
			x.r.log.Warn("lost Podman while a step ran; waiting for it to come back", "container", id, "err", err)
		}
		if time.Since(lost) > x.r.cfg.PodmanBack {
			return 0, fmt.Errorf("lost Podman while it ran (%v), and Podman did not come back within %s", err, x.r.cfg.PodmanBack)
		}
		select {
		case <-wctx.Done():
		case <-time.After(time.Second):
		}
	}
}

func (x *run) container(ctx context.Context, res state.Resource) state.ResourceReport {
	rep := x.applyContainer(ctx, res)
	switch {
	case x.undoing[res.RuntimeName()] && rep.Outcome != state.Failed:
		x.r.ledger.UndoPull(res.RuntimeName(), res.Pull)
	case res.Pull > 0 && rep.Outcome != state.Failed && !x.undoing[res.RuntimeName()]:
		x.r.ledger.MarkPulled(res.RuntimeName(), res.Pull)
	}
	delete(x.undoing, res.RuntimeName())
	// A restart is handled by any start this apply made (a new or
	// replaced container, one started again), or by the restart itself.
	if res.Restart > 0 && rep.Outcome != state.Failed && rep.Outcome != state.Waiting {
		x.r.ledger.MarkRestarted(res.RuntimeName(), res.Restart)
	}
	return rep
}

func (x *run) applyContainer(ctx context.Context, res state.Resource) state.ResourceReport {
	want := describe(res, x.r.cfg.DNS, x.publishOn, x.r.networkOf(res.Module), x.inputsOf(res.Module))
	var have *Container
	if c, ok := x.managed[want.Name]; ok {
		have = &c
	} else {
		c, found, err := x.rt.Lookup(ctx, want.Name)
		if err != nil {
			return report(res, state.Failed, err.Error())
		}
		if found {
			have = &c
		}
	}
	// Its environment is written before anything starts it (Podman's
	// restarts included: the file stays while the container is wanted).
	if stop := x.writeEnv(ctx, res, want.Name); stop != nil {
		stop.Reason += x.takeBack(ctx, res)
		return *stop
	}
	action, reason, err := decideContainer(want, have, x.ranOf(res.Module))
	if err != nil {
		return report(res, state.Failed, err.Error())
	}
	// mesh module pull: fetch the image now, and replace the container only
	// if the image it runs is not the one the name now gives.
	if pullDue(res.Pull, x.r.ledger.Pulled[want.Name]) {
		if err := x.rt.Pull(ctx, res.Decl.Image, manifest.PullAlways); err != nil {
			return report(res, state.Failed, err.Error()+" (mesh module pull; tried again at the next apply)")
		}
		if have != nil {
			id, err := x.rt.ImageID(ctx, res.Decl.Image)
			if err != nil {
				return report(res, state.Failed, err.Error())
			}
			action, reason = decidePull(action, reason, res.Decl.Image, have.ImageID, id)
			// A name by digest is never tagged back: nothing to keep.
			if have.ImageID != "" && have.ImageID != id && !strings.Contains(res.Decl.Image, "@") {
				x.r.ledger.SetPrePull(want.Name, PrePull{Index: res.Pull, ImageID: have.ImageID})
			}
		}
	} else if pre, ok := x.r.ledger.PrePull[want.Name]; pullUndone(res.Pull, pre, ok) {
		// The pull's rollout was reverted: the name gives the image the
		// container ran before it again, and the container runs that.
		if err := x.rt.Tag(ctx, pre.ImageID, res.Decl.Image); err != nil {
			// The image is gone from this node (pruned): the container keeps
			// the pulled one, and the ledger stops asking for it.
			x.r.log.Warn("a pull's rollout was reverted, but the image from before it cannot be put back; the container keeps the pulled one",
				"container", want.Name, "image", shortID(pre.ImageID), "err", err)
			x.r.ledger.UndoPull(want.Name, res.Pull)
		} else {
			if x.undoing == nil {
				x.undoing = map[string]bool{}
			}
			x.undoing[want.Name] = true
			if have != nil && have.ImageID != pre.ImageID {
				why := fmt.Sprintf("image %s back to %s (the rollout of mesh module pull was reverted)", res.Decl.Image, shortID(pre.ImageID))
				if action == actReplace {
					reason += "; " + why
				} else {
					action, reason = actReplace, why
				}
			}
		}
	}
	if msg := x.mountsOK(res); msg != "" {
		if have != nil && have.Running {
			// Running with what was there at its start; it must not start
			// again through the link.
			if err := x.rt.Remove(ctx, have.ID); err != nil {
				return report(res, state.Failed, msg+"; and removing it failed: "+err.Error())
			}
			delete(x.managed, want.Name)
			return report(res, state.Failed, msg+"; stopped and removed, so Podman cannot start it through the link")
		}
		return report(res, state.Failed, msg+"; not started")
	}
	if msg := x.othersSecretsOK(res); msg != "" {
		if have != nil && have.Running {
			// One that runs (started before the secret came, or by an
			// earlier release) is not stopped by the mesh: said.
			return report(res, state.Failed, msg+"; it runs as it was started, and is not started, created or replaced while the mount holds it")
		}
		return report(res, state.Failed, msg+"; not started")
	}
	switch action {
	case actKeep:
		if have != nil && have.Running && res.Restart > x.r.ledger.Restarted[want.Name] {
			x.r.health.expectRestart(want.Name)
			err := x.rt.Restart(ctx, have.ID)
			x.r.health.restartDone(want.Name)
			if err != nil {
				return report(res, state.Failed, err.Error()+" (mesh restart; tried again at the next apply)")
			}
			// Durable at once, as a step's marker: a kill -9 from here on
			// does not restart it again.
			x.r.ledger.MarkRestarted(want.Name, res.Restart)
			if err := x.r.ledger.Save(); err != nil {
				return report(res, state.Restarted, "mesh restart (not recorded: "+err.Error()+"; it may restart once more)")
			}
			return report(res, state.Restarted, "mesh restart")
		}
		return report(res, state.Unchanged, "")
	case actStart:
		if err := x.rt.Start(ctx, have.ID); err != nil {
			return report(res, state.Failed, err.Error())
		}
		return report(res, state.Started, reason)
	}
	// What the new container needs comes before the old one goes: a
	// replacement whose image, network or resolver is missing leaves the
	// container it would replace running.
	if err := x.ensureImage(ctx, res); err != nil {
		return report(res, state.Failed, err.Error())
	}
	if msg := x.volumesKept(ctx, res); msg != "" {
		return report(res, state.Failed, msg)
	}
	if msg := x.ensureNetwork(ctx, res.Module); msg != "" {
		return report(res, state.Failed, msg)
	}
	if msg := x.reachable(ctx, res); msg != "" {
		return report(res, state.Failed, msg)
	}
	if action == actReplace {
		if err := x.rt.Remove(ctx, have.ID); err != nil {
			return report(res, state.Failed, err.Error())
		}
	}
	id, err := x.rt.Create(ctx, x.spec(ctx, res, want))
	if err != nil {
		return report(res, state.Failed, err.Error())
	}
	x.managed[want.Name] = Container{ID: id, Name: want.Name}
	if err := x.rt.Start(ctx, id); err != nil {
		return report(res, state.Failed, err.Error())
	}
	if action == actReplace {
		return report(res, state.Replaced, reason)
	}
	return report(res, state.Created, "")
}

// removeUnwanted removes the mesh's containers that the plan no longer holds,
// and the paths it wrote that the plan no longer holds, children first. A
// path that holds anything the mesh did not put there is kept and reported;
// a file the mesh took over gets its original back.
func (x *run) removeUnwanted(ctx context.Context, plan *state.Plan, paths, ctrs map[string]bool) []state.ResourceReport {
	var out []state.ResourceReport
	var names []string
	for name := range x.managed {
		if !ctrs[name] {
			names = append(names, name)
		}
	}
	sort.Strings(names)
	// Containers no longer wanted are removed concurrently, a few at a
	// time: each may take its stop timeout (10 s for a process that ignores
	// SIGTERM), and one after the other a module of twenty took minutes.
	// Nothing orders them: the paths go after all of them, as before.
	removed := make([]state.ResourceReport, len(names))
	sem := make(chan struct{}, RemoveConcurrency)
	var wg sync.WaitGroup
	var crash panicked
	for i, name := range names {
		c := x.managed[name]
		wg.Add(1)
		sem <- struct{}{}
		if crash.happened() {
			wg.Done()
			<-sem
			break
		}
		go func() {
			defer func() { <-sem; wg.Done() }()
			defer crash.catch()
			rr := state.ResourceReport{Module: c.Labels[LabelModule], Kind: c.Labels[LabelKind], Name: name}
			if err := x.rt.Remove(ctx, c.ID); err != nil {
				rr.Outcome, rr.Reason = state.Failed, err.Error()
			} else {
				rr.Outcome = state.Removed
			}
			x.r.logLine(rr)
			removed[i] = rr
		}()
	}
	wg.Wait()
	crash.rethrow()
	out = append(out, removed...)
	// A module whose container is not gone keeps its data, purge or not.
	running := map[string]bool{}
	for _, rr := range removed {
		if rr.Outcome == state.Failed {
			running[rr.Module] = true
		}
	}
	purge := map[string]string{}
	for _, pg := range plan.Purge {
		purge[pg.Path] = pg.Module
		if _, ok := x.r.ledger.Paths[pg.Path]; !ok && !paths[pg.Path] {
			if have, err := look(pg.Path); err == nil && have.exists && x.r.kept[pg.Path] == "" {
				rr := state.ResourceReport{Module: pg.Module, Kind: manifest.KindDirectory, Name: pg.Path, Outcome: state.Kept,
					Reason: "--purge-data: the mesh did not make it (it was there before), so it does not remove it"}
				x.r.kept[pg.Path] = rr.Reason
				x.r.logLine(rr)
				out = append(out, rr)
			}
		}
	}
	var gone []string
	for p := range x.r.ledger.Paths {
		if !paths[p] {
			gone = append(gone, p)
		}
	}
	sort.Sort(sort.Reverse(sort.StringSlice(gone)))
	seen := map[string]bool{}
	for _, p := range gone {
		e := x.r.ledger.Paths[p]
		var rr state.ResourceReport
		if m, ok := purge[p]; ok && e.Data && e.Kind == manifest.KindDirectory && e.Original == nil && m == e.Module && !running[m] {
			rr = x.purgePath(p, e)
		} else {
			rr = x.removePath(p, e)
		}
		if rr.Outcome == state.Removed || rr.Outcome == state.Restored {
			if err := x.r.ledger.Drop(p); err != nil {
				rr.Outcome, rr.Reason = state.Failed, err.Error()
			}
			x.writes++
		}
		if rr.Outcome == state.Kept {
			seen[p] = true
			if x.r.kept[p] == rr.Reason {
				out = append(out, rr)
				continue // said once already
			}
			x.r.kept[p] = rr.Reason
		}
		x.r.logLine(rr)
		out = append(out, rr)
	}
	for p := range x.r.kept {
		if !seen[p] {
			delete(x.r.kept, p)
		}
	}
	// The ledger forgets the runs of steps and the pulls of containers the
	// plan no longer holds, but the runs of a module held stopped (in the
	// plan, without a container or step: a move, a failed restore), and
	// those a move brought here before its start reached the node
	// (Arriving): forgotten, its steps ran again where it started next
	// (on TO, from the markers the move sends; here, after an abort).
	want, held := map[string]bool{}, map[string]bool{}
	for _, res := range plan.Resources {
		if _, ok := held[res.Module]; !ok {
			held[res.Module] = true
		}
		if res.Kind == manifest.KindStep || res.Kind == manifest.KindContainer {
			want[res.Kind+"\x00"+res.RuntimeName()] = true
			held[res.Module] = false
		}
	}
	now := x.r.cfg.Now()
	for module, arr := range x.r.ledger.Arriving {
		if stopped, in := held[module]; (in && !stopped) || now.After(arr.Until) {
			delete(x.r.ledger.Arriving, module)
		} else {
			held[module] = true
		}
	}
	for k := range x.r.ledger.Markers {
		module, _, _ := strings.Cut(k, ".") // a module's name is a DNS label: no dot
		if !want[manifest.KindStep+"\x00"+k] && !held[module] {
			delete(x.r.ledger.Markers, k)
		}
	}
	for k := range x.r.ledger.Pulled {
		if !want[manifest.KindContainer+"\x00"+k] {
			delete(x.r.ledger.Pulled, k)
		}
	}
	for k := range x.r.ledger.PrePull {
		if !want[manifest.KindContainer+"\x00"+k] {
			delete(x.r.ledger.PrePull, k)
		}
	}
	for k := range x.r.ledger.Restarted {
		if !want[manifest.KindContainer+"\x00"+k] {
			delete(x.r.ledger.Restarted, k)
		}
	}
	for k := range x.r.ledger.Schedules {
		if !want[manifest.KindStep+"\x00"+k] {
			delete(x.r.ledger.Schedules, k)
		}
	}
	return out
}

// purgePath removes a data directory the mesh made, with everything in it
// (mesh unassign --purge-data), following no link: a link inside is removed,
// never what it points at. Cut short (a kill, a full disk), the ledger still
// holds it and the next apply goes on.
func (x *run) purgePath(p string, e PathEntry) state.ResourceReport {
	rr := state.ResourceReport{Module: e.Module, Kind: e.Kind, Name: p}
	if msg := x.r.refusedPath(p); msg != "" {
		rr.Outcome, rr.Reason = state.Kept, msg
		return rr
	}
	if other := x.r.keptUnder(p, e.Module); other != "" {
		// Another module's path, or one taken over, that stays (a data
		// directory of a module unassigned without --purge-data is kept):
		// never removed with this module's data.
		rr.Outcome, rr.Reason = state.Kept, "--purge-data: it holds "+other+", which stays; move that out of it, then the next apply purges it"
		return rr
	}
	if owner := x.r.OwnerAt(p + purgeSuffix); owner != "" {
		// The purge renames the directory there (and removes what a cut
		// purge left there first): never a module's, which a manifest
		// may declare.
		rr.Outcome, rr.Reason = state.Kept, fmt.Sprintf("--purge-data: %s, where the purge sets it aside, is module %s's (or holds its files); rename that module's directory, then the next apply purges it", p+purgeSuffix, owner)
		return rr
	}
	// The copy a restore kept of what the directory held before it is the
	// module's data too (a purge that left it would leave the data on the
	// disk): purged first, so that one cut short or refused keeps the
	// directory in the ledger, and the next apply goes on. Never a
	// module's path (a manifest may declare /srv/db.mesh-before-restore).
	before := p + RestoreAside
	if owner := cmp.Or(x.r.OwnerAt(before), x.r.OwnerAt(before+purgeSuffix)); owner != "" {
		rr.Outcome, rr.Reason = state.Kept, fmt.Sprintf("--purge-data: %s, the copy a restore kept beside it, is module %s's path (or holds its files); rename that module's directory, then the next apply purges both", before, owner)
		return rr
	}
	kept := 0
	// A file or a link there is not a restore's copy, and stays; what a
	// purge of the copy cut short left at before.mesh-purging is, and
	// purgeDir removes that first.
	fi, err := os.Lstat(before)
	gone := errors.Is(err, os.ErrNotExist)
	if err == nil && fi.IsDir() || gone && safefs.IsDir(before+purgeSuffix) {
		if kept, err = purgeDir(before); err != nil {
			rr.Outcome, rr.Reason = state.Failed, "--purge-data: the copy a restore kept beside it: "+err.Error()
			return rr
		}
	}
	n, err := purgeDir(p)
	if err != nil {
		rr.Outcome, rr.Reason = state.Failed, "--purge-data: "+err.Error()
		return rr
	}
	rr.Outcome, rr.Reason = state.Removed, fmt.Sprintf("purged with its %d entries (mesh unassign --purge-data)", n)
	if kept > 0 {
		rr.Reason += fmt.Sprintf(", and the copy a restore kept beside it (%s, %d entries)", before, kept)
	}
	return rr
}

// RestoreAside names the copy a restore (the agent's) keeps of what a data
// directory held before it, beside it, until the next restore of it or a
// purge.
const RestoreAside = ".mesh-before-restore"

// keptUnder names the first path the ledger holds under p (not p) that a
// purge of module's data directory p must not remove: another module's,
// or one taken over (there before the mesh); "" when none.
func (r *Reconciler) keptUnder(p, module string) string {
	var found []string
	for q, e := range r.ledger.Paths {
		if q != p && manifest.Within(q, p) && (e.Module != module || e.Original != nil) {
			found = append(found, q)
		}
	}
	if len(found) == 0 {
		return ""
	}
	slices.Sort(found)
	e := r.ledger.Paths[found[0]]
	if e.Module != module {
		return found[0] + " (module " + e.Module + ")"
	}
	return found[0] + " (taken over: there before the mesh)"
}

// removePath removes one path the mesh made and no longer wants, or puts
// back the original of a file it took over.
func (x *run) removePath(p string, e PathEntry) state.ResourceReport {
	rr := state.ResourceReport{Module: e.Module, Kind: e.Kind, Name: p}
	if msg := x.r.refusedPath(p); msg != "" && !(e.Kind == manifest.KindDirectory && e.Original != nil && !e.Data) {
		// (A directory an older mesh took over before the host refused
		// it, /tmp at 0755, gets its owner and mode back all the same:
		// that only mends it.)
		rr.Outcome, rr.Reason = state.Kept, msg
		return rr
	}
	var removed bool
	var kept string
	var err error
	switch {
	case e.Kind == manifest.KindDirectory && e.Data && e.Original != nil:
		// Taken over: there before the module, so never the mesh's to
		// remove, --purge-data or not; it keeps the owner and mode the
		// module gave it, with its data.
		rr.Outcome, rr.Reason = state.Kept, "a data directory of "+e.Module+" that was there before the mesh took it over: never removed, --purge-data included"
		return rr
	case e.Kind == manifest.KindDirectory && e.Data:
		// A module's data: never the mesh's to remove, even empty (issue
		// 30), but for mesh unassign --purge-data.
		rr.Outcome, rr.Reason = state.Kept, "a data directory of "+e.Module+": the mesh never removes one; mesh unassign NODE "+e.Module+" --purge-data removes it"
		return rr
	case e.Kind == manifest.KindDirectory && e.Original != nil:
		// Taken over: it was there before, and gets its owner and mode back.
		if err := restoreOwnerMode(p, e.Original.UID, e.Original.GID, e.Original.Mode); err != nil {
			rr.Outcome, rr.Reason = state.Failed, err.Error()
			return rr
		}
		x.r.ledger.Drop(p)
		rr.Outcome, rr.Reason = state.Restored, fmt.Sprintf("its owner and mode before the module took it over (%d:%d %04o) are back", e.Original.UID, e.Original.GID, e.Original.Mode)
		return rr
	case e.Kind == manifest.KindDirectory:
		removed, kept, err = removeDir(p)
	case e.Original != nil:
		removed, kept, err = x.r.restore(p, e)
		if removed {
			rr.Outcome, rr.Reason = state.Restored, "the original the module took over is back"
			return rr
		}
	case holdsSecret(e.Kind):
		// A secret's or a credential's file goes whatever it holds now:
		// what a container wrote there may hold the secret, and this node
		// may no longer be one the secret is for (a move's copy, adopted
		// with no digest and then aborted, kept a credential here).
		have, lerr := look(p)
		if lerr == nil && have.exists && !have.isDir {
			removed, kept, err = unlink(p, have.digest)
		} else {
			removed, kept, err = unlink(p, e.Digest, e.Prev)
		}
	default:
		removed, kept, err = unlink(p, e.Digest, e.Prev)
		if removed {
			x.r.pruneKeptOf(p, 0) // its edits' copies go with it
		}
	}
	switch {
	case err != nil:
		rr.Outcome, rr.Reason = state.Failed, err.Error()
	case removed:
		rr.Outcome = state.Removed
	default:
		rr.Outcome, rr.Reason = state.Kept, kept
	}
	return rr
}

// restore puts a taken-over file's original back, if the file still holds
// what the mesh wrote.
func (r *Reconciler) restore(p string, e PathEntry) (bool, string, error) {
	orig, err := os.ReadFile(e.Original.Kept)
	if errors.Is(err, os.ErrNotExist) {
		// Put back, its copy removed, and the ledger's entry not dropped
		// yet (a kill, or a full disk at the ledger's write): done, if
		// the file holds the original.
		if have, lerr := look(p); lerr == nil && have.exists && have.digest == e.Original.Digest {
			return true, "", nil
		}
	}
	if err != nil {
		return false, "", fmt.Errorf("read the original kept at %s: %w", e.Original.Kept, err)
	}
	if digestBytes(orig) != e.Original.Digest {
		return false, "", fmt.Errorf("the original kept at %s is not what was taken over (digest differs); put it back by hand", e.Original.Kept)
	}
	have, err := look(p)
	if err != nil {
		return false, keptReason(err) + "; the original is kept at " + e.Original.Kept, nil
	}
	if have.exists && have.digest != e.Digest && have.digest != e.Prev && have.digest != e.Original.Digest {
		return false, "its content changed since the mesh wrote it; the original is kept at " + e.Original.Kept, nil
	}
	dfd, base, err := safefs.OpenParent(p)
	if err != nil {
		return false, keptReason(err) + "; the original is kept at " + e.Original.Kept, nil
	}
	defer unix.Close(dfd)
	if err := safefs.WriteAt(dfd, base, orig, safefs.Attr{UID: e.Original.UID, GID: e.Original.GID, Mode: e.Original.Mode, Chown: true}); err != nil {
		return false, "", err
	}
	os.Remove(e.Original.Kept)
	return true, "", nil
}

// secretInput is what a secret file is to restart-on: its name and the
// digest of its value (never the value).
func secretInput(name, digest string) string { return "secret " + name + "\x00" + digest }

// secretValue opens one of the module's secrets for res. A secret not set,
// or not sealed to this node yet, makes the module wait there (not a
// failure: the node tries again as the state changes), and says what to do.
func (x *run) secretValue(ctx context.Context, res state.Resource, name string) ([]byte, *state.ResourceReport) {
	wait := func(why string) *state.ResourceReport {
		x.failed[res.Module] = &state.ModuleFailure{Module: res.Module, Resource: res.Kind + " " + res.RuntimeName(), Reason: why, Secret: name}
		r := report(res, state.Waiting, "waits for secret "+name+": "+why)
		return &r
	}
	if res.Secrets[name] == "" {
		r := wait(fmt.Sprintf("it is not set; set it with: mesh secret set %s %s", res.Module, name))
		x.failed[res.Module].SecretUnset = true
		return nil, r
	}
	if x.r.cfg.OperatorSecret == nil {
		r := report(res, state.Failed, "this node opens no secret (no sealing key given to the reconciler)")
		return nil, &r
	}
	v, err := x.r.cfg.OperatorSecret(ctx, state.SecretRef{Module: res.Module, Name: name}, res.Secrets[name])
	if errors.Is(err, state.ErrNotFound) {
		r := wait(fmt.Sprintf("it is not set; set it with: mesh secret set %s %s", res.Module, name))
		x.failed[res.Module].SecretUnset = true
		return nil, r
	}
	if err != nil {
		return nil, wait(err.Error())
	}
	x.r.secrets.add(res.Module, v)
	return v, nil
}

// unset says whether a secret res reads is not set.
func unset(res state.Resource) bool {
	for _, d := range res.Secrets {
		if d == "" {
			return true
		}
	}
	return false
}

// envPath is the file that holds the environment of a container (or step)
// with env-secrets.
func (r *Reconciler) envPath(name string) string { return filepath.Join(r.cfg.EnvDir, name) }

// writeEnv writes the environment a step or container takes from the
// module's secrets (env-secrets): NAME=VALUE entries ended by NUL, in a
// file of EnvDir (a tmpfs) that only it mounts. It says why not when a
// secret is not set or cannot be opened (the module waits there), or holds
// a NUL (which no environment variable can).
func (x *run) writeEnv(ctx context.Context, res state.Resource, name string) *state.ResourceReport {
	if len(res.Decl.EnvSecrets) == 0 {
		return nil
	}
	if x.r.cfg.EnvDir == "" || x.r.cfg.EnvExec == "" {
		r := report(res, state.Failed, "this node cannot give a container env-secrets (the agent set no runtime directory or mesh binary)")
		return &r
	}
	vars := make([]string, 0, len(res.Decl.EnvSecrets))
	for k := range res.Decl.EnvSecrets {
		vars = append(vars, k)
	}
	sort.Strings(vars)
	var b []byte
	values := map[string][]byte{} // each secret opened once, whatever names it
	for _, k := range vars {
		sn := res.Decl.EnvSecrets[k]
		v, ok := values[sn]
		if !ok {
			var stop *state.ResourceReport
			if v, stop = x.secretValue(ctx, res, sn); stop != nil {
				return stop
			}
			values[sn] = v
		}
		if bytes.IndexByte(v, 0) >= 0 {
			r := report(res, state.Failed, fmt.Sprintf("secret %s holds a NUL byte, which an environment variable cannot; deliver it as a file (a secret: resource) instead", sn))
			return &r
		}
		// What the kernel takes at exec: a variable of at most 128 KiB
		// (MAX_ARG_STRLEN, its NUL counted), all of them within a quarter
		// of the stack's limit (2 MiB by default); past either the
		// container could never start. The whole is bounded at 1 MiB,
		// well within, and so is what a manifest naming one large secret
		// under many variables makes the agent write to memory (/run).
		if n := len(k) + 1 + len(v) + 1; n > maxEnvVar {
			r := report(res, state.Failed, fmt.Sprintf("env-secrets: %s from secret %s would be %d bytes, more than the %d KiB a variable may hold at exec; deliver it as a file (a secret: resource) instead", k, sn, n, maxEnvVar>>10))
			return &r
		}
		if len(b)+len(k)+len(v)+2 > maxEnvFile {
			r := report(res, state.Failed, fmt.Sprintf("env-secrets: the variables from %s on would make an environment of more than %d KiB, more than a container's exec takes with room to spare; deliver the large secrets as files (secret: resources) instead", k, maxEnvFile>>10))
			return &r
		}
		b = append(append(append(append(b, k...), '='), v...), 0)
	}
	if err := writeEnvFile(x.r.cfg.EnvDir, name, b); err != nil {
		r := report(res, state.Failed, "write its environment: "+err.Error())
		return &r
	}
	return nil
}

// Bounds of env-secrets (writeEnv): one variable, NAME=VALUE and its NUL,
// and all of a container's.
const (
	maxEnvVar  = 128 << 10
	maxEnvFile = 1 << 20
)

// writeEnvFile writes name in dir (made 0700 if missing) whole or not at
// all: a temporary file, renamed over. The file is 0444 so that the
// container's user, whoever it is, reads it; dir keeps everyone else out.
func writeEnvFile(dir, name string, b []byte) error {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return err
	}
	if err := os.Chmod(dir, 0o700); err != nil {
		return err
	}
	if fi, err := os.Lstat(dir); err != nil || !fi.IsDir() {
		return fmt.Errorf("%s is not a directory", dir)
	}
	path := filepath.Join(dir, name)
	if old, err := os.ReadFile(path); err == nil && bytes.Equal(old, b) {
		return nil
	}
	f, err := os.CreateTemp(dir, "."+name+".*")
	if err != nil {
		return err
	}
	defer os.Remove(f.Name())
	if _, err := f.Write(b); err != nil {
		f.Close()
		return err
	}
	if err := f.Chmod(0o444); err != nil {
		f.Close()
		return err
	}
	if err := f.Close(); err != nil {
		return err
	}
	return os.Rename(f.Name(), path)
}

// dropEnv removes a container's environment file (it went, or the step ended).
func (x *run) dropEnv(name string) {
	if x.r.cfg.EnvDir != "" {
		os.Remove(x.r.envPath(name))
	}
}

// pruneEnv removes the environment files of containers the plan does not
// hold with env-secrets (removed, moved away, or left by an agent that
// stopped before it removed them).
func (x *run) pruneEnv(plan *state.Plan) {
	if x.r.cfg.EnvDir == "" {
		return
	}
	entries, err := os.ReadDir(x.r.cfg.EnvDir)
	if err != nil {
		return
	}
	keep := map[string]bool{}
	for _, res := range plan.Resources {
		if res.Kind == manifest.KindContainer && len(res.Decl.EnvSecrets) > 0 {
			keep[res.RuntimeName()] = true
		}
	}
	left := 0
	for _, e := range entries {
		if !keep[e.Name()] {
			os.Remove(filepath.Join(x.r.cfg.EnvDir, e.Name()))
		} else {
			left++
		}
	}
	if left == 0 {
		// Nothing of this node's left on the runtime tmpfs: its directory
		// and the data dir's go too (writeEnvFile makes them again).
		os.Remove(x.r.cfg.EnvDir)
		os.Remove(filepath.Dir(x.r.cfg.EnvDir))
	}
}

// takeBackMounted removes the containers of res's module that mount the
// file of res, a secret that is not set (mesh secret rm), itself: a file
// mount keeps the file it found, the value the operator took back in it,
// for as long as the container runs (one that mounts the directory sees
// the file go). They are made again once the secret is set. It says so,
// for the resource's reason.
func (x *run) takeBackMounted(ctx context.Context, res state.Resource) string {
	var took []string
	for _, name := range slices.Sorted(maps.Keys(x.managed)) {
		c := x.managed[name]
		if c.Labels[LabelModule] != res.Module {
			continue
		}
		var d struct {
			Mounts []string `json:"mounts"`
		}
		if json.Unmarshal([]byte(c.Labels[LabelDecl]), &d) != nil || !slices.ContainsFunc(d.Mounts, func(m string) bool {
			src, _, _ := strings.Cut(m, ":")
			return filepath.Clean(src) == res.Name
		}) {
			continue
		}
		if err := x.rt.Remove(ctx, c.ID); err != nil {
			return "; removing " + name + ", which mounts the file that held it, failed: " + err.Error()
		}
		delete(x.managed, name)
		x.dropEnv(name)
		x.r.log.Info(fmt.Sprintf("removed %s (%s): it mounts the file of secret %s, which is no longer set", name, res.Module, res.Decl.SecretName))
		took = append(took, name)
	}
	if len(took) == 0 {
		return ""
	}
	return "; " + strings.Join(took, ", ") + ", which mounted the file, removed (made again once the secret is set)"
}

// takeBack removes the container of res when a secret it takes into its
// environment is not set (mesh secret rm): its environment holds a value
// the operator took back. It says so, for the resource's reason.
func (x *run) takeBack(ctx context.Context, res state.Resource) string {
	if res.Kind != manifest.KindContainer || len(res.Decl.EnvSecrets) == 0 || !unset(res) {
		return ""
	}
	name := res.RuntimeName()
	c, ok := x.managed[name]
	if !ok {
		return ""
	}
	if err := x.rt.Remove(ctx, c.ID); err != nil {
		return "; removing the container that holds the secret's old value failed: " + err.Error()
	}
	delete(x.managed, name)
	x.dropEnv(name)
	x.r.log.Info(fmt.Sprintf("removed %s (%s): a secret it reads is no longer set", name, res.Module))
	return "; its container, which held the removed secret, was removed (created again once the secret is set)"
}
