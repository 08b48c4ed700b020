package main

import (
	"errors"
	"fmt"
	"time"
)

// WebCmd gives access to the node's web page (mesh agent --web-listen).
type WebCmd struct {
	Token  WebTokenCmd  `cmd:"" help:"Print a one-time link that logs a browser in to this node's web page (it works once, for --ttl)."`
	Logout WebLogoutCmd `cmd:"" help:"End every session of this node's web page, and every link not used yet (--all)."`
}

// WebTokenCmd prints a login link.
type WebTokenCmd struct {
	TTL  time.Duration `name:"ttl" default:"10m" help:"How long the link works (at most 24h); the session it opens lasts 12h idle, 7 days at most."`
	JSON bool          `name:"json" help:"Print JSON: url, expires, and over TLS fingerprint."`
}

// Run asks the agent, on its socket, for a link.
func (c *WebTokenCmd) Run(g *Globals) error {
	if c.TTL < time.Second || c.TTL > 24*time.Hour {
		return usageError{errors.New("--ttl takes a duration between 1s and 24h")}
	}
	ctx, cancel := timeout()
	defer cancel()
	r, err := g.client().WebToken(ctx, c.TTL)
	if err != nil {
		return err
	}
	if c.JSON {
		return printJSON(g.out, r)
	}
	fmt.Fprintf(g.out, "%s\n(works once, until %s)\n", r.URL, r.Expires.Local().Format("15:04:05"))
	if r.Fingerprint != "" {
		fmt.Fprintf(g.out, "the page's certificate is its own, self-signed: check that your browser shows SHA-256 %s\n", r.Fingerprint)
	}
	return nil
}

// WebLogoutCmd ends the page's sessions.
type WebLogoutCmd struct {
	All  bool `name:"all" required:"" help:"End every session (the page keeps none per person)."`
	JSON bool `name:"json" help:"Print JSON: sessions."`
}

// Run ends them.
func (c *WebLogoutCmd) Run(g *Globals) error {
	ctx, cancel := timeout()
	defer cancel()
	r, err := g.client().WebLogout(ctx)
	if err != nil {
		return err
	}
	if c.JSON {
		return printJSON(g.out, r)
	}
	fmt.Fprintf(g.out, "ended %d web sessions; links not used yet no longer work\n", r.Sessions)
	return nil
}
