package integration

import (
	"bytes"
	"crypto/sha256"
	"crypto/x509"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"encoding/pem"
	"fmt"
	meshagent "mesh/agent"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"
)

// The multi-node bed: three nodes, each in a network namespace of the bed's
// own on one bridge (addresses that exist only there), each with its own
// Podman service and storage, and its own resolver on 169.254.53.53 inside its
// namespace.
//
// Each node also has its own mount namespace, kept in multiMnt, where its
// directory's srv/ is bound over /srv (issue 34 item 4): its agent, its
// Podman service and their containers see /srv as that node's own disk, as
// on separate machines, and the host's /srv is never written. The examples
// run with their /srv paths as shipped; a test reads node i's files under
// multiDir/ni/srv.
const (
	multiDir    = "/var/tmp/mesh-mbed"
	multiBridge = "mbnbr0"
	multiNet    = "10.231.5."
	multiMnt    = "/run/mesh-mbed-mnt"
)

// mountNS makes netns ns's mount namespace, with srv bound over /srv.
func mountNS(t testing.TB, ns, srv string) {
	os.MkdirAll(multiMnt, 0o700)
	// The namespace files must sit on a private mount, or the bind of a
	// namespace file would propagate (and pin it) elsewhere.
	if exec.Command("mountpoint", "-q", multiMnt).Run() != nil {
		sh(t, "mount", "--bind", multiMnt, multiMnt)
		sh(t, "mount", "--make-private", multiMnt)
	}
	f := filepath.Join(multiMnt, ns)
	os.WriteFile(f, nil, 0o600)
	os.MkdirAll("/srv", 0o755)
	sh(t, "unshare", "--mount="+f, "--propagation", "slave", "mount", "--bind", srv, "/srv")
}

// unmountNS undoes mountNS for every node (their processes are gone).
func unmountNS() {
	entries, _ := os.ReadDir(multiMnt)
	for _, e := range entries {
		exec.Command("umount", "-l", filepath.Join(multiMnt, e.Name())).Run()
	}
	exec.Command("umount", "-l", multiMnt).Run()
	os.RemoveAll(multiMnt)
}

func multiCleanup() {
	exec.Command("pkill", "-f", multiDir).Run()
	for i := 1; i <= 5; i++ {
		dir := fmt.Sprintf("%s/n%d", multiDir, i)
		if _, err := os.Stat(dir + "/root"); err == nil {
			// In the node's mount namespace, where its storage is mounted.
			in := []string{}
			if f := filepath.Join(multiMnt, fmt.Sprintf("mbn%d", i)); exists(f) {
				in = []string{"nsenter", "--mount=" + f}
			}
			rm := append(in[:len(in):len(in)], "podman", "--root", dir+"/root", "--runroot", dir+"/runroot", "rm", "-af", "-t", "0")
			c := exec.Command(rm[0], rm[1:]...)
			c.Env = append(os.Environ(), "CONTAINERS_CONF="+dir+"/containers.conf")
			c.Run()
			um := append(in[:len(in):len(in)], "umount", "-l", dir+"/root/overlay")
			exec.Command(um[0], um[1:]...).Run()
		}
		exec.Command("ip", "netns", "del", fmt.Sprintf("mbn%d", i)).Run()
		// The robustness suite's tmpfs data dir, left mounted by a run
		// that was killed: RemoveAll cannot take a mount point away.
		exec.Command("umount", "-l", dir+"/data").Run()
		os.RemoveAll(filepath.Dir(meshagent.EnvDir(dir + "/data")))
		exec.Command("ip", "link", "del", fmt.Sprintf("mbn%d-h", i)).Run()
	}
	exec.Command("ip", "link", "del", multiBridge).Run()
	killConmons(multiDir)
	unmountNS()
	os.RemoveAll(multiDir)
}

// netnsLink makes node i's namespace, on the bed's bridge at multiNet.i.
func netnsLink(t testing.TB, i int) string {
	ns := fmt.Sprintf("mbn%d", i)
	sh(t, "ip", "netns", "add", ns)
	sh(t, "ip", "link", "add", ns+"-h", "type", "veth", "peer", "name", ns+"-n")
	sh(t, "ip", "link", "set", ns+"-h", "master", multiBridge, "up")
	sh(t, "ip", "link", "set", ns+"-n", "netns", ns)
	sh(t, "ip", "netns", "exec", ns, "sh", "-c", fmt.Sprintf("ip link set lo up && ip link set %s-n name eth0 && ip addr add %s%d/24 dev eth0 && ip link set eth0 up", ns, multiNet, i))
	return ns
}

