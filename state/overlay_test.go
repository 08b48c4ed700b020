package state

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"
)

// applyOne applies r at the next index and returns its rule error.
func applyOne(t *testing.T, s *Store, r Request) error {
	t.Helper()
	idx, err := s.AppliedIndex()
	if err != nil {
		t.Fatal(err)
	}
	return s.Apply(idx+1, encodeAt(r, t0.Add(time.Duration(idx)*time.Second)))
}

func mustNext(t *testing.T, s *Store, r Request) {
	t.Helper()
	if err := applyOne(t, s, r); err != nil {
		t.Fatalf("%s: %v", r.Op(), err)
	}
}

func overlayAddresses(t *testing.T, s *Store) map[string]string {
	t.Helper()
	nodes, err := s.Nodes(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]string{}
	for _, n := range nodes {
		out[n.Name] = n.OverlayAddress
	}
	return out
}

// The FSM gives each node that brings a key the next free address after the
// last one given: deterministic, never the address of a node that exists,
// and a full prefix is a clear refusal.
func TestOverlayAddressesAreGivenInTurn(t *testing.T) {
	s := openStore(t)
	node := func(i int) Node {
		n := string(rune('0' + i))
		return Node{Name: "n" + n, Address: "10.0.0." + n, OverlayKey: "key" + n, OverlayEndpoint: "10.0.0." + n + ":51820"}
	}
	// A /29 holds six nodes: .1 to .6.
	mustNext(t, s, &InitRequest{MeshID: "m", Node: node(1), Overlay: "100.90.0.0/29"})
	for i := 2; i <= 4; i++ {
		mustNext(t, s, &NodeAddRequest{Node: node(i)})
	}
	want := map[string]string{"n1": "100.90.0.1", "n2": "100.90.0.2", "n3": "100.90.0.3", "n4": "100.90.0.4"}
	if got := overlayAddresses(t, s); len(got) != 4 || got["n1"] != want["n1"] || got["n2"] != want["n2"] || got["n3"] != want["n3"] || got["n4"] != want["n4"] {
		t.Fatalf("addresses %v, want %v", got, want)
	}
	// n2 goes; the next node does not get its address while others are free.
	mustNext(t, s, &NodeRemoveRequest{Name: "n2"})
	mustNext(t, s, &NodeAddRequest{Node: node(5)})
	mustNext(t, s, &NodeAddRequest{Node: node(6)})
	if got := overlayAddresses(t, s); got["n5"] != "100.90.0.5" || got["n6"] != "100.90.0.6" {
		t.Fatalf("after a removal: %v", got)
	}
	// The end of the prefix wraps round to the freed address.
	mustNext(t, s, &NodeAddRequest{Node: node(7)})
	if got := overlayAddresses(t, s)["n7"]; got != "100.90.0.2" {
		t.Fatalf("n7 got %q, want the freed 100.90.0.2", got)
	}
	// Full: refused, and nothing of the node is written.
	err := applyOne(t, s, &NodeAddRequest{Node: node(8)})
	if !errors.Is(err, ErrConflict) || !strings.Contains(err.Error(), "no free address") {
		t.Fatalf("a seventh node in a /29: %v", err)
	}
	if _, ok := overlayAddresses(t, s)["n8"]; ok {
		t.Fatal("a refused node was written")
	}
	// A key another node holds is refused.
	dup := node(8)
	dup.OverlayKey = "key1"
	if err := applyOne(t, s, &NodeAddRequest{Node: dup}); !errors.Is(err, ErrConflict) {
		t.Fatalf("a node with n1's key: %v", err)
	}
}

