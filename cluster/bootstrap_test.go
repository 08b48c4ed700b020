package cluster

import (
	"crypto/sha256"
	"encoding/hex"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
)

func TestInstallLine(t *testing.T) {
	tok := Token{MeshID: "m1", CADigest: strings.Repeat("ab", 32), Secret: "s3cret"}.String()
	line, err := InstallLine("10.0.0.1", tok, "/usr/local/bin/mesh")
	if err != nil {
		t.Fatal(err)
	}
	for _, w := range []string{
		"sh -ec '", "curl -fsSk https://10.0.0.1:7430/v1/ca",
		`echo "` + strings.Repeat("ab", 32) + `  $d/ca.der" | sha256sum -c --quiet`,
		"sh -ec 'IFS= read -r t; ",
		`printf "Authorization: Bearer %s\n" "$t" > "$d/auth"; `,
		`d=$(mktemp -d); trap "rm -rf \"$d\"" EXIT; `,
		`c=$(curl -sS --cacert "$d/ca.pem" -H @"$d/auth" -o "$d/mesh" -w "%{http_code}" https://10.0.0.1:7430/v1/binary </dev/null); `,
		`[ "$c" = 200 ] || { echo "the binary from 10.0.0.1:7430: HTTP $c: $(head -c 400 "$d/mesh")" >&2; exit 1; }; `,
		`install -m 0755 "$d/mesh" /usr/local/bin/mesh`,
		`printf "%s\n" "$t" | /usr/local/bin/mesh join 10.0.0.1 --token-file -'`,
	} {
		if !strings.Contains(line, w) {
			t.Errorf("install line lacks %q:\n%s", w, line)
		}
	}
	// The token goes in on standard input, from a printf of the pasting
	// shell: never in the script, which ps shows every user while it runs.
	if !strings.HasPrefix(line, "printf '%s\\n' '"+tok+"' | sh -ec '") || strings.Count(line, tok) != 1 {
		t.Fatalf("the token is not only in the printf:\n%s", line)
	}
	// The digest is checked before the binary is fetched.
	if strings.Index(line, "sha256sum -c") > strings.Index(line, "/v1/binary") {
		t.Fatal("the binary is fetched before the CA is checked")
	}
	if l, _ := InstallLine("10.0.0.1:7431", tok, "/x/mesh"); !strings.Contains(l, "https://10.0.0.1:7431/v1/binary") {
		t.Fatalf("port: %s", l)
	}
	if _, err := InstallLine("10.0.0.1", "not-a-token", "/x"); err == nil {
		t.Fatal("a bad token gave a line")
	}
}

// fakeCurl stands for curl in the install line's test: the CA is "CA";
// the binary is answered with BINARY_STATUS and the file BINARY_BODY, and
// the header file's content is appended to HEADERS_SEEN.
const fakeCurl = `#!/bin/sh
out=""; url=""; w=""
while [ $# -gt 0 ]; do
	case "$1" in
	-o) out="$2"; shift ;;
	-w) w="$2"; shift ;;
	-H) cat "${2#@}" >> "$HEADERS_SEEN"; shift ;;
	--cacert) shift ;;
	-*) ;;
	*) url="$1" ;;
	esac
	shift
done
case "$url" in
*/v1/ca) printf CA > "$out" ;;
*/v1/binary) [ -z "$BINARY_HANG" ] || { : > "$BINARY_HANG"; sleep 30; }; cat "$BINARY_BODY" > "$out"; [ -z "$w" ] || printf %s "$BINARY_STATUS" ;;
esac
`

