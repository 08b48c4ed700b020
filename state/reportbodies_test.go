package state

import (
	"bytes"
	"context"
	"maps"
	"testing"
)

// The report bodies the store keeps follow every command that writes the
// table (a report, a node's removal), and with checkComposition on a write
// past the FSM is found.
func TestReportBodiesKept(t *testing.T) {
	ctx := context.Background()
	s := openStore(t)
	var idx uint64
	mustApply(t, s, &idx, &InitRequest{MeshID: "m-1", Domain: "internal", Node: Node{Name: "ace", Address: "10.0.0.1", Voter: true}})
	mustApply(t, s, &idx, &NodeAddRequest{Node: Node{Name: "bee", Address: "10.0.0.2"}})
	check := checkComposition
	defer func() { checkComposition = check }()
	checkComposition = false
	same := func(step string) map[string]string {
		t.Helper()
		got, err := s.ReportBodies(ctx)
		if err != nil {
			t.Fatal(err)
		}
		read, err := s.readReportBodies(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if !maps.Equal(got, read) {
			t.Fatalf("%s: kept %v, the table holds %v", step, got, read)
		}
		return got
	}
	if len(same("none yet")) != 0 {
		t.Fatal("reports before any")
	}
	mustApply(t, s, &idx, &ReportRequest{Report: Report{Node: "ace", Version: 1}})
	mustApply(t, s, &idx, &ReportRequest{Report: Report{Node: "bee", Version: 1}})
	same("two reports")
	mustApply(t, s, &idx, &ReportRequest{Report: Report{Node: "ace", Version: 2, Error: "x"}})
	if got := same("a new report"); len(got) != 2 {
		t.Fatalf("%d reports", len(got))
	}
	var snap bytes.Buffer
	if err := s.WriteSnapshot(ctx, &snap); err != nil {
		t.Fatal(err)
	}
	mustApply(t, s, &idx, &NodeRemoveRequest{Name: "bee"})
	if got := same("bee removed"); len(got) != 1 {
		t.Fatalf("%d reports after bee's removal", len(got))
	}
	if err := s.Restore(ctx, &snap); err != nil {
		t.Fatal(err)
	}
	if got := same("restored"); len(got) != 2 {
		t.Fatalf("%d reports after the restore", len(got))
	}
	mustApply(t, s, &idx, &NodeRemoveRequest{Name: "bee"})
	same("bee removed again")
	// Kept, not read: a write past the FSM is not seen, and the check
	// finds it.
	if _, err := s.db.Exec(`UPDATE reports SET body = '{}' WHERE node = 'ace'`); err != nil {
		t.Fatal(err)
	}
	if got, _ := s.ReportBodies(ctx); got["ace"] == "{}" {
		t.Fatal("the reports were read, not kept")
	}
	checkComposition = true
	if _, err := s.ReportBodies(ctx); err == nil {
		t.Fatal("the check did not find a write past the FSM")
	}
}
