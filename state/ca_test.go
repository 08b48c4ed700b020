package state

import (
	"context"
	"encoding/pem"
	"errors"
	"strings"
	"testing"
	"time"
)

func fakeCert(s string) string {
	return string(pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: []byte(s)}))
}

// A rotation of the CA holds both until every node says its certificate
// is the new CA's; then the new one replaces the old in the same command,
// on every replica; removing the last node it waits for ends it too. One
// rotation at a time, sealed to the voters as they are.
func TestCARotation(t *testing.T) {
	ctx := context.Background()
	s := openStore(t)
	var idx uint64
	old, next := fakeCert("old"), fakeCert("next")
	mustApply(t, s, &idx, &InitRequest{MeshID: "m-1", CACert: old, Node: Node{Name: "ace", Address: "10.0.0.1", SealKey: "kA", Voter: true},
		SealedCAKey: &VoterSecret{Sealed: "S-old", Recipients: []string{"kA"}}, SealedJoinSecret: &VoterSecret{Sealed: "S-join", Recipients: []string{"kA"}}})
	mustApply(t, s, &idx, &NodeAddRequest{Node: Node{Name: "bee", Address: "10.0.0.2", SealKey: "kB"}})
	mustApply(t, s, &idx, &NodeAddRequest{Node: Node{Name: "cat", Address: "10.0.0.3", SealKey: "kC"}})

	for _, bad := range []*CARotateRequest{
		{NextCert: "not pem", NextKey: &VoterSecret{Sealed: "S", Recipients: []string{"kA"}}},
		{NextCert: old, NextKey: &VoterSecret{Sealed: "S", Recipients: []string{"kA"}}},
		{NextCert: next, NextKey: &VoterSecret{Sealed: "S", Recipients: []string{"kB"}}},
		{NextCert: next},
	} {
		var rule *RuleError
		if err := applyErr(t, s, &idx, bad); !errors.As(err, &rule) {
			t.Fatalf("%+v: %v", bad, err)
		}
	}
	mustApply(t, s, &idx, &CARotateRequest{NextCert: next, NextKey: &VoterSecret{Sealed: "S-next", Recipients: []string{"kA"}}})
	if err := applyErr(t, s, &idx, &CARotateRequest{NextCert: fakeCert("third"), NextKey: &VoterSecret{Sealed: "S", Recipients: []string{"kA"}}}); !errors.Is(err, ErrConflict) || !strings.Contains(err.Error(), "ace, bee, cat") {
		t.Fatalf("a second rotation: %v", err)
	}
	id, _ := s.Identity(ctx)
	if id.CACert != old || id.CANextCert != next || id.CANextKeySealed != "S-next" {
		t.Fatalf("identity under rotation: %+v", id)
	}
	d := CertDigest(next)
	exp := t0.Add(time.Hour)
	mustApply(t, s, &idx, &NodeCertRequest{Node: "ace", Expires: exp, CA: d})
	mustApply(t, s, &idx, &NodeCertRequest{Node: "bee", Expires: exp, CA: d})
	mustApply(t, s, &idx, &NodeCertRequest{Node: "cat", Expires: exp, CA: CertDigest(old)})
	c, _ := s.CA(ctx)
	if c.Next != d || strings.Join(c.Renewed, ",") != "ace,bee" || strings.Join(c.Waiting, ",") != "cat" {
		t.Fatalf("status under rotation: %+v", c)
	}
	// cat is gone for good: removing it ends the rotation.
	mustApply(t, s, &idx, &NodeRemoveRequest{Name: "cat"})
	id, _ = s.Identity(ctx)
	c, _ = s.CA(ctx)
	if id.CACert != next || id.CAKeySealed != "S-next" || id.CANextCert != "" || c.Next != "" || c.RotatedAt == "" || c.Digest != d {
		t.Fatalf("after the rotation: %+v %+v", id, c)
	}
	// And again, ended by the last node.cert this time.
	third := fakeCert("third")
	mustApply(t, s, &idx, &CARotateRequest{NextCert: third, NextKey: &VoterSecret{Sealed: "S-third", Recipients: []string{"kA"}}})
	mustApply(t, s, &idx, &NodeCertRequest{Node: "bee", Expires: exp, CA: CertDigest(third)})
	if id, _ := s.Identity(ctx); id.CACert != next {
		t.Fatal("ended before every node renewed")
	}
	mustApply(t, s, &idx, &NodeCertRequest{Node: "ace", Expires: exp, CA: CertDigest(third)})
	if id, _ := s.Identity(ctx); id.CACert != third || id.CAKeySealed != "S-third" {
		t.Fatalf("not ended by the last renewal: %+v", id)
	}
	if NewCommand(&NodeCertRequest{Node: "ace", CA: d}).V != secretFormat {
		t.Fatal("node.cert with a CA is not written in format 8")
	}
}
