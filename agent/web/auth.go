package web

import (
	"crypto/rand"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/base64"
	"net/http"
	"net/netip"
	"sync"
	"time"
)

// Lifetimes and bounds of the page's access (DESIGN.md, "The web page").
const (
	// TokenLife is how long a login link works when none is asked for.
	TokenLife = 10 * time.Minute
	// MaxTokenLife bounds what `mesh web token --ttl` may ask for.
	MaxTokenLife = 24 * time.Hour
	// SessionIdle ends a session nobody used for that long; SessionLife
	// ends any session.
	SessionIdle = 12 * time.Hour
	SessionLife = 7 * 24 * time.Hour
	// maxTokens and maxSessions bound what a flood of `mesh web token` or of
	// logins can make the agent hold; the oldest goes first.
	maxTokens   = 64
	maxSessions = 256
	// Failed logins: loginBurst in a row from one address, then one per
	// loginEvery; failedBurst from all addresses together, then one per
	// failedEvery (a spread-out guesser is bounded too).
	loginBurst  = 5
	loginEvery  = 12 * time.Second
	failedBurst = 30
	failedEvery = 2 * time.Second
	// maxAddrs bounds the addresses whose failures are counted apart.
	maxAddrs = 4096
)

// secret is a random value as it travels (base64url) and, kept, its digest:
// the agent never holds a live token or session id in the clear, so a dump
// of its memory's maps does not log anybody in.
func newSecret() (string, [32]byte) {
	b := make([]byte, 32)
	if _, err := rand.Read(b); err != nil {
		panic(err) // crypto/rand does not fail on Linux
	}
	s := base64.RawURLEncoding.EncodeToString(b)
	return s, sha256.Sum256([]byte(s))
}

func digest(s string) [32]byte { return sha256.Sum256([]byte(s)) }

// A session is bound to the address it logged in from: a browser sends
// the cookie to every port of the page's host (cookies are not kept apart
// by port, RFC 6265 section 8.5), so another service there (a module's
// container publishing a port on the same address, or one tunnelled to
// the operator's localhost) is given it when the operator opens that
// service; from its own address the cookie is no session. The exact
// address, not an IPv6 address's /64: a neighbour in the /64 is another
// host.
type session struct {
	csrf    string
	addr    netip.Addr
	created time.Time
	used    time.Time
}

// access holds the login links not used yet, the sessions, and the failed
// logins' limiter. Everything is in memory: an agent that restarts has no
// session left (log in again with a new link).
type access struct {
	mu       sync.Mutex
	now      func() time.Time
	tokens   map[[32]byte]time.Time // digest -> expiry
	sessions map[[32]byte]*session
	perAddr  map[netip.Prefix]*bucket
	pruned   time.Time // when perAddr was last pruned at its bound
	all      bucket
}

func newAccess(now func() time.Time) *access {
	return &access{now: now, tokens: map[[32]byte]time.Time{}, sessions: map[[32]byte]*session{}, perAddr: map[netip.Prefix]*bucket{}}
}

// mint makes a one-time login token that works for life.
func (a *access) mint(life time.Duration) (string, time.Time) {
	tok, d := newSecret()
	a.mu.Lock()
	defer a.mu.Unlock()
	now := a.now()
	a.expire(now)
	for len(a.tokens) >= maxTokens {
		a.dropOldestToken()
	}
	exp := now.Add(life)
	a.tokens[d] = exp
	return tok, exp
}

// dropOldestToken drops the link that expires first.
func (a *access) dropOldestToken() {
	var oldest [32]byte
	var at time.Time
	for d, exp := range a.tokens {
		if at.IsZero() || exp.Before(at) {
			oldest, at = d, exp
		}
	}
	delete(a.tokens, oldest)
}

// exchange spends a login token for a new session: its id and CSRF token.
// A good token always logs in: it is 256 random bits, which nobody
// guesses, so the limiter does not stand between it and its operator (a
// flood of bad guesses from anywhere cannot lock the operator out); what
// the limiter bounds is what a guesser costs (its answers are 429 and not
// logged). ok is false for a token that is unknown, spent or expired; each
// such failure is counted against its address (an IPv6 address by its
// /64, which one host holds whole) and against all addresses together, and
// limited is true once either has failed too often.
func (a *access) exchange(tok string, from netip.Addr) (id, csrf string, ok, limited bool) {
	a.mu.Lock()
	defer a.mu.Unlock()
	now := a.now()
	d := digest(tok)
	if exp, found := a.tokens[d]; found && now.Before(exp) {
		delete(a.tokens, d)
		a.expire(now)
		for len(a.sessions) >= maxSessions {
			a.dropOldestSession()
		}
		id, sd := newSecret()
		csrf, _ = newSecret()
		a.sessions[sd] = &session{csrf: csrf, addr: from, created: now, used: now}
		return id, csrf, true, false
	}
	key := addrKey(from)
	b := a.perAddr[key]
	if b == nil {
		if len(a.perAddr) >= maxAddrs && now.Sub(a.pruned) > loginEvery {
			a.expire(now) // at most once per loginEvery: a flood does not scan for each guess
			a.pruned = now
		}
		b = &bucket{}
		if len(a.perAddr) < maxAddrs {
			a.perAddr[key] = b
		} // else counted by the bucket of all alone, until some expire
	}
	limited = !b.allows(now, loginBurst, loginEvery) || !a.all.allows(now, failedBurst, failedEvery)
	b.fail(now, loginBurst, loginEvery)
	a.all.fail(now, failedBurst, failedEvery)
	return "", "", false, limited
}

