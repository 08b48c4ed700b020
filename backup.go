package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"slices"
	"sort"
	"strings"
	"syscall"
	"text/tabwriter"
	"time"

	"mesh/cluster/api"
	"mesh/internal/safefs"
	"mesh/state"
	"mesh/state/manifest"
)

// BackupCmd groups the backups of modules' data with restic (issue 30).
type BackupCmd struct {
	Run  BackupRunCmd  `cmd:"" default:"withargs" hidden:"" help:"Back up MODULE's data directories now."`
	List BackupListCmd `cmd:"" help:"List MODULE's snapshots in the repository, oldest first."`
	Repo BackupRepoCmd `cmd:"" help:"Set or show the restic repository the mesh backs up to."`
}

// BackupRunCmd is mesh backup MODULE.
type BackupRunCmd struct {
	Module string        `arg:"" predictor:"module" help:"The module whose data directories (data: true) to back up."`
	Node   string        `predictor:"node" help:"Only on this node (by default every node that holds the module's data)."`
	JSON   bool          `name:"json" help:"Print the results as JSON."`
	Limit  time.Duration `name:"timeout" default:"6h" help:"Give up after this long."`
}

// Run backs up on each node, printing progress.
func (c *BackupRunCmd) Run(g *Globals) error {
	results, err := runBackup(g, api.BackupRequest{Op: api.BackupRun, Module: c.Module, Node: c.Node}, c.Limit, !c.JSON)
	if c.JSON {
		if perr := printJSON(g.out, results); perr != nil {
			return perr
		}
	} else {
		for _, r := range results {
			fmt.Fprintf(g.out, "%s on %s: snapshot %s of %s (%d files, %s, %s added) in %s\n", r.Module, r.Node, r.Snapshot, strings.Join(r.Dirs, ", "), r.Files, bytesText(uint64(r.Bytes)), bytesText(uint64(r.Added)), r.Duration)
			if r.Created {
				fmt.Fprintln(g.out, "  the repository was initialised by this backup")
			}
			if len(r.Forgotten) > 0 {
				fmt.Fprintf(g.out, "  keep: forgot %d older snapshot(s): %s\n", len(r.Forgotten), strings.Join(r.Forgotten, ", "))
			}
			if r.Warning != "" {
				fmt.Fprintf(g.out, "  warning: %s\n", printable(r.Warning))
			}
		}
	}
	return err
}

// runBackup sends req and reads its events: progress to stderr (when
// shown), each node's result, and an error naming each node that failed.
func runBackup(g *Globals, req api.BackupRequest, limit time.Duration, show bool) ([]api.BackupResult, error) {
	ctx, cancel := context.WithTimeout(context.Background(), limit)
	defer cancel()
	defer cancelOnSignal(ctx, cancel, os.Interrupt, syscall.SIGTERM)()
	if host, err := os.Hostname(); err == nil {
		req.By = host
	}
	var results []api.BackupResult
	var failed []string
	err := g.client().Backup(ctx, req, func(ev api.BackupEvent) error {
		switch {
		case ev.Error != "":
			failed = append(failed, fmt.Sprintf("%s on %s: %s", req.Module, ev.Node, ev.Error))
		case ev.Result != nil:
			results = append(results, *ev.Result)
		case ev.Progress != "" && show:
			fmt.Fprintf(os.Stderr, "%s: %s\n", ev.Node, ev.Progress)
		}
		return nil
	})
	if err == nil && ctx.Err() != nil {
		err = fmt.Errorf("stopped after %s: %w", limit, ctx.Err())
	}
	if err != nil {
		failed = append(failed, err.Error())
	}
	if len(failed) > 0 {
		return results, errors.New(strings.Join(failed, "\n"))
	}
	return results, nil
}

// BackupListCmd lists a module's snapshots.
type BackupListCmd struct {
	Module string `arg:"" predictor:"module" help:"The module."`
	JSON   bool   `name:"json" help:"Print the snapshots as JSON."`
}

