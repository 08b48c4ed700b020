package agent

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/sha256"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/hex"
	"encoding/pem"
	"errors"
	"fmt"
	"log/slog"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"time"

	"mesh/internal/safefs"
)

// The web page's certificate (issue "a web page for the fleet"): its own,
// self-signed, not the node's. A browser told to trust the mesh CA would
// take any name the CA signed, and the CA's key opens on every voter: one
// voter taken would let its taker stand in for any site to that browser.
// A self-signed leaf (not a CA) vouches for this page alone; the operator
// checks its fingerprint, which `mesh web token` prints, once.
const (
	WebCertFile = "web.crt"
	WebKeyFile  = "web.key"
	// webCertLife is how long a web certificate is made for; one within
	// webCertRenew of its end is made again (at start, or at a handshake).
	webCertLife  = 365 * 24 * time.Hour
	webCertRenew = 30 * 24 * time.Hour
)

// webCert holds the page's certificate, made or loaded from the data dir.
type webCert struct {
	dir   string
	hosts []string // the names and addresses it must cover
	log   *slog.Logger
	now   func() time.Time
	mu    sync.Mutex
	cert  *tls.Certificate
	leaf  *x509.Certificate
	// failed is when making it again last failed: a handshake tries again
	// an hour later, not at every handshake (a full disk, a read-only dir).
	failed time.Time
}

// newWebCert loads the data dir's web certificate, or makes one (and
// keeps it, 0600) when there is none, it does not load, does not cover
// hosts, or ends soon.
func newWebCert(dir string, hosts []string, log *slog.Logger) (*webCert, error) {
	w := &webCert{dir: dir, hosts: hosts, log: log, now: time.Now}
	if err := w.ensure(); err != nil {
		return nil, err
	}
	return w, nil
}

// Fingerprint is the certificate's SHA-256, as a browser's certificate
// viewer shows it (hex pairs).
func (w *webCert) Fingerprint() string {
	w.mu.Lock()
	defer w.mu.Unlock()
	return fingerprint(w.leaf)
}

func fingerprint(c *x509.Certificate) string {
	sum := sha256.Sum256(c.Raw)
	h := strings.ToUpper(hex.EncodeToString(sum[:]))
	var b strings.Builder
	for i := 0; i < len(h); i += 2 {
		if i > 0 {
			b.WriteByte(':')
		}
		b.WriteString(h[i : i+2])
	}
	return b.String()
}

