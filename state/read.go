package state

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync/atomic"
	"time"

	"mesh/state/manifest"
)

// NodeInfo is a node as `mesh node list` and `mesh status` show it.
type NodeInfo struct {
	Node
	AddedAt      time.Time `json:"added_at"`
	ComposeError string    `json:"compose_error,omitempty"`
	// CertExpires is when the node's certificate expires, as the node last
	// said (it renews it a third of its life before).
	CertExpires *time.Time `json:"cert_expires,omitempty"`
	// CertKey is the digest of the public key of the node's certificate
	// (hex SHA-256 of its SubjectPublicKeyInfo), "" until the node or the
	// leader that admitted it recorded it. Its peers refuse a certificate
	// for its name with another key.
	CertKey string `json:"cert_key,omitempty"`
	// CertCA is the digest of the CA that signed it, as the node last said.
	CertCA string `json:"cert_ca,omitempty"`
	// Draining: `mesh node drain` marked it; it takes no new module.
	Draining bool `json:"draining,omitempty"`
}

// ModuleInfo is a catalogue entry.
type ModuleInfo struct {
	Name     string    `json:"name"`
	File     string    `json:"file"`
	Digest   string    `json:"digest"`
	Version  uint64    `json:"version"`
	AddedAt  time.Time `json:"added_at"`
	Manifest string    `json:"manifest,omitempty"`
	Nodes    []string  `json:"nodes"`
}

// PlanVersion is one recorded version of a node's plan.
type PlanVersion struct {
	Node      string    `json:"node"`
	Version   uint64    `json:"version"`
	Digest    string    `json:"digest"`
	Cause     string    `json:"cause"`
	CreatedAt time.Time `json:"created_at"`
	Plan      *Plan     `json:"plan,omitempty"`
}

// Settings are the mesh-wide values set at init.
type Settings struct {
	MeshID    string `json:"mesh_id"`
	Domain    string `json:"domain"`
	CreatedAt string `json:"created_at"`
	// Overlay is the mesh's overlay prefix, OverlayOff, or "" (overlay.go).
	Overlay string `json:"overlay,omitempty"`
}

// settings reads the settings table; ErrNotFound before init.
func (s *Store) settings(ctx context.Context) (map[string]string, error) {
	return readSettings(ctx, s.db)
}

func readSettings(ctx context.Context, q queryer) (map[string]string, error) {
	rows, err := q.QueryContext(ctx, `SELECT key, value FROM settings`)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	kv := map[string]string{}
	for rows.Next() {
		var k, v string
		if err := rows.Scan(&k, &v); err != nil {
			return nil, err
		}
		kv[k] = v
	}
	if err := rows.Err(); err != nil {
		return nil, err
	}
	if kv["mesh_id"] == "" {
		return nil, ruleErr(ErrNotFound, "the mesh is not initialised")
	}
	return kv, nil
}

// Settings reads the mesh id and domain; ErrNotFound before init.
func (s *Store) Settings(ctx context.Context) (Settings, error) {
	kv, err := s.settings(ctx)
	if err != nil {
		return Settings{}, err
	}
	return Settings{MeshID: kv["mesh_id"], Domain: kv["domain"], CreatedAt: kv["created_at"], Overlay: kv["overlay"]}, nil
}

func readNodes(ctx context.Context, q queryer) ([]NodeInfo, error) {
	query := `SELECT name, address, public_domain, voter, added_at, compose_error, port, seal_key, cert_expires, cert_key, overlay_key, overlay_endpoint, overlay_address, cert_ca, acme_directory, acme_email, acme_ca_root, draining FROM nodes ORDER BY name`
	rows, err := q.QueryContext(ctx, query)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var out []NodeInfo
	for rows.Next() {
		var n NodeInfo
		var at, exp string
		if err := rows.Scan(&n.Name, &n.Address, &n.PublicDomain, &n.Voter, &at, &n.ComposeError, &n.Port, &n.SealKey, &exp, &n.CertKey, &n.OverlayKey, &n.OverlayEndpoint, &n.OverlayAddress, &n.CertCA, &n.ACME.Directory, &n.ACME.Email, &n.ACME.CARoot, &n.Draining); err != nil {
			return nil, err
		}
		n.Node.splitDomains()
		n.AddedAt, _ = time.Parse(timeLayout, at)
		if t, err := time.Parse(timeLayout, exp); err == nil {
			n.CertExpires = &t
		}
		out = append(out, n)
	}
	return out, rows.Err()
}

