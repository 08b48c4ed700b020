package agent

import (
	"crypto/tls"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/netip"
	"time"

	"mesh/agent/web"
	"mesh/cluster/api"
	"mesh/internal/connlimit"
)

// webMaxConns and webMaxConnsPerSource bound the web page's open
// connections in all and from one address (a browser holds a few; over
// HTTP/2 one). webMaxStreams bounds the requests one HTTP/2 connection
// has open at once: the connection bounds count connections, not
// requests, and under Go's default (250 streams) one connection that sends
// a POST's headers and never its body held 250 handlers until the read
// timeout, 128 such connections some 32,000. A browser's tabs share its
// one connection: at most 8 event streams a session (agent/web), and the
// rest for pages and their assets, which a browser queues past the bound.
const (
	webMaxConns          = 128
	webMaxConnsPerSource = 16
	webMaxStreams        = 16
)

// serveWeb serves the fleet's web page at --web-listen (off when empty):
// plain HTTP on a loopback address, TLS anywhere else with the page's own
// certificate (webcert.go), whose fingerprint `mesh web token` prints.
func (a *Agent) serveWeb() error {
	if a.cfg.WebListen == "" {
		return nil
	}
	ln, err := net.Listen("tcp", a.cfg.WebListen)
	if err != nil {
		return fmt.Errorf("--web-listen %s: %w", a.cfg.WebListen, err)
	}
	at := ln.Addr().(*net.TCPAddr)
	ip, _ := netip.AddrFromSlice(at.IP)
	useTLS := !ip.Unmap().IsLoopback()
	host := at.String()
	if ip.IsUnspecified() {
		// The link must name an address a browser can reach: the node's.
		host = net.JoinHostPort(a.member.ID.Address, fmt.Sprint(at.Port))
	}
	scheme := "http"
	if useTLS {
		scheme = "https"
	}
	var cert *webCert
	if useTLS {
		h, _, _ := net.SplitHostPort(host)
		if cert, err = newWebCert(a.dir, []string{h}, a.log); err != nil {
			// The page goes, not the node (a full disk, say): the agent
			// runs on and says why the page is not there.
			ln.Close()
			a.log.Error("web page not served: its certificate could not be made", "listen", a.cfg.WebListen, "err", err)
			return nil
		}
	}
	m := a.member
	cfg := web.Config{
		Client: api.NewClient(a.dir), Changed: m.Store.Changed, Applied: m.Store.AppliedIndex,
		URL: scheme + "://" + host, TLS: useTLS, Logger: a.log,
	}
	if cert != nil {
		cfg.Fingerprint = cert.Fingerprint
	}
	w, err := web.New(cfg)
	if err != nil {
		ln.Close()
		return err
	}
	var getCert func(*tls.ClientHelloInfo) (*tls.Certificate, error)
	if cert != nil {
		getCert = cert.GetCertificate
	}
	srv := webServer(w, getCert, a.log)
	// Connections are bounded as at the resolver's TCP port: each held
	// open costs a descriptor, and anybody on the network reaches the port.
	bounds := connlimit.NewByNetwork(webMaxConns, webMaxConnsPerSource)
	// On loopback each local user's connections are counted apart (the
	// kernel's table names the user of the other end): one user holding
	// 127.0.0.1's places would keep the operator's `ssh -L` out.
	ln = &connlimit.Listener{Listener: ln, Bounds: bounds, Owner: connlimit.LoopbackOwner, TurnedAway: func(src netip.Addr, open int) {
		a.log.Warn("web page: connection turned away (logged once a minute at most)", "from", src, "open_from_it", open, "max_per_source", bounds.PerSource, "max", bounds.Total)
	}}
	if srv.TLSConfig != nil {
		ln = tls.NewListener(ln, srv.TLSConfig)
	}
	go srv.Serve(ln)
	a.api.SetWeb(w.LocalHandler())
	a.onClose(func() { srv.Close() })
	a.log.Info("web page listening", "url", scheme+"://"+host+"/", "login", "mesh web token")
	return nil
}

// webServer is the page's server: over TLS (getCert set) with the
// certificate getCert gives, plain HTTP without. A page's request is
// bounded both ways; the event stream lifts the bounds for itself and
// bounds each of its writes instead.
func webServer(h http.Handler, getCert func(*tls.ClientHelloInfo) (*tls.Certificate, error), log *slog.Logger) *http.Server {
	srv := &http.Server{
		Handler: h, ReadHeaderTimeout: 10 * time.Second, ReadTimeout: 30 * time.Second, WriteTimeout: 30 * time.Second,
		IdleTimeout: 2 * time.Minute, MaxHeaderBytes: 64 << 10,
		HTTP2:    &http.HTTP2Config{MaxConcurrentStreams: webMaxStreams},
		ErrorLog: slog.NewLogLogger(log.With("component", "web").Handler(), slog.LevelDebug),
	}
	if getCert != nil {
		// HTTP/2 where the browser speaks it: a browser holds at most six
		// HTTP/1.1 connections to a host, and each open tab's event
		// stream holds one.
		srv.TLSConfig = &tls.Config{MinVersion: tls.VersionTLS12, GetCertificate: getCert, NextProtos: []string{"h2", "http/1.1"}}
	}
	return srv
}
