package state

import (
	"cmp"
	"context"
	"crypto/x509"
	"database/sql"
	"encoding/pem"
	"errors"
	"fmt"
	"maps"
	"net/url"
	"regexp"
	"slices"
	"strings"

	"mesh/state/manifest"
)

// The public edge (issue 28): a node may serve several public domains, a
// route may name whole host names, and each node has the ACME settings its
// route proxy reads through its routes-file template. No certificate or key
// is ever in the state: the proxy gets them itself and keeps them in its
// own data directory.

// edgeFormat is the command format of the public edge: the node.acme op, a
// node.public-domain with several domains or --add/--remove, a manifest
// whose routes name hosts, and a restore that carries ACME settings.
const edgeFormat = 9

// OpNodeACME sets (or clears) a node's ACME settings.
const OpNodeACME = "node.acme"

// LetsEncrypt and LetsEncryptStaging are Let's Encrypt's ACME directories:
// the first is what a node's proxy uses when no directory is set.
const (
	LetsEncrypt        = "https://acme-v02.api.letsencrypt.org/directory"
	LetsEncryptStaging = "https://acme-staging-v02.api.letsencrypt.org/directory"
)

// MaxCARoot caps the PEM a node's --ca-root may hold.
const MaxCARoot = 64 << 10

// ACME is a node's ACME settings, as set by `mesh node acme`.
type ACME struct {
	// Directory is the ACME directory URL ("" is Let's Encrypt's).
	Directory string `json:"directory,omitempty"`
	// Email is the account's contact address ("" is none).
	Email string `json:"email,omitempty"`
	// CARoot is the PEM of the root that signs the directory's own HTTPS,
	// for a test CA such as Pebble ("" trusts the system's roots).
	CARoot string `json:"ca_root,omitempty"`
}

// NodeACMERequest sets a node's ACME settings; Clear puts back the defaults.
type NodeACMERequest struct {
	Node  string `json:"node"`
	ACME  ACME   `json:"acme"`
	Clear bool   `json:"clear,omitempty"`
}

func (*NodeACMERequest) Op() string { return OpNodeACME }
func (r *NodeACMERequest) describe() string {
	switch {
	case r.Clear:
		return "mesh node acme " + r.Node + " --clear"
	case r.ACME.Directory != "":
		return "mesh node acme " + r.Node + " --directory " + r.ACME.Directory
	}
	return "mesh node acme " + r.Node
}

// Check says what is wrong with a's values, if anything: the FSM's check,
// which reads characters and PEM's structure only (what the standard
// library's URL and certificate parsers accept moves between Go releases,
// and replicas built with two must agree). Each value is written into a
// proxy's configuration by a template, so each is printable ASCII with no
// space, quote, brace, backslash or newline: nothing that could end a
// directive or start a comment or a placeholder.
func (a ACME) Check() error {
	if d := a.Directory; d != "" {
		host, _, _ := strings.Cut(strings.TrimPrefix(d, "https://"), "/")
		if len(d) > 2048 || !strings.HasPrefix(d, "https://") || host == "" || !urlChars(d) {
			return ruleErr(ErrInvalid, "ACME directory %q is not an https URL, such as %s", d, LetsEncrypt)
		}
	}
	if e := a.Email; e != "" {
		local, domain, ok := strings.Cut(e, "@")
		if len(e) > 254 || !ok || local == "" || !strings.Contains(domain, ".") || !emailChars(local) || !emailChars(domain) || strings.ContainsRune(domain, '+') {
			return ruleErr(ErrInvalid, "ACME e-mail %q is not an address, such as ops@example.org", e)
		}
	}
	if a.CARoot != "" {
		if _, err := canonicalRoots(a.CARoot, false); err != nil {
			return ruleErr(ErrInvalid, "ACME CA root: %v", err)
		}
	}
	return nil
}