// readComposeNodes is readNodes's Node part alone, which composition
// reads: the nodes' certificates, times and states are no input of a
// plan, and reading them was most of reading the table on every command.
func readComposeNodes(ctx context.Context, q queryer) ([]Node, error) {
	rows, err := q.QueryContext(ctx, `SELECT name, address, public_domain, voter, port, seal_key, overlay_key, overlay_endpoint, overlay_address, acme_directory, acme_email, acme_ca_root FROM nodes ORDER BY name`)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	// Sized as the last read was, and each row read in place: every
	// command reads the table, and growing it by appends of rows read
	// apart was 130 kB of garbage per command in a fleet of 100 nodes.
	out := make([]Node, 0, composeNodesRead.Load())
	for rows.Next() {
		out = append(out, Node{})
		n := &out[len(out)-1]
		if err := rows.Scan(&n.Name, &n.Address, &n.PublicDomain, &n.Voter, &n.Port, &n.SealKey, &n.OverlayKey, &n.OverlayEndpoint, &n.OverlayAddress, &n.ACME.Directory, &n.ACME.Email, &n.ACME.CARoot); err != nil {
			return nil, err
		}
		n.splitDomains()
	}
	composeNodesRead.Store(int64(len(out)))
	return out, rows.Err()
}

// composeNodesRead is how many nodes readComposeNodes read last.
var composeNodesRead atomic.Int64

// Nodes lists the nodes by name. It reads the table once per change of the
// replica (notify forgets it): the peer API names every request's caller by
// it, and liveness and every write read it whole, many times a second in a
// fleet of fifty (a fresh SQLite statement each time, the most of a node's
// idle CPU there; issue "scale", bench/fleet.sh). A read that a commit
// overtook is returned but not kept.
func (s *Store) Nodes(ctx context.Context) ([]NodeInfo, error) {
	s.mu.Lock()
	gen, kept := s.gen, s.nodes
	s.mu.Unlock()
	if kept != nil {
		return cloneNodes(kept), nil
	}
	out, err := readNodes(ctx, s.db)
	if err != nil {
		return nil, err
	}
	s.mu.Lock()
	if s.gen == gen {
		s.nodes = cloneNodes(out)
	}
	s.mu.Unlock()
	return out, nil
}

// cloneNodes copies nodes down to their slices and pointers: a caller may
// change what it was given.
func cloneNodes(nodes []NodeInfo) []NodeInfo {
	out := slices.Clone(nodes)
	if out == nil {
		out = []NodeInfo{}
	}
	for i := range out {
		out[i].PublicDomains = slices.Clone(out[i].PublicDomains)
		if e := out[i].CertExpires; e != nil {
			t := *e
			out[i].CertExpires = &t
		}
	}
	return out
}

// Node reads one node, or ErrNotFound with the names that exist.
func (s *Store) Node(ctx context.Context, name string) (NodeInfo, error) {
	nodes, err := s.Nodes(ctx)
	if err != nil {
		return NodeInfo{}, err
	}
	var names []string
	for _, n := range nodes {
		if n.Name == name {
			return n, nil
		}
		names = append(names, n.Name)
	}
	return NodeInfo{}, ruleErr(ErrNotFound, "node %q is not in the mesh (known: %s)", name, joinOr(names, "none"))
}

// Modules lists the catalogue, with where each module is assigned: two
// reads merged (a join grouped per module cost a scan of the assignments
// per module).
func (s *Store) Modules(ctx context.Context) ([]ModuleInfo, error) {
	return s.modules(ctx, "")
}

