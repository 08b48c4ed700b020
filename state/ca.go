package state

import (
	"bytes"
	"context"
	"crypto/sha256"
	"crypto/x509"
	"database/sql"
	"encoding/hex"
	"encoding/pem"
	"fmt"
	"slices"
	"sort"
	"strings"
	"time"
)

// Rotating the mesh's CA (issue "The operator's secrets", item 5). A voter
// makes a new CA and proposes ca.rotate with its certificate and its key
// sealed to the voters. From then on every node trusts both CAs and renews
// its own certificate under the new one, and says so (node.cert with the
// digest of its certificate's CA). The command that leaves no node with a
// certificate of the old CA (the last node.cert, or the node.remove of the
// last node that had not renewed) ends the rotation in the FSM: the new CA
// replaces the old, whose key is dropped, and from then every node refuses
// a certificate the old CA signed. A node that was away meanwhile holds
// such a certificate: it joins again (README, "Rotating the CA").

// OpCARotate starts a rotation.
const OpCARotate = "ca.rotate"

// CARotateRequest is the new CA: its certificate (PEM) and its key, sealed
// to the voters' keys as the proposer saw them.
type CARotateRequest struct {
	NextCert string       `json:"next_cert"`
	NextKey  *VoterSecret `json:"next_key"`
	// Cross is the new CA's certificate signed by the old CA's key: nodes
	// present it while the rotation runs, so that a node that has not
	// learnt of the rotation yet (it was down when it started) still
	// verifies the others' renewed certificates and catches up.
	Cross string `json:"cross"`
	// Reason says who started it: "mesh ca rotate", or the old CA's
	// certificate nearing its end.
	Reason string `json:"reason,omitempty"`
}

func (*CARotateRequest) Op() string { return OpCARotate }
func (r *CARotateRequest) describe() string {
	d := "mesh ca rotate"
	if r.Reason != "" {
		d += " (" + r.Reason + ")"
	}
	return d
}

// CertDigest is the hex sha256 of the first certificate of a PEM text (a
// CA's identity: what a token pins), "" when it holds none.
func CertDigest(certPEM string) string {
	b, _ := pem.Decode([]byte(certPEM))
	if b == nil || b.Type != "CERTIFICATE" {
		return ""
	}
	s := sha256.Sum256(b.Bytes)
	return hex.EncodeToString(s[:])
}

func (ap *applier) caRotate(r *CARotateRequest) (bool, error) {
	kv, err := readSettings(ap.ctx, ap.tx)
	if err != nil {
		return false, err
	}
	if kv["ca_next_cert"] != "" {
		left, err := listRows(ap.tx, `SELECT name FROM nodes WHERE cert_ca != ? ORDER BY name`, CertDigest(kv["ca_next_cert"]))
		if err != nil {
			return false, err
		}
		return false, ruleErr(ErrConflict, "a rotation of the CA is under way (since %s); it ends once %s renewed their certificates (mesh status shows it; mesh node remove a node that is gone for good)", kv["ca_rotation_started"], strings.Join(left, ", "))
	}
	next := CertDigest(r.NextCert)
	if next == "" || r.NextKey == nil || r.NextKey.Sealed == "" || len(r.NextKey.Recipients) == 0 {
		return false, ruleErr(ErrInvalid, "ca.rotate without a new CA certificate and its sealed key")
	}
	if err := checkNextCA(r.NextCert, r.Cross, kv["ca_cert"]); err != nil {
		return false, ruleErr(ErrInvalid, "ca.rotate: %v", err)
	}
	if next == CertDigest(kv["ca_cert"]) {
		return false, ruleErr(ErrInvalid, "the new CA is the mesh's CA")
	}
	keys, err := voterKeys(ap.ctx, ap.tx)
	if err != nil {
		return false, err
	}
	rec := slices.Clone(r.NextKey.Recipients)
	sort.Strings(rec)
	if !slices.Equal(rec, keys) {
		return false, ruleErr(ErrConflict, "the new CA's key was sealed to other keys than the voters' now (a voter joined or left meanwhile); run mesh ca rotate again")
	}
	for k, v := range map[string]string{"ca_next_cert": r.NextCert, "ca_next_cross": r.Cross, "ca_next_key_sealed": r.NextKey.Sealed, "ca_next_key_to": strings.Join(rec, ","), "ca_rotation_started": ap.at} {
		if err := setSetting(ap.tx, k, v); err != nil {
			return false, err
		}
	}
	return false, ap.finishRotation()
}

// finishRotation ends a rotation under way once no node holds a
// certificate of the old CA: the new CA becomes the mesh's, and the old
// one's key goes. Every replica decides it on the same command.
func (ap *applier) finishRotation() error {
	kv, err := readSettings(ap.ctx, ap.tx)
	if err != nil {
		return err
	}
	if kv["ca_next_cert"] == "" {
		return nil
	}
	left, err := has(ap.tx, `SELECT 1 FROM nodes WHERE cert_ca != ?`, CertDigest(kv["ca_next_cert"]))
	if err != nil || left {
		return err
	}
	for k, v := range map[string]string{
		"ca_cert": kv["ca_next_cert"], "ca_key": "", "ca_key_sealed": kv["ca_next_key_sealed"], "ca_key_to": kv["ca_next_key_to"],
		"ca_rotated_at": ap.at, "ca_next_cert": "", "ca_next_cross": "", "ca_next_key_sealed": "", "ca_next_key_to": "", "ca_rotation_started": "",
	} {
		if err := setSetting(ap.tx, k, v); err != nil {
			return err
		}
	}
	return nil
}

