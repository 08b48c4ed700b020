package state

import (
	"context"
	"crypto/sha256"
	"database/sql"
	"encoding/hex"
	"errors"
	"fmt"
	"slices"
	"sort"
	"strings"
	"time"

	"mesh/state/manifest"
)

// ModuleText is a manifest as the operator gave it.
type ModuleText struct {
	File string `json:"file"`
	Text string `json:"text"`
}

// Secret is a generated credential. Only the proposer makes one, and seals
// it to the nodes that deliver it (seal.go): Sealed, Recipients and Digest.
// Value, the secret in plain text, is only in commands of older meshes.
type Secret struct {
	Pair
	Value      string   `json:"value,omitempty"`
	Sealed     string   `json:"sealed,omitempty"`
	Digest     string   `json:"digest,omitempty"`
	Recipients []string `json:"recipients,omitempty"`
	// Reason says why it was sealed (new, a node moved, ...), for the log.
	Reason string `json:"reason,omitempty"`
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
//
// The command is decoded into its op's typed request; an op or format this
// binary does not know stops the node (never a skip, which would let
// replicas diverge in a rolling upgrade).
func (s *Store) Apply(index uint64, data []byte) error {
	c, req := decodeEntry(index, data)
	s.applyMu.Lock()
	defer s.applyMu.Unlock()
	return s.applyLocked(index, c, req)
}

// CatchUp applies, in order, the commands after the replica's applied index
// up to upTo, an index the leader says is committed, reading each entry from
// this node's own Raft log with entry. It lets a follower apply a commit as
// soon as the leader tells it, instead of when Raft next sends it the commit
// index (up to its commit timeout later); Raft's own Apply of the same
// entries then skips them. entry gives an entry's data and whether it is a
// command (Raft's own entries are not); an error stops the catch-up there
// (an entry this node does not hold is left to Raft). Applying and Restore
// hold one lock, and the applied index is read under it, so no entry is
// skipped or applied twice whichever path gets there first. It returns how
// many commands it applied; at most maxCatchUp entries are read.
func (s *Store) CatchUp(upTo uint64, entry func(index uint64) (data []byte, command bool, err error)) (int, error) {
	s.applyMu.Lock()
	defer s.applyMu.Unlock()
	applied, err := s.AppliedIndex()
	if err != nil {
		return 0, err
	}
	if upTo <= applied || upTo-applied > maxCatchUp {
		return 0, nil
	}
	n := 0
	for i := applied + 1; i <= upTo; i++ {
		data, command, err := entry(i)
		if err != nil {
			return n, err
		}
		if !command {
			continue
		}
		c, req := decodeEntry(i, data)
		s.applyLocked(i, c, req) // a broken rule is the command's outcome, as through Raft
		n++
	}
	return n, nil
}

// maxCatchUp bounds CatchUp: a replica further behind is Raft's to bring up.
const maxCatchUp = 256

// decodeEntry decodes a log entry's command; one that does not decode stops
// the node (see Apply).
func decodeEntry(index uint64, data []byte) (*Command, Request) {
	c, err := Decode(data)
	if err != nil {
		panic(fmt.Sprintf("state: log entry %d is not a command (%v): the raft log is corrupt", index, err))
	}
	req, err := c.Request()
	if errors.Is(err, ErrUnknownCommand) {
		panic(fmt.Sprintf("state: log entry %d is a %q command of format v%d, which this mesh binary (formats up to v%d) cannot apply; "+
			"this node stops applying rather than skip it: upgrade its mesh binary and start it again", index, c.Op, c.V, CommandVersion))
	}
	if err != nil {
		panic(fmt.Sprintf("state: log entry %d: %v: the raft log is corrupt", index, err))
	}
	return c, req
}

// applyLocked applies one decoded command; the caller holds applyMu.
func (s *Store) applyLocked(index uint64, c *Command, req Request) error {
	// A full disk is not a broken rule and not a reason to die: the command
	// waits, whole, until there is space again (reads and the resolver keep
	// answering from what is applied), then applies exactly as it would have.
	for waited := time.Duration(0); ; {
		err, full := s.applyOnce(index, c.Time, req)
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
func (s *Store) applyOnce(index uint64, at time.Time, req Request) (ruleError error, full bool) {
	defer func() {
		if r := recover(); r != nil {
			if IsDiskFull(r) {
				ruleError, full = nil, true
				return
			}
			panic(r)
		}
	}()
	return s.applyTx(index, at, req), false
}

func (s *Store) applyTx(index uint64, at time.Time, req Request) error {
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
	ap := &applier{s: s, tx: tx, index: index, at: at.UTC().Format(timeLayout)}
	ctx = context.WithValue(ctx, applyingKey{}, ap)
	ap.ctx = ctx
	recompose, ruleErr := ap.apply(req)
	if ruleErr == nil && recompose {
		if err := s.recompose(ctx, tx, index, ap.at, req.describe()); err != nil {
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
	if ruleErr == nil && ap.roster != nil {
		s.roster.Store(&ap.roster)
	}
	if cat := s.cat; cat != nil {
		s.catPub.Store(&cat)
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

// applier applies one request inside the apply transaction: one function
// per op (Nomad's fsm.go shape). Each reports whether composition must run
// again, or the rule the request broke.
type applier struct {
	s     *Store
	ctx   context.Context
	tx    *sql.Tx
	index uint64
	at    string // the proposer's time
	// catChanged: this command writes the catalogue.
	catChanged bool
	// rosterChanged: this command writes the roster table itself (besides
	// recompose), so the kept roster is not what it diffs against.
	rosterChanged bool
	// roster is the roster recompose wrote, kept once the command commits.
	roster []Name
}

// rosterChanges says the command being applied writes the roster table
// outside recompose: what the store keeps of it is no longer the truth.
func (ap *applier) rosterChanges() {
	ap.rosterChanged = true
	ap.s.roster.Store(nil)
}

func (ap *applier) apply(req Request) (bool, error) {
	switch r := req.(type) {
	case *InitRequest:
		return ap.init(r)
	case *NodeAddRequest:
		return ap.nodeAdd(r)
	case *NodeRemoveRequest:
		return ap.nodeRemove(r)
	case *PublicDomainRequest:
		return ap.publicDomain(r)
	case *ModuleAddRequest:
		return ap.moduleAdd(r)
	case *ModuleRemoveRequest:
		return ap.moduleRemove(r)
	case *ModulePullRequest:
		return ap.modulePull(r)
	case *AssignRequest:
		return ap.assign(r)
	case *UnassignRequest:
		return ap.unassign(r)
	case *ReportRequest:
		return ap.report(r)
	case *TokenRotateRequest:
		return ap.tokenRotate(r)
	case *SealRequest:
		return ap.seal(r)
	case *NodeKeyRequest:
		return ap.nodeKey(r)
	case *NodeCertRequest:
		return ap.nodeCert(r)
	case *RestoreBody:
		ap.catalogueChanges()
		ap.rosterChanges()
		return ap.s.applyRestore(ap.tx, r)
	}
	panic(fmt.Sprintf("state: no apply function for %T", req))
}

func (ap *applier) init(r *InitRequest) (bool, error) {
	tx := ap.tx
	if has(tx, `SELECT 1 FROM settings WHERE key = 'mesh_id'`) {
		return false, ruleErr(ErrConflict, "this mesh is already initialised")
	}
	if r.Node.Name == "" || r.MeshID == "" {
		return false, ruleErr(ErrInvalid, "init needs a mesh id and a first node")
	}
	domain := r.Domain
	if domain == "" {
		domain = DefaultDomain
	}
	voters := r.Voters
	if voters <= 0 {
		voters = 3
	}
	mustExec(tx, `INSERT INTO settings VALUES ('mesh_id', ?), ('domain', ?), ('created_at', ?), ('ca_cert', ?), ('ca_key', ?), ('join_secret', ?), ('voters', ?)`,
		r.MeshID, domain, ap.at, r.CACert, r.CAKey, r.JoinSecret, fmt.Sprint(voters))
	if v := r.SealedCAKey; v != nil {
		ap.setVoterSecret("ca_key", v.Sealed, v.Recipients)
	}
	if v := r.SealedJoinSecret; v != nil {
		ap.setVoterSecret("join_secret", v.Sealed, v.Recipients)
	}
	mustExec(tx, `INSERT INTO nodes (name, address, voter, added_at, port, seal_key) VALUES (?, ?, 1, ?, ?, ?)`, r.Node.Name, r.Node.Address, ap.at, r.Node.Port, r.Node.SealKey)
	return true, nil
}

func (ap *applier) nodeAdd(r *NodeAddRequest) (bool, error) {
	tx, n := ap.tx, r.Node
	if n.Name == "" || n.Address == "" {
		return false, ruleErr(ErrInvalid, "node.add without a node")
	}
	if has(tx, `SELECT 1 FROM nodes WHERE name = ?`, n.Name) {
		return false, ruleErr(ErrConflict, "node %q is already in the mesh", n.Name)
	}
	if has(tx, `SELECT 1 FROM nodes WHERE address = ?`, n.Address) {
		return false, ruleErr(ErrConflict, "address %s is already taken by another node", n.Address)
	}
	if n.SealKey != "" && has(tx, `SELECT 1 FROM nodes WHERE seal_key = ?`, n.SealKey) {
		return false, ruleErr(ErrConflict, "another node already holds that sealing key")
	}
	mustExec(tx, `INSERT INTO nodes (name, address, voter, added_at, port, seal_key) VALUES (?, ?, ?, ?, ?, ?)`, n.Name, n.Address, n.Voter, ap.at, n.Port, n.SealKey)
	return true, nil
}

func (ap *applier) nodeRemove(r *NodeRemoveRequest) (bool, error) {
	tx := ap.tx
	if err := needNode(tx, r.Name); err != nil {
		return false, err
	}
	mods := listRows(tx, `SELECT module FROM assignments WHERE node = ? ORDER BY module`, r.Name)
	if len(mods) > 0 && !r.Force {
		return false, ruleErr(ErrConflict, "node %q still runs %s; unassign them first or pass --force", r.Name, strings.Join(mods, ", "))
	}
	mustExec(tx, `DELETE FROM assignments WHERE node = ?`, r.Name)
	mustExec(tx, `DELETE FROM nodes WHERE name = ?`, r.Name)
	ap.rosterChanges()
	mustExec(tx, `DELETE FROM roster WHERE node = ?`, r.Name)
	mustExec(tx, `DELETE FROM reports WHERE node = ?`, r.Name)
	return true, nil
}

func (ap *applier) publicDomain(r *PublicDomainRequest) (bool, error) {
	if err := needNode(ap.tx, r.Node); err != nil {
		return false, err
	}
	if r.Domain != "" && !validDomain(r.Domain) {
		return false, ruleErr(ErrInvalid, "%q is not a domain name", r.Domain)
	}
	mustExec(ap.tx, `UPDATE nodes SET public_domain = ? WHERE name = ?`, r.Domain, r.Node)
	return true, nil
}

// moduleAdd stores manifests the proposer parsed and checked. It reads their
// parsed form and never their text.
func (ap *applier) moduleAdd(r *ModuleAddRequest) (bool, error) {
	if len(r.Modules) == 0 {
		return false, ruleErr(ErrInvalid, "module add needs at least one manifest")
	}
	seen := map[string]string{}
	for i := range r.Modules {
		sp := &r.Modules[i]
		if err := sp.check(); err != nil {
			return false, err
		}
		name := sp.Manifest.Module
		if other, dup := seen[name]; dup {
			return false, ruleErr(ErrInvalid, "module %q is given twice (%s and %s)", name, other, sp.File)
		}
		seen[name] = sp.File
		ap.catalogueChanges()
		mustExec(ap.tx, `INSERT INTO modules (name, file, manifest, digest, version, added_at, spec) VALUES (?, ?, ?, ?, ?, ?, ?)
			ON CONFLICT (name) DO UPDATE SET file = excluded.file, manifest = excluded.manifest, digest = excluded.digest, version = excluded.version, added_at = excluded.added_at, spec = excluded.spec
			WHERE modules.digest != excluded.digest`, name, sp.File, sp.Text, sp.Digest, ap.index, ap.at, sp.specJSON())
	}
	if err := ap.takeSecrets(r.Secrets); err != nil {
		return false, err
	}
	return true, nil
}

func (ap *applier) moduleRemove(r *ModuleRemoveRequest) (bool, error) {
	tx := ap.tx
	if !has(tx, `SELECT 1 FROM modules WHERE name = ?`, r.Name) {
		return false, ruleErr(ErrNotFound, "module %q is not in the catalogue (%s)", r.Name, listOf(tx, `SELECT name FROM modules ORDER BY name`, "mesh module list"))
	}
	if nodes := listRows(tx, `SELECT node FROM assignments WHERE module = ? ORDER BY node`, r.Name); len(nodes) > 0 {
		return false, ruleErr(ErrConflict, "module %q is assigned to %s; unassign it first", r.Name, strings.Join(nodes, ", "))
	}
	ap.catalogueChanges()
	mustExec(tx, `DELETE FROM modules WHERE name = ?`, r.Name)
	mustExec(tx, `DELETE FROM pulls WHERE module = ?`, r.Name)
	return true, nil
}

// modulePull records the pull in the module's plans (each of its
// containers carries the index), so every node running it pulls and
// replaces what changed; nothing else about the containers moves.
func (ap *applier) modulePull(r *ModulePullRequest) (bool, error) {
	tx := ap.tx
	if !has(tx, `SELECT 1 FROM modules WHERE name = ?`, r.Module) {
		return false, ruleErr(ErrNotFound, "module %q is not in the catalogue (%s)", r.Module, listOf(tx, `SELECT name FROM modules ORDER BY name`, "mesh module list"))
	}
	if !has(tx, `SELECT 1 FROM assignments WHERE module = ?`, r.Module) {
		return false, ruleErr(ErrConflict, "module %q is assigned to no node; there is nothing to pull (a node pulls what it needs when the module is assigned)", r.Module)
	}
	mustExec(tx, `INSERT INTO pulls (module, idx) VALUES (?, ?) ON CONFLICT (module) DO UPDATE SET idx = excluded.idx`, r.Module, ap.index)
	return true, nil
}

func (ap *applier) assign(r *AssignRequest) (bool, error) {
	tx, a := ap.tx, r.Assignment
	if err := needNode(tx, a.Node); err != nil {
		return false, err
	}
	if !has(tx, `SELECT 1 FROM modules WHERE name = ?`, a.Module) {
		return false, ruleErr(ErrNotFound, "module %q is not in the catalogue (%s)", a.Module, listOf(tx, `SELECT name FROM modules ORDER BY name`, "mesh module add FILE"))
	}
	if has(tx, `SELECT 1 FROM assignments WHERE node = ? AND module = ?`, a.Node, a.Module) {
		return false, nil // already so; nothing to do
	}
	if err := ap.s.checkProviders(ap.ctx, tx, a.Module); err != nil {
		return false, err
	}
	mustExec(tx, `INSERT INTO assignments (node, module, seq) VALUES (?, ?, ?)`, a.Node, a.Module, ap.index)
	if err := ap.takeSecrets(r.Secrets); err != nil {
		return false, err
	}
	return true, nil
}

func (ap *applier) unassign(r *UnassignRequest) (bool, error) {
	tx, a := ap.tx, r.Assignment
	if err := needNode(tx, a.Node); err != nil {
		return false, err
	}
	if !has(tx, `SELECT 1 FROM assignments WHERE node = ? AND module = ?`, a.Node, a.Module) {
		return false, ruleErr(ErrNotFound, "module %q is not assigned to node %q (%s)", a.Module, a.Node, listOf(tx, `SELECT module FROM assignments WHERE node = ? ORDER BY module`, "nothing is assigned there", a.Node))
	}
	mustExec(tx, `DELETE FROM assignments WHERE node = ? AND module = ?`, a.Node, a.Module)
	return true, nil
}

func (ap *applier) tokenRotate(r *TokenRotateRequest) (bool, error) {
	if r.Sealed != nil {
		if r.Sealed.Sealed == "" || len(r.Sealed.Recipients) == 0 {
			return false, ruleErr(ErrInvalid, "token rotation with a malformed sealed secret")
		}
		// Sealed to the voters as the proposer saw them; if that is not
		// the voters now, a voter seals it again.
		rec := slices.Clone(r.Sealed.Recipients)
		sort.Strings(rec)
		ap.setVoterSecret("join_secret", r.Sealed.Sealed, rec)
		return false, nil
	}
	if r.JoinSecret == "" {
		return false, ruleErr(ErrInvalid, "token rotation without a new secret")
	}
	mustExec(ap.tx, `UPDATE settings SET value = ? WHERE key = 'join_secret'`, r.JoinSecret)
	return false, nil
}

func (ap *applier) report(r *ReportRequest) (bool, error) {
	rep := &r.Report
	if err := needNode(ap.tx, rep.Node); err != nil {
		return false, err
	}
	mustExec(ap.tx, `INSERT INTO reports VALUES (?, ?, ?, ?) ON CONFLICT (node) DO UPDATE SET version = excluded.version, applied_at = excluded.applied_at, body = excluded.body`,
		rep.Node, rep.Version, rep.AppliedAt.UTC().Format(timeLayout), jsonString(rep))
	return false, nil
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

func needNode(tx *sql.Tx, name string) error {
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

// catalogue reads every module's parsed form.
func (s *Store) catalogue(ctx context.Context, q queryer) (map[string]*manifest.Manifest, error) {
	// The FSM reads the catalogue it keeps, unless the command being
	// applied changes it (then its transaction is the truth).
	ap := applying(ctx)
	if ap != nil && !ap.catChanged && s.cat != nil {
		return s.cat, nil
	}
	cat, err := s.readCatalogue(ctx, q)
	if err == nil && ap != nil && !ap.catChanged {
		s.cat = cat
	}
	return cat, err
}

// applying is the command being applied in ctx, nil outside the FSM.
func applying(ctx context.Context) *applier {
	ap, _ := ctx.Value(applyingKey{}).(*applier)
	return ap
}

// applyingKey marks the context of a command being applied; its value is
// the *applier.
type applyingKey struct{}

// catalogueChanges says the command being applied writes the catalogue:
// what the FSM keeps of it is no longer the truth, whether or not the
// command commits.
func (ap *applier) catalogueChanges() {
	ap.catChanged = true
	ap.s.cat = nil
	ap.s.catPub.Store(nil)
}

func (s *Store) readCatalogue(ctx context.Context, q queryer) (map[string]*manifest.Manifest, error) {
	// The parsed forms are read only for the digests not decoded yet: every
	// command recomposes, and reading every module's spec each time was most
	// of an assign's cost with a large catalogue.
	rows, err := q.QueryContext(ctx, `SELECT name, file, digest FROM modules`)
	if err != nil {
		return nil, err
	}
	cat := map[string]*manifest.Manifest{}
	type miss struct{ name, file, digest string }
	var missing []miss
	s.mu.Lock()
	for rows.Next() {
		var r miss
		if err := rows.Scan(&r.name, &r.file, &r.digest); err != nil {
			s.mu.Unlock()
			rows.Close()
			return nil, err
		}
		if m, ok := s.parsed[r.digest]; ok {
			cat[r.name] = m
		} else {
			missing = append(missing, r)
		}
	}
	s.mu.Unlock()
	if err := rows.Close(); err != nil {
		return nil, err
	}
	if err := rows.Err(); err != nil {
		return nil, err
	}
	for _, r := range missing {
		var spec string
		if err := q.QueryRowContext(ctx, `SELECT spec FROM modules WHERE name = ?`, r.name).Scan(&spec); err != nil {
			return nil, fmt.Errorf("read the stored form of module %s: %w", r.name, err)
		}
		m, err := s.manifestOf(r.file, r.digest, spec)
		if err != nil {
			return nil, fmt.Errorf("the stored form of module %s does not decode: %w", r.name, err)
		}
		cat[r.name] = m
	}
	return cat, nil
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
	in.Pulls = map[string]uint64{}
	rows, err = q.QueryContext(ctx, `SELECT module, idx FROM pulls`)
	if err != nil {
		return in, err
	}
	for rows.Next() {
		var m string
		var i uint64
		if err := rows.Scan(&m, &i); err != nil {
			rows.Close()
			return in, fmt.Errorf("read pulls: %w", err)
		}
		in.Pulls[m] = i
	}
	rows.Close()
	return in, nil
}

// recompose derives roster and plans after a change and records what moved: a
// new plan version for each node whose plan digest changed, the composition
// error of each node that failed (its last good plan and names are kept).
func (s *Store) recompose(ctx context.Context, tx *sql.Tx, index uint64, at, cause string) error {
	in, err := s.input(ctx, tx)
	if err != nil {
		return err
	}
	out := Compose(in)
	roster := out.Roster
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
	roster = slices.Compact(roster) // the table's key is the whole row
	var old []Name
	a := applying(ctx)
	if kept := s.roster.Load(); kept != nil && a != nil && !a.rosterChanged {
		old = *kept
	} else if old, err = readRoster(ctx, tx); err != nil {
		return err
	}
	for _, c := range RosterChanges(old, roster) {
		mustExec(tx, `INSERT INTO roster_history VALUES (?, ?, ?, ?, ?, ?, ?)`, index, at, cause, c.Op, c.Name, c.Address, c.Node)
	}
	// Only the rows that changed are written: rewriting the whole roster on
	// every command cost as much as the rest of the apply.
	was := map[Name]bool{}
	for _, r := range old {
		was[r] = true
	}
	now := map[Name]bool{}
	for _, r := range roster {
		if !now[r] && !was[r] {
			mustExec(tx, `INSERT OR IGNORE INTO roster VALUES (?, ?, ?)`, r.Name, r.Address, r.Node)
		}
		now[r] = true
	}
	for _, r := range old {
		if !now[r] {
			mustExec(tx, `DELETE FROM roster WHERE name = ? AND address = ? AND node = ?`, r.Name, r.Address, r.Node)
		}
	}
	if a != nil {
		a.roster = roster
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
