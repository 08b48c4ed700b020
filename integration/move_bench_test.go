package integration

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// BenchmarkMoveCopy is issue 30's figure for mesh move: 1 GB of a module's
// data (20,000 files of 4 to 28 KiB and 7 of 100 MB, random bytes) moved
// from n1 to n2 by mesh move, beside Debian's rsync in daemon mode copying
// the same tree between the same two namespaces (rsync -aHS --numeric-ids,
// so links, hard links, holes and owners as mesh keeps them), on the same
// disk. mesh's figure is the whole move: stop, copy, digest check on both
// ends, start on TO. Run by bench/move.sh (not in CI: it writes 2 GB).
func BenchmarkMoveCopy(b *testing.B) {
	if _, err := exec.LookPath("rsync"); err != nil {
		b.Fatal("rsync is missing; bench/move.sh installs it")
	}
	n, _ := startThree(b)
	m := n[1].manifest("benchdata", `module: benchdata
resources:
  - directory: /srv/benchdata
    owner: "0:0"
    mode: "0755"
  - directory: /srv/benchdata/data
    owner: "0:0"
    mode: "0700"
    data: true
`, nil)
	n[1].mesh("module", "add", m)
	n[1].mesh("assign", "n1", "benchdata", "--wait")
	src := n[1].h.dir + "/srv/benchdata/data"
	script := fmt.Sprintf(`set -e
head -c 400M /dev/urandom > %[1]s/pool
python3 - %[1]s %[1]s/pool <<'PY'
import os, sys, random
d, pool = sys.argv[1], open(sys.argv[2], 'rb').read()
random.seed(30)
off = 0
for i in range(20000):
    sub = os.path.join(d, "small", "%%03d" %% (i %% 100))
    os.makedirs(sub, exist_ok=True)
    n = random.randint(4, 28) * 1024
    with open(os.path.join(sub, "f%%05d" %% i), "wb") as f:
        f.write(pool[off:off + n])
    off = (off + n) %% (len(pool) - 40000)
PY
rm %[1]s/pool
mkdir -p %[1]s/large
for i in 1 2 3 4 5 6 7; do head -c 100M /dev/urandom > %[1]s/large/l$i; done
sync`, src)
	if out, err := exec.Command("bash", "-c", script).CombinedOutput(); err != nil {
		b.Fatalf("write the data: %v\n%s", err, out)
	}
	du, _ := exec.Command("du", "-sb", src).Output()
	total := strings.Fields(string(du))[0]
	drop := func() { exec.Command("sh", "-c", "sync; echo 3 > /proc/sys/vm/drop_caches").Run() }

	// rsync: a daemon in n2's namespace, the client in n1's.
	rs := b.TempDir()
	dst := filepath.Join(rs, "dst")
	os.MkdirAll(dst, 0o755)
	conf := filepath.Join(rs, "rsyncd.conf")
	os.WriteFile(conf, []byte(fmt.Sprintf("uid = root\ngid = root\nuse chroot = no\npid file = %s/rsyncd.pid\n[bench]\npath = %s\nread only = no\n", rs, dst)), 0o644)
	daemon := exec.Command("ip", "netns", "exec", n[2].h.netns, "rsync", "--daemon", "--no-detach", "--config", conf, "--address", n[2].addr(), "--port", "18730")
	if err := daemon.Start(); err != nil {
		b.Fatal(err)
	}
	defer func() { daemon.Process.Kill(); daemon.Wait() }()
	eventually(b, 10*time.Second, "rsync's daemon listens", func() (bool, string) {
		err := exec.Command("ip", "netns", "exec", n[1].h.netns, "rsync", "rsync://"+n[2].addr()+":18730/").Run()
		return err == nil, errString(err)
	})

	b.ResetTimer()
	var meshTotal, rsyncTotal time.Duration
	for i := 0; i < b.N; i++ {
		drop()
		t0 := time.Now()
		if out := n[3].mesh("move", "benchdata", "n1", "n2", "--timeout", "30m"); !strings.Contains(out, "moved benchdata to n2") {
			b.Fatalf("mesh move: %s", out)
		}
		meshTotal += time.Since(t0)
		b.StopTimer()
		n[3].mesh("move", "--finish", "benchdata")
		n[3].mesh("move", "benchdata", "n2", "n1", "--timeout", "30m")
		n[3].mesh("move", "--finish", "benchdata")
		os.RemoveAll(dst)
		os.MkdirAll(dst, 0o755)
		drop()
		b.StartTimer()
		t0 = time.Now()
		rsync := exec.Command("ip", "netns", "exec", n[1].h.netns, "rsync", "-aHS", "--numeric-ids", src+"/", "rsync://"+n[2].addr()+":18730/bench/")
		if out, err := rsync.CombinedOutput(); err != nil {
			b.Fatalf("rsync: %v\n%s", err, out)
		}
		rsyncTotal += time.Since(t0)
	}
	b.StopTimer()
	mesh, rsync := meshTotal/time.Duration(b.N), rsyncTotal/time.Duration(b.N)
	mb := func(d time.Duration) float64 {
		var n float64
		fmt.Sscan(total, &n)
		return n / (1 << 20) / d.Seconds()
	}
	b.ReportMetric(float64(mesh.Milliseconds()), "mesh_move_ms")
	b.ReportMetric(float64(rsync.Milliseconds()), "rsync_ms")
	b.ReportMetric(mesh.Seconds()/rsync.Seconds(), "ratio")
	b.Logf("%s bytes: mesh move %s (%.0f MiB/s), rsync daemon %s (%.0f MiB/s), ratio %.2f", total, mesh.Round(time.Millisecond), mb(mesh), rsync.Round(time.Millisecond), mb(rsync), mesh.Seconds()/rsync.Seconds())
}
