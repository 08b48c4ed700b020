// Package state owns the mesh's replicated model: the SQLite schema, the
// commands that change it, the pure composition of roster and plans, and the
// read-only queries everything else uses.
//
// Store.Apply is the FSM body: it decodes a command chosen by the proposer and
// applies it deterministically (no clock, no randomness, no environment: times
// and secrets travel inside the command). It never imports cluster; cluster
// adapts it to raft.FSM. Node-local facts do not live here.
package state

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"

	"mesh/state/manifest"

	_ "modernc.org/sqlite" // the pure-Go SQLite driver, registered as "sqlite"
)

// DefaultDomain is the mesh domain when `mesh init` is given none.
const DefaultDomain = "internal"

// Sentinel errors. A command that breaks a rule returns one of these wrapped in
// a sentence for the operator; every replica returns the same one.
var (
	ErrNotFound = errors.New("not found")
	ErrConflict = errors.New("conflict")
	ErrInvalid  = errors.New("invalid")
)

// Store is one replica of the replicated state, in one SQLite file.
type Store struct {
	db   *sql.DB
	path string

	mu     sync.Mutex // guards the caches and the subscribers
	parsed map[string]*manifest.Manifest
	// planSizes is each plan's number of resources by its digest (PlanHeads).
	planSizes map[string]int
	changed   chan struct{}
	// gen counts the replica's changes (notify); nodes is the nodes
	// table as of gen, nil until read (Nodes).
	gen     uint64
	nodes   []NodeInfo
	applyMu sync.Mutex // one Apply or Restore at a time
	// cat is the catalogue as the last applied command left it, for the
	// FSM's own reads (under applyMu); nil when not known. Every command
	// recomposes, and reading the catalogue's rows each time cost more than
	// the rest of an assign with a thousand modules.
	cat map[string]*manifest.Manifest
	// deps is what each module of cat reads of the others (affected), nil
	// whenever cat is.
	deps *catDeps
	// assigned is the assignments table as the last committed command left
	// it, nil when not known (assigned.go); under applyMu.
	assigned []Assignment
	// assignedAt is each module's assignments, with assigned.
	assignedAt map[string][]Assignment
	// inputs are the credentials', secrets', restarts' and pulls' tables
	// as the last committed command left them, nil when not known
	// (keptinputs.go); under applyMu.
	inputs *keptInputs
	// roster is the roster table as the last committed command left it,
	// sorted and without duplicates, nil when not known. It is set only
	// under applyMu, after a commit, and never changed in place: the FSM
	// diffs against it and the resolver reads it after every change,
	// instead of reading every row twice per command.
	roster atomic.Pointer[Roster]
	// rosterBy is roster's rows by node, when it was built for the roster
	// kept now (its of); under applyMu.
	rosterBy *rosterByNode
	// catPub is a copy of cat for readers outside the FSM (a proposer's
	// SealNeeds and CheckHosts), as of the last commit; nil when not made
	// since the last change (publishedCatalogue).
	catPub atomic.Pointer[map[string]*manifest.Manifest]
	// encoded is each node's last composed plan's resources with their JSON
	// (planenc.go); under applyMu.
	encoded map[string]*keptPlan
	// checks are, by node, the checks across its modules its last
	// incremental composition left (nodeChecks): keyed by what each
	// module was, they hold whatever commands came between.
	checks map[string]*nodeChecks
	// ckpt, ckptStop and ckptDone drive the goroutine that checkpoints the
	// write-ahead log (checkpoint.go); ckptRuns counts its checkpoints and
	// ckptFrames is what the last one copied (under mu, for tests).
	ckpt, ckptStop, ckptDone chan struct{}
	ckptOnce                 sync.Once
	ckptRuns, ckptFrames     int
	// stmts are the statements the FSM has prepared, by their SQL, and how
	// many (prepared.go).
	stmts    sync.Map
	prepares atomic.Int32
	// reportBodies is the reports table's bodies by node as the last
	// committed command left it, nil when not known; reportsGen counts the
	// commits that changed the table (reportbodies.go). Under mu.
	reportBodies map[string]string
	reportsGen   uint64

	// OnDiskFull, when set, is told once per command that waits for space.
	OnDiskFull func(index uint64)
}

