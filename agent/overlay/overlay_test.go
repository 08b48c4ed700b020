package overlay

import (
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/google/nftables/expr"

	"mesh/internal/wgkey"
)

func key(t *testing.T) string {
	t.Helper()
	k, err := wgkey.Generate()
	if err != nil {
		t.Fatal(err)
	}
	return k.Public()
}

func hexOf(t *testing.T, b64 string) string {
	h, err := wgkey.PublicHex(b64)
	if err != nil {
		t.Fatal(err)
	}
	return h
}

// A node's peers are every other node with a key, an endpoint and an
// address, each allowed only its own address; what is damaged or taken
// twice is left out and said.
func TestWant(t *testing.T) {
	k1, k2, k3, k4 := key(t), key(t), key(t), key(t)
	nodes := []Node{
		{Name: "n3", Key: k3, Endpoint: "10.0.0.3:51820", Address: "100.90.0.3"},
		{Name: "n1", Key: k1, Endpoint: "10.0.0.1:51820", Address: "100.90.0.1"},
		{Name: "n2", Key: k2, Endpoint: "10.0.0.2:51820", Address: "100.90.0.2"},
		{Name: "old", Address: "", Endpoint: ""},                                           // an older binary: no key yet
		{Name: "bad", Key: "not-a-key", Endpoint: "10.0.0.5:51820", Address: "100.90.0.5"}, // damaged key
		{Name: "twin", Key: k2, Endpoint: "10.0.0.6:51820", Address: "100.90.0.6"},         // n2's key
		{Name: "thief", Key: k4, Endpoint: "10.0.0.7:51820", Address: "100.90.0.1"},        // n1's address
		{Name: "noep", Key: key(t), Endpoint: "somewhere", Address: "100.90.0.8"},          // endpoint does not parse
		{Name: "v6", Key: key(t), Endpoint: "10.0.0.9:51820", Address: "fd00::9"},          // not IPv4
		{Name: "waiting", Key: key(t), Endpoint: "10.0.0.10:51820", Address: ""},           // no address yet
	}
	peers, problems := Want("n1", nodes)
	if len(peers) != 2 || peers[0].Name != "n2" || peers[1].Name != "n3" {
		t.Fatalf("peers %+v, want n2 and n3", peers)
	}
	if peers[0].KeyHex != hexOf(t, k2) || peers[0].Address != netip.MustParseAddr("100.90.0.2") || peers[0].Endpoint != netip.MustParseAddrPort("10.0.0.2:51820") {
		t.Fatalf("n2 as a peer: %+v", peers[0])
	}
	want := []string{"bad", "twin", "thief", "noep", "v6"}
	if len(problems) != len(want) {
		t.Fatalf("problems %q, want one for each of %v", problems, want)
	}
	for _, n := range want {
		if !strings.Contains(strings.Join(problems, "\n"), "node "+n+":") {
			t.Fatalf("no problem said for %s: %q", n, problems)
		}
	}
	// A node is never its own peer, whatever it is called in the list.
	if p, _ := Want("n2", nodes); len(p) != 2 || p[0].Name != "n1" || p[1].Name != "n3" {
		t.Fatalf("n2's peers: %+v", p)
	}
}

// WireGuard is told only what changed: an unchanged peer is not mentioned
// (its session and roamed endpoint stay), a moved one gets its new
// endpoint, a removed one is removed.
func TestChange(t *testing.T) {
	p := func(name, k, ep, addr string) Peer {
		return Peer{Name: name, KeyHex: k, Endpoint: netip.MustParseAddrPort(ep), Address: netip.MustParseAddr(addr)}
	}
	a := p("a", "aa", "10.0.0.1:51820", "100.90.0.1")
	b := p("b", "bb", "10.0.0.2:51820", "100.90.0.2")
	b2 := p("b", "bb", "10.0.0.22:51820", "100.90.0.2")
	c := p("c", "cc", "10.0.0.3:51820", "100.90.0.3")
	cases := []struct {
		name       string
		have, want []Peer
		out        string
	}{
		{"nothing to do", []Peer{a, b}, []Peer{a, b}, ""},
		{"first", nil, []Peer{a}, "public_key=aa\nendpoint=10.0.0.1:51820\nreplace_allowed_ips=true\nallowed_ip=100.90.0.1/32\npersistent_keepalive_interval=25\n"},
		{"one more", []Peer{a}, []Peer{a, c}, "public_key=cc\nendpoint=10.0.0.3:51820\nreplace_allowed_ips=true\nallowed_ip=100.90.0.3/32\npersistent_keepalive_interval=25\n"},
		{"moved", []Peer{a, b}, []Peer{a, b2}, "public_key=bb\nendpoint=10.0.0.22:51820\nreplace_allowed_ips=true\nallowed_ip=100.90.0.2/32\n"},
		{"removed", []Peer{a, b}, []Peer{a}, "public_key=bb\nremove=true\n"},
	}
	for _, tc := range cases {
		if got := change(tc.have, tc.want); got != tc.out {
			t.Errorf("%s: told\n%s\nwant\n%s", tc.name, got, tc.out)
		}
	}
}

