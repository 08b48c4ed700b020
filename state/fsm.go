package state

import (
	"context"
	"crypto/sha256"
	"database/sql"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"sort"
	"strings"
	"time"

	"mesh/state/manifest"
)

// Ops, the kinds of command.
const (
	OpInit         = "init"
	OpNodeAdd      = "node.add"
	OpNodeRemove   = "node.remove"
	OpPublicDomain = "node.public-domain"
	OpModuleAdd    = "module.add"
	OpModuleRemove = "module.remove"
	OpAssign       = "assign"
	OpUnassign     = "unassign"
	OpReport       = "report"
	OpTokenRotate  = "token.rotate"

	timeLayout = time.RFC3339Nano
)

// CommandVersion is the newest command format this binary applies. A
// command carries the format it needs (V); a node that meets a newer one
// stops applying and says so (it never skips it, which would let replicas
// diverge), and a leader refuses to propose one that a node it knows of
// cannot apply yet.
const CommandVersion = 2

// opVersion is the format each op needs: the version that introduced it.
var opVersion = map[string]int{
	OpInit: 1, OpNodeAdd: 1, OpNodeRemove: 1, OpPublicDomain: 1, OpModuleAdd: 1,
	OpModuleRemove: 1, OpAssign: 1, OpUnassign: 1, OpReport: 1, OpTokenRotate: 1,
	OpRestore: 2,
}

// NeedsVersion is the command format c needs (0 for an unknown op).
func (c *Command) NeedsVersion() int { return opVersion[c.Op] }

// Command is one replicated change. Everything Apply needs that is not already
// in the state travels in it: the proposer's time and any generated secrets.
type Command struct {
	Op string `json:"op"`
	// V is the command format it needs (absent: 1); Encode sets it.
	V    int       `json:"v,omitempty"`
	Time time.Time `json:"time"`

	MeshID  string       `json:"mesh_id,omitempty"`
	Domain  string       `json:"domain,omitempty"`
	Node    *Node        `json:"node,omitempty"`
	Name    string       `json:"name,omitempty"` // a node or a module
	Modules []ModuleText `json:"modules,omitempty"`
	Assign  *Assignment  `json:"assign,omitempty"`
	Secrets []Secret     `json:"secrets,omitempty"`
	Report  *Report      `json:"report,omitempty"`
	Force   bool         `json:"force,omitempty"`

	// Identity of the mesh, chosen by the proposer of init (and of a token
	// rotation): replicated so that any node can admit a joining one.
	CACert     string `json:"ca_cert,omitempty"`
	CAKey      string `json:"ca_key,omitempty"`
	JoinSecret string `json:"join_secret,omitempty"`
	Voters     int    `json:"voters,omitempty"`

	// Restore is the state a restore puts back (OpRestore).
	Restore *RestoreBody `json:"restore,omitempty"`
}

// ModuleText is a manifest as the operator gave it.
type ModuleText struct {
	File string `json:"file"`
	Text string `json:"text"`
}

// Secret is a generated credential. Only the proposer makes one; the FSM keeps
// the first secret it sees for a pair and ignores later ones.
type Secret struct {
	Pair
	Value string `json:"value"`
}

// Report is what a node says it last applied.
type Report struct {
	Node      string           `json:"node"`
	Version   uint64           `json:"version"`
	AppliedAt time.Time        `json:"applied_at"`
	Error     string           `json:"error,omitempty"`
	Resources []ResourceReport `json:"resources,omitempty"`
	// Mutations counts the changes the apply made: mutating Podman calls and
	// files or directories written or removed. Zero when nothing changed.
	Mutations int `json:"mutations"`
	// Failures lists each module that failed in this apply: where, why, and
	// which of its resources (or its consumers') wait behind it.
	Failures []ModuleFailure `json:"failures,omitempty"`
}

// ModuleFailure is one module's failure in an apply.
type ModuleFailure struct {
	Module   string `json:"module"`
	Resource string `json:"resource"` // "KIND NAME" of the resource that failed
	Reason   string `json:"reason"`
	// Provider is set when the module waits for a provider that failed.
	Provider string   `json:"provider,omitempty"`
	Waiting  []string `json:"waiting,omitempty"`
}

