package dnsd

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/netip"
	"runtime"
	"slices"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/miekg/dns"
	"golang.org/x/net/ipv4"
	"golang.org/x/net/ipv6"
	"golang.org/x/sys/unix"

	"mesh/internal/connlimit"
)

// ForwardTimeout bounds one upstream exchange.
const ForwardTimeout = 2 * time.Second

// ForwardBudget bounds a forwarded query as a whole, whatever the number
// of upstreams (a client has given up on it by then).
const ForwardBudget = 4 * time.Second

// DefaultMaxForwarding is Config.MaxForwarding's default.
const DefaultMaxForwarding = 512

// Config is how a Server runs.
type Config struct {
	// Addr is the one address:port to bind, UDP and TCP. Never a wildcard:
	// a wildcard :53 socket silently breaks aardvark-dns (ENVIRONMENT.md §2).
	Addr string
	// Upstreams are host:port resolvers for names that are not the mesh's.
	Upstreams []string
	// TTL of the mesh's answers, seconds; 0 means DefaultTTL.
	TTL uint32
	// Allow lists the sources that may query, besides loopback and Addr's own
	// IP (the source rootless containers arrive from).
	Allow []netip.Prefix
	// Refresh, when set, reads the allowed sources anew. A query from a
	// source not allowed calls it (at most once a second, one at a time)
	// before it is refused, so a network created since the last refresh
	// may ask at once. It asks Podman, which may be slow or hung, so it
	// never runs where UDP queries are read: anybody who can reach the
	// address can send a query from a source not allowed.
	Refresh func() []netip.Prefix
	// MaxForwarding caps the queries being forwarded upstream at once (each
	// holds a socket while it waits); past it a query gets SERVFAIL at once,
	// so a flood of names the upstream never answers cannot exhaust the
	// agent's descriptors. 0 means DefaultMaxForwarding. One source holds
	// at most a quarter of them (rootless containers, which all arrive
	// from Addr's IP, share that quarter): a container asking names of a
	// domain that never answers took every slot, and every other
	// container's lookups outside the mesh got SERVFAIL.
	MaxForwarding int
	// AfterFlood, when set, is called once a flood is over: a few seconds
	// after the last query turned away at the MaxForwarding cap. The agent
	// gives the memory the flood took back to the system there.
	AfterFlood func()
	// MaxTCP and MaxTCPPerSource bound the TCP connections open at once, in
	// all and from one source; a connection past either is closed at once.
	// Sources that may not query have places of their own (tcpLimiter).
	// 0 means DefaultMaxTCP and DefaultMaxTCPPerSource.
	MaxTCP, MaxTCPPerSource int
	// Observe, when set, is told of every answered query: its rcode,
	// whether it went upstream, and how long answering took.
	Observe func(rcode int, forwarded bool, took time.Duration)
	// Sockets, when set, are already bound to Addr (by a helper that may
	// bind port 53 where this process may not); Start serves on them.
	Sockets *Sockets
	Logger  *slog.Logger
}

// Sockets are a resolver's bound sockets: UDP (one or more, SO_REUSEPORT)
// and TCP.
type Sockets struct {
	UDP []net.PacketConn
	TCP net.Listener
}

// Server answers DNS from the current Index.
type Server struct {
	cfg   Config
	index atomic.Pointer[Index]
	allow atomic.Pointer[[]netip.Prefix]
	// refreshed is when Refresh last began (unix nanoseconds); refreshing
	// says one is running (never two at once: each is a call to Podman).
	refreshed  atomic.Int64
	refreshing atomic.Bool
	self       netip.Addr
	log        *slog.Logger
	udp        []*net.UDPConn
	tcp        *dns.Server
	done       chan struct{}
	// forwarding counts the queries being forwarded, in all and by source;
	// overLogged is when a cap was last reported (unix nanoseconds).
	forwarding *connlimit.Bounds
	overLogged atomic.Int64
	floodOver  time.Duration
	// exchange asks one upstream; tests replace it.
	exchange func(ctx context.Context, m *dns.Msg, upstream, network string) (*dns.Msg, error)
}