// modules lists the catalogue, or only the module named only.
func (s *Store) modules(ctx context.Context, only string) ([]ModuleInfo, error) {
	where, args := "", []any{}
	if only != "" {
		where, args = ` WHERE name = ?`, []any{only}
	}
	rows, err := s.db.QueryContext(ctx, `SELECT name, file, digest, version, added_at FROM modules`+where+` ORDER BY name`, args...)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var out []ModuleInfo
	at := map[string]int{}
	for rows.Next() {
		var m ModuleInfo
		var added string
		if err := rows.Scan(&m.Name, &m.File, &m.Digest, &m.Version, &added); err != nil {
			return nil, err
		}
		m.AddedAt, _ = time.Parse(timeLayout, added)
		at[m.Name] = len(out)
		out = append(out, m)
	}
	if err := rows.Err(); err != nil {
		return nil, err
	}
	where = ""
	if only != "" {
		where = ` WHERE module = ?`
	}
	arows, err := s.db.QueryContext(ctx, `SELECT module, node FROM assignments`+where+` ORDER BY module, node`, args...)
	if err != nil {
		return nil, err
	}
	defer arows.Close()
	for arows.Next() {
		var mod, node string
		if err := arows.Scan(&mod, &node); err != nil {
			return nil, err
		}
		if i, ok := at[mod]; ok {
			out[i].Nodes = append(out[i].Nodes, node)
		}
	}
	return out, arows.Err()
}

// Module reads one catalogue entry with its manifest text.
func (s *Store) Module(ctx context.Context, name string) (ModuleInfo, error) {
	one, err := s.modules(ctx, name)
	if err != nil {
		return ModuleInfo{}, err
	}
	if len(one) == 1 {
		m := one[0]
		err := s.db.QueryRowContext(ctx, `SELECT manifest FROM modules WHERE name = ?`, name).Scan(&m.Manifest)
		return m, err
	}
	mods, err := s.Modules(ctx)
	if err != nil {
		return ModuleInfo{}, err
	}
	var names []string
	for _, m := range mods {
		names = append(names, m.Name)
	}
	return ModuleInfo{}, ruleErr(ErrNotFound, "module %q is not in the catalogue (known: %s)", name, joinOr(names, "none; mesh module add FILE"))
}

// Manifest is a catalogue module's parsed form.
func (s *Store) Manifest(ctx context.Context, name string) (*manifest.Manifest, error) {
	var file, digest, spec string
	err := s.db.QueryRowContext(ctx, `SELECT file, digest, spec FROM modules WHERE name = ?`, name).Scan(&file, &digest, &spec)
	if err == sql.ErrNoRows {
		return nil, ruleErr(ErrNotFound, "module %q is not in the catalogue", name)
	}
	if err != nil {
		return nil, err
	}
	return s.manifestOf(file, digest, spec)
}

// Roster reads the derived names.
func (s *Store) Roster(ctx context.Context) ([]Name, error) {
	if r := s.roster.Load(); r != nil {
		return r.Names(), nil
	}
	return readRoster(ctx, s.db)
}

// SharedRoster is Roster without the copy, for a reader that changes
// nothing in it: the resolver's feed, which reads the roster after every
// change (at 10,000 modules the copy was 0.5 MB per assign, and its
// allocation, when the collector was marking, a part of the worst
// answers' delay). The roster the store keeps is never changed: a command
// that changes names keeps a new one (recompose), which shares every run
// of names its changes do not fall in with the one before (Roster), so a
// reader that compares the two can step over those (the feed's
// movedNames).
func (s *Store) SharedRoster(ctx context.Context) (Roster, error) {
	if r := s.roster.Load(); r != nil {
		return *r, nil
	}
	flat, err := readRoster(ctx, s.db)
	return NewRoster(flat), err
}

func readRoster(ctx context.Context, q queryer) ([]Name, error) {
	rows, err := q.QueryContext(ctx, `SELECT name, address, node FROM roster ORDER BY name, address, node`)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var out []Name
	for rows.Next() {
		var n Name
		if err := rows.Scan(&n.Name, &n.Address, &n.Node); err != nil {
			return nil, err
		}
		out = append(out, n)
	}
	return out, rows.Err()
}

