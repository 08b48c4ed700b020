package manifest

import (
	"encoding/json"
	"errors"
	"reflect"
	"strings"
	"testing"
)

// pgBackup is a module backed up daily, its database dumped into its data
// directory first. Its lines are the ones the rows below count on.
const pgBackup = `module: pg
backup:
  schedule: daily
  keep: {daily: 7, weekly: 4, monthly: 12}
  pause: true
resources:
  - directory: /srv/pg
    owner: "999:999"
    mode: "0700"
    data: true
  - step: dump
    image: docker.io/library/postgres:16
    command: ["pg_dumpall", "-f", "/data/dump.sql"]
    mounts: ["/srv/pg:/data"]
    before-backup: true
  - container: pg.server
    image: docker.io/library/postgres:16
    mounts: ["/srv/pg:/var/lib/postgresql/data"]
`

// Issue 30, item 2: backup: and before-backup: are parsed, and survive the
// trip through the log and the catalogue (JSON) whole.
func TestBackupRoundTrip(t *testing.T) {
	m, err := Parse("pg.yaml", []byte(pgBackup))
	if err != nil {
		t.Fatal(err)
	}
	want := &Backup{Schedule: "daily", Keep: &Keep{Daily: 7, Weekly: 4, Monthly: 12}, Pause: true}
	if !reflect.DeepEqual(m.Backup, want) {
		t.Fatalf("backup: %+v, want %+v", m.Backup, want)
	}
	if !m.Resources[1].BeforeBackup || m.Resources[0].BeforeBackup || m.Resources[2].BeforeBackup {
		t.Fatalf("before-backup is on the wrong resources: %+v", m.Resources)
	}
	b, err := json.Marshal(m)
	if err != nil {
		t.Fatal(err)
	}
	for _, k := range []string{`"backup":{"schedule":"daily","keep":{"daily":7,"weekly":4,"monthly":12},"pause":true}`, `"before-backup":true`} {
		if !strings.Contains(string(b), k) {
			t.Errorf("the parsed form lacks %s: %s", k, b)
		}
	}
	var back Manifest
	if err := json.Unmarshal(b, &back); err != nil {
		t.Fatal(err)
	}
	back.File, back.Digest = m.File, m.Digest
	back.IndexProviders() // not in the parsed form: found again
	if !reflect.DeepEqual(&back, m) {
		t.Fatalf("round trip:\n got %+v\nwant %+v", &back, m)
	}

	// A manifest without them says nothing of them in its parsed form, so
	// the forms stored before the keys existed are unchanged.
	plain, err := Parse("g.yaml", []byte(gitea))
	if err != nil {
		t.Fatal(err)
	}
	if b, _ := json.Marshal(plain); strings.Contains(string(b), "backup") {
		t.Fatalf("a manifest without backups carries them: %s", b)
	}
}