// New makes a server with an empty index for domain.
func New(cfg Config, domain string) (*Server, error) {
	ap, err := netip.ParseAddrPort(cfg.Addr)
	if err != nil {
		return nil, fmt.Errorf("resolver address %q: want IP:PORT: %w", cfg.Addr, err)
	}
	if ap.Addr().IsUnspecified() {
		return nil, fmt.Errorf("resolver address %q is a wildcard; bind one specific address (a wildcard :53 breaks Podman's aardvark-dns)", cfg.Addr)
	}
	if cfg.TTL == 0 {
		cfg.TTL = DefaultTTL
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.NewTextHandler(io.Discard, nil))
	}
	if cfg.MaxTCP <= 0 {
		cfg.MaxTCP = DefaultMaxTCP
	}
	if cfg.MaxTCPPerSource <= 0 {
		cfg.MaxTCPPerSource = DefaultMaxTCPPerSource
	}
	s := &Server{cfg: cfg, self: ap.Addr(), log: cfg.Logger.With("component", "dnsd"), floodOver: floodOver}
	s.SetIndex(NewIndex(domain, nil, 0))
	if cfg.MaxForwarding <= 0 {
		cfg.MaxForwarding = DefaultMaxForwarding
		s.cfg.MaxForwarding = cfg.MaxForwarding
	}
	s.forwarding = connlimit.New(cfg.MaxForwarding, max(1, cfg.MaxForwarding/4))
	s.SetAllow(cfg.Allow)
	s.exchange = func(ctx context.Context, m *dns.Msg, upstream, network string) (*dns.Msg, error) {
		c := &dns.Client{Net: network, Timeout: ForwardTimeout}
		r, _, err := c.ExchangeContext(ctx, m, upstream)
		return r, err
	}
	return s, nil
}

// SetIndex swaps the index in; queries in flight keep the one they started with.
func (s *Server) SetIndex(ix *Index) { s.index.Store(ix.forServer(s.self, s.cfg.TTL)) }

// Start binds UDP and TCP on the configured address and serves in the
// background. It returns once the sockets are bound. UDP gets one socket per
// CPU (SO_REUSEPORT), so reads do not queue behind one reader.
func (s *Server) Start() (string, error) {
	if so := s.cfg.Sockets; so != nil {
		if len(so.UDP) == 0 || so.TCP == nil {
			return "", errors.New("resolver: the sockets given lack UDP or TCP")
		}
		bound := so.UDP[0].LocalAddr().String()
		if bound != so.TCP.Addr().String() || bound != s.cfg.Addr {
			return "", fmt.Errorf("resolver: the sockets given are bound to %s and %s, not %s", bound, so.TCP.Addr(), s.cfg.Addr)
		}
		return s.serve(bound, so.UDP, so.TCP), nil
	}
	// With port 0 (tests), UDP picks a free port that TCP may find taken
	// by another process's connection; pick again rather than fail.
	_, port, _ := net.SplitHostPort(s.cfg.Addr)
	for attempt := 1; ; attempt++ {
		bound, conns, l, err := bindBoth(s.cfg.Addr)
		if err == nil {
			return s.serve(bound, conns, l), nil
		}
		if port != "0" || !errors.Is(err, syscall.EADDRINUSE) || attempt == 20 {
			return "", err
		}
	}
}

// listenTCP is net.Listen; tests make it fail.
var listenTCP = net.Listen

