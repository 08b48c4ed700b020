package manifest

import (
	"fmt"
	"path"
	"strconv"
	"strings"
	"time"
)

// Typed is a resource's declaration parsed into the values the host acts
// on. Parse fills it for every resource; the reconciler consumes it and never
// parses the strings again.
type Typed struct {
	// OK is set once the values below were parsed (a zero Typed is not a
	// declaration of owner 0:0 and mode 0).
	OK       bool    `json:"ok"`
	HasOwner bool    `json:"has_owner,omitempty"`
	UID      int     `json:"uid,omitempty"`
	GID      int     `json:"gid,omitempty"`
	HasMode  bool    `json:"has_mode,omitempty"`
	Mode     uint32  `json:"mode,omitempty"` // permission, setuid, setgid, sticky bits
	Mounts   []Mount `json:"mounts,omitempty"`
	Ports    []Port  `json:"ports,omitempty"`
	// PublicPorts are published on every interface (or their IP).
	PublicPorts []Port `json:"public_ports,omitempty"`
	// Health is the container's health check with its defaults filled in.
	Health *HealthCheck `json:"health,omitempty"`
	// The container fields (container.go), parsed; all absent when unset.
	Devices []Device `json:"devices,omitempty"`
	Tmpfs   []Tmpfs  `json:"tmpfs,omitempty"`
	Memory  int64    `json:"memory,omitempty"`
	// LogMaxSize bounds the container's log (DefaultLogMaxSize unless
	// declared).
	LogMaxSize  int64 `json:"log_max_size,omitempty"`
	StopSignal  int   `json:"stop_signal,omitempty"`
	StopTimeout *uint `json:"stop_timeout,omitempty"`
	// PidsLimit bounds the container's processes (0: Podman's default).
	PidsLimit int64 `json:"pids_limit,omitempty"`
}

// Health is a container's health check as declared: Podman's own health
// check, run in the container. Durations are Go durations ("10s", "1m30s").
type Health struct {
	Command     []string `yaml:"command" json:"command" jsonschema:"required,minItems=1,description=The check: a command run in the container; exit 0 is healthy"`
	Interval    string   `yaml:"interval,omitempty" json:"interval,omitempty" jsonschema:"description=How often the check runs (default 10s)"`
	Timeout     string   `yaml:"timeout,omitempty" json:"timeout,omitempty" jsonschema:"description=How long one run may take (default 5s, or the interval if shorter)"`
	Retries     int      `yaml:"retries,omitempty" json:"retries,omitempty" jsonschema:"minimum=1,maximum=100,description=Failures in a row that make it unhealthy (default 3)"`
	StartPeriod string   `yaml:"start-period,omitempty" json:"start-period,omitempty" jsonschema:"description=Time after start in which failures do not count (default 30s)"`
}

// Health check defaults, as the schema documents them.
const (
	DefaultHealthInterval    = 10 * time.Second
	DefaultHealthTimeout     = 5 * time.Second
	DefaultHealthRetries     = 3
	DefaultHealthStartPeriod = 30 * time.Second
)

// HealthCheck is a health check with its values parsed and defaults filled.
type HealthCheck struct {
	Command     []string      `json:"command"`
	Interval    time.Duration `json:"interval"`
	Timeout     time.Duration `json:"timeout"`
	Retries     int           `json:"retries"`
	StartPeriod time.Duration `json:"start_period"`
}

// Deadline is how long after start a check that never passes is declared
// failed: the start period, then retries runs an interval apart.
func (h *HealthCheck) Deadline() time.Duration {
	return h.StartPeriod + time.Duration(h.Retries)*(h.Interval+h.Timeout)
}

