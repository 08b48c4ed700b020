// Package podman is the only importer of Podman's Go bindings. Client
// implements reconciler.Runtime against a Podman service socket, starting
// `podman system service` itself when nothing listens there.
//
// It decides nothing: what to create and when is the reconciler's.
package podman

import (
	"sort"

	imagemanifest "github.com/containers/image/v5/manifest"

	"context"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	nettypes "github.com/containers/common/libnetwork/types"
	"github.com/containers/podman/v5/libpod/define"
	"github.com/containers/podman/v5/pkg/bindings"
	"github.com/containers/podman/v5/pkg/bindings/containers"
	"github.com/containers/podman/v5/pkg/bindings/images"
	"github.com/containers/podman/v5/pkg/bindings/network"
	"github.com/containers/podman/v5/pkg/bindings/system"
	"github.com/containers/podman/v5/pkg/domain/entities/types"
	"github.com/containers/podman/v5/pkg/specgen"
	spec "github.com/opencontainers/runtime-spec/specs-go"
	"golang.org/x/sys/unix"

	"mesh/reconciler"
	"mesh/state"
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
	socket string
	start  bool
	log    *slog.Logger

	mu      sync.Mutex
	conn    context.Context
	service *exec.Cmd
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

// New makes a client. It connects lazily, on the first call and again after
// the service went away, so a Podman that is down is an error of that call
// (reported, retried), never a dead agent.
func New(cfg Config) *Client {
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	return &Client{socket: strings.TrimPrefix(cfg.Socket, "unix://"), start: cfg.Start, log: cfg.Logger.With("component", "podman")}
}

// connect returns a live connection, starting the service if allowed.
func (c *Client) connect(ctx context.Context) (context.Context, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.conn != nil && listening(c.socket) {
		return c.conn, nil
	}
	c.conn = nil
	if !listening(c.socket) {
		if !c.start {
			return nil, fmt.Errorf("nothing listens on the Podman socket %s; start it (podman system service --time 0 unix://%s)", c.socket, c.socket)
		}
		if err := c.startService(ctx); err != nil {
			return nil, err
		}
	}
	conn, err := bindings.NewConnection(context.Background(), "unix://"+c.socket)
	if err != nil {
		return nil, fmt.Errorf("connect to Podman at %s: %w", c.socket, err)
	}
	// The version the connection's ping reported: asking /version instead
	// makes Podman gather its whole `info`, which runs dpkg-query or rpm
	// several times (seconds of CPU on a small host) at every connect.
	c.log.Info("connected to podman", "socket", c.socket, "api_version", bindings.ServiceVersion(conn).String())
	c.conn = conn
	return conn, nil
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
	if c.service != nil {
		// The service we started died; reap it before starting another.
		c.service.Process.Kill()
		c.service.Wait()
		c.service = nil
	}
	if err := os.MkdirAll(filepath.Dir(c.socket), 0o700); err != nil {
		return fmt.Errorf("create %s: %w", filepath.Dir(c.socket), err)
	}
	os.Remove(c.socket)
	// The agent runs with umask 077 (its data dir is private); Podman's
	// service gets the usual 022 for what it creates.
	cmd := exec.Command("sh", "-c", `umask 022 && exec podman system service --time 0 "$0"`, "unix://"+c.socket)
	// Its own process group: a Ctrl-C meant for the agent reaches it only
	// through Close, after the agent stopped using it.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
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
			c.stopService()
			return fmt.Errorf("podman system service did not listen on %s within 30s; see %s", c.socket, logPath)
		}
		select {
		case <-ctx.Done():
			c.stopService()
			return ctx.Err()
		case <-time.After(50 * time.Millisecond):
		}
	}
	return nil
}

// Close stops the service the client started, if any.
func (c *Client) Close() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.stopService()
	return nil
}

func (c *Client) stopService() {
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
}

