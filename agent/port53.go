package agent

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"syscall"

	"golang.org/x/sys/unix"

	"mesh/dnsd"
)

// A rootless agent's resolver must answer on port 53, which only a process
// with CAP_NET_BIND_SERVICE may bind. Rather than lower the port limit for
// every user of the host, `mesh setup --user USER` installs a copy of this
// binary that only USER's group may run, with that one capability: the
// helper. It does one thing, bind the resolver's address on port 53 (only an
// address on the bridge mesh setup made), and hand the sockets to the agent
// that ran it over a unix socket; the agent, whose own binary has no
// capability, serves on them.

// HelperName is the name the helper copy runs under.
const HelperName = "mesh-resolver-socket"

// helperDir is where mesh setup puts USER's helper.
const helperDir = "/usr/local/lib/mesh"

// HelperPath is USER's helper.
func HelperPath(username string) string { return filepath.Join(helperDir, username, HelperName) }

// socketsEnv tells an agent which inherited descriptors are its resolver's
// sockets: "udp,udp,tcp" from descriptor 3 on.
const socketsEnv = "MESH_RESOLVER_SOCKETS"

// IsHelper says whether this process must act as the helper: started
// under its name, or started with privileges its user lacks (the kernel's
// AT_SECURE, which the helper's file capability sets): whatever argv[0]
// says, the helper's binary does the helper's one job and nothing else. A
// user's agent run with ambient capabilities (a systemd unit's) is not
// privileged by its file, so it stays the agent.
func IsHelper() bool {
	return filepath.Base(os.Args[0]) == HelperName || (os.Geteuid() != 0 && secureExec())
}

// secureExec says whether the kernel started this process with more
// privilege than its caller had (AT_SECURE in the auxiliary vector).
func secureExec() bool {
	b, err := os.ReadFile("/proc/self/auxv")
	if err != nil {
		return true // not known: the helper's job only
	}
	const atSecure = 23
	for len(b) >= 16 {
		k, v := binary.NativeEndian.Uint64(b), binary.NativeEndian.Uint64(b[8:])
		if k == atSecure {
			return v != 0
		}
		b = b[16:]
	}
	return false
}

// RunHelper binds ADDR:53 (args[0]) and sends the sockets over descriptor
// 3, then exits: 0 on success, 1 with the reason on standard error.
func RunHelper(args []string) int {
	if err := helper(args); err != nil {
		fmt.Fprintf(os.Stderr, "%s: %v\n", HelperName, err)
		return 1
	}
	return 0
}

func helper(args []string) error {
	if len(args) != 1 {
		return errors.New("give the resolver's address, and nothing else")
	}
	// Only the user mesh setup installed it for: its directory is named so.
	self, err := os.Executable()
	if err != nil {
		return err
	}
	u, err := user.Current()
	if err != nil {
		return err
	}
	if filepath.Base(filepath.Dir(self)) != u.Username {
		return fmt.Errorf("this helper is %s's, not %s's", filepath.Base(filepath.Dir(self)), u.Username)
	}
	addr, err := netip.ParseAddr(args[0])
	if err != nil {
		return fmt.Errorf("%q is not an IP address", args[0])
	}
	// Only an address root put on the mesh's own bridge.
	if !onLink(addr, dnsd.DefaultLink) {
		return fmt.Errorf("%s is not on %s; run mesh setup as root", addr, dnsd.DefaultLink)
	}
	files, kinds, err := bindResolver(addr)
	if err != nil {
		return err
	}
	to := os.NewFile(3, "agent")
	if to == nil {
		return errors.New("no socket to hand the resolver's sockets over")
	}
	uc, err := net.FileConn(to)
	if err != nil {
		return fmt.Errorf("descriptor 3 is not a unix socket: %w", err)
	}
	defer uc.Close()
	var fds []int
	for _, f := range files {
		fds = append(fds, int(f.Fd()))
	}
	_, _, err = uc.(*net.UnixConn).WriteMsgUnix([]byte(strings.Join(kinds, ",")), unix.UnixRights(fds...), nil)
	return err
}

// onLink says whether addr is one of link's addresses.
func onLink(addr netip.Addr, link string) bool {
	i, err := net.InterfaceByName(link)
	if err != nil {
		return false
	}
	as, _ := i.Addrs()
	for _, a := range as {
		if n, ok := a.(*net.IPNet); ok {
			if p, _ := netip.AddrFromSlice(n.IP); p.Unmap() == addr {
				return true
			}
		}
	}
	return false
}

// bindResolver binds addr:53: a UDP socket per core (SO_REUSEPORT, as the
// resolver does itself) and one TCP listener.
func bindResolver(addr netip.Addr) ([]*os.File, []string, error) {
	at := netip.AddrPortFrom(addr, 53).String()
	lc := net.ListenConfig{Control: func(network, address string, c syscall.RawConn) error {
		var serr error
		c.Control(func(fd uintptr) { serr = syscall.SetsockoptInt(int(fd), syscall.SOL_SOCKET, unix.SO_REUSEPORT, 1) })
		return serr
	}}
	var files []*os.File
	var kinds []string
	for i := 0; i < max(1, runtime.NumCPU()); i++ {
		pc, err := lc.ListenPacket(context.Background(), "udp", at)
		if err != nil {
			if i > 0 {
				break
			}
			return nil, nil, fmt.Errorf("bind udp %s: %w", at, err)
		}
		f, err := pc.(*net.UDPConn).File()
		pc.Close()
		if err != nil {
			for _, f := range files {
				f.Close()
			}
			return nil, nil, err
		}
		files, kinds = append(files, f), append(kinds, "udp")
	}
	l, err := net.Listen("tcp", at)
	if err != nil {
		for _, f := range files {
			f.Close()
		}
		return nil, nil, fmt.Errorf("bind tcp %s: %w", at, err)
	}
	f, err := l.(*net.TCPListener).File()
	l.Close()
	if err != nil {
		return nil, nil, err
	}
	return append(files, f), append(kinds, "tcp"), nil
}

