package state

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"path"
	"sort"
	"strings"

	"mesh/state/manifest"
)

// Node is a machine of the mesh.
type Node struct {
	Name         string `json:"name"`
	Address      string `json:"address"`
	PublicDomain string `json:"public_domain,omitempty"`
	Voter        bool   `json:"voter"`
}

// Assignment says a module runs on a node.
type Assignment struct {
	Node   string `json:"node"`
	Module string `json:"module"`
}

// Pair names one credential: a consumer module's secret for a provider module.
type Pair struct {
	Consumer string `json:"consumer"`
	Provider string `json:"provider"`
}

// Input is everything composition reads. It holds no secrets, only their digests.
type Input struct {
	Domain      string
	Nodes       []Node
	Modules     map[string]*manifest.Manifest
	Assignments []Assignment
	// Credentials maps each generated credential to its secret's digest.
	Credentials map[Pair]string
}

// Name is one roster entry: a DNS name, the address it answers with, and the
// node whose plan put it there (so a node whose plan fails keeps its names).
type Name struct {
	Name    string `json:"name"`
	Address string `json:"address"`
	Node    string `json:"node"`
}

// Route is one line of a node's routing table, written to a routes-file.
type Route struct {
	Name   string `json:"name"`
	Module string `json:"module"`
	Port   int    `json:"port"`
}

// Resource is one resolved resource of a plan.
type Resource struct {
	Module string `json:"module"`
	Kind   string `json:"kind"`
	Name   string `json:"name"`
	// The declaration, as written (kind key included).
	Decl manifest.Resource `json:"decl"`
	// Content is the resolved content of files, bindings and routes files.
	Content string `json:"content,omitempty"`
	// Credential is set on credentials and delivered credentials: which secret,
	// and the digest of what will be written (never the secret).
	Credential *Pair  `json:"credential,omitempty"`
	Digest     string `json:"digest,omitempty"`
}

// KindDeliveredCredential is a provider-side credential file: the mesh writes
// CONSUMER.credential into the provider's accepts-credentials directory.
const KindDeliveredCredential = "delivered-credential"

// Plan is what one node must hold.
type Plan struct {
	Node      string     `json:"node"`
	Resources []Resource `json:"resources"`
	Routes    []Route    `json:"routes,omitempty"`
}

// Digest is the sha256 of the plan's canonical JSON.
func (p *Plan) Digest() string {
	b, err := json.Marshal(p)
	if err != nil {
		panic(err) // a Plan always encodes
	}
	s := sha256.Sum256(b)
	return hex.EncodeToString(s[:])
}

// Output is the result of composition: the roster and, per node, either a plan
// or the reason it does not compose.
type Output struct {
	Roster []Name
	Plans  map[string]*Plan
	Errors map[string]string
}

// Compose derives the roster and every node's plan. It is pure: no clock, no
// I/O, and the same input always gives the same output, in the same order.
//
// A node whose plan does not compose gets an entry in Errors and no plan, and
// contributes no names; the caller keeps that node's previous plan and names
// (DESIGN rule 6).
func Compose(in Input) Output {
	out := Output{Plans: map[string]*Plan{}, Errors: map[string]string{}}
	nodes := map[string]Node{}
	for _, n := range in.Nodes {
		nodes[n.Name] = n
	}
	byNode := map[string][]string{}
	byModule := map[string][]string{}
	for _, a := range in.Assignments {
		byNode[a.Node] = append(byNode[a.Node], a.Module)
		byModule[a.Module] = append(byModule[a.Module], a.Node)
	}
	for _, s := range byNode {
		sort.Strings(s)
	}
	for _, s := range byModule {
		sort.Strings(s)
	}
	names := make([]string, 0, len(nodes))
	for n := range nodes {
		names = append(names, n)
	}
	sort.Strings(names)

	for _, nn := range names {
		n := nodes[nn]
		plan, roster, err := composeNode(in, n, nodes, byNode, byModule)
		if err != nil {
			out.Errors[nn] = err.Error()
			continue
		}
		out.Plans[nn] = plan
		out.Roster = append(out.Roster, roster...)
	}
	SortRoster(out.Roster)
	return out
}