// newNetnsNode makes node i: its namespace, link, Podman, data dir.
func newNetnsNode(t testing.TB, i int) *agent {
	ns := netnsLink(t, i)
	h := &host{t: t, dir: fmt.Sprintf("%s/n%d", multiDir, i), dnsAddr: "169.254.53.53", netns: ns}
	os.MkdirAll(h.dir+"/srv", 0o755)
	mountNS(t, ns, h.dir+"/srv")
	h.conf = h.dir + "/containers.conf"
	os.WriteFile(h.conf, []byte(rootfulConf(h.dir)), 0o644)
	h.sock = h.dir + "/podman.sock"
	h.importImage()
	h.startService()
	return &agent{name: fmt.Sprintf("n%d", i), h: h, n: &node{t: t, dir: h.dir + "/data"}}
}

func fileDigest(t testing.TB, p string) string {
	b, err := os.ReadFile(p)
	if err != nil {
		t.Fatal(err)
	}
	return fmt.Sprintf("%x", sha256.Sum256(b))
}

func (a *agent) addr() string { return multiNet + strings.TrimPrefix(a.h.netns, "mbn") }

// oaddr is the node's overlay address, as the mesh gave it: what its names
// answer and where its containers' ports are published.
func (a *agent) oaddr() string {
	a.h.t.Helper()
	if a.overlay != "" {
		return a.overlay
	}
	var nodes []struct {
		Name    string `json:"name"`
		Overlay string `json:"overlay_address"`
	}
	eventually(a.h.t, 30*time.Second, a.name+" has its overlay address", func() (bool, string) {
		out, err := a.command("node", "list", "--json", "--data-dir", a.n.dir).Output()
		if err != nil {
			return false, err.Error()
		}
		json.Unmarshal(out, &nodes)
		for _, n := range nodes {
			if n.Name == a.name && n.Overlay != "" {
				a.overlay = n.Overlay
				return true, ""
			}
		}
		return false, string(out)
	})
	return a.overlay
}

// resolve asks the node's own resolver, inside its namespace.
func (a *agent) resolve(name string) string {
	out, _ := exec.Command("ip", "netns", "exec", a.h.netns, dnsqBin, "-server", "169.254.53.53:53", name).CombinedOutput()
	return string(out)
}

// multiBed makes the bed's bridge and three nodes (namespaces, Podman,
// data dirs), none initialised yet. n[0] is unused.
func multiBed(t testing.TB) []*agent {
	if os.Geteuid() != 0 {
		t.Fatal("the multi-node beds run as root (network namespaces); run contrib/test.sh as root")
	}
	multiCleanup()
	t.Cleanup(multiCleanup)
	os.MkdirAll(multiDir, 0o755)
	sh(t, "ip", "link", "add", multiBridge, "type", "bridge")
	sh(t, "ip", "link", "set", multiBridge, "up")
	return []*agent{nil, newNetnsNode(t, 1), newNetnsNode(t, 2), newNetnsNode(t, 3)}
}

