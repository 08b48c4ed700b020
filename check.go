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
	for _, m := range order {
		data, warnings, problems := dataOf(m)
		what := "none declared (data: true on a directory marks what a person backs up)"
		if len(data) > 0 {
			what = strings.Join(data, ", ")
		}
		fmt.Fprintf(g.out, "%s: data: %s\n", m.File, what)
		for _, w := range warnings {
			fmt.Fprintf(g.out, "%s: warning: %s\n", m.File, w)
		}
		for _, p := range problems {
			errs = append(errs, m.File+": "+p)
		}
	}
	if len(errs) > 0 {
		return errors.New(strings.Join(errs, "\n"))
	}
	fmt.Fprintf(g.out, "%d manifest(s) ok\n", len(order))
	return nil
}

// dataOf lists a module's data directories (issue 30), warns of a directory
// a container or step mounts writable that is not data (the mesh writes
// files, never a directory's contents: what the container writes there is
// data nobody declared, and no backup takes it), and names each mounted
// directory that does not declare its owner and mode (the runtime's root
// and 0755 would be a mode nobody chose).
func dataOf(m *manifest.Manifest) (data, warnings, problems []string) {
	data = m.DataDirs()
	dirs := map[string]*manifest.Resource{}
	for i := range m.Resources {
		if r := &m.Resources[i]; r.Directory != "" {
			dirs[r.Directory] = r
		}
	}
	said := map[string]bool{}
	for _, r := range m.Resources {
		for _, mt := range r.Typed.Mounts {
			d, ok := dirs[mt.Source]
			if !ok || said[mt.Source] {
				continue
			}
			said[mt.Source] = true
			if d.Owner == "" || d.Mode == "" {
				problems = append(problems, fmt.Sprintf("directory %s is mounted by %s but does not declare its owner and mode; write owner: \"UID:GID\" and mode: \"0750\" (as the container sees them), or the runtime's root and 0755 become a mode nobody chose", mt.Source, r.Name()))
			}
			if !mt.ReadOnly && !d.Data {
				warnings = append(warnings, fmt.Sprintf("%s mounts %s writable, and it is not data: what it writes there is in no backup and not kept as data; add data: true to the directory if it holds what the module keeps, or mount it :ro", r.Name(), mt.Source))
			}
		}
	}
	return data, warnings, problems
}
