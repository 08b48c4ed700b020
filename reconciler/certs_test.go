package reconciler

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"math/big"
	"net"
	"strings"
	"testing"
	"time"

	"mesh/state"
	"mesh/state/manifest"
)

// logsRT is a runtime whose only call is Logs.
type logsRT struct {
	Runtime
	logs string
}

func (l logsRT) Logs(ctx context.Context, id string, n int) (string, error) { return l.logs, nil }

// A proxy's output as Caddy writes it: the ACME error for one name, among
// lines about others.
const caddyLog = `{"level":"info","ts":1,"logger":"tls.obtain","msg":"acquiring lock","identifier":"new.example.org"}
{"level":"error","ts":2,"logger":"tls.obtain","msg":"could not get certificate from issuer","identifier":"new.example.org","issuer":"10.0.0.3-14000-dir","error":"HTTP 0 - Get \"https://10.0.0.3:14000/dir\": dial tcp 10.0.0.3:14000: connect: connection refused"}
{"level":"error","ts":3,"logger":"tls.obtain","msg":"will retry","identifier":"other.example.org","error":"rate limited"}
{"level":"info","ts":4,"logger":"tls.obtain","msg":"releasing lock","identifier":"new.example.org"}
`

func TestLastLoggedError(t *testing.T) {
	got := lastLoggedError(caddyLog, "new.example.org")
	if got != `could not get certificate from issuer: HTTP 0 - Get "https://10.0.0.3:14000/dir": dial tcp 10.0.0.3:14000: connect: connection refused` {
		t.Fatalf("got %q", got)
	}
	retry := `{"level":"error","ts":5,"logger":"tls.obtain","msg":"will retry","error":"[new.example.org] Obtain: registering account [] with server: connection refused","attempt":1}` + "\n"
	if got := lastLoggedError(caddyLog+retry, "new.example.org"); got != "Obtain: registering account [] with server: connection refused" {
		t.Fatalf("Caddy's will-retry line: %q", got)
	}
	if got := lastLoggedError(caddyLog, "ok.example.org"); got != "" {
		t.Fatalf("a name the log says nothing bad of: %q", got)
	}
	if got := lastLoggedError("2026/12/01 nginx: [error] cert for plain.example.org not found\n", "plain.example.org"); got != "" {
		t.Fatalf("a plain line (it carries a time, and would be a new report at every look): %q", got)
	}
	if got := lastLoggedError(caddyLog, "example.org"); got != "" {
		t.Fatalf("a name that is the end of another: %q", got)
	}
}