// bindBoth binds UDP on addr (one socket per CPU) and TCP on the port UDP got.
func bindBoth(addr string) (string, []net.PacketConn, net.Listener, error) {
	lc := net.ListenConfig{Control: func(network, address string, c syscall.RawConn) error {
		var serr error
		c.Control(func(fd uintptr) { serr = syscall.SetsockoptInt(int(fd), syscall.SOL_SOCKET, unix.SO_REUSEPORT, 1) })
		return serr
	}}
	pc, err := lc.ListenPacket(context.Background(), "udp", addr)
	if err != nil {
		return "", nil, nil, fmt.Errorf("resolver: listen udp %s: %w", addr, err)
	}
	bound := pc.LocalAddr().String()
	conns := []net.PacketConn{pc}
	for i := 1; i < runtime.GOMAXPROCS(0); i++ {
		more, err := lc.ListenPacket(context.Background(), "udp", bound)
		if err != nil {
			break // one socket still serves
		}
		conns = append(conns, more)
	}
	l, err := listenTCP("tcp", bound)
	if err != nil {
		for _, c := range conns {
			c.Close()
		}
		return "", nil, nil, fmt.Errorf("resolver: listen tcp %s: %w", bound, err)
	}
	return bound, conns, l, nil
}

// serve serves on bound sockets.
func (s *Server) serve(bound string, conns []net.PacketConn, l net.Listener) string {
	s.done = make(chan struct{})
	for _, c := range conns {
		u := c.(*net.UDPConn)
		s.udp = append(s.udp, u)
		go s.serveUDP(u)
	}
	limited := tcpLimit(l, s.cfg.MaxTCP, s.cfg.MaxTCPPerSource, s.allowedNow, s.log)
	s.tcp = &dns.Server{Listener: limited, Handler: s, ReadTimeout: 5 * time.Second}
	go s.tcp.ActivateAndServe()
	if s.cfg.AfterFlood != nil {
		go s.watchFloods()
	}
	s.log.Info("resolver listening", "addr", bound, "udp_sockets", len(conns), "upstreams", s.cfg.Upstreams, "given", s.cfg.Sockets != nil)
	return bound
}

// Close stops serving.
func (s *Server) Close() error {
	var errs []error
	if s.done != nil {
		close(s.done)
	}
	for _, u := range s.udp {
		errs = append(errs, u.Close())
	}
	if s.tcp != nil {
		errs = append(errs, s.tcp.Shutdown())
	}
	return errors.Join(errs...)
}

// batch is how many datagrams one recvmmsg/sendmmsg moves.
const batch = 32

// maxQuery is the longest query read over UDP: the payload size the resolver
// advertises in its EDNS answers. A longer datagram is dropped.
const maxQuery = 4096

// batchConn is what ipv4.PacketConn and ipv6.PacketConn share.
type batchConn interface {
	ReadBatch(ms []ipv4.Message, flags int) (int, error)
	WriteBatch(ms []ipv4.Message, flags int) (int, error)
}

