package integration

import (
	"crypto/sha256"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// A module whose container writes its data, and plants a link to the
// host's /etc/shadow in it, as a hostile one would.
const bedData = `module: beddata
resources:
  - directory: {{root}}/beddata
    owner: "0:0"
    mode: "0755"
  - directory: {{root}}/beddata/data
    owner: "1000:1000"
    mode: "0750"
    data: true
  # A nightly dump, here every 10s: it appends a line each run.
  - step: stamp
    image: localhost/mesh-bed-busybox:1
    command: ["sh", "-c", "date +%s >> /data/stamps"]
    mounts: ["{{root}}/beddata/data:/data"]
    schedule: every 10s
  - container: beddata.db
    image: localhost/mesh-bed-busybox:1
    command: ["sh", "-c", "echo precious > /data/db; mkdir -p /data/a/b; echo x > /data/a/b/c; ln -sf /etc/shadow /data/shadow-link; while true; do sleep 1; done"]
    mounts: ["{{root}}/beddata/data:/data"]
    restart-on: [stamp]
`

// checkData is issue 30, item 1, on a real host (rootful and rootless): a
// data directory is kept when its module goes, even as the mesh would
// remove any other; mesh unassign --purge-data asks first (refusing without
// a terminal or --yes, changing nothing), then removes it with all it
// holds once the container is gone, following no link.
func checkData(t testing.TB, a *agent) {
	srv := filepath.Join(a.h.dir, "srv")
	data := srv + "/beddata/data"
	shadow := func() [32]byte { b, _ := os.ReadFile("/etc/shadow"); return sha256.Sum256(b) }
	before := shadow()
	a.mesh("module", "add", a.manifest("beddata", bedData, nil))
	a.mesh("assign", "ace", "beddata", "--wait")
	eventually(t, 20*time.Second, "beddata.db wrote its data and its link", func() (bool, string) {
		_, err := os.Lstat(data + "/shadow-link")
		return exists(data+"/db") && err == nil, errString(err)
	})
	// Issue 30, item 3: the scheduled step runs again at its slots, and
	// the container that names it (restart-on) is not recreated.
	db := a.h.containerID("beddata.db")
	eventually(t, 60*time.Second, "the scheduled step ran three times", func() (bool, string) {
		b, _ := os.ReadFile(data + "/stamps")
		return strings.Count(string(b), "\n") >= 3, string(b)
	})
	if id := a.h.containerID("beddata.db"); id != db {
		t.Fatalf("a scheduled run recreated the container that names the step (%s -> %s)", db, id)
	}
	eventually(t, 20*time.Second, "status shows the scheduled step's runs", func() (bool, string) {
		st := a.mesh("status")
		return strings.Contains(st, "scheduled step stamp (beddata) ran at"), st
	})
	a.mesh("unassign", "ace", "beddata", "--wait")
	if o, r := a.outcome(data); o != "kept" || !strings.Contains(r, "a data directory of beddata: the mesh never removes one") {
		t.Fatalf("the data directory after unassign: %s; %s", o, r)
	}
	if b, err := os.ReadFile(data + "/db"); err != nil || string(b) != "precious\n" {
		t.Fatalf("the data went with the module: %q %v", b, err)
	}
	a.mesh("assign", "ace", "beddata", "--wait")
	// Without a terminal and without --yes: refused, nothing changed.
	out := a.meshFails("unassign", "ace", "beddata", "--purge-data")
	if !strings.Contains(out, data) || !strings.Contains(out, "pass --yes to remove them; nothing was changed") {
		t.Fatalf("--purge-data without --yes:\n%s", out)
	}
	if h := a.h.containerID("beddata.db"); h == "" {
		t.Fatal("a refused --purge-data unassigned the module")
	}
	out = a.mesh("unassign", "ace", "beddata", "--purge-data", "--yes", "--wait")
	if !strings.Contains(out, "--purge-data removes from ace, with everything in them") {
		t.Fatalf("unassign --purge-data --yes:\n%s", out)
	}
	eventually(t, 30*time.Second, "the data directory is purged", func() (bool, string) {
		o, r := a.outcome(data)
		return !exists(data) && o == "removed", o + " " + r
	})
	if _, r := a.outcome(data); !strings.Contains(r, "purged with its") {
		t.Fatalf("the purge's report: %s", r)
	}
	if shadow() != before || !exists("/etc/shadow") {
		t.Fatal("the purge followed the link to /etc/shadow")
	}
	if exists(srv + "/beddata") {
		t.Fatal("the module's directory is left after its data was purged")
	}
	a.mesh("module", "remove", "beddata")
}
