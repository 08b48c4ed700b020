package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/signal"
	"syscall"
	"time"

	"golang.org/x/term"

	"mesh/cluster/api"
)

// LogsCmd prints a module's lines from the nodes that run it (issue 29).
type LogsCmd struct {
	Target     string        `arg:"" name:"MODULE[.CONTAINER]" predictor:"module" help:"The module (all its containers), one container (MODULE.NAME) or a step (MODULE.STEP: its last run)."`
	Node       string        `predictor:"node" help:"Only the instance on this node."`
	Follow     bool          `short:"f" help:"Keep printing new lines, on across a container's replacement, until Ctrl-C."`
	Since      time.Duration `placeholder:"DURATION" help:"Only lines of the last DURATION (e.g. 10m)."`
	Tail       int           `placeholder:"N" help:"Only the last N lines of each container."`
	Timestamps bool          `help:"Print the time of each line (Podman keeps it to the second)."`
}

// Help is the note under mesh logs --help.
func (c *LogsCmd) Help() string {
	return "On a terminal, the control characters a container wrote (escape sequences other than colours, carriage returns, ...) are shown escaped (\\x1b, \\x0d), never acted on; to a pipe or a file its lines are written as it wrote them."
}

// Run streams the lines, merged in time order; a node that cannot be read
// is named on stderr (exit 1) and the others' lines still print.
func (c *LogsCmd) Run(g *Globals) error {
	if c.Tail < 0 || c.Since < 0 {
		return usageError{errors.New("--tail and --since take a positive value")}
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	q := api.LogQuery{Follow: c.Follow, Tail: c.Tail}
	if c.Since > 0 {
		q.Since = time.Now().Add(-c.Since)
	}
	prefix, failed := false, 0
	outTTY, errTTY := isTerminal(g.out), isTerminal(os.Stderr)
	err := g.client().Logs(ctx, c.Target, c.Node, q, func(r api.Record) error {
		switch {
		case r.Sources != nil:
			prefix = len(r.Sources) > 1
			return nil
		case r.Error != "":
			failed++
			fmt.Fprintf(os.Stderr, "mesh: %s on %s: %s\n", r.Container, r.Node, shown(r.Error, errTTY))
			return nil
		case r.Note != "":
			fmt.Fprintf(os.Stderr, "mesh: %s\n", shown(r.Note, errTTY))
			return nil
		}
		w, tty := g.out, outTTY
		if r.Stream == "stderr" {
			w, tty = os.Stderr, errTTY
		}
		_, err := fmt.Fprint(w, c.line(r, prefix, tty))
		return err
	})
	if err != nil {
		return err
	}
	if failed > 0 {
		return fmt.Errorf("%d of the sources could not be read, or not whole (above)", failed)
	}
	return nil
}

// line is how a container's line prints: on a terminal with its control
// characters shown escaped (terminalText; colours kept), to a pipe or a
// file as the container wrote it.
func (c *LogsCmd) line(r api.Record, prefix, tty bool) string {
	line := shown(r.Text, tty)
	if r.Cut {
		line += " [line cut at 64 KiB]"
	}
	if c.Timestamps && !r.Time.IsZero() {
		line = r.Time.Format(time.RFC3339) + " " + line
	}
	if prefix {
		line = r.Node + " " + r.Container + " | " + line
	}
	if !r.Partial {
		line += "\n"
	}
	return line
}

// shown is what a container wrote, escaped for a terminal (tty) or as is.
func shown(s string, tty bool) string {
	if tty {
		return terminalText(s)
	}
	return s
}

func isTerminal(w io.Writer) bool {
	f, ok := w.(*os.File)
	return ok && term.IsTerminal(int(f.Fd()))
}
