package cluster

import (
	"context"
	"strings"
	"testing"
	"time"

	"mesh/state"
)

const dbManifest = `module: db
resources:
  - directory: /srv/db
`

// Issue 9 item 4: the leader refuses a command that a node it knows of
// cannot apply yet, naming the node to upgrade.
func TestLeaderRefusesWhatANodeCannotApply(t *testing.T) {
	a, _ := leadingAgent(t)
	ctx := context.Background()
	if _, err := a.Node.Propose(ctx, &state.NodeAddRequest{Node: state.Node{Name: "old", Address: "10.9.9.9"}}); err != nil {
		t.Fatal(err)
	}
	// "old" runs a binary of format 2 (flat commands): it cannot apply the
	// typed commands of format 3, so the leader refuses them all.
	a.Node.live.mu.Lock()
	a.Node.live.seen["old"] = Seen{LastSeen: time.Now(), Version: "v0.1", Commands: 2}
	a.Node.live.mu.Unlock()
	st, _ := a.Store.Settings(ctx)
	restore := &state.RestoreBody{MeshID: st.MeshID}
	if _, err := a.Node.Propose(ctx, restore); err == nil || !strings.Contains(err.Error(), "node old runs mesh v0.1, which cannot apply a restore command yet; upgrade old first") {
		t.Fatalf("restore with an old node: %v", err)
	}
	add := addWeb(t)
	if _, err := a.Node.Propose(ctx, add); err == nil || !strings.Contains(err.Error(), "upgrade old first") {
		t.Fatalf("module add with an old node: %v", err)
	}
	if mods, _ := a.Store.Modules(ctx); len(mods) != 0 {
		t.Fatalf("a refused command changed the catalogue: %+v", mods)
	}
	a.Node.live.mu.Lock()
	a.Node.live.seen["old"] = Seen{LastSeen: time.Now(), Version: "v0.2", Commands: state.CommandVersion}
	a.Node.live.mu.Unlock()
	if _, err := a.Node.Propose(ctx, add); err != nil {
		t.Fatalf("module add once upgraded: %v", err)
	}
	if _, err := a.Node.Propose(ctx, restore); err != nil {
		t.Fatalf("restore once upgraded: %v", err)
	}
}

// A leader just started has heard no hello yet: a node it has not heard
// from, whose binary the state does not show to take the overlay's format
// (it gave no overlay key), holds back a command of that format, which an
// older binary would stop on; it does not hold back one of an older format.
func TestUnheardNodeHoldsBackNewFormats(t *testing.T) {
	a, _ := leadingAgent(t)
	ctx := context.Background()
	if _, err := a.Node.Propose(ctx, &state.NodeAddRequest{Node: state.Node{Name: "quiet", Address: "10.9.9.9"}}); err != nil {
		t.Fatal(err)
	}
	mine := &state.NodeOverlayRequest{Node: a.ID.Name, Key: "k-" + a.ID.Name, Endpoint: "10.9.9.1:51820", Prefix: state.DefaultOverlay}
	if _, err := a.Node.Propose(ctx, mine); err == nil || !strings.Contains(err.Error(), "node quiet has not said which mesh it runs") {
		t.Fatalf("a format-7 command with an unheard node: %v", err)
	}
	if _, err := a.Node.Propose(ctx, addWeb(t)); err != nil {
		t.Fatalf("a format-3 command with an unheard node: %v", err)
	}
	a.Node.live.mu.Lock()
	a.Node.live.seen["quiet"] = Seen{LastSeen: time.Now(), Version: "v0.3", Commands: state.CommandVersion}
	a.Node.live.mu.Unlock()
	if _, err := a.Node.Propose(ctx, &state.NodeOverlayRequest{Node: "quiet", Key: "k-quiet", Endpoint: "10.9.9.9:51820", Prefix: state.DefaultOverlay}); err != nil {
		t.Fatalf("quiet's key once heard: %v", err)
	}
	// Its key in the state says what it runs: unheard again (this leader
	// restarted), it no longer holds the command back.
	a.Node.live.mu.Lock()
	delete(a.Node.live.seen, "quiet")
	a.Node.live.mu.Unlock()
	if _, err := a.Node.Propose(ctx, mine); err != nil {
		t.Fatalf("a format-7 command once every node gave its key: %v", err)
	}
}
