package state

import (
	"cmp"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"path"
	"slices"
	"sort"
	"strings"
	"sync"

	"mesh/state/manifest"
)

// Node is a machine of the mesh.
type Node struct {
	Name         string `json:"name"`
	Address      string `json:"address"`
	PublicDomain string `json:"public_domain,omitempty"`
	Voter        bool   `json:"voter"`
	// Port is the node's Raft port (0 for nodes that joined before it was
	// kept): with it the leader can put a node back into Raft's
	// configuration after a join that stopped half-way.
	Port int `json:"port,omitempty"`
	// SealKey is the public key credentials are sealed to for this node
	// (seal.go); empty until the node gives one.
	SealKey string `json:"seal_key,omitempty"`
	// OverlayKey is the node's WireGuard public key (base64), and
	// OverlayEndpoint the UDP address its peers send to (overlay.go);
	// OverlayAddress is the address the FSM gave it on the overlay.
	OverlayKey      string `json:"overlay_key,omitempty"`
	OverlayEndpoint string `json:"overlay_endpoint,omitempty"`
	OverlayAddress  string `json:"overlay_address,omitempty"`
	// PublicDomains are every public domain the node serves, PublicDomain
	// the first (edge.go); ACME is what its route proxy gets certificates with.
	PublicDomains []string `json:"public_domains,omitempty"`
	ACME          ACME     `json:"acme,omitzero"`
}

// Assignment says a module runs on a node.
type Assignment struct {
	Node   string `json:"node"`
	Module string `json:"module"`
	// Seq orders assignments: the Raft index of the command that made it.
	Seq uint64 `json:"seq,omitempty"`
}

// BindKey names one binding of one consumer on one node.
type BindKey struct {
	Node   string
	Module string
	Path   string
}

// Pair names one credential: a consumer module's secret for a provider module.
type Pair struct {
	Consumer string `json:"consumer"`
	Provider string `json:"provider"`
}

// Input is everything composition reads. It holds no secrets, only their digests.
type Input struct {
	Domain string
	// Overlay is the mesh's overlay setting (overlay.go).
	Overlay     string
	Nodes       []Node
	Modules     map[string]*manifest.Manifest
	Assignments []Assignment
	// Credentials maps each generated credential to its secret's digest.
	Credentials map[Pair]string
	// Bound is the provider node each binding pointed at after the last
	// composition, so that adding an instance never moves a consumer.
	Bound map[BindKey]string
	// Pulls is the log index of each module's last `mesh module pull`.
	Pulls map[string]uint64
	// Secrets maps each of the operator's secrets to its value's digest.
	Secrets map[SecretRef]string
	// Restarts is the index of the last `mesh restart` of each scope.
	Restarts map[RestartKey]uint64
	// Held is the manifest a node keeps for a module whose rollout has not
	// reached it yet (rollout.go): the version before; HeldPulls the pull
	// index it keeps while a pull's rollout has not reached it.
	Held      map[HeldKey]*manifest.Manifest
	HeldPulls map[HeldKey]uint64
	// HeldSecrets are the digests of the values a node keeps, by secret
	// name, while the rollout of a new value has not reached it (only a
	// node the value before was sealed to keeps it).
	HeldSecrets map[HeldKey]map[string]string
	// Purges lists, per node, the data directories an unassign
	// --purge-data asked it to remove (issue 30).
	Purges map[string][]Purge
	// Stopped holds the modules a move holds stopped on a node (move.go),
	// with the move's phase: the node keeps their directories and files,
	// none of their containers or steps, and answers none of their names;
	// once the module starts on the move's TO (phase start), it provides
	// no binding either.
	Stopped map[HeldKey]string
	// assignedByNode says Assignments is sorted by node, then module (as
	// the FSM keeps and reads it), so a node's modules are found by binary
	// search.
	assignedByNode bool
	// hostIndex is, when set, the catalogue's routes by name and host
	// (catDeps), for the rule on host names about a few hosts.
	hostIndex *catDeps
	// consumers are, when set, each provider's consumers in Credentials,
	// sorted; assignedAt each module's assignments, in no order (issue
	// "scale": consumersOf walked every credential, and for each of a
	// provider's every assignment of the fleet; groupFor walked them for
	// the nodes of the providers a node binds to).
	consumers  map[string][]string
	assignedAt map[string][]Assignment
	// named says composition names each resource's declaration (src)
	// without copying it into Decl and Typed (1.2 kB a resource, 500 a
	// node of 100 modules: the largest part of composing one that grew
	// with the node, issue "scale"). Only the FSM's recompose sets it:
	// planBody, which copies them into the resources it encodes, and
	// writeBindings are all that read its plans.
	named bool
}

