package state

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"

	"mesh/state/manifest"
)

// Preview is what a write would do, node by node, computed without making
// it: the command is applied to a private in-memory copy of the replica and
// the plans and roster it derives are compared with the current ones.
type Preview struct {
	// Index is the applied index of the replica the preview was taken from.
	Index uint64        `json:"index"`
	Nodes []NodePreview `json:"nodes"`
	Names []NameChange  `json:"names,omitempty"`
}

// NodePreview is one node whose plan would change.
type NodePreview struct {
	Node    string   `json:"node"`
	Actions []Action `json:"actions,omitempty"`
	// ComposeError is set when the node's plan would stop composing (the
	// node then keeps its last good plan).
	ComposeError string `json:"compose_error,omitempty"`
}

// Action is what a node's agent would do with one resource.
type Action struct {
	Do     string `json:"do"` // create, update, run, rerun, replace, pull, remove
	Kind   string `json:"kind"`
	Name   string `json:"name"`
	Module string `json:"module"`
	Why    string `json:"why,omitempty"`
}

func (a Action) String() string {
	op := map[string]string{"create": "+", "run": "+", "remove": "-"}[a.Do]
	if op == "" {
		op = "~"
	}
	s := fmt.Sprintf("%s %s %s %s (%s)", op, a.Do, a.Kind, a.Name, a.Module)
	if a.Why != "" {
		s += ": " + a.Why
	}
	return s
}

// NameChange is a roster entry that would appear ("+") or go ("-"), and
// the node whose plan holds it.
type NameChange struct {
	Op      string `json:"op"`
	Name    string `json:"name"`
	Address string `json:"address"`
	Node    string `json:"node,omitempty"`
}

// Preview applies data (an encoded command) to a copy of this replica and
// says what would change. A command the state machine would refuse gives
// the same error the write would.
func (s *Store) Preview(ctx context.Context, data []byte) (*Preview, error) {
	var snap bytes.Buffer
	if err := s.WriteSnapshot(ctx, &snap); err != nil {
		return nil, err
	}
	index, err := s.AppliedIndex()
	if err != nil {
		return nil, err
	}
	scratch, cleanup, err := s.openScratch()
	if err != nil {
		return nil, err
	}
	defer cleanup()
	if err := scratch.Restore(ctx, &snap); err != nil {
		return nil, fmt.Errorf("preview: copy the replica: %w", err)
	}
	if err := scratch.Apply(index+1, data); err != nil {
		return nil, err
	}
	out := &Preview{Index: index}
	nodes, err := scratch.Nodes(ctx)
	if err != nil {
		return nil, err
	}
	for _, n := range nodes {
		before, err := s.Plan(ctx, n.Name)
		if err != nil {
			before = PlanVersion{}
		}
		after, err := scratch.Plan(ctx, n.Name)
		if err != nil {
			after = PlanVersion{}
		}
		np := NodePreview{Node: n.Name, Actions: PlanActions(before.Plan, after.Plan)}
		if old, err := s.Node(ctx, n.Name); (err != nil || old.ComposeError == "") && n.ComposeError != "" {
			np.ComposeError = n.ComposeError
		}
		if len(np.Actions) > 0 || np.ComposeError != "" {
			out.Nodes = append(out.Nodes, np)
		}
	}
	r0, err := s.Roster(ctx)
	if err != nil {
		return nil, err
	}
	r1, err := scratch.Roster(ctx)
	if err != nil {
		return nil, err
	}
	out.Names = RosterChanges(r0, r1)
	return out, nil
}

// openScratch opens a private replica beside this one, in the data dir
// (0700: the copy holds the CA key and the secrets), removed by cleanup. A
// copy left by a killed process is removed when the replica is next opened.
func (s *Store) openScratch() (*Store, func(), error) {
	b := make([]byte, 8)
	rand.Read(b)
	p := filepath.Join(filepath.Dir(s.path), scratchPrefix+hex.EncodeToString(b)+".db")
	sc, err := Open(p)
	if err != nil {
		return nil, nil, fmt.Errorf("preview: %w", err)
	}
	return sc, func() { sc.Close(); removeScratch(p) }, nil
}

const scratchPrefix = "preview-"

func removeScratch(p string) {
	for _, suffix := range []string{"", "-wal", "-shm"} {
		os.Remove(p + suffix)
	}
}

// removeScratches removes the preview copies a killed process left in dir.
func removeScratches(dir string) {
	m, _ := filepath.Glob(filepath.Join(dir, scratchPrefix+"*.db"))
	for _, p := range m {
		removeScratch(p)
	}
}

