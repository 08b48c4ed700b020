package state

import (
	"context"
	"crypto/x509"
	"encoding/pem"
	"fmt"
	"net/url"
	"slices"
	"sort"
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
	if r.Clear {
		return "mesh node acme " + r.Node + " --clear"
	}
	return "mesh node acme " + r.Node + " --directory " + r.ACME.Directory
}

// Check says what is wrong with a's values, if anything. Each value is
// written into a proxy's configuration by a template, so none may carry a
// character that would end a directive (space, quote, brace, newline).
func (a ACME) Check() error {
	if a.Directory != "" {
		u, err := url.Parse(a.Directory)
		if err != nil || u.Scheme != "https" || u.Host == "" || strings.ContainsAny(a.Directory, " \t\r\n\"'{}`\\") {
			return ruleErr(ErrInvalid, "ACME directory %q is not an https URL, such as %s", a.Directory, LetsEncrypt)
		}
	}
	if a.Email != "" {
		at := strings.IndexByte(a.Email, '@')
		if len(a.Email) > 254 || at < 1 || at == len(a.Email)-1 || strings.ContainsAny(a.Email, " \t\r\n\"'{}`\\<>;,") {
			return ruleErr(ErrInvalid, "ACME e-mail %q is not an address, such as ops@example.org", a.Email)
		}
	}
	if a.CARoot != "" {
		if _, err := canonicalRoots(a.CARoot); err != nil {
			return ruleErr(ErrInvalid, "ACME CA root: %v", err)
		}
	}
	return nil
}

// canonicalRoots reads pemText as one or more PEM certificates and nothing
// else, and returns them encoded afresh (so text pem.Decode would skip
// between blocks never reaches the proxy's file).
func canonicalRoots(pemText string) (string, error) {
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
		if _, err := x509.ParseCertificate(b.Bytes); err != nil {
			return "", fmt.Errorf("certificate %d does not parse: %v", n, err)
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
		a.CARoot, _ = canonicalRoots(a.CARoot)
	}
	return true, exec(ap.tx, `UPDATE nodes SET acme_directory = ?, acme_email = ?, acme_ca_root = ? WHERE name = ?`, a.Directory, a.Email, a.CARoot, r.Node)
}

// splitDomains splits the public_domain column: the node's public domains, the
// first one the node's primary (what .Domain gives a template).
func splitDomains(col string) []string { return strings.Fields(col) }

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

// hostClash finds a host name two modules are served at, with the
// catalogue cat, the assignments and every node's domains: explicit hosts
// clash whether assigned or not (two manifests claim one name), names
// under a domain only where both modules are assigned. It returns the
// first clash by host name, as an error naming both modules.
func hostClash(cat map[string]*manifest.Manifest, as []Assignment, domains map[string][]string) error {
	owner := map[string]string{}
	var clash []string
	claim := func(h, mod string) {
		if o, ok := owner[h]; ok && o != mod {
			if o > mod {
				o, mod = mod, o
			}
			clash = append(clash, fmt.Sprintf("host %s is claimed by both %s and %s; remove it from one of them", h, o, mod))
			return
		}
		owner[h] = mod
	}
	mods := make([]string, 0, len(cat))
	for m := range cat {
		mods = append(mods, m)
	}
	sort.Strings(mods)
	for _, mod := range mods {
		for _, r := range cat[mod].Routes {
			for _, h := range r.Hosts {
				claim(h, mod)
			}
		}
	}
	for _, a := range as {
		m, ok := cat[a.Module]
		if !ok {
			continue
		}
		for _, r := range m.Routes {
			for _, d := range domains[a.Node] {
				claim(r.Name+"."+d, a.Module)
			}
		}
	}
	if len(clash) == 0 {
		return nil
	}
	sort.Strings(clash)
	return ruleErr(ErrConflict, "%s", clash[0])
}

// checkHosts refuses the command being applied if, with it, two modules
// would be served at one host name.
func (ap *applier) checkHosts() error {
	cat, err := ap.catalogue()
	if err != nil {
		return err
	}
	as, err := readAssignments(ap.ctx, ap.tx)
	if err != nil {
		return err
	}
	domains := map[string][]string{}
	rows, err := ap.tx.Query(`SELECT name, public_domain FROM nodes`)
	if err != nil {
		return err
	}
	defer rows.Close()
	for rows.Next() {
		var n, d string
		if err := rows.Scan(&n, &d); err != nil {
			return err
		}
		domains[n] = splitDomains(d)
	}
	if err := rows.Err(); err != nil {
		return err
	}
	return hostClash(cat, as, domains)
}

func readAssignments(ctx context.Context, q queryer) ([]Assignment, error) {
	rows, err := q.QueryContext(ctx, `SELECT node, module, seq FROM assignments ORDER BY node, module`)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var as []Assignment
	for rows.Next() {
		var a Assignment
		if err := rows.Scan(&a.Node, &a.Module, &a.Seq); err != nil {
			return nil, err
		}
		as = append(as, a)
	}
	return as, rows.Err()
}

func manifestNamesHosts(m *manifest.Manifest) bool {
	for _, r := range m.Routes {
		if len(r.Hosts) > 0 {
			return true
		}
	}
	return false
}
