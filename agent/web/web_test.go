package web

import (
	"bufio"
	"context"
	"crypto/tls"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/cookiejar"
	"net/http/httptest"
	"net/netip"
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"mesh/cluster"
	"mesh/cluster/api"
	"mesh/internal/testutil"
	"mesh/state"
)

// These tests run the page on a real one-node mesh (a cluster.Member with
// the local API on its socket, as `mesh agent` assembles it, less Podman)
// and drive its handlers over HTTP.

const appManifest = `module: app
resources:
  - directory: /srv/app
  - file: /srv/app/app.conf
    content: "port 8080\n"
  - container: app.server
    image: localhost/busybox:1
    mounts: ["/srv/app:/app"]
    restart-on: [/srv/app/app.conf]
`

// hostile has what a page must escape.
const hostileManifest = `module: evil
# <script>alert("x")</script>
resources:
  - directory: /srv/evil
`

type bed struct {
	t      testing.TB
	dir    string
	member *cluster.Member
	client *api.Client
	web    *Server
	srv    *httptest.Server
	clock  *clock
}

type clock struct {
	mu sync.Mutex
	at time.Time
}

func (c *clock) now() time.Time { c.mu.Lock(); defer c.mu.Unlock(); return c.at }
func (c *clock) add(d time.Duration) {
	c.mu.Lock()
	c.at = c.at.Add(d)
	c.mu.Unlock()
}

func startBed(t testing.TB) *bed {
	t.Helper()
	// A short path: the data dir holds a unix socket (at most 108 bytes).
	tmp, err := os.MkdirTemp("", "mweb")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(tmp) })
	dir := filepath.Join(tmp, "n")
	if err := cluster.Init(context.Background(), cluster.InitConfig{DataDir: dir, Name: "ace", Address: "127.0.0.1", Port: testutil.FreePort(t)}); err != nil {
		t.Fatal(err)
	}
	m, err := cluster.StartMember(cluster.MemberConfig{DataDir: dir, Logger: testutil.Logger(t), Version: "test"})
	if err != nil {
		t.Fatal(err)
	}
	srv := api.New(api.Config{Node: m.Node, Store: m.Store, ID: m.ID, Logger: testutil.Logger(t)})
	b := &bed{t: t, dir: dir, member: m, clock: &clock{at: time.Now()}}
	b.client = api.NewClient(dir)
	w, err := New(Config{Client: b.client, Changed: m.Store.Changed, Applied: m.Store.AppliedIndex, URL: "http://mesh.test", Logger: testutil.Logger(t), Now: b.clock.now})
	if err != nil {
		t.Fatal(err)
	}
	b.web = w
	srv.SetWeb(w.LocalHandler())
	if err := srv.Start(filepath.Join(dir, cluster.SocketFile)); err != nil {
		m.Stop()
		t.Fatal(err)
	}
	b.srv = httptest.NewServer(w)
	t.Cleanup(func() {
		b.srv.Close()
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		srv.Shutdown(ctx)
		m.Stop()
	})
	deadline := time.Now().Add(10 * time.Second)
	for m.Node.State() != "Leader" {
		if time.Now().After(deadline) {
			t.Fatal("node did not become leader within 10s")
		}
		time.Sleep(10 * time.Millisecond)
	}
	return b
}

func (b *bed) add(text string) {
	b.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, err := b.client.AddModules(ctx, api.AddRequest{Modules: []state.ModuleText{{File: "m.yaml", Text: text}}}); err != nil {
		b.t.Fatal(err)
	}
}

// link asks for a login link as `mesh web token` does, on the socket.
func (b *bed) link() string {
	b.t.Helper()
	var r TokenReply
	b.local("/v1/web/token", TokenRequest{}, &r)
	if !strings.HasPrefix(r.URL, "http://mesh.test/login?token=") || !r.Expires.After(b.clock.now()) {
		b.t.Fatalf("login link %+v", r)
	}
	u, _ := url.Parse(r.URL)
	return u.Query().Get("token")
}

func (b *bed) local(path string, body, out any) int {
	b.t.Helper()
	rd := strings.NewReader("{}")
	if body != nil {
		j, _ := json.Marshal(body)
		rd = strings.NewReader(string(j))
	}
	rec := httptest.NewRecorder()
	b.web.LocalHandler().ServeHTTP(rec, httptest.NewRequest("POST", path, rd))
	if out != nil && rec.Code == 200 {
		if err := json.Unmarshal(rec.Body.Bytes(), out); err != nil {
			b.t.Fatal(err)
		}
	}
	return rec.Code
}

// browser is a client with a cookie jar that does not follow redirects.
type browser struct {
	t    testing.TB
	b    *bed
	hc   *http.Client
	csrf string
}

func (b *bed) browser() *browser {
	jar, _ := cookiejar.New(nil)
	return &browser{t: b.t, b: b, hc: &http.Client{Jar: jar, Timeout: 20 * time.Second, CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}}
}