// ctx gives a call its connection: the bindings keep it in a context, which
// takes over the caller's cancellation and a timeout (0: none).
func (c *Client) ctx(ctx context.Context, timeout time.Duration) (context.Context, context.CancelFunc, error) {
	conn, err := c.connect(ctx)
	if err != nil {
		return nil, nil, err
	}
	var cx context.Context
	var cancel context.CancelFunc
	if timeout > 0 {
		cx, cancel = context.WithTimeout(conn, timeout)
	} else {
		cx, cancel = context.WithCancel(conn)
	}
	stop := context.AfterFunc(ctx, cancel)
	return cx, func() { stop(); cancel() }, nil
}

func toContainer(l types.ListContainer) reconciler.Container {
	name := ""
	if len(l.Names) > 0 {
		name = l.Names[0]
	}
	c := reconciler.Container{ID: l.ID, Name: name, Labels: l.Labels, Running: l.State == "running", State: l.State, ImageID: l.ImageID}
	if l.StartedAt > 0 { // a container never started has Go's zero time, far below 0
		c.StartedAt = time.Unix(l.StartedAt, 0)
	}
	return c
}

// Managed lists the mesh's containers.
func (c *Client) Managed(ctx context.Context) ([]reconciler.Container, error) {
	cx, cancel, err := c.ctx(ctx, CallTimeout)
	if err != nil {
		return nil, err
	}
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
	cx, cancel, err := c.ctx(ctx, CallTimeout)
	if err != nil {
		return reconciler.Container{}, false, err
	}
	defer cancel()
	list, err := containers.List(cx, new(containers.ListOptions).WithAll(true).WithFilters(map[string][]string{"name": {"^" + regexp.QuoteMeta(name) + "$"}}))
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

// ImageExists reports whether ref is in local storage.
func (c *Client) ImageExists(ctx context.Context, ref string) (bool, error) {
	cx, cancel, err := c.ctx(ctx, CallTimeout)
	if err != nil {
		return false, err
	}
	defer cancel()
	ok, err := images.Exists(cx, ref, nil)
	if err != nil {
		return false, fmt.Errorf("look up image %s: %w", ref, err)
	}
	return ok, nil
}

// Pull fetches an image under policy (missing, always, newer).
func (c *Client) Pull(ctx context.Context, ref, policy string) error {
	cx, cancel, err := c.ctx(ctx, 30*time.Minute)
	if err != nil {
		return err
	}
	defer cancel()
	if policy == "" {
		policy = "missing"
	}
	if _, err := images.Pull(cx, ref, new(images.PullOptions).WithQuiet(true).WithPolicy(policy)); err != nil {
		return fmt.Errorf("pull %s: %w", ref, err)
	}
	return nil
}

// ImageID is the ID of the local image ref names.
func (c *Client) ImageID(ctx context.Context, ref string) (string, error) {
	cx, cancel, err := c.ctx(ctx, CallTimeout)
	if err != nil {
		return "", err
	}
	defer cancel()
	img, err := images.GetImage(cx, ref, nil)
	if err != nil {
		return "", fmt.Errorf("inspect image %s: %w", ref, err)
	}
	return img.ID, nil
}

// ImageVolumes lists the paths the local image ref declares VOLUME, sorted.
func (c *Client) ImageVolumes(ctx context.Context, ref string) ([]string, error) {
	cx, cancel, err := c.ctx(ctx, CallTimeout)
	if err != nil {
		return nil, err
	}
	defer cancel()
	img, err := images.GetImage(cx, ref, nil)
	if err != nil {
		return nil, fmt.Errorf("inspect image %s: %w", ref, err)
	}
	var vols []string
	if img.Config != nil {
		for v := range img.Config.Volumes {
			vols = append(vols, v)
		}
	}
	sort.Strings(vols)
	return vols, nil
}

// ImageFacts says what a local image declares: the ports it exposes
// ("5432/tcp") and its USER; ok is false when it is not in local storage.
func (c *Client) ImageFacts(ctx context.Context, ref string) (ports []string, user string, ok bool, err error) {
	cx, cancel, err := c.ctx(ctx, CallTimeout)
	if err != nil {
		return nil, "", false, err
	}
	defer cancel()
	if ok, err := images.Exists(cx, ref, nil); err != nil || !ok {
		return nil, "", false, err
	}
	img, err := images.GetImage(cx, ref, nil)
	if err != nil {
		return nil, "", false, fmt.Errorf("inspect image %s: %w", ref, err)
	}
	if img.Config != nil {
		for p := range img.Config.ExposedPorts {
			ports = append(ports, p)
		}
		user = img.Config.User
	}
	sort.Strings(ports)
	return ports, user, true, nil
}

// Tag makes ref (NAME[:TAG]) name the local image id: a pull's rollout
// that is reverted puts the image from before the pull back under it.
func (c *Client) Tag(ctx context.Context, id, ref string) error {
	if strings.Contains(ref, "@") {
		return fmt.Errorf("%s names an image by digest; it cannot be tagged", ref)
	}
	cx, cancel, err := c.ctx(ctx, CallTimeout)
	if err != nil {
		return err
	}
	defer cancel()
	// The name as the image the ref gives now carries it, fully qualified:
	// Podman reads a short name as localhost/NAME when tagging, which the
	// ref would then find first.
	name := ref
	if !strings.Contains(ref[strings.LastIndex(ref, "/")+1:], ":") {
		name += ":latest"
	}
	if img, err := images.GetImage(cx, ref, nil); err == nil {
		for _, t := range img.RepoTags {
			if t == name || strings.HasSuffix(t, "/"+name) {
				name = t
				break
			}
		}
	}
	repo, tag := name, "latest"
	if i := strings.LastIndex(name, ":"); i > strings.LastIndex(name, "/") {
		repo, tag = name[:i], name[i+1:]
	}
	if err := images.Tag(cx, id, tag, repo, nil); err != nil {
		return fmt.Errorf("tag image %s as %s: %w", short(id), ref, err)
	}
	return nil
}

// Create creates a container from spec.
func (c *Client) Create(ctx context.Context, s reconciler.Spec) (string, error) {
	g := generator(s)
	if s.EnvFile != "" {
		if err := c.execEnv(ctx, g, s); err != nil {
			return "", fmt.Errorf("create container %s: %w", s.Name, err)
		}
	}
	// Podman 4.3 asks for rlimits above what this host lets root set
	// (ENVIRONMENT.md §1); ask for the host's own hard limits instead.
	g.Rlimits = c.rlimits()
	cx, cancel, err := c.ctx(ctx, CallTimeout)
	if err != nil {
		return "", err
	}
	defer cancel()
	r, err := containers.CreateWithSpec(cx, g, nil)
	if err != nil {
		return "", fmt.Errorf("create container %s: %w", s.Name, err)
	}
	return r.ID, nil
}

// The oom_score_adj of a container without a memory limit, and of one
// with (generator).
const (
	OOMScoreUnbounded = 1000
	OOMScoreBounded   = 500
)

// generator is the Podman spec of s, but for what needs the host or the
// service (the environment of env-secrets, the rlimits): what each field of
// the manifest becomes, table tested without a Podman.
func generator(s reconciler.Spec) *specgen.SpecGenerator {
	g := specgen.NewSpecGenerator(s.Image, false)
	g.Name = s.Name
	// A path the image declares a VOLUME is not made a volume: Podman's
	// default makes an anonymous one, owned by the runtime, outside the
	// module's directories (no backup, no move), which the container's
	// removal leaves behind and its replacement does not get back: the
	// data written there was lost to the module at its next replacement,
	// and each replacement left a volume on the disk. What is kept is
	// what the manifest mounts; an unmounted VOLUME path is the
	// container's own, as every other path of it.
	g.ImageVolumeMode = "ignore"
	g.Command = s.Command
	if len(s.Entrypoint) > 0 {
		g.Entrypoint = s.Entrypoint
	}
	g.Env = s.Env
	g.Labels = s.Labels
	g.RestartPolicy = s.Restart
	if s.DNS.IsValid() {
		g.DNSServers = []net.IP{net.IP(s.DNS.AsSlice())}
	}
	g.DNSSearch = s.DNSSearch
	if s.Network != "" {
		g.NetNS = specgen.Namespace{NSMode: specgen.Bridge}
		g.Networks = map[string]nettypes.PerNetworkOptions{s.Network: {}}
	}
	for _, m := range s.Mounts {
		g.Mounts = append(g.Mounts, spec.Mount{Type: "bind", Source: m.Source, Destination: m.Destination, Options: append([]string{"rbind"}, m.Options...)})
	}
	for _, p := range s.Ports {
		g.PortMappings = append(g.PortMappings, nettypes.PortMapping{HostIP: p.HostIP, HostPort: p.HostPort, ContainerPort: p.ContainerPort, Protocol: p.Protocol})
	}
	if s.LogMaxSize > 0 {
		// The k8s-file log: conmon cuts it when it would pass the bound.
		// Named, not left to Podman's default: on a host that runs
		// systemd that is journald, which takes no bound, so a container
		// that writes without end filled the journal (and pushed the
		// agent's own lines out of it).
		g.LogConfiguration = &specgen.LogConfig{Driver: "k8s-file", Size: s.LogMaxSize}
	}
	g.User = s.User
	g.WorkDir = s.WorkingDir
	g.CapAdd, g.CapDrop = s.CapAdd, s.CapDrop
	for _, d := range s.Devices {
		g.Devices = append(g.Devices, spec.LinuxDevice{Path: d.Host + ":" + d.Container + ":" + d.Permissions})
	}
	if s.ReadOnly {
		ro := true
		g.ReadOnlyFilesystem = &ro
	}
	for _, t := range s.Tmpfs {
		g.Mounts = append(g.Mounts, spec.Mount{Type: "tmpfs", Source: "tmpfs", Destination: t.Path, Options: t.Options})
	}
	if s.Memory > 0 || s.CPUs > 0 || s.PidsLimit > 0 {
		g.ResourceLimits = &spec.LinuxResources{}
		if s.Memory > 0 {
			m := s.Memory
			g.ResourceLimits.Memory = &spec.LinuxMemory{Limit: &m}
		}
		if s.CPUs > 0 {
			period := uint64(100000)
			quota := int64(s.CPUs * float64(period))
			g.ResourceLimits.CPU = &spec.LinuxCPU{Period: &period, Quota: &quota}
		}
		if s.PidsLimit > 0 {
			// Without it Podman sets its own default (containers.conf
			// pids_limit); this one takes its place.
			g.ResourceLimits.Pids = &spec.LinuxPids{Limit: s.PidsLimit}
		}
	}
	// What the kernel ends first when the node runs out of memory: a
	// container's processes, never the agent, Podman or sshd while a
	// container has one (each of those is at 0; 1,000 outweighs any size).
	// A container with a memory limit, which its own cgroup enforces first,
	// gets half that: one without a limit goes before it. Kubernetes ranks
	// pods alike (1,000 for those that ask for no memory). The score is not
	// in the declaration's digest: containers made by earlier releases keep
	// Podman's (the process's own, 0) until they are made again.
	adj := OOMScoreUnbounded
	if s.Memory > 0 {
		adj = OOMScoreBounded
	}
	g.OOMScoreAdj = &adj
	if s.TTY {
		on := true
		g.Terminal = &on
	}
	if s.Init {
		// Podman mounts its init binary (containers.conf init_path) at
		// /run/podman-init and runs the command under it; a host without
		// one fails the create, saying so.
		on := true
		g.Init = &on
	}
	g.Groups = s.GroupAdd
	if s.StopSignal > 0 {
		sig := syscall.Signal(s.StopSignal)
		g.StopSignal = &sig
	}
	g.StopTimeout = s.StopTimeout
	if h := s.Health; h != nil {
		// Podman schedules runs through systemd timers, which hosts without
		// systemd lack; the agent runs the check itself (HealthCheck), and
		// Podman keeps the status, the failing streak and the log.
		g.HealthConfig = &imagemanifest.Schema2HealthConfig{
			Test:     append([]string{"CMD"}, h.Command...),
			Interval: h.Interval, Timeout: h.Timeout, StartPeriod: h.StartPeriod, Retries: h.Retries,
		}
	}
	return g
}

// rlimits are the limits to ask for: the hard limits of the Podman service
// (found through the socket's peer credentials) and of this process,
// whichever is lower. Podman 4.3 otherwise asks for more than this host lets
// root set, and runc fails (ENVIRONMENT.md section 1).
func (c *Client) rlimits() []spec.POSIXRlimit {
	want := map[string]uint64{"nofile": math.MaxUint64, "nproc": math.MaxUint64}
	for name, res := range map[string]int{"nofile": unix.RLIMIT_NOFILE, "nproc": unix.RLIMIT_NPROC} {
		var l unix.Rlimit
		if unix.Getrlimit(res, &l) == nil {
			want[name] = l.Max
		}
	}
	if pid, err := peerPID(c.socket); err == nil {
		if b, err := os.ReadFile(fmt.Sprintf("/proc/%d/limits", pid)); err == nil {
			for _, line := range strings.Split(string(b), "\n") {
				for prefix, name := range map[string]string{"Max open files": "nofile", "Max processes": "nproc"} {
					if f := strings.Fields(strings.TrimPrefix(line, prefix)); strings.HasPrefix(line, prefix) && len(f) >= 2 {
						if v, err := strconv.ParseUint(f[1], 10, 64); err == nil && v < want[name] {
							want[name] = v
						}
					}
				}
			}
		}
	}
	var out []spec.POSIXRlimit
	for _, name := range []string{"nofile", "nproc"} {
		if want[name] != math.MaxUint64 {
			out = append(out, spec.POSIXRlimit{Type: name, Soft: want[name], Hard: want[name]})
		}
	}
	return out
}

// peerPID is the pid of the process listening on a unix socket.
func peerPID(sock string) (int, error) {
	conn, err := net.DialTimeout("unix", sock, time.Second)
	if err != nil {
		return 0, err
	}
	defer conn.Close()
	raw, err := conn.(*net.UnixConn).SyscallConn()
	if err != nil {
		return 0, err
	}
	var cred *unix.Ucred
	var cerr error
	raw.Control(func(fd uintptr) { cred, cerr = unix.GetsockoptUcred(int(fd), unix.SOL_SOCKET, unix.SO_PEERCRED) })
	if cerr != nil {
		return 0, cerr
	}
	return int(cred.Pid), nil
}

// Start starts a container; Podman's Wait does not catch a failed start, so
// this error is the one to trust.
func (c *Client) Start(ctx context.Context, id string) error {
	cx, cancel, err := c.ctx(ctx, CallTimeout)
	if err != nil {
		return err
	}
	defer cancel()
	if err := containers.Start(cx, id, nil); err != nil {
		return fmt.Errorf("start container %s: %w", short(id), err)
	}
	return nil
}

// Restart stops a container as Podman stops it (its stop signal, then
// SIGKILL after its stop timeout) and starts it again: the same container.
func (c *Client) Restart(ctx context.Context, id string) error {
	cx, cancel, err := c.ctx(ctx, CallTimeout)
	if err != nil {
		return err
	}
	defer cancel()
	if err := containers.Restart(cx, id, nil); err != nil {
		return fmt.Errorf("restart container %s: %w", short(id), err)
	}
	return nil
}

// Pause freezes a container's processes (a backup's copy, issue 30).
func (c *Client) Pause(ctx context.Context, id string) error {
	cx, cancel, err := c.ctx(ctx, CallTimeout)
	if err != nil {
		return err
	}
	defer cancel()
	if err := containers.Pause(cx, id, nil); err != nil {
		return fmt.Errorf("pause container %s: %w", short(id), err)
	}
	return nil
}

// Unpause lets a paused container's processes run again.
func (c *Client) Unpause(ctx context.Context, id string) error {
	cx, cancel, err := c.ctx(ctx, CallTimeout)
	if err != nil {
		return err
	}
	defer cancel()
	if err := containers.Unpause(cx, id, nil); err != nil {
		return fmt.Errorf("unpause container %s: %w", short(id), err)
	}
	return nil
}

// Remove force-removes a container.
func (c *Client) Remove(ctx context.Context, id string) error {
	cx, cancel, err := c.ctx(ctx, CallTimeout)
	if err != nil {
		return err
	}
	defer cancel()
	// The stop waits the container's own stop timeout (10 s, or its
	// declared stop-timeout) before it kills.
	_, err = containers.Remove(cx, id, new(containers.RemoveOptions).WithForce(true))
	if err != nil && !errors.Is(err, define.ErrNoSuchCtr) && !strings.Contains(err.Error(), "no such container") {
		return fmt.Errorf("remove container %s: %w", short(id), err)
	}
	return nil
}

// Wait waits for the container to exit.
func (c *Client) Wait(ctx context.Context, id string) (int, error) {
	cx, cancel, err := c.ctx(ctx, 0)
	if err != nil {
		return -1, err
	}
	defer cancel()
	code, err := containers.Wait(cx, id, new(containers.WaitOptions).WithCondition([]define.ContainerStatus{define.ContainerStateExited, define.ContainerStateStopped}))
	if err != nil {
		return -1, fmt.Errorf("wait for container %s: %w", short(id), err)
	}
	return int(code), nil
}

// Died calls died for each of the mesh's containers that exits, from
// Podman's event stream, until ctx ends or the stream breaks.
func (c *Client) Died(ctx context.Context, died func(id, name string, exitCode int)) error {
	cx, cancel, err := c.ctx(ctx, 0)
	if err != nil {
		return err
	}
	defer cancel()
	ch := make(chan types.Event, 16)
	stop := make(chan bool)
	opts := new(system.EventsOptions).WithStream(true).WithFilters(map[string][]string{
		"type": {"container"}, "event": {"died"}, "label": {reconciler.LabelManaged + "=1"},
	})
	if err := system.Events(cx, ch, stop, opts); err != nil {
		return fmt.Errorf("follow Podman's events: %w", err)
	}
	defer close(stop)
	for {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case e, ok := <-ch:
			if !ok {
				return errors.New("Podman's event stream ended")
			}
			code, _ := strconv.Atoi(e.Actor.Attributes["containerExitCode"])
			died(e.Actor.ID, e.Actor.Attributes["name"], code)
		}
	}
}

