package reconciler

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// fillDisk mounts a small tmpfs on dir and fills it, so every write there
// fails with "no space left on device". The returned func frees it again.
func fillDisk(t *testing.T, dir string) (free func()) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Fatal("this test mounts a small tmpfs: run it as root (contrib/test.sh does)")
	}
	os.MkdirAll(dir, 0o700)
	if out, err := exec.Command("mount", "-t", "tmpfs", "-o", "size=64k", "tmpfs", dir).CombinedOutput(); err != nil {
		t.Fatalf("mount tmpfs: %v %s", err, out)
	}
	t.Cleanup(func() { exec.Command("umount", "-l", dir).Run() })
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
	if o.Outcome != Failed || !strings.Contains(o.Reason, "no space left") {
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
	if o.Outcome == Failed {
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
