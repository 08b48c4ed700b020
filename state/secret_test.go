package state

import (
	"context"
	"errors"
	"strings"
	"testing"
)

const secretAppSrc = `module: mail
resources:
  - directory: /srv/mail
  - secret: /srv/mail/smtp.password
    name: smtp
  - container: mail.server
    image: docker.io/library/busybox:1.36
    restart-on: [/srv/mail/smtp.password]
  - container: mail.sender
    image: docker.io/library/busybox:1.36
    env-secrets: {SMTP_PASSWORD: smtp, API_KEY: api}
  - container: mail.other
    image: docker.io/library/busybox:1.36
`

func setReq(module, name, value string, keys ...string) *SecretSetRequest {
	d := strings.Repeat("0", 60) + SecretDigest(value)[:4]
	return &SecretSetRequest{SecretRef: SecretRef{Module: module, Name: name}, Sealed: "SEALED:" + value, Digest: d, Salt: strings.Repeat("5", 32), Size: len(value), Recipients: keys}
}

func secretsIn(t *testing.T, s *Store, node string) map[string]map[string]string {
	t.Helper()
	pv, err := s.Plan(context.Background(), node)
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]map[string]string{}
	for _, r := range pv.Plan.Resources {
		if r.Secrets != nil {
			out[r.Name] = r.Secrets
		}
	}
	return out
}

func applyErr(t *testing.T, s *Store, idx *uint64, r Request) error {
	t.Helper()
	*idx++
	return s.Apply(*idx, encodeAt(r, t0))
}

