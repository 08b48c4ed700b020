package state

import (
	"database/sql"
	"fmt"
	"iter"
	"maps"
	"os"
	"slices"
	"sort"
	"strings"

	"mesh/state/manifest"
)

// Incremental composition (issue "scale", docs/incremental-composition.md):
// a command that says what it touched recomposes only the nodes whose plans
// that can change, instead of every node of the fleet.

// checkComposition makes every incremental recomposition also compose the
// whole fleet in the same transaction and compare: every node's plan
// digest, composition error and bindings, and the roster. A difference is
// no rule a command broke but a gap in affected, and stops the node
// (applyLocked) rather than let replicas' plans drift from what a full
// composition gives. The state package's tests set it; beds set
// MESH_CHECK_COMPOSITION=1 for their agents.
var checkComposition = os.Getenv("MESH_CHECK_COMPOSITION") == "1"

// alwaysFull makes every command compose every node, as before
// incremental composition: bench/scale.sh measures both in one run.
var alwaysFull bool

// touches is what a command changed that plans read: nodes whose own
// inputs changed, and modules whose placement or credentials changed
// (every node that runs one, consumes one or provides one a credential
// recomposes; see affected).
type touches struct {
	nodes, modules map[string]bool
	// nodesOf are modules whose nodes recompose, without what reads them:
	// the providers a changed module took a credential from.
	nodesOf map[string]bool
}

// touchNodesOf records that the plans of the nodes running modules can
// change, for incremental composition.
func (ap *applier) touchNodesOf(modules ...string) {
	ap.touched.init()
	for _, m := range modules {
		ap.touched.nodesOf[m] = true
	}
}

// touch records that the command changed node's plan inputs (node may be
// "") and those of modules, for incremental composition.
func (ap *applier) touch(node string, modules ...string) {
	t := &ap.touched
	t.init()
	if node != "" {
		t.nodes[node] = true
	}
	for _, m := range modules {
		t.modules[m] = true
	}
}

// moduleScopedRequest is a request whose command changes one module's inputs
// only: its manifest (a revert, a rollout's step), its pulls, restarts or
// secrets, or which of its nodes run which of them (a rollout).
type moduleScopedRequest interface {
	scopedModule() string
}

func (r *ModulePullRequest) scopedModule() string    { return r.Module }
func (r *ModuleRestartRequest) scopedModule() string { return r.Module }
func (r *RolloutStepRequest) scopedModule() string   { return r.Module }
func (r *ModuleRevertRequest) scopedModule() string  { return r.Module }
func (r SecretRef) scopedModule() string             { return r.Module }

// scoped makes an op of a moduleScopedRequest compose the nodes whose
// plans it can change instead of every node: the module's nodes; and when
// its catalogue entry changed (a revert, or a rollout stopped with
// auto-revert, puts another version back), those affected by the module as
// by an assign (its consumers', its providers') and the nodes of the
// providers its manifest took a credential from before the command.
// checkComposition compares with a full composition after each.
func scoped(d opDef) opDef {
	apply := d.apply
	d.apply = func(ap *applier, r Request) (bool, error) {
		m := r.(moduleScopedRequest).scopedModule()
		cat, err := ap.catalogue()
		if err != nil {
			return false, err
		}
		was := cat[m] // the catalogue is edited in place: a new entry is a new pointer
		before := credentialProviders(was)
		recompose, err := apply(ap, r)
		if err != nil || !recompose {
			return recompose, err
		}
		if cat, err = ap.catalogue(); err != nil {
			return false, err
		}
		ap.incremental = true
		if cat[m] == was {
			// The same catalogue entry: what changed (a pull, a restart,
			// a secret's value, which nodes hold a version back) is read
			// by the module's own nodes only; other nodes read its
			// catalogue entry (consumers' credentials, a provider's
			// accepts-credentials directory) and where it runs.
			ap.touchNodesOf(m)
			return true, nil
		}
		ap.touch("", m)
		ap.touchNodesOf(before...)
		ap.touchNodesOf(credentialProviders(cat[m])...)
		return true, nil
	}
	return d
}

// nodeScopedRequest is a request whose command changes one node's own
// inputs: its public domains, its ACME account.
type nodeScopedRequest interface {
	scopedNode() string
}

func (r *PublicDomainRequest) scopedNode() string { return r.Node }
func (r *NodeACMERequest) scopedNode() string     { return r.Node }

