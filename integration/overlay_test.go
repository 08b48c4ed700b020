package integration

import (
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"mesh/reconciler"
)

// The overlay bed (private by default): three nodes and an outsider on one bridge.
// n1 runs a provider with an internal port and a public one; n2 runs a
// consumer that reaches it by its mesh name, over the overlay.
const (
	outsiderNS   = "mbn9"
	outsiderAddr = multiNet + "9"
)

const overlayProvider = `module: {{name}}
resources:
  - directory: {{root}}/{{name}}
    owner: "0:0"
    mode: "0755"
  - directory: {{root}}/{{name}}-sink
    owner: "0:0"
    mode: "0755"
  - file: {{root}}/{{name}}/index.html
    content: "provider page\n"
  - container: {{name}}.web
    image: localhost/mesh-bed-busybox:1
    command: ["httpd", "-f", "-p", "8090", "-h", "/www"]
    ports: ["8090:8090"]
    mounts: ["{{root}}/{{name}}/index.html:/www/index.html:ro"]
  - container: {{name}}.public
    image: localhost/mesh-bed-busybox:1
    command: ["httpd", "-f", "-p", "8091", "-h", "/www"]
    public-ports: ["8091:8091"]
    mounts: ["{{root}}/{{name}}/index.html:/www/index.html:ro"]
  - container: {{name}}.sink
    image: localhost/mesh-bed-busybox:1
    # busybox nc ends at the end of its standard input: give it one that
    # lasts, so it ends when the sender closes.
    command: ["sh", "-c", "while true; do sleep 60 | nc -l -p 8092 | wc -c > /data/received; done"]
    ports: ["8092:8092"]
    mounts: ["{{root}}/{{name}}-sink:/data"]
`

const overlayConsumer = `module: bedcons
resources:
  - directory: {{root}}/bedcons
  - container: bedcons.app
    image: localhost/mesh-bed-busybox:1
    command: ["sleep", "1000000"]
    cap-add: [NET_RAW]
    mounts: ["{{root}}/bedcons:/data"]
`

// overlayPeek is a module beside the provider on its node: what one
// module's container may reach of another's.
const overlayPeek = `module: bedpeek
resources:
  - container: bedpeek.app
    image: localhost/mesh-bed-busybox:1
    command: ["sleep", "1000000"]
`

// modulesKeepToThemselves checks, on n1 (which runs bedprov and bedpeek),
// that each module's containers are on a network of their own, that
// another module's container and a host of the LAN reach none of bedprov's
// ports at its container's address, and that a published port and the
// module's own containers still do.
func modulesKeepToThemselves(t *testing.T, n1 *agent) {
	t.Helper()
	ipOf := func(name string) (ip, network string) {
		out := n1.h.podman("inspect", name, "--format", `{{range $k, $v := .NetworkSettings.Networks}}{{$k}} {{$v.IPAddress}}{{end}}`)
		f := strings.Fields(out)
		if len(f) != 2 {
			t.Fatalf("the networks of %s: %q", name, out)
		}
		return f[1], f[0]
	}
	web, webNet := ipOf("bedprov.web")
	_, sinkNet := ipOf("bedprov.sink")
	_, peekNet := ipOf("bedpeek.app")
	if webNet != "mesh-bedprov" || sinkNet != "mesh-bedprov" || peekNet != "mesh-bedpeek" {
		t.Fatalf("networks: bedprov.web on %s, bedprov.sink on %s, bedpeek.app on %s", webNet, sinkNet, peekNet)
	}
	page := func(from, addr string) (string, error) {
		return n1.inContainer(from, "sh", "-c", fmt.Sprintf(`printf 'GET / HTTP/1.0\r\n\r\n' | nc -w 2 %s 8090`, addr))
	}
	if out, err := page("bedprov.sink", web); err != nil || !strings.Contains(out, "provider page") {
		t.Fatalf("bedprov's own container does not reach bedprov.web at %s: %v %s", web, err, out)
	}
	if out, err := page("bedpeek.app", web); err == nil || strings.Contains(out, "provider page") {
		t.Fatalf("bedpeek's container reached bedprov.web's unpublished address %s:8090: %v %s", web, err, out)
	}
	if out, err := page("bedpeek.app", "bedprov.internal"); err != nil || !strings.Contains(out, "provider page") {
		t.Fatalf("bedpeek's container does not reach bedprov's published port by name: %v %s", err, out)
	}
	// A host of the LAN that routes the containers' subnet through n1.
	subnet := web[:strings.LastIndexByte(web, '.')] + ".0/24"
	sh(t, "ip", "netns", "exec", outsiderNS, "ip", "route", "add", subnet, "via", n1.addr())
	defer exec.Command("ip", "netns", "exec", outsiderNS, "ip", "route", "del", subnet).Run()
	if out, err := get(outsiderNS, web, 8090); err == nil || strings.Contains(out, "provider page") {
		t.Fatalf("the outsider reached bedprov.web at %s:8090, routed through n1: %v %s", web, err, out)
	}
	// bedpeek leaves n1: its network goes, and its bridge with it.
	n1.mesh("unassign", "n1", "bedpeek", "--wait")
	bridge := reconciler.ModuleNetwork("bedpeek").Interface
	eventually(t, 20*time.Second, "bedpeek's network and bridge go with it", func() (bool, string) {
		nets := n1.h.podman("network", "ls", "--format", "{{.Name}}")
		link, err := exec.Command("ip", "-n", n1.h.netns, "link", "show", bridge).CombinedOutput()
		return !strings.Contains(nets, "mesh-bedpeek") && err != nil, fmt.Sprintf("networks %q; %s: %s", nets, bridge, link)
	})
}

