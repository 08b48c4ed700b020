package agent

import (
	"log/slog"
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
	_, keyPEM, _ := makeWebCert([]string{"10.9.9.9"}, time.Now())
	os.WriteFile(filepath.Join(dir, WebKeyFile), keyPEM, 0o600)
	k, err := newWebCert(dir, []string{"10.9.9.9"}, log)
	if err != nil || k.Fingerprint() == d.Fingerprint() {
		t.Fatalf("a key of another pair: %v", err)
	}
	// A handshake near the end makes it again.
	fp = k.Fingerprint()
	k.now = func() time.Time { return time.Now().Add(webCertLife - webCertRenew/2) }
	c, err := k.GetCertificate(nil)
	if err != nil || k.Fingerprint() == fp || c.Leaf == nil || c.Leaf.NotAfter.Before(time.Now().Add(webCertLife)) {
		t.Fatalf("near its end: %v, fingerprint unchanged %v", err, k.Fingerprint() == fp)
	}
}