// SortRoster orders names by name, then address, then node.
func SortRoster(r []Name) {
	sort.Slice(r, func(i, j int) bool {
		if r[i].Name != r[j].Name {
			return r[i].Name < r[j].Name
		}
		if r[i].Address != r[j].Address {
			return r[i].Address < r[j].Address
		}
		return r[i].Node < r[j].Node
	})
}

func composeNode(in Input, n Node, nodes map[string]Node, byNode, byModule map[string][]string) (*Plan, []Name, error) {
	plan := &Plan{Node: n.Name, Resources: []Resource{}}
	roster := []Name{{Name: n.Name + "." + in.Domain, Address: n.Address, Node: n.Name}}
	owner := map[string]string{} // resource name -> module, for collisions on this node
	claim := func(name, module string) error {
		if other, ok := owner[name]; ok {
			return fmt.Errorf("%q is declared by both %s and %s on node %s; unassign one of them", name, other, module, n.Name)
		}
		owner[name] = module
		return nil
	}
	routeOwner := map[string]string{}
	var routesFiles []int

	for _, mod := range byNode[n.Name] {
		m, ok := in.Modules[mod]
		if !ok {
			return nil, nil, fmt.Errorf("module %q is assigned but not in the catalogue; add it with `mesh module add` or `mesh unassign %s %s`", mod, n.Name, mod)
		}
		roster = append(roster, Name{Name: mod + "." + in.Domain, Address: n.Address, Node: n.Name})
		for _, r := range m.Routes {
			if other, ok := routeOwner[r.Name]; ok {
				return nil, nil, fmt.Errorf("route %q is claimed by both %s and %s on node %s; rename one route", r.Name, other, mod, n.Name)
			}
			routeOwner[r.Name] = mod
			plan.Routes = append(plan.Routes, Route{Name: routeName(r.Name, n.PublicDomain), Module: mod, Port: r.Port})
			if n.PublicDomain != "" {
				roster = append(roster, Name{Name: r.Name + "." + n.PublicDomain, Address: n.Address, Node: n.Name})
			}
		}
		for i := range m.Resources {
			d := m.Resources[i]
			res := Resource{Module: mod, Kind: d.Kind(), Name: d.Name(), Decl: d}
			if err := claim(res.RuntimeName(), mod); err != nil {
				return nil, nil, err
			}
			switch res.Kind {
			case manifest.KindFile:
				res.Content = d.Content
			case manifest.KindRoutesFile:
				routesFiles = append(routesFiles, len(plan.Resources))
			case manifest.KindBinding:
				c, err := bindingContent(in, n, d, nodes, byModule)
				if err != nil {
					return nil, nil, fmt.Errorf("%s: binding %s: %w", mod, d.Binding, err)
				}
				res.Content = c
			case manifest.KindCredential:
				pm, ok := in.Modules[d.Provider]
				if !ok {
					return nil, nil, fmt.Errorf("%s: credential %s: provider %q is not in the catalogue; add it with `mesh module add`", mod, d.Credential, d.Provider)
				}
				if pm.AcceptsCredentials == "" {
					return nil, nil, fmt.Errorf("%s: credential %s: provider %q declares no accepts-credentials directory", mod, d.Credential, d.Provider)
				}
				p := Pair{Consumer: mod, Provider: d.Provider}
				dg, ok := in.Credentials[p]
				if !ok {
					return nil, nil, fmt.Errorf("%s: credential %s: no secret generated yet for %s -> %s; run `mesh assign %s %s` again", mod, d.Credential, mod, d.Provider, n.Name, mod)
				}
				res.Credential, res.Digest = &p, dg
			}
			plan.Resources = append(plan.Resources, res)
			// A provider's accepts-credentials directory receives one file per consumer,
			// right after the directory itself, so it exists before anything reads it.
			if res.Kind == manifest.KindDirectory && m.AcceptsCredentials == res.Name {
				for _, p := range consumersOf(in, mod) {
					dr := Resource{
						Module:     mod,
						Kind:       KindDeliveredCredential,
						Name:       path.Join(res.Name, p.Consumer+".credential"),
						Decl:       manifest.Resource{Mode: "0600", Owner: d.Owner},
						Credential: &p,
						Digest:     in.Credentials[p],
					}
					if err := claim(dr.Name, mod); err != nil {
						return nil, nil, err
					}
					plan.Resources = append(plan.Resources, dr)
				}
			}
		}
	}
	if len(routesFiles) > 0 {
		b, _ := json.MarshalIndent(plan.Routes, "", "  ")
		for _, i := range routesFiles {
			plan.Resources[i].Content = string(b) + "\n"
		}
	}
	return plan, roster, nil
}

