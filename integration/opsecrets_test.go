package integration

import (
	"bytes"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"mesh/internal/seal"
	"mesh/state"
)

// The operator's secrets (issue "The operator's secrets").
const bedMail = `module: bedmail
resources:
  - directory: {{root}}/bedmail
  - secret: {{root}}/bedmail/smtp.password
    name: smtp
  - secret: {{root}}/bedmail/blob
    name: blob
    mode: "0400"
  - container: bedmail.server
    image: localhost/mesh-bed-busybox:1
    command: [sleep, "100000"]
    mounts: ["{{root}}/bedmail/smtp.password:/run/smtp.password:ro"]
    restart-on: [{{root}}/bedmail/smtp.password]
  - container: bedmail.sender
    image: localhost/mesh-bed-busybox:1
    command: [sleep, "100000"]
    env-secrets: {SMTP_PASSWORD: smtp}
  - container: bedmail.other
    image: localhost/mesh-bed-busybox:1
    command: [sleep, "100000"]
`

// setSecret runs mesh secret set on a with value on its standard input.
func setSecret(t *testing.T, a *agent, value []byte, args ...string) (string, error) {
	t.Helper()
	cmd := a.command(append(append([]string{"secret", "set"}, args...), "--data-dir", a.n.dir)...)
	cmd.Stdin = bytes.NewReader(value)
	out, err := cmd.CombinedOutput()
	return string(out), err
}

// sealedSecret reads a secret's sealed value from a snapshot a writes.
func sealedSecret(t *testing.T, a *agent, module, name string) string {
	t.Helper()
	for _, row := range snapshotOf(t, a).Rows("secrets") {
		if row["module"] == module && row["name"] == name {
			s, _ := row["sealed"].(string)
			return s
		}
	}
	t.Fatalf("the snapshot of %s holds no secret %s/%s", a.name, module, name)
	return ""
}

// canOpen says whether a's sealing key opens sealed.
func canOpen(t *testing.T, a *agent, sealed string) bool {
	t.Helper()
	id, err := seal.LoadOrCreate(a.n.dir)
	if err != nil {
		t.Fatal(err)
	}
	_, err = id.Open(sealed)
	if err != nil && !errors.Is(err, seal.ErrNotForUs) {
		t.Fatalf("%s: %v", a.name, err)
	}
	return err == nil
}

func randomValue(t *testing.T) string {
	b := make([]byte, 12)
	rand.Read(b)
	return "pw-" + hex.EncodeToString(b)
}

