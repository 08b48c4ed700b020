// Command mesh runs a small self-hosted fleet: every machine runs this binary.
//
// The root is the operator's CLI and nothing else: main.go holds the kong
// grammar and main(), and each noun has its file, whose command's Run talks
// to the node only through the typed cluster/api client and prints. The node
// itself is package agent (`mesh agent` parses its flags into agent.Config);
// DESIGN.md says where everything else lives.
package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/signal"
	"path/filepath"
	"syscall"
	"time"

	"github.com/alecthomas/kong"
	"github.com/willabides/kongplete"

	"mesh/agent"
	"mesh/cluster/api"
	"mesh/internal/envexec"
	"mesh/state/manifest"
)

// version is set at build time with -ldflags "-X main.version=...".
var version = "dev"

// Exit codes (DESIGN.md, "The command line").
const (
	exitFailed = 1
	exitUsage  = 2
)

// Globals are flags every command takes.
type Globals struct {
	DataDir string `name:"data-dir" env:"MESH_DATA_DIR" placeholder:"DIR" help:"Node data directory (default /var/lib/mesh for root, $XDG_DATA_HOME/mesh otherwise)."`

	out io.Writer
	api *api.Client
}

func (g *Globals) dir() string {
	if g.DataDir != "" {
		return g.DataDir
	}
	return defaultDataDir()
}

func defaultDataDir() string {
	if os.Geteuid() == 0 {
		return "/var/lib/mesh"
	}
	if x := os.Getenv("XDG_DATA_HOME"); x != "" {
		return filepath.Join(x, "mesh")
	}
	home, _ := os.UserHomeDir()
	return filepath.Join(home, ".local", "share", "mesh")
}

// client is the command's one client of the local agent: it remembers the
// index of the command's last write, and every read after it waits until
// the agent's replica holds that write (read your writes).
func (g *Globals) client() *api.Client {
	if g.api == nil {
		g.api = api.NewClient(g.dir())
	}
	return g.api
}

// writer is the client for a write: one that only previews it on --dry-run.
func (g *Globals) writer(dryRun bool) *api.Client {
	if dryRun {
		return g.client().DryRun()
	}
	return g.client()
}

// status reads the local agent's status, within the usual timeout.
func (g *Globals) status() (api.Status, error) {
	ctx, cancel := timeout()
	defer cancel()
	return g.client().Status(ctx)
}

// CLI is the whole grammar.
type CLI struct {
	Globals

	Init       InitCmd       `cmd:"" help:"Create a new mesh with this machine as its first node, then exit."`
	Join       JoinCmd       `cmd:"" help:"Join this machine to a mesh through any of its nodes, then exit."`
	Agent      AgentCmd      `cmd:"" help:"Run this node until stopped: raft, the resolver, the reconciler and the local API."`
	Token      TokenCmd      `cmd:"" help:"Print the token that lets a machine join (MESH_TOKEN=TOKEN mesh join ADDRESS ...); on a voter, which alone holds the join secret."`
	Node       NodeCmd       `cmd:"" help:"List, configure and remove nodes."`
	Module     ModuleCmd     `cmd:"" help:"Manage the catalogue of modules."`
	CA         CACmd         `cmd:"" name:"ca" help:"Rotate the mesh's certificate authority, or show it."`
	Secret     SecretCmd     `cmd:"" help:"Set, list and remove the secrets operators bring (passwords, API keys), sealed to the nodes each module runs on."`
	Assign     AssignCmd     `cmd:"" help:"Run each MODULE on NODE (several modules: one command, all or none)."`
	Unassign   UnassignCmd   `cmd:"" help:"Stop running each MODULE on NODE (several modules: one command, all or none)."`
	Plan       PlanCmd       `cmd:"" help:"Show what a node must hold, its history and what changed."`
	Status     StatusCmd     `cmd:"" help:"Show the mesh: nodes, plan versions, what each applied, errors."`
	Roster     RosterCmd     `cmd:"" help:"Show every name the mesh answers and its addresses."`
	History    HistoryCmd    `cmd:"" help:"Set how much of the plans', manifests' and roster's history the mesh keeps."`
	Resolve    ResolveCmd    `cmd:"" help:"Ask this node's resolver for NAME (A and AAAA)."`
	Check      CheckCmd      `cmd:"" help:"Check manifests offline; exit 1 on any error."`
	Import     ImportCmd     `cmd:"" help:"Write manifests from the files of other tools (docker-compose)."`
	Provision  ProvisionCmd  `cmd:"" help:"Run a provisioner: make a provider accept the credentials delivered to it."`
	Setup      SetupCmd      `cmd:"" help:"Once, as root: prepare this host for a rootless agent (resolver address, port 53, /dev/net/tun)."`
	Schema     SchemaCmd     `cmd:"" help:"Print the JSON Schema of a manifest."`
	Snapshot   SnapshotCmd   `cmd:"" help:"Save the replicated state to a file, or restore it through Raft."`
	Recover    RecoverCmd    `cmd:"" help:"With the agent stopped, make this node the only voter (when the majority of voters is gone for good)."`
	Version    VersionCmd    `cmd:"" help:"Print the version."`
	Completion CompletionCmd `cmd:"" help:"Print a shell completion script (bash, zsh, fish)."`
	Backup     BackupCmd     `cmd:"" help:"Back up MODULE's data directories (data: true) to the mesh's restic repository now (mesh backup MODULE), list its snapshots, or set the repository."`
	Move       MoveCmd       `cmd:"" help:"Move MODULE from FROM to TO with its data: stopped on FROM, its data directories copied over the peer API (checked by digest), started on TO; FROM keeps its copy until mesh move --finish MODULE. Any failure before TO is healthy puts it back on FROM."`
	Restore    RestoreCmd    `cmd:"" help:"Put MODULE's data directories back from a snapshot (its latest by default): its containers stop, the data is swapped in (what was there is kept aside), they start again and their health checks pass."`
	Restart    RestartCmd    `cmd:"" help:"Restart MODULE's containers (or MODULE.CONTAINER) on every node running it, or on --node: the same containers, stopped and started again, recorded so mesh why says who asked."`
	Logs       LogsCmd       `cmd:"" help:"Print MODULE's lines (or MODULE.CONTAINER's, or a step's last run) from the nodes running it, merged in time order; -f follows."`
	Exec       ExecCmd       `cmd:"" help:"Run a command in MODULE.CONTAINER on the node running it (-i for input, -t for a terminal); exits with its code."`
	Web        WebCmd        `cmd:"" help:"Log in to this node's web page (mesh web token prints a one-time link) or end its sessions (mesh web logout --all)."`
	Why        WhyCmd        `cmd:"" help:"Why RESOURCE on NODE last changed: the plan version, the command that made it, and what moved, down to the input whose digest changed."`

	VersionFlag kong.VersionFlag `name:"version" help:"Print the version and exit."`
}

