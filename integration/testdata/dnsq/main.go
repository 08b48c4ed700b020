// Command dnsq is the beds' DNS client, copied into busybox containers
// (busybox nslookup speaks UDP only). It prints the rcode and one answer a
// line, and exits 0 whatever the answer.
package main

import (
	"flag"
	"fmt"
	"net"
	"os"
	"time"

	"github.com/miekg/dns"
)

func main() {
	network := flag.String("net", "udp", "udp or tcp")
	server := flag.String("server", "", "HOST:PORT (default: the first nameserver of /etc/resolv.conf)")
	qtype := flag.String("type", "A", "query type")
	aa := flag.Bool("aa", false, "print AUTHORITATIVE last when the answer has the AA flag")
	flag.Parse()
	if *server == "" {
		cc, err := dns.ClientConfigFromFile("/etc/resolv.conf")
		if err != nil || len(cc.Servers) == 0 {
			fmt.Println("ERROR no resolver in /etc/resolv.conf", err)
			os.Exit(1)
		}
		*server = net.JoinHostPort(cc.Servers[0], cc.Port)
	}
	m := new(dns.Msg)
	m.SetQuestion(dns.Fqdn(flag.Arg(0)), dns.StringToType[*qtype])
	r, _, err := (&dns.Client{Net: *network, Timeout: 3 * time.Second}).Exchange(m, *server)
	if err != nil {
		fmt.Println("ERROR", err)
		return
	}
	fmt.Println(dns.RcodeToString[r.Rcode])
	for _, rr := range r.Answer {
		fmt.Println(rr.String())
	}
	if *aa && r.Authoritative {
		fmt.Println("AUTHORITATIVE")
	}
}