// The install line as dash runs it, with curl faked: a refusal of the
// binary stops it with the node's reason and leaves no file behind (the
// token was in one); a binary served is installed and joins with the
// token on its standard input, the token having reached curl in the
// header file only.
func TestInstallLineRuns(t *testing.T) {
	if _, err := exec.LookPath("sh"); err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	fake := filepath.Join(dir, "bin")
	os.MkdirAll(fake, 0o755)
	if err := os.WriteFile(filepath.Join(fake, "curl"), []byte(fakeCurl), 0o755); err != nil {
		t.Fatal(err)
	}
	sum := sha256.Sum256([]byte("CA"))
	tok := Token{MeshID: "m1", CADigest: hex.EncodeToString(sum[:]), Secret: "s3cret"}.String()
	installed := filepath.Join(dir, "installed", "mesh")
	os.MkdirAll(filepath.Dir(installed), 0o755)
	line, err := InstallLine("10.0.0.1", tok, installed)
	if err != nil {
		t.Fatal(err)
	}
	run := func(status, body string) (string, string, error) {
		tmp := filepath.Join(dir, "tmp")
		os.RemoveAll(tmp)
		os.MkdirAll(tmp, 0o700)
		seen := filepath.Join(dir, "headers")
		os.Remove(seen)
		bodyFile := filepath.Join(dir, "body")
		os.WriteFile(bodyFile, []byte(body), 0o644)
		cmd := exec.Command("sh", "-c", line)
		cmd.Env = append(os.Environ(), "PATH="+fake+":"+os.Getenv("PATH"), "TMPDIR="+tmp, "BINARY_STATUS="+status, "BINARY_BODY="+bodyFile, "HEADERS_SEEN="+seen)
		var out, errOut strings.Builder
		cmd.Stdout, cmd.Stderr = &out, &errOut
		err := cmd.Run()
		if left, _ := os.ReadDir(tmp); len(left) > 0 {
			t.Fatalf("the line left %v in its temporary directory's place (status %s)", left, status)
		}
		if h, _ := os.ReadFile(seen); string(h) != "Authorization: Bearer "+tok+"\n" {
			t.Fatalf("the header file curl read: %q", h)
		}
		return out.String(), errOut.String(), err
	}
	_, stderr, err := run("403", "the join token ended at 2026-12-07T10:00:00Z; get a new one")
	if err == nil || !strings.Contains(stderr, "the binary from 10.0.0.1:7430: HTTP 403: the join token ended at 2026-12-07T10:00:00Z") {
		t.Fatalf("a refused binary: %v\n%s", err, stderr)
	}
	if _, err := os.Stat(installed); err == nil {
		t.Fatal("a refused binary was installed")
	}
	// Served: the "binary" says how it was run and what it read.
	stdout, stderr, err := run("200", "#!/bin/sh\necho \"ran: $*\"; echo \"read: $(cat)\"\n")
	if err != nil || !strings.Contains(stdout, "ran: join 10.0.0.1 --token-file -") || !strings.Contains(stdout, "read: "+tok) {
		t.Fatalf("a served binary: %v\n%s\n%s", err, stdout, stderr)
	}
	// Stopped while the binary comes (a Ctrl-C, the terminal closed, a
	// kill of the line's processes): the token's header file and the
	// partial binary go all the same.
	for _, sig := range []syscall.Signal{syscall.SIGINT, syscall.SIGHUP, syscall.SIGTERM} {
		tmp := filepath.Join(dir, "tmp")
		os.RemoveAll(tmp)
		os.MkdirAll(tmp, 0o700)
		hang := filepath.Join(dir, "hanging")
		os.Remove(hang)
		cmd := exec.Command("sh", "-c", line)
		cmd.Env = append(os.Environ(), "PATH="+fake+":"+os.Getenv("PATH"), "TMPDIR="+tmp, "BINARY_STATUS=200", "BINARY_BODY=/dev/null", "HEADERS_SEEN=/dev/null", "BINARY_HANG="+hang)
		cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(10 * time.Millisecond) {
			if _, err := os.Stat(hang); err == nil {
				break
			}
			if time.Now().After(deadline) {
				syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
				t.Fatal("the line did not reach the binary's download within 10 s")
			}
		}
		if left, _ := os.ReadDir(tmp); len(left) != 1 {
			t.Fatalf("while the binary comes: %v in the temporary directory's place", left)
		}
		syscall.Kill(-cmd.Process.Pid, sig) // the terminal's signals go to the whole group
		done := make(chan error, 1)
		go func() { done <- cmd.Wait() }()
		select {
		case <-done:
		case <-time.After(10 * time.Second):
			syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
			t.Fatalf("%v: the line did not stop within 10 s", sig)
		}
		// The shell the line was pasted into may end before the line's
		// own (a hang-up ends it at once): the directory goes soon after.
		for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(10 * time.Millisecond) {
			left, _ := os.ReadDir(tmp)
			if len(left) == 0 {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("%v: the line left %v behind", sig, left)
			}
		}
	}
}