// A secret is set only for a module in the catalogue that runs somewhere,
// sealed to exactly the keys of its nodes; the same value again changes
// nothing; the plans carry its digest (never its value) on what reads it,
// "" while it is not set; a move makes it stale for its holder, whose seal
// to the new nodes is taken only for the same value.
func TestOperatorSecrets(t *testing.T) {
	ctx := context.Background()
	s := openStore(t)
	var idx uint64
	mustApply(t, s, &idx, &InitRequest{MeshID: "m-1", Node: Node{Name: "ace", Address: "10.0.0.1", SealKey: "kA"}})
	mustApply(t, s, &idx, &NodeAddRequest{Node: Node{Name: "bee", Address: "10.0.0.2", SealKey: "kB"}})
	mustApply(t, s, &idx, &NodeAddRequest{Node: Node{Name: "cat", Address: "10.0.0.3"}})

	ref := SecretRef{Module: "mail", Name: "smtp"}
	if _, err := s.SecretTarget(ctx, ref); !errors.Is(err, ErrNotFound) || !strings.Contains(err.Error(), "mesh module add") {
		t.Fatalf("unknown module: %v", err)
	}
	if err := applyErr(t, s, &idx, setReq("mail", "smtp", "pw", "kA")); !errors.Is(err, ErrNotFound) {
		t.Fatalf("set for an unknown module: %v", err)
	}
	mustApply(t, s, &idx, &ModuleAddRequest{Modules: []ModuleSpec{spec("mail.yaml", secretAppSrc)}})
	if c := NewCommand(&ModuleAddRequest{Modules: []ModuleSpec{spec("mail.yaml", secretAppSrc)}}); c.V != secretFormat {
		t.Fatalf("a manifest naming a secret is written in format %d", c.V)
	}
	if _, err := s.SecretTarget(ctx, ref); !errors.Is(err, ErrConflict) || !strings.Contains(err.Error(), "mesh assign NODE mail") {
		t.Fatalf("a module assigned nowhere: %v", err)
	}
	mustApply(t, s, &idx, &AssignRequest{Assignment: Assignment{Node: "ace", Module: "mail"}})
	// Not set yet: the plan names what it waits for, with no digest.
	got := secretsIn(t, s, "ace")
	if got["/srv/mail/smtp.password"]["smtp"] != "" || len(got["mail.sender"]) != 2 || got["mail.other"] != nil || got["mail.server"] != nil {
		t.Fatalf("plan before set: %v", got)
	}
	for _, bad := range []*SecretSetRequest{
		setReq("mail", "smtp", "pw", "kA", "kB"), // sealed to a node it does not run on
		setReq("mail", "smtp", "pw"),             // to nobody
		setReq("mail", "Bad Name", "pw", "kA"),
		setReq("mail", "smtp", "", "kA"),
		func() *SecretSetRequest {
			r := setReq("mail", "smtp", "pw", "kA")
			r.Size = MaxSecretSize + 1
			return r
		}(),
		func() *SecretSetRequest { r := setReq("mail", "smtp", "pw", "kA"); r.Digest = "x"; return r }(),
	} {
		var rule *RuleError
		if err := applyErr(t, s, &idx, bad); !errors.As(err, &rule) {
			t.Fatalf("%+v: %v", bad, err)
		}
	}
	if l, _ := s.Secrets(ctx, ""); len(l) != 0 {
		t.Fatalf("refused sets left %+v", l)
	}
	mustApply(t, s, &idx, setReq("mail", "smtp", "pw", "kA"))
	v1 := secretsIn(t, s, "ace")["/srv/mail/smtp.password"]["smtp"]
	if v1 == "" || secretsIn(t, s, "ace")["mail.sender"]["smtp"] != v1 || secretsIn(t, s, "ace")["mail.sender"]["api"] != "" {
		t.Fatalf("plan after set: %v", secretsIn(t, s, "ace"))
	}
	pv, _ := s.Plan(ctx, "ace")
	before := pv.Version
	mustApply(t, s, &idx, setReq("mail", "smtp", "pw", "kA"))
	if pv, _ := s.Plan(ctx, "ace"); pv.Version != before {
		t.Fatalf("the same value made plan v%d (was v%d)", pv.Version, before)
	}
	if d, err := s.Dump(ctx); err != nil || strings.Contains(jsonString(d), `"pw"`) {
		t.Fatalf("the state holds the value in plain text (or does not dump: %v)", err)
	}
	l, err := s.Secrets(ctx, "mail")
	if err != nil || len(l) != 1 || l[0].State != SecretSealed || strings.Join(l[0].SealedTo, ",") != "ace" || l[0].Size != 2 {
		t.Fatalf("list: %+v %v", l, err)
	}

	// Moved to bee: ace holds it and must seal it again to bee.
	mustApply(t, s, &idx, &AssignRequest{Assignment: Assignment{Node: "bee", Module: "mail"}})
	mustApply(t, s, &idx, &UnassignRequest{Assignment: Assignment{Node: "ace", Module: "mail"}})
	st, err := s.StaleSecrets(ctx, "kA")
	if err != nil || len(st) != 1 || strings.Join(st[0].Keys, ",") != "kB" || strings.Join(st[0].Nodes, ",") != "bee" {
		t.Fatalf("stale for ace: %+v %v", st, err)
	}
	if st, _ := s.StaleSecrets(ctx, "kB"); len(st) != 0 {
		t.Fatalf("bee cannot open it, yet it is asked to seal it: %+v", st)
	}
	if l, _ := s.Secrets(ctx, "mail"); l[0].State != SecretResealing {
		t.Fatalf("list after the move: %+v", l)
	}
	// A seal for another value (set meanwhile) or other keys is ignored.
	mustApply(t, s, &idx, &SecretSealRequest{SecretRef: ref, Digest: strings.Repeat("1", 64), Sealed: "SEALED:old", Recipients: []string{"kB"}})
	mustApply(t, s, &idx, &SecretSealRequest{SecretRef: ref, Digest: st[0].Digest, Sealed: "SEALED:pw", Recipients: []string{"kA", "kB"}})
	if l, _ := s.Secrets(ctx, "mail"); l[0].State != SecretResealing {
		t.Fatalf("a wrong seal was taken: %+v", l)
	}
	mustApply(t, s, &idx, &SecretSealRequest{SecretRef: ref, Digest: st[0].Digest, Sealed: "SEALED:pw", Recipients: []string{"kB"}})
	if l, _ := s.Secrets(ctx, "mail"); l[0].State != SecretSealed || strings.Join(l[0].SealedTo, ",") != "bee" {
		t.Fatalf("after the seal: %+v", l)
	}
	// A node without a key cannot be sealed to: set says to wait.
	mustApply(t, s, &idx, &AssignRequest{Assignment: Assignment{Node: "cat", Module: "mail"}})
	if _, err := s.SecretTarget(ctx, ref); err == nil || !strings.Contains(err.Error(), "node cat runs module mail and has not given its sealing key") {
		t.Fatalf("a node without a key: %v", err)
	}
	mustApply(t, s, &idx, &UnassignRequest{Assignment: Assignment{Node: "cat", Module: "mail"}})

	// Sealed only to a node that left: lost, and says so.
	mustApply(t, s, &idx, &UnassignRequest{Assignment: Assignment{Node: "bee", Module: "mail"}})
	mustApply(t, s, &idx, &NodeRemoveRequest{Name: "bee"})
	if l, _ := s.Secrets(ctx, "mail"); l[0].State != SecretLost || !strings.Contains(l[0].Advice, "mesh secret set mail smtp") {
		t.Fatalf("sealed to a node that left: %+v", l)
	}
	// Set again with the same value, for ace: sealed to ace, and no plan
	// changes (the value did not).
	mustApply(t, s, &idx, &AssignRequest{Assignment: Assignment{Node: "ace", Module: "mail"}})
	pv, _ = s.Plan(ctx, "ace")
	before = pv.Version
	again := setReq("mail", "smtp", "pw", "kA")
	again.Digest = st[0].Digest
	mustApply(t, s, &idx, again)
	if l, _ := s.Secrets(ctx, "mail"); l[0].State != SecretSealed || strings.Join(l[0].SealedTo, ",") != "ace" {
		t.Fatalf("a lost secret set again with its value: %+v", l)
	}
	if pv, _ := s.Plan(ctx, "ace"); pv.Version != before {
		t.Fatalf("setting a lost secret's same value made plan v%d", pv.Version)
	}
	mustApply(t, s, &idx, &UnassignRequest{Assignment: Assignment{Node: "ace", Module: "mail"}})
	if err := applyErr(t, s, &idx, &SecretRemoveRequest{SecretRef: SecretRef{Module: "mail", Name: "nope"}}); !errors.Is(err, ErrNotFound) || !strings.Contains(err.Error(), "smtp") {
		t.Fatalf("rm of an unknown secret: %v", err)
	}
	mustApply(t, s, &idx, &SecretRemoveRequest{SecretRef: ref})
	if l, _ := s.Secrets(ctx, ""); len(l) != 0 {
		t.Fatalf("after rm: %+v", l)
	}
}