// startThree makes the bed's three nodes: n1 inits, n2 joins through n1, n3
// through n2 (which hands the request to the leader). n[0] is unused.
func startThree(t testing.TB, before ...func([]*agent)) ([]*agent, string) {
	n := multiBed(t)
	for _, f := range before {
		f(n)
	}
	n[1].run("init", "--name", "n1", "--address", n[1].addr(), "--data-dir", n[1].n.dir)
	n[1].start()
	token := strings.TrimSpace(n[1].mesh("token"))
	n[2].run("join", n[1].addr(), "--token", token, "--name", "n2", "--address", n[2].addr(), "--data-dir", n[2].n.dir)
	n[2].start()
	// n3 with a token that ends (mesh token --ttl), through n2: its end
	// and its derived secret reach the leader.
	ttlToken := strings.TrimSpace(n[1].mesh("token", "--ttl", "10m"))
	if ttlToken == token || !strings.HasPrefix(ttlToken, "mesh1.") {
		t.Fatalf("mesh token --ttl 10m: %q", ttlToken)
	}
	joinFromStdin(t, n[3], n[2].addr(), ttlToken, "--name", "n3", "--address", n[3].addr(), "--data-dir", n[3].n.dir)
	n[3].start()
	eventually(t, 30*time.Second, "n3 sees three nodes and a leader", func() (bool, string) {
		var st struct {
			Leader string
			Nodes  []struct{ Name string }
		}
		// Until n3 has replicated the init, status says the mesh is not
		// initialised: that is a wait, not a failure.
		out, err := n[3].command("status", "--json", "--data-dir", n[3].n.dir).Output()
		json.Unmarshal(out, &st)
		return err == nil && len(st.Nodes) == 3 && st.Leader != "", fmt.Sprintf("%+v %v", st, err)
	})
	for _, a := range n[1:] {
		a.oaddr() // read while every agent runs (a test may kill one)
	}
	return n, token
}

// joinFromStdin runs mesh join on a with the token on its standard input,
// and checks, while the join waits for it, that no process shows the token
// in its command line (what ps prints).
func joinFromStdin(t testing.TB, a *agent, peer, token string, args ...string) {
	t.Helper()
	cmd := a.command(append([]string{"join", peer, "--token-file", "-"}, args...)...)
	in, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	// The join is waiting on its standard input: look at every process.
	eventually(t, 10*time.Second, "the join is running", func() (bool, string) {
		b, _ := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", cmd.Process.Pid))
		return strings.Contains(string(b), "join"), string(b)
	})
	procs, _ := filepath.Glob("/proc/[0-9]*/cmdline")
	for _, p := range procs {
		if b, err := os.ReadFile(p); err == nil && strings.Contains(string(b), token) {
			t.Fatalf("%s shows the join token: %q", p, b)
		}
	}
	fmt.Fprintln(in, token)
	in.Close()
	if err := cmd.Wait(); err != nil || !strings.Contains(out.String(), "joined the mesh") {
		t.Fatalf("join with the token on stdin: %v\n%s", err, out.String())
	}
}

