package main

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"mesh/agent"
	"mesh/internal/safefs"
	"net"
	"os"
	"strings"
	"time"

	"golang.org/x/term"
)

// JoinCmd joins a mesh.
type JoinCmd struct {
	Peer        string `arg:"" name:"ADDRESS" help:"Any node of the mesh, IP[:PORT]."`
	Token       string `env:"MESH_TOKEN" help:"The join token from mesh token on a node of the mesh. Prefer MESH_TOKEN, --token-file or standard input: a token on the command line shows in ps and stays in the shell's history."`
	TokenFile   string `name:"token-file" placeholder:"FILE" help:"Read the token from FILE (- for standard input). With no token given at all, it is read from standard input (without echo on a terminal)."`
	Name        string `help:"This node's name (a DNS label). Default: the short host name, lower-cased."`
	Address     string `placeholder:"IP" help:"The IP other nodes reach this one at. Default: this machine's source address toward ADDRESS."`
	Port        int    `default:"7430" help:"TCP port for node-to-node traffic."`
	LogStore    string `name:"log-store" default:"wal" enum:"wal,boltdb" help:"Raft log store."`
	OverlayPort int    `name:"overlay-port" default:"51820" help:"This node's WireGuard UDP port on the mesh's overlay (the others must reach it at --address)."`
	Replace     bool   `help:"Take the place of a node of this name that has run (a machine rebuilt after its data dir was lost): the mesh takes this machine's keys for the name, and the machine that had them is refused from then on. Without it such a join is refused."`
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
	// Attempts start for 45 s while the mesh has no leader, and each may
	// take 30 s: the last ends within the 2 minutes.
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	err = agent.Join(ctx, agent.JoinConfig{DataDir: g.dir(), Peer: c.Peer, Token: token, Name: c.Name, Address: c.Address, Port: c.Port, LogStore: c.LogStore, OverlayPort: c.OverlayPort, Replace: c.Replace,
		Note: func(msg string) { fmt.Fprintln(os.Stderr, "mesh: "+msg) }})
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
		b, err := safefs.ReadRegular(c.TokenFile, 4096)
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
