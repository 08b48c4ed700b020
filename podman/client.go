// Package podman is the only importer of Podman's Go bindings. Client
// implements reconciler.Runtime against a Podman service socket, starting
// `podman system service` itself when nothing listens there.
//
// It decides nothing: what to create and when is the reconciler's.
package podman

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	nettypes "github.com/containers/common/libnetwork/types"
	"github.com/containers/podman/v5/libpod/define"
	"github.com/containers/podman/v5/pkg/bindings"
	"github.com/containers/podman/v5/pkg/bindings/containers"
	"github.com/containers/podman/v5/pkg/bindings/images"
	"github.com/containers/podman/v5/pkg/bindings/system"
	"github.com/containers/podman/v5/pkg/domain/entities/types"
	"github.com/containers/podman/v5/pkg/specgen"
	spec "github.com/opencontainers/runtime-spec/specs-go"

	"mesh/reconciler"
)

var _ reconciler.Runtime = (*Client)(nil)

// CallTimeout bounds one API call that is not a wait.
const CallTimeout = 2 * time.Minute

// Config says which Podman to talk to.
type Config struct {
	// Socket is a unix socket path or unix:// URL; empty means the default
	// for this user (DefaultSocket).
	Socket string
	// Start: when nothing listens, run `podman system service --time 0` on
	// the socket as a child and wait for it.
	Start  bool
	Logger *slog.Logger
}

// Client talks to one Podman service.
type Client struct {
	conn    context.Context
	socket  string
	service *exec.Cmd
	log     *slog.Logger
}

// DefaultSocket is root's /run/podman/podman.sock, or the user's
// $XDG_RUNTIME_DIR/podman/podman.sock.
func DefaultSocket(rootless bool) string {
	if !rootless {
		return "/run/podman/podman.sock"
	}
	dir := os.Getenv("XDG_RUNTIME_DIR")
	if dir == "" {
		dir = fmt.Sprintf("/run/user/%d", os.Getuid())
	}
	return filepath.Join(dir, "podman", "podman.sock")
}

// New connects, starting the service if asked and needed.
func New(ctx context.Context, cfg Config) (*Client, error) {
	sock := strings.TrimPrefix(cfg.Socket, "unix://")
	log := cfg.Logger.With("component", "podman")
	c := &Client{socket: sock, log: log}
	if !listening(sock) {
		if !cfg.Start {
			return nil, fmt.Errorf("nothing listens on the Podman socket %s; start it (podman system service --time 0 unix://%s) or let the agent start it", sock, sock)
		}
		if err := c.startService(ctx); err != nil {
			return nil, err
		}
	}
	conn, err := bindings.NewConnection(ctx, "unix://"+sock)
	if err != nil {
		c.Close()
		return nil, fmt.Errorf("connect to Podman at %s: %w", sock, err)
	}
	c.conn = conn
	v, err := system.Version(conn, nil)
	if err == nil && v.Server != nil {
		log.Info("connected to podman", "socket", sock, "version", v.Server.Version)
	}
	return c, nil
}

func listening(sock string) bool {
	c, err := net.DialTimeout("unix", sock, time.Second)
	if err != nil {
		return false
	}
	c.Close()
	return true
}

func (c *Client) startService(ctx context.Context) error {
	if err := os.MkdirAll(filepath.Dir(c.socket), 0o700); err != nil {
		return fmt.Errorf("create %s: %w", filepath.Dir(c.socket), err)
	}
	os.Remove(c.socket)
	cmd := exec.Command("podman", "system", "service", "--time", "0", "unix://"+c.socket)
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGTERM}
	logPath := filepath.Join(filepath.Dir(c.socket), "mesh-podman-service.log")
	if f, err := os.OpenFile(logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600); err == nil {
		cmd.Stdout, cmd.Stderr = f, f
		defer f.Close()
	}
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("start podman system service: %w (is podman installed?)", err)
	}
	c.service = cmd
	c.log.Info("nothing listened on the podman socket; started podman system service", "socket", c.socket, "pid", cmd.Process.Pid, "log", logPath)
	deadline := time.Now().Add(30 * time.Second)
	for !listening(c.socket) {
		if time.Now().After(deadline) {
			c.Close()
			return fmt.Errorf("podman system service did not listen on %s within 30s; see %s", c.socket, logPath)
		}
		select {
		case <-ctx.Done():
			c.Close()
			return ctx.Err()
		case <-time.After(50 * time.Millisecond):
		}
	}
	return nil
}