// A snapshot keeps the secrets sealed, and a restore brings them back as
// they were; a restore of a snapshot without them keeps those of now.
func TestRestoreKeepsSecretsSealed(t *testing.T) {
	ctx := context.Background()
	s := openStore(t)
	var idx uint64
	mustApply(t, s, &idx, &InitRequest{MeshID: "m-1", Node: Node{Name: "ace", Address: "10.0.0.1", SealKey: "kA"}})
	mustApply(t, s, &idx, &ModuleAddRequest{Modules: []ModuleSpec{spec("mail.yaml", secretAppSrc)}})
	mustApply(t, s, &idx, &AssignRequest{Assignment: Assignment{Node: "ace", Module: "mail"}})
	mustApply(t, s, &idx, setReq("mail", "smtp", "one", "kA"))
	sn, err := s.Dump(ctx)
	if err != nil {
		t.Fatal(err)
	}
	b, err := sn.RestoreBody()
	if err != nil || b.Secrets == nil || len(*b.Secrets) != 1 {
		t.Fatalf("restore body: %+v %v", b, err)
	}
	if err := b.ParseSpecs(); err != nil {
		t.Fatal(err)
	}
	mustApply(t, s, &idx, setReq("mail", "smtp", "two", "kA"))
	mustApply(t, s, &idx, b)
	l, _ := s.Secrets(ctx, "mail")
	if len(l) != 1 || l[0].Size != 3 || l[0].State != SecretSealed {
		t.Fatalf("after the restore: %+v", l)
	}
	old := *b
	old.Secrets = nil
	mustApply(t, s, &idx, &old)
	if l, _ := s.Secrets(ctx, "mail"); len(l) != 1 {
		t.Fatalf("a restore without secrets dropped them: %+v", l)
	}
}
