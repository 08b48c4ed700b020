package state

import (
	"context"
	"errors"
	"os"
	"strings"
	"testing"
	"time"
)

// sealedFor is what a proposer would carry: the FSM never opens a sealed
// secret, so a test stands for one with a marked string.
func sealedFor(p Pair, plain, reason string, keys ...string) Secret {
	return Secret{Pair: p, Sealed: "SEALED:" + SecretDigest(plain)[:12], Digest: SecretDigest(plain), Recipients: keys, Reason: reason}
}

func mustApply(t *testing.T, s *Store, idx *uint64, r Request) {
	t.Helper()
	*idx++
	if err := s.Apply(*idx, encodeAt(r, t0)); err != nil {
		t.Fatalf("%s: %v", r.describe(), err)
	}
}

func needsOf(t *testing.T, s *Store, extra *Assignment) map[Pair]SealNeed {
	t.Helper()
	var more []Assignment
	if extra != nil {
		more = append(more, *extra)
	}
	ns, err := s.SealNeeds(context.Background(), more, nil)
	if err != nil {
		t.Fatal(err)
	}
	out := map[Pair]SealNeed{}
	for _, n := range ns {
		out[n.Pair] = n
	}
	return out
}

func digestIn(t *testing.T, s *Store, node string) string {
	t.Helper()
	pv, err := s.Plan(context.Background(), node)
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range pv.Plan.Resources {
		if r.Credential != nil {
			return r.Digest
		}
	}
	return ""
}