// outsider makes a namespace on the bed's bridge that is no node: a host
// on the same LAN, with a route for the overlay's prefix through n1.
func outsider(t *testing.T, via string) {
	t.Helper()
	exec.Command("ip", "netns", "del", outsiderNS).Run()
	exec.Command("ip", "link", "del", outsiderNS+"-h").Run()
	t.Cleanup(func() {
		exec.Command("ip", "netns", "del", outsiderNS).Run()
		exec.Command("ip", "link", "del", outsiderNS+"-h").Run()
	})
	sh(t, "ip", "netns", "add", outsiderNS)
	sh(t, "ip", "link", "add", outsiderNS+"-h", "type", "veth", "peer", "name", outsiderNS+"-n")
	sh(t, "ip", "link", "set", outsiderNS+"-h", "master", multiBridge, "up")
	sh(t, "ip", "link", "set", outsiderNS+"-n", "netns", outsiderNS)
	sh(t, "ip", "netns", "exec", outsiderNS, "sh", "-c", fmt.Sprintf("ip link set lo up && ip link set %s-n name eth0 && ip addr add %s/24 dev eth0 && ip link set eth0 up && ip route add 100.90.0.0/16 via %s", outsiderNS, outsiderAddr, via))
}

// get asks addr:port for / from namespace ns with busybox's nc, within 3 s.
func get(ns, addr string, port int) (string, error) {
	cmd := exec.Command("ip", "netns", "exec", ns, "sh", "-c", fmt.Sprintf(`printf 'GET / HTTP/1.0\r\n\r\n' | busybox nc -w 3 %s %d`, addr, port))
	out, err := cmd.CombinedOutput()
	return string(out), err
}

// inContainer runs a command in a container of node a.
func (a *agent) inContainer(name string, args ...string) (string, error) {
	out, err := a.h.podmanCmd(append([]string{"exec", name}, args...)...).CombinedOutput()
	return string(out), err
}

// fetch is the consumer's request for the provider's page by its mesh name.
func fetch(a *agent, path string) (string, error) {
	return a.inContainer("bedcons.app", "sh", "-c", fmt.Sprintf(`printf 'GET %s HTTP/1.0\r\n\r\n' | nc -w 3 bedprov.internal 8090`, path))
}

func consumerReaches(t *testing.T, a *agent, within time.Duration, what string) {
	t.Helper()
	eventually(t, within, what, func() (bool, string) {
		out, err := fetch(a, "/")
		return err == nil && strings.Contains(out, "provider page"), fmt.Sprintf("%v %s", err, out)
	})
}

// cpuTime is the CPU time (user and system) the node's agent used so far.
func (a *agent) cpuTime(t *testing.T) time.Duration {
	t.Helper()
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", a.cmd.Process.Pid))
	if err != nil {
		t.Fatal(err)
	}
	f := strings.Fields(string(b[bytes.LastIndexByte(b, ')')+2:]))
	ut, _ := strconv.Atoi(f[11])
	st, _ := strconv.Atoi(f[12])
	return time.Duration(ut+st) * time.Second / 100 // USER_HZ
}

