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