// Close stops the service the client started, if any.
func (c *Client) Close() error {
	if c.service != nil && c.service.Process != nil {
		c.service.Process.Signal(syscall.SIGTERM)
		done := make(chan struct{})
		go func() { c.service.Wait(); close(done) }()
		select {
		case <-done:
		case <-time.After(10 * time.Second):
			c.service.Process.Kill()
		}
		c.service = nil
	}
	return nil
}

func (c *Client) ctx(ctx context.Context) (context.Context, context.CancelFunc) {
	// The bindings keep their connection in the context; carry the caller's
	// deadline and cancellation over to it.
	conn, cancel := context.WithTimeout(c.conn, CallTimeout)
	stop := context.AfterFunc(ctx, cancel)
	return conn, func() { stop(); cancel() }
}

func toContainer(l types.ListContainer) reconciler.Container {
	name := ""
	if len(l.Names) > 0 {
		name = l.Names[0]
	}
	return reconciler.Container{ID: l.ID, Name: name, Labels: l.Labels, Running: l.State == "running", State: l.State}
}

// Managed lists the mesh's containers.
func (c *Client) Managed(ctx context.Context) ([]reconciler.Container, error) {
	cx, cancel := c.ctx(ctx)
	defer cancel()
	list, err := containers.List(cx, new(containers.ListOptions).WithAll(true).WithFilters(map[string][]string{"label": {reconciler.LabelManaged + "=1"}}))
	if err != nil {
		return nil, fmt.Errorf("list containers: %w", err)
	}
	out := make([]reconciler.Container, 0, len(list))
	for _, l := range list {
		out = append(out, toContainer(l))
	}
	return out, nil
}

// Lookup finds a container by exact name.
func (c *Client) Lookup(ctx context.Context, name string) (reconciler.Container, bool, error) {
	cx, cancel := c.ctx(ctx)
	defer cancel()
	list, err := containers.List(cx, new(containers.ListOptions).WithAll(true).WithFilters(map[string][]string{"name": {"^" + regexpQuote(name) + "$"}}))
	if err != nil {
		return reconciler.Container{}, false, fmt.Errorf("look up container %s: %w", name, err)
	}
	for _, l := range list {
		for _, n := range l.Names {
			if n == name {
				return toContainer(l), true, nil
			}
		}
	}
	return reconciler.Container{}, false, nil
}

func regexpQuote(s string) string {
	var b strings.Builder
	for _, r := range s {
		if strings.ContainsRune(`\.+*?()|[]{}^$`, r) {
			b.WriteRune('\\')
		}
		b.WriteRune(r)
	}
	return b.String()
}

// ImageExists reports whether ref is in local storage.
func (c *Client) ImageExists(ctx context.Context, ref string) (bool, error) {
	cx, cancel := c.ctx(ctx)
	defer cancel()
	ok, err := images.Exists(cx, ref, nil)
	if err != nil {
		return false, fmt.Errorf("look up image %s: %w", ref, err)
	}
	return ok, nil
}

// Pull fetches an image.
func (c *Client) Pull(ctx context.Context, ref string) error {
	cx, cancel := c.ctx(ctx)
	defer cancel()
	if _, err := images.Pull(cx, ref, new(images.PullOptions).WithQuiet(true)); err != nil {
		return fmt.Errorf("pull %s: %w", ref, err)
	}
	return nil
}

