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
// (DESIGN rule 2), the resolver address is (it never changes with the roster).
type declFields struct {
	Image     string            `json:"image"`
	Command   []string          `json:"command,omitempty"`
	Env       map[string]string `json:"env,omitempty"`
	Mounts    []string          `json:"mounts,omitempty"`
	Ports     []string          `json:"ports,omitempty"`
	Restart   string            `json:"restart,omitempty"`
	RestartOn []string          `json:"restart-on,omitempty"`
	DNS       string            `json:"dns,omitempty"`
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
}

// describe computes a step's or container's declaration and digest. inputs
// holds the digest of every resource applied before it in this plan.
func describe(r state.Resource, dnsAddr netip.Addr, inputs map[string]string) desired {
	d := r.Decl
	f := declFields{Image: d.Image, Command: d.Command, Env: d.Env, Mounts: d.Mounts, Ports: d.Ports, Restart: d.Restart, RestartOn: d.RestartOn, Health: r.Typed.Health,
		User: d.User, Entrypoint: d.Entrypoint, WorkingDir: d.WorkingDir, CapAdd: d.CapAdd, CapDrop: d.CapDrop, Devices: d.Devices, ReadOnly: d.ReadOnly,
		Tmpfs: d.Tmpfs, Memory: r.Typed.Memory, CPUs: d.CPUs, StopSignal: r.Typed.StopSignal, StopTimeout: r.Typed.StopTimeout, Labels: d.Labels}
	if dnsAddr.IsValid() {
		f.DNS = dnsAddr.String()
	}
	decl, _ := json.Marshal(f)
	want := desired{Module: r.Module, Kind: r.Kind, Name: r.RuntimeName(), Decl: string(decl), Inputs: map[string]string{}, RestartOn: d.RestartOn}
	h := sha256.New()
	h.Write(decl)
	for _, on := range d.RestartOn {
		want.Inputs[on] = inputs[on]
		fmt.Fprintf(h, "\x00%s=%s", on, inputs[on])
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
			parts = append(parts, "restart-on: "+on+" changed")
		}
	}
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
