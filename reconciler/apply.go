// Package reconciler makes a node hold its plan: directories, files,
// bindings, credentials, steps and containers, in the order written. It
// touches the machine (the filesystem, and Podman through Runtime) and keeps
// node-local facts in a Ledger; it never decides placement, which is state's.
package reconciler

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/netip"
	"os"
	"sort"
	"strconv"
	"strings"
	"time"

	"mesh/state"
	"mesh/state/manifest"
)

// Outcomes of a resource in an apply, as reports and log lines say them.
const (
	Unchanged = "unchanged"
	Created   = "created"
	Updated   = "updated"
	Replaced  = "replaced"
	Started   = "started"
	Ran       = "ran"
	Kept      = "kept"
	Removed   = "removed"
	Failed    = "failed"
)

// DefaultStepTimeout bounds one run of a step.
const DefaultStepTimeout = 30 * time.Minute

// Config is what a Reconciler needs to know about its node.
type Config struct {
	Node string
	// DNS is the node's resolver address, every container's only DNS server.
	DNS netip.Addr
	// LedgerPath is the node-local ledger file.
	LedgerPath string
	// Secret returns a credential's secret from the local replica.
	Secret      func(ctx context.Context, p state.Pair) (string, error)
	StepTimeout time.Duration
	Logger      *slog.Logger
	Now         func() time.Time
}

// Reconciler applies plans on one node.
type Reconciler struct {
	cfg    Config
	rt     Runtime
	ledger *Ledger
	log    *slog.Logger
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
	return &Reconciler{cfg: cfg, rt: rt, ledger: l, log: cfg.Logger.With("component", "reconciler")}, nil
}

// counting counts the calls made through a Runtime: n the mutating ones,
// calls all of them.
type counting struct {
	Runtime
	n, calls int
}

func (c *counting) Managed(ctx context.Context) ([]Container, error) {
	c.calls++
	return c.Runtime.Managed(ctx)
}
func (c *counting) Lookup(ctx context.Context, name string) (Container, bool, error) {
	c.calls++
	return c.Runtime.Lookup(ctx, name)
}
func (c *counting) ImageExists(ctx context.Context, ref string) (bool, error) {
	c.calls++
	return c.Runtime.ImageExists(ctx, ref)
}
func (c *counting) Wait(ctx context.Context, id string) (int, error) {
	c.calls++
	return c.Runtime.Wait(ctx, id)
}
func (c *counting) Logs(ctx context.Context, id string, n int) (string, error) {
	c.calls++
	return c.Runtime.Logs(ctx, id, n)
}

func (c *counting) Pull(ctx context.Context, ref string) error {
	c.n++
	return c.Runtime.Pull(ctx, ref)
}
func (c *counting) Create(ctx context.Context, s Spec) (string, error) {
	c.n++
	return c.Runtime.Create(ctx, s)
}
func (c *counting) Start(ctx context.Context, id string) error {
	c.n++
	return c.Runtime.Start(ctx, id)
}
func (c *counting) Remove(ctx context.Context, id string) error {
	c.n++
	return c.Runtime.Remove(ctx, id)
}

// run is the state of one apply.
type run struct {
	r       *Reconciler
	rt      *counting
	inputs  map[string]string // resource name -> digest, for restart-on
	ran     map[string]bool   // steps that ran in this apply
	managed map[string]Container
	writes  int
}

// Apply makes the node hold plan (version is the plan's version) and reports
// each resource's outcome. It stops at the first failure: nothing after a
// failed resource is applied, and nothing is removed.
func (r *Reconciler) Apply(ctx context.Context, version uint64, plan *state.Plan) state.Report {
	start := time.Now()
	rep := state.Report{Node: r.cfg.Node, Version: version, AppliedAt: r.cfg.Now().UTC()}
	x := &run{r: r, rt: &counting{Runtime: r.rt}, inputs: map[string]string{}, ran: map[string]bool{}, managed: map[string]Container{}}
	list, err := x.rt.Managed(ctx)
	if err != nil {
		rep.Error = "podman: " + err.Error()
		r.log.Warn("apply failed", "version", version, "err", err)
		return rep
	}
	for _, c := range list {
		x.managed[c.Name] = c
	}
	wantPaths := map[string]bool{}
	wantCtrs := map[string]bool{}
	for _, res := range plan.Resources {
		out := x.apply(ctx, res)
		rep.Resources = append(rep.Resources, out)
		if out.Outcome != Unchanged {
			r.logLine(res, out)
		}
		if out.Outcome == Failed {
			rep.Error = fmt.Sprintf("%s %s (%s): %s", res.Kind, res.RuntimeName(), res.Module, out.Reason)
			break
		}
		switch res.Kind {
		case manifest.KindStep, manifest.KindContainer:
			wantCtrs[res.RuntimeName()] = true
		default:
			wantPaths[res.Name] = true
		}
	}
	if rep.Error == "" {
		rep.Resources = append(rep.Resources, x.removeUnwanted(ctx, plan, wantPaths, wantCtrs)...)
	}
	if err := r.ledger.Save(); err != nil {
		if rep.Error == "" {
			rep.Error = err.Error()
		}
	}
	rep.Mutations = x.rt.n + x.writes
	lvl := slog.LevelInfo
	if rep.Mutations == 0 && rep.Error == "" {
		lvl = slog.LevelDebug // a quiet periodic pass
	}
	r.log.Log(ctx, lvl, "applied plan", "version", version, "mutations", rep.Mutations, "podman_calls", x.rt.calls, "took", time.Since(start).Round(time.Millisecond), "error", rep.Error)
	return rep
}