// WaitReason is what a resource of module that waits behind f says.
func (f *ModuleFailure) WaitReason(module string) string {
	if f.Module != module || f.Provider != "" {
		p := f.Provider
		if f.Module != module {
			p = f.Module
		}
		return "waits for its provider " + p + ", which failed"
	}
	return "waits: " + f.Resource + " failed before it"
}

// FailureSummary is the report's failures in one line each ("" if none).
func (r *Report) FailureSummary() string {
	var lines []string
	for _, f := range r.Failures {
		s := f.Resource
		if f.Module != "" {
			s = f.Module + ": " + s
		}
		s += ": " + f.Reason
		if n := len(f.Waiting); n > 0 {
			s += fmt.Sprintf(" (%d resource(s) wait: %s)", n, strings.Join(f.Waiting, ", "))
		}
		lines = append(lines, s)
	}
	return strings.Join(lines, "\n")
}

// Failed reports whether module failed (or waits) in this report.
func (r *Report) Failed(module string) *ModuleFailure {
	for i := range r.Failures {
		if r.Failures[i].Module == module {
			return &r.Failures[i]
		}
	}
	return nil
}

// ResourceReport is one resource's outcome in an apply.
type ResourceReport struct {
	Module  string `json:"module"`
	Kind    string `json:"kind"`
	Name    string `json:"name"`
	Outcome string `json:"outcome"` // unchanged, created, replaced, ran, kept, removed, failed
	Reason  string `json:"reason,omitempty"`
}

// Encode serialises a command for the log.
func (c *Command) Encode() []byte {
	if v := c.NeedsVersion(); v > 1 {
		c.V = v
	}
	b, err := json.Marshal(c)
	if err != nil {
		panic(err)
	}
	return b
}

// SecretDigest is how a secret is compared (DESIGN rule 7).
func SecretDigest(secret string) string {
	s := sha256.Sum256([]byte(secret))
	return hex.EncodeToString(s[:])
}

// Apply applies one log entry at index. An entry that cannot be decoded means
// the log is corrupt, and Apply panics. A command that breaks a rule returns
// an error, the same on every replica, and changes nothing. Entries at or
// below the applied index are skipped, so a replay after restart is harmless.
func (s *Store) Apply(index uint64, data []byte) error {
	var c Command
	if err := json.Unmarshal(data, &c); err != nil {
		panic(fmt.Sprintf("state: log entry %d is not a command (%v): the raft log is corrupt", index, err))
	}
	if v := max(c.V, 1); c.NeedsVersion() == 0 || v > CommandVersion {
		panic(fmt.Sprintf("state: log entry %d is a %q command of format v%d, which this mesh binary (formats up to v%d) cannot apply; "+
			"this node stops applying rather than skip it: upgrade its mesh binary and start it again", index, c.Op, v, CommandVersion))
	}
	s.applyMu.Lock()
	defer s.applyMu.Unlock()
	// A full disk is not a broken rule and not a reason to die: the command
	// waits, whole, until there is space again (reads and the resolver keep
	// answering from what is applied), then applies exactly as it would have.
	for waited := time.Duration(0); ; {
		err, full := s.applyOnce(index, &c)
		if !full {
			return err
		}
		if waited == 0 && s.OnDiskFull != nil {
			s.OnDiskFull(index)
		}
		time.Sleep(DiskFullRetry)
		waited += DiskFullRetry
	}
}

// DiskFullRetry is how often a command that met a full disk is tried again.
var DiskFullRetry = time.Second

// IsDiskFull reports whether err (or a panic's value) says the disk is full.
func IsDiskFull(v any) bool {
	s := strings.ToLower(fmt.Sprint(v))
	return strings.Contains(s, "disk is full") || strings.Contains(s, "no space left") || strings.Contains(s, "sqlite_full")
}

