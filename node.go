package main

import (
	"errors"
	"fmt"
	"strings"
	"text/tabwriter"
	"time"
)

// NodeCmd groups node commands.
type NodeCmd struct {
	List         NodeListCmd         `cmd:"" help:"List the nodes."`
	PublicDomain NodePublicDomainCmd `cmd:"" name:"public-domain" help:"Set (or with --clear, remove) NODE's public domain; routes become NAME.DOMAIN."`
	Remove       NodeRemoveCmd       `cmd:"" help:"Remove NODE from the mesh."`
}

// NodeListCmd lists nodes.
type NodeListCmd struct {
	JSON bool `name:"json" help:"Print JSON."`
}

// Run prints the nodes.
func (c *NodeListCmd) Run(g *Globals) error {
	ctx, cancel := timeout()
	defer cancel()
	nodes, err := g.client().Nodes(ctx)
	if err != nil {
		return err
	}
	if c.JSON {
		return printJSON(g.out, nodes)
	}
	tw := tabwriter.NewWriter(g.out, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "NODE\tADDRESS\tOVERLAY\tPUBLIC DOMAIN\tVOTER")
	for _, n := range nodes {
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%v\n", n.Name, n.Address, dash(n.OverlayAddress), dash(n.PublicDomain), n.Voter)
	}
	return tw.Flush()
}

// NodePublicDomainCmd sets a public domain.
type NodePublicDomainCmd struct {
	Node    string        `arg:"" predictor:"node" help:"The node."`
	Domain  string        `arg:"" optional:"" help:"The public domain, e.g. zurag.be."`
	Clear   bool          `help:"Remove the node's public domain."`
	Wait    bool          `help:"Return when the node has applied its new plan and the health checks of the containers it changed pass; exit 1 if either fails."`
	Timeout time.Duration `default:"5m" help:"How long --wait waits."`
	DryRun  bool          `name:"dry-run" help:"Print, per node, what would be created, replaced (and why), run again or removed, and which names would change; write nothing."`
}

// Run sets or clears it.
func (c *NodePublicDomainCmd) Run(g *Globals) error {
	if c.Clear == (c.Domain != "") {
		return usageError{errors.New("give either DOMAIN or --clear")}
	}
	ctx, cancel := timeout()
	defer cancel()
	r, err := g.writer(c.DryRun).PublicDomain(ctx, c.Node, strings.ToLower(c.Domain))
	if err != nil {
		return err
	}
	if r.Preview != nil {
		return printPreview(g, r.Preview)
	}
	if c.Clear {
		fmt.Fprintf(g.out, "cleared the public domain of %s (log index %d)\n", c.Node, r.Index)
	} else {
		fmt.Fprintf(g.out, "%s now serves routes under %s (log index %d)\n", c.Node, strings.ToLower(c.Domain), r.Index)
	}
	if !c.Wait {
		return nil
	}
	return waitChanged(g, r.Index, c.Timeout)
}

// NodeRemoveCmd removes a node.
type NodeRemoveCmd struct {
	Node  string `arg:"" predictor:"node" help:"The node."`
	Force bool   `help:"Remove it even though modules are still assigned to it (they are unassigned)."`
}

// Run removes it.
func (c *NodeRemoveCmd) Run(g *Globals) error {
	ctx, cancel := timeout()
	defer cancel()
	r, err := g.client().RemoveNode(ctx, c.Node, c.Force)
	if err != nil {
		return err
	}
	fmt.Fprintf(g.out, "removed node %s (log index %d)\n", c.Node, r.Index)
	if len(r.SecretsLost) > 0 {
		fmt.Fprintf(g.out, "warning: %s were sealed to %s alone, and no node can open them now: set each again (mesh secret set MODULE NAME)\n", strings.Join(r.SecretsLost, ", "), c.Node)
	}
	// What removal does not undo (README, More nodes).
	switch {
	case r.Voter && r.JoinSecretRotated:
		fmt.Fprintf(g.out, "%s was a voter: it held the join secret, which was rotated (mesh token on a voter prints the new token), and the CA key, with which it could still sign a certificate for a new name: rotate the CA with mesh ca rotate\n", c.Node)
	case r.Voter:
		fmt.Fprintf(g.out, "%s was a voter: rotating the join secret it held failed (%s): run mesh token --rotate; and rotate the CA key it held: mesh ca rotate\n", c.Node, r.JoinSecretError)
	default:
		fmt.Fprintf(g.out, "its certificate is refused from now on; the machine may still hold the join token: mesh token --rotate\n")
	}
	return nil
}