// A credential is sealed to the nodes that deliver it; moving the provider
// (or the consumer) to a node that cannot open it rotates it; removing a
// node it was sealed to rotates it; a stale proposer cannot undo a newer
// seal; no plain secret is ever stored.
func TestSealedCredentials(t *testing.T) {
	ctx := context.Background()
	s := openStore(t)
	var idx uint64
	app := Pair{Consumer: "app", Provider: "postgres"}
	mustApply(t, s, &idx, &InitRequest{MeshID: "m-1", Node: Node{Name: "ace", Address: "10.0.0.1", SealKey: "kA"}})
	mustApply(t, s, &idx, &NodeAddRequest{Node: Node{Name: "bee", Address: "10.0.0.2", SealKey: "kB"}})
	mustApply(t, s, &idx, &NodeAddRequest{Node: Node{Name: "cat", Address: "10.0.0.3", SealKey: "kC"}})
	mustApply(t, s, &idx, &ModuleAddRequest{Modules: []ModuleSpec{spec("pg.yaml", pgSrc), spec("app.yaml", appSrc)}})
	mustApply(t, s, &idx, &AssignRequest{Assignment: Assignment{Node: "bee", Module: "postgres"}})

	// The proposer of `assign ace app` sees that app -> postgres needs a
	// secret for ace (consumer) and bee (provider).
	n := needsOf(t, s, &Assignment{Node: "ace", Module: "app"})[app]
	if n.Reason != "new" || strings.Join(n.Nodes, ",") != "ace,bee" || strings.Join(n.Keys, ",") != "kA,kB" || !n.Rotates() {
		t.Fatalf("need before the first assign: %+v", n)
	}
	mustApply(t, s, &idx, &AssignRequest{Assignment: Assignment{Node: "ace", Module: "app"}, Secrets: []Secret{sealedFor(app, "one", "new", "kA", "kB")}})
	if got := needsOf(t, s, nil); len(got) != 0 {
		t.Fatalf("still needed after sealing: %+v", got)
	}
	first := digestIn(t, s, "ace")
	if first != SecretDigest("one") {
		t.Fatalf("ace's plan carries %q", first)
	}
	row, err := s.SealedSecret(ctx, app)
	if err != nil || row.Sealed != "SEALED:"+SecretDigest("one")[:12] || row.Plain != "" || strings.Join(row.Recipients, ",") != "kA,kB" {
		t.Fatalf("stored: %+v %v", row, err)
	}

	// A second proposer that raced the first (its replica was behind) sends
	// another secret for the same pair: it is not stale, so it is ignored.
	mustApply(t, s, &idx, &SealRequest{Secrets: []Secret{sealedFor(app, "racer", "new", "kA", "kB")}})
	if d := digestIn(t, s, "ace"); d != first {
		t.Fatal("a secret that was not stale was replaced")
	}

	// Move the provider to cat: cat cannot open the secret, so it rotates.
	mustApply(t, s, &idx, &UnassignRequest{Assignment: Assignment{Node: "bee", Module: "postgres"}})
	n = needsOf(t, s, &Assignment{Node: "cat", Module: "postgres"})[app]
	if !strings.Contains(n.Reason, "node cat delivers it and cannot open it") || strings.Join(n.Keys, ",") != "kA,kC" {
		t.Fatalf("need when the provider moves: %+v", n)
	}
	// Sealed to a key no node holds: refused (kept stale).
	mustApply(t, s, &idx, &AssignRequest{Assignment: Assignment{Node: "cat", Module: "postgres"}, Secrets: []Secret{sealedFor(app, "rogue", n.Reason, "kA", "kX")}})
	if d := digestIn(t, s, "ace"); d != first {
		t.Fatal("a secret sealed to an unknown key was taken")
	}
	mustApply(t, s, &idx, &SealRequest{Secrets: []Secret{sealedFor(app, "two", n.Reason, n.Keys...)}})
	second := digestIn(t, s, "ace")
	if second != SecretDigest("two") || digestIn(t, s, "cat") != second {
		t.Fatalf("after the move the plans carry %q and %q", second, digestIn(t, s, "cat"))
	}
	pv, _ := s.Plan(ctx, "ace")
	if !strings.Contains(pv.Cause, "sealed again: credential app -> postgres (node cat delivers it and cannot open it)") {
		t.Fatalf("the plan's cause does not say the credential rotated: %q", pv.Cause)
	}

	// Run the provider on ace too (ace already opens the secret), then
	// remove cat: the secret is still sealed to cat's key, which no node
	// holds now, so it goes stale although every node that delivers it can
	// open it.
	mustApply(t, s, &idx, &AssignRequest{Assignment: Assignment{Node: "ace", Module: "postgres"}})
	if got := needsOf(t, s, nil); len(got) != 0 {
		t.Fatalf("a node that can open it made it stale: %+v", got)
	}
	mustApply(t, s, &idx, &NodeRemoveRequest{Name: "cat", Force: true})
	n = needsOf(t, s, nil)[app]
	if !strings.Contains(n.Reason, "a key no node holds") || strings.Join(n.Keys, ",") != "kA" {
		t.Fatalf("need after removing a node it was sealed to: %+v", n)
	}

	// A node key is unique.
	idx++
	if err := s.Apply(idx, encodeAt(&NodeKeyRequest{Node: "bee", SealKey: "kA"}, t0)); !errors.Is(err, ErrConflict) {
		t.Fatalf("a node took another's key: %v", err)
	}
	// A sealed secret that also carries a plain value is refused.
	bad := sealedFor(app, "x", "new", "kA")
	bad.Value = "x"
	idx++
	if err := s.Apply(idx, encodeAt(&SealRequest{Secrets: []Secret{bad}}, t0)); !errors.Is(err, ErrInvalid) {
		t.Fatalf("a sealed secret with a plain value: %v", err)
	}
}