// Each row is a manifest built from pgBackup; an empty want is accepted,
// any other is the first error's message (a substring) at line.
func TestBackupChecks(t *testing.T) {
	edit := func(pairs ...string) string { return strings.NewReplacer(pairs...).Replace(pgBackup) }
	const (
		sched = "  schedule: daily\n"
		keep  = "  keep: {daily: 7, weekly: 4, monthly: 12}\n"
		pause = "  pause: true\n"
		data  = "    data: true\n"
		bb    = "    before-backup: true\n"
	)
	noBackup := sched + keep + pause
	for _, c := range []struct {
		name, src string
		line      int
		want      string
	}{
		{"the example", pgBackup, 0, ""},
		{"every 6h", edit(sched, "  schedule: every 6h\n"), 0, ""},
		{"a cron line", edit(sched, "  schedule: \"30 3 * * *\"\n"), 0, ""},
		{"no schedule", edit(sched, ""), 0, ""},
		{"no keep", edit(keep, ""), 0, ""},
		{"keep last only", edit(keep, "  keep: {last: 10000}\n"), 0, ""},
		{"before-backup without backup:", edit("backup:\n"+noBackup, ""), 0, ""},
		{"backup: without a step", edit(bb, ""), 0, ""},

		{"bad schedule", edit(sched, "  schedule: sometimes\n"), 3, `backup: schedule "sometimes": `},
		{"every too short", edit(sched, "  schedule: every 5s\n"), 3, "between 10s and 366 days"},
		{"keep too many", edit(keep, "  keep:\n    daily: 7\n    weekly: 10001\n"), 6, "backup: keep weekly 10001 is not between 0 and 10000"},
		{"keep negative", edit(keep, "  keep: {last: -1, daily: 7}\n"), 4, "backup: keep last -1 is not between 0 and 10000"},
		{"keep nothing", edit(keep, "  keep: {daily: 0}\n"), 4, "backup: keep: keeps nothing; give at least one of last, hourly, daily, weekly, monthly, yearly a count above 0"},
		{"keep empty", edit(keep, "  keep: {}\n"), 4, "backup: keep: keeps nothing"},
		{"no data directory", edit(data, ""), 3, "backup: the module declares no data directory (data: true) to back up"},
		{"unknown backup key", edit(pause, "  paws: true\n"), 5, `unknown key "paws"; did you mean "pause"?`},
		{"unknown keep key", edit(keep, "  keep: {dayly: 7}\n"), 4, `unknown key "dayly"; did you mean "daily"?`},
		{"keep a number", edit(keep, "  keep: 7\n"), 4, "`keep` must be a mapping of keys; got the number 7"},
		{"keep a text", edit(keep, "  keep: {daily: seven}\n"), 4, "`daily` must be a whole number, e.g. daily: 7"},
		{"pause a text", edit(pause, "  pause: always\n"), 5, "`pause` must be true or false"},
		{"backup a list", edit("backup:\n"+noBackup, "backup: [daily]\n"), 2, "`backup` must be a mapping of keys; got a list"},

		{"before-backup on a container", edit(bb, "", "  - container: pg.server\n", "  - container: pg.server\n"+bb), 16, "a container does not take `before-backup`"},
		{"before-backup on a directory", edit(bb, "", data, data+bb), 11, "a directory does not take `before-backup`"},
		{"before-backup a text", edit(bb, "    before-backup: yes please\n"), 15, "`before-backup` must be true or false"},
		{"before-backup and schedule", edit(bb, bb+"    schedule: hourly\n"), 15, `step "dump": before-backup and schedule do not go together`},
		{"before-backup with nothing to back up", edit("backup:\n"+noBackup, "", data, ""), 10, `step "dump" runs before each backup (before-backup: true), but the module declares neither backup: nor a data directory (data: true)`},
		{"restart-on a before-backup step", edit("    mounts: [\"/srv/pg:/var/lib/postgresql/data\"]\n", "    mounts: [\"/srv/pg:/var/lib/postgresql/data\"]\n    restart-on: [dump]\n"), 19, `restart-on "dump" names a before-backup step, which runs before each backup and never at an apply`},
		{"restart-on on a before-backup step", edit(bb, bb+"    restart-on: [/srv/pg]\n"), 16, `step "dump": restart-on is never acted on`},
	} {
		t.Run(c.name, func(t *testing.T) {
			m, err := Parse("pg.yaml", []byte(c.src))
			if c.want == "" {
				if err != nil {
					t.Fatalf("refused: %v\n%s", err, c.src)
				}
				if m.Backup == nil && len(m.DataDirs()) == 0 {
					t.Fatalf("the row tests nothing:\n%s", c.src)
				}
				return
			}
			var errs Errors
			if !errors.As(err, &errs) || len(errs) == 0 {
				t.Fatalf("accepted, or not Errors (%v):\n%s", err, c.src)
			}
			if e := errs[0]; e.Line != c.line || !strings.Contains(e.Msg, c.want) {
				t.Fatalf("got %v\nwant pg.yaml:%d: ...%s...\n%s", err, c.line, c.want, c.src)
			}
		})
	}

	// backup: without a data directory is said once, at backup:, not
	// again at each before-backup step.
	_, err := Parse("pg.yaml", []byte(strings.Replace(pgBackup, data, "", 1)))
	var errs Errors
	if !errors.As(err, &errs) || len(errs) != 1 {
		t.Fatalf("want one error, got %v", err)
	}
}

// Every key of the manifest, of backup: and of keep: is in the shape check
// and in the schema (the Resource's keys are checked by TestEveryKeyIsHandled).
func TestTopKeysAreKnown(t *testing.T) {
	b, err := Schema()
	if err != nil {
		t.Fatal(err)
	}
	var schema struct {
		Defs map[string]struct {
			Properties map[string]json.RawMessage `json:"properties"`
		} `json:"$defs"`
	}
	if err := json.Unmarshal(b, &schema); err != nil {
		t.Fatal(err)
	}
	keep := manifestShape.fields["backup"].fields["keep"]
	for _, c := range []struct {
		def   string
		typ   reflect.Type
		shape *shape
	}{
		{"Manifest", reflect.TypeOf(Manifest{}), manifestShape},
		{"Backup", reflect.TypeOf(Backup{}), manifestShape.fields["backup"]},
		{"Keep", reflect.TypeOf(Keep{}), keep},
		{"Update", reflect.TypeOf(Update{}), manifestShape.fields["update"]},
	} {
		if c.shape == nil {
			t.Errorf("%s: no shape", c.def)
			continue
		}
		keys := map[string]bool{}
		for i := 0; i < c.typ.NumField(); i++ {
			key, _, _ := strings.Cut(c.typ.Field(i).Tag.Get("yaml"), ",")
			if key == "-" || key == "" {
				continue
			}
			keys[key] = true
			if c.shape.fields[key] == nil {
				t.Errorf("%s.%s: not in the shape check (shape.go)", c.def, key)
			}
			if schema.Defs[c.def].Properties[key] == nil {
				t.Errorf("%s.%s: not in the schema", c.def, key)
			}
		}
		for k := range c.shape.fields {
			if !keys[k] {
				t.Errorf("%s: the shape check takes %q, which no field is", c.def, k)
			}
		}
	}
}