// serveUDP answers one socket's queries, a batch of datagrams per system call
// each way. Local answers are made inline, the common ones by the fast path
// without unpacking anything (fast.go); a query to forward gets its own
// goroutine, so a slow upstream never holds up the mesh's names.
func (s *Server) serveUDP(conn *net.UDPConn) {
	var bc batchConn = ipv4.NewPacketConn(conn)
	if s.self.Is6() {
		bc = ipv6.NewPacketConn(conn)
	}
	in := make([]ipv4.Message, batch)
	out := make([]ipv4.Message, batch)
	bufs := make([][]byte, batch)
	for i := range in {
		in[i].Buffers = [][]byte{make([]byte, maxQuery)}
		bufs[i] = make([]byte, 0, maxQuery) // answers up to 4 KB need no allocation
		out[i].Buffers = [][]byte{nil}
	}
	for {
		n, err := bc.ReadBatch(in, 0)
		if err != nil {
			select {
			case <-s.done:
				return
			default:
			}
			if errors.Is(err, net.ErrClosed) {
				return
			}
			continue
		}
		k := 0
		for i := 0; i < n; i++ {
			src, ok := in[i].Addr.(*net.UDPAddr)
			if !ok || in[i].Flags&unix.MSG_TRUNC != 0 {
				continue // longer than we read: not answered from a part
			}
			start := s.clock()
			if b, rcode, ok := s.fastReply(s.index.Load(), in[i].Buffers[0][:in[i].N], src.AddrPort().Addr().Unmap(), bufs[k]); ok {
				if s.cfg.Observe != nil {
					s.cfg.Observe(rcode, false, time.Since(start))
				}
				out[k].Buffers[0], out[k].Addr = b, src
				k++
				continue
			}
			if !plainQuery(in[i].Buffers[0][:in[i].N]) {
				continue // not one a resolver takes: no answer
			}
			req := new(dns.Msg)
			if req.Unpack(in[i].Buffers[0][:in[i].N]) != nil {
				continue // not a DNS message: no answer
			}
			from := src.AddrPort().Addr().Unmap()
			if !s.allowedNow(from) && s.claimRefresh() {
				// Refresh asks Podman, which may be slow or hung: never
				// here, where every container's next query waits. The
				// query is answered once the refresh is over.
				go func() {
					s.refresh()
					if r := s.answer(context.Background(), req, from); r != nil {
						if b, err := udpReply(r, req, nil); err == nil {
							conn.WriteToUDP(b, src)
						}
					}
				}()
				continue
			}
			resp, forward := s.local(req, from)
			if forward && s.takeForwardSlot(req, from) {
				go func() {
					r := s.forwardHolding(context.Background(), req, from)
					s.observe(r, true, start)
					if b, err := udpReply(r, req, nil); err == nil {
						conn.WriteToUDP(b, src)
					}
				}()
				continue
			}
			if forward {
				// Past the cap: SERVFAIL from here, with the batch, rather
				// than a goroutine per query of a flood.
				resp = servfail(req)
			}
			if resp == nil {
				continue
			}
			s.observe(resp, forward, start)
			b, err := udpReply(resp, req, bufs[k])
			if err != nil {
				continue
			}
			out[k].Buffers[0], out[k].Addr = b, src
			k++
		}
		for sent := 0; sent < k; {
			m, err := bc.WriteBatch(out[sent:k], 0)
			if err != nil {
				break
			}
			sent += m
		}
	}
}

// udpReply truncates resp to what the client can take over UDP and packs it.
func udpReply(resp, req *dns.Msg, buf []byte) ([]byte, error) {
	size := dns.MinMsgSize
	if o := req.IsEdns0(); o != nil && int(o.UDPSize()) > size {
		size = int(o.UDPSize())
	}
	resp.Truncate(size)
	return resp.PackBuffer(buf[:cap(buf)]) // PackBuffer packs into buf only if its length will do
}

// allowedNow says whether ip may query, from the allowed sources as they
// are (no refresh).
func (s *Server) allowedNow(ip netip.Addr) bool {
	return ip.IsLoopback() || ip == s.self || s.inAllow(ip)
}

// claimRefresh says whether the caller is to run Refresh now: there is
// one, none is running and none began within the last second.
func (s *Server) claimRefresh() bool {
	if s.cfg.Refresh == nil {
		return false
	}
	now := time.Now().UnixNano()
	if now-s.refreshed.Load() < int64(time.Second) || !s.refreshing.CompareAndSwap(false, true) {
		return false
	}
	s.refreshed.Store(now)
	return true
}

// refresh runs Refresh, which claimRefresh said to run.
func (s *Server) refresh() {
	defer s.refreshing.Store(false)
	if p := s.cfg.Refresh(); p != nil {
		s.SetAllow(p)
	}
}

func (s *Server) inAllow(ip netip.Addr) bool {
	for _, p := range *s.allow.Load() {
		if p.Contains(ip) {
			return true
		}
	}
	return false
}

func addrOf(a net.Addr) netip.Addr {
	switch a := a.(type) {
	case *net.UDPAddr:
		return a.AddrPort().Addr().Unmap()
	case *net.TCPAddr:
		return a.AddrPort().Addr().Unmap()
	}
	return netip.Addr{}
}

// ServeDNS serves TCP (miekg/dns) through the same decisions as UDP.
func (s *Server) ServeDNS(w dns.ResponseWriter, req *dns.Msg) {
	if resp := s.answer(context.Background(), req, addrOf(w.RemoteAddr())); resp != nil {
		w.WriteMsg(resp)
	}
}

