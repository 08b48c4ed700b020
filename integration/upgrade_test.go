package integration

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// previousRelease is the commit of the release before the overlay (what
// landed before it): the upgrade bed builds it from its source, kept in testdata.
const previousRelease = "6806394"

// previousSource is the previous release's tree, as `git archive
// 6806394` writes it (a checkout without that history, an archive or a
// shallow clone, still has it), and previousDigest its sha256.
const (
	previousSource = "testdata/release-6806394.tar.gz"
	previousDigest = "8a90677ab495bd8ca9340ffb51e98f31cc6995449744a565902e2f08e00d1fcf"
)

// previousBinary builds the previous release's mesh, as its own README
// builds it, from previousSource.
func previousBinary(t *testing.T) string {
	t.Helper()
	b, err := os.ReadFile(previousSource)
	if err != nil {
		t.Fatalf("the upgrade bed builds the previous release from %s: %v", previousSource, err)
	}
	if d := sha256.Sum256(b); hex.EncodeToString(d[:]) != previousDigest {
		t.Fatalf("%s is not the archive of release %s (sha256 %x)", previousSource, previousRelease, d)
	}
	src := t.TempDir()
	if out, err := exec.Command("tar", "-xzf", previousSource, "-C", src).CombinedOutput(); err != nil {
		t.Fatalf("unpack %s: %v\n%s", previousSource, err, out)
	}
	bin := filepath.Join(filepath.Dir(meshBin), "mesh-"+previousRelease)
	build := exec.Command("go", "build", "-tags", "containers_image_openpgp", "-o", bin, ".")
	build.Dir = src
	build.Env = append(os.Environ(), "CGO_ENABLED=0")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("build %s: %v\n%s", previousRelease, err, out)
	}
	return bin
}

const upgradeProvider = `module: bedprov
resources:
  - directory: {{root}}/bedprov
  - file: {{root}}/bedprov/index.html
    content: "provider page\n"
  - container: bedprov.web
    image: localhost/mesh-bed-busybox:1
    command: ["httpd", "-f", "-p", "8090", "-h", "/www"]
    ports: ["8090:8090"]
    mounts: ["{{root}}/bedprov/index.html:/www/index.html:ro"]
`

const upgradePublic = `  - container: bedprov.public
    image: localhost/mesh-bed-busybox:1
    command: ["httpd", "-f", "-p", "8091", "-h", "/www"]
    public-ports: ["8091:8091"]
    mounts: ["{{root}}/bedprov/index.html:/www/index.html:ro"]
`

