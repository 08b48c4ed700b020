package integration

import (
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"mesh/internal/seal"
	"mesh/state"
)

// Issue 14: a credential's secret is sealed to the nodes that deliver it.
const (
	bedVault = `module: bedvault
accepts-credentials: {{root}}/bedvault/creds
resources:
  - directory: {{root}}/bedvault
  - directory: {{root}}/bedvault/creds
    mode: "0700"
`
	bedVaultUser = `module: bedvaultuser
resources:
  - directory: {{root}}/bedvaultuser
  - credential: {{root}}/bedvaultuser/db.password
    provider: bedvault
`
)

// grepTree says which files under dir hold s. It reads a file a megabyte
// at a time: the beds' data dirs hold preallocated Raft segments of 64 MiB,
// and this process's peak memory is inherited by every command it starts
// (the hostile-manifest bed measures theirs).
func grepTree(t *testing.T, dir, s string) []string {
	t.Helper()
	var hits []string
	filepath.WalkDir(dir, func(p string, d os.DirEntry, err error) error {
		if err == nil && d.Type().IsRegular() && fileHolds(p, []byte(s)) {
			hits = append(hits, p)
		}
		return nil
	})
	return hits
}

// fileHolds reads p in chunks, keeping the last len(s)-1 bytes of each so
// that s is found across a chunk's end.
func fileHolds(p string, s []byte) bool {
	f, err := os.Open(p)
	if err != nil {
		return false
	}
	defer f.Close()
	buf := make([]byte, 1<<20+len(s))
	have := 0
	for {
		n, err := f.Read(buf[have:])
		have += n
		if bytes.Contains(buf[:have], s) {
			return true
		}
		if err != nil {
			return false
		}
		if keep := len(s) - 1; have > keep {
			copy(buf, buf[have-keep:have])
			have = keep
		}
	}
}

// TestSealedSecrets: a consumer on n1 and its provider on n2; n3 replicates
// the state and never holds the secret. Moving the provider to n3 rotates
// it; removing a node it was sealed to rotates it again.
func TestSealedSecrets(t *testing.T) {
	n, _ := startThree(t)
	passwd := filepath.Join(n[1].h.dir, "srv/bedvaultuser/db.password")
	delivered := filepath.Join(n[1].h.dir, "srv/bedvault/creds/bedvaultuser.credential")
	secretIn := func(p string) string {
		b, err := os.ReadFile(p)
		if err != nil {
			return ""
		}
		s := strings.TrimSpace(string(b))
		if i := strings.Index(s, "secret="); i >= 0 {
			s = strings.TrimSpace(s[i+len("secret="):])
		}
		return s
	}
	// The manifests name n1's paths; every node of the bed shares one
	// filesystem, so the provider's delivered file is at one path wherever
	// it runs.
	n[1].mesh("module", "add", n[1].manifest("bedvault", bedVault, nil), n[1].manifest("bedvaultuser", bedVaultUser, nil))
	n[1].mesh("assign", "n2", "bedvault")
	n[1].mesh("assign", "n1", "bedvaultuser")
	var first string
	eventually(t, 30*time.Second, "the consumer on n1 and the provider on n2 hold the same secret", func() (bool, string) {
		first = secretIn(passwd)
		return first != "" && secretIn(delivered) == first, first + " / " + secretIn(delivered)
	})
	// Snapshots too: make each node write one, then look everywhere.
	for i := 1; i <= 3; i++ {
		n[i].mesh("snapshot", "save", filepath.Join(n[i].n.dir, "bed-snapshot.json"))
	}
	// The search finds the secret where it is meant to be.
	if hits := grepTree(t, filepath.Join(n[1].h.dir, "srv"), first); len(hits) != 2 {
		t.Fatalf("the secret should be in the two delivered files, found in %v", hits)
	}
	if hits := grepTree(t, n[3].n.dir, first); len(hits) > 0 {
		t.Fatalf("n3 runs neither side and holds the secret in %v", hits)
	}
	for i := 1; i <= 3; i++ {
		if hits := grepTree(t, n[i].n.dir, first); len(hits) > 0 {
			t.Fatalf("n%d's data dir holds the secret in plain text in %v", i, hits)
		}
		if strings.Contains(n[i].log(), first) {
			t.Fatalf("n%d's log holds the secret", i)
		}
	}
	if out := n[1].mesh("why", "n1", passwd); strings.Contains(out, first) {
		t.Fatalf("why shows the secret: %s", out)
	}

	// Move the provider to n3: n3 cannot open the secret, so the assign
	// rotates it, sealed to n1 and n3; n2 cannot open the new one.
	n[1].mesh("unassign", "n2", "bedvault")
	eventually(t, 30*time.Second, "n2 took its delivered credential away", func() (bool, string) {
		_, err := os.Stat(delivered)
		return os.IsNotExist(err), ""
	})
	n[3].mesh("assign", "n3", "bedvault")
	var second string
	eventually(t, 30*time.Second, "a new secret on n1 and in n3's delivered file", func() (bool, string) {
		second = secretIn(passwd)
		return second != "" && second != first && secretIn(delivered) == second, second + " / " + secretIn(delivered)
	})
	for _, p := range []string{passwd, delivered} {
		if strings.Contains(readFile(t, p), first) {
			t.Fatalf("%s still holds the old secret", p)
		}
	}
	if hits := grepTree(t, n[2].n.dir, second); len(hits) > 0 {
		t.Fatalf("n2 no longer delivers it and holds the new secret in %v", hits)
	}
	why := n[1].mesh("why", "n1", passwd)
	if !strings.Contains(why, "credential rotated: bedvaultuser -> bedvault: node n3 delivers it and cannot open it") {
		t.Fatalf("why does not say the credential rotated:\n%s", why)
	}
	t.Logf("mesh why n1 %s:\n%s", passwd, why)

	// Remove n3 (with the provider on it): the secret is sealed to a key no
	// node holds now; the leader rotates it, for n1 alone.
	n[3].stop()
	n[1].mesh("node", "remove", "n3", "--force")
	eventually(t, 30*time.Second, "a third secret on n1", func() (bool, string) {
		s := secretIn(passwd)
		return s != "" && s != second && s != first, s
	})
	leaderLogs := n[1].log() + n[2].log()
	if !strings.Contains(leaderLogs, "credential rotated") || !strings.Contains(leaderLogs, "a key no node holds") {
		t.Fatalf("no log line says the credential rotated after the removal:\n%s\n%s", tail(n[1].log(), 20), tail(n[2].log(), 20))
	}
}

