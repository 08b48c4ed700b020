package reconciler

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"net/netip"
	"sort"
	"strings"

	"mesh/state"
	"mesh/state/manifest"
)

// This file decides; it touches nothing. Given what the plan wants and what
// was observed, each function returns what to do and why.

// desired is a step or container as the plan wants it.
type desired struct {
	Module string
	Kind   string
	Name   string // the container's name (MODULE.STEP for a step)
	Decl   string // canonical JSON of everything that defines it
	// Inputs are the digests of what it names under restart-on.
	Inputs    map[string]string
	RestartOn []string
	Digest    string
}

// declFields is what a step or container is; the roster is not in it
// (DESIGN.md rule 2), the resolver address is (it never changes with the roster).
type declFields struct {
	Image   string            `json:"image"`
	Command []string          `json:"command,omitempty"`
	Env     map[string]string `json:"env,omitempty"`
	Mounts  []string          `json:"mounts,omitempty"`
	Ports   []string          `json:"ports,omitempty"`
	// PublishOn is where ports are published, PublicPorts those on every
	// interface; each absent when unset, so that a mesh upgrading keeps its
	// containers until the overlay is in place, and then replaces each once.
	PublishOn   string   `json:"publish-on,omitempty"`
	PublicPorts []string `json:"public-ports,omitempty"`
	Restart     string   `json:"restart,omitempty"`
	RestartOn   []string `json:"restart-on,omitempty"`
	DNS         string   `json:"dns,omitempty"`
	// Network is the module's own network (absent on a rootless node): a
	// container made on the bridge all modules shared is replaced once.
	Network string `json:"network,omitempty"`
	// Health is the health check with its defaults (absent when none is
	// declared, so declaring none changes no container's digest).
	Health *manifest.HealthCheck `json:"health,omitempty"`
	// The container fields compose users rely on, each absent when unset
	// (so a manifest without them keeps its containers' digests).
	User        string            `json:"user,omitempty"`
	Entrypoint  []string          `json:"entrypoint,omitempty"`
	WorkingDir  string            `json:"working-dir,omitempty"`
	CapAdd      []string          `json:"cap-add,omitempty"`
	CapDrop     []string          `json:"cap-drop,omitempty"`
	Devices     []string          `json:"devices,omitempty"`
	ReadOnly    bool              `json:"read-only,omitempty"`
	Tmpfs       []string          `json:"tmpfs,omitempty"`
	Memory      int64             `json:"memory,omitempty"`
	CPUs        float64           `json:"cpus,omitempty"`
	StopSignal  int               `json:"stop-signal,omitempty"`
	StopTimeout *uint             `json:"stop-timeout,omitempty"`
	Labels      map[string]string `json:"labels,omitempty"`
	// EnvSecrets maps variables to the module's secrets (their values are
	// inputs, below, by digest).
	EnvSecrets map[string]string `json:"env-secrets,omitempty"`
	// LogMaxSize is the log's bound, always in (a default when undeclared):
	// a container made before bounds existed is replaced once to get one.
	LogMaxSize int64 `json:"log-max-size,omitempty"`
	// A terminal, an init as PID 1, a bound on processes, supplementary
	// groups: each absent when unset, as the fields above.
	TTY       bool     `json:"tty,omitempty"`
	Init      bool     `json:"init,omitempty"`
	PidsLimit int64    `json:"pids-limit,omitempty"`
	GroupAdd  []string `json:"group-add,omitempty"`
}

