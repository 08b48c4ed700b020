package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"

	"mesh/internal/composeimport"
	"mesh/internal/safefs"
	"mesh/podman"
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
	Root    string `default:"/srv" placeholder:"DIR" help:"Where the services' host paths go: DIR/PROJECT-SERVICE (default /srv); an absolute path a manifest may declare."`
	Prefix  string `placeholder:"PREFIX" help:"Name each module PREFIX-SERVICE (module names are unique in the whole mesh; two projects' db would be one module). Hosts named in environment values and commands (db, postgres://u@db:5432) are renamed too, said in a note; config files are not."`
	// CopyHostFiles: a bind-mounted text file outside the project's
	// directory (an absolute host path) is read into the manifest only
	// when asked.
	CopyHostFiles bool `name:"copy-host-files" help:"Copy bind-mounted text files from outside the compose file's directory into the manifests (every node replicates them; a link leading out of the directory is never followed). Without it they are named, not copied."`
	Force         bool `help:"Overwrite manifests already in the output directory."`
	JSON          bool `name:"json" help:"Print the result as JSON: project, output, files, copied, notes [{service, kind (carried, dropped, action), text}]."`
}

// Run imports: every manifest is checked (as mesh check would) before any
// is written, nothing is overwritten without --force, and all are written or
// none (writeAll).
func (c *ImportComposeCmd) Run(g *Globals) error {
	// A FIFO or a device named by mistake would hang the import or feed it
	// without end.
	if fi, err := os.Stat(c.File); err == nil && !fi.Mode().IsRegular() {
		return fmt.Errorf("%s is not a regular file (%s); give the compose file", c.File, fi.Mode().Type())
	}
	ctx, cancel := timeout()
	defer cancel()
	res, err := composeimport.Import(ctx, composeimport.Options{
		File: c.File, Project: c.Project, Root: c.Root, Prefix: c.Prefix,
		CopyHostFiles: c.CopyHostFiles, Inspect: localImage,
	})
	var ue composeimport.UsageError
	if errors.As(err, &ue) {
		return usageError{err}
	}
	if err != nil {
		return err
	}
	out := c.Output
	if out == "" {
		out = res.Project
	}
	// Relative to where the command runs; the writes and the directory's
	// sync need it absolute.
	if out, err = filepath.Abs(out); err != nil {
		return err
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
	var files []outFile
	for _, m := range res.Manifests {
		mode := os.FileMode(0o644)
		if m.Private {
			mode = 0o600
		}
		files = append(files, outFile{m.File, []byte(m.Text), mode})
	}
	written, err := writeAll(out, files)
	if err != nil {
		return err
	}
	if c.JSON {
		notes := res.Notes
		if notes == nil {
			notes = []composeimport.Note{}
		}
		return printJSON(g.out, map[string]any{"project": res.Project, "output": out, "files": written, "copied": nonNil(res.Copied), "notes": notes})
	}
	for _, n := range res.Lines() {
		fmt.Fprintln(g.out, n)
	}
	if len(res.Copied) > 0 {
		fmt.Fprintf(g.out, "copied into the manifests: %s\n", strings.Join(res.Copied, " "))
	}
	fmt.Fprintf(g.out, "wrote %d manifests for project %s to %s: %s\n", len(written), res.Project, out, strings.Join(written, " "))
	fmt.Fprintf(g.out, "next: mesh check %s/*.yaml; mesh module add %s/*.yaml --dry-run (a module of the same name from another project would be replaced); then mesh assign NODE MODULE\n", out, out)
	return nil
}

// localImage asks this machine's Podman, if one listens, what a local image
// declares; any failure (no Podman, no image) is no answer.
func localImage(ctx context.Context, image string) (composeimport.Image, bool) {
	rootless := os.Geteuid() != 0
	sock := podman.DefaultSocket(rootless)
	if s := os.Getenv("MESH_PODMAN_SOCKET"); s != "" {
		sock = s
	}
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	c := podman.New(podman.Config{Socket: sock})
	ports, user, ok, err := c.ImageFacts(ctx, image)
	if err != nil || !ok {
		return composeimport.Image{}, false
	}
	vols, err := c.ImageVolumes(ctx, image)
	if err != nil {
		return composeimport.Image{}, false
	}
	return composeimport.Image{Ports: ports, User: user, Volumes: vols}, true
}

func nonNil(s []string) []string {
	if s == nil {
		return []string{}
	}
	return s
}

// outFile is a file writeAll writes: its name in the directory, its bytes,
// its mode.
type outFile struct {
	name string
	data []byte
	mode os.FileMode
}

// writeAll writes every file into dir, or none: each is written to a
// temporary file there first, and only once all of them are on disk are they
// renamed into place, so a full disk or a failed write leaves dir as it was
// (an earlier import's manifests, which the operator may have edited, are not
// cut short). A rename replaces a link at a name rather than following it.
func writeAll(dir string, files []outFile) ([]string, error) {
	temps := map[string]string{}
	cleanup := func() {
		for _, tmp := range temps {
			os.Remove(tmp)
		}
	}
	for _, file := range files {
		name := file.name
		f, err := os.CreateTemp(dir, "."+name+".mesh-*")
		if err != nil {
			cleanup()
			return nil, fmt.Errorf("write %s: %w; nothing was written", filepath.Join(dir, name), err)
		}
		temps[name] = f.Name()
		_, err = f.Write(file.data)
		if err == nil {
			err = f.Chmod(file.mode)
		}
		if err == nil {
			err = f.Sync()
		}
		if cerr := f.Close(); err == nil {
			err = cerr
		}
		if err != nil {
			cleanup()
			return nil, fmt.Errorf("write %s: %w; nothing was written", filepath.Join(dir, name), err)
		}
	}
	var written []string
	for _, file := range files {
		name, p := file.name, filepath.Join(dir, file.name)
		if err := os.Rename(temps[name], p); err != nil {
			cleanup()
			return nil, fmt.Errorf("write %s: %w; written before it: %s", p, err, strings.Join(written, ", "))
		}
		delete(temps, name)
		written = append(written, p)
	}
	if err := safefs.SyncDir(dir); err != nil {
		return nil, fmt.Errorf("sync %s: %w", dir, err)
	}
	return written, nil
}
