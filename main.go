// Command mesh runs a small self-hosted fleet: every machine runs this binary.
//
// main.go holds the command-line grammar; each command's Run wires packages
// together and prints, nothing more.
package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/signal"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"text/tabwriter"
	"time"

	"github.com/alecthomas/kong"
	"github.com/miekg/dns"
	"github.com/willabides/kongplete"
	"golang.org/x/term"

	"mesh/cluster"
	"mesh/cluster/api"
	"mesh/internal/safefs"
	"mesh/state"
	"mesh/state/manifest"
)

// version is set at build time with -ldflags "-X main.version=...".
var version = "dev"

// Exit codes (DESIGN section 6).
const (
	exitFailed = 1
	exitUsage  = 2
)

// Globals are flags every command takes.
type Globals struct {
	DataDir string `name:"data-dir" env:"MESH_DATA_DIR" placeholder:"DIR" help:"Node data directory (default /var/lib/mesh for root, $XDG_DATA_HOME/mesh otherwise)."`

	out io.Writer
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

func (g *Globals) client() *api.Client { return api.NewClient(g.dir()) }

// writer is the client for a write: one that only previews it on --dry-run.
func (g *Globals) writer(dryRun bool) *api.Client {
	if dryRun {
		return g.client().DryRun()
	}
	return g.client()
}

// printPreview prints what a write would do; nothing was written.
func printPreview(g *Globals, p *state.Preview) error {
	fmt.Fprintf(g.out, "dry run at log index %d: nothing was written\n", p.Index)
	if len(p.Nodes) == 0 && len(p.Names) == 0 {
		fmt.Fprintln(g.out, "no node's plan and no name would change")
		return nil
	}
	for _, n := range p.Nodes {
		fmt.Fprintf(g.out, "%s:\n", n.Node)
		if n.ComposeError != "" {
			fmt.Fprintf(g.out, "  ! its plan would stop composing (it keeps its last good plan): %s\n", n.ComposeError)
		}
		for _, a := range n.Actions {
			fmt.Fprintf(g.out, "  %s\n", a)
		}
	}
	if len(p.Names) > 0 {
		fmt.Fprintln(g.out, "names:")
		for _, c := range p.Names {
			fmt.Fprintf(g.out, "  %s %s -> %s\n", c.Op, c.Name, c.Address)
		}
	}
	return nil
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
	Assign     AssignCmd     `cmd:"" help:"Run MODULE on NODE."`
	Unassign   UnassignCmd   `cmd:"" help:"Stop running MODULE on NODE."`
	Plan       PlanCmd       `cmd:"" help:"Show what a node must hold, its history and what changed."`
	Status     StatusCmd     `cmd:"" help:"Show the mesh: nodes, plan versions, what each applied, errors."`
	Roster     RosterCmd     `cmd:"" help:"Show every name the mesh answers and its addresses."`
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
	Why        WhyCmd        `cmd:"" help:"Why RESOURCE on NODE last changed: the plan version, the command that made it, and what moved, down to the input whose digest changed."`

	VersionFlag kong.VersionFlag `name:"version" help:"Print the version and exit."`
}

func main() {
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

// InitCmd creates a mesh.
type InitCmd struct {
	Name     string `required:"" help:"This node's name (a DNS label)."`
	Address  string `required:"" placeholder:"IP" help:"The IP other nodes reach this one at."`
	Domain   string `default:"internal" help:"The mesh's DNS domain: NODE.DOMAIN and MODULE.DOMAIN."`
	Port     int    `default:"7430" help:"TCP port for node-to-node (raft) traffic."`
	LogStore string `name:"log-store" default:"wal" enum:"wal,boltdb" help:"Raft log store: wal or boltdb (see cluster/DESIGN.md)."`
	Voters   int    `default:"3" help:"How many nodes vote in raft: the first ones to join; the rest are non-voting replicas."`
}

// Run creates the data dir and exits.
func (c *InitCmd) Run(g *Globals) error {
	privateUmask()
	ctx, cancel := signalContext()
	defer cancel()
	if c.Voters < 1 {
		return usageError{errors.New("--voters must be at least 1")}
	}
	err := cluster.Init(ctx, cluster.InitConfig{DataDir: g.dir(), Name: c.Name, Address: c.Address, Port: c.Port, Domain: c.Domain, LogStore: c.LogStore, Voters: c.Voters})
	if err != nil {
		return err
	}
	fmt.Fprintf(g.out, "initialised mesh with node %s (%s) in %s\nstart it with: mesh agent --data-dir %s\n", c.Name, c.Address, g.dir(), g.dir())
	return nil
}

// JoinCmd joins a mesh.
type JoinCmd struct {
	Peer      string `arg:"" name:"ADDRESS" help:"Any node of the mesh, IP[:PORT]."`
	Token     string `env:"MESH_TOKEN" help:"The join token from mesh token on a node of the mesh. Prefer MESH_TOKEN, --token-file or standard input: a token on the command line shows in ps and stays in the shell's history."`
	TokenFile string `name:"token-file" placeholder:"FILE" help:"Read the token from FILE (- for standard input). With no token given at all, it is read from standard input (without echo on a terminal)."`
	Name      string `help:"This node's name (a DNS label). Default: the short host name, lower-cased."`
	Address   string `placeholder:"IP" help:"The IP other nodes reach this one at. Default: this machine's source address toward ADDRESS."`
	Port      int    `default:"7430" help:"TCP port for node-to-node traffic."`
	LogStore  string `name:"log-store" default:"wal" enum:"wal,boltdb" help:"Raft log store."`
}

// Run joins and exits.
func (c *JoinCmd) Run(g *Globals) error {
	privateUmask()
	if c.Name == "" {
		n, err := hostLabel()
		if err != nil {
			return usageError{fmt.Errorf("%v; name this node with --name", err)}
		}
		c.Name = n
	}
	if c.Address == "" {
		a, err := sourceAddressToward(c.Peer)
		if err != nil {
			return usageError{fmt.Errorf("no address toward %s (%v); give this node's with --address", c.Peer, err)}
		}
		c.Address = a
	}
	token, err := c.readToken(os.Stdin, os.Stderr, os.Args[1:])
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	err = cluster.Join(ctx, cluster.JoinConfig{DataDir: g.dir(), Peer: c.Peer, Token: token, Name: c.Name, Address: c.Address, Port: c.Port, LogStore: c.LogStore})
	if err != nil {
		return err
	}
	fmt.Fprintf(g.out, "joined the mesh as %s (%s) in %s\nstart it with: mesh agent --data-dir %s\n", c.Name, c.Address, g.dir(), g.dir())
	return nil
}

// readToken finds the join token: in the file --token-file names (- for
// stdin), in --token or MESH_TOKEN, or else on standard input (a terminal
// is asked, without echo). A token on the command line works, with a
// warning: it shows in ps while the join runs and stays in the history.
func (c *JoinCmd) readToken(stdin *os.File, warn io.Writer, args []string) (string, error) {
	onCommandLine := false
	for _, a := range args {
		if a == "--token" || strings.HasPrefix(a, "--token=") {
			onCommandLine = true
		}
	}
	var tok string
	switch {
	case c.TokenFile != "" && onCommandLine:
		return "", usageError{errors.New("give the token once: --token-file or --token, not both")}
	case c.TokenFile == "-":
		t, err := readLine(stdin)
		if err != nil {
			return "", fmt.Errorf("read the token from standard input: %w", err)
		}
		tok = t
	case c.TokenFile != "":
		b, err := os.ReadFile(c.TokenFile)
		if err != nil {
			return "", fmt.Errorf("read the token: %w", err)
		}
		tok = strings.TrimSpace(string(b))
	case c.Token != "":
		if onCommandLine {
			fmt.Fprintln(warn, "warning: a token on the command line shows in ps while the join runs and stays in the shell's history; next time use MESH_TOKEN, --token-file FILE, or paste it when asked")
		}
		tok = strings.TrimSpace(c.Token)
	case term.IsTerminal(int(stdin.Fd())):
		fmt.Fprint(warn, "join token (from `mesh token` on a node of the mesh): ")
		b, err := term.ReadPassword(int(stdin.Fd()))
		fmt.Fprintln(warn)
		if err != nil {
			return "", fmt.Errorf("read the token: %w", err)
		}
		tok = strings.TrimSpace(string(b))
	default:
		t, err := readLine(stdin)
		if err != nil {
			return "", usageError{fmt.Errorf("no join token: give it with MESH_TOKEN, --token-file FILE, or on standard input (%v)", err)}
		}
		tok = t
	}
	if tok == "" {
		return "", usageError{errors.New("the join token is empty; print it with `mesh token` on a node of the mesh")}
	}
	return tok, nil
}

// stdinWait bounds the wait for a token on a standard input that is not a
// terminal (a pipe nobody writes to, as under ssh without -n).
var stdinWait = 30 * time.Second

// readLine reads the first line of r (at most 4 KiB), trimmed, within
// stdinWait.
func readLine(r io.Reader) (string, error) {
	type line struct {
		s   string
		err error
	}
	got := make(chan line, 1)
	go func() {
		b, err := bufio.NewReader(io.LimitReader(r, 4096)).ReadString('\n')
		if err != nil && !errors.Is(err, io.EOF) {
			got <- line{"", err}
			return
		}
		if strings.TrimSpace(b) == "" && errors.Is(err, io.EOF) {
			got <- line{"", errors.New("nothing was given")}
			return
		}
		got <- line{strings.TrimSpace(b), nil}
	}()
	select {
	case l := <-got:
		return l.s, l.err
	case <-time.After(stdinWait):
		return "", fmt.Errorf("nothing came within %s", stdinWait)
	}
}

// hostLabel is the short host name as a DNS label: lower-cased, '_' as '-',
// other characters dropped.
func hostLabel() (string, error) {
	h, err := os.Hostname()
	if err != nil {
		return "", err
	}
	return labelOf(h)
}

func labelOf(h string) (string, error) {
	h, _, _ = strings.Cut(strings.ToLower(h), ".")
	var b strings.Builder
	for _, r := range h {
		switch {
		case r >= 'a' && r <= 'z', r >= '0' && r <= '9', r == '-':
			b.WriteRune(r)
		case r == '_':
			b.WriteRune('-')
		}
	}
	l := strings.Trim(b.String(), "-")
	if l == "" || len(l) > 63 {
		return "", fmt.Errorf("the host name %q makes no DNS label", h)
	}
	return l, nil
}

// sourceAddressToward is the address this machine sends from toward peer
// (IP[:PORT]): a UDP "connection" picks the route, sending nothing.
func sourceAddressToward(peer string) (string, error) {
	host := peer
	if h, _, err := net.SplitHostPort(peer); err == nil {
		host = h
	}
	c, err := net.Dial("udp", net.JoinHostPort(host, "7430"))
	if err != nil {
		return "", err
	}
	defer c.Close()
	return c.LocalAddr().(*net.UDPAddr).IP.String(), nil
}

// TokenCmd prints the join token.
type TokenCmd struct {
	Rotate      bool `help:"Replace the token; the old one stops working."`
	JoinLine    bool `name:"join-line" help:"Print the command a machine that has mesh runs to join."`
	InstallLine bool `name:"install-line" help:"Print one line for a machine with nothing of the mesh on it: it fetches this node's mesh binary (the mesh CA checked against the token's digest first, so no trust on first use) into /usr/local/bin and joins."`
}

// Run prints it: the token alone when captured ($(mesh token)); on a
// terminal also the lines to paste on the new machine.
func (c *TokenCmd) Run(g *Globals) error {
	if c.JoinLine && c.InstallLine {
		return usageError{errors.New("give --join-line or --install-line, not both")}
	}
	ctx, cancel := timeout()
	defer cancel()
	t, err := g.client().Token(ctx, c.Rotate)
	if err != nil {
		return err
	}
	peer := func() string {
		st, err := g.client().Status(ctx)
		if err != nil {
			return ""
		}
		for _, n := range st.Nodes {
			if n.Name == st.Node {
				if n.Port != 0 && n.Port != cluster.DefaultPort {
					return net.JoinHostPort(n.Address, strconv.Itoa(n.Port))
				}
				return n.Address
			}
		}
		return ""
	}()
	join := fmt.Sprintf("MESH_TOKEN=%s mesh join %s", t, peer)
	install, ierr := cluster.InstallLine(peer, t, "/usr/local/bin/mesh")
	switch {
	case (c.JoinLine || c.InstallLine) && peer == "":
		return fmt.Errorf("this node is not in its own status yet; try again")
	case c.JoinLine:
		fmt.Fprintln(g.out, join)
		return nil
	case c.InstallLine:
		if ierr != nil {
			return ierr
		}
		fmt.Fprintln(g.out, install)
		return nil
	}
	fmt.Fprintln(g.out, t)
	if f, ok := g.out.(*os.File); ok && term.IsTerminal(int(f.Fd())) && peer != "" && ierr == nil {
		fmt.Fprintf(g.out, "\non the new machine, as root (name and address default to its host name and its\naddress toward this node); where mesh is installed:\n  %s\nwhere it is not (fetches this node's binary, the mesh CA checked against the token):\n  %s\nthen start it: mesh agent (or contrib/mesh.service)\n", join, install)
	}
	return nil
}

// SnapshotCmd groups backup and restore.
type SnapshotCmd struct {
	Save    SnapshotSaveCmd    `cmd:"" help:"Write a consistent copy of the replicated state to FILE (mode 0600: it holds the CA key and secrets)."`
	Restore SnapshotRestoreCmd `cmd:"" help:"Put back the catalogue, assignments, credentials and public domains of FILE, on every node, through Raft. Membership stays as it is."`
}

// SnapshotSaveCmd saves the state.
type SnapshotSaveCmd struct {
	File string `arg:"" help:"Where to write the snapshot."`
}

// Run writes it atomically.
func (c *SnapshotSaveCmd) Run(g *Globals) error {
	ctx, cancel := timeout()
	defer cancel()
	b, err := g.client().Snapshot(ctx)
	if err != nil {
		return err
	}
	sn, err := state.ReadSnapshot(bytes.NewReader(b))
	if err != nil {
		return fmt.Errorf("the agent's snapshot does not decode: %w", err)
	}
	if err := safefs.WriteFile(c.File, append(b, '\n'), 0o600); err != nil {
		return err
	}
	fmt.Fprintf(g.out, "saved the state at index %d (%d modules, %d assignments, %d nodes) to %s\n", sn.Index, len(sn.Rows("modules")), len(sn.Rows("assignments")), len(sn.Rows("nodes")), c.File)
	return nil
}

// SnapshotRestoreCmd restores the state.
type SnapshotRestoreCmd struct {
	File  string `arg:"" type:"existingfile" help:"A file written by mesh snapshot save."`
	Force bool   `help:"Restore a snapshot of another mesh."`
}

// Run proposes the restore.
func (c *SnapshotRestoreCmd) Run(g *Globals) error {
	b, err := os.ReadFile(c.File)
	if err != nil {
		return err
	}
	sn, err := state.ReadSnapshot(bytes.NewReader(b))
	if err != nil {
		return fmt.Errorf("%s is not a snapshot (%v); give a file written by mesh snapshot save", c.File, err)
	}
	body, err := sn.RestoreBody()
	if err != nil {
		return fmt.Errorf("%s: %w", c.File, err)
	}
	ctx, cancel := timeout()
	defer cancel()
	r, err := g.client().Restore(ctx, api.RestoreRequest{Restore: body, Force: c.Force})
	if err != nil {
		return err
	}
	fmt.Fprintf(g.out, "restored the state of index %d (%d modules, %d assignments) at log index %d; every node's plan follows from it\n", sn.Index, len(body.Modules), len(body.Assignments)-len(r.Dropped), r.Index)
	for _, d := range r.Dropped {
		fmt.Fprintf(g.out, "  left out: %s (that node is not in the mesh now)\n", d)
	}
	return nil
}

// RecoverCmd makes this node the only voter.
type RecoverCmd struct{}

// Run recovers and says what to do next.
func (c *RecoverCmd) Run(g *Globals) error {
	privateUmask()
	ctx, cancel := timeout()
	defer cancel()
	r, err := cluster.Recover(ctx, g.dir())
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

// NodeCmd groups node commands.
type NodeCmd struct {
	List         NodeListCmd         `cmd:"" help:"List the nodes."`
	PublicDomain NodePublicDomainCmd `cmd:"" name:"public-domain" help:"Set (or with --clear, remove) NODE's public domain; routes become NAME.DOMAIN."`
	Remove       NodeRemoveCmd       `cmd:"" help:"Remove NODE from the mesh."`
}

// NodeListCmd lists nodes.
type NodeListCmd struct {
	JSON bool `name:"json" help:"Print JSON."`
}

// Run prints the nodes.
func (c *NodeListCmd) Run(g *Globals) error {
	ctx, cancel := timeout()
	defer cancel()
	nodes, err := g.client().Nodes(ctx)
	if err != nil {
		return err
	}
	if c.JSON {
		return printJSON(g.out, nodes)
	}
	tw := tabwriter.NewWriter(g.out, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "NODE\tADDRESS\tPUBLIC DOMAIN\tVOTER")
	for _, n := range nodes {
		fmt.Fprintf(tw, "%s\t%s\t%s\t%v\n", n.Name, n.Address, dash(n.PublicDomain), n.Voter)
	}
	return tw.Flush()
}

// NodePublicDomainCmd sets a public domain.
type NodePublicDomainCmd struct {
	Node    string        `arg:"" predictor:"node" help:"The node."`
	Domain  string        `arg:"" optional:"" help:"The public domain, e.g. zurag.be."`
	Clear   bool          `help:"Remove the node's public domain."`
	Wait    bool          `help:"Return when the node has applied its new plan and the health checks of the containers it changed pass; exit 1 if either fails."`
	Timeout time.Duration `default:"5m" help:"How long --wait waits."`
	DryRun  bool          `name:"dry-run" help:"Print, per node, what would be created, replaced (and why), run again or removed, and which names would change; write nothing."`
}

// Run sets or clears it.
func (c *NodePublicDomainCmd) Run(g *Globals) error {
	if c.Clear == (c.Domain != "") {
		return usageError{errors.New("give either DOMAIN or --clear")}
	}
	ctx, cancel := timeout()
	defer cancel()
	r, err := g.writer(c.DryRun).PublicDomain(ctx, c.Node, strings.ToLower(c.Domain))
	if err != nil {
		return err
	}
	if r.Preview != nil {
		return printPreview(g, r.Preview)
	}
	if c.Clear {
		fmt.Fprintf(g.out, "cleared the public domain of %s (log index %d)\n", c.Node, r.Index)
	} else {
		fmt.Fprintf(g.out, "%s now serves routes under %s (log index %d)\n", c.Node, strings.ToLower(c.Domain), r.Index)
	}
	if !c.Wait {
		return nil
	}
	return waitChanged(g, r.Index, c.Timeout)
}

// waitChanged waits for every node whose plan the write at index changed to
// apply it, and for the health checks of the containers that apply changed.
func waitChanged(g *Globals, index uint64, limit time.Duration) error {
	st, err := g.status()
	if err != nil {
		return err
	}
	var errs []string
	waited := 0
	for _, n := range st.Nodes {
		if n.PlanVersion != index {
			continue
		}
		waited++
		if err := waitApplied(g, n.Name, "", index, limit); err != nil {
			errs = append(errs, err.Error())
		}
	}
	if waited == 0 {
		fmt.Fprintln(g.out, "no node's plan changed; nothing to wait for")
	}
	if len(errs) > 0 {
		return errors.New(strings.Join(errs, "\n"))
	}
	return nil
}

// NodeRemoveCmd removes a node.
type NodeRemoveCmd struct {
	Node  string `arg:"" predictor:"node" help:"The node."`
	Force bool   `help:"Remove it even though modules are still assigned to it (they are unassigned)."`
}

// Run removes it.
func (c *NodeRemoveCmd) Run(g *Globals) error {
	ctx, cancel := timeout()
	defer cancel()
	r, err := g.client().RemoveNode(ctx, c.Node, c.Force)
	if err != nil {
		return err
	}
	fmt.Fprintf(g.out, "removed node %s (log index %d)\n", c.Node, r.Index)
	// What removal does not undo (README, More nodes).
	fmt.Fprintf(g.out, "its certificate is refused from now on; the machine may still hold the join token: mesh token --rotate\n")
	return nil
}

// ModuleCmd groups catalogue commands.
type ModuleCmd struct {
	Add    ModuleAddCmd    `cmd:"" help:"Add or replace modules from manifest files (all or none)."`
	List   ModuleListCmd   `cmd:"" help:"List the catalogue."`
	Show   ModuleShowCmd   `cmd:"" help:"Print a module's manifest."`
	Remove ModuleRemoveCmd `cmd:"" help:"Remove a module that is assigned nowhere."`
	Pull   ModulePullCmd   `cmd:"" help:"Pull the images of MODULE's containers on every node running it now, and replace only the containers whose image changed."`
}

// ModuleAddCmd adds manifests.
type ModuleAddCmd struct {
	Files   []string      `arg:"" type:"existingfile" help:"Manifest files." name:"FILE"`
	Wait    bool          `help:"Return when every node whose plan changed has applied it and the health checks of the containers it changed pass; exit 1 if any fails."`
	Timeout time.Duration `default:"5m" help:"How long --wait waits."`
	DryRun  bool          `name:"dry-run" help:"Print, per node, what would be created, replaced (and why), run again or removed, and which names would change; write nothing."`
}

// Run checks every file first, then adds them in one command.
func (c *ModuleAddCmd) Run(g *Globals) error {
	req, err := readManifests(c.Files, g.dir())
	if err != nil {
		return err
	}
	ctx, cancel := timeout()
	defer cancel()
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
	return waitChanged(g, r.Index, c.Timeout)
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
	fh, err := os.Open(f)
	if err != nil {
		return nil, nil, err
	}
	defer fh.Close()
	if fi, err := fh.Stat(); err == nil && !fi.Mode().IsRegular() {
		return nil, nil, fmt.Errorf("%s: not a regular file; give the module's YAML file", f)
	}
	b, err := io.ReadAll(io.LimitReader(fh, manifest.MaxSize+1))
	if err != nil {
		return nil, nil, fmt.Errorf("read %s: %w", f, err)
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
	Wait    bool          `help:"Return when every node running it has pulled and applied, and the health checks of the containers it replaced pass; exit 1 if any fails."`
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
	fmt.Fprintf(g.out, "every node running %s pulls its images and replaces the containers whose image changed (log index %d)\n", c.Name, r.Index)
	if !c.Wait {
		return nil
	}
	if err := waitChanged(g, r.Index, c.Timeout); err != nil {
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

// AssignCmd assigns a module to a node.
type AssignCmd struct {
	Node    string        `arg:"" predictor:"node" help:"The node."`
	Module  string        `arg:"" predictor:"module" help:"The module."`
	Wait    bool          `help:"Return when the node has applied the new plan and the health checks of the containers it changed pass; exit 1 if either fails."`
	Timeout time.Duration `default:"5m" help:"How long --wait waits."`
	DryRun  bool          `name:"dry-run" help:"Print, per node, what would be created, replaced (and why), run again or removed, and which names would change; write nothing."`
}

// Run assigns it.
func (c *AssignCmd) Run(g *Globals) error {
	return assign(g, state.OpAssign, c.Node, c.Module, c.Wait, c.DryRun, c.Timeout)
}

// UnassignCmd unassigns a module from a node.
type UnassignCmd struct {
	Node    string        `arg:"" predictor:"node" help:"The node."`
	Module  string        `arg:"" predictor:"module" help:"The module."`
	Wait    bool          `help:"Return when the node has applied the new plan and the health checks of the containers it changed pass; exit 1 if either fails."`
	Timeout time.Duration `default:"5m" help:"How long --wait waits."`
	DryRun  bool          `name:"dry-run" help:"Print, per node, what would be created, replaced (and why), run again or removed, and which names would change; write nothing."`
}

// Run unassigns it.
func (c *UnassignCmd) Run(g *Globals) error {
	return assign(g, state.OpUnassign, c.Node, c.Module, c.Wait, c.DryRun, c.Timeout)
}

func assign(g *Globals, op, node, module string, wait, dryRun bool, limit time.Duration) error {
	ctx, cancel := timeout()
	defer cancel()
	r, err := g.writer(dryRun).Assign(ctx, op, node, module)
	if err != nil {
		return err
	}
	if r.Preview != nil {
		return printPreview(g, r.Preview)
	}
	verb := "assigned %s to %s"
	if op == state.OpUnassign {
		verb = "unassigned %s from %s"
	}
	fmt.Fprintf(g.out, verb+" (log index %d)\n", module, node, r.Index)
	p, err := g.client().Plans(ctx, node, 1)
	if err != nil {
		return err
	}
	if p.Error != "" {
		if wait {
			return fmt.Errorf("the plan of %s does not compose, so there is nothing new to apply: %s", node, p.Error)
		}
		fmt.Fprintf(g.out, "warning: the plan of %s does not compose; it keeps its last good plan:\n  %s\n", node, p.Error)
	}
	if !wait || len(p.Versions) == 0 {
		return nil
	}
	return waitApplied(g, node, module, p.Versions[0].Version, limit)
}

// waitApplied polls the node's reports until it applied version, or failed.
// With a module, only that module's failure fails the wait; other modules'
// failures on the node are printed.
func waitApplied(g *Globals, node, module string, version uint64, limit time.Duration) error {
	fmt.Fprintf(g.out, "waiting for %s to apply plan v%d ...\n", node, version)
	start := time.Now().Add(-time.Second) // a little slack for clocks
	deadline := time.Now().Add(limit)
	gated := ""
	for {
		st, err := g.status()
		if err != nil {
			return err
		}
		for _, n := range st.Nodes {
			if n.Name != node || n.Report == nil || n.Report.Version < version {
				continue
			}
			if n.Report.Error != "" && n.Report.AppliedAt.Before(start) {
				continue // a failure from before this command; wait for the retry
			}
			if f := n.Report.Failed(module); n.Report.OnlyGates() && (module == "" || f != nil) {
				// A health gate: the node goes on as the provider's health
				// changes; say so once per reason.
				if n.Report.Error != gated {
					gated = n.Report.Error
					fmt.Fprintf(g.out, "%s: %s\n", node, strings.ReplaceAll(gated, "\n", "\n  "))
				}
				if time.Now().After(deadline) {
					return fmt.Errorf("%s still waits at a health gate after %s:\n  %s", node, limit, strings.ReplaceAll(gated, "\n", "\n  "))
				}
				continue
			}
			if n.Report.Error != "" && (module == "" || n.Report.Failed(module) != nil || len(n.Report.Failures) == 0) {
				return fmt.Errorf("%s failed to apply plan v%d:\n  %s", node, n.Report.Version, strings.ReplaceAll(n.Report.Error, "\n", "\n  "))
			}
			printOutcomes(g.out, n.Report)
			if n.Report.Error != "" {
				fmt.Fprintf(g.out, "%s applied plan v%d for %s; other modules there failed:\n  %s\n", node, n.Report.Version, module, strings.ReplaceAll(n.Report.Error, "\n", "\n  "))
			} else {
				fmt.Fprintf(g.out, "%s applied plan v%d\n", node, n.Report.Version)
			}
			return waitHealthy(g, node, module, n.Report, deadline)
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%s did not apply plan v%d within %s; `mesh status` shows its last report (is its agent running?)", node, version, limit)
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// waitHealthy waits until every health-checked container that the apply of
// rep created or replaced (of module, when given) is healthy; it fails once
// one is unhealthy (Podman says so only after the start period and the
// retries), naming the check and its output.
func waitHealthy(g *Globals, node, module string, rep *state.Report, deadline time.Time) error {
	changed := map[string]bool{}
	for _, rr := range rep.Resources {
		if rr.Kind == "container" && (rr.Outcome == "created" || rr.Outcome == state.Replaced) && (module == "" || rr.Module == module) {
			changed[rr.Name] = true
		}
	}
	wait := map[string]bool{}
	for _, h := range rep.Health {
		if changed[h.Container] {
			wait[h.Container] = true
		}
	}
	if len(wait) == 0 {
		return nil
	}
	names := make([]string, 0, len(wait))
	for n := range wait {
		names = append(names, n)
	}
	sort.Strings(names)
	fmt.Fprintf(g.out, "waiting for the health checks of %s ...\n", strings.Join(names, ", "))
	for {
		st, err := g.status()
		if err != nil {
			return err
		}
		healthy := 0
		for _, n := range st.Nodes {
			if n.Name != node || n.Report == nil {
				continue
			}
			for _, h := range n.Report.Health {
				if !wait[h.Container] {
					continue
				}
				switch h.Status {
				case state.HealthHealthy:
					healthy++
				case state.HealthUnhealthy:
					return fmt.Errorf("%s on %s is unhealthy: its health check %s failed %d time(s) in a row; last output: %q (mesh status shows it; podman healthcheck run %s runs it by hand)",
						h.Container, node, checkOf(g, node, h.Container), h.FailingStreak, h.Output, h.Container)
				}
			}
		}
		if healthy == len(wait) {
			fmt.Fprintf(g.out, "healthy: %s\n", strings.Join(names, ", "))
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("the health checks of %s on %s did not pass before the --timeout; mesh status shows them", strings.Join(names, ", "), node)
		}
		time.Sleep(250 * time.Millisecond)
	}
}

// checkOf is a container's declared health check command, for messages.
func checkOf(g *Globals, node, container string) string {
	ctx, cancel := timeout()
	defer cancel()
	p, err := g.client().Plans(ctx, node, 1)
	if err != nil || len(p.Versions) == 0 || p.Versions[0].Plan == nil {
		return "(unknown)"
	}
	for _, r := range p.Versions[0].Plan.Resources {
		if r.RuntimeName() == container && r.Typed.Health != nil {
			b, _ := json.Marshal(r.Typed.Health.Command)
			return string(b)
		}
	}
	return "(unknown)"
}

// printOutcomes prints a report's changes, one line each.
func printOutcomes(w io.Writer, r *state.Report) {
	for _, rr := range r.Resources {
		if rr.Outcome == state.Unchanged {
			continue
		}
		line := fmt.Sprintf("  %s %s (%s): %s", rr.Kind, rr.Name, rr.Module, rr.Outcome)
		if rr.Reason != "" {
			line += "; " + rr.Reason
		}
		fmt.Fprintln(w, line)
	}
}

// PlanCmd shows a node's plan.
type PlanCmd struct {
	Node    string `arg:"" predictor:"node" help:"The node."`
	Diff    bool   `help:"Show what changed between the last two plan versions."`
	History bool   `help:"List every plan version, newest first."`
	JSON    bool   `name:"json" help:"Print JSON."`
}

// Run prints the plan, its diff or its history.
func (c *PlanCmd) Run(g *Globals) error {
	if c.Diff && c.History {
		return usageError{errors.New("give --diff or --history, not both")}
	}
	ctx, cancel := timeout()
	defer cancel()
	limit := 1
	if c.Diff {
		limit = 2
	}
	if c.History {
		limit = 0
	}
	p, err := g.client().Plans(ctx, c.Node, limit)
	if err != nil {
		return err
	}
	w := g.out
	if c.Diff {
		var older, newer *state.Plan
		if len(p.Versions) > 0 {
			newer = p.Versions[0].Plan
		}
		if len(p.Versions) > 1 {
			older = p.Versions[1].Plan
		}
		changes := state.Diff(older, newer)
		if c.JSON {
			return printJSON(w, changes)
		}
		switch len(p.Versions) {
		case 0:
			fmt.Fprintf(w, "%s has no plan yet\n", c.Node)
		case 1:
			fmt.Fprintf(w, "%s: v%d is its first plan (%s)\n", c.Node, p.Versions[0].Version, p.Versions[0].Cause)
		default:
			fmt.Fprintf(w, "%s: v%d -> v%d (%s)\n", c.Node, p.Versions[1].Version, p.Versions[0].Version, p.Versions[0].Cause)
		}
		for _, ch := range changes {
			fmt.Fprintln(w, ch.String())
		}
		printComposeError(w, p)
		return nil
	}
	if c.JSON {
		return printJSON(w, p)
	}
	if c.History {
		tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
		fmt.Fprintln(tw, "VERSION\tWHEN\tDIGEST\tRESOURCES\tCAUSE")
		for _, v := range p.Versions {
			fmt.Fprintf(tw, "v%d\t%s\t%.12s\t%d\t%s\n", v.Version, v.CreatedAt.Format(time.RFC3339), v.Digest, len(v.Plan.Resources), v.Cause)
		}
		tw.Flush()
		printComposeError(w, p)
		return nil
	}
	if len(p.Versions) == 0 {
		fmt.Fprintf(w, "%s has no plan yet\n", c.Node)
		printComposeError(w, p)
		return nil
	}
	v := p.Versions[0]
	fmt.Fprintf(w, "%s: plan v%d, digest %.12s, %s (%s)\n", c.Node, v.Version, v.Digest, v.CreatedAt.Format(time.RFC3339), v.Cause)
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	for _, r := range v.Plan.Resources {
		fmt.Fprintf(tw, "  %s\t%s\t(%s)\n", r.Kind, r.Name, r.Module)
	}
	tw.Flush()
	if st, err := g.client().Status(ctx); err == nil {
		for _, n := range st.Nodes {
			if n.Name == c.Node && n.Report != nil {
				fmt.Fprintf(w, "last apply: plan v%d at %s, %d mutations (Podman calls and file writes)\n", n.Report.Version, n.Report.AppliedAt.Format(time.RFC3339), n.Report.Mutations)
				printOutcomes(w, n.Report)
				if n.Report.Error != "" {
					fmt.Fprintf(w, "  failed: %s\n", n.Report.Error)
				}
			}
		}
	}
	if len(v.Plan.Routes) > 0 {
		fmt.Fprintln(w, "routes:")
		for _, r := range v.Plan.Routes {
			fmt.Fprintf(w, "  %s -> %s:%d\n", r.Name, r.Module, r.Port)
		}
	}
	printComposeError(w, p)
	return nil
}

func printComposeError(w io.Writer, p api.PlansReply) {
	if p.Error != "" {
		fmt.Fprintf(w, "error: the plan does not compose; the node keeps the plan above:\n  %s\n", p.Error)
	}
}

// StatusCmd shows the mesh.
type StatusCmd struct {
	JSON     bool          `name:"json" help:"Print JSON."`
	Watch    bool          `help:"Redraw as plans are applied, nodes come and go and health changes (a terminal is redrawn in place; otherwise each change is printed after a rule). Stop with Ctrl-C."`
	Interval time.Duration `default:"1s" help:"How often --watch asks the agent."`
}

// RosterCmd shows the names.
type RosterCmd struct {
	JSON    bool   `name:"json" help:"Print JSON."`
	History bool   `help:"When each name appeared, moved or went, and the command that caused it (oldest first)."`
	Name    string `arg:"" optional:"" help:"With --history: only this name."`
}

// Run prints the roster, or its history.
func (c *RosterCmd) Run(g *Globals) error {
	ctx, cancel := timeout()
	defer cancel()
	if c.Name != "" && !c.History {
		return usageError{errors.New("a NAME goes with --history (mesh resolve NAME asks the resolver)")}
	}
	if c.History {
		h, err := g.client().RosterHistory(ctx, c.Name)
		if err != nil {
			return err
		}
		if c.JSON {
			return printJSON(g.out, h)
		}
		if len(h) == 0 {
			fmt.Fprintln(g.out, "no changes recorded (the history starts with this mesh version; a state restored from an older snapshot has none before it)")
			return nil
		}
		tw := tabwriter.NewWriter(g.out, 0, 4, 2, ' ', 0)
		fmt.Fprintln(tw, "INDEX\tTIME\tCHANGE\tNAME\tADDRESS\tNODE\tCAUSE")
		for i, e := range h {
			what := map[string]string{"+": "appeared", "-": "went"}[e.Op]
			// A name that went from one address and appeared at another
			// in the same command moved.
			for j := max(0, i-3); j < min(len(h), i+4); j++ {
				if j != i && h[j].Index == e.Index && h[j].Name == e.Name && h[j].Op != e.Op {
					what = map[string]string{"+": "moved to", "-": "moved from"}[e.Op]
				}
			}
			at := e.At
			if t, err := time.Parse(time.RFC3339Nano, e.At); err == nil {
				at = t.Local().Format("2006-01-02 15:04:05")
			}
			fmt.Fprintf(tw, "%d\t%s\t%s\t%s\t%s\t%s\t%s\n", e.Index, at, what, e.Name, e.Address, e.Node, e.Cause)
		}
		return tw.Flush()
	}
	ro, err := g.client().Roster(ctx)
	if err != nil {
		return err
	}
	if c.JSON {
		if ro == nil {
			ro = []state.Name{}
		}
		return printJSON(g.out, ro)
	}
	tw := tabwriter.NewWriter(g.out, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "NAME\tADDRESS\tNODE")
	for _, n := range ro {
		fmt.Fprintf(tw, "%s\t%s\t%s\n", n.Name, n.Address, n.Node)
	}
	return tw.Flush()
}

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
	if len(errs) > 0 {
		return errors.New(strings.Join(errs, "\n"))
	}
	fmt.Fprintf(g.out, "%d manifest(s) ok\n", len(order))
	return nil
}

// ResolveCmd asks the local resolver.
type ResolveCmd struct {
	Name    string        `arg:"" help:"The name, e.g. gitea.internal."`
	TCP     bool          `name:"tcp" help:"Ask over TCP instead of UDP."`
	Server  string        `help:"Ask this resolver (IP or IP:PORT) instead of this node's; needs no data dir or agent." placeholder:"ADDR"`
	Timeout time.Duration `default:"5s" help:"How long to wait for each answer."`
}

// Run asks for A and AAAA and prints the answers; exit 1 when the name does
// not exist or the resolver fails.
func (c *ResolveCmd) Run(g *Globals) error {
	ctx, cancel := timeout()
	defer cancel()
	server := c.Server
	if server == "" {
		st, err := g.client().Status(ctx)
		if err != nil {
			return err
		}
		if st.Resolver == "" {
			return errors.New("this node's agent runs no resolver")
		}
		server = st.Resolver
	} else if _, _, err := net.SplitHostPort(server); err != nil {
		server = net.JoinHostPort(server, "53")
	}
	network := "udp"
	if c.TCP {
		network = "tcp"
	}
	found := 0
	for _, qt := range []uint16{dns.TypeA, dns.TypeAAAA} {
		m := new(dns.Msg)
		m.SetQuestion(dns.Fqdn(c.Name), qt)
		r, _, err := (&dns.Client{Net: network, Timeout: c.Timeout}).ExchangeContext(ctx, m, server)
		if err != nil {
			return fmt.Errorf("ask the resolver at %s: %w", server, err)
		}
		if r.Rcode != dns.RcodeSuccess {
			return fmt.Errorf("%s: %s (from %s)", c.Name, dns.RcodeToString[r.Rcode], server)
		}
		for _, rr := range r.Answer {
			fmt.Fprintln(g.out, rr.String())
			found++
		}
	}
	if found == 0 {
		fmt.Fprintf(g.out, "%s exists but has no address\n", c.Name)
	}
	return nil
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