// describe computes a step's or container's declaration and digest. inputs
// holds the digest of every resource applied before it in this plan.
func describe(r state.Resource, dnsAddr netip.Addr, publishOn, network string, inputs map[string]string) desired {
	d := r.Decl
	f := declFields{Image: d.Image, Command: d.Command, Env: d.Env, Mounts: d.Mounts, Ports: d.Ports, Restart: d.Restart, RestartOn: d.RestartOn, Health: r.Typed.Health,
		User: d.User, Entrypoint: d.Entrypoint, WorkingDir: d.WorkingDir, CapAdd: d.CapAdd, CapDrop: d.CapDrop, Devices: d.Devices, ReadOnly: d.ReadOnly,
		Tmpfs: d.Tmpfs, Memory: r.Typed.Memory, LogMaxSize: logMaxSize(r.Typed), CPUs: d.CPUs, StopSignal: r.Typed.StopSignal, StopTimeout: r.Typed.StopTimeout, Labels: d.Labels, EnvSecrets: d.EnvSecrets,
		TTY: d.TTY, Init: d.Init, PidsLimit: r.Typed.PidsLimit, GroupAdd: d.GroupAdd}
	if r.Kind == manifest.KindContainer {
		// A step's network is not what it is: a step that ran does not
		// run again because its module moved onto a network of its own.
		f.Network = network
	}
	if dnsAddr.IsValid() {
		f.DNS = dnsAddr.String()
	}
	f.PublicPorts = d.PublicPorts
	if len(d.Ports) > 0 {
		f.PublishOn = publishOn
	}
	decl, _ := json.Marshal(f)
	want := desired{Module: r.Module, Kind: r.Kind, Name: r.RuntimeName(), Decl: string(decl), Inputs: map[string]string{}, RestartOn: d.RestartOn}
	h := sha256.New()
	h.Write(decl)
	for _, on := range d.RestartOn {
		want.Inputs[on] = inputs[on]
		fmt.Fprintf(h, "\x00%s=%s", on, inputs[on])
	}
	// The secrets it takes into its environment, by digest: only a
	// container that reads a secret is replaced when it changes.
	if len(d.EnvSecrets) > 0 {
		for _, n := range state.SecretsOf(&d) {
			want.Inputs[secretKey+n] = r.Secrets[n]
			fmt.Fprintf(h, "\x00%s%s=%s", secretKey, n, r.Secrets[n])
		}
	}
	want.Digest = hex.EncodeToString(h.Sum(nil))
	return want
}

// why says what moved between an old declaration and inputs and new ones, in
// the words of the log line: "step migrate ran", "image changed",
// "restart-on: /srv/gitea/app.ini changed".
func why(oldDecl, newDecl string, oldInputs, newInputs map[string]string, restartOn []string, ran map[string]bool) string {
	var parts []string
	for _, on := range restartOn {
		if ran[on] {
			parts = append(parts, "step "+on+" ran")
		}
	}
	var a, b map[string]json.RawMessage
	json.Unmarshal([]byte(oldDecl), &a)
	json.Unmarshal([]byte(newDecl), &b)
	var fields []string
	for k := range union(a, b) {
		if string(a[k]) != string(b[k]) {
			fields = append(fields, k)
		}
	}
	sort.Strings(fields)
	for _, f := range fields {
		parts = append(parts, f+" changed")
	}
	for _, on := range restartOn {
		if !ran[on] && oldInputs[on] != newInputs[on] {
			if n, ok := secretOf(newInputs[on]); ok {
				parts = append(parts, "secret "+n+" changed")
			} else {
				parts = append(parts, "restart-on: "+on+" changed")
			}
		}
	}
	var secrets []string
	for k := range newInputs {
		if n, ok := strings.CutPrefix(k, secretKey); ok && oldInputs[k] != newInputs[k] {
			secrets = append(secrets, "secret "+n+" changed")
		}
	}
	sort.Strings(secrets)
	parts = append(parts, secrets...)
	return strings.Join(parts, "; ")
}

func union(a, b map[string]json.RawMessage) map[string]bool {
	u := map[string]bool{}
	for k := range a {
		u[k] = true
	}
	for k := range b {
		u[k] = true
	}
	return u
}

// Container actions.
const (
	actKeep    = "keep"
	actStart   = "start"
	actCreate  = "create"
	actReplace = "replace"
)

// decideContainer chooses what to do with a container. have is nil when none
// by that name exists.
func decideContainer(want desired, have *Container, ran map[string]bool) (action, reason string, err error) {
	if have == nil {
		return actCreate, "", nil
	}
	if have.Labels[LabelManaged] != "1" {
		return "", "", fmt.Errorf("a container named %s exists and is not the mesh's; rename or remove it (podman rm %s)", want.Name, want.Name)
	}
	stepRan := false
	for _, on := range want.RestartOn {
		stepRan = stepRan || ran[on]
	}
	if have.Labels[LabelDigest] != want.Digest || stepRan {
		var oldInputs map[string]string
		json.Unmarshal([]byte(have.Labels[LabelInputs]), &oldInputs)
		r := why(have.Labels[LabelDecl], want.Decl, oldInputs, want.Inputs, want.RestartOn, ran)
		if r == "" {
			r = "its digest changed"
		}
		return actReplace, r, nil
	}
	if !have.Running {
		return actStart, "it was " + have.State, nil
	}
	return actKeep, "", nil
}

// decideStep says whether a step runs: when it never ran, when its digest
// moved (a changed declaration or input), or when a step it names ran.
func decideStep(want desired, marker *Marker, ran map[string]bool) (run bool, reason string) {
	if marker == nil {
		return true, ""
	}
	stepRan := false
	for _, on := range want.RestartOn {
		stepRan = stepRan || ran[on]
	}
	if marker.Digest == want.Digest && !stepRan {
		return false, ""
	}
	r := why(marker.Decl, want.Decl, marker.Inputs, want.Inputs, want.RestartOn, ran)
	if r == "" {
		r = "its digest changed"
	}
	return true, r
}