// nodeScoped makes an op of a nodeScopedRequest compose that node alone
// (what other nodes' plans read of a node is its address, which neither
// changes).
func nodeScoped(d opDef) opDef {
	apply := d.apply
	d.apply = func(ap *applier, r Request) (bool, error) {
		recompose, err := apply(ap, r)
		if err != nil || !recompose {
			return recompose, err
		}
		ap.incremental = true
		ap.touch(r.(nodeScopedRequest).scopedNode())
		return true, nil
	}
	return d
}

func (t *touches) init() {
	if t.nodes == nil {
		t.nodes, t.modules, t.nodesOf = map[string]bool{}, map[string]bool{}, map[string]bool{}
	}
}

// catDeps is what the catalogue's modules read of each other: consumers
// lists, for each provider, the modules that bind to it or take a
// credential from it; credentials lists, for each consumer, the providers
// it takes a credential from. And for the rule on host names (edge.go):
// hosted lists, for each host a route names (hosts:), the modules that
// name it; routed, for each route name, the modules with a route of that
// name. A list may name a module twice.
type catDeps struct {
	consumers, credentials map[string][]string
	hosted, routed         map[string][]string
}

func newCatDeps() *catDeps {
	return &catDeps{consumers: map[string][]string{}, credentials: map[string][]string{}, hosted: map[string][]string{}, routed: map[string][]string{}}
}

func depsOf(cat map[string]*manifest.Manifest) *catDeps {
	d := newCatDeps()
	for name, m := range cat {
		d.addTo(name, m, false)
	}
	return d
}

// add puts what m (module name's manifest) reads of other modules in d, a
// clone's: the lists it appends to are copied first.
func (d *catDeps) add(name string, m *manifest.Manifest) { d.addTo(name, m, true) }

func (d *catDeps) addTo(name string, m *manifest.Manifest, shared bool) {
	if m == nil {
		return
	}
	for i := range m.Resources {
		r := &m.Resources[i]
		switch r.Kind() {
		case manifest.KindCredential:
			d.credentials[name] = appendTo(d.credentials[name], r.Provider, shared)
			fallthrough
		case manifest.KindBinding:
			d.consumers[r.Provider] = appendTo(d.consumers[r.Provider], name, shared)
		}
	}
	for _, r := range m.Routes {
		d.routed[r.Name] = appendTo(d.routed[r.Name], name, shared)
		for _, h := range r.Hosts {
			d.hosted[h] = appendTo(d.hosted[h], name, shared)
		}
	}
}

// appendTo appends x to list, into a copy when list is shared.
func appendTo(list []string, x string, shared bool) []string {
	if shared {
		list = slices.Clip(list)
	}
	return append(list, x)
}

// touchSecretRollouts records the nodes of every module whose secret rolls
// out: which of them keep the value before follows the nodes' sealing keys,
// and node.key, which changes one, composes nothing (a full recompose at
// the next command absorbed it, as this does).
func (ap *applier) touchSecretRollouts() error {
	var mods []string
	err := eachRow(ap.ctx, ap.q, "rollouts", `SELECT module FROM rollouts WHERE secret != '' AND state IN ('running', 'failed')`, func(rows *sql.Rows) error {
		var m string
		if err := rows.Scan(&m); err != nil {
			return err
		}
		mods = append(mods, m)
		return nil
	})
	if err == nil {
		ap.touchNodesOf(mods...)
	}
	return err
}

// credentialProviders lists the modules m takes a credential from.
func credentialProviders(m *manifest.Manifest) []string {
	if m == nil {
		return nil
	}
	var out []string
	for i := range m.Resources {
		if r := &m.Resources[i]; r.Kind() == manifest.KindCredential {
			out = append(out, r.Provider)
		}
	}
	return out
}

// affected is the set of nodes whose plans t can change, read from the
// input after the command: the nodes t names, and for each module it names,
// the nodes that run it, the nodes that run a module whose manifest (the
// catalogue's or one a rollout holds) binds to it or takes a credential
// from it (their binding's pick, their error), and the nodes that run a
// provider it takes a credential from (the provider's accepts-credentials
// directory lists the consumers assigned somewhere); and the nodes running
// the modules of t.nodesOf.
func affected(in Input, t touches, cat *catDeps) map[string]bool {
	set := map[string]bool{}
	for n := range t.nodes {
		set[n] = true
	}
	if len(t.modules) == 0 && len(t.nodesOf) == 0 {
		return set
	}
	// The few manifests rollouts hold, read as the catalogue's are.
	held := newCatDeps()
	for k, m := range in.Held {
		held.addTo(k.Module, m, false)
	}
	related := map[string]bool{}
	for m := range t.modules {
		related[m] = true
		for _, d := range []*catDeps{cat, held} {
			for _, c := range d.consumers[m] {
				related[c] = true
			}
			for _, p := range d.credentials[m] {
				related[p] = true
			}
		}
	}
	for m := range t.nodesOf {
		related[m] = true
	}
	for _, n := range nodesRunning(in, related) {
		set[n] = true
	}
	return set
}

