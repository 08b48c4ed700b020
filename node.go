package main

import (
	"cmp"
	"errors"
	"fmt"
	"mesh/cluster/api"
	"mesh/state"
	"os"
	"strings"
	"text/tabwriter"
	"time"
)

// NodeCmd groups node commands.
type NodeCmd struct {
	List         NodeListCmd         `cmd:"" help:"List the nodes."`
	PublicDomain NodePublicDomainCmd `cmd:"" name:"public-domain" help:"Set NODE's public domains (or --add, --remove some, --clear all); a route NAME is served at NAME.DOMAIN for each."`
	Drain        NodeDrainCmd        `cmd:"" help:"Mark NODE draining: its modules keep running, new assigns to it are refused (--undo ends it)."`
	ACME         NodeACMECmd         `cmd:"" name:"acme" help:"Set the ACME directory, account e-mail and directory root NODE's route proxy gets certificates with (default: Let's Encrypt). Each call replaces all three: what it does not give is back to its default."`
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
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%v\n", n.Name, n.Address, dash(n.OverlayAddress), dash(strings.Join(n.PublicDomains, ",")), n.Voter)
	}
	return tw.Flush()
}

// NodePublicDomainCmd sets a node's public domains.
type NodePublicDomainCmd struct {
	Node    string        `arg:"" predictor:"node" help:"The node."`
	Domains []string      `arg:"" optional:"" name:"domain" help:"The public domains, e.g. zurag.be example.org (the first is the one a template's .Domain gives)."`
	Add     bool          `help:"Add DOMAIN... to the node's domains instead of replacing them."`
	Remove  bool          `help:"Remove DOMAIN... from the node's domains."`
	Clear   bool          `help:"Remove all of the node's public domains."`
	Wait    bool          `help:"Return when the node has applied its new plan and the health checks of the containers it changed pass; exit 1 if either fails."`
	Timeout time.Duration `default:"5m" help:"How long --wait waits."`
	DryRun  bool          `name:"dry-run" help:"Print, per node, what would be created, replaced (and why), run again or removed, and which names would change; write nothing."`
}

// Run sets or clears it.
func (c *NodePublicDomainCmd) Run(g *Globals) error {
	if c.Clear == (len(c.Domains) > 0) {
		return usageError{errors.New("give DOMAIN... or --clear")}
	}
	if c.Add && c.Remove {
		return usageError{errors.New("give --add or --remove, not both")}
	}
	ds := make([]string, len(c.Domains))
	for i, d := range c.Domains {
		ds[i] = strings.ToLower(strings.TrimSuffix(d, "."))
	}
	req := api.DomainRequest{Domains: ds}
	switch {
	case c.Add:
		req = api.DomainRequest{Add: ds}
	case c.Remove:
		req = api.DomainRequest{Remove: ds}
	}
	ctx, cancel := timeout()
	defer cancel()
	r, err := g.writer(c.DryRun).PublicDomain(ctx, c.Node, req)
	if err != nil {
		return err
	}
	if r.Preview != nil {
		return printPreview(g, r.Preview)
	}
	switch {
	case c.Clear:
		fmt.Fprintf(g.out, "cleared the public domains of %s (log index %d)\n", c.Node, r.Index)
	case c.Add:
		fmt.Fprintf(g.out, "%s also serves routes under %s (log index %d)\n", c.Node, strings.Join(ds, ", "), r.Index)
	case c.Remove:
		fmt.Fprintf(g.out, "%s no longer serves routes under %s (log index %d)\n", c.Node, strings.Join(ds, ", "), r.Index)
	default:
		fmt.Fprintf(g.out, "%s now serves routes under %s (log index %d)\n", c.Node, strings.Join(ds, ", "), r.Index)
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

// NodeACMECmd sets a node's ACME settings (issue 28).
type NodeACMECmd struct {
	Node      string        `arg:"" predictor:"node" help:"The node."`
	Directory string        `help:"The ACME directory URL (default: Let's Encrypt's production directory)." placeholder:"URL"`
	Staging   bool          `help:"Use Let's Encrypt's staging directory (untrusted certificates, generous rate limits)."`
	Email     string        `help:"The ACME account's contact e-mail (expiry notices)." placeholder:"ADDR"`
	CARoot    string        `name:"ca-root" type:"existingfile" help:"PEM file of the root that signs the directory's own HTTPS, for a test CA such as Pebble." placeholder:"FILE"`
	Clear     bool          `help:"Put back the defaults (Let's Encrypt, no e-mail)."`
	Wait      bool          `help:"Return when the node has applied its new plan and the health checks of the containers it changed pass; exit 1 if either fails."`
	Timeout   time.Duration `default:"5m" help:"How long --wait waits."`
	DryRun    bool          `name:"dry-run" help:"Print what would change on the node (its routes-files), and write nothing."`
}

// Run sets them.
func (c *NodeACMECmd) Run(g *Globals) error {
	if c.Staging && c.Directory != "" {
		return usageError{errors.New("give --directory or --staging, not both")}
	}
	if c.Clear && (c.Staging || c.Directory != "" || c.Email != "" || c.CARoot != "") {
		return usageError{errors.New("--clear takes no other setting")}
	}
	req := api.ACMERequest{ACME: state.ACME{Directory: c.Directory, Email: c.Email}, Clear: c.Clear}
	if c.Staging {
		req.Directory = state.LetsEncryptStaging
	}
	if c.CARoot != "" {
		b, err := os.ReadFile(c.CARoot)
		if err != nil {
			return err
		}
		if len(b) > state.MaxCARoot {
			return fmt.Errorf("%s is %d bytes; a CA root is at most %d", c.CARoot, len(b), state.MaxCARoot)
		}
		req.CARoot = string(b)
	}
	if err := req.ACME.CheckFull(); err != nil {
		return err
	}
	ctx, cancel := timeout()
	defer cancel()
	r, err := g.writer(c.DryRun).ACME(ctx, c.Node, req)
	if err != nil {
		return err
	}
	if r.Preview != nil {
		return printPreview(g, r.Preview)
	}
	if c.Clear {
		fmt.Fprintf(g.out, "%s gets certificates from Let's Encrypt again (log index %d)\n", c.Node, r.Index)
	} else {
		fmt.Fprintf(g.out, "%s gets certificates from %s (log index %d)\n", c.Node, cmp.Or(req.Directory, state.LetsEncrypt), r.Index)
	}
	if !c.Wait {
		return nil
	}
	return waitChanged(g, r.Index, c.Timeout)
}

// NodeDrainCmd marks a node draining (issue 29 item 4).
type NodeDrainCmd struct {
	Node string `arg:"" predictor:"node" help:"The node."`
	Undo bool   `help:"End the drain: the node takes new modules again."`
}

// Run marks it.
func (c *NodeDrainCmd) Run(g *Globals) error {
	ctx, cancel := timeout()
	defer cancel()
	r, err := g.client().Drain(ctx, c.Node, c.Undo)
	if err != nil {
		return err
	}
	if c.Undo {
		fmt.Fprintf(g.out, "%s takes new modules again (log index %d)\n", c.Node, r.Index)
	} else {
		fmt.Fprintf(g.out, "%s is draining: what runs there keeps running, new assigns to it are refused (log index %d); `mesh node drain %s --undo` ends it\n", c.Node, r.Index, c.Node)
	}
	return nil
}