// Step actions: what becomes of a step once decideStep said whether it runs,
// given the container a run may have left under its name.
type stepAction string

const (
	// stepSkip: it need not run, and nothing is left over.
	stepSkip stepAction = "skip"
	// stepTidy: it need not run, but its finished run's container is left;
	// the marker is saved before the container is removed (it may be the
	// only record on this host that the step ran).
	stepTidy stepAction = "tidy"
	// stepRun: it runs, in a new container.
	stepRun stepAction = "run"
	// stepClearAndRun: it runs, once the leftover (of another declaration,
	// or one that never started) is removed.
	stepClearAndRun stepAction = "clear-and-run"
	// stepReattach: the leftover is this run, under way or finished: it is
	// waited for, never run twice.
	stepReattach stepAction = "re-attach"
)

// stepDecision is what to do with a step, and the reason its report gives.
type stepDecision struct {
	Action stepAction
	Reason string
}

// decideLeftover says what becomes of a step: run and reason are
// decideStep's answer, leftover the mesh's container under the step's name
// (nil when there is none). A leftover with the step's digest that Podman
// ran (running, exited or stopped) is the same run, started before the agent
// stopped or Podman went away.
func decideLeftover(want desired, run bool, reason string, leftover *Container) stepDecision {
	if !run {
		if leftover != nil {
			return stepDecision{Action: stepTidy}
		}
		return stepDecision{Action: stepSkip}
	}
	if leftover == nil {
		return stepDecision{Action: stepRun, Reason: reason}
	}
	if leftover.Labels[LabelDigest] == want.Digest && (leftover.State == "running" || leftover.State == "exited" || leftover.State == "stopped") {
		return stepDecision{Action: stepReattach, Reason: strings.TrimPrefix(reason+"; re-attached to the run under way", "; ")}
	}
	return stepDecision{Action: stepClearAndRun, Reason: reason}
}

// pullDue says whether a container handles a `mesh module pull` now: the
// pull's index is past the last one the ledger says it handled.
func pullDue(pull, handled uint64) bool {
	return pull > handled
}

// pullUndone says whether the pull that replaced a container was taken
// back (a pull's rollout reverted: the plan's pull index is now below that
// pull's) and the image it ran before is known.
func pullUndone(pull uint64, pre PrePull, known bool) bool {
	return known && pull < pre.Index && pre.ImageID != ""
}

// decidePull turns decideContainer's answer once `mesh module pull` fetched
// image: a container whose image (running, its image ID; "" when unknown) is
// not the one the name gives now (pulled) is replaced, with that reason
// after any it already had. Otherwise the answer stands.
func decidePull(action, reason, image, running, pulled string) (string, string) {
	if running == "" || running == pulled {
		return action, reason
	}
	why := fmt.Sprintf("image %s updated by mesh module pull (%s -> %s)", image, shortID(running), shortID(pulled))
	if action == actReplace {
		return actReplace, reason + "; " + why
	}
	return actReplace, why
}

func shortID(id string) string {
	id = strings.TrimPrefix(id, "sha256:")
	if len(id) > 12 {
		return id[:12]
	}
	return id
}

// File actions: what is done with a declared file's path before the mesh
// writes it (DESIGN "What the mesh owns on disk": the host never loses bytes
// it did not write).
type fileAction string

const (
	// fileWrite: absent, or holds what the mesh wrote (either digest of its
	// entry) or what is wanted of a path the mesh owns: written as is.
	fileWrite fileAction = "write"
	// fileRefuse: the resource fails with Message, nothing touched.
	fileRefuse fileAction = "refuse"
	// fileTakeOver: not the mesh's, and declared `take-over: true`: its
	// original is kept (and recorded) before the mesh owns the path.
	fileTakeOver fileAction = "take-over"
	// fileCopyAside: the mesh's, but edited since it wrote it: that content
	// is copied aside before the mesh writes it again.
	fileCopyAside fileAction = "copy-aside"
)

// fileDecision is what to do with a declared file's path, and the words for
// it.
type fileDecision struct {
	Action fileAction
	// Message is the failure for fileRefuse; for fileTakeOver and
	// fileCopyAside, what a failed copy says before its error.
	Message string
	// Note, for fileTakeOver and fileCopyAside, is what the report adds,
	// followed by where the copy is kept.
	Note string
	// Prev is the digest the ledger entry keeps beside the wanted one until
	// the write is done: what the path holds now, when that differs.
	Prev string
}