// A mesh of an earlier release keeps its names on the mesh addresses and its
// ports where they were until every node brought its key; then names,
// bindings and ports move to the overlay in one command.
func TestNamesMoveToTheOverlayOnceEveryNodeHasAnAddress(t *testing.T) {
	ctx := context.Background()
	s := openStore(t)
	mustNext(t, s, &InitRequest{MeshID: "m", Domain: "internal", Node: Node{Name: "ace", Address: "10.0.0.1"}})
	mustNext(t, s, &NodeAddRequest{Node: Node{Name: "novox", Address: "10.0.0.2"}})
	mustNext(t, s, &ModuleAddRequest{Modules: []ModuleSpec{spec("pg.yaml", pgSrc), spec("app.yaml", appSrc)}, Secrets: []Secret{{Pair: Pair{"app", "postgres"}, Value: "s"}}})
	mustNext(t, s, &AssignRequest{Assignment: Assignment{Node: "novox", Module: "postgres"}})
	mustNext(t, s, &AssignRequest{Assignment: Assignment{Node: "ace", Module: "app"}})

	check := func(when, pg, binding, publish string) {
		t.Helper()
		ro, err := s.Roster(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if !hasName(ro, "postgres.internal", pg) {
			t.Fatalf("%s: postgres.internal is not %s: %v", when, pg, ro)
		}
		p, err := s.Plan(ctx, "ace")
		if err != nil {
			t.Fatal(err)
		}
		if p.Plan.PublishAddress != publish {
			t.Fatalf("%s: ace publishes on %q, want %q", when, p.Plan.PublishAddress, publish)
		}
		for _, r := range p.Plan.Resources {
			if r.Name == "/srv/app/db.binding" && !strings.Contains(r.Content, "address="+binding+"\n") {
				t.Fatalf("%s: the binding says %q, want address=%s", when, r.Content, binding)
			}
		}
	}
	check("before any key", "10.0.0.2", "10.0.0.2", "")

	// ace brings its key (and the mesh takes up the default prefix): novox
	// has none yet, so nothing moves.
	mustNext(t, s, &NodeOverlayRequest{Node: "ace", Key: "kace", Endpoint: "10.0.0.1:51820", Prefix: DefaultOverlay})
	if st, _ := s.Settings(ctx); st.Overlay != DefaultOverlay {
		t.Fatalf("the mesh's overlay is %q", st.Overlay)
	}
	check("one node of two", "10.0.0.2", "10.0.0.2", "")

	mustNext(t, s, &NodeOverlayRequest{Node: "novox", Key: "knovox", Endpoint: "10.0.0.2:51820"})
	check("every node", "100.90.0.2", "100.90.0.2", "100.90.0.1")

	// The key again (a restart) keeps the address.
	mustNext(t, s, &NodeOverlayRequest{Node: "novox", Key: "knovox", Endpoint: "10.0.0.2:51820"})
	if got := overlayAddresses(t, s)["novox"]; got != "100.90.0.2" {
		t.Fatalf("novox moved to %s", got)
	}
}

// With the overlay off, names stay on the mesh addresses and ports are
// published on them, and no node may bring a key.
func TestOverlayOff(t *testing.T) {
	ctx := context.Background()
	s := openStore(t)
	mustNext(t, s, &InitRequest{MeshID: "m", Domain: "internal", Node: Node{Name: "ace", Address: "10.0.0.1"}, Overlay: OverlayOff})
	mustNext(t, s, &ModuleAddRequest{Modules: []ModuleSpec{spec("web.yaml", webSrc)}})
	mustNext(t, s, &AssignRequest{Assignment: Assignment{Node: "ace", Module: "web"}})
	p, err := s.Plan(ctx, "ace")
	if err != nil {
		t.Fatal(err)
	}
	if p.Plan.PublishAddress != "10.0.0.1" {
		t.Fatalf("with the overlay off ace publishes on %q, want its mesh address", p.Plan.PublishAddress)
	}
	if err := applyOne(t, s, &NodeOverlayRequest{Node: "ace", Key: "k", Endpoint: "10.0.0.1:51820"}); !errors.Is(err, ErrConflict) {
		t.Fatalf("a key in a mesh without overlay: %v", err)
	}
	for _, bad := range []string{"10.0.0.0/33", "fd00::/64", "10.1.2.3/16", "10.0.0.0/30", "nonsense", "8.8.0.0/16", "100.0.0.0/8", "172.0.0.0/8", "192.169.0.0/16"} {
		if _, err := ParseOverlay(bad); err == nil {
			t.Errorf("ParseOverlay(%q) took it", bad)
		}
	}
	for _, good := range []string{"100.90.0.0/16", "10.0.0.0/8", "172.16.4.0/24", "192.168.50.0/29", "100.64.0.0/10"} {
		if _, err := ParseOverlay(good); err != nil {
			t.Errorf("ParseOverlay(%q): %v", good, err)
		}
	}
}
