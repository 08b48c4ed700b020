package integration

import (
	"crypto/sha256"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"mesh/cluster"
	"mesh/cluster/api"
	"mesh/state"
)

// kill9 kills the agent's process group at once (kill -9), as a crash.
func (a *agent) kill9() {
	exec.Command("pkill", "-KILL", "-f", "mesh agent --data-dir "+a.n.dir).Run()
	if a.cmd != nil {
		a.cmd.Wait()
		a.cmd = nil
	}
}

// moves is what the state says of module's move.
func moveOf(t *testing.T, a *agent, module string) *state.MoveInfo {
	t.Helper()
	var st api.Status
	if err := json.Unmarshal([]byte(a.mesh("status", "--json")), &st); err != nil {
		t.Fatal(err)
	}
	for i := range st.Moves {
		if st.Moves[i].Module == module {
			return &st.Moves[i]
		}
	}
	return nil
}

// runsOn lists the nodes whose Podman runs postgres.server.
func runsOn(n []*agent, name string) []string {
	var out []string
	for _, a := range n[1:] {
		if a.h.containerID(name) != "" {
			out = append(out, a.name)
		}
	}
	return out
}

// checkMove is issue 30, item 4, on the examples bed after checkBackups
// (postgres on n1 with its 10,000 rows, and its planted link):
//
//   - the consumer (postgres-exporter) on n3, bound to n1;
//   - mesh move --dry-run says what it would copy and changes nothing;
//   - mesh move postgres n1 n2 from n3: the rows are on n2, the link is a
//     link, the superuser-password step did not run on n2, the consumer's
//     binding points at n2 and its metrics show the database; n1 keeps its
//     copy (status says so) until mesh move --finish, which removes it;
//   - back to n1 with a 500 MB file added, TO's agent (n1) killed -9 in the
//     middle of the copy and then FROM's (n2) in the next: the move ends on
//     n1, complete (rows, file digest), never on both nodes at once;
//   - a move to a node that cannot start it (the image missing there) is
//     aborted and the module runs on FROM again, as before.
func checkMove(t *testing.T, n []*agent) {
	shadow := func() [32]byte { b, _ := os.ReadFile("/etc/shadow"); return sha256.Sum256(b) }
	shadowBefore := shadow()
	psql := func(on *agent, sql string) string {
		t.Helper()
		out, err := on.h.podmanCmd("exec", "postgres.server", "psql", "-h", "/var/run/postgresql", "-U", "postgres", "-Atc", sql).CombinedOutput()
		if err != nil {
			t.Fatalf("psql on %s %q: %v\n%s", on.name, sql, err, out)
		}
		return strings.TrimSpace(string(out))
	}
	metrics := func() (string, error) {
		out, err := n[3].h.podmanCmd("exec", "postgres-exporter.server", "wget", "-qO-", "http://127.0.0.1:9187/metrics").CombinedOutput()
		return string(out), err
	}
	n[1].mesh("assign", "n3", "postgres-exporter", "--wait")
	eventually(t, 60*time.Second, "the exporter on n3 reads postgres on n1", func() (bool, string) {
		out, err := metrics()
		return err == nil && pgUp.MatchString(out) && migrated.MatchString(out), lastLines(out, 3) + errString(err)
	})
	binding := n[3].h.dir + "/srv/postgres-exporter/db.binding"
	if b, _ := os.ReadFile(binding); !strings.Contains(string(b), n[1].addr()) && !strings.Contains(string(b), n[1].oaddr()) {
		t.Fatalf("the binding does not point at n1: %s", b)
	}

	server := n[1].h.containerID("postgres.server")
	out := n[2].mesh("move", "postgres", "n1", "n2", "--dry-run")
	if !strings.Contains(out, "would copy /srv/postgres/data, /srv/postgres/secrets, /srv/postgres/dump from n1 to n2") || !strings.Contains(out, "nothing was written") {
		t.Fatalf("move --dry-run: %s", out)
	}
	if id := n[1].h.containerID("postgres.server"); id != server || moveOf(t, n[1], "postgres") != nil {
		t.Fatal("a dry run changed something")
	}

	began := time.Now()
	n2log := n[2].logLen()
	out = n[3].mesh("move", "postgres", "n1", "n2", "--timeout", "10m")
	if !strings.Contains(out, "moved postgres to n2; n1 keeps its copy") {
		t.Fatalf("mesh move: %s", out)
	}
	t.Logf("mesh move postgres n1 n2: %s", time.Since(began).Round(100*time.Millisecond))
	if c := psql(n[2], "SELECT count(*) FROM rows"); c != "10000" {
		t.Fatalf("on n2 after the move: %s rows", c)
	}
	if l, err := os.Readlink(n[2].h.dir + "/srv/postgres/data/shadow-link"); err != nil || l != "/etc/shadow" {
		t.Fatalf("the planted link on n2: %q %v", l, err)
	}
	if on := runsOn(n, "postgres.server"); len(on) != 1 || on[0] != "n2" {
		t.Fatalf("postgres.server runs on %v", on)
	}
	// The step's marker travelled: n2 did not run it (an apply logs each
	// step it runs: "updated postgres.superuser-password (postgres): ran").
	after := strings.Join(n[2].linesAfter(n2log), "\n")
	if !strings.Contains(after, "updated postgres.server (postgres): created") {
		t.Fatalf("n2's log does not show postgres.server created (the check below would prove nothing):\n%s", after)
	}
	if strings.Contains(after, "postgres.superuser-password (postgres): ran") {
		t.Fatalf("the superuser-password step ran again on n2 (its marker did not travel):\n%s", after)
	}
	eventually(t, 90*time.Second, "the exporter on n3 reads postgres on n2", func() (bool, string) {
		b, _ := os.ReadFile(binding)
		out, err := metrics()
		onN2 := strings.Contains(string(b), n[2].addr()) || strings.Contains(string(b), n[2].oaddr())
		return onN2 && err == nil && pgUp.MatchString(out), string(b) + lastLines(out, 3) + errString(err)
	})
	if !exists(n[1].h.dir + "/srv/postgres/data/PG_VERSION") {
		t.Fatal("n1 did not keep its copy")
	}
	if st := n[1].mesh("status"); !strings.Contains(st, "n1 keeps its copy of /srv/postgres/data") {
		t.Fatalf("status does not report the copy n1 keeps: %s", st)
	}
	// A purge of n2's copy is refused while n1 keeps its own: an assign
	// on n2 again and a finish would leave none.
	out = n[1].meshFails("unassign", "n2", "postgres", "--purge-data", "--yes")
	if !strings.Contains(out, "mesh move --finish postgres first") {
		t.Fatalf("unassign n2 postgres --purge-data while n1 keeps its copy:\n%s", out)
	}
	if on := runsOn(n, "postgres.server"); len(on) != 1 || on[0] != "n2" {
		t.Fatalf("after the refused purge, postgres.server runs on %v", on)
	}
	// The copy a restore kept on n1 (checkBackups) goes with it: it is
	// the module's data as it was.
	before := n[1].h.dir + "/srv/postgres/data.mesh-before-restore"
	if !exists(before + "/PG_VERSION") {
		t.Fatal("n1 keeps no copy of a restore before the finish (checkBackups restored there); mend the bed")
	}
	n[1].mesh("move", "--finish", "postgres")
	eventually(t, 60*time.Second, "n1 removes its copy, and the one its last restore kept", func() (bool, string) {
		return !exists(n[1].h.dir+"/srv/postgres/data") && !exists(before), ""
	})

	// Back to n1, cut by two kills; 500 MB more to copy.
	big := n[2].h.dir + "/srv/postgres/dump/big"
	if out, err := exec.Command("sh", "-c", "head -c 500M /dev/urandom > "+big).CombinedOutput(); err != nil {
		t.Fatalf("%v %s", err, out)
	}
	sum := func(p string) [32]byte { b, _ := os.ReadFile(p); return sha256.Sum256(b) }
	bigSum := sum(big)
	done := make(chan string, 1)
	go func() {
		out, _ := n[3].command("move", "postgres", "n2", "n1", "--timeout", "10m", "--data-dir", n[3].n.dir).CombinedOutput()
		done <- string(out)
	}()
	staging := n[1].h.dir + "/srv/postgres/dump.mesh-moving"
	eventually(t, 60*time.Second, "the copy to n1 has begun", func() (bool, string) { return exists(staging), "" })
	// A member that is not the move's FROM sends nothing to TO.
	id := moveOf(t, n[3], "postgres").ID
	cert := filepath.Join(t.TempDir(), "n3.crt")
	crt, _ := os.ReadFile(n[3].n.dir + "/node.crt")
	ca, _ := os.ReadFile(n[3].n.dir + "/ca.crt")
	os.WriteFile(cert, append(crt, ca...), 0o600)
	forged := inNetns(n[3].h.netns, exec.Command("curl", "-sk", "--http1.1", "--max-time", "10", "--cert", cert, "--key", n[3].n.dir+"/node.key",
		"-X", "POST", "--data-binary", "mesh datacopy 1\n", "-w", "%{http_code}", fmt.Sprintf("https://%s:%d/v1/op/move/receive?module=postgres&id=%d", n[1].addr(), cluster.DefaultPort, id)))
	if out, _ := forged.Output(); !strings.HasSuffix(strings.TrimSpace(string(out)), "403") || !strings.Contains(string(out), "comes from n2, not from n3") {
		t.Fatalf("n3 sent a copy of n2's move to n1: %s", out)
	}
	n[1].kill9()
	if on := runsOn(n, "postgres.server"); len(on) != 0 {
		t.Fatalf("during the copy postgres.server runs on %v", on)
	}
	// What the cut copy left is marked: a new copy begins without it.
	cut := staging + "/.bed-cut-copy"
	if err := os.WriteFile(cut, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	n[1].start()
	eventually(t, 90*time.Second, "the copy to n1 begins again", func() (bool, string) { return exists(staging) && !exists(cut), "" })
	n[2].kill9()
	n[2].start()
	var final string
	select {
	case final = <-done:
	case <-time.After(5 * time.Minute):
		t.Fatal("mesh move n2 n1 did not end")
	}
	if !strings.Contains(final, "moved postgres to n1") {
		t.Fatalf("the move cut by two kills: %s\n%s", final, n[2].log())
	}
	if on := runsOn(n, "postgres.server"); len(on) != 1 || on[0] != "n1" {
		t.Fatalf("after the move postgres.server runs on %v", on)
	}
	if c := psql(n[1], "SELECT count(*) FROM rows"); c != "10000" {
		t.Fatalf("on n1 after the move: %s rows", c)
	}
	if sum(n[1].h.dir+"/srv/postgres/dump/big") != bigSum {
		t.Fatal("the 500 MB file differs on n1")
	}
	// The step's marker travelled though n2 restarted under the move (its
	// first apply, of the plan that holds postgres stopped, forgot the
	// step's run, and the copy sent again carried none: n1 ran it again).
	// n1's log since its restart, under the copy, holds its start.
	after = strings.Join(n[1].linesAfter(0), "\n")
	if !strings.Contains(after, "updated postgres.server (postgres): created") {
		t.Fatalf("n1's log does not show postgres.server created (the check below would prove nothing):\n%s", after)
	}
	if strings.Contains(after, "postgres.superuser-password (postgres): ran") {
		t.Fatalf("the superuser-password step ran again on n1 (its marker did not travel with the copy sent again):\n%s", after)
	}
	if exists(staging) {
		t.Fatal("a staging directory is left on n1")
	}
	n[1].mesh("move", "--finish", "postgres")

	// A TO without the room for the copy refuses it before anything is
	// written, by the size FROM announces, and the move is aborted at
	// once (a try again would fill its disk again): here n3's
	// /srv/postgres, where the copy would be written, is a filesystem of
	// 1,200 MiB, over the 1 GiB a node keeps free but not over that and
	// the 500 MB file alone of postgres's data.
	// Mounted in n3's mount namespace, where its /srv is its own.
	room := n[3].h.dir + "/srv/postgres"
	if err := os.MkdirAll(room, 0o755); err != nil {
		t.Fatal(err)
	}
	inN3 := func(args ...string) *exec.Cmd {
		return exec.Command("nsenter", append([]string{"--mount=" + filepath.Join(multiMnt, n[3].h.netns)}, args...)...)
	}
	if out, err := inN3("mount", "-t", "tmpfs", "-o", "size=1200m", "bed-move-room", "/srv/postgres").CombinedOutput(); err != nil {
		t.Fatalf("mount a small filesystem at n3's /srv/postgres: %v %s", err, out)
	}
	unmount := func() { inN3("umount", "/srv/postgres").Run(); os.Remove(room) }
	defer unmount()
	if out, err := inN3("findmnt", "-n", "-o", "SIZE", "/srv/postgres").CombinedOutput(); err != nil || !strings.Contains(string(out), "1.2G") {
		t.Fatalf("n3's /srv/postgres is not the small filesystem: %v %s", err, out)
	}
	out = n[3].meshFails("move", "postgres", "n1", "n3", "--timeout", "2m")
	if !strings.Contains(out, "was aborted; it runs on n1 again") || !strings.Contains(out, "not enough room for the copy on n3") || strings.Contains(out, "what is left") {
		t.Fatalf("a move to a node without the room for the copy: %s", out)
	}
	if ls, err := inN3("ls", "-A", "/srv/postgres").CombinedOutput(); err != nil || len(strings.TrimSpace(string(ls))) != 0 {
		t.Fatalf("the refused copy wrote into n3's /srv/postgres: %v %s", err, ls)
	}
	eventually(t, 90*time.Second, "postgres back on n1", func() (bool, string) {
		on := runsOn(n, "postgres.server")
		return len(on) == 1 && on[0] == "n1", strings.Join(on, ",")
	})
	unmount()

	// A TO that cannot start it: the abort puts it back on FROM.
	n[3].h.podman("rmi", "-f", "docker.io/library/postgres:15")
	server = n[1].h.containerID("postgres.server")
	out = n[3].meshFails("move", "postgres", "n1", "n3", "--timeout", "5m")
	if !strings.Contains(out, "was aborted; it runs on n1 again") {
		t.Fatalf("a move to a node without the image: %s", out)
	}
	eventually(t, 90*time.Second, "postgres back on n1 with its rows", func() (bool, string) {
		on := runsOn(n, "postgres.server")
		return len(on) == 1 && on[0] == "n1", strings.Join(on, ",")
	})
	eventually(t, 60*time.Second, "n1's postgres answers", func() (bool, string) {
		out, err := n[1].h.podmanCmd("exec", "postgres.server", "psql", "-h", "/var/run/postgresql", "-U", "postgres", "-Atc", "SELECT count(*) FROM rows").CombinedOutput()
		return err == nil && strings.TrimSpace(string(out)) == "10000", string(out)
	})
	if st := n[1].mesh("status"); !strings.Contains(st, "error: the move of postgres from n1 to n3 was aborted") {
		t.Fatalf("status does not say the move was aborted: %s", st)
	}
	if shadow() != shadowBefore {
		t.Fatal("/etc/shadow changed")
	}
	_ = server
	// n3 gets the image back, for the beds after this one.
	img := filepath.Join(t.TempDir(), "postgres.tar")
	n[1].h.podman("save", "-q", "-o", img, "docker.io/library/postgres:15")
	n[3].h.podman("load", "-q", "-i", img)
}
