package main

import (
	"errors"
	"fmt"
	"os"

	"golang.org/x/term"
)

// TokenCmd prints the join token.
type TokenCmd struct {
	Rotate      bool `help:"Replace the token; the old one stops working."`
	JoinLine    bool `name:"join-line" help:"Print the command a machine that has mesh runs to join."`
	InstallLine bool `name:"install-line" help:"Print one line for a machine with nothing of the mesh on it: it fetches this node's mesh binary (the mesh CA checked against the token's digest first, so no trust on first use) into /usr/local/bin and joins."`
}

// Run prints it: the token alone when captured ($(mesh token)); on a
// terminal also the lines to paste on the new machine.
func (c *TokenCmd) Run(g *Globals) error {
	if c.JoinLine && c.InstallLine {
		return usageError{errors.New("give --join-line or --install-line, not both")}
	}
	ctx, cancel := timeout()
	defer cancel()
	t, err := g.client().Token(ctx, c.Rotate)
	if err != nil {
		return err
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
	if f, ok := g.out.(*os.File); ok && term.IsTerminal(int(f.Fd())) && t.InstallLine != "" {
		fmt.Fprintf(g.out, "\non the new machine, as root (name and address default to its host name and its\naddress toward this node); where mesh is installed:\n  %s\nwhere it is not (fetches this node's binary, the mesh CA checked against the token):\n  %s\nthen start it: mesh agent (or contrib/mesh.service)\n", t.JoinLine, t.InstallLine)
	}
	return nil
}
