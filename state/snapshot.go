package state

import (
	"bytes"
	"context"
	"database/sql"
	"encoding/json"
	"fmt"
	"io"
	"sort"
	"strings"

	"mesh/state/manifest"
)

// Snapshot is the whole replicated state: every table of the schema but the
// node's own bookkeeping, row by row in key order. The list of tables is
// read from the schema itself, so a table added by a migration is in every
// snapshot without anyone remembering to add it.
type Snapshot struct {
	Format int    `json:"format"`
	Index  uint64 `json:"index"`
	// Schema is the schema version of the replica that wrote it.
	Schema int                         `json:"schema"`
	Tables map[string][]map[string]any `json:"tables"`
}

// SnapshotFormat is the format Dump writes. Format 1 (a fixed list of
// tables, written by older binaries) is still read.
const SnapshotFormat = 2

// nodeLocalTables are the tables a snapshot leaves out: the replica's own
// bookkeeping (its applied index travels as Index).
var nodeLocalTables = map[string]bool{"schema_version": true, "applied": true}

// Rows is a table's rows (nil when the snapshot has none).
func (sn *Snapshot) Rows(table string) []map[string]any { return sn.Tables[table] }

// Setting is one row of the settings table ("" when absent).
func (sn *Snapshot) Setting(key string) string {
	for _, r := range sn.Rows("settings") {
		if k, _ := r["key"].(string); k == key {
			v, _ := r["value"].(string)
			return v
		}
	}
	return ""
}

// replicatedTables lists the schema's tables that snapshots carry, each with
// its columns, and the key columns that order it.
func replicatedTables(ctx context.Context, q queryer) ([]tableInfo, error) {
	rows, err := q.QueryContext(ctx, `SELECT name FROM sqlite_master WHERE type = 'table' AND name NOT LIKE 'sqlite_%' ORDER BY name`)
	if err != nil {
		return nil, err
	}
	var names []string
	for rows.Next() {
		var n string
		if err := rows.Scan(&n); err != nil {
			rows.Close()
			return nil, err
		}
		if !nodeLocalTables[n] {
			names = append(names, n)
		}
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return nil, err
	}
	var out []tableInfo
	for _, n := range names {
		t := tableInfo{name: n, columns: map[string]bool{}}
		cols, err := q.QueryContext(ctx, `SELECT name, pk FROM pragma_table_info(?) ORDER BY cid`, n)
		if err != nil {
			return nil, err
		}
		type kc struct {
			name string
			pk   int
		}
		var keys, all []kc
		for cols.Next() {
			var c kc
			if err := cols.Scan(&c.name, &c.pk); err != nil {
				cols.Close()
				return nil, err
			}
			t.columns[c.name] = true
			all = append(all, c)
			if c.pk > 0 {
				keys = append(keys, c)
			}
		}
		cols.Close()
		if len(keys) == 0 {
			keys = all
		}
		sort.SliceStable(keys, func(i, j int) bool { return keys[i].pk < keys[j].pk })
		for _, k := range keys {
			t.order = append(t.order, `"`+k.name+`"`)
		}
		out = append(out, t)
	}
	return out, nil
}

type tableInfo struct {
	name    string
	columns map[string]bool
	order   []string
}

func (s *Store) schemaVersion(ctx context.Context, q queryer) (int, error) {
	var v int
	err := q.QueryRowContext(ctx, `SELECT COALESCE(MAX(version), 0) FROM schema_version`).Scan(&v)
	return v, err
}

