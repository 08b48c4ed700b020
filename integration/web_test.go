package integration

import (
	"context"
	"crypto/sha256"
	"crypto/tls"
	"crypto/x509"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
	"github.com/chromedp/chromedp/kb"
)

// The web page's bed (issue "a web page for the fleet"): a real three-node
// mesh whose n1 serves the page on its mesh address (so over TLS with its
// node certificate), driven by a real headless Chromium from the host.
const webModule = `module: webmod
resources:
  - directory: /srv/webmod
  - file: /srv/webmod/site.conf
    content: "colour blue\n"
  - secret: /srv/webmod/api.key
    name: apikey
  - container: webmod.server
    image: ` + bedImage + `
    command: ["sh", "-c", "trap 'exit 0' TERM; while true; do sleep 1; done"]
    restart-on: [/srv/webmod/site.conf]
`

func TestWebBed(t *testing.T) {
	chromium, err := findChromium()
	if err != nil {
		t.Fatal("no Chromium on this host: install Debian's chromium (contrib/test.sh does)")
	}
	n, token, web, base := startWebMesh(t)
	var tr struct {
		URL, Fingerprint string
	}
	if err := json.Unmarshal([]byte(n[1].mesh("web", "token", "--ttl", "5m", "--json")), &tr); err != nil {
		t.Fatal(err)
	}
	link := tr.URL
	if !strings.HasPrefix(link, base+"/login?token=") {
		t.Fatalf("mesh web token printed %q, want a link to %s", link, base)
	}
	// The page serves a certificate of its own: the one whose fingerprint
	// the link came with, a leaf (not a CA), not the mesh CA's (a browser
	// told to trust that CA would take any name a voter's key can sign).
	served := servedCertificate(t, web)
	sum := sha256.Sum256(served.Raw)
	if got := strings.ReplaceAll(tr.Fingerprint, ":", ""); !strings.EqualFold(got, hex.EncodeToString(sum[:])) || served.IsCA {
		t.Fatalf("served certificate %x (CA %v), mesh web token says %s", sum, served.IsCA, tr.Fingerprint)
	}
	caPEM, _ := os.ReadFile(filepath.Join(n[1].h.dir, "ca.crt"))
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(caPEM)
	if _, err := served.Verify(x509.VerifyOptions{Roots: pool}); err == nil {
		t.Fatal("the page serves a certificate of the mesh CA")
	}
	// Without a session nothing answers (over the real TLS listener).
	insecure := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{TLSClientConfig: &tls.Config{InsecureSkipVerify: true}}}
	for _, p := range []string{"/", "/nodes/n1", "/modules/webmod", "/roster", "/preview", "/events"} {
		resp, err := insecure.Get(base + p)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusUnauthorized {
			t.Fatalf("GET %s without a session: %s", p, resp.Status)
		}
	}
	// A flood of connections from one outsider (the host, on the bed's
	// network) held open, then let go: the page answers again.
	insecure.CloseIdleConnections()
	var flood []net.Conn
	for range 40 {
		c, err := net.DialTimeout("tcp", web, 5*time.Second)
		if err != nil {
			t.Fatal(err)
		}
		flood = append(flood, c)
	}
	for _, c := range flood {
		c.Close()
	}
	eventually(t, 30*time.Second, "the page answers after the flood", func() (bool, string) {
		resp, err := insecure.Get(base + "/")
		if err != nil {
			return false, err.Error()
		}
		resp.Body.Close()
		return resp.StatusCode == http.StatusUnauthorized, resp.Status
	})
	art := filepath.Join(artifactsDir(), "web")
	os.MkdirAll(art, 0o755)

	browser := startChromium(t, chromium, served)
	var ctx context.Context
	step := func() {
		var c context.CancelFunc
		ctx, c = context.WithTimeout(browser, 45*time.Second)
		t.Cleanup(c)
	}
	failed := func(what string, err error) {
		t.Helper()
		dctx, c := context.WithTimeout(browser, 10*time.Second)
		defer c()
		html, _ := chromedp.Run(dctx, chromedp.OuterHTML(chromedp.CSS("html")))
		url, _ := chromedp.Run(dctx, chromedp.Evaluate[string](`location.href`))
		t.Logf("at %s", url)
		t.Fatalf("%s: %v\npage:\n%s\n%s", what, err, tail(html, 3000), tail(n[1].log(), 3000))
	}
	run := func(what string, steps ...chromedp.Action[chromedp.Void]) {
		t.Helper()
		step()
		if err := chromedp.Do(ctx, steps...); err != nil {
			failed(what, err)
		}
	}
	// runLive is run for steps that find an element and then act on it in
	// a live page: the stream can replace the content between the two
	// (Chromium then says "Could not find node with given id"), and the
	// steps are run again from the start, within a deadline.
	runLive := func(what string, steps ...chromedp.Action[chromedp.Void]) {
		t.Helper()
		deadline := time.Now().Add(40 * time.Second)
		for {
			step()
			err := chromedp.Do(ctx, steps...)
			if err == nil {
				return
			}
			if !strings.Contains(err.Error(), "Could not find node with given id") || time.Now().After(deadline) {
				failed(what, err)
			}
			t.Logf("%s: the page changed under the step (%v); again", what, err)
		}
	}
	value := func(what string, a chromedp.Action[string]) string {
		t.Helper()
		step()
		v, err := chromedp.Run(ctx, a)
		if err != nil {
			failed(what, err)
		}
		return v
	}
	// Log in with the link; see the three nodes.
	run("open the link", chromedp.Navigate(link), chromedp.WaitVisible(chromedp.CSS("#login")))
	run("press Log in", chromedp.Click(chromedp.CSS("#login")))
	run("see the fleet", chromedp.WaitVisible(chromedp.CSS(`tr[data-node="n3"]`)))
	if rows := value("count the nodes", chromedp.Evaluate[string](`String(document.querySelectorAll("tr.node-row").length)`)); rows != "3" {
		t.Fatalf("the fleet page shows %s nodes, want 3", rows)
	}
	// Over TLS the page speaks HTTP/2: each open tab's event stream would
	// hold one of a browser's six HTTP/1.1 connections to the host.
	if proto := value("read the protocol", chromedp.Evaluate[string](`performance.getEntriesByType("navigation")[0].nextHopProtocol`)); proto != "h2" {
		t.Fatalf("the page was served over %q, want h2", proto)
	}
	run("see the stream open", chromedp.WaitVisible(chromedp.CSS(`#live.live:not(.off)`)))
	// The keyboard: the first Tab reaches the skip link and Enter moves to
	// the content; each Tab stop after it is a link, a button, a field or a
	// summary, and shows that it has the focus.
	run("tab to the skip link", chromedp.KeyEvent(kb.Tab))
	if f := value("read the focus", chromedp.Evaluate[string](`document.activeElement.textContent`)); f != "Skip to the content" {
		t.Fatalf("the first Tab stop is %q, want the skip link", f)
	}
	run("skip to the content", chromedp.KeyEvent(kb.Enter))
	if h := value("read the hash", chromedp.Evaluate[string](`location.hash`)); h != "#main" {
		t.Fatalf("the skip link led to %q", h)
	}
	stops := 0
	for ; stops < 40; stops++ {
		run("tab", chromedp.KeyEvent(kb.Tab))
		stop := value("read the focus", chromedp.Evaluate[string](`(function(){var e=document.activeElement, s=getComputedStyle(e);
			return e.tagName + " " + s.outlineStyle + " " + (e.getBoundingClientRect().width > 0)})()`))
		f := strings.Fields(stop)
		if len(f) > 0 && f[0] == "BODY" {
			break // past the page's last stop: the focus leaves the page
		}
		if len(f) != 3 || !slices.Contains([]string{"A", "BUTTON", "INPUT", "SELECT", "SUMMARY"}, f[0]) || f[1] == "none" || f[2] != "true" {
			t.Fatalf("Tab stop %d after the skip link: %q (tag, outline style, visible)", stops+1, stop)
		}
	}
	// The three nodes' links, the folded table's summary, the filter's
	// field and button at least.
	if stops < 6 || stops == 40 {
		t.Fatalf("%d Tab stops in the fleet page's content", stops)
	}
	// Assign from the CLI: the module appears without a reload.
	value("mark the page", chromedp.Evaluate[string](`window.meshMark = "kept"`))
	os.WriteFile(filepath.Join(n[1].h.dir, "webmod.yaml"), []byte(webModule), 0o644)
	n[1].mesh("module", "add", filepath.Join(n[1].h.dir, "webmod.yaml"))
	n[2].mesh("assign", "n2", "webmod")
	n[1].mesh("secret", "set", "webmod", "apikey", "--from-file", writeSecret(t, n[1].h.dir, "s3cr3t-web-bed-value"))
	run("see the assign without a reload", chromedp.WaitVisible(chromedp.CSS(`tr[data-module="webmod"] a[href="/nodes/n2"]`)))
	if mark := value("read the mark", chromedp.Evaluate[string](`window.meshMark || "reloaded"`)); mark != "kept" {
		t.Fatalf("the page reloaded to show the assign (mark %q)", mark)
	}
	eventually(t, 60*time.Second, "webmod runs on n2", func() (bool, string) {
		out := n[2].mesh("status", "--json")
		return strings.Contains(out, `"webmod.server"`), tail(out, 500)
	})
	// Change the file the container restarts on: the module's page follows
	// the replacement to the input whose digest moved.
	os.WriteFile(filepath.Join(n[1].h.dir, "webmod.yaml"), []byte(strings.Replace(webModule, "colour blue", "colour green", 1)), 0o644)
	n[1].mesh("module", "add", filepath.Join(n[1].h.dir, "webmod.yaml"))
	runLive("follow a change to its cause",
		chromedp.Navigate(base+"/modules/webmod"),
		chromedp.WaitVisible(chromedp.CSS(`a.cause`)),
		chromedp.Click(chromedp.CSS(`a.cause`)))
	hash := value("read the hash", chromedp.Evaluate[string](`location.hash`))
	cause := value("read the cause", chromedp.Text(chromedp.CSS(`li:target`)))
	if !strings.HasSuffix(hash, "-cause") || !strings.Contains(cause, "/srv/webmod/site.conf") || !strings.Contains(cause, "→") {
		t.Fatalf("the cause link led to %q: %q", hash, cause)
	}
	// A dry run: what an unassign would do, and nothing done.
	runLive("preview an unassign",
		chromedp.Navigate(base+"/preview"),
		chromedp.SetValue(chromedp.CSS(`#op`), "unassign"),
		chromedp.SetValue(chromedp.CSS(`#node`), "n2"),
		chromedp.SetValue(chromedp.CSS(`#module`), "webmod"),
		chromedp.Click(chromedp.CSS(`#preview`)),
		chromedp.WaitVisible(chromedp.CSS(`#result`)))
	result := value("read the preview", chromedp.Text(chromedp.CSS(`#result`)))
	if !strings.Contains(result, "remove container webmod.server") || !strings.Contains(result, "n2") {
		t.Fatalf("the preview says:\n%s", result)
	}
	if out := n[1].mesh("module", "list"); !strings.Contains(out, "n2") {
		t.Fatalf("the preview unassigned webmod:\n%s", out)
	}
	// Screenshots at a phone's width and a desktop's; no page scrolls
	// sideways on the phone.
	for _, size := range []struct {
		name          string
		width, height int64
		mobile        bool
	}{{"phone", 390, 844, true}, {"desktop", 1280, 900, false}} {
		for _, p := range []string{"/", "/modules/webmod", "/nodes/n2"} {
			vp := []chromedp.EmulateViewportOption{}
			if size.mobile {
				vp = append(vp, chromedp.EmulateMobile)
			}
			run("open "+p+" on a "+size.name,
				chromedp.EmulateViewport(size.width, size.height, vp...),
				chromedp.Navigate(base+p),
				chromedp.WaitVisible(chromedp.CSS(`main h1`)))
			wide := value("measure "+p, chromedp.Evaluate[string](`String(document.documentElement.scrollWidth > window.innerWidth + 1)`)) == "true"
			step()
			shot, err := chromedp.Run(ctx, chromedp.FullScreenshot(100))
			if err != nil {
				failed("screenshot "+p, err)
			}
			name := size.name + strings.ReplaceAll(p, "/", "_") + ".png"
			if err := os.WriteFile(filepath.Join(art, name), shot, 0o644); err != nil {
				t.Fatal(err)
			}
			if wide && size.mobile {
				t.Errorf("%s scrolls sideways at %dpx", p, size.width)
			}
		}
	}
	t.Logf("screenshots in %s", art)
	// No secret, credential or key in any page.
	key, _ := os.ReadFile(filepath.Join(n[1].n.dir, "node.key"))
	keyLine := strings.Split(string(key), "\n")[1]
	for _, p := range []string{"/", "/nodes/n1", "/nodes/n2", "/modules/webmod", "/roster", "/preview?op=assign&node=n3&module=webmod"} {
		run("open "+p, chromedp.Navigate(base+p), chromedp.WaitVisible(chromedp.CSS(`main h1`)))
		html := value("read "+p, chromedp.OuterHTML(chromedp.CSS("html")))
		for what, secret := range map[string]string{"the operator's secret": "s3cr3t-web-bed-value", "the join token": token, "the node key": keyLine} {
			if secret != "" && strings.Contains(html, secret) {
				t.Errorf("%s shows %s", p, what)
			}
		}
	}
	// Logging out every session: the browser's page answers no more.
	n[1].mesh("web", "logout", "--all")
	run("a session after logout --all", chromedp.Navigate(base+"/"), chromedp.WaitVisible(chromedp.CSS(`main h1`)))
	status := value("read the page", chromedp.Text(chromedp.CSS(`main`)))
	if !strings.Contains(status, "Log in with a link") {
		t.Fatalf("after logout --all the page shows:\n%s", status)
	}
}