// logLine writes the seeds' one line per change.
func (r *Reconciler) logLine(res state.Resource, out state.ResourceReport) {
	verb := "updated"
	switch out.Outcome {
	case Kept:
		r.log.Info(fmt.Sprintf("kept %s (%s): %s", out.Name, out.Module, out.Reason))
		return
	case Failed:
		verb = "failed"
	}
	line := fmt.Sprintf("%s %s (%s): %s", verb, out.Name, out.Module, out.Outcome)
	if out.Reason != "" {
		line += "; " + out.Reason
	}
	if out.Outcome == Failed {
		r.log.Warn(line)
	} else {
		r.log.Info(line)
	}
}

func report(res state.Resource, outcome, reason string) state.ResourceReport {
	return state.ResourceReport{Module: res.Module, Kind: res.Kind, Name: res.RuntimeName(), Outcome: outcome, Reason: reason}
}

func (x *run) apply(ctx context.Context, res state.Resource) state.ResourceReport {
	switch res.Kind {
	case manifest.KindDirectory:
		return x.directory(res)
	case manifest.KindFile, manifest.KindRoutesFile, manifest.KindBinding, manifest.KindCredential, state.KindDeliveredCredential:
		return x.file(ctx, res)
	case manifest.KindStep:
		return x.step(ctx, res)
	case manifest.KindContainer:
		return x.container(ctx, res)
	}
	return report(res, Failed, "unknown resource kind "+res.Kind+" (is this mesh older than the plan?)")
}

func ownerOf(d manifest.Resource) (int, int) {
	if d.Owner == "" {
		return 0, 0
	}
	u, g, _ := strings.Cut(d.Owner, ":")
	uid, _ := strconv.Atoi(u)
	gid, _ := strconv.Atoi(g)
	return uid, gid
}

func modeOf(d manifest.Resource, def os.FileMode) os.FileMode {
	if d.Mode == "" {
		return def
	}
	v, err := strconv.ParseUint(d.Mode, 8, 32)
	if err != nil {
		return def
	}
	m := os.FileMode(v).Perm()
	if v&0o4000 != 0 {
		m |= os.ModeSetuid
	}
	if v&0o2000 != 0 {
		m |= os.ModeSetgid
	}
	if v&0o1000 != 0 {
		m |= os.ModeSticky
	}
	return m
}

func (x *run) directory(res state.Resource) state.ResourceReport {
	uid, gid := ownerOf(res.Decl)
	mode := modeOf(res.Decl, 0o755)
	outcome, drift, err := ensureDir(res.Name, uid, gid, mode)
	if err != nil {
		return report(res, Failed, err.Error())
	}
	x.inputs[res.Name] = digestBytes([]byte(fmt.Sprintf("dir %d:%d %o", uid, gid, mode)))
	if outcome == fsCreated {
		// Only a directory the mesh created is the mesh's to remove later.
		x.r.ledger.Paths[res.Name] = PathEntry{Kind: res.Kind, Module: res.Module}
	}
	if outcome != fsUnchanged {
		x.writes++
	}
	return report(res, outcomeOf(outcome), drift)
}

func outcomeOf(fs string) string {
	switch fs {
	case fsCreated:
		return Created
	case fsUpdated:
		return Updated
	}
	return Unchanged
}

