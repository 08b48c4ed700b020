package api

import (
	"context"
	"log/slog"
	"path/filepath"
	"testing"
	"time"

	"mesh/cluster"
	"mesh/internal/testutil"
)

// These tests run a node as `mesh agent` assembles it, less Podman and the
// resolver: a cluster.Member with the local API around it, on 127.0.0.1.

const webManifest = `module: web
resources:
  - directory: /srv/web
  - container: web.server
    image: localhost/busybox:1
    mounts: ["/srv/web:/www"]
`

const dbManifest = `module: db
resources:
  - directory: /srv/db
`

type agent struct {
	*cluster.Member
	api *API
}

func startAgent(t testing.TB, dir string) *agent {
	t.Helper()
	m, err := cluster.StartMember(cluster.MemberConfig{DataDir: dir, Logger: testLogger(t), Version: "test"})
	if err != nil {
		t.Error(err)
		return nil
	}
	srv := New(Config{Node: m.Node, Store: m.Store, ID: m.ID, Logger: testLogger(t)})
	if err := srv.Start(filepath.Join(dir, cluster.SocketFile)); err != nil {
		m.Stop()
		t.Error(err)
		return nil
	}
	return &agent{Member: m, api: srv}
}

func (a *agent) Stop() error {
	if a == nil {
		return nil
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	a.api.Shutdown(ctx)
	return a.Member.Stop()
}

func (a *agent) voters(t testing.TB) int {
	n, err := a.Node.Voters()
	if err != nil {
		t.Log(err)
	}
	return n
}

func initDir(t testing.TB, store string) string {
	t.Helper()
	dir := filepath.Join(t.TempDir(), "node")
	err := cluster.Init(context.Background(), cluster.InitConfig{DataDir: dir, Name: "ace", Address: "127.0.0.1", Port: freePort(t), LogStore: store})
	if err != nil {
		t.Fatal(err)
	}
	return dir
}

func waitLeader(t testing.TB, a *agent) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for a.Node.State() != "Leader" {
		if time.Now().After(deadline) {
			t.Fatal("node did not become leader within 10s")
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func freePort(t testing.TB) int { return testutil.FreePort(t) }

func testLogger(t testing.TB) *slog.Logger { return testutil.Logger(t) }
