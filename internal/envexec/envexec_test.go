package envexec

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// The file's entries are set over the environment, values byte for byte
// (newlines, '=' and all); a damaged file is refused, never half read.
func TestEnviron(t *testing.T) {
	dir := t.TempDir()
	f := filepath.Join(dir, "env")
	os.WriteFile(f, []byte("A=one\x00B=two=2\nlines\x00"), 0o444)
	got, err := Environ(f, []string{"PATH=/bin", "A=old", "HOME=/root"})
	if err != nil {
		t.Fatal(err)
	}
	if strings.Join(got, "|") != "PATH=/bin|HOME=/root|A=one|B=two=2\nlines" {
		t.Fatalf("got %q", got)
	}
	for name, bad := range map[string]string{"no NUL at the end": "A=one", "no name": "=x\x00", "no =": "A\x00"} {
		os.WriteFile(f, []byte(bad), 0o444)
		if _, err := Environ(f, nil); err == nil {
			t.Errorf("%s: taken", name)
		}
	}
	if _, err := Environ(filepath.Join(dir, "missing"), nil); err == nil {
		t.Error("a missing file taken")
	}
	// Keys are taken as written, dotted and dashed ones too (an env-secrets
	// key such as elastic.password), and set over the same key.
	os.WriteFile(f, []byte("xpack.security.password=pw\x00a-b=1\x00"), 0o444)
	got, err = Environ(f, []string{"xpack.security.password=old", "PATH=/bin"})
	if err != nil || strings.Join(got, "|") != "PATH=/bin|xpack.security.password=pw|a-b=1" {
		t.Fatalf("dotted keys: %q %v", got, err)
	}
}

// Run execs the command with the environment, in its place: the command's
// own output and exit code; a command that is not found is 127.
func TestRunExecs(t *testing.T) {
	if os.Getenv("ENVEXEC_CHILD") != "" {
		os.Exit(Run(strings.Split(os.Getenv("ENVEXEC_CHILD"), "\x1f"), os.Stderr))
	}
	dir := t.TempDir()
	f := filepath.Join(dir, "env")
	os.WriteFile(f, []byte("SECRET=s3 cr=t\x00"), 0o444)
	run := func(args ...string) (string, int) {
		cmd := exec.Command(os.Args[0], "-test.run=TestRunExecs")
		cmd.Env = append(os.Environ(), "ENVEXEC_CHILD="+strings.Join(args, "\x1f"))
		var out bytes.Buffer
		cmd.Stdout, cmd.Stderr = &out, &out
		err := cmd.Run()
		code := 0
		if ee, ok := err.(*exec.ExitError); ok {
			code = ee.ExitCode()
		}
		return out.String(), code
	}
	out, code := run(f, "--", "sh", "-c", `printf '%s' "$SECRET"; exit 3`)
	if out != "s3 cr=t" || code != 3 {
		t.Fatalf("got %q, exit %d", out, code)
	}
	if out, code := run(f, "--", "no-such-command-here"); code != 127 || !strings.Contains(out, "not found") {
		t.Fatalf("a missing command: %q, exit %d", out, code)
	}
	if _, code := run(f); code != 126 {
		t.Fatalf("no command: exit %d", code)
	}
}
