package integration

import (
	"crypto/ecdsa"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/json"
	"encoding/pem"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"mesh/cluster"
	"mesh/internal/seal"
)

// oldCACert signs, with the mesh's CA key as it is now (opened with a's
// sealing key: a is a voter), a certificate for node b's own key and name:
// what a voter since removed could still sign after a rotation.
func oldCACert(t *testing.T, a, b *agent) (certFile, keyFile string) {
	t.Helper()
	sn := snapshotOf(t, a)
	id, err := seal.LoadOrCreate(a.n.dir)
	if err != nil {
		t.Fatal(err)
	}
	caKey, err := id.Open(sn.Setting("ca_key_sealed"))
	if err != nil {
		t.Fatal(err)
	}
	ca, err := cluster.ParseCA([]byte(sn.Setting("ca_cert")), []byte(caKey))
	if err != nil {
		t.Fatal(err)
	}
	keyFile = filepath.Join(b.n.dir, cluster.KeyFile)
	kb, _ := pem.Decode([]byte(readFile(t, keyFile)))
	key, err := x509.ParseECPrivateKey(kb.Bytes)
	if err != nil {
		t.Fatal(err)
	}
	csr, err := x509.CreateCertificateRequest(rand.Reader, &x509.CertificateRequest{Subject: pkix.Name{CommonName: b.name}}, (*ecdsa.PrivateKey)(key))
	if err != nil {
		t.Fatal(err)
	}
	cert, err := ca.Sign(pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE REQUEST", Bytes: csr}), b.name, b.addr())
	if err != nil {
		t.Fatal(err)
	}
	certFile = filepath.Join(t.TempDir(), "old-ca.crt")
	os.WriteFile(certFile, append(cert, ca.CertPEM...), 0o600)
	return certFile, keyFile
}

// helloAs is what node at's peer API answers a hello made from from's
// namespace with a certificate: "200", "403", or "000" (the handshake was
// refused).
func helloAs(from, at *agent, certFile, keyFile string) string {
	c := inNetns(from.h.netns, exec.Command("curl", "-sk", "--http1.1", "--max-time", "5", "--cert", certFile, "--key", keyFile,
		"-o", "/dev/null", "-w", "%{http_code}", fmt.Sprintf("https://%s:%d/v1/hello", at.addr(), cluster.DefaultPort)))
	out, _ := c.Output()
	return strings.TrimSpace(string(out))
}

type caState struct {
	CA struct {
		Digest  string   `json:"digest"`
		Next    string   `json:"next"`
		Renewed []string `json:"renewed"`
		Waiting []string `json:"waiting"`
	} `json:"ca"`
	Nodes []struct {
		Name   string `json:"name"`
		CertCA string `json:"cert_ca"`
	} `json:"nodes"`
}

func caOf(t *testing.T, a *agent) caState {
	t.Helper()
	var st caState
	json.Unmarshal([]byte(a.mesh("status", "--json")), &st)
	return st
}

// TestCARotation: mesh ca rotate under a stream of writes loses none, every
// node renews under the new CA, and a certificate the old CA signed (for a
// node's own key and name, taken by every node before) is refused by every
// node after. A second rotation with a node down waits for it, is ended by
// removing it, and the node, refused when it comes back, joins again with
// the README's steps.
func TestCARotation(t *testing.T) {
	n, _ := startThree(t)
	certFile, keyFile := oldCACert(t, n[1], n[2])
	for i := 1; i <= 3; i++ {
		if got := helloAs(n[2], n[i], certFile, keyFile); got != "200" {
			t.Fatalf("before the rotation, n%d answers n2's certificate of the mesh CA with %s", i, got)
		}
	}
	before := caOf(t, n[1]).CA.Digest

	// Writes from n3 while the rotation runs.
	stop := make(chan struct{})
	acked := make(chan []string)
	go func() {
		var ok []string
		for i := 0; ; i++ {
			select {
			case <-stop:
				acked <- ok
				return
			default:
			}
			name := fmt.Sprintf("bedrot%d", i)
			f := n[3].manifest(name, "module: {{name}}\n", map[string]string{"name": name})
			if out, err := n[3].command("module", "add", f, "--data-dir", n[3].n.dir).CombinedOutput(); err == nil {
				ok = append(ok, name)
			} else {
				t.Errorf("write %s refused during the rotation: %s", name, out)
			}
		}
	}()
	out := n[1].mesh("ca", "rotate", "--wait", "--timeout", "90s")
	close(stop)
	writes := <-acked
	if !strings.Contains(out, "the rotation ended") {
		t.Fatalf("ca rotate --wait:\n%s", out)
	}
	st := caOf(t, n[2])
	if st.CA.Digest == before || st.CA.Next != "" {
		t.Fatalf("after the rotation: %+v", st.CA)
	}
	for _, nd := range st.Nodes {
		if nd.CertCA != st.CA.Digest {
			t.Fatalf("%s's certificate is of CA %q, not the new %s", nd.Name, nd.CertCA, st.CA.Digest)
		}
	}
	for i := 1; i <= 3; i++ {
		if !strings.Contains(n[i].log(), "renewed this node's certificate") {
			t.Fatalf("n%d's log does not say it renewed its certificate", i)
		}
		i := i
		eventually(t, 10*time.Second, fmt.Sprintf("n%d refuses a certificate of the old CA", i), func() (bool, string) {
			got := helloAs(n[2], n[i], certFile, keyFile)
			return got != "200", got
		})
		eventually(t, 20*time.Second, fmt.Sprintf("n%d holds every write acknowledged during the rotation", i), func() (bool, string) {
			out, _ := n[i].command("module", "list", "--data-dir", n[i].n.dir).CombinedOutput()
			for _, w := range writes {
				if !strings.Contains(string(out), w+" ") {
					return false, "missing " + w
				}
			}
			return true, ""
		})
	}
	if len(writes) < 5 {
		t.Fatalf("only %d writes acknowledged during the rotation", len(writes))
	}
	if s := n[1].mesh("status"); !strings.Contains(s, "CA "+st.CA.Digest[:12]) || !strings.Contains(s, "rotated") {
		t.Fatalf("status does not show the new CA:\n%s", s)
	}
	// The nodes still talk and write with their renewed certificates.
	n[2].mesh("module", "add", n[2].manifest("bedrotafter", "module: bedrotafter\n", nil))

	// A rotation with n3 down: it waits for n3; removing n3 ends it.
	n[3].stop()
	n[1].mesh("ca", "rotate")
	eventually(t, 30*time.Second, "the rotation waits for n3 alone", func() (bool, string) {
		c := caOf(t, n[1]).CA
		return c.Next != "" && strings.Join(c.Waiting, ",") == "n3" && len(c.Renewed) == 2, fmt.Sprintf("%+v", c)
	})
	if out := n[1].meshFails("token"); !strings.Contains(out, "rotation of the mesh's CA is under way") {
		t.Fatalf("a token during the rotation: %s", out)
	}
	rm := n[1].mesh("node", "remove", "n3", "--force")
	if !strings.Contains(rm, "join secret, which was rotated") || !strings.Contains(rm, "mesh ca rotate") {
		t.Fatalf("removing a voter:\n%s", rm)
	}
	eventually(t, 30*time.Second, "the rotation ended without n3", func() (bool, string) {
		c := caOf(t, n[1]).CA
		return c.Next == "" && c.Digest != st.CA.Digest, fmt.Sprintf("%+v", c)
	})
	// n3 comes back with its certificate of the old CA: refused.
	logAt := n[3].logLen()
	n[3].startAsync()
	eventually(t, 30*time.Second, "n3, back, is refused by the mesh", func() (bool, string) {
		l := strings.Join(n[3].linesAfter(logAt), "\n")
		return strings.Contains(l, "not from this mesh's CA"), tail(l, 5)
	})
	for _, l := range n[3].linesAfter(logAt) {
		if strings.Contains(l, "not from this mesh's CA") {
			t.Logf("n3, back: %s", l)
			break
		}
	}
	for _, a := range n[1:3] {
		if s := a.mesh("node", "list"); strings.Contains(s, "n3") {
			t.Fatalf("%s lists n3 after its removal:\n%s", a.name, s)
		}
	}
	// The README's steps: stop it, move its data dir aside, join again
	// with a token made now.
	n[3].stop()
	os.RemoveAll(n[3].n.dir)
	token := strings.TrimSpace(n[1].mesh("token"))
	n[3].run("join", n[1].addr(), "--token", token, "--name", "n3", "--address", n[3].addr(), "--data-dir", n[3].n.dir)
	n[3].start()
	eventually(t, 30*time.Second, "n3 is back, with a certificate of the new CA", func() (bool, string) {
		st := caOf(t, n[1])
		for _, nd := range st.Nodes {
			if nd.Name == "n3" && nd.CertCA == st.CA.Digest {
				return true, ""
			}
		}
		return false, fmt.Sprintf("%+v", st)
	})
	n[3].mesh("module", "add", n[3].manifest("bedrotback", "module: bedrotback\n", nil))
	t.Logf("%d writes acknowledged during the first rotation", len(writes))
}
