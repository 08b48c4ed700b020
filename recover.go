package main

import (
	"fmt"
	"mesh/agent"
	"strings"
)

// RecoverCmd makes this node the only voter.
type RecoverCmd struct{}

// Run recovers and says what to do next.
func (c *RecoverCmd) Run(g *Globals) error {
	privateUmask()
	ctx, cancel := timeout()
	defer cancel()
	r, err := agent.Recover(ctx, g.dir())
	if err != nil {
		return err
	}
	fmt.Fprintf(g.out, "node %s is now the only voter of mesh %s; its state, CA and names are kept\n", r.Node, r.MeshID)
	if len(r.Lost) > 0 {
		fmt.Fprintf(g.out, "dropped from Raft: %s\n", strings.Join(r.Lost, ", "))
	}
	fmt.Fprintf(g.out, "next:\n  1. start it: mesh agent --data-dir %s\n  2. mesh token --rotate   (the old token's holders are not to rejoin as they were)\n", g.dir())
	if len(r.Others) > 0 {
		fmt.Fprintf(g.out, "  3. for each lost node: mesh node remove NODE --force   (%s)\n  4. on a machine that comes back: move its data dir aside, then MESH_TOKEN=NEW-TOKEN mesh join %s ...\n", strings.Join(r.Others, ", "), r.Node)
	}
	return nil
}
