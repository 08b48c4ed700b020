// Command tcpflood opens many TCP connections, as a hostile container could,
// for bench/memory.sh: n connections spread over source addresses 127.0.1.1,
// 127.0.1.2, ..., each asking one DNS query of a resolver, or with -node one
// GET /v1/ca of a node port over TLS without a certificate. It keeps the
// answered ones open for -hold, then prints how many were answered and how
// many the server closed without an answer, and exits.
package main

import (
	"bufio"
	"crypto/tls"
	"flag"
	"fmt"
	"log"
	"net"
	"net/http"
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
	work := make(chan int)
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
	fmt.Printf("opened %d from %d sources: answered %d (held open %s), closed without an answer %d\n",
		*n, *sources, answered.Load(), *hold, closed.Load())
	time.Sleep(*hold)
	for _, c := range open {
		c.Close()
	}
}

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
