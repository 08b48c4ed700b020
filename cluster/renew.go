package cluster

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"encoding/pem"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"sync/atomic"
	"time"

	"github.com/hashicorp/raft"

	"mesh/state"
)

// Node certificates last a year (nodeCertLife) and are renewed a third of
// their life before they expire, by the leader (a voter, which holds the CA
// key), without a restart: the new certificate is written, then presented
// by every new connection. Each node says in the state when its certificate
// expires (node.cert), which `mesh status` shows. A certificate that has
// expired is refused like any other that does not verify, so a node that
// was off for most of a year must join again.

// renewDue says whether a certificate should be renewed now.
func renewDue(c *x509.Certificate, now time.Time) bool {
	life := c.NotAfter.Sub(c.NotBefore)
	return c.NotAfter.Sub(now) < life/3
}

// RenewRequest asks the leader for a new certificate for the caller's key.
type RenewRequest struct {
	CSR string `json:"csr"`
}

// RenewReply carries it.
type RenewReply struct {
	Cert string `json:"cert"`
	applyReply
}

// keepCertificate renews this node's certificate when due and keeps the
// state told of its expiry. It looks every tenth of the time left (at
// least every second, at most every hour); a failed renewal is tried again
// sooner.
func (n *Node) keepCertificate(ctx context.Context) {
	for {
		changed := n.store.Changed()
		leaf := n.tls.current().Leaf
		wait := min(max(time.Until(leaf.NotAfter)/10, time.Second), time.Hour)
		if renewDue(leaf, time.Now()) || n.rotationDue(ctx, leaf) {
			if err := n.renew(ctx); err != nil {
				if ctx.Err() != nil {
					return
				}
				n.log.Warn("renewing this node's certificate failed; will try again", "expires", leaf.NotAfter, "err", err)
				wait = min(wait, 5*time.Second)
			}
			leaf = n.tls.current().Leaf
		}
		switch whole, err := n.tellCert(ctx, leaf); {
		case err != nil:
			wait = min(wait, 5*time.Second)
		case !whole: // the leader is not known to apply a key yet
			wait = min(wait, 5*time.Second)
		}
		select {
		case <-ctx.Done():
			return
		case <-changed: // a rotation of the CA may have started
			pause(ctx, 500*time.Millisecond) // at most two looks a second under writes
		case <-time.After(wait):
		}
	}
}

// pause waits d, or until ctx ends.
func pause(ctx context.Context, d time.Duration) {
	select {
	case <-ctx.Done():
	case <-time.After(d):
	}
}

// tellCert records this node's certificate in the state, expiry and key,
// if the state says otherwise. whole is false while a node of the mesh
// cannot apply a key yet (halfway through an upgrade): the expiry is told
// alone, and the key once they can.
func (n *Node) tellCert(ctx context.Context, leaf *x509.Certificate) (whole bool, err error) {
	me, err := n.store.Node(ctx, n.cfg.ID)
	if err != nil {
		return false, err
	}
	key, ca := CertKey(leaf), n.certCA(leaf)
	r := &state.NodeCertRequest{Node: n.cfg.ID, Expires: leaf.NotAfter.UTC(), Key: key, CA: ca}
	if ca != "" && n.canApply(state.NewCommand(r)) != nil {
		r.CA, ca = "", "" // a node of the mesh does not know it yet (an upgrade halfway)
	}
	if me.CertExpires != nil && me.CertExpires.Equal(leaf.NotAfter) && me.CertKey == key && (me.CertCA == ca || ca == "") {
		return true, nil
	}
	pctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	n.WaitLeader(pctx) // which leader appends it decides whether the key may go
	if n.keyMayGo(state.NewCommand(r), "", 0) {
		if _, err := n.Propose(pctx, r); err == nil || !errors.Is(err, state.ErrConflict) {
			return err == nil, err
		}
	}
	// Not every node is known to apply a key yet: the expiry alone, which
	// every node applies.
	r.Key, r.CA = "", ""
	if me.CertExpires != nil && me.CertExpires.Equal(leaf.NotAfter) {
		return false, nil
	}
	_, err = n.Propose(pctx, r)
	return false, err
}

