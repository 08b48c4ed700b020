package main

import (
	"errors"
	"fmt"
	"mesh/agent"
)

// InitCmd creates a mesh.
type InitCmd struct {
	Name        string `required:"" help:"This node's name (a DNS label)."`
	Address     string `required:"" placeholder:"IP" help:"The IP other nodes reach this one at."`
	Domain      string `default:"internal" help:"The mesh's DNS domain: NODE.DOMAIN and MODULE.DOMAIN."`
	Port        int    `default:"7430" help:"TCP port for node-to-node (raft) traffic."`
	LogStore    string `name:"log-store" default:"wal" enum:"wal,boltdb" help:"Raft log store: wal or boltdb (see cluster/DESIGN.md)."`
	Voters      int    `default:"3" help:"How many nodes vote in raft: the first ones to join; the rest are non-voting replicas."`
	Overlay     string `default:"100.90.0.0/16" placeholder:"CIDR|off" help:"The mesh's private network: nodes talk over WireGuard on this prefix, names answer its addresses and internal ports are published on it only. Refused when it overlaps a route or address of this host. off: for nodes that already share a private network (Tailscale, a LAN); then ports are published on each node's --address."`
	OverlayPort int    `name:"overlay-port" default:"51820" help:"This node's WireGuard UDP port (the others must reach it at --address)."`
}

// Run creates the data dir and exits.
func (c *InitCmd) Run(g *Globals) error {
	privateUmask()
	ctx, cancel := signalContext()
	defer cancel()
	if c.Voters < 1 {
		return usageError{errors.New("--voters must be at least 1")}
	}
	err := agent.Init(ctx, agent.InitConfig{DataDir: g.dir(), Name: c.Name, Address: c.Address, Port: c.Port, Domain: c.Domain, LogStore: c.LogStore, Voters: c.Voters, Overlay: c.Overlay, OverlayPort: c.OverlayPort})
	if err != nil {
		return err
	}
	fmt.Fprintf(g.out, "initialised mesh with node %s (%s) in %s\n", c.Name, c.Address, g.dir())
	if c.Overlay != "off" {
		fmt.Fprintf(g.out, "its overlay is %s; the other nodes must reach UDP port %d at %s\n", c.Overlay, c.OverlayPort, c.Address)
	}
	fmt.Fprintf(g.out, "start it with: mesh agent --data-dir %s\n", g.dir())
	return nil
}
