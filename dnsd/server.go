package dnsd

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/netip"
	"sync/atomic"
	"time"

	"github.com/miekg/dns"
)

// ForwardTimeout bounds one upstream exchange.
const ForwardTimeout = 2 * time.Second

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
	Allow  []netip.Prefix
	Logger *slog.Logger
}

// Server answers DNS from the current Index.
type Server struct {
	cfg   Config
	index atomic.Pointer[Index]
	allow atomic.Pointer[[]netip.Prefix]
	self  netip.Addr
	log   *slog.Logger
	udp   *dns.Server
	tcp   *dns.Server
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
	s := &Server{cfg: cfg, self: ap.Addr(), log: cfg.Logger.With("component", "dnsd")}
	s.index.Store(NewIndex(domain, nil, 0))
	s.SetAllow(cfg.Allow)
	s.exchange = func(ctx context.Context, m *dns.Msg, upstream, network string) (*dns.Msg, error) {
		c := &dns.Client{Net: network, Timeout: ForwardTimeout}
		r, _, err := c.ExchangeContext(ctx, m, upstream)
		return r, err
	}
	return s, nil
}

// SetIndex swaps the index in; queries in flight keep the one they started with.
func (s *Server) SetIndex(ix *Index) { s.index.Store(ix) }

// Start binds UDP and TCP on the configured address and serves in the
// background. It returns once both sockets are bound.
func (s *Server) Start() (string, error) {
	pc, err := net.ListenPacket("udp", s.cfg.Addr)
	if err != nil {
		return "", fmt.Errorf("resolver: listen udp %s: %w", s.cfg.Addr, err)
	}
	// The TCP socket takes the port UDP got, so ":0" works in tests.
	l, err := net.Listen("tcp", pc.LocalAddr().String())
	if err != nil {
		pc.Close()
		return "", fmt.Errorf("resolver: listen tcp %s: %w", pc.LocalAddr(), err)
	}
	s.udp = &dns.Server{PacketConn: pc, Handler: s}
	s.tcp = &dns.Server{Listener: l, Handler: s, ReadTimeout: 5 * time.Second}
	go s.udp.ActivateAndServe()
	go s.tcp.ActivateAndServe()
	s.log.Info("resolver listening", "addr", pc.LocalAddr().String(), "upstreams", s.cfg.Upstreams)
	return pc.LocalAddr().String(), nil
}

// Close stops serving.
func (s *Server) Close() error {
	var errs []error
	if s.udp != nil {
		errs = append(errs, s.udp.Shutdown())
	}
	if s.tcp != nil {
		errs = append(errs, s.tcp.Shutdown())
	}
	return errors.Join(errs...)
}

func (s *Server) allowed(src net.Addr) bool {
	var ip netip.Addr
	switch a := src.(type) {
	case *net.UDPAddr:
		ip, _ = netip.AddrFromSlice(a.IP)
	case *net.TCPAddr:
		ip, _ = netip.AddrFromSlice(a.IP)
	default:
		return false
	}
	ip = ip.Unmap()
	if ip.IsLoopback() || ip == s.self {
		return true
	}
	for _, p := range *s.allow.Load() {
		if p.Contains(ip) {
			return true
		}
	}
	return false
}

// ServeDNS adapts miekg/dns to Lookup and the forwarder; it decides nothing.
func (s *Server) ServeDNS(w dns.ResponseWriter, req *dns.Msg) {
	resp := s.answer(context.Background(), req, w.RemoteAddr())
	if resp == nil {
		return
	}
	if _, udp := w.RemoteAddr().(*net.UDPAddr); udp {
		size := dns.MinMsgSize
		if o := req.IsEdns0(); o != nil && int(o.UDPSize()) > size {
			size = int(o.UDPSize())
		}
		resp.Truncate(size)
	}
	w.WriteMsg(resp)
}

// answer builds the reply to req from src; nil means drop it.
func (s *Server) answer(ctx context.Context, req *dns.Msg, src net.Addr) *dns.Msg {
	if req.Response {
		return nil // never answer an answer
	}
	resp := new(dns.Msg)
	resp.SetReply(req)
	resp.RecursionAvailable = true
	if o := req.IsEdns0(); o != nil {
		resp.SetEdns0(4096, false)
		if o.Version() != 0 {
			resp.Rcode = dns.RcodeBadVers
			return resp
		}
	}
	if !s.allowed(src) {
		resp.Rcode = dns.RcodeRefused
		return resp
	}
	if req.Opcode != dns.OpcodeQuery {
		resp.Rcode = dns.RcodeNotImplemented
		return resp
	}
	if len(req.Question) != 1 {
		resp.Rcode = dns.RcodeFormatError
		return resp
	}
	r := s.index.Load().Lookup(req.Question[0], s.cfg.TTL)
	if !r.Forward {
		resp.Authoritative = r.Authoritative
		resp.Rcode = r.Rcode
		resp.Answer = r.Answer
		resp.Ns = r.Ns
		return resp
	}
	up := s.forward(ctx, req)
	if up == nil {
		resp.Rcode = dns.RcodeServerFailure
		return resp
	}
	up.Id = req.Id
	return up
}

// forward asks each upstream in turn, over TCP when UDP comes back truncated.
func (s *Server) forward(ctx context.Context, req *dns.Msg) *dns.Msg {
	q := req.Copy()
	if q.IsEdns0() == nil {
		q.SetEdns0(4096, false)
	}
	for _, u := range s.cfg.Upstreams {
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
