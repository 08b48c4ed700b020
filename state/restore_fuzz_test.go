package state

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"
)

// A snapshot file is text on disk that an operator hands to mesh snapshot
// restore, and a restore request is what an API client sends: damaged or
// hostile, it is refused whole, changing nothing, or it restores a state the
// mesh goes on working with: the commands after it apply without a panic,
// and the names the resolver reads are names. The FSM must never panic on
// it: every node would replay the entry and panic again.
func FuzzRestore(f *testing.F) {
	src := openAfterHistory(f)
	var b bytes.Buffer
	if err := src.WriteSnapshot(context.Background(), &b); err != nil {
		f.Fatal(err)
	}
	good := b.String()
	f.Add([]byte(good))
	f.Add([]byte(strings.Replace(good, `"zurag.be"`, `"Not A Domain!"`, 1)))
	f.Add([]byte(strings.Replace(good, `"provider_node":"ace"`, `"provider_node":"nowhere"`, 1)))
	f.Add([]byte(`{"format":1,"index":3,"settings":[{"key":"mesh_id","value":"m-1"}],"nodes":[{"name":"ace","public_domain":"x..y"}],"assignments":[{"node":"ace","module":"web","seq":-1}]}`))
	f.Fuzz(func(t *testing.T, data []byte) {
		sn, err := ReadSnapshot(bytes.NewReader(data))
		if err != nil {
			return
		}
		body, err := sn.RestoreBody()
		if err != nil || body.ParseSpecs() != nil {
			return // the proposer refuses it; nothing is proposed
		}
		checkRestore(t, body)
	})
}

// checkRestore applies body after history on two replicas and checks what
// FuzzRestore promises.
func checkRestore(t *testing.T, body *RestoreBody) {
	// s keeps its catalogue and roster between commands; fresh reads
	// them afresh each time, as a replica that just started does. Both
	// start from history and must end the same.
	s, fresh := openAfterHistory(t), openAfterHistory(t)
	forget := func() { fresh.cat = nil; fresh.roster.Store(nil) }
	apply := func(idx uint64, e []byte) error {
		err := s.Apply(idx, e)
		forget()
		if errF := fresh.Apply(idx, e); fmt.Sprint(err) != fmt.Sprint(errF) {
			t.Fatalf("entry %d: %v on one replica, %v on the other", idx, err, errF)
		}
		forget()
		return err
	}
	before := tablesOf(t, s)
	idx := uint64(len(history()) + 1)
	err := apply(idx, encodeAt(body, t0.Add(time.Hour)))
	if err != nil {
		if after := tablesOf(t, s); after != before {
			t.Fatalf("a refused restore (%v) changed the state:\n%s\n%s", err, before, after)
		}
	}
	checkNames(t, s)
	// The mesh goes on: commands after the restore apply.
	defer func() {
		if a, b := tablesOf(t, s), tablesOf(t, fresh); a != b {
			t.Fatalf("the replicas differ:\n%s\n%s", a, b)
		}
	}()
	for i, r := range []Request{
		&AssignRequest{Assignment: Assignment{Node: "ace", Module: "web"}},
		&NodeAddRequest{Node: Node{Name: "g14", Address: "10.0.0.3"}},
		&AssignRequest{Assignment: Assignment{Node: "g14", Module: "postgres"}},
		&PublicDomainRequest{Node: "ace", Domain: "example.org"},
		&UnassignRequest{Assignment: Assignment{Node: "novox", Module: "web"}},
		&NodeRemoveRequest{Name: "novox", Force: true},
	} {
		apply(idx+1+uint64(i), encodeAt(r, t0.Add(time.Hour+time.Duration(i+1)*time.Second)))
		checkNames(t, s)
	}
}