// PlanHistory returns a node's plan versions, newest first, at most limit
// (0: all), each with its plan.
func (s *Store) PlanHistory(ctx context.Context, node string, limit int) ([]PlanVersion, error) {
	if _, err := s.Node(ctx, node); err != nil {
		return nil, err
	}
	q := `SELECT node, version, digest, body, cause, created_at FROM plans WHERE node = ? ORDER BY version DESC`
	args := []any{node}
	if limit > 0 {
		q += ` LIMIT ?`
		args = append(args, limit)
	}
	rows, err := s.db.QueryContext(ctx, q, args...)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var out []PlanVersion
	for rows.Next() {
		var v PlanVersion
		var stored []byte
		var at string
		if err := rows.Scan(&v.Node, &v.Version, &v.Digest, &stored, &v.Cause, &at); err != nil {
			return nil, err
		}
		v.CreatedAt, _ = time.Parse(timeLayout, at)
		body, err := unpackPlan(stored)
		if err != nil {
			return nil, fmt.Errorf("decode plan %s v%d: %w", node, v.Version, err)
		}
		v.Plan = &Plan{}
		if err := json.Unmarshal(body, v.Plan); err != nil {
			return nil, fmt.Errorf("decode plan %s v%d: %w", node, v.Version, err)
		}
		out = append(out, v)
	}
	return out, rows.Err()
}

// Plan returns a node's current plan version; ErrNotFound when it has none yet.
func (s *Store) Plan(ctx context.Context, node string) (PlanVersion, error) {
	h, err := s.PlanHistory(ctx, node, 1)
	if err != nil {
		return PlanVersion{}, err
	}
	if len(h) == 0 {
		return PlanVersion{}, ruleErr(ErrNotFound, "node %q has no plan yet", node)
	}
	return h[0], nil
}

// PlanHead is what a node's newest plan is, without the plan: its version,
// digest and number of resources.
type PlanHead struct {
	Version   uint64
	Digest    string
	Resources int
}

// PlanHeads reads every node's newest plan's head (mesh status, which
// shows them for every node, does not decode the plans). A plan's number
// of resources is counted once per digest: a digest names one plan.
func (s *Store) PlanHeads(ctx context.Context) (map[string]PlanHead, error) {
	rows, err := s.db.QueryContext(ctx, `SELECT p.node, p.version, p.digest
		FROM plans p JOIN (SELECT node, MAX(version) AS v FROM plans GROUP BY node) m ON p.node = m.node AND p.version = m.v`)
	if err != nil {
		return nil, err
	}
	out := map[string]PlanHead{}
	for rows.Next() {
		var n string
		var h PlanHead
		if err := rows.Scan(&n, &h.Version, &h.Digest); err != nil {
			rows.Close()
			return nil, err
		}
		out[n] = h
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return nil, err
	}
	for n, h := range out {
		s.mu.Lock()
		count, ok := s.planSizes[h.Digest]
		s.mu.Unlock()
		if !ok {
			var stored []byte
			err := s.db.QueryRowContext(ctx, `SELECT body FROM plans WHERE node = ? AND version = ?`, n, h.Version).Scan(&stored)
			if errors.Is(err, sql.ErrNoRows) {
				delete(out, n) // pruned or restored since the first read: no head to show
				continue
			} else if err != nil {
				return nil, err
			}
			if count, err = resourceCount(stored); err != nil {
				return nil, fmt.Errorf("plan %s v%d: %w", n, h.Version, err)
			}
			s.mu.Lock()
			if len(s.planSizes) >= 4096 {
				clear(s.planSizes) // bounded: counted again when asked
			}
			s.planSizes[h.Digest] = count
			s.mu.Unlock()
		}
		h.Resources = count
		out[n] = h
	}
	return out, nil
}