// ParseHealth checks a declared health check and fills its defaults.
func ParseHealth(h *Health) (*HealthCheck, error) {
	if len(h.Command) == 0 || h.Command[0] == "" {
		return nil, fmt.Errorf("health: `command:` is missing; give the check as a list, e.g. [\"curl\", \"-fsS\", \"http://localhost:3000/\"]")
	}
	c := &HealthCheck{Command: h.Command, Interval: DefaultHealthInterval, Timeout: DefaultHealthTimeout, Retries: DefaultHealthRetries, StartPeriod: DefaultHealthStartPeriod}
	for _, d := range []struct {
		name string
		s    string
		dst  *time.Duration
		min  time.Duration
	}{{"interval", h.Interval, &c.Interval, time.Second}, {"timeout", h.Timeout, &c.Timeout, time.Second}, {"start-period", h.StartPeriod, &c.StartPeriod, 0}} {
		if d.s == "" {
			continue
		}
		v, err := time.ParseDuration(d.s)
		if err != nil {
			return nil, fmt.Errorf("health: %s %q is not a duration; write e.g. \"10s\" or \"1m\"", d.name, d.s)
		}
		if v < d.min || v > 24*time.Hour {
			return nil, fmt.Errorf("health: %s %s is out of range (%s to 24h)", d.name, d.s, d.min)
		}
		*d.dst = v
	}
	if h.Retries != 0 {
		if h.Retries < 1 || h.Retries > 100 {
			return nil, fmt.Errorf("health: retries %d is out of range (1 to 100)", h.Retries)
		}
		c.Retries = h.Retries
	}
	if h.Timeout == "" {
		c.Timeout = min(c.Timeout, c.Interval)
	}
	if c.Timeout > c.Interval {
		return nil, fmt.Errorf("health: timeout %s is longer than the interval %s", c.Timeout, c.Interval)
	}
	return c, nil
}

// Mount is a bind mount of a declared host path.
type Mount struct {
	Source      string   `json:"source"`
	Destination string   `json:"destination"`
	Options     []string `json:"options,omitempty"`
	ReadOnly    bool     `json:"read_only,omitempty"`
}

// Port publishes a container port on the host.
type Port struct {
	HostIP        string `json:"host_ip,omitempty"`
	HostPort      uint16 `json:"host_port"`
	ContainerPort uint16 `json:"container_port"`
	Protocol      string `json:"protocol"`
}

// ModeOr is the declared mode, or def when none is declared.
func (t Typed) ModeOr(def uint32) uint32 {
	if t.HasMode {
		return t.Mode
	}
	return def
}

// TypeOf parses a resource's strings into typed values. Parse calls it for
// every resource; it is exported for plans written before typed values
// travelled in them.
func TypeOf(r *Resource) (Typed, error) {
	t := Typed{OK: true}
	if r.Owner != "" {
		uid, gid, err := ParseOwner(r.Owner)
		if err != nil {
			return t, err
		}
		t.HasOwner, t.UID, t.GID = true, uid, gid
	}
	if r.Mode != "" {
		m, err := ParseMode(r.Mode)
		if err != nil {
			return t, err
		}
		t.HasMode, t.Mode = true, m
	}
	for _, s := range r.Mounts {
		m, err := ParseMount(s)
		if err != nil {
			return t, fmt.Errorf("mount %q: %w", s, err)
		}
		t.Mounts = append(t.Mounts, m)
	}
	for _, s := range r.Ports {
		p, err := ParsePort(s)
		if err != nil {
			return t, fmt.Errorf("port %q: %w", s, err)
		}
		t.Ports = append(t.Ports, p)
	}
	for _, s := range r.PublicPorts {
		p, err := ParsePort(s)
		if err != nil {
			return t, fmt.Errorf("public port %q: %w", s, err)
		}
		t.PublicPorts = append(t.PublicPorts, p)
	}
	if r.Health != nil {
		h, err := ParseHealth(r.Health)
		if err != nil {
			return t, err
		}
		t.Health = h
	}
	if err := typeContainer(r, &t); err != nil {
		return t, err
	}
	return t, nil
}

