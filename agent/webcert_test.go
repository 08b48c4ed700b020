package agent

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"log/slog"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"testing"
	"time"
)

// The page's certificate is a leaf of its own, kept across restarts, made
// again when it is damaged, does not match its key, does not cover the
// page's address, or ends soon.
func TestWebCert(t *testing.T) {
	dir := t.TempDir()
	log := slog.New(slog.DiscardHandler)
	w, err := newWebCert(dir, []string{"10.1.2.3"}, log)
	if err != nil {
		t.Fatal(err)
	}
	leaf := w.leaf
	if leaf.IsCA || !leaf.BasicConstraintsValid || len(leaf.IPAddresses) != 1 || leaf.IPAddresses[0].String() != "10.1.2.3" {
		t.Fatalf("certificate: CA %v, IPs %v", leaf.IsCA, leaf.IPAddresses)
	}
	if err := leaf.CheckSignature(leaf.SignatureAlgorithm, leaf.RawTBSCertificate, leaf.Signature); err != nil {
		t.Fatalf("not self-signed: %v", err)
	}
	for _, f := range []string{WebCertFile, WebKeyFile} {
		fi, err := os.Stat(filepath.Join(dir, f))
		if err != nil || fi.Mode().Perm() != 0o600 {
			t.Fatalf("%s: %v %v", f, fi, err)
		}
	}
	fp := w.Fingerprint()
	if len(fp) != 95 {
		t.Fatalf("fingerprint %q", fp)
	}
	// Kept across a restart.
	again, err := newWebCert(dir, []string{"10.1.2.3"}, log)
	if err != nil || again.Fingerprint() != fp {
		t.Fatalf("after a restart: %v, fingerprint %s, was %s", err, again.Fingerprint(), fp)
	}
	// Made again for another address.
	other, err := newWebCert(dir, []string{"10.9.9.9"}, log)
	if err != nil || other.Fingerprint() == fp || !covers(other.leaf, []string{"10.9.9.9"}) {
		t.Fatalf("another address: %v, same fingerprint %v", err, other.Fingerprint() == fp)
	}
	fp = other.Fingerprint()
	// A damaged certificate, or a key of another pair, is made again.
	os.WriteFile(filepath.Join(dir, WebCertFile), []byte("-----BEGIN CERTIFICATE-----\ngarbage\n"), 0o600)
	d, err := newWebCert(dir, []string{"10.9.9.9"}, log)
	if err != nil || d.Fingerprint() == fp {
		t.Fatalf("damaged: %v", err)
	}
	_, keyPEM, _ := makeWebCert([]string{"10.9.9.9"}, time.Now(), nil)
	os.WriteFile(filepath.Join(dir, WebKeyFile), keyPEM, 0o600)
	k, err := newWebCert(dir, []string{"10.9.9.9"}, log)
	if err != nil || k.Fingerprint() == d.Fingerprint() {
		t.Fatalf("a key of another pair: %v", err)
	}
	// A handshake near the end makes it again, with the same key (a
	// browser that pinned the key takes it).
	fp, spki := k.Fingerprint(), string(k.leaf.RawSubjectPublicKeyInfo)
	k.now = func() time.Time { return time.Now().Add(webCertLife - webCertRenew/2) }
	c, err := k.GetCertificate(nil)
	if err != nil || k.Fingerprint() == fp || c.Leaf == nil || c.Leaf.NotAfter.Before(time.Now().Add(webCertLife)) || string(c.Leaf.RawSubjectPublicKeyInfo) != spki {
		t.Fatalf("near its end: %v, fingerprint unchanged %v, key kept %v", err, k.Fingerprint() == fp, c != nil && c.Leaf != nil && string(c.Leaf.RawSubjectPublicKeyInfo) == spki)
	}
	// A link planted in the data dir is not followed (one to the node's
	// certificate would serve the mesh CA's), nor a CA taken.
	fp = k.Fingerprint()
	elsewhere := filepath.Join(t.TempDir(), "planted.crt")
	b, _ := os.ReadFile(filepath.Join(dir, WebCertFile))
	os.WriteFile(elsewhere, b, 0o600)
	os.Remove(filepath.Join(dir, WebCertFile))
	if err := os.Symlink(elsewhere, filepath.Join(dir, WebCertFile)); err != nil {
		t.Fatal(err)
	}
	l, err := newWebCert(dir, []string{"10.9.9.9"}, log)
	if err != nil || l.Fingerprint() == fp {
		t.Fatalf("through a link: %v, the linked certificate served %v", err, l.Fingerprint() == fp)
	}
	if fi, err := os.Lstat(filepath.Join(dir, WebCertFile)); err != nil || !fi.Mode().IsRegular() {
		t.Fatalf("the link is still there: %v %v", fi, err)
	}
	caPEM, caKey := selfSignedCA(t)
	os.WriteFile(filepath.Join(dir, WebCertFile), caPEM, 0o600)
	os.WriteFile(filepath.Join(dir, WebKeyFile), caKey, 0o600)
	ca, err := newWebCert(dir, []string{"10.9.9.9"}, log)
	if err != nil || ca.leaf.IsCA {
		t.Fatalf("a CA planted as the page's certificate: %v, served %v", err, err == nil && ca.leaf.IsCA)
	}
}

func selfSignedCA(t *testing.T) (certPEM, keyPEM []byte) {
	key, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	tpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "planted CA"}, NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(webCertLife),
		IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature, IPAddresses: []net.IP{net.ParseIP("10.9.9.9")}}
	der, err := x509.CreateCertificate(rand.Reader, tpl, tpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	kder, _ := x509.MarshalECPrivateKey(key)
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: kder})
}
