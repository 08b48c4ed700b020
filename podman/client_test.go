package podman

import (
	"encoding/json"
	"net/netip"
	"slices"
	"strings"
	"testing"
	"time"

	"mesh/reconciler"

	nettypes "github.com/containers/common/libnetwork/types"
	"github.com/containers/podman/v5/pkg/domain/entities/types"
	"github.com/containers/podman/v5/pkg/specgen"
)

// A container's terminal, init, pids limit, supplementary groups and mount
// labels reach Podman's spec, under the names Podman 4.3's API reads; a
// container without them asks for none, so Podman's defaults hold (its
// pids_limit among them).
func TestGeneratorCarriesTheComposeKeys(t *testing.T) {
	s := reconciler.Spec{Name: "f.app", Image: "b:2", TTY: true, Init: true, PidsLimit: 512, GroupAdd: []string{"1000", "video"},
		Mounts: []reconciler.Mount{{Source: "/srv/f", Destination: "/data", Options: []string{"ro", "z"}}, {Source: "/srv/g", Destination: "/g", Options: []string{"Z"}}}}
	g := generator(s)
	if g.Terminal == nil || !*g.Terminal || g.Init == nil || !*g.Init || strings.Join(g.Groups, " ") != "1000 video" {
		t.Fatalf("terminal %v, init %v, groups %v", g.Terminal, g.Init, g.Groups)
	}
	if g.ResourceLimits == nil || g.ResourceLimits.Pids == nil || g.ResourceLimits.Pids.Limit != 512 || g.ResourceLimits.Memory != nil || g.ResourceLimits.CPU != nil {
		t.Fatalf("resource limits: %+v", g.ResourceLimits)
	}
	if len(g.Mounts) != 2 || strings.Join(g.Mounts[0].Options, ",") != "rbind,ro,z" || strings.Join(g.Mounts[1].Options, ",") != "rbind,Z" {
		t.Fatalf("mounts: %+v", g.Mounts)
	}
	b, err := json.Marshal(g)
	if err != nil {
		t.Fatal(err)
	}
	for _, k := range []string{`"image_volume_mode":"ignore"`, `"terminal":true`, `"init":true`, `"groups":["1000","video"]`, `"resource_limits":{"pids":{"limit":512}}`, `"options":["rbind","ro","z"]`} {
		if !strings.Contains(string(b), k) {
			t.Errorf("the request lacks %s: %s", k, b)
		}
	}

	// A bounded log is k8s-file's, whatever Podman's default driver (on a
	// host with systemd, journald, which takes no bound).
	logged := generator(reconciler.Spec{Image: "b:2", LogMaxSize: 1 << 20})
	if l := logged.LogConfiguration; l == nil || l.Driver != "k8s-file" || l.Size != 1<<20 {
		t.Fatalf("log configuration: %+v", logged.LogConfiguration)
	}
	b, _ = json.Marshal(logged)
	if !strings.Contains(string(b), `"log_configuration":{"driver":"k8s-file","size":1048576}`) {
		t.Errorf("the request's log configuration: %s", b)
	}

	// Memory and a pids limit together: one set of limits with both.
	both := generator(reconciler.Spec{Image: "b:2", Memory: 64 << 20, PidsLimit: 100})
	if l := both.ResourceLimits; l == nil || l.Memory == nil || *l.Memory.Limit != 64<<20 || l.Pids == nil || l.Pids.Limit != 100 {
		t.Fatalf("memory and pids: %+v", both.ResourceLimits)
	}
	// Out of memory, the kernel ends a container before the agent: one
	// without a limit first.
	if a := both.OOMScoreAdj; a == nil || *a != 500 {
		t.Fatalf("oom_score_adj with a memory limit: %v", a)
	}
	if a := g.OOMScoreAdj; a == nil || *a != 1000 {
		t.Fatalf("oom_score_adj without a memory limit: %v", a)
	}
	b, _ = json.Marshal(both)
	if !strings.Contains(string(b), `"oom_score_adj":500`) {
		t.Errorf("the request's oom_score_adj: %s", b)
	}

	plain := generator(reconciler.Spec{Name: "f.app", Image: "b:2"})
	if plain.Terminal != nil || plain.Init != nil || plain.Groups != nil || plain.ResourceLimits != nil {
		t.Fatalf("a container without the keys: terminal %v, init %v, groups %v, limits %+v", plain.Terminal, plain.Init, plain.Groups, plain.ResourceLimits)
	}
	// A module's network, or Podman's default when none is named.
	onNet := generator(reconciler.Spec{Name: "f.app", Image: "b:2", Network: "mesh-f"})
	if _, ok := onNet.Networks["mesh-f"]; !ok || len(onNet.Networks) != 1 || onNet.NetNS.NSMode != specgen.Bridge {
		t.Fatalf("on the module's network: %v %+v", onNet.Networks, onNet.NetNS)
	}
	if plain.Networks != nil || plain.NetNS.NSMode != "" {
		t.Fatalf("a container on no named network asks for %v %+v", plain.Networks, plain.NetNS)
	}
	b, _ = json.Marshal(plain)
	for _, k := range []string{`"terminal"`, `"init"`, `"groups"`, `"resource_limits"`} {
		if strings.Contains(string(b), k) {
			t.Errorf("a container without the keys asks for %s: %s", k, b)
		}
	}
}

// A container's start reaches the reconciler's Container (mesh logs -f
// tells a run that began and ended between two lookups by it); one never
// started, which Podman gives as Go's zero time in seconds, has none.
func TestContainerStartedAt(t *testing.T) {
	c := toContainer(types.ListContainer{ID: "c1", Names: []string{"f.app"}, State: "exited", StartedAt: 105})
	if !c.StartedAt.Equal(time.Unix(105, 0)) || c.Running {
		t.Fatalf("started %v, running %v; want 105, not running", c.StartedAt, c.Running)
	}
	if c := toContainer(types.ListContainer{ID: "c2", State: "created", StartedAt: time.Time{}.Unix()}); !c.StartedAt.IsZero() {
		t.Fatalf("a container never started: started %v, want none", c.StartedAt)
	}
}

// The resolver answers containers of the node's bridge networks, not every
// device of a LAN a macvlan or ipvlan network is a part of.
func TestBridgeSubnets(t *testing.T) {
	net := func(driver string, cidrs ...string) nettypes.Network {
		n := nettypes.Network{Driver: driver}
		for _, c := range cidrs {
			ip, err := nettypes.ParseCIDR(c)
			if err != nil {
				t.Fatal(err)
			}
			n.Subnets = append(n.Subnets, nettypes.Subnet{Subnet: ip})
		}
		return n
	}
	got := bridgeSubnets([]nettypes.Network{net("bridge", "10.88.0.0/16"), net("macvlan", "192.168.1.0/24"), net("ipvlan", "192.168.2.0/24"), net("bridge", "10.89.3.0/24", "fd00:1::/64")})
	want := []netip.Prefix{netip.MustParsePrefix("10.88.0.0/16"), netip.MustParsePrefix("10.89.3.0/24"), netip.MustParsePrefix("fd00:1::/64")}
	if !slices.Equal(got, want) {
		t.Fatalf("%v, want %v", got, want)
	}
}
