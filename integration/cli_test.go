package integration

import (
	"os"
	"os/exec"
	"strings"
	"testing"
)

// Issue 12 item 11: a bare mesh shows its usage (exit 0), --version prints
// the version, and the completion scripts load in bash and complete from
// the grammar.
func TestCLICompletionAndVersion(t *testing.T) {
	out, err := exec.Command(meshBin).CombinedOutput()
	if err != nil || !strings.Contains(string(out), "Usage: mesh") {
		t.Fatalf("bare mesh: %v\n%s", err, out)
	}
	out, err = exec.Command(meshBin, "--version").CombinedOutput()
	if err != nil || !strings.HasPrefix(string(out), "mesh ") {
		t.Fatalf("--version: %v %q", err, out)
	}
	out, err = exec.Command("bash", "-c", `eval "$(`+meshBin+` completion bash)" && complete -p mesh`).CombinedOutput()
	if err != nil || !strings.Contains(string(out), "complete -C") {
		t.Fatalf("bash completion does not load: %v\n%s", err, out)
	}
	for _, sh := range []string{"zsh", "fish"} {
		if out, err := exec.Command(meshBin, "completion", sh).CombinedOutput(); err != nil || !strings.Contains(string(out), meshBin) {
			t.Fatalf("completion %s: %v\n%s", sh, err, out)
		}
	}
	// What bash does on TAB: run the command with COMP_LINE set.
	for line, want := range map[string]string{"mesh ass": "assign", "mesh node ": "public-domain", "mesh completion ": "fish"} {
		c := exec.Command(meshBin)
		c.Env = append(os.Environ(), "COMP_LINE="+line, "MESH_DATA_DIR="+t.TempDir())
		out, err := c.CombinedOutput()
		if err != nil || !strings.Contains(string(out), want) {
			t.Fatalf("completing %q: %v %q, want %q", line, err, out, want)
		}
	}
	if out, err := exec.Command(meshBin, "completion", "tcsh").CombinedOutput(); err == nil {
		t.Fatalf("completion tcsh succeeded: %s", out)
	}
}
