// Package envexec is `mesh exec-env FILE -- COMMAND...`: what a container
// with env-secrets runs first (podman/client.go mounts the static mesh
// binary and FILE read-only). It adds FILE's entries to the environment
// and execs COMMAND in its place, so that the process is the container's
// own (its PID, its signals, its exit code) and the values were never in
// the container's configuration.
package envexec

import (
	"bytes"

	"fmt"
	"io"
	"os"
	"os/exec"
	"strings"
	"syscall"
)

// MaxFile bounds what is read of FILE (a module's secrets, 1 MiB each).
const MaxFile = 64 << 20

// Run runs it and returns an exit code only when it could not exec: 127
// when the command is not found, 126 otherwise (a shell's codes).
func Run(args []string, stderr io.Writer) int {
	if len(args) < 3 || args[1] != "--" {
		fmt.Fprintln(stderr, "usage: mesh exec-env FILE -- COMMAND [ARG...] (the mesh runs it in a container with env-secrets)")
		return 126
	}
	env, err := Environ(args[0], os.Environ())
	if err != nil {
		fmt.Fprintf(stderr, "mesh exec-env: %v\n", err)
		return 126
	}
	argv := args[2:]
	path, err := lookPath(argv[0], env)
	if err != nil {
		fmt.Fprintf(stderr, "mesh exec-env: %v\n", err)
		return 127
	}
	err = syscall.Exec(path, argv, env)
	fmt.Fprintf(stderr, "mesh exec-env: exec %s: %v\n", path, err)
	return 126
}

// Environ is base with FILE's entries (NAME=VALUE, each ended by NUL)
// set over it.
func Environ(file string, base []string) ([]string, error) {
	f, err := os.Open(file)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	b, err := io.ReadAll(io.LimitReader(f, MaxFile+1))
	if err != nil {
		return nil, fmt.Errorf("read %s: %w", file, err)
	}
	if len(b) > MaxFile {
		return nil, fmt.Errorf("%s is over %d bytes", file, MaxFile)
	}
	set := map[string]string{}
	var order []string
	for len(b) > 0 {
		i := bytes.IndexByte(b, 0)
		if i < 0 {
			return nil, fmt.Errorf("%s ends without a NUL: it is damaged", file)
		}
		k, v, ok := strings.Cut(string(b[:i]), "=")
		if !ok || k == "" {
			return nil, fmt.Errorf("%s holds an entry without a name", file)
		}
		if _, dup := set[k]; !dup {
			order = append(order, k)
		}
		set[k] = v
		b = b[i+1:]
	}
	out := make([]string, 0, len(base)+len(order))
	for _, kv := range base {
		k, _, _ := strings.Cut(kv, "=")
		if _, over := set[k]; !over {
			out = append(out, kv)
		}
	}
	for _, k := range order {
		out = append(out, k+"="+set[k])
	}
	return out, nil
}

// lookPath finds name as a shell would, on the PATH of env (the image's).
func lookPath(name string, env []string) (string, error) {
	if strings.Contains(name, "/") {
		return name, nil
	}
	path := "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
	for _, kv := range env {
		if v, ok := strings.CutPrefix(kv, "PATH="); ok {
			path = v
		}
	}
	for _, dir := range strings.Split(path, ":") {
		if dir == "" {
			dir = "."
		}
		p := dir + "/" + name
		if fi, err := os.Stat(p); err == nil && fi.Mode().IsRegular() && fi.Mode()&0o111 != 0 {
			return p, nil
		}
	}
	return "", fmt.Errorf("%s: %w", name, exec.ErrNotFound)
}
