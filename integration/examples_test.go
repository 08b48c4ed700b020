package integration

import (
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"
)

// Issue 11: the manifests in examples/, as shipped (only the proxy's
// renewal check made faster for Pebble's short certificates; each node's
// /srv is its own, multi_test.go), on three nodes, from the images
// contrib/example-images.sh makes without a registry; and issue 28, the
// public edge, against a real ACME server (Debian's pebble) on n3 whose
// DNS is n3's mesh resolver, so it validates HTTP-01 against the proxy as
// Let's Encrypt would:
//
//   - n1 runs postgres (server and provisioner);
//   - n2, with a public domain and Pebble as its ACME directory, runs
//     whoami and the route proxy; whoami answers over HTTPS with a
//     certificate Pebble issued, which curl verifies with Pebble's root,
//     and plain HTTP redirects to HTTPS; the proxy removed, the mesh makes
//     it again and it serves the same certificate (its data directory);
//   - postgres-exporter, assigned to n2 later: its migrate step logs in to
//     postgres on n1 with the credential the mesh delivered, it is routed
//     and gets its certificate without the proxy being recreated;
//   - a second domain serves whoami under both; a module's own host name
//     is served too; a host claimed by two modules is refused, naming both;
//   - the certificates (60 s long) are renewed while requests go on, and
//     none fails;
//   - Pebble stopped, a new name's ACME error shows in status and the
//     names already served keep their certificates;
//   - the exporter unassigned, its role is left alone and reported;
//   - postgres backed up with restic and restored (checkBackups), and
//     moved with its data to another node and back (checkMove).
func TestExamplesBed(t *testing.T) {
	for _, bin := range []string{"curl", "openssl", "pebble"} {
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
					logs, _ := a.h.podmanCmd("logs", "--tail", "15", c).CombinedOutput()
					t.Logf("%s %s:\n%s", a.name, c, logs)
				}
			}
		}
	})
	acme := startPebble(t, n[3])

	// The images, made once into n1's storage and copied to n2's and n3's.
	imgs := []string{"docker.io/library/busybox:1.35", "docker.io/library/postgres:15", "docker.io/library/caddy:2.6.2",
		"quay.io/prometheuscommunity/postgres-exporter:v0.11.1", "localhost/cfssl:1.2.0", "localhost/mesh:latest"}
	mk := exec.Command("bash", "../contrib/example-images.sh", meshBin)
	mk.Env = append(os.Environ(), "CONTAINERS_CONF="+n[1].h.conf,
		"PODMAN=nsenter --mount="+filepath.Join(multiMnt, n[1].h.netns)+" --wd="+cwd()+" podman --root "+n[1].h.dir+"/root --runroot "+n[1].h.dir+"/runroot")
	if out, err := mk.CombinedOutput(); err != nil {
		t.Fatalf("contrib/example-images.sh: %v\n%s", err, out)
	}
	archive := filepath.Join(t.TempDir(), "images.tar")
	n[1].h.podman(append([]string{"save", "-q", "-m", "-o", archive}, imgs...)...)
	n[2].h.podman("load", "-q", "-i", archive)
	n[3].h.podman("load", "-q", "-i", archive)

	var files []string
	for _, name := range []string{"postgres", "postgres-exporter", "route-proxy", "whoami"} {
		b, err := os.ReadFile("../examples/" + name + ".yaml")
		if err != nil {
			t.Fatal(err)
		}
		text := string(b)
		if name == "route-proxy" {
			if !strings.Contains(text, "renew_interval 1m") {
				t.Fatal("the route proxy example no longer sets renew_interval 1m; mend the bed")
			}
			text = strings.ReplaceAll(text, "renew_interval 1m", "renew_interval 5s")
		}
		f := filepath.Join(t.TempDir(), name+".yaml")
		os.WriteFile(f, []byte(text), 0o644)
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
	n[1].mesh("node", "acme", "n2", "--directory", acme.directory, "--email", "ops@bed.example", "--ca-root", acme.tlsRoot)
	if out := n[1].meshFails("node", "acme", "n2", "--directory", "http://"+n[3].addr()+":14000/dir"); !strings.Contains(out, "is not an https URL") {
		t.Fatalf("a plain-HTTP directory: %s", out)
	}

	n[1].mesh("assign", "n1", "postgres", "--wait")
	// Two modules in one command (the README's tour does the same): one
	// Raft entry, one plan version, all or none.
	newest := func() (last uint64, causes []string) {
		var p struct {
			Versions []struct {
				Version uint64
				Cause   string
			}
		}
		if err := json.Unmarshal([]byte(n[1].mesh("plan", "n2", "--history", "--json")), &p); err != nil {
			t.Fatal(err)
		}
		for _, v := range p.Versions {
			last = max(last, v.Version)
			causes = append(causes, v.Cause)
		}
		return last, causes
	}
	was, _ := newest()
	out := n[1].mesh("assign", "n2", "whoami", "route-proxy", "--wait")
	if !strings.Contains(out, "assigned whoami, route-proxy to n2") {
		t.Fatalf("mesh assign n2 whoami route-proxy:\n%s", out)
	}
	if now, causes := newest(); now <= was || causes[0] != "mesh assign n2 whoami route-proxy" || slices.Contains(causes[1:], causes[0]) {
		t.Fatalf("plan history of n2 after one batch (v%d before): v%d, causes %q", was, now, causes)
	}
	assignedTo := func(module string) []string {
		var mods []struct {
			Name  string
			Nodes []string
		}
		json.Unmarshal([]byte(n[1].mesh("module", "list", "--json")), &mods)
		for _, m := range mods {
			if m.Name == module {
				return m.Nodes
			}
		}
		return nil
	}
	if out := n[1].meshFails("assign", "n2", "postgres-exporter", "nosuch"); !strings.Contains(out, "nosuch") || len(assignedTo("postgres-exporter")) != 0 {
		t.Fatalf("a batch with an unknown module: %s; postgres-exporter on %v", out, assignedTo("postgres-exporter"))
	}

	root := acme.root(t)
	// https fetches a page of host over HTTPS at n2, from n3, verified with
	// Pebble's root only.
	https := func(host, path string) (string, error) {
		out, err := exec.Command("ip", "netns", "exec", n[3].h.netns, "curl", "-sS", "-m", "5", "--cacert", root,
			"--resolve", host+":443:"+n[2].addr(), "https://"+host+path).CombinedOutput()
		return string(out), err
	}
	served := func(host, want string, within time.Duration) time.Duration {
		start := time.Now()
		eventually(t, within, host+" over HTTPS with Pebble's certificate", func() (bool, string) {
			out, err := https(host, "/")
			return err == nil && strings.Contains(out, want), lastLines(out, 3) + errString(err)
		})
		return time.Since(start)
	}
	served("whoami.bed.example", "whoami: served by mesh", 90*time.Second)
	redirect, _ := exec.Command("ip", "netns", "exec", n[3].h.netns, "curl", "-sS", "-m", "5", "-o", "/dev/null", "-w", "%{http_code} %{redirect_url}",
		"--resolve", "whoami.bed.example:80:"+n[2].addr(), "http://whoami.bed.example/").CombinedOutput()
	if !strings.HasPrefix(string(redirect), "30") || !strings.Contains(string(redirect), "https://whoami.bed.example/") {
		t.Fatalf("plain HTTP does not redirect to HTTPS: %s", redirect)
	}
	proxy := n[2].h.containerID("route-proxy.server")
	first := certSerial(n[3], n[2].addr(), "whoami.bed.example")
	// A replaced proxy keeps its certificates and its ACME account (its
	// data directory): removed by hand, the mesh makes it again, and it
	// serves the same certificate without a new order to Pebble.
	orders := strings.Count(acme.log(), "Issued certificate serial")
	n[2].h.podman("rm", "-f", "route-proxy.server")
	eventually(t, 60*time.Second, "the mesh makes the removed proxy again", func() (bool, string) {
		id := n[2].h.containerID("route-proxy.server")
		return id != "" && id != proxy, id
	})
	proxy = n[2].h.containerID("route-proxy.server")
	served("whoami.bed.example", "whoami: served by mesh", 30*time.Second)
	if s := certSerial(n[3], n[2].addr(), "whoami.bed.example"); s != first || strings.Count(acme.log(), "Issued certificate serial") != orders {
		t.Fatalf("the replaced proxy got a new certificate (%s -> %s) instead of keeping its own", first, s)
	}

	// Requests go on, every 300 ms, across the renewals to come.
	var failed, sent atomic.Int64
	var lastFail atomic.Value
	stopLoop := make(chan struct{})
	loopDone := make(chan struct{})
	go func() {
		defer close(loopDone)
		for {
			select {
			case <-stopLoop:
				return
			case <-time.After(300 * time.Millisecond):
			}
			sent.Add(1)
			if out, err := https("whoami.bed.example", "/"); err != nil || !strings.Contains(out, "whoami") {
				failed.Add(1)
				lastFail.Store(out + errString(err))
			}
		}
	}()
	endLoop := func() {
		select {
		case <-stopLoop:
		default:
			close(stopLoop)
			<-loopDone
		}
	}
	t.Cleanup(endLoop)

	// The consumer, assigned later: its migrate step logs in with its
	// delivered credential; it is routed, and gets its certificate,
	// without the proxy being recreated. Previewed first (issue 12): the
	// dry run writes nothing and names what the real assign then does.
	assigned := time.Now()
	dryRunThenDo(t, n[1], n[2], "assign", "n2", "postgres-exporter")
	eventually(t, 90*time.Second, "the exporter's metrics over HTTPS show the database and the migration", func() (bool, string) {
		out, err := https("pg-metrics.bed.example", "/metrics")
		return err == nil && pgUp.MatchString(out) && migrated.MatchString(out), lastLines(out, 5) + errString(err)
	})
	t.Logf("postgres-exporter: %s from mesh assign to its first verified HTTPS answer", time.Since(assigned).Round(100*time.Millisecond))
	if id := n[2].h.containerID("route-proxy.server"); id != proxy {
		t.Fatalf("a routed assign recreated the proxy (%s -> %s)", proxy, id)
	}

	// Several domains: whoami under a second one as well; a module whose
	// route names its own host; a host two modules claim is refused.
	n[1].mesh("node", "public-domain", "n2", "--add", "bed2.example", "--wait")
	served("whoami.bed2.example", "whoami: served by mesh", 90*time.Second)
	clash := filepath.Join(t.TempDir(), "clash.yaml")
	os.WriteFile(clash, []byte("module: clash\nroutes:\n  - {name: c, port: 8082, hosts: [whoami.bed2.example]}\n"), 0o644)
	if out := n[1].meshFails("module", "add", clash); !strings.Contains(out, "host whoami.bed2.example is claimed by both clash and whoami") {
		t.Fatalf("a host claimed twice: %s", out)
	}
	hello := filepath.Join(t.TempDir(), "hello.yaml")
	os.WriteFile(hello, []byte(`module: hello
routes:
  - {name: hello, port: 8081, hosts: [hello.other.example]}
resources:
  - container: hello.web
    image: docker.io/library/busybox:1.35
    command: ["sh", "-c", "mkdir -p /www && echo hello from its own host > /www/index.html && exec httpd -f -p 8081 -h /www"]
    ports: ["8081:8081"]
`), 0o644)
	n[1].mesh("module", "add", hello)
	n[1].mesh("assign", "n2", "hello", "--wait")
	served("hello.other.example", "hello from its own host", 90*time.Second)
	served("hello.bed2.example", "hello from its own host", 90*time.Second)
	if id := n[2].h.containerID("route-proxy.server"); id != proxy {
		t.Fatalf("a new domain or host recreated the proxy (%s -> %s)", proxy, id)
	}
	eventually(t, 60*time.Second, "n2's status tells the certificates its proxy serves", func() (bool, string) {
		out := n[1].mesh("status")
		return strings.Contains(out, "n2: certificates served for 7 name(s)") && !strings.Contains(out, "n2: certificate for"), out
	})

	// Renewed while served: Pebble's certificates last 60 s, Caddy renews
	// a third of that before; the loop of requests saw no failure.
	eventually(t, 120*time.Second, "whoami.bed.example's certificate renewed", func() (bool, string) {
		s := certSerial(n[3], n[2].addr(), "whoami.bed.example")
		return s != "" && s != first, first + " -> " + s
	})
	endLoop()
	if failed.Load() != 0 || sent.Load() < 50 {
		t.Fatalf("%d of %d requests across the renewal failed (last: %v)", failed.Load(), sent.Load(), lastFail.Load())
	}
	t.Logf("renewal: %d requests across it, none failed", sent.Load())

	// The ACME server gone: the names served keep their certificates (for
	// as long as they last: Pebble's are 60 s long), and a new name's error
	// shows in status, with what Caddy's ACME client said.
	acme.stop()
	if out, err := https("whoami.bed.example", "/"); err != nil || !strings.Contains(out, "whoami") {
		t.Fatalf("a name already served, once the ACME server stopped: %s %v", out, err)
	}
	n[1].mesh("node", "public-domain", "n2", "--add", "bed3.example", "--wait")
	eventually(t, 90*time.Second, "status shows whoami.bed3.example's ACME error", func() (bool, string) {
		out := n[1].mesh("status")
		return strings.Contains(out, "n2: certificate for whoami.bed3.example (whoami): no certificate served (") &&
			regexp.MustCompile(`whoami\.bed3\.example \(whoami\): no certificate served \([^\n]*\): [^\n]*connection refused`).MatchString(out), out
	})

	// roster --history (issue 12 item 3): when the routed name came and
	// went, and which command did each.
	n[1].mesh("node", "public-domain", "n2", "--remove", "bed.example", "--wait")
	hist := n[3].mesh("roster", "--history", "whoami.bed.example")
	if !regexp.MustCompile(`appeared\s+whoami\.bed\.example\s+`+regexp.QuoteMeta(n[2].oaddr())+`\s+n2\s+mesh assign n2 whoami`).MatchString(hist) ||
		!regexp.MustCompile(`went\s+whoami\.bed\.example\s+.*mesh node public-domain n2 --remove bed\.example`).MatchString(hist) {
		t.Fatalf("roster --history:\n%s", hist)
	}
	if why := n[1].mesh("why", "n2", "postgres-exporter.migrate"); !strings.Contains(why, "+ run step migrate (postgres-exporter)") || !strings.Contains(why, "by `mesh assign n2 postgres-exporter`") {
		t.Fatalf("why migrate:\n%s", why)
	}
	if id := n[2].h.containerID("route-proxy.server"); id != proxy {
		t.Fatalf("the proxy was recreated (%s -> %s)", proxy, id)
	}

	// The metrics moved with what happened on n2: applies that changed
	// things, a step run (migrate), and queries answered.
	for i := 0; i < 3; i++ {
		n[2].resolve("whoami.internal")
	}
	m1 := scrape()
	for name, least := range map[string]float64{
		"mesh_apply_mutations_total": 10, "mesh_steps_run_total": 1,
		`mesh_dns_queries_total{forwarded="false",rcode="NOERROR"}`: 3,
		`mesh_applies_total{result="ok"}`:                           3,
	} {
		if m1[name]-m0[name] < least {
			t.Errorf("%s moved by %v, want %v at least", name, m1[name]-m0[name], least)
		}
	}

	// Unassigned, the consumer's role is left alone, and reported.
	secret, err := os.ReadFile(n[2].h.dir + "/srv/postgres-exporter/db.password")
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

	repo, pw := checkBackups(t, n, files[0])
	checkRestoreRoom(t, n)
	checkBackupLetsAppliesGoOn(t, n, repo, pw)
	checkMove(t, n)
	authorityMoves(t, n)
	composeApp(t, n)
}