// Open opens (creating if needed) the replica at path and brings its schema up
// to date.
func Open(path string) (*Store, error) {
	if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
		return nil, fmt.Errorf("create state dir: %w", err)
	}
	if !strings.HasPrefix(filepath.Base(path), scratchPrefix) {
		removeScratches(filepath.Dir(path))
	}
	s, err := openDSN(fileURI(path)+"?_pragma=journal_mode(WAL)&_pragma=busy_timeout(10000)&_pragma=synchronous(NORMAL)&_pragma=secure_delete(ON)"+
		fmt.Sprintf("&_pragma=wal_autocheckpoint(%d)", walAutoCheckpoint)+"&_txlock=immediate", path)
	if err != nil {
		return nil, err
	}
	s.startCheckpoints()
	return s, nil
}

// fileURI makes path a SQLite URI filename: SQLite decodes %HH in it and
// ends the path at '?' or '#', so those three are escaped. Unescaped, a data
// directory named "mesh#2" opened the file "mesh" in its parent, and one
// with a '?' did that without the pragmas (no WAL, no busy timeout).
func fileURI(path string) string {
	var b strings.Builder
	b.WriteString("file:")
	for i := 0; i < len(path); i++ {
		switch c := path[i]; c {
		case '%', '?', '#':
			fmt.Fprintf(&b, "%%%02X", c)
		default:
			b.WriteByte(c)
		}
	}
	return b.String()
}

func openDSN(dsn, path string) (*Store, error) {
	db, err := sql.Open("sqlite", dsn)
	if err != nil {
		return nil, fmt.Errorf("open state db %q: %w", path, err)
	}
	db.SetMaxOpenConns(4)
	s := &Store{db: db, path: path, parsed: map[string]*manifest.Manifest{}, planSizes: map[string]int{}, changed: make(chan struct{})}
	if err := s.migrate(); err != nil {
		db.Close()
		if IsDamaged(err) {
			return nil, fmt.Errorf("migrate state db %q: %w; %s", path, err, DamagedWayOut)
		}
		return nil, fmt.Errorf("migrate state db %q: %w", path, err)
	}
	if err := s.fillSpecs(context.Background()); err != nil {
		db.Close()
		if IsDamaged(err) {
			return nil, fmt.Errorf("upgrade state db %q: %w; %s", path, err, DamagedWayOut)
		}
		return nil, fmt.Errorf("upgrade state db %q: %w", path, err)
	}
	return s, nil
}

// Close closes the database.
func (s *Store) Close() error {
	s.stopCheckpoints()
	s.closeStatements()
	return s.db.Close()
}

