package cluster

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/netip"
	"strconv"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/hashicorp/raft"

	"mesh/internal/connlimit"
	"mesh/state"
)

// One TCP port per node carries both Raft and the node-to-node API, told
// apart by the TLS ALPN protocol. Both are mutual TLS with certificates from
// the mesh CA, and a peer must be a current node of the mesh, so a removed
// node's certificate is refused. The one exception is the join endpoint of
// the API, which a joining node reaches before it has a certificate: it
// proves the token's secret instead, and pinned the CA itself.
const (
	alpnRaft = "mesh-raft"
	alpnAPI  = "http/1.1" // net/http serves only ALPN protocols it knows
)

// mux accepts TLS connections and hands each to Raft or the API.
type mux struct {
	ln     net.Listener
	tls    *nodeTLS
	member func(name string, cert *x509.Certificate) bool
	raftCh chan net.Conn
	api    *chanListener
	guests *guests
	// shaking is the connections in their handshake; cfg is the TLS
	// server's configuration.
	shaking *handshakes
	cfg     *tls.Config
	// refusedRaft throttles the warning for a Raft connection refused:
	// anybody reaching the port can offer Raft's protocol without a
	// node's certificate, as often as it can handshake.
	refusedRaft connlimit.Throttle
	// acceptFailed throttles the warning for a failed accept.
	acceptFailed connlimit.Throttle
	log          *slog.Logger
	once         sync.Once
	closing      chan struct{}
	// loops are the mux's goroutines (serve, each route, watchLeader,
	// keepRechecking): Close waits for them, since they read the replica,
	// which closes after.
	loops sync.WaitGroup
	// raftConns are the Raft connections handed to Raft, each with the
	// certificate its peer showed: checked again when the replica or the
	// trust changes (recheck), since Raft itself never asks who speaks.
	raftMu    sync.Mutex
	raftConns map[*raftConn]struct{}
	// raft is this node's Raft once started (mayLead reads its
	// configuration and its leader); led is when this node last knew a
	// leader that is a voter (ns since start), kept by watchLeader.
	raft atomic.Pointer[raft.Raft]
	led  atomic.Int64
	// start is when the mux was made: led counts from it, on the
	// monotonic clock (a wall clock stepped would shorten or stretch the
	// grace).
	start time.Time
	// emptyReplica says whether this node's replica holds no node yet
	// (set by the node; nil in tests of the mux alone).
	emptyReplica func() bool
	// caughtUp says whether this node's replica names this node with its
	// own certificate's key: it holds the entry of this node's join, and
	// so every node of the mesh then (set by the node; nil: it does).
	caughtUp func() bool
}

// sinceLed is how long ago this node last knew a voter leading.
func (m *mux) sinceLed() time.Duration {
	return time.Since(m.start) - time.Duration(m.led.Load())
}

// markLed records that this node knows a voter leading now.
func (m *mux) markLed() { m.led.Store(int64(time.Since(m.start))) }

// onCAAlone says whether a Raft connection taken now is taken on the
// mesh CA's word alone: this node's replica, or its Raft configuration,
// holds nobody yet (a node that just joined). recheck leaves such a
// connection to its certificate's checks: the replica that fills from it
// names its peer only once it has caught up to that peer's own join, and
// a joiner whose leader joined after the first node lost the one
// connection it caught up by (a review saw one stay at a third of the log).
func (m *mux) onCAAlone() bool {
	if m.emptyReplica != nil && m.emptyReplica() {
		return true
	}
	r := m.raft.Load()
	return r != nil && len(r.GetConfiguration().Configuration().Servers) == 0
}

// leaderlessGrace is how long a node knows no leader before it takes Raft
// connections from nodes its configuration names as non-voters.
const leaderlessGrace = 30 * time.Second

// mayLead says whether a Raft connection from node name is taken. Only a
// leader or a candidate opens one, and Raft takes an AppendEntries of a
// newer term from any sender (it never asks whether the sender is a
// voter): taken from a non-voter, one message would depose the leader and
// write into the receiver's log what the non-voter likes, round the
// refusal of the peer API (speaksForItself). So a connection is taken from
// a voter of this node's configuration only, but for a configuration that
// may be stale: one that is empty (a node that just joined takes the first
// leader the CA vouches for), or a node that has known no voter leading
// for leaderlessGrace (one cut off while a non-voter was promoted, which
// now leads, would otherwise never catch up). What that leaves: while the
// voters have had no leader for that long (a majority down), a non-voter
// could lead the rest.
func (m *mux) mayLead(name string) bool {
	r := m.raft.Load()
	if r == nil {
		return true // not started: watchLeader's first look rechecks
	}
	cfg := r.GetConfiguration().Configuration()
	if len(cfg.Servers) == 0 || isVoter(cfg, name) {
		return true
	}
	return m.sinceLed() > leaderlessGrace
}