// Restarts is the ID of the container called name and how many times Podman
// restarted it (its restart policy).
func (c *Client) Restarts(ctx context.Context, name string) (string, int, error) {
	cx, cancel, err := c.ctx(ctx, CallTimeout)
	if err != nil {
		return "", 0, err
	}
	defer cancel()
	d, err := containers.Inspect(cx, name, nil)
	if err != nil {
		return "", 0, fmt.Errorf("inspect container %s: %w", name, err)
	}
	return d.ID, int(d.RestartCount), nil
}

// HealthCheck runs a container's health check once and returns the health
// Podman then keeps for it. The run's own answer is that run's result alone
// ("unhealthy" on any failure, even within the start period); the kept
// status applies the start period and the retries.
func (c *Client) HealthCheck(ctx context.Context, name string) (reconciler.HealthResult, error) {
	cx, cancel, err := c.ctx(ctx, CallTimeout)
	if err != nil {
		return reconciler.HealthResult{}, err
	}
	defer cancel()
	if _, err := containers.RunHealthCheck(cx, name, nil); err != nil {
		return reconciler.HealthResult{}, fmt.Errorf("run the health check of %s: %w", name, err)
	}
	d, err := containers.Inspect(cx, name, nil)
	if err != nil {
		return reconciler.HealthResult{}, fmt.Errorf("inspect container %s: %w", name, err)
	}
	if d.State == nil || d.State.Health == nil {
		return reconciler.HealthResult{}, fmt.Errorf("container %s has no health check in Podman", name)
	}
	h := d.State.Health
	out := reconciler.HealthResult{Status: h.Status, FailingStreak: h.FailingStreak}
	if n := len(h.Log); n > 0 {
		out.ExitCode, out.Output = h.Log[n-1].ExitCode, h.Log[n-1].Output
	}
	return out, nil
}