// applyOnce applies c in one transaction. full says it met a full disk and
// changed nothing; any other failure inside panics (stops the node loudly).
func (s *Store) applyOnce(index uint64, c *Command) (ruleError error, full bool) {
	defer func() {
		if r := recover(); r != nil {
			if IsDiskFull(r) {
				ruleError, full = nil, true
				return
			}
			panic(r)
		}
	}()
	return s.applyTx(index, c), false
}

func (s *Store) applyTx(index uint64, cp *Command) error {
	c := *cp
	ctx := context.Background()
	tx, err := s.db.BeginTx(ctx, nil)
	if err != nil {
		panic(fmt.Sprintf("state: begin apply %d: %v", index, err))
	}
	defer tx.Rollback()
	var applied uint64
	if err := tx.QueryRow(`SELECT idx FROM applied WHERE id = 1`).Scan(&applied); err != nil {
		panic(fmt.Sprintf("state: read applied index: %v", err))
	}
	if index <= applied {
		return nil
	}
	recompose, ruleErr := s.applyOp(ctx, tx, index, &c)
	if ruleErr == nil && recompose {
		if err := s.recompose(ctx, tx, index, &c); err != nil {
			panic(fmt.Sprintf("state: recompose at %d: %v", index, err))
		}
	}
	if ruleErr != nil {
		// Roll the command back but still record the index, so the replay skips it.
		tx.Rollback()
		tx, err = s.db.BeginTx(ctx, nil)
		if err != nil {
			panic(fmt.Sprintf("state: begin apply %d: %v", index, err))
		}
	}
	if _, err := tx.Exec(`UPDATE applied SET idx = ? WHERE id = 1`, index); err != nil {
		panic(fmt.Sprintf("state: record applied index: %v", err))
	}
	if err := tx.Commit(); err != nil {
		panic(fmt.Sprintf("state: commit apply %d: %v", index, err))
	}
	s.notify()
	return ruleErr
}

// RuleError is a command's broken rule: a sentence for the operator, and the
// kind (ErrNotFound, ErrConflict, ErrInvalid) for callers that branch on it.
type RuleError struct {
	Kind error
	Msg  string
}

func (e *RuleError) Error() string { return e.Msg }
func (e *RuleError) Unwrap() error { return e.Kind }

func ruleErr(kind error, format string, a ...any) error {
	return &RuleError{Kind: kind, Msg: fmt.Sprintf(format, a...)}
}