func isVoter(cfg raft.Configuration, name string) bool {
	for _, s := range cfg.Servers {
		if string(s.ID) == name {
			return s.Suffrage == raft.Voter
		}
	}
	return false
}

// watchLeader keeps led, once a second, and rechecks the Raft connections
// when a voter is seen leading again (a non-voter's connection taken while
// none led is closed then), until the mux closes.
func (m *mux) watchLeader(r *raft.Raft) {
	m.markLed() // a node that starts waits the grace too
	m.raft.Store(r)
	m.recheck()
	t := time.NewTicker(time.Second)
	defer t.Stop()
	wasLed := true
	for {
		select {
		case <-m.closing:
			return
		case <-t.C:
		}
		_, id := r.LeaderWithID()
		led := id != "" && isVoter(r.GetConfiguration().Configuration(), string(id))
		if led {
			m.markLed()
			if !wasLed {
				m.recheck()
			}
		}
		wasLed = led
	}
}

// raftConn is a Raft connection from a peer that was a node of the mesh
// when it connected.
type raftConn struct {
	*tls.Conn
	m     *mux
	name  string
	certs []*x509.Certificate
	// vouched: taken on the CA's word alone (onCAAlone).
	vouched bool
}

func (c *raftConn) Close() error {
	c.m.raftMu.Lock()
	delete(c.m.raftConns, c)
	c.m.raftMu.Unlock()
	return c.Conn.Close()
}

// recheck closes every Raft connection whose peer is no longer what it had
// to be to connect: a node of the replica with the key recorded for it,
// and a certificate the trust verifies (a removed node, a node that joined
// again with another key, an expired certificate, a CA a rotation ended).
// Raft keeps a connection for as long as its peer likes and takes any RPC
// over it from anyone, so a check at the handshake alone would leave a
// removed node able to depose the leader and write into its log. It
// returns when the soonest certificate still held expires.
func (m *mux) recheck() time.Time {
	// A connection the CA vouched for is left to its certificate's
	// checks until the replica holds this node's join (caughtUp), and
	// checked as any other from then on: taken before the real leader
	// came, by a removed node whose certificate is still valid, it would
	// otherwise be kept for as long as its peer liked.
	early := m.caughtUp != nil && !m.caughtUp()
	m.raftMu.Lock()
	var gone []*raftConn
	var soonest time.Time
	for c := range m.raftConns {
		name, err := m.tls.verifyPeer(c.certs)
		if err != nil || name != c.name || !(c.vouched && early) && (!m.member(name, c.certs[0]) || !m.mayLead(name)) {
			gone = append(gone, c)
			delete(m.raftConns, c)
			continue
		}
		if soonest.IsZero() || c.certs[0].NotAfter.Before(soonest) {
			soonest = c.certs[0].NotAfter
		}
	}
	m.raftMu.Unlock()
	for _, c := range gone {
		m.log.Warn("closed a raft connection: its peer is no longer a node of the mesh with that certificate, or a voter", "from", c.RemoteAddr(), "peer", c.name)
		c.Conn.Close()
	}
	return soonest
}

// keepRechecking runs recheck at every change of the replica (changed),
// and when a certificate held expires, until the mux closes.
func (m *mux) keepRechecking(changed func() <-chan struct{}) {
	for {
		ch := changed()
		wait := time.Minute
		if soonest := m.recheck(); !soonest.IsZero() {
			wait = min(wait, max(time.Until(soonest)+time.Second, time.Second))
		}
		select {
		case <-m.closing:
			return
		case <-ch:
			select { // at most five looks a second under writes
			case <-m.closing:
				return
			case <-time.After(200 * time.Millisecond):
			}
		case <-time.After(wait):
		}
	}
}

// newMux serves the node port on ln; isNode says whether an address is a
// node's (handshakes.go).
func newMux(ln net.Listener, t *nodeTLS, member func(string, *x509.Certificate) bool, isNode func(netip.Addr) bool, log *slog.Logger) *mux {
	m := &mux{tls: t, member: member, raftCh: make(chan net.Conn, 16), log: log, closing: make(chan struct{}), start: time.Now(),
		guests: newGuests(guestsInAll, guestsPerSource), shaking: newHandshakes(handshakesInAll, handshakesPerSource, handshakesPerNode, isNode)}
	m.api = &chanListener{ch: make(chan net.Conn, 16), addr: ln.Addr(), closing: m.closing}
	m.ln, m.cfg = ln, m.serverConfig()
	m.run(m.serve)
	return m
}

