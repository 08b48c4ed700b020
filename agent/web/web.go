// Package web is the fleet's web page (issue "a web page for the fleet"):
// what runs where, its health, why it changed, and what a change would
// do, served by the agent itself with `mesh agent --web-listen ADDR`.
//
// It decides nothing and holds no state of the mesh: every page is
// rendered from the local API (the same client the CLI uses, so the page
// and `mesh status` cannot disagree), and the one change it makes (an
// assign, an unassign, a public domain) is the API's write, previewed
// first with the API's dry run. What it holds of its own is access: login
// links not used yet, sessions and their CSRF tokens, in memory only.
package web

import (
	"context"
	"crypto/sha256"
	"embed"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"html/template"
	"io/fs"
	"log/slog"
	"net"
	"net/http"
	"net/netip"
	"net/url"
	"strings"
	"sync"
	"time"

	"mesh/cluster/api"
	"mesh/internal/connlimit"
)

//go:embed templates/*.html static/*
var assets embed.FS

// Config is what the page is served from.
type Config struct {
	// Client reads and writes through the node's local API.
	Client *api.Client
	// Changed returns a channel closed at the replica's next change (the
	// store's Changed): the page's events follow it.
	Changed func() <-chan struct{}
	// Applied is the replica's applied index (the store's AppliedIndex),
	// which each event carries.
	Applied func() (uint64, error)
	// URL is where the page is reached (scheme and host), for the login
	// links `mesh web token` prints.
	URL string
	// TLS: the page is served over TLS (the session cookie is Secure).
	TLS bool
	// Fingerprint is the SHA-256 of the certificate served over TLS, which
	// the login link comes with (nil: plain HTTP).
	Fingerprint func() string
	Logger      *slog.Logger
	// Now is the clock (tests set it).
	Now func() time.Time
}

// Server serves the page.
type Server struct {
	cfg    Config
	access *access
	cookie string
	// streams counts the open event streams, of all sessions and of each.
	streamsMu  sync.Mutex
	streams    map[[32]byte]int
	allStreams int
	pages      map[string]*template.Template
	static     http.Handler
	mux        *http.ServeMux
	log        *slog.Logger
	// crossSiteLogins throttles the warning for a login from another
	// site, or from no site named: anybody reaching the port can send
	// one, and it comes before the failed-login limit.
	crossSiteLogins connlimit.Throttle
	// strayCookies throttles the warning for a session's cookie used from
	// another address than the session's.
	strayCookies connlimit.Throttle
}

// New makes the page's server.
func New(cfg Config) (*Server, error) {
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	if cfg.Changed == nil || cfg.Applied == nil {
		return nil, errors.New("web: the page needs the replica's Changed and Applied")
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	s := &Server{cfg: cfg, access: newAccess(cfg.Now), log: cfg.Logger.With("component", "web"), streams: map[[32]byte]int{}}
	s.cookie = cookieName(cfg.URL, cfg.TLS)
	if err := s.parse(); err != nil {
		return nil, err
	}
	st, err := fs.Sub(assets, "static")
	if err != nil {
		return nil, err
	}
	files := http.FileServerFS(st)
	s.static = http.StripPrefix("/static/", http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "" || strings.HasSuffix(r.URL.Path, "/") {
			http.NotFound(w, r) // no listing of the assets
			return
		}
		// An asset asked for by its digest (as the pages link it) is
		// the same for ever: the browser keeps it, and a page's load
		// does not wait on it again. Anything else is not kept.
		if v := r.URL.Query().Get("v"); v != "" && v == assetDigest(r.URL.Path) {
			w.Header().Set("Cache-Control", "public, max-age=31536000, immutable")
		}
		files.ServeHTTP(w, r)
	}))
	mux := http.NewServeMux()
	mux.Handle("GET /static/", s.static)
	mux.HandleFunc("GET /login", s.loginPage)
	mux.HandleFunc("POST /login", s.login)
	mux.Handle("POST /logout", s.changes(s.logout))
	mux.Handle("GET /{$}", s.reads(s.fleet))
	mux.Handle("GET /nodes/{name}", s.reads(s.node))
	mux.Handle("GET /modules/{name}", s.reads(s.module))
	mux.Handle("GET /roster", s.reads(s.roster))
	mux.Handle("GET /preview", s.reads(s.preview))
	mux.Handle("POST /do", s.changes(s.do))
	mux.Handle("GET /events", s.reads(s.events))
	mux.HandleFunc("/", s.notFound)
	s.mux = mux
	return s, nil
}