// TestOperatorSecrets: three nodes, a module on n1 that reads a secret as
// a file and as an environment variable. The value is delivered there and
// nowhere else: n2 and n3 cannot open it from their data dir, Raft log or
// a snapshot, and no data dir, log or podman inspect holds it. A new value
// replaces exactly the containers that read it, saying why; the same value
// changes nothing. Moved to n2, the secret is sealed to n2, and n1's file
// goes. Every bad input is refused with nothing changed.
func TestOperatorSecrets(t *testing.T) {
	n, _ := startThree(t)
	root := n[1].h.dir
	file := filepath.Join(root, "srv/bedmail/smtp.password")
	blobFile := filepath.Join(root, "srv/bedmail/blob")
	n[1].mesh("module", "add", n[1].manifest("bedmail", bedMail, nil), n[1].manifest("bedmailidle", "module: bedmailidle\n", nil))

	// Bad input: a clear error each, and nothing set.
	for _, c := range []struct {
		args  []string
		value []byte
		want  string
	}{
		{[]string{"nosuch", "smtp"}, []byte("x"), `module "nosuch" is not in the catalogue`},
		{[]string{"bedmail", "Bad Name"}, []byte("x"), "secret name"},
		{[]string{"bedmail", "smtp"}, nil, "the value is empty"},
		{[]string{"bedmail", "smtp"}, make([]byte, state.MaxSecretSize+1), "more than 1 MiB"},
		{[]string{"bedmailidle", "smtp"}, []byte("x"), "assigned to no node"},
		{[]string{"bedmail", "smtp"}, []byte("x"), "assigned to no node"},
	} {
		out, err := setSecret(t, n[1], c.value, c.args...)
		if err == nil || !strings.Contains(out, c.want) {
			t.Fatalf("mesh secret set %v: %v\n%s", c.args, err, out)
		}
	}
	if out := n[1].meshFails("secret", "rm", "bedmail", "smtp"); !strings.Contains(out, "has no secret") {
		t.Fatalf("rm of a secret never set: %s", out)
	}
	if out := n[1].mesh("secret", "list", "--json"); strings.TrimSpace(out) != "[]" {
		t.Fatalf("refused sets left: %s", out)
	}

	n[1].mesh("assign", "n1", "bedmail")
	eventually(t, 30*time.Second, "n1's status says which secret to set", func() (bool, string) {
		st := n[1].mesh("status")
		return strings.Contains(st, "mesh secret set bedmail smtp"), st
	})
	if id := n[1].h.containerID("bedmail.other"); id != "" {
		t.Fatalf("a resource after the unset secret was applied: bedmail.other %s", id)
	}

	v1 := randomValue(t)
	blob := make([]byte, state.MaxSecretSize)
	rand.Read(blob)
	blob[0], blob[len(blob)-1] = 0, 0
	blobPath := filepath.Join(t.TempDir(), "blob")
	os.WriteFile(blobPath, blob, 0o600)
	if out, err := setSecret(t, n[2], []byte(v1), "bedmail", "smtp"); err != nil || !strings.Contains(out, "sealed to n1") {
		t.Fatalf("set from n2: %v\n%s", err, out)
	}
	n[3].mesh("secret", "set", "bedmail", "blob", "--from-file", blobPath)
	eventually(t, 60*time.Second, "n1 delivers both secrets and runs the three containers", func() (bool, string) {
		b, _ := os.ReadFile(file)
		bb, _ := os.ReadFile(blobFile)
		ok := string(b) == v1 && bytes.Equal(bb, blob) && n[1].h.containerID("bedmail.other") != "" && n[1].h.containerID("bedmail.sender") != ""
		return ok, tail(n[1].log(), 5)
	})
	for p, want := range map[string]os.FileMode{file: 0o600, blobFile: 0o400} {
		if fi, _ := os.Stat(p); fi.Mode().Perm() != want {
			t.Fatalf("%s: mode %v, want %v", p, fi.Mode().Perm(), want)
		}
	}
	environ := n[1].h.podman("exec", "bedmail.sender", "cat", "/proc/1/environ")
	if !strings.Contains(environ, "SMTP_PASSWORD="+v1+"\x00") {
		t.Fatalf("the sender's process has no SMTP_PASSWORD=%s: %q", v1, environ)
	}
	if got := n[1].h.podman("exec", "bedmail.server", "cat", "/run/smtp.password"); got != v1 {
		t.Fatalf("the server reads %q", got)
	}
	// Where the value is: the delivered file (and the environment the
	// sender's process got, kept on the runtime tmpfs while it runs). No
	// data dir, no log, no podman inspect, no snapshot.
	for i := 1; i <= 3; i++ {
		n[i].mesh("snapshot", "save", filepath.Join(n[i].n.dir, "bed-snapshot.json"))
	}
	if hits := grepTree(t, filepath.Join(root, "srv"), v1); len(hits) != 1 || hits[0] != file {
		t.Fatalf("the value should be in the delivered file alone under srv, found in %v", hits)
	}
	for i := 1; i <= 3; i++ {
		if hits := grepTree(t, n[i].n.dir, v1); len(hits) > 0 {
			t.Fatalf("n%d's data dir holds the value in %v", i, hits)
		}
		if strings.Contains(n[i].log(), v1) {
			t.Fatalf("n%d's log holds the value", i)
		}
	}
	for _, c := range []string{"bedmail.sender", "bedmail.server", "bedmail.other"} {
		if out := n[1].h.podman("inspect", c); strings.Contains(out, v1) {
			t.Fatalf("podman inspect %s shows the value", c)
		}
	}
	for _, args := range [][]string{{"status", "--json"}, {"plan", "n1"}, {"why", "n1", "bedmail.sender"}, {"secret", "list"}, {"module", "show", "bedmail"}} {
		if out := n[2].mesh(args...); strings.Contains(out, v1) {
			t.Fatalf("mesh %v shows the value", args)
		}
	}
	sealed := sealedSecret(t, n[3], "bedmail", "smtp")
	if !canOpen(t, n[1], sealed) || canOpen(t, n[2], sealed) || canOpen(t, n[3], sealed) {
		t.Fatal("the secret opens elsewhere than on n1, the node its module runs on")
	}
	list := n[1].mesh("secret", "list", "bedmail")
	if !strings.Contains(list, "smtp") || !strings.Contains(list, "1048576") || !strings.Contains(list, "sealed") {
		t.Fatalf("list:\n%s", list)
	}

	// A new value: the file's reader and the sender are replaced, for the
	// secret; the other container is not; a preview first changes nothing.
	ids := map[string]string{}
	for _, c := range []string{"bedmail.server", "bedmail.sender", "bedmail.other"} {
		ids[c] = n[1].h.containerID(c)
	}
	v2 := randomValue(t)
	out, err := setSecret(t, n[1], []byte(v2), "bedmail", "smtp", "--dry-run")
	if err != nil || !strings.Contains(out, "nothing was written") || !strings.Contains(out, "bedmail.sender") || !strings.Contains(out, "secret smtp changed") || strings.Contains(out, "bedmail.other") {
		t.Fatalf("dry run: %v\n%s", err, out)
	}
	if b, _ := os.ReadFile(file); string(b) != v1 {
		t.Fatal("the dry run changed the file")
	}
	logAt := n[1].logLen()
	setSecret(t, n[1], []byte(v2), "bedmail", "smtp")
	eventually(t, 60*time.Second, "the file holds the new value and both readers are replaced", func() (bool, string) {
		b, _ := os.ReadFile(file)
		for _, c := range []string{"bedmail.server", "bedmail.sender"} {
			if id := n[1].h.containerID(c); id == "" || id == ids[c] {
				return false, c + " not replaced yet"
			}
		}
		return string(b) == v2 && strings.Contains(strings.Join(n[1].linesAfter(logAt), "\n"), "updated bedmail.sender (bedmail): replaced"), tail(n[1].log(), 5)
	})
	if n[1].h.containerID("bedmail.other") != ids["bedmail.other"] {
		t.Fatal("bedmail.other, which reads no secret, was replaced")
	}
	lines := strings.Join(n[1].linesAfter(logAt), "\n")
	for _, c := range []string{"bedmail.server", "bedmail.sender"} {
		if !strings.Contains(lines, "updated "+c+" (bedmail): replaced; secret smtp changed") {
			t.Fatalf("no log line says %s was replaced for the secret:\n%s", c, lines)
		}
	}
	if why := n[1].mesh("why", "n1", "bedmail.sender"); !strings.Contains(why, "secret smtp changed") || !strings.Contains(why, "mesh secret set bedmail smtp") {
		t.Fatalf("why:\n%s", why)
	}
	if environ := n[1].h.podman("exec", "bedmail.sender", "cat", "/proc/1/environ"); !strings.Contains(environ, "SMTP_PASSWORD="+v2+"\x00") {
		t.Fatalf("the new sender's environment: %q", environ)
	}
	// The same value again: nothing.
	for _, c := range []string{"bedmail.server", "bedmail.sender", "bedmail.other"} {
		ids[c] = n[1].h.containerID(c)
	}
	if out, err := setSecret(t, n[1], []byte(v2), "bedmail", "smtp"); err != nil || !strings.Contains(out, "nothing changed") {
		t.Fatalf("the same value: %v\n%s", err, out)
	}
	n[1].mesh("assign", "n1", "bedmailidle") // a write after it, for n1 to apply
	eventually(t, 30*time.Second, "n1 applied its plan after the same value", func() (bool, string) {
		var st struct {
			Nodes []struct {
				Name           string
				PlanVersion    uint64 `json:"plan_version"`
				AppliedVersion uint64 `json:"applied_version"`
			}
		}
		out := n[1].mesh("status", "--json")
		json.Unmarshal([]byte(out), &st)
		for _, nd := range st.Nodes {
			if nd.Name == "n1" {
				return nd.PlanVersion > 0 && nd.AppliedVersion == nd.PlanVersion, out
			}
		}
		return false, out
	})
	for c, id := range ids {
		if now := n[1].h.containerID(c); now != id {
			t.Fatalf("%s was replaced by setting the same value (%s -> %s)", c, id, now)
		}
	}

	// Moved: off n1 first (its file goes), then onto n2, which the
	// secret is sealed to by n1, the node that held it.
	n[1].mesh("unassign", "n1", "bedmail")
	eventually(t, 60*time.Second, "n1 removed the delivered files and the containers", func() (bool, string) {
		_, e1 := os.Stat(file)
		_, e2 := os.Stat(blobFile)
		return os.IsNotExist(e1) && os.IsNotExist(e2) && n[1].h.containerID("bedmail.sender") == "", ""
	})
	n[1].mesh("assign", "n2", "bedmail")
	eventually(t, 60*time.Second, "n2 delivers the secret and runs the sender with it", func() (bool, string) {
		b, _ := os.ReadFile(file)
		if string(b) != v2 || n[2].h.containerID("bedmail.sender") == "" {
			return false, tail(n[2].log(), 5)
		}
		env, _ := n[2].h.podmanCmd("exec", "bedmail.sender", "cat", "/proc/1/environ").Output()
		return strings.Contains(string(env), "SMTP_PASSWORD="+v2+"\x00"), string(env)
	})
	sealed = sealedSecret(t, n[3], "bedmail", "smtp")
	if canOpen(t, n[1], sealed) || !canOpen(t, n[2], sealed) || canOpen(t, n[3], sealed) {
		t.Fatal("after the move the secret is not sealed to n2 alone")
	}
	if !strings.Contains(n[1].log()+n[2].log()+n[3].log(), "secret sealed again to its module's nodes") {
		t.Fatal("no log line says the secret was sealed again")
	}
	var infos []state.SecretInfo
	json.Unmarshal([]byte(n[3].mesh("secret", "list", "--json")), &infos)
	if len(infos) != 2 || strings.Join(infos[1].SealedTo, ",") != "n2" || infos[1].State != state.SecretSealed {
		t.Fatalf("list after the move: %+v", infos)
	}

	// rm: the file goes, and the container whose environment held it.
	n[2].mesh("secret", "rm", "bedmail", "smtp")
	eventually(t, 60*time.Second, "n2 removed the file and the sender", func() (bool, string) {
		_, err := os.Stat(file)
		return os.IsNotExist(err) && n[2].h.containerID("bedmail.sender") == "", tail(n[2].log(), 5)
	})
	eventually(t, 30*time.Second, "status says to set it again", func() (bool, string) {
		st := n[1].mesh("status")
		return strings.Contains(st, "mesh secret set bedmail smtp"), st
	})

	// The module off n2, which still holds blob (a module assigned nowhere
	// keeps its secrets sealed to its last nodes); removing n2 says blob is
	// lost, and the list says so too.
	n[2].mesh("unassign", "n2", "bedmail")
	n[2].stop()
	if out := n[1].mesh("node", "remove", "n2", "--force"); !strings.Contains(out, "warning: bedmail/blob were sealed to n2 alone") {
		t.Fatalf("removing the node that alone held a secret:\n%s", out)
	}
	infos = nil
	json.Unmarshal([]byte(n[1].mesh("secret", "list", "--json")), &infos)
	if len(infos) != 1 || infos[0].Name != "blob" || infos[0].State != state.SecretLost {
		t.Fatalf("list after removing its holder: %+v", infos)
	}
}
