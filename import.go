package main

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"mesh/internal/composeimport"
	"mesh/state/manifest"
)

// ImportCmd turns files of other tools into manifests.
type ImportCmd struct {
	Compose ImportComposeCmd `cmd:"" help:"Write a manifest per service of a docker-compose file, and say what was decided and what could not be carried over."`
}

// ImportComposeCmd is `mesh import compose FILE`.
type ImportComposeCmd struct {
	File    string `arg:"" type:"existingfile" help:"The compose file (its .env, env files, extends and profiles resolve as docker compose resolves them)."`
	Output  string `placeholder:"DIR" help:"Where to write the manifests (default: ./PROJECT)."`
	Project string `placeholder:"NAME" help:"The project name (default: the file's name: key, else its directory's name); host paths go under ROOT/PROJECT-SERVICE."`
	Root    string `default:"/srv" placeholder:"DIR" help:"Where the services' host paths go: DIR/PROJECT-SERVICE (default /srv)."`
	Force   bool   `help:"Overwrite manifests already in the output directory."`
}

// Run imports: every manifest is checked (as mesh check would) before any
// is written, and nothing is overwritten without --force.
func (c *ImportComposeCmd) Run(g *Globals) error {
	ctx, cancel := timeout()
	defer cancel()
	res, err := composeimport.Import(ctx, composeimport.Options{File: c.File, Project: c.Project, Root: c.Root})
	if err != nil {
		return err
	}
	out := c.Output
	if out == "" {
		out = res.Project
	}
	parsed := map[string]*manifest.Manifest{}
	for _, m := range res.Manifests {
		pm, err := manifest.Parse(m.File, []byte(m.Text))
		if err != nil {
			return err
		}
		parsed[pm.Module] = pm
	}
	var problems []string
	for _, pm := range parsed {
		if err := manifest.CheckProvidersOffline(pm, func(n string) (*manifest.Manifest, bool) { p, ok := parsed[n]; return p, ok }); err != nil {
			problems = append(problems, err.Error())
		}
	}
	if len(problems) > 0 {
		return fmt.Errorf("the imported manifests do not check together:\n%s", strings.Join(problems, "\n"))
	}
	if !c.Force {
		for _, m := range res.Manifests {
			if _, err := os.Stat(filepath.Join(out, m.File)); err == nil {
				return usageError{fmt.Errorf("%s already exists; pass --force to overwrite, or --output another directory", filepath.Join(out, m.File))}
			}
		}
	}
	if err := os.MkdirAll(out, 0o755); err != nil {
		return err
	}
	var written []string
	for _, m := range res.Manifests {
		p := filepath.Join(out, m.File)
		if err := os.WriteFile(p, []byte(m.Text), 0o644); err != nil {
			return errors.Join(fmt.Errorf("write %s: %w", p, err), fmt.Errorf("written before it: %s", strings.Join(written, ", ")))
		}
		written = append(written, p)
	}
	for _, n := range res.Notes {
		fmt.Fprintln(g.out, n)
	}
	fmt.Fprintf(g.out, "wrote %d manifests for project %s to %s: %s\n", len(written), res.Project, out, strings.Join(written, " "))
	fmt.Fprintf(g.out, "next: mesh check %s/*.yaml; mesh module add %s/*.yaml --dry-run (a module of the same name from another project would be replaced); then mesh assign NODE MODULE\n", out, out)
	return nil
}