// caKeyOf opens the mesh's CA key with a's sealing key (a is a voter) and
// returns a line of its PEM body, and a piece of its sealed form.
func caKeyOf(t *testing.T, a *agent) (pemLine, sealed string) {
	t.Helper()
	sn := snapshotOf(t, a)
	sealed = sn.Setting("ca_key_sealed")
	if sn.Setting("ca_key") != "" || len(sealed) < 64 {
		t.Fatalf("the snapshot's CA key: plain %d bytes, sealed %d bytes", len(sn.Setting("ca_key")), len(sealed))
	}
	id, err := seal.LoadOrCreate(a.n.dir)
	if err != nil {
		t.Fatal(err)
	}
	key, err := id.Open(sealed)
	if err != nil || !strings.Contains(key, "PRIVATE KEY") {
		t.Fatalf("%s cannot open the CA key: %v", a.name, err)
	}
	lines := strings.Split(key, "\n")
	if len(lines) < 3 || len(lines[1]) < 40 {
		t.Fatalf("the CA key is not a PEM block")
	}
	return lines[1], sealed[len(sealed)-64:]
}

// snapshotOf is the replicated state as a's mesh snapshot save writes it.
func snapshotOf(t *testing.T, a *agent) *state.Snapshot {
	t.Helper()
	f := filepath.Join(t.TempDir(), "snapshot.json")
	a.mesh("snapshot", "save", f)
	r, err := os.Open(f)
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	sn, err := state.ReadSnapshot(r)
	if err != nil {
		t.Fatal(err)
	}
	return sn
}

