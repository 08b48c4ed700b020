package state

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"regexp"
	"strings"
	"time"

	"mesh/state/manifest"
)

// Explanation is the cause chain of a resource's last change on a node: the
// plan version that changed it, the command that made that version, and
// what moved, from the resource down to the input whose digest changed.
type Explanation struct {
	Node     string    `json:"node"`
	Resource string    `json:"resource"`
	Module   string    `json:"module"`
	Version  uint64    `json:"version"` // the plan version: the log index of the command
	At       time.Time `json:"at"`
	Cause    string    `json:"cause"` // the command, e.g. "mesh module add web.yaml"
	Chain    []Step    `json:"chain"`
}

// Step is one link of the chain, indented by Depth under the one it explains.
type Step struct {
	Depth  int    `json:"depth"`
	Action Action `json:"action"`
	// Before and After are short digests of a path's content (or a
	// credential's secret digest) when that is what moved.
	Before string `json:"before,omitempty"`
	After  string `json:"after,omitempty"`
}

var causeRE = regexp.MustCompile(`(?:step (\S+) ran|restart-on: (\S+) changed)`)

// Explain finds, in a node's plan history (newest first, as PlanHistory
// gives it), the last version that changed the resource called name (a
// path, a container, a step, or MODULE.STEP), and explains it. The oldest
// version kept counts as creating what it holds.
func Explain(node string, history []PlanVersion, name string) (*Explanation, error) {
	for i, v := range history {
		var prev *Plan
		if i+1 < len(history) {
			prev = history[i+1].Plan
		}
		acts := PlanActions(prev, v.Plan)
		at := -1
		for j, a := range acts {
			if a.Name == name || (a.Kind == manifest.KindStep && a.Module+"."+a.Name == name) {
				at = j
				break
			}
		}
		if at < 0 {
			continue
		}
		e := &Explanation{Node: node, Resource: name, Module: acts[at].Module, Version: v.Version, At: v.CreatedAt, Cause: v.Cause}
		seen := map[string]bool{}
		var walk func(a Action, depth int)
		walk = func(a Action, depth int) {
			if seen[a.Kind+a.Name] {
				return
			}
			seen[a.Kind+a.Name] = true
			st := Step{Depth: depth, Action: a}
			if a.Do == "update" {
				st.Before, st.After = contentDigest(prev, a), contentDigest(v.Plan, a)
			}
			e.Chain = append(e.Chain, st)
			for _, m := range causeRE.FindAllStringSubmatch(a.Why, -1) {
				what := m[1] + m[2]
				for _, b := range acts {
					if b.Name == what && (b.Module == a.Module || b.Kind != manifest.KindStep) {
						walk(b, depth+1)
					}
				}
			}
		}
		walk(acts[at], 0)
		return e, nil
	}
	if len(history) == 0 {
		return nil, fmt.Errorf("node %s has no plan yet", node)
	}
	return nil, fmt.Errorf("no resource %q in the %d plan version(s) of %s kept (v%d to v%d); `mesh plan %s` lists what it holds", name, len(history), node, history[len(history)-1].Version, history[0].Version, node)
}

// contentDigest is a short digest of what a path resource holds in p.
func contentDigest(p *Plan, a Action) string {
	if p == nil {
		return ""
	}
	for _, r := range p.Resources {
		if r.Kind == a.Kind && r.Name == a.Name {
			h := sha256.Sum256([]byte(r.Content + "\x00" + r.Digest + "\x00" + jsonString(r.Decl)))
			return hex.EncodeToString(h[:4])
		}
	}
	return ""
}

// String renders the explanation as mesh why prints it.
func (e *Explanation) String() string {
	var b strings.Builder
	fmt.Fprintf(&b, "%s (%s) on %s: changed at plan v%d, %s, by `%s` (log index %d)\n", e.Resource, e.Module, e.Node, e.Version, e.At.Local().Format("2006-01-02 15:04:05"), e.Cause, e.Version)
	for _, s := range e.Chain {
		ind := strings.Repeat("  ", s.Depth+1)
		prefix := ""
		if s.Depth > 0 {
			prefix = "because: "
		}
		fmt.Fprintf(&b, "%s%s%s", ind, prefix, s.Action)
		if s.Before != "" || s.After != "" {
			fmt.Fprintf(&b, " (digest %s -> %s)", dashIfEmpty(s.Before), dashIfEmpty(s.After))
		}
		b.WriteString("\n")
	}
	return b.String()
}

func dashIfEmpty(s string) string {
	if s == "" {
		return "-"
	}
	return s
}
