package manifest

import (
	"fmt"
	"math"
	"path"
	"regexp"
	"strconv"
	"strings"
	"time"
)

// The container fields compose users rely on (issue 15): checked by `mesh
// check`, typed once (Typed), and part of a container's digest.

var containerFields = []string{"user", "entrypoint", "working-dir", "cap-add", "cap-drop", "devices", "read-only", "tmpfs", "memory", "cpus", "stop-signal", "stop-timeout", "labels", "log-max-size", "tty", "init", "pids-limit", "group-add"}

// Bounds of a container's log (the k8s-file Podman writes: conmon truncates
// it when it would pass the bound, so it never does).
const (
	// DefaultLogMaxSize is the log bound of a container or step that
	// declares none: a small VPS survives a container that logs without end.
	DefaultLogMaxSize = 10 << 20
	// MinLogMaxSize is conmon's read buffer: a bound must be at least that.
	MinLogMaxSize = 8 << 10
	// MaxLogMaxSize is the largest bound a manifest may ask for.
	MaxLogMaxSize = 1 << 30
)

// MaxPidsLimit is the largest pids-limit: the kernel's own bound on
// process ids (PID_MAX_LIMIT), so a limit above it would bound nothing.
const MaxPidsLimit = 4194304

// EnvKeyRule says in words what an env or env-secrets key may be
// (ValidEnvKey).
const EnvKeyRule = "use letters, digits, '_', '.' and '-', starting with a letter or '_'"

// idName is a user or group name, or a numeric id, as a container's
// passwd and group files may hold it.
const idName = `[A-Za-z0-9_][A-Za-z0-9_.-]{0,31}`