// nodesRunning lists the nodes the input assigns any of modules to: from
// each module's assignments when the input indexes them (the FSM's), else
// with the assignments sorted by node, then module, and few modules, by
// looking each up in each node's run (by binary search) instead of
// walking every assignment of the fleet.
func nodesRunning(in Input, modules map[string]bool) []string {
	var out []string
	if in.assignedAt != nil {
		for m := range modules {
			for _, a := range in.assignedAt[m] {
				if !slices.Contains(out, a.Node) {
					out = append(out, a.Node)
				}
			}
		}
		return out
	}
	as := in.Assignments
	if !in.assignedByNode || len(modules)*len(in.Nodes) > len(as)/8 {
		for _, a := range as {
			if modules[a.Module] && !slices.Contains(out, a.Node) {
				out = append(out, a.Node)
			}
		}
		return out
	}
	return nodesRunningByRun(in, modules)
}

// nodeRun is node's run of as, sorted by node, then module.
func nodeRun(as []Assignment, node string) []Assignment {
	lo, _ := slices.BinarySearchFunc(as, node, func(a Assignment, n string) int { return strings.Compare(a.Node, n) })
	hi := lo + sort.Search(len(as)-lo, func(i int) bool { return as[lo+i].Node > node })
	return as[lo:hi]
}

// nodesRunningByRun is nodesRunning by binary search in each node's run of
// assignments, sorted by node, then module (in.assignedByNode).
func nodesRunningByRun(in Input, modules map[string]bool) []string {
	var out []string
	for _, n := range in.Nodes {
		run := nodeRun(in.Assignments, n.Name)
		for m := range modules {
			if _, ok := slices.BinarySearchFunc(run, m, func(a Assignment, m string) int { return strings.Compare(a.Module, m) }); ok {
				out = append(out, n.Name)
				break
			}
		}
	}
	return out
}

// replaceNames is the roster old with the names of the nodes in only
// replaced by mine (those nodes' names now, sorted as SortRoster sorts),
// and theirs, those nodes' names in old: one walk of old, which a command
// that recomposes a few nodes pays instead of sorting the whole roster
// again (mine is a few names).
func replaceNames(old []Name, only map[string]bool, mine []Name) (now, theirs []Name) {
	now = make([]Name, 0, len(old)+len(mine))
	// Comparing with each of a few nodes is cheaper than hashing every
	// name's node.
	var few []string
	if len(only) <= 8 {
		for n := range only {
			few = append(few, n)
		}
	}
	for _, x := range old {
		var in bool
		if len(only) <= 8 {
			in = slices.Contains(few, x.Node)
		} else {
			in = only[x.Node]
		}
		if in {
			theirs = append(theirs, x)
			continue
		}
		for len(mine) > 0 && RosterLess(mine[0], x) {
			now, mine = append(now, mine[0]), mine[1:]
		}
		now = append(now, x)
	}
	return append(now, mine...), theirs
}

// rosterByNode is the kept roster's rows split by node (each node's sorted
// as the roster is), for the roster it was built from: recompose finds
// the rows of the nodes it recomposed there instead of walking the whole
// roster (replaceNames), and splices the roster (spliceNames).
type rosterByNode struct {
	of *Roster
	by map[string][]Name
}

// splitByNode is roster's rows split by node.
func splitByNode(roster iter.Seq[Name]) map[string][]Name {
	by := map[string][]Name{}
	for x := range roster {
		by[x.Node] = append(by[x.Node], x)
	}
	return by
}

// theirNames is the rows of the nodes in only, sorted as the roster is.
func (r *rosterByNode) theirNames(only map[string]bool) []Name {
	var out []Name
	for n := range only {
		out = append(out, r.by[n]...)
	}
	SortRoster(out)
	return out
}

