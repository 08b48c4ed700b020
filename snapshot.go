package main

import (
	"bytes"
	"context"
	"fmt"
	"time"

	"mesh/cluster"
	"mesh/cluster/api"
	"mesh/internal/safefs"
	"mesh/state"
)

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
	b, err := safefs.ReadRegular(c.File, api.MaxRestore)
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
	// A large state (tens of MiB at thousands of modules) is given the
	// time each step on the way gives it (cluster.LargeWrite).
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second+cluster.LargeWrite(int64(len(b))))
	defer cancel()
	r, err := g.client().Restore(ctx, api.RestoreRequest{Restore: body, Force: c.Force})
	if err != nil {
		return err
	}
	fmt.Fprintf(g.out, "restored the state of index %d (%d modules, %d assignments) at log index %d; every node's plan follows from it\n", sn.Index, len(body.Modules), len(body.Assignments)-len(r.Dropped), r.Index)
	for _, d := range r.Dropped {
		fmt.Fprintf(g.out, "  left out: %s (that node is not in the mesh now)\n", d)
	}
	for _, c := range r.Unsealed {
		fmt.Fprintf(g.out, "  left out: the credential %s, in plain text in the snapshot and delivered by no node (a new one is made when it is needed)\n", c)
	}
	return nil
}
