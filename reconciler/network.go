package reconciler

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"sort"

	"mesh/state"
	"mesh/state/manifest"
)

// Each module's containers and steps run on a bridge network of their own
// (rootful Podman; a rootless container has a network namespace of its own
// already). On one bridge shared by every module, a container reached any
// other module's unpublished ports at its address: the bridge forwards
// between its ports, which no IP packet filter sees unless br_netfilter is
// loaded. On bridges of their own, traffic between modules is routed by
// the host, where the mesh's filter (agent/overlay/isolate.go) drops a new
// connection into a module's bridge unless it came to a published port.
// Modules reach each other as they always did, by name, at a node's
// overlay address and a published port.

// BridgePrefix begins the host interface name of every module's bridge:
// the packet filter matches it.
const BridgePrefix = "meshm"

// ModuleNetwork is the network of module's containers: its name in Podman
// and its bridge (an interface name has at most 15 bytes, a module name
// up to 63: a digest of the name, not the name).
func ModuleNetwork(module string) Network {
	sum := sha256.Sum256([]byte(module))
	return Network{Name: "mesh-" + module, Module: module, Interface: BridgePrefix + hex.EncodeToString(sum[:5]),
		Labels: map[string]string{LabelManaged: "1", LabelModule: module}}
}

// networkOf is the network name of module's containers on this node, empty
// when they use the runtime's default.
func (r *Reconciler) networkOf(module string) string {
	if !r.cfg.ModuleNetworks {
		return ""
	}
	return ModuleNetwork(module).Name
}

// networks lists the runtime's networks once per run (the operator's too:
// one may hold a module network's name).
func (x *run) networks(ctx context.Context) (map[string]Network, error) {
	if x.nets != nil {
		return x.nets, nil
	}
	list, err := x.rt.Networks(ctx)
	if err != nil {
		return nil, fmt.Errorf("list networks: %w", err)
	}
	if x.nets != nil {
		// Another module's listing came first while the lock was let go
		// for the call (modules.go): one map, or a network made meanwhile
		// would be made twice.
		return x.nets, nil
	}
	x.nets = map[string]Network{}
	for _, n := range list {
		x.nets[n.Name] = n
	}
	return x.nets, nil
}

// ensureNetwork makes module's network when it is missing, before the first
// of its containers is created. It returns why it could not.
func (x *run) ensureNetwork(ctx context.Context, module string) string {
	if !x.r.cfg.ModuleNetworks {
		return ""
	}
	want := ModuleNetwork(module)
	have, err := x.networks(ctx)
	if err != nil {
		return err.Error()
	}
	if n, ok := have[want.Name]; ok {
		if n.Labels[LabelManaged] != "1" || n.Labels[LabelModule] != module {
			return fmt.Sprintf("a network named %s exists and is not the mesh's network of module %s; remove it (podman network rm %s)", want.Name, module, want.Name)
		}
		return ""
	}
	if x.r.cfg.ClearBridge != nil {
		if err := x.r.cfg.ClearBridge(want.Interface); err != nil {
			return fmt.Sprintf("make the module's network %s: %v", want.Name, err)
		}
	}
	if err := x.rt.CreateNetwork(ctx, want); err != nil {
		return fmt.Sprintf("create the module's network %s: %v", want.Name, err)
	}
	have[want.Name] = want
	if x.r.cfg.NetworkMade != nil {
		x.r.cfg.NetworkMade()
	}
	x.r.log.Info("made the module's network", "module", module, "network", want.Name, "interface", want.Interface)
	return ""
}

// pruneNetworks removes the mesh's networks of modules that have no step
// or container in plan. One a container still uses (a module's failed
// removal, an operator's own container) stays, and is tried again on the
// next pass.
func (x *run) pruneNetworks(ctx context.Context, plan *state.Plan) {
	if !x.r.cfg.ModuleNetworks {
		return
	}
	want := map[string]bool{}
	for _, res := range plan.Resources {
		if res.Kind == manifest.KindStep || res.Kind == manifest.KindContainer {
			want[res.Module] = true
		}
	}
	have, err := x.networks(ctx)
	if err != nil {
		x.r.log.Warn("networks not pruned", "err", err)
		return
	}
	names := make([]string, 0, len(have))
	for name, n := range have {
		if n.Labels[LabelManaged] == "1" && n.Module != "" && !want[n.Module] && name == ModuleNetwork(n.Module).Name {
			names = append(names, name)
		}
	}
	sort.Strings(names)
	for _, name := range names {
		if err := x.rt.RemoveNetwork(ctx, name); err != nil {
			x.r.log.Debug("network kept", "network", name, "err", err)
			continue
		}
		delete(have, name)
		x.r.log.Info("removed the network of a module no longer on this node", "network", name)
	}
}