// run runs f as one of the mux's goroutines: Close waits for it.
func (m *mux) run(f func()) {
	m.loops.Add(1)
	go func() {
		defer m.loops.Done()
		f()
	}()
}

func (m *mux) serverConfig() *tls.Config {
	return &tls.Config{
		MinVersion:     tls.VersionTLS13,
		GetCertificate: func(*tls.ClientHelloInfo) (*tls.Certificate, error) { return m.tls.current(), nil },
		ClientAuth:     tls.RequestClientCert,
		NextProtos:     []string{alpnRaft, alpnAPI},
	}
}

func (m *mux) serve() {
	var wait time.Duration
	for {
		c, err := m.ln.Accept()
		if err != nil {
			select {
			case <-m.closing:
				return
			default:
			}
			if errors.Is(err, net.ErrClosed) {
				return
			}
			// Out of descriptors, say: wait before the next try, as
			// net/http's server does (5 ms, doubling to a second), rather
			// than spin on the error.
			wait = min(max(2*wait, 5*time.Millisecond), time.Second)
			if m.acceptFailed.Now() {
				m.log.Warn("accept on the node port failed; trying again (logged once a minute at most)", "err", err, "wait", wait)
			}
			select {
			case <-m.closing:
				return
			case <-time.After(wait):
			}
			continue
		}
		wait = 0
		// The handshake's deadline is set before the connection is counted:
		// one pushed out later gets a deadline of now, which the route's
		// goroutine must not put back.
		c.SetDeadline(time.Now().Add(10 * time.Second))
		e, out := m.shaking.begin(c)
		select {
		case <-m.closing: // after Close's endAll: end this one's handshake too
			c.SetDeadline(time.Now())
		default:
		}
		if len(out) > 0 && m.shaking.evicted.Now() {
			m.log.Warn("ended a connection to the node port still in its TLS handshake: too many in their handshake (logged once a minute at most)",
				"from", out[0], "max_per_source", m.shaking.perSource, "max", m.shaking.total, "max_per_node", m.shaking.perNode)
		}
		tc := tls.Server(c, m.cfg)
		m.run(func() { m.route(tc, e) })
	}
}

func (m *mux) route(c *tls.Conn, e *handshake) {
	err := c.Handshake()
	m.shaking.end(e)
	if err != nil {
		c.Close()
		return
	}
	c.SetDeadline(time.Time{})
	st := c.ConnectionState()
	switch st.NegotiatedProtocol {
	case alpnRaft:
		name, err := m.tls.verifyPeer(st.PeerCertificates)
		var rc *raftConn
		if err == nil {
			// Held before the check: a removal after it is rechecked.
			rc = &raftConn{Conn: c, m: m, name: name, certs: st.PeerCertificates, vouched: m.onCAAlone()}
			m.raftMu.Lock()
			if m.raftConns == nil {
				m.raftConns = map[*raftConn]struct{}{}
			}
			m.raftConns[rc] = struct{}{}
			m.raftMu.Unlock()
		}
		if err == nil && !m.mayLead(name) {
			err = fmt.Errorf("%s is no voter of this node's Raft configuration, and only a voter leads", name)
		}
		if err != nil || !m.member(name, st.PeerCertificates[0]) {
			if m.refusedRaft.Now() {
				m.log.Warn("refused a raft connection (logged once a minute at most)", "from", c.RemoteAddr(), "peer", name, "err", err)
			}
			if rc != nil {
				rc.Close()
			} else {
				c.Close()
			}
			return
		}
		select {
		case m.raftCh <- rc:
		case <-m.closing:
			rc.Close()
		}
	default:
		if !m.fromNode(st) {
			if open, ok := m.guests.admit(c); !ok {
				if m.guests.WarnNow() {
					m.log.Warn("closed a connection to the node port without a node's certificate: too many open (logged once a minute at most)",
						"from", c.RemoteAddr(), "open_from_it", open, "max_per_source", m.guests.PerSource, "max", m.guests.Total)
				}
				c.Close()
				return
			}
		}
		select {
		case m.api.ch <- c:
		case <-m.closing:
			c.Close()
		}
	}
}

// fromNode says whether the peer of a connection showed the certificate of
// a current node of the mesh.
func (m *mux) fromNode(st tls.ConnectionState) bool {
	if len(st.PeerCertificates) == 0 {
		return false
	}
	name, err := m.tls.verifyPeer(st.PeerCertificates)
	return err == nil && m.member(name, st.PeerCertificates[0])
}