// applyOp changes the tables for one command. It reports whether composition
// must run again, or the rule the command broke.
func (s *Store) applyOp(ctx context.Context, tx *sql.Tx, index uint64, c *Command) (bool, error) {
	at := c.Time.UTC().Format(timeLayout)
	switch c.Op {
	case OpInit:
		var n int
		if err := tx.QueryRow(`SELECT COUNT(*) FROM settings WHERE key = 'mesh_id'`).Scan(&n); err != nil {
			panic(fmt.Sprintf("state: read the mesh id: %v", err))
		}
		if n > 0 {
			return false, ruleErr(ErrConflict, "this mesh is already initialised")
		}
		if c.Node == nil || c.MeshID == "" {
			return false, ruleErr(ErrInvalid, "init needs a mesh id and a first node")
		}
		domain := c.Domain
		if domain == "" {
			domain = DefaultDomain
		}
		voters := c.Voters
		if voters <= 0 {
			voters = 3
		}
		mustExec(tx, `INSERT INTO settings VALUES ('mesh_id', ?), ('domain', ?), ('created_at', ?), ('ca_cert', ?), ('ca_key', ?), ('join_secret', ?), ('voters', ?)`,
			c.MeshID, domain, at, c.CACert, c.CAKey, c.JoinSecret, fmt.Sprint(voters))
		mustExec(tx, `INSERT INTO nodes (name, address, voter, added_at) VALUES (?, ?, 1, ?)`, c.Node.Name, c.Node.Address, at)
		return true, nil

	case OpNodeAdd:
		if c.Node == nil {
			return false, ruleErr(ErrInvalid, "node.add without a node")
		}
		if ok := has(tx, `SELECT 1 FROM nodes WHERE name = ?`, c.Node.Name); ok {
			return false, ruleErr(ErrConflict, "node %q is already in the mesh", c.Node.Name)
		}
		if ok := has(tx, `SELECT 1 FROM nodes WHERE address = ?`, c.Node.Address); ok {
			return false, ruleErr(ErrConflict, "address %s is already taken by another node", c.Node.Address)
		}
		mustExec(tx, `INSERT INTO nodes (name, address, voter, added_at) VALUES (?, ?, ?, ?)`, c.Node.Name, c.Node.Address, c.Node.Voter, at)
		return true, nil

	case OpNodeRemove:
		if err := s.needNode(tx, c.Name); err != nil {
			return false, err
		}
		mods := listRows(tx, `SELECT module FROM assignments WHERE node = ? ORDER BY module`, c.Name)
		if len(mods) > 0 && !c.Force {
			return false, ruleErr(ErrConflict, "node %q still runs %s; unassign them first or pass --force", c.Name, strings.Join(mods, ", "))
		}
		mustExec(tx, `DELETE FROM assignments WHERE node = ?`, c.Name)
		mustExec(tx, `DELETE FROM nodes WHERE name = ?`, c.Name)
		mustExec(tx, `DELETE FROM roster WHERE node = ?`, c.Name)
		mustExec(tx, `DELETE FROM reports WHERE node = ?`, c.Name)
		return true, nil

	case OpPublicDomain:
		if err := s.needNode(tx, c.Name); err != nil {
			return false, err
		}
		if c.Domain != "" && !validDomain(c.Domain) {
			return false, ruleErr(ErrInvalid, "%q is not a domain name", c.Domain)
		}
		mustExec(tx, `UPDATE nodes SET public_domain = ? WHERE name = ?`, c.Domain, c.Name)
		return true, nil

	case OpModuleAdd:
		if len(c.Modules) == 0 {
			return false, ruleErr(ErrInvalid, "module add needs at least one manifest")
		}
		seen := map[string]string{}
		for _, mt := range c.Modules {
			m, err := manifest.Parse(mt.File, []byte(mt.Text))
			if err != nil {
				return false, ruleErr(ErrInvalid, "%v", err)
			}
			if other, dup := seen[m.Module]; dup {
				return false, ruleErr(ErrInvalid, "module %q is given twice (%s and %s)", m.Module, other, mt.File)
			}
			seen[m.Module] = mt.File
			mustExec(tx, `INSERT INTO modules (name, file, manifest, digest, version, added_at) VALUES (?, ?, ?, ?, ?, ?)
				ON CONFLICT (name) DO UPDATE SET file = excluded.file, manifest = excluded.manifest, digest = excluded.digest, version = excluded.version, added_at = excluded.added_at
				WHERE modules.digest != excluded.digest`, m.Module, mt.File, mt.Text, m.Digest, index, at)
		}
		s.insertSecrets(tx, c.Secrets)
		return true, nil

	case OpRestore:
		return s.applyRestore(tx, index, c)

	case OpModuleRemove:
		if ok := has(tx, `SELECT 1 FROM modules WHERE name = ?`, c.Name); !ok {
			return false, ruleErr(ErrNotFound, "module %q is not in the catalogue (%s)", c.Name, listOf(tx, `SELECT name FROM modules ORDER BY name`, "mesh module list"))
		}
		if nodes := listRows(tx, `SELECT node FROM assignments WHERE module = ? ORDER BY node`, c.Name); len(nodes) > 0 {
			return false, ruleErr(ErrConflict, "module %q is assigned to %s; unassign it first", c.Name, strings.Join(nodes, ", "))
		}
		mustExec(tx, `DELETE FROM modules WHERE name = ?`, c.Name)
		return true, nil

	case OpAssign, OpUnassign:
		if c.Assign == nil {
			return false, ruleErr(ErrInvalid, "%s without a node and module", c.Op)
		}
		a := c.Assign
		if err := s.needNode(tx, a.Node); err != nil {
			return false, err
		}
		if ok := has(tx, `SELECT 1 FROM modules WHERE name = ?`, a.Module); !ok && c.Op == OpAssign {
			return false, ruleErr(ErrNotFound, "module %q is not in the catalogue (%s)", a.Module, listOf(tx, `SELECT name FROM modules ORDER BY name`, "mesh module add FILE"))
		}
		assigned := has(tx, `SELECT 1 FROM assignments WHERE node = ? AND module = ?`, a.Node, a.Module)
		if c.Op == OpUnassign {
			if !assigned {
				return false, ruleErr(ErrNotFound, "module %q is not assigned to node %q (%s)", a.Module, a.Node, listOf(tx, `SELECT module FROM assignments WHERE node = ? ORDER BY module`, "nothing is assigned there", a.Node))
			}
			mustExec(tx, `DELETE FROM assignments WHERE node = ? AND module = ?`, a.Node, a.Module)
			return true, nil
		}
		if assigned {
			return false, nil // already so; nothing to do
		}
		if err := s.checkProviders(ctx, tx, a.Module); err != nil {
			return false, err
		}
		mustExec(tx, `INSERT INTO assignments (node, module, seq) VALUES (?, ?, ?)`, a.Node, a.Module, index)
		s.insertSecrets(tx, c.Secrets)
		return true, nil

	case OpTokenRotate:
		if c.JoinSecret == "" {
			return false, ruleErr(ErrInvalid, "token rotation without a new secret")
		}
		mustExec(tx, `UPDATE settings SET value = ? WHERE key = 'join_secret'`, c.JoinSecret)
		return false, nil

	case OpReport:
		if c.Report == nil {
			return false, ruleErr(ErrInvalid, "report without a body")
		}
		if err := s.needNode(tx, c.Report.Node); err != nil {
			return false, err
		}
		mustExec(tx, `INSERT INTO reports VALUES (?, ?, ?, ?) ON CONFLICT (node) DO UPDATE SET version = excluded.version, applied_at = excluded.applied_at, body = excluded.body`,
			c.Report.Node, c.Report.Version, c.Report.AppliedAt.UTC().Format(timeLayout), jsonString(c.Report))
		return false, nil
	}
	return false, ruleErr(ErrInvalid, "unknown command %q (is this node's mesh binary older than the leader's?)", c.Op)
}

