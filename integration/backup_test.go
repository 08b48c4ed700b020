package integration

import (
	"crypto/sha256"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"mesh/cluster/api"
	"mesh/internal/testutil"
	"mesh/state"
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
//   - a restore cut by a kill -9 of n1's agent while restic writes the
//     copy: n1 starts again with the module whole, nothing of the cut
//     restore is left, and the next restore works;
//   - the schedule shortened to every 15s: two scheduled backups run, and
//     keep: (daily 7, weekly 4, all in one day) prunes the older ones.
//
// It returns the repository it set, and its password's file.
func checkBackups(t *testing.T, n []*agent, pgFile string) (repo, pw string) {
	shadow := func() [32]byte { b, _ := os.ReadFile("/etc/shadow"); return sha256.Sum256(b) }
	shadowBefore := shadow()
	dir := t.TempDir()
	repo = filepath.Join(dir, "repo")
	pw = filepath.Join(dir, "password")
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
	// 100 MB more in a data directory: a restore then takes long enough
	// for the bed to cut it (below).
	big := srv + "/dump/big"
	if out, err := exec.Command("sh", "-c", "head -c 100M /dev/urandom > "+big).CombinedOutput(); err != nil {
		t.Fatalf("%v %s", err, out)
	}

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

	// A restore cut by a kill -9 of n1's agent while restic writes the
	// copy: n1 starts again with the module whole (the data as it was, or
	// restored), nothing of the cut restore left beside its directories,
	// and the next restore works.
	psql("DELETE FROM rows")
	done := make(chan string, 1)
	go func() {
		out, _ := n[2].command("restore", "postgres", "--timeout", "2m", "--data-dir", n[2].n.dir).CombinedOutput()
		done <- string(out)
	}()
	staging := func() []string {
		left, _ := filepath.Glob(srv + "/*.mesh-restoring")
		return left
	}
	for deadline := time.Now().Add(2 * time.Minute); len(staging()) == 0; time.Sleep(5 * time.Millisecond) {
		select {
		case out := <-done:
			t.Fatalf("the restore ended before the bed saw it write its copy (make the data larger):\n%s", out)
		default:
		}
		if time.Now().After(deadline) {
			t.Fatal("the restore wrote no copy in 2 minutes")
		}
	}
	n[1].kill9()
	select {
	case out := <-done:
		t.Logf("the restore cut by the kill: %s", strings.TrimSpace(out))
	case <-time.After(3 * time.Minute):
		t.Fatal("mesh restore did not end once n1's agent was killed")
	}
	n[1].start()
	eventually(t, 2*time.Minute, "postgres answers on n1 after the cut restore, whole", func() (bool, string) {
		out, err := n[1].h.podmanCmd("exec", "postgres.server", "psql", "-h", "/var/run/postgresql", "-U", "postgres", "-Atc", "SELECT count(*) FROM rows").CombinedOutput()
		c := strings.TrimSpace(string(out))
		return err == nil && (c == "0" || c == "10000"), c
	})
	if left := staging(); len(left) != 0 {
		var said []string
		for _, l := range strings.Split(n[1].log(), "\n") {
			if strings.Contains(l, "restore") {
				said = append(said, l)
			}
		}
		t.Fatalf("the cut restore left %v on n1; n1's log on restores:\n%s", left, strings.Join(said, "\n"))
	}
	out = n[2].mesh("restore", "postgres", "--timeout", "5m")
	if !strings.Contains(out, "restored /srv/postgres/data") || !strings.Contains(out, "healthy: postgres.server") {
		t.Fatalf("mesh restore after a cut one: %s", out)
	}
	// At once: the restore waited for the restored server's health
	// check, not an earlier one's (the server the restart created just
	// before passed for it, while the restored data still started).
	if c := psql("SELECT count(*) FROM rows"); c != "10000" {
		t.Fatalf("after the restore that followed a cut one: %s rows", c)
	}

	// A sparse file the server's container makes, of several times what
	// the node's disk holds: restic would read its holes for hours with
	// the node held. The backup stops at once, says why and where to
	// look; without the file the next ones run (the schedule below).
	var fsst syscall.Statfs_t
	if err := syscall.Statfs(n[1].h.dir+"/srv", &fsst); err != nil {
		t.Fatal(err)
	}
	holeSize := 4*fsst.Blocks*uint64(fsst.Bsize) + 2<<40
	if out, err := n[1].h.podmanCmd("exec", "postgres.server", "truncate", "-s", strconv.FormatUint(holeSize, 10), "/var/lib/postgresql/data/hole").CombinedOutput(); err != nil {
		t.Fatalf("make a sparse file of %d bytes in postgres's data (its filesystem must take one): %v %s", holeSize, err, out)
	}
	out = n[3].meshFails("backup", "postgres")
	if !strings.Contains(out, "stopped: it was to read") || !strings.Contains(out, "find '/srv/postgres/data'") {
		t.Fatalf("a backup of a sparse file several times the disk: %s", out)
	}
	eventually(t, 30*time.Second, "status says why the backup failed", func() (bool, string) {
		st := n[3].mesh("status")
		return strings.Contains(st, "error: backup of postgres failed") && strings.Contains(st, "it was to read"), st
	})
	n[1].h.podman("exec", "postgres.server", "rm", "/var/lib/postgresql/data/hole")

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
	return repo, pw
}

// roomTest is a module of one data directory and no container: what a
// restore of it writes is all the bed's.
const roomTest = `module: roomtest
resources:
  - directory: /srv/roomtest/data
    mode: "0700"
    data: true
`

// checkRestoreRoom: a restore whose copy would leave the filesystem of its
// data directories under the 1 GiB a node keeps free is refused before
// anything is written or stopped, saying how much it needs and what to
// free. n1's /srv/roomtest is a filesystem of 1,100 MiB (in n1's mount
// namespace) holding 100 MiB of data: the copy would leave 900 MiB.
func checkRestoreRoom(t *testing.T, n []*agent) {
	inN1 := func(args ...string) *exec.Cmd {
		return exec.Command("nsenter", append([]string{"--mount=" + filepath.Join(multiMnt, n[1].h.netns)}, args...)...)
	}
	if err := os.MkdirAll(n[1].h.dir+"/srv/roomtest", 0o755); err != nil {
		t.Fatal(err)
	}
	if out, err := inN1("mount", "-t", "tmpfs", "-o", "size=1100m", "bed-restore-room", "/srv/roomtest").CombinedOutput(); err != nil {
		t.Fatalf("mount a small filesystem at n1's /srv/roomtest: %v %s", err, out)
	}
	defer func() { inN1("umount", "/srv/roomtest").Run(); os.Remove(n[1].h.dir + "/srv/roomtest") }()
	file := filepath.Join(t.TempDir(), "roomtest.yaml")
	os.WriteFile(file, []byte(roomTest), 0o644)
	n[1].mesh("module", "add", file)
	n[1].mesh("assign", "n1", "roomtest", "--wait")
	sumOf := func() string {
		out, err := inN1("sha256sum", "/srv/roomtest/data/big").CombinedOutput()
		if err != nil {
			t.Fatalf("read n1's /srv/roomtest/data/big: %v %s", err, out)
		}
		return strings.Fields(string(out))[0]
	}
	if out, err := inN1("sh", "-c", "head -c 100M /dev/urandom > /srv/roomtest/data/big").CombinedOutput(); err != nil {
		t.Fatalf("write n1's /srv/roomtest/data/big: %v %s", err, out)
	}
	before := sumOf()
	if out := n[2].mesh("backup", "roomtest"); !strings.Contains(out, "roomtest on n1: snapshot ") {
		t.Fatalf("mesh backup roomtest: %s", out)
	}
	out := n[2].meshFails("restore", "roomtest", "--timeout", "2m")
	if !strings.Contains(out, "nothing was restored (the module was not stopped)") || !strings.Contains(out, "not enough room for the copy on n1") ||
		!strings.Contains(out, "a copy of 100.0 MiB") || !strings.Contains(out, "restore again") {
		t.Fatalf("a restore without the room for its copy: %s", out)
	}
	if ls, err := inN1("ls", "-A", "/srv/roomtest").CombinedOutput(); err != nil || strings.TrimSpace(string(ls)) != "data" {
		t.Fatalf("the refused restore left something beside the data: %v %q", err, ls)
	}
	if sumOf() != before {
		t.Fatal("the refused restore changed the data")
	}
	n[1].mesh("unassign", "n1", "roomtest", "--purge-data", "--yes", "--wait")
	n[1].mesh("module", "remove", "roomtest")
}

// gateTest is a module of one data directory (no pause: its backup lets
// the node's applies go on) with a secret's file in it; gateConf adds a
// file outside the data directory.
const gateTest = `module: gate
resources:
  - directory: /srv/gate
  - directory: /srv/gate/data
    mode: "0700"
    data: true
  - secret: /srv/gate/data/token
    name: token
  - container: gate.server
    image: docker.io/library/busybox:1.35
    command: ["sh", "-c", "while true; do sleep 1; done"]
    health:
      command: ["true"]
      interval: 1s
      retries: 2
`

const gateConf = gateTest + `  - file: /srv/gate/conf.txt
    content: "conf\n"
`

// gatedRestic stands for restic (RESTIC) on n1's PATH: while the bed's
// gate (GATE) is armed, a backup waits (the file waiting says so) until
// the gate opens, then the real restic runs.
const gatedRestic = `#!/bin/sh
if [ "$1" = backup ] && [ -e GATE/armed ]; then
	: > GATE/waiting
	while [ ! -e GATE/open ]; do sleep 0.1; done
fi
exec RESTIC "$@"
`

// checkBackupLetsAppliesGoOn: a backup of a module that does not pause its
// containers holds n1 only while it lists what to leave out. While restic
// reads (held at the gate, deterministically), n1 applies a change of the
// module (a file outside its data directory, `module add --wait` within a
// minute), and the rotation of the secret whose file is in the data
// directory waits at it (said in n1's log) until restic has read: neither
// the new value nor a temporary file beside it is in the snapshot, which
// holds the module's data. Before, the node was held throughout: the
// first change waited out its --timeout.
func checkBackupLetsAppliesGoOn(t *testing.T, n []*agent, repo, pw string) {
	realRestic, err := exec.LookPath("restic")
	if err != nil {
		t.Fatal(err)
	}
	gate := filepath.Join(n[1].h.dir, "gate")
	os.MkdirAll(gate, 0o755)
	script := strings.NewReplacer("GATE", gate, "RESTIC", realRestic).Replace(gatedRestic)
	if err := os.WriteFile(filepath.Join(gate, "restic"), []byte(script), 0o755); err != nil {
		t.Fatal(err)
	}
	n[1].stop()
	n[1].env = append(slices.Clone(n[1].env), "PATH="+gate+":"+os.Getenv("PATH"))
	n[1].start()
	defer func() {
		// A failure must not leave a backup waiting; n1 keeps the
		// wrapper, which lets every later backup through.
		os.WriteFile(filepath.Join(gate, "open"), nil, 0o644)
		os.Remove(filepath.Join(gate, "armed"))
	}()
	file := filepath.Join(t.TempDir(), "gate.yaml")
	os.WriteFile(file, []byte(gateTest), 0o644)
	n[1].mesh("module", "add", file)
	n[1].mesh("assign", "n1", "gate") // it waits for its secret
	if out, err := setSecret(t, n[2], []byte("first-token"), "gate", "token"); err != nil {
		t.Fatalf("secret set gate token: %v %s", err, out)
	}
	srv := n[1].h.dir + "/srv/gate"
	holds := func(p, want string) func() (bool, string) {
		return func() (bool, string) {
			b, err := os.ReadFile(p)
			var said []string // n1's lines of gate, to say why
			for _, l := range strings.Split(n[1].log(), "\n") {
				if strings.Contains(l, "gate") {
					said = append(said, l)
				}
			}
			return err == nil && string(b) == want, fmt.Sprintf("%q %v; n1 said:\n%s", b, err, strings.Join(said[max(0, len(said)-8):], "\n"))
		}
	}
	eventually(t, 60*time.Second, "n1 writes the token", holds(srv+"/data/token", "first-token"))
	os.WriteFile(srv+"/data/rows", []byte("the module's data\n"), 0o600)
	// gateHealth is what n1 last reported of gate: its failure (a wait)
	// and the health of gate.server.
	gateHealth := func() (*state.ModuleFailure, *state.ContainerHealth, string) {
		var st api.Status
		out := n[1].mesh("status", "--json")
		json.Unmarshal([]byte(out), &st)
		for _, nd := range st.Nodes {
			if nd.Name != "n1" || nd.Report == nil {
				continue
			}
			var h *state.ContainerHealth
			for i := range nd.Report.Health {
				if nd.Report.Health[i].Container == "gate.server" {
					h = &nd.Report.Health[i]
				}
			}
			return nd.Report.Failed("gate"), h, fmt.Sprintf("failures %+v health %+v", nd.Report.Failures, nd.Report.Health)
		}
		return nil, nil, out
	}
	eventually(t, 60*time.Second, "gate.server healthy", func() (bool, string) {
		f, h, out := gateHealth()
		return f == nil && h != nil && h.Status == state.HealthHealthy, out
	})

	os.WriteFile(filepath.Join(gate, "armed"), nil, 0o644)
	backup := n[2].command("backup", "gate", "--data-dir", n[2].n.dir)
	var out testutil.Log // written by the command while the test reads it
	backup.Stdout, backup.Stderr = &out, &out
	if err := backup.Start(); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- backup.Wait() }()
	defer func() {
		os.WriteFile(filepath.Join(gate, "open"), nil, 0o644)
		select {
		case <-done:
		case <-time.After(2 * time.Minute):
			backup.Process.Kill()
		}
	}()
	eventually(t, 60*time.Second, "n1's restic waits at the gate", func() (bool, string) {
		return exists(filepath.Join(gate, "waiting")), out.String()
	})

	// While restic reads: a change of the module applies; the rotation of
	// the secret in the data directory waits.
	os.WriteFile(file, []byte(gateConf), 0o644)
	n[1].mesh("module", "add", file, "--wait", "--timeout", "60s")
	if b, err := os.ReadFile(srv + "/conf.txt"); err != nil || string(b) != "conf\n" {
		t.Fatalf("the change applied while the backup reads: %q %v", b, err)
	}
	at := n[1].logLen()
	rotatedAt := time.Now()
	if o, err := setSecret(t, n[2], []byte("rotated-token"), "gate", "token"); err != nil {
		t.Fatalf("secret set gate token (rotated): %v %s", err, o)
	}
	eventually(t, 60*time.Second, "n1 says the token waits for the backup", func() (bool, string) {
		for _, l := range n[1].linesAfter(at) {
			if strings.Contains(l, "a secret's file waits for the backup that reads its directory") && strings.Contains(l, "/srv/gate/data/token") {
				return true, l
			}
		}
		return false, lastLines(n[1].log(), 5)
	})
	if b, _ := os.ReadFile(srv + "/data/token"); string(b) != "first-token" {
		t.Fatalf("the secret's file changed while restic read its directory: %q", b)
	}
	// gate's container runs on through the wait, followed as before (its
	// health reported, not begun again), and the wait says it runs: a
	// health gate on gate elsewhere stays open.
	eventually(t, 30*time.Second, "n1 reports gate.server healthy while the token waits, and the wait running", func() (bool, string) {
		f, h, out := gateHealth()
		return f != nil && f.Backup == "gate" && f.Running && h != nil && h.Status == state.HealthHealthy && h.Since.Before(rotatedAt), out
	})
	// The rest of n1 goes on meanwhile: another module is assigned there
	// and applied (the apply once waited at the token, holding every
	// change of the node for as long as restic read).
	bystander := filepath.Join(t.TempDir(), "bystander.yaml")
	os.WriteFile(bystander, []byte(bystanderModule), 0o644)
	n[1].mesh("module", "add", bystander)
	if o, err := n[1].try("assign", "n1", "bystander", "--wait", "--timeout", "60s", "--data-dir", n[1].n.dir); err != nil || !strings.Contains(string(o), "other modules there wait") {
		t.Fatalf("assign n1 bystander while the token waits for the backup: %v\n%s", err, o)
	}
	if b, err := os.ReadFile(n[1].h.dir + "/srv/bystander/hello.txt"); err != nil || string(b) != "hello\n" {
		t.Fatalf("bystander's file while the token waits for the backup: %q %v", b, err)
	}
	if st := n[1].mesh("status"); !strings.Contains(st, "waiting") || !strings.Contains(st, "the backup of gate reads") {
		t.Fatalf("mesh status while the token waits for the backup:\n%s", st)
	}
	if left, _ := filepath.Glob(srv + "/data/.*"); len(left) > 0 {
		t.Fatalf("written beside the secret's file while restic read: %v", left)
	}
	select {
	case err := <-done:
		t.Fatalf("the backup ended before its gate opened: %v\n%s", err, out.String())
	default:
	}

	os.WriteFile(filepath.Join(gate, "open"), nil, 0o644)
	select {
	case err := <-done:
		if err != nil || !strings.Contains(out.String(), "gate on n1: snapshot ") {
			t.Fatalf("mesh backup gate: %v\n%s", err, out.String())
		}
	case <-time.After(2 * time.Minute):
		t.Fatalf("mesh backup gate did not end after its gate opened:\n%s", out.String())
	}
	eventually(t, 60*time.Second, "the rotated token written once restic has read", holds(srv+"/data/token", "rotated-token"))
	ls := exec.Command(realRestic, "-r", repo, "--password-file", pw, "--no-cache", "ls", "latest", "--tag", "module=gate")
	listing, err := ls.CombinedOutput()
	if err != nil || !strings.Contains(string(listing), "/srv/gate/data/rows") {
		t.Fatalf("restic ls of the gate's snapshot: %v\n%s", err, listing)
	}
	if strings.Contains(string(listing), "token") {
		t.Fatalf("a secret's file is in the snapshot:\n%s", listing)
	}
	n[1].mesh("unassign", "n1", "gate", "--purge-data", "--yes", "--wait")
	n[2].mesh("secret", "rm", "gate", "token")
	n[1].mesh("module", "remove", "gate")
	n[1].mesh("unassign", "n1", "bystander", "--wait")
	n[1].mesh("module", "remove", "bystander")
}

// bystanderModule is a module of n1 that is not backed up.
const bystanderModule = `module: bystander
resources:
  - directory: /srv/bystander
  - file: /srv/bystander/hello.txt
    content: "hello\n"
`