// guestKey marks the context of a guest's connection (connContext).
type guestKey struct{}

// connContext is the API server's ConnContext: it marks a guest's
// connection, which the peer API closes after each answer.
func (m *mux) connContext(ctx context.Context, c net.Conn) context.Context {
	if m.guests.holds(c) {
		return context.WithValue(ctx, guestKey{}, true)
	}
	return ctx
}

// guestConn says ctx is a request's on a guest's connection.
func guestConn(ctx context.Context) bool {
	g, _ := ctx.Value(guestKey{}).(bool)
	return g
}

// connState is the API server's ConnState: a guest's place is given back
// when its connection ends.
func (m *mux) connState(c net.Conn, s http.ConnState) {
	if s == http.StateClosed || s == http.StateHijacked {
		m.guests.gone(c)
	}
}

// Close stops the node port and returns once its goroutines have ended:
// those in a handshake are ended at once, not at their deadline.
func (m *mux) Close() error {
	m.once.Do(func() { close(m.closing) })
	err := m.ln.Close()
	m.shaking.endAll()
	m.loops.Wait()
	return err
}

// clientConfig dials a peer of the mesh with this node's certificate.
func (t *nodeTLS) clientConfig(proto string) *tls.Config {
	return &tls.Config{
		MinVersion:           tls.VersionTLS13,
		GetClientCertificate: func(*tls.CertificateRequestInfo) (*tls.Certificate, error) { return t.current(), nil },
		NextProtos:           []string{proto},
		InsecureSkipVerify:   true, // the chain is checked against the mesh CA below, not a host name
		VerifyPeerCertificate: func(raw [][]byte, _ [][]*x509.Certificate) error {
			certs, err := parseCerts(raw)
			if err != nil {
				return err
			}
			name, err := t.verifyPeer(certs)
			if err == nil && t.peerOK != nil {
				err = t.peerOK(name, certs[0])
			}
			return err
		},
	}
}

func parseCerts(raw [][]byte) ([]*x509.Certificate, error) {
	var out []*x509.Certificate
	for _, r := range raw {
		c, err := x509.ParseCertificate(r)
		if err != nil {
			return nil, err
		}
		out = append(out, c)
	}
	return out, nil
}

// streamLayer is Raft's view of the mux.
type streamLayer struct {
	m         *mux
	advertise net.Addr
	// stop is closed when the node shuts down (Node.stop).
	stop <-chan struct{}
	// known says whether an address is still a node's of the state: a
	// refused dial waits only for those (a node that joined again under
	// another port is dialled there at Raft's next try).
	known func(address string) bool
	// nodeAt is the node the state has at address ("" when none, or the
	// replica is empty): a peer that answers there must be that node.
	nodeAt func(address string) string
}

// knownPeer says whether address is the Raft address of a node of store's
// state (true when that cannot be told: an unread state, a node without a
// recorded port).
func knownPeer(store *state.Store) func(string) bool {
	return func(address string) bool {
		nodes, err := store.Nodes(context.Background())
		if err != nil || len(nodes) == 0 {
			return true
		}
		for _, nd := range nodes {
			if nd.Port == 0 || net.JoinHostPort(nd.Address, strconv.Itoa(nd.Port)) == address {
				return true
			}
		}
		return false
	}
}

var _ raft.StreamLayer = (*streamLayer)(nil)

func (s *streamLayer) Accept() (net.Conn, error) {
	select {
	case c := <-s.m.raftCh:
		return c, nil
	case <-s.m.closing:
		return nil, net.ErrClosed
	}
}

func (s *streamLayer) Close() error { return s.m.Close() }
func (s *streamLayer) Addr() net.Addr {
	if s.advertise != nil {
		return s.advertise
	}
	return s.m.ln.Addr()
}

// Dial connects to a peer. A peer that refuses the connection (its agent
// is restarting, or down) is dialled again every dialRetry until timeout,
// rather than failed at once: Raft backs off a follower's replication after
// each failure (up to 10 s between tries, after a few seconds of failing
// fast), and a node restarted after a kill -9 then waited that long to be
// caught up (issue "Robustness", item 2). Waiting here, a failure costs the
// whole timeout, so the backoff stays short and a peer that comes back is
// reached within dialRetry.
func (s *streamLayer) Dial(address raft.ServerAddress, timeout time.Duration) (net.Conn, error) {
	deadline := time.Now().Add(timeout)
	for {
		d := &net.Dialer{Deadline: deadline}
		c, err := tls.DialWithDialer(d, "tcp", string(address), s.m.tls.clientConfig(alpnRaft))
		if err == nil {
			if err := s.isExpected(c, string(address)); err != nil {
				c.Close()
				return nil, err
			}
			return c, nil
		}
		if !dialWaits.Load() || !errors.Is(err, syscall.ECONNREFUSED) || time.Until(deadline) < dialRetry || (s.known != nil && !s.known(string(address))) {
			return nil, fmt.Errorf("dial raft peer %s: %w", address, err)
		}
		select {
		case <-s.stop: // the node is shutting down: Raft waits for this
			return nil, fmt.Errorf("dial raft peer %s: %w", address, err)
		case <-time.After(dialRetry):
		}
	}
}