// ServeHTTP serves the page, with the headers every answer carries: no
// framing (clickjacking), scripts and styles from the page only, no
// referrer to another site (a login link must not leak), nothing cached.
func (s *Server) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	h := w.Header()
	h.Set("Content-Security-Policy", "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:; frame-ancestors 'none'; form-action 'self'; base-uri 'none'")
	h.Set("X-Frame-Options", "DENY")
	h.Set("X-Content-Type-Options", "nosniff")
	h.Set("Referrer-Policy", "same-origin")
	h.Set("Cache-Control", "no-store")
	if s.cfg.TLS {
		h.Set("Strict-Transport-Security", "max-age=31536000")
	}
	s.mux.ServeHTTP(w, r)
}

// assetDigests is each embedded asset's digest, made once.
var assetDigests = sync.OnceValue(func() map[string]string {
	out := map[string]string{}
	entries, _ := fs.ReadDir(assets, "static")
	for _, e := range entries {
		b, err := fs.ReadFile(assets, "static/"+e.Name())
		if err == nil {
			sum := sha256.Sum256(b)
			out[e.Name()] = hex.EncodeToString(sum[:8])
		}
	}
	return out
})

func assetDigest(name string) string { return assetDigests()[name] }

// assetURL is where a page links an asset: by its digest, so that a
// browser that keeps it takes a new one when the binary brings one.
func assetURL(name string) string { return "/static/" + name + "?v=" + assetDigest(name) }

// cookieName is the session cookie's name: one per port, so that two
// agents' pages on one host do not overwrite each other's cookie; over TLS
// with the __Host- prefix, which a browser only takes from a secure
// origin, for the path /, with no domain. The name keeps nothing from
// anybody: a browser sends a host's cookies to each of its ports (RFC
// 6265 section 8.5), whatever their names, so any other service on the
// page's host is given the cookie. What keeps the session the operator's
// is its binding to the address it logged in from (auth.go, session).
func cookieName(pageURL string, tls bool) string {
	name := "mesh_session"
	if u, err := url.Parse(pageURL); err == nil && u.Port() != "" {
		name += "_" + u.Port()
	}
	if tls {
		name = "__Host-" + name
	}
	return name
}

// CookieName is the session cookie's name.
func (s *Server) CookieName() string { return s.cookie }

// The local API's wire types of the page's access.
type (
	TokenRequest = api.WebTokenRequest
	TokenReply   = api.WebTokenReply
	LogoutReply  = api.WebLogoutReply
)

// LocalHandler serves the local API's end of the page (POST /v1/web/token
// and POST /v1/web/logout), for the CLI on the data dir's socket, which
// only the agent's user can open.
func (s *Server) LocalHandler() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("POST /v1/web/token", func(w http.ResponseWriter, r *http.Request) {
		var req TokenRequest
		if err := json.NewDecoder(http.MaxBytesReader(w, r.Body, 4096)).Decode(&req); err != nil {
			localError(w, http.StatusBadRequest, fmt.Errorf("bad request: %v", err))
			return
		}
		if req.TTL == 0 {
			req.TTL = TokenLife
		}
		if req.TTL < time.Second || req.TTL > MaxTokenLife {
			localError(w, http.StatusBadRequest, fmt.Errorf("--ttl %s: a login link lives between 1s and %s", req.TTL, MaxTokenLife))
			return
		}
		tok, exp := s.access.mint(req.TTL)
		s.log.Info("login link made", "expires", exp.Format(time.RFC3339))
		reply := TokenReply{URL: s.cfg.URL + "/login?token=" + url.QueryEscape(tok), Expires: exp}
		if s.cfg.Fingerprint != nil {
			reply.Fingerprint = s.cfg.Fingerprint()
		}
		localReply(w, reply)
	})
	mux.HandleFunc("POST /v1/web/logout", func(w http.ResponseWriter, r *http.Request) {
		n := s.access.logoutAll()
		s.log.Info("every web session ended", "sessions", n)
		localReply(w, LogoutReply{Sessions: n})
	})
	return mux
}

