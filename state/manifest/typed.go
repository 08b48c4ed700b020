package manifest

import (
	"fmt"
	"path"
	"strconv"
	"strings"
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
		for _, o := range strings.Split(parts[2], ",") {
			switch o {
			case "ro":
				m.ReadOnly = true
			case "rw", "z", "Z":
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
