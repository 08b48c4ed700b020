package reconciler

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"mesh/internal/testutil"
	"mesh/state"
)

// fillDisk mounts a small tmpfs on dir and fills it, so every write there
// fails with "no space left on device". The returned func frees it again.
func fillDisk(t *testing.T, dir string) (free func()) {
	t.Helper()
	testutil.Tmpfs(t, dir, "size=64k")
	filler := filepath.Join(dir, "filler")
	f, err := os.Create(filler)
	if err != nil {
		t.Fatal(err)
	}
	for buf := make([]byte, 4096); ; {
		if _, err := f.Write(buf); err != nil {
			break
		}
	}
	f.Close()
	if err := os.WriteFile(filepath.Join(dir, "probe"), []byte("x"), 0o600); err == nil {
		t.Fatal("the tmpfs is not full")
	}
	return func() { os.Remove(filler) }
}

const keepTmpl = `module: keep
resources:
  - directory: {{d}}/srv/keep
  - file: {{d}}/srv/keep/conf
    content: "a"
`

// A full disk under the data dir: the ledger cannot record a path, so the
// mesh does not make it, and it does not claim it either. A directory an
// operator then makes there (a mount point, say) is not the mesh's to remove
// when the module goes, even once the disk has room again.
func TestFullDiskClaimsNothing(t *testing.T) {
	h := newHost(t)
	free := fillDisk(t, filepath.Join(h.dir, "data"))
	os.MkdirAll(filepath.Join(h.dir, "srv"), 0o755)
	h.src["keep"] = keepTmpl
	h.assign("keep")
	rep := h.apply()
	o := outcome(rep, h.dir+"/srv/keep")
	if o.Outcome != state.Failed || !strings.Contains(o.Reason, "no space left") {
		t.Fatalf("directory with the ledger's disk full: %+v", o)
	}
	if _, err := os.Stat(filepath.Join(h.dir, "srv/keep")); !os.IsNotExist(err) {
		t.Fatalf("the directory was made though the ledger could not record it: %v", err)
	}
	// The operator makes the directory; space comes back; the module goes.
	if err := os.MkdirAll(filepath.Join(h.dir, "srv/keep"), 0o755); err != nil {
		t.Fatal(err)
	}
	free()
	rep = h.apply()
	o = outcome(rep, h.dir+"/srv/keep")
	if o.Outcome == state.Failed {
		t.Fatalf("directory after space came back: %+v", o)
	}
	h.assign()
	h.apply()
	if _, err := os.Stat(filepath.Join(h.dir, "srv/keep")); err != nil {
		t.Fatalf("the operator's directory was removed with the module: %v", err)
	}
	// And an agent restart reads the same from disk.
	h.open()
	if _, ok := h.r.ledger.Paths[h.dir+"/srv/keep"]; ok {
		t.Fatal("the ledger on disk claims the operator's directory")
	}
}

const migTmpl = `module: mig
resources:
  - step: migrate
    image: localhost/busybox:1
    command: ["true"]
  - container: mig.server
    image: localhost/busybox:1
    restart-on: [migrate]
`

// A step that ran while the ledger's disk was full: its marker is not on
// disk, so its exited container is the only record that it ran. The mesh
// keeps that container until the marker is recorded, so an agent killed in
// the meantime re-attaches to the run instead of running the step again.
func TestFullDiskNeverRerunsAStep(t *testing.T) {
	h := newHost(t)
	free := fillDisk(t, filepath.Join(h.dir, "data"))
	h.src["mig"] = migTmpl
	h.assign("mig")
	runs := 0
	count := func() {
		for _, c := range h.rt.calls {
			if c == "create mig.migrate" {
				runs++
			}
		}
	}
	rep := h.apply()
	count()
	if o := outcome(rep, "mig.migrate"); o.Outcome != state.Failed || !strings.Contains(o.Reason, "marker could not be recorded") {
		t.Fatalf("step with the ledger's disk full: %+v", o)
	}
	h.apply()
	count()
	if h.rt.byName("mig.migrate") == nil {
		t.Fatal("the step's container, the only record that it ran, was removed before its marker was recorded")
	}
	h.open() // the agent is killed and starts again, the disk still full
	h.apply()
	count()
	free()
	rep = h.apply()
	count()
	if o := outcome(rep, "mig.migrate"); o.Outcome == state.Failed {
		t.Fatalf("step once the disk has room: %+v", o)
	}
	h.open()
	rep = h.apply()
	count()
	if o := outcome(rep, "mig.migrate"); o.Outcome != state.Unchanged {
		t.Fatalf("step after a restart: %+v", o)
	}
	if runs != 1 {
		t.Fatalf("the step ran %d times", runs)
	}
	if h.rt.byName("mig.migrate") != nil {
		t.Fatal("the step's container is left once its marker is recorded")
	}
}

// A directory the mesh could not make (its disk has no inode left) is not
// the mesh's: one an operator makes there later stays when the module goes.
func TestDirectoryNotMadeIsNotClaimed(t *testing.T) {
	h := newHost(t)
	srv := filepath.Join(h.dir, "srv")
	testutil.Tmpfs(t, srv, "size=64k,nr_inodes=2")
	for i := 0; ; i++ { // use up the inodes
		if err := os.Mkdir(filepath.Join(srv, fmt.Sprint("fill", i)), 0o755); err != nil {
			break
		}
	}
	h.src["keep"] = keepTmpl
	h.assign("keep")
	rep := h.apply()
	if o := outcome(rep, h.dir+"/srv/keep"); o.Outcome != state.Failed || !strings.Contains(o.Reason, "no space left") {
		t.Fatalf("directory on a disk with no inode left: %+v", o)
	}
	if _, ok := h.r.ledger.Paths[h.dir+"/srv/keep"]; ok {
		t.Fatal("the ledger claims the directory the mesh could not make")
	}
	h.open()
	if _, ok := h.r.ledger.Paths[h.dir+"/srv/keep"]; ok {
		t.Fatal("the ledger on disk claims the directory the mesh could not make")
	}
}