// Purge is a data directory a node removes, with all it holds, while its
// module is not assigned there.
type Purge struct {
	Module string `json:"module"`
	Path   string `json:"path"`
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
	// Typed is the declaration's values, parsed once by the manifest parser.
	Typed manifest.Typed `json:"typed"`
	// Content is the resolved content of files, bindings and routes files.
	Content string `json:"content,omitempty"`
	// Credential is set on credentials and delivered credentials: which secret,
	// and the digest of what will be written (never the secret).
	Credential *Pair  `json:"credential,omitempty"`
	Digest     string `json:"digest,omitempty"`
	// Provider is, for a binding, the node of the provider it points at.
	Provider string `json:"provider_node,omitempty"`
	// Secrets are, for a secret file and for a step or container with
	// env-secrets, the module's secrets it reads: name -> the value's
	// digest, "" while the secret is not set (the resource waits).
	Secrets map[string]string `json:"secrets,omitempty"`
	// Pull is, for a container, the log index of its module's last `mesh
	// module pull`: an agent that has not handled it pulls the image and
	// replaces the container if the image changed. It is not part of the
	// container's declaration.
	Pull uint64 `json:"pull,omitempty"`
	// Restart is, for a container, the log index of the last `mesh
	// restart` that names it on this node (restart.go); not part of its
	// declaration either.
	Restart uint64 `json:"restart,omitempty"`
	// src is the manifest's declaration Decl and Typed were copied from
	// (nil for one composition made up), for planBody; never encoded.
	src *manifest.Resource
	// via is, for a delivered credential (made up), the accepts-credentials
	// directory's declaration its Decl and Typed are made from, for
	// planBody; never encoded.
	via *manifest.Resource
}

// KindDeliveredCredential is a provider-side credential file: the mesh writes
// CONSUMER.credential into the provider's accepts-credentials directory.
const KindDeliveredCredential = "delivered-credential"

// Plan is what one node must hold.
type Plan struct {
	Node      string     `json:"node"`
	Resources []Resource `json:"resources"`
	Routes    []Route    `json:"routes,omitempty"`
	// PublishAddress is where the node publishes its containers' ports:
	// (not their public ports): its overlay address, its mesh address when
	// the overlay is off, or every interface when empty (overlay.go).
	PublishAddress string `json:"publish_address,omitempty"`
	// Purge is the data directories the node removes, with all they hold,
	// once the containers of their module are gone (mesh unassign
	// --purge-data); never one a module the node runs declares.
	Purge []Purge `json:"purge,omitempty"`
	// named says its resources were composed with their declarations
	// named, not copied (Input.named).
	named bool
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
	// Bound is the provider node of every binding of the composed nodes.
	Bound map[BindKey]string
}

// Compose derives the roster and every node's plan. It is pure: no clock, no
// I/O, and the same input always gives the same output, in the same order.
//
// A node whose plan does not compose gets an entry in Errors and no plan, and
// contributes no names; the caller keeps that node's previous plan and names
// (DESIGN.md rule 6).
func Compose(in Input) Output { return ComposeNodes(in, nil) }

// ComposeNodes composes the plans of the nodes in only (every node when
// only is nil): the same plans, errors, bindings and names Compose gives
// those nodes, for a command that can change no other node's (incremental
// composition, issue "scale").
func ComposeNodes(in Input, only map[string]bool) Output { return composeKept(in, only, nil) }

// composeKept is ComposeNodes with each composed node's checks across its
// modules taken from checks (nil: none kept) and left there for its next
// composition (deleted for a node that does not compose).
func composeKept(in Input, only map[string]bool, checks map[string]*nodeChecks) Output {
	out := Output{Plans: map[string]*Plan{}, Errors: map[string]string{}, Bound: map[BindKey]string{}}
	nodes := make(map[string]Node, len(in.Nodes))
	for _, n := range in.Nodes {
		nodes[n.Name] = n
	}
	var byNode, byModule map[string][]string
	if only == nil {
		byNode, byModule = groupAssignments(in, in.Assignments)
	} else {
		byNode, byModule = groupFor(in, only)
	}
	names := make([]string, 0, len(nodes))
	for n := range nodes {
		if only == nil || only[n] {
			names = append(names, n)
		}
	}
	sort.Strings(names)

	for _, nn := range names {
		n := nodes[nn]
		var kc *nodeChecks
		if checks != nil {
			kc = checks[nn]
			delete(checks, nn)
		}
		plan, roster, kc, err := composeNode(in, n, nodes, byNode, byModule, kc, checks != nil)
		if errors.Is(err, errRecheck) {
			// A module changed to clash with another (or to fail): the
			// whole node again, for the error a full composition gives.
			plan, roster, kc, err = composeNode(in, n, nodes, byNode, byModule, nil, true)
		}
		if err != nil {
			out.Errors[nn] = err.Error()
			continue
		}
		if checks != nil {
			checks[nn] = kc
		}
		for i := range plan.Resources { // by index: a Resource is 1.2 kB
			if r := &plan.Resources[i]; r.Kind == manifest.KindBinding {
				out.Bound[BindKey{Node: nn, Module: r.Module, Path: r.Name}] = r.Provider
			}
		}
		out.Plans[nn] = plan
		out.Roster = append(out.Roster, roster...)
	}
	SortRoster(out.Roster)
	return out
}

