package agent

import (
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
