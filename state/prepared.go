package state

import (
	"context"
	"database/sql"
	"fmt"
)

// Statements the FSM runs on every command are prepared once per
// connection instead of once per run (issue "scale", item 1): SQLite
// parses a statement anew on each Exec or Query through database/sql, and
// the parsing of the twenty-odd statements an assign runs cost about a
// millisecond of it. The SQL, the arguments and the rows are the same, so
// a prepared statement changes no outcome, only the time.

// prepared is q prepared on the store's database, nil when it cannot be
// (then the caller runs q as it is: never a failure of its own).
func (s *Store) prepared(q string) *sql.Stmt {
	if st, ok := s.stmts.Load(q); ok {
		return st.(*sql.Stmt)
	}
	// The FSM's statements are constants; past this many, a statement made
	// up at run time would be kept forever, one per value.
	if s.prepares.Add(1) > maxPrepared {
		return nil
	}
	st, err := s.db.Prepare(q)
	if err != nil {
		return nil
	}
	if was, loaded := s.stmts.LoadOrStore(q, st); loaded {
		st.Close()
		return was.(*sql.Stmt)
	}
	return st
}

// maxPrepared bounds the statements a store prepares (about 40 are).
const maxPrepared = 200

// txStmts runs statements inside tx through the store's prepared ones; it
// is a queryer, so the readers the FSM shares with the API (input,
// historyBound) take it in place of tx.
type txStmts struct {
	s  *Store
	tx *sql.Tx
}

func (t txStmts) stmt(ctx context.Context, q string) *sql.Stmt {
	if st := t.s.prepared(q); st != nil {
		return t.tx.StmtContext(ctx, st)
	}
	return nil
}

func (t txStmts) QueryContext(ctx context.Context, q string, args ...any) (*sql.Rows, error) {
	if st := t.stmt(ctx, q); st != nil {
		return st.QueryContext(ctx, args...)
	}
	return t.tx.QueryContext(ctx, q, args...)
}

func (t txStmts) QueryRowContext(ctx context.Context, q string, args ...any) *sql.Row {
	if st := t.stmt(ctx, q); st != nil {
		return st.QueryRowContext(ctx, args...)
	}
	return t.tx.QueryRowContext(ctx, q, args...)
}

func (t txStmts) exec(q string, args ...any) error {
	var err error
	if st := t.stmt(context.Background(), q); st != nil {
		_, err = st.Exec(args...)
	} else {
		_, err = t.tx.Exec(q, args...)
	}
	if err != nil {
		return fmt.Errorf("exec %s: %w", q, err)
	}
	return nil
}

// closeStatements closes the prepared statements (Close).
func (s *Store) closeStatements() {
	s.stmts.Range(func(q, st any) bool {
		st.(*sql.Stmt).Close()
		s.stmts.Delete(q)
		return true
	})
}