// resourceArrays are the arrays of plans composed and let go
// (releasePlans), for the next composition's. A node of 100 modules has
// 500 resources of 1.2 kB: an assign at 10,000 modules allocated 0.6 MB
// for them, a quarter of its garbage.
//
// They are kept in a list of their own, not a sync.Pool: a pool's Get
// does not see what another processor's Put left in its private slot, and
// the applying goroutine moves between the two processors of a small
// node often enough that one assign in five allocated its array anew
// (BenchmarkFleetProfile -benchmem). At most keptArrays are kept, emptied.
var resourceArrays struct {
	sync.Mutex
	free [][]Resource
}

const keptArrays = 4

// resourceArray is an empty array for n resources.
func resourceArray(n int) []Resource {
	resourceArrays.Lock()
	defer resourceArrays.Unlock()
	free := resourceArrays.free
	for i := len(free) - 1; i >= 0; i-- {
		if a := free[i]; cap(a) >= n {
			resourceArrays.free = slices.Delete(free, i, i+1)
			return a
		}
	}
	return make([]Resource, 0, n+n/4) // room for the node's next modules
}

// releasePlans gives the arrays of out's plans to the next compositions:
// the caller reads none of out's plans after, and kept nothing of them
// but copies (planBody keeps fields, not the array).
func (out Output) releasePlans() {
	for _, p := range out.Plans {
		// Past len the array is zero: it was cleared when let go, or new.
		if p.named {
			// A resource composed with its declaration named has no
			// Decl or Typed written (planBody encodes a copy).
			for i := range p.Resources {
				if r := &p.Resources[i]; r.src != nil {
					r.clearNamed()
				} else {
					*r = Resource{}
				}
			}
		} else {
			clear(p.Resources) // holds nothing of this plan alive
		}
		a := p.Resources[:cap(p.Resources)]
		p.Resources = nil
		resourceArrays.Lock()
		if free := resourceArrays.free; len(free) < keptArrays {
			resourceArrays.free = append(free, a[:0])
		} else if i := slices.IndexFunc(free, func(f []Resource) bool { return cap(f) < cap(a) }); i >= 0 {
			free[i] = a[:0] // the larger kept
		}
		resourceArrays.Unlock()
	}
}

// groupAssignments is, for the assignments as, each node's modules in the
// order it composes them (by name, providers first) and each module's
// nodes, earliest assigned first (then by node), so a binding's fallback
// is the instance that was there first; a module a move holds at phase
// start is not its FROM's to provide.
func groupAssignments(in Input, as []Assignment) (byNode, byModule map[string][]string) {
	return groupByNode(in, as), groupByModule(in, as)
}

// groupByNode is groupAssignments's byNode: it does not depend on the
// assignments' order (each node's modules are sorted by name).
func groupByNode(in Input, as []Assignment) map[string][]string {
	byNode := map[string][]string{}
	for _, a := range as {
		byNode[a.Node] = append(byNode[a.Node], a.Module)
	}
	for n, s := range byNode {
		sort.Strings(s)
		byNode[n] = providersFirst(s, in.Modules)
	}
	return byNode
}

// groupByModule is groupAssignments's byModule.
func groupByModule(in Input, as []Assignment) map[string][]string {
	as = slices.Clone(as)
	sort.SliceStable(as, func(i, j int) bool {
		if as[i].Seq != as[j].Seq {
			return as[i].Seq < as[j].Seq
		}
		return as[i].Node < as[j].Node
	})
	byModule := map[string][]string{}
	for _, a := range as {
		if in.Stopped[HeldKey{Node: a.Node, Module: a.Module}] == MoveStart {
			continue // TO provides it now
		}
		byModule[a.Module] = append(byModule[a.Module], a.Node)
	}
	return byModule
}

// groupFor is groupAssignments for the nodes in only: their modules, and
// the nodes of the modules their bindings name (the only modules whose
// nodes composition reads), found without sorting or grouping the whole
// fleet's assignments (issue "scale": a command costs what it changes).
func groupFor(in Input, only map[string]bool) (byNode, byModule map[string][]string) {
	var mine []Assignment
	if in.assignedByNode {
		// Sorted by node, then module: each node's modules are one run.
		for n := range only {
			mine = append(mine, nodeRun(in.Assignments, n)...)
		}
	} else {
		for _, a := range in.Assignments {
			if only[a.Node] {
				mine = append(mine, a)
			}
		}
	}
	byNode = groupByNode(in, mine)
	// The providers the composed nodes' bindings name, from the manifest
	// each node composes (a rollout may hold the one before).
	providers := map[string]bool{}
	for _, a := range mine {
		for _, m := range []*manifest.Manifest{in.Modules[a.Module], in.Held[HeldKey{Node: a.Node, Module: a.Module}]} {
			if m == nil {
				continue
			}
			for _, p := range m.BindingProviders() {
				providers[p] = true
			}
		}
	}
	byModule = map[string][]string{}
	if len(providers) == 0 {
		return byNode, byModule
	}
	byModule = groupByModule(in, assignmentsOf(in, providers))
	return byNode, byModule
}

