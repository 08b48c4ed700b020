package integration

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// Issue 15, items 2 and 4, on real Podman: a container with the fields
// compose users rely on, which reaches another module by its short name
// (the mesh's domain is its resolver's search domain) through a port that
// module publishes on its node.
const (
	bedServe = `module: bedserve
resources:
  - directory: {{root}}/bedserve
  - file: {{root}}/bedserve/index.html
    content: served-by-short-name
  - container: bedserve.httpd
    image: localhost/mesh-bed-busybox:1
    command: ["httpd", "-f", "-p", "80", "-h", "/www"]
    mounts: ["{{root}}/bedserve:/www:ro"]
    ports: ["18081:80"]
`
	bedFields = `module: bedfields
resources:
  - directory: {{root}}/bedfields
    owner: "1000:1000"
  - container: bedfields.app
    image: localhost/mesh-bed-busybox:1
    user: "1000:1000"
    entrypoint: ["/bin/sh", "-c"]
    command: ["trap 'echo quit > stopped; exit 0' QUIT; while true; do wget -q -O fetched.tmp http://bedserve:18081/ && mv fetched.tmp fetched; touch /run/alive; sleep 1; done"]
    working-dir: /data
    mounts: ["{{root}}/bedfields:/data"]
    read-only: true
    tmpfs: ["/run:size=8m"]
    cap-drop: [ALL]
    devices: ["/dev/null:/dev/mynull:rw"]
    memory: 64m
    cpus: 0.5
    stop-signal: SIGQUIT
    stop-timeout: 20s
    labels: {com.example.team: web}
`
	// bedVol's image declares VOLUME /cache/data; the manifest mounts the
	// module's directory above it, at /cache. bedLoose mounts nothing there.
	bedVol = `module: bedvol
resources:
  - directory: {{root}}/bedvol
  - container: bedvol.app
    image: localhost/mesh-bed-volume:1
    command: ["sh", "-c", "mkdir -p /cache/data && echo kept-in-the-module > /cache/data/f; sleep 3600"]
    mounts: ["{{root}}/bedvol:/cache"]
`
	bedLoose = `module: bedloose
resources:
  - container: bedloose.app
    image: localhost/mesh-bed-volume:1
    command: ["sleep", "3600"]
`
)

// muslResolve prints the first IPv4 address getaddrinfo gives for argv[1].
const muslResolve = `#include <netdb.h>
#include <stdio.h>
#include <arpa/inet.h>
#include <netinet/in.h>
int main(int argc, char **argv) {
	struct addrinfo hints = {0}, *res;
	hints.ai_family = AF_INET;
	int rc = getaddrinfo(argv[1], NULL, &hints, &res);
	if (rc != 0) { printf("error %s\n", gai_strerror(rc)); return 1; }
	char buf[64];
	inet_ntop(AF_INET, &((struct sockaddr_in *)res->ai_addr)->sin_addr, buf, sizeof buf);
	printf("%s\n", buf);
	return 0;
}
`