func TestMultiNode(t *testing.T) {
	n, token := startThree(t)

	// A wrong token, and a data dir of another mesh, are refused.
	bad := withSecret(t, token, "not-the-secret")
	if out := n[3].runFails("join", n[1].addr(), "--token", bad, "--name", "n4", "--address", multiNet+"4", "--data-dir", multiDir+"/n4"); !strings.Contains(out, "secret is not valid") {
		t.Fatalf("wrong token: %s", out)
	}
	// A token holder cannot take a live node's place: a join under n2's
	// name and address, from another machine, is refused and says how.
	if out := n[3].runFails("join", n[1].addr(), "--token", token, "--name", "n2", "--address", n[2].addr(), "--data-dir", multiDir+"/thief"); !strings.Contains(out, `node "n2" is already in the mesh`) || !strings.Contains(out, "--replace") {
		t.Fatalf("a join under a live node's name: %s", out)
	}
	if out := n[1].mesh("node", "list"); strings.Count(out, "\nn2 ") != 1 {
		t.Fatalf("after a refused join under its name:\n%s", out)
	}
	// and the real n2 still writes (its certificate is still the one taken).
	n[2].mesh("node", "public-domain", "n2", "thief.test")
	n[2].mesh("node", "public-domain", "n2", "--clear")
	other := multiDir + "/other"
	n[3].run("init", "--name", "o1", "--address", "127.0.0.1", "--port", freePort(t), "--data-dir", other)
	if out := n[3].runFails("join", n[1].addr(), "--token", token, "--name", "n4", "--address", multiNet+"4", "--data-dir", other); !strings.Contains(out, "belongs to mesh") {
		t.Fatalf("data dir of another mesh: %s", out)
	}

	// A fourth node joins as a non-voting replica (three voters by default);
	// after mesh token --rotate the old token admits no one.
	n4 := newNetnsNode(t, 4)
	if out := n[1].meshFails("token", "--ttl", "10s"); !strings.Contains(out, "between 1m and") {
		t.Fatalf("mesh token --ttl 10s: %s", out)
	}
	// The join line, for a machine that has mesh.
	if line := strings.Fields(n[1].mesh("token", "--join-line")); len(line) != 4 || line[0] != "MESH_TOKEN="+token || line[1] != "mesh" || line[2] != "join" || line[3] != n[1].addr() {
		t.Fatalf("join line: %q", line)
	}
	// n4 has no mesh binary: it is brought up from the one line
	// `mesh token --install-line` prints, as pasted, run in its namespace
	// (only the install path is moved into the bed). The line fetches the
	// CA, checks it against the token, fetches n1's binary over TLS
	// verified by it and joins: its name is its host name (a UTS namespace
	// of its own says n4), its address the one it reaches n1 from.
	n4bin := n4.h.dir + "/bin/mesh"
	os.MkdirAll(n4.h.dir+"/bin", 0o755)
	if _, err := os.Stat(n4bin); err == nil {
		t.Fatal("n4 has a mesh binary before the install line ran")
	}
	install := strings.TrimSpace(n[1].mesh("token", "--install-line"))
	if !strings.HasPrefix(install, "printf '%s\\n' '"+token+"' | sh -ec '") || !strings.Contains(install, "sha256sum -c") || !strings.Contains(install, "--cacert") {
		t.Fatalf("install line: %s", install)
	}
	// The token is in no process's command line: only in the pasting
	// shell's printf (a builtin), never in the sh -ec script.
	if _, script, _ := strings.Cut(install, " | sh -ec "); strings.Contains(script, token) {
		t.Fatalf("the install line's script holds the token (ps shows it while it runs): %s", install)
	}
	bringUp := time.Now()
	run := exec.Command("unshare", "--uts", "sh", "-c", `hostname N4.bed.example && eval "$1"`, "_", strings.ReplaceAll(install, "/usr/local/bin/mesh", n4bin))
	run.Env = append(os.Environ(), "MESH_DATA_DIR="+n4.n.dir)
	if out, err := inNetns(n4.h.netns, run).CombinedOutput(); err != nil || !strings.Contains(string(out), "joined the mesh as n4 ("+n4.addr()+")") {
		t.Fatalf("the pasted install line: %v\n%s", err, out)
	}
	if a, b := fileDigest(t, n4bin), fileDigest(t, meshBin); a != b {
		t.Fatalf("n4's fetched binary differs from n1's (%s, %s)", a, b)
	}
	// A CA that is not the mesh's (a digest that does not match) stops the
	// line before anything is fetched or run.
	digest := regexp.MustCompile(`echo "([0-9a-f]{64})  `).FindStringSubmatch(install)
	if digest == nil {
		t.Fatalf("no CA digest in the install line: %s", install)
	}
	badCA := strings.Replace(install, digest[1], strings.Repeat("0", 64), 1)
	badCA = strings.ReplaceAll(badCA, "/usr/local/bin/mesh", n4.h.dir+"/bin/mesh-bad")
	if out, err := inNetns(n4.h.netns, exec.Command("sh", "-c", badCA)).CombinedOutput(); err == nil || exists(n4.h.dir+"/bin/mesh-bad") {
		t.Fatalf("a wrong CA digest did not stop the install line: %v\n%s", err, out)
	}
	// The binary goes to a token holder only: a stranger's curl is refused
	// (before it takes a download slot).
	binURL := regexp.MustCompile(`https://[^ ]+/v1/binary`).FindString(install)
	if out, err := inNetns(n4.h.netns, exec.Command("curl", "-sk", "-o", "/dev/null", "-w", "%{http_code}", binURL)).CombinedOutput(); err != nil || string(out) != "401" {
		t.Fatalf("a stranger's curl of %q: %v %s, want 401", binURL, err, out)
	}
	n4.bin = n4bin
	n4.start()
	eventually(t, 30*time.Second, "n4 replicates the state", func() (bool, string) {
		out := n4.resolve("n1.internal")
		return strings.Contains(out, n[1].oaddr()), out
	})
	t.Logf("n4 brought up from the install line (fetch, join, agent, state replicated) in %s", time.Since(bringUp).Round(10*time.Millisecond))
	var nodes []struct {
		Name  string
		Voter bool
	}
	json.Unmarshal([]byte(n4.mesh("node", "list", "--json")), &nodes)
	if len(nodes) != 4 || nodes[3].Name != "n4" || nodes[3].Voter || !nodes[2].Voter {
		t.Fatalf("voters: %+v", nodes)
	}
	// Each node's certificate key is recorded in the state (the leader
	// records a joiner's as it admits it), and it is the key of the
	// certificate in that node's data dir: a certificate for its name with
	// another key is refused (cluster.TestPinnedCertificateKey).
	all := map[string]*agent{"n1": n[1], "n2": n[2], "n3": n[3], "n4": n4}
	eventually(t, 60*time.Second, "every node's certificate key recorded", func() (bool, string) {
		out := n[1].mesh("node", "list", "--json")
		var keys []struct {
			Name    string
			CertKey string `json:"cert_key"`
		}
		json.Unmarshal([]byte(out), &keys)
		for _, k := range keys {
			if a := all[k.Name]; a == nil || k.CertKey != certKeyOf(t, filepath.Join(a.n.dir, "node.crt")) {
				return false, out
			}
		}
		return len(keys) == 4, out
	})
	// Only voters hold the CA key and the join secret (issue 14): n4
	// cannot print the token; n2, a voter that joined after n1, can once a
	// voter has sealed them to it; no data dir holds the CA key in plain.
	if out := n4.meshFails("token"); !strings.Contains(out, "only voters hold the mesh's CA key and join secret") {
		t.Fatalf("mesh token on a non-voter: %s", out)
	}
	eventually(t, 15*time.Second, "n2, a voter, prints the token", func() (bool, string) {
		out, err := n[2].command("token", "--data-dir", n[2].n.dir).CombinedOutput()
		return err == nil && strings.TrimSpace(string(out)) == token, string(out)
	})
	caKey, sealedCA := caKeyOf(t, n[1])
	for _, a := range []*agent{n[1], n[2], n[3], n4} {
		if hits := grepTree(t, a.n.dir, caKey); len(hits) > 0 {
			t.Fatalf("%s's data dir holds the CA key in plain text in %v", a.name, hits)
		}
	}
	if hits := grepTree(t, n4.n.dir, sealedCA); len(hits) == 0 {
		t.Fatal("n4 does not even replicate the sealed CA key (is the search blind?)")
	}
	rotated := strings.TrimSpace(n[2].mesh("token", "--rotate"))
	if rotated == token {
		t.Fatal("rotation kept the token")
	}
	if out := n4.runFails("join", n[1].addr(), "--token", token, "--name", "n5", "--address", multiNet+"5", "--data-dir", multiDir+"/n5"); !strings.Contains(out, "secret is not valid") {
		t.Fatalf("old token after rotation: %s", out)
	}
	// Removal: refused while it runs modules (unless --force), and for a voter
	// whose loss would break quorum; removed, its certificate is refused.
	n[1].mesh("module", "add", n[1].manifest("bedm99", bedProvider, map[string]string{"name": "bedm99"}))
	n[1].mesh("assign", "n4", "bedm99")
	if out := n[1].meshFails("node", "remove", "n4"); !strings.Contains(out, "still runs bedm99") {
		t.Fatalf("remove with assignments: %s", out)
	}
	n[1].mesh("node", "remove", "n4", "--force")
	if out := n4.meshFails("assign", "n1", "bedm99"); !strings.Contains(out, "certificate of a current node") {
		t.Fatalf("a removed node's write: %s\n--- n4:\n%s\n--- n1:\n%s", out, tail(n4.log(), 15), tail(n[1].log(), 15))
	}
	n4.stop()

	// On n3, assign a module to n2: it runs there and every resolver answers
	// its name with n2's address.
	web := n[3].manifest("bedweb", bedWeb, nil)
	n[3].mesh("module", "add", web)
	n[3].mesh("assign", "n2", "bedweb", "--wait")
	box := n[2].h.containerID("bedweb.box")
	if box == "" {
		t.Fatal("bedweb.box is not on n2")
	}
	for i := 1; i <= 3; i++ {
		i := i
		eventually(t, 10*time.Second, fmt.Sprintf("n%d's resolver answers bedweb.internal", i), func() (bool, string) {
			out := n[i].resolve("bedweb.internal")
			return strings.Contains(out, "\tA\t"+n[2].oaddr()), out
		})
	}

	// ADR 0099 whole: the authority moves; on n2 the binding is rewritten, the
	// gate runs again and the server is recreated after it, in one apply.
	auth := n[1].manifest("bedauth", bedProvider, map[string]string{"name": "bedauth"})
	proxy := n[1].manifest("bedproxy", bedProxy, nil)
	n[1].mesh("module", "add", auth, proxy)
	n[1].mesh("assign", "n1", "bedauth", "--wait")
	n[1].mesh("assign", "n2", "bedproxy", "--wait")
	server := n[2].h.containerID("bedproxy.server")
	n[1].mesh("unassign", "n1", "bedauth")
	n[1].mesh("assign", "n3", "bedauth", "--wait")
	eventually(t, 30*time.Second, "n2 applies the move", func() (bool, string) {
		o, r := n[2].outcome("bedproxy.server")
		return o == "replaced", o + " " + r
	})
	if o, r := n[2].outcome("bedproxy.gate"); o != "ran" || !strings.Contains(r, "db.binding changed") {
		t.Fatalf("gate: %s; %s", o, r)
	}
	if o, r := n[2].outcome("bedproxy.server"); !strings.HasPrefix(r, "step gate ran") {
		t.Fatalf("server: %s; %s", o, r)
	}
	if b, _ := os.ReadFile(n[1].h.dir + "/srv/bedproxy/data/seen.binding"); !strings.Contains(string(b), "node=n3") {
		t.Fatalf("the gate saw %q", b)
	}
	if n[2].h.containerID("bedproxy.server") == server || n[2].h.containerID("bedweb.box") != box {
		t.Fatal("wrong containers replaced on n2")
	}

	// Issue 151 whole: with containers on n1, 25 modules assigned one by one
	// to n2 and public domains set and cleared replace nothing on n1.
	n[1].mesh("assign", "n1", "bedweb", "--wait")
	n1box := n[1].h.containerID("bedweb.box")
	var files []string
	for i := 0; i < 25; i++ {
		name := fmt.Sprintf("bedm%02d", i)
		files = append(files, n[1].manifest(name, bedProvider, map[string]string{"name": name}))
	}
	n[1].mesh(append([]string{"module", "add"}, files...)...)
	for i := 0; i < 25; i++ {
		n[1].mesh("assign", "n2", fmt.Sprintf("bedm%02d", i))
	}
	n[1].mesh("node", "public-domain", "n2", "zurag.test")
	n[1].mesh("node", "public-domain", "n1", "other.test")
	n[1].mesh("node", "public-domain", "n2", "--clear")
	n[1].mesh("node", "public-domain", "n1", "--clear")
	n[1].mesh("assign", "n2", "bedm24", "--wait")
	if n[1].h.containerID("bedweb.box") != n1box || n[2].h.containerID("bedweb.box") != box {
		t.Fatal("names moving replaced a container")
	}

	// Cut n3 off: its resolver keeps answering, a write there fails fast and
	// says why; healed, it catches up.
	sh(t, "ip", "link", "set", "mbn3-h", "down")
	if out := n[3].resolve("bedweb.internal"); !strings.Contains(out, n[2].oaddr()) {
		t.Fatalf("cut-off resolver: %s", out)
	}
	start := time.Now()
	out := n[3].meshFails("assign", "n3", "bedm00")
	if took := time.Since(start); took > 5*time.Second || !strings.Contains(out, "no leader is reachable") {
		t.Fatalf("write on a cut-off node took %s: %s", took, out)
	}
	t.Logf("a write on the cut-off node failed after %s", time.Since(start).Round(time.Millisecond))
	n[1].mesh("assign", "n1", "bedm00")
	// With n3 unreachable, removing the other healthy voter would leave no
	// majority: refused. (Without --force, and it runs modules, so a check
	// that wrongly passed would still be refused, for its modules.)
	var st struct{ Leader string }
	json.Unmarshal([]byte(n[1].mesh("status", "--json")), &st)
	healthy := "n1"
	if st.Leader == "n1" {
		healthy = "n2"
	}
	n[1].mesh("assign", healthy, "bedm01")
	eventually(t, 20*time.Second, "removing the last healthy voter but the leader is refused for quorum", func() (bool, string) {
		out := n[1].meshFails("node", "remove", healthy)
		return strings.Contains(out, "a majority needs"), out
	})
	sh(t, "ip", "link", "set", "mbn3-h", "up")
	eventually(t, 30*time.Second, "n3 catches up", func() (bool, string) {
		out := n[3].resolve("bedm00.internal")
		return strings.Contains(out, n[1].oaddr()), out
	})

	// kill -9 the leader while a client on another node issues 200 assigns:
	// a new leader is elected, and once the old one is back every assign that
	// was acknowledged is on every node.
	var files2 []string
	for i := 0; i < 70; i++ {
		name := fmt.Sprintf("bedk%02d", i)
		files2 = append(files2, n[1].manifest(name, "module: {{name}}\n", map[string]string{"name": name}))
	}
	n[1].mesh(append([]string{"module", "add"}, files2...)...)
	json.Unmarshal([]byte(n[1].mesh("status", "--json")), &st)
	leader := n[1]
	for i := 1; i <= 3; i++ {
		if n[i].name == st.Leader {
			leader = n[i]
		}
	}
	client := n[1]
	if client == leader {
		client = n[2]
	}
	// The client's agent logs JSON from here on (issue 12): every line of it
	// must parse, and Raft's warnings about the lost leader come at WARN.
	client.stop()
	client.json = true
	client.start()
	// The third node (neither the client nor the leader) is cut off for
	// assigns 20 to 50 and heals; the leader is killed at 60. Every
	// acknowledged assign must end on every node; every refused one must
	// say why.
	third := n[1]
	for i := 1; i <= 3; i++ {
		if n[i] != leader && n[i] != client {
			third = n[i]
		}
	}
	var acked []string
	failed := 0
	reasons := map[string]int{}
	var victim *agent
	for i := 0; i < 200; i++ {
		switch i {
		case 20:
			sh(t, "ip", "link", "set", third.h.netns+"-h", "down")
		case 50:
			sh(t, "ip", "link", "set", third.h.netns+"-h", "up")
		case 60:
			leader.cmd.Process.Kill() // SIGKILL: no goodbye
			leader.cmd.Wait()
			leader.cmd = nil
		case 100:
			leader.start()
		case 120:
			// A follower (not the client), which applies commits from the
			// leader's notices ahead of Raft, is killed mid-stream and back
			// at 150: it must end with every acknowledged assign.
			var now struct{ Leader string }
			json.Unmarshal([]byte(client.mesh("status", "--json")), &now)
			victim = third
			if third.name == now.Leader {
				victim = leader
			}
			victim.cmd.Process.Kill()
			victim.cmd.Wait()
			victim.cmd = nil
		case 150:
			victim.start()
		}
		node, module := fmt.Sprintf("n%d", i%3+1), fmt.Sprintf("bedk%02d", i/3)
		out, err := client.command("assign", node, module, "--data-dir", client.n.dir).CombinedOutput()
		if err == nil {
			acked = append(acked, node+"/"+module)
			continue
		}
		failed++
		said := ""
		for _, why := range []string{"no leader is reachable", "may or may not have been applied", "did not answer within"} {
			if strings.Contains(string(out), why) {
				said = why
			}
		}
		if said == "" {
			t.Fatalf("assign %d was refused without saying why:\n%s", i, out)
		}
		reasons[said]++
	}
	t.Logf("%s cut off for assigns 20-50, kill -9 of %s at assign 60, back at 100, kill -9 of the follower %s at 120 and back at 150: %d of 200 acknowledged, %d refused (%v)", third.name, leader.name, victim.name, len(acked), failed, reasons)
	raftWarns := 0
	for _, l := range strings.Split(client.log(), "\n") {
		var line struct{ Time, Level, Msg, Component string }
		if err := json.Unmarshal([]byte(l), &line); err != nil || line.Time == "" || line.Level == "" || line.Msg == "" {
			t.Fatalf("--log-format json wrote a line that is not a log object (%v): %q", err, l)
		}
		if line.Component == "raft" && line.Level == "WARN" {
			raftWarns++
		}
	}
	if raftWarns == 0 {
		t.Fatalf("no raft line at WARN in the client's JSON log after the leader was killed:\n%s", client.log())
	}
	client.json = false // the restarts below read text lines
	if len(acked) < 150 {
		t.Fatalf("only %d assigns acknowledged: the mesh did not recover from losing its leader", len(acked))
	}
	for i := 1; i <= 3; i++ {
		i := i
		eventually(t, 30*time.Second, fmt.Sprintf("n%d holds every acknowledged assign", i), func() (bool, string) {
			var mods []struct {
				Name  string
				Nodes []string
			}
			json.Unmarshal([]byte(n[i].mesh("module", "list", "--json")), &mods)
			have := map[string]bool{}
			for _, m := range mods {
				for _, nd := range m.Nodes {
					have[nd+"/"+m.Name] = true
				}
			}
			for _, a := range acked {
				if !have[a] {
					return false, "missing " + a
				}
			}
			return true, ""
		})
	}

	// Restart all three agents: no container replaced, no step rerun.
	ids := []string{n[1].h.containerID("bedweb.box"), n[2].h.containerID("bedweb.box"), n[2].h.containerID("bedproxy.server")}
	gate, _ := os.ReadFile(n[1].h.dir + "/srv/bedproxy/data/gate.log")
	for i := 1; i <= 3; i++ {
		n[i].stop()
	}
	for i := 1; i <= 3; i++ {
		n[i].start()
	}
	for i := 1; i <= 3; i++ {
		if _, mutations, _ := n[i].nextApply(0); mutations != 0 {
			t.Fatalf("n%d's first apply after a restart made %d mutations", i, mutations)
		}
	}
	after := []string{n[1].h.containerID("bedweb.box"), n[2].h.containerID("bedweb.box"), n[2].h.containerID("bedproxy.server")}
	if strings.Join(ids, ",") != strings.Join(after, ",") {
		t.Fatalf("containers replaced by a restart: %v -> %v", ids, after)
	}
	if g, _ := os.ReadFile(n[1].h.dir + "/srv/bedproxy/data/gate.log"); string(g) != string(gate) {
		t.Fatal("a restart reran the gate")
	}
}