func TestParseStats(t *testing.T) {
	get := "private_key=00\nlisten_port=51820\npublic_key=aa\nendpoint=10.0.0.1:51820\nlast_handshake_time_sec=1764590000\nlast_handshake_time_nsec=5\nrx_bytes=100\ntx_bytes=200\n" +
		"public_key=bb\nlast_handshake_time_sec=0\nlast_handshake_time_nsec=0\nrx_bytes=0\ntx_bytes=148\n"
	s := parseStats(get, map[string]string{"aa": "n1", "bb": "n2"})
	if s["n1"].RxBytes != 100 || s["n1"].TxBytes != 200 || !s["n1"].LastHandshake.Equal(time.Unix(1764590000, 5)) || s["n1"].Endpoint != "10.0.0.1:51820" {
		t.Fatalf("n1: %+v", s["n1"])
	}
	if !s["n2"].LastHandshake.IsZero() || s["n2"].TxBytes != 148 {
		t.Fatalf("n2 never shook hands: %+v", s["n2"])
	}
}

// The filter drops what is for the prefix unless it came through the
// device, loopback or Podman's bridges.
func TestFilterRules(t *testing.T) {
	in, fwd := filterRules(netip.MustParsePrefix("100.90.0.0/16"), "meshwg0")
	var text []string
	for _, r := range in {
		text = append(text, r.text)
	}
	want := []string{`iifname "meshwg0" accept`, `iifname "lo" accept`, `iifname "podman*" accept`, `iifname "cni-podman*" accept`, `iifname "meshm*" accept`, `ip daddr 100.90.0.0/16 drop`}
	if strings.Join(text, "\n") != strings.Join(want, "\n") {
		t.Fatalf("rules:\n%s\nwant:\n%s", strings.Join(text, "\n"), strings.Join(want, "\n"))
	}
	if m := maskOf(16); string(m) != "\xff\xff\x00\x00" {
		t.Fatalf("mask of /16: %x", m)
	}
	if len(fwd) != 1 || !strings.Contains(fwd[0].text, "maxseg") {
		t.Fatalf("forward rules: %+v", fwd)
	}
	// The text above is for people; the expressions are what the kernel
	// runs. An exact name ends in NUL (else "meshwg0" would take
	// "meshwg0x" too), a prefix does not.
	name := func(r rule) (string, expr.VerdictKind) {
		return string(r.exprs[1].(*expr.Cmp).Data), r.exprs[2].(*expr.Verdict).Kind
	}
	if n, v := name(in[0]); n != "meshwg0\x00" || v != expr.VerdictAccept {
		t.Fatalf("the device's rule matches %q, verdict %v", n, v)
	}
	if n, _ := name(in[2]); n != "podman" {
		t.Fatalf("the bridges' rule matches %q", n)
	}
	// The drop: the IPv4 destination (offset 16 of the network header, 4
	// bytes), masked to the prefix, equal to the network.
	d := in[len(in)-1].exprs
	p, ok := d[0].(*expr.Payload)
	if !ok || p.Base != expr.PayloadBaseNetworkHeader || p.Offset != 16 || p.Len != 4 {
		t.Fatalf("the drop loads %+v", d[0])
	}
	if b := d[1].(*expr.Bitwise); string(b.Mask) != "\xff\xff\x00\x00" {
		t.Fatalf("the drop masks with %x", b.Mask)
	}
	if c := d[2].(*expr.Cmp); c.Op != expr.CmpOpEq || string(c.Data) != "\x64\x5a\x00\x00" {
		t.Fatalf("the drop compares with %x", c.Data)
	}
	if v := d[3].(*expr.Verdict); v.Kind != expr.VerdictDrop {
		t.Fatalf("the last rule's verdict is %v", v.Kind)
	}
}

