package state

import (
	"context"
	"strings"
	"testing"
)

// A draining node keeps what it runs and takes nothing new; --undo ends it.
func TestNodeDrain(t *testing.T) {
	ctx := context.Background()
	s := openStore(t)
	var idx uint64
	mustApply(t, s, &idx, &InitRequest{MeshID: "m-1", Node: Node{Name: "ace", Address: "10.0.0.1"}})
	mustApply(t, s, &idx, &ModuleAddRequest{Modules: []ModuleSpec{spec("git.yaml", edgeGitSrc), spec("wiki.yaml", edgeWikiSrc)}})
	mustApply(t, s, &idx, &AssignRequest{Assignment: Assignment{Node: "ace", Module: "git"}})
	before, err := s.Plan(ctx, "ace")
	if err != nil {
		t.Fatal(err)
	}
	mustApply(t, s, &idx, &NodeDrainRequest{Node: "ace"})
	if n, _ := s.Node(ctx, "ace"); !n.Draining {
		t.Fatal("not marked draining")
	}
	if after, _ := s.Plan(ctx, "ace"); after.Version != before.Version {
		t.Fatalf("the drain changed the plan: v%d -> v%d", before.Version, after.Version)
	}
	dump := dumpJSON(t, s)
	err = applyErr(t, s, &idx, &AssignRequest{Assignment: Assignment{Node: "ace", Module: "wiki"}})
	if err == nil || !strings.Contains(err.Error(), "node ace is draining") || !strings.Contains(err.Error(), "mesh node drain ace --undo") {
		t.Fatalf("an assign to a draining node: %v", err)
	}
	if !sameState(dump, dumpJSON(t, s)) {
		t.Fatal("the refused assign changed the state")
	}
	if err := applyErr(t, s, &idx, &NodeDrainRequest{Node: "nobody"}); err == nil || !strings.Contains(err.Error(), "nobody") {
		t.Fatalf("draining an unknown node: %v", err)
	}
	// What runs there may still be unassigned.
	mustApply(t, s, &idx, &UnassignRequest{Assignment: Assignment{Node: "ace", Module: "git"}})
	mustApply(t, s, &idx, &NodeDrainRequest{Node: "ace", Undo: true})
	mustApply(t, s, &idx, &AssignRequest{Assignment: Assignment{Node: "ace", Module: "wiki"}})
	if n, _ := s.Node(ctx, "ace"); n.Draining {
		t.Fatal("--undo left it draining")
	}
}

// Nodes is read once per change of the replica: a command's change is seen
// at the next read, and what a caller does to the list it got is not.
func TestNodesKeptUntilAChange(t *testing.T) {
	ctx := context.Background()
	s := openStore(t)
	var idx uint64
	mustApply(t, s, &idx, &InitRequest{MeshID: "m-1", Node: Node{Name: "ace", Address: "10.0.0.1"}})
	mustApply(t, s, &idx, &NodeAddRequest{Node: Node{Name: "bee", Address: "10.0.0.2"}})
	got, err := s.Nodes(ctx)
	if err != nil || len(got) != 2 {
		t.Fatalf("nodes: %v, %v", got, err)
	}
	got[0].Address = "10.9.9.9"
	got[0].PublicDomains = append(got[0].PublicDomains, "x.example")
	if n, _ := s.Node(ctx, "ace"); n.Address != "10.0.0.1" || len(n.PublicDomains) != 0 {
		t.Fatalf("a caller's change reached the kept nodes: %+v", n)
	}
	mustApply(t, s, &idx, &NodeDrainRequest{Node: "bee"})
	if n, _ := s.Node(ctx, "bee"); !n.Draining {
		t.Fatal("the kept nodes outlived a command that changed one")
	}
	mustApply(t, s, &idx, &NodeRemoveRequest{Name: "bee"})
	if _, err := s.Node(ctx, "bee"); err == nil {
		t.Fatal("a removed node is still read")
	}
}
