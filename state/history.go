package state

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"strconv"
	"time"
)

// History that does not grow forever (issue 30, item 5). Plan versions,
// roster history and module versions are kept to a bound: the last
// Versions of each node's plans (of each module's versions, of each name's
// roster events), and of those only what is younger than Days, the newest
// always kept. Pruning runs in the FSM, from the command's index and
// proposer time only, so every replica prunes alike. It holds once a mesh
// has a bound: mesh init by this binary sets the default, and
// history.keep sets another (both of historyFormat, which an older replica
// never applies, so no replica prunes while another does not).

// OpHistoryKeep sets the history's bound.
const OpHistoryKeep = "history.keep"

// historyFormat is the format of history.keep, and of an init that sets
// the default bound.
const historyFormat = 12

// The default bound, and the least and most history.keep takes.
const (
	DefaultHistoryVersions = 100
	DefaultHistoryDays     = 90
	MinHistoryVersions     = 10
	MaxHistoryVersions     = 100000
	MaxHistoryDays         = 36500
)

// HistoryKeepRequest sets how much history the mesh keeps.
type HistoryKeepRequest struct {
	Versions int `json:"versions"`
	Days     int `json:"days"`
}

func (*HistoryKeepRequest) Op() string { return OpHistoryKeep }
func (r *HistoryKeepRequest) describe() string {
	return fmt.Sprintf("history.keep %d versions, %d days", r.Versions, r.Days)
}

// HistoryBound is what the mesh keeps; Set is false for a mesh made before
// the bound (it keeps everything until mesh history keep).
type HistoryBound struct {
	Set      bool `json:"set"`
	Versions int  `json:"versions"`
	Days     int  `json:"days"`
}

func (ap *applier) historyKeep(r *HistoryKeepRequest) (bool, error) {
	if r.Versions < MinHistoryVersions || r.Versions > MaxHistoryVersions {
		return false, ruleErr(ErrInvalid, "history.keep: %d versions is not between %d and %d", r.Versions, MinHistoryVersions, MaxHistoryVersions)
	}
	if r.Days < 1 || r.Days > MaxHistoryDays {
		return false, ruleErr(ErrInvalid, "history.keep: %d days is not between 1 and %d", r.Days, MaxHistoryDays)
	}
	if err := ap.setHistoryBound(r.Versions, r.Days); err != nil {
		return false, err
	}
	return false, ap.pruneAll()
}

func (ap *applier) setHistoryBound(versions, days int) error {
	for _, kv := range []struct {
		k string
		v int
	}{{"history_versions", versions}, {"history_days", days}} {
		if err := exec(ap.tx, `INSERT INTO settings (key, value) VALUES (?, ?) ON CONFLICT (key) DO UPDATE SET value = excluded.value`, kv.k, strconv.Itoa(kv.v)); err != nil {
			return err
		}
	}
	return nil
}

func historyBound(q queryer) (HistoryBound, error) {
	b := HistoryBound{}
	for _, kv := range []struct {
		key string
		dst *int
	}{{"history_versions", &b.Versions}, {"history_days", &b.Days}} {
		var v string
		err := q.QueryRowContext(context.Background(), `SELECT value FROM settings WHERE key = ?`, kv.key).Scan(&v)
		if errors.Is(err, sql.ErrNoRows) {
			return HistoryBound{}, nil
		}
		if err != nil {
			return b, err
		}
		if *kv.dst, err = strconv.Atoi(v); err != nil {
			return b, fmt.Errorf("settings %s: %w", kv.key, err)
		}
	}
	b.Set = true
	return b, nil
}

// HistoryBound reads the mesh's history bound.
func (s *Store) HistoryBound(ctx context.Context) (HistoryBound, error) { return historyBound(s.db) }

// cutoff is the oldest proposer time the bound keeps.
func (ap *applier) cutoff(b HistoryBound) time.Time {
	at, _ := time.Parse(timeLayout, ap.at)
	return at.Add(-time.Duration(b.Days) * 24 * time.Hour)
}

// prune keeps, of the rows query lists newest first (a key and a time
// each), at most b.Versions, and of those only the ones replaced (by the
// row after them) since the cutoff, but always the first least (a plan's
// diff needs the one before; a rollout, the version it goes from); it
// returns the oldest key kept (0: none to drop).
func (ap *applier) prune(b HistoryBound, least int, query string, args ...any) (uint64, error) {
	rows, err := ap.q.QueryContext(ap.ctx, query, args...)
	if err != nil {
		return 0, err
	}
	defer rows.Close()
	cut, keep, n := ap.cutoff(b), uint64(0), 0
	drop := false
	var replaced time.Time // when the row after this one came: this one's end
	for rows.Next() {
		var k uint64
		var at string
		if err := rows.Scan(&k, &at); err != nil {
			return 0, err
		}
		t, _ := time.Parse(timeLayout, at)
		if n >= least && (n >= b.Versions || replaced.Before(cut)) {
			drop = true
			break
		}
		keep, n, replaced = k, n+1, t
	}
	if err := rows.Err(); err != nil {
		return 0, err
	}
	if !drop {
		return 0, nil
	}
	return keep, nil
}

// prunePlans drops a node's plan versions past the bound.
func (ap *applier) prunePlans(b HistoryBound, node string) error {
	keep, err := ap.prune(b, 2, `SELECT version, created_at FROM plans WHERE node = ? ORDER BY version DESC`, node)
	if err != nil || keep == 0 {
		return err
	}
	return ap.q.exec(`DELETE FROM plans WHERE node = ? AND version < ?`, node, keep)
}

// pruneRoster drops a name's roster events past the bound.
func (ap *applier) pruneRoster(b HistoryBound, name string) error {
	keep, err := ap.prune(b, 2, `SELECT idx, at FROM roster_history WHERE name = ? ORDER BY idx DESC`, name)
	if err != nil || keep == 0 {
		return err
	}
	return ap.q.exec(`DELETE FROM roster_history WHERE name = ? AND idx < ?`, name, keep)
}

// pruneModule drops a module's versions past the bound, never one its
// rollout goes from or to (a revert needs it).
func (ap *applier) pruneModule(b HistoryBound, module string) error {
	keep, err := ap.prune(b, 2, `SELECT version, at FROM module_history WHERE module = ? ORDER BY version DESC`, module)
	if err != nil || keep == 0 {
		return err
	}
	return exec(ap.tx, `DELETE FROM module_history WHERE module = ? AND version < ?
		AND version NOT IN (SELECT from_version FROM rollouts WHERE module = ?) AND version NOT IN (SELECT to_version FROM rollouts WHERE module = ?)`, module, keep, module, module)
}

// pruneAll prunes every node's plans, every name's events and every
// module's versions (history.keep).
func (ap *applier) pruneAll() error {
	b, err := historyBound(ap.tx)
	if err != nil || !b.Set {
		return err
	}
	for _, q := range []struct {
		list  string
		prune func(HistoryBound, string) error
	}{
		{`SELECT DISTINCT node FROM plans ORDER BY node`, ap.prunePlans},
		{`SELECT DISTINCT name FROM roster_history ORDER BY name`, ap.pruneRoster},
		{`SELECT DISTINCT module FROM module_history ORDER BY module`, ap.pruneModule},
	} {
		keys, err := listRowsQ(ap.tx, q.list)
		if err != nil {
			return err
		}
		for _, k := range keys {
			if err := q.prune(b, k); err != nil {
				return err
			}
		}
	}
	return nil
}
