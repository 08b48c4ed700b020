// Command maxrss runs a command and writes its peak resident set (KiB) to
// the file named by MAXRSS_OUT, then exits with its exit code. A process
// started straight from a large test binary has the test's resident set
// counted as its own peak (Go starts children with vfork, and the peak is
// kept across exec); started from this small program, the peak is the
// command's own.
package main

import (
	"fmt"
	"os"
	"os/exec"
	"syscall"
)

func main() {
	if len(os.Args) < 2 {
		fmt.Fprintln(os.Stderr, "usage: MAXRSS_OUT=FILE maxrss CMD [ARG...]")
		os.Exit(2)
	}
	cmd := exec.Command(os.Args[1], os.Args[2:]...)
	cmd.Stdin, cmd.Stdout, cmd.Stderr = os.Stdin, os.Stdout, os.Stderr
	err := cmd.Run()
	if cmd.ProcessState == nil {
		fmt.Fprintln(os.Stderr, "maxrss:", err)
		os.Exit(127)
	}
	if out := os.Getenv("MAXRSS_OUT"); out != "" {
		os.WriteFile(out, []byte(fmt.Sprint(cmd.ProcessState.SysUsage().(*syscall.Rusage).Maxrss)), 0o644)
	}
	if ws, ok := cmd.ProcessState.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
		os.Exit(128 + int(ws.Signal())) // as a shell says it
	}
	os.Exit(cmd.ProcessState.ExitCode())
}