// pinCert records the expiry and key of a node's certificate (PEM) as the
// leader admits it: its peers require that key of it from its first
// connection (a node that joins again comes with a new key). In a mesh
// halfway through an upgrade the key is left out; the node tells it itself
// once every node can apply it (tellCert).
func (n *Node) pinCert(ctx context.Context, name string, format int, certPEM []byte) error {
	c, err := x509.ParseCertificate(pemDER(certPEM))
	if err != nil {
		return fmt.Errorf("read the certificate just signed: %w", err)
	}
	r := &state.NodeCertRequest{Node: name, Expires: c.NotAfter.UTC(), Key: CertKey(c)}
	// A node that joins again replaces the key recorded for it, which every
	// node then applied; it must, or its peers refuse its new certificate.
	was, err := n.store.Node(ctx, name)
	if (err != nil || was.CertKey == "") && !n.keyMayGo(state.NewCommand(r), name, format) {
		r.Key = ""
	}
	_, err = n.Propose(ctx, r)
	return err
}

// renew gets a new certificate for this node's key from the leader (or
// signs it, as the leader), writes it and presents it from now on.
func (n *Node) renew(ctx context.Context) error {
	me, err := n.store.Node(ctx, n.cfg.ID)
	if err != nil {
		return err
	}
	keyPEM, err := os.ReadFile(filepath.Join(n.cfg.TLSDir, KeyFile))
	if err != nil {
		return err
	}
	csrPEM, err := csrFor(keyPEM, n.cfg.ID, me.Address)
	if err != nil {
		return err
	}
	var certPEM []byte
	if n.raft.State() == raft.Leader {
		certPEM, err = n.signRenewal(ctx, n.cfg.ID, csrPEM)
	} else {
		var addr string
		if addr, err = n.leaderAddr(); err == nil {
			cctx, cancel := context.WithTimeout(ctx, 15*time.Second)
			var out RenewReply
			err = n.call(cctx, addr, "/v1/renew", RenewRequest{CSR: string(csrPEM)}, &out)
			cancel()
			if err == nil && out.Error != "" {
				err = errOfKind(out.Kind, out.Error)
			}
			certPEM = []byte(out.Cert)
		}
	}
	if err != nil {
		return err
	}
	// Check it before it replaces anything: for this key, from this CA,
	// for this node. It is written before it is used, so a restart after
	// this point starts with it. It may be of a new CA (a rotation) that
	// this replica has just learnt of.
	if err := n.refreshTrust(ctx); err != nil {
		return err
	}
	cert, err := n.tls.pair(certPEM, keyPEM)
	if err != nil {
		return fmt.Errorf("the renewed certificate does not fit this node's key: %w", err)
	}
	if name, err := n.tls.verifyPeer([]*x509.Certificate{cert.Leaf}); err != nil || name != n.cfg.ID {
		return fmt.Errorf("the renewed certificate is not this node's (%q) from this mesh's CA: %v", name, err)
	}
	if err := writeFileAtomic(filepath.Join(n.cfg.TLSDir, CertFile), certPEM, 0o600); err != nil {
		return fmt.Errorf("write the renewed certificate: %w", err)
	}
	n.tls.cert.Store(cert)
	// A peer checks this node's certificate on each request to its API, as
	// it was at the connection's handshake: calls from now on go over new
	// connections, which present the new one.
	n.peerConns.fresh()
	n.log.Info("renewed this node's certificate", "expires", cert.Leaf.NotAfter.UTC().Format(time.RFC3339))
	return nil
}

// serveRenew (leader) signs a new certificate for the calling node, whose
// current certificate proved who it is.
func (n *Node) serveRenew(w http.ResponseWriter, r *http.Request) {
	name := n.peerName(r)
	var req RenewRequest
	if err := json.NewDecoder(io.LimitReader(r.Body, 1<<20)).Decode(&req); err != nil {
		writeJSON(w, http.StatusBadRequest, applyReply{Error: "bad renewal request: " + err.Error(), Kind: "invalid"})
		return
	}
	if n.raft.State() != raft.Leader {
		writeJSON(w, http.StatusOK, applyReply{Error: notLeaderMsg, Kind: "conflict"})
		return
	}
	cert, err := n.signRenewal(r.Context(), name, []byte(req.CSR))
	if err != nil {
		writeJSON(w, http.StatusOK, applyReply{Error: err.Error(), Kind: kindOf(err)})
		return
	}
	writeJSON(w, http.StatusOK, RenewReply{Cert: string(cert)})
}

