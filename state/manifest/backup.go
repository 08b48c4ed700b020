package manifest

import (
	"fmt"
	"strings"
)

// Backups (issue 30, "A module's data", item 2): `backup:` says when the
// module's data directories (data: true) are copied to the mesh's restic
// repository and which snapshots are kept; a step with `before-backup:
// true` runs before each copy (a dump into a data directory) and never at
// an apply. The manifest only declares them; the node runs them.

// MaxKeep is the largest count a `keep:` policy takes.
const MaxKeep = 10000

// Backup is a module's backup policy.
type Backup struct {
	// Schedule is when a backup runs, as a step's schedule is written
	// (ParseSchedule).
	Schedule string `yaml:"schedule,omitempty" json:"schedule,omitempty" jsonschema:"description=When a backup runs: daily or hourly or weekly or every 6h or a cron line of five fields in UTC (as a step's schedule)"`
	// Keep is which snapshots outlive a backup (restic forget).
	Keep *Keep `yaml:"keep,omitempty" json:"keep,omitempty" jsonschema:"description=The snapshots kept after each backup (restic forget --keep-last and the like); without keep: none is removed"`
	// Pause pauses the module's containers during the copy, so that what
	// is copied is not written meanwhile.
	Pause bool `yaml:"pause,omitempty" json:"pause,omitempty" jsonschema:"description=Pause the module's containers on the node while its data is copied"`
}

// Keep is a restic retention policy: how many of the newest snapshots, and
// of the last hours, days, weeks, months and years (one each), are kept.
type Keep struct {
	Last    int `yaml:"last,omitempty" json:"last,omitempty" jsonschema:"minimum=0,maximum=10000,description=The newest N snapshots"`
	Hourly  int `yaml:"hourly,omitempty" json:"hourly,omitempty" jsonschema:"minimum=0,maximum=10000,description=The last snapshot of each of the last N hours that have one"`
	Daily   int `yaml:"daily,omitempty" json:"daily,omitempty" jsonschema:"minimum=0,maximum=10000,description=The last snapshot of each of the last N days that have one"`
	Weekly  int `yaml:"weekly,omitempty" json:"weekly,omitempty" jsonschema:"minimum=0,maximum=10000,description=The last snapshot of each of the last N weeks that have one"`
	Monthly int `yaml:"monthly,omitempty" json:"monthly,omitempty" jsonschema:"minimum=0,maximum=10000,description=The last snapshot of each of the last N months that have one"`
	Yearly  int `yaml:"yearly,omitempty" json:"yearly,omitempty" jsonschema:"minimum=0,maximum=10000,description=The last snapshot of each of the last N years that have one"`
}

// keepCount is one key of a keep: policy and its count.
type keepCount struct {
	key string
	n   int
}

// counts lists the policy's keys with their counts, in the order messages
// name them.
func (k *Keep) counts() []keepCount {
	return []keepCount{{"last", k.Last}, {"hourly", k.Hourly}, {"daily", k.Daily}, {"weekly", k.Weekly}, {"monthly", k.Monthly}, {"yearly", k.Yearly}}
}

// checkBackup checks `backup:` and each step's `before-backup:`.
func (m *Manifest) checkBackup(p *positions, add func(line int, format string, a ...any)) {
	hasData := len(m.DataDirs()) > 0
	if b := m.Backup; b != nil {
		if b.Schedule != "" {
			if _, err := ParseSchedule(b.Schedule); err != nil {
				add(p.topAt("backup", "schedule"), "backup: %s", err)
			}
		}
		if k := b.Keep; k != nil {
			var keys []string
			kept := false
			for _, c := range k.counts() {
				keys = append(keys, c.key)
				if c.n < 0 || c.n > MaxKeep {
					add(p.topAt("backup", "keep", c.key), "backup: keep %s %d is not between 0 and %d", c.key, c.n, MaxKeep)
				}
				kept = kept || c.n > 0
			}
			if !kept {
				add(p.topAt("backup", "keep"), "backup: keep: keeps nothing; give at least one of %s a count above 0 (keep: {daily: 7, weekly: 4}), or leave keep: out to keep every snapshot", strings.Join(keys, ", "))
			}
		}
		if !hasData {
			add(p.top("backup"), "backup: the module declares no data directory (data: true) to back up; mark the directory that holds its data with data: true")
		}
	}
	for i := range m.Resources {
		r := &m.Resources[i]
		if r.Step == "" || !r.BeforeBackup {
			continue
		}
		ln := p.at(i, "before-backup", -1)
		if r.Schedule != "" {
			add(ln, "step %q: before-backup and schedule do not go together (a before-backup step runs before each backup, and only then); keep one, and give the backups their schedule under backup:", r.Step)
		}
		if r.RestartOn != nil {
			add(p.at(i, "restart-on", -1), "step %q: restart-on is never acted on: a before-backup step runs before each backup, never at an apply; remove restart-on", r.Step)
		}
		if m.Backup == nil && !hasData {
			add(ln, "step %q runs before each backup (before-backup: true), but the module declares neither backup: nor a data directory (data: true), so it is never backed up; mark the directory the step writes into with data: true, and add backup: to schedule the backups", r.Step)
		}
	}
}

// beforeBackupNamed is the message for a restart-on naming a before-backup
// step, which no apply runs (so nothing could follow it).
func beforeBackupNamed(on string) string {
	return fmt.Sprintf("restart-on %q names a before-backup step, which runs before each backup and never at an apply; name a path or a step that applies run", on)
}