// MaxLogText caps what Logs returns (each line is cut at state.MaxText):
// enough for the certificate probe to find the proxy's last ACME error
// among its other lines; a report cuts what it carries again.
const MaxLogText = 256 << 10

// Logs returns the last lines of stdout and stderr, interleaved per stream.
func (c *Client) Logs(ctx context.Context, id string, lines int) (string, error) {
	cx, cancel, err := c.ctx(ctx, CallTimeout)
	if err != nil {
		return "", err
	}
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
				got = keepTail(got, l, lines)
			case l, ok := <-errc:
				if !ok {
					errc = nil
					continue
				}
				got = keepTail(got, l, lines)
			}
		}
		close(done)
	}()
	err = containers.Logs(cx, id, new(containers.LogOptions).WithStdout(true).WithStderr(true).WithTail(fmt.Sprint(lines)), out, errc)
	close(out)
	close(errc)
	<-done
	if err != nil {
		return "", fmt.Errorf("logs of %s: %w", short(id), err)
	}
	if len(got) > lines {
		got = got[len(got)-lines:]
	}
	return state.Tail(strings.TrimRight(strings.Join(got, ""), "\n"), MaxLogText), nil
}

// keepTail appends line to the last lines kept, at most n of them, each cut
// to its end within state.MaxText: a container that prints lines of
// megabytes costs the agent a few KB here.
func keepTail(got []string, line string, n int) []string {
	got = append(got, state.Tail(line, state.MaxText))
	if len(got) > n {
		got = got[len(got)-n:]
	}
	return got
}

