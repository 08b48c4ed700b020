package main

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"time"

	"github.com/posener/complete"
)

// CompletionCmd prints a shell's completion script. The scripts call mesh
// itself with COMP_LINE set (github.com/posener/complete's protocol, which
// kongplete answers from the grammar), so they never go stale.
type CompletionCmd struct {
	Shell string `arg:"" enum:"bash,zsh,fish" help:"bash, zsh or fish."`
}

// Run prints the script for c.Shell.
func (c *CompletionCmd) Run(g *Globals) error {
	self, err := os.Executable()
	if err != nil {
		self = "mesh"
	} else if abs, err := filepath.EvalSymlinks(self); err == nil {
		self = abs
	}
	q := strconv.Quote(self)
	switch c.Shell {
	case "bash":
		fmt.Fprintf(g.out, "# mesh completion for bash: eval \"$(mesh completion bash)\" in ~/.bashrc\ncomplete -C %s mesh\n", q)
	case "zsh":
		fmt.Fprintf(g.out, "# mesh completion for zsh: eval \"$(mesh completion zsh)\" in ~/.zshrc\nautoload -U +X bashcompinit && bashcompinit\ncomplete -C %s mesh\n", q)
	case "fish":
		fmt.Fprintf(g.out, `# mesh completion for fish: mesh completion fish > ~/.config/fish/completions/mesh.fish
function __complete_mesh
    set -lx COMP_LINE (commandline -cp)
    test -z (commandline -ct)
    and set COMP_LINE "$COMP_LINE "
    %s
end
complete -f -c mesh -a "(__complete_mesh)"
`, q)
	}
	return nil
}

// completionPredictors complete node and module names from the local agent,
// when one answers within a moment (else nothing is offered).
func completionPredictors(g *Globals) map[string]complete.Predictor {
	if g.DataDir == "" { // flags are not parsed when a shell asks
		g.DataDir = os.Getenv("MESH_DATA_DIR")
	}
	ask := func(list func(ctx context.Context) []string) complete.Predictor {
		return complete.PredictFunc(func(complete.Args) []string {
			ctx, cancel := context.WithTimeout(context.Background(), 500*time.Millisecond)
			defer cancel()
			return list(ctx)
		})
	}
	return map[string]complete.Predictor{
		"node": ask(func(ctx context.Context) (names []string) {
			nodes, _ := g.client().Nodes(ctx)
			for _, n := range nodes {
				names = append(names, n.Name)
			}
			return names
		}),
		"module": ask(func(ctx context.Context) (names []string) {
			mods, _ := g.client().Modules(ctx)
			for _, m := range mods {
				names = append(names, m.Name)
			}
			return names
		}),
	}
}
