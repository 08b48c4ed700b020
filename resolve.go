package main

import (
	"errors"
	"fmt"
	"net"
	"time"

	"github.com/miekg/dns"
)

// ResolveCmd asks the local resolver.
type ResolveCmd struct {
	Name    string        `arg:"" help:"The name, e.g. gitea.internal."`
	TCP     bool          `name:"tcp" help:"Ask over TCP instead of UDP."`
	Server  string        `help:"Ask this resolver (IP or IP:PORT) instead of this node's; needs no data dir or agent." placeholder:"ADDR"`
	Timeout time.Duration `default:"5s" help:"How long to wait for each answer."`
	Short   bool          `help:"Print the addresses alone, one a line (for scripts: curl \"$(mesh resolve --short whoami.internal)\":8080)."`
}

// Run asks for A and AAAA and prints the answers; exit 1 when the name does
// not exist or the resolver fails.
func (c *ResolveCmd) Run(g *Globals) error {
	ctx, cancel := timeout()
	defer cancel()
	server := c.Server
	if server == "" {
		st, err := g.client().Status(ctx)
		if err != nil {
			return err
		}
		if st.Resolver == "" {
			return errors.New("this node's agent runs no resolver")
		}
		server = st.Resolver
	} else if _, _, err := net.SplitHostPort(server); err != nil {
		server = net.JoinHostPort(server, "53")
	}
	network := "udp"
	if c.TCP {
		network = "tcp"
	}
	found := 0
	for _, qt := range []uint16{dns.TypeA, dns.TypeAAAA} {
		m := new(dns.Msg)
		m.SetQuestion(dns.Fqdn(c.Name), qt)
		r, _, err := (&dns.Client{Net: network, Timeout: c.Timeout}).ExchangeContext(ctx, m, server)
		if err != nil {
			return fmt.Errorf("ask the resolver at %s: %w", server, err)
		}
		if r.Rcode != dns.RcodeSuccess {
			return fmt.Errorf("%s: %s (from %s)", c.Name, dns.RcodeToString[r.Rcode], server)
		}
		for _, rr := range r.Answer {
			switch a := rr.(type) {
			case *dns.A:
				if c.Short {
					fmt.Fprintln(g.out, a.A)
					found++
					continue
				}
			case *dns.AAAA:
				if c.Short {
					fmt.Fprintln(g.out, a.AAAA)
					found++
					continue
				}
			}
			if !c.Short {
				fmt.Fprintln(g.out, rr.String())
				found++
			}
		}
	}
	if found == 0 {
		if c.Short {
			return fmt.Errorf("%s exists but has no address", c.Name)
		}
		fmt.Fprintf(g.out, "%s exists but has no address\n", c.Name)
	}
	return nil
}
