// Command rtt measures small TCP request/response round trips, for
// bench/overlay.sh:
//
//	rtt -listen :PORT          echo each 64-byte request back
//	rtt -to ADDR:PORT [-n N]   N round trips on one connection; prints p50 and p99
package main

import (
	"flag"
	"fmt"
	"io"
	"net"
	"os"
	"sort"
	"time"
)

func main() {
	listen := flag.String("listen", "", "serve echo on this address")
	to := flag.String("to", "", "measure against this address")
	n := flag.Int("n", 2000, "round trips")
	flag.Parse()
	switch {
	case *listen != "":
		l, err := net.Listen("tcp", *listen)
		if err != nil {
			fail(err)
		}
		for {
			c, err := l.Accept()
			if err != nil {
				fail(err)
			}
			go func() {
				defer c.Close()
				buf := make([]byte, 64)
				for {
					if _, err := io.ReadFull(c, buf); err != nil {
						return
					}
					if _, err := c.Write(buf); err != nil {
						return
					}
				}
			}()
		}
	case *to != "":
		c, err := net.DialTimeout("tcp", *to, 5*time.Second)
		if err != nil {
			fail(err)
		}
		c.(*net.TCPConn).SetNoDelay(true)
		buf := make([]byte, 64)
		var d []time.Duration
		for i := 0; i < *n+100; i++ {
			start := time.Now()
			if _, err := c.Write(buf); err != nil {
				fail(err)
			}
			if _, err := io.ReadFull(c, buf); err != nil {
				fail(err)
			}
			if i >= 100 { // the first ones warm the path
				d = append(d, time.Since(start))
			}
		}
		sort.Slice(d, func(i, j int) bool { return d[i] < d[j] })
		fmt.Printf("p50 %d us p99 %d us (%d round trips)\n", d[len(d)/2].Microseconds(), d[len(d)*99/100].Microseconds(), len(d))
	default:
		flag.Usage()
		os.Exit(2)
	}
}

func fail(err error) {
	fmt.Fprintln(os.Stderr, "rtt:", err)
	os.Exit(1)
}