func readFile(t *testing.T, p string) string {
	t.Helper()
	b, err := os.ReadFile(p)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// certExpiries reads each node's certificate expiry from a's status.
func certExpiries(t *testing.T, a *agent) map[string]time.Time {
	t.Helper()
	var st struct {
		Nodes []struct {
			Name        string
			CertExpires *time.Time `json:"cert_expires"`
			Reachable   bool
		}
	}
	out, _ := a.command("status", "--json", "--data-dir", a.n.dir).Output()
	json.Unmarshal(out, &st)
	m := map[string]time.Time{}
	for _, n := range st.Nodes {
		if n.CertExpires != nil {
			m[n.Name] = *n.CertExpires
		}
	}
	return m
}

// TestCertificateRenewal: node certificates of a short life (30 s) renew on
// all three nodes while writes go on, without an agent restarting and
// without losing a write; once the first certificates have expired, a
// restarted node connects to the others with their renewed ones.
func TestCertificateRenewal(t *testing.T) {
	t.Setenv("MESH_CERT_LIFETIME", "30s")
	n, _ := startThree(t)
	pids := map[int]int{}
	for i := 1; i <= 3; i++ {
		pids[i] = n[i].cmd.Process.Pid
	}
	var first map[string]time.Time
	eventually(t, 20*time.Second, "every node's certificate expiry is in the state", func() (bool, string) {
		first = certExpiries(t, n[1])
		return len(first) == 3, fmt.Sprint(first)
	})
	var latest time.Time
	for _, e := range first {
		if e.After(latest) {
			latest = e
		}
		if d := time.Until(e); d > 31*time.Second {
			t.Fatalf("a certificate lives longer than MESH_CERT_LIFETIME: %s left", d)
		}
	}
	var acked []string
	renewed := func() bool {
		now := certExpiries(t, n[1])
		for name, e := range first {
			if !now[name].After(e) {
				return false
			}
		}
		return true
	}
	deadline := time.Now().Add(90 * time.Second)
	for i := 0; !(renewed() && time.Now().After(latest.Add(time.Second))); i++ {
		if time.Now().After(deadline) {
			t.Fatalf("certificates not all renewed within 90s: first %v, now %v\n%s", first, certExpiries(t, n[1]), tail(n[2].log(), 20))
		}
		name := fmt.Sprintf("bedcert%d", i)
		f := n[3].manifest(name, "module: {{name}}\n", map[string]string{"name": name})
		if out, err := n[3].command("module", "add", f, "--data-dir", n[3].n.dir).CombinedOutput(); err == nil {
			acked = append(acked, name)
		} else {
			t.Fatalf("write %s refused while certificates renew: %s", name, out)
		}
	}
	for i := 1; i <= 3; i++ {
		if n[i].cmd.Process.Pid != pids[i] || n[i].cmd.ProcessState != nil {
			t.Fatalf("n%d's agent restarted", i)
		}
		if !strings.Contains(n[i].log(), "renewed this node's certificate") {
			t.Fatalf("n%d's log does not say it renewed its certificate", i)
		}
	}
	if len(acked) < 20 {
		t.Fatalf("only %d writes acknowledged while the certificates renewed", len(acked))
	}
	// n1 restarts after every first certificate expired: it dials the
	// others anew, and they it; only renewed certificates pass.
	n[1].stop()
	n[1].start()
	eventually(t, 30*time.Second, "the restarted n1 reaches n2 and n3, and a write from it lands", func() (bool, string) {
		f := n[1].manifest("bedcertlast", "module: bedcertlast\n", nil)
		out, err := n[1].command("module", "add", f, "--data-dir", n[1].n.dir).CombinedOutput()
		return err == nil, string(out)
	})
	acked = append(acked, "bedcertlast")
	for i := 1; i <= 3; i++ {
		i := i
		eventually(t, 10*time.Second, fmt.Sprintf("n%d holds every acknowledged write", i), func() (bool, string) {
			out, _ := n[i].command("module", "list", "--json", "--data-dir", n[i].n.dir).Output()
			var mods []struct{ Name string }
			json.Unmarshal(out, &mods)
			have := map[string]bool{}
			for _, m := range mods {
				have[m.Name] = true
			}
			for _, a := range acked {
				if !have[a] {
					return false, "missing " + a
				}
			}
			return true, ""
		})
	}
	if st := n[2].mesh("status"); !strings.Contains(st, "CERT EXPIRES") || strings.Contains(st, "EXPIRED") {
		t.Fatalf("status:\n%s", st)
	}
	t.Logf("%d writes acknowledged while three certificates of 30s renewed; first expiries %v", len(acked), first)
}