// CheckFull is Check and then the proposer's full parse: the directory as
// a URL, each certificate of the CA root as X.509.
func (a ACME) CheckFull() error {
	if err := a.Check(); err != nil {
		return err
	}
	if a.Directory != "" {
		if u, err := url.Parse(a.Directory); err != nil || u.Host == "" {
			return ruleErr(ErrInvalid, "ACME directory %q is not an https URL, such as %s", a.Directory, LetsEncrypt)
		}
	}
	if a.CARoot != "" {
		if _, err := canonicalRoots(a.CARoot, true); err != nil {
			return ruleErr(ErrInvalid, "ACME CA root: %v", err)
		}
	}
	return nil
}

// urlChars: RFC 3986's characters, no quote, brace or backslash.
func urlChars(s string) bool {
	for _, c := range []byte(s) {
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || strings.IndexByte("-._~:/?#[]@!$&()*+,;=%", c) >= 0) {
			return false
		}
	}
	return true
}

// emailChars: letters, digits and . _ % + -, what addresses use.
func emailChars(s string) bool {
	for _, c := range []byte(s) {
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || strings.IndexByte("._%+-", c) >= 0) {
			return false
		}
	}
	return true
}

// canonicalRoots reads pemText as one or more PEM certificates and nothing
// else, and returns them encoded afresh (so text pem.Decode would skip
// between blocks never reaches the proxy's file); parse also parses each as
// X.509 (the proposer's check, never the FSM's).
func canonicalRoots(pemText string, parse bool) (string, error) {
	if len(pemText) > MaxCARoot {
		return "", fmt.Errorf("%d bytes; the limit is %d", len(pemText), MaxCARoot)
	}
	notPEM := fmt.Errorf("is not PEM certificates (give the file that starts with -----BEGIN CERTIFICATE-----)")
	rest, out := []byte(pemText), []byte(nil)
	for n := 1; ; n++ {
		if t := strings.TrimSpace(string(rest)); t == "" {
			break
		} else if !strings.HasPrefix(t, "-----BEGIN ") {
			return "", notPEM
		}
		var b *pem.Block
		b, rest = pem.Decode(rest)
		if b == nil {
			return "", notPEM
		}
		if b.Type != "CERTIFICATE" || len(b.Headers) > 0 {
			return "", fmt.Errorf("holds a %s block; give certificates only", b.Type)
		}
		if parse {
			if _, err := x509.ParseCertificate(b.Bytes); err != nil {
				return "", fmt.Errorf("certificate %d does not parse: %v", n, err)
			}
		}
		out = append(out, pem.EncodeToMemory(b)...)
	}
	if len(out) == 0 {
		return "", notPEM
	}
	return string(out), nil
}

func (ap *applier) nodeACME(r *NodeACMERequest) (bool, error) {
	if err := needNode(ap.tx, r.Node); err != nil {
		return false, err
	}
	a := r.ACME
	if r.Clear {
		a = ACME{}
	} else if err := a.Check(); err != nil {
		return false, err
	} else if a.CARoot != "" {
		a.CARoot, _ = canonicalRoots(a.CARoot, false)
	}
	return true, exec(ap.tx, `UPDATE nodes SET acme_directory = ?, acme_email = ?, acme_ca_root = ? WHERE name = ?`, a.Directory, a.Email, a.CARoot, r.Node)
}

// splitDomains splits the public_domain column: the node's public domains, the
// first one the node's primary (what .Domain gives a template).
func splitDomains(col string) []string { return strings.Fields(col) }

// splitDomains turns PublicDomain as read from the nodes table (every
// domain, space-separated) into PublicDomains and the first of them.
func (n *Node) splitDomains() {
	n.PublicDomains = splitDomains(n.PublicDomain)
	n.PublicDomain = ""
	if len(n.PublicDomains) > 0 {
		n.PublicDomain = n.PublicDomains[0]
	}
}

