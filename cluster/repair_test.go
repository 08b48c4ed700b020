package cluster

import (
	"context"
	"fmt"
	"path/filepath"
	"testing"
	"time"

	"github.com/hashicorp/raft"

	"mesh/internal/wgkey"
	"mesh/state"
)

// Issue 9 item 5: a removal that crashed between the state and Raft heals:
// the leader removes the Raft server that is no longer a node.
func TestMembershipRepair(t *testing.T) {
	a, _ := leadingAgent(t)
	// The half-done removal: a server Raft knows and the state does not.
	if err := a.Node.raft.AddNonvoter("ghost", "127.0.0.9:1", 0, 5*time.Second).Error(); err != nil {
		t.Fatal(err)
	}
	has := func() bool {
		for _, s := range a.Node.raft.GetConfiguration().Configuration().Servers {
			if s.ID == raft.ServerID("ghost") {
				return true
			}
		}
		return false
	}
	if !has() {
		t.Fatal("the ghost was not added")
	}
	for deadline := time.Now().Add(3 * RepairInterval); has(); time.Sleep(100 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("the ghost server is still in Raft after %s", 3*RepairInterval)
		}
	}
}

// Issue 9 item 5, the other direction: a join that stopped between the state
// and Raft heals. The leader adds the node Raft lacks, at the port it joined
// with; and the same node may join again (a retry after such a crash).
func TestMembershipRepairAddsWhatRaftLacks(t *testing.T) {
	a, dir := leadingAgent(t)
	ctx := context.Background()
	// The half-done join: the state has the node (with the overlay key its
	// join carried), Raft does not.
	wk, err := wgkey.Generate()
	if err != nil {
		t.Fatal(err)
	}
	if _, err := a.Node.Propose(ctx, &state.NodeAddRequest{Node: state.Node{Name: "late", Address: "127.0.0.9", Port: 7001, OverlayKey: wk.Public(), OverlayEndpoint: "127.0.0.9:51820"}}); err != nil {
		t.Fatal(err)
	}
	server := func(id string) (raft.Server, bool) {
		for _, s := range a.Node.raft.GetConfiguration().Configuration().Servers {
			if s.ID == raft.ServerID(id) {
				return s, true
			}
		}
		return raft.Server{}, false
	}
	for deadline := time.Now().Add(3 * RepairInterval); ; time.Sleep(100 * time.Millisecond) {
		if s, ok := server("late"); ok {
			if s.Address != "127.0.0.9:7001" || s.Suffrage != raft.Nonvoter {
				t.Fatalf("added as %+v", s)
			}
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the node Raft lacked was not added within %s", 3*RepairInterval)
		}
	}
	// A real node joins, and joins again with a fresh data dir (its first
	// try's answer was lost): both are admitted, and the state has it once.
	id, err := ReadIdentity(dir)
	if err != nil {
		t.Fatal(err)
	}
	tok, err := a.Store.Identity(ctx)
	if err != nil {
		t.Fatal(err)
	}
	secret, err := a.Node.JoinSecret(tok)
	if err != nil {
		t.Fatal(err)
	}
	token := Token{MeshID: tok.MeshID, CADigest: CADigest([]byte(tok.CACert)), Secret: secret}.String()
	port := freePort(t)
	for i := 0; i < 2; i++ {
		err := Join(ctx, JoinConfig{DataDir: filepath.Join(t.TempDir(), "novox"), Peer: fmt.Sprintf("127.0.0.1:%d", id.Port), Token: token, Name: "novox", Address: "127.0.0.2", Port: port})
		if err != nil {
			t.Fatalf("join %d: %v", i+1, err)
		}
	}
	nodes, _ := a.Store.Nodes(ctx)
	n := 0
	for _, nd := range nodes {
		if nd.Name == "novox" {
			n++
			if nd.Port != port {
				t.Fatalf("novox's raft port in the state: %d, want %d", nd.Port, port)
			}
		}
	}
	if n != 1 {
		t.Fatalf("novox is %d times in the state", n)
	}
	if _, ok := server("novox"); !ok {
		t.Fatal("novox is not in Raft after joining again")
	}
}
