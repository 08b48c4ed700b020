package cluster

import (
	"crypto/x509"
	"encoding/pem"
	"testing"
	"time"
)

// verifyPeer passes a chain once per trust: the same certificate under the
// same trust is not checked again, but under another trust (a rotation, a
// CA that does not sign it) it is, and refused; an expired one never hits.
func TestVerifyPeerChecksAgainUnderAnotherTrust(t *testing.T) {
	ca, err := NewCA("m1")
	if err != nil {
		t.Fatal(err)
	}
	other, err := NewCA("m1")
	if err != nil {
		t.Fatal(err)
	}
	_, csr, err := NewKey("n2", "10.0.0.2")
	if err != nil {
		t.Fatal(err)
	}
	certPEM, err := ca.Sign(csr, "n2", "10.0.0.2")
	if err != nil {
		t.Fatal(err)
	}
	b, _ := pem.Decode(certPEM)
	leaf, err := x509.ParseCertificate(b.Bytes)
	if err != nil {
		t.Fatal(err)
	}
	ours, err := newTrust(ca.CertPEM)
	if err != nil {
		t.Fatal(err)
	}
	theirs, err := newTrust(other.CertPEM)
	if err != nil {
		t.Fatal(err)
	}
	var n nodeTLS
	n.trust.Store(ours)
	if name, err := n.verifyPeer([]*x509.Certificate{leaf}); err != nil || name != "n2" {
		t.Fatalf("under its CA: %q, %v", name, err)
	}
	if _, ok := n.verified.get(leaf, ours); !ok {
		t.Fatal("a chain verifyPeer passed is not remembered")
	}
	n.trust.Store(theirs)
	if name, err := n.verifyPeer([]*x509.Certificate{leaf}); err == nil {
		t.Fatalf("under another CA it passed as %q: the remembered check outlived its trust", name)
	}
	expired := *leaf
	expired.NotAfter = time.Now().Add(-time.Minute)
	n.verified.put(&expired, ours)
	if _, ok := n.verified.get(&expired, ours); ok {
		t.Fatal("an expired certificate hit the remembered checks")
	}
}

// Liveness's round stays ProbeInterval up to 21 nodes and past that keeps
// a node's hellos at helloRate a second.
func TestProbeEveryBoundsHellosPerSecond(t *testing.T) {
	for _, tc := range []struct {
		nodes int
		want  time.Duration
	}{{1, ProbeInterval}, {3, ProbeInterval}, {21, ProbeInterval}, {22, 2100 * time.Millisecond}, {50, 4900 * time.Millisecond}, {101, 10 * time.Second}} {
		got := probeEvery(tc.nodes)
		if got != tc.want {
			t.Errorf("%d nodes: a round of %s, want %s", tc.nodes, got, tc.want)
		}
		if rate := float64(tc.nodes-1) / got.Seconds(); rate > helloRate {
			t.Errorf("%d nodes: %.1f hellos a second, past %d", tc.nodes, rate, helloRate)
		}
	}
}
