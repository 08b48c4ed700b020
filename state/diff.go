package state

import (
	"encoding/json"
	"fmt"
	"sort"
	"strings"
)

// Change is one difference between two plan versions.
type Change struct {
	Op     string `json:"op"` // "+", "-", "~"
	Module string `json:"module"`
	Kind   string `json:"kind"`
	Name   string `json:"name"`
	What   string `json:"what,omitempty"` // for "~": which fields changed
}

func (c Change) String() string {
	s := fmt.Sprintf("%s %s %s (%s)", c.Op, c.Kind, c.Name, c.Module)
	if c.What != "" {
		s += ": " + c.What
	}
	return s
}

// Diff lists what changed from old to new (old may be nil: everything is new).
// Credentials are compared by digest only; their secrets are never in a plan.
func Diff(old, new *Plan) []Change {
	key := func(r Resource) string { return r.Kind + "\x00" + r.Name }
	before := map[string]Resource{}
	if old != nil {
		for _, r := range old.Resources {
			before[key(r)] = r
		}
	}
	var out []Change
	seen := map[string]bool{}
	if new != nil {
		for _, r := range new.Resources {
			k := key(r)
			seen[k] = true
			o, ok := before[k]
			if !ok {
				out = append(out, Change{Op: "+", Module: r.Module, Kind: r.Kind, Name: r.Name})
				continue
			}
			if what := changedFields(o, r); what != "" {
				out = append(out, Change{Op: "~", Module: r.Module, Kind: r.Kind, Name: r.Name, What: what})
			}
		}
	}
	var gone []Change
	for k, r := range before {
		if !seen[k] {
			gone = append(gone, Change{Op: "-", Module: r.Module, Kind: r.Kind, Name: r.Name})
		}
	}
	sort.Slice(gone, func(i, j int) bool { return gone[i].Name < gone[j].Name })
	out = append(out, gone...)
	return append(out, diffRoutes(old, new)...)
}

// diffRoutes lists routes that appeared or went away (a changed public domain
// shows as one of each).
func diffRoutes(old, new *Plan) []Change {
	set := func(p *Plan) map[Route]bool {
		m := map[Route]bool{}
		if p != nil {
			for _, r := range p.Routes {
				m[r] = true
			}
		}
		return m
	}
	a, b := set(old), set(new)
	var out []Change
	if new != nil {
		for _, r := range new.Routes {
			if !a[r] {
				out = append(out, Change{Op: "+", Module: r.Module, Kind: "route", Name: fmt.Sprintf("%s -> port %d", r.Name, r.Port)})
			}
		}
	}
	if old != nil {
		for _, r := range old.Routes {
			if !b[r] {
				out = append(out, Change{Op: "-", Module: r.Module, Kind: "route", Name: fmt.Sprintf("%s -> port %d", r.Name, r.Port)})
			}
		}
	}
	return out
}

// changedFields names the fields of a resource that differ, in a stable order.
func changedFields(a, b Resource) string {
	var fa, fb map[string]any
	ja, _ := json.Marshal(a.Decl)
	jb, _ := json.Marshal(b.Decl)
	json.Unmarshal(ja, &fa)
	json.Unmarshal(jb, &fb)
	var diff []string
	keys := map[string]bool{}
	for k := range fa {
		keys[k] = true
	}
	for k := range fb {
		keys[k] = true
	}
	delete(keys, "typed") // the parsed form of the fields above: the field itself is named
	for k := range keys {
		x, _ := json.Marshal(fa[k])
		y, _ := json.Marshal(fb[k])
		if string(x) != string(y) {
			diff = append(diff, k)
		}
	}
	if a.Module != b.Module {
		diff = append(diff, "module")
	}
	if a.Content != b.Content && a.Decl.Content == b.Decl.Content {
		diff = append(diff, "resolved content")
	}
	if a.Digest != b.Digest {
		diff = append(diff, "secret digest")
	}
	if a.Pull != b.Pull {
		diff = append(diff, "pull (mesh module pull)")
	}
	if a.Restart != b.Restart {
		diff = append(diff, "restart (mesh restart)")
	}
	for n := range secretUnion(a.Secrets, b.Secrets) {
		if a.Secrets[n] != b.Secrets[n] {
			diff = append(diff, "secret "+n)
		}
	}
	if len(diff) == 0 {
		return ""
	}
	sort.Strings(diff)
	return strings.Join(diff, ", ") + " changed"
}

func secretUnion(a, b map[string]string) map[string]bool {
	u := map[string]bool{}
	for k := range a {
		u[k] = true
	}
	for k := range b {
		u[k] = true
	}
	return u
}
