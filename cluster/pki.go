package cluster

import (
	"bytes"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"crypto/subtle"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"encoding/pem"
	"errors"
	"fmt"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"mesh/internal/safefs"
	"mesh/state"
)

// Files of a node's identity in its data dir.
const (
	CAFile   = "ca.crt"
	CertFile = "node.crt"
	KeyFile  = "node.key"
)

// certLife is how long the CA certificate is valid; testCALife, when set
// (tests), replaces it.
const certLife = 20 * 365 * 24 * time.Hour

var testCALife atomic.Int64

func caLife() time.Duration {
	if d := testCALife.Load(); d > 0 {
		return time.Duration(d)
	}
	return certLife
}

// NodeCertLifeEnv shortens node certificates' life (a Go duration), so that
// a bed sees them renewed; unset, a node certificate lasts a year.
const NodeCertLifeEnv = "MESH_CERT_LIFETIME"

// nodeCertLife is how long a node certificate is valid.
func nodeCertLife() time.Duration {
	if d, err := time.ParseDuration(os.Getenv(NodeCertLifeEnv)); err == nil && d >= 10*time.Second {
		return d
	}
	return 365 * 24 * time.Hour
}

// backdate is how far before its signing a certificate is valid, for
// clocks a little behind: an hour, or a tenth of a short life.
func backdate(life time.Duration) time.Duration { return min(time.Hour, life/10) }

// CA is the mesh's certificate authority.
type CA struct {
	Cert    *x509.Certificate
	Key     *ecdsa.PrivateKey
	CertPEM []byte
	KeyPEM  []byte
}

func serial() *big.Int {
	n, _ := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 126))
	return n
}

// NewCA makes a CA for the mesh meshID.
func NewCA(meshID string) (*CA, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, err
	}
	tmpl := &x509.Certificate{
		SerialNumber: serial(), Subject: pkix.Name{CommonName: "mesh " + meshID, Organization: []string{meshID}},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(caLife()),
		IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		return nil, err
	}
	kd, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		return nil, err
	}
	return ParseCA(pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: kd}))
}

// ParseCA reads a CA from PEM.
func ParseCA(certPEM, keyPEM []byte) (*CA, error) {
	cb, _ := pem.Decode(certPEM)
	kb, _ := pem.Decode(keyPEM)
	if cb == nil || kb == nil {
		return nil, errors.New("CA is not PEM")
	}
	cert, err := x509.ParseCertificate(cb.Bytes)
	if err != nil {
		return nil, err
	}
	key, err := x509.ParseECPrivateKey(kb.Bytes)
	if err != nil {
		return nil, err
	}
	return &CA{Cert: cert, Key: key, CertPEM: certPEM, KeyPEM: keyPEM}, nil
}

// CADigest is the sha256 of the CA certificate (DER), hex: what a token pins.
func CADigest(certPEM []byte) string {
	b, _ := pem.Decode(certPEM)
	if b == nil {
		return ""
	}
	s := sha256.Sum256(b.Bytes)
	return hex.EncodeToString(s[:])
}

// NewKey makes a node key and a CSR for name at address.
func NewKey(name, address string) (keyPEM, csrPEM []byte, err error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, nil, err
	}
	if csrPEM, err = certRequest(key, name, address); err != nil {
		return nil, nil, err
	}
	kd, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		return nil, nil, err
	}
	return pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: kd}), csrPEM, nil
}

// certRequest is a CSR for key, for name at address.
func certRequest(key *ecdsa.PrivateKey, name, address string) ([]byte, error) {
	csr := &x509.CertificateRequest{Subject: pkix.Name{CommonName: name}}
	if ip := net.ParseIP(address); ip != nil {
		csr.IPAddresses = []net.IP{ip}
	}
	der, err := x509.CreateCertificateRequest(rand.Reader, csr, key)
	if err != nil {
		return nil, err
	}
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE REQUEST", Bytes: der}), nil
}

