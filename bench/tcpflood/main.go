// Command tcpflood opens many TCP connections to a DNS server, as a hostile
// container could, for bench/memory.sh: n connections spread over source
// addresses 127.0.1.1, 127.0.1.2, ..., each asking one query. It keeps the
// answered ones open for -hold, then prints how many were answered and how
// many the server closed without an answer, and exits.
package main

import (
	"flag"
	"fmt"
	"log"
	"net"
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
	flag.Parse()
	if *sources < 1 || *sources > 250 {
		log.Fatal("-sources: 1 to 250")
	}
	var answered, closed atomic.Int64
	var mu sync.Mutex
	var open []net.Conn
	work := make(chan int)
	var wg sync.WaitGroup
	for w := 0; w < 64; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range work {
				src := net.IPv4(127, 0, 1, byte(1+i%*sources))
				d := net.Dialer{LocalAddr: &net.TCPAddr{IP: src}, Timeout: 2 * time.Second}
				c, err := d.Dial("tcp", *addr)
				if err != nil {
					closed.Add(1)
					continue
				}
				dc := &dns.Conn{Conn: c}
				m := new(dns.Msg)
				m.SetQuestion(*name, dns.TypeA)
				dc.SetDeadline(time.Now().Add(2 * time.Second))
				if err := dc.WriteMsg(m); err != nil {
					c.Close()
					closed.Add(1)
					continue
				}
				if _, err := dc.ReadMsg(); err != nil {
					c.Close()
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
