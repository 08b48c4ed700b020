package state

import (
	"context"
	"database/sql"
	"fmt"
	"maps"
)

// ReportBodies is each node's last report as it is stored (JSON, which
// DecodeReport reads), for a reader that keeps what it decoded and decodes
// again only what changed: the resolver's feed, after every change of the
// replica. The store keeps the bodies from one read to the next, and each
// command that writes a report changes what it keeps (issue "scale"):
// reading every node's report at every assign was most of the feed's work
// at 10,000 modules. With checkComposition on (tests, beds), what is kept
// is compared with a read of the table.
func (s *Store) ReportBodies(ctx context.Context) (map[string]string, error) {
	s.mu.Lock()
	kept, gen := s.reportBodies, s.reportsGen
	s.mu.Unlock()
	if kept != nil && !checkComposition {
		return maps.Clone(kept), nil
	}
	read, err := s.readReportBodies(ctx)
	if err != nil {
		return nil, err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if kept != nil && gen == s.reportsGen && !maps.Equal(kept, read) {
		// The check (checkComposition): a write to the table that did not
		// tell reportsCommitted.
		return nil, fmt.Errorf("the kept reports (%d) are not the table's (%d): a write to the reports table did not change them", len(kept), len(read))
	}
	// A read that a commit overtook is returned but not kept: the commit
	// changed what it read, or not yet.
	if gen == s.reportsGen && s.reportBodies == nil {
		s.reportBodies = read
		return maps.Clone(read), nil
	}
	return read, nil
}

func (s *Store) readReportBodies(ctx context.Context) (map[string]string, error) {
	out := map[string]string{}
	err := eachRow(ctx, s.db, "reports", `SELECT node, body FROM reports`, func(rows *sql.Rows) error {
		var n, body string
		if err := rows.Scan(&n, &body); err != nil {
			return err
		}
		out[n] = body
		return nil
	})
	return out, err
}

// reportsCommitted follows a commit that wrote the reports table: reported
// is the one report it wrote (node, body), forget says it removed one or
// rewrote the table (then the next read reads it).
func (s *Store) reportsCommitted(reported *[2]string, forget bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.reportsGen++
	switch {
	case forget || s.reportBodies == nil:
		s.reportBodies = nil
	case reported != nil:
		next := maps.Clone(s.reportBodies)
		next[reported[0]] = reported[1]
		s.reportBodies = next
	}
}