// addrKey is what failures are counted by: an IPv4 address, or an IPv6
// address's /64.
func addrKey(a netip.Addr) netip.Prefix {
	bits := 32
	if a.Is6() {
		bits = 64
	}
	p, err := a.Prefix(bits)
	if err != nil {
		return netip.Prefix{}
	}
	return p
}

func (a *access) dropOldestSession() {
	var oldest [32]byte
	var at time.Time
	for d, s := range a.sessions {
		if at.IsZero() || s.used.Before(at) {
			oldest, at = d, s.used
		}
	}
	delete(a.sessions, oldest)
}

// session finds a live session by its id, used from the address it
// logged in from, and, when touch is set, marks it used; nil when there is
// none (unknown, idle too long, too old, or logged out). elsewhere says
// that the id is a live session's used from another address: that request
// has no session, and the session lives on for its own address (a cookie
// that went astray does not log its operator out). An event stream's
// checks do not touch it: a tab left open is not an operator using the
// page, and its session still ends when idle.
func (a *access) session(id string, from netip.Addr, touch bool) (sess *session, elsewhere bool) {
	if id == "" {
		return nil, false
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	now := a.now()
	d := digest(id)
	s := a.sessions[d]
	if s == nil {
		return nil, false
	}
	if now.Sub(s.used) > SessionIdle || now.Sub(s.created) > SessionLife {
		delete(a.sessions, d)
		return nil, false
	}
	if !from.IsValid() || from != s.addr {
		return nil, true
	}
	if touch {
		s.used = now
	}
	cp := *s
	return &cp, false
}

// logout ends one session; logoutAll every session and every login link
// not used yet, and says how many sessions it ended.
func (a *access) logout(id string) {
	a.mu.Lock()
	defer a.mu.Unlock()
	delete(a.sessions, digest(id))
}

func (a *access) logoutAll() int {
	a.mu.Lock()
	defer a.mu.Unlock()
	n := len(a.sessions)
	a.sessions = map[[32]byte]*session{}
	a.tokens = map[[32]byte]time.Time{}
	return n
}

func (a *access) expire(now time.Time) {
	for d, exp := range a.tokens {
		if !now.Before(exp) {
			delete(a.tokens, d)
		}
	}
	for d, s := range a.sessions {
		if now.Sub(s.used) > SessionIdle || now.Sub(s.created) > SessionLife {
			delete(a.sessions, d)
		}
	}
	for addr, b := range a.perAddr {
		if b.full(now, loginBurst, loginEvery) {
			delete(a.perAddr, addr)
		}
	}
}

// bucket counts failures: each takes a token, tokens come back one per
// every, up to burst; with none left, nothing is heard.
type bucket struct {
	used int
	at   time.Time
}

func (b *bucket) refill(now time.Time, burst int, every time.Duration) {
	if b.at.IsZero() {
		b.at = now
		return
	}
	back := int(now.Sub(b.at) / every)
	if back > 0 {
		b.used = max(0, b.used-back)
		b.at = b.at.Add(time.Duration(back) * every)
	}
	if b.used == 0 {
		b.at = now
	}
}

func (b *bucket) allows(now time.Time, burst int, every time.Duration) bool {
	b.refill(now, burst, every)
	return b.used < burst
}

func (b *bucket) fail(now time.Time, burst int, every time.Duration) {
	b.refill(now, burst, every)
	b.used = min(b.used+1, burst) // a guesser that keeps on is heard again once per every
}

func (b *bucket) full(now time.Time, burst int, every time.Duration) bool {
	b.refill(now, burst, every)
	return b.used == 0
}

// Why a request that changes something (a login, a logout, a change) is
// refused before its session's CSRF token is looked at.
const (
	refusedCrossSite = "refused: the request came from another site"
	refusedNoOrigin  = "refused: the request names no origin (a browser sends Origin or Sec-Fetch-Site with it): make changes from the page in a browser"
)

// crossOrigin says why a request that changes something does not come
// from the page itself, "" when it does: a browser names the site that
// sent it (Sec-Fetch-Site, which every current browser sends), or else its
// origin (Origin: the page's scheme and host); a request from another site
// is refused even with a good CSRF token. A request that names neither is
// refused too: every browser sends Origin with a POST (Chrome, Safari and
// Edge since 79, Firefox since 70), the page's own forms included, and the
// page has no other client (the CLI talks to the local API). What is left
// without a browser's header is a client that is not one, and a session
// cookie that went astray (another service on the page's host was given
// it) is then kept from making changes with no header of its own.
func crossOrigin(r *http.Request, tls bool) string {
	switch r.Header.Get("Sec-Fetch-Site") {
	case "same-origin", "none":
		return ""
	case "":
	default:
		return refusedCrossSite
	}
	o := r.Header.Get("Origin")
	if o == "" {
		return refusedNoOrigin
	}
	scheme := "http://"
	if tls {
		scheme = "https://"
	}
	if o != scheme+r.Host {
		return refusedCrossSite
	}
	return ""
}

func equalSecret(a, b string) bool {
	return len(a) == len(b) && subtle.ConstantTimeCompare([]byte(a), []byte(b)) == 1
}
