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

const bedPull = `module: bedpull
resources:
  - container: bedpull.web
    image: {{registry}}/bed/web:1
    command: ["sh", "-c", "while true; do sleep 1; done"]
  - container: bedpull.other
    image: {{registry}}/bed/other:1
    command: ["sh", "-c", "while true; do sleep 1; done"]
`

// startRegistry runs Debian's docker-registry (unpacked from its .deb, not
// installed: no service on the host) on a free loopback port until the test
// ends, and returns its host:port.
func startRegistry(t *testing.T) string {
	cache := "/var/cache/mesh-bed"
	os.MkdirAll(cache, 0o755)
	debs, _ := filepath.Glob(cache + "/docker-registry_*.deb")
	if len(debs) == 0 {
		dl := exec.Command("apt-get", "download", "docker-registry")
		dl.Dir = cache
		if out, err := dl.CombinedOutput(); err != nil {
			t.Fatalf("apt-get download docker-registry (a Debian mirror is needed once; contrib/test.sh has one): %v\n%s", err, out)
		}
		debs, _ = filepath.Glob(cache + "/docker-registry_*.deb")
	}
	root := t.TempDir()
	sh(t, "dpkg-deb", "-x", debs[len(debs)-1], root)
	addr := "127.0.0.1:" + freePort(t)
	conf := filepath.Join(root, "config.yml")
	os.WriteFile(conf, []byte(fmt.Sprintf("version: 0.1\nstorage:\n  filesystem:\n    rootdirectory: %s/data\nhttp:\n  addr: %s\n", root, addr)), 0o644)
	reg := exec.Command(filepath.Join(root, "usr/bin/docker-registry"), "serve", conf)
	logf, _ := os.Create(filepath.Join(root, "registry.log"))
	reg.Stdout, reg.Stderr = logf, logf
	if err := reg.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { reg.Process.Kill(); reg.Wait() })
	eventually(t, 20*time.Second, "the registry answers", func() (bool, string) {
		out, err := httpGet(addr)
		return err == nil && strings.HasPrefix(out, "HTTP/"), out + errString(err)
	})
	return addr
}

// Issue 12 item 10: mesh module pull, against a real registry. Each node
// running the module pulls once; the container whose image changed behind
// its name is replaced, with that reason, and the other is kept.
func TestModulePullBed(t *testing.T) {
	h := newHost(t, false)
	registry := startRegistry(t)
	// The bed's Podman may use this registry over plain HTTP.
	regConf := filepath.Join(h.dir, "registries.conf")
	os.WriteFile(regConf, []byte(fmt.Sprintf("[[registry]]\nlocation = %q\ninsecure = true\n", registry)), 0o644)
	h.env = []string{"CONTAINERS_REGISTRIES_CONF=" + regConf}
	h.stopService()
	h.startService()

	push := func(name, marker string) {
		h.podman("build", "-q", "-t", registry+"/bed/"+name, buildContext(t, marker))
		h.podman("push", "-q", registry+"/bed/"+name)
		h.podman("rmi", registry+"/bed/"+name) // the node must get it from the registry
	}
	push("web:1", "v1")
	push("other:1", "v1")

	a := h.newAgent(t)
	a.mesh("module", "add", a.manifest("bedpull", bedPull, map[string]string{"registry": registry}))
	a.mesh("assign", "ace", "bedpull", "--wait")
	web, other := h.containerID("bedpull.web"), h.containerID("bedpull.other")

	// A new image behind web:1 only.
	push("web:1", "v2")
	out := a.mesh("module", "pull", "bedpull", "--wait")
	if !strings.Contains(out, "ace: bedpull.web replaced: image "+registry+"/bed/web:1 updated by mesh module pull (") ||
		!strings.Contains(out, "ace: bedpull.other image unchanged, kept") {
		t.Fatalf("module pull --wait:\n%s", out)
	}
	if h.containerID("bedpull.web") == web || h.containerID("bedpull.other") != other {
		t.Fatalf("containers: web %s -> %s, other %s -> %s", web, h.containerID("bedpull.web"), other, h.containerID("bedpull.other"))
	}
	if got := h.podman("exec", "bedpull.web", "cat", "/version"); strings.TrimSpace(got) != "v2" {
		t.Fatalf("web runs %q, want v2", got)
	}
	// Nothing new in the registry: a second pull replaces nothing.
	web = h.containerID("bedpull.web")
	if out := a.mesh("module", "pull", "bedpull", "--wait"); strings.Contains(out, "replaced") || h.containerID("bedpull.web") != web {
		t.Fatalf("second pull:\n%s", out)
	}
	if why := a.mesh("why", "ace", "bedpull.web"); !strings.Contains(why, "mesh module pull bedpull") {
		t.Fatalf("why:\n%s", why)
	}

	// Issue 29: a pull of a module that rolls out (update:) whose new image
	// fails its health check is stopped and reverted: the container runs
	// the image from before the pull again (its ID), and --wait says why.
	push("roll:1", "good")
	a.mesh("module", "add", a.manifest("bedroll", bedPullRoll, map[string]string{"registry": registry}))
	if out := a.mesh("assign", "ace", "bedroll", "--wait"); !strings.Contains(out, "healthy: bedroll.web") {
		t.Fatalf("assign bedroll --wait:\n%s", out)
	}
	good := strings.TrimSpace(h.podman("container", "inspect", "--format", "{{.Image}}", "bedroll.web"))
	push("roll:1", "broken")
	b, err := a.command("module", "pull", "bedroll", "--wait", "--data-dir", a.n.dir).CombinedOutput()
	if err == nil || !strings.Contains(string(b), "stopped and reverted") || !strings.Contains(string(b), "ace: container bedroll.web is unhealthy") {
		t.Fatalf("a pull of a broken image: %v\n%s", err, b)
	}
	eventually(t, 60*time.Second, "the container runs the image from before the pull", func() (bool, string) {
		// Not there for a moment while it is replaced: looked for again.
		idb, _ := h.podmanCmd("container", "inspect", "--format", "{{.Image}}", "bedroll.web").Output()
		out, _ := h.podmanCmd("exec", "bedroll.web", "cat", "/version").CombinedOutput()
		id := strings.TrimSpace(string(idb))
		return id == good && strings.TrimSpace(string(out)) == "good", id + " " + string(out)
	})
	if why := a.mesh("why", "ace", "bedroll.web"); !strings.Contains(why, "stopped: ace: container bedroll.web is unhealthy") {
		t.Fatalf("why after the revert:\n%s", why)
	}
}

const bedPullRoll = `module: bedroll
update: {healthy-for: 2s}
resources:
  - container: bedroll.web
    image: {{registry}}/bed/roll:1
    command: ["sh", "-c", "trap 'exit 0' TERM; while true; do sleep 1; done"]
    health:
      command: ["grep", "-q", "good", "/version"]
      interval: 1s
      retries: 2
      start-period: 1s
`

// buildContext is a build of the bed's busybox with /version (COPY, not
// RUN: nothing runs at build time).
func buildContext(t *testing.T, marker string) string {
	d := t.TempDir()
	os.WriteFile(filepath.Join(d, "Containerfile"), []byte(fmt.Sprintf("FROM %s\nCOPY version /version\n", bedImage)), 0o644)
	os.WriteFile(filepath.Join(d, "version"), []byte(marker+"\n"), 0o644)
	return d
}
