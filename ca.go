package main

import (
	"context"
	"fmt"
	"strings"
	"time"
)

// CACmd groups the mesh's certificate authority.
type CACmd struct {
	Rotate CARotateCmd `cmd:"" help:"Make a new CA: every node trusts both while it renews its certificate under the new one, then the old CA is dropped and a certificate it signed is refused everywhere."`
	Show   CAShowCmd   `cmd:"" help:"Show the mesh's CA and any rotation under way."`
}

// CARotateCmd starts a rotation.
type CARotateCmd struct {
	Wait    bool          `help:"Return when the rotation has ended (every node renewed); exit 1 if it has not within --timeout, naming the nodes it waits for."`
	Timeout time.Duration `default:"5m" help:"How long --wait waits."`
	JSON    bool          `name:"json" help:"Print the CA as JSON when done."`
}

// Run starts it.
func (c *CARotateCmd) Run(g *Globals) error {
	ctx, cancel := timeout()
	defer cancel()
	r, err := g.client().RotateCA(ctx)
	if err != nil {
		return err
	}
	if !c.JSON {
		fmt.Fprintf(g.out, "rotating the mesh's CA (log index %d): every node renews its certificate under the new one; then the old is refused\n", r.Index)
	}
	if !c.Wait {
		return nil
	}
	deadline := time.Now().Add(c.Timeout)
	said, seen := "", r.Index
	for {
		// A blocking read: it answers at the next entry applied past seen.
		wctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		st, err := g.client().StatusAfter(wctx, seen, 5*time.Second)
		cancel()
		if err != nil {
			time.Sleep(time.Second) // the agent restarting, say: not a busy loop
		} else if st.AppliedIndex > seen {
			seen = st.AppliedIndex
		}
		if err == nil && st.CA != nil {
			if st.CA.Next == "" {
				if c.JSON {
					return printJSON(g.out, st.CA)
				}
				fmt.Fprintf(g.out, "the rotation ended: %s\n", st.CA)
				return nil
			}
			if now := strings.Join(st.CA.Waiting, ", "); now != said && !c.JSON {
				said = now
				fmt.Fprintf(g.out, "waiting for %s to renew (%d renewed)\n", now, len(st.CA.Renewed))
			}
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("the rotation has not ended after %s: it waits for %s to renew; a node that is down renews when it is back, and one that is gone for good ends it when removed (mesh node remove NODE --force)", c.Timeout, dash(said))
		}
	}
}

// CAShowCmd shows the CA.
type CAShowCmd struct {
	JSON bool `name:"json" help:"Print JSON."`
}

// Run prints it.
func (c *CAShowCmd) Run(g *Globals) error {
	ctx, cancel := timeout()
	defer cancel()
	ca, err := g.client().CA(ctx)
	if err != nil {
		return err
	}
	if c.JSON {
		return printJSON(g.out, ca)
	}
	fmt.Fprintln(g.out, ca)
	return nil
}
