package cluster

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"mesh/internal/testutil"
	"mesh/state"
)

const webManifest = `module: web
resources:
  - directory: /srv/web
  - container: web.server
    image: localhost/busybox:1
    mounts: ["/srv/web:/www"]
`

func testLogger(t testing.TB) *slog.Logger { return testutil.Logger(t) }

func initDir(t testing.TB, store string) string {
	t.Helper()
	return initVoters(t, store, 0)
}

// initVoters is initDir for a mesh of that many voters (0: the default).
func initVoters(t testing.TB, store string, voters int) string {
	t.Helper()
	dir := filepath.Join(t.TempDir(), "node")
	err := Init(context.Background(), InitConfig{DataDir: dir, Name: "ace", Address: "127.0.0.1", Port: freePort(t), LogStore: store, Voters: voters})
	if err != nil {
		t.Fatal(err)
	}
	return dir
}

func startAgent(t testing.TB, dir string) *Member {
	t.Helper()
	a, err := StartMember(MemberConfig{DataDir: dir, Logger: testLogger(t), Version: "test"})
	if err != nil {
		t.Fatal(err)
	}
	return a
}

// addWeb is a module add of webManifest, as a proposer makes it.
func addWeb(t testing.TB) *state.ModuleAddRequest {
	return addModule(t, "web.yaml", webManifest)
}

func addModule(t testing.TB, file, text string) *state.ModuleAddRequest {
	t.Helper()
	sp, err := state.SpecOf(file, text)
	if err != nil {
		t.Fatal(err)
	}
	return &state.ModuleAddRequest{Modules: []state.ModuleSpec{sp}}
}

// leadingAgent inits a one-node mesh, starts it until the test ends, and
// returns it once it leads, with its data dir.
func leadingAgent(t testing.TB) (*Member, string) {
	t.Helper()
	dir := initDir(t, LogStoreWAL)
	a := startAgent(t, dir)
	t.Cleanup(func() { a.Stop() })
	waitLeader(t, a)
	return a, dir
}