// assignmentsOf is the assignments of the modules in mods, in no order:
// from each module's assignments when the input indexes them (the FSM's),
// else when the assignments are sorted by node, found by binary search in
// each node's run rather than by a walk of the fleet's (a node whose
// modules bind to a database walked 10,000 of them with every command).
func assignmentsOf(in Input, mods map[string]bool) []Assignment {
	var out []Assignment
	if in.assignedAt != nil {
		for m := range mods {
			out = append(out, in.assignedAt[m]...)
		}
		return out
	}
	if !in.assignedByNode || len(mods)*len(in.Nodes) > len(in.Assignments)/8 {
		for _, a := range in.Assignments {
			if mods[a.Module] {
				out = append(out, a)
			}
		}
		return out
	}
	return assignmentsOfByRun(in, mods)
}

// assignmentsOfByRun is assignmentsOf by binary search in each node's run
// of assignments, sorted by node, then module (in.assignedByNode).
func assignmentsOfByRun(in Input, mods map[string]bool) []Assignment {
	var out []Assignment
	for _, n := range in.Nodes {
		run := nodeRun(in.Assignments, n.Name)
		for m := range mods {
			if i, found := slices.BinarySearchFunc(run, m, func(a Assignment, m string) int { return strings.Compare(a.Module, m) }); found {
				out = append(out, run[i])
			}
		}
	}
	return out
}

// SortRoster orders names by name, then address, then node.
func SortRoster(r []Name) {
	sort.Slice(r, func(i, j int) bool { return RosterLess(r[i], r[j]) })
}

