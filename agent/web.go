package agent

import (
	"crypto/tls"
	"fmt"
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
	// No write timeout: the page's event stream is long-lived (each has a
	// keep-alive and ends with its session or its connection).
	srv := &http.Server{Handler: w, ReadHeaderTimeout: 10 * time.Second, ReadTimeout: 30 * time.Second, IdleTimeout: 2 * time.Minute, MaxHeaderBytes: 64 << 10}
	if useTLS {
		srv.TLSConfig = &tls.Config{MinVersion: tls.VersionTLS12, GetCertificate: nodeCertificate(a.dir)}
		ln = tls.NewListener(ln, srv.TLSConfig)
	}
	go srv.Serve(ln)
	a.api.SetWeb(w.LocalHandler())
	a.onClose(func() { srv.Close() })
	a.log.Info("web page listening", "url", scheme+"://"+host+"/", "login", "mesh web token")
	return nil
}

// nodeCertificate serves the data dir's node certificate, read again when
// its file changes (the node renews it before it expires).
func nodeCertificate(dir string) func(*tls.ClientHelloInfo) (*tls.Certificate, error) {
	var mu sync.Mutex
	var cert *tls.Certificate
	var mod time.Time
	return func(*tls.ClientHelloInfo) (*tls.Certificate, error) {
		certFile, keyFile := filepath.Join(dir, cluster.CertFile), filepath.Join(dir, cluster.KeyFile)
		fi, err := os.Stat(certFile)
		if err != nil {
			return nil, err
		}
		mu.Lock()
		defer mu.Unlock()
		if cert == nil || !fi.ModTime().Equal(mod) {
			c, err := tls.LoadX509KeyPair(certFile, keyFile)
			if err != nil {
				return nil, err
			}
			cert, mod = &c, fi.ModTime()
		}
		return cert, nil
	}
}
