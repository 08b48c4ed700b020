package main

import (
	"net"
	"testing"
)

func TestLabelOf(t *testing.T) {
	for in, want := range map[string]string{"Ace": "ace", "web_01.example.org": "web-01", "-x-": "x", "höst": "hst"} {
		if got, err := labelOf(in); err != nil || got != want {
			t.Errorf("labelOf(%q) = %q, %v; want %q", in, got, err, want)
		}
	}
	for _, in := range []string{"", "...", "___", string(make([]byte, 64))} {
		if got, err := labelOf(in); err == nil {
			t.Errorf("labelOf(%q) = %q, want an error", in, got)
		}
	}
}

func TestSourceAddressToward(t *testing.T) {
	for _, peer := range []string{"127.0.0.1", "127.0.0.1:7431"} {
		a, err := sourceAddressToward(peer)
		if err != nil || net.ParseIP(a) == nil || !net.ParseIP(a).IsLoopback() {
			t.Fatalf("toward %s: %q %v", peer, a, err)
		}
	}
	if _, err := sourceAddressToward("not an address"); err == nil {
		t.Fatal("a bad peer gave an address")
	}
}