func TestOverlay(t *testing.T) {
	for _, bin := range []string{"tcpdump", "ping"} {
		if _, err := exec.LookPath(bin); err != nil {
			t.Fatalf("%s is missing; contrib/test.sh installs it", bin)
		}
	}
	n, _ := startThree(t)
	for i := 1; i <= 3; i++ {
		if a := n[i].oaddr(); a != fmt.Sprintf("100.90.0.%d", i) {
			t.Fatalf("n%d's overlay address is %s; the FSM gives them in join order", i, a)
		}
	}
	// node list shows every node's overlay address, and the status its
	// peers' handshakes.
	if out := n[1].mesh("node", "list"); !strings.Contains(out, "OVERLAY") || !strings.Contains(out, "100.90.0.3") {
		t.Fatalf("node list:\n%s", out)
	}
	n[1].mesh("module", "add", n[1].manifest("bedprov", overlayProvider, map[string]string{"name": "bedprov"}), n[1].manifest("bedcons", overlayConsumer, nil),
		n[1].manifest("bedpeek", overlayPeek, nil))
	n[1].mesh("assign", "n1", "bedprov", "bedpeek", "--wait")
	n[1].mesh("assign", "n2", "bedcons", "--wait")
	outsider(t, n[1].addr())
	modulesKeepToThemselves(t, n[1])

	// The consumer on n2 reaches the provider's internal port on n1 by its
	// mesh name, which answers n1's overlay address.
	if out := n[2].resolve("bedprov.internal"); !strings.Contains(out, "100.90.0.1") {
		t.Fatalf("bedprov.internal from n2: %s", out)
	}
	// It answers the overlay's reverse names itself (a server's PTR of a
	// peer never goes upstream): n1's address with n1's name, an unused
	// address NXDOMAIN with authority.
	ptr := func(name string) string {
		out, _ := exec.Command("ip", "netns", "exec", n[2].h.netns, dnsqBin, "-server", "169.254.53.53:53", "-type", "PTR", "-aa", name).CombinedOutput()
		return string(out)
	}
	if out := ptr("1.0.90.100.in-addr.arpa"); !strings.Contains(out, "NOERROR") || !strings.Contains(out, "PTR\tn1.internal.") || !strings.Contains(out, "AUTHORITATIVE") {
		t.Fatalf("the PTR of n1's overlay address from n2: %s", out)
	}
	if out := ptr("7.7.90.100.in-addr.arpa"); !strings.Contains(out, "NXDOMAIN") || !strings.Contains(out, "AUTHORITATIVE") {
		t.Fatalf("the PTR of an unused overlay address from n2: %s", out)
	}
	consumerReaches(t, n[2], 20*time.Second, "the consumer on n2 reaches bedprov on n1 by name")
	eventually(t, 10*time.Second, "status shows n1's handshake with n2", func() (bool, string) {
		out := n[1].mesh("status")
		return strings.Contains(out, "overlay on n1: up: 100.90.0.1/16 on meshwg0") && strings.Contains(out, "n2 (100.90.0.2): last handshake"), out
	})

	// The outsider reaches neither the internal port at n1's address nor
	// at its overlay address (routed through n1), but the public one.
	if out, err := get(outsiderNS, n[1].addr(), 8090); err == nil && strings.Contains(out, "provider page") {
		t.Fatalf("the outsider reached the internal port at n1's address: %s", out)
	}
	if out, err := get(outsiderNS, "100.90.0.1", 8090); err == nil && strings.Contains(out, "provider page") {
		t.Fatalf("the outsider reached the internal port at n1's overlay address: %s", out)
	}
	if out, err := exec.Command("ip", "netns", "exec", outsiderNS, "ping", "-c", "2", "-W", "1", "100.90.0.1").CombinedOutput(); err == nil {
		t.Fatalf("the outsider pings n1's overlay address:\n%s", out)
	}
	if out, err := get(outsiderNS, n[1].addr(), 8091); err != nil || !strings.Contains(out, "provider page") {
		t.Fatalf("the outsider does not reach the public port: %v %s", err, out)
	}

	// A capture of what n2 puts on the bridge (its link: frames a bridge
	// forwards between its ports do not pass the bridge's own device) while
	// the consumer sends a marker: the marker never crosses in clear; only
	// WireGuard's UDP and the node port's TLS do.
	pcap := filepath.Join(t.TempDir(), "n2.pcap")
	dump := exec.Command("tcpdump", "-i", "mbn2-h", "--immediate-mode", "-U", "-s", "0", "-w", pcap, "ip")
	var dumpErr bytes.Buffer
	dump.Stderr = &dumpErr
	if err := dump.Start(); err != nil {
		t.Fatal(err)
	}
	eventually(t, 10*time.Second, "tcpdump listens", func() (bool, string) {
		return strings.Contains(dumpErr.String(), "listening on"), dumpErr.String()
	})
	marker := fmt.Sprintf("MESHMARKER%d", time.Now().UnixNano())
	if out, err := fetch(n[2], "/"+marker); err != nil || !strings.Contains(out, "404") {
		t.Fatalf("the marker's request did not reach the provider: %v %s", err, out)
	}
	time.Sleep(500 * time.Millisecond) // tcpdump writes what it saw (--immediate-mode, -U: per packet)
	dump.Process.Signal(syscall.SIGINT)
	dump.Wait()
	raw, err := os.ReadFile(pcap)
	if err != nil || len(raw) < 100 {
		t.Fatalf("the capture is empty (%d bytes): %v\n%s", len(raw), err, dumpErr.String())
	}
	if bytes.Contains(raw, []byte(marker)) {
		t.Fatal("the marker crossed n2's link in clear")
	}
	other, _ := exec.Command("tcpdump", "-nn", "-r", pcap, "ip and not (udp port 51820 or tcp port 7430)").CombinedOutput()
	var lines []string
	for _, l := range strings.Split(strings.TrimSpace(string(other)), "\n") {
		if l != "" && !strings.HasPrefix(l, "reading from file") {
			lines = append(lines, l)
		}
	}
	if len(lines) > 0 {
		t.Fatalf("n2's link carried more than WireGuard and the node port:\n%s", strings.Join(lines, "\n"))
	}
	if wg, _ := exec.Command("tcpdump", "-nn", "-r", pcap, "udp port 51820").Output(); len(bytes.TrimSpace(wg)) == 0 {
		t.Fatal("no WireGuard datagram crossed: the capture saw nothing at all")
	}

	// Garbage and replayed datagrams to n1's WireGuard port change nothing,
	// and cost n1's agent little CPU.
	before := n[1].cpuTime(t)
	for _, args := range [][]string{{"garbage", n[1].addr() + ":51820", "20000"}, {"replay", n[1].addr() + ":51820", pcap}, {"replay", n[1].addr() + ":51820", pcap}} {
		if out, err := exec.Command("ip", append([]string{"netns", "exec", outsiderNS, wgfloodBin}, args...)...).CombinedOutput(); err != nil {
			t.Fatalf("wgflood %s: %v\n%s", args[0], err, out)
		} else {
			t.Logf("wgflood %s: %s", args[0], strings.TrimSpace(string(out)))
		}
	}
	spent := n[1].cpuTime(t) - before
	t.Logf("n1's agent spent %s of CPU on 20000 garbage and the replayed datagrams", spent)
	if spent > 5*time.Second {
		t.Fatalf("n1's agent spent %s of CPU on a flood of 20000 datagrams", spent)
	}
	consumerReaches(t, n[2], 10*time.Second, "the consumer still reaches the provider after the flood")

	// The MTU fits the underlay: a 64 KB ping and 1 MB over TCP pass between
	// a container on n2 and n1.
	if out, err := n[2].inContainer("bedcons.app", "ping", "-c", "1", "-W", "5", "-s", "65000", "100.90.0.1"); err != nil || !strings.Contains(out, "1 packets received") {
		t.Fatalf("64 KB ping from n2's container to n1: %v\n%s", err, out)
	}
	if out, err := n[2].inContainer("bedcons.app", "sh", "-c", "head -c 1048576 /dev/zero | nc -w 5 bedprov.internal 8092"); err != nil {
		t.Fatalf("1 MB to n1's sink: %v\n%s", err, out)
	}
	eventually(t, 20*time.Second, "n1's sink received 1 MB", func() (bool, string) {
		b, err := os.ReadFile(n[1].h.dir + "/srv/bedprov-sink/received")
		logs, _ := n[1].h.podmanCmd("logs", "bedprov.sink").CombinedOutput()
		ps, _ := n[1].h.podmanCmd("ps", "-a").CombinedOutput()
		return strings.TrimSpace(string(b)) == "1048576", fmt.Sprintf("%q %v; sink logs: %s; %s", b, err, logs, ps)
	})

	// A partition of n2's underlay heals without an operator: names keep
	// answering meanwhile, and the consumer reaches the provider again.
	sh(t, "ip", "link", "set", "mbn2-h", "down")
	if out := n[2].resolve("bedprov.internal"); !strings.Contains(out, "100.90.0.1") {
		t.Fatalf("n2's resolver during the partition: %s", out)
	}
	if _, err := fetch(n[2], "/"); err == nil {
		t.Log("note: the consumer's request passed during the partition (the link went down after it)")
	}
	time.Sleep(3 * time.Second) // the partition lasts
	sh(t, "ip", "link", "set", "mbn2-h", "up")
	healed := time.Now()
	consumerReaches(t, n[2], 30*time.Second, "the consumer reaches the provider after the partition heals")
	t.Logf("after the partition healed, the consumer reached the provider in %s", time.Since(healed).Round(10*time.Millisecond))

	// n1's agent killed -9 and started again: the same key and address, the
	// device still there, the consumer served again.
	pub := func() string {
		var nodes []struct {
			Name    string `json:"name"`
			Key     string `json:"overlay_key"`
			Address string `json:"overlay_address"`
		}
		out, _ := n[2].command("node", "list", "--json", "--data-dir", n[2].n.dir).Output()
		json.Unmarshal(out, &nodes)
		return fmt.Sprint(nodes)
	}
	keysBefore := pub()
	n[1].cmd.Process.Signal(syscall.SIGKILL)
	n[1].cmd.Wait()
	n[1].cmd = nil
	if out, err := exec.Command("ip", "netns", "exec", "mbn1", "ip", "-br", "addr", "show", "meshwg0").CombinedOutput(); err != nil || !strings.Contains(string(out), "100.90.0.1/16") {
		t.Fatalf("after kill -9 n1's device is gone: %v %s", err, out)
	}
	n[1].start()
	consumerReaches(t, n[2], 30*time.Second, "the consumer reaches the provider after n1's agent was killed and restarted")
	if pub() != keysBefore {
		t.Fatal("a restart changed the nodes' overlay keys or addresses")
	}

	// mesh node remove: within 2 s the removed node reaches no overlay
	// address of the others (their devices dropped its key), and they reach
	// it no more. The node removed is n3, or n2 when n3 leads (a leader is
	// not removed while it leads).
	reach := func(from *agent, to string) error {
		out, err := exec.Command("ip", "netns", "exec", from.h.netns, "ping", "-c", "1", "-W", "1", to).CombinedOutput()
		if err != nil {
			return fmt.Errorf("%v: %s", err, out)
		}
		return nil
	}
	// The leader is read at each try: n1's restart above may move it.
	var victim *agent
	var others []*agent
	var victimAddr string
	var asked, removed time.Time
	eventually(t, 30*time.Second, "mesh node remove of n3 (or n2, when n3 leads)", func() (bool, string) {
		var st struct{ Leader string }
		json.Unmarshal([]byte(n[1].mesh("status", "--json")), &st)
		victim, others = n[3], []*agent{n[1], n[2]}
		if st.Leader == "n3" {
			victim, others = n[2], []*agent{n[1], n[3]}
		}
		for _, o := range others {
			if err := reach(victim, o.oaddr()); err != nil {
				return false, victim.name + " does not reach " + o.name + " before its removal: " + err.Error()
			}
		}
		victimAddr = victim.oaddr()
		asked = time.Now()
		out, err := n[1].command("node", "remove", victim.name, "--force", "--data-dir", n[1].n.dir).CombinedOutput()
		removed = time.Now()
		return err == nil, string(out)
	})
	eventually(t, 5*time.Second, victim.name+" reaches no overlay address of the others", func() (bool, string) {
		for _, o := range others {
			if reach(victim, o.oaddr()) == nil {
				return false, victim.name + " reaches " + o.name
			}
		}
		return true, ""
	})
	t.Logf("%s reached nothing of the overlay %s after mesh node remove returned (pings of 1 s each)", victim.name, time.Since(removed).Round(10*time.Millisecond))
	for _, o := range others {
		if reach(o, victimAddr) == nil {
			t.Fatalf("%s still reaches the removed %s", o.name, victim.name)
		}
		// When each peer let go of the removed node's key, from its log.
		var at time.Time
		eventually(t, 5*time.Second, o.name+" logs the removed peer", func() (bool, string) {
			for _, l := range strings.Split(o.log(), "\n") {
				if strings.Contains(l, `msg="overlay peer removed"`) && strings.Contains(l, " peer="+victim.name+" ") {
					f := strings.Fields(l)
					at, _ = time.Parse(time.RFC3339Nano, strings.TrimPrefix(f[0], "time="))
					return true, ""
				}
			}
			return false, ""
		})
		t.Logf("%s dropped %s's key %s after mesh node remove was asked", o.name, victim.name, at.Sub(asked).Round(time.Millisecond))
	}

	// A node that joins is a peer of every node as soon as its agent runs.
	n4 := newNetnsNode(t, 4)
	token := strings.TrimSpace(n[1].mesh("token"))
	n4.run("join", n[1].addr(), "--token", token, "--name", "n4", "--address", n4.addr(), "--data-dir", n4.n.dir)
	n4.start()
	ready := time.Now()
	for _, o := range others {
		eventually(t, 10*time.Second, o.name+" reaches the new n4 over the overlay", func() (bool, string) {
			err := reach(o, n4.oaddr())
			return err == nil, fmt.Sprint(err)
		})
	}
	t.Logf("the joined n4 was reachable over the overlay from %s and %s %s after its agent was ready", others[0].name, others[1].name, time.Since(ready).Round(10*time.Millisecond))
}