// A secret an older mesh kept in plain text is sealed as it is: no
// rotation, the digest stays, and the plain copy is gone afterwards.
func TestPlainSecretsAreSealedAsTheyAre(t *testing.T) {
	ctx := context.Background()
	s := openStore(t)
	var idx uint64
	app := Pair{Consumer: "app", Provider: "postgres"}
	mustApply(t, s, &idx, &InitRequest{MeshID: "m-1", Node: Node{Name: "ace", Address: "10.0.0.1"}})
	const old = "plain-secret-of-an-older-mesh-7f3a"
	mustApply(t, s, &idx, &ModuleAddRequest{Modules: []ModuleSpec{spec("pg.yaml", pgSrc), spec("app.yaml", appSrc)}, Secrets: []Secret{{Pair: app, Value: old}}})
	mustApply(t, s, &idx, &AssignRequest{Assignment: Assignment{Node: "ace", Module: "postgres"}})
	mustApply(t, s, &idx, &AssignRequest{Assignment: Assignment{Node: "ace", Module: "app"}})
	if got := needsOf(t, s, nil); len(got) != 0 {
		t.Fatalf("a node without a key got a need: %+v", got)
	}
	mustApply(t, s, &idx, &NodeKeyRequest{Node: "ace", SealKey: "kA"})
	n := needsOf(t, s, nil)[app]
	if n.Plain != old || n.Rotates() || !strings.Contains(n.Reason, "plain text") {
		t.Fatalf("need of a plain secret: %+v", n)
	}
	mustApply(t, s, &idx, &SealRequest{Secrets: []Secret{sealedFor(app, n.Plain, n.Reason, n.Keys...)}})
	row, err := s.SealedSecret(ctx, app)
	if err != nil || row.Plain != "" || row.Digest != SecretDigest(old) {
		t.Fatalf("after sealing: %+v %v", row, err)
	}
	// The old plain copy is gone from the file too, once the write-ahead
	// log is checkpointed into it (the store also runs with secure_delete,
	// so freed space is zeroed).
	if _, err := s.db.Exec(`PRAGMA wal_checkpoint(TRUNCATE)`); err != nil {
		t.Fatal(err)
	}
	raw, err := os.ReadFile(s.path)
	if err != nil {
		t.Fatal(err)
	}
	if strings.Contains(string(raw), old) {
		t.Fatal("the state db still holds the plain secret after it was sealed")
	}
}

// The CA key and the join secret are sealed to the voters: a voter that
// joins, or a token rotated by a node that saw fewer voters, makes them
// stale until a voter seals them to exactly the voters' keys; non-voters
// never count; an older mesh's plain copies are stale until sealed, and
// then gone.
func TestVoterSecrets(t *testing.T) {
	ctx := context.Background()
	stale := func(s *Store) string {
		t.Helper()
		m, err := s.VoterSealStale(ctx)
		if err != nil {
			t.Fatal(err)
		}
		var out []string
		for _, n := range voterSecretNames {
			if m[n] {
				out = append(out, n)
			}
		}
		return strings.Join(out, ",")
	}
	vs := func(v string, keys ...string) *VoterSecret {
		return &VoterSecret{Sealed: "SEALED:" + v, Recipients: keys}
	}
	s := openStore(t)
	var idx uint64
	mustApply(t, s, &idx, &InitRequest{MeshID: "m-1", Node: Node{Name: "ace", Address: "10.0.0.1", SealKey: "kA"}, SealedCAKey: vs("ca", "kA"), SealedJoinSecret: vs("js", "kA")})
	if got := stale(s); got != "" {
		t.Fatalf("stale right after init: %q", got)
	}
	mustApply(t, s, &idx, &NodeAddRequest{Node: Node{Name: "bee", Address: "10.0.0.2", Voter: true, SealKey: "kB"}})
	if got := stale(s); got != "ca_key,join_secret" {
		t.Fatalf("a voter joined: stale %q", got)
	}
	// Sealed to fewer keys than the voters': ignored.
	mustApply(t, s, &idx, &SealRequest{CAKey: vs("ca", "kA")})
	if got := stale(s); got != "ca_key,join_secret" {
		t.Fatalf("a seal to too few voters was taken: %q", got)
	}
	mustApply(t, s, &idx, &SealRequest{CAKey: vs("ca2", "kB", "kA")})
	if got := stale(s); got != "join_secret" {
		t.Fatalf("after sealing the CA key: stale %q", got)
	}
	mustApply(t, s, &idx, &NodeAddRequest{Node: Node{Name: "cat", Address: "10.0.0.3", SealKey: "kC"}})
	mustApply(t, s, &idx, &SealRequest{JoinSecret: vs("js", "kA", "kB")})
	if got := stale(s); got != "" {
		t.Fatalf("a non-voter joined: stale %q", got)
	}
	id, _ := s.Identity(ctx)
	if id.CAKey != "" || id.JoinSecret != "" || id.CAKeySealed != "SEALED:ca2" || id.JoinSecretSealed != "SEALED:js" {
		t.Fatalf("identity: %+v", id)
	}
	// A rotation proposed by a node that knew ace alone is taken, and is
	// stale until sealed to both voters.
	mustApply(t, s, &idx, &TokenRotateRequest{Sealed: vs("js2", "kA")})
	if got := stale(s); got != "join_secret" {
		t.Fatalf("after a rotation sealed to one voter: stale %q", got)
	}

	// An older mesh: plain copies, stale as soon as a voter has a key.
	old := openStore(t)
	idx = 0
	mustApply(t, old, &idx, &InitRequest{MeshID: "m-2", Node: Node{Name: "ace", Address: "10.0.0.1"}, CAKey: "PLAIN-CA-KEY", JoinSecret: "PLAIN-JOIN"})
	if got := stale(old); got != "" {
		t.Fatalf("no voter has a key yet, and %q is stale", got)
	}
	mustApply(t, old, &idx, &NodeKeyRequest{Node: "ace", SealKey: "kA"})
	if got := stale(old); got != "ca_key,join_secret" {
		t.Fatalf("plain copies are not stale: %q", got)
	}
	mustApply(t, old, &idx, &SealRequest{CAKey: vs("ca", "kA"), JoinSecret: vs("js", "kA")})
	id, _ = old.Identity(ctx)
	if got := stale(old); got != "" || id.CAKey != "" || id.JoinSecret != "" {
		t.Fatalf("after sealing an older mesh's secrets: stale %q, %+v", got, id)
	}
}