// A mesh made by the previous release (no overlay: names on the nodes'
// addresses, ports on every interface) upgrades node by node, the leader
// first. Until the last node runs the new binary nothing moves: the names
// answer the old addresses, the consumer reaches its provider, the older
// nodes apply every command the newer ones write (none they would stop
// on). With the last, every node gives its overlay key, the names move to
// the overlay, the provider's container is replaced once to publish on its
// node's overlay address, and the port no longer answers an outsider.
func TestOverlayUpgrade(t *testing.T) {
	old := previousBinary(t)
	n := multiBed(t)
	for _, a := range n[1:] {
		a.bin = old
	}
	n[1].run("init", "--name", "n1", "--address", n[1].addr(), "--data-dir", n[1].n.dir)
	n[1].start()
	token := strings.TrimSpace(n[1].mesh("token"))
	for _, a := range n[2:] {
		a.run("join", n[1].addr(), "--token", token, "--name", a.name, "--address", a.addr(), "--data-dir", a.n.dir)
		a.start()
	}
	threeNodes := func(a *agent) {
		t.Helper()
		eventually(t, 60*time.Second, a.name+" sees three nodes, each reachable, and a leader", func() (bool, string) {
			var st struct {
				Leader string
				Nodes  []struct {
					Name      string
					Reachable bool
				}
			}
			out, err := a.command("status", "--json", "--data-dir", a.n.dir).Output()
			json.Unmarshal(out, &st)
			ok := err == nil && len(st.Nodes) == 3 && st.Leader != ""
			for _, nd := range st.Nodes {
				ok = ok && nd.Reachable
			}
			return ok, fmt.Sprintf("%v %s", err, out)
		})
	}
	threeNodes(n[3])
	n[1].mesh("module", "add", n[1].manifest("bedprov", upgradeProvider, nil), n[2].manifest("bedcons", overlayConsumer, nil))
	n[1].mesh("assign", "n1", "bedprov", "--wait")
	n[1].mesh("assign", "n2", "bedcons", "--wait")
	consumerReaches(t, n[2], 30*time.Second, "the consumer on n2 reaches bedprov on n1 (previous release)")
	outsider(t, n[1].addr())
	if out, err := get(outsiderNS, n[1].addr(), 8090); err != nil || !strings.Contains(out, "provider page") {
		t.Fatalf("the previous release's port does not answer on every interface (what the upgrade is for): %v %s", err, out)
	}

	namesOnTheMesh := func(what string) {
		t.Helper()
		for _, a := range n[1:] {
			if out := a.resolve("bedprov.internal"); !strings.Contains(out, n[1].addr()) || strings.Contains(out, "100.90.") {
				t.Fatalf("%s: %s resolves bedprov.internal to %s, want n1's mesh address %s", what, a.name, out, n[1].addr())
			}
		}
	}
	for i, a := range n[1:] {
		a.stop()
		a.bin = ""
		a.start()
		threeNodes(a)
		if i == 2 {
			break
		}
		what := fmt.Sprintf("%d of 3 nodes upgraded", i+1)
		// A write through the upgraded node reaches every older one: none
		// was given a command it stops on.
		marker := fmt.Sprintf("bedmark%d", i+1)
		a.mesh("module", "add", a.manifest(marker, "module: {{name}}\nresources:\n  - directory: {{root}}/{{name}}\n", map[string]string{"name": marker}))
		for _, o := range n[i+2:] {
			eventually(t, 20*time.Second, what+": the older "+o.name+" applies a write of the upgraded "+a.name, func() (bool, string) {
				out, err := o.command("module", "list", "--data-dir", o.n.dir).CombinedOutput()
				return err == nil && strings.Contains(string(out), marker), string(out)
			})
		}
		// What the older nodes would store without its new keys waits for
		// them: a manifest with public-ports: is refused, naming them. The
		// refusal is the upgraded node's ("cannot apply a module.add
		// command yet") or, when an older node leads by then, that leader's
		// own ("... of format 7 yet"): either names a node to upgrade.
		if out := a.meshFails("module", "add", a.manifest("bedprov", upgradeProvider+upgradePublic, nil)); !strings.Contains(out, "cannot apply a module.add command") || !strings.Contains(out, "yet; upgrade n") {
			t.Fatalf("%s: public-ports: while older nodes run: %s", what, out)
		} else if i == 0 {
			t.Logf("public-ports: with older nodes: %s", strings.TrimSpace(out))
		}
		var nodes []struct {
			Name    string `json:"name"`
			Overlay string `json:"overlay_address"`
		}
		json.Unmarshal([]byte(a.mesh("node", "list", "--json")), &nodes)
		for _, nd := range nodes {
			if nd.Overlay != "" {
				t.Fatalf("%s: %s has an overlay address while older nodes run: %+v", what, nd.Name, nodes)
			}
		}
		namesOnTheMesh(what)
		consumerReaches(t, n[2], 30*time.Second, what+": the consumer still reaches its provider")
	}

	// Every node runs the new binary: every node gives its key, and the
	// names and the ports move onto the overlay.
	for _, a := range n[1:] {
		a.overlay = ""
		a.oaddr()
	}
	eventually(t, 30*time.Second, "bedprov.internal answers n1's overlay address on every node", func() (bool, string) {
		for _, a := range n[1:] {
			if out := a.resolve("bedprov.internal"); !strings.Contains(out, n[1].oaddr()) {
				return false, a.name + ": " + out
			}
		}
		return true, ""
	})
	consumerReaches(t, n[2], 60*time.Second, "the consumer reaches its provider over the overlay")
	eventually(t, 60*time.Second, "bedprov.web replaced to publish on n1's overlay address", func() (bool, string) {
		outcome, reason := n[1].outcome("bedprov.web")
		return strings.Contains(reason, "publish"), outcome + ": " + reason
	})
	_, reason := n[1].outcome("bedprov.web")
	t.Logf("n1's report for bedprov.web after the move: %s", reason)
	eventually(t, 30*time.Second, "the internal port no longer answers the outsider at n1's address", func() (bool, string) {
		out, err := get(outsiderNS, n[1].addr(), 8090)
		return err != nil || !strings.Contains(out, "provider page"), out
	})
	if out, err := get(n[2].h.netns, n[1].oaddr(), 8090); err != nil || !strings.Contains(out, "provider page") {
		t.Fatalf("n2 does not reach n1's internal port on its overlay address: %v %s", err, out)
	}
	// Now a port the world must reach is declared so, and answers it.
	n[1].mesh("module", "add", n[1].manifest("bedprov", upgradeProvider+upgradePublic, nil))
	eventually(t, 60*time.Second, "the outsider reaches bedprov's public port", func() (bool, string) {
		out, err := get(outsiderNS, n[1].addr(), 8091)
		return err == nil && strings.Contains(out, "provider page"), fmt.Sprintf("%v %s", err, out)
	})
}