func (x *run) file(ctx context.Context, res state.Resource) state.ResourceReport {
	var content string
	mode := modeOf(res.Decl, 0o644)
	switch res.Kind {
	case manifest.KindCredential, state.KindDeliveredCredential:
		if res.Credential == nil {
			return report(res, Failed, "the plan carries no credential for it")
		}
		secret, err := x.r.cfg.Secret(ctx, *res.Credential)
		if err != nil {
			return report(res, Failed, "read its secret from the replica: "+err.Error())
		}
		if res.Kind == manifest.KindCredential {
			content = secret + "\n"
		} else {
			content = "name=" + res.Credential.Consumer + "\nsecret=" + secret + "\n"
		}
		// A secret is never readable by group or others (DESIGN rule 7).
		mode = modeOf(res.Decl, 0o600) &^ 0o077
		x.inputs[res.Name] = res.Digest
	default:
		content = res.Content
		x.inputs[res.Name] = digestBytes([]byte(content))
	}
	uid, gid := ownerOf(res.Decl)
	outcome, drift, err := ensureFile(res.Name, []byte(content), uid, gid, mode)
	if err != nil {
		return report(res, Failed, err.Error())
	}
	x.r.ledger.Paths[res.Name] = PathEntry{Kind: res.Kind, Module: res.Module, Digest: digestBytes([]byte(content))}
	if outcome != fsUnchanged {
		x.writes++
	}
	return report(res, outcomeOf(outcome), drift)
}

func (x *run) ensureImage(ctx context.Context, ref string) error {
	ok, err := x.rt.ImageExists(ctx, ref)
	if err != nil {
		return err
	}
	if ok {
		return nil
	}
	return x.rt.Pull(ctx, ref)
}

func labels(want desired) map[string]string {
	in, _ := json.Marshal(want.Inputs)
	return map[string]string{
		LabelManaged: "1", LabelModule: want.Module, LabelKind: want.Kind,
		LabelDigest: want.Digest, LabelDecl: want.Decl, LabelInputs: string(in),
	}
}

func (x *run) spec(res state.Resource, want desired) Spec {
	d := res.Decl
	s := Spec{Name: want.Name, Image: d.Image, Command: d.Command, Env: d.Env, Labels: labels(want), DNS: x.r.cfg.DNS, Restart: d.Restart}
	if res.Kind == manifest.KindContainer && s.Restart == "" {
		s.Restart = "always"
	}
	for _, m := range d.Mounts {
		parts := strings.Split(m, ":")
		mt := Mount{Source: parts[0], Destination: parts[1]}
		if len(parts) == 3 {
			mt.Options = strings.Split(parts[2], ",")
		}
		s.Mounts = append(s.Mounts, mt)
	}
	for _, p := range d.Ports {
		s.Ports = append(s.Ports, parsePort(p))
	}
	return s
}

func parsePort(p string) Port {
	spec, proto, ok := strings.Cut(p, "/")
	if !ok {
		proto = "tcp"
	}
	parts := strings.Split(spec, ":")
	var out Port
	if len(parts) == 3 {
		out.HostIP, parts = parts[0], parts[1:]
	}
	h, _ := strconv.Atoi(parts[0])
	c, _ := strconv.Atoi(parts[1])
	out.HostPort, out.ContainerPort, out.Protocol = uint16(h), uint16(c), proto
	return out
}

func (x *run) step(ctx context.Context, res state.Resource) state.ResourceReport {
	want := describe(res, x.r.cfg.DNS, x.inputs)
	x.inputs[res.Name] = want.Digest
	var marker *Marker
	if m, ok := x.r.ledger.Markers[want.Name]; ok {
		marker = &m
	}
	run, reason := decideStep(want, marker, x.ran)
	if !run {
		return report(res, Unchanged, "")
	}
	if err := x.ensureImage(ctx, res.Decl.Image); err != nil {
		return report(res, Failed, err.Error())
	}
	if old, ok := x.managed[want.Name]; ok {
		// A leftover of a run that was cut short.
		if err := x.rt.Remove(ctx, old.ID); err != nil {
			return report(res, Failed, err.Error())
		}
		delete(x.managed, want.Name)
	} else if c, found, err := x.rt.Lookup(ctx, want.Name); err != nil {
		return report(res, Failed, err.Error())
	} else if found {
		_, _, err := decideContainer(want, &c, x.ran)
		return report(res, Failed, err.Error())
	}
	id, err := x.rt.Create(ctx, x.spec(res, want))
	if err != nil {
		return report(res, Failed, err.Error())
	}
	defer x.rt.Remove(context.WithoutCancel(ctx), id)
	if err := x.rt.Start(ctx, id); err != nil {
		return report(res, Failed, err.Error())
	}
	wctx, cancel := context.WithTimeout(ctx, x.r.cfg.StepTimeout)
	code, err := x.rt.Wait(wctx, id)
	cancel()
	if err != nil {
		if wctx.Err() != nil {
			err = fmt.Errorf("did not finish within %s", x.r.cfg.StepTimeout)
		}
		return report(res, Failed, err.Error())
	}
	if code != 0 {
		logs, _ := x.rt.Logs(ctx, id, 10)
		msg := fmt.Sprintf("exited with code %d", code)
		if logs != "" {
			msg += "; last lines:\n" + logs
		}
		return report(res, Failed, msg)
	}
	x.r.ledger.Markers[want.Name] = Marker{Digest: want.Digest, Decl: want.Decl, Inputs: want.Inputs}
	x.ran[res.Name] = true
	return report(res, Ran, reason)
}

