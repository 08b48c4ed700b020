package integration

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
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
	// n2 serves metrics (issue 12 item 4), scraped from its namespace.
	n[2].stop()
	n[2].extra = []string{"--metrics-listen", "127.0.0.1:9430"}
	n[2].start()
	scrape := func() map[string]float64 {
		out, err := exec.Command("ip", "netns", "exec", n[2].h.netns, "curl", "-sS", "-m", "5", "http://127.0.0.1:9430/metrics").CombinedOutput()
		if err != nil {
			t.Fatalf("scrape n2's metrics: %v\n%s", err, out)
		}
		m := map[string]float64{}
		for _, l := range strings.Split(string(out), "\n") {
			if f := strings.Fields(l); len(f) == 2 && strings.HasPrefix(f[0], "mesh_") {
				v, _ := strconv.ParseFloat(f[1], 64)
				m[f[0]] = v
			}
		}
		return m
	}
	m0 := scrape()
	if m0["mesh_raft_term"] < 1 || m0[`mesh_raft_state{state="follower"}`]+m0[`mesh_raft_state{state="leader"}`] != 1 {
		t.Fatalf("raft metrics: %v", m0)
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
	// Previewed first (issue 12): the dry run writes nothing and names what
	// the real assign then does.
	dryRunThenDo(t, n[1], n[2], "assign", "n2", "postgres-exporter")
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
	dryRunThenDo(t, n[1], n[2], "node", "public-domain", "n2", "bed2.example")
	eventually(t, 30*time.Second, "the new domain is served, with its certificate", func() (bool, string) {
		out, err := get("whoami.bed2.example", "/")
		c := certFor("whoami.bed2.example")
		return err == nil && strings.Contains(out, "whoami") && strings.Contains(c, "DNS:*.bed2.example"), out + c
	})
	// why (issue 12 item 2): the proxy was replaced because its gate step
	// ran, which ran because its request (restart-on) changed, because of
	// the public domain; and the node's last apply says the same.
	why := n[1].mesh("why", "n2", "route-proxy.server")
	for _, w := range []string{
		"by `mesh node public-domain n2 bed2.example`",
		"~ replace container route-proxy.server (route-proxy): step certificate ran",
		"because: ~ rerun step certificate (route-proxy): restart-on: " + srv + "/route-proxy/tls/request.cnf changed",
		"because: ~ update routes-file " + srv + "/route-proxy/tls/request.cnf (route-proxy): resolved content changed (digest ",
		"replaced; step certificate ran",
	} {
		if !strings.Contains(why, w) {
			t.Fatalf("mesh why lacks %q:\n%s", w, why)
		}
	}
	if why := n[1].mesh("why", "n2", "postgres-exporter.migrate"); !strings.Contains(why, "+ run step migrate (postgres-exporter)") || !strings.Contains(why, "by `mesh assign n2 postgres-exporter`") {
		t.Fatalf("why migrate:\n%s", why)
	}
	// roster --history (issue 12 item 3): when the routed name came and
	// went, and which command did each.
	hist := n[3].mesh("roster", "--history", "whoami.bed.example")
	if !regexp.MustCompile(`appeared\s+whoami\.bed\.example\s+`+regexp.QuoteMeta(n[2].oaddr())+`\s+n2\s+mesh assign n2 whoami`).MatchString(hist) ||
		!regexp.MustCompile(`went\s+whoami\.bed\.example\s+.*mesh node public-domain n2 bed2\.example`).MatchString(hist) {
		t.Fatalf("roster --history:\n%s", hist)
	}
	recreated := n[2].h.containerID("route-proxy.server")
	if recreated == proxy {
		t.Fatal("the proxy kept the old certificate: it was not recreated after the gate step")
	}
	if out, err := get("whoami.bed.example", "/"); err == nil && strings.Contains(out, "whoami") {
		t.Fatalf("the old domain is still routed: %s", out)
	}

	// The metrics moved with what happened on n2: applies that changed
	// things, steps run (certificate twice, migrate once), the proxy
	// replaced because its step ran, and queries answered.
	for i := 0; i < 3; i++ {
		n[2].resolve("whoami.internal")
	}
	m1 := scrape()
	for name, least := range map[string]float64{
		"mesh_apply_mutations_total": 10, "mesh_steps_run_total": 3,
		`mesh_container_replacements_total{reason="step"}`:          1,
		`mesh_dns_queries_total{forwarded="false",rcode="NOERROR"}`: 3,
		`mesh_applies_total{result="ok"}`:                           3,
	} {
		if m1[name]-m0[name] < least {
			t.Errorf("%s moved by %v, want %v at least", name, m1[name]-m0[name], least)
		}
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

var (
	previewLine = regexp.MustCompile(`^  [+~-] (run|rerun|create|replace) (step|container) (\S+) \((\S+)\)(?:: (.*))?$`)
	changeLine  = regexp.MustCompile(`msg="updated (\S+) \((\S+)\): (created|ran|replaced)(?:; ([^"]*))?"`)
)

// dryRunThenDo runs a write with --dry-run, checks that it changed nothing,
// then runs it for real (--wait) and checks that the steps and containers
// on's agent changed are exactly those the dry run named, for the reasons
// it gave. (Paths are compared by the unit tests: a dry run names the
// paths the plan changes, the agent logs the ones it had to write.)
func dryRunThenDo(t *testing.T, admin, on *agent, args ...string) {
	t.Helper()
	plans := func() string {
		var b strings.Builder
		for _, n := range admin.status().Nodes {
			fmt.Fprintf(&b, "%s=v%d ", n.Name, n.PlanVersion)
		}
		return b.String() + admin.mesh("roster")
	}
	before := plans()
	out := admin.mesh(append(args, "--dry-run")...)
	if !strings.Contains(out, "nothing was written") {
		t.Fatalf("dry run: %s", out)
	}
	if after := plans(); after != before {
		t.Fatalf("the dry run changed plans or names:\n%s\n%s", before, after)
	}
	want := map[string]string{}
	section := ""
	for _, l := range strings.Split(out, "\n") {
		if strings.HasSuffix(l, ":") && !strings.HasPrefix(l, " ") {
			section = strings.TrimSuffix(l, ":")
			continue
		}
		m := previewLine.FindStringSubmatch(l)
		if m == nil || section != on.name {
			continue
		}
		name := m[3]
		if m[2] == "step" {
			name = m[4] + "." + m[3]
		}
		want[name] = map[string]string{"run": "ran", "rerun": "ran", "create": "created", "replace": "replaced"}[m[1]] + " " + m[5]
	}
	if len(want) == 0 {
		t.Fatalf("the dry run names no step or container on %s:\n%s", on.name, out)
	}
	from := on.logLen()
	admin.mesh(append(args, "--wait")...)
	got := map[string]string{}
	eventually(t, 30*time.Second, "the agent changed what the dry run said", func() (bool, string) {
		on.mu.Lock()
		lines := append([]string(nil), on.lines[from:]...)
		on.mu.Unlock()
		for _, l := range lines {
			if m := changeLine.FindStringSubmatch(l); m != nil && !strings.HasPrefix(m[1], "/") {
				got[m[1]] = m[3] + " " + m[4]
			}
		}
		return fmt.Sprint(got) == fmt.Sprint(want), fmt.Sprintf("dry run: %v\nagent:   %v", want, got)
	})
	t.Logf("%s: the dry run named %v; the agent did the same", strings.Join(args, " "), want)
}

func lastLines(s string, n int) string {
	l := strings.Split(strings.TrimRight(s, "\n"), "\n")
	if len(l) > n {
		l = l[len(l)-n:]
	}
	return strings.Join(l, "\n")
}