func short(id string) string {
	if len(id) > 12 {
		return id[:12]
	}
	return id
}

// Subnets lists the subnets of the node's Podman networks (the resolver
// answers queries from them).
func (c *Client) Subnets(ctx context.Context) ([]netip.Prefix, error) {
	cx, cancel, err := c.ctx(ctx, CallTimeout)
	if err != nil {
		return nil, err
	}
	defer cancel()
	nets, err := network.List(cx, nil)
	if err != nil {
		return nil, fmt.Errorf("list networks: %w", err)
	}
	return bridgeSubnets(nets), nil
}

// bridgeSubnets are the subnets of the bridge networks among nets: a
// container there reaches the resolver through the host's bridge. Not a
// macvlan's or an ipvlan's: such a network is a part of the LAN (a home
// box's 192.168.1.0/24, for Home Assistant), its containers cannot reach
// the host's own addresses anyway, and the resolver would have taken any
// device of the LAN for a container (open recursion, the fleet's names).
func bridgeSubnets(nets []nettypes.Network) []netip.Prefix {
	var out []netip.Prefix
	for _, n := range nets {
		if n.Driver != "bridge" {
			continue
		}
		for _, s := range n.Subnets {
			if p, err := netip.ParsePrefix(s.Subnet.String()); err == nil {
				out = append(out, p.Masked())
			}
		}
	}
	return out
}

