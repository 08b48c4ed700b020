package agent

import (
	"crypto/tls"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/netip"
	"os"
	"path/filepath"
	"sync"
	"time"

	"mesh/agent/web"
	"mesh/cluster"
	"mesh/cluster/api"
)

// serveWeb serves the fleet's web page at --web-listen (off when empty):
// plain HTTP on a loopback address, TLS with the node's certificate (the
// mesh CA's, which the operator's browser trusts once) anywhere else.
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
	m := a.member
	w, err := web.New(web.Config{
		Client: api.NewClient(a.dir), Changed: m.Store.Changed, Applied: m.Store.AppliedIndex,
		URL: scheme + "://" + host, TLS: useTLS, Logger: a.log,
	})
	if err != nil {
		ln.Close()
		return err
	}
	// A page's request is bounded both ways; the event stream lifts the
	// bounds for itself and bounds each of its writes instead.
	srv := &http.Server{
		Handler: w, ReadHeaderTimeout: 10 * time.Second, ReadTimeout: 30 * time.Second, WriteTimeout: 30 * time.Second,
		IdleTimeout: 2 * time.Minute, MaxHeaderBytes: 64 << 10,
		ErrorLog: slog.NewLogLogger(a.log.With("component", "web").Handler(), slog.LevelDebug),
	}
	if useTLS {
		// HTTP/2 where the browser speaks it: a browser holds at most six
		// HTTP/1.1 connections to a host, and each open tab's event
		// stream holds one.
		srv.TLSConfig = &tls.Config{MinVersion: tls.VersionTLS12, GetCertificate: nodeCertificate(a.dir, a.log), NextProtos: []string{"h2", "http/1.1"}}
		ln = tls.NewListener(ln, srv.TLSConfig)
	}
	go srv.Serve(ln)
	a.api.SetWeb(w.LocalHandler())
	a.onClose(func() { srv.Close() })
	a.log.Info("web page listening", "url", scheme+"://"+host+"/", "login", "mesh web token")
	return nil
}

// nodeCertificate serves the data dir's node certificate, read again when
// its file changes (the node renews it before it expires). A pair that
// does not load (read half-written, or damaged) leaves the last good one
// served.
func nodeCertificate(dir string, log *slog.Logger) func(*tls.ClientHelloInfo) (*tls.Certificate, error) {
	var mu sync.Mutex
	var cert *tls.Certificate
	var mod time.Time
	return func(*tls.ClientHelloInfo) (*tls.Certificate, error) {
		certFile, keyFile := filepath.Join(dir, cluster.CertFile), filepath.Join(dir, cluster.KeyFile)
		mu.Lock()
		defer mu.Unlock()
		fi, err := os.Stat(certFile)
		if err != nil {
			if cert != nil {
				return cert, nil
			}
			return nil, err
		}
		if cert == nil || !fi.ModTime().Equal(mod) {
			c, err := tls.LoadX509KeyPair(certFile, keyFile)
			if err != nil {
				if cert != nil {
					log.Warn("web page: the node certificate did not load; serving the last good one", "err", err)
					mod = fi.ModTime() // said once per change of the file
					return cert, nil
				}
				return nil, err
			}
			cert, mod = &c, fi.ModTime()
		}
		return cert, nil
	}
}
