package main

import (
	"errors"
	"fmt"
	"sort"
	"strings"

	"mesh/state/manifest"
)

// CheckCmd checks manifests offline.
type CheckCmd struct {
	Files []string `arg:"" type:"existingfile" name:"FILE" help:"Manifest files."`
}

// Run checks each file and the bindings between them.
func (c *CheckCmd) Run(g *Globals) error {
	var errs []string
	parsed := map[string]*manifest.Manifest{}
	var order []*manifest.Manifest
	for _, f := range c.Files {
		m, _, err := parseFile(f, g.dir())
		if err != nil {
			errs = append(errs, err.Error())
			continue
		}
		parsed[m.Module] = m
		order = append(order, m)
	}
	// Providers are checked against the files given together, so a set of
	// modules can be checked before any of it is added.
	for _, m := range order {
		if err := manifest.CheckProvidersOffline(m, func(n string) (*manifest.Manifest, bool) { p, ok := parsed[n]; return p, ok }); err != nil {
			fmt.Fprintf(g.out, "note: %v\n", strings.ReplaceAll(err.Error(), "\n", "\nnote: "))
		}
	}
	// What each file lets the world reach: its public ports (everything
	// else is reachable only inside the mesh).
	for _, m := range order {
		var public []string
		for _, r := range m.Resources {
			for _, p := range r.PublicPorts {
				public = append(public, r.Name()+" "+p)
			}
		}
		what := "none (its ports answer inside the mesh only)"
		if len(public) > 0 {
			what = strings.Join(public, ", ")
		}
		fmt.Fprintf(g.out, "%s: public ports: %s\n", m.File, what)
		for _, r := range m.Resources {
			keys := make([]string, 0, len(r.Env))
			for k := range r.Env {
				keys = append(keys, k)
			}
			sort.Strings(keys)
			for _, k := range keys {
				if manifest.LooksSecret(k, r.Env[k]) {
					fmt.Fprintf(g.out, "%s: warning: %s env %s looks like a secret, and its value is in the manifest, which every node replicates and mesh module show prints; move it to env-secrets: {%s: NAME} and set it with mesh secret set %s NAME\n", m.File, r.Name(), k, k, m.Module)
				}
			}
		}
	}
	if len(errs) > 0 {
		return errors.New(strings.Join(errs, "\n"))
	}
	fmt.Fprintf(g.out, "%d manifest(s) ok\n", len(order))
	return nil
}
