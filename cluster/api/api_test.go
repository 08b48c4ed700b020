package api

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"mesh/cluster"
	"mesh/state"
)

// Issue 9 item 7: save, change, restore: the state comes back on the node,
// every plan follows from it, and a snapshot of another mesh is refused
// unless forced.
func TestSnapshotSaveAndRestore(t *testing.T) {
	dir := initDir(t, cluster.LogStoreWAL)
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
	// A parsed form sent with a module is not trusted: the proposer parses
	// the text (here web's text comes with db's parsed form).
	forged, err := state.SpecOf("db.yaml", dbManifest)
	must(err)
	body.Modules = append([]state.RestoredModule(nil), body.Modules...)
	body.Modules[0].Manifest = forged.Manifest
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
	dirA := initDir(t, cluster.LogStoreWAL)
	a := startAgent(t, dirA)
	waitLeader(t, a)
	tr, err := NewClient(dirA).Token(ctx, false, 0)
	tok := tr.Token
	if err != nil {
		t.Fatal(err)
	}
	var others []*agent
	for i, name := range []string{"novox", "g14"} {
		d := filepath.Join(t.TempDir(), name)
		err := cluster.Join(ctx, cluster.JoinConfig{DataDir: d, Peer: fmt.Sprintf("127.0.0.1:%d", a.ID.Port), Token: tok, Name: name, Address: fmt.Sprintf("127.0.0.%d", i+2), Port: freePort(t)})
		if err != nil {
			t.Fatal(err)
		}
		others = append(others, startAgent(t, d))
	}
	// Three voters.
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		if a.voters(t) == 3 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("not three voters within 30s: %d", a.voters(t))
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
	// cluster.Recover refuses while the agent runs, then works on the stopped node.
	if _, err := cluster.Recover(ctx, dirA); err == nil || !strings.Contains(err.Error(), "stop the agent first") {
		t.Fatalf("recover with the agent running: %v", err)
	}
	a.Stop()
	res, err := cluster.Recover(ctx, dirA)
	if err != nil {
		t.Fatal(err)
	}
	if strings.Join(res.Lost, ",") != "novox,g14" && strings.Join(res.Lost, ",") != "g14,novox" {
		t.Fatalf("lost voters: %v", res.Lost)
	}
	a = startAgent(t, dirA)
	defer a.Stop()
	waitLeader(t, a)
	if a.voters(t) != 1 {
		t.Fatalf("%d voters after recover", a.voters(t))
	}
	ro, err := a.Store.Roster(ctx)
	if err != nil || !strings.Contains(fmt.Sprint(ro), "web.internal") {
		t.Fatalf("names after recover: %v %v", ro, err)
	}
	if _, err := c.Assign(ctx, state.OpUnassign, "ace", "web"); err != nil {
		t.Fatalf("a write after recover: %v", err)
	}
}

// Issue 9 item 1: a join sent the moment the first agent started (before it
// elected itself) waits for the election instead of failing with "no leader
// is known". Issue 9 item 2 is the same wait on every write.
func TestJoinRightAfterFirstStart(t *testing.T) {
	dir := initDir(t, cluster.LogStoreWAL)
	id, err := cluster.ReadIdentity(dir)
	if err != nil {
		t.Fatal(err)
	}
	// The agent starts in the background; the join and a write go out the
	// moment its socket exists, before it elected itself.
	started := make(chan *agent, 1)
	go func() { started <- startAgent(t, dir) }()
	t.Cleanup(func() { (<-started).Stop() })
	sock := filepath.Join(dir, cluster.SocketFile)
	// (The socket file appears at bind(), before listen(): dial, not stat.)
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(time.Millisecond) {
		if c, err := net.Dial("unix", sock); err == nil {
			c.Close()
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("no socket within 10s")
		}
	}
	c := NewClient(dir)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	tr, err := c.Token(ctx, false, 0)
	tok := tr.Token
	if err != nil {
		t.Fatal(err)
	}
	wrote := make(chan error, 1)
	go func() {
		_, err := c.AddModules(ctx, AddRequest{Modules: []state.ModuleText{{File: "web.yaml", Text: webManifest}}})
		wrote <- err
	}()
	err = cluster.Join(ctx, cluster.JoinConfig{
		DataDir: filepath.Join(t.TempDir(), "novox"), Peer: fmt.Sprintf("127.0.0.1:%d", id.Port),
		Token: tok, Name: "novox", Address: "127.0.0.2", Port: freePort(t),
	})
	if err != nil {
		t.Fatalf("join right after the first start: %v", err)
	}
	if err := <-wrote; err != nil {
		t.Fatalf("a write right after the first start: %v", err)
	}
}

func TestClientSaysWhenNoAgentRuns(t *testing.T) {
	dir := t.TempDir()
	_, err := NewClient(dir).Status(context.Background())
	if !errors.Is(err, ErrNoAgent) || !strings.Contains(err.Error(), "mesh agent --data-dir "+dir) {
		t.Fatalf("got %v", err)
	}
}