func composeNode(in Input, n Node, nodes map[string]Node, byNode, byModule map[string][]string, kc *nodeChecks, keep bool) (*Plan, []Name, *nodeChecks, error) {
	// The checks across modules kept from the node's last composition hold
	// for the modules that have not changed since (the same manifest,
	// stopped or not, under the same domains); the others are checked
	// against them, and any error composes the whole node again.
	domains := strings.Join(n.Domains(), " ")
	incremental := kc != nil && kc.domains == domains
	if incremental {
		kc.gen++ // saw marks the modules known with it
	}
	// Each module's manifest (the one a rollout holds, if any), whether it
	// is stopped, and whether the checks kept saw it so.
	mods := byNode[n.Name]
	type modNow struct {
		m                  *manifest.Manifest
		ok, stopped, known bool
		consumers          []Pair // a provider's, whose credentials its directory receives
	}
	now := make([]modNow, len(mods))
	// What the node's modules hold, to allocate each array once (they
	// are a node's plan of 100 modules: growing them made a third of an
	// assign's garbage).
	size, nmounts, nroutes := 0, 0, 0
	for i, mod := range mods {
		m, ok := in.Modules[mod]
		if h := in.Held[HeldKey{Node: n.Name, Module: mod}]; h != nil && ok {
			m = h
		}
		_, stopped := in.Stopped[HeldKey{Node: n.Name, Module: mod}]
		var cons []Pair
		if ok && m.AcceptsCredentials != "" {
			cons = consumersOf(in, mod)
		}
		now[i] = modNow{m: m, ok: ok, stopped: stopped, consumers: cons, known: incremental && ok && kc.saw(mod, m, stopped, cons)}
		if ok {
			size += len(m.Resources)
			if !now[i].known {
				nmounts += m.MountCount()
			}
			nroutes += len(m.Routes)
		}
	}
	if incremental {
		kc.release()
	} else {
		kc = newNodeChecks(domains, size, nroutes)
	}
	// fail is an error of the node's composition: when incremental, the
	// whole node is composed again (errRecheck) for the error a full
	// composition gives, first in the modules' order.
	fail := func(err error) (*Plan, []Name, *nodeChecks, error) {
		if incremental {
			return nil, nil, nil, errRecheck
		}
		return nil, nil, nil, err
	}
	plan := &Plan{Node: n.Name, Resources: resourceArray(size), PublishAddress: in.publishAddress(n), named: in.named}
	addr := in.nameAddress(n)
	roster := make([]Name, 1, 1+len(byNode[n.Name]))
	roster[0] = Name{Name: n.Name + "." + in.Domain, Address: addr, Node: n.Name}
	owner := kc.owner       // resource name -> module, for collisions on this node
	var checked *modChecked // the module being checked, nil for one known
	claim := func(name, module string) error {
		if checked == nil {
			return nil
		}
		if other, ok := owner[name]; ok {
			return fmt.Errorf("%q is declared by both %s and %s on node %s; unassign one of them", name, other, module, n.Name)
		}
		owner[name] = module
		if keep {
			checked.names = append(checked.names, name)
		}
		return nil
	}
	routeOwner, hostOwner := kc.routes, kc.hosts
	if nroutes > 0 {
		plan.Routes = make([]Route, 0, nroutes) // nil again below if none is served
	}
	var routesFiles []int
	mounts := make([]manifest.MountAt, 0, nmounts)
	var hostsOfMod []string

	for i, mod := range mods {
		m, stopped := now[i].m, now[i].stopped
		if !now[i].ok {
			return fail(fmt.Errorf("module %q is assigned but not in the catalogue; add it with `mesh module add` or `mesh unassign %s %s`", mod, n.Name, mod))
		}
		checked = nil
		if !now[i].known {
			checked = &modChecked{m: m, stopped: stopped}
			if keep && len(now[i].consumers) > 0 {
				checked.consumers = make([]string, len(now[i].consumers))
				for k, p := range now[i].consumers {
					checked.consumers[k] = p.Consumer
				}
			}
		}
		hostsOf := hostsOfMod[:0] // the module's hosts so far
		if !stopped {
			roster = append(roster, Name{Name: mod + "." + in.Domain, Address: addr, Node: n.Name})
		}
		for _, r := range m.Routes {
			if stopped {
				break
			}
			if checked != nil {
				if other, ok := routeOwner[r.Name]; ok {
					return fail(fmt.Errorf("route %q is claimed by both %s and %s on node %s; rename one route", r.Name, other, mod, n.Name))
				}
				routeOwner[r.Name] = mod
				if keep {
					checked.routes = append(checked.routes, r.Name)
				}
			}
			for _, h := range routeHosts(r, n.Domains()) {
				if checked != nil {
					if other, ok := hostOwner[h]; ok {
						if other.module == mod && other.port == r.Port {
							continue // one route at a name twice: under a domain, and as one of its hosts
						}
						return fail(fmt.Errorf("host %s is claimed by both %s (port %d) and %s (port %d) on node %s; remove it from one of them", h, other.module, other.port, mod, r.Port, n.Name))
					}
					hostOwner[h] = hostUse{mod, r.Port}
					if keep {
						checked.hosts = append(checked.hosts, h)
					}
				} else if slices.Contains(hostsOf, h) {
					continue // as above, for a module known (checked before)
				}
				hostsOf = append(hostsOf, h)
				plan.Routes = append(plan.Routes, Route{Name: h, Module: mod, Port: r.Port})
				if h != r.Name {
					roster = append(roster, Name{Name: h, Address: addr, Node: n.Name})
				}
			}
		}
		if checked != nil {
			at := len(mounts)
			if mounts = m.AppendMounts(mounts); keep {
				for _, mt := range mounts[at:] {
					km := keptMount{source: mt.Mount.Source, module: mod, owner: mt.Module, rw: !mt.Mount.ReadOnly}
					if incremental { // in place: the others are sorted
						i, _ := slices.BinarySearchFunc(kc.mounts, km, compareMounts)
						kc.mounts = slices.Insert(kc.mounts, i, km)
					} else {
						kc.mounts = append(kc.mounts, km)
					}
				}
			}
		}
		consumers := now[i].consumers
		heads := m.Heads()
		for i := range m.Resources {
			// Made in place: a Resource is 1.2 kB, and a node of 100
			// modules composes 500 of them (copying each twice was a
			// quarter of composing it, issue "scale"). What every
			// resource gives is read from its head, the declaration d
			// only for the kinds that need more.
			d, h := &m.Resources[i], &heads[i]
			kind := h.Kind
			if stopped && (kind == manifest.KindContainer || kind == manifest.KindStep) {
				continue
			}
			at := len(plan.Resources)
			if in.named {
				// Only the fields set are written: the slot is zero (a
				// Resource is 1.2 kB; writing and clearing 500 of them
				// made a tenth of an assign at 10,000 modules).
				if at < cap(plan.Resources) {
					plan.Resources = plan.Resources[:at+1]
				} else { // delivered credentials took the room
					plan.Resources = append(plan.Resources, Resource{})
				}
				r := &plan.Resources[at]
				r.Module, r.Kind, r.Name, r.src = mod, kind, h.Name, d
			} else {
				plan.Resources = append(plan.Resources, Resource{Module: mod, Kind: kind, Name: h.Name, Decl: *d, Typed: d.Typed, src: d})
			}
			res := &plan.Resources[at]
			if checked != nil {
				if err := claim(res.RuntimeName(), mod); err != nil {
					return fail(err)
				}
			}
			if names := h.Secrets; len(names) > 0 {
				res.Secrets = map[string]string{}
				held := in.HeldSecrets[HeldKey{Node: n.Name, Module: mod}]
				for _, sn := range names {
					res.Secrets[sn] = in.Secrets[SecretRef{Module: mod, Name: sn}]
					if d, ok := held[sn]; ok {
						res.Secrets[sn] = d
					}
				}
			}
			switch res.Kind {
			case manifest.KindContainer:
				res.Pull = in.Pulls[mod]
				if p, ok := in.HeldPulls[HeldKey{Node: n.Name, Module: mod}]; ok {
					res.Pull = p
				}
				res.Restart = in.restartOf(mod, res.Name, n.Name)
			case manifest.KindFile:
				res.Content = h.Content
			case manifest.KindRoutesFile:
				routesFiles = append(routesFiles, at)
			case manifest.KindBinding:
				c, pick, err := bindingContent(in, n, mod, d, nodes, byModule)
				if err != nil {
					return fail(fmt.Errorf("%s: binding %s: %w", mod, d.Binding, err))
				}
				res.Content, res.Provider = c, pick
			case manifest.KindCredential:
				pm, ok := in.Modules[d.Provider]
				if !ok {
					return fail(fmt.Errorf("%s: credential %s: provider %q is not in the catalogue; add it with `mesh module add`", mod, d.Credential, d.Provider))
				}
				if pm.AcceptsCredentials == "" {
					return fail(fmt.Errorf("%s: credential %s: provider %q declares no accepts-credentials directory", mod, d.Credential, d.Provider))
				}
				p := Pair{Consumer: mod, Provider: d.Provider}
				dg, ok := in.Credentials[p]
				if !ok {
					return fail(fmt.Errorf("%s: credential %s: no secret sealed for %s -> %s yet; the leader seals one within seconds (if this stays, read the leader's log)", mod, d.Credential, mod, d.Provider))
				}
				res.Credential, res.Digest = &p, dg
			}
			// A provider's accepts-credentials directory receives one file per consumer,
			// right after the directory itself, so it exists before anything reads it.
			if dir := res.Name; res.Kind == manifest.KindDirectory && m.AcceptsCredentials == dir {
				// (res is not used below: an append may move the array.)
				for _, p := range consumers {
					dr := Resource{
						Module:     mod,
						Kind:       KindDeliveredCredential,
						Name:       path.Join(dir, p.Consumer+".credential"),
						Decl:       manifest.Resource{Mode: "0600", Owner: d.Owner},
						Typed:      manifest.Typed{OK: true, HasOwner: d.Typed.HasOwner, UID: d.Typed.UID, GID: d.Typed.GID, HasMode: true, Mode: 0o600},
						Credential: &p,
						Digest:     in.Credentials[p],
						via:        d,
					}
					if err := claim(dr.Name, mod); err != nil {
						return fail(err)
					}
					plan.Resources = append(plan.Resources, dr)
				}
			}
		}
		if checked != nil && keep {
			checked.gen = kc.gen
			kc.mods[mod] = checked
		}
		hostsOfMod = hostsOf
	}
	if len(plan.Routes) == 0 {
		plan.Routes = nil // as a plan without routes always encoded
	}
	if !incremental {
		kc.sortMounts()
	}
	if incremental {
		// The mounts of the modules checked now, against every other
		// (kc.mounts holds theirs too).
		if kc.nests(mounts) {
			return fail(nil)
		}
	} else {
		for _, c := range manifest.NestedMounts(mounts) {
			if c.Outer.Module != c.Inner.Module {
				return nil, nil, nil, fmt.Errorf("modules %s and %s on node %s: %s", c.Outer.Module, c.Inner.Module, n.Name, c)
			}
		}
	}
	if len(routesFiles) > 0 {
		b, _ := json.MarshalIndent(plan.Routes, "", "  ")
		data := manifest.RoutesData{Node: n.Name, Address: addr, Domain: n.PublicDomain, Domains: n.Domains(), MeshDomain: in.Domain,
			ACME: manifest.ACMEData{Directory: cmp.Or(n.ACME.Directory, LetsEncrypt), Email: n.ACME.Email, CARoot: n.ACME.CARoot}}
		for _, r := range plan.Routes {
			data.Routes = append(data.Routes, manifest.RouteData{Name: r.Name, Module: r.Module, Port: r.Port, Public: strings.Contains(r.Name, ".")})
		}
		sort.Slice(data.Routes, func(i, j int) bool { return data.Routes[i].Name < data.Routes[j].Name })
		for _, i := range routesFiles {
			res := &plan.Resources[i]
			if res.declared().Template == "" {
				res.Content = string(b) + "\n"
				continue
			}
			t, err := manifest.ParseTemplate(res.declared().Template)
			if err == nil {
				res.Content, err = manifest.ExecTemplate(t, data)
			}
			if err != nil {
				return fail(fmt.Errorf("%s: routes-file %s: %w", res.Module, res.Name, err))
			}
		}
	}
	// Data an unassign --purge-data asked the node to remove: never a path
	// (or one inside or around a path) a module the node runs declares.
	for _, pg := range in.Purges[n.Name] {
		declared := false
		for i := range plan.Resources {
			r := &plan.Resources[i]
			if manifest.Within(r.Name, pg.Path) || manifest.Within(pg.Path, r.Name) && r.Kind == manifest.KindDirectory && r.declared().Data {
				declared = true
				break
			}
		}
		if !declared {
			plan.Purge = append(plan.Purge, pg)
		}
	}
	return plan, roster, kc, nil
}

