package agent

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"mesh/agent/overlay"
	"mesh/reconciler"
)

func TestCheckPrivate(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "data")
	if err := checkPrivate(dir); err != nil {
		t.Fatalf("a data dir not made yet: %v", err)
	}
	os.MkdirAll(filepath.Join(dir, "raft"), 0o700)
	os.WriteFile(filepath.Join(dir, "node.key"), []byte("key"), 0o600)
	os.Symlink("/etc/passwd", filepath.Join(dir, "link"))
	if err := checkPrivate(dir); err != nil {
		t.Fatalf("a private data dir: %v", err)
	}
	os.Chmod(filepath.Join(dir, "node.key"), 0o644)
	err := checkPrivate(dir)
	if err == nil || !strings.Contains(err.Error(), "node.key (0644)") || !strings.Contains(err.Error(), "chmod -R go-rwx "+dir) {
		t.Fatalf("a readable key: %v", err)
	}
	os.Chmod(filepath.Join(dir, "node.key"), 0o600)
	os.Chmod(dir, 0o755)
	if err := checkPrivate(dir); err == nil || !strings.Contains(err.Error(), dir+" (0755)") {
		t.Fatalf("a data dir others can enter: %v", err)
	}
	os.Chmod(dir, 0o700)
	os.Chmod(filepath.Join(dir, "raft"), 0o750)
	if err := checkPrivate(dir); err == nil || !strings.Contains(err.Error(), "raft (0750)") {
		t.Fatalf("a group-readable raft dir: %v", err)
	}
}

// The reconciler names each module's bridge with the prefix the modules'
// packet filter matches: apart, a bridge would be left open.
func TestModuleBridgesAreTheFiltered(t *testing.T) {
	if reconciler.BridgePrefix != overlay.ModuleBridges {
		t.Fatalf("bridges begin %q, the filter matches %q", reconciler.BridgePrefix, overlay.ModuleBridges)
	}
	if n := reconciler.ModuleNetwork(strings.Repeat("m", 63)); !strings.HasPrefix(n.Interface, overlay.ModuleBridges) || len(n.Interface) > 15 {
		t.Fatalf("the bridge of a long module name: %q", n.Interface)
	}
}