// With --overlay off (nodes that already share a private network) the
// names answer the mesh addresses and internal ports are published on each
// node's mesh address only.
func TestOverlayOff(t *testing.T) {
	n := multiBed(t)
	n[1].run("init", "--name", "n1", "--address", n[1].addr(), "--data-dir", n[1].n.dir, "--overlay", "off")
	n[1].start()
	token := strings.TrimSpace(n[1].mesh("token"))
	n[2].run("join", n[1].addr(), "--token", token, "--name", "n2", "--address", n[2].addr(), "--data-dir", n[2].n.dir)
	n[2].start()
	if _, err := os.Stat(n[2].n.dir + "/overlay.key"); err == nil {
		t.Fatal("a node of a mesh without overlay keeps an overlay key")
	}
	n[1].mesh("module", "add", n[1].manifest("bedprov", overlayProvider, map[string]string{"name": "bedprov"}), n[1].manifest("bedcons", overlayConsumer, nil))
	n[1].mesh("assign", "n1", "bedprov", "--wait")
	n[1].mesh("assign", "n2", "bedcons", "--wait")
	if out := n[2].resolve("bedprov.internal"); !strings.Contains(out, n[1].addr()) {
		t.Fatalf("bedprov.internal: %s", out)
	}
	consumerReaches(t, n[2], 20*time.Second, "the consumer on n2 reaches bedprov on n1 at its mesh address")
	ports := n[1].h.podman("port", "bedprov.web")
	if !strings.Contains(ports, n[1].addr()+":8090") {
		t.Fatalf("bedprov.web's internal port is not on n1's mesh address only: %s", ports)
	}
	if ports := n[1].h.podman("port", "bedprov.public"); !strings.Contains(ports, "0.0.0.0:8091") {
		t.Fatalf("the public port is not on every interface: %s", ports)
	}
	if out, err := exec.Command("ip", "netns", "exec", "mbn1", "ip", "link", "show", "meshwg0").CombinedOutput(); err == nil {
		t.Fatalf("a mesh without overlay made the device:\n%s", out)
	}
}

