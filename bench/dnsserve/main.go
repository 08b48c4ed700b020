// Command dnsserve runs the mesh resolver (dnsd.Server, as the agent runs it)
// on an address with N generated names, for bench/dns.sh. It never forwards:
// the benchmark asks only for names in the mesh zone.
package main

import (
	"flag"
	"fmt"
	"log"
	"net/netip"
	"os"
	"os/signal"
	"runtime/pprof"
	"syscall"

	"mesh/dnsd"
)

func main() {
	addr := flag.String("addr", "127.0.0.1:5353", "IP:PORT to serve on")
	n := flag.Int("names", 10000, "how many names (nNNNNN.internal)")
	prof := flag.String("cpuprofile", "", "write a CPU profile here until stopped")
	flag.Parse()
	if *prof != "" {
		f, err := os.Create(*prof)
		if err != nil {
			log.Fatal(err)
		}
		pprof.StartCPUProfile(f)
		defer pprof.StopCPUProfile()
	}
	srv, err := dnsd.New(dnsd.Config{Addr: *addr}, "internal")
	if err != nil {
		log.Fatal(err)
	}
	names := make(map[string][]netip.Addr, *n)
	for i := 0; i < *n; i++ {
		names[fmt.Sprintf("n%06d.internal", i)] = []netip.Addr{netip.AddrFrom4([4]byte{10, byte(i >> 16), byte(i >> 8), byte(i)})}
	}
	srv.SetIndex(dnsd.NewIndex("internal", names, 1))
	bound, err := srv.Start()
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println("serving", *n, "names on", bound)
	ch := make(chan os.Signal, 1)
	signal.Notify(ch, syscall.SIGINT, syscall.SIGTERM)
	<-ch
	srv.Close()
}
