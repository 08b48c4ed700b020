package main

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"os"
	"strings"
	"time"

	"mesh/internal/provision"
)

// ProvisionCmd groups the provisioners.
type ProvisionCmd struct {
	Postgres ProvisionPostgresCmd `cmd:"" help:"Make PostgreSQL accept the credentials the mesh delivered: each consumer's role, password and database."`
}

// ProvisionPostgresCmd runs the PostgreSQL provisioner.
type ProvisionPostgresCmd struct {
	Credentials string        `required:"" type:"existingdir" placeholder:"DIR" help:"The provider's accepts-credentials directory (CONSUMER.credential files)."`
	DSN         string        `name:"dsn" required:"" env:"MESH_PROVISION_DSN" placeholder:"DSN" help:"How to reach PostgreSQL as a role that may create roles and databases, e.g. 'host=/run/postgresql user=postgres' (or MESH_PROVISION_DSN, which keeps a password off the command line)."`
	Watch       bool          `help:"Keep running: apply again whenever what was delivered changes, and retry what failed."`
	Interval    time.Duration `default:"5s" help:"With --watch, how often the delivered files are looked at."`
}

// Run makes one pass, or watches. It never drops a role or a database.
func (c *ProvisionPostgresCmd) Run(g *Globals) error {
	log := slog.New(slog.NewTextHandler(os.Stderr, nil))
	p := &provision.Postgres{DSN: c.DSN, Dir: c.Credentials, Log: log}
	if c.Watch {
		if c.Interval < 100*time.Millisecond {
			return usageError{fmt.Errorf("--interval %s is too short (at least 100ms)", c.Interval)}
		}
		ctx, cancel := signalContext()
		defer cancel()
		p.Watch(ctx, c.Interval, func(out []provision.Outcome, err error) {
			if err != nil {
				log.Error("provision pass failed; retrying", "err", err)
			}
			printProvision(g.out, out, false)
		})
		return nil
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	out, err := p.Pass(ctx)
	if err != nil {
		return err
	}
	if failed := printProvision(g.out, out, true); failed > 0 {
		return fmt.Errorf("%d consumer(s) failed; the others are applied", failed)
	}
	return nil
}

// printProvision prints a pass's outcomes (all of them, or only what moved)
// and counts the failures.
func printProvision(w io.Writer, out []provision.Outcome, all bool) (failed int) {
	for _, o := range out {
		if o.Outcome == provision.Failed {
			failed++
		}
		if !all && o.Outcome == provision.Unchanged {
			continue
		}
		line := o.Consumer + ": " + o.Outcome
		if o.Reason != "" {
			line += " (" + strings.TrimSpace(o.Reason) + ")"
		}
		fmt.Fprintln(w, line)
	}
	return failed
}