func TestContainerFieldsBed(t *testing.T) {
	n, _ := startThree(t)
	srv := filepath.Join(n[1].h.dir, "srv")
	n[1].mesh("module", "add", n[1].manifest("bedserve", bedServe, nil), n[1].manifest("bedfields", bedFields, nil), n[1].manifest("bedvol", bedVol, nil), n[1].manifest("bedloose", bedLoose, nil))
	n[1].mesh("assign", "n2", "bedserve", "--wait")
	n[1].mesh("assign", "n1", "bedfields", "--wait")
	n[1].mesh("assign", "n1", "bedvol", "--wait")

	// The image's VOLUME under a directory of the module's mounted above
	// it is not made a volume of the runtime's (Podman's default made an
	// anonymous one there: the data went into it, not the module's
	// directory, and was left behind by the container's removal).
	if mounts := strings.TrimSpace(n[1].h.podman("inspect", "--format", "{{range .Mounts}}{{.Type}}:{{.Destination}} {{end}}", "bedvol.app")); mounts != "bind:/cache" {
		t.Fatalf("bedvol.app's mounts: %q, want the module's directory alone", mounts)
	}
	eventually(t, 30*time.Second, "bedvol.app wrote into the module's directory", func() (bool, string) {
		b, err := os.ReadFile(filepath.Join(srv, "bedvol/data/f"))
		return err == nil && strings.TrimSpace(string(b)) == "kept-in-the-module", string(b) + errString(err)
	})
	if vols := strings.TrimSpace(n[1].h.podman("volume", "ls", "--quiet")); vols != "" {
		t.Fatalf("the runtime made volumes: %q", vols)
	}
	// A VOLUME nothing holds is refused, with what to write.
	out := n[1].meshFails("assign", "n1", "bedloose", "--wait")
	if !strings.Contains(out, "keeps data at /cache/data (VOLUME), which no mount of bedloose.app holds") || !strings.Contains(out, "a tmpfs if it holds nothing to keep") {
		t.Fatalf("bedloose assigned: %s", out)
	}
	if _, err := n[1].h.podmanCmd("container", "exists", "bedloose.app").CombinedOutput(); err == nil {
		t.Fatal("bedloose.app was created")
	}
	n[1].mesh("unassign", "n1", "bedloose", "--wait")

	// By its short name, from a container on another node.
	eventually(t, 30*time.Second, "bedfields.app fetched bedserve's page by its short name", func() (bool, string) {
		b, err := os.ReadFile(filepath.Join(srv, "bedfields/fetched"))
		return err == nil && string(b) == "served-by-short-name", string(b) + errString(err)
	})
	if rc := n[1].h.podman("exec", "bedfields.app", "cat", "/etc/resolv.conf"); !strings.Contains(rc, "search internal") || !strings.Contains(rc, "nameserver 169.254.53.53") {
		t.Fatalf("resolv.conf:\n%s", rc)
	}
	// busybox resolves with (static) glibc; a program built against musl
	// resolves the short name too.
	src := filepath.Join(t.TempDir(), "mresolve.c")
	os.WriteFile(src, []byte(muslResolve), 0o644)
	sh(t, "musl-gcc", "-static", "-O2", "-o", filepath.Join(srv, "bedfields", "mresolve"), src)
	if out := strings.TrimSpace(n[1].h.podman("exec", "bedfields.app", "/data/mresolve", "bedserve")); out != n[2].oaddr() {
		t.Fatalf("musl getaddrinfo(bedserve) in the container: %q, want %s", out, n[2].oaddr())
	}
	// Each field, as Podman has it.
	for format, want := range map[string]string{
		"{{.Config.User}}":                            "1000:1000",
		"{{.Config.WorkingDir}}":                      "/data",
		"{{.HostConfig.ReadonlyRootfs}}":              "true",
		"{{.HostConfig.Memory}}":                      "67108864",
		"{{.HostConfig.OomScoreAdj}}":                 "500", // ended after one without a limit
		"{{.HostConfig.CpuQuota}}":                    "50000",
		"{{.Config.StopTimeout}}":                     "20",
		`{{index .Config.Labels "com.example.team"}}`: "web",
		"{{.EffectiveCaps}}":                          "[]",
		"{{.Config.Entrypoint}}":                      "/bin/sh -c", // Podman 4.3 shows it joined
	} {
		if got := strings.TrimSpace(n[1].h.podman("inspect", "--format", format, "bedfields.app")); got != want {
			t.Errorf("%s: %q, want %q", format, got, want)
		}
	}
	if adj := n[1].h.oomScoreAdj("bedfields.app"); adj != "500" {
		t.Fatalf("bedfields.app (memory: 64m) has oom_score_adj %s, want 500", adj)
	}
	if adj := n[2].h.oomScoreAdj("bedserve.httpd"); adj != "1000" {
		t.Fatalf("bedserve.httpd (no memory limit) has oom_score_adj %s, want 1000", adj)
	}
	if out := n[1].h.podman("exec", "bedfields.app", "sh", "-c", "test -c /dev/mynull && test -f /run/alive && ! touch /etc/x 2>/dev/null && echo ok"); strings.TrimSpace(out) != "ok" {
		t.Fatalf("device, tmpfs or read-only root: %q", out)
	}
	// A changed field replaces the container, and says which.
	mark := n[1].logLen()
	n[1].mesh("module", "add", n[1].manifest("bedfields", strings.Replace(bedFields, "memory: 64m", "memory: 96m", 1), nil), "--wait")
	if !strings.Contains(strings.Join(n[1].linesAfter(mark), "\n"), "memory changed") {
		t.Fatalf("the replacement does not say memory changed:\n%s", tail(n[1].log(), 20))
	}
	// The stop signal is the one declared: unassigned, the container gets
	// SIGQUIT, which its trap writes down.
	n[1].mesh("unassign", "n1", "bedfields", "--wait")
	if b, _ := os.ReadFile(filepath.Join(srv, "bedfields/stopped")); strings.TrimSpace(string(b)) != "quit" {
		t.Fatalf("the container was not stopped with SIGQUIT: %q", b)
	}
}
