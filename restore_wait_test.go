package main

import (
	"bytes"
	"encoding/json"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"mesh/cluster"
	"mesh/cluster/api"
	"mesh/state"
)

// statusSequence serves the reports in turn to the CLI's status reads
// (the last one again once they are all read), at a socket in a new
// directory, which it returns.
func statusSequence(t *testing.T, node string, reports []*state.Report) string {
	t.Helper()
	dir, err := os.MkdirTemp("", "mw") // short: a socket's path is at most 108 bytes
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	l, err := net.Listen("unix", filepath.Join(dir, cluster.SocketFile))
	if err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	read := 0
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		defer mu.Unlock()
		rep := reports[min(read, len(reports)-1)]
		read++
		json.NewEncoder(w).Encode(api.Status{AppliedIndex: uint64(read), Nodes: []api.NodeStatus{{NodeInfo: state.NodeInfo{Node: state.Node{Name: node}}, Reachable: true, Report: rep}}})
	})}
	go srv.Serve(l)
	t.Cleanup(func() { srv.Close() })
	return dir
}

// mesh restore waits for the containers it stopped to run again even when
// the apply that created them and a later one both came between two reads
// of the status: the later report says them unchanged, not created, and
// the wait lasted until its --timeout (a restore that had worked, said
// failed). An apply from before the restore stopped them does not count.
func TestRestoreWaitSeesContainersStartedByAnEarlierApply(t *testing.T) {
	stopped := time.Date(2026, 12, 7, 10, 0, 0, 0, time.UTC)
	report := func(at time.Time, outcome state.Outcome, health string) *state.Report {
		return &state.Report{Node: "ace", Version: 7, AppliedAt: at,
			Resources: []state.ResourceReport{
				{Module: "db", Kind: "directory", Name: "/srv/db", Outcome: state.Unchanged},
				{Module: "db", Kind: "container", Name: "db.server", Outcome: outcome},
				{Module: "db", Kind: "container", Name: "db.backup", Outcome: outcome},
			},
			Health: []state.ContainerHealth{{Module: "db", Container: "db.server", Status: health}},
		}
	}
	reports := []*state.Report{
		// Before the stop: created and healthy, and not the restore's.
		report(stopped.Add(-time.Second), state.Created, state.HealthHealthy),
		// The second apply after the restore; the first, which created
		// them, was never read.
		report(stopped.Add(2*time.Second), state.Unchanged, state.HealthStarting),
		report(stopped.Add(3*time.Second), state.Unchanged, state.HealthHealthy),
	}
	var out bytes.Buffer
	g := &Globals{DataDir: statusSequence(t, "ace", reports), out: &out}
	if err := waitStarted(g, "ace", "db", []string{"db.server", "db.backup"}, stopped, true, time.Now().Add(20*time.Second)); err != nil {
		t.Fatalf("%v\n%s", err, out.String())
	}
	if !strings.Contains(out.String(), "ace started db.server, db.backup") || !strings.Contains(out.String(), "healthy: db.server") {
		t.Fatalf("want the containers said started, then healthy:\n%s", out.String())
	}
	if n := strings.Count(out.String(), "waiting for the health checks"); n != 1 {
		t.Fatalf("the health check of the restored server was not waited for:\n%s", out.String())
	}

	// Where the time is this machine's (an agent that does not say when it
	// stopped them), a report of unchanged containers may be the apply of
	// just before the restore: only one that created them counts.
	out.Reset()
	g = &Globals{DataDir: statusSequence(t, "ace", reports), out: &out}
	err := waitStarted(g, "ace", "db", []string{"db.server", "db.backup"}, stopped, false, time.Now().Add(2*time.Second))
	if err == nil || !strings.Contains(err.Error(), "did not start") {
		t.Fatalf("from this machine's clock, unchanged containers were taken as started: %v\n%s", err, out.String())
	}

	// A failure of the module after the restore ends the wait at once.
	failed := report(stopped.Add(2*time.Second), state.Failed, state.HealthStarting)
	failed.Failures = []state.ModuleFailure{{Module: "db", Resource: "container db.server", Reason: "image gone"}}
	failed.Error = "container db.server: image gone"
	out.Reset()
	g = &Globals{DataDir: statusSequence(t, "ace", []*state.Report{failed}), out: &out}
	if err := waitStarted(g, "ace", "db", []string{"db.server", "db.backup"}, stopped, true, time.Now().Add(20*time.Second)); err == nil || !strings.Contains(err.Error(), "image gone") {
		t.Fatalf("a failure after the restore: %v", err)
	}
}