// helperSockets runs this user's helper, when mesh setup installed one, and
// returns the sockets it bound for addr with their kinds; none (and no
// error) when there is no helper.
func helperSockets(addr netip.Addr) ([]*os.File, []string, error) {
	u, err := user.Current()
	if err != nil {
		return nil, nil, err
	}
	path := HelperPath(u.Username)
	if _, err := os.Stat(path); err != nil {
		return nil, nil, nil
	}
	pair, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return nil, nil, err
	}
	ours, theirs := os.NewFile(uintptr(pair[0]), "helper"), os.NewFile(uintptr(pair[1]), "agent")
	defer ours.Close()
	cmd := exec.Command(path, addr.String())
	cmd.ExtraFiles = []*os.File{theirs}
	out, err := cmd.CombinedOutput()
	theirs.Close()
	if err != nil {
		return nil, nil, fmt.Errorf("%s: %v: %s", path, err, strings.TrimSpace(string(out)))
	}
	uc, err := net.FileConn(ours)
	if err != nil {
		return nil, nil, err
	}
	defer uc.Close()
	buf, oob := make([]byte, 256), make([]byte, unix.CmsgSpace(64*4))
	n, oobn, _, _, err := uc.(*net.UnixConn).ReadMsgUnix(buf, oob)
	if err != nil {
		return nil, nil, fmt.Errorf("read the resolver's sockets from %s: %w", path, err)
	}
	msgs, err := unix.ParseSocketControlMessage(oob[:oobn])
	if err != nil || len(msgs) != 1 {
		return nil, nil, fmt.Errorf("%s sent no sockets", path)
	}
	fds, err := unix.ParseUnixRights(&msgs[0])
	if err != nil {
		return nil, nil, err
	}
	kinds := strings.Split(string(buf[:n]), ",")
	if len(kinds) != len(fds) {
		return nil, nil, fmt.Errorf("%s sent %d sockets for %d kinds", path, len(fds), len(kinds))
	}
	var files []*os.File
	for _, fd := range fds {
		files = append(files, os.NewFile(uintptr(fd), "resolver"))
	}
	return files, kinds, nil
}

// inheritedSockets are the resolver's sockets this agent was given at
// descriptor 3 on (socketsEnv), or nil.
func inheritedSockets() (*dnsd.Sockets, error) {
	v := os.Getenv(socketsEnv)
	if v == "" {
		return nil, nil
	}
	os.Unsetenv(socketsEnv) // not for the children
	so := &dnsd.Sockets{}
	for i, kind := range strings.Split(v, ",") {
		f := os.NewFile(uintptr(3+i), "resolver")
		if f == nil {
			return nil, fmt.Errorf("inherited resolver socket %d is missing", 3+i)
		}
		switch kind {
		case "udp":
			pc, err := net.FilePacketConn(f)
			if err != nil {
				return nil, fmt.Errorf("inherited resolver socket %d: %w", 3+i, err)
			}
			so.UDP = append(so.UDP, pc)
		case "tcp":
			l, err := net.FileListener(f)
			if err != nil {
				return nil, fmt.Errorf("inherited resolver socket %d: %w", 3+i, err)
			}
			so.TCP = l
		default:
			return nil, fmt.Errorf("inherited resolver socket %d of kind %q", 3+i, kind)
		}
		f.Close() // the conn holds its own copy
	}
	return so, nil
}

// InstallHelper copies the binary at self to username's helper: owned
// root:GROUP, mode 0750 (only the user's group may run it), with
// CAP_NET_BIND_SERVICE as its one file capability. As root.
func InstallHelper(self, username string) (string, error) {
	u, err := user.Lookup(username)
	if err != nil {
		return "", fmt.Errorf("user %s: %w", username, err)
	}
	gid, _ := strconv.Atoi(u.Gid)
	dir := filepath.Dir(HelperPath(username))
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return "", err
	}
	if err := os.Chmod(helperDir, 0o755); err != nil {
		return "", err
	}
	if err := os.Chown(dir, 0, gid); err != nil {
		return "", err
	}
	if err := os.Chmod(dir, 0o750); err != nil {
		return "", err
	}
	b, err := os.ReadFile(self)
	if err != nil {
		return "", err
	}
	tmp := HelperPath(username) + ".tmp"
	os.Remove(tmp)
	if err := os.WriteFile(tmp, b, 0o700); err != nil {
		return "", err
	}
	if err := os.Chown(tmp, 0, gid); err != nil {
		return "", err
	}
	if err := os.Chmod(tmp, 0o750); err != nil {
		return "", err
	}
	if err := unix.Setxattr(tmp, "security.capability", netBindCap(), 0); err != nil {
		os.Remove(tmp)
		return "", fmt.Errorf("give %s the capability to bind port 53: %w", tmp, err)
	}
	if err := os.Rename(tmp, HelperPath(username)); err != nil {
		return "", err
	}
	return HelperPath(username), nil
}

// netBindCap is the security.capability xattr (vfs_cap_data, revision 2)
// giving CAP_NET_BIND_SERVICE, permitted and effective, and nothing else.
func netBindCap() []byte {
	const (
		revision2      = 0x02000000
		flagEffective  = 0x000001
		capNetBindServ = 10
	)
	b := make([]byte, 20)
	binary.LittleEndian.PutUint32(b[0:], revision2|flagEffective)
	binary.LittleEndian.PutUint32(b[4:], 1<<capNetBindServ) // permitted
	return b
}
