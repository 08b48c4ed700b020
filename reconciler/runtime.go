package reconciler

import (
	"mesh/state/manifest"

	"context"
	"net/netip"
	"time"
)

// Labels the mesh puts on every container it creates. A container without
// LabelManaged is never touched.
const (
	LabelManaged = "mesh.managed"
	LabelModule  = "mesh.module"
	LabelKind    = "mesh.kind" // "container" or "step"
	LabelDigest  = "mesh.digest"
	// LabelDecl holds the declaration as JSON, so a replacement can say which
	// field changed; LabelInputs the digest of each restart-on input.
	LabelDecl   = "mesh.decl"
	LabelInputs = "mesh.inputs"
)

// Runtime is what the reconciler needs of a container engine. podman.Client
// implements it; tests use a recording fake.
type Runtime interface {
	// Managed lists every container with LabelManaged.
	Managed(ctx context.Context) ([]Container, error)
	// Lookup finds a container by name, managed or not.
	Lookup(ctx context.Context, name string) (Container, bool, error)
	// ImageExists reports whether ref is in local storage.
	ImageExists(ctx context.Context, ref string) (bool, error)
	// Pull fetches ref (mutating) under a policy: missing (only when it is
	// not in local storage), always, or newer (when the registry's image
	// differs from the local one).
	Pull(ctx context.Context, ref, policy string) error
	// ImageID is the ID of the local image ref names.
	ImageID(ctx context.Context, ref string) (string, error)
	// ImageVolumes lists the paths the local image ref declares VOLUME.
	ImageVolumes(ctx context.Context, ref string) ([]string, error)
	// Tag makes ref name the local image id (mutating).
	Tag(ctx context.Context, id, ref string) error
	// Create creates a container (mutating) and returns its ID.
	Create(ctx context.Context, spec Spec) (string, error)
	// Start starts a container (mutating); an error means it did not start.
	Start(ctx context.Context, id string) error
	// Restart stops a container (its stop signal, then its stop timeout)
	// and starts it again, keeping it (mutating).
	Restart(ctx context.Context, id string) error
	// Remove removes a container, stopping it first (mutating).
	Remove(ctx context.Context, id string) error
	// Wait waits until the container exits and returns its exit code.
	Wait(ctx context.Context, id string) (int, error)
	// Logs returns the last lines of a container's output.
	Logs(ctx context.Context, id string, lines int) (string, error)
	// HealthCheck runs a container's health check once (Podman's own, as it
	// was declared at create) and returns what Podman then says of it.
	HealthCheck(ctx context.Context, name string) (HealthResult, error)
	// Died calls died for each of the mesh's containers that exits, from
	// Podman's events, until ctx ends (or the stream breaks: an error).
	Died(ctx context.Context, died func(id, name string, exitCode int)) error
	// Restarts is the ID of the container called name, and how many times
	// Podman restarted it.
	Restarts(ctx context.Context, name string) (id string, restarts int, err error)
	// Networks lists the runtime's networks (the mesh's are those with
	// LabelManaged, the others are in the way of a name); CreateNetwork makes
	// one; RemoveNetwork removes one that no container uses (an error
	// when one does).
	Networks(ctx context.Context) ([]Network, error)
	CreateNetwork(ctx context.Context, n Network) error
	RemoveNetwork(ctx context.Context, name string) error
}

// Network is a module's own bridge network (network.go): its name, the
// module, the host interface it gets. Labels is what the runtime reports
// (LabelManaged and LabelModule when the mesh made it).
type Network struct {
	Name, Module, Interface string
	Labels                  map[string]string
}

// HealthResult is a container's health after one run of its check.
type HealthResult struct {
	Status        string // starting, healthy, unhealthy
	FailingStreak int
	ExitCode      int
	Output        string // the last run's output
}

// Container is a container as the runtime reports it.
type Container struct {
	ID      string
	Name    string
	Labels  map[string]string
	Running bool
	State   string
	// ImageID is the image the container was created from.
	ImageID string
	// StartedAt is when it last started, in whole seconds (zero: never,
	// or the runtime does not say). A restart changes it, so a run that
	// began and ended between two looks is still told from the one before.
	StartedAt time.Time
}

// Spec is a container to create.
type Spec struct {
	Name       string
	Image      string
	Entrypoint []string // empty: the image's own
	Command    []string
	Env        map[string]string
	Mounts     []Mount
	Ports      []Port
	Labels     map[string]string
	// DNS is the node's resolver: the container's only DNS server; DNSSearch
	// its search domains (the mesh's domain).
	DNS       netip.Addr
	DNSSearch []string
	// Network is the module's own network (empty: the runtime's default).
	Network string
	Restart string
	// Health is the container's health check (nil: none).
	Health *manifest.HealthCheck
	// What compose users set (each zero when unset): the user, working
	// directory, capabilities, devices, a read-only root, tmpfs mounts,
	// limits (bytes; cores) and how the container is stopped (signal
	// number; seconds). Labels holds the mesh's labels and the manifest's.
	User        string
	WorkingDir  string
	CapAdd      []string
	CapDrop     []string
	Devices     []manifest.Device
	ReadOnly    bool
	Tmpfs       []manifest.Tmpfs
	Memory      int64
	CPUs        float64
	StopSignal  int
	StopTimeout *uint
	// LogMaxSize bounds the container's log file (bytes; 0: Podman's own).
	LogMaxSize int64
	// TTY gives the process a terminal; Init runs Podman's init as PID 1;
	// PidsLimit bounds its processes (0: Podman's default); GroupAdd are
	// supplementary groups (gids or names).
	TTY       bool
	Init      bool
	PidsLimit int64
	GroupAdd  []string
	// EnvFile, when set, is a host file of NAME=VALUE entries (each ended
	// by NUL) that the process gets in its environment, and EnvExec a
	// static mesh binary: the runtime mounts both read-only and runs the
	// command through `mesh exec-env`, so that the values are never in
	// the container's configuration (podman inspect).
	EnvFile string
	EnvExec string
}

// Mount is a bind mount of a declared host path.
type Mount struct {
	Source, Destination string
	Options             []string
}

// Port publishes a container port on the host.
type Port struct {
	HostIP        string
	HostPort      uint16
	ContainerPort uint16
	Protocol      string
}