// A command needs format 5 only when it carries something sealed: during a
// rolling upgrade, assigns without credentials still go through, and an
// older node is never asked to apply a sealed secret it would read as an
// empty plain one (a token rotation above all: it would diverge).
func TestSealedCommandsNeedFormat5(t *testing.T) {
	sealed := []Secret{{Pair: Pair{"app", "db"}, Sealed: "x", Digest: "d", Recipients: []string{"k"}}}
	for _, tc := range []struct {
		r    Request
		want int
	}{
		{&AssignRequest{Assignment: Assignment{Node: "a", Module: "m"}}, 3},
		{&AssignRequest{Assignment: Assignment{Node: "a", Module: "m"}, Secrets: sealed}, 5},
		{&AssignRequest{Assignment: Assignment{Node: "a", Module: "m"}, Secrets: []Secret{{Pair: Pair{"app", "db"}, Value: "plain"}}}, 3},
		{&ModuleAddRequest{}, 3},
		{&ModuleAddRequest{Secrets: sealed}, 5},
		{&NodeAddRequest{Node: Node{Name: "n"}}, 3},
		{&NodeAddRequest{Node: Node{Name: "n", SealKey: "k"}}, 5},
		{&TokenRotateRequest{JoinSecret: "plain"}, 3},
		{&TokenRotateRequest{Sealed: &VoterSecret{Sealed: "x", Recipients: []string{"k"}}}, 5},
		{&RestoreBody{Credentials: sealed}, 5},
		{&RestoreBody{}, 3},
		{&SealRequest{}, 5},
		{&NodeKeyRequest{}, 5},
		{&NodeCertRequest{}, 5},
		{&NodeCertRequest{Key: strings.Repeat("0", 64)}, 6},
		{&InitRequest{}, historyFormat}, // it sets the history's bound
		// The keys of format 7 in a manifest: an older binary would drop
		// them from the module it stores.
		{&ModuleAddRequest{Modules: []ModuleSpec{spec("a.yaml", "module: a\nresources:\n  - container: a.x\n    image: i\n    ports: [\"80:80\"]\n")}}, 3},
		{&ModuleAddRequest{Modules: []ModuleSpec{spec("a.yaml", "module: a\nresources:\n  - container: a.x\n    image: i\n    public-ports: [\"80:80\"]\n")}}, 7},
		{&ModuleAddRequest{Modules: []ModuleSpec{spec("a.yaml", "module: a\nresources:\n  - container: a.x\n    image: i\n    log-max-size: 1m\n")}}, 7},
		{&RestoreBody{Modules: []RestoredModule{{ModuleSpec: spec("a.yaml", "module: a\nresources:\n  - container: a.x\n    image: i\n    public-ports: [\"443:443\"]\n")}}}, 7},
	} {
		if got := NewCommand(tc.r).NeedsVersion(); got != tc.want {
			t.Errorf("%T %s: format %d, want %d", tc.r, tc.r.describe(), got, tc.want)
		}
	}
}

