package cluster

import (
	"bytes"
	"context"
	"fmt"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/hashicorp/raft"

	"mesh/state"
)

const dbManifest = `module: db
resources:
  - directory: /srv/db
`

// Issue 9 item 7: save, change, restore: the state comes back on the node,
// every plan follows from it, and a snapshot of another mesh is refused
// unless forced.
func TestSnapshotSaveAndRestore(t *testing.T) {
	dir := initDir(t, LogStoreWAL)
	a := startAgent(t, dir)
	defer a.Stop()
	waitLeader(t, a)
	c := NewClient(dir)
	ctx := context.Background()
	must := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	_, err := c.AddModules(ctx, AddRequest{Modules: []state.ModuleText{{File: "web.yaml", Text: webManifest}}})
	must(err)
	_, err = c.Assign(ctx, state.OpAssign, "ace", "web")
	must(err)
	saved, err := c.Snapshot(ctx)
	must(err)

	// Change everything: web goes, db comes.
	_, err = c.Assign(ctx, state.OpUnassign, "ace", "web")
	must(err)
	_, err = c.RemoveModule(ctx, "web")
	must(err)
	_, err = c.AddModules(ctx, AddRequest{Modules: []state.ModuleText{{File: "db.yaml", Text: dbManifest}}})
	must(err)
	_, err = c.Assign(ctx, state.OpAssign, "ace", "db")
	must(err)

	sn, err := state.ReadSnapshot(bytes.NewReader(saved))
	must(err)
	body, err := sn.RestoreBody()
	must(err)
	// Another mesh's snapshot is refused without --force.
	other := *body
	other.MeshID = "someone-else"
	if _, err := c.Restore(ctx, RestoreRequest{Restore: &other}); err == nil || !strings.Contains(err.Error(), "pass --force") {
		t.Fatalf("restore of another mesh: %v", err)
	}
	r, err := c.Restore(ctx, RestoreRequest{Restore: body})
	must(err)
	mods, err := a.Store.Modules(ctx)
	must(err)
	if len(mods) != 1 || mods[0].Name != "web" || fmt.Sprint(mods[0].Nodes) != "[ace]" {
		t.Fatalf("catalogue after restore: %+v", mods)
	}
	p, err := a.Store.Plan(ctx, "ace")
	must(err)
	if p.Version != r.Index || len(p.Plan.Resources) != 2 || p.Plan.Resources[1].Name != "web.server" || !strings.Contains(p.Cause, "mesh snapshot restore") {
		t.Fatalf("plan after restore: v%d (restore at %d) %+v %s", p.Version, r.Index, p.Plan.Resources, p.Cause)
	}
	ro, err := a.Store.Roster(ctx)
	must(err)
	if len(ro) != 2 || ro[1].Name != "web.internal" {
		t.Fatalf("roster after restore: %v", ro)
	}
}

// Issue 9 item 7: two of three voters gone for good; recover the third, write
// again, names intact.
func TestRecoverTheLastVoter(t *testing.T) {
	ctx := context.Background()
	dirA := initDir(t, LogStoreWAL)
	a := startAgent(t, dirA)
	waitLeader(t, a)
	tok, err := NewClient(dirA).Token(ctx, false)
	if err != nil {
		t.Fatal(err)
	}
	var others []*Agent
	for i, name := range []string{"novox", "g14"} {
		d := filepath.Join(t.TempDir(), name)
		err := Join(ctx, JoinConfig{DataDir: d, Peer: fmt.Sprintf("127.0.0.1:%d", a.ID.Port), Token: tok, Name: name, Address: fmt.Sprintf("127.0.0.%d", i+2), Port: freePort(t)})
		if err != nil {
			t.Fatal(err)
		}
		others = append(others, startAgent(t, d))
	}
	// Three voters.
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		if voters(t, a) == 3 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("not three voters within 30s: %d", voters(t, a))
		}
	}
	c := NewClient(dirA)
	if _, err := c.AddModules(ctx, AddRequest{Modules: []state.ModuleText{{File: "web.yaml", Text: webManifest}}}); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Assign(ctx, state.OpAssign, "ace", "web"); err != nil {
		t.Fatal(err)
	}
	// Issue 9 item 6: status says which nodes are reachable, when each was
	// last seen and what it runs; a stopped node reads unreachable.
	reach := func(want bool) {
		t.Helper()
		for deadline := time.Now().Add(20 * time.Second); ; time.Sleep(100 * time.Millisecond) {
			st, err := c.Status(ctx)
			if err != nil {
				t.Fatal(err)
			}
			ok := len(st.Nodes) == 3
			for _, n := range st.Nodes {
				if n.Name == "ace" {
					ok = ok && n.Reachable && n.Version == "test"
				} else {
					ok = ok && n.Reachable == want && n.LastSeen != nil && n.Version == "test"
				}
			}
			if ok {
				return
			}
			if time.Now().After(deadline) {
				t.Fatalf("status does not show the others reachable=%v within 20s: %+v", want, st.Nodes)
			}
		}
	}
	reach(true)
	// Two voters gone for good: no write can commit.
	for _, o := range others {
		o.Stop()
	}
	reach(false)
	// (Raft may still append it to this node's log: the error says it may or
	// may not be applied, and recover replays what the log holds.)
	wctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	_, err = c.AddModules(wctx, AddRequest{Modules: []state.ModuleText{{File: "db.yaml", Text: dbManifest}}})
	cancel()
	if err == nil {
		t.Fatal("a write committed without a majority")
	}
	t.Logf("write without a majority: %v", err)
	// Recover refuses while the agent runs, then works on the stopped node.
	if _, err := Recover(ctx, dirA); err == nil || !strings.Contains(err.Error(), "stop the agent first") {
		t.Fatalf("recover with the agent running: %v", err)
	}
	a.Stop()
	res, err := Recover(ctx, dirA)
	if err != nil {
		t.Fatal(err)
	}
	if strings.Join(res.Lost, ",") != "novox,g14" && strings.Join(res.Lost, ",") != "g14,novox" {
		t.Fatalf("lost voters: %v", res.Lost)
	}
	a = startAgent(t, dirA)
	defer a.Stop()
	waitLeader(t, a)
	if voters(t, a) != 1 {
		t.Fatalf("%d voters after recover", voters(t, a))
	}
	ro, err := a.Store.Roster(ctx)
	if err != nil || !strings.Contains(fmt.Sprint(ro), "web.internal") {
		t.Fatalf("names after recover: %v %v", ro, err)
	}
	if _, err := c.Assign(ctx, state.OpUnassign, "ace", "web"); err != nil {
		t.Fatalf("a write after recover: %v", err)
	}
}

func voters(t *testing.T, a *Agent) int {
	f := a.Node.raft.GetConfiguration()
	if err := f.Error(); err != nil {
		return 0
	}
	n := 0
	for _, s := range f.Configuration().Servers {
		if s.Suffrage == raft.Voter {
			n++
		}
	}
	return n
}

// Issue 9 item 4: the leader refuses a command that a node it knows of
// cannot apply yet, naming the node to upgrade.
func TestLeaderRefusesWhatANodeCannotApply(t *testing.T) {
	dir := initDir(t, LogStoreWAL)
	a := startAgent(t, dir)
	defer a.Stop()
	waitLeader(t, a)
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
	web, err := state.SpecOf("web.yaml", webManifest)
	if err != nil {
		t.Fatal(err)
	}
	add := &state.ModuleAddRequest{Modules: []state.ModuleSpec{web}}
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