// Create creates a container from spec.
func (c *Client) Create(ctx context.Context, s reconciler.Spec) (string, error) {
	g := specgen.NewSpecGenerator(s.Image, false)
	g.Name = s.Name
	g.Command = s.Command
	g.Env = s.Env
	g.Labels = s.Labels
	g.RestartPolicy = s.Restart
	if s.DNS.IsValid() {
		g.DNSServers = []net.IP{net.IP(s.DNS.AsSlice())}
	}
	for _, m := range s.Mounts {
		g.Mounts = append(g.Mounts, spec.Mount{Type: "bind", Source: m.Source, Destination: m.Destination, Options: append([]string{"rbind"}, m.Options...)})
	}
	for _, p := range s.Ports {
		g.PortMappings = append(g.PortMappings, nettypes.PortMapping{HostIP: p.HostIP, HostPort: p.HostPort, ContainerPort: p.ContainerPort, Protocol: p.Protocol})
	}
	// Podman 4.3 asks for rlimits above what this host lets root set
	// (ENVIRONMENT.md §1); ask for the host's own hard limits instead.
	g.Rlimits = hostRlimits()
	cx, cancel := c.ctx(ctx)
	defer cancel()
	r, err := containers.CreateWithSpec(cx, g, nil)
	if err != nil {
		return "", fmt.Errorf("create container %s: %w", s.Name, err)
	}
	return r.ID, nil
}

func hostRlimits() []spec.POSIXRlimit {
	var out []spec.POSIXRlimit
	for name, res := range map[string]int{"nofile": syscall.RLIMIT_NOFILE, "nproc": 6 /* RLIMIT_NPROC */} {
		var l syscall.Rlimit
		if err := syscall.Getrlimit(res, &l); err == nil {
			out = append(out, spec.POSIXRlimit{Type: name, Soft: l.Max, Hard: l.Max})
		}
	}
	if len(out) == 2 && out[0].Type > out[1].Type {
		out[0], out[1] = out[1], out[0]
	}
	return out
}

// Start starts a container; Podman's Wait does not catch a failed start, so
// this error is the one to trust.
func (c *Client) Start(ctx context.Context, id string) error {
	cx, cancel := c.ctx(ctx)
	defer cancel()
	if err := containers.Start(cx, id, nil); err != nil {
		return fmt.Errorf("start container %s: %w", short(id), err)
	}
	return nil
}

// Remove force-removes a container.
func (c *Client) Remove(ctx context.Context, id string) error {
	cx, cancel := c.ctx(ctx)
	defer cancel()
	_, err := containers.Remove(cx, id, new(containers.RemoveOptions).WithForce(true).WithTimeout(10))
	if err != nil && !errors.Is(err, define.ErrNoSuchCtr) && !strings.Contains(err.Error(), "no such container") {
		return fmt.Errorf("remove container %s: %w", short(id), err)
	}
	return nil
}

// Wait waits for the container to exit.
func (c *Client) Wait(ctx context.Context, id string) (int, error) {
	cx, cancel := context.WithCancel(c.conn)
	stop := context.AfterFunc(ctx, cancel)
	defer func() { stop(); cancel() }()
	code, err := containers.Wait(cx, id, new(containers.WaitOptions).WithCondition([]define.ContainerStatus{define.ContainerStateExited, define.ContainerStateStopped}))
	if err != nil {
		return -1, fmt.Errorf("wait for container %s: %w", short(id), err)
	}
	return int(code), nil
}

// Logs returns the last lines of stdout and stderr, interleaved per stream.
func (c *Client) Logs(ctx context.Context, id string, lines int) (string, error) {
	cx, cancel := c.ctx(ctx)
	defer cancel()
	out, errc := make(chan string, 64), make(chan string, 64)
	var got []string
	done := make(chan struct{})
	go func() {
		for out != nil || errc != nil {
			select {
			case l, ok := <-out:
				if !ok {
					out = nil
					continue
				}
				got = append(got, l)
			case l, ok := <-errc:
				if !ok {
					errc = nil
					continue
				}
				got = append(got, l)
			}
		}
		close(done)
	}()
	err := containers.Logs(cx, id, new(containers.LogOptions).WithStdout(true).WithStderr(true).WithTail(fmt.Sprint(lines)), out, errc)
	close(out)
	close(errc)
	<-done
	if err != nil {
		return "", fmt.Errorf("logs of %s: %w", short(id), err)
	}
	if len(got) > lines {
		got = got[len(got)-lines:]
	}
	return strings.TrimRight(strings.Join(got, ""), "\n"), nil
}

func short(id string) string {
	if len(id) > 12 {
		return id[:12]
	}
	return id
}