// decideFile says what is done with a declared file at name before it is
// written: have is what the path holds, entry the ledger's entry for it (nil
// when the mesh never wrote it), want the digest of the content declared,
// takeOver the file's `take-over: true`, keptDir where copies are kept.
func decideFile(name string, have pathState, entry *PathEntry, want string, takeOver bool, keptDir string) fileDecision {
	if have.isDir {
		return fileDecision{Action: fileRefuse, Message: "exists and is a directory; move it aside"}
	}
	d := fileDecision{Action: fileWrite}
	if have.exists && have.digest != want {
		d.Prev = have.digest
	}
	switch {
	case !have.exists:
	case entry != nil && (have.digest == entry.Digest || have.digest == entry.Prev):
		// What the mesh wrote, or what it held before a write a crash
		// interrupted: the mesh's either way.
	case entry != nil && have.digest == want:
		// Edited into what is wanted: nothing is lost by writing it.
	case entry != nil:
		d.Action = fileCopyAside
		d.Message = "keep a copy of what is there before replacing it: "
		d.Note = "it was changed since the mesh wrote it; that content is kept at "
	case !takeOver && have.digest != want:
		d.Action = fileRefuse
		d.Message = fmt.Sprintf("%s exists and the mesh did not write it; the mesh never overwrites bytes it did not write. Move it aside (mv %s %s.orig), or add `take-over: true` to the file in the manifest: its original is then kept in %s and put back when the module lets go of it", name, name, name, keptDir)
	case !takeOver:
		d.Action = fileRefuse
		d.Message = fmt.Sprintf("%s exists and the mesh did not write it (its content is already what the manifest says); move it aside (mv %s %s.orig), or add `take-over: true` to the file in the manifest", name, name, name)
	case have.digest != want:
		d.Action = fileTakeOver
		d.Message = "keep a copy of what is there before replacing it: "
		d.Note = "taken over; the original is kept at "
	default:
		d.Action = fileTakeOver
		d.Message = "keep a copy of what is there before taking it over: "
		d.Note = "taken over; the original is kept at "
	}
	return d
}

// logMaxSize is a container's or step's log bound: declared, or the
// default (a plan of an older mesh carries none).
func logMaxSize(t manifest.Typed) int64 {
	if t.LogMaxSize > 0 {
		return t.LogMaxSize
	}
	return manifest.DefaultLogMaxSize
}

// Directory actions.
const (
	dirMake     = "make"      // absent: the mesh makes it, and it is the mesh's
	dirOurs     = "ours"      // the mesh made it: owner and mode as declared
	dirAdopt    = "adopt"     // there already, as declared: used, never removed
	dirTakeOver = "take-over" // there already, otherwise: changed, put back later
	dirRefuse   = "refuse"    // there already, otherwise, and not taken over
)

// dirDecision is what to do with a declared directory, and why.
type dirDecision struct {
	Action  string
	Message string // for dirRefuse: the report's reason
}

// decideDir decides about a declared directory: have is what is there,
// entry the ledger's entry for it (nil when the mesh did not make it nor
// take it over). A directory the mesh did not make keeps its owner and mode
// unless the manifest takes it over (take-over: true), which records them
// so they are put back when the module lets go of it.
func decideDir(name string, have pathState, entry *PathEntry, uid, gid int, mode uint32, takeOver bool) dirDecision {
	switch {
	case !have.exists:
		return dirDecision{Action: dirMake}
	case entry != nil:
		return dirDecision{Action: dirOurs}
	case have.uid == uid && have.gid == gid && have.mode == mode:
		return dirDecision{Action: dirAdopt}
	case takeOver:
		return dirDecision{Action: dirTakeOver}
	}
	return dirDecision{Action: dirRefuse, Message: fmt.Sprintf("%s exists (owner %d:%d, mode %04o) and the mesh did not make it; the mesh does not change a directory it did not make: declare it as it is (owner: \"%d:%d\", mode: \"%04o\"), or add `take-over: true` to it to change it to %d:%d %04o (its owner and mode are put back when the module lets go of it)",
		name, have.uid, have.gid, have.mode, have.uid, have.gid, have.mode, uid, gid, mode)}
}

// secretKey prefixes the inputs that are secrets taken into the
// environment (env-secrets), by name.
const secretKey = "secret "

// secretOf is the secret a restart-on input is (a secret file's input,
// secretInput), if it is one.
func secretOf(input string) (string, bool) {
	rest, ok := strings.CutPrefix(input, secretKey)
	if !ok {
		return "", false
	}
	n, _, ok := strings.Cut(rest, "\x00")
	return n, ok
}
