package agent

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"mesh/state"
)

// TestMoversForgetEndedMoves: what the moves' loop keeps of a move (the
// sweep of a replaced copy, the container last logged as waiting) goes
// once the move no longer copies or starts.
func TestMoversForgetEndedMoves(t *testing.T) {
	m := &movers{logged: map[uint64]string{7: "db.server", 9: "web.server"}, swept: map[uint64]bool{7: true, 8: true, 9: true}}
	m.forget([]state.MoveInfo{
		{ID: 7, Module: "db", Phase: state.MoveStart},
		{ID: 8, Module: "cache", Phase: state.MoveDone},
		{ID: 9, Module: "web", Phase: state.MoveAborted},
	})
	if len(m.logged) != 1 || m.logged[7] != "db.server" || len(m.swept) != 1 || !m.swept[7] {
		t.Fatalf("kept: logged %v, swept %v", m.logged, m.swept)
	}
	m.forget(nil)
	if len(m.logged) != 0 || len(m.swept) != 0 {
		t.Fatalf("kept with no move: logged %v, swept %v", m.logged, m.swept)
	}
}

// A move's receiver does not set aside a directory at a data path that no
// module has on it (an operator's), unless the manifest takes it over.
func TestMoveRefusesAnOperatorsDirectory(t *testing.T) {
	d := filepath.Join(t.TempDir(), "srv", "db")
	if err := foreignAt(d, "n2", "", false); err != nil {
		t.Fatalf("nothing there: %v", err)
	}
	os.MkdirAll(d, 0o755)
	if err := foreignAt(d, "n2", "", false); err == nil || !strings.Contains(err.Error(), "exists on n2 and the mesh did not make it") {
		t.Fatalf("an operator's directory: %v", err)
	}
	if err := foreignAt(d, "n2", "db", false); err != nil {
		t.Fatalf("the module's own (an earlier run's, kept): %v", err)
	}
	if err := foreignAt(d, "n2", "", true); err != nil {
		t.Fatalf("taken over by the manifest: %v", err)
	}
}