func (s *Store) insertSecrets(tx *sql.Tx, secrets []Secret) {
	for _, sc := range secrets {
		mustExec(tx, `INSERT INTO credentials VALUES (?, ?, ?, ?) ON CONFLICT DO NOTHING`, sc.Consumer, sc.Provider, sc.Value, SecretDigest(sc.Value))
	}
}

func (s *Store) checkProviders(ctx context.Context, tx *sql.Tx, module string) error {
	cat, err := s.catalogue(ctx, tx)
	if err != nil {
		panic(err)
	}
	m := cat[module]
	if err := manifest.CheckProviders(m, func(n string) (*manifest.Manifest, bool) { p, ok := cat[n]; return p, ok }); err != nil {
		return ruleErr(ErrInvalid, "%v", err)
	}
	return nil
}

func (s *Store) needNode(tx *sql.Tx, name string) error {
	if ok := has(tx, `SELECT 1 FROM nodes WHERE name = ?`, name); !ok {
		return ruleErr(ErrNotFound, "node %q is not in the mesh (%s)", name, listOf(tx, `SELECT name FROM nodes ORDER BY name`, "mesh node list"))
	}
	return nil
}

// listOf names what exists, for "unknown X" messages.
func listOf(tx *sql.Tx, q, none string, args ...any) string {
	names := listRows(tx, q, args...)
	if len(names) == 0 {
		return "there are none; " + none
	}
	if len(names) > 12 {
		names = append(names[:12], fmt.Sprintf("and %d more", len(names)-12))
	}
	return "known: " + strings.Join(names, ", ")
}

func listRows(tx *sql.Tx, q string, args ...any) []string {
	rows, err := tx.Query(q, args...)
	if err != nil {
		panic(err)
	}
	defer rows.Close()
	var out []string
	for rows.Next() {
		var n string
		if err := rows.Scan(&n); err != nil {
			panic(fmt.Sprintf("state: %v in %s", err, q))
		}
		out = append(out, n)
	}
	if err := rows.Err(); err != nil {
		panic(fmt.Sprintf("state: %v in %s", err, q))
	}
	return out
}

