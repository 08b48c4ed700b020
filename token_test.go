package main

import (
	"bytes"
	"encoding/json"
	"net"
	"net/http"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"mesh/cluster"
	"mesh/cluster/api"
)

// mesh token --ttl refuses what an agent of an older binary answers (it
// leaves the ttl out, and its token would join for ever); from an agent
// that makes one, it prints the token with its end.
func TestTokenTTLRefusesATokenWithoutEnd(t *testing.T) {
	dir := t.TempDir()
	l, err := net.Listen("unix", filepath.Join(dir, cluster.SocketFile))
	if err != nil {
		t.Fatal(err)
	}
	var answer api.TokenReply
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		json.NewEncoder(w).Encode(answer)
	})}
	go srv.Serve(l)
	defer srv.Close()
	run := func() (string, error) {
		var out bytes.Buffer
		err := (&TokenCmd{TTL: time.Hour}).Run(&Globals{DataDir: dir, out: &out})
		return out.String(), err
	}
	answer = api.TokenReply{Token: cluster.Token{MeshID: "m", CADigest: "c", Secret: "the join secret"}.String()}
	if out, err := run(); err == nil || !strings.Contains(err.Error(), "older mesh binary") || out != "" {
		t.Fatalf("a token without end from an older agent: %q, %v; want it refused, nothing printed", out, err)
	}
	until := time.Now().Add(time.Hour).Unix()
	answer = api.TokenReply{Token: cluster.Token{MeshID: "m", CADigest: "c", Secret: "derived", Until: until}.String(), Until: time.Unix(until, 0).UTC().Format(time.RFC3339)}
	if out, err := run(); err != nil || strings.TrimSpace(out) != answer.Token {
		t.Fatalf("a token with an end: %q, %v", out, err)
	}
	if err := (&TokenCmd{TTL: 10 * time.Second}).Run(&Globals{DataDir: dir, out: &bytes.Buffer{}}); err == nil || !strings.Contains(err.Error(), "between 1m and 8760h") {
		t.Fatalf("--ttl 10s: %v", err)
	}
}