// Dump reads all replicated state in one read transaction.
func (s *Store) Dump(ctx context.Context) (*Snapshot, error) {
	tx, err := s.db.BeginTx(ctx, &sql.TxOptions{ReadOnly: true})
	if err != nil {
		return nil, err
	}
	defer tx.Rollback()
	sn := &Snapshot{Format: SnapshotFormat, Tables: map[string][]map[string]any{}}
	if err := tx.QueryRow(`SELECT idx FROM applied WHERE id = 1`).Scan(&sn.Index); err != nil {
		return nil, err
	}
	if sn.Schema, err = s.schemaVersion(ctx, tx); err != nil {
		return nil, err
	}
	tables, err := replicatedTables(ctx, tx)
	if err != nil {
		return nil, err
	}
	for _, t := range tables {
		rows, err := tx.QueryContext(ctx, `SELECT * FROM "`+t.name+`" ORDER BY `+strings.Join(t.order, ", "))
		if err != nil {
			return nil, err
		}
		cols, err := rows.Columns()
		if err != nil {
			rows.Close()
			return nil, err
		}
		out := []map[string]any{}
		for rows.Next() {
			vals := make([]any, len(cols))
			ptrs := make([]any, len(cols))
			for i := range vals {
				ptrs[i] = &vals[i]
			}
			if err := rows.Scan(ptrs...); err != nil {
				rows.Close()
				return nil, err
			}
			row := map[string]any{}
			for i, c := range cols {
				if t.name == "plans" && c == "body" {
					vals[i] = snapshotPlan(asBytes(vals[i]))
				}
				if b, ok := vals[i].([]byte); ok {
					vals[i] = string(b)
				}
				row[c] = vals[i]
			}
			out = append(out, row)
		}
		rows.Close()
		if err := rows.Err(); err != nil {
			return nil, err
		}
		sn.Tables[t.name] = out
	}
	return sn, nil
}

// WriteSnapshot writes the replicated state as JSON.
func (s *Store) WriteSnapshot(ctx context.Context, w io.Writer) error {
	sn, err := s.Dump(ctx)
	if err != nil {
		return fmt.Errorf("dump state: %w", err)
	}
	return json.NewEncoder(w).Encode(sn)
}

// snapshotV1 is format 1: a fixed list of tables, settings as pairs.
type snapshotV1 struct {
	Settings    [][2]string      `json:"settings"`
	Nodes       []map[string]any `json:"nodes"`
	Modules     []map[string]any `json:"modules"`
	Assignments []map[string]any `json:"assignments"`
	Credentials []map[string]any `json:"credentials"`
	Plans       []map[string]any `json:"plans"`
	Roster      []map[string]any `json:"roster"`
	Reports     []map[string]any `json:"reports"`
	Bindings    []map[string]any `json:"bindings"`
}

// ReadSnapshot decodes a snapshot of either format. Numbers stay
// json.Number, so that integers come back as they were written.
func ReadSnapshot(r io.Reader) (*Snapshot, error) {
	raw, err := io.ReadAll(r)
	if err != nil {
		return nil, err
	}
	dec := func(v any) error {
		d := json.NewDecoder(bytes.NewReader(raw))
		d.UseNumber()
		return d.Decode(v)
	}
	var sn Snapshot
	if err := dec(&sn); err != nil {
		return nil, fmt.Errorf("decode snapshot: %w", err)
	}
	switch sn.Format {
	case SnapshotFormat:
		if sn.Tables == nil {
			return nil, fmt.Errorf("the snapshot has no tables")
		}
		return &sn, nil
	case 1:
		var v1 snapshotV1
		if err := dec(&v1); err != nil {
			return nil, fmt.Errorf("decode snapshot: %w", err)
		}
		sn.Schema = 2
		sn.Tables = map[string][]map[string]any{
			"nodes": v1.Nodes, "modules": v1.Modules, "assignments": v1.Assignments,
			"credentials": v1.Credentials, "plans": v1.Plans, "roster": v1.Roster,
			"reports": v1.Reports, "bindings": v1.Bindings,
		}
		for _, kv := range v1.Settings {
			sn.Tables["settings"] = append(sn.Tables["settings"], map[string]any{"key": kv[0], "value": kv[1]})
		}
		return &sn, nil
	}
	return nil, fmt.Errorf("snapshot format %d is not known to this mesh binary (it reads formats 1 and %d); use a newer mesh", sn.Format, SnapshotFormat)
}