var (
	userRE   = regexp.MustCompile(`^` + idName + `(:` + idName + `)?$`)
	groupRE  = regexp.MustCompile(`^` + idName + `$`)
	digitsRE = regexp.MustCompile(`^[0-9]+$`)
	// envKeyRE admits what images read besides shell names
	// (elasticsearch's discovery.type): Podman and mesh exec-env take
	// any key without '=' and NUL, and nothing passes a key to a shell.
	envKeyRE = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_.-]*$`)
	capRE    = regexp.MustCompile(`^(CAP_)?[A-Z][A-Z_]{1,30}$`)
	signals  = map[string]int{"HUP": 1, "INT": 2, "QUIT": 3, "KILL": 9, "USR1": 10, "USR2": 12, "TERM": 15, "WINCH": 28, "PWR": 30, "STOP": 19}
	tmpfsOpt = regexp.MustCompile(`^(size=[0-9]+[kmgKMG%]?|mode=[0-7]{3,4}|uid=[0-9]+|gid=[0-9]+|nr_inodes=[0-9]+[kmgKMG]?|noexec|exec|nosuid|suid|nodev|dev|ro|rw|notmpcopyup)$`)
)

// Device is a host device passed into a container.
type Device struct {
	Host        string `json:"host"`
	Container   string `json:"container"`
	Permissions string `json:"permissions"`
}

// Tmpfs is a tmpfs mounted in a container.
type Tmpfs struct {
	Path    string   `json:"path"`
	Options []string `json:"options,omitempty"`
}

// fieldErr is one error of a container field: which key, which list item.
type fieldErr struct {
	key   string
	index int
	msg   string
}

// checkContainerFields checks the compose-style fields of a step or a
// container; every error, by key.
func checkContainerFields(r *Resource) []fieldErr {
	var errs []fieldErr
	add := func(key string, i int, format string, a ...any) {
		errs = append(errs, fieldErr{key, i, fmt.Sprintf(format, a...)})
	}
	if r.User != "" && !userRE.MatchString(r.User) {
		add("user", -1, "user %q is not USER[:GROUP] (names or numeric ids, as the container sees them)", r.User)
	}
	if r.Entrypoint != nil && len(r.Entrypoint) == 0 {
		add("entrypoint", -1, "entrypoint is empty; leave it out to keep the image's")
	}
	if r.WorkingDir != "" && !cleanAbs(r.WorkingDir) {
		add("working-dir", -1, "working-dir %q is not a clean absolute path", r.WorkingDir)
	}
	for key, caps := range map[string][]string{"cap-add": r.CapAdd, "cap-drop": r.CapDrop} {
		for i, c := range caps {
			if c != "ALL" && !capRE.MatchString(c) {
				add(key, i, "%q is not a capability name (e.g. NET_ADMIN, CHOWN, or ALL)", c)
			}
		}
	}
	for i, d := range r.Devices {
		if _, err := ParseDevice(d); err != nil {
			add("devices", i, "device %q: %s", d, err)
		}
	}
	for i, t := range r.Tmpfs {
		if _, err := ParseTmpfs(t); err != nil {
			add("tmpfs", i, "tmpfs %q: %s", t, err)
		}
	}
	if r.Memory != "" {
		if _, err := ParseMemory(r.Memory); err != nil {
			add("memory", -1, "%s", err)
		}
	}
	if r.LogMaxSize != "" {
		if _, err := ParseLogMaxSize(r.LogMaxSize); err != nil {
			add("log-max-size", -1, "%s", err)
		}
	}
	if math.IsNaN(r.CPUs) || math.IsInf(r.CPUs, 0) || r.CPUs < 0 || r.CPUs > 1024 {
		add("cpus", -1, "cpus %v is not between 0.01 and 1024", r.CPUs)
	} else if r.CPUs != 0 && r.CPUs < 0.01 {
		add("cpus", -1, "cpus %v is below 0.01", r.CPUs)
	}
	if r.StopSignal != "" {
		if _, err := ParseSignal(r.StopSignal); err != nil {
			add("stop-signal", -1, "%s", err)
		}
	}
	if r.StopTimeout != "" {
		if d, err := time.ParseDuration(r.StopTimeout); err != nil || d < 0 || d > 90*time.Second {
			add("stop-timeout", -1, "stop-timeout %q is not a duration between 0s and 90s (e.g. 30s; a removal waits this long before it kills)", r.StopTimeout)
		}
	}
	for k := range r.Labels {
		if strings.HasPrefix(k, "mesh.") || k == "" {
			add("labels", -1, "label %q: keys starting with mesh. are the mesh's own", k)
		}
	}
	if r.PidsLimit != nil {
		if err := checkPidsLimit(*r.PidsLimit); err != nil {
			add("pids-limit", -1, "%s", err)
		}
	}
	for i, g := range r.GroupAdd {
		switch {
		case g == "keep-groups":
			add("group-add", i, "group-add keep-groups is Podman's own (rootless with crun only), not a group; name the groups the process needs")
		case !ValidGroup(g):
			add("group-add", i, "group-add %q is not a group: a numeric gid (0 to 2147483647) or a name of letters, digits, '_', '.' and '-', as the container sees it", g)
		}
	}
	return errs
}

// checkPidsLimit says what is wrong with a pids-limit.
func checkPidsLimit(n int64) error {
	if n < 1 || n > MaxPidsLimit {
		return fmt.Errorf("pids-limit %d is not between 1 and %d; leave it out for Podman's default", n, MaxPidsLimit)
	}
	return nil
}

// ValidUser says whether s may be a container's user.
func ValidUser(s string) bool { return userRE.MatchString(s) }

// ValidCapability says whether s may be named in cap-add or cap-drop.
func ValidCapability(s string) bool { return s == "ALL" || capRE.MatchString(s) }

// ValidGroup says whether s may be named in group-add: a numeric gid or a
// group name.
func ValidGroup(s string) bool {
	if digitsRE.MatchString(s) {
		n, err := strconv.ParseUint(s, 10, 32)
		return err == nil && n <= 1<<31-1
	}
	return groupRE.MatchString(s)
}

// ValidEnvKey says whether s may be an env or env-secrets key (EnvKeyRule).
func ValidEnvKey(s string) bool { return envKeyRE.MatchString(s) }

func cleanAbs(p string) bool { return strings.HasPrefix(p, "/") && path.Clean(p) == p }

// ParseDevice parses /dev/HOST[:CONTAINER[:PERMISSIONS]].
func ParseDevice(s string) (Device, error) {
	parts := strings.Split(s, ":")
	if len(parts) > 3 {
		return Device{}, fmt.Errorf("write /dev/HOST[:CONTAINER[:rwm]]")
	}
	d := Device{Host: parts[0], Container: parts[0], Permissions: "rwm"}
	if len(parts) > 1 {
		d.Container = parts[1]
	}
	if len(parts) > 2 {
		d.Permissions = parts[2]
	}
	if !cleanAbs(d.Host) || !strings.HasPrefix(d.Host, "/dev/") {
		return d, fmt.Errorf("the host side must be a clean path under /dev/")
	}
	if !cleanAbs(d.Container) {
		return d, fmt.Errorf("the container side must be a clean absolute path")
	}
	if d.Permissions == "" || strings.Trim(d.Permissions, "rwm") != "" {
		return d, fmt.Errorf("permissions %q are not made of r, w and m", d.Permissions)
	}
	return d, nil
}

// ParseTmpfs parses PATH[:OPTIONS].
func ParseTmpfs(s string) (Tmpfs, error) {
	p, opts, hasOpts := strings.Cut(s, ":")
	t := Tmpfs{Path: p}
	if !cleanAbs(p) || p == "/" {
		return t, fmt.Errorf("the path must be a clean absolute path other than /")
	}
	if hasOpts {
		for _, o := range strings.Split(opts, ",") {
			if !tmpfsOpt.MatchString(o) {
				return t, fmt.Errorf("option %q is not one of size=, mode=, uid=, gid=, nr_inodes=, noexec, nosuid, nodev, ro, rw", o)
			}
			t.Options = append(t.Options, o)
		}
	}
	return t, nil
}

// ParseLogMaxSize parses a log bound: a byte count with an optional unit,
// between MinLogMaxSize and MaxLogMaxSize.
func ParseLogMaxSize(s string) (int64, error) {
	n, err := parseBytes(s)
	if err != nil {
		return 0, fmt.Errorf("log-max-size %w", err)
	}
	if n < MinLogMaxSize || n > MaxLogMaxSize {
		return 0, fmt.Errorf("log-max-size %s is not between 8k and 1g", s)
	}
	return n, nil
}

// ParseMemory parses a byte count with an optional unit (b, k, m, g).
func ParseMemory(s string) (int64, error) {
	n, err := parseBytes(s)
	if err != nil {
		return 0, fmt.Errorf("memory %q is not a size such as 512m or 2g", s)
	}
	if n < 6<<20 {
		return 0, fmt.Errorf("memory %q is below 6m, less than a container can start with", s)
	}
	return n, nil
}

// parseBytes parses a positive byte count with an optional unit (b, k, m, g).
func parseBytes(s string) (int64, error) {
	v := strings.ToLower(strings.TrimSpace(s))
	mult := int64(1)
	if v != "" {
		switch v[len(v)-1] {
		case 'b':
			v = v[:len(v)-1]
		case 'k':
			mult, v = 1<<10, v[:len(v)-1]
		case 'm':
			mult, v = 1<<20, v[:len(v)-1]
		case 'g':
			mult, v = 1<<30, v[:len(v)-1]
		}
	}
	n, err := strconv.ParseInt(v, 10, 64)
	if err != nil || n <= 0 || n > (1<<50)/mult {
		return 0, fmt.Errorf("%q is not a size such as 512m or 2g", s)
	}
	return n * mult, nil
}

// ParseSignal parses a signal name (SIGTERM or TERM) or number.
func ParseSignal(s string) (int, error) {
	if n, err := strconv.Atoi(s); err == nil && n > 0 && n < 65 {
		return n, nil
	}
	if n, ok := signals[strings.TrimPrefix(strings.ToUpper(s), "SIG")]; ok {
		return n, nil
	}
	return 0, fmt.Errorf("stop-signal %q is not a signal (e.g. SIGTERM, SIGQUIT, SIGINT)", s)
}

// typeContainer fills the typed values of the container fields.
func typeContainer(r *Resource, t *Typed) error {
	for _, s := range r.Devices {
		d, err := ParseDevice(s)
		if err != nil {
			return fmt.Errorf("device %q: %w", s, err)
		}
		t.Devices = append(t.Devices, d)
	}
	for _, s := range r.Tmpfs {
		x, err := ParseTmpfs(s)
		if err != nil {
			return fmt.Errorf("tmpfs %q: %w", s, err)
		}
		t.Tmpfs = append(t.Tmpfs, x)
	}
	if r.Memory != "" {
		m, err := ParseMemory(r.Memory)
		if err != nil {
			return err
		}
		t.Memory = m
	}
	t.LogMaxSize = DefaultLogMaxSize
	if r.LogMaxSize != "" {
		m, err := ParseLogMaxSize(r.LogMaxSize)
		if err != nil {
			return err
		}
		t.LogMaxSize = m
	}
	if r.PidsLimit != nil {
		if err := checkPidsLimit(*r.PidsLimit); err != nil {
			return err
		}
		t.PidsLimit = *r.PidsLimit
	}
	if r.StopSignal != "" {
		n, err := ParseSignal(r.StopSignal)
		if err != nil {
			return err
		}
		t.StopSignal = n
	}
	if r.StopTimeout != "" {
		d, err := time.ParseDuration(r.StopTimeout)
		if err != nil {
			return fmt.Errorf("stop-timeout %q: %w", r.StopTimeout, err)
		}
		secs := uint(d.Round(time.Second) / time.Second)
		t.StopTimeout = &secs
	}
	return nil
}
