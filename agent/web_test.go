package agent

import (
	"bytes"
	"crypto/tls"
	"log/slog"
	"net"
	"net/http"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"golang.org/x/net/http2"
	"golang.org/x/net/http2/hpack"

	"mesh/agent/web"
)

// One HTTP/2 connection holds at most webMaxStreams of the page's
// handlers: a client that sends a login's headers and never its body, on
// many streams at once, is refused the streams past the bound instead of
// holding a handler (a goroutine) for each until the read timeout. The
// server is the one serveWeb makes, with the page's real handler.
func TestWebStreamsPerConnectionAreBounded(t *testing.T) {
	log := slog.New(slog.DiscardHandler)
	cert, err := newWebCert(t.TempDir(), []string{"127.0.0.1"}, log)
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	host := ln.Addr().String()
	page, err := web.New(web.Config{URL: "https://" + host, TLS: true, Changed: func() <-chan struct{} { return nil }, Applied: func() (uint64, error) { return 1, nil }})
	if err != nil {
		t.Fatal(err)
	}
	// held counts the page's handlers under way, most the most at once.
	var held, most atomic.Int64
	counted := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		n := held.Add(1)
		defer held.Add(-1)
		for m := most.Load(); n > m && !most.CompareAndSwap(m, n); m = most.Load() {
		}
		page.ServeHTTP(w, r)
	})
	srv := webServer(counted, cert.GetCertificate, log)
	go srv.Serve(tls.NewListener(ln, srv.TLSConfig))
	defer srv.Close()

	conn, err := tls.Dial("tcp", host, &tls.Config{InsecureSkipVerify: true, NextProtos: []string{"h2"}})
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	if p := conn.ConnectionState().NegotiatedProtocol; p != "h2" {
		t.Fatalf("negotiated %q, want h2", p)
	}
	if _, err := conn.Write([]byte(http2.ClientPreface)); err != nil {
		t.Fatal(err)
	}
	fr := http2.NewFramer(conn, conn)
	var writeMu sync.Mutex
	write := func(f func() error) {
		writeMu.Lock()
		defer writeMu.Unlock()
		if err := f(); err != nil {
			t.Error(err)
		}
	}
	write(func() error { return fr.WriteSettings() })
	// The reader acknowledges the server's settings, as a client does,
	// and counts the streams the server refused.
	var refused atomic.Int64
	go func() {
		for {
			f, err := fr.ReadFrame()
			if err != nil {
				return
			}
			switch f := f.(type) {
			case *http2.SettingsFrame:
				if !f.IsAck() {
					writeMu.Lock()
					fr.WriteSettingsAck()
					writeMu.Unlock()
				}
			case *http2.RSTStreamFrame:
				refused.Add(1)
			}
		}
	}()
	// A login's headers, with the page's Origin (the page then reads the
	// body), announcing a body that never comes.
	var block bytes.Buffer
	enc := hpack.NewEncoder(&block)
	for _, h := range [][2]string{
		{":method", "POST"}, {":scheme", "https"}, {":authority", host}, {":path", "/login"},
		{"content-type", "application/x-www-form-urlencoded"}, {"content-length", "4000"}, {"origin", "https://" + host},
	} {
		enc.WriteField(hpack.HeaderField{Name: h[0], Value: h[1]})
	}
	const streams = 4 * webMaxStreams
	for i := range streams {
		write(func() error {
			return fr.WriteHeaders(http2.HeadersFrameParam{StreamID: uint32(2*i + 1), BlockFragment: block.Bytes(), EndHeaders: true})
		})
	}
	// Each stream is either held by a handler or refused.
	deadline := time.Now().Add(10 * time.Second)
	for held.Load()+refused.Load() < streams {
		if time.Now().After(deadline) {
			t.Fatalf("after 10s: %d streams held, %d refused, of %d", held.Load(), refused.Load(), streams)
		}
		time.Sleep(10 * time.Millisecond)
	}
	time.Sleep(200 * time.Millisecond) // any handler that was to start more has
	if m := most.Load(); m > webMaxStreams {
		t.Fatalf("one connection held %d handlers at once (%d refused), want at most %d", m, refused.Load(), webMaxStreams)
	}
	if h := held.Load(); h != webMaxStreams {
		t.Fatalf("%d handlers held, want %d: the test's streams did not reach the page", h, webMaxStreams)
	}
	conn.Close()
	// The held handlers end with their connection.
	deadline = time.Now().Add(10 * time.Second)
	for held.Load() > 0 {
		if time.Now().After(deadline) {
			t.Fatalf("%d handlers still held after the connection closed", held.Load())
		}
		time.Sleep(10 * time.Millisecond)
	}
}