func (x *run) container(ctx context.Context, res state.Resource) state.ResourceReport {
	want := describe(res, x.r.cfg.DNS, x.inputs)
	var have *Container
	if c, ok := x.managed[want.Name]; ok {
		have = &c
	} else {
		c, found, err := x.rt.Lookup(ctx, want.Name)
		if err != nil {
			return report(res, Failed, err.Error())
		}
		if found {
			have = &c
		}
	}
	action, reason, err := decideContainer(want, have, x.ran)
	if err != nil {
		return report(res, Failed, err.Error())
	}
	switch action {
	case actKeep:
		return report(res, Unchanged, "")
	case actStart:
		if err := x.rt.Start(ctx, have.ID); err != nil {
			return report(res, Failed, err.Error())
		}
		return report(res, Started, reason)
	case actReplace:
		if err := x.rt.Remove(ctx, have.ID); err != nil {
			return report(res, Failed, err.Error())
		}
	}
	if err := x.ensureImage(ctx, res.Decl.Image); err != nil {
		return report(res, Failed, err.Error())
	}
	id, err := x.rt.Create(ctx, x.spec(res, want))
	if err != nil {
		return report(res, Failed, err.Error())
	}
	x.managed[want.Name] = Container{ID: id, Name: want.Name}
	if err := x.rt.Start(ctx, id); err != nil {
		return report(res, Failed, err.Error())
	}
	if action == actReplace {
		return report(res, Replaced, reason)
	}
	return report(res, Created, "")
}

// removeUnwanted removes the mesh's containers that the plan no longer holds,
// and the paths it wrote that the plan no longer holds, children first. A
// path that holds anything the mesh did not put there is kept and reported.
func (x *run) removeUnwanted(ctx context.Context, plan *state.Plan, paths, ctrs map[string]bool) []state.ResourceReport {
	var out []state.ResourceReport
	var names []string
	for name := range x.managed {
		if !ctrs[name] {
			names = append(names, name)
		}
	}
	sort.Strings(names)
	for _, name := range names {
		c := x.managed[name]
		rr := state.ResourceReport{Module: c.Labels[LabelModule], Kind: c.Labels[LabelKind], Name: name}
		if err := x.rt.Remove(ctx, c.ID); err != nil {
			rr.Outcome, rr.Reason = Failed, err.Error()
		} else {
			rr.Outcome = Removed
		}
		x.r.logLine(state.Resource{}, rr)
		out = append(out, rr)
	}
	var gone []string
	for p := range x.r.ledger.Paths {
		if !paths[p] {
			gone = append(gone, p)
		}
	}
	sort.Sort(sort.Reverse(sort.StringSlice(gone)))
	for _, p := range gone {
		e := x.r.ledger.Paths[p]
		var removed bool
		var kept string
		var err error
		if e.Kind == manifest.KindDirectory {
			removed, kept, err = removeDir(p)
		} else {
			removed, kept, err = removeFile(p, e.Digest)
		}
		rr := state.ResourceReport{Module: e.Module, Kind: e.Kind, Name: p}
		switch {
		case err != nil:
			rr.Outcome, rr.Reason = Failed, err.Error()
		case removed:
			rr.Outcome = Removed
			delete(x.r.ledger.Paths, p)
			x.writes++
		default:
			rr.Outcome, rr.Reason = Kept, kept
		}
		x.r.logLine(state.Resource{}, rr)
		out = append(out, rr)
	}
	wantSteps := map[string]bool{}
	for _, res := range plan.Resources {
		if res.Kind == manifest.KindStep {
			wantSteps[res.RuntimeName()] = true
		}
	}
	for k := range x.r.ledger.Markers {
		if !wantSteps[k] {
			delete(x.r.ledger.Markers, k)
		}
	}
	return out
}