// Run lists them, oldest first.
func (c *BackupListCmd) Run(g *Globals) error {
	results, err := runBackup(g, api.BackupRequest{Op: api.BackupList, Module: c.Module}, 5*time.Minute, false)
	if err != nil {
		return err
	}
	// Each node holding its data lists the repository: one shared by
	// them gives the same snapshots to each.
	var snaps []api.Snapshot
	seen := map[string]bool{}
	for _, r := range results {
		for _, s := range r.Snapshots {
			if !seen[s.ID] {
				seen[s.ID] = true
				snaps = append(snaps, s)
			}
		}
	}
	sort.Slice(snaps, func(i, j int) bool { return snaps[i].Time.Before(snaps[j].Time) })
	if c.JSON {
		if snaps == nil {
			snaps = []api.Snapshot{}
		}
		return printJSON(g.out, snaps)
	}
	if len(snaps) == 0 {
		fmt.Fprintf(g.out, "module %s has no snapshot yet (mesh backup %s)\n", c.Module, c.Module)
		return nil
	}
	tw := tabwriter.NewWriter(g.out, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "SNAPSHOT\tTIME\tNODE\tPLAN\tMANIFEST\tPATHS")
	for _, s := range snaps {
		fmt.Fprintf(tw, "%s\t%s\t%s\tv%s\t%s\t%s\n", s.ID, s.Time.UTC().Format(time.RFC3339), s.Node, s.Plan, s.Manifest, strings.Join(s.Paths, ","))
	}
	return tw.Flush()
}

// BackupRepoCmd groups the repository's commands.
type BackupRepoCmd struct {
	Set  BackupRepoSetCmd  `cmd:"" help:"Set the restic repository (a local path, sftp:HOST:/PATH, s3:..., rest:...) and its password, sealed to every node; it is initialised by the first backup when it does not exist."`
	Show BackupRepoShowCmd `cmd:"" help:"Show the repository and which nodes can open its password (never the password)."`
}

// BackupRepoSetCmd sets it.
type BackupRepoSetCmd struct {
	URL          string `arg:"" name:"URL" help:"The repository, as restic takes it."`
	PasswordFile string `name:"password-file" required:"" placeholder:"FILE" type:"path" help:"A file holding the repository's password (a regular file, at most 1 MiB; white space around it is not part of it, as restic reads it)."`
	JSON         bool   `name:"json" help:"Print the result as JSON."`
}

// Run reads the password and hands both to the local agent, which seals it.
func (c *BackupRepoSetCmd) Run(g *Globals) error {
	if err := errors.Join(state.CheckRepoURL(c.URL), state.CheckRepoPassword(c.URL)); err != nil {
		return usageError{err}
	}
	pw, err := safefs.ReadRegular(c.PasswordFile, state.MaxSecretSize)
	if err != nil {
		return fmt.Errorf("read the password: %w", err)
	}
	// restic's own --password-file trims the same white space: the same
	// file gives the same password to both.
	pw = []byte(strings.TrimSpace(string(pw)))
	if len(pw) == 0 {
		return usageError{fmt.Errorf("%s holds no password", c.PasswordFile)}
	}
	ctx, cancel := timeout()
	defer cancel()
	r, err := g.client().SetBackupRepo(ctx, c.URL, pw)
	if err != nil {
		return err
	}
	if c.JSON {
		return printJSON(g.out, r)
	}
	fmt.Fprintf(g.out, "backup repository set to %s, its password sealed to %s (log index %d)\n", state.RedactRepoURL(c.URL), strings.Join(r.SealedTo, ", "), r.Index)
	return nil
}

// BackupRepoShowCmd shows it.
type BackupRepoShowCmd struct {
	JSON bool `name:"json" help:"Print it as JSON."`
}

// Run shows the repository.
func (c *BackupRepoShowCmd) Run(g *Globals) error {
	ctx, cancel := timeout()
	defer cancel()
	r, err := g.client().BackupRepo(ctx)
	if err != nil {
		return err
	}
	if c.JSON {
		return printJSON(g.out, r)
	}
	if r.URL == "" {
		fmt.Fprintln(g.out, "no backup repository is set (mesh backup repo set URL --password-file FILE)")
		return nil
	}
	fmt.Fprintf(g.out, "%s (its password opens on %s)\n", r.URL, strings.Join(r.SealedTo, ", "))
	return nil
}