// checkNextCA is what the FSM verifies of a new CA (parsing certificates
// is pure: every replica decides the same): a CA certificate, and its cross
// certificate, for the same subject and key, signed by the old CA.
func checkNextCA(nextPEM, crossPEM, oldPEM string) error {
	parse := func(p, what string) (*x509.Certificate, error) {
		b, _ := pem.Decode([]byte(p))
		if b == nil || b.Type != "CERTIFICATE" {
			return nil, fmt.Errorf("the %s is not a PEM certificate", what)
		}
		c, err := x509.ParseCertificate(b.Bytes)
		if err != nil {
			return nil, fmt.Errorf("the %s does not parse: %v", what, err)
		}
		if !c.IsCA {
			return nil, fmt.Errorf("the %s is not a CA's", what)
		}
		return c, nil
	}
	next, err := parse(nextPEM, "new CA certificate")
	if err != nil {
		return err
	}
	if err := next.CheckSignatureFrom(next); err != nil {
		return fmt.Errorf("the new CA certificate is not self-signed: %v", err)
	}
	cross, err := parse(crossPEM, "cross certificate")
	if err != nil {
		return err
	}
	old, err := parse(oldPEM, "mesh's CA certificate")
	if err != nil {
		return err
	}
	if !bytes.Equal(cross.RawSubjectPublicKeyInfo, next.RawSubjectPublicKeyInfo) || !bytes.Equal(cross.RawSubject, next.RawSubject) {
		return fmt.Errorf("the cross certificate is not for the new CA's subject and key")
	}
	if err := cross.CheckSignatureFrom(old); err != nil {
		return fmt.Errorf("the cross certificate is not signed by the mesh's CA: %v", err)
	}
	return nil
}

func setSetting(tx *sql.Tx, key, value string) error {
	return exec(tx, `INSERT INTO settings (key, value) VALUES (?, ?) ON CONFLICT (key) DO UPDATE SET value = excluded.value`, key, value)
}

// CA reads the mesh's CA and any rotation under way.
func (s *Store) CA(ctx context.Context) (CAStatus, error) {
	kv, err := readSettings(ctx, s.db)
	if err != nil {
		return CAStatus{}, err
	}
	c := CAStatus{Digest: CertDigest(kv["ca_cert"]), RotatedAt: kv["ca_rotated_at"], Since: kv["created_at"]}
	if c.RotatedAt != "" {
		c.Since = c.RotatedAt
	}
	if b, _ := pem.Decode([]byte(kv["ca_cert"])); b != nil {
		if cert, err := x509.ParseCertificate(b.Bytes); err == nil {
			t := cert.NotAfter.UTC()
			c.Expires = &t
		}
	}
	if kv["ca_next_cert"] == "" {
		return c, nil
	}
	c.Next, c.RotationStarted = CertDigest(kv["ca_next_cert"]), kv["ca_rotation_started"]
	nodes, err := readNodes(ctx, s.db)
	if err != nil {
		return c, err
	}
	for _, n := range nodes {
		if n.CertCA == c.Next {
			c.Renewed = append(c.Renewed, n.Name)
		} else {
			c.Waiting = append(c.Waiting, n.Name)
		}
	}
	return c, nil
}

// CAStatus is the mesh's CA as `mesh status` shows it.
type CAStatus struct {
	Digest string `json:"digest"`
	// Since is when this CA became the mesh's (its init, or the end of the
	// rotation that brought it: RotatedAt), Expires when its certificate ends.
	Since     string     `json:"since"`
	RotatedAt string     `json:"rotated_at,omitempty"`
	Expires   *time.Time `json:"expires,omitempty"`
	// Next is the digest of the new CA while a rotation is under way,
	// since RotationStarted; Renewed are the nodes whose certificate it
	// signed already, Waiting those it waits for.
	Next            string   `json:"next,omitempty"`
	RotationStarted string   `json:"rotation_started,omitempty"`
	Renewed         []string `json:"renewed,omitempty"`
	Waiting         []string `json:"waiting,omitempty"`
}

func (c CAStatus) String() string {
	s := "CA " + c.Digest[:min(12, len(c.Digest))]
	if t, err := time.Parse(timeLayout, c.Since); err == nil {
		s += fmt.Sprintf(", %d days old", int(time.Since(t).Hours()/24))
	}
	if c.RotatedAt != "" {
		s += " (rotated " + c.RotatedAt + ")"
	}
	if c.Expires != nil {
		s += ", certificate valid until " + c.Expires.UTC().Format("2006-01-02")
	}
	if c.Next != "" {
		s += fmt.Sprintf("; rotating to %s since %s: %d renewed, waiting for %s", c.Next[:min(12, len(c.Next))], c.RotationStarted, len(c.Renewed), strings.Join(c.Waiting, ", "))
	}
	return s
}