// Domains is every public domain of n: PublicDomains, or PublicDomain
// alone for a Node made without the list.
func (n Node) Domains() []string {
	if len(n.PublicDomains) == 0 && n.PublicDomain != "" {
		return []string{n.PublicDomain}
	}
	return n.PublicDomains
}

// changeDomains is what node.public-domain makes of a node's domains.
func (r *PublicDomainRequest) changeDomains(have []string) ([]string, error) {
	if len(r.Domains) > 0 && (len(r.Add) > 0 || len(r.Remove) > 0) {
		return nil, ruleErr(ErrInvalid, "give the node's domains, or domains to add or remove, not both")
	}
	var want []string
	switch {
	case len(r.Domains) > 0 || (len(r.Add) == 0 && len(r.Remove) == 0):
		want = r.Domains
		if len(want) == 0 && r.Domain != "" {
			want = []string{r.Domain}
		}
	default:
		want = slices.Clone(have)
		for _, d := range r.Add {
			if !slices.Contains(want, d) {
				want = append(want, d)
			}
		}
		for _, d := range r.Remove {
			i := slices.Index(want, d)
			if i < 0 {
				return nil, ruleErr(ErrNotFound, "node %s does not serve %s (it serves %s)", r.Node, d, orNone(have))
			}
			want = slices.Delete(want, i, i+1)
		}
	}
	seen := map[string]bool{}
	for _, d := range want {
		if !validDomain(d) {
			return nil, ruleErr(ErrInvalid, "%q is not a domain name", d)
		}
		if seen[d] {
			return nil, ruleErr(ErrInvalid, "domain %s is given twice", d)
		}
		seen[d] = true
	}
	if len(want) > 16 {
		return nil, ruleErr(ErrInvalid, "%d public domains; a node may serve 16", len(want))
	}
	return want, nil
}

func orNone(ds []string) string {
	if len(ds) == 0 {
		return "none"
	}
	return strings.Join(ds, ", ")
}

// routeHosts is every host name route r of a module is served at on a node
// with the public domains ds: NAME under each domain, then its own hosts.
// With no domain and no host, it is NAME alone (a routing table's entry
// that no resolver answers, as before several domains).
func routeHosts(r manifest.Route, ds []string) []string {
	var hs []string
	for _, d := range ds {
		hs = append(hs, r.Name+"."+d)
	}
	hs = append(hs, r.Hosts...)
	if len(hs) == 0 {
		hs = []string{r.Name}
	}
	return hs
}

// hostClashes lists, sorted, what breaks the rule on host names: a host two
// modules are served at (explicit hosts whether assigned or not: two
// manifests claim one name; names under a domain where their modules are
// assigned), a host one module claims for two ports, and an explicit host
// under the mesh's own domain (whose names are the mesh's). The same route
// of one module at a name twice (a label under a domain that is also one
// of its hosts), or on several nodes, is no clash.
func hostClashes(in Input) []string { return hostClashesAmong(in, nil) }

