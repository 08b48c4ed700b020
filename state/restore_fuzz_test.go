package state

import (
	"bytes"
	"context"
	"encoding/json"
	"strings"
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
	src := openStore(f)
	for i, r := range history() {
		src.Apply(uint64(i+1), encodeAt(r, t0.Add(time.Duration(i)*time.Second)))
	}
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
		s := openStore(t)
		hist := history()
		for i, r := range hist {
			s.Apply(uint64(i+1), encodeAt(r, t0.Add(time.Duration(i)*time.Second)))
		}
		before := tablesOf(t, s)
		idx := uint64(len(hist) + 1)
		err = s.Apply(idx, encodeAt(body, t0.Add(time.Hour)))
		if err != nil {
			if after := tablesOf(t, s); after != before {
				t.Fatalf("a refused restore (%v) changed the state:\n%s\n%s", err, before, after)
			}
		}
		checkNames(t, s)
		// The mesh goes on: commands after the restore apply.
		for i, r := range []Request{
			&AssignRequest{Assignment: Assignment{Node: "ace", Module: "web"}},
			&NodeAddRequest{Node: Node{Name: "g14", Address: "10.0.0.3"}},
			&AssignRequest{Assignment: Assignment{Node: "g14", Module: "postgres"}},
			&PublicDomainRequest{Node: "ace", Domain: "example.org"},
			&UnassignRequest{Assignment: Assignment{Node: "novox", Module: "web"}},
			&NodeRemoveRequest{Name: "novox", Force: true},
		} {
			s.Apply(idx+1+uint64(i), encodeAt(r, t0.Add(time.Hour+time.Duration(i+1)*time.Second)))
			checkNames(t, s)
		}
	})
}

// tablesOf is the replica's state without its applied index.
func tablesOf(t *testing.T, s *Store) string {
	t.Helper()
	var b bytes.Buffer
	if err := s.WriteSnapshot(context.Background(), &b); err != nil {
		t.Fatal(err)
	}
	var sn Snapshot
	if err := json.Unmarshal(b.Bytes(), &sn); err != nil {
		t.Fatal(err)
	}
	out, _ := json.Marshal(sn.Tables)
	return string(out)
}

// checkNames: every name the resolver would answer is a domain name, and
// every node's plan reads.
func checkNames(t *testing.T, s *Store) {
	t.Helper()
	ctx := context.Background()
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
