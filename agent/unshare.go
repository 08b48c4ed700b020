package agent

import (
	"errors"
	"fmt"
	"net/netip"
	"os"
	"os/exec"
	"os/signal"
	"strings"
	"syscall"

	"golang.org/x/sys/unix"
)

// unsharedEnv marks the agent that runs inside `podman unshare`.
const unsharedEnv = "MESH_UNSHARED"

// NeedsUnshare says whether this process must run again inside Podman's
// user namespace before it can be a node: a rootless agent sets owners as
// the container sees them there, where a container's uid n is uid n, and
// can manage directories owned by subordinate ids.
func NeedsUnshare() bool { return os.Geteuid() != 0 }

// EndWithParent makes an agent started by Unshare's wrapper end when the
// wrapper does, so stopping what the operator started always stops the
// agent. Elsewhere it does nothing.
func EndWithParent() {
	if os.Getenv(unsharedEnv) == "1" {
		unix.Prctl(unix.PR_SET_PDEATHSIG, uintptr(syscall.SIGTERM), 0, 0, 0)
	}
}

// Unshare runs this command again inside Podman's user namespace, as a
// child in its own process group: SIGINT, SIGTERM and SIGHUP sent to this
// process (`kill $!`, Ctrl-C, systemd) are passed to the whole group, and
// the child ends if this process dies, so no agent is ever left running
// alone. It exits with the child's exit code.
//
// When mesh setup installed this user's helper, the resolver's sockets on
// port 53 are bound by it first and passed down (port53.go).
func Unshare(dataDir string, dnsAddr netip.Addr) error {
	podmanPath, err := exec.LookPath("podman")
	if err != nil {
		return errors.New("a rootless agent needs podman on PATH (apt-get install podman)")
	}
	self, err := os.Executable()
	if err != nil {
		return err
	}
	cmd := exec.Command(podmanPath, append([]string{"unshare", self}, os.Args[1:]...)...)
	cmd.Env = append(os.Environ(), "MESH_DATA_DIR="+dataDir, unsharedEnv+"=1")
	files, kinds, err := helperSockets(dnsAddr)
	if err != nil {
		return fmt.Errorf("bind the resolver's port 53: %w", err)
	}
	if len(files) > 0 {
		cmd.ExtraFiles = files
		cmd.Env = append(cmd.Env, socketsEnv+"="+strings.Join(kinds, ","))
	}
	cmd.Stdin, cmd.Stdout, cmd.Stderr = os.Stdin, os.Stdout, os.Stderr
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGTERM}
	sigs := make(chan os.Signal, 4)
	signal.Notify(sigs, os.Interrupt, syscall.SIGTERM, syscall.SIGHUP)
	defer signal.Stop(sigs)
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("start the agent under podman unshare: %w", err)
	}
	for _, f := range files {
		f.Close() // the agent holds them now
	}
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	for {
		select {
		case s := <-sigs:
			syscall.Kill(-cmd.Process.Pid, s.(syscall.Signal))
		case err := <-done:
			var ee *exec.ExitError
			if errors.As(err, &ee) {
				os.Exit(ee.ExitCode())
			}
			return err
		}
	}
}

// isIdentityMap says whether a uid_map is the initial namespace's.
func isIdentityMap(uidMap string) bool {
	f := strings.Fields(uidMap)
	return len(f) == 3 && f[0] == "0" && f[1] == "0" && f[2] == "4294967295"
}