// migrations are applied in order; each runs once, recorded in schema_version.
// Never edit one that has shipped: append a new one.
var migrations = []string{
	`CREATE TABLE settings (key TEXT PRIMARY KEY, value TEXT NOT NULL);
	 CREATE TABLE nodes (
		name TEXT PRIMARY KEY,
		address TEXT NOT NULL,
		public_domain TEXT NOT NULL DEFAULT '',
		voter INTEGER NOT NULL DEFAULT 0,
		added_at TEXT NOT NULL,
		compose_error TEXT NOT NULL DEFAULT ''
	 );
	 CREATE TABLE modules (
		name TEXT PRIMARY KEY,
		file TEXT NOT NULL,
		manifest TEXT NOT NULL,
		digest TEXT NOT NULL,
		version INTEGER NOT NULL,
		added_at TEXT NOT NULL
	 );
	 CREATE TABLE assignments (
		node TEXT NOT NULL,
		module TEXT NOT NULL,
		PRIMARY KEY (node, module)
	 );
	 CREATE TABLE credentials (
		consumer TEXT NOT NULL,
		provider TEXT NOT NULL,
		secret TEXT NOT NULL,
		digest TEXT NOT NULL,
		PRIMARY KEY (consumer, provider)
	 );
	 CREATE TABLE plans (
		node TEXT NOT NULL,
		version INTEGER NOT NULL,
		digest TEXT NOT NULL,
		body TEXT NOT NULL,
		cause TEXT NOT NULL,
		created_at TEXT NOT NULL,
		PRIMARY KEY (node, version)
	 );
	 CREATE TABLE roster (
		name TEXT NOT NULL,
		address TEXT NOT NULL,
		node TEXT NOT NULL,
		PRIMARY KEY (name, address, node)
	 );
	 CREATE TABLE reports (
		node TEXT PRIMARY KEY,
		version INTEGER NOT NULL,
		applied_at TEXT NOT NULL,
		body TEXT NOT NULL
	 );
	 CREATE TABLE applied (id INTEGER PRIMARY KEY CHECK (id = 1), idx INTEGER NOT NULL);
	 INSERT INTO applied VALUES (1, 0);`,
	// 2: assignments remember their order (a binding falls back to the
	// instance assigned earliest), and each binding's provider node is kept so
	// that adding an instance never moves a consumer.
	`ALTER TABLE assignments ADD COLUMN seq INTEGER NOT NULL DEFAULT 0;
	 CREATE TABLE bindings (
		node TEXT NOT NULL,
		module TEXT NOT NULL,
		path TEXT NOT NULL,
		provider_node TEXT NOT NULL,
		PRIMARY KEY (node, module, path)
	 );`,
	// 3: each module keeps its parsed form, as the proposer made it (the FSM
	// never parses a manifest's text). Rows written before are filled by
	// fillSpecs.
	`ALTER TABLE modules ADD COLUMN spec TEXT NOT NULL DEFAULT '';`,
	// 4: each node's Raft port, so that membership can be repaired from the
	// state in both directions.
	`ALTER TABLE nodes ADD COLUMN port INTEGER NOT NULL DEFAULT 0;`,
	// 5: when each name appeared or went, and the command that caused it
	// (the roster itself has no history; plans do).
	`CREATE TABLE roster_history (
		idx INTEGER NOT NULL,
		at TEXT NOT NULL,
		cause TEXT NOT NULL,
		op TEXT NOT NULL,
		name TEXT NOT NULL,
		address TEXT NOT NULL,
		node TEXT NOT NULL
	 );
	 CREATE INDEX roster_history_name ON roster_history (name, idx);`,
	// 6: the last `mesh module pull` of each module (its log index).
	`CREATE TABLE pulls (module TEXT PRIMARY KEY, idx INTEGER NOT NULL);`,
	// 7: sealed credentials (seal.go): each node's sealing key, and each
	// credential's sealed form and recipients. The secret column is kept
	// only for rows of older meshes until they are sealed. And when each
	// node's certificate expires, as the node last said.
	`ALTER TABLE nodes ADD COLUMN seal_key TEXT NOT NULL DEFAULT '';
	 ALTER TABLE nodes ADD COLUMN cert_expires TEXT NOT NULL DEFAULT '';
	 ALTER TABLE credentials ADD COLUMN sealed TEXT NOT NULL DEFAULT '';
	 ALTER TABLE credentials ADD COLUMN recipients TEXT NOT NULL DEFAULT '';`,
	// 8: the key of each node's certificate (node.cert), which its peers
	// require of it: a certificate for its name with another key, signed by
	// whoever holds the CA key (a voter since removed), is refused.
	`ALTER TABLE nodes ADD COLUMN cert_key TEXT NOT NULL DEFAULT '';`,
	// 9: the overlay (overlay.go): each node's WireGuard public key, its UDP
	// endpoint and the overlay address the FSM gave it.
	`ALTER TABLE nodes ADD COLUMN overlay_key TEXT NOT NULL DEFAULT '';
	 ALTER TABLE nodes ADD COLUMN overlay_endpoint TEXT NOT NULL DEFAULT '';
	 ALTER TABLE nodes ADD COLUMN overlay_address TEXT NOT NULL DEFAULT '';`,
	// 10: the operator's secrets (secret.go), sealed to the module's nodes.
	`CREATE TABLE secrets (
		module TEXT NOT NULL,
		name TEXT NOT NULL,
		sealed TEXT NOT NULL,
		digest TEXT NOT NULL,
		salt TEXT NOT NULL,
		size INTEGER NOT NULL,
		set_at TEXT NOT NULL,
		set_index INTEGER NOT NULL,
		recipients TEXT NOT NULL,
		PRIMARY KEY (module, name)
	 );`,
	// 11: the digest of the CA that signed each node's certificate, as the
	// node last said (a rotation of the CA ends when every node's is the
	// new CA's: ca.go).
	`ALTER TABLE nodes ADD COLUMN cert_ca TEXT NOT NULL DEFAULT '';`,
	// 12: each node's ACME settings, for its route proxy (edge.go); the
	// public_domain column may now hold several domains, space-separated.
	`ALTER TABLE nodes ADD COLUMN acme_directory TEXT NOT NULL DEFAULT '';
	 ALTER TABLE nodes ADD COLUMN acme_email TEXT NOT NULL DEFAULT '';
	 ALTER TABLE nodes ADD COLUMN acme_ca_root TEXT NOT NULL DEFAULT '';`,
	// 13: a node marked draining takes no new module (drain.go).
	`ALTER TABLE nodes ADD COLUMN draining INTEGER NOT NULL DEFAULT 0;`,
	// 14: the last `mesh restart` of each scope (restart.go).
	`CREATE TABLE restarts (
		module TEXT NOT NULL,
		container TEXT NOT NULL,
		node TEXT NOT NULL,
		idx INTEGER NOT NULL,
		PRIMARY KEY (module, container, node)
	 );`,
	// 15: rollouts (rollout.go): every version a module is given, and each
	// module's rollout of its last change over its nodes (a new manifest,
	// or a pull: from_pull and to_pull).
	`CREATE TABLE module_history (
		module TEXT NOT NULL,
		version INTEGER NOT NULL,
		file TEXT NOT NULL,
		manifest TEXT NOT NULL,
		digest TEXT NOT NULL,
		spec TEXT NOT NULL,
		at TEXT NOT NULL,
		cause TEXT NOT NULL,
		PRIMARY KEY (module, version)
	 );
	 CREATE TABLE rollouts (
		module TEXT PRIMARY KEY,
		from_version INTEGER NOT NULL,
		to_version INTEGER NOT NULL,
		state TEXT NOT NULL,
		reached TEXT NOT NULL,
		reason TEXT NOT NULL,
		started_at TEXT NOT NULL,
		step_index INTEGER NOT NULL,
		step_at TEXT NOT NULL,
		from_pull INTEGER NOT NULL DEFAULT 0,
		to_pull INTEGER NOT NULL DEFAULT 0
	 );`,
	// 16: data directories an unassign --purge-data asked a node to
	// remove (issue 30), until the module is assigned there again.
	`CREATE TABLE purges (
		node TEXT NOT NULL,
		module TEXT NOT NULL,
		path TEXT NOT NULL,
		idx INTEGER NOT NULL,
		PRIMARY KEY (node, path)
	 );`,
	// 17: moves of a module with its data (issue 30, move.go).
	`CREATE TABLE moves (
		module TEXT PRIMARY KEY,
		id INTEGER NOT NULL,
		from_node TEXT NOT NULL,
		to_node TEXT NOT NULL,
		phase TEXT NOT NULL,
		reason TEXT NOT NULL,
		since TEXT NOT NULL,
		data TEXT NOT NULL
	 );`,
	// 18: a secret's value from before a change that rolls out (issue 29,
	// rollout.go), kept for the nodes the rollout has not reached yet (and
	// for a revert) until it ends; the secret a rollout carries.
	`CREATE TABLE held_secrets (
		module TEXT NOT NULL,
		name TEXT NOT NULL,
		sealed TEXT NOT NULL,
		digest TEXT NOT NULL,
		salt TEXT NOT NULL,
		size INTEGER NOT NULL,
		set_at TEXT NOT NULL,
		set_index INTEGER NOT NULL,
		recipients TEXT NOT NULL,
		PRIMARY KEY (module, name)
	 );
	 ALTER TABLE rollouts ADD COLUMN secret TEXT NOT NULL DEFAULT '';`,
	// 19: plans.body may be packed (planbody.go); nothing to change in the
	// schema, but an older binary must not open what it cannot read.
	`SELECT 1;`,
}