// hostClashesAmong is hostClashes about the hosts in only (every host when
// only is nil): the same sentences, for each host the same claims in the
// same order (a sentence names the host's first claim). Restricted, it
// sorts only the claims on those hosts, not every module and assignment of
// the fleet (a module add at 10,000 modules checked the rule in 20 ms).
func hostClashesAmong(in Input, only map[string]bool) []string {
	type claim struct {
		module string
		port   int
	}
	owner := map[string]claim{}
	found := map[string]bool{}
	add := func(h string, c claim) {
		o, ok := owner[h]
		switch {
		case !ok:
			owner[h] = c
		case o == c:
		case o.module == c.module:
			found[fmt.Sprintf("host %s is claimed twice by module %s (ports %d and %d); keep one", h, c.module, min(o.port, c.port), max(o.port, c.port))] = true
		default:
			a, b := min(o.module, c.module), max(o.module, c.module)
			found[fmt.Sprintf("host %s is claimed by both %s and %s; remove it from one of them", h, a, b)] = true
		}
	}
	explicit := func(mod, h string, port int) {
		if d := in.Domain; d != "" && (h == d || strings.HasSuffix(h, "."+d)) {
			found[fmt.Sprintf("host %s of module %s is under the mesh's own domain %s, whose names are the mesh's; name a public host", h, mod, d)] = true
		}
		add(h, claim{mod, port})
	}
	domains := domainsByNode(in)
	as := in.Assignments
	byNode := func(x, y Assignment) int { return cmp.Or(cmp.Compare(x.Node, y.Node), cmp.Compare(x.Module, y.Module)) }
	// Checked, not taken from in.assignedByNode: the proposer's check adds
	// a command's assignments at the end of a sorted input (CheckHosts),
	// and the first claim on a host is what each sentence names.
	if !slices.IsSortedFunc(as, byNode) {
		as = slices.Clone(as)
		slices.SortFunc(as, byNode)
	}
	// under adds the names under the nodes' domains of the modules of ms
	// (about only), by node, then module.
	under := func(ms map[string]*manifest.Manifest) {
		for _, a := range as {
			m, ok := ms[a.Module]
			if !ok {
				continue
			}
			for _, r := range m.Routes {
				for _, d := range domains[a.Node] {
					if h := r.Name + "." + d; only == nil || only[h] {
						add(h, claim{a.Module, r.Port})
					}
				}
			}
		}
	}
	if only == nil {
		// The explicit hosts first, by module, then as each module lists
		// them; then the names under the nodes' domains.
		for _, mod := range slices.Sorted(maps.Keys(in.Modules)) {
			for _, r := range in.Modules[mod].Routes {
				for _, h := range r.Hosts {
					explicit(mod, h, r.Port)
				}
			}
		}
		under(in.Modules)
		return slices.Sorted(maps.Keys(found))
	}
	// The same claims on the hosts of only, in the same order: the
	// explicit ones found in one walk of the catalogue, with the modules
	// that have a route whose name under a domain can be one of them (its
	// name is what a host of only has before one of its dots).
	labels := map[string]bool{}
	for h := range only {
		for i := range len(h) {
			if h[i] == '.' {
				labels[h[:i]] = true
			}
		}
	}
	type listed struct {
		mod  string
		i    int
		host string
		port int
	}
	var ls []listed
	named := map[string]*manifest.Manifest{}
	list := func(mod string, m *manifest.Manifest) {
		i := 0
		for _, r := range m.Routes {
			if labels[r.Name] {
				named[mod] = m
			}
			for _, h := range r.Hosts {
				if only[h] {
					ls = append(ls, listed{mod, i, h, r.Port})
				}
				i++
			}
		}
	}
	if idx := in.hostIndex; idx != nil {
		// The modules the index says name a host of only or a route of
		// one of the labels, not the whole catalogue.
		some := map[string]bool{}
		for h := range only {
			for _, mod := range idx.hosted[h] {
				some[mod] = true
			}
		}
		for l := range labels {
			for _, mod := range idx.routed[l] {
				some[mod] = true
			}
		}
		for mod := range some {
			if m := in.Modules[mod]; m != nil {
				list(mod, m)
			}
		}
	} else {
		for mod, m := range in.Modules {
			list(mod, m)
		}
	}
	slices.SortFunc(ls, func(a, b listed) int { return cmp.Or(cmp.Compare(a.mod, b.mod), cmp.Compare(a.i, b.i)) })
	for _, l := range ls {
		explicit(l.mod, l.host, l.port)
	}
	if len(named) > 0 {
		under(named)
	}
	return slices.Sorted(maps.Keys(found))
}

// hostsAssigned adds to hosts the names under the domains of each node of
// as that its module's routes claim there.
func hostsAssigned(in Input, hosts map[string]bool, as []Assignment) {
	domains := domainsByNode(in)
	for _, a := range as {
		m := in.Modules[a.Module]
		if m == nil {
			continue
		}
		for _, r := range m.Routes {
			for _, d := range domains[a.Node] {
				hosts[r.Name+"."+d] = true
			}
		}
	}
}