// errRecheck: a node composed with the checks kept from its last
// composition failed; composed whole, it gives the error a full
// composition gives, in the modules' order.
var errRecheck = errors.New("compose the node whole")

// nodeChecks are the checks across a node's modules as its last
// composition left them: the names each module claims, its routes, the
// hosts they answer at and its mounts, with what each module was then
// (Store.checks keeps them by node). The next composition checks only the
// modules that are new or changed against the others (issue "scale": at
// 10,000 modules over 100 nodes, checking all of a node's 100 modules
// against each other was a third of composing it for one assign).
type nodeChecks struct {
	domains string // the node's domains, joined: its routes' hosts follow them
	mods    map[string]*modChecked
	gen     uint64             // of the composition under way (modChecked.gen)
	owner   map[string]string  // a resource's runtime name -> its module
	routes  map[string]string  // a route's name -> its module
	hosts   map[string]hostUse // a host -> its route's module and port
	mounts  []keptMount        // every module's, sorted by source
}

type hostUse struct {
	module string
	port   int
}

// modChecked is one module as its checks saw it, and what it claimed.
type modChecked struct {
	m                    *manifest.Manifest
	stopped              bool
	consumers            []string // a provider's, whose credentials its accepts-credentials directory received
	names, routes, hosts []string
	gen                  uint64 // nodeChecks.gen of the last composition that saw it so
}