// Reports reads the last report of every node that sent one.
func (s *Store) Reports(ctx context.Context) (map[string]Report, error) {
	rows, err := s.db.QueryContext(ctx, `SELECT node, body FROM reports`)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	out := map[string]Report{}
	for rows.Next() {
		var n, body string
		rows.Scan(&n, &body)
		var r Report
		if err := json.Unmarshal([]byte(body), &r); err != nil {
			return nil, fmt.Errorf("decode report of %s: %w", n, err)
		}
		out[n] = r
	}
	return out, rows.Err()
}

// DecodeReport reads a report as ReportBodies gives it.
func DecodeReport(body string) (Report, error) {
	var r Report
	err := json.Unmarshal([]byte(body), &r)
	return r, err
}

// CredentialDigests says which credentials exist (never their secrets).
func (s *Store) CredentialDigests(ctx context.Context) (map[Pair]string, error) {
	in := map[Pair]string{}
	rows, err := s.db.QueryContext(ctx, `SELECT consumer, provider, digest FROM credentials`)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	for rows.Next() {
		var p Pair
		var d string
		rows.Scan(&p.Consumer, &p.Provider, &d)
		in[p] = d
	}
	return in, rows.Err()
}

// Identity is the mesh's CA and join secret, for admitting nodes, as this
// replica holds them: sealed to the voters (seal.go), or in plain text in
// a mesh made by an older binary until a voter seals them. Never printed.
type Identity struct {
	MeshID           string
	CACert           string
	CAKey            string // plain, older meshes only
	JoinSecret       string // plain, older meshes only
	CAKeySealed      string
	JoinSecretSealed string
	Voters           int
	// CANextCert and CANextKeySealed are the new CA while a rotation is
	// under way (ca.go).
	CANextCert      string
	CANextKeySealed string
	CANextCross     string
}

// Identity reads the mesh's identity from the replica.
func (s *Store) Identity(ctx context.Context) (Identity, error) {
	kv, err := s.settings(ctx)
	if err != nil {
		return Identity{}, err
	}
	id := Identity{MeshID: kv["mesh_id"], CACert: kv["ca_cert"], CAKey: kv["ca_key"], JoinSecret: kv["join_secret"],
		CAKeySealed: kv["ca_key_sealed"], JoinSecretSealed: kv["join_secret_sealed"], CANextCert: kv["ca_next_cert"], CANextKeySealed: kv["ca_next_key_sealed"], CANextCross: kv["ca_next_cross"]}
	fmt.Sscan(kv["voters"], &id.Voters)
	return id, nil
}

func joinOr(names []string, none string) string {
	if len(names) == 0 {
		return none
	}
	return strings.Join(names, ", ")
}

func splitNonEmpty(s string) []string {
	return strings.FieldsFunc(s, func(r rune) bool { return r == ',' })
}

// RosterEvent is a name that appeared ("+") or went ("-") at a log index,
// and the command that caused it. A name that moved went from one address
// and appeared at another at the same index.
type RosterEvent struct {
	Index   uint64 `json:"index"`
	At      string `json:"at"`
	Cause   string `json:"cause"`
	Op      string `json:"op"`
	Name    string `json:"name"`
	Address string `json:"address"`
	Node    string `json:"node"`
}

// RosterHistory lists the roster's changes, oldest first; only name's when
// name is set.
func (s *Store) RosterHistory(ctx context.Context, name string) ([]RosterEvent, error) {
	q := `SELECT idx, at, cause, op, name, address, node FROM roster_history`
	var args []any
	if name != "" {
		q += ` WHERE name = ?`
		args = append(args, strings.ToLower(strings.TrimSuffix(name, ".")))
	}
	rows, err := s.db.QueryContext(ctx, q+` ORDER BY idx, op, name, address`, args...)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	out := []RosterEvent{}
	for rows.Next() {
		var e RosterEvent
		if err := rows.Scan(&e.Index, &e.At, &e.Cause, &e.Op, &e.Name, &e.Address, &e.Node); err != nil {
			return nil, err
		}
		out = append(out, e)
	}
	return out, rows.Err()
}
