package integration

import (
	"context"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
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

// Issue 12 item 14: the units pass systemd's own check, and the agent tells
// systemd (Type=notify) when it is ready and when it stops.
func TestSystemdUnits(t *testing.T) {
	if _, err := exec.LookPath("systemd-analyze"); err != nil {
		t.Fatal("systemd-analyze is missing; contrib/test.sh installs systemd")
	}
	for _, u := range []string{"mesh.service", "mesh-user.service", "mesh-setup.service"} {
		b, err := os.ReadFile("../contrib/" + u)
		if err != nil {
			t.Fatal(err)
		}
		f := filepath.Join(t.TempDir(), u)
		os.WriteFile(f, []byte(strings.ReplaceAll(string(b), "/usr/local/bin/mesh", meshBin)), 0o644)
		// verify prints what it finds wrong and exits 0 for an unknown key,
		// so any output is a failure.
		if out, err := exec.Command("systemd-analyze", "verify", f).CombinedOutput(); err != nil || len(strings.TrimSpace(string(out))) > 0 {
			t.Errorf("systemd-analyze verify %s: %v\n%s", u, err, out)
		}
	}
}

func TestAgentNotifiesSystemd(t *testing.T) {
	dir := t.TempDir()
	sock := filepath.Join(dir, "notify.sock")
	conn, err := net.ListenUnixgram("unixgram", &net.UnixAddr{Name: sock, Net: "unixgram"})
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	data := filepath.Join(dir, "data")
	if out, err := exec.Command(meshBin, "init", "--name", "sd", "--address", "127.0.0.1", "--port", freePort(t), "--data-dir", data, "--overlay", "off").CombinedOutput(); err != nil {
		t.Fatalf("init: %v\n%s", err, out)
	}
	// In a network namespace of its own, so the resolver's address and
	// bridge go with it.
	agent := exec.Command("unshare", "--net", "sh", "-c", `ip link set lo up && exec "$0" "$@"`,
		meshBin, "agent", "--data-dir", data, "--dns-address", "169.254.53.53", "--podman-socket", "unix://"+filepath.Join(dir, "no-podman.sock"))
	agent.Env = append(os.Environ(), "NOTIFY_SOCKET="+sock)
	var logs strings.Builder
	agent.Stdout, agent.Stderr = &logs, &logs
	if err := agent.Start(); err != nil {
		t.Fatal(err)
	}
	defer agent.Process.Kill()
	read := func() string {
		conn.SetReadDeadline(time.Now().Add(60 * time.Second))
		b := make([]byte, 512)
		n, err := conn.Read(b)
		if err != nil {
			t.Fatalf("no notification: %v\n%s", err, logs.String())
		}
		return string(b[:n])
	}
	if m := read(); !strings.HasPrefix(m, "READY=1") {
		t.Fatalf("first notification %q", m)
	}
	// Ready means mesh commands work.
	if out, err := exec.Command(meshBin, "status", "--data-dir", data).CombinedOutput(); err != nil {
		t.Fatalf("status right after READY=1: %v\n%s", err, out)
	}
	agent.Process.Signal(syscall.SIGTERM)
	if m := read(); m != "STOPPING=1" {
		t.Fatalf("on SIGTERM: %q", m)
	}
	agent.Wait()
}

// Hardening, item 14: every file the CLI reads is a regular file, opened
// without blocking, within a bound: a FIFO or /dev/zero named by mistake
// fails at once, saying so.
func TestCLIReadsOnlyRegularFiles(t *testing.T) {
	dir := t.TempDir()
	fifo := filepath.Join(dir, "m.yaml")
	if err := syscall.Mkfifo(fifo, 0o600); err != nil {
		t.Fatal(err)
	}
	for _, args := range [][]string{{"check", fifo}, {"module", "add", fifo, "--data-dir", dir}, {"snapshot", "restore", fifo, "--data-dir", dir}, {"snapshot", "restore", "/dev/zero", "--data-dir", dir}, {"import", "compose", fifo}} {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		out, err := exec.CommandContext(ctx, meshBin, args...).CombinedOutput()
		hung := ctx.Err() != nil
		cancel()
		if hung {
			t.Fatalf("mesh %s hung", strings.Join(args, " "))
		}
		if err == nil || !strings.Contains(string(out), "not a regular file") {
			t.Fatalf("mesh %s: %v\n%s", strings.Join(args, " "), err, out)
		}
	}
}
