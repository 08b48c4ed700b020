package cluster

import (
	"bytes"
	"context"
	"crypto/rand"
	"crypto/x509"
	"encoding/pem"
	"errors"
	"fmt"
	"path/filepath"
	"sync/atomic"
	"time"

	"mesh/state"
)

// The node's side of a rotation of the mesh's CA (state/ca.go): it trusts
// what the state says (the mesh's CA, and the new one while a rotation is
// under way), keeps the CA file of its data dir the same, renews its
// certificate under the new CA as soon as a rotation starts, and says which
// CA signed it. The leader signs renewals with the new CA's key meanwhile.

// trustOf is what the state says to trust, PEM: the mesh's CA, then the new
// one while a rotation is under way.
func trustOf(id state.Identity) [][]byte {
	out := [][]byte{[]byte(id.CACert)}
	if id.CANextCert != "" {
		out = append(out, []byte(id.CANextCert))
	}
	return out
}

// refreshTrust makes the node trust what its replica says, and writes the
// CA file when that changed (a restart trusts the same).
func (n *Node) refreshTrust(ctx context.Context) error {
	// One at a time (the trust loop and a renewal both call it), each
	// from the replica as it is then.
	n.trustMu.Lock()
	defer n.trustMu.Unlock()
	id, err := n.store.Identity(ctx)
	if err != nil || id.CACert == "" {
		return err // not initialised yet: the CA file holds
	}
	want, err := newTrust(trustOf(id)...)
	if err != nil {
		return fmt.Errorf("the state's CA: %w", err)
	}
	if id.CANextCross != "" {
		if want.cross, err = x509.ParseCertificate(pemDER([]byte(id.CANextCross))); err != nil {
			return fmt.Errorf("the state's cross certificate: %w", err)
		}
	}
	have := n.tls.trust.Load()
	if bytes.Equal(have.joint, want.joint) && (have.cross == nil) == (want.cross == nil) {
		return nil
	}
	if err := writeFileAtomic(filepath.Join(n.cfg.TLSDir, CAFile), want.joint, 0o600); err != nil {
		return fmt.Errorf("write the CA file: %w", err)
	}
	n.tls.trust.Store(want)
	n.tls.rechain()
	// Raft connections made under the old trust are checked under the new.
	n.mux.recheck()
	switch {
	case len(want.cas) > 1:
		n.log.Info("a rotation of the CA is under way: trusting the new CA as well", "ca", state.CertDigest(id.CACert)[:12], "new", state.CertDigest(id.CANextCert)[:12])
	case len(have.cas) > 1:
		n.log.Info("the rotation of the CA ended: trusting the new CA alone; a certificate of the old one is refused", "ca", state.CertDigest(id.CACert)[:12])
	default:
		n.log.Info("trusting the mesh's CA of the state", "ca", state.CertDigest(id.CACert)[:12])
	}
	// Connections made under the old trust are not checked again: new
	// ones are made from now on.
	n.peerConns.fresh()
	return nil
}

// keepTrust follows the state's CA until ctx ends.
func (n *Node) keepTrust(ctx context.Context) {
	for {
		changed := n.store.Changed()
		if err := n.refreshTrust(ctx); err != nil && ctx.Err() == nil && !errors.Is(err, state.ErrNotFound) {
			n.log.Warn("following the mesh's CA", "err", err)
		}
		select {
		case <-ctx.Done():
			return
		case <-changed:
			pause(ctx, 200*time.Millisecond)
		case <-time.After(30 * time.Second):
		}
	}
}

// certCA is the digest of the trusted CA that signed c ("" when none does).
func (n *Node) certCA(c *x509.Certificate) string {
	if ca := n.tls.trust.Load().issuer(c); ca != nil {
		return sha256Hex(ca.Raw) // as tokens and the state name a CA
	}
	return ""
}

// rotationDue says whether this node's certificate must be renewed for a
// rotation under way: it is not the new CA's.
func (n *Node) rotationDue(ctx context.Context, leaf *x509.Certificate) bool {
	id, err := n.store.Identity(ctx)
	if err != nil || id.CANextCert == "" {
		return false
	}
	return n.certCA(leaf) != state.CertDigest(id.CANextCert)
}

// signingCA is the CA the leader signs with: the new one while a rotation
// is under way, else the mesh's.
func (n *Node) signingCA(id state.Identity) (*CA, error) {
	if id.CANextCert != "" {
		key, err := n.openVoterSecret("", id.CANextKeySealed, "new CA key")
		if err != nil {
			return nil, err
		}
		return ParseCA([]byte(id.CANextCert), []byte(key))
	}
	caKey, _, err := n.OpenIdentity(id)
	if err != nil {
		return nil, err
	}
	return ParseCA([]byte(id.CACert), []byte(caKey))
}