// signRenewal signs a certificate for node name at its address in the state.
func (n *Node) signRenewal(ctx context.Context, name string, csrPEM []byte) ([]byte, error) {
	node, err := n.store.Node(ctx, name)
	if err != nil {
		return nil, err
	}
	id, err := n.store.Identity(ctx)
	if err != nil {
		return nil, err
	}
	// While a rotation is under way, renewals are the new CA's.
	ca, err := n.signingCA(id)
	if err != nil {
		return nil, fmt.Errorf("read the mesh CA: %w", err)
	}
	// A renewal is for the key recorded for the node: a certificate for
	// another key would be refused by every peer (joining again is how a
	// node changes its key).
	if csr, err := x509.ParseCertificateRequest(pemDER(csrPEM)); err == nil && node.CertKey != "" && spkiKey(csr.RawSubjectPublicKeyInfo) != node.CertKey {
		return nil, &state.RuleError{Kind: state.ErrInvalid, Msg: fmt.Sprintf("a renewal for %s must be for the key recorded for it; to change a node's key, join it again", name)}
	}
	cert, err := ca.Sign(csrPEM, name, node.Address)
	if err != nil {
		return nil, &state.RuleError{Kind: state.ErrInvalid, Msg: err.Error()}
	}
	n.log.Info("signed a renewed certificate", "name", name)
	return cert, nil
}

// csrFor makes a certificate request for an existing key.
func csrFor(keyPEM []byte, name, address string) ([]byte, error) {
	b, _ := pem.Decode(keyPEM)
	if b == nil {
		return nil, errors.New("this node's key is not PEM")
	}
	key, err := x509.ParseECPrivateKey(b.Bytes)
	if err != nil {
		return nil, err
	}
	return certRequest(key, name, address)
}

// peerTransport carries calls to peers' APIs over a pool of connections
// that fresh replaces, so that after a renewal no call goes over a
// connection made with the old certificate (which peers refuse once it has
// expired). Calls in flight finish on the old pool, which is then closed.
type peerTransport struct {
	cfg *tls.Config
	// expect checks that the peer of a connection made to an address is
	// the node the state has there (nodeTLS.isNodeAt): the certificate's
	// check takes any node of the mesh, and a member that took another's
	// address (on a shared network, or a machine given it) would otherwise
	// be sent what is meant for that node: a write forwarded to the
	// leader with the secret it sets, a joiner's request with its token,
	// an exec session's input. Nil checks nothing more.
	expect func(c *tls.Conn, address string) error
	cur    atomic.Pointer[http.Transport]
}

func (p *peerTransport) fresh() {
	t := &http.Transport{DialTLSContext: p.dialTLS, IdleConnTimeout: time.Minute}
	if old := p.cur.Swap(t); old != nil {
		old.CloseIdleConnections()
		time.AfterFunc(20*time.Second, old.CloseIdleConnections) // after the calls in flight (15 s at most)
	}
}

// dialTLS dials a peer and makes the handshake, each within the 2 s the
// transport gave them before; every failure is a dial's (net.OpError), so
// that a caller knows the request was not sent (Node.call).
func (p *peerTransport) dialTLS(ctx context.Context, network, address string) (net.Conn, error) {
	c, err := p.handshake(ctx, network, address)
	if op := (*net.OpError)(nil); err != nil && !(errors.As(err, &op) && op.Op == "dial") {
		err = &net.OpError{Op: "dial", Net: network, Err: err} // the handshake's, or the name's check
	}
	if err != nil {
		return nil, err
	}
	return c, nil
}

func (p *peerTransport) handshake(ctx context.Context, network, address string) (*tls.Conn, error) {
	raw, err := (&net.Dialer{Timeout: 2 * time.Second}).DialContext(ctx, network, address)
	if err != nil {
		return nil, err
	}
	hctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	c := tls.Client(raw, p.cfg)
	if err := c.HandshakeContext(hctx); err != nil {
		raw.Close()
		return nil, err
	}
	if p.expect != nil {
		if err := p.expect(c, address); err != nil {
			c.Close()
			return nil, err
		}
	}
	return c, nil
}

func (p *peerTransport) RoundTrip(r *http.Request) (*http.Response, error) {
	return p.cur.Load().RoundTrip(r)
}

// CloseIdleConnections closes the current pool's idle connections.
func (p *peerTransport) CloseIdleConnections() { p.cur.Load().CloseIdleConnections() }