// authorityMoves is issue 28 item 3: examples/authority.yaml (a real cfssl
// CA) on n1, examples/intranet.yaml on n2 served with a certificate it
// issued and open to clients holding one; the authority moves to n3, which
// makes a root of its own (each node's /srv is its own): in one apply on n2
// the binding is rewritten, the gate step fetches the new root and a new
// certificate, and the server is recreated with them; a client certificate
// from the new authority is accepted, one from the old is refused, and no
// other container on any node is replaced.
func authorityMoves(t *testing.T, n []*agent) {
	n[1].mesh("module", "add", "../examples/authority.yaml", "../examples/intranet.yaml")
	n[1].mesh("assign", "n1", "authority", "--wait")
	n[1].mesh("assign", "n2", "intranet", "--wait")
	if b, err := os.ReadFile(n[1].h.dir + "/srv/authority/ca-key.pem"); err != nil || !strings.Contains(string(b), "PRIVATE KEY") {
		t.Fatalf("the authority's init step made no root key on n1: %v", err)
	}
	dir := t.TempDir()
	// issue asks the authority at addr for a client certificate.
	issue := func(addr, name string) (cert, key string) {
		out, err := exec.Command("ip", "netns", "exec", n[3].h.netns, "curl", "-sS", "-m", "10", "-d",
			`{"request": {"CN": "`+name+`", "key": {"algo": "ecdsa", "size": 256}}}`, "http://"+addr+":8888/api/v1/cfssl/newcert").Output()
		if err != nil {
			t.Fatalf("a client certificate from the authority at %s: %v %s", addr, err, out)
		}
		var r struct {
			Result struct {
				Certificate string `json:"certificate"`
				Key         string `json:"private_key"`
			} `json:"result"`
		}
		if json.Unmarshal(out, &r) != nil || r.Result.Certificate == "" {
			t.Fatalf("the authority answered %s", out)
		}
		cert, key = filepath.Join(dir, name+".pem"), filepath.Join(dir, name+"-key.pem")
		os.WriteFile(cert, []byte(r.Result.Certificate), 0o600)
		os.WriteFile(key, []byte(r.Result.Key), 0o600)
		return cert, key
	}
	keepRoot := func(name string) string {
		b, err := os.ReadFile(n[2].h.dir + "/srv/intranet/tls/root.pem")
		if err != nil {
			t.Fatal(err)
		}
		f := filepath.Join(dir, name)
		os.WriteFile(f, b, 0o600)
		return f
	}
	mtls := func(root, cert, key string) (string, error) {
		out, err := exec.Command("ip", "netns", "exec", n[3].h.netns, "curl", "-sS", "-m", "5", "--cacert", root, "--cert", cert, "--key", key,
			"--resolve", "intranet.internal:8443:"+n[2].oaddr(), "https://intranet.internal:8443/").CombinedOutput()
		return string(out), err
	}
	oldRoot := keepRoot("old-root.pem")
	oldCert, oldKey := issue(n[1].oaddr(), "old-client")
	eventually(t, 30*time.Second, "intranet answers a client of the authority on n1, over TLS it issued", func() (bool, string) {
		out, err := mtls(oldRoot, oldCert, oldKey)
		return err == nil && strings.Contains(out, "intranet: hello CN=old-client"), out + errString(err)
	})
	ids := func() map[string]string {
		m := map[string]string{}
		for _, a := range n[1:] {
			for _, l := range strings.Split(strings.TrimSpace(a.h.podman("ps", "-a", "--format", "{{.Names}} {{.ID}}")), "\n") {
				if f := strings.Fields(l); len(f) == 2 {
					m[a.name+"/"+f[0]] = f[1]
				}
			}
		}
		return m
	}
	before := ids()

	n[1].mesh("assign", "n3", "authority", "--wait")
	n[1].mesh("unassign", "n1", "authority", "--wait")
	eventually(t, 60*time.Second, "intranet trusts the root of the authority on n3", func() (bool, string) {
		b, _ := os.ReadFile(n[2].h.dir + "/srv/intranet/tls/root.pem")
		o, _ := os.ReadFile(oldRoot)
		return len(b) > 0 && string(b) != string(o) && n[2].h.containerID("intranet.server") != before["n2/intranet.server"], string(b)
	})
	newRoot := keepRoot("new-root.pem")
	newCert, newKey := issue(n[3].oaddr(), "new-client")
	eventually(t, 30*time.Second, "intranet answers a client of the new authority", func() (bool, string) {
		out, err := mtls(newRoot, newCert, newKey)
		return err == nil && strings.Contains(out, "intranet: hello CN=new-client"), out + errString(err)
	})
	if out, err := mtls(newRoot, oldCert, oldKey); err == nil || strings.Contains(out, "hello") {
		t.Fatalf("a client certificate of the old authority was accepted: %s", out)
	}
	if out, err := mtls(oldRoot, newCert, newKey); err == nil {
		t.Fatalf("intranet's certificate verified against the old root: %s", out)
	}
	// One apply on n2 did it: the binding, the gate, the server (why reads
	// the plan's versions and the node's last apply).
	why := n[1].mesh("why", "n2", "intranet.server")
	for _, w := range []string{"by `mesh unassign n1 authority`", "~ replace container intranet.server (intranet): step trust ran",
		"restart-on: /srv/intranet/authority.binding changed"} {
		if !strings.Contains(why, w) {
			t.Fatalf("mesh why lacks %q:\n%s", w, why)
		}
	}
	after := ids()
	for name, id := range before {
		switch name {
		case "n2/intranet.server", "n1/authority.server":
			continue
		}
		if strings.HasSuffix(name, "/intranet.trust") || strings.HasSuffix(name, "/authority.init") {
			continue // steps: the gate ran again
		}
		if after[name] != id {
			t.Errorf("%s was replaced or removed by the authority's move (%s -> %q)", name, id, after[name])
		}
	}
	if _, ok := after["n1/authority.server"]; ok {
		t.Error("the authority's server is still on n1")
	}
	if after["n3/authority.server"] == "" {
		t.Error("no authority server on n3")
	}
	t.Logf("the authority moved: %d containers on three nodes kept, intranet.server recreated with the new root", len(before)-2)

	// Issue 29 item 4: a draining node keeps what it runs and takes
	// nothing new, until --undo.
	authority := n[3].h.containerID("authority.server")
	n[1].mesh("node", "drain", "n3")
	if out := n[1].meshFails("assign", "n3", "whoami"); !strings.Contains(out, "node n3 is draining") || !strings.Contains(out, "mesh node drain n3 --undo") {
		t.Fatalf("an assign to a draining node: %s", out)
	}
	if st := n[2].mesh("status"); !regexp.MustCompile(`(?m)^n3 .*draining; `).MatchString(st) {
		t.Fatalf("status does not show n3 draining:\n%s", st)
	}
	n[1].mesh("node", "drain", "n3", "--undo")
	n[1].mesh("assign", "n3", "whoami", "--wait")
	if id := n[3].h.containerID("authority.server"); id != authority {
		t.Fatalf("the drain touched what runs on n3 (%s -> %s)", authority, id)
	}

	// Issue 29 item 2: mesh restart, from n1, of whoami.web on n2 only:
	// the same container started again, n3's left alone, and why says who.
	startedAt := func(a *agent) string {
		return strings.TrimSpace(a.h.podman("inspect", "--format", "{{.State.StartedAt}}", "whoami.web"))
	}
	id2, at2, at3 := n[2].h.containerID("whoami.web"), startedAt(n[2]), startedAt(n[3])
	n[1].mesh("restart", "whoami.web", "--node", "n2", "--wait")
	if n[2].h.containerID("whoami.web") != id2 || startedAt(n[2]) == at2 {
		t.Fatalf("whoami.web on n2 was not restarted in place (%s at %s -> %s at %s)", id2, at2, n[2].h.containerID("whoami.web"), startedAt(n[2]))
	}
	if startedAt(n[3]) != at3 {
		t.Fatal("a restart on n2 restarted n3's whoami.web")
	}
	why = n[1].mesh("why", "n2", "whoami.web")
	for _, w := range []string{"by `mesh restart whoami.web --node n2`", "~ restart container whoami.web (whoami): mesh restart"} {
		if !strings.Contains(why, w) {
			t.Fatalf("mesh why lacks %q:\n%s", w, why)
		}
	}
	if out := n[1].meshFails("restart", "whoami.nothing"); !strings.Contains(out, `module whoami has no container "whoami.nothing" (it has whoami.web)`) {
		t.Fatalf("a restart of a container that is not there: %s", out)
	}
}