func newNodeChecks(domains string, names, routes int) *nodeChecks {
	return &nodeChecks{domains: domains, mods: map[string]*modChecked{}, owner: make(map[string]string, names), routes: make(map[string]string, routes), hosts: make(map[string]hostUse, routes)}
}

// saw says the checks saw module mod as it is now: the same manifest,
// stopped or not, and for a provider the same consumers (the files its
// accepts-credentials directory receives, one per consumer, follow other
// modules' assignments and manifests: a provider on a node of databases
// was checked anew with every command, issue "scale").
func (kc *nodeChecks) saw(mod string, m *manifest.Manifest, stopped bool, consumers []Pair) bool {
	c := kc.mods[mod]
	if c == nil || c.m != m || c.stopped != stopped || c.gen == kc.gen {
		return false // (seen already in this composition: a module twice on the node is checked)
	}
	if !slices.EqualFunc(c.consumers, consumers, func(c string, p Pair) bool { return c == p.Consumer }) {
		return false
	}
	c.gen = kc.gen
	return true
}

// release lets go of what each module that saw did not mark (gone from the
// node, or not as the checks saw it) claimed, to be checked again.
func (kc *nodeChecks) release() {
	var gone []string
	for mod, c := range kc.mods {
		if c.gen == kc.gen {
			continue
		}
		gone = append(gone, mod)
		for _, x := range c.names {
			if kc.owner[x] == mod {
				delete(kc.owner, x)
			}
		}
		for _, x := range c.routes {
			if kc.routes[x] == mod {
				delete(kc.routes, x)
			}
		}
		for _, x := range c.hosts {
			if kc.hosts[x].module == mod {
				delete(kc.hosts, x)
			}
		}
		delete(kc.mods, mod)
	}
	if len(gone) > 0 {
		kc.mounts = slices.DeleteFunc(kc.mounts, func(km keptMount) bool { return slices.Contains(gone, km.module) })
	}
}

// keptMount is a mount of a module on the node, as the nesting check
// reads it.
type keptMount struct {
	source string
	module string // the module's name on the node (what release goes by)
	owner  string // MountAt.Module: whose it is to the check, as NestedMounts compares
	rw     bool
}

// sortMounts sorts the mounts by source (then the rest, for one order).
func (kc *nodeChecks) sortMounts() { slices.SortFunc(kc.mounts, compareMounts) }

func compareMounts(a, b keptMount) int {
	return cmp.Or(strings.Compare(a.source, b.source), strings.Compare(a.module, b.module), strings.Compare(a.owner, b.owner), cmp.Compare(b2i(a.rw), b2i(b.rw)))
}

func b2i(b bool) int {
	if b {
		return 1
	}
	return 0
}

// nests says whether a mount of mine (the modules checked now) and one of
// another module (kc.mounts, sorted, mine's included) nest as NestedMounts
// finds them: one inside another's writable one. Each is looked up by
// source, not compared with every mount of the node: outer/ is inside
// outer exactly when outer is the path before one of its slashes.
func (kc *nodeChecks) nests(mine []manifest.MountAt) bool {
	ms := kc.mounts
	from := func(src string) int { return sort.Search(len(ms), func(k int) bool { return ms[k].source >= src }) }
	// writableAt: another's writable mount whose source is o.
	writableAt := func(o string, x manifest.MountAt) bool {
		for i := from(o); i < len(ms) && ms[i].source == o; i++ {
			if ms[i].rw && ms[i].owner != x.Module {
				return true
			}
		}
		return false
	}
	for _, x := range mine {
		src := x.Mount.Source
		if !x.Mount.ReadOnly { // another's mount inside x
			if src == "/" {
				for _, e := range ms {
					if e.source != "/" && e.owner != x.Module {
						return true
					}
				}
			} else {
				p := src + "/"
				for i := from(p); i < len(ms) && strings.HasPrefix(ms[i].source, p); i++ {
					if ms[i].owner != x.Module {
						return true
					}
				}
			}
		}
		// x inside another's writable mount.
		for i := 0; i < len(src); i++ {
			if src[i] == '/' && writableAt(src[:i], x) {
				return true
			}
		}
		if src != "/" && writableAt("/", x) {
			return true
		}
	}
	return false
}

// declared is r's declaration: the manifest's it was composed from
// (which Input.named does not copy into Decl), else Decl.
func (r *Resource) declared() *manifest.Resource {
	if r.src != nil {
		return r.src
	}
	return &r.Decl
}

