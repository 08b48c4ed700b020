package main

import (
	"errors"
	"fmt"
	"io"
	"os"
	"strings"
	"text/tabwriter"
	"time"

	"golang.org/x/term"

	"mesh/internal/safefs"
	"mesh/state"
	"mesh/state/manifest"
)

// SecretCmd groups the operator's secrets.
type SecretCmd struct {
	Set  SecretSetCmd  `cmd:"" help:"Set MODULE's secret NAME from standard input or --from-file (never the command line): sealed to the nodes MODULE runs on; the containers that read it are replaced."`
	List SecretListCmd `cmd:"" help:"List secrets: name, short digest, size, when set and which nodes can open it; never a value."`
	Rm   SecretRmCmd   `cmd:"" help:"Remove MODULE's secret NAME (what reads it waits until it is set again)."`
}

// SecretSetCmd sets a secret.
type SecretSetCmd struct {
	Module   string        `arg:"" predictor:"module" help:"The module the secret is for."`
	Name     string        `arg:"" help:"The secret's name, as the manifest's secret resource (name:) or env-secrets name it."`
	FromFile string        `name:"from-file" placeholder:"FILE" type:"path" help:"Read the value from FILE (a regular file, at most 1 MiB), byte for byte. Without it the value is read from standard input, byte for byte (printf '%s' \"$PW\" | ..., as echo adds a newline), or asked for without echo on a terminal."`
	Wait     bool          `help:"Return when every node whose plan changed has applied it and the health checks of the containers it replaced pass, and a rollout of the new value (a module with update: or a health check on several nodes) has ended; exit 1 if any fails or the rollout stopped."`
	Timeout  time.Duration `default:"10m" help:"How long --wait waits."`
	DryRun   bool          `name:"dry-run" help:"Print, per node, which containers would be replaced (and why); write nothing."`
	JSON     bool          `name:"json" help:"Print the result as JSON."`
}

// Run reads the value and hands it to the local agent, which seals it.
func (c *SecretSetCmd) Run(g *Globals) error {
	if !manifest.SecretNameRE.MatchString(c.Name) {
		return usageError{fmt.Errorf("secret name %q: %s", c.Name, manifest.SecretNameRule)}
	}
	value, err := c.read(os.Stdin)
	if err != nil {
		return err
	}
	ctx, cancel := timeout()
	defer cancel()
	r, err := g.writer(c.DryRun).SetSecret(ctx, c.Module, c.Name, value)
	if err != nil {
		return err
	}
	if c.JSON {
		return printJSON(g.out, r)
	}
	if r.Preview != nil {
		return printPreview(g, r.Preview)
	}
	if r.Unchanged {
		fmt.Fprintf(g.out, "secret %s of %s is already this value: nothing changed\n", c.Name, c.Module)
		return nil
	}
	fmt.Fprintf(g.out, "set secret %s of %s (%d bytes), sealed to %s (log index %d)\n", c.Name, c.Module, len(value), strings.Join(r.SealedTo, ", "), r.Index)
	if !c.Wait {
		return nil
	}
	return waitAndRollouts(g, []string{c.Module}, r.Index, c.Timeout)
}

func (c *SecretSetCmd) read(stdin *os.File) ([]byte, error) {
	var b []byte
	var err error
	switch {
	case c.FromFile != "":
		b, err = safefs.ReadRegular(c.FromFile, state.MaxSecretSize)
		if errors.Is(err, safefs.ErrTooLarge) {
			return nil, fmt.Errorf("%w; a secret holds at most 1 MiB", err)
		}
		if err != nil {
			return nil, fmt.Errorf("read the secret: %w", err)
		}
	case term.IsTerminal(int(stdin.Fd())):
		fmt.Fprintf(os.Stderr, "value of secret %s for %s (not shown; Enter ends it): ", c.Name, c.Module)
		b, err = term.ReadPassword(int(stdin.Fd()))
		fmt.Fprintln(os.Stderr)
		if err != nil {
			return nil, fmt.Errorf("read the secret from the terminal: %w", err)
		}
	default:
		b, err = io.ReadAll(io.LimitReader(stdin, state.MaxSecretSize+1))
		if err != nil {
			return nil, fmt.Errorf("read the secret from standard input: %w", err)
		}
		if len(b) > state.MaxSecretSize {
			return nil, fmt.Errorf("standard input holds more than 1 MiB (%d bytes); a secret holds at most that", state.MaxSecretSize)
		}
	}
	if len(b) == 0 {
		return nil, errors.New("the value is empty: give it on standard input (printf '%s' \"$VALUE\" | mesh secret set MODULE NAME) or with --from-file FILE; nothing was set")
	}
	return b, nil
}

// SecretListCmd lists secrets.
type SecretListCmd struct {
	Module string `arg:"" optional:"" predictor:"module" help:"Only this module's secrets."`
	JSON   bool   `name:"json" help:"Print JSON."`
}

// Run prints them.
func (c *SecretListCmd) Run(g *Globals) error {
	ctx, cancel := timeout()
	defer cancel()
	l, err := g.client().Secrets(ctx, c.Module)
	if err != nil {
		return err
	}
	if c.JSON {
		return printJSON(g.out, l)
	}
	if len(l) == 0 {
		fmt.Fprintln(g.out, "no secret is set (mesh secret set MODULE NAME)")
		return nil
	}
	tw := tabwriter.NewWriter(g.out, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "MODULE\tNAME\tDIGEST\tSIZE\tSET\tSEALED TO\tSTATE")
	for _, s := range l {
		fmt.Fprintf(tw, "%s\t%s\t%s\t%d\t%s\t%s\t%s\n", s.Module, s.Name, s.Digest, s.Size, s.SetAt.Local().Format("2006-01-02 15:04:05"), dash(strings.Join(s.SealedTo, ",")), s.State)
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	for _, s := range l {
		if s.Advice != "" {
			fmt.Fprintf(g.out, "%s/%s: %s\n", s.Module, s.Name, s.Advice)
		}
	}
	return nil
}

// SecretRmCmd removes a secret.
type SecretRmCmd struct {
	Module string `arg:"" predictor:"module" help:"The module."`
	Name   string `arg:"" help:"The secret's name."`
	DryRun bool   `name:"dry-run" help:"Print, per node, what would wait for the secret or be removed; write nothing."`
}

// Run removes it.
func (c *SecretRmCmd) Run(g *Globals) error {
	ctx, cancel := timeout()
	defer cancel()
	r, err := g.writer(c.DryRun).RemoveSecret(ctx, c.Module, c.Name)
	if err != nil {
		return err
	}
	if r.Preview != nil {
		return printPreview(g, r.Preview)
	}
	fmt.Fprintf(g.out, "removed secret %s of %s (log index %d); what reads it waits until it is set again\n", c.Name, c.Module, r.Index)
	return nil
}