func (br *browser) get(path string) (int, string) {
	br.t.Helper()
	resp, err := br.hc.Get(br.b.srv.URL + path)
	if err != nil {
		br.t.Fatal(err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(body)
}

// post sends a form as a browser does, with the page's Origin; header
// sets more, or another Origin ("" removes a header).
func (br *browser) post(path string, form url.Values, header ...string) (*http.Response, string) {
	br.t.Helper()
	req, _ := http.NewRequest("POST", br.b.srv.URL+path, strings.NewReader(form.Encode()))
	req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	req.Header.Set("Origin", br.b.srv.URL)
	for i := 0; i+1 < len(header); i += 2 {
		if header[i+1] == "" {
			req.Header.Del(header[i])
			continue
		}
		req.Header.Set(header[i], header[i+1])
	}
	resp, err := br.hc.Do(req)
	if err != nil {
		br.t.Fatal(err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	return resp, string(body)
}

// login spends a fresh link and keeps the session's CSRF token.
func (br *browser) login() {
	br.t.Helper()
	resp, body := br.post("/login", url.Values{"token": {br.b.link()}})
	if resp.StatusCode != http.StatusSeeOther {
		br.t.Fatalf("login: %s %s", resp.Status, body)
	}
	code, page := br.get("/")
	if code != 200 {
		br.t.Fatalf("fleet page after login: %d %s", code, page)
	}
	br.csrf = csrfOf(br.t, page)
}

func csrfOf(t testing.TB, page string) string {
	t.Helper()
	i := strings.Index(page, `name="csrf" value="`)
	if i < 0 {
		t.Fatalf("no CSRF token in the page:\n%s", page)
	}
	rest := page[i+len(`name="csrf" value="`):]
	return rest[:strings.IndexByte(rest, '"')]
}

var pages = []string{"/", "/nodes/ace", "/modules/app", "/roster", "/roster?q=app", "/preview", "/preview?op=assign&node=ace&module=app", "/nodes/ace?from=1&to=2"}

func TestNothingAnswersWithoutASession(t *testing.T) {
	b := startBed(t)
	b.add(appManifest)
	anon := b.browser()
	for _, p := range append(pages, "/events", "/no/such/page") {
		if code, body := anon.get(p); code != http.StatusUnauthorized || strings.Contains(body, "app.server") {
			t.Errorf("GET %s without a session: %d\n%s", p, code, body)
		}
	}
	for _, p := range []string{"/do", "/logout"} {
		if resp, _ := anon.post(p, url.Values{"op": {"assign"}, "node": {"ace"}, "module": {"app"}}); resp.StatusCode != http.StatusUnauthorized {
			t.Errorf("POST %s without a session: %s", p, resp.Status)
		}
	}
	// A forged session cookie is no session.
	forged := b.browser()
	u, _ := url.Parse(b.srv.URL)
	forged.hc.Jar.SetCookies(u, []*http.Cookie{{Name: b.web.CookieName(), Value: strings.Repeat("A", 43)}})
	if code, _ := forged.get("/"); code != http.StatusUnauthorized {
		t.Errorf("forged session: %d", code)
	}
	if a := assigned(t, b, "app"); len(a) != 0 {
		t.Errorf("app assigned to %v by requests without a session", a)
	}
}

func assigned(t *testing.T, b *bed, module string) []string {
	t.Helper()
	mi, err := b.client.Module(context.Background(), module)
	if err != nil {
		t.Fatal(err)
	}
	return mi.Nodes
}

func TestLoginLink(t *testing.T) {
	b := startBed(t)
	br := b.browser()
	tok := b.link()
	// Opening the link only shows a button: it does not spend the token.
	for range 2 {
		code, body := br.get("/login?token=" + tok)
		if code != 200 || !strings.Contains(body, `id="login"`) {
			t.Fatalf("login page: %d\n%s", code, body)
		}
	}
	resp, body := br.post("/login", url.Values{"token": {tok}})
	if resp.StatusCode != http.StatusSeeOther || resp.Header.Get("Location") != "/" {
		t.Fatalf("login: %s %s", resp.Status, body)
	}
	var cookie *http.Cookie
	for _, c := range resp.Cookies() {
		if c.Name == b.web.CookieName() {
			cookie = c
		}
	}
	if cookie == nil || !cookie.HttpOnly || cookie.SameSite != http.SameSiteStrictMode || cookie.Secure || cookie.Path != "/" {
		t.Fatalf("session cookie %+v: want HttpOnly, SameSite=Strict, not Secure over plain HTTP", cookie)
	}
	if strings.Contains(cookie.Value, tok) {
		t.Fatal("the session id is the login token")
	}
	if code, body := br.get("/"); code != 200 || !strings.Contains(body, `data-node="ace"`) || !strings.Contains(body, `<details id="nodes-details" open>`) {
		t.Fatalf("fleet page (its one node's table open): %d\n%s", code, body)
	}
	// The token is spent: a second browser cannot use it.
	other := b.browser()
	if resp, _ := other.post("/login", url.Values{"token": {tok}}); resp.StatusCode != http.StatusUnauthorized {
		t.Fatalf("a spent token logged in: %s", resp.Status)
	}
	// Headers every answer carries.
	r2, _ := br.hc.Get(b.srv.URL + "/")
	r2.Body.Close()
	for k, want := range map[string]string{"X-Frame-Options": "DENY", "Referrer-Policy": "same-origin", "Cache-Control": "no-store"} {
		if got := r2.Header.Get(k); got != want {
			t.Errorf("%s: %q, want %q", k, got, want)
		}
	}
	if csp := r2.Header.Get("Content-Security-Policy"); !strings.Contains(csp, "script-src 'self'") || !strings.Contains(csp, "frame-ancestors 'none'") {
		t.Errorf("CSP %q", csp)
	}
}

func TestExpiredAndForgedTokens(t *testing.T) {
	b := startBed(t)
	tok := b.link()
	b.clock.add(TokenLife + time.Second)
	br := b.browser()
	if resp, _ := br.post("/login", url.Values{"token": {tok}}); resp.StatusCode != http.StatusUnauthorized {
		t.Fatalf("expired token: %s", resp.Status)
	}
	if resp, _ := br.post("/login", url.Values{"token": {tok + "x"}}); resp.StatusCode != http.StatusUnauthorized {
		t.Fatalf("forged token: %s", resp.Status)
	}
	// A TTL out of bounds is refused with what to do.
	if code := b.local("/v1/web/token", TokenRequest{TTL: 48 * time.Hour}, nil); code != http.StatusBadRequest {
		t.Fatalf("ttl 48h: %d", code)
	}
	// A session ends when idle too long.
	br.login()
	b.clock.add(SessionIdle + time.Minute)
	if code, _ := br.get("/"); code != http.StatusUnauthorized {
		t.Fatalf("idle session still answers: %d", code)
	}
}

func TestFailedLoginsAreLimited(t *testing.T) {
	b := startBed(t)
	br := b.browser()
	for i := range loginBurst {
		if resp, _ := br.post("/login", url.Values{"token": {"guess"}}); resp.StatusCode != http.StatusUnauthorized {
			t.Fatalf("guess %d: %s", i, resp.Status)
		}
	}
	resp, body := br.post("/login", url.Values{"token": {"guess"}})
	if resp.StatusCode != http.StatusTooManyRequests || resp.Header.Get("Retry-After") == "" || !strings.Contains(body, "mesh web token") {
		t.Fatalf("guess after %d failures: %s, want 429 with Retry-After\n%s", loginBurst, resp.Status, body)
	}
	// A guesser that keeps on is heard again once per loginEvery, not
	// after its whole backlog.
	b.clock.add(loginEvery)
	if resp, _ := br.post("/login", url.Values{"token": {"guess"}}); resp.StatusCode != http.StatusUnauthorized {
		t.Fatalf("a guess after the wait: %s, want 401", resp.Status)
	}
	if resp, _ := br.post("/login", url.Values{"token": {"guess"}}); resp.StatusCode != http.StatusTooManyRequests {
		t.Fatalf("a second guess after the wait: %s, want 429", resp.Status)
	}
	// A good link logs in even from the limited address: the limiter
	// stands between guessers and the page, not the operator.
	if resp, body := br.post("/login", url.Values{"token": {b.link()}}); resp.StatusCode != http.StatusSeeOther {
		t.Fatalf("good link from a limited address: %s %s", resp.Status, body)
	}
}

// A flood of bad guesses from many addresses exhausts the limit of all
// addresses together; the operator's link still logs in, and an address
// that keeps failing is limited even after more addresses than the
// limiter keeps apart have failed.
func TestFailedLoginFloodDoesNotLockOut(t *testing.T) {
	clk := &clock{at: time.Now()}
	a := newAccess(clk.now)
	addr := func(i int) netip.Addr {
		return netip.AddrFrom4([4]byte{10, byte(i >> 16), byte(i >> 8), byte(i)})
	}
	limitedSeen := false
	for i := range maxAddrs + 500 {
		_, _, ok, limited := a.exchange("guess", addr(i))
		if ok {
			t.Fatal("a guess logged in")
		}
		limitedSeen = limitedSeen || limited
	}
	if !limitedSeen {
		t.Fatal("thousands of failed logins from all over were never limited")
	}
	if len(a.perAddr) > maxAddrs {
		t.Fatalf("the limiter keeps %d addresses, bound %d", len(a.perAddr), maxAddrs)
	}
	tok, _ := a.mint(time.Minute)
	if _, _, ok, _ := a.exchange(tok, addr(7)); !ok {
		t.Fatal("the operator's link did not log in during a flood")
	}
	// One address that fails loginBurst times is limited, wherever the
	// flood has brought the map.
	clk.add(time.Hour) // the bucket of all has refilled
	me := netip.MustParseAddr("192.0.2.1")
	for range loginBurst {
		a.exchange("guess", me)
	}
	if _, _, _, limited := a.exchange("guess", me); !limited {
		t.Fatal("an address that failed loginBurst times is not limited")
	}
	// IPv6: one host holds a /64 whole, so its addresses share a bucket.
	clk.add(time.Hour)
	for i := range loginBurst {
		a.exchange("guess", netip.MustParseAddr(fmt.Sprintf("2001:db8:1:2::%x", i+1)))
	}
	if _, _, _, limited := a.exchange("guess", netip.MustParseAddr("2001:db8:1:2:ffff::1")); !limited {
		t.Fatal("addresses of one /64 are counted apart")
	}
	if _, _, _, limited := a.exchange("guess", netip.MustParseAddr("2001:db8:1:3::1")); limited {
		t.Fatal("another /64 is limited with the first")
	}
}

// An event stream's checks do not keep its session alive: a tab left
// open is not an operator using the page.
func TestStreamChecksDoNotTouchTheSession(t *testing.T) {
	clk := &clock{at: time.Now()}
	a := newAccess(clk.now)
	tok, _ := a.mint(time.Minute)
	id, _, ok, _ := a.exchange(tok, netip.MustParseAddr("127.0.0.1"))
	if !ok {
		t.Fatal("login")
	}
	for range 13 {
		clk.add(time.Hour)
		a.session(id, netip.MustParseAddr("127.0.0.1"), false)
	}
	if sess, _ := a.session(id, netip.MustParseAddr("127.0.0.1"), true); sess != nil {
		t.Fatal("a session only a stream checked lived past SessionIdle")
	}
}

func TestChangesNeedCSRFAndSameOrigin(t *testing.T) {
	b := startBed(t)
	b.add(appManifest)
	br := b.browser()
	br.login()
	form := func(csrf string) url.Values {
		return url.Values{"op": {"assign"}, "node": {"ace"}, "module": {"app"}, "csrf": {csrf}}
	}
	for name, tc := range map[string]struct {
		form   url.Values
		header []string
	}{
		"no CSRF token":      {form(""), nil},
		"wrong CSRF token":   {form(br.csrf + "x"), nil},
		"cross-site Origin":  {form(br.csrf), []string{"Origin", "https://evil.example"}},
		"null Origin":        {form(br.csrf), []string{"Origin", "null"}},
		"same host, https":   {form(br.csrf), []string{"Origin", "https://" + strings.TrimPrefix(b.srv.URL, "http://")}},
		"cross-site request": {form(br.csrf), []string{"Sec-Fetch-Site", "cross-site"}},
		"same-site request":  {form(br.csrf), []string{"Sec-Fetch-Site", "same-site"}},
		// A browser names its origin with every POST; what names none is
		// not a browser, and a session's cookie alone does not change
		// anything.
		"no Origin nor Sec-Fetch-Site": {form(br.csrf), []string{"Origin", ""}},
	} {
		if resp, body := br.post("/do", tc.form, tc.header...); resp.StatusCode != http.StatusForbidden {
			t.Errorf("%s: %s %s", name, resp.Status, body)
		}
	}
	if resp, body := br.post("/do", form(br.csrf), "Origin", ""); !strings.Contains(body, "names no origin") {
		t.Errorf("a change naming no origin is refused with: %s %q", resp.Status, body)
	}
	if resp, _ := br.post("/logout", url.Values{"csrf": {br.csrf}}, "Origin", ""); resp.StatusCode != http.StatusForbidden {
		t.Errorf("a logout naming no origin: %s", resp.Status)
	}
	if resp, body := b.browser().post("/login", url.Values{"token": {b.link()}}, "Origin", ""); resp.StatusCode != http.StatusForbidden || !strings.Contains(body, "names no origin") {
		t.Errorf("a login naming no origin: %s %q", resp.Status, body)
	}
	if a := assigned(t, b, "app"); len(a) != 0 {
		t.Fatalf("a refused request assigned app to %v", a)
	}
	// Another session's CSRF token does not do either.
	other := b.browser()
	other.login()
	if resp, _ := br.post("/do", form(other.csrf)); resp.StatusCode != http.StatusForbidden {
		t.Fatalf("another session's CSRF token: %s", resp.Status)
	}
	// A browser that sends Sec-Fetch-Site alone (no Origin) is heard too.
	resp, body := br.post("/do", form(br.csrf), "Origin", "", "Sec-Fetch-Site", "same-origin")
	if resp.StatusCode != http.StatusSeeOther || !strings.Contains(resp.Header.Get("Location"), "done=") {
		t.Fatalf("good request: %s %s", resp.Status, body)
	}
	if a := assigned(t, b, "app"); len(a) != 1 || a[0] != "ace" {
		t.Fatalf("app on %v after the assign", a)
	}
	// A change the mesh refuses says why and changes nothing.
	resp, body = br.post("/do", url.Values{"op": {"assign"}, "node": {"nosuch"}, "module": {"app"}, "csrf": {br.csrf}})
	if resp.StatusCode != http.StatusConflict || !strings.Contains(body, "nosuch") {
		t.Fatalf("assign to an unknown node: %s\n%s", resp.Status, body)
	}
}

func TestLogout(t *testing.T) {
	b := startBed(t)
	one, two := b.browser(), b.browser()
	one.login()
	two.login()
	if resp, _ := one.post("/logout", url.Values{}); resp.StatusCode != http.StatusForbidden {
		t.Fatalf("logout without CSRF: %s", resp.Status)
	}
	if resp, _ := one.post("/logout", url.Values{"csrf": {one.csrf}}); resp.StatusCode != http.StatusSeeOther {
		t.Fatalf("logout: %s", resp.Status)
	}
	if code, _ := one.get("/"); code != http.StatusUnauthorized {
		t.Fatalf("a session after its logout: %d", code)
	}
	if code, _ := two.get("/"); code != 200 {
		t.Fatalf("the other session ended with the first: %d", code)
	}
	unused := b.link()
	var r LogoutReply
	b.local("/v1/web/logout", nil, &r)
	if r.Sessions != 1 {
		t.Fatalf("logout --all ended %d sessions, want 1", r.Sessions)
	}
	if code, _ := two.get("/"); code != http.StatusUnauthorized {
		t.Fatalf("a session after logout --all: %d", code)
	}
	if resp, _ := two.post("/login", url.Values{"token": {unused}}); resp.StatusCode != http.StatusUnauthorized {
		t.Fatalf("a link made before logout --all still logs in: %s", resp.Status)
	}
}

// A browser sends the page's cookie to every port of its host: another
// service there (a module's container publishing HTTPS on the page's
// address, or one tunnelled to the operator's localhost) is given it. From
// any other address than its login's the cookie is no session, and the
// session lives on for its operator.
func TestSessionIsBoundToItsAddress(t *testing.T) {
	b := startBed(t)
	b.add(appManifest)
	br := b.browser()
	br.login()
	u, _ := url.Parse(b.srv.URL)
	var cookie *http.Cookie
	for _, c := range br.hc.Jar.Cookies(u) {
		if c.Name == b.web.CookieName() {
			cookie = c
		}
	}
	if cookie == nil {
		t.Fatal("no session cookie after the login")
	}
	// The bed's browser is at 127.0.0.1; the stray service at another
	// address, a loopback one too, or an IPv6 one.
	for _, from := range []string{"10.0.0.9:40000", "127.0.0.2:40000", "[::1]:40000"} {
		send := func(method, path string, form url.Values) *httptest.ResponseRecorder {
			// Bounded: without a session's binding the event stream
			// would answer, and last.
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
			defer cancel()
			req := httptest.NewRequestWithContext(ctx, method, "http://mesh.test"+path, strings.NewReader(form.Encode()))
			req.RemoteAddr = from
			req.AddCookie(&http.Cookie{Name: cookie.Name, Value: cookie.Value})
			if method == "POST" {
				req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
				req.Header.Set("Origin", "http://mesh.test")
				req.Header.Set("Sec-Fetch-Site", "same-origin")
			}
			rec := httptest.NewRecorder()
			b.web.ServeHTTP(rec, req)
			return rec
		}
		for _, p := range append(pages, "/events") {
			rec := send("GET", p, nil)
			if body := rec.Body.String(); rec.Code != http.StatusUnauthorized || strings.Contains(body, "app.server") || strings.Contains(body, br.csrf) {
				t.Errorf("GET %s with the cookie from %s: %d\n%s", p, from, rec.Code, body)
			}
		}
		do := url.Values{"op": {"assign"}, "node": {"ace"}, "module": {"app"}, "csrf": {br.csrf}}
		if rec := send("POST", "/do", do); rec.Code != http.StatusUnauthorized {
			t.Errorf("POST /do with the cookie from %s: %d %s", from, rec.Code, rec.Body)
		}
		if rec := send("POST", "/logout", url.Values{"csrf": {br.csrf}}); rec.Code != http.StatusUnauthorized {
			t.Errorf("POST /logout with the cookie from %s: %d %s", from, rec.Code, rec.Body)
		}
	}
	if a := assigned(t, b, "app"); len(a) != 0 {
		t.Fatalf("app assigned to %v with a cookie from another address", a)
	}
	// The operator's session is still theirs.
	if code, page := br.get("/"); code != 200 || csrfOf(t, page) != br.csrf {
		t.Fatalf("the operator's page after the cookie was used elsewhere: %d", code)
	}
	resp, body := br.post("/do", url.Values{"op": {"assign"}, "node": {"ace"}, "module": {"app"}, "csrf": {br.csrf}}, "Origin", b.srv.URL)
	if resp.StatusCode != http.StatusSeeOther {
		t.Fatalf("the operator's assign: %s %s", resp.Status, body)
	}
	if a := assigned(t, b, "app"); len(a) != 1 || a[0] != "ace" {
		t.Fatalf("app on %v after the operator's assign", a)
	}
}

// The address is the exact one: another host in an IPv6 /64 is another
// address (the failed-login limit counts by /64, sessions do not).
func TestSessionIsBoundToTheExactAddress(t *testing.T) {
	a := newAccess(time.Now)
	tok, _ := a.mint(time.Minute)
	id, _, ok, _ := a.exchange(tok, netip.MustParseAddr("2001:db8:1:2::1"))
	if !ok {
		t.Fatal("login")
	}
	if sess, elsewhere := a.session(id, netip.MustParseAddr("2001:db8:1:2::2"), true); sess != nil || !elsewhere {
		t.Fatalf("the session from a neighbour in its /64: %v, elsewhere %v", sess, elsewhere)
	}
	if sess, _ := a.session(id, netip.Addr{}, true); sess != nil {
		t.Fatal("the session from no address")
	}
	if sess, _ := a.session(id, netip.MustParseAddr("2001:db8:1:2::1"), true); sess == nil {
		t.Fatal("the session from its own address ended")
	}
}

func TestPages(t *testing.T) {
	b := startBed(t)
	b.add(appManifest)
	b.add(hostileManifest)
	br := b.browser()
	br.login()
	// The dry run shows what the assign would do and writes nothing.
	code, body := br.get("/preview?op=assign&node=ace&module=app")
	if code != 200 || !strings.Contains(body, "create container app.server") || !strings.Contains(body, `id="do"`) {
		t.Fatalf("preview: %d\n%s", code, body)
	}
	if a := assigned(t, b, "app"); len(a) != 0 {
		t.Fatalf("the preview assigned app to %v", a)
	}
	resp, _ := br.post("/do", url.Values{"op": {"assign"}, "node": {"ace"}, "module": {"app"}, "csrf": {br.csrf}})
	if resp.StatusCode != http.StatusSeeOther {
		t.Fatalf("do: %s", resp.Status)
	}
	// A second version of the module: its page follows the change to the
	// input whose digest moved.
	b.add(strings.Replace(appManifest, "port 8080", "port 9090", 1))
	code, body = br.get("/modules/app")
	if code != 200 {
		t.Fatalf("module page: %d\n%s", code, body)
	}
	for _, want := range []string{"Module app", "ace</a>: ", "mesh module add", "/srv/app/app.conf", "the input that moved", "-cause\"", "port 9090"} {
		if !strings.Contains(body, want) {
			t.Errorf("module page lacks %q", want)
		}
	}
	if testing.Verbose() && t.Failed() {
		t.Log(body)
	}
	code, body = br.get("/nodes/ace")
	if code != 200 || !strings.Contains(body, "app.server") || !strings.Contains(body, "mesh assign ace app") {
		t.Fatalf("node page: %d\n%s", code, body)
	}
	p, err := b.client.Plans(context.Background(), "ace", 0)
	if err != nil || len(p.Versions) < 2 {
		t.Fatalf("plans %v %v", p, err)
	}
	from, to := p.Versions[1].Version, p.Versions[0].Version
	code, body = br.get("/nodes/ace?from=" + itoa(from) + "&to=" + itoa(to))
	if code != 200 || !strings.Contains(body, `id="diff"`) || !strings.Contains(body, "/srv/app/app.conf") {
		t.Fatalf("diff page: %d\n%s", code, body)
	}
	if _, body = br.get("/nodes/ace?from=99999&to=" + itoa(to)); !strings.Contains(body, "no plan v99999") {
		t.Errorf("a diff from an unknown version does not say so:\n%s", body)
	}
	code, body = br.get("/roster?q=app")
	if code != 200 || !strings.Contains(body, "mesh assign ace app") {
		t.Fatalf("roster: %d\n%s", code, body)
	}
	if _, body = br.get("/roster?q=zzznothing"); strings.Contains(body, "mesh assign ace app") {
		t.Errorf("the roster's search does not filter")
	}
	if code, body = br.get("/nodes/nosuch"); code != http.StatusNotFound || !strings.Contains(body, "no node nosuch") {
		t.Errorf("unknown node: %d", code)
	}
	// A manifest's text is escaped, everywhere.
	_, body = br.get("/modules/evil")
	if strings.Contains(body, `<script>alert`) || !strings.Contains(body, "&lt;script&gt;alert") {
		t.Fatalf("the manifest's text is not escaped:\n%s", body)
	}
	// The part the script swaps in is the main part alone.
	req, _ := http.NewRequest("GET", b.srv.URL+"/", nil)
	req.Header.Set(partHeader, "main")
	r, err := br.hc.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	part, _ := io.ReadAll(r.Body)
	r.Body.Close()
	if strings.Contains(string(part), "<html") || !strings.Contains(string(part), `data-module="app"`) {
		t.Fatalf("main part:\n%s", part)
	}
}

func itoa(n uint64) string { return strconv.FormatUint(n, 10) }

func TestEventsFollowTheReplica(t *testing.T) {
	b := startBed(t)
	br := b.browser()
	br.login()
	req, _ := http.NewRequest("GET", b.srv.URL+"/events", nil)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	resp, err := (&http.Client{Jar: br.hc.Jar}).Do(req.WithContext(ctx))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != 200 || resp.Header.Get("Content-Type") != "text/event-stream" {
		t.Fatalf("events: %s %s", resp.Status, resp.Header.Get("Content-Type"))
	}
	lines := streamLines(resp.Body)
	b.add(appManifest)
	want, _ := b.member.Store.AppliedIndex()
	for {
		select {
		case l, ok := <-lines:
			if !ok {
				t.Fatal("the stream ended before the change")
			}
			var idx uint64
			if n, _ := fmtSscan(l, &idx); n == 1 && idx >= want {
				// The stream ends with the session, at its next event.
				b.local("/v1/web/logout", nil, nil)
				b.add(hostileManifest)
				ended := time.After(10 * time.Second)
				for {
					select {
					case _, ok := <-lines:
						if !ok {
							return
						}
					case <-ended:
						t.Fatal("the stream outlived its session by 10s")
					}
				}
			}
		case <-ctx.Done():
			t.Fatalf("no event for index %d within 20s", want)
		}
	}
}

func fmtSscan(line string, idx *uint64) (int, error) {
	if !strings.HasPrefix(line, "data: ") {
		return 0, nil
	}
	return fmt.Sscan(strings.TrimPrefix(line, "data: "), idx)
}

func TestSecureCookieOverTLS(t *testing.T) {
	w, err := New(Config{TLS: true, URL: "https://mesh.test", Changed: func() <-chan struct{} { return nil }, Applied: func() (uint64, error) { return 1, nil }})
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewTLSServer(w)
	defer srv.Close()
	rec := httptest.NewRecorder()
	w.LocalHandler().ServeHTTP(rec, httptest.NewRequest("POST", "/v1/web/token", strings.NewReader("{}")))
	var r TokenReply
	json.Unmarshal(rec.Body.Bytes(), &r)
	u, _ := url.Parse(r.URL)
	hc := srv.Client()
	hc.Transport.(*http.Transport).TLSClientConfig = &tls.Config{InsecureSkipVerify: true}
	hc.CheckRedirect = func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }
	req, _ := http.NewRequest("POST", srv.URL+"/login", strings.NewReader(url.Values{"token": {u.Query().Get("token")}}.Encode()))
	req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	req.Header.Set("Origin", srv.URL)
	resp, err := hc.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	var ok bool
	for _, c := range resp.Cookies() {
		ok = ok || (c.Name == w.CookieName() && strings.HasPrefix(c.Name, "__Host-") && c.Secure && c.HttpOnly)
	}
	if !ok || resp.Header.Get("Strict-Transport-Security") == "" {
		t.Fatalf("over TLS: cookies %v, HSTS %q", resp.Cookies(), resp.Header.Get("Strict-Transport-Security"))
	}
}

// openStream opens /events for br and returns its lines, closed at the
// stream's end.
func (br *browser) openStream(ctx context.Context, base string) (*http.Response, <-chan string) {
	br.t.Helper()
	req, _ := http.NewRequestWithContext(ctx, "GET", base+"/events", nil)
	resp, err := (&http.Client{Jar: br.hc.Jar}).Do(req)
	if err != nil {
		br.t.Fatal(err)
	}
	return resp, streamLines(resp.Body)
}

// streamLines reads an event stream's lines, closing the channel at its end.
func streamLines(body io.Reader) <-chan string {
	lines := make(chan string, 64)
	go func() {
		defer close(lines)
		sc := bufio.NewScanner(body)
		for sc.Scan() {
			lines <- sc.Text()
		}
	}()
	return lines
}

// nextIndex waits for the stream's next event of an index at least want.
func nextIndex(t *testing.T, ctx context.Context, lines <-chan string, want uint64) uint64 {
	t.Helper()
	for {
		select {
		case l, ok := <-lines:
			if !ok {
				t.Fatalf("the stream ended before an event for index %d", want)
			}
			var idx uint64
			if n, _ := fmtSscan(l, &idx); n == 1 && idx >= want {
				return idx
			}
		case <-ctx.Done():
			t.Fatalf("no event for index %d in time", want)
		}
	}
}

// A stream starts with where the replica is (the page compares it with
// the index it was rendered at), and outlives the server's read and
// write timeouts, which bound a page's request but not a stream.
func TestEventsStartWithTheIndexAndOutliveTimeouts(t *testing.T) {
	b := startBed(t)
	srv := httptest.NewUnstartedServer(b.web)
	srv.Config.ReadTimeout, srv.Config.WriteTimeout = 500*time.Millisecond, 500*time.Millisecond
	srv.Start()
	defer srv.Close()
	br := b.browser()
	br.login()
	before, _ := b.member.Store.AppliedIndex()
	_, page := br.get("/")
	var at uint64
	if i := strings.Index(page, `data-index="`); i < 0 {
		t.Fatalf("the page does not carry the index it was rendered at:\n%s", page)
	} else if _, err := fmt.Sscanf(page[i:], `data-index="%d"`, &at); err != nil || at < before {
		t.Fatalf("the page carries index %d (%v), the replica was at %d before", at, err, before)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	resp, lines := br.openStream(ctx, srv.URL)
	defer resp.Body.Close()
	now, _ := b.member.Store.AppliedIndex()
	if got := nextIndex(t, ctx, lines, 0); got < at || got > now {
		t.Fatalf("first event %d: want the replica's index, between %d and %d", got, at, now)
	}
	// Past both timeouts (the condition itself is time passing).
	time.Sleep(1500 * time.Millisecond)
	b.add(appManifest)
	want, _ := b.member.Store.AppliedIndex()
	nextIndex(t, ctx, lines, want)
}

// One session holds at most maxSessionStreams streams; another session
// still opens its own.
func TestStreamsPerSessionAreBounded(t *testing.T) {
	b := startBed(t)
	br, other := b.browser(), b.browser()
	br.login()
	other.login()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	for i := range maxSessionStreams {
		resp, lines := br.openStream(ctx, b.srv.URL)
		defer resp.Body.Close()
		if resp.StatusCode != 200 {
			t.Fatalf("stream %d: %s", i, resp.Status)
		}
		nextIndex(t, ctx, lines, 0)
	}
	resp, _ := br.openStream(ctx, b.srv.URL)
	resp.Body.Close()
	if resp.StatusCode != http.StatusServiceUnavailable {
		t.Fatalf("stream %d of one session: %s, want 503", maxSessionStreams+1, resp.Status)
	}
	resp, _ = other.openStream(ctx, b.srv.URL)
	resp.Body.Close()
	if resp.StatusCode != 200 {
		t.Fatalf("another session's stream: %s", resp.Status)
	}
}

// A new login in a browser ends the session it had.
func TestLoginAgainEndsTheLastSession(t *testing.T) {
	b := startBed(t)
	br := b.browser()
	br.login()
	u, _ := url.Parse(b.srv.URL)
	old := br.hc.Jar.Cookies(u)[0].Value
	br.login()
	keep := b.browser()
	keep.hc.Jar.SetCookies(u, []*http.Cookie{{Name: b.web.CookieName(), Value: old}})
	if code, _ := keep.get("/"); code != http.StatusUnauthorized {
		t.Fatalf("the session before a new login still answers: %d", code)
	}
	if code, _ := br.get("/"); code != 200 {
		t.Fatalf("the new session: %d", code)
	}
}

// The page's public-domain change adds or removes one domain: it never
// replaces or clears the node's others, and an empty domain is refused.
func TestPublicDomainAddsOne(t *testing.T) {
	b := startBed(t)
	br := b.browser()
	br.login()
	ctx := context.Background()
	if _, err := b.client.PublicDomain(ctx, "ace", api.DomainRequest{Domains: []string{"one.example"}}); err != nil {
		t.Fatal(err)
	}
	domains := func() []string {
		ns, err := b.client.Nodes(ctx)
		if err != nil || len(ns) != 1 {
			t.Fatalf("nodes %v %v", ns, err)
		}
		return ns[0].Domains()
	}
	for _, op := range []string{"public-domain add", "public-domain remove"} {
		resp, body := br.post("/do", url.Values{"op": {op}, "node": {"ace"}, "domain": {" "}, "csrf": {br.csrf}})
		if resp.StatusCode != http.StatusConflict || !strings.Contains(body, "give the public domain") || !strings.Contains(body, `<option selected>ace</option>`) {
			t.Fatalf("%s of no domain: %s\n%s", op, resp.Status, body)
		}
	}
	if d := domains(); len(d) != 1 || d[0] != "one.example" {
		t.Fatalf("domains %v after refused changes", d)
	}
	if _, body := br.get("/preview?op=public-domain+add&node=ace&domain=two.example"); !strings.Contains(body, `id="do"`) {
		t.Fatalf("preview of public-domain add:\n%s", body)
	}
	resp, body := br.post("/do", url.Values{"op": {"public-domain add"}, "node": {"ace"}, "domain": {"two.example"}, "csrf": {br.csrf}})
	if resp.StatusCode != http.StatusSeeOther {
		t.Fatalf("public-domain add: %s %s", resp.Status, body)
	}
	if d := domains(); !slices.Equal(d, []string{"one.example", "two.example"}) {
		t.Fatalf("domains %v after adding two.example to one.example", d)
	}
	br.post("/do", url.Values{"op": {"public-domain remove"}, "node": {"ace"}, "domain": {"one.example"}, "csrf": {br.csrf}})
	if d := domains(); !slices.Equal(d, []string{"two.example"}) {
		t.Fatalf("domains %v after removing one.example", d)
	}
}

func TestStaticHasNoListing(t *testing.T) {
	b := startBed(t)
	br := b.browser()
	for _, p := range []string{"/static/", "/static"} {
		if code, body := br.get(p); code == 200 || strings.Contains(body, "mesh.js") {
			t.Errorf("GET %s: %d\n%s", p, code, body)
		}
	}
	if code, _ := br.get("/static/mesh.js"); code != 200 {
		t.Errorf("mesh.js: %d", code)
	}
	// The pages link each asset by its digest, which the browser may keep
	// for ever; any other form of its address is not kept.
	_, login := br.get("/login")
	if !strings.Contains(login, `src="`+assetURL("mesh.js")+`"`) || len(assetDigest("mesh.js")) != 16 {
		t.Fatalf("the page does not link mesh.js by its digest:\n%s", login)
	}
	for u, want := range map[string]string{
		assetURL("mesh.css"):                  "public, max-age=31536000, immutable",
		"/static/mesh.css":                    "no-store",
		"/static/mesh.css?v=0123456789abcdef": "no-store",
	} {
		resp, err := br.hc.Get(b.srv.URL + u)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if got := resp.Header.Get("Cache-Control"); got != want {
			t.Errorf("%s: Cache-Control %q, want %q", u, got, want)
		}
	}
}

func TestCookieNamePerPort(t *testing.T) {
	for _, tc := range []struct {
		url  string
		tls  bool
		want string
	}{
		{"http://127.0.0.1:8080", false, "mesh_session_8080"},
		{"https://10.0.0.1:8443", true, "__Host-mesh_session_8443"},
		{"http://mesh.test", false, "mesh_session"},
	} {
		if got := cookieName(tc.url, tc.tls); got != tc.want {
			t.Errorf("cookieName(%s, %v) = %s, want %s", tc.url, tc.tls, got, tc.want)
		}
	}
}

// How an instance is shown when its node cannot say, or says its plan or
// apply failed, or that the module waits.
func TestInstanceOf(t *testing.T) {
	seen := time.Now().Add(-time.Hour)
	node := func(name string, mod func(*api.NodeStatus)) api.NodeStatus {
		n := api.NodeStatus{Reachable: true, PlanVersion: 3, AppliedVersion: 3, Report: &state.Report{Node: name}}
		n.Name = name
		if mod != nil {
			mod(&n)
		}
		return n
	}
	st := api.Status{Nodes: []api.NodeStatus{
		node("ok", nil),
		node("gone", func(n *api.NodeStatus) { n.Reachable, n.LastSeen = false, &seen }),
		node("nocompose", func(n *api.NodeStatus) { n.ComposeError = "route www claimed twice" }),
		node("applyerr", func(n *api.NodeStatus) { n.Report.Error = "podman socket down" }),
		node("secret", func(n *api.NodeStatus) {
			n.Report.Failures = []state.ModuleFailure{{Module: "app", Resource: "container app.server", Reason: "not set", Secret: "apikey"}}
		}),
		node("gate", func(n *api.NodeStatus) {
			n.Report.Failures = []state.ModuleFailure{{Module: "app", Resource: "container app.server", Reason: "db starting", Provider: "db", HealthGate: true}}
		}),
		node("broken", func(n *api.NodeStatus) {
			n.Report.Failures = []state.ModuleFailure{{Module: "app", Resource: "container app.server", Reason: "image not found"}}
		}),
	}}
	for node, want := range map[string]string{"ok": "applied", "gone": "unknown", "nocompose": "failing", "applyerr": "failing", "secret": "waiting", "gate": "waiting", "broken": "failing"} {
		in := instanceOf(st, "app", node)
		if in.Health != want || (want != "applied" && in.Reason == "") {
			t.Errorf("%s: %s (%s), want %s with a reason", node, in.Health, in.Reason, want)
		}
		if needsCare(in.Health) == (want == "applied") {
			t.Errorf("%s: needsCare(%s) = %v", node, in.Health, needsCare(in.Health))
		}
	}
	if in := instanceOf(st, "app", "gone"); !strings.Contains(in.Reason, "unreachable") {
		t.Errorf("unreachable node's reason: %q", in.Reason)
	}
}

func TestModuleNamesAreExact(t *testing.T) {
	roster := []state.Name{
		{Name: "db.mesh", Node: "a"}, {Name: "db.mesh", Node: "b"}, {Name: "mydb.mesh", Node: "a"},
		{Name: "db.other.mesh", Node: "a"}, {Name: "shop.db.mesh", Node: "a"}, {Name: "admin.example", Node: "a"},
	}
	got := moduleNames(roster, "db", "mesh", []state.Route{{Name: "admin.example", Module: "db"}, {Name: "www.example", Module: "web"}}, []string{"a"})
	want := []state.Name{{Name: "db.mesh", Node: "a"}, {Name: "admin.example", Node: "a"}}
	if !slices.Equal(got, want) {
		t.Fatalf("names of db: %v, want %v", got, want)
	}
}

// The fleet page of a large fleet: problems cut at problemsShown with a
// link to all, modules a page at a time (those that need care first), a
// filter by name, and the roster cut at maxNames.
func TestFleetPagesAndFilters(t *testing.T) {
	b := startBed(t)
	ctx := context.Background()
	for i := range problemsShown + 10 {
		// Nodes that run no agent: each an "unreachable" problem.
		if _, err := b.member.Node.Propose(ctx, &state.NodeAddRequest{Node: state.Node{Name: fmt.Sprintf("d%03d", i), Address: fmt.Sprintf("10.9.0.%d", i+1)}}); err != nil {
			t.Fatal(err)
		}
	}
	// Ten modules a command: a module add of more is of format 17, which
	// waits until every node is known to apply it, and these nodes never
	// say (nor gave an overlay key, which only a binary of format 7 or
	// later gives).
	for from := 0; from < 250; from += 10 {
		var texts []state.ModuleText
		for j := from; j < from+10; j++ {
			texts = append(texts, state.ModuleText{File: fmt.Sprintf("w%04d.yaml", j), Text: strings.ReplaceAll(appManifest, "app", fmt.Sprintf("w%04d", j))})
		}
		if _, err := b.client.AddModules(ctx, api.AddRequest{Modules: texts}); err != nil {
			t.Fatal(err)
		}
	}
	// One module on an unreachable node: it needs care, so it comes first.
	if _, err := b.client.Assign(ctx, state.OpAssign, "d007", "w0200"); err != nil {
		t.Fatal(err)
	}
	br := b.browser()
	br.login()
	_, page := br.get("/")
	rows := func(page string) []string {
		var out []string
		for _, part := range strings.Split(page, `class="module-row" data-module="`)[1:] {
			out = append(out, part[:strings.IndexByte(part, '"')])
		}
		return out
	}
	if got := strings.Count(page, `<li class="problem">`); got != problemsShown || !strings.Contains(page, "and 10 more") {
		t.Errorf("fleet page lists %d problems, want %d and a link to 10 more", got, problemsShown)
	}
	// More than nodesOpen nodes: the table is folded under its summary.
	if !strings.Contains(page, `<details id="nodes-details">`) || !strings.Contains(page, "61 nodes: 1 reachable") || !strings.Contains(page, "60 unreachable") {
		t.Errorf("the node table of 61 nodes is not folded under its summary")
	}
	if r := rows(page); len(r) != modulesPerPage || r[0] != "w0200" || r[1] != "w0000" || !strings.Contains(page, "Modules 1 to 100 of 250") {
		t.Fatalf("page 1: %d rows, first %v", len(r), r[:min(2, len(r))])
	}
	_, page = br.get("/?page=3")
	if r := rows(page); len(r) != 50 || r[49] != "w0249" || strings.Contains(page, `id="next-page"`) {
		t.Fatalf("page 3: %d rows", len(r))
	}
	_, page = br.get("/?page=99") // past the end: the last page
	if r := rows(page); len(r) != 50 {
		t.Fatalf("page 99: %d rows", len(r))
	}
	_, page = br.get("/?q=w01&page=1")
	if r := rows(page); len(r) != 100 || r[0] != "w0100" || !strings.Contains(page, "of 100 whose name has") {
		t.Fatalf("filter w01: %d rows", len(r))
	}
	_, page = br.get("/?problems=all")
	if got := strings.Count(page, `<li class="problem">`); got != problemsShown+10 {
		t.Errorf("all problems: %d", got)
	}
	if _, page = br.get("/?q=%3Cscript%3E"); strings.Contains(page, "<script>") || !strings.Contains(page, "No module") {
		t.Errorf("a filter is not escaped, or matches:\n%s", page)
	}
	// The roster: at most maxNames names, and how many more.
	var more []state.ModuleText
	for j := 250; j < 250+maxNames; j++ {
		more = append(more, state.ModuleText{File: fmt.Sprintf("w%04d.yaml", j), Text: strings.ReplaceAll(appManifest, "app", fmt.Sprintf("w%04d", j))})
	}
	b.client.AddModules(ctx, api.AddRequest{Modules: more})
	for j := range maxNames + 5 {
		if _, err := b.client.Assign(ctx, state.OpAssign, "ace", fmt.Sprintf("w%04d", j)); err != nil {
			t.Fatal(err)
		}
	}
	all, _ := b.client.Roster(ctx)
	_, page = br.get("/roster")
	names := page[strings.Index(page, `id="roster-table"`):strings.Index(page, `<h2>History`)]
	if got := strings.Count(names, `<tr><td>`); got != maxNames || !strings.Contains(page, fmt.Sprintf("%d more names not shown", len(all)-maxNames)) {
		t.Errorf("roster shows %d of %d names, want %d and how many more", got, len(all), maxNames)
	}
}

// Over HTTP/2 (what a browser speaks to the page over TLS) a stream lives
// past writeWait with nothing to write: a write's deadline is lifted once
// the write is out (a deadline left set resets an HTTP/2 stream).
func TestEventsOverHTTP2OutliveWriteWait(t *testing.T) {
	b := startBed(t)
	oldWait, oldAlive := writeWait, keepAlive
	writeWait, keepAlive = 300*time.Millisecond, 5*time.Second
	t.Cleanup(func() { writeWait, keepAlive = oldWait, oldAlive })
	srv := httptest.NewUnstartedServer(b.web)
	srv.EnableHTTP2 = true
	srv.StartTLS()
	defer srv.Close()
	br := b.browser()
	br.login()
	u, _ := url.Parse(b.srv.URL)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, "GET", srv.URL+"/events", nil)
	req.AddCookie(br.hc.Jar.Cookies(u)[0])
	resp, err := srv.Client().Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if resp.ProtoMajor != 2 || resp.StatusCode != 200 {
		t.Fatalf("events: %s over %s", resp.Status, resp.Proto)
	}
	lines := streamLines(resp.Body)
	nextIndex(t, ctx, lines, 0)
	// Four times writeWait with nothing written (the condition is time
	// passing), then a change: it comes on the same stream.
	time.Sleep(4 * writeWait)
	b.add(appManifest)
	want, _ := b.member.Store.AppliedIndex()
	nextIndex(t, ctx, lines, want)
}

// What the page's script asks by itself (its stream, the refreshes events
// bring) does not keep the session alive: only the operator's own requests
// do.
func TestScriptRequestsDoNotKeepTheSession(t *testing.T) {
	b := startBed(t)
	br := b.browser()
	br.login()
	half := SessionIdle/2 + time.Minute
	b.clock.add(half)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	resp, lines := br.openStream(ctx, b.srv.URL)
	if resp.StatusCode != 200 {
		t.Fatalf("events: %s", resp.Status)
	}
	nextIndex(t, ctx, lines, 0)
	resp.Body.Close()
	req, _ := http.NewRequest("GET", b.srv.URL+"/", nil)
	req.Header.Set(partHeader, "main")
	r, err := br.hc.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	r.Body.Close()
	if r.StatusCode != 200 {
		t.Fatalf("a refresh: %s", r.Status)
	}
	b.clock.add(half)
	if code, _ := br.get("/"); code != http.StatusUnauthorized {
		t.Fatalf("a session only the script used for %s still answers: %d", SessionIdle, code)
	}
	// The operator's own request keeps it.
	other := b.browser()
	other.login()
	b.clock.add(half)
	other.get("/roster")
	b.clock.add(half)
	if code, _ := other.get("/"); code != 200 {
		t.Fatalf("a session used %s ago: %d", half, code)
	}
}

// A login from another site comes before the failed-login limit, and
// anybody reaching the port can send it: refused each time, it is logged
// once a minute at most (each was a warning, which a loop of requests
// turned into a full log).
func TestCrossSiteLoginsDoNotFillTheLog(t *testing.T) {
	b := startBed(t)
	logger, out := testutil.NewLog()
	w, err := New(Config{Client: b.client, Changed: b.member.Store.Changed, Applied: b.member.Store.AppliedIndex, URL: "http://mesh.test", Logger: logger, Now: b.clock.now})
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(w)
	defer srv.Close()
	const tries = 20
	for i := range tries {
		req, _ := http.NewRequest("POST", srv.URL+"/login", strings.NewReader(url.Values{"token": {"guess"}}.Encode()))
		req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
		req.Header.Set("Sec-Fetch-Site", "cross-site")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusForbidden {
			t.Fatalf("cross-site login %d: %s, want 403", i, resp.Status)
		}
	}
	if n := out.Count("web login refused"); n != 1 {
		t.Fatalf("%d cross-site logins logged %d times, want once:\n%s", tries, n, out.String())
	}
}