// has reports whether q finds a row. Inside Apply an error that is not a
// rule violation (an I/O error, a damaged file) must never take another
// branch than on the other replicas: it stops the node loudly.
func has(tx *sql.Tx, q string, args ...any) bool {
	var one int
	err := tx.QueryRow(q, args...).Scan(&one)
	if err == sql.ErrNoRows {
		return false
	}
	if err != nil {
		panic(fmt.Sprintf("state: %v in %s", err, q))
	}
	return true
}

func mustExec(tx *sql.Tx, q string, args ...any) {
	if _, err := tx.Exec(q, args...); err != nil {
		panic(fmt.Sprintf("state: %v in %s", err, q))
	}
}

func validDomain(d string) bool {
	if len(d) > 253 || strings.HasSuffix(d, ".") || !strings.Contains(d, ".") {
		return false
	}
	for _, l := range strings.Split(d, ".") {
		if l == "" || len(l) > 63 || l[0] == '-' || l[len(l)-1] == '-' {
			return false
		}
		for _, r := range l {
			if !(r >= 'a' && r <= 'z' || r >= '0' && r <= '9' || r == '-') {
				return false
			}
		}
	}
	return true
}

// catalogue reads and parses every module.
func (s *Store) catalogue(ctx context.Context, q queryer) (map[string]*manifest.Manifest, error) {
	rows, err := q.QueryContext(ctx, `SELECT name, file, manifest, digest FROM modules`)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	cat := map[string]*manifest.Manifest{}
	for rows.Next() {
		var name, file, text, digest string
		if err := rows.Scan(&name, &file, &text, &digest); err != nil {
			return nil, err
		}
		m, err := s.manifestOf(file, text, digest)
		if err != nil {
			return nil, fmt.Errorf("stored manifest %s no longer parses: %w", name, err)
		}
		cat[name] = m
	}
	return cat, rows.Err()
}

// input loads what composition reads.
func (s *Store) input(ctx context.Context, q queryer) (Input, error) {
	in := Input{Credentials: map[Pair]string{}}
	if err := q.QueryRowContext(ctx, `SELECT value FROM settings WHERE key = 'domain'`).Scan(&in.Domain); err != nil {
		return in, fmt.Errorf("read domain: %w", err)
	}
	nodes, err := readNodes(ctx, q)
	if err != nil {
		return in, err
	}
	for _, n := range nodes {
		in.Nodes = append(in.Nodes, n.Node)
	}
	if in.Modules, err = s.catalogue(ctx, q); err != nil {
		return in, err
	}
	rows, err := q.QueryContext(ctx, `SELECT node, module, seq FROM assignments ORDER BY node, module`)
	if err != nil {
		return in, err
	}
	for rows.Next() {
		var a Assignment
		if err := rows.Scan(&a.Node, &a.Module, &a.Seq); err != nil {
			rows.Close()
			return in, fmt.Errorf("read assignments: %w", err)
		}
		in.Assignments = append(in.Assignments, a)
	}
	rows.Close()
	in.Bound = map[BindKey]string{}
	rows, err = q.QueryContext(ctx, `SELECT node, module, path, provider_node FROM bindings`)
	if err != nil {
		return in, err
	}
	for rows.Next() {
		var k BindKey
		var v string
		if err := rows.Scan(&k.Node, &k.Module, &k.Path, &v); err != nil {
			rows.Close()
			return in, fmt.Errorf("read bindings: %w", err)
		}
		in.Bound[k] = v
	}
	rows.Close()
	rows, err = q.QueryContext(ctx, `SELECT consumer, provider, digest FROM credentials`)
	if err != nil {
		return in, err
	}
	for rows.Next() {
		var p Pair
		var d string
		if err := rows.Scan(&p.Consumer, &p.Provider, &d); err != nil {
			rows.Close()
			return in, fmt.Errorf("read credentials: %w", err)
		}
		in.Credentials[p] = d
	}
	rows.Close()
	return in, nil
}