// GetCertificate serves it, made again first when it ends soon.
func (w *webCert) GetCertificate(*tls.ClientHelloInfo) (*tls.Certificate, error) {
	w.mu.Lock()
	now := w.now()
	soon := w.leaf.NotAfter.Sub(now) < webCertRenew && now.Sub(w.failed) > time.Hour
	w.mu.Unlock()
	if soon {
		if err := w.ensure(); err != nil {
			w.mu.Lock()
			w.failed = now
			w.mu.Unlock()
			w.log.Warn("web page: the certificate ends soon and was not made again; trying again in an hour", "err", err)
		}
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.cert, nil
}

func (w *webCert) ensure() error {
	w.mu.Lock()
	defer w.mu.Unlock()
	certFile, keyFile := filepath.Join(w.dir, WebCertFile), filepath.Join(w.dir, WebKeyFile)
	c, leaf, err := loadWebCert(certFile, keyFile)
	switch {
	case err == nil && leaf.NotAfter.Sub(w.now()) >= webCertRenew && covers(leaf, w.hosts):
		w.cert, w.leaf = c, leaf
		return nil
	case err == nil:
		w.log.Info("web page: making a new certificate", "why", "the last one ends soon or does not cover "+strings.Join(w.hosts, ", "))
	case !errors.Is(err, os.ErrNotExist):
		w.log.Warn("web page: the certificate in the data dir does not load; making a new one", "err", err)
	}
	// The key stays when it loads: a browser that pinned it (or was told
	// its hash) takes the new certificate.
	var key *ecdsa.PrivateKey
	if b, err := readOwn(keyFile); err == nil {
		if blk, _ := pem.Decode(b); blk != nil && blk.Type == "EC PRIVATE KEY" {
			key, _ = x509.ParseECPrivateKey(blk.Bytes)
		}
	}
	certPEM, keyPEM, err := makeWebCert(w.hosts, w.now(), key)
	if err != nil {
		return err
	}
	// The key first: a crash between the two leaves a certificate that
	// does not match its key, which the next start makes again.
	if err := safefs.WriteFile(keyFile, keyPEM, 0o600); err != nil {
		return fmt.Errorf("keep the web page's key: %w", err)
	}
	if err := safefs.WriteFile(certFile, certPEM, 0o600); err != nil {
		return fmt.Errorf("keep the web page's certificate: %w", err)
	}
	c, leaf, err = loadWebCert(certFile, keyFile)
	if err != nil {
		return err
	}
	w.cert, w.leaf = c, leaf
	w.log.Info("web page: certificate made", "fingerprint", fingerprint(leaf), "expires", leaf.NotAfter.Format(time.RFC3339))
	return nil
}

// loadWebCert loads the pair, which must be the page's own: regular files
// (a link is not followed: one planted to the node's certificate would
// serve the mesh CA's), and a self-signed leaf, not a CA.
func loadWebCert(certFile, keyFile string) (*tls.Certificate, *x509.Certificate, error) {
	certPEM, err := readOwn(certFile)
	if err != nil {
		return nil, nil, err
	}
	keyPEM, err := readOwn(keyFile)
	if err != nil {
		return nil, nil, err
	}
	c, err := tls.X509KeyPair(certPEM, keyPEM)
	if err != nil {
		return nil, nil, err
	}
	leaf, err := x509.ParseCertificate(c.Certificate[0])
	if err != nil {
		return nil, nil, err
	}
	if leaf.IsCA || leaf.CheckSignature(leaf.SignatureAlgorithm, leaf.RawTBSCertificate, leaf.Signature) != nil {
		return nil, nil, errors.New(certFile + " is not a self-signed leaf certificate")
	}
	c.Leaf = leaf
	return &c, leaf, nil
}

// readOwn reads one of the page's small files, never through a link.
func readOwn(path string) ([]byte, error) { return safefs.ReadFile(path, 64<<10) }

// covers says whether c names every host.
func covers(c *x509.Certificate, hosts []string) bool {
	for _, h := range hosts {
		if ip := net.ParseIP(h); ip != nil {
			if !slices.ContainsFunc(c.IPAddresses, ip.Equal) {
				return false
			}
		} else if !slices.Contains(c.DNSNames, h) {
			return false
		}
	}
	return true
}

// makeWebCert makes a self-signed ECDSA P-256 certificate for hosts, with
// key (a new one when nil): a leaf for serving (not a CA, so trusting it
// vouches for nothing else).
func makeWebCert(hosts []string, now time.Time, key *ecdsa.PrivateKey) (certPEM, keyPEM []byte, err error) {
	if key == nil {
		if key, err = ecdsa.GenerateKey(elliptic.P256(), rand.Reader); err != nil {
			return nil, nil, err
		}
	}
	sn, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 127))
	if err != nil {
		return nil, nil, err
	}
	tpl := &x509.Certificate{
		SerialNumber:          sn,
		Subject:               pkix.Name{CommonName: "mesh web page " + strings.Join(hosts, " ")},
		NotBefore:             now.Add(-time.Hour),
		NotAfter:              now.Add(webCertLife),
		KeyUsage:              x509.KeyUsageDigitalSignature,
		ExtKeyUsage:           []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
		BasicConstraintsValid: true,
		IsCA:                  false,
	}
	for _, h := range hosts {
		if ip := net.ParseIP(h); ip != nil {
			tpl.IPAddresses = append(tpl.IPAddresses, ip)
		} else {
			tpl.DNSNames = append(tpl.DNSNames, h)
		}
	}
	der, err := x509.CreateCertificate(rand.Reader, tpl, tpl, &key.PublicKey, key)
	if err != nil {
		return nil, nil, err
	}
	kder, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		return nil, nil, err
	}
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: kder}), nil
}
