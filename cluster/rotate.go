package cluster

import (
	"bytes"
	"context"
	"crypto/x509"
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
	id, err := n.store.Identity(ctx)
	if err != nil || id.CACert == "" {
		return err // not initialised yet: the CA file holds
	}
	want, err := newTrust(trustOf(id)...)
	if err != nil {
		return fmt.Errorf("the state's CA: %w", err)
	}
	have := n.tls.trust.Load()
	if bytes.Equal(have.joint, want.joint) {
		return nil
	}
	if err := writeFileAtomic(filepath.Join(n.cfg.TLSDir, CAFile), want.joint, 0o600); err != nil {
		return fmt.Errorf("write the CA file: %w", err)
	}
	n.tls.trust.Store(want)
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
		if err := n.refreshTrust(ctx); err != nil && ctx.Err() == nil {
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
	ca, err := NewCA(id.MeshID)
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
	return n.Propose(ctx, &state.CARotateRequest{NextCert: string(ca.CertPEM), NextKey: sealed, Reason: reason})
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