// isExpected checks that the peer of c, dialled at address, is the node
// the state has there. The client's check (nodeTLS.clientConfig) takes any
// node of the mesh with its recorded key; a member that took another
// node's address (on a shared network, or a machine given it) would
// otherwise answer Raft in its place, and acknowledge entries it never
// kept.
func (s *streamLayer) isExpected(c *tls.Conn, address string) error {
	if err := s.m.tls.isNodeAt(s.nodeAt, c, address); err != nil {
		return fmt.Errorf("dial raft peer %s: %w", address, err)
	}
	return nil
}

// isNodeAt checks that the peer of c, dialled at address, is the node
// nodeAt says the state has there (any node of the mesh when it has none
// there, or nodeAt is nil).
func (t *nodeTLS) isNodeAt(nodeAt func(string) string, c *tls.Conn, address string) error {
	if nodeAt == nil {
		return nil
	}
	want := nodeAt(address)
	if want == "" {
		return nil
	}
	got, err := t.verifyPeer(c.ConnectionState().PeerCertificates)
	if err == nil && got != want {
		err = fmt.Errorf("the peer at %s answered as %s, not as %s, the node there", address, got, want)
	}
	return err
}

// nodeAt is streamLayer.nodeAt of the store's nodes.
func nodeAt(store *state.Store) func(string) string {
	return func(address string) string {
		nodes, err := store.Nodes(context.Background())
		if err != nil {
			return ""
		}
		for _, nd := range nodes {
			if nd.Port != 0 && net.JoinHostPort(nd.Address, strconv.Itoa(nd.Port)) == address {
				return nd.Name
			}
		}
		return ""
	}
}

// dialRetry is how often a refusing peer is dialled again; dialWaits is
// off only in the benchmark that measures Raft's own behaviour.
const dialRetry = 100 * time.Millisecond

var dialWaits atomic.Bool

func init() { dialWaits.Store(true) }

// chanListener is a net.Listener fed by the mux, for the API's http.Server.
type chanListener struct {
	ch      chan net.Conn
	addr    net.Addr
	closing chan struct{}
}

func (l *chanListener) Accept() (net.Conn, error) {
	select {
	case c := <-l.ch:
		return c, nil
	case <-l.closing:
		return nil, net.ErrClosed
	}
}
func (l *chanListener) Close() error   { return nil }
func (l *chanListener) Addr() net.Addr { return l.addr }

// Connections to the node port without the certificate of a current node
// are guests: a machine joining, the install line fetching the CA and the
// binary, or anyone at all, since every container can reach the port. At
// most guestsPerSource from one address and guestsInAll in all are open at
// once; past that a guest is closed once its handshake is done, so a
// container cannot take the agent's descriptors by opening connections and
// keeping them. Nodes of the mesh are never counted: a container whose
// traffic leaves its node with the node's address cannot crowd that node out.
const (
	guestsPerSource = 16
	guestsInAll     = 128
)

// guests are the node port's connections without a node's certificate.
type guests struct {
	*connlimit.Bounds
	mu    sync.Mutex
	conns map[net.Conn]netip.Addr
}

func newGuests(total, perSource int) *guests {
	return &guests{Bounds: connlimit.NewByNetwork(total, perSource), conns: map[net.Conn]netip.Addr{}}
}

// admit counts c in if the bounds allow it; it returns how many its source
// had open.
func (g *guests) admit(c net.Conn) (int, bool) {
	src := connlimit.Source(c)
	g.mu.Lock()
	defer g.mu.Unlock()
	open, ok := g.Take(src)
	if ok {
		g.conns[c] = src
	}
	return open, ok
}

// holds says c has a guest's place.
func (g *guests) holds(c net.Conn) bool {
	g.mu.Lock()
	defer g.mu.Unlock()
	_, ok := g.conns[c]
	return ok
}

// gone gives c's place back, if it had one.
func (g *guests) gone(c net.Conn) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if src, ok := g.conns[c]; ok {
		delete(g.conns, c)
		g.Give(src)
	}
}