// withSecret returns token with another secret: well formed, not valid.
func withSecret(t testing.TB, token, secret string) string {
	b, err := base64.RawURLEncoding.DecodeString(strings.TrimPrefix(token, "mesh1."))
	if err != nil {
		t.Fatal(err)
	}
	var m map[string]string
	json.Unmarshal(b, &m)
	m["s"] = secret
	b, _ = json.Marshal(m)
	return "mesh1." + base64.RawURLEncoding.EncodeToString(b)
}

const bedProxy = `module: bedproxy
resources:
  - directory: {{root}}/bedproxy
  - directory: {{root}}/bedproxy/data
  - binding: {{root}}/bedproxy/db.binding
    provider: bedauth
  - step: gate
    image: localhost/mesh-bed-busybox:1
    command: ["sh", "-c", "echo ran >> /data/gate.log; cp /db.binding /data/seen.binding"]
    mounts: ["{{root}}/bedproxy/data:/data", "{{root}}/bedproxy/db.binding:/db.binding:ro"]
    restart-on: [{{root}}/bedproxy/db.binding]
  - container: bedproxy.server
    image: localhost/mesh-bed-busybox:1
    command: ["sh", "-c", "while true; do sleep 1; done"]
    mounts: ["{{root}}/bedproxy/db.binding:/db.binding:ro"]
    restart-on: [gate, {{root}}/bedproxy/db.binding]
`

func tail(s string, n int) string {
	l := strings.Split(s, "\n")
	if len(l) > n {
		l = l[len(l)-n:]
	}
	return strings.Join(l, "\n")
}

// certKeyOf is the hex SHA-256 of the public key of the certificate in file,
// as the state records a node's.
func certKeyOf(t *testing.T, file string) string {
	t.Helper()
	b, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	blk, _ := pem.Decode(b)
	if blk == nil {
		t.Fatalf("%s holds no PEM block", file)
	}
	c, err := x509.ParseCertificate(blk.Bytes)
	if err != nil {
		t.Fatal(err)
	}
	d := sha256.Sum256(c.RawSubjectPublicKeyInfo)
	return hex.EncodeToString(d[:])
}