// Sign issues a node certificate for a CSR whose name must be name.
func (ca *CA) Sign(csrPEM []byte, name, address string) ([]byte, error) {
	b, _ := pem.Decode(csrPEM)
	if b == nil {
		return nil, errors.New("certificate request is not PEM")
	}
	csr, err := x509.ParseCertificateRequest(b.Bytes)
	if err != nil {
		return nil, err
	}
	if err := csr.CheckSignature(); err != nil {
		return nil, fmt.Errorf("certificate request signature: %w", err)
	}
	if csr.Subject.CommonName != name {
		return nil, fmt.Errorf("certificate request is for %q, not %q", csr.Subject.CommonName, name)
	}
	life := nodeCertLife()
	tmpl := &x509.Certificate{
		SerialNumber: serial(), Subject: pkix.Name{CommonName: name, Organization: ca.Cert.Subject.Organization},
		NotBefore: time.Now().Add(-backdate(life)), NotAfter: time.Now().Add(life),
		KeyUsage:    x509.KeyUsageDigitalSignature,
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth},
	}
	if ip := net.ParseIP(address); ip != nil {
		tmpl.IPAddresses = []net.IP{ip}
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.Cert, csr.PublicKey, ca.Key)
	if err != nil {
		return nil, err
	}
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), nil
}

// writeIdentityFiles stores a node's CA, certificate and key (0600).
func writeIdentityFiles(dir string, caPEM, certPEM, keyPEM []byte) error {
	for name, b := range map[string][]byte{CAFile: caPEM, CertFile: certPEM, KeyFile: keyPEM} {
		if err := writeFileAtomic(filepath.Join(dir, name), b, 0o600); err != nil {
			return err
		}
	}
	return nil
}

func writeFileAtomic(path string, b []byte, mode os.FileMode) error {
	return safefs.WriteFile(path, b, mode)
}

// nodeTLS is a node's TLS material: its certificate (replaced when it is
// renewed, without a restart) and the mesh CA.
type nodeTLS struct {
	cert atomic.Pointer[tls.Certificate]
	// trust is the CAs the node trusts: the mesh's, and while a rotation
	// is under way the new one as well (rotate.go).
	trust atomic.Pointer[trustSet]
	// verified: the chains verifyPeer passed.
	verified verifiedCerts
	meshID   string
	// peerOK, when set (by the node, before it dials anyone), also checks
	// a peer this node dials: a node of the replica, with the key recorded
	// for it (keyFits).
	peerOK func(name string, cert *x509.Certificate) error
}

// current is the certificate the node presents now.
func (t *nodeTLS) current() *tls.Certificate { return t.cert.Load() }

// trustSet is the CAs a node trusts, the first the mesh's own.
type trustSet struct {
	pool  *x509.CertPool
	cas   []*x509.Certificate
	pems  [][]byte
	joint []byte // every CA, PEM, as the CA file holds them
	// cross, while a rotation runs, is the new CA signed by the old one:
	// presented after a certificate of the new CA (state/ca.go).
	cross *x509.Certificate
}

func newTrust(caPEMs ...[]byte) (*trustSet, error) {
	ts := &trustSet{pool: x509.NewCertPool()}
	for _, p := range caPEMs {
		for rest := p; ; {
			var b *pem.Block
			b, rest = pem.Decode(rest)
			if b == nil {
				break
			}
			if b.Type != "CERTIFICATE" {
				continue
			}
			c, err := x509.ParseCertificate(b.Bytes)
			if err != nil {
				return nil, fmt.Errorf("a CA certificate does not parse: %w", err)
			}
			one := pem.EncodeToMemory(b)
			ts.pool.AddCert(c)
			ts.cas = append(ts.cas, c)
			ts.pems = append(ts.pems, one)
			ts.joint = append(ts.joint, one...)
		}
	}
	if len(ts.cas) == 0 {
		return nil, errors.New("the mesh CA file holds no certificate")
	}
	return ts, nil
}

// issuer is the trusted CA that signed c, or nil.
func (ts *trustSet) issuer(c *x509.Certificate) *x509.Certificate {
	for _, ca := range ts.cas {
		if c.CheckSignatureFrom(ca) == nil {
			return ca
		}
	}
	return nil
}