func localReply(w http.ResponseWriter, v any) {
	w.Header().Set("Content-Type", "application/json")
	json.NewEncoder(w).Encode(v)
}

func localError(w http.ResponseWriter, code int, err error) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(code)
	json.NewEncoder(w).Encode(map[string]string{"error": err.Error()})
}

type indexKey struct{}

// reads serves a handler only within a session; without one it answers
// 401 and a page that says how to get one. The replica's applied index is
// taken before the handler reads anything and the page carries it: the
// page's script compares it with the event stream's first event, so a
// change that lands between the page's reads and its stream's start is
// not missed.
func (s *Server) reads(next func(w http.ResponseWriter, r *http.Request, sess *session)) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		sess := s.sessionOf(r)
		if sess == nil {
			s.unauthorized(w, r)
			return
		}
		if idx, err := s.cfg.Applied(); err == nil {
			r = r.WithContext(context.WithValue(r.Context(), indexKey{}, idx))
		}
		next(w, r, sess)
	})
}

// renderedAt is the applied index a page's reads started at (0: unknown).
func renderedAt(r *http.Request) uint64 {
	idx, _ := r.Context().Value(indexKey{}).(uint64)
	return idx
}

// changes serves a handler that changes something only within a session,
// from the page's own origin (which the request names: auth.go,
// crossOrigin), with the session's CSRF token in the form.
func (s *Server) changes(next func(w http.ResponseWriter, r *http.Request, sess *session)) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		sess := s.sessionOf(r)
		if sess == nil {
			s.unauthorized(w, r)
			return
		}
		if why := crossOrigin(r, s.cfg.TLS); why != "" {
			s.refuse(w, r, http.StatusForbidden, why)
			return
		}
		r.Body = http.MaxBytesReader(w, r.Body, 64<<10)
		if !equalSecret(r.PostFormValue("csrf"), sess.csrf) {
			s.refuse(w, r, http.StatusForbidden, "refused: the form's CSRF token is missing or wrong; reload the page and try again")
			return
		}
		next(w, r, sess)
	})
}

// sessionOf is the request's session: its cookie's, used from the
// address the session logged in from (auth.go, session). What the page's
// script asks by itself (its event stream, and the refreshes the events
// bring) does not mark the session used: a tab left open is not an
// operator using the page, and its session still ends when idle.
func (s *Server) sessionOf(r *http.Request) *session {
	c, err := r.Cookie(s.cookie)
	if err != nil {
		return nil
	}
	byScript := r.URL.Path == "/events" || r.Header.Get(partHeader) != ""
	sess, elsewhere := s.access.session(c.Value, remoteAddr(r), !byScript)
	if elsewhere && s.strayCookies.Now() {
		// A cookie that went astray (another service on the page's host
		// was given it), or the operator's own address changed (log in
		// again). Whoever holds the cookie can send it as often as it
		// likes: logged once a minute at most.
		s.log.Warn("web session refused: its cookie came from another address than the session's login (logged once a minute at most)", "from", r.RemoteAddr, "path", r.URL.Path)
	}
	return sess
}

func (s *Server) loginPage(w http.ResponseWriter, r *http.Request) {
	// The link's GET only shows a button: a link previewer or a mail
	// scanner that opens the link does not spend it.
	s.render(w, r, http.StatusOK, "login", nil, map[string]any{"Token": r.URL.Query().Get("token")})
}

