package state

import (
	"cmp"
	"context"
	"crypto/sha256"
	"database/sql"
	"encoding/hex"
	"errors"
	"fmt"
	"maps"
	"slices"
	"sort"
	"strings"
	"syscall"
	"time"

	"mesh/state/manifest"

	"modernc.org/sqlite"
	sqlite3 "modernc.org/sqlite/lib"
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

// SecretDigest is how a secret is compared (DESIGN.md rule 7).
func SecretDigest(secret string) string {
	s := sha256.Sum256([]byte(secret))
	return hex.EncodeToString(s[:])
}

// Apply applies one log entry at index. An entry that cannot be decoded means
// the log is corrupt, and Apply panics. A command that breaks a rule returns
// an error, the same on every replica, and changes nothing. A full disk makes
// it wait; any other failure of this replica (an I/O error) panics, naming
// the entry (applyLocked). Entries at or below the applied index are
// skipped, so a replay after restart is harmless.
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

// applyLocked applies one decoded command; the caller holds applyMu. It
// is the one place where a command's failure is told apart: a broken rule
// is the command's outcome (applyTx), a full disk makes it wait, and any
// other failure stops the node.
func (s *Store) applyLocked(index uint64, c *Command, req Request) error {
	for waited := time.Duration(0); ; {
		broken, err := s.applyTx(index, c.V, c.Time, req)
		if err == nil {
			return broken
		}
		if !IsDiskFull(err) {
			// An I/O failure (a damaged file, a statement that fails) is no
			// rule: the other replicas applied the command, so this one can
			// neither skip it nor record it as refused. It stops, loudly.
			msg := fmt.Sprintf("state: apply log entry %d (%s): %v; this node stops applying rather than diverge from the other replicas", index, req.Op(), err)
			if IsDamaged(err) {
				msg += "; " + DamagedWayOut
			}
			panic(msg)
		}
		// A full disk is not a broken rule and not a reason to die: the command
		// waits, whole, until there is space again (reads and the resolver keep
		// answering from what is applied), then applies exactly as it would have.
		if waited == 0 && s.OnDiskFull != nil {
			s.OnDiskFull(index)
		}
		time.Sleep(DiskFullRetry)
		waited += DiskFullRetry
	}
}

// DiskFullRetry is how often a command that met a full disk is tried again.
var DiskFullRetry = time.Second

// IsDiskFull reports whether err, however wrapped, is a full disk: the
// errno (a file's write, the Raft log store's) or SQLite's SQLITE_FULL, the
// primary result code (the low byte) of the driver's error.
func IsDiskFull(err error) bool {
	var se *sqlite.Error
	return errors.Is(err, syscall.ENOSPC) || errors.As(err, &se) && se.Code()&0xff == sqlite3.SQLITE_FULL
}

// IsDamaged reports whether err, however wrapped, is SQLite finding the
// state database damaged (SQLITE_CORRUPT) or not a database at all
// (SQLITE_NOTADB).
func IsDamaged(err error) bool {
	var se *sqlite.Error
	if !errors.As(err, &se) {
		return false
	}
	c := se.Code() & 0xff
	return c == sqlite3.SQLITE_CORRUPT || c == sqlite3.SQLITE_NOTADB
}

// DamagedWayOut is what to do with a damaged state database: it holds only
// what the Raft log and snapshot hold, and the node makes it again.
const DamagedWayOut = "the state database is damaged: stop the agent, move state.db, state.db-wal and state.db-shm aside (keep them), and start it again; the node makes its replica again from its Raft snapshot and log (or from the leader's)"

// beginAgain, when set (tests), is the error of beginning a transaction
// again after a command was refused, as a full disk can give.
var beginAgain func() error

// errNotCommitted is the outcome of a command that committed nothing, for
// what the FSM keeps of it.
var errNotCommitted = errors.New("not committed")

// applyTx applies req in one transaction. broken is the rule the command
// broke: it is rolled back and its index recorded all the same, so every
// replica agrees on the refusal and a replay skips it. err is any other
// failure, with nothing committed (applyLocked decides what follows).
func (s *Store) applyTx(index uint64, v int, at time.Time, req Request) (broken, err error) {
	// Apply is never cancelled half-way: the context carries nothing.
	ctx := context.Background()
	tx, err := s.db.BeginTx(ctx, nil)
	if err != nil {
		return nil, fmt.Errorf("begin the transaction: %w", err)
	}
	defer tx.Rollback()
	var applied uint64
	q := txStmts{s, tx}
	if err := q.QueryRowContext(ctx, `SELECT idx FROM applied WHERE id = 1`).Scan(&applied); err != nil {
		return nil, fmt.Errorf("read the applied index: %w", err)
	}
	if index <= applied {
		return nil, nil
	}
	ap := &applier{s: s, ctx: ctx, tx: tx, q: q, index: index, v: v, at: at.UTC().Format(timeLayout)}
	// The kept catalogue, which the command edits in place, is settled on
	// every way out: kept once committed, else forgotten.
	settled := false
	defer func() {
		if !settled {
			ap.catalogueCommitted(errNotCommitted)
		}
	}()
	recompose, err := ap.apply(req)
	if err == nil && recompose {
		err = ap.recompose(causeAt(req, ap.v))
	}
	if err == nil {
		err = ap.settleInputs()
	}
	var rule *RuleError
	switch {
	case errors.As(err, &rule):
		// Roll the command back but still record the index, so the replay skips it.
		broken = err
		tx.Rollback()
		if beginAgain != nil {
			if err := beginAgain(); err != nil {
				return nil, fmt.Errorf("begin the transaction: %w", err)
			}
		}
		if tx, err = s.db.BeginTx(ctx, nil); err != nil {
			return nil, fmt.Errorf("begin the transaction: %w", err)
		}
		defer tx.Rollback()
	case err != nil:
		return nil, err
	}
	if err := (txStmts{s, tx}).exec(`UPDATE applied SET idx = ? WHERE id = 1`, index); err != nil {
		return nil, fmt.Errorf("record the applied index: %w", err)
	}
	if err := tx.Commit(); err != nil {
		return nil, fmt.Errorf("commit: %w", err)
	}
	s.committed()
	if broken == nil && ap.roster != nil {
		s.roster.Store(ap.roster)
		s.rosterBy = ap.rosterBy
	}
	if broken == nil && ap.assignedDirty {
		s.assigned, s.assignedAt = nil, nil
		if ap.assignedKnown {
			s.assigned, s.assignedAt = ap.assigned, ap.assignedAt
		}
	}
	ap.catalogueCommitted(broken)
	settled = true
	s.inputsCommitted(ap, broken)
	if broken == nil && (ap.reported != nil || ap.reportsForgotten) {
		s.reportsCommitted(ap.reported, ap.reportsForgotten)
	}
	s.notify()
	return broken, nil
}

// RuleError is a command's broken rule: a sentence for the operator, and the
// kind (ErrNotFound, ErrConflict, ErrInvalid) for callers that branch on it.
// Inside Apply it is the only error that is a command's outcome; any other
// is a failure of this replica.
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
// per op (Nomad's fsm.go shape), found in the table of ops (command.go).
// Each reports whether composition must run again, or the rule the request
// broke, or an I/O error (which is not the command's outcome: see
// applyLocked). What the functions share about the command being applied
// is here, passed to each, never carried in a context.
type applier struct {
	s   *Store
	ctx context.Context // carries nothing (applyTx)
	tx  *sql.Tx
	// q runs the statements of every command prepared (prepared.go).
	q     txStmts
	index uint64
	// v is the command's format: a rule added in a format holds only for
	// commands of that format or later, which every replica that applies
	// them knows (an older one stops there), so replicas never disagree.
	v  int
	at string // the proposer's time
	// catEdited says the command edited the kept catalogue in place
	// (catalogueSet); catWhole that it rewrote the table whole (a
	// restore), which is then the only truth (catalogue.go).
	catWhole, catEdited bool
	// rosterChanged: this command writes the roster table itself (besides
	// recompose), so the kept roster is not what it diffs against.
	rosterChanged bool
	// roster is the roster recompose wrote, kept once the command commits,
	// and rosterBy its rows by node.
	roster   *Roster
	rosterBy *rosterByNode
	// incremental: this command says which nodes' plans it can change (an
	// assign, an unassign, a module add), so recompose composes those only;
	// touched is what it changed (incremental.go). Any other command
	// recomposes every node.
	incremental bool
	touched     touches
	// assigned is this command's copy of the assignments table, once it
	// edited it or read it (assignedDirty); assignedKnown is false when it
	// wrote the table without a copy to edit (assigned.go).
	assigned                     []Assignment
	assignedKnown, assignedDirty bool
	assignedAt                   map[string][]Assignment
	// inputs are the kept tables an input reads whole, once this command
	// took them from the store (inputsTaken); marks the keys it wrote since
	// (keptinputs.go).
	inputs      *keptInputs
	inputsTaken bool
	marks       inputMarks
	// reported is the report this command wrote (node and body);
	// reportsForgotten says it removed one (reportbodies.go).
	reported         *[2]string
	reportsForgotten bool
	// clashesBefore is the whole rule on host names before a module add,
	// for checkComposition to compare the rule about its hosts with.
	clashesBefore []string
}

// rosterChanges says the command being applied writes the roster table
// outside recompose: what the store keeps of it is no longer the truth.
func (ap *applier) rosterChanges() {
	ap.rosterChanged = true
	ap.s.roster.Store(nil)
}

// apply runs the op's apply function.
func (ap *applier) apply(req Request) (bool, error) {
	op, ok := ops[req.Op()]
	if !ok {
		return false, fmt.Errorf("apply a %s command: no apply function for it", req.Op())
	}
	return op.apply(ap, req)
}

func (ap *applier) init(r *InitRequest) (bool, error) {
	tx := ap.tx
	if err := refuseIf(tx, ruleErr(ErrConflict, "this mesh is already initialised"), `SELECT 1 FROM settings WHERE key = 'mesh_id'`); err != nil {
		return false, err
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
	if err := exec(tx, `INSERT INTO settings VALUES ('mesh_id', ?), ('domain', ?), ('created_at', ?), ('ca_cert', ?), ('ca_key', ?), ('join_secret', ?), ('voters', ?)`,
		r.MeshID, domain, ap.at, r.CACert, r.CAKey, r.JoinSecret, fmt.Sprint(voters)); err != nil {
		return false, err
	}
	if ap.v >= historyFormat {
		if err := ap.setHistoryBound(DefaultHistoryVersions, DefaultHistoryDays); err != nil {
			return false, err
		}
	}
	if v := r.SealedCAKey; v != nil {
		if err := ap.setVoterSecret("ca_key", v.Sealed, v.Recipients); err != nil {
			return false, err
		}
	}
	if v := r.SealedJoinSecret; v != nil {
		if err := ap.setVoterSecret("join_secret", v.Sealed, v.Recipients); err != nil {
			return false, err
		}
	}
	if err := exec(tx, `INSERT INTO nodes (name, address, voter, added_at, port, seal_key, overlay_key, overlay_endpoint) VALUES (?, ?, 1, ?, ?, ?, ?, ?)`,
		r.Node.Name, r.Node.Address, ap.at, r.Node.Port, r.Node.SealKey, r.Node.OverlayKey, r.Node.OverlayEndpoint); err != nil {
		return false, err
	}
	if r.Overlay != "" {
		if r.Overlay != OverlayOff {
			if _, err := ParseOverlay(r.Overlay); err != nil {
				return false, ruleErr(ErrInvalid, "%v", err)
			}
		}
		if err := exec(tx, `INSERT INTO settings VALUES ('overlay', ?)`, r.Overlay); err != nil {
			return false, err
		}
		if r.Overlay != OverlayOff && r.Node.OverlayKey != "" {
			if err := ap.giveOverlayAddress(r.Node.Name, r.Overlay); err != nil {
				return false, err
			}
		}
	}
	return true, nil
}

func (ap *applier) nodeAdd(r *NodeAddRequest) (bool, error) {
	tx, n := ap.tx, r.Node
	if n.Name == "" || n.Address == "" {
		return false, ruleErr(ErrInvalid, "node.add without a node")
	}
	if err := refuseIf(tx, ruleErr(ErrConflict, "node %q is already in the mesh", n.Name), `SELECT 1 FROM nodes WHERE name = ?`, n.Name); err != nil {
		return false, err
	}
	if err := refuseIf(tx, ruleErr(ErrConflict, "address %s is already taken by another node", n.Address), `SELECT 1 FROM nodes WHERE address = ?`, n.Address); err != nil {
		return false, err
	}
	if n.SealKey != "" {
		if err := refuseIf(tx, ruleErr(ErrConflict, "another node already holds that sealing key"), `SELECT 1 FROM nodes WHERE seal_key = ?`, n.SealKey); err != nil {
			return false, err
		}
	}
	if n.OverlayKey != "" {
		if err := refuseIf(tx, ruleErr(ErrConflict, "another node already holds that overlay key"), `SELECT 1 FROM nodes WHERE overlay_key = ?`, n.OverlayKey); err != nil {
			return false, err
		}
	}
	if err := exec(tx, `INSERT INTO nodes (name, address, voter, added_at, port, seal_key, overlay_key, overlay_endpoint) VALUES (?, ?, ?, ?, ?, ?, ?, ?)`,
		n.Name, n.Address, n.Voter, ap.at, n.Port, n.SealKey, n.OverlayKey, n.OverlayEndpoint); err != nil {
		return false, err
	}
	if n.OverlayKey != "" {
		prefix, err := ap.overlay()
		if err != nil {
			return false, err
		}
		if prefix != "" && prefix != OverlayOff {
			if err := ap.giveOverlayAddress(n.Name, prefix); err != nil {
				return false, err
			}
		}
	}
	return true, nil
}

func (ap *applier) nodeRemove(r *NodeRemoveRequest) (bool, error) {
	tx := ap.tx
	if err := needNode(tx, r.Name); err != nil {
		return false, err
	}
	mods, err := listRows(tx, `SELECT module FROM assignments WHERE node = ? ORDER BY module`, r.Name)
	if err != nil {
		return false, err
	}
	if len(mods) > 0 && !r.Force {
		return false, ruleErr(ErrConflict, "node %q still runs %s; unassign them first or pass --force", r.Name, strings.Join(mods, ", "))
	}
	if err := exec(tx, `DELETE FROM assignments WHERE node = ?`, r.Name); err != nil {
		return false, err
	}
	ap.assignedDeleteNode(r.Name)
	for _, m := range mods {
		if err := ap.endIfUnassigned(m); err != nil {
			return false, err
		}
	}
	if err := exec(tx, `DELETE FROM nodes WHERE name = ?`, r.Name); err != nil {
		return false, err
	}
	ap.rosterChanges()
	if err := exec(tx, `DELETE FROM roster WHERE node = ?`, r.Name); err != nil {
		return false, err
	}
	if err := exec(tx, `DELETE FROM purges WHERE node = ?`, r.Name); err != nil {
		return false, err
	}
	// A move from or to it ends with it (its assignments went above).
	if err := exec(tx, `DELETE FROM moves WHERE from_node = ? OR to_node = ?`, r.Name, r.Name); err != nil {
		return false, err
	}
	if err := exec(tx, `DELETE FROM reports WHERE node = ?`, r.Name); err != nil {
		return false, err
	}
	ap.reportsForgotten = true
	// The last node a rotation of the CA waited for may be this one.
	return true, ap.finishRotation()
}

func (ap *applier) publicDomain(r *PublicDomainRequest) (bool, error) {
	if err := needNode(ap.tx, r.Node); err != nil {
		return false, err
	}
	var have string
	if err := ap.tx.QueryRow(`SELECT public_domain FROM nodes WHERE name = ?`, r.Node).Scan(&have); err != nil {
		return false, err
	}
	clashes, err := ap.hostsBefore()
	if err != nil {
		return false, err
	}
	want, err := r.changeDomains(splitDomains(have))
	if err != nil {
		return false, err
	}
	if err := exec(ap.tx, `UPDATE nodes SET public_domain = ? WHERE name = ?`, strings.Join(want, " "), r.Node); err != nil {
		return false, err
	}
	return true, ap.checkHosts(clashes)
}

// moduleAdd stores manifests the proposer parsed and checked. It reads their
// parsed form and never their text.
func (ap *applier) moduleAdd(r *ModuleAddRequest) (bool, error) {
	if len(r.Modules) == 0 {
		return false, ruleErr(ErrInvalid, "module add needs at least one manifest")
	}
	// The cause of each version kept, once: made for each module, it
	// sorted every file's name for each (seconds at 10,000 modules).
	cause := causeAt(r, ap.v)
	clashes, hosts, err := ap.moduleHostsBefore(r.Modules)
	if err != nil {
		return false, err
	}
	// The catalogue before the command: a changed module's providers
	// before are affected too (incremental composition).
	before, err := ap.catalogue()
	if err != nil {
		return false, err
	}
	ap.incremental = true
	seen := map[string]string{}
	for i := range r.Modules {
		sp := &r.Modules[i]
		if err := sp.check(); err != nil {
			return false, err
		}
		name := sp.Manifest.Module
		ap.touch("", name)
		ap.touchNodesOf(credentialProviders(before[name])...)
		ap.touchNodesOf(credentialProviders(sp.Manifest)...)
		if other, dup := seen[name]; dup {
			return false, ruleErr(ErrInvalid, "module %q is given twice (%s and %s)", name, other, sp.File)
		}
		// Its data directories are the move's while it moves.
		if err := ap.refuseMoving(name, "change its manifest"); err != nil {
			return false, err
		}
		seen[name] = sp.File
		// Rollouts (rollout.go), for commands of their format: a version
		// is kept in the module's history, and a change to a module that
		// rolls out starts its rollout.
		var prev uint64
		var prevDigest string
		// A module with a rollout row is handled so by any command: such a
		// row exists only after a command of the format, which every
		// replica that goes on applying knows.
		rolls := ap.v >= rolloutFormat
		if !rolls {
			ok, err := has(ap.tx, `SELECT 1 FROM rollouts WHERE module = ?`, name)
			if err != nil {
				return false, err
			}
			rolls = ok
		}
		if rolls {
			err := ap.tx.QueryRow(`SELECT version, digest FROM modules WHERE name = ?`, name).Scan(&prev, &prevDigest)
			if err != nil && !errors.Is(err, sql.ErrNoRows) {
				return false, err
			}
			if prevDigest != "" && prevDigest != sp.Digest {
				if err := refuseDuringRollout(ap.tx, name); err != nil {
					return false, err
				}
				if err := refuseAfterStoppedSecret(ap.tx, name); err != nil {
					return false, err
				}
				if err := ap.keepHistory(name); err != nil {
					return false, err
				}
			}
		}
		// The row is written when the module is new or its digest changed
		// (the statement's WHERE), and so is the kept catalogue.
		specJSON := sp.specJSON()
		if b := before[name]; b == nil || b.Digest != sp.Digest {
			m, err := ap.s.manifestOf(sp.File, sp.Digest, specJSON)
			if err != nil {
				return false, fmt.Errorf("decode the parsed form of module %s: %w", name, err)
			}
			if err := ap.catalogueSet(name, m); err != nil {
				return false, err
			}
		}
		if err := exec(ap.tx, `INSERT INTO modules (name, file, manifest, digest, version, added_at, spec) VALUES (?, ?, ?, ?, ?, ?, ?)
			ON CONFLICT (name) DO UPDATE SET file = excluded.file, manifest = excluded.manifest, digest = excluded.digest, version = excluded.version, added_at = excluded.added_at, spec = excluded.spec
			WHERE modules.digest != excluded.digest`, name, sp.File, sp.Text, sp.Digest, ap.index, ap.at, specJSON); err != nil {
			return false, err
		}
		if rolls && prevDigest != sp.Digest {
			if err := ap.recordVersion(name, cause); err != nil {
				return false, err
			}
			if prevDigest != "" {
				if err := ap.startRollout(name, sp.Manifest, prev); err != nil {
					return false, err
				}
			}
		}
	}
	if err := ap.takeSecrets(r.Secrets); err != nil {
		return false, err
	}
	return true, ap.checkHostsAmong(clashes, hosts)
}

func (ap *applier) moduleRemove(r *ModuleRemoveRequest) (bool, error) {
	tx := ap.tx
	if err := needModule(tx, r.Name, "mesh module list"); err != nil {
		return false, err
	}
	nodes, err := listRows(tx, `SELECT node FROM assignments WHERE module = ? ORDER BY node`, r.Name)
	if err != nil {
		return false, err
	}
	if len(nodes) > 0 {
		return false, ruleErr(ErrConflict, "module %q is assigned to %s; unassign it first", r.Name, strings.Join(nodes, ", "))
	}
	if err := ap.catalogueSet(r.Name, nil); err != nil {
		return false, err
	}
	if err := exec(tx, `DELETE FROM modules WHERE name = ?`, r.Name); err != nil {
		return false, err
	}
	ap.markPull(r.Name)
	if err := exec(tx, `DELETE FROM pulls WHERE module = ?`, r.Name); err != nil {
		return false, err
	}
	if err := ap.dropRollout(r.Name); err != nil {
		return false, err
	}
	if err := exec(tx, `DELETE FROM moves WHERE module = ?`, r.Name); err != nil {
		return false, err
	}
	if err := exec(tx, `DELETE FROM module_history WHERE module = ?`, r.Name); err != nil {
		return false, err
	}
	ap.markRestartsOf(r.Name)
	if err := exec(tx, `DELETE FROM restarts WHERE module = ?`, r.Name); err != nil {
		return false, err
	}
	return true, nil
}

// modulePull records the pull in the module's plans (each of its
// containers carries the index), so every node running it pulls and
// replaces what changed; nothing else about the containers moves.
func (ap *applier) modulePull(r *ModulePullRequest) (bool, error) {
	tx := ap.tx
	if err := needModule(tx, r.Module, "mesh module list"); err != nil {
		return false, err
	}
	if err := ap.refuseMoving(r.Module, "pull it"); err != nil {
		return false, err
	}
	assigned, err := has(tx, `SELECT 1 FROM assignments WHERE module = ?`, r.Module)
	if err != nil {
		return false, err
	}
	if !assigned {
		return false, ruleErr(ErrConflict, "module %q is assigned to no node; there is nothing to pull (a node pulls what it needs when the module is assigned)", r.Module)
	}
	// A pull rolls out as a new manifest does (rollout.go), for commands of
	// that format and modules with a rollout row.
	rolls := ap.v >= rolloutFormat
	if !rolls {
		if rolls, err = has(tx, `SELECT 1 FROM rollouts WHERE module = ?`, r.Module); err != nil {
			return false, err
		}
	}
	var prev uint64
	if rolls {
		if err := refuseDuringRollout(tx, r.Module); err != nil {
			return false, err
		}
		if err := refuseAfterStoppedSecret(tx, r.Module); err != nil {
			return false, err
		}
		if err := tx.QueryRow(`SELECT idx FROM pulls WHERE module = ?`, r.Module).Scan(&prev); err != nil && !errors.Is(err, sql.ErrNoRows) {
			return false, err
		}
	}
	ap.markPull(r.Module)
	if err := exec(tx, `INSERT INTO pulls (module, idx) VALUES (?, ?) ON CONFLICT (module) DO UPDATE SET idx = excluded.idx`, r.Module, ap.index); err != nil {
		return false, err
	}
	if rolls {
		return true, ap.startPullRollout(r.Module, prev)
	}
	return true, nil
}

// assign assigns each module of the command, all or none: one refused
// refuses the command, and the transaction that made the others goes.
func (ap *applier) assign(r *AssignRequest) (bool, error) {
	if err := distinct(r.All()); err != nil {
		return false, err
	}
	ap.incremental = true
	// The rule on host names: per module before format 16, else once for
	// the whole batch (batchHostsFormat).
	perModule := ap.v < batchHostsFormat
	var clashes []string
	var hosts map[string]bool
	if !perModule {
		var err error
		if clashes, hosts, err = ap.assignHostsBefore(r.All()); err != nil {
			return false, err
		}
	}
	changed := false
	for _, a := range r.All() {
		c, err := ap.assignOne(a, perModule)
		if err != nil {
			return false, err
		}
		changed = changed || c
	}
	if !changed {
		return false, nil
	}
	if !perModule {
		if err := ap.checkHostsAmong(clashes, hosts); err != nil {
			return false, err
		}
	}
	if err := ap.takeSecrets(r.Secrets); err != nil {
		return false, err
	}
	return true, nil
}

// distinct refuses a batch that names a module twice.
func distinct(as []Assignment) error {
	seen := map[string]bool{}
	for _, a := range as {
		if seen[a.Module] {
			return ruleErr(ErrInvalid, "module %q is named twice; name each module once", a.Module)
		}
		seen[a.Module] = true
	}
	return nil
}

// assignOne assigns one module of an assign; hosts says it checks the rule
// on host names for it (else the caller checks the whole command).
func (ap *applier) assignOne(a Assignment, hosts bool) (bool, error) {
	tx := ap.tx
	if err := needNode(tx, a.Node); err != nil {
		return false, err
	}
	if err := needModule(tx, a.Module, "mesh module add FILE"); err != nil {
		return false, err
	}
	already, err := has(tx, `SELECT 1 FROM assignments WHERE node = ? AND module = ?`, a.Node, a.Module)
	if err != nil || already {
		return false, err // already so, nothing to do (or the error reading it)
	}
	cat, err := ap.catalogue()
	if err != nil {
		return false, err
	}
	if err := checkProviders(cat, a.Module); err != nil {
		return false, err
	}
	if err := ap.refuseDraining(a.Node, a.Module); err != nil {
		return false, err
	}
	if err := ap.refuseMoving(a.Module, "assign it"); err != nil {
		return false, err
	}
	var clashes []string
	if hosts {
		if clashes, err = ap.hostsBefore(); err != nil {
			return false, err
		}
	}
	if err := exec(tx, `INSERT INTO assignments (node, module, seq) VALUES (?, ?, ?)`, a.Node, a.Module, ap.index); err != nil {
		return false, err
	}
	ap.assignedInsert(Assignment{Node: a.Node, Module: a.Module, Seq: ap.index})
	ap.touch(a.Node, a.Module)
	// Assigned again, its data is its own again: a purge asked before is
	// not done now, nor the finish of a move from there.
	if err := exec(tx, `DELETE FROM purges WHERE node = ? AND module = ?`, a.Node, a.Module); err != nil {
		return false, err
	}
	if err := exec(tx, `DELETE FROM moves WHERE module = ? AND from_node = ? AND phase IN ('done', 'aborted')`, a.Module, a.Node); err != nil {
		return false, err
	}
	if hosts {
		if err := ap.checkHosts(clashes); err != nil {
			return false, err
		}
	}
	return true, nil
}

// unassign takes each module of the command off its node, all or none.
func (ap *applier) unassign(r *UnassignRequest) (bool, error) {
	if err := distinct(r.All()); err != nil {
		return false, err
	}
	if len(r.More) > 0 && len(r.PurgeData) > 0 {
		return false, ruleErr(ErrInvalid, "--purge-data takes one module at a time; nothing was changed")
	}
	ap.incremental = true
	for _, a := range r.All() {
		if err := ap.unassignOne(a, r.PurgeData); err != nil {
			return false, err
		}
	}
	return true, nil
}

func (ap *applier) unassignOne(a Assignment, purgeData []string) error {
	tx := ap.tx
	if err := needNode(tx, a.Node); err != nil {
		return err
	}
	assigned, err := has(tx, `SELECT 1 FROM assignments WHERE node = ? AND module = ?`, a.Node, a.Module)
	if err != nil {
		return err
	}
	if !assigned {
		known, err := listOf(tx, `SELECT module FROM assignments WHERE node = ? ORDER BY module`, "nothing is assigned there", a.Node)
		if err != nil {
			return err
		}
		return ruleErr(ErrNotFound, "module %q is not assigned to node %q (%s)", a.Module, a.Node, known)
	}
	if err := ap.refuseMoving(a.Module, "unassign it"); err != nil {
		return err
	}
	if len(purgeData) > 0 && ap.v >= purgeMovedFormat {
		if err := ap.refuseMovedHere(a); err != nil {
			return err
		}
	}
	if len(purgeData) > 0 {
		cat, err := ap.catalogue()
		if err != nil {
			return err
		}
		var data []string
		if m := cat[a.Module]; m != nil {
			data = m.DataDirs()
		}
		for _, p := range purgeData {
			if !slices.Contains(data, p) {
				return ruleErr(ErrInvalid, "--purge-data: %q is not a data directory of module %q; nothing was changed", p, a.Module)
			}
			if err := exec(tx, `INSERT INTO purges (node, module, path, idx) VALUES (?, ?, ?, ?) ON CONFLICT (node, path) DO UPDATE SET module = excluded.module, idx = excluded.idx`, a.Node, a.Module, p, ap.index); err != nil {
				return err
			}
		}
	}
	if err := exec(tx, `DELETE FROM assignments WHERE node = ? AND module = ?`, a.Node, a.Module); err != nil {
		return err
	}
	ap.assignedDelete(a.Node, a.Module)
	ap.touch(a.Node, a.Module)
	if err := ap.endIfUnassigned(a.Module); err != nil {
		return err
	}
	return nil
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
		return false, ap.setVoterSecret("join_secret", r.Sealed.Sealed, rec)
	}
	if r.JoinSecret == "" {
		return false, ruleErr(ErrInvalid, "token rotation without a new secret")
	}
	return false, exec(ap.tx, `UPDATE settings SET value = ? WHERE key = 'join_secret'`, r.JoinSecret)
}

func (ap *applier) report(r *ReportRequest) (bool, error) {
	// Bounded on every replica alike, whatever the node sent (an older
	// binary, a damaged one): a report is kept by every node.
	r.Report.Bound()
	rep := &r.Report
	if err := needNode(ap.tx, rep.Node); err != nil {
		return false, err
	}
	body := jsonString(rep)
	ap.reported = &[2]string{rep.Node, body}
	return false, exec(ap.tx, `INSERT INTO reports VALUES (?, ?, ?, ?) ON CONFLICT (node) DO UPDATE SET version = excluded.version, applied_at = excluded.applied_at, body = excluded.body`,
		rep.Node, rep.Version, rep.AppliedAt.UTC().Format(timeLayout), body)
}

// checkProviders is the rule that module's providers are in cat.
func checkProviders(cat map[string]*manifest.Manifest, module string) error {
	m := cat[module]
	if err := manifest.CheckProviders(m, func(n string) (*manifest.Manifest, bool) { p, ok := cat[n]; return p, ok }); err != nil {
		return ruleErr(ErrInvalid, "%v", err)
	}
	return nil
}

// needNode is the rule that node name is in the mesh.
func needNode(tx *sql.Tx, name string) error {
	ok, err := has(tx, `SELECT 1 FROM nodes WHERE name = ?`, name)
	if err != nil || ok {
		return err
	}
	known, err := listOf(tx, `SELECT name FROM nodes ORDER BY name`, "mesh node list")
	if err != nil {
		return err
	}
	return ruleErr(ErrNotFound, "node %q is not in the mesh (%s)", name, known)
}

// needModule is the rule that module name is in the catalogue; none says
// what to do when the catalogue is empty.
func needModule(tx *sql.Tx, name, none string) error {
	ok, err := has(tx, `SELECT 1 FROM modules WHERE name = ?`, name)
	if err != nil || ok {
		return err
	}
	known, err := listOf(tx, `SELECT name FROM modules ORDER BY name`, none)
	if err != nil {
		return err
	}
	return ruleErr(ErrNotFound, "module %q is not in the catalogue (%s)", name, known)
}

// refuseIf is broken, a rule error, when q finds a row, and nil when it
// finds none.
func refuseIf(tx *sql.Tx, broken error, q string, args ...any) error {
	found, err := has(tx, q, args...)
	if err != nil {
		return err
	}
	if found {
		return broken
	}
	return nil
}

// listOf names what exists, for "unknown X" messages.
func listOf(tx *sql.Tx, q, none string, args ...any) (string, error) {
	names, err := listRows(tx, q, args...)
	if err != nil {
		return "", err
	}
	if len(names) == 0 {
		return "there are none; " + none, nil
	}
	if len(names) > 12 {
		names = append(names[:12], fmt.Sprintf("and %d more", len(names)-12))
	}
	return "known: " + strings.Join(names, ", "), nil
}

// The statements of Apply. Each returns its error, wrapped, for
// applyLocked to tell apart: inside Apply an error that is not a rule
// violation (an I/O error, a damaged file) must never take another branch
// than on the other replicas, so no caller reads it as "no row".

// listRows reads one column of every row q finds.
func listRows(tx *sql.Tx, q string, args ...any) ([]string, error) {
	rows, err := tx.Query(q, args...)
	if err != nil {
		return nil, fmt.Errorf("query %s: %w", q, err)
	}
	defer rows.Close()
	var out []string
	for rows.Next() {
		var n string
		if err := rows.Scan(&n); err != nil {
			return nil, fmt.Errorf("read a row of %s: %w", q, err)
		}
		out = append(out, n)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("read the rows of %s: %w", q, err)
	}
	return out, nil
}

// has reports whether q finds a row.
func has(tx *sql.Tx, q string, args ...any) (bool, error) {
	var one int
	err := tx.QueryRow(q, args...).Scan(&one)
	if err == sql.ErrNoRows {
		return false, nil
	}
	if err != nil {
		return false, fmt.Errorf("query %s: %w", q, err)
	}
	return true, nil
}

// exec runs a statement that writes.
func exec(tx *sql.Tx, q string, args ...any) error {
	if _, err := tx.Exec(q, args...); err != nil {
		return fmt.Errorf("exec %s: %w", q, err)
	}
	return nil
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

// input loads what composition reads, with the catalogue cat.
func input(ctx context.Context, q queryer, cat map[string]*manifest.Manifest) (Input, error) {
	return inputWith(ctx, q, cat, nil)
}

// inputWith is input with the assignments given (nil: read the table).
func inputWith(ctx context.Context, q queryer, cat map[string]*manifest.Manifest, assigned []Assignment) (Input, error) {
	return inputKept(ctx, q, cat, assigned, nil)
}

// input is inputWith for this command, its credentials, secrets, restarts
// and pulls from the maps the FSM keeps (keptinputs.go); at is each
// module's assignments in assigned, when known (assignedIndex). Its Bound
// is empty: a composition reads the bindings of the nodes it composes
// (readBound), and the table holds one row per binding of the fleet.
func (ap *applier) input(cat map[string]*manifest.Manifest, assigned []Assignment, at map[string][]Assignment) (Input, error) {
	k, err := ap.keptInputsNow()
	if err != nil {
		return Input{}, err
	}
	if checkComposition {
		if err := checkInputs(ap.ctx, ap.q, k); err != nil {
			return Input{}, err
		}
	}
	in, err := inputKept(ap.ctx, ap.q, cat, assigned, k)
	in.assignedAt = at
	return in, err
}

// inputKept is inputWith with the four tables of k when it is not nil.
func inputKept(ctx context.Context, q queryer, cat map[string]*manifest.Manifest, assigned []Assignment, k *keptInputs) (Input, error) {
	in := Input{Credentials: map[Pair]string{}, Bound: map[BindKey]string{}, Pulls: map[string]uint64{}, Modules: cat}
	if err := q.QueryRowContext(ctx, `SELECT value FROM settings WHERE key = 'domain'`).Scan(&in.Domain); err != nil {
		return in, fmt.Errorf("read domain: %w", err)
	}
	if err := q.QueryRowContext(ctx, `SELECT value FROM settings WHERE key = 'overlay'`).Scan(&in.Overlay); err != nil && err != sql.ErrNoRows {
		return in, fmt.Errorf("read the overlay setting: %w", err)
	}
	var err error
	if in.Nodes, err = readComposeNodes(ctx, q); err != nil {
		return in, fmt.Errorf("read nodes: %w", err)
	}
	if in.Assignments = assigned; assigned == nil {
		if in.Assignments, err = readAssignments(ctx, q); err != nil {
			return in, err
		}
	}
	in.assignedByNode = true // both are sorted by node, then module
	if k == nil {
		if in.Bound, err = readBound(ctx, q, nil); err != nil {
			return in, err
		}
		if k, err = readInputs(ctx, q); err != nil {
			return in, err
		}
	}
	in.Credentials, in.Secrets, in.Restarts, in.Pulls, in.consumers = k.credentials, k.secrets, k.restarts, k.pulls, k.consumers
	if in.Held, in.HeldPulls, in.HeldSecrets, err = heldBack(q); err != nil {
		return in, err
	}
	moves, err := readMoves(ctx, q, "")
	if err != nil {
		return in, err
	}
	in.Stopped = map[HeldKey]string{}
	for _, mv := range moves {
		if mv.Phase == MoveCopy || mv.Phase == MoveStart {
			in.Stopped[HeldKey{Node: mv.From, Module: mv.Module}] = mv.Phase
		}
	}
	in.Purges = map[string][]Purge{}
	err = eachRow(ctx, q, "purges", `SELECT node, module, path FROM purges ORDER BY node, path`, func(rows *sql.Rows) error {
		var node string
		var p Purge
		if err := rows.Scan(&node, &p.Module, &p.Path); err != nil {
			return err
		}
		in.Purges[node] = append(in.Purges[node], p)
		return nil
	})
	return in, err
}

// writeBindings makes node's rows of the bindings table p's bindings,
// writing only the rows that changed (had are its rows before): a node of
// 100 modules bound to databases rewrote 90 rows with every command that
// composed it, the most of an assign's writes in a wired fleet.
func (ap *applier) writeBindings(node string, had map[BindKey]string, p *Plan) error {
	now := map[BindKey]bool{}
	for i := range p.Resources { // by index: a Resource is 1.2 kB
		r := &p.Resources[i]
		if r.Kind != manifest.KindBinding {
			continue
		}
		k := BindKey{Node: node, Module: r.Module, Path: r.Name}
		now[k] = true
		if prov, ok := had[k]; ok && prov == r.Provider {
			continue
		}
		if err := ap.q.exec(`INSERT INTO bindings VALUES (?, ?, ?, ?) ON CONFLICT (node, module, path) DO UPDATE SET provider_node = excluded.provider_node`,
			node, r.Module, r.Name, r.Provider); err != nil {
			return err
		}
	}
	var gone []BindKey
	for k := range had {
		if !now[k] {
			gone = append(gone, k)
		}
	}
	slices.SortFunc(gone, func(a, b BindKey) int { return cmp.Or(cmp.Compare(a.Module, b.Module), cmp.Compare(a.Path, b.Path)) })
	for _, k := range gone {
		if err := ap.q.exec(`DELETE FROM bindings WHERE node = ? AND module = ? AND path = ?`, node, k.Module, k.Path); err != nil {
			return err
		}
	}
	return nil
}

// readBound is the bindings table's rows of the nodes in only (all when
// only is nil): what Input.Bound holds for the nodes composed.
func readBound(ctx context.Context, q queryer, only map[string]bool) (map[BindKey]string, error) {
	out := map[BindKey]string{}
	scan := func(rows *sql.Rows) error {
		var k BindKey
		var v string
		if err := rows.Scan(&k.Node, &k.Module, &k.Path, &v); err != nil {
			return err
		}
		out[k] = v
		return nil
	}
	if only == nil {
		return out, eachRow(ctx, q, "bindings", `SELECT node, module, path, provider_node FROM bindings`, scan)
	}
	for n := range only {
		if err := eachRow(ctx, q, "bindings", `SELECT node, module, path, provider_node FROM bindings WHERE node = ?`, scan, n); err != nil {
			return nil, err
		}
	}
	return out, nil
}

// eachRow calls scan on every row query finds; what names the rows in its
// errors, which end the reading (a failure mid-way is never taken for the
// last row).
func eachRow(ctx context.Context, q queryer, what, query string, scan func(*sql.Rows) error, args ...any) error {
	rows, err := q.QueryContext(ctx, query, args...)
	if err != nil {
		return fmt.Errorf("read %s: %w", what, err)
	}
	defer rows.Close()
	for rows.Next() {
		if err := scan(rows); err != nil {
			return fmt.Errorf("read %s: %w", what, err)
		}
	}
	if err := rows.Err(); err != nil {
		return fmt.Errorf("read %s: %w", what, err)
	}
	return nil
}

// nodeRoster is the roster table's names of node (kept while its
// composition fails).
func nodeRoster(tx *sql.Tx, node string) ([]Name, error) {
	rows, err := tx.Query(`SELECT name, address, node FROM roster WHERE node = ?`, node)
	if err != nil {
		return nil, fmt.Errorf("read the roster of %s: %w", node, err)
	}
	defer rows.Close()
	var out []Name
	for rows.Next() {
		var r Name
		if err := rows.Scan(&r.Name, &r.Address, &r.Node); err != nil {
			return nil, fmt.Errorf("read the roster of %s: %w", node, err)
		}
		out = append(out, r)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("read the roster of %s: %w", node, err)
	}
	return out, nil
}

// recompose derives roster and plans after a change and records what moved: a
// new plan version for each node whose plan digest changed, the composition
// error of each node that failed (its last good plan and names are kept).
// cause is the command's description.
func (ap *applier) recompose(cause string) error {
	s, ctx, tx, index, at := ap.s, ap.ctx, ap.tx, ap.index, ap.at
	cat, err := ap.catalogue()
	if err != nil {
		return fmt.Errorf("recompose: %w", err)
	}
	if checkComposition {
		if err := ap.checkCatalogue(cat); err != nil {
			return err
		}
	}
	assigned, err := ap.assignmentsFor()
	if err != nil {
		return fmt.Errorf("recompose: %w", err)
	}
	in, err := ap.input(cat, assigned, ap.assignedIndex())
	if err != nil {
		return fmt.Errorf("recompose: %w", err)
	}
	// A command that says what it touched composes the nodes that can
	// change; the others keep their plans, errors, bindings and names.
	var only map[string]bool
	if ap.incremental && !alwaysFull {
		if err := ap.touchSecretRollouts(); err != nil {
			return fmt.Errorf("recompose: %w", err)
		}
		deps := ap.deps(cat)
		if checkComposition && !sameDeps(deps, depsOf(cat)) {
			return fmt.Errorf("recompose: what the modules read of each other, as kept, differs from the catalogue's")
		}
		only = affected(in, ap.touched, deps)
	}
	// The bindings of the nodes composed; with checkComposition on, all of
	// them too, for the full composition it compares with (read before
	// this command rewrites those it composes).
	var allBound map[BindKey]string
	if only == nil || checkComposition {
		if allBound, err = readBound(ctx, ap.q, nil); err != nil {
			return fmt.Errorf("recompose: %w", err)
		}
	}
	if in.Bound = allBound; only != nil {
		if in.Bound, err = readBound(ctx, ap.q, only); err != nil {
			return fmt.Errorf("recompose: %w", err)
		}
		if checkComposition {
			mine := maps.Clone(allBound)
			maps.DeleteFunc(mine, func(k BindKey, _ string) bool { return !only[k.Node] })
			if !maps.Equal(mine, in.Bound) {
				return fmt.Errorf("recompose: the bindings read for the nodes composed are not the table's")
			}
		}
	}
	var out Output
	if only != nil {
		// The checks across each composed node's modules, as its last
		// composition left them: a cache of what the modules claimed,
		// by what they were (nodeChecks), which changes no outcome.
		if s.checks == nil {
			s.checks = map[string]*nodeChecks{}
		}
		named := in
		named.named = true // only planBody and writeBindings read the plans
		out = composeKept(named, only, s.checks)
	} else {
		// Every node composed from nothing, as before; the checks each
		// leaves are kept for the incremental commands after (a node's
		// first one needs not make them).
		fresh := map[string]*nodeChecks{}
		named := in
		named.named = true
		out = composeKept(named, nil, fresh)
		s.checks = fresh
	}
	defer out.releasePlans()
	var old Roster
	kept := s.roster.Load()
	if kept != nil && !ap.rosterChanged {
		old = *kept
	} else if flat, err := readRoster(ctx, ap.q); err != nil {
		return fmt.Errorf("read the roster: %w", err)
	} else {
		old = NewRoster(flat)
	}
	roster := out.Roster
	// The bindings rows each composed node has, to write only those that
	// changed.
	had := map[string]map[BindKey]string{}
	for k, prov := range in.Bound {
		if only == nil || only[k.Node] {
			if had[k.Node] == nil {
				had[k.Node] = map[BindKey]string{}
			}
			had[k.Node][k] = prov
		}
	}
	bound, err := historyBound(ap.q)
	if err != nil {
		return err
	}
	for _, n := range in.Nodes {
		if only != nil && !only[n.Name] {
			continue
		}
		if msg, failed := out.Errors[n.Name]; failed {
			if err := ap.q.exec(`UPDATE nodes SET compose_error = ? WHERE name = ?`, msg, n.Name); err != nil {
				return err
			}
			kept, err := nodeRoster(tx, n.Name)
			if err != nil {
				return err
			}
			roster = append(roster, kept...)
			continue
		}
		if err := ap.q.exec(`UPDATE nodes SET compose_error = '' WHERE name = ?`, n.Name); err != nil {
			return err
		}
		p := out.Plans[n.Name]
		if err := ap.writeBindings(n.Name, had[n.Name], p); err != nil {
			return err
		}
		text, d := s.planBody(p)
		var last string
		err := ap.q.QueryRowContext(ctx, `SELECT digest FROM plans WHERE node = ? ORDER BY version DESC LIMIT 1`, n.Name).Scan(&last)
		if err != nil && err != sql.ErrNoRows {
			return fmt.Errorf("read the plan of %s: %w", n.Name, err)
		}
		if last != d {
			if err := ap.q.exec(`INSERT INTO plans VALUES (?, ?, ?, ?, ?, ?)`, n.Name, index, d, text.pack(), cause, at); err != nil {
				return err
			}
			if bound.Set {
				if err := ap.prunePlans(bound, n.Name); err != nil {
					return err
				}
			}
		}
	}
	if only == nil {
		s.forgetEncoded(in.Nodes)
	}
	SortRoster(roster)
	roster = slices.Compact(roster) // the table's key is the whole row
	// What changed: with only some nodes recomposed, among their names
	// alone (no other node's names moved), else the whole roster's.
	var changes []NameChange
	var added, removed []Name
	var now Roster
	if only != nil {
		// theirs are the recomposed nodes' names before, mine after.
		mine := roster
		var theirs []Name
		if by := s.rosterBy; by != nil && kept != nil && by.of == kept && !ap.rosterChanged {
			theirs = by.theirNames(only)
			// The rows of those nodes that stay stay where they are: the
			// runs the others fall in are the only ones made anew.
			added, removed = rosterDiff(theirs, mine)
			now = old.spliced(removed, added)
			ap.roster = &now
			ap.rosterBy = by.edited(ap.roster, only, mine)
			if checkComposition {
				if err := checkSplice(old.Names(), only, mine, now, theirs, ap.rosterBy); err != nil {
					return err
				}
			}
		} else {
			var flat []Name
			flat, theirs = replaceNames(old.Names(), only, mine)
			now = NewRoster(flat)
			added, removed = rosterDiff(theirs, mine)
		}
		// Only the rows that differ (a node of 100 modules has 200
		// names, each looked up in the whole roster).
		changes = rosterChangesAmong(old, now, removed, added)
	} else {
		now = NewRoster(roster)
		flatOld := old.Names()
		changes = RosterChanges(flatOld, roster)
		added, removed = rosterDiff(flatOld, roster)
	}
	if only != nil && checkComposition {
		flat, flatOld := now.Names(), old.Names()
		full := in
		full.Bound = allBound
		if err := ap.checkAgainstFull(full, only, flat); err != nil {
			return err
		}
		if want := RosterChanges(flatOld, flat); !slices.Equal(changes, want) {
			return fmt.Errorf("the roster's changes among the recomposed nodes %v differ from the whole roster's %v", changes, want)
		}
		if a, r := rosterDiff(flatOld, flat); !slices.Equal(added, a) || !slices.Equal(removed, r) {
			return fmt.Errorf("the roster's rows added %v and removed %v among the recomposed nodes differ from the whole roster's %v and %v", added, removed, a, r)
		}
	}
	pruned := map[string]bool{}
	for _, c := range changes {
		if err := ap.q.exec(`INSERT INTO roster_history VALUES (?, ?, ?, ?, ?, ?, ?)`, index, at, cause, c.Op, c.Name, c.Address, c.Node); err != nil {
			return err
		}
		if bound.Set && !pruned[c.Name] {
			pruned[c.Name] = true
			if err := ap.pruneRoster(bound, c.Name); err != nil {
				return err
			}
		}
	}
	// Only the rows that changed are written: rewriting the whole roster on
	// every command cost as much as the rest of the apply.
	for _, r := range added {
		if err := ap.q.exec(`INSERT OR IGNORE INTO roster VALUES (?, ?, ?)`, r.Name, r.Address, r.Node); err != nil {
			return err
		}
	}
	for _, r := range removed {
		if err := ap.q.exec(`DELETE FROM roster WHERE name = ? AND address = ? AND node = ?`, r.Name, r.Address, r.Node); err != nil {
			return err
		}
	}
	ap.roster = &now
	if ap.rosterBy == nil || ap.rosterBy.of != ap.roster {
		ap.rosterBy = &rosterByNode{of: ap.roster, by: splitByNode(now.All())}
	}
	// Drop parsed manifests that left the catalogue (a changed or removed
	// module's, a refused module add's, a preview's) once they are an
	// eighth of it: walking the catalogue every command that changes a
	// module cost 5 ms at 10,000 modules.
	s.mu.Lock()
	if ap.catWhole || len(s.parsed) > len(in.Modules)+len(in.Modules)/8+16 {
		keep := map[string]bool{}
		for _, m := range in.Modules {
			keep[m.Digest] = true
		}
		for d := range s.parsed {
			if !keep[d] {
				delete(s.parsed, d)
			}
		}
	}
	s.mu.Unlock()
	return nil
}