func (s *Store) migrate() error {
	if _, err := s.db.Exec(`CREATE TABLE IF NOT EXISTS schema_version (version INTEGER NOT NULL)`); err != nil {
		return err
	}
	var v int
	if err := s.db.QueryRow(`SELECT COALESCE(MAX(version), 0) FROM schema_version`).Scan(&v); err != nil {
		return err
	}
	if v > len(migrations) {
		return fmt.Errorf("state db has schema version %d, newer than this mesh binary knows (%d); run the newer mesh", v, len(migrations))
	}
	for i := v; i < len(migrations); i++ {
		tx, err := s.db.Begin()
		if err != nil {
			return err
		}
		if _, err := tx.Exec(migrations[i]); err != nil {
			tx.Rollback()
			return fmt.Errorf("migration %d: %w", i+1, err)
		}
		if _, err := tx.Exec(`INSERT INTO schema_version VALUES (?)`, i+1); err != nil {
			tx.Rollback()
			return err
		}
		if err := tx.Commit(); err != nil {
			return err
		}
	}
	// Not a migration (an older binary opens the file all the same, and
	// keeps the index up to date without knowing it): the history's
	// pruning reads each kept plan's version and time, which sit after
	// its body in the row, so without it every new plan version read
	// every kept plan whole. Results are the same either way; a disk too
	// full to build it leaves the pruning slower, not the store shut.
	s.db.Exec(`CREATE INDEX IF NOT EXISTS plans_created ON plans (node, version, created_at)`)
	return nil
}

