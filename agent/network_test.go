package agent

import (
	"errors"
	"net/netip"
	"testing"

	"mesh/agent/overlay"
)

// The overlay's device is opened only once its packet filter is in: a
// filter that fails leaves no device (which would keep its address on the
// host, unfiltered); a rootless host's filter is mesh setup's.
func TestOverlayFilterComesFirst(t *testing.T) {
	p := netip.MustParsePrefix("100.90.0.0/16")
	var did []string
	ops := func(installErr error) overlayOps {
		return overlayOps{
			install: func(netip.Prefix, string) error { did = append(did, "install"); return installErr },
			open: func(overlay.Config) (*overlay.Device, error) {
				did = append(did, "open")
				return nil, nil
			},
		}
	}
	if _, err := openFiltered(p, overlay.Config{Device: "mesh0"}, ops(errors.New("no nftables"))); err == nil {
		t.Fatal("a filter that failed was not an error")
	}
	if len(did) != 1 || did[0] != "install" {
		t.Fatalf("with the filter failing: %v, want the install only", did)
	}
	did = nil
	if _, err := openFiltered(p, overlay.Config{Device: "mesh0"}, ops(nil)); err != nil {
		t.Fatal(err)
	}
	if len(did) != 2 || did[0] != "install" || did[1] != "open" {
		t.Fatalf("as root: %v, want install then open", did)
	}
	did = nil
	if _, err := openFiltered(p, overlay.Config{Device: "mesh0", Prepared: true}, ops(errors.New("not root"))); err != nil {
		t.Fatal(err)
	}
	if len(did) != 1 || did[0] != "open" {
		t.Fatalf("rootless: %v, want open only", did)
	}
}

// mesh setup (rootless) installs the filter before it makes the device:
// a filter that fails leaves no overlay address on the host.
func TestSetupFilterComesFirst(t *testing.T) {
	p := netip.MustParsePrefix("100.90.0.0/16")
	var did []string
	ops := func(installErr error) prepareOps {
		return prepareOps{
			install: func(netip.Prefix, string) error { did = append(did, "install"); return installErr },
			prepare: func(string, int, netip.Prefix, int) error { did = append(did, "prepare"); return nil },
		}
	}
	addr := netip.MustParsePrefix("100.90.0.7/16")
	if err := prepareFiltered(p, "mesh0", 1000, addr, 1380, ops(errors.New("no nftables"))); err == nil {
		t.Fatal("a filter that failed was not an error")
	}
	if len(did) != 1 || did[0] != "install" {
		t.Fatalf("with the filter failing: %v, want the install only", did)
	}
	did = nil
	if err := prepareFiltered(p, "mesh0", 1000, addr, 1380, ops(nil)); err != nil {
		t.Fatal(err)
	}
	if len(did) != 2 || did[0] != "install" || did[1] != "prepare" {
		t.Fatalf("%v, want install then prepare", did)
	}
}