func main() {
	if agent.IsHelper() {
		// The copy mesh setup made to bind a rootless agent's port 53 does
		// that and nothing else.
		os.Exit(agent.RunHelper(os.Args[1:]))
	}
	if len(os.Args) > 1 && os.Args[1] == "exec-env" {
		// What a container with env-secrets runs first (podman/client.go).
		os.Exit(envexec.Run(os.Args[2:], os.Stderr))
	}
	var cli CLI
	cli.out = os.Stdout
	parser, err := kong.New(&cli,
		kong.Name("mesh"),
		kong.Description("mesh: one binary per machine; the fleet keeps a replicated roster and each node runs its share of modules on Podman."),
		kong.UsageOnError(),
		kong.Vars{"version": "mesh " + version},
		kong.Exit(func(code int) {
			if code == 80 { // kong's usage-error code; ours is 2
				code = exitUsage
			}
			os.Exit(code)
		}),
	)
	if err != nil {
		panic(err)
	}
	// With COMP_LINE set (a shell asking for completions), answer and exit.
	kongplete.Complete(parser, kongplete.WithPredictors(completionPredictors(&cli.Globals)))
	args := os.Args[1:]
	if len(args) == 0 {
		args = []string{"--help"} // a bare mesh shows its usage, exit 0
	}
	ctx, err := parser.Parse(args)
	if err != nil {
		var pe *kong.ParseError
		if errors.As(err, &pe) {
			fmt.Fprintf(os.Stderr, "mesh: %v (see mesh --help)\n", err)
			os.Exit(exitUsage)
		}
		fmt.Fprintf(os.Stderr, "mesh: %v\n", err)
		os.Exit(exitUsage)
	}
	if err := ctx.Run(&cli.Globals); err != nil {
		var es exitStatus
		if errors.As(err, &es) {
			os.Exit(int(es))
		}
		var ue usageError
		if errors.As(err, &ue) {
			fmt.Fprintf(os.Stderr, "mesh: %v\n", err)
			os.Exit(exitUsage)
		}
		fmt.Fprintf(os.Stderr, "mesh: %v\n", err)
		os.Exit(exitFailed)
	}
}

// usageError marks a mistake in how a command was called (exit 2).
type usageError struct{ error }

// privateUmask makes every file the process creates private: the stores
// (SQLite, the Raft log) create theirs 0644, and the data dir holds the CA key
// and the join secret.
func privateUmask() { syscall.Umask(0o077) }

func signalContext() (context.Context, context.CancelFunc) {
	return signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
}

func timeout() (context.Context, context.CancelFunc) {
	return context.WithTimeout(context.Background(), 30*time.Second)
}

func printJSON(w io.Writer, v any) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(v)
}

// SchemaCmd prints the manifest's JSON Schema.
type SchemaCmd struct{}

// Run prints it.
func (c *SchemaCmd) Run(g *Globals) error {
	b, err := manifest.Schema()
	if err != nil {
		return err
	}
	_, err = fmt.Fprintf(g.out, "%s\n", b)
	return err
}

// VersionCmd prints the version.
type VersionCmd struct{}

// Run prints it.
func (c *VersionCmd) Run(g *Globals) error {
	fmt.Fprintf(g.out, "mesh %s\n", version)
	return nil
}

func dash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}
