package integration

import (
	"crypto/sha256"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"mesh/cluster/api"
)

// checkBackups is issue 30, item 2, on the examples bed: examples/postgres.yaml
// as shipped, on n1, backed up with Debian's restic into a repository the
// operator sets once (a local path every node reaches):
//
//   - before a repository is set, mesh backup says how to set one;
//   - 10,000 rows written; a link to the host's /etc/shadow planted in the
//     data directory by the server's container, as a hostile one would;
//   - mesh backup postgres, from n3 (the peer API to n1): the before-backup
//     dump ran, the server was paused and runs again, not recreated;
//   - the rows deleted, mesh restore postgres from n2 brings them back, the
//     server started again and healthy; the link is restored as a link and
//     /etc/shadow is untouched; the data as it was is kept aside;
//   - a restore of a snapshot that does not exist changes nothing;
//   - the schedule shortened to every 15s: two scheduled backups run, and
//     keep: (daily 7, weekly 4, all in one day) prunes the older ones.
func checkBackups(t *testing.T, n []*agent, pgFile string) {
	shadow := func() [32]byte { b, _ := os.ReadFile("/etc/shadow"); return sha256.Sum256(b) }
	shadowBefore := shadow()
	dir := t.TempDir()
	repo := filepath.Join(dir, "repo")
	pw := filepath.Join(dir, "password")
	os.WriteFile(pw, []byte("correct horse battery staple\n"), 0o600)

	if out := n[3].meshFails("backup", "postgres"); !strings.Contains(out, "mesh backup repo set") {
		t.Fatalf("a backup without a repository: %s", out)
	}
	if out := n[2].mesh("backup", "repo", "set", repo, "--password-file", pw); !strings.Contains(out, "sealed to n1, n2, n3") {
		t.Fatalf("repo set: %s", out)
	}
	if out := n[3].mesh("backup", "repo", "show"); !strings.Contains(out, repo) || !strings.Contains(out, "n1, n2, n3") {
		t.Fatalf("repo show: %s", out)
	}
	if out := n[3].mesh("secret", "list"); strings.Contains(out, "correct horse") {
		t.Fatalf("secret list shows the password: %s", out)
	}

	psql := func(sql string) string {
		t.Helper()
		out, err := n[1].h.podmanCmd("exec", "postgres.server", "psql", "-h", "/var/run/postgresql", "-U", "postgres", "-Atc", sql).CombinedOutput()
		if err != nil {
			t.Fatalf("psql %q: %v\n%s", sql, err, out)
		}
		return strings.TrimSpace(string(out))
	}
	psql("CREATE TABLE rows AS SELECT g AS id, md5(g::text) AS v FROM generate_series(1, 10000) g")
	if c := psql("SELECT count(*) FROM rows"); c != "10000" {
		t.Fatalf("rows written: %s", c)
	}
	if out, err := n[1].h.podmanCmd("exec", "postgres.server", "ln", "-s", "/etc/shadow", "/var/lib/postgresql/data/shadow-link").CombinedOutput(); err != nil {
		t.Fatalf("plant the link: %v\n%s", err, out)
	}
	srv := n[1].h.dir + "/srv/postgres"
	server := n[1].h.containerID("postgres.server")

	out := n[3].mesh("backup", "postgres")
	if !strings.Contains(out, "postgres on n1: snapshot ") || !strings.Contains(out, "/srv/postgres/data") || !strings.Contains(out, "initialised") {
		t.Fatalf("mesh backup postgres: %s", out)
	}
	if b, err := os.ReadFile(srv + "/dump/all.sql"); err != nil || !strings.Contains(string(b), "COPY public.rows") {
		t.Fatalf("the before-backup dump: %v (%d bytes)", err, len(b))
	}
	if id := n[1].h.containerID("postgres.server"); id != server {
		t.Fatalf("the backup recreated the server (%s -> %s)", server, id)
	}
	if st := strings.TrimSpace(n[1].h.podman("inspect", "--format", "{{.State.Status}}", "postgres.server")); st != "running" {
		t.Fatalf("the server is %s after the backup (paused, not resumed?)", st)
	}
	var snaps []api.Snapshot
	if err := json.Unmarshal([]byte(n[2].mesh("backup", "list", "postgres", "--json")), &snaps); err != nil || len(snaps) != 1 {
		t.Fatalf("backup list: %v %+v", err, snaps)
	}
	if s := snaps[0]; s.Node != "n1" || s.Plan == "" || len(s.Manifest) != 12 || len(s.Paths) != 3 {
		t.Fatalf("the snapshot's tags: %+v", s)
	}
	eventually(t, 30*time.Second, "status shows the backup", func() (bool, string) {
		out := n[2].mesh("status")
		return strings.Contains(out, "n1: backup of postgres: snapshot "+snaps[0].ID), out
	})

	// Lost rows, restored from n2.
	psql("DELETE FROM rows")
	out = n[2].mesh("restore", "postgres", "--timeout", "5m")
	if !strings.Contains(out, "restored /srv/postgres/data") || !strings.Contains(out, "healthy: postgres.server") {
		t.Fatalf("mesh restore: %s", out)
	}
	if c := psql("SELECT count(*) FROM rows"); c != "10000" {
		t.Fatalf("after the restore: %s rows", c)
	}
	if l, err := os.Readlink(srv + "/data/shadow-link"); err != nil || l != "/etc/shadow" {
		t.Fatalf("the planted link after the restore: %q %v (it must stay a link)", l, err)
	}
	if shadow() != shadowBefore {
		t.Fatal("/etc/shadow changed")
	}
	if !exists(srv + "/data" + ".mesh-before-restore/PG_VERSION") {
		t.Fatal("the data as it was before the restore is not kept aside")
	}
	server = n[1].h.containerID("postgres.server")
	if out := n[2].meshFails("restore", "postgres", "--snapshot", "deadbeef"); !strings.Contains(out, "has no snapshot deadbeef") {
		t.Fatalf("a snapshot that is not there: %s", out)
	}
	if id := n[1].h.containerID("postgres.server"); id != server {
		t.Fatal("a refused restore stopped the server")
	}

	// Scheduled: every 15s, twice; keep: prunes.
	text, err := os.ReadFile(pgFile)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(text), "schedule: daily") {
		t.Fatal("examples/postgres.yaml no longer backs up daily; mend the bed")
	}
	fast := filepath.Join(dir, "postgres.yaml")
	os.WriteFile(fast, []byte(strings.Replace(string(text), "schedule: daily", "schedule: every 15s", 1)), 0o644)
	n[1].mesh("module", "add", fast)
	var first time.Time
	eventually(t, 2*time.Minute, "two scheduled backups", func() (bool, string) {
		var st api.Status
		json.Unmarshal([]byte(n[3].mesh("status", "--json")), &st)
		for _, nd := range st.Nodes {
			if nd.Name != "n1" || nd.Report == nil {
				continue
			}
			for _, b := range nd.Report.Backups {
				if b.Module != "postgres" || b.By != "schedule" || !b.OK {
					continue
				}
				if first.IsZero() {
					first = b.Last
				}
				return b.Last.After(first), b.Last.String()
			}
		}
		return false, "no scheduled backup yet"
	})
	snaps = nil
	if err := json.Unmarshal([]byte(n[2].mesh("backup", "list", "postgres", "--json")), &snaps); err != nil || len(snaps) != 1 {
		t.Fatalf("keep: daily 7, weekly 4 on one day keeps one snapshot: %v %+v", err, snaps)
	}
	n[1].mesh("module", "add", pgFile)
}
