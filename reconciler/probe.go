package reconciler

import (
	"context"
	"fmt"
	"mesh/state"
	"strings"
	"time"
)

// ProbeConfig says how to check that the node's resolver answers from
// Podman's network before the first container starts there (seed issue 110:
// reachability checked only at set-up let containers start with no resolver).
type ProbeConfig struct {
	// Binary is a static mesh binary, mounted read-only into the probe
	// container as its entrypoint (it needs nothing from the image).
	Binary string
	// Name is a name the resolver answers, e.g. NODE.DOMAIN.
	Name func(ctx context.Context) string
	// Timeout bounds one probe (default 30s).
	Timeout time.Duration
}

// LabelProbe marks the probe's container; it is never a managed one.
const LabelProbe = "mesh.probe"

// reachable checks, once per agent run, that the resolver answers from a
// container on the network of res's module, using its image (already
// present). It returns why not. Once is enough: every module's bridge is
// made alike, and the resolver is told of each network made
// (Config.NetworkMade).
func (x *run) reachable(ctx context.Context, res state.Resource) string {
	p := x.r.cfg.Probe
	if p == nil || x.r.probed {
		return ""
	}
	timeout := p.Timeout
	if timeout == 0 {
		timeout = 30 * time.Second
	}
	// The probe holds the apply's lock throughout (counted, not x.rt): one
	// probe at a time, whichever module's container comes first.
	rt := x.counted
	pctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	name := x.probeName()
	if msg := x.removeProbe(pctx, rt); msg != "" {
		return msg
	}
	network := x.r.networkOf(res.Module)
	spec := Spec{
		Name: name, Image: res.Decl.Image, Entrypoint: []string{"/mesh-probe"},
		Command: []string{"resolve", "--server", x.r.cfg.DNS.String(), "--timeout", "3s", p.Name(pctx)},
		Mounts:  []Mount{{Source: p.Binary, Destination: "/mesh-probe", Options: []string{"ro"}}},
		Labels:  map[string]string{LabelProbe: "1"}, DNS: x.r.cfg.DNS, Network: network, Restart: "no",
	}
	id, err := rt.Create(pctx, spec)
	if err != nil {
		return "create the resolver probe: " + err.Error()
	}
	defer rt.Remove(context.WithoutCancel(ctx), id)
	if err := rt.Start(pctx, id); err != nil {
		return "start the resolver probe: " + err.Error()
	}
	code, err := rt.Wait(pctx, id)
	if err != nil {
		return fmt.Sprintf("the resolver probe did not finish within %s", timeout)
	}
	if network == "" {
		network = "podman" // the runtime's default
	}
	if code != 0 {
		logs, _ := rt.Logs(ctx, id, 5)
		logs = state.Tail(logs, state.MaxText)
		return fmt.Sprintf("the resolver %s does not answer from Podman's network %q (the probe said: %s); the container is not started, so it cannot run with no resolver. Is the address up (ip addr show %s)? On a rootless host, has `mesh setup` run?",
			x.r.cfg.DNS, network, strings.TrimSpace(logs), x.r.cfg.DNS)
	}
	x.r.probed = true
	x.r.log.Info("the resolver answers from Podman's network", "network", network, "resolver", x.r.cfg.DNS)
	return ""
}

func (x *run) probeName() string { return "mesh-probe-" + x.r.cfg.Node }

// removeProbe removes the probe's container that a run cut short left. It
// returns why not ("" when none is left).
func (x *run) removeProbe(ctx context.Context, rt Runtime) string {
	name := x.probeName()
	c, ok, err := rt.Lookup(ctx, name)
	switch {
	case err != nil:
		return err.Error()
	case !ok:
		return ""
	case c.Labels[LabelProbe] != "1":
		return fmt.Sprintf("a container named %s exists and is not the mesh's probe; remove it (podman rm %s)", name, name)
	}
	if err := rt.Remove(ctx, c.ID); err != nil {
		return err.Error()
	}
	return ""
}