// caPEM is the mesh's own CA certificate (the first trusted).
func (t *nodeTLS) caPEM() []byte { return t.trust.Load().pems[0] }

// pair reads a certificate for the node's key, with the CA that signed it
// appended to the chain it presents.
func (t *nodeTLS) pair(certPEM, keyPEM []byte) (*tls.Certificate, error) {
	cert, err := tls.X509KeyPair(certPEM, keyPEM)
	if err != nil {
		return nil, err
	}
	if cert.Leaf, err = x509.ParseCertificate(cert.Certificate[0]); err != nil {
		return nil, err
	}
	cert.Certificate = t.trust.Load().chain(cert.Leaf)
	return &cert, nil
}

// chain is what a node presents with leaf: leaf, the CA that signed it,
// and, for a certificate of a rotation's new CA, the cross certificate, by
// which a node that trusts only the old CA still verifies it.
func (ts *trustSet) chain(leaf *x509.Certificate) [][]byte {
	out := [][]byte{leaf.Raw}
	ca := ts.issuer(leaf)
	if ca == nil {
		return append(out, ts.cas[0].Raw)
	}
	out = append(out, ca.Raw)
	if ts.cross != nil && bytes.Equal(ts.cross.RawSubjectPublicKeyInfo, ca.RawSubjectPublicKeyInfo) {
		out = append(out, ts.cross.Raw)
	}
	return out
}

// rechain presents the node's certificate with the chain the trust now
// gives (a rotation began or ended).
func (t *nodeTLS) rechain() {
	c := *t.current()
	c.Certificate = t.trust.Load().chain(c.Leaf)
	t.cert.Store(&c)
}

func loadNodeTLS(dir string) (*nodeTLS, error) {
	caPEM, err := os.ReadFile(filepath.Join(dir, CAFile))
	if err != nil {
		return nil, fmt.Errorf("read the mesh CA: %w", err)
	}
	certPEM, err := os.ReadFile(filepath.Join(dir, CertFile))
	if err != nil {
		return nil, fmt.Errorf("read this node's certificate: %w", err)
	}
	keyPEM, err := os.ReadFile(filepath.Join(dir, KeyFile))
	if err != nil {
		return nil, fmt.Errorf("read this node's key: %w", err)
	}
	ts, err := newTrust(caPEM)
	if err != nil {
		return nil, err
	}
	t := &nodeTLS{}
	t.trust.Store(ts)
	cert, err := t.pair(certPEM, keyPEM)
	if err != nil {
		return nil, fmt.Errorf("read this node's certificate: %w", err)
	}
	t.cert.Store(cert)
	return t, nil
}

func pemDER(p []byte) []byte {
	b, _ := pem.Decode(p)
	if b == nil {
		return nil
	}
	return b.Bytes
}

// CertKey is the digest the state pins a node's certificate by: the hex
// SHA-256 of its public key (SubjectPublicKeyInfo), which stays the same
// across renewals (a renewal signs the node's same key again).
func CertKey(c *x509.Certificate) string { return spkiKey(c.RawSubjectPublicKeyInfo) }

func spkiKey(spki []byte) string {
	d := sha256.Sum256(spki)
	return hex.EncodeToString(d[:])
}

// keyFits says whether cert may speak for node: the key its peers recorded
// for it (state node.cert) is this certificate's, or none is recorded yet (a
// node that joined before keys were recorded and has not said its own yet).
// The mesh CA alone is not enough: a voter since removed still holds the CA
// key, and could sign a certificate under the name of a node still in the
// mesh.
func keyFits(node state.NodeInfo, cert *x509.Certificate) bool {
	return node.CertKey == "" || node.CertKey == CertKey(cert)
}

// pinnedIn says whether cert may speak for node name of nodes.
func pinnedIn(nodes []state.NodeInfo, name string, cert *x509.Certificate) bool {
	for _, n := range nodes {
		if n.Name == name {
			return keyFits(n, cert)
		}
	}
	return false
}