// certSerial is the serial of the certificate served for name at addr:443,
// as seen from a's namespace ("" when none is).
func certSerial(a *agent, addr, name string) string {
	c := exec.Command("ip", "netns", "exec", a.h.netns, "sh", "-c",
		fmt.Sprintf("echo | openssl s_client -connect %s:443 -servername %s 2>/dev/null | openssl x509 -noout -serial", addr, name))
	out, _ := c.CombinedOutput()
	if s := strings.TrimSpace(string(out)); strings.HasPrefix(s, "serial=") {
		return s
	}
	return ""
}

// pebbleBed is Debian's pebble, Let's Encrypt's test ACME server, running
// in a node's namespace with that node's mesh resolver as its DNS.
type pebbleBed struct {
	directory string // its ACME directory URL
	tlsRoot   string // the file of the certificate its own HTTPS serves
	mgmt      string // its management address (its issuing root)
	ns        string
	cmd       *exec.Cmd
	done      chan struct{}
}

func startPebble(t testing.TB, on *agent) *pebbleBed {
	t.Helper()
	dir := filepath.Join(multiDir, "pebble")
	os.MkdirAll(dir, 0o700)
	addr := on.addr()
	cert, key := filepath.Join(dir, "cert.pem"), filepath.Join(dir, "key.pem")
	if out, err := exec.Command("openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes", "-days", "2",
		"-subj", "/CN=pebble bed", "-addext", "subjectAltName=IP:"+addr, "-addext", "basicConstraints=critical,CA:TRUE",
		"-keyout", key, "-out", cert).CombinedOutput(); err != nil {
		t.Fatalf("pebble's certificate: %v\n%s", err, out)
	}
	cfg := fmt.Sprintf(`{"pebble": {"listenAddress": "%s:14000", "managementListenAddress": "%s:15000", "certificate": %q, "privateKey": %q,
  "httpPort": 80, "tlsPort": 443, "ocspResponderURL": "", "externalAccountBindingRequired": false, "certificateValidityPeriod": 60}}`, addr, addr, cert, key)
	cfgFile := filepath.Join(dir, "pebble-config.json")
	os.WriteFile(cfgFile, []byte(cfg), 0o600)
	logf, err := os.Create(filepath.Join(dir, "pebble.log"))
	if err != nil {
		t.Fatal(err)
	}
	p := &pebbleBed{directory: "https://" + addr + ":14000/dir", tlsRoot: cert, mgmt: "https://" + addr + ":15000", done: make(chan struct{})}
	p.cmd = exec.Command("ip", "netns", "exec", on.h.netns, "pebble", "-config", cfgFile, "-dnsserver", on.h.dnsAddr+":53")
	p.cmd.Env = append(os.Environ(), "PEBBLE_VA_NOSLEEP=1", "PEBBLE_WFE_NONCEREJECT=0")
	p.cmd.Stdout, p.cmd.Stderr = logf, logf
	if err := p.cmd.Start(); err != nil {
		t.Fatalf("start pebble: %v", err)
	}
	go func() { p.cmd.Wait(); logf.Close(); close(p.done) }()
	t.Cleanup(func() {
		p.stop()
		if t.Failed() {
			b, _ := os.ReadFile(filepath.Join(dir, "pebble.log"))
			t.Logf("pebble's log:\n%s", lastLines(string(b), 40))
		}
	})
	eventually(t, 30*time.Second, "pebble answers its directory", func() (bool, string) {
		out, err := exec.Command("ip", "netns", "exec", on.h.netns, "curl", "-sS", "-m", "3", "--cacert", cert, p.directory).CombinedOutput()
		return err == nil && strings.Contains(string(out), "newAccount"), string(out) + errString(err)
	})
	b, _ := os.ReadFile(filepath.Join(dir, "pebble.log"))
	if !strings.Contains(string(b), "validity period of 60 seconds") {
		t.Fatalf("pebble did not take the 60 s certificate lifetime:\n%s", b)
	}
	p.ns = on.h.netns
	return p
}

// root fetches the root Pebble issues under (made anew at each start) into
// a file.
func (p *pebbleBed) root(t testing.TB) string {
	t.Helper()
	f := filepath.Join(multiDir, "pebble", "issuing-root.pem")
	out, err := exec.Command("ip", "netns", "exec", p.ns, "curl", "-sS", "-m", "5", "--cacert", p.tlsRoot, "-o", f, p.mgmt+"/roots/0").CombinedOutput()
	if err != nil {
		t.Fatalf("pebble's root: %v\n%s", err, out)
	}
	return f
}

// log is what Pebble printed so far.
func (p *pebbleBed) log() string {
	b, _ := os.ReadFile(filepath.Join(multiDir, "pebble", "pebble.log"))
	return string(b)
}

func (p *pebbleBed) stop() {
	select {
	case <-p.done:
		return
	default:
	}
	p.cmd.Process.Kill()
	<-p.done
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
