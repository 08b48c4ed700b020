package integration

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"
)

// Issue 11: the manifests in examples/, as shipped (only their /srv/ moved
// under the bed's directory), on three nodes, from the images
// contrib/example-images.sh makes without a registry:
//
//   - n1 runs postgres (server and provisioner);
//   - n2, with a public domain, runs whoami and the route proxy; whoami
//     answers through the proxy on n2's port 80, and on 443 with the
//     certificate the gate step made for the domain;
//   - postgres-exporter, assigned to n2 later: its migrate step logs in to
//     postgres on n1 with the credential the mesh delivered, it is routed
//     through the proxy without the proxy being recreated, and its
//     metrics show it reached the database;
//   - a new public domain on n2 reruns the gate step and recreates the
//     proxy once, with a certificate for the new domain;
//   - the exporter unassigned, its role is left alone and reported.
func TestExamplesBed(t *testing.T) {
	for _, bin := range []string{"curl", "openssl"} {
		if _, err := exec.LookPath(bin); err != nil {
			t.Fatalf("%s is missing; contrib/test.sh installs it", bin)
		}
	}
	n, _ := startThree(t)
	t.Cleanup(func() {
		if !t.Failed() {
			return
		}
		for _, a := range n[1:3] {
			out, _ := a.h.podmanCmd("ps", "-a", "--format", "{{.Names}} {{.Status}}").CombinedOutput()
			t.Logf("%s containers:\n%s", a.name, out)
			for _, c := range strings.Fields(string(out)) {
				if strings.Contains(c, ".") {
					logs, _ := a.h.podmanCmd("logs", "--tail", "10", c).CombinedOutput()
					t.Logf("%s %s:\n%s", a.name, c, logs)
				}
			}
		}
	})
	srv := multiDir + "/srv"
	os.MkdirAll(srv, 0o755)

	// The images, made once into n1's storage and copied to n2's.
	imgs := []string{"docker.io/library/busybox:1.35", "docker.io/library/postgres:15", "docker.io/library/caddy:2.6.2",
		"quay.io/prometheuscommunity/postgres-exporter:v0.11.1", "localhost/mesh:latest"}
	mk := exec.Command("bash", "../contrib/example-images.sh", meshBin)
	mk.Env = append(os.Environ(), "CONTAINERS_CONF="+n[1].h.conf,
		"PODMAN=podman --root "+n[1].h.dir+"/root --runroot "+n[1].h.dir+"/runroot")
	if out, err := mk.CombinedOutput(); err != nil {
		t.Fatalf("contrib/example-images.sh: %v\n%s", err, out)
	}
	archive := filepath.Join(t.TempDir(), "images.tar")
	n[1].h.podman(append([]string{"save", "-q", "-m", "-o", archive}, imgs...)...)
	n[2].h.podman("load", "-q", "-i", archive)

	var files []string
	for _, name := range []string{"postgres", "postgres-exporter", "route-proxy", "whoami"} {
		b, err := os.ReadFile("../examples/" + name + ".yaml")
		if err != nil {
			t.Fatal(err)
		}
		f := filepath.Join(t.TempDir(), name+".yaml")
		os.WriteFile(f, []byte(strings.ReplaceAll(string(b), "/srv/", srv+"/")), 0o644)
		files = append(files, f)
	}
	n[1].mesh(append([]string{"module", "add"}, files...)...)
	n[1].mesh("node", "public-domain", "n2", "bed.example")

	n[1].mesh("assign", "n1", "postgres", "--wait")
	n[1].mesh("assign", "n2", "whoami", "--wait")
	n[1].mesh("assign", "n2", "route-proxy", "--wait")

	get := func(host, path string) (string, error) {
		out, err := exec.Command("ip", "netns", "exec", n[3].h.netns, "curl", "-sS", "-m", "5",
			"-H", "Host: "+host, "http://"+n[2].addr()+path).CombinedOutput()
		return string(out), err
	}
	eventually(t, 30*time.Second, "whoami answers through the proxy on n2's port 80", func() (bool, string) {
		out, err := get("whoami.bed.example", "/")
		return err == nil && strings.Contains(out, "whoami: served by mesh"), out + errString(err)
	})
	certFor := func(name string) string {
		c := exec.Command("ip", "netns", "exec", n[3].h.netns, "sh", "-c",
			fmt.Sprintf("echo | openssl s_client -connect %s:443 -servername %s 2>/dev/null | openssl x509 -noout -ext subjectAltName", n[2].addr(), name))
		out, _ := c.CombinedOutput()
		return string(out)
	}
	eventually(t, 30*time.Second, "whoami on 443 with the gate step's certificate", func() (bool, string) {
		out := certFor("whoami.bed.example")
		return strings.Contains(out, "DNS:*.bed.example"), out
	})
	proxy := n[2].h.containerID("route-proxy.server")

	// The consumer, assigned later: its migrate step logs in with its
	// delivered credential; it is routed without the proxy being recreated.
	n[1].mesh("assign", "n2", "postgres-exporter", "--wait")
	eventually(t, 30*time.Second, "the exporter's metrics through the proxy show the database and the migration", func() (bool, string) {
		out, err := get("pg-metrics.bed.example", "/metrics")
		return err == nil && pgUp.MatchString(out) && migrated.MatchString(out), lastLines(out, 5) + errString(err)
	})
	if id := n[2].h.containerID("route-proxy.server"); id != proxy {
		t.Fatalf("a routed assign recreated the proxy (%s -> %s)", proxy, id)
	}
	if out, err := get("whoami.bed.example", "/"); err != nil || !strings.Contains(out, "whoami") {
		t.Fatalf("whoami after the exporter was routed: %s %v", out, err)
	}

	// A new public domain: the gate step runs again and the proxy is
	// recreated with the new certificate, once.
	n[1].mesh("node", "public-domain", "n2", "bed2.example", "--wait")
	eventually(t, 30*time.Second, "the new domain is served, with its certificate", func() (bool, string) {
		out, err := get("whoami.bed2.example", "/")
		c := certFor("whoami.bed2.example")
		return err == nil && strings.Contains(out, "whoami") && strings.Contains(c, "DNS:*.bed2.example"), out + c
	})
	recreated := n[2].h.containerID("route-proxy.server")
	if recreated == proxy {
		t.Fatal("the proxy kept the old certificate: it was not recreated after the gate step")
	}
	if out, err := get("whoami.bed.example", "/"); err == nil && strings.Contains(out, "whoami") {
		t.Fatalf("the old domain is still routed: %s", out)
	}

	// Unassigned, the consumer's role is left alone, and reported.
	secret, err := os.ReadFile(srv + "/postgres-exporter/db.password")
	if err != nil {
		t.Fatal(err)
	}
	n[1].mesh("unassign", "n2", "postgres-exporter", "--wait")
	eventually(t, 30*time.Second, "the provisioner reports the withdrawn consumer", func() (bool, string) {
		logs := n[1].h.podman("logs", "postgres.provisioner")
		return strings.Contains(logs, "postgres-exporter: withdrawn"), lastLines(logs, 5)
	})
	login := n[1].h.podmanCmd("exec", "-e", "PGPASSWORD="+strings.TrimSpace(string(secret)), "postgres.server",
		"psql", "-h", "127.0.0.1", "-U", "postgres-exporter", "-d", "postgres-exporter", "-Atc", "SELECT count(*) FROM migrations")
	if out, err := login.CombinedOutput(); err != nil || strings.TrimSpace(string(out)) != "1" {
		t.Fatalf("the withdrawn consumer's role or data was touched: %s %v", out, err)
	}
	if logs := n[1].h.podman("logs", "postgres.provisioner"); strings.Contains(logs, strings.TrimSpace(string(secret))) {
		t.Fatal("a secret is in the provisioner's output")
	}
	t.Logf("route proxy: created once, recreated %d time(s) (by the new public domain), none by the routed assign", map[bool]int{true: 1}[recreated != proxy])
}

var (
	pgUp     = regexp.MustCompile(`(?m)^pg_up 1$`)
	migrated = regexp.MustCompile(`(?m)^migrations_applied\{[^}]*\} 1$`)
)

func lastLines(s string, n int) string {
	l := strings.Split(strings.TrimRight(s, "\n"), "\n")
	if len(l) > n {
		l = l[len(l)-n:]
	}
	return strings.Join(l, "\n")
}
