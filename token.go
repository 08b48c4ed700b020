package main

import (
	"errors"
	"fmt"
	"os"
	"time"

	"golang.org/x/term"

	"mesh/cluster"
	"mesh/cluster/api"
)

// TokenCmd prints the join token.
type TokenCmd struct {
	Rotate      bool          `help:"Replace the token; the old one stops working (and every token made with --ttl before)."`
	TTL         time.Duration `name:"ttl" help:"Make a token that stops joining after this long (1m to 8760h; none without): it carries a secret derived from the mesh's, never the mesh's own. A token without --ttl joins until the next --rotate."`
	JoinLine    bool          `name:"join-line" help:"Print the command a machine that has mesh runs to join."`
	InstallLine bool          `name:"install-line" help:"Print one line for a machine with nothing of the mesh on it: it fetches this node's mesh binary (the mesh CA checked against the token's digest first, so no trust on first use) into /usr/local/bin and joins."`
}

// Run prints it: the token alone when captured ($(mesh token)); on a
// terminal also the lines to paste on the new machine.
func (c *TokenCmd) Run(g *Globals) error {
	if c.JoinLine && c.InstallLine {
		return usageError{errors.New("give --join-line or --install-line, not both")}
	}
	if c.TTL != 0 && (c.TTL < time.Minute || c.TTL > api.MaxTokenTTL) {
		return usageError{fmt.Errorf("--ttl takes a duration %s", api.TokenTTLRange)}
	}
	ctx, cancel := timeout()
	defer cancel()
	t, err := g.client().Token(ctx, c.Rotate, c.TTL)
	if err != nil {
		return err
	}
	if c.TTL != 0 {
		// An agent of an older binary leaves the ttl out, and its token
		// would join for ever.
		if tok, err := cluster.ParseToken(t.Token); err != nil || tok.Until == 0 || t.Until == "" {
			return errors.New("this node's agent runs an older mesh binary, which makes no token with an end (its token would join until the next --rotate); restart the agent on the new binary, or leave --ttl out")
		}
	}
	switch {
	case c.JoinLine:
		fmt.Fprintln(g.out, t.JoinLine)
		return nil
	case c.InstallLine:
		if t.InstallLine == "" {
			return errors.New(t.InstallError)
		}
		fmt.Fprintln(g.out, t.InstallLine)
		return nil
	}
	fmt.Fprintln(g.out, t.Token)
	f, ok := g.out.(*os.File)
	if ok && term.IsTerminal(int(f.Fd())) && t.Until != "" {
		fmt.Fprintf(g.out, "(joins until %s)\n", t.Until)
	}
	if ok && term.IsTerminal(int(f.Fd())) && t.InstallLine != "" {
		fmt.Fprintf(g.out, "\non the new machine, as root (name and address default to its host name and its\naddress toward this node); where mesh is installed:\n  %s\nwhere it is not (fetches this node's binary, the mesh CA checked against the token):\n  %s\nthen start it: mesh agent (or contrib/mesh.service)\n", t.JoinLine, t.InstallLine)
	}
	return nil
}