// answer builds the reply to req from src, forwarding if need be; nil means
// drop it.
func (s *Server) answer(ctx context.Context, req *dns.Msg, src netip.Addr) *dns.Msg {
	start := s.clock()
	if !s.allowedNow(src) && s.claimRefresh() {
		s.refresh() // TCP: this connection's own goroutine waits
	}
	resp, forward := s.local(req, src)
	if forward {
		resp = s.forwarded(ctx, req, src)
	}
	if resp != nil {
		s.observe(resp, forward, start)
	}
	return resp
}

// clock is the time a query arrived, when someone observes queries.
func (s *Server) clock() time.Time {
	if s.cfg.Observe == nil {
		return time.Time{}
	}
	return time.Now()
}

func (s *Server) observe(resp *dns.Msg, forwarded bool, start time.Time) {
	if s.cfg.Observe != nil {
		s.cfg.Observe(resp.Rcode, forwarded, time.Since(start))
	}
}

// local answers what the node can answer itself; forward says the question
// is for upstream.
func (s *Server) local(req *dns.Msg, src netip.Addr) (resp *dns.Msg, forward bool) {
	if req.Response {
		return nil, false // never answer an answer
	}
	resp = new(dns.Msg)
	resp.SetReply(req)
	resp.RecursionAvailable = true
	if o := req.IsEdns0(); o != nil {
		// The DO bit is copied into the response (RFC 3225 3); the mesh's
		// own answers carry no signatures.
		resp.SetEdns0(maxQuery, o.Do())
		if o.Version() != 0 {
			resp.Rcode = dns.RcodeBadVers
			return resp, false
		}
	}
	if !s.allowedNow(src) {
		resp.Rcode = dns.RcodeRefused
		return resp, false
	}
	if req.Opcode != dns.OpcodeQuery {
		resp.Rcode = dns.RcodeNotImplemented
		return resp, false
	}
	if len(req.Question) != 1 {
		resp.Rcode = dns.RcodeFormatError
		return resp, false
	}
	r := s.index.Load().Lookup(req.Question[0], s.cfg.TTL)
	if r.Forward {
		return nil, true
	}
	resp.Authoritative = r.Authoritative
	resp.Rcode = r.Rcode
	resp.Answer = r.Answer
	resp.Ns = r.Ns
	return resp, false
}

// forwarded is the upstream's answer to req, or SERVFAIL: when no upstream
// answers within ForwardBudget, or when MaxForwarding queries are already
// being forwarded.
func (s *Server) forwarded(ctx context.Context, req *dns.Msg, src netip.Addr) *dns.Msg {
	if !s.takeForwardSlot(req, src) {
		return servfail(req)
	}
	return s.forwardHolding(ctx, req, src)
}

// takeForwardSlot takes one of the MaxForwarding slots for src, within
// its share, or says (in the log, at most once a second: a flood must not
// flood the log too) that there is none.
func (s *Server) takeForwardSlot(req *dns.Msg, src netip.Addr) bool {
	held, ok := s.forwarding.Take(src)
	if ok {
		return true
	}
	if now := time.Now().UnixNano(); now-s.overLogged.Load() > int64(time.Second) {
		s.overLogged.Store(now)
		s.log.Warn("too many queries being forwarded upstream at once, in all or from one source; answering SERVFAIL past the cap", "max", s.cfg.MaxForwarding, "max_per_source", s.forwarding.PerSource, "source", src, "held_by_source", held, "name", req.Question[0].Name)
	}
	return false
}

// forwardHolding forwards req within ForwardBudget, holding a slot taken by
// takeForwardSlot for src, which it gives back.
func (s *Server) forwardHolding(ctx context.Context, req *dns.Msg, src netip.Addr) *dns.Msg {
	defer s.forwarding.Give(src)
	ctx, cancel := context.WithTimeout(ctx, ForwardBudget)
	defer cancel()
	up := s.forward(ctx, req)
	if up == nil {
		return servfail(req)
	}
	up.Id = req.Id
	return up
}