func (s *Server) login(w http.ResponseWriter, r *http.Request) {
	r.Body = http.MaxBytesReader(w, r.Body, 4096)
	if why := crossOrigin(r, s.cfg.TLS); why != "" {
		// Anybody reaching the port can send this, as often as it likes,
		// before the failed-login limit: a guesser cannot fill the log.
		if s.crossSiteLogins.Now() {
			s.log.Warn("web login refused: the request did not come from the page (logged once a minute at most)", "from", r.RemoteAddr, "why", why)
		}
		http.Error(w, why, http.StatusForbidden)
		return
	}
	id, _, ok, limited := s.access.exchange(r.PostFormValue("token"), remoteAddr(r))
	switch {
	case limited:
		w.Header().Set("Retry-After", fmt.Sprint(int(loginEvery.Seconds())))
		// Not logged: a guesser past its limit does not fill the log.
		s.log.Debug("web login refused: too many failed logins", "from", r.RemoteAddr)
		s.render(w, r, http.StatusTooManyRequests, "login", nil, map[string]any{"Error": "This link is unknown, used already, or expired, and too many logins failed from here. Make a new link with `mesh web token`: a good link always logs in."})
		return
	case !ok:
		s.log.Warn("web login refused: the link is unknown, used or expired", "from", r.RemoteAddr)
		s.render(w, r, http.StatusUnauthorized, "login", nil, map[string]any{"Error": "This link is unknown, used already, or expired. Make a new one with `mesh web token`."})
		return
	}
	if c, err := r.Cookie(s.cookie); err == nil {
		s.access.logout(c.Value) // a new login ends the browser's last session
	}
	s.log.Info("web login", "from", r.RemoteAddr)
	http.SetCookie(w, &http.Cookie{Name: s.cookie, Value: id, Path: "/", HttpOnly: true, Secure: s.cfg.TLS, SameSite: http.SameSiteStrictMode, MaxAge: int(SessionLife.Seconds())})
	http.Redirect(w, r, "/", http.StatusSeeOther)
}

func (s *Server) logout(w http.ResponseWriter, r *http.Request, _ *session) {
	if c, err := r.Cookie(s.cookie); err == nil {
		s.access.logout(c.Value)
	}
	http.SetCookie(w, &http.Cookie{Name: s.cookie, Value: "", Path: "/", HttpOnly: true, Secure: s.cfg.TLS, SameSite: http.SameSiteStrictMode, MaxAge: -1})
	http.Redirect(w, r, "/login", http.StatusSeeOther)
}

func (s *Server) unauthorized(w http.ResponseWriter, r *http.Request) {
	if r.URL.Path == "/events" || r.Header.Get(partHeader) != "" {
		http.Error(w, "no session: log in with a link from `mesh web token`", http.StatusUnauthorized)
		return
	}
	s.render(w, r, http.StatusUnauthorized, "login", nil, map[string]any{"Error": "Log in with a link from `mesh web token` (run it on a node)."})
}

func (s *Server) refuse(w http.ResponseWriter, r *http.Request, code int, msg string) {
	s.log.Warn("web request refused", "path", r.URL.Path, "from", r.RemoteAddr, "why", msg)
	http.Error(w, msg, code)
}

func (s *Server) notFound(w http.ResponseWriter, r *http.Request) {
	if s.sessionOf(r) == nil {
		s.unauthorized(w, r)
		return
	}
	http.Error(w, "no such page", http.StatusNotFound)
}

func remoteAddr(r *http.Request) netip.Addr {
	host, _, err := net.SplitHostPort(r.RemoteAddr)
	if err != nil {
		host = r.RemoteAddr
	}
	a, _ := netip.ParseAddr(host)
	return a.Unmap()
}

// readTimeout bounds the API reads of one page: a page that cannot be
// read says why rather than hanging.
const readTimeout = 10 * time.Second

func pageContext(r *http.Request) (context.Context, context.CancelFunc) {
	return context.WithTimeout(r.Context(), readTimeout)
}

// apiError is how a page shows a read that failed.
func apiError(err error) string {
	if errors.Is(err, context.DeadlineExceeded) {
		return "the agent did not answer within " + readTimeout.String()
	}
	return strings.TrimSpace(err.Error())
}