// The modules' rule matches every module bridge by prefix (no NUL), drops
// only a new connection, lets a translated one (a published port) and one
// that stays on its bridge pass; the overlay bed sends the packets
// (integration/overlay_test.go, modulesKeepToThemselves).
func TestIsolateRule(t *testing.T) {
	r := isolateRule()
	if r.text != `oifname "meshm*" ct state new ct status & dnat == 0 fib daddr . iif oif missing drop` {
		t.Fatalf("rule %q", r.text)
	}
	if c := r.exprs[1].(*expr.Cmp); string(c.Data) != ModuleBridges {
		t.Fatalf("the bridges' match %q", c.Data)
	}
	if b := r.exprs[3].(*expr.Bitwise); string(b.Mask) != string(hostOrder(expr.CtStateBitNEW)) {
		t.Fatalf("the state's mask %x", b.Mask)
	}
	if b := r.exprs[6].(*expr.Bitwise); string(b.Mask) != string(hostOrder(0x20)) {
		t.Fatalf("the status's mask %x, want IPS_DST_NAT", b.Mask)
	}
	if f := r.exprs[8].(*expr.Fib); !f.FlagDADDR || !f.FlagIIF || !f.ResultOIF || f.FlagSADDR {
		t.Fatalf("fib %+v", f)
	}
	if v := r.exprs[len(r.exprs)-1].(*expr.Verdict); v.Kind != expr.VerdictDrop {
		t.Fatalf("verdict %v", v.Kind)
	}
}

// respell is another spelling of the base64 key k that decodes to the same
// 32 bytes: the last character's two unused bits set.
func respell(t *testing.T, k string) string {
	t.Helper()
	const alphabet = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/"
	i := strings.IndexByte(alphabet, k[42])
	if len(k) != 44 || i < 0 || k[43] != '=' {
		t.Fatalf("%q is not a base64 WireGuard key", k)
	}
	return k[:42] + string(alphabet[i|3]) + "="
}

// The state refuses a second node with a key another node holds by
// comparing the keys as strings; base64 spells one key several ways (the
// last character's unused bits, line breaks). A node (or a joiner with a
// token) that gave another spelling of n2's key, under a name sorted
// before n2's, took n2's place in every other node's peers: n2's key
// routed to its endpoint and address, n2 cut off from the overlay. Only
// the one spelling the agent writes is taken.
func TestWantTakesOneSpellingOfAKey(t *testing.T) {
	k1, k2 := key(t), key(t)
	for _, other := range []string{respell(t, k2), k2 + "\n", k2[:20] + "\r\n" + k2[20:]} {
		if h, err := wgkey.PublicHex(other); err == nil && h != hexOf(t, k2) {
			t.Fatalf("%q decodes to another key", other)
		}
		nodes := []Node{
			{Name: "n1", Key: k1, Endpoint: "10.0.0.1:51820", Address: "100.90.0.1"},
			{Name: "n2", Key: k2, Endpoint: "10.0.0.2:51820", Address: "100.90.0.2"},
			{Name: "a-thief", Key: other, Endpoint: "10.0.0.66:51820", Address: "100.90.0.66"},
		}
		peers, problems := Want("n1", nodes)
		if len(peers) != 1 || peers[0].Name != "n2" || peers[0].Endpoint != netip.MustParseAddrPort("10.0.0.2:51820") || peers[0].Address != netip.MustParseAddr("100.90.0.2") {
			t.Fatalf("key spelt %q: peers %+v (problems %q), want n2 alone at its own endpoint and address", other, peers, problems)
		}
		if len(problems) != 1 || !strings.Contains(problems[0], "node a-thief:") {
			t.Fatalf("key spelt %q: problems %q", other, problems)
		}
	}
}