// edited is the index once the nodes in only have the rows mine (sorted),
// for the roster now.
func (r *rosterByNode) edited(now *Roster, only map[string]bool, mine []Name) *rosterByNode {
	by := maps.Clone(r.by)
	for n := range only {
		delete(by, n)
	}
	for _, x := range mine {
		by[x.Node] = append(by[x.Node], x)
	}
	return &rosterByNode{of: now, by: by}
}

// spliceNames is replaceNames with theirs (the rows of the recomposed nodes
// in old, sorted) known: old without theirs, with mine merged in, each
// found by binary search and the rows between copied whole.
func spliceNames(old, theirs, mine []Name) []Name {
	now := make([]Name, 0, len(old)-len(theirs)+len(mine))
	firstNotBefore := func(r []Name, x Name) int {
		return sort.Search(len(r), func(k int) bool { return !RosterLess(r[k], x) })
	}
	// merge appends chunk (rows of old kept) with the rows of mine that
	// sort before its end.
	merge := func(chunk []Name, last bool) {
		for len(mine) > 0 && len(chunk) > 0 {
			k := firstNotBefore(chunk, mine[0])
			now, chunk = append(now, chunk[:k]...), chunk[k:]
			if len(chunk) == 0 {
				break
			}
			now, mine = append(now, mine[0]), mine[1:]
		}
		now = append(now, chunk...)
		if last {
			now = append(now, mine...)
		}
	}
	i := 0
	for _, t := range theirs {
		// The rows of old before t, with those of mine before them (the
		// rows of mine after them and before t go with the next chunk).
		j := i + firstNotBefore(old[i:], t)
		merge(old[i:j], false)
		i = j
		if i < len(old) && old[i] == t {
			i++
		}
	}
	merge(old[i:], true)
	return now
}

// checkSplice compares what the index gave recompose with a walk of the
// whole roster (checkComposition): the recomposed nodes' rows before, the
// roster after, and the index after.
func checkSplice(old []Name, only map[string]bool, mine []Name, spliced Roster, theirs []Name, by *rosterByNode) error {
	want, wantTheirs := replaceNames(old, only, mine)
	roster := spliced.Names()
	if len(roster) != spliced.Len() {
		return fmt.Errorf("the roster spliced says it holds %d names, it holds %d", spliced.Len(), len(roster))
	}
	for i, run := range spliced.Runs() {
		if len(run) == 0 || len(run) > 2*rosterRun || cap(run) != len(run) {
			return fmt.Errorf("run %d of the roster spliced holds %d names (capacity %d): runs hold 1 to %d", i, len(run), cap(run), 2*rosterRun)
		}
	}
	if !slices.Equal(theirs, wantTheirs) {
		return fmt.Errorf("the recomposed nodes' names by the index (%d) are not those of the roster (%d)", len(theirs), len(wantTheirs))
	}
	if !slices.Equal(roster, want) {
		return fmt.Errorf("the roster spliced (%d names) is not the roster with the recomposed nodes' names replaced (%d)", len(roster), len(want))
	}
	split := splitByNode(slices.Values(roster))
	if len(split) != len(by.by) {
		return fmt.Errorf("the roster's index has %d nodes, the roster %d", len(by.by), len(split))
	}
	for n, rows := range split {
		if !slices.Equal(rows, by.by[n]) {
			return fmt.Errorf("the roster's index of %s has %d names, the roster %d", n, len(by.by[n]), len(rows))
		}
	}
	return nil
}