// withDecl is r with its declaration copied into Decl and Typed, as
// encoded, in a copy: composition with Input.named leaves them out.
func (r *Resource) withDecl() *Resource {
	c := *r
	if c.src != nil {
		c.Decl, c.Typed = *c.src, c.src.Typed
	}
	return &c
}

// clearNamed zeroes r, a resource composed with its declaration named,
// whose Decl and Typed are zero (TestClearNamedClearsAll fails when a
// field is added to Resource and not here).
func (r *Resource) clearNamed() {
	r.Module, r.Kind, r.Name, r.Content = "", "", "", ""
	r.Credential, r.Digest, r.Provider, r.Secrets = nil, "", "", nil
	r.Pull, r.Restart, r.src, r.via = 0, 0, nil, nil
}

// RuntimeName is what a resource occupies on the host: its path, its
// container name, or for a step the container it runs in, MODULE.STEP.
func (r Resource) RuntimeName() string {
	if r.Kind == manifest.KindStep {
		return r.Module + "." + r.Name
	}
	return r.Name
}

// consumersOf lists the credentials whose provider is mod, for consumers that
// are assigned somewhere and whose secret exists, in consumer order.
func consumersOf(in Input, mod string) []Pair {
	var ps []Pair
	if in.consumers != nil {
		for _, c := range in.consumers[mod] { // sorted
			if p := (Pair{Consumer: c, Provider: mod}); isAssigned(in, c) && declaresCredential(in.Modules[c], mod) {
				ps = append(ps, p)
			}
		}
		return ps
	}
	for p := range in.Credentials {
		if p.Provider == mod && isAssigned(in, p.Consumer) && declaresCredential(in.Modules[p.Consumer], mod) {
			ps = append(ps, p)
		}
	}
	sort.Slice(ps, func(i, j int) bool { return ps[i].Consumer < ps[j].Consumer })
	return ps
}

func isAssigned(in Input, mod string) bool {
	if in.assignedAt != nil {
		return len(in.assignedAt[mod]) > 0
	}
	for _, a := range in.Assignments {
		if a.Module == mod {
			return true
		}
	}
	return false
}

func declaresCredential(m *manifest.Manifest, provider string) bool {
	return m != nil && slices.Contains(m.CredentialProviders(), provider)
}

// bindingContent resolves a binding: the provider's mesh name, the node it
// runs on, and that node's address. The node is the one the binding pointed
// at before while the provider is still there (adding an instance never moves
// a consumer), else the consumer's own node when the provider runs there, else
// the instance assigned earliest.
func bindingContent(in Input, n Node, mod string, d *manifest.Resource, nodes map[string]Node, byModule map[string][]string) (string, string, error) {
	if _, ok := in.Modules[d.Provider]; !ok {
		return "", "", fmt.Errorf("provider %q is not in the catalogue; add it with `mesh module add`", d.Provider)
	}
	at := byModule[d.Provider]
	if len(at) == 0 {
		return "", "", fmt.Errorf("provider %q is not assigned to any node; `mesh assign NODE %s`", d.Provider, d.Provider)
	}
	pick := at[0]
	if slices.Contains(at, n.Name) {
		pick = n.Name
	}
	if prev, ok := in.Bound[BindKey{Node: n.Name, Module: mod, Path: d.Binding}]; ok && slices.Contains(at, prev) {
		pick = prev
	}
	var b strings.Builder
	fmt.Fprintf(&b, "provider=%s\nname=%s.%s\nnode=%s\naddress=%s\n", d.Provider, d.Provider, in.Domain, pick, in.nameAddress(nodes[pick]))
	return b.String(), pick, nil
}

// providersFirst orders a node's modules so that a module comes after the
// modules on the same node it binds to or takes a credential from (so a
// provider that fails makes its consumers wait), otherwise by name. A cycle
// keeps name order.
func providersFirst(mods []string, cat map[string]*manifest.Manifest) []string {
	// Most nodes' modules take nothing from a module: their order is
	// mods's (by name), without the visit's map of every module.
	if !slices.ContainsFunc(mods, func(m string) bool {
		man := cat[m]
		return man != nil && (len(man.BindingProviders()) > 0 || len(man.CredentialProviders()) > 0)
	}) {
		return mods
	}
	// Each of mods is on the node, then being visited, then done.
	const (
		on = iota + 1
		visiting
		done
	)
	state := make(map[string]uint8, len(mods))
	for _, m := range mods {
		state[m] = on
	}
	out := make([]string, 0, len(mods))
	var visit func(m string)
	visit = func(m string) {
		if state[m] != on {
			return
		}
		state[m] = visiting
		if man, ok := cat[m]; ok {
			var deps []string
			for _, ps := range [][]string{man.BindingProviders(), man.CredentialProviders()} {
				for _, p := range ps {
					if state[p] != 0 && p != m {
						deps = append(deps, p)
					}
				}
			}
			sort.Strings(deps)
			for _, d := range deps {
				visit(d)
			}
		}
		state[m] = done
		out = append(out, m)
	}
	for _, m := range mods {
		visit(m)
	}
	return out
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