// newNetnsRootlessNode makes node i as a rootless host: its namespace and
// link, the bed user's Podman service inside it, a data dir the user owns.
func newNetnsRootlessNode(t *testing.T, i int) *agent {
	t.Helper()
	u, err := user.Lookup(bedUser)
	if err != nil {
		t.Fatalf("user %s is missing; contrib/test.sh creates it", bedUser)
	}
	ns := netnsLink(t, i)
	h := &host{t: t, rootless: true, usr: u, dir: filepath.Join(u.HomeDir, fmt.Sprintf("mesh-obed-n%d", i)), dnsAddr: "169.254.53.53", netns: ns, runtime: "/run/user/" + u.Uid}
	clean := func() {
		exec.Command("pkill", "-f", h.dir).Run()
		h.podmanCmd("rm", "-af", "-t", "0").Run()
		exec.Command("pkill", "-u", bedUser).Run()
		os.RemoveAll(h.dir)
		os.RemoveAll(filepath.Dir(agentHelper))
	}
	clean()
	t.Cleanup(clean)
	uid, _ := strconv.Atoi(u.Uid)
	gid, _ := strconv.Atoi(u.Gid)
	for _, d := range []string{h.dir, filepath.Join(h.dir, "srv"), h.runtime} {
		os.MkdirAll(d, 0o700)
		os.Chown(d, uid, gid)
	}
	h.conf = filepath.Join(h.dir, "containers.conf")
	os.WriteFile(h.conf, []byte(containersC), 0o644)
	os.Chown(h.conf, uid, gid)
	h.sock = filepath.Join(h.runtime, "mesh-obed-podman.sock")
	h.importImage()
	h.startService()
	return &agent{name: fmt.Sprintf("n%d", i), h: h, n: &node{t: t, dir: h.dir + "/data"}}
}