// RosterChanges lists the names in after and not before ("+") and the other
// way round ("-"), by name.
func RosterChanges(before, after []Name) []NameChange {
	key := func(n Name) string { return n.Name + "\x00" + n.Address }
	in := func(r []Name) map[string]bool {
		m := map[string]bool{}
		for _, n := range r {
			m[key(n)] = true
		}
		return m
	}
	a, b := in(before), in(after)
	var out []NameChange
	for _, n := range after {
		if !a[key(n)] {
			out = append(out, NameChange{Op: "+", Name: n.Name, Address: n.Address, Node: n.Node})
		}
	}
	for _, n := range before {
		if !b[key(n)] {
			out = append(out, NameChange{Op: "-", Name: n.Name, Address: n.Address, Node: n.Node})
		}
	}
	sort.SliceStable(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out
}

// PlanActions says what an agent would do to go from plan old to plan new,
// in apply order, with the reconciler's reasons: a step runs again when its
// declaration or what it names under restart-on changed, a container is
// replaced when its declaration changed, or what it names changed, or a
// step it names runs. It works from the plans alone: drift on the host (a
// container removed by hand) is not in it.
func PlanActions(old, new *Plan) []Action {
	before := map[string]Resource{}
	if old != nil {
		for _, r := range old.Resources {
			before[r.Kind+"\x00"+r.Name] = r
		}
	}
	changed := map[string]string{} // resource name -> "changed" or "ran"
	var out []Action
	seen := map[string]bool{}
	if new != nil {
		for _, r := range new.Resources {
			k := r.Kind + "\x00" + r.Name
			seen[k] = true
			o, had := before[k]
			switch r.Kind {
			case manifest.KindStep, manifest.KindContainer:
				var why []string
				if had {
					for _, on := range r.Decl.RestartOn {
						if changed[on] == "ran" {
							why = append(why, "step "+on+" ran")
						}
					}
					if f := declChanges(o, r); f != "" {
						why = append(why, f)
					}
					for _, on := range r.Decl.RestartOn {
						switch c := changed[on]; {
						case c == "changed":
							why = append(why, "restart-on: "+on+" changed")
						case strings.HasPrefix(c, "secret "):
							why = append(why, c)
						}
					}
				}
				pull := had && r.Kind == manifest.KindContainer && r.Pull > o.Pull && len(why) == 0
				unpull := had && r.Kind == manifest.KindContainer && r.Pull < o.Pull && len(why) == 0
				restart := had && r.Kind == manifest.KindContainer && r.Restart > o.Restart && len(why) == 0
				switch {
				case pull: // a replacement it makes restarts it too
					out = append(out, Action{Do: "pull", Kind: r.Kind, Name: r.Name, Module: r.Module, Why: "mesh module pull: replaced only if its image changed"})
				case unpull: // a pull's rollout reverted (rollout.go)
					out = append(out, Action{Do: "pull", Kind: r.Kind, Name: r.Name, Module: r.Module, Why: "a pull taken back: the image from before it, back (replaced if it runs another)"})
				case restart:
					out = append(out, Action{Do: "restart", Kind: r.Kind, Name: r.Name, Module: r.Module, Why: "mesh restart: the same container, stopped and started again"})
				case !had && r.Kind == manifest.KindStep:
					out = append(out, Action{Do: "run", Kind: r.Kind, Name: r.Name, Module: r.Module})
					changed[r.Name] = "ran"
				case !had:
					out = append(out, Action{Do: "create", Kind: r.Kind, Name: r.Name, Module: r.Module})
				case len(why) > 0 && r.Kind == manifest.KindStep:
					out = append(out, Action{Do: "rerun", Kind: r.Kind, Name: r.Name, Module: r.Module, Why: strings.Join(why, "; ")})
					changed[r.Name] = "ran"
				case len(why) > 0:
					out = append(out, Action{Do: "replace", Kind: r.Kind, Name: r.Name, Module: r.Module, Why: strings.Join(why, "; ")})
				}
			default:
				if !had {
					out = append(out, Action{Do: "create", Kind: r.Kind, Name: r.Name, Module: r.Module})
					changed[r.Name] = "changed"
				} else if what := changedFields(o, r); what != "" {
					out = append(out, Action{Do: "update", Kind: r.Kind, Name: r.Name, Module: r.Module, Why: what})
					changed[r.Name] = "changed"
					if r.Kind == manifest.KindSecret && what == "secret "+r.Decl.SecretName+" changed" {
						// A new value: what reads the file is replaced for the secret.
						changed[r.Name] = what
					}
				}
			}
		}
	}
	var gone []Action
	for k, r := range before {
		if seen[k] {
			continue
		}
		a := Action{Do: "remove", Kind: r.Kind, Name: r.Name, Module: r.Module}
		purged := new != nil && slices.ContainsFunc(new.Purge, func(p Purge) bool { return p.Path == r.Name && p.Module == r.Module })
		switch {
		case r.Kind == manifest.KindDirectory && r.Decl.Data && purged:
			a.Do, a.Why = "purge", "a data directory: removed with everything in it (--purge-data), once the module's containers are gone"
		case r.Kind == manifest.KindDirectory && r.Decl.Data:
			a.Do, a.Why = "keep", "a data directory: never removed, even empty (mesh unassign --purge-data removes it)"
		case r.Kind == manifest.KindDirectory:
			a.Why = "kept if it holds anything the mesh did not put there"
		case r.Kind == manifest.KindStep:
			a.Why = "its run marker goes; it runs again if declared again"
		}
		gone = append(gone, a)
	}
	// Removals run in reverse order of creation: containers, then steps,
	// then paths, children before parents.
	rank := func(kind string) int {
		switch kind {
		case manifest.KindContainer:
			return 0
		case manifest.KindStep:
			return 1
		}
		return 2
	}
	sort.Slice(gone, func(i, j int) bool {
		if ri, rj := rank(gone[i].Kind), rank(gone[j].Kind); ri != rj {
			return ri < rj
		}
		return gone[i].Name > gone[j].Name
	})
	return append(out, gone...)
}

// declChanges names the fields of a step's or container's declaration that
// differ ("image changed"), as the reconciler's log line does.
func declChanges(a, b Resource) string {
	x, y := a, b
	x.Content, y.Content, x.Digest, y.Digest = "", "", "", ""
	// The pull policy is not part of what a container is.
	x.Decl.Pull, y.Decl.Pull, x.Pull, y.Pull = "", "", 0, 0
	// Nor is a step's schedule: when it runs again, not what it runs.
	x.Decl.Schedule, y.Decl.Schedule = "", ""
	x.Restart, y.Restart = 0, 0
	return changedFields(x, y)
}