// ParseOwner parses "UID:GID" (container-side numeric ids).
func ParseOwner(s string) (uid, gid int, err error) {
	if !ownerRE.MatchString(s) {
		return 0, 0, fmt.Errorf("owner %q is not UID:GID; write numeric ids as the container sees them, e.g. \"1000:1000\"", s)
	}
	u, g, _ := strings.Cut(s, ":")
	uid, err1 := strconv.Atoi(u)
	gid, err2 := strconv.Atoi(g)
	if err1 != nil || err2 != nil || uid > 1<<31-1 || gid > 1<<31-1 || uid < 0 || gid < 0 {
		return 0, 0, fmt.Errorf("owner %q: ids must be between 0 and 2147483647", s)
	}
	return uid, gid, nil
}

// ParseMode parses a quoted octal mode with a leading 0, e.g. "0750".
func ParseMode(s string) (uint32, error) {
	v, err := strconv.ParseUint(s, 8, 32)
	if err != nil || v > 0o7777 || !strings.HasPrefix(s, "0") {
		return 0, fmt.Errorf("mode %q is not an octal mode; write it quoted with a leading 0, e.g. \"0750\"", s)
	}
	return uint32(v), nil
}

// ParseMount parses HOST:CONTAINER[:OPTIONS]; the host side is checked as a
// path, not as declared (that needs the manifest).
func ParseMount(s string) (Mount, error) {
	parts := strings.Split(s, ":")
	if len(parts) < 2 || len(parts) > 3 {
		return Mount{}, fmt.Errorf("write HOST:CONTAINER or HOST:CONTAINER:OPTIONS")
	}
	m := Mount{Source: parts[0], Destination: parts[1]}
	if msg := checkPath(m.Source); msg != "" {
		return m, fmt.Errorf("host side: %s", msg)
	}
	if !strings.HasPrefix(m.Destination, "/") {
		return m, fmt.Errorf("container side must be an absolute path")
	}
	if path.Clean(m.Destination) != m.Destination {
		return m, fmt.Errorf("container side is not clean; write %q", path.Clean(m.Destination))
	}
	if len(parts) == 3 {
		// z and Z relabel the source for SELinux (z: a label other
		// containers share, Z: one private to this container); Podman
		// takes one of each pair at most, and so does the manifest.
		var access, label string
		for _, o := range strings.Split(parts[2], ",") {
			switch o {
			case "ro", "rw":
				if access != "" {
					return m, fmt.Errorf("options %s and %s: give one of ro and rw", access, o)
				}
				access, m.ReadOnly = o, o == "ro"
			case "z", "Z":
				if label != "" {
					return m, fmt.Errorf("options %s and %s: give one of z (a label shared with other containers) and Z (a label private to this one)", label, o)
				}
				label = o
			default:
				return m, fmt.Errorf("option %q is not one of ro, rw, z, Z", o)
			}
			m.Options = append(m.Options, o)
		}
	}
	return m, nil
}

// ParsePort parses [IP:]HOST:CONTAINER[/tcp|/udp].
func ParsePort(s string) (Port, error) {
	spec, proto, hasProto := strings.Cut(s, "/")
	p := Port{Protocol: "tcp"}
	if hasProto {
		if proto != "tcp" && proto != "udp" {
			return p, fmt.Errorf("protocol must be tcp or udp")
		}
		p.Protocol = proto
	}
	parts := strings.Split(spec, ":")
	switch len(parts) {
	case 2:
	case 3:
		if parts[0] == "" {
			return p, fmt.Errorf("write HOST:CONTAINER or IP:HOST:CONTAINER")
		}
		p.HostIP, parts = parts[0], parts[1:]
	default:
		return p, fmt.Errorf("write HOST:CONTAINER or IP:HOST:CONTAINER, optionally /tcp or /udp")
	}
	nums := make([]uint16, 2)
	for i, n := range parts {
		v, err := strconv.Atoi(n)
		if err != nil || v < 1 || v > 65535 {
			return p, fmt.Errorf("%q is not a port between 1 and 65535", n)
		}
		nums[i] = uint16(v)
	}
	p.HostPort, p.ContainerPort = nums[0], nums[1]
	return p, nil
}