// domainsByNode is each node's public domains.
func domainsByNode(in Input) map[string][]string {
	domains := make(map[string][]string, len(in.Nodes))
	for _, n := range in.Nodes {
		domains[n.Name] = n.Domains()
	}
	return domains
}

// hostsClaimed adds to hosts every host the manifests ms claim, named
// explicitly or under the domains of the nodes their module is assigned to
// in in.
func hostsClaimed(in Input, hosts map[string]bool, ms ...*manifest.Manifest) {
	domains := domainsByNode(in)
	for _, m := range ms {
		if m == nil {
			continue
		}
		for _, r := range m.Routes {
			for _, h := range r.Hosts {
				hosts[h] = true
			}
		}
		for _, a := range in.Assignments {
			if a.Module != m.Module {
				continue
			}
			for _, r := range m.Routes {
				for _, d := range domains[a.Node] {
					hosts[r.Name+"."+d] = true
				}
			}
		}
	}
}

// newClash is the first of after that before lacks, as a rule error: a
// command is refused for what it breaks, not for a clash older than it.
func newClash(before, after []string) error {
	for _, c := range after {
		if !slices.Contains(before, c) {
			return ruleErr(ErrConflict, "%s", c)
		}
	}
	return nil
}

// hostRule is what the rule on host names reads in the command's
// transaction, or nil for a command older than the rule (format 9): a
// replica applies those as the binaries that wrote them did, and their
// proposer checked (Store.CheckHosts).
func (ap *applier) hostRule() (*Input, error) {
	if ap.v < edgeFormat {
		return nil, nil
	}
	cat, err := ap.catalogue()
	if err != nil {
		return nil, err
	}
	assigned, err := ap.assignmentsFor()
	if err != nil {
		return nil, err
	}
	in, err := ap.input(cat, assigned, ap.assignedIndex())
	if err != nil {
		return nil, err
	}
	in.hostIndex = ap.deps(cat)
	return &in, nil
}

// hostsBefore is the clashes before the command writes (nil when the rule
// does not hold for it).
func (ap *applier) hostsBefore() ([]string, error) {
	in, err := ap.hostRule()
	if in == nil || err != nil {
		return nil, err
	}
	return hostClashes(*in), nil
}

// checkHosts refuses the command if, written, it breaks the rule on host
// names in a way the state before it (before) did not.
func (ap *applier) checkHosts(before []string) error { return ap.checkHostsAmong(before, nil) }

// checkHostsAmong is checkHosts about the hosts in only (nil: every host),
// where before is about them too.
func (ap *applier) checkHostsAmong(before []string, only map[string]bool) error {
	in, err := ap.hostRule()
	if in == nil || err != nil {
		return err
	}
	broken := newClash(before, hostClashesAmong(*in, only))
	if checkComposition && only != nil {
		whole := newClash(ap.clashesBefore, hostClashes(*in))
		if fmt.Sprint(whole) != fmt.Sprint(broken) {
			return fmt.Errorf("the rule on host names about the command's hosts %v says %v, about every host %v", slices.Sorted(maps.Keys(only)), broken, whole)
		}
	}
	return broken
}

// assignHostsBefore is hostsBefore for a batch assign of as: about the
// names under the domains of each node of as that its module's routes
// claim there, the only claims an assign adds (FuzzHostClashesAmong).
func (ap *applier) assignHostsBefore(as []Assignment) (clashes []string, hosts map[string]bool, err error) {
	in, err := ap.hostRule()
	if in == nil || err != nil {
		return nil, nil, err
	}
	hosts = map[string]bool{}
	hostsAssigned(*in, hosts, as)
	if checkComposition {
		ap.clashesBefore = hostClashes(*in)
	}
	return hostClashesAmong(*in, hosts), hosts, nil
}