// The same promises for the rows a restore carries, field by field: a
// snapshot that is well-formed JSON and says odd things (a node that is not
// in the mesh, a binding to one, a module that is not in it, odd names,
// numbers and times) is refused whole or restores a state the mesh works
// with.
func FuzzRestoreFields(f *testing.F) {
	sn, err := openAfterHistory(f).Dump(context.Background())
	if err != nil {
		f.Fatal(err)
	}
	f.Add("novox", "zurag.be", "ace", "app", "/srv/app/db.binding", "ace", "app", "postgres", "s3cret", uint64(3), int64(1), "2026-11-29T12:00:00Z")
	f.Add("ace", "", "novox", "web", "/srv/web/x", "nowhere", "web", "nosuch", "", uint64(0), int64(-1), "yesterday")
	f.Add("g14", "a.b", "ace", "nosuch", "relative", "", "", "", "x", ^uint64(0), int64(1)<<62, "")
	f.Fuzz(func(t *testing.T, node, domain, bindNode, module, path, providerNode, consumer, provider, secret string, seq uint64, version int64, addedAt string) {
		body, err := sn.RestoreBody()
		if err != nil {
			t.Fatal(err)
		}
		if err := body.ParseSpecs(); err != nil {
			t.Fatal(err)
		}
		body.PublicDomains[node] = domain
		body.Assignments = append(body.Assignments, Assignment{Node: node, Module: module, Seq: seq})
		body.Bindings = append(body.Bindings, RestoredBinding{BindKey: BindKey{Node: bindNode, Module: module, Path: path}, ProviderNode: providerNode})
		body.Credentials = append(body.Credentials, Secret{Pair: Pair{Consumer: consumer, Provider: provider}, Value: secret})
		if len(body.Modules) > 0 {
			m := &body.Modules[len(body.Modules)-1]
			m.Version, m.AddedAt = version, addedAt
		}
		checkRestore(t, body)
	})
}

var (
	historyOnce sync.Once
	historyDB   []byte
)

// openAfterHistory opens a replica that applied history(), from a copy of
// one database that did (replaying it for every fuzz input is most of the
// time of one).
func openAfterHistory(t testing.TB) *Store {
	t.Helper()
	historyOnce.Do(func() {
		dir, err := os.MkdirTemp("", "mesh-fuzz-history")
		if err != nil {
			panic(err)
		}
		defer os.RemoveAll(dir)
		s, err := Open(filepath.Join(dir, "state.db"))
		if err != nil {
			panic(err)
		}
		for i, r := range history() {
			s.Apply(uint64(i+1), encodeAt(r, t0.Add(time.Duration(i)*time.Second)))
		}
		if _, err := s.db.Exec(`PRAGMA wal_checkpoint(TRUNCATE)`); err != nil {
			panic(err)
		}
		s.Close()
		if historyDB, err = os.ReadFile(filepath.Join(dir, "state.db")); err != nil {
			panic(err)
		}
	})
	p := filepath.Join(t.TempDir(), "state.db")
	if err := os.WriteFile(p, historyDB, 0o600); err != nil {
		t.Fatal(err)
	}
	return openStoreAt(t, p)
}

// tablesOf is the replica's state without its applied index.
func tablesOf(t *testing.T, s *Store) string {
	t.Helper()
	var sn Snapshot
	if err := json.Unmarshal([]byte(dumpJSON(t, s)), &sn); err != nil {
		t.Fatal(err)
	}
	out, _ := json.Marshal(sn.Tables)
	return string(out)
}

// checkNames: every name the resolver would answer is a domain name, and
// what mesh status reads, reads.
func checkNames(t *testing.T, s *Store) {
	t.Helper()
	ctx := context.Background()
	if _, err := s.Settings(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Modules(ctx); err != nil {
		t.Fatalf("modules: %v", err)
	}
	if _, err := s.Reports(ctx); err != nil {
		t.Fatalf("reports: %v", err)
	}
	if _, err := s.CredentialDigests(ctx); err != nil {
		t.Fatalf("credentials: %v", err)
	}
	names, err := s.Roster(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for _, n := range names {
		if !validDomain(n.Name) {
			t.Fatalf("the roster holds %q, which is not a domain name", n.Name)
		}
	}
	nodes, err := s.Nodes(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for _, n := range nodes {
		if n.PublicDomain != "" && !validDomain(n.PublicDomain) {
			t.Fatalf("node %s has the public domain %q", n.Name, n.PublicDomain)
		}
		if _, err := s.Plan(ctx, n.Name); err != nil && !strings.Contains(err.Error(), "no plan") {
			t.Fatalf("node %s's plan: %v", n.Name, err)
		}
	}
}