// AppliedIndex is the Raft index of the last command applied to this replica.
func (s *Store) AppliedIndex() (uint64, error) {
	var i uint64
	err := s.db.QueryRow(`SELECT idx FROM applied WHERE id = 1`).Scan(&i)
	return i, err
}

// Changed returns a channel that is closed at the next change of the replica.
// Take a new one after each wake-up.
func (s *Store) Changed() <-chan struct{} {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.changed
}

func (s *Store) notify() {
	s.mu.Lock()
	s.gen++
	s.nodes = nil
	close(s.changed)
	s.changed = make(chan struct{})
	s.mu.Unlock()
}

// manifestOf decodes a catalogue entry's parsed form, caching by digest.
// Decoding is pure, so the cache cannot make replicas disagree.
func (s *Store) manifestOf(file, digest, spec string) (*manifest.Manifest, error) {
	s.mu.Lock()
	m, ok := s.parsed[digest]
	s.mu.Unlock()
	if ok {
		return m, nil
	}
	m, err := decodeSpec(file, digest, spec)
	if err != nil {
		return nil, err
	}
	s.mu.Lock()
	s.parsed[digest] = m
	s.mu.Unlock()
	return m, nil
}

// fillSpecs gives each catalogue row written by a binary older than format
// 3 (by its log or its snapshot) its parsed form, parsing its text once.
// It runs at open and after a snapshot is restored, never inside Apply.
func (s *Store) fillSpecs(ctx context.Context) error {
	rows, err := s.db.QueryContext(ctx, `SELECT name, file, manifest FROM modules WHERE spec = ''`)
	if err != nil {
		return err
	}
	type row struct{ name, file, text string }
	var todo []row
	for rows.Next() {
		var r row
		if err := rows.Scan(&r.name, &r.file, &r.text); err != nil {
			rows.Close()
			return err
		}
		todo = append(todo, r)
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return err
	}
	for _, r := range todo {
		sp, err := SpecOf(r.file, r.text)
		if err != nil {
			return fmt.Errorf("module %s, stored by an older mesh, no longer parses: %w", r.name, err)
		}
		if _, err := s.db.ExecContext(ctx, `UPDATE modules SET spec = ? WHERE name = ?`, sp.specJSON(), r.name); err != nil {
			return err
		}
	}
	return nil
}

type queryer interface {
	QueryContext(ctx context.Context, query string, args ...any) (*sql.Rows, error)
	QueryRowContext(ctx context.Context, query string, args ...any) *sql.Row
}

func jsonString(v any) string {
	b, err := json.Marshal(v)
	if err != nil {
		panic(err)
	}
	return string(b)
}
