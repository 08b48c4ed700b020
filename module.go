package main

import (
	"context"
	"fmt"
	"mesh/cluster/api"
	"mesh/internal/composeimport"
	"mesh/internal/safefs"
	"mesh/state"
	"mesh/state/manifest"
	"path/filepath"
	"strings"
	"text/tabwriter"
	"time"
)

// ModuleCmd groups catalogue commands.
type ModuleCmd struct {
	Add     ModuleAddCmd     `cmd:"" help:"Add or replace modules from manifest files (all or none)."`
	List    ModuleListCmd    `cmd:"" help:"List the catalogue."`
	Show    ModuleShowCmd    `cmd:"" help:"Print a module's manifest."`
	Remove  ModuleRemoveCmd  `cmd:"" help:"Remove a module that is assigned nowhere."`
	Pull    ModulePullCmd    `cmd:"" help:"Pull the images of MODULE's containers on every node running it (node by node when it rolls out), and replace only the containers whose image changed."`
	History ModuleHistoryCmd `cmd:"" help:"List MODULE's versions, the newest first, with the command that gave each."`
	Revert  ModuleRevertCmd  `cmd:"" help:"Give MODULE back an earlier version, rolled out as any change; during a rollout, stop it and put every node back."`
}

// ModuleAddCmd adds manifests.
type ModuleAddCmd struct {
	Files   []string      `arg:"" type:"existingfile" help:"Manifest files." name:"FILE"`
	Wait    bool          `help:"Return when every node whose plan changed has applied it and the health checks of the containers it changed pass, and a rollout it started has ended; exit 1 if any fails or the rollout stopped."`
	Timeout time.Duration `default:"5m" help:"How long --wait waits."`
	DryRun  bool          `name:"dry-run" help:"Print, per node, what would be created, replaced (and why), run again or removed, and which names would change; write nothing."`
	Replace bool          `help:"Let a manifest imported from a compose project replace a module of the same name from another project or written by hand (refused otherwise: module names are the mesh's, and two projects' db would be one module)."`
}

// Run checks every file first, then adds them in one command.
func (c *ModuleAddCmd) Run(g *Globals) error {
	req, err := readManifests(c.Files, g.dir())
	if err != nil {
		return err
	}
	ctx, cancel := timeout()
	defer cancel()
	if !c.Replace {
		if err := importCollisions(ctx, g.client(), req); err != nil {
			return err
		}
	}
	r, err := g.writer(c.DryRun).AddModules(ctx, req)
	if err != nil {
		return err
	}
	if r.Preview != nil {
		return printPreview(g, r.Preview)
	}
	fmt.Fprintf(g.out, "added %s (log index %d)\n", strings.Join(r.Modules, ", "), r.Index)
	if !c.Wait {
		return nil
	}
	return waitAndRollouts(g, r.Modules, r.Index, c.Timeout)
}

// importedFrom is the compose project and service a manifest was made from
// (the first line mesh import compose writes), "" for one written by hand.
func importedFrom(text string) (project, service string) {
	line, _, _ := strings.Cut(text, "\n")
	rest, ok := strings.CutPrefix(line, composeimport.Header)
	if !ok {
		return "", ""
	}
	service, project, ok = strings.Cut(rest, " of project ")
	if !ok {
		return "", ""
	}
	return project, service
}

// importCollisions refuses a manifest imported from a compose project that
// would replace a module of the same name from another project, or one
// written by hand: module names are the whole mesh's, so two projects' db
// would silently become one module (the second's).
func importCollisions(ctx context.Context, c *api.Client, req api.AddRequest) error {
	var imported []state.ModuleText
	for _, m := range req.Modules {
		if p, _ := importedFrom(m.Text); p != "" {
			imported = append(imported, m)
		}
	}
	if len(imported) == 0 {
		return nil
	}
	mods, err := c.Modules(ctx)
	if err != nil {
		return err
	}
	have := map[string]bool{}
	for _, m := range mods {
		have[m.Name] = true
	}
	var errs []string
	for _, m := range imported {
		pm, err := manifest.Parse(m.File, []byte(m.Text))
		if err != nil || !have[pm.Module] {
			continue // parsed before; not in the catalogue yet
		}
		info, err := c.Module(ctx, pm.Module)
		if err != nil {
			return err
		}
		proj, svc := importedFrom(m.Text)
		oproj, osvc := importedFrom(info.Manifest)
		if oproj == proj {
			continue // the same project's, imported again
		}
		was := "a module written by hand"
		if oproj != "" {
			was = fmt.Sprintf("project %s's service %s", oproj, osvc)
		}
		errs = append(errs, fmt.Sprintf("%s (project %s's service %s) would replace the module %s, which is %s; import this project with --prefix %s (module %s-%s), or pass --replace", m.File, proj, svc, pm.Module, was, proj, proj, svc))
	}
	if len(errs) > 0 {
		return usageError{fmt.Errorf("nothing was added:\n%s", strings.Join(errs, "\n"))}
	}
	return nil
}