// A credential row with neither a sealed nor a plain secret (a damaged
// restore) is stale and rotates: a new secret, never an empty one.
func TestEmptySecretRotates(t *testing.T) {
	s := openStore(t)
	var idx uint64
	app := Pair{Consumer: "app", Provider: "postgres"}
	mustApply(t, s, &idx, &InitRequest{MeshID: "m-1", Node: Node{Name: "ace", Address: "10.0.0.1", SealKey: "kA"}})
	mustApply(t, s, &idx, &RestoreBody{MeshID: "m-1", Modules: []RestoredModule{{ModuleSpec: spec("pg.yaml", pgSrc)}, {ModuleSpec: spec("app.yaml", appSrc)}},
		Assignments: []Assignment{{Node: "ace", Module: "postgres"}, {Node: "ace", Module: "app"}},
		Credentials: []Secret{{Pair: app, Sealed: "", Digest: "d"}}})
	n := needsOf(t, s, nil)[app]
	if !n.Rotates() || !strings.Contains(n.Reason, "holds no secret") {
		t.Fatalf("need of an empty secret: %+v", n)
	}
}

// node.cert records the key of a node's certificate; a key that is not a
// digest, or another node's, is refused and changes nothing; one without a
// key (a node of an older format) leaves the key as it was.
func TestNodeCertKey(t *testing.T) {
	ctx := context.Background()
	s := openStore(t)
	var idx uint64
	mustApply(t, s, &idx, &InitRequest{MeshID: "m-1", Node: Node{Name: "ace", Address: "10.0.0.1"}})
	mustApply(t, s, &idx, &NodeAddRequest{Node: Node{Name: "bee", Address: "10.0.0.2"}})
	keyA, keyB := strings.Repeat("a1", 32), strings.Repeat("b2", 32)
	mustApply(t, s, &idx, &NodeCertRequest{Node: "ace", Expires: t0.Add(time.Hour), Key: keyA})
	keyOf := func(name string) string {
		n, err := s.Node(ctx, name)
		if err != nil {
			t.Fatal(err)
		}
		return n.CertKey
	}
	if got := keyOf("ace"); got != keyA {
		t.Fatalf("ace's key: %q", got)
	}
	for _, bad := range []*NodeCertRequest{
		{Node: "bee", Expires: t0, Key: keyA},                  // ace's
		{Node: "bee", Expires: t0, Key: "not a digest"},        // not hex
		{Node: "bee", Expires: t0, Key: strings.ToUpper(keyB)}, // not lower-case hex
		{Node: "cat", Expires: t0, Key: keyB},                  // no such node
		{Node: "bee", Expires: t0, Key: keyB[:62]},             // too short
	} {
		idx++
		err := s.Apply(idx, encodeAt(bad, t0))
		var re *RuleError
		if !errors.As(err, &re) {
			t.Fatalf("%s: %v", bad.describe(), err)
		}
		if keyOf("bee") != "" {
			t.Fatalf("%s changed bee's key", bad.describe())
		}
	}
	mustApply(t, s, &idx, &NodeCertRequest{Node: "ace", Expires: t0.Add(2 * time.Hour)})
	if got := keyOf("ace"); got != keyA {
		t.Fatalf("a node.cert without a key changed ace's: %q", got)
	}
	mustApply(t, s, &idx, &NodeCertRequest{Node: "ace", Expires: t0.Add(3 * time.Hour), Key: keyB})
	if got := keyOf("ace"); got != keyB {
		t.Fatalf("ace's new key (it joined again): %q", got)
	}
}