// rosterChangesAmong is RosterChanges(before, after) for a command that
// changed only some nodes' names: beforeMine and afterMine are those
// nodes' names in before and after (the rest of both is the same rows),
// or only those of their rows that differ (rosterDiff's removed and
// added: a row in both is in both rosters and changes nothing), all
// sorted as SortRoster sorts. Only their names can be added or
// removed, so each is looked up in the other roster by binary search
// instead of putting both rosters in maps; the changes and their order
// are RosterChanges's (TestRosterChangesAmong).
func rosterChangesAmong(before, after Roster, beforeMine, afterMine []Name) []NameChange {
	var out []NameChange
	for _, n := range afterMine {
		if !before.has(n) {
			out = append(out, NameChange{Op: "+", Name: n.Name, Address: n.Address, Node: n.Node})
		}
	}
	for _, n := range beforeMine {
		if !after.has(n) {
			out = append(out, NameChange{Op: "-", Name: n.Name, Address: n.Address, Node: n.Node})
		}
	}
	sort.SliceStable(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out
}

// rosterDiff is what changed from old to now, both sorted as SortRoster
// sorts and without duplicates: the names added and those removed.
func rosterDiff(old, now []Name) (added, removed []Name) {
	for len(old) > 0 || len(now) > 0 {
		switch {
		case len(old) == 0 || len(now) > 0 && RosterLess(now[0], old[0]):
			added, now = append(added, now[0]), now[1:]
		case len(now) == 0 || RosterLess(old[0], now[0]):
			removed, old = append(removed, old[0]), old[1:]
		default:
			old, now = old[1:], now[1:]
		}
	}
	return added, removed
}

// RosterLess orders names as SortRoster does: by name, then address,
// then node.
func RosterLess(x, y Name) bool {
	if x.Name != y.Name {
		return x.Name < y.Name
	}
	if x.Address != y.Address {
		return x.Address < y.Address
	}
	return x.Node < y.Node
}

// checkAgainstFull composes every node of in and compares with what the
// incremental recomposition of only left in the transaction: each node's
// composition error, its last plan's digest and its bindings, and roster
// (the roster it is about to write). See checkComposition.
func (ap *applier) checkAgainstFull(in Input, only map[string]bool, roster []Name) error {
	tx := ap.tx
	// Composed without the indexes the incremental composition reads
	// (which consumers each provider has, how many nodes run each
	// module): with the walks they replace.
	plain := in
	plain.consumers, plain.assignedAt = nil, nil
	full := Compose(plain)
	var want []Name
	want = append(want, full.Roster...)
	bound := map[BindKey]string{}
	err := eachRow(ap.ctx, tx, "bindings", `SELECT node, module, path, provider_node FROM bindings`, func(rows *sql.Rows) error {
		var k BindKey
		var p string
		if err := rows.Scan(&k.Node, &k.Module, &k.Path, &p); err != nil {
			return err
		}
		bound[k] = p
		return nil
	})
	if err != nil {
		return err
	}
	var diffs []string
	for _, n := range in.Nodes {
		var msg string
		if err := tx.QueryRow(`SELECT compose_error FROM nodes WHERE name = ?`, n.Name).Scan(&msg); err != nil {
			return fmt.Errorf("check the composition of %s: %w", n.Name, err)
		}
		if e, failed := full.Errors[n.Name]; failed {
			if msg != e {
				diffs = append(diffs, fmt.Sprintf("%s: error %q, a full composition says %q", n.Name, msg, e))
			}
			kept, err := nodeRoster(tx, n.Name)
			if err != nil {
				return err
			}
			want = append(want, kept...)
			continue
		}
		if msg != "" {
			diffs = append(diffs, fmt.Sprintf("%s: error %q, a full composition composes it", n.Name, msg))
		}
		var last string
		if err := tx.QueryRow(`SELECT digest FROM plans WHERE node = ? ORDER BY version DESC LIMIT 1`, n.Name).Scan(&last); err != nil {
			return fmt.Errorf("check the plan of %s: %w", n.Name, err)
		}
		if d := full.Plans[n.Name].Digest(); d != last {
			diffs = append(diffs, fmt.Sprintf("%s: plan %s, a full composition gives %s", n.Name, shortDigest(last), shortDigest(d)))
		}
		for k, p := range bound {
			if k.Node == n.Name && full.Bound[k] != p {
				diffs = append(diffs, fmt.Sprintf("%s: binding %s/%s to %s, a full composition picks %q", n.Name, k.Module, k.Path, p, full.Bound[k]))
			}
		}
		for k, p := range full.Bound {
			if _, ok := bound[k]; k.Node == n.Name && !ok {
				diffs = append(diffs, fmt.Sprintf("%s: no binding %s/%s, a full composition picks %s", n.Name, k.Module, k.Path, p))
			}
		}
	}
	SortRoster(want)
	want = slices.Compact(want)
	if !slices.Equal(want, roster) {
		diffs = append(diffs, fmt.Sprintf("roster of %d names, a full composition gives %d", len(roster), len(want)))
		for _, c := range RosterChanges(want, roster) {
			diffs = append(diffs, fmt.Sprintf("roster: %s %s %s (%s) against a full composition", c.Op, c.Name, c.Address, c.Node))
		}
	}
	if len(diffs) > 0 {
		var nodes []string
		for n := range only {
			nodes = append(nodes, n)
		}
		slices.Sort(nodes)
		return fmt.Errorf("incremental composition of %v differs from a full one: %s", nodes, strings.Join(diffs, "; "))
	}
	return nil
}

func shortDigest(d string) string {
	if len(d) > 12 {
		return d[:12]
	}
	return d
}