// moduleHostsBefore is hostsBefore for a module add of specs: about the
// hosts its modules claim, before it or after it (hosts). Every clash the
// command can make is about one of them: any other host has the same
// claims, in the same order, before and after (a module add changes no
// assignment and no domain), so the same sentences; and a clash about them
// is in the whole check's list exactly when it is in this one
// (FuzzHostClashesAmong compares both with the whole check). nil when the
// rule does not hold for the command.
func (ap *applier) moduleHostsBefore(specs []ModuleSpec) (clashes []string, hosts map[string]bool, err error) {
	in, err := ap.hostRule()
	if in == nil || err != nil {
		return nil, nil, err
	}
	hosts = map[string]bool{}
	for i := range specs {
		if m := specs[i].Manifest; m != nil {
			hostsClaimed(*in, hosts, in.Modules[m.Module], m)
		}
	}
	if checkComposition {
		ap.clashesBefore = hostClashes(*in)
	}
	return hostClashesAmong(*in, hosts), hosts, nil
}

// CheckHosts is the proposer's check of the rule on host names for req (an
// assign, a module add, a public domain), against this replica: every
// command is checked here, including those of formats older than the
// rule, which the FSM applies without it.
func (s *Store) CheckHosts(ctx context.Context, req Request) error {
	cat, err := s.publishedCatalogue(ctx)
	if err != nil {
		return err
	}
	in, err := input(ctx, s.db, cat)
	if errors.Is(err, sql.ErrNoRows) {
		return nil // not initialised: the FSM refuses it, saying so
	} else if err != nil {
		return err
	}
	before := hostClashes(in)
	switch r := req.(type) {
	case *AssignRequest:
		in.Assignments = append(slices.Clone(in.Assignments), r.All()...)
		in.assignedByNode = false
	case *ModuleAddRequest:
		in.Modules = maps.Clone(in.Modules)
		for _, sp := range r.Modules {
			if sp.Manifest != nil {
				in.Modules[sp.Manifest.Module] = sp.Manifest
			}
		}
	case *PublicDomainRequest:
		i := slices.IndexFunc(in.Nodes, func(n Node) bool { return n.Name == r.Node })
		if i < 0 {
			return nil // an unknown node: the FSM refuses it, naming those there are
		}
		have := in.Nodes[i].Domains()
		want, err := r.changeDomains(have)
		if err != nil {
			return err
		}
		// Under the mesh's own domain, NAME.DOMAIN of a route could be a
		// node's or a module's mesh name, and take part of its traffic (a
		// domain the node already has may stay, so it can be removed).
		for _, d := range want {
			if md := in.Domain; md != "" && (d == md || strings.HasSuffix(d, "."+md)) && !slices.Contains(have, d) {
				return ruleErr(ErrInvalid, "public domain %s is under the mesh's own domain %s, whose names are the mesh's (a route could take a node's or a module's name); give a domain outside it", d, md)
			}
		}
		in.Nodes = slices.Clone(in.Nodes)
		in.Nodes[i].PublicDomain, in.Nodes[i].PublicDomains = "", want
	default:
		return nil
	}
	return newClash(before, hostClashes(in))
}

// manifestNeedsEdge says m uses what format 9 added: a route's hosts, or
// a routes-file template that reads .ACME, .Domains or .Public (a replica
// of an older binary would fail to execute it, and hold another plan).
func manifestNeedsEdge(m *manifest.Manifest) bool {
	for _, r := range m.Routes {
		if len(r.Hosts) > 0 {
			return true
		}
	}
	for _, r := range m.Resources {
		if r.Template != "" && edgeFields.MatchString(r.Template) {
			return true
		}
	}
	return false
}

// edgeFields finds a template's use of the fields format 9 added (a
// false match only asks for the newer format).
var edgeFields = regexp.MustCompile(`\.(ACME|Domains|Public)\b`)