// RuntimeName is what a resource occupies on the host: its path, its
// container name, or for a step the container it runs in, MODULE.STEP.
func (r Resource) RuntimeName() string {
	if r.Kind == manifest.KindStep {
		return r.Module + "." + r.Name
	}
	return r.Name
}

func routeName(name, publicDomain string) string {
	if publicDomain == "" {
		return name
	}
	return name + "." + publicDomain
}

// consumersOf lists the credentials whose provider is mod, for consumers that
// are assigned somewhere and whose secret exists, in consumer order.
func consumersOf(in Input, mod string) []Pair {
	var ps []Pair
	for p := range in.Credentials {
		if p.Provider == mod && isAssigned(in, p.Consumer) && declaresCredential(in.Modules[p.Consumer], mod) {
			ps = append(ps, p)
		}
	}
	sort.Slice(ps, func(i, j int) bool { return ps[i].Consumer < ps[j].Consumer })
	return ps
}

func isAssigned(in Input, mod string) bool {
	for _, a := range in.Assignments {
		if a.Module == mod {
			return true
		}
	}
	return false
}

func declaresCredential(m *manifest.Manifest, provider string) bool {
	if m == nil {
		return false
	}
	for i := range m.Resources {
		if m.Resources[i].Kind() == manifest.KindCredential && m.Resources[i].Provider == provider {
			return true
		}
	}
	return false
}

// bindingContent resolves a binding: the provider's mesh name, the node it runs
// on (the consumer's own node when it runs there too, else the first by name)
// and that node's address.
func bindingContent(in Input, n Node, d manifest.Resource, nodes map[string]Node, byModule map[string][]string) (string, error) {
	if _, ok := in.Modules[d.Provider]; !ok {
		return "", fmt.Errorf("provider %q is not in the catalogue; add it with `mesh module add`", d.Provider)
	}
	at := byModule[d.Provider]
	if len(at) == 0 {
		return "", fmt.Errorf("provider %q is not assigned to any node; `mesh assign NODE %s`", d.Provider, d.Provider)
	}
	pick := at[0]
	for _, a := range at {
		if a == n.Name {
			pick = a
		}
	}
	var b strings.Builder
	fmt.Fprintf(&b, "provider=%s\nname=%s.%s\nnode=%s\naddress=%s\n", d.Provider, d.Provider, in.Domain, pick, nodes[pick].Address)
	return b.String(), nil
}

// NeededCredentials lists the credentials that module m consumes, so that the
// proposer of a command can generate their secrets (the FSM may not).
func NeededCredentials(m *manifest.Manifest) []Pair {
	var ps []Pair
	seen := map[Pair]bool{}
	for i := range m.Resources {
		r := &m.Resources[i]
		if r.Kind() == manifest.KindCredential {
			p := Pair{Consumer: m.Module, Provider: r.Provider}
			if !seen[p] {
				seen[p] = true
				ps = append(ps, p)
			}
		}
	}
	return ps
}
