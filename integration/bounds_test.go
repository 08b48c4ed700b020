package integration

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"
)

// A step that prints 10 lines of 1.5 MB and fails.
const bedNoisy = `module: bednoisy
resources:
  - directory: {{root}}/bednoisy
  - step: spill
    image: localhost/mesh-bed-busybox:1
    command: ["sh", "-c", "for i in 1 2 3 4 5 6 7 8 9 10; do head -c 1500000 /dev/zero | tr '\\0' x; echo; done; echo the real reason; exit 1"]
`

// A container that logs as fast as it can, its log bounded at 1m.
const bedChatty = `module: bedchatty
resources:
  - container: bedchatty.yes
    image: localhost/mesh-bed-busybox:1
    command: ["yes", "mesh"]
    log-max-size: 1m
`

func dirSize(t *testing.T, dir string) int64 {
	t.Helper()
	var n int64
	filepath.Walk(dir, func(_ string, fi os.FileInfo, err error) error {
		if err == nil && fi.Mode().IsRegular() {
			n += fi.Size()
		}
		return nil
	})
	return n
}

// Hardening, items 1 and 2: no container fills its node. What a failing step
// printed reaches the report, status and the log as a bounded tail that
// ends with its last words; a container that logs without end keeps a log
// within its bound.
func TestBoundsRootful(t *testing.T) {
	h := newHost(t, false)
	a := h.newAgent(t)
	a.mesh("module", "add", a.manifest("bednoisy", bedNoisy, nil), a.manifest("bedchatty", bedChatty, nil))
	before := dirSize(t, a.n.dir)
	out := a.meshFails("assign", "ace", "bednoisy", "--wait", "--timeout", "2m")
	if len(out) > 32<<10 || !strings.Contains(out, "exited with code 1") || !strings.Contains(out, "the real reason") || !strings.Contains(out, "[cut: ") {
		t.Fatalf("assign --wait of the noisy step (%d bytes): %.2000s", len(out), out)
	}
	// The step is tried again on every pass (--resync 1s here): neither
	// status nor the data dir grow with it.
	time.Sleep(5 * time.Second)
	st := a.mesh("status", "--json")
	if len(st) > 64<<10 {
		t.Fatalf("status --json is %d bytes", len(st))
	}
	if grew := dirSize(t, a.n.dir) - before; grew > 8<<20 {
		t.Fatalf("the data dir grew by %d MB in the step's retries", grew>>20)
	}
	for _, l := range strings.Split(a.log(), "\n") {
		if len(l) > 16<<10 {
			t.Fatalf("a log line of %d bytes: %.200s", len(l), l)
		}
	}

	a.mesh("assign", "ace", "bedchatty", "--wait")
	var ctr []struct {
		HostConfig struct {
			LogConfig struct{ Type, Path, Size string }
		}
	}
	if err := json.Unmarshal([]byte(h.podman("container", "inspect", "bedchatty.yes")), &ctr); err != nil || len(ctr) != 1 || ctr[0].HostConfig.LogConfig.Path == "" {
		t.Fatalf("inspect bedchatty.yes: %v %+v", err, ctr)
	}
	t.Logf("bedchatty.yes's log: %+v", ctr[0].HostConfig.LogConfig)
	logPath := ctr[0].HostConfig.LogConfig.Path
	eventually(t, 30*time.Second, "yes has written past its bound, which keeps its log within 1 MiB", func() (bool, string) {
		fi, err := os.Stat(logPath)
		if err != nil {
			return false, err.Error()
		}
		// conmon cuts the log when it would pass the bound: while yes
		// writes, the file never holds more.
		if fi.Size() > 1<<20 {
			t.Fatalf("the log holds %d bytes, past its bound of 1 MiB", fi.Size())
		}
		return fi.Size() > 512<<10, strconv.FormatInt(fi.Size(), 10)
	})
	for i := 0; i < 10; i++ {
		if fi, err := os.Stat(logPath); err == nil && fi.Size() > 1<<20 {
			t.Fatalf("the log holds %d bytes, past its bound of 1 MiB", fi.Size())
		}
		time.Sleep(300 * time.Millisecond)
	}
}