// RestoreCmd is mesh restore MODULE.
type RestoreCmd struct {
	Module   string        `arg:"" predictor:"module" help:"The module whose data directories to restore."`
	Snapshot string        `placeholder:"ID" help:"The snapshot (mesh backup list MODULE); by default the module's latest."`
	Node     string        `predictor:"node" help:"The node to restore on (needed when the module holds data on several)."`
	Timeout  time.Duration `default:"1h" help:"Give up after this long (the restore, then the health checks)."`
	JSON     bool          `name:"json" help:"Print the result as JSON."`
}

// Run restores, then waits until the node has started the module's
// containers again and their health checks pass.
func (c *RestoreCmd) Run(g *Globals) error {
	began := time.Now().Add(-time.Second)
	deadline := time.Now().Add(c.Timeout)
	results, err := runBackup(g, api.BackupRequest{Op: api.BackupRestore, Module: c.Module, Node: c.Node, Snapshot: c.Snapshot}, c.Timeout, !c.JSON)
	if c.JSON {
		if perr := printJSON(g.out, results); perr != nil {
			return perr
		}
	}
	if err != nil {
		return err
	}
	for _, r := range results {
		if !c.JSON {
			fmt.Fprintf(g.out, "restored %s of %s on %s from snapshot %s\n", strings.Join(r.Dirs, ", "), r.Module, r.Node, r.Snapshot)
			for _, d := range r.Dirs {
				fmt.Fprintf(g.out, "  what %s held before is kept at %s\n", d, r.Kept[d])
			}
		}
		since := began // an agent before stopped_at: this machine's clock, a second early
		if !r.StoppedAt.IsZero() {
			since = r.StoppedAt
		}
		if err := waitStarted(g, r.Node, r.Module, r.Stopped, since, !r.StoppedAt.IsZero(), deadline); err != nil {
			return err
		}
	}
	return nil
}

// waitStarted waits until node's applies after since have started again
// the module's containers a restore stopped, then for their health checks.
// since is on the node's clock (the restore's stopped_at): an apply of
// just before the restore that created them too (the node started again)
// would otherwise pass for it, healthy, while the restored data starts.
// The restore removed the containers and held the node, so a container
// an apply after since reports as there (created, or unchanged by a later
// apply than the one that created it: two applies may come between two
// reads of the status) was started after the restore. When since is this
// machine's clock (exact false: an agent that does not say when it
// stopped them), only an apply that created them counts.
func waitStarted(g *Globals, node, module string, stopped []string, since time.Time, exact bool, deadline time.Time) error {
	if len(stopped) == 0 {
		return nil
	}
	fmt.Fprintf(g.out, "waiting for %s to start %s again ...\n", node, strings.Join(stopped, ", "))
	started := map[string]bool{}
	after := g.follow()
	for {
		st, err := after.next(deadline)
		if err != nil {
			return err
		}
		for _, n := range st.Nodes {
			if n.Name != node || n.Report == nil || !n.Report.AppliedAt.After(since) {
				continue
			}
			if f := n.Report.Failed(module); f != nil && f.Backup == "" {
				return fmt.Errorf("%s could not start %s again after the restore: %s", node, module, f.Reason)
			}
			for _, rr := range n.Report.Resources {
				if rr.Kind == manifest.KindContainer && slices.Contains(stopped, rr.Name) && (rr.Outcome == state.Created || exact && running(rr.Outcome)) {
					started[rr.Name] = true
				}
			}
			if len(started) == len(stopped) {
				fmt.Fprintf(g.out, "%s started %s\n", node, strings.Join(stopped, ", "))
				return waitChecks(g, node, started, n.Report, deadline)
			}
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%s did not start %s again before the --timeout; mesh status shows why", node, strings.Join(stopped, ", "))
		}
	}
}

// running says a container an apply reports with outcome o is there and
// running after it.
func running(o state.Outcome) bool {
	switch o {
	case state.Created, state.Unchanged, state.Updated, state.Replaced, state.Started, state.Restarted:
		return true
	}
	return false
}
