package main

import (
	"context"
	"errors"
	"fmt"

	"os"
	"os/signal"
	"syscall"

	"golang.org/x/term"

	"mesh/cluster/api"
)

// ExecCmd runs a command in a module's container on whichever node runs it.
type ExecCmd struct {
	Target      string   `arg:"" name:"MODULE.CONTAINER" predictor:"module" help:"The container (e.g. gitea.server)."`
	Command     []string `arg:"" name:"CMD" passthrough:"" help:"The command and its arguments, after --."`
	Node        string   `predictor:"node" help:"The node, when the container runs on several."`
	Interactive bool     `short:"i" help:"Send this terminal's standard input to the command."`
	TTY         bool     `short:"t" name:"tty" help:"Give the command a terminal (with this window's size)."`
}

// cancelOnSignal calls cancel at the first of sigs, until ctx ends or the
// returned stop is called.
func cancelOnSignal(ctx context.Context, cancel context.CancelFunc, sigs ...os.Signal) (stop func()) {
	ch := make(chan os.Signal, 1)
	signal.Notify(ch, sigs...)
	go func() {
		select {
		case <-ch:
			cancel()
		case <-ctx.Done():
		}
	}()
	return func() { signal.Stop(ch) }
}

// exitStatus is a command's own exit code, which mesh exits with.
type exitStatus int

func (e exitStatus) Error() string { return fmt.Sprintf("exit status %d", int(e)) }

// Run runs the command and returns its exit code as mesh's.
func (c *ExecCmd) Run(g *Globals) error {
	if len(c.Command) > 0 && c.Command[0] == "--" {
		c.Command = c.Command[1:]
	}
	if len(c.Command) == 0 {
		return usageError{errors.New("no command: mesh exec MODULE.CONTAINER -- CMD...")}
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	q := api.ExecQuery{Cmd: c.Command, TTY: c.TTY, Stdin: c.Interactive}
	st := api.ExecStreams{Stdout: g.out, Stderr: os.Stderr}
	if c.Interactive {
		st.Stdin = os.Stdin
	}
	// Ctrl-C (without a raw terminal), SIGTERM and SIGHUP end the command
	// (its streams close); the terminal is restored on the way out.
	defer cancelOnSignal(ctx, cancel, os.Interrupt, syscall.SIGTERM, syscall.SIGHUP)()
	fd := int(os.Stdin.Fd())
	if c.TTY && term.IsTerminal(fd) {
		if w, h, err := term.GetSize(fd); err == nil {
			q.Width, q.Height = uint16(w), uint16(h)
		}
	}
	// Raw mode only when this terminal's keys go to the command (-i):
	// then Ctrl-C is the command's to read.
	if c.TTY && c.Interactive && term.IsTerminal(fd) {
		old, err := term.MakeRaw(fd)
		if err != nil {
			return fmt.Errorf("put the terminal in raw mode: %w", err)
		}
		defer term.Restore(fd, old)
		sizes := make(chan [2]uint16, 1)
		winch := make(chan os.Signal, 1)
		signal.Notify(winch, syscall.SIGWINCH)
		defer signal.Stop(winch)
		go func() {
			for range winch {
				if w, h, err := term.GetSize(fd); err == nil {
					select {
					case sizes <- [2]uint16{uint16(w), uint16(h)}:
					default:
					}
				}
			}
		}()
		st.Resizes = sizes
	}
	e, err := g.client().Exec(ctx, c.Target, c.Node, q, st)
	if errors.Is(err, context.Canceled) {
		return exitStatus(130)
	}
	if err != nil {
		return err
	}
	if e.Error != "" {
		return errors.New(e.Error)
	}
	if e.Code != 0 {
		return exitStatus(e.Code)
	}
	return nil
}