// Networks lists the node's Podman networks.
func (c *Client) Networks(ctx context.Context) ([]reconciler.Network, error) {
	cx, cancel, err := c.ctx(ctx, CallTimeout)
	if err != nil {
		return nil, err
	}
	defer cancel()
	nets, err := network.List(cx, nil)
	if err != nil {
		return nil, fmt.Errorf("list networks: %w", err)
	}
	out := make([]reconciler.Network, 0, len(nets))
	for _, n := range nets {
		out = append(out, reconciler.Network{Name: n.Name, Module: n.Labels[reconciler.LabelModule], Interface: n.NetworkInterface, Labels: n.Labels})
	}
	return out, nil
}

// CreateNetwork makes n, a bridge on its own interface whose subnet Podman
// picks from its pool, without Podman's own name server (every container
// asks the node's resolver).
func (c *Client) CreateNetwork(ctx context.Context, n reconciler.Network) error {
	cx, cancel, err := c.ctx(ctx, CallTimeout)
	if err != nil {
		return err
	}
	defer cancel()
	_, err = network.Create(cx, &nettypes.Network{Name: n.Name, Driver: "bridge", NetworkInterface: n.Interface, DNSEnabled: false, Labels: n.Labels})
	if err != nil {
		return fmt.Errorf("create network %s: %w", n.Name, err)
	}
	return nil
}