// agentHelper is the bed user's port-53 helper, as mesh setup installs it.
const agentHelper = "/usr/local/lib/mesh/" + bedUser + "/mesh-resolver-socket"

// The consumer-provider case with the consumer's node rootless: mesh setup
// (as root, once before and once after the join) gives the bed user the
// resolver's port 53 through the helper alone and the overlay device; the
// user's agent runs WireGuard on it; rootless containers reach a provider
// on another node over the overlay, and their own internal ports are on
// the overlay address only.
func TestOverlayRootless(t *testing.T) {
	multiCleanup()
	t.Cleanup(multiCleanup)
	os.MkdirAll(multiDir, 0o755)
	sh(t, "ip", "link", "add", multiBridge, "type", "bridge")
	sh(t, "ip", "link", "set", multiBridge, "up")
	n := []*agent{nil, newNetnsNode(t, 1), newNetnsRootlessNode(t, 2)}
	n[1].run("init", "--name", "n1", "--address", n[1].addr(), "--data-dir", n[1].n.dir)
	n[1].start()
	token := strings.TrimSpace(n[1].mesh("token"))

	setup := func(args ...string) string {
		t.Helper()
		out, err := inNetns(n[2].h.netns, exec.Command(meshBin, append([]string{"setup", "--user", bedUser, "--dns-address", "169.254.53.53"}, args...)...)).CombinedOutput()
		if err != nil {
			t.Fatalf("mesh setup: %v\n%s", err, out)
		}
		return string(out)
	}
	if out := setup("--data-dir", n[2].n.dir); !strings.Contains(out, "port 53: only "+bedUser+"'s agent may bind it") || !strings.Contains(out, "no node in") {
		t.Fatalf("mesh setup before the join:\n%s", out)
	}
	n[2].run("join", n[1].addr(), "--token", token, "--name", "n2", "--address", n[2].addr(), "--data-dir", n[2].n.dir)
	if out := setup("--data-dir", n[2].n.dir); !strings.Contains(out, "overlay: meshwg0 holds 100.90.0.2/16") {
		t.Fatalf("mesh setup after the join:\n%s", out)
	}
	// Nothing host-wide: the port limit stays, and only the bed user's
	// group may run the helper.
	if b, _ := exec.Command("ip", "netns", "exec", n[2].h.netns, "sysctl", "-n", "net.ipv4.ip_unprivileged_port_start").Output(); strings.TrimSpace(string(b)) != "1024" {
		t.Fatalf("ip_unprivileged_port_start is %s", b)
	}
	if out, err := exec.Command("runuser", "-u", "nobody", "--", agentHelper, "169.254.53.53").CombinedOutput(); err == nil || !strings.Contains(string(out), "ermission denied") {
		t.Fatalf("another user runs the helper: %v %s", err, out)
	}
	// The helper keeps its one job under any name: the bed user cannot run
	// the whole CLI with its capability through a link of another name.
	alias := filepath.Join(n[2].h.usr.HomeDir, "mesh-alias")
	defer os.Remove(alias)
	if out, err := n[2].h.asUser("sh", "-c", "ln -sf "+agentHelper+" "+alias+" && "+alias+" status --json").CombinedOutput(); err == nil || !strings.Contains(string(out), "give the resolver's address, and nothing else") {
		t.Fatalf("the helper run under another name: %v %s", err, out)
	}
	n[2].start()

	// (n2's modules' paths are under the bed user's home, where its agent
	// may write.)
	n[1].mesh("module", "add", n[1].manifest("bedprov", overlayProvider, map[string]string{"name": "bedprov"}),
		n[2].manifest("bedcons", overlayConsumer, nil), n[2].manifest("bedprov2", overlayProvider, map[string]string{"name": "bedprov2"}))
	n[1].mesh("assign", "n1", "bedprov", "--wait")
	n[1].mesh("assign", "n2", "bedcons", "--wait")
	consumerReaches(t, n[2], 30*time.Second, "the rootless consumer on n2 reaches bedprov on n1 over the overlay")

	// The rootless node's own ports: the internal one on its overlay address
	// only, the public one everywhere.
	n[1].mesh("assign", "n2", "bedprov2", "--wait")
	outsider(t, n[2].addr())
	eventually(t, 20*time.Second, "n1 reaches n2's internal port on its overlay address", func() (bool, string) {
		out, err := get("mbn1", "100.90.0.2", 8090)
		return err == nil && strings.Contains(out, "provider page"), fmt.Sprintf("%v %s", err, out)
	})
	if out, err := get(outsiderNS, n[2].addr(), 8090); err == nil && strings.Contains(out, "provider page") {
		t.Fatalf("the outsider reached n2's internal port at its address: %s", out)
	}
	if out, err := get(outsiderNS, "100.90.0.2", 8090); err == nil && strings.Contains(out, "provider page") {
		t.Fatalf("the outsider reached n2's internal port at its overlay address: %s", out)
	}
	if out, err := get(outsiderNS, n[2].addr(), 8091); err != nil || !strings.Contains(out, "provider page") {
		t.Fatalf("the outsider does not reach n2's public port: %v %s", err, out)
	}
}