// servedCertificate is the certificate addr serves over TLS.
func servedCertificate(t testing.TB, addr string) *x509.Certificate {
	t.Helper()
	conn, err := tls.Dial("tcp", addr, &tls.Config{InsecureSkipVerify: true})
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	return conn.ConnectionState().PeerCertificates[0]
}

// startChromium starts Debian's headless Chromium, which takes the page's
// certificate trust, by its key, and no other; it ends with the test.
func startChromium(t testing.TB, chromium string, trust *x509.Certificate) context.Context {
	t.Helper()
	spki := sha256.Sum256(trust.RawSubjectPublicKeyInfo)
	opts := append(chromedp.DefaultExecAllocatorOptions[:], chromedp.ExecPath(chromium), chromedp.NoSandbox,
		chromedp.Flag("ignore-certificate-errors-spki-list", base64.StdEncoding.EncodeToString(spki[:])),
		chromedp.UserDataDir(t.TempDir()),
		chromedp.Flag("disable-gpu", true), chromedp.WindowSize(1280, 900))
	actx, cancelAlloc := chromedp.NewExecAllocator(context.Background(), opts...)
	browser, cancel := chromedp.NewContext(actx)
	t.Cleanup(func() { cancel(); cancelAlloc() })
	// The browser lives as long as the context of its first action: start
	// it on one without a deadline, and give each step its own.
	if err := chromedp.Do(browser); err != nil {
		t.Fatalf("start Chromium: %v", err)
	}
	return browser
}

// startWebMesh starts the three-node bed with n1 serving the page on its
// address (TLS), which the host reaches over the bed's bridge.
func startWebMesh(t testing.TB) (n []*agent, token, web, base string) {
	n, token = startThree(t, func(n []*agent) {
		web = n[1].addr() + ":8430"
		n[1].extra = []string{"--web-listen", web}
	})
	sh(t, "ip", "addr", "add", multiNet+"254/24", "dev", multiBridge)
	return n, token, web, "https://" + web
}

func writeSecret(t *testing.T, dir, value string) string {
	p := filepath.Join(dir, "secret.value")
	if err := os.WriteFile(p, []byte(value), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

func artifactsDir() string {
	if d := os.Getenv("MESH_ARTIFACTS"); d != "" {
		return d
	}
	return "/var/tmp/mesh-artifacts"
}

func findChromium() (string, error) {
	for _, p := range []string{"/usr/bin/chromium", "/usr/bin/chromium-browser", "/usr/bin/google-chrome"} {
		if _, err := os.Stat(p); err == nil {
			return p, nil
		}
	}
	return "", os.ErrNotExist
}
