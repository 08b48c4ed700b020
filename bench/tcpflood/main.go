// Command tcpflood opens many TCP connections, as a hostile container could,
// for bench/memory.sh: n connections spread over source addresses 127.0.1.1,
// 127.0.1.2, ..., each asking one DNS query of a resolver, or with -node one
// GET /v1/ca of a node port over TLS without a certificate. It keeps the
// answered ones open for -hold, then prints how many were answered and how
// many the server closed without an answer, and exits. With -stall each
// connection sends nothing at all (a TLS handshake never begun); it prints
// how many the server closed within -hold.
package main

import (
	"bufio"
	"crypto/tls"
	"errors"
	"flag"
	"fmt"
	"log"
	"net"
	"net/http"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"github.com/miekg/dns"
)

func main() {
	addr := flag.String("addr", "127.0.0.54:53", "server IP:PORT")
	n := flag.Int("n", 2000, "connections to open")
	sources := flag.Int("sources", 20, "source addresses to spread them over (127.0.1.1 on)")
	name := flag.String("name", "mem1.internal.", "name to ask for")
	hold := flag.Duration("hold", 3*time.Second, "how long to keep the answered connections open")
	node := flag.Bool("node", false, "-addr is a node port: GET /v1/ca over TLS, without a certificate")
	stall := flag.Bool("stall", false, "send nothing on each connection; print how many the server closed within -hold")
	flag.Parse()
	if *sources < 1 || *sources > 250 {
		log.Fatal("-sources: 1 to 250")
	}
	var answered, closed atomic.Int64
	var mu sync.Mutex
	var open []net.Conn
	ask := askDNS
	if *node {
		ask = askCA
	}
	if *stall {
		ask = connect
	}
	work := make(chan int)
	began := time.Now()
	var wg sync.WaitGroup
	for w := 0; w < 64; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range work {
				src := net.IPv4(127, 0, 1, byte(1+i%*sources))
				d := net.Dialer{LocalAddr: &net.TCPAddr{IP: src}, Timeout: 2 * time.Second}
				c, err := ask(&d, *addr, *name)
				if err != nil {
					closed.Add(1)
					continue
				}
				answered.Add(1)
				mu.Lock()
				open = append(open, c)
				mu.Unlock()
			}
		}()
	}
	for i := 0; i < *n; i++ {
		work <- i
	}
	close(work)
	wg.Wait()
	if *stall {
		opened := time.Since(began)
		time.Sleep(*hold)
		// All at once: one after another, the last would be read after
		// the server's own handshake deadline.
		var gone atomic.Int64
		var rd sync.WaitGroup
		until := time.Now().Add(200 * time.Millisecond)
		for _, c := range open {
			rd.Add(1)
			go func() {
				defer rd.Done()
				c.SetReadDeadline(until)
				if _, err := c.Read(make([]byte, 1)); err != nil && !errors.Is(err, os.ErrDeadlineExceeded) {
					gone.Add(1)
				}
			}()
		}
		rd.Wait()
		for _, c := range open {
			c.Close()
		}
		fmt.Printf("opened %d of %d from %d sources in %s, sending nothing: %s later the server had closed %d, %d still open\n",
			answered.Load(), *n, *sources, opened.Round(time.Millisecond), *hold, gone.Load(), int64(len(open))-gone.Load())
		return
	}
	fmt.Printf("opened %d from %d sources: answered %d (held open %s), closed without an answer %d\n",
		*n, *sources, answered.Load(), *hold, closed.Load())
	time.Sleep(*hold)
	for _, c := range open {
		c.Close()
	}
}

// connect opens a connection and sends nothing on it.
func connect(d *net.Dialer, addr, _ string) (net.Conn, error) { return d.Dial("tcp", addr) }

// askDNS asks a resolver for name over TCP and returns the connection if it
// was answered.
func askDNS(d *net.Dialer, addr, name string) (net.Conn, error) {
	c, err := d.Dial("tcp", addr)
	if err != nil {
		return nil, err
	}
	dc := &dns.Conn{Conn: c}
	m := new(dns.Msg)
	m.SetQuestion(name, dns.TypeA)
	dc.SetDeadline(time.Now().Add(2 * time.Second))
	if err := dc.WriteMsg(m); err != nil {
		c.Close()
		return nil, err
	}
	if _, err := dc.ReadMsg(); err != nil {
		c.Close()
		return nil, err
	}
	c.SetDeadline(time.Time{})
	return c, nil
}

// askCA asks a node port for the mesh CA over TLS, as a guest (no
// certificate), and returns the connection if it was answered.
func askCA(d *net.Dialer, addr, _ string) (net.Conn, error) {
	c, err := tls.DialWithDialer(d, "tcp", addr, &tls.Config{InsecureSkipVerify: true, NextProtos: []string{"http/1.1"}})
	if err != nil {
		return nil, err
	}
	c.SetDeadline(time.Now().Add(2 * time.Second))
	if _, err := fmt.Fprintf(c, "GET /v1/ca HTTP/1.1\r\nHost: mesh\r\n\r\n"); err != nil {
		c.Close()
		return nil, err
	}
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil {
		c.Close()
		return nil, err
	}
	resp.Body.Close()
	c.SetDeadline(time.Time{})
	return c, nil
}