// OpenNextCAKey opens the key of the CA a rotation brings in (a voter's).
func (n *Node) OpenNextCAKey(id state.Identity) (string, error) {
	if id.CANextKeySealed == "" {
		return "", errors.New("no rotation of the CA is under way")
	}
	return n.openVoterSecret("", id.CANextKeySealed, "new CA key")
}

// RotateCA starts a rotation of the mesh's CA: a new CA, its key sealed to
// the voters as this replica knows them, proposed with ca.rotate. The key
// is in this process's memory only while it is sealed.
func (n *Node) RotateCA(ctx context.Context, reason string) (uint64, error) {
	id, err := n.store.Identity(ctx)
	if err != nil {
		return 0, err
	}
	if id.CANextCert != "" {
		c, _ := n.store.CA(ctx)
		return 0, &state.RuleError{Kind: state.ErrConflict, Msg: fmt.Sprintf("a rotation of the CA is under way (since %s); it ends once %v renewed their certificates (mesh status shows it; mesh node remove a node that is gone for good)", c.RotationStarted, c.Waiting)}
	}
	// The old CA signs the new one too (the cross certificate): a voter's
	// work, which holds the old key.
	oldKey, _, err := n.OpenIdentity(id)
	if err != nil {
		return 0, &state.RuleError{Kind: state.ErrConflict, Msg: "mesh ca rotate signs the new CA with the old CA's key, which only voters hold: run it on a voter (mesh node list shows them)"}
	}
	old, err := ParseCA([]byte(id.CACert), []byte(oldKey))
	if err != nil {
		return 0, fmt.Errorf("read the mesh CA: %w", err)
	}
	ca, err := NewCA(id.MeshID)
	if err != nil {
		return 0, err
	}
	cross, err := crossSign(old, ca)
	if err != nil {
		return 0, err
	}
	keys, err := n.store.VoterKeys(ctx)
	if err != nil {
		return 0, err
	}
	sealed, err := n.SealToVoters(string(ca.KeyPEM), keys)
	if err != nil {
		return 0, err
	}
	return n.Propose(ctx, &state.CARotateRequest{NextCert: string(ca.CertPEM), NextKey: sealed, Cross: string(cross), Reason: reason})
}

// crossSign is next's certificate (its subject and key) signed by old.
func crossSign(old, next *CA) ([]byte, error) {
	tmpl := &x509.Certificate{
		SerialNumber: serial(), Subject: next.Cert.Subject, SubjectKeyId: next.Cert.SubjectKeyId,
		NotBefore: next.Cert.NotBefore, NotAfter: next.Cert.NotAfter,
		IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature,
	}
	if old.Cert.NotAfter.Before(tmpl.NotAfter) {
		tmpl.NotAfter = old.Cert.NotAfter
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, old.Cert, next.Key.Public(), old.Key)
	if err != nil {
		return nil, fmt.Errorf("cross-sign the new CA: %w", err)
	}
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), nil
}

// caRenewDue says whether the mesh's CA certificate has less than a third
// of its life left: the leader then rotates it, well before it expires.
func caRenewDue(ca *x509.Certificate, now time.Time) bool {
	return ca.NotAfter.Sub(now) < ca.NotAfter.Sub(ca.NotBefore)/3
}

// caCheckEvery is how often the leader looks at the CA's certificate;
// testCACheck, when set (tests), replaces it.
const caCheckEvery = time.Hour

var testCACheck atomic.Int64

func caCheckInterval() time.Duration {
	if d := testCACheck.Load(); d > 0 {
		return time.Duration(d)
	}
	return caCheckEvery
}

// keepCA, on the leader, rotates the mesh's CA when its certificate nears
// its end.
func (n *Node) keepCA(ctx context.Context) {
	for {
		select {
		case <-ctx.Done():
			return
		case <-time.After(caCheckInterval()):
		}
		if n.State() != "Leader" {
			continue
		}
		id, err := n.store.Identity(ctx)
		if err != nil || id.CANextCert != "" {
			continue
		}
		c, err := x509.ParseCertificate(pemDER([]byte(id.CACert)))
		if err != nil || !caRenewDue(c, time.Now()) {
			continue
		}
		if _, err := n.RotateCA(ctx, "its certificate expires "+c.NotAfter.UTC().Format(time.RFC3339)); err != nil {
			n.log.Warn("rotating the CA before its certificate expires failed; will try again", "expires", c.NotAfter, "err", err)
			continue
		}
		n.log.Info("rotating the CA: its certificate has a third of its life left", "expires", c.NotAfter)
	}
}