// floodOver is how long after the last query turned away at the cap a
// flood counts as over.
const floodOver = 3 * time.Second

// watchFloods calls AfterFlood once after each flood.
func (s *Server) watchFloods() {
	t := time.NewTicker(s.floodOver / 3)
	defer t.Stop()
	var handled int64
	for {
		select {
		case <-s.done:
			return
		case <-t.C:
		}
		if last := s.overLogged.Load(); last != 0 && last != handled && time.Since(time.Unix(0, last)) > s.floodOver {
			handled = last
			s.log.Info("a flood of queries to forward is over", "max_forwarding", s.cfg.MaxForwarding)
			s.cfg.AfterFlood()
		}
	}
}

// plainQuery says whether the message's header is a query's as miekg/dns
// takes one over TCP (its DefaultMsgAcceptFunc): at most one answer record
// (NOTIFY's SOA), one authority record (IXFR's SOA), and two additional
// (EDNS and a TSIG). The UDP reader unpacks what it reads itself, and a
// 4 kB query of hundreds of records unpacked to some 100 kB.
func plainQuery(b []byte) bool {
	if len(b) < 12 {
		return false
	}
	an, ns, ar := binary.BigEndian.Uint16(b[6:]), binary.BigEndian.Uint16(b[8:]), binary.BigEndian.Uint16(b[10:])
	return b[2]&0x80 == 0 && an <= 1 && ns <= 1 && ar <= 2
}

func servfail(req *dns.Msg) *dns.Msg {
	resp := new(dns.Msg)
	resp.SetRcode(req, dns.RcodeServerFailure)
	resp.RecursionAvailable = true
	return resp
}

// forward asks each upstream in turn, over TCP when UDP comes back truncated.
func (s *Server) forward(ctx context.Context, req *dns.Msg) *dns.Msg {
	// The question and the client's EDNS record only: what else a query
	// carries (answer, authority, other additional records) is nothing
	// upstream needs, and copied it held some 25 times a query's size per
	// forward.
	q := &dns.Msg{MsgHdr: req.MsgHdr, Compress: req.Compress, Question: slices.Clone(req.Question)}
	if opt := req.IsEdns0(); opt != nil {
		q.Extra = []dns.RR{dns.Copy(opt)}
	}
	if q.IsEdns0() == nil {
		q.SetEdns0(4096, false)
	}
	for _, u := range s.cfg.Upstreams {
		if ctx.Err() != nil {
			return nil
		}
		r, err := s.exchange(ctx, q, u, "udp")
		if err == nil && r.Truncated {
			r, err = s.exchange(ctx, q, u, "tcp")
		}
		if err != nil {
			s.log.Debug("upstream failed", "upstream", u, "name", req.Question[0].Name, "err", err)
			continue
		}
		if req.IsEdns0() == nil {
			// The client did not speak EDNS0; do not hand it an OPT record.
			r.Extra = withoutOPT(r.Extra)
		}
		return r
	}
	return nil
}

func withoutOPT(rrs []dns.RR) []dns.RR {
	out := rrs[:0]
	for _, rr := range rrs {
		if rr.Header().Rrtype != dns.TypeOPT {
			out = append(out, rr)
		}
	}
	return out
}

// UpstreamsFromResolvConf reads the host's resolvers, leaving out the mesh's
// own address (a host may point its resolv.conf at the mesh resolver).
func UpstreamsFromResolvConf(path string, self netip.Addr) ([]string, error) {
	cc, err := dns.ClientConfigFromFile(path)
	if err != nil {
		return nil, fmt.Errorf("read upstream resolvers from %s: %w", path, err)
	}
	var out []string
	for _, s := range cc.Servers {
		if a, err := netip.ParseAddr(s); err == nil && a == self {
			continue
		}
		out = append(out, net.JoinHostPort(s, cc.Port))
	}
	return out, nil
}