func waitLeader(t testing.TB, a *Member) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for a.Node.State() != "Leader" {
		if time.Now().After(deadline) {
			t.Fatal("node did not become leader within 10s")
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func TestAgentKeepsStateAcrossRestartAndSnapshot(t *testing.T) {
	for _, store := range []string{LogStoreWAL, LogStoreBolt} {
		t.Run(store, func(t *testing.T) {
			dir := initDir(t, store)
			a := startAgent(t, dir)
			waitLeader(t, a)
			ctx := context.Background()
			if _, err := a.Node.Propose(ctx, addWeb(t)); err != nil {
				t.Fatal(err)
			}
			if _, err := a.Node.Propose(ctx, &state.AssignRequest{Assignment: state.Assignment{Node: "ace", Module: "web"}}); err != nil {
				t.Fatal(err)
			}
			_, err := a.Node.Propose(ctx, &state.AssignRequest{Assignment: state.Assignment{Node: "nobody", Module: "web"}})
			if err == nil || !strings.Contains(err.Error(), `node "nobody" is not in the mesh (known: ace)`) {
				t.Fatalf("assign to unknown node: %v", err)
			}
			before, _ := a.Store.Dump(ctx)
			if err := a.Node.Snapshot(); err != nil {
				t.Fatal(err)
			}
			if err := a.Stop(); err != nil {
				t.Fatal(err)
			}

			// Restart: the replica is the same, and nothing was applied twice.
			a = startAgent(t, dir)
			waitLeader(t, a)
			after, _ := a.Store.Dump(ctx)
			if fmt.Sprint(after.Rows("plans")) != fmt.Sprint(before.Rows("plans")) || fmt.Sprint(after.Rows("roster")) != fmt.Sprint(before.Rows("roster")) {
				t.Fatalf("state changed across restart:\n%v\n%v", before.Rows("plans"), after.Rows("plans"))
			}
			a.Stop()

			// Lose the replica: it is rebuilt from the snapshot and the log.
			for _, f := range []string{StateFile, StateFile + "-wal", StateFile + "-shm"} {
				os.Remove(filepath.Join(dir, f))
			}
			a = startAgent(t, dir)
			defer a.Stop()
			waitLeader(t, a)
			ro, err := a.Store.Roster(ctx)
			if err != nil || len(ro) != 2 || ro[1].Name != "web.internal" {
				t.Fatalf("roster after rebuild: %v %v", ro, err)
			}
		})
	}
}

func TestInitRefusesAnExistingNode(t *testing.T) {
	dir := initDir(t, LogStoreWAL)
	err := Init(context.Background(), InitConfig{DataDir: dir, Name: "other", Address: "127.0.0.1", Port: freePort(t)})
	if err == nil || !strings.Contains(err.Error(), `already holds node "ace"`) {
		t.Fatalf("second init: %v", err)
	}
	id, _ := ReadIdentity(dir)
	if id.Name != "ace" {
		t.Fatalf("identity changed to %+v", id)
	}
}

// BenchmarkApply measures commands applied per second through Raft on one
// node (alternating assign and unassign), with each log store.
func BenchmarkApply(b *testing.B) {
	for _, store := range []string{LogStoreWAL, LogStoreBolt} {
		b.Run(store, func(b *testing.B) {
			dir := initDir(b, store)
			a, err := StartMember(MemberConfig{DataDir: dir, Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
			if err != nil {
				b.Fatal(err)
			}
			defer a.Stop()
			waitLeader(b, a)
			ctx := context.Background()
			if _, err := a.Node.Propose(ctx, addWeb(b)); err != nil {
				b.Fatal(err)
			}
			b.ResetTimer()
			start := time.Now()
			for i := 0; i < b.N; i++ {
				var req state.Request = &state.AssignRequest{Assignment: state.Assignment{Node: "ace", Module: "web"}}
				if i%2 == 1 {
					req = &state.UnassignRequest{Assignment: state.Assignment{Node: "ace", Module: "web"}}
				}
				if _, err := a.Node.Propose(ctx, req); err != nil {
					b.Fatal(err)
				}
			}
			b.ReportMetric(float64(b.N)/time.Since(start).Seconds(), "cmds/s")
		})
	}
}

// twoNodes starts a mesh of ace (its leader) and novox, joined with a token
// as `mesh join` would; both stop when the test ends.
// joinToken is the token that joins m's mesh (m is a voter, which opens
// the join secret).
func joinToken(t testing.TB, m *Member) string {
	t.Helper()
	id, err := m.Store.Identity(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	secret, err := m.Node.JoinSecret(id)
	if err != nil {
		t.Fatal(err)
	}
	return Token{MeshID: id.MeshID, CADigest: CADigest([]byte(id.CACert)), Secret: secret}.String()
}

func twoNodes(t *testing.T) (a, b *Member) {
	t.Helper()
	return twoNodesVoting(t, 0)
}

// twoNodesVoting is twoNodes in a mesh of that many voters: with 1, novox
// stays a non-voter, and ace keeps its quorum when novox stops.
func twoNodesVoting(t *testing.T, voters int) (a, b *Member) {
	t.Helper()
	ctx := context.Background()
	a = startAgent(t, initVoters(t, LogStoreWAL, voters))
	t.Cleanup(func() { a.Stop() })
	waitLeader(t, a)
	token := joinToken(t, a)
	dirB := filepath.Join(t.TempDir(), "novox")
	if err := Join(ctx, JoinConfig{DataDir: dirB, Peer: fmt.Sprintf("127.0.0.1:%d", a.ID.Port), Token: token, Name: "novox", Address: "127.0.0.2", Port: freePort(t)}); err != nil {
		t.Fatal(err)
	}
	b = startAgent(t, dirB)
	t.Cleanup(func() { b.Stop() })
	return a, b
}
