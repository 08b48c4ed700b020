package state

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"math/big"
	"strings"
	"testing"
	"time"
)

// testCA is a CA: its certificate (PEM), and its key.
type testCA struct {
	pem  string
	cert *x509.Certificate
	key  *ecdsa.PrivateKey
}

func newTestCA(t *testing.T, name string) testCA {
	t.Helper()
	key, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(time.Now().UnixNano()), Subject: pkix.Name{CommonName: "mesh m-1"}, NotBefore: t0, NotAfter: t0.Add(24 * time.Hour),
		IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign, SubjectKeyId: []byte(name)}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	c, _ := x509.ParseCertificate(der)
	return testCA{pem: string(pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})), cert: c, key: key}
}

// cross is next's certificate signed by old.
func cross(t *testing.T, next, old testCA) string {
	t.Helper()
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(time.Now().UnixNano()), Subject: next.cert.Subject, NotBefore: t0, NotAfter: t0.Add(24 * time.Hour),
		IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign, SubjectKeyId: next.cert.SubjectKeyId}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, old.cert, &next.key.PublicKey, old.key)
	if err != nil {
		t.Fatal(err)
	}
	return string(pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}))
}

// A rotation of the CA holds both until every node says its certificate
// is the new CA's; then the new one replaces the old in the same command,
// on every replica; removing the last node it waits for ends it too. One
// rotation at a time, sealed to the voters as they are.
func TestCARotation(t *testing.T) {
	ctx := context.Background()
	s := openStore(t)
	var idx uint64
	oldCA, nextCA := newTestCA(t, "old"), newTestCA(t, "next")
	old, next := oldCA.pem, nextCA.pem
	x := cross(t, nextCA, oldCA)
	mustApply(t, s, &idx, &InitRequest{MeshID: "m-1", CACert: old, Node: Node{Name: "ace", Address: "10.0.0.1", SealKey: "kA", Voter: true},
		SealedCAKey: &VoterSecret{Sealed: "S-old", Recipients: []string{"kA"}}, SealedJoinSecret: &VoterSecret{Sealed: "S-join", Recipients: []string{"kA"}}})
	mustApply(t, s, &idx, &NodeAddRequest{Node: Node{Name: "bee", Address: "10.0.0.2", SealKey: "kB"}})
	mustApply(t, s, &idx, &NodeAddRequest{Node: Node{Name: "cat", Address: "10.0.0.3", SealKey: "kC"}})

	other := newTestCA(t, "other")
	for _, bad := range []*CARotateRequest{
		{NextCert: "not pem", Cross: x, NextKey: &VoterSecret{Sealed: "S", Recipients: []string{"kA"}}},
		{NextCert: old, Cross: x, NextKey: &VoterSecret{Sealed: "S", Recipients: []string{"kA"}}},
		{NextCert: next, Cross: x, NextKey: &VoterSecret{Sealed: "S", Recipients: []string{"kB"}}},
		{NextCert: next, Cross: x},
		{NextCert: next, NextKey: &VoterSecret{Sealed: "S", Recipients: []string{"kA"}}},                                 // no cross
		{NextCert: next, Cross: cross(t, nextCA, other), NextKey: &VoterSecret{Sealed: "S", Recipients: []string{"kA"}}}, // signed by another CA
		{NextCert: next, Cross: cross(t, other, oldCA), NextKey: &VoterSecret{Sealed: "S", Recipients: []string{"kA"}}},  // for another key
	} {
		var rule *RuleError
		if err := applyErr(t, s, &idx, bad); !errors.As(err, &rule) {
			t.Fatalf("%+v: %v", bad, err)
		}
	}
	mustApply(t, s, &idx, &CARotateRequest{NextCert: next, Cross: x, NextKey: &VoterSecret{Sealed: "S-next", Recipients: []string{"kA"}}})
	thirdCA := newTestCA(t, "third")
	if err := applyErr(t, s, &idx, &CARotateRequest{NextCert: thirdCA.pem, Cross: cross(t, thirdCA, nextCA), NextKey: &VoterSecret{Sealed: "S", Recipients: []string{"kA"}}}); !errors.Is(err, ErrConflict) || !strings.Contains(err.Error(), "ace, bee, cat") {
		t.Fatalf("a second rotation: %v", err)
	}
	id, _ := s.Identity(ctx)
	if id.CACert != old || id.CANextCert != next || id.CANextKeySealed != "S-next" || id.CANextCross != x {
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
	// A seal of the old CA's key proposed from a replica read before the
	// rotation ends is not taken after it (For names the old CA).
	late := &SealRequest{CAKey: &VoterSecret{Sealed: "S-old-late", Recipients: []string{"kA", "kD"}, For: CertDigest(old)}}
	// cat is gone for good: removing it ends the rotation.
	mustApply(t, s, &idx, &NodeRemoveRequest{Name: "cat"})
	id, _ = s.Identity(ctx)
	c, _ = s.CA(ctx)
	if id.CACert != next || id.CAKeySealed != "S-next" || id.CANextCert != "" || id.CANextCross != "" || c.Next != "" || c.RotatedAt == "" || c.Digest != d {
		t.Fatalf("after the rotation: %+v %+v", id, c)
	}
	// A voter joins (its key kD): the CA key is stale; the late seal of
	// the old CA's key is ignored, a seal of the new one's is taken.
	mustApply(t, s, &idx, &NodeAddRequest{Node: Node{Name: "dog", Address: "10.0.0.4", SealKey: "kD", Voter: true}})
	if st, _ := s.VoterSealStale(ctx); !st["ca_key"] {
		t.Fatalf("the CA key is not stale with a new voter: %v", st)
	}
	mustApply(t, s, &idx, late)
	if id, _ := s.Identity(ctx); id.CAKeySealed != "S-next" {
		t.Fatalf("a late seal of the old CA's key replaced the new one's: %q", id.CAKeySealed)
	}
	mustApply(t, s, &idx, &SealRequest{CAKey: &VoterSecret{Sealed: "S-next-2", Recipients: []string{"kA", "kD"}, For: d}})
	if id, _ := s.Identity(ctx); id.CAKeySealed != "S-next-2" {
		t.Fatalf("a seal of the new CA's key was not taken: %q", id.CAKeySealed)
	}
	mustApply(t, s, &idx, &NodeRemoveRequest{Name: "dog"})
	// And again, ended by the last node.cert this time.
	third := thirdCA.pem
	mustApply(t, s, &idx, &CARotateRequest{NextCert: third, Cross: cross(t, thirdCA, nextCA), NextKey: &VoterSecret{Sealed: "S-third", Recipients: []string{"kA"}}})
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