// Hardening, item 9: a snapshot that holds a secret in plain text (an older
// mesh's, or a crafted one) leaves none in plain text on any replica: the
// restore seals each to the nodes that deliver it, and leaves out one that
// no node delivers, saying so.
func TestRestoreSealsPlainSecrets(t *testing.T) {
	dir := initDir(t, cluster.LogStoreWAL)
	a := startAgent(t, dir)
	defer a.Stop()
	waitLeader(t, a)
	c := NewClient(dir)
	ctx := context.Background()
	const pg = "module: pg\naccepts-credentials: /srv/pg/creds\nresources:\n  - directory: /srv/pg\n  - directory: /srv/pg/creds\n"
	const app = "module: app\nresources:\n  - directory: /srv/app\n  - credential: /srv/app/db.password\n    provider: pg\n"
	const idle = "module: idle\nresources:\n  - directory: /srv/idle\n  - credential: /srv/idle/db.password\n    provider: pg\n"
	if _, err := c.AddModules(ctx, AddRequest{Modules: []state.ModuleText{{File: "pg.yaml", Text: pg}, {File: "app.yaml", Text: app}, {File: "idle.yaml", Text: idle}}}); err != nil {
		t.Fatal(err)
	}
	for _, m := range []string{"pg", "app"} {
		if _, err := c.Assign(ctx, state.OpAssign, "ace", m); err != nil {
			t.Fatal(err)
		}
	}
	saved, err := c.Snapshot(ctx)
	if err != nil {
		t.Fatal(err)
	}
	sn, err := state.ReadSnapshot(bytes.NewReader(saved))
	if err != nil {
		t.Fatal(err)
	}
	body, err := sn.RestoreBody()
	if err != nil {
		t.Fatal(err)
	}
	// The crafted part: both credentials in plain text.
	body.Credentials = []state.Secret{
		{Pair: state.Pair{Consumer: "app", Provider: "pg"}, Value: "plain-app-secret"},
		{Pair: state.Pair{Consumer: "idle", Provider: "pg"}, Value: "plain-idle-secret"},
	}
	r, err := c.Restore(ctx, RestoreRequest{Restore: body})
	if err != nil {
		t.Fatal(err)
	}
	if len(r.Unsealed) != 1 || r.Unsealed[0] != "idle -> pg" {
		t.Fatalf("left out: %v", r.Unsealed)
	}
	row, err := a.Store.SealedSecret(ctx, state.Pair{Consumer: "app", Provider: "pg"})
	if err != nil || row.Plain != "" || row.Sealed == "" || row.Digest != state.SecretDigest("plain-app-secret") {
		t.Fatalf("app -> pg after the restore: %+v %v", row, err)
	}
	if got, err := a.Node.Seal().Open(row.Sealed); err != nil || got != "plain-app-secret" {
		t.Fatalf("the node that delivers it opens %q, %v", got, err)
	}
	if row, err := a.Store.SealedSecret(ctx, state.Pair{Consumer: "idle", Provider: "pg"}); err == nil && row.Plain != "" {
		t.Fatalf("idle -> pg kept in plain text: %+v", row)
	}
	var snap bytes.Buffer
	if err := a.Store.WriteSnapshot(ctx, &snap); err != nil {
		t.Fatal(err)
	}
	if bytes.Contains(snap.Bytes(), []byte("plain-app-secret")) || bytes.Contains(snap.Bytes(), []byte("plain-idle-secret")) {
		t.Fatal("a secret is in plain text in the replica")
	}
}

// mesh token --ttl: the token says its end, carries a secret of its own,
// joins, and stops joining once the join secret is rotated; a ttl out of
// bounds is refused.
func TestTokenTTL(t *testing.T) {
	dir := initDir(t, cluster.LogStoreWAL)
	a := startAgent(t, dir)
	defer a.Stop()
	waitLeader(t, a)
	c := NewClient(dir)
	ctx := context.Background()
	plain, err := c.Token(ctx, false, 0)
	if err != nil {
		t.Fatal(err)
	}
	before := time.Now()
	tr, err := c.Token(ctx, false, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	tok, err := cluster.ParseToken(tr.Token)
	if err != nil {
		t.Fatal(err)
	}
	until, err := time.Parse(time.RFC3339, tr.Until)
	if err != nil || tok.Until != until.Unix() || until.Before(before.Add(time.Hour-time.Second)) || until.After(time.Now().Add(time.Hour+time.Second)) {
		t.Fatalf("a token for an hour says until %q (%v), carries %d", tr.Until, err, tok.Until)
	}
	if p, _ := cluster.ParseToken(plain.Token); p.Until != 0 || plain.Until != "" || p.Secret == tok.Secret {
		t.Fatalf("the token without --ttl: until %d %q, the same secret as one with: %v", p.Until, plain.Until, p.Secret == tok.Secret)
	}
	joined := 1
	join := func(name, token string) error {
		joined++
		return cluster.Join(ctx, cluster.JoinConfig{DataDir: filepath.Join(t.TempDir(), name), Peer: fmt.Sprintf("127.0.0.1:%d", a.ID.Port), Token: token, Name: name, Address: fmt.Sprintf("127.0.0.%d", joined), Port: freePort(t)})
	}
	if err := join("novox", tr.Token); err != nil {
		t.Fatalf("a join with a token for an hour: %v", err)
	}
	if _, err := c.Token(ctx, true, 0); err != nil {
		t.Fatal(err)
	}
	if err := join("g14", tr.Token); err == nil || !strings.Contains(err.Error(), "secret is not valid") {
		t.Fatalf("a token for an hour made before a rotation: %v, want it refused", err)
	}
	for _, ttl := range []time.Duration{10 * time.Second, MaxTokenTTL + time.Hour, -time.Hour} {
		if _, err := c.Token(ctx, false, ttl); err == nil || !strings.Contains(err.Error(), "between 1m and 8760h") {
			t.Fatalf("ttl %s: %v, want it refused", ttl, err)
		}
	}
	// A rotation with a ttl out of bounds is refused before it rotates:
	// the token before still joins.
	now, err := c.Token(ctx, false, 0)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.Token(ctx, true, 10*time.Second); err == nil {
		t.Fatal("a rotation with a ttl of 10s was not refused")
	}
	if err := join("g15", now.Token); err != nil {
		t.Fatalf("the token after a refused rotation: %v", err)
	}
}