// verifyPeer checks a peer's chain against the mesh CA and returns its name.
// A chain it passed under the same trust is not checked again while its
// certificate is valid: the peer API asks once per request, and a
// connection's requests hold the same certificate (the check was 15% of a
// node's CPU at 25 nodes, bench/fleet.sh).
func (n *nodeTLS) verifyPeer(certs []*x509.Certificate) (string, error) {
	if len(certs) == 0 {
		return "", errors.New("no certificate")
	}
	trust := n.trust.Load()
	if name, ok := n.verified.get(certs[0], trust); ok {
		return name, nil
	}
	inter := x509.NewCertPool()
	for _, c := range certs[1:] {
		inter.AddCert(c)
	}
	if _, err := certs[0].Verify(x509.VerifyOptions{Roots: trust.pool, Intermediates: inter, KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageAny}}); err != nil {
		return "", fmt.Errorf("certificate is not from this mesh's CA: %w", err)
	}
	n.verified.put(certs[0], trust)
	return certs[0].Subject.CommonName, nil
}

// verifiedCerts are the leaf certificates verifyPeer passed, by the very
// certificate a connection holds (not by its bytes: a peer cannot make a
// hit without a handshake that presented it), each with the trust it passed
// under; a change of trust (a CA rotation) checks every chain again. At most
// verifiedMax; when full it starts afresh (the connections' certificates go
// with it).
type verifiedCerts struct {
	mu sync.Mutex
	m  map[*x509.Certificate]*trustSet
}

const verifiedMax = 1024

func (v *verifiedCerts) get(c *x509.Certificate, trust *trustSet) (string, bool) {
	now := time.Now()
	if now.Before(c.NotBefore) || now.After(c.NotAfter) {
		return "", false
	}
	v.mu.Lock()
	defer v.mu.Unlock()
	if t, ok := v.m[c]; ok && t == trust {
		return c.Subject.CommonName, true
	}
	return "", false
}

func (v *verifiedCerts) put(c *x509.Certificate, trust *trustSet) {
	v.mu.Lock()
	defer v.mu.Unlock()
	if v.m == nil || len(v.m) >= verifiedMax {
		v.m = map[*x509.Certificate]*trustSet{}
	}
	v.m[c] = trust
}

// Token is what `mesh join` needs: the mesh, the CA it pins, and the secret.
// A token with an end (mesh token --ttl) carries Until, the Unix second
// after which it no longer joins, and as its secret not the join secret
// but one derived from it and Until (TokenSecret): its holder cannot make
// a token that lasts longer, or one without end.
type Token struct {
	MeshID   string `json:"m"`
	CADigest string `json:"c"`
	Secret   string `json:"s"`
	Until    int64  `json:"u,omitempty"`
}

// TokenSecret is the secret a token ending at until carries: the join
// secret itself for a token without end (until 0), else the hex
// HMAC-SHA256, keyed by the join secret, of "mesh join token until UNIX".
func TokenSecret(joinSecret string, until int64) string {
	if until == 0 {
		return joinSecret
	}
	m := hmac.New(sha256.New, []byte(joinSecret))
	fmt.Fprintf(m, "mesh join token until %d", until)
	return hex.EncodeToString(m.Sum(nil))
}

const tokenPrefix = "mesh1."

// String encodes a token.
func (t Token) String() string {
	b, _ := json.Marshal(t)
	return tokenPrefix + base64.RawURLEncoding.EncodeToString(b)
}

// ParseToken decodes a token.
func ParseToken(s string) (Token, error) {
	var t Token
	if !strings.HasPrefix(s, tokenPrefix) {
		return t, errors.New("not a mesh join token (it starts with mesh1.); get one with `mesh token` on a node of the mesh")
	}
	b, err := base64.RawURLEncoding.DecodeString(strings.TrimPrefix(s, tokenPrefix))
	if err != nil || json.Unmarshal(b, &t) != nil || t.MeshID == "" || t.CADigest == "" || t.Secret == "" || t.Until < 0 {
		return t, errors.New("the join token is damaged; copy it again from `mesh token`")
	}
	return t, nil
}

// secretEqual compares secrets in constant time.
func secretEqual(a, b string) bool { return subtle.ConstantTimeCompare([]byte(a), []byte(b)) == 1 }