func readManifests(files []string, dataDir string) (api.AddRequest, error) {
	var req api.AddRequest
	var errs []string
	for _, f := range files {
		_, b, err := parseFile(f, dataDir)
		if err != nil {
			errs = append(errs, err.Error())
			continue
		}
		req.Modules = append(req.Modules, state.ModuleText{File: filepath.Base(f), Text: string(b)})
	}
	if len(errs) > 0 {
		return req, fmt.Errorf("nothing was added:\n%s", strings.Join(errs, "\n"))
	}
	return req, nil
}

// parseFile reads at most a manifest's size of f (a device or a huge file is
// refused, not read whole), parses it, and refuses paths in the data dir.
func parseFile(f, dataDir string) (*manifest.Manifest, []byte, error) {
	b, err := safefs.ReadRegular(f, manifest.MaxSize)
	if err != nil {
		return nil, nil, fmt.Errorf("%w; give the module's YAML file", err)
	}
	m, err := manifest.Parse(f, b)
	if err != nil {
		return nil, nil, err
	}
	if abs, err := filepath.Abs(dataDir); err == nil {
		if err := manifest.CheckDataDir(m, abs); err != nil {
			return nil, nil, err
		}
	}
	return m, b, nil
}

// ModuleListCmd lists the catalogue.
type ModuleListCmd struct {
	JSON bool `name:"json" help:"Print JSON."`
}

// Run prints it.
func (c *ModuleListCmd) Run(g *Globals) error {
	ctx, cancel := timeout()
	defer cancel()
	mods, err := g.client().Modules(ctx)
	if err != nil {
		return err
	}
	if c.JSON {
		return printJSON(g.out, mods)
	}
	tw := tabwriter.NewWriter(g.out, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "MODULE\tDIGEST\tNODES\tFILE")
	for _, m := range mods {
		fmt.Fprintf(tw, "%s\t%.12s\t%s\t%s\n", m.Name, m.Digest, dash(strings.Join(m.Nodes, ",")), m.File)
	}
	return tw.Flush()
}

// ModuleShowCmd prints a manifest.
type ModuleShowCmd struct {
	Name string `arg:"" predictor:"module" help:"The module."`
}

// Run prints it.
func (c *ModuleShowCmd) Run(g *Globals) error {
	ctx, cancel := timeout()
	defer cancel()
	m, err := g.client().Module(ctx, c.Name)
	if err != nil {
		return err
	}
	fmt.Fprintf(g.out, "# module %s, digest %s, from %s, assigned to: %s\n%s", m.Name, m.Digest, m.File, dash(strings.Join(m.Nodes, ", ")), m.Manifest)
	return nil
}

// ModulePullCmd pulls a module's images everywhere it runs.
type ModulePullCmd struct {
	Name    string        `arg:"" predictor:"module" help:"The module."`
	Wait    bool          `help:"Return when every node running it has pulled and applied, the health checks of the containers it replaced pass, and a rollout it started has ended; exit 1 if any fails or the rollout stopped."`
	Timeout time.Duration `default:"10m" help:"How long --wait waits (pulls can be slow)."`
	DryRun  bool          `name:"dry-run" help:"Print which containers would pull, on which nodes; write nothing."`
}

// Run asks for the pull, through the log: each node running the module
// pulls once, whatever its state when the command reaches it.
func (c *ModulePullCmd) Run(g *Globals) error {
	ctx, cancel := timeout()
	defer cancel()
	r, err := g.writer(c.DryRun).PullModule(ctx, c.Name)
	if err != nil {
		return err
	}
	if r.Preview != nil {
		return printPreview(g, r.Preview)
	}
	fmt.Fprintf(g.out, "every node running %s pulls its images and replaces the containers whose image changed (log index %d; node by node when it rolls out)\n", c.Name, r.Index)
	if !c.Wait {
		return nil
	}
	if err := waitAndRollouts(g, []string{c.Name}, r.Index, c.Timeout); err != nil {
		return err
	}
	st, err := g.status()
	if err != nil {
		return err
	}
	for _, n := range st.Nodes {
		if n.Report == nil {
			continue
		}
		for _, rr := range n.Report.Resources {
			if rr.Module == c.Name && rr.Kind == "container" {
				what := "image unchanged, kept"
				if rr.Outcome == state.Replaced {
					what = "replaced: " + rr.Reason
				}
				fmt.Fprintf(g.out, "%s: %s %s\n", n.Name, rr.Name, what)
			}
		}
	}
	return nil
}

// ModuleRemoveCmd removes a module.
type ModuleRemoveCmd struct {
	Name   string `arg:"" predictor:"module" help:"The module."`
	DryRun bool   `name:"dry-run" help:"Print, per node, what would be created, replaced (and why), run again or removed, and which names would change; write nothing."`
}

// Run removes it.
func (c *ModuleRemoveCmd) Run(g *Globals) error {
	ctx, cancel := timeout()
	defer cancel()
	r, err := g.writer(c.DryRun).RemoveModule(ctx, c.Name)
	if err != nil {
		return err
	}
	if r.Preview != nil {
		return printPreview(g, r.Preview)
	}
	fmt.Fprintf(g.out, "removed module %s (log index %d)\n", c.Name, r.Index)
	return nil
}
