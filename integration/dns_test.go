package integration

import (
	"net"
	"os/exec"
	"strings"
	"testing"
	"time"

	"mesh/reconciler"

	"github.com/miekg/dns"
)

const bedWeb = `module: bedweb
routes:
  - {name: web, port: 8080}
resources:
  - container: bedweb.box
    image: localhost/mesh-bed-busybox:1
    command: ["sh", "-c", "while true; do sleep 1; done"]
`

const bedName = `module: bedname
resources:
  - directory: {{root}}/bedname
`

// hostQuery asks the resolver from the host.
func hostQuery(t testing.TB, server, name string) (string, []string) {
	m := new(dns.Msg)
	m.SetQuestion(dns.Fqdn(name), dns.TypeA)
	r, _, err := (&dns.Client{Timeout: 2 * time.Second}).Exchange(m, net.JoinHostPort(server, "53"))
	if err != nil {
		return "ERROR " + err.Error(), nil
	}
	var out []string
	for _, rr := range r.Answer {
		if a, ok := rr.(*dns.A); ok {
			out = append(out, a.A.String())
		}
	}
	return dns.RcodeToString[r.Rcode], out
}

// inContainer runs dnsq in a container, over proto, against its resolv.conf.
func (h *host) inContainer(ctr, proto, name string) string {
	return h.podman("exec", ctr, "/dnsq", "-net", proto, name)
}

func TestResolverRootful(t *testing.T)  { testResolver(t, false) }
func TestResolverRootless(t *testing.T) { testResolver(t, true) }

func testResolver(t testing.TB, rootless bool) {
	h := newHost(t, rootless)
	if !rootless {
		// A bridge of bedweb's network's name, left with another subnet, as
		// Podman's CNI backend leaves one when a network goes: the agent
		// removes it before it makes the network.
		bridge := reconciler.ModuleNetwork("bedweb").Interface
		exec.Command("ip", "link", "del", bridge).Run()
		sh(t, "ip", "link", "add", bridge, "type", "bridge")
		t.Cleanup(func() { exec.Command("ip", "link", "del", bridge).Run() })
		sh(t, "ip", "addr", "add", "10.89.254.1/24", "dev", bridge)
	}
	a := h.newAgent(t)
	a.mesh("module", "add", a.manifest("bedweb", bedWeb, nil), a.manifest("bedname", bedName, nil))
	a.mesh("assign", "ace", "bedweb", "--wait")
	a.mesh("assign", "ace", "bedname", "--wait")

	// The container's only DNS server is the node's resolver.
	rc := h.podman("exec", "bedweb.box", "cat", "/etc/resolv.conf")
	var servers []string
	for _, l := range strings.Split(rc, "\n") {
		if f := strings.Fields(l); len(f) == 2 && f[0] == "nameserver" {
			servers = append(servers, f[1])
		}
	}
	if len(servers) != 1 || servers[0] != h.dnsAddr {
		t.Fatalf("resolv.conf:\n%s", rc)
	}
	h.podman("cp", dnsqBin, "bedweb.box:/dnsq")
	for _, proto := range []string{"udp", "tcp"} {
		if out := h.inContainer("bedweb.box", proto, "bedname.internal"); !strings.HasPrefix(out, "NOERROR") || !strings.Contains(out, "\tA\t127.0.0.1") {
			t.Fatalf("%s from the mesh's container: %s", proto, out)
		}
	}
	if out := h.podman("exec", "bedweb.box", "nslookup", "BEDNAME.Internal"); !strings.Contains(out, "127.0.0.1") {
		t.Fatalf("busybox nslookup (case folded): %s", out)
	}

	// A container on another network, one with Podman's DNS disabled.
	h.podman("network", "create", "--disable-dns", bedNet)
	h.podman("run", "-d", "--name", "mbed-other", "--network", bedNet, "--dns", h.dnsAddr,
		"--ulimit", "nofile=1024:1024", "--ulimit", "nproc=1024:1024", bedImage, "sh", "-c", "while true; do sleep 1; done")
	h.podman("cp", dnsqBin, "mbed-other:/dnsq")
	for _, proto := range []string{"udp", "tcp"} {
		eventually(t, 10*time.Second, proto+" from a container on "+bedNet, func() (bool, string) {
			out := h.inContainer("mbed-other", proto, "bedweb.internal")
			return strings.HasPrefix(out, "NOERROR") && strings.Contains(out, "127.0.0.1"), out
		})
	}

	// Unassign: NXDOMAIN at once, and no container replaced.
	box := h.containerID("bedweb.box")
	a.mesh("unassign", "ace", "bedname")
	start := time.Now()
	eventually(t, time.Second, "bedname.internal is NXDOMAIN within 1 s of the unassign", func() (bool, string) {
		rcode, _ := hostQuery(t, h.dnsAddr, "bedname.internal")
		return rcode == "NXDOMAIN", rcode
	})
	t.Logf("NXDOMAIN %s after unassign returned", time.Since(start).Round(time.Millisecond))
	for _, ctr := range []string{"bedweb.box", "mbed-other"} {
		if out := h.inContainer(ctr, "udp", "bedname.internal"); !strings.HasPrefix(out, "NXDOMAIN") {
			t.Fatalf("%s after unassign: %s", ctr, out)
		}
	}
	if h.containerID("bedweb.box") != box {
		t.Fatal("a name going away replaced a container")
	}

	// A public domain makes the route answer; clearing it takes it away.
	a.mesh("node", "public-domain", "ace", "zurag.test")
	if out := h.inContainer("bedweb.box", "udp", "web.zurag.test"); !strings.HasPrefix(out, "NOERROR") || !strings.Contains(out, "127.0.0.1") {
		t.Fatalf("routed name: %s", out)
	}
	a.mesh("node", "public-domain", "ace", "--clear")
	if out := h.inContainer("bedweb.box", "udp", "web.zurag.test"); strings.Contains(out, "127.0.0.1") {
		t.Fatalf("routed name answered after clearing: %s", out)
	}
	if h.containerID("bedweb.box") != box {
		t.Fatal("a public domain change replaced a container")
	}

	// Not an open resolver: a source outside loopback and the node's Podman
	// subnets (a network namespace of the bed's own) is refused.
	sh(t, "ip", "netns", "add", bedNetns)
	sh(t, "ip", "link", "add", bedNetns+"-h", "type", "veth", "peer", "name", bedNetns+"-n")
	sh(t, "ip", "link", "set", bedNetns+"-n", "netns", bedNetns)
	sh(t, "ip", "addr", "add", "10.231.77.1/24", "dev", bedNetns+"-h")
	sh(t, "ip", "link", "set", bedNetns+"-h", "up")
	sh(t, "ip", "netns", "exec", bedNetns, "sh", "-c", "ip link set lo up && ip addr add 10.231.77.2/24 dev "+bedNetns+"-n && ip link set "+bedNetns+"-n up && ip route add "+h.dnsAddr+"/32 via 10.231.77.1")
	out := sh(t, "ip", "netns", "exec", bedNetns, dnsqBin, "-server", h.dnsAddr+":53", "bedweb.internal")
	if !strings.HasPrefix(out, "REFUSED") {
		t.Fatalf("query from an outside source: %s", out)
	}
	// mesh resolve asks the same resolver.
	if out := a.mesh("resolve", "bedweb.internal", "--tcp"); !strings.Contains(out, "127.0.0.1") {
		t.Fatalf("mesh resolve: %s", out)
	}
}