// recompose derives roster and plans after a change and records what moved: a
// new plan version for each node whose plan digest changed, the composition
// error of each node that failed (its last good plan and names are kept).
func (s *Store) recompose(ctx context.Context, tx *sql.Tx, index uint64, c *Command) error {
	in, err := s.input(ctx, tx)
	if err != nil {
		return err
	}
	out := Compose(in)
	roster := out.Roster
	at := c.Time.UTC().Format(timeLayout)
	cause := c.Describe()
	for _, n := range in.Nodes {
		if msg, failed := out.Errors[n.Name]; failed {
			mustExec(tx, `UPDATE nodes SET compose_error = ? WHERE name = ?`, msg, n.Name)
			rows, err := tx.Query(`SELECT name, address, node FROM roster WHERE node = ?`, n.Name)
			if err != nil {
				return err
			}
			for rows.Next() {
				var r Name
				if err := rows.Scan(&r.Name, &r.Address, &r.Node); err != nil {
					rows.Close()
					return fmt.Errorf("read the roster of %s: %w", n.Name, err)
				}
				roster = append(roster, r)
			}
			rows.Close()
			continue
		}
		mustExec(tx, `UPDATE nodes SET compose_error = '' WHERE name = ?`, n.Name)
		mustExec(tx, `DELETE FROM bindings WHERE node = ?`, n.Name)
		p := out.Plans[n.Name]
		for _, r := range p.Resources {
			if r.Kind == manifest.KindBinding {
				mustExec(tx, `INSERT INTO bindings VALUES (?, ?, ?, ?)`, n.Name, r.Module, r.Name, r.Provider)
			}
		}
		d := p.Digest()
		var last string
		err := tx.QueryRow(`SELECT digest FROM plans WHERE node = ? ORDER BY version DESC LIMIT 1`, n.Name).Scan(&last)
		if err != nil && err != sql.ErrNoRows {
			return err
		}
		if last != d {
			mustExec(tx, `INSERT INTO plans VALUES (?, ?, ?, ?, ?, ?)`, n.Name, index, d, jsonString(p), cause, at)
		}
	}
	SortRoster(roster)
	mustExec(tx, `DELETE FROM roster`)
	for _, r := range roster {
		mustExec(tx, `INSERT OR IGNORE INTO roster VALUES (?, ?, ?)`, r.Name, r.Address, r.Node)
	}
	// Drop parsed manifests that left the catalogue.
	keep := map[string]bool{}
	for _, m := range in.Modules {
		keep[m.Digest] = true
	}
	s.mu.Lock()
	for d := range s.parsed {
		if !keep[d] {
			delete(s.parsed, d)
		}
	}
	s.mu.Unlock()
	return nil
}

// Describe says what a command did, in the operator's words (no secrets).
func (c *Command) Describe() string {
	switch c.Op {
	case OpInit:
		return "mesh init --name " + nodeName(c.Node)
	case OpNodeAdd:
		return "node " + nodeName(c.Node) + " joined"
	case OpTokenRotate:
		return "mesh token --rotate"
	case OpNodeRemove:
		return "mesh node remove " + c.Name
	case OpPublicDomain:
		if c.Domain == "" {
			return "mesh node public-domain " + c.Name + " --clear"
		}
		return "mesh node public-domain " + c.Name + " " + c.Domain
	case OpModuleAdd:
		var names []string
		for _, m := range c.Modules {
			names = append(names, m.File)
		}
		sort.Strings(names)
		return "mesh module add " + strings.Join(names, " ")
	case OpModuleRemove:
		return "mesh module remove " + c.Name
	case OpRestore:
		if c.Restore != nil {
			return fmt.Sprintf("mesh snapshot restore (the state at index %d)", c.Restore.Index)
		}
	case OpAssign, OpUnassign:
		if c.Assign != nil {
			return "mesh " + c.Op + " " + c.Assign.Node + " " + c.Assign.Module
		}
	}
	return c.Op
}

func nodeName(n *Node) string {
	if n == nil {
		return "?"
	}
	return n.Name
}