// A one-node mesh works the same way (the README's tour): its internal port
// answers on its overlay address, found with mesh resolve --short, and not
// on its own address.
func TestOverlayOneNode(t *testing.T) {
	multiCleanup()
	t.Cleanup(multiCleanup)
	os.MkdirAll(multiDir, 0o755)
	sh(t, "ip", "link", "add", multiBridge, "type", "bridge")
	sh(t, "ip", "link", "set", multiBridge, "up")
	a := newNetnsNode(t, 1)
	a.run("init", "--name", "n1", "--address", a.addr(), "--data-dir", a.n.dir)
	a.start()
	a.mesh("module", "add", a.manifest("bedprov", overlayProvider, map[string]string{"name": "bedprov"}))
	a.mesh("assign", "n1", "bedprov", "--wait")
	at := strings.TrimSpace(a.mesh("resolve", "--short", "bedprov.internal"))
	if at != "100.90.0.1" {
		t.Fatalf("mesh resolve --short bedprov.internal: %q", at)
	}
	eventually(t, 20*time.Second, "the internal port answers on the overlay address", func() (bool, string) {
		out, err := get(a.h.netns, at, 8090)
		return err == nil && strings.Contains(out, "provider page"), fmt.Sprintf("%v %s", err, out)
	})
	if out, err := get(a.h.netns, a.addr(), 8090); err == nil && strings.Contains(out, "provider page") {
		t.Fatalf("the internal port answers on the node's own address: %s", out)
	}
	if out := a.mesh("check", a.h.dir+"/bedprov.yaml"); !strings.Contains(out, "public ports: bedprov.public 8091:8091") {
		t.Fatalf("mesh check does not list the public port:\n%s", out)
	}
}
