package operate

import (
	"context"
	"errors"
	"log/slog"
	"strings"
	"testing"
	"time"

	"mesh/cluster/api"
	"mesh/podman"
	"mesh/reconciler"
)

// fakeRuntime is a node's Podman as the tests need it.
type fakeRuntime struct {
	lookup func(name string) (reconciler.Container, bool, error)
	logs   func(ctx context.Context, id string, o podman.LogOptions, each func(podman.LogLine) error) error
	exec   func(name string, cfg podman.ExecConfig) (Session, error)
}

var _ Runtime = (*fakeRuntime)(nil)

func (f *fakeRuntime) Lookup(ctx context.Context, name string) (reconciler.Container, bool, error) {
	return f.lookup(name)
}

func (f *fakeRuntime) StreamLogs(ctx context.Context, id string, o podman.LogOptions, each func(podman.LogLine) error) error {
	return f.logs(ctx, id, o, each)
}

func (f *fakeRuntime) Exec(ctx context.Context, name string, cfg podman.ExecConfig) (Session, error) {
	return f.exec(name, cfg)
}

func testServer(t *testing.T, rt Runtime) *Server {
	return &Server{Node: "ace", RT: rt, Log: slog.New(slog.NewTextHandler(tWriter{t}, nil))}
}

type tWriter struct{ t *testing.T }

func (w tWriter) Write(p []byte) (int, error) {
	w.t.Log(strings.TrimSuffix(string(p), "\n"))
	return len(p), nil
}

func running(name string) (reconciler.Container, bool, error) {
	return reconciler.Container{ID: "c1", Name: name, Running: true}, true, nil
}

// A read from Podman that fails part way (its socket gone, the container
// removed, an error frame) is an error of the source, never a log that
// ends early as if it were whole.
func TestLogsCutIsAnError(t *testing.T) {
	rt := &fakeRuntime{lookup: running}
	rt.logs = func(ctx context.Context, id string, o podman.LogOptions, each func(podman.LogLine) error) error {
		each(podman.LogLine{Time: time.Unix(100, 0), Stream: "stdout", Text: "one"})
		each(podman.LogLine{Time: time.Unix(101, 0), Stream: "stdout", Text: "two"})
		return errors.New("read the log stream: unexpected EOF")
	}
	s := testServer(t, rt)
	var got []string
	err := s.nodeLogs(context.Background(), api.Source{Node: "ace", Container: "app.server"}, api.LogQuery{}, func(r api.Record) error {
		got = append(got, r.Text)
		return nil
	})
	if strings.Join(got, " ") != "one two" {
		t.Fatalf("lines %q, want one two", got)
	}
	if err == nil {
		t.Fatal("a log cut part way read as whole (no error)")
	}
	if !strings.Contains(err.Error(), "cut") || !strings.Contains(err.Error(), "unexpected EOF") {
		t.Fatalf("error %q does not say the log was cut and why", err)
	}
}
