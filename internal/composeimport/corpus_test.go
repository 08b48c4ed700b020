package composeimport

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/compose-spec/compose-go/v2/cli"

	"mesh/state/manifest"
)

// Issue 31: every compose file under testdata/compose (shaped like those
// popular self-hosted software publishes: apps with databases, caches,
// workers, proxies) imports; each manifest passes mesh check, alone and
// with the others; every depends_on edge is reachable (the dependency
// publishes a port, or a note says which to add and where); and the count
// of notes by kind is the one in its notes.want (go test -update rewrites
// it, with the notes themselves below the counts for review).
func TestImportCorpus(t *testing.T) {
	dirs, err := filepath.Glob("testdata/compose/*/compose.yaml")
	if err != nil || len(dirs) < 10 {
		t.Fatalf("the corpus has %d files (%v)", len(dirs), err)
	}
	for _, file := range dirs {
		dir := filepath.Dir(file)
		t.Run(filepath.Base(dir), func(t *testing.T) {
			env := []string{"PATH=/usr/bin"}
			res, err := Import(context.Background(), Options{File: file, Env: env})
			if err != nil {
				t.Fatal(err)
			}
			parsed := map[string]*manifest.Manifest{}
			for _, m := range res.Manifests {
				pm, err := manifest.Parse(m.File, []byte(m.Text))
				if err != nil {
					t.Fatalf("%s does not pass mesh check: %v\n%s", m.File, err, m.Text)
				}
				parsed[pm.Module] = pm
				// Every directory a container mounts declares its owner
				// and mode (mesh check refuses it otherwise).
				dirs := map[string]manifest.Resource{}
				for _, r := range pm.Resources {
					if r.Directory != "" {
						dirs[r.Directory] = r
					}
				}
				for _, r := range pm.Resources {
					for _, mt := range r.Typed.Mounts {
						if d, ok := dirs[mt.Source]; ok && (d.Owner == "" || d.Mode == "") {
							t.Errorf("%s: %s mounts %s, which declares no owner or mode", m.File, r.Name(), mt.Source)
						}
					}
				}
			}
			for _, pm := range parsed {
				if err := manifest.CheckProvidersOffline(pm, func(n string) (*manifest.Manifest, bool) { p, ok := parsed[n]; return p, ok }); err != nil {
					t.Errorf("%s: %v", pm.Module, err)
				}
			}
			// Every edge: the provider publishes a port, or the import
			// says what to add.
			fns := []cli.ProjectOptionsFn{cli.WithWorkingDirectory(dir), cli.WithEnv(env)}
			if _, err := os.Stat(filepath.Join(dir, ".env")); err == nil {
				fns = append(fns, cli.WithEnvFiles(filepath.Join(dir, ".env")), cli.WithDotEnv)
			}
			po, err := cli.NewProjectOptions([]string{file}, append(fns, cli.WithDefaultProfiles())...)
			if err != nil {
				t.Fatal(err)
			}
			proj, err := po.LoadProject(context.Background())
			if err != nil {
				t.Fatal(err)
			}
			edges := 0
			for _, svc := range sortedKeys(proj.Services) {
				for dep, c := range proj.Services[svc].DependsOn {
					if c.Condition == "service_completed_successfully" {
						continue // it waits for dep to end: no port to reach
					}
					edges++
					pm := parsed[moduleName(dep)]
					if pm == nil {
						t.Errorf("%s depends on %s, which was not imported", svc, dep)
						continue
					}
					if !publishes(pm) && !slices.ContainsFunc(res.Notes, func(n Note) bool {
						return n.Service == dep && n.Kind == NoteAction && strings.HasPrefix(n.Text, svc+" depends on it")
					}) {
						t.Errorf("%s depends on %s, which publishes no port, and no note says what to add", svc, dep)
					}
				}
			}
			count := map[string]int{}
			for _, n := range res.Notes {
				if n.Kind != NoteCarried && n.Kind != NoteDropped && n.Kind != NoteAction {
					t.Errorf("note of no kind: %+v", n)
				}
				count[n.Kind]++
			}
			got := fmt.Sprintf("carried %d\ndropped %d\naction %d\nedges %d\n--\n%s\n", count[NoteCarried], count[NoteDropped], count[NoteAction], edges, strings.Join(res.Lines(), "\n"))
			want := filepath.Join(dir, "notes.want")
			if *update {
				os.WriteFile(want, []byte(got), 0o644)
				return
			}
			b, _ := os.ReadFile(want)
			if head(string(b)) != head(got) {
				t.Errorf("the notes by kind differ from %s (go test -update rewrites it):\n%s", want, got)
			}
		})
	}
}

// head is a notes.want's counts, above its "--".
func head(s string) string { h, _, _ := strings.Cut(s, "--"); return h }

func publishes(m *manifest.Manifest) bool {
	for _, r := range m.Resources {
		if len(r.Ports) > 0 {
			return true
		}
	}
	return false
}
