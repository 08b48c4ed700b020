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
	"net/url"
	"os"
	"path/filepath"
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
	t      *testing.T
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

func startBed(t *testing.T) *bed {
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
	t    *testing.T
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

func (br *browser) post(path string, form url.Values, header ...string) (*http.Response, string) {
	br.t.Helper()
	req, _ := http.NewRequest("POST", br.b.srv.URL+path, strings.NewReader(form.Encode()))
	req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	for i := 0; i+1 < len(header); i += 2 {
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

func csrfOf(t *testing.T, page string) string {
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
	forged.hc.Jar.SetCookies(u, []*http.Cookie{{Name: CookieName, Value: strings.Repeat("A", 43)}})
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
		if c.Name == CookieName {
			cookie = c
		}
	}
	if cookie == nil || !cookie.HttpOnly || cookie.SameSite != http.SameSiteStrictMode || cookie.Secure || cookie.Path != "/" {
		t.Fatalf("session cookie %+v: want HttpOnly, SameSite=Strict, not Secure over plain HTTP", cookie)
	}
	if strings.Contains(cookie.Value, tok) {
		t.Fatal("the session id is the login token")
	}
	if code, body := br.get("/"); code != 200 || !strings.Contains(body, `data-node="ace"`) {
		t.Fatalf("fleet page: %d\n%s", code, body)
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
	good := b.link()
	resp, _ := br.post("/login", url.Values{"token": {good}})
	if resp.StatusCode != http.StatusTooManyRequests || resp.Header.Get("Retry-After") == "" {
		t.Fatalf("after %d failures: %s, want 429 with Retry-After", loginBurst, resp.Status)
	}
	// The limited attempt did not spend the good token: once the address
	// is heard again, it logs in.
	b.clock.add(loginEvery)
	if resp, body := br.post("/login", url.Values{"token": {good}}); resp.StatusCode != http.StatusSeeOther {
		t.Fatalf("good token after the wait: %s %s", resp.Status, body)
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
		"cross-site request": {form(br.csrf), []string{"Sec-Fetch-Site", "cross-site"}},
		"same-site request":  {form(br.csrf), []string{"Sec-Fetch-Site", "same-site"}},
	} {
		if resp, body := br.post("/do", tc.form, tc.header...); resp.StatusCode != http.StatusForbidden {
			t.Errorf("%s: %s %s", name, resp.Status, body)
		}
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
	resp, body := br.post("/do", form(br.csrf), "Origin", b.srv.URL, "Sec-Fetch-Site", "same-origin")
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
	lines := make(chan string)
	go func() {
		sc := bufio.NewScanner(resp.Body)
		for sc.Scan() {
			lines <- sc.Text()
		}
		close(lines)
	}()
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
				// The stream ends with the session.
				b.local("/v1/web/logout", nil, nil)
				b.add(hostileManifest)
				for range lines {
				}
				return
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
	w, err := New(Config{TLS: true, URL: "https://mesh.test", Changed: func() <-chan struct{} { return nil }})
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
	resp, err := hc.PostForm(srv.URL+"/login", url.Values{"token": {u.Query().Get("token")}})
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	var ok bool
	for _, c := range resp.Cookies() {
		ok = ok || (c.Name == CookieName && c.Secure && c.HttpOnly)
	}
	if !ok || resp.Header.Get("Strict-Transport-Security") == "" {
		t.Fatalf("over TLS: cookies %v, HSTS %q", resp.Cookies(), resp.Header.Get("Strict-Transport-Security"))
	}
}