// The node reports, per public routed name, the certificate the container
// publishing 443 serves for it, or why none: a certificate for another
// name, or no answer, with the error the proxy logged for the name.
func TestProbeCerts(t *testing.T) {
	k, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	notAfter := time.Now().Add(time.Hour).Truncate(time.Second)
	ca := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "Bed Intermediate"}, NotBefore: time.Now().Add(-time.Minute), NotAfter: notAfter,
		DNSNames: []string{"ok.example.org"}}
	der, err := x509.CreateCertificate(rand.Reader, ca, ca, &k.PublicKey, k)
	if err != nil {
		t.Fatal(err)
	}
	cfg := &tls.Config{GetCertificate: func(h *tls.ClientHelloInfo) (*tls.Certificate, error) {
		if h.ServerName == "broken.example.org" {
			return nil, nil // as Caddy with no certificate: the handshake fails
		}
		return &tls.Certificate{Certificate: [][]byte{der}, PrivateKey: k}, nil
	}}
	ln, err := tls.Listen("tcp", "127.0.0.1:0", cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() { c.(*tls.Conn).Handshake(); c.Close() }()
		}
	}()
	_, port, _ := net.SplitHostPort(ln.Addr().String())

	plan := &state.Plan{
		Resources: []state.Resource{
			{Module: "proxy", Kind: manifest.KindContainer, Name: "proxy.server", Typed: manifest.Typed{PublicPorts: []manifest.Port{{HostPort: 80, Protocol: "tcp"}, {HostPort: 443, Protocol: "tcp"}}}},
			{Module: "web", Kind: manifest.KindContainer, Name: "web.app", Typed: manifest.Typed{Ports: []manifest.Port{{HostPort: 443, Protocol: "tcp"}}}},
		},
		Routes: []state.Route{{Name: "ok.example.org", Module: "web"}, {Name: "new.example.org", Module: "web"}, {Name: "broken.example.org", Module: "web"}, {Name: "bare", Module: "web"}},
	}
	tg := certTargetsOf(plan, "127.0.0.1")
	if tg.container != "proxy.server" || tg.addr != "127.0.0.1:443" || len(tg.names) != 3 {
		t.Fatalf("targets %+v", tg)
	}
	if none := certTargetsOf(plan, ""); none.container != "" {
		t.Fatalf("no address to probe at, yet targets %+v", none)
	}
	tg.addr = "127.0.0.1:" + port // the test's listener stands for the proxy
	cs := probeCerts(context.Background(), logsRT{logs: caddyLog}, tg, nil)
	byName := map[string]state.CertStatus{}
	for _, c := range cs {
		byName[c.Name] = c
	}
	if c := byName["ok.example.org"]; c.Error != "" || c.Issuer != "Bed Intermediate" || !c.NotAfter.Equal(notAfter) {
		t.Errorf("ok: %+v", c)
	}
	if c := byName["new.example.org"]; !strings.Contains(c.Error, "the certificate it serves is for ok.example.org") {
		t.Errorf("new (served another name's): %+v", c)
	}
	if c := byName["broken.example.org"]; !strings.HasPrefix(c.Error, "no certificate served (") || c.Issuer != "" {
		t.Errorf("broken: %+v", c)
	}
	ln.Close()
	cs = probeCerts(context.Background(), logsRT{logs: caddyLog}, tg, nil)
	for _, c := range cs {
		if c.Name == "new.example.org" && !strings.Contains(c.Error, "could not get certificate from issuer: HTTP 0") {
			t.Errorf("the proxy down, the logged ACME error is lacking: %+v", c)
		}
	}
}

// TestCertErrorHasNoProxySecret: the error the proxy logged goes into the
// node's report, which every node keeps; a DNS provider's token that the
// proxy module was given, in the URL of a failed request, is taken out.
func TestCertErrorHasNoProxySecret(t *testing.T) {
	const token = "duckdns-tok-8f3a2c91"
	line := `{"level":"error","ts":2,"logger":"tls.obtain","msg":"could not get certificate from issuer","identifier":"git.example.org","error":"[git.example.org] solving challenges: Get \"https://www.duckdns.org/update?domains=x&token=` + token + `&txt=y\": dial tcp: i/o timeout"}` + "\n"
	plan := &state.Plan{
		Resources: []state.Resource{{Module: "proxy", Kind: manifest.KindContainer, Name: "proxy.server", Typed: manifest.Typed{PublicPorts: []manifest.Port{{HostPort: 443, Protocol: "tcp"}}}}},
		Routes:    []state.Route{{Name: "git.example.org", Module: "git"}},
	}
	tg := certTargetsOf(plan, "127.0.0.1")
	if tg.module != "proxy" {
		t.Fatalf("targets %+v: the proxy's module is not kept", tg)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	tg.addr = ln.Addr().String()
	ln.Close() // nothing answers: no certificate served, the log is read
	var sv secretValues
	sv.add("proxy", []byte(token+"\n"))
	cs := probeCerts(context.Background(), logsRT{logs: line}, tg, &sv)
	if len(cs) != 1 || !strings.Contains(cs[0].Error, "solving challenges") {
		t.Fatalf("the logged error is lacking: %+v", cs)
	}
	if strings.Contains(cs[0].Error, token) || !strings.Contains(cs[0].Error, "token=[secret]") {
		t.Errorf("the proxy's secret is in the report: %q", cs[0].Error)
	}
}