// Restore replaces all replicated state with a snapshot's (Raft's restore:
// a node that installs a snapshot from its leader, or its own at start).
func (s *Store) Restore(ctx context.Context, r io.Reader) error {
	sn, err := ReadSnapshot(r)
	if err != nil {
		return err
	}
	s.applyMu.Lock()
	defer s.applyMu.Unlock()
	s.cat, s.deps = nil, nil // whatever happens below, the kept catalogue is not the truth
	s.assigned, s.assignedAt = nil, nil
	s.inputs = nil
	s.roster.Store(nil)
	s.rosterBy = nil
	// The reports kept are forgotten now and again once the restore is
	// over, so that no read of the table while it ran is kept.
	s.reportsCommitted(nil, true)
	defer s.reportsCommitted(nil, true)
	s.catPub.Store(nil)
	tx, err := s.db.BeginTx(ctx, nil)
	if err != nil {
		return err
	}
	defer tx.Rollback()
	mine, err := s.schemaVersion(ctx, tx)
	if err != nil {
		return err
	}
	if sn.Schema > mine {
		return fmt.Errorf("the snapshot is of schema version %d, newer than this mesh binary knows (%d); upgrade this node's mesh", sn.Schema, mine)
	}
	tables, err := replicatedTables(ctx, tx)
	if err != nil {
		return err
	}
	known := map[string]bool{}
	for _, t := range tables {
		known[t.name] = true
	}
	for name := range sn.Tables {
		if !known[name] {
			return fmt.Errorf("the snapshot has a table %q that this mesh binary does not know; upgrade this node's mesh", name)
		}
	}
	for _, t := range tables {
		if _, err := tx.ExecContext(ctx, `DELETE FROM "`+t.name+`"`); err != nil {
			return err
		}
		for _, row := range sn.Tables[t.name] {
			if len(row) == 0 {
				return fmt.Errorf("the snapshot's table %s has an empty row", t.name)
			}
			cols := make([]string, 0, len(row))
			for c := range row {
				if !t.columns[c] {
					return fmt.Errorf("the snapshot's table %s has a column %q that this mesh binary does not know", t.name, c)
				}
				cols = append(cols, c)
			}
			sort.Strings(cols)
			vals := make([]any, len(cols))
			for i, c := range cols {
				v := row[c]
				if n, ok := v.(json.Number); ok {
					iv, err := n.Int64()
					if err != nil {
						return fmt.Errorf("the snapshot's %s.%s: %w", t.name, c, err)
					}
					v = iv
				}
				if t.name == "plans" && c == "body" {
					b, _ := v.(string)
					if v, err = restoredPlan(b); err != nil {
						return fmt.Errorf("the snapshot's plan %v v%v: %w", row["node"], row["version"], err)
					}
				}
				vals[i] = v
			}
			q := `INSERT INTO "` + t.name + `" ("` + strings.Join(cols, `", "`) + `") VALUES (?` + strings.Repeat(", ?", len(cols)-1) + `)`
			if _, err := tx.ExecContext(ctx, q, vals...); err != nil {
				return fmt.Errorf("restore %s: %w", t.name, err)
			}
		}
	}
	if _, err := tx.Exec(`UPDATE applied SET idx = ? WHERE id = 1`, sn.Index); err != nil {
		return err
	}
	if err := tx.Commit(); err != nil {
		return err
	}
	s.committed()
	s.mu.Lock()
	s.parsed = map[string]*manifest.Manifest{}
	s.mu.Unlock()
	// A snapshot written before the catalogue kept parsed forms.
	if err := s.fillSpecs(ctx); err != nil {
		return err
	}
	s.notify()
	return nil
}

// asBytes is a column's value as bytes (TEXT scans as string or []byte).
func asBytes(v any) []byte {
	switch b := v.(type) {
	case []byte:
		return b
	case string:
		return []byte(b)
	}
	return nil
}