// RemoveNetwork removes the network called name; Podman refuses while a
// container uses it.
func (c *Client) RemoveNetwork(ctx context.Context, name string) error {
	cx, cancel, err := c.ctx(ctx, CallTimeout)
	if err != nil {
		return err
	}
	defer cancel()
	reports, err := network.Remove(cx, name, nil)
	if err == nil {
		for _, r := range reports {
			if r != nil && r.Err != nil {
				err = r.Err
			}
		}
	}
	if err != nil {
		return fmt.Errorf("remove network %s: %w", name, err)
	}
	return nil
}

// Where a container with env-secrets finds the mesh binary and its
// environment file.
const (
	ExecEnvBinary = "/.mesh/mesh"
	ExecEnvFile   = "/.mesh/env"
)

// execEnv makes the container run its command through `mesh exec-env`,
// which reads s.EnvFile into the environment and execs it: the command is
// the one Podman would run (the entrypoint, the image's unless given, then
// the command, the image's only when neither is given, as Podman's
// makeCommand does), and the values are never in the container's
// configuration.
func (c *Client) execEnv(ctx context.Context, g *specgen.SpecGenerator, s reconciler.Spec) error {
	entry, cmd := s.Entrypoint, s.Command
	if len(entry) == 0 || len(cmd) == 0 {
		cx, cancel, err := c.ctx(ctx, CallTimeout)
		if err != nil {
			return err
		}
		img, err := images.GetImage(cx, s.Image, nil)
		cancel()
		if err != nil {
			return fmt.Errorf("inspect image %s for its command: %w", s.Image, err)
		}
		if img.Config != nil {
			if len(entry) == 0 {
				entry = img.Config.Entrypoint
				if len(cmd) == 0 {
					cmd = img.Config.Cmd
				}
			}
		}
	}
	if len(entry) == 1 && entry[0] == "" {
		entry = nil
	}
	argv := append(append([]string{}, entry...), cmd...)
	if len(argv) == 0 {
		return fmt.Errorf("image %s names no command, and the manifest gives none; give command:", s.Image)
	}
	g.Entrypoint = []string{ExecEnvBinary, "exec-env", ExecEnvFile, "--"}
	g.Command = argv
	g.Mounts = append(g.Mounts,
		spec.Mount{Type: "bind", Source: s.EnvExec, Destination: ExecEnvBinary, Options: []string{"rbind", "ro"}},
		spec.Mount{Type: "bind", Source: s.EnvFile, Destination: ExecEnvFile, Options: []string{"rbind", "ro"}})
	return nil
}
