// Command dnsserve runs the mesh resolver (dnsd.Server, as the agent runs it)
// on an address with N generated names, for bench/dns.sh and bench/memory.sh.
// It never forwards: the benchmarks ask it only for names in the mesh zone.
// With -sink it is instead an upstream that never answers.
package main

import (
	"flag"
	"fmt"
	"log"
	"net"
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
	sink := flag.Bool("sink", false, "be an upstream that never answers: read every datagram on -addr, answer none")
	flag.Parse()
	if *sink {
		pc, err := net.ListenPacket("udp", *addr)
		if err != nil {
			log.Fatal(err)
		}
		fmt.Println("sinking queries on", pc.LocalAddr())
		buf := make([]byte, 65535)
		for {
			if _, _, err := pc.ReadFrom(buf); err != nil {
				log.Fatal(err)
			}
		}
	}
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
