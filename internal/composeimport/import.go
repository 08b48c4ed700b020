// Package composeimport turns a docker-compose file into mesh manifests
// (`mesh import compose`). The file is read by compose-go, the parser
// `docker compose` uses, so env files, interpolation, extends and profiles
// resolve as they do there. Each service becomes a module of its own name,
// so its short compose name resolves from every container (the mesh's
// domain is every container's search domain). Everything it decides, and
// everything it cannot carry over, is said in one line each.
package composeimport

import (
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"math"
	"os"
	"path"
	"path/filepath"
	"regexp"
	"slices"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/compose-spec/compose-go/v2/cli"
	"github.com/compose-spec/compose-go/v2/types"

	"mesh/state/manifest"
)

// Options says what to import.
type Options struct {
	File    string // the compose file
	Project string // overrides the project name ("" keeps compose's)
	// Root is where the services' host paths go: ROOT/PROJECT-SERVICE
	// (default /srv).
	Root string
	// Env replaces the process environment for interpolation (nil: the
	// process's own).
	Env []string
}

// Manifest is one module written from a service.
type Manifest struct {
	Service string
	Module  string
	File    string // MODULE.yaml
	Text    string
}

// Result is the manifests and the lines that say what was decided.
type Result struct {
	Project   string
	Manifests []Manifest
	// Notes are one line each: "SERVICE: ..." decisions and drops.
	Notes []string
}

var (
	labelRE  = regexp.MustCompile(`[^a-z0-9-]+`)
	secretRE = regexp.MustCompile(`[^a-z0-9_.-]+`)
)

// secretName makes a mesh secret's name of a compose secret's.
func secretName(s string) string {
	n := strings.Trim(secretRE.ReplaceAllString(strings.ToLower(s), "-"), "-._")
	if len(n) > 63 {
		n = n[:63]
	}
	return n
}

// moduleName makes a DNS label of a service name.
func moduleName(s string) string {
	m := strings.Trim(labelRE.ReplaceAllString(strings.ToLower(s), "-"), "-")
	if len(m) > 63 {
		m = strings.TrimRight(m[:63], "-")
	}
	return m
}

// Import reads opts.File and returns the manifests, each checked by the
// same parser as `mesh check`.
func Import(ctx context.Context, opts Options) (*Result, error) {
	if opts.Root == "" {
		opts.Root = "/srv"
	}
	abs, err := filepath.Abs(opts.File)
	if err != nil {
		return nil, err
	}
	env := opts.Env
	if env == nil {
		env = os.Environ()
	}
	if err := guardFiles(abs, env); err != nil {
		return nil, err
	}
	fns := []cli.ProjectOptionsFn{
		cli.WithWorkingDirectory(filepath.Dir(abs)), cli.WithEnv(env), cli.WithDotEnv,
		cli.WithResolvedPaths(true), cli.WithInterpolation(true), cli.WithNormalization(true),
	}
	if opts.Project != "" {
		fns = append(fns, cli.WithName(opts.Project))
	}
	po, err := cli.NewProjectOptions([]string{abs}, fns...)
	if err != nil {
		return nil, err
	}
	proj, err := cli.ProjectFromOptions(ctx, po)
	if err != nil {
		return nil, fmt.Errorf("read %s: %w", opts.File, err)
	}
	res := &Result{Project: proj.Name}
	names := make([]string, 0, len(proj.Services))
	for n := range proj.Services {
		names = append(names, n)
	}
	sort.Strings(names)
	// Which services mount each named volume: a volume belongs to the
	// first; the mesh gives a path to one module only.
	volOwner := map[string]string{}
	for _, n := range names {
		for _, v := range proj.Services[n].Volumes {
			if v.Type == types.VolumeTypeVolume && v.Source != "" && volOwner[v.Source] == "" {
				volOwner[v.Source] = n
			}
		}
	}
	mods := map[string]string{}
	for _, n := range names {
		m := moduleName(n)
		if other, dup := mods[m]; dup {
			return nil, fmt.Errorf("services %q and %q both become module %q; rename one", other, n, m)
		}
		if m == "" {
			return nil, fmt.Errorf("service %q has no letter or digit to name a module with", n)
		}
		mods[m] = n
		svc := proj.Services[n]
		if m != n {
			res.Notes = append(res.Notes, fmt.Sprintf("%s: becomes module %s (a module's name is a DNS label); other services reach it as %s", n, m, m))
		}
		w := &writer{svc: n, module: m, project: proj.Name, root: filepath.Join(opts.Root, proj.Name+"-"+m), deps: map[string]string{}}
		for d := range svc.DependsOn {
			w.deps[d] = moduleName(d)
		}
		w.service(svc, volOwner, proj.Secrets)
		if w.err != nil {
			return nil, w.err
		}
		text := w.text()
		if _, err := manifest.Parse(m+".yaml", []byte(text)); err != nil {
			return nil, fmt.Errorf("the manifest made from service %s does not pass mesh check (a bug of the import; please report it with the compose file):\n%v\n---\n%s", n, err, text)
		}
		res.Manifests = append(res.Manifests, Manifest{Service: n, Module: m, File: m + ".yaml", Text: text})
		res.Notes = append(res.Notes, w.notes...)
	}
	for _, n := range sortedKeys(proj.DisabledServices) {
		res.Notes = append(res.Notes, fmt.Sprintf("%s: not imported: its profile is not active (pass COMPOSE_PROFILES to import it)", n))
	}
	return res, nil
}

func sortedKeys[V any](m map[string]V) []string { return slices.Sorted(maps.Keys(m)) }

// writer builds one module's manifest.
type writer struct {
	svc, module, project, root string
	deps                       map[string]string // service -> module
	lines                      []string
	notes                      []string
	declared                   map[string]bool
	// err is the first thing of the service that has no manifest form.
	err error
}

// refuse records what of the service the import cannot carry over and
// must not drop silently; the import then fails with it.
func (w *writer) refuse(format string, a ...any) {
	if w.err == nil {
		w.err = fmt.Errorf("service %s: %s", w.svc, fmt.Sprintf(format, a...))
	}
}

func (w *writer) note(format string, a ...any) {
	w.notes = append(w.notes, w.svc+": "+fmt.Sprintf(format, a...))
}

func js(v any) string {
	b, err := json.Marshal(v)
	if err != nil {
		panic(err)
	}
	return string(b)
}

// res starts a resource; kv adds its keys (values as JSON, which is YAML).
func (w *writer) res(kind, name string, kv ...any) {
	w.lines = append(w.lines, "  - "+kind+": "+js(name))
	for i := 0; i+1 < len(kv); i += 2 {
		w.lines = append(w.lines, "    "+kv[i].(string)+": "+js(kv[i+1]))
	}
}

func (w *writer) text() string {
	return "# made by mesh import compose from service " + w.svc + " of project " + w.project + "\nmodule: " + w.module + "\nresources:\n" + strings.Join(w.lines, "\n") + "\n"
}

// owner is who owns the service's directories: its numeric user, else root
// (the image's user is not known here), said so.
func (w *writer) owner(user string) string {
	u, g, hasG := strings.Cut(user, ":")
	if _, err := strconv.Atoi(u); err == nil {
		if !hasG {
			g = u
		}
		if _, err := strconv.Atoi(g); err == nil {
			return u + ":" + g
		}
	}
	return "0:0"
}

func (w *writer) service(svc types.ServiceConfig, volOwner map[string]string, secrets types.Secrets) {
	w.declared = map[string]bool{}
	owner := w.owner(svc.User)
	if owner == "0:0" {
		if svc.User != "" {
			w.note("directories owned by 0:0: user %q is not numeric, so its ids are not known here; set owner if the image runs as another user", svc.User)
		} else {
			w.note("directories owned by 0:0 (root in the container): the image's user is not known here; set owner if the image runs as another user")
		}
	} else {
		w.note("directories owned by %s, the service's user", owner)
	}
	w.res("directory", w.root)
	w.declared[w.root] = true

	var mounts, tmpfs []string
	for _, v := range svc.Volumes {
		ro := ""
		if v.ReadOnly {
			ro = ":ro"
		}
		if !path.IsAbs(v.Target) {
			w.refuse("volume %s: its container path %q is not absolute; fix the compose file", v.Source, v.Target)
			continue
		}
		switch v.Type {
		case types.VolumeTypeVolume:
			if v.Source == "" {
				w.note("anonymous volume at %s: not carried over (the container's own storage keeps it until it is replaced); name it to keep its data", v.Target)
				continue
			}
			if owner := volOwner[v.Source]; owner != w.svc {
				w.note("volume %s is shared with service %s, whose module declares it; the mesh gives a path to one module only: not mounted here (mount a directory of its own, or run both in one module)", v.Source, owner)
				continue
			}
			p := filepath.Join(w.root, safeBase(v.Source))
			if !w.declared[p] {
				w.res("directory", p, "owner", owner, "mode", "0750")
				w.declared[p] = true
				w.note("named volume %s -> directory %s (owner %s, mode 0750)", v.Source, p, owner)
			}
			mounts = append(mounts, p+":"+path.Clean(v.Target)+ro)
		case types.VolumeTypeBind:
			if strings.HasSuffix(v.Source, ".sock") || manifest.Within(v.Source, "/var/run") || manifest.Within(v.Source, "/run") {
				w.note("bind mount %s: not carried over; the mesh hands no container a host socket or a path under /run (a container that drives the engine does not fit the mesh)", v.Source)
				continue
			}
			p := filepath.Join(w.root, safeBase(v.Source))
			if w.declared[p] {
				p = filepath.Join(w.root, safeBase(v.Source)+"-"+strconv.Itoa(len(mounts)))
			}
			st, err := os.Stat(v.Source)
			switch {
			case err == nil && st.Mode().IsRegular() && st.Size() <= 64<<10:
				b, rerr := os.ReadFile(v.Source)
				if rerr != nil || !isText(b) {
					w.note("bind mount %s is a file that is not text (or unreadable): not carried over; declare it as a file or copy it into a declared directory", v.Source)
					continue
				}
				w.res("file", p, "mode", "0644", "content", string(b))
				w.note("bind mount of the file %s -> file %s with its content (mode 0644); the content is now in the manifest, which every node replicates: keep secrets out of it", v.Source, p)
			case err == nil && st.Mode().IsRegular():
				w.note("bind mount %s is a file over 64 KiB: not carried over; copy it into a declared directory", v.Source)
				continue
			default:
				w.res("directory", p, "owner", owner, "mode", "0750")
				if err == nil {
					w.note("bind mount of the directory %s -> directory %s (owner %s, mode 0750); copy its contents there before the first start", v.Source, p, owner)
				} else {
					w.note("bind mount %s (absent here) -> directory %s (owner %s, mode 0750)", v.Source, p, owner)
				}
			}
			w.declared[p] = true
			mounts = append(mounts, p+":"+path.Clean(v.Target)+ro)
		case types.VolumeTypeTmpfs:
			tmpfs = append(tmpfs, path.Clean(v.Target))
		default:
			w.note("volume of type %s at %s: not carried over", v.Type, v.Target)
		}
	}
	// Each secret: a secret resource (its value set with mesh secret set,
	// sealed to the nodes the module runs on), mounted where compose put it.
	if len(svc.Secrets) > 0 {
		dir := filepath.Join(w.root, "secrets")
		w.res("directory", dir, "owner", owner, "mode", "0700")
		w.declared[dir] = true
		for _, s := range svc.Secrets {
			name := secretName(s.Source)
			if !manifest.SecretNameRE.MatchString(name) {
				w.refuse("secret %q has no letter or digit to name a mesh secret with; rename it", s.Source)
				return
			}
			target := s.Target
			if target == "" {
				target = s.Source
			}
			if !path.IsAbs(target) {
				target = "/run/secrets/" + target
			}
			p := filepath.Join(dir, name)
			if w.declared[p] {
				continue
			}
			w.declared[p] = true
			w.res("secret", p, "name", name, "owner", owner)
			mounts = append(mounts, p+":"+path.Clean(target)+":ro")
			how := fmt.Sprintf("printf '%%s' \"$VALUE\" | mesh secret set %s %s", w.module, name)
			if sc, ok := secrets[s.Source]; ok && sc.File != "" {
				how = fmt.Sprintf("mesh secret set %s %s --from-file %s", w.module, name, sc.File)
			} else if ok && sc.Environment != "" {
				how = fmt.Sprintf("printf '%%s' \"$%s\" | mesh secret set %s %s", sc.Environment, w.module, name)
			}
			w.note("secret %s -> secret %s (name %s, owner %s, mode 0600) mounted at %s; once the module is added and assigned, set its value: %s", s.Source, p, name, owner, path.Clean(target), how)
		}
	}
	// depends_on: a binding to each dependency, so it is applied first on a
	// node that runs both, and the service is recreated when it moves.
	var restartOn []string
	for _, d := range sortedKeys(w.deps) {
		p := filepath.Join(w.root, w.deps[d]+".binding")
		restartOn = append(restartOn, p)
		cond := svc.DependsOn[d].Condition
		switch cond {
		case types.ServiceConditionHealthy:
			w.res("binding", p, "provider", w.deps[d], "healthy", true)
			w.note("depends_on %s (service_healthy) -> binding %s with healthy: true: the container starts once %s's instance it points at passes its health check", d, p, d)
		default:
			w.res("binding", p, "provider", w.deps[d])
			w.note("depends_on %s -> binding %s (applied after it, recreated when it moves)", d, p)
		}
	}

	name := w.module + ".main"
	kv := []any{"image", svc.Image}
	if svc.Image == "" {
		kv[1] = "localhost/" + w.project + "-" + w.module + ":latest"
		w.note("build: not carried over: mesh runs images; build it (podman build -t %s ...) on each node or push it to a registry, then set image", kv[1])
	} else if svc.Build != nil {
		w.note("build: dropped; mesh runs the image %s", svc.Image)
	}
	add := func(k string, v any) { kv = append(kv, k, v) }
	if len(svc.Entrypoint) > 0 {
		add("entrypoint", []string(svc.Entrypoint))
	}
	if len(svc.Command) > 0 {
		add("command", []string(svc.Command))
	}
	env := envOf(svc.Environment)
	for _, k := range sortedKeys(env) {
		if !manifest.ValidEnvKey(k) {
			w.note("environment %s: dropped; a mesh env key is a variable name (letters, digits, _)", k)
			delete(env, k)
		}
	}
	for _, k := range sortedKeys(env) {
		if manifest.LooksSecret(k, env[k]) {
			w.note("environment %s looks like a secret: its value is now in the manifest, which every node replicates; move it to env-secrets: {%s: %s} and set it with: printf '%%s' \"$VALUE\" | mesh secret set %s %s", k, k, secretName(k), w.module, secretName(k))
		}
	}
	if len(env) > 0 {
		add("env", env)
		if len(svc.EnvFiles) > 0 {
			w.note("env_file read into env (%d variables in all)", len(env))
		}
	}
	if len(mounts) > 0 {
		add("mounts", mounts)
	}
	if ports := w.ports(svc); len(ports) > 0 {
		add("ports", ports)
	}
	switch svc.Restart {
	case "", "no":
		if svc.Restart == "" {
			w.note("restart: none given; the mesh keeps containers running (restart always)")
		} else {
			add("restart", "no")
		}
	default:
		r := svc.Restart
		if strings.HasPrefix(r, "on-failure") {
			r = "on-failure"
		}
		add("restart", r)
	}
	if len(restartOn) > 0 {
		add("restart-on", restartOn)
	}
	if h := w.health(svc.HealthCheck); h != nil {
		add("health", h)
	}
	if svc.User != "" {
		if manifest.ValidUser(svc.User) {
			add("user", svc.User)
		} else {
			w.note("user %q: dropped; write USER[:GROUP]", svc.User)
		}
	}
	if svc.WorkingDir != "" {
		add("working-dir", svc.WorkingDir)
	}
	caps := func(key string, in []string) {
		var out []string
		for _, c := range in {
			if u := strings.ToUpper(c); manifest.ValidCapability(u) {
				out = append(out, u)
			} else {
				w.note("%s %q: dropped; not a capability name", key, c)
			}
		}
		if len(out) > 0 {
			add(key, out)
		}
	}
	caps("cap-add", svc.CapAdd)
	caps("cap-drop", svc.CapDrop)
	var devs []string
	for _, d := range svc.Devices {
		s := d.Source + ":" + d.Target
		if d.Permissions != "" {
			s += ":" + d.Permissions
		}
		if _, err := manifest.ParseDevice(s); err != nil {
			w.note("device %s: dropped (%v)", s, err)
			continue
		}
		devs = append(devs, s)
	}
	if len(devs) > 0 {
		add("devices", devs)
	}
	if svc.ReadOnly {
		add("read-only", true)
	}
	tmpfs = append(tmpfs, svc.Tmpfs...)
	tmpfs = slices.DeleteFunc(tmpfs, func(t string) bool {
		if _, err := manifest.ParseTmpfs(t); err != nil {
			w.note("tmpfs %s: dropped (%v)", t, err)
			return true
		}
		return false
	})
	if len(tmpfs) > 0 {
		add("tmpfs", tmpfs)
	}
	mem, cpus := int64(svc.MemLimit), float64(svc.CPUS)
	if svc.Deploy != nil && svc.Deploy.Resources.Limits != nil {
		if l := svc.Deploy.Resources.Limits; mem == 0 && l.MemoryBytes > 0 {
			mem = int64(l.MemoryBytes)
		}
		if l := svc.Deploy.Resources.Limits; cpus == 0 && l.NanoCPUs > 0 {
			cpus = float64(l.NanoCPUs.Value())
		}
	}
	if mem > 0 {
		if _, err := manifest.ParseMemory(strconv.FormatInt(mem, 10)); err != nil {
			w.note("memory limit %d bytes: dropped (%v)", mem, err)
		} else {
			add("memory", strconv.FormatInt(mem, 10))
		}
	}
	if cpus > 0 {
		add("cpus", math.Round(cpus*100)/100)
	}
	if svc.StopSignal != "" {
		if _, err := manifest.ParseSignal(svc.StopSignal); err != nil {
			w.note("stop_signal %s: dropped (%v)", svc.StopSignal, err)
		} else {
			add("stop-signal", svc.StopSignal)
		}
	}
	if g := svc.StopGracePeriod; g != nil {
		d := time.Duration(*g)
		if d > 90*time.Second {
			w.note("stop_grace_period %s: the mesh waits at most 90s; set to 90s", d)
			d = 90 * time.Second
		}
		add("stop-timeout", d.String())
	}
	if len(svc.Labels) > 0 {
		labels := map[string]string{}
		for k, v := range svc.Labels {
			if strings.HasPrefix(k, "mesh.") {
				w.note("label %s: dropped (mesh. labels are the mesh's own)", k)
				continue
			}
			labels[k] = v
		}
		if len(labels) > 0 {
			add("labels", labels)
		}
	}
	w.res("container", name, kv...)
	w.dropped(svc)
}

// port says whether a port and protocol have a manifest form, refusing the
// service when not.
func (w *writer) port(what, port, proto string) bool {
	if n, err := strconv.Atoi(port); err != nil || n < 1 || n > 65535 {
		w.refuse("%s port %q is not a port between 1 and 65535", what, port)
		return false
	}
	if proto != "tcp" && proto != "udp" {
		w.refuse("%s port %s: protocol %q; the mesh publishes tcp and udp", what, port, proto)
		return false
	}
	return true
}

// ports: published ports become ports: (internal: on the node's overlay
// address), and the notes say how to make one public; exposed ones are
// published too, at the same number, since another module reaches this one
// at its node's address (the name answers that).
func (w *writer) ports(svc types.ServiceConfig) []string {
	var out, published []string
	seen := map[string]bool{}
	for _, p := range svc.Ports {
		proto := strings.ToLower(p.Protocol)
		if proto == "" {
			proto = "tcp"
		}
		if !w.port("ports: target", strconv.FormatUint(uint64(p.Target), 10), "tcp") {
			continue
		}
		pub := p.Published
		if pub == "" || pub == "0" { // compose picks a free port for either
			pub = strconv.Itoa(int(p.Target))
			w.note("port %d has no published port; published at %s on the node (compose would pick one at random)", p.Target, pub)
		}
		if strings.Contains(pub, "-") {
			w.note("port range %s: not carried over; list each port", pub)
			continue
		}
		if !w.port("ports: published", pub, proto) {
			continue
		}
		s := pub + ":" + strconv.Itoa(int(p.Target)) + "/" + proto
		if p.HostIP != "" {
			w.note("port %s was published on %s; in the mesh ports: answer on the node's overlay address only", s, p.HostIP)
		}
		if !seen[s] {
			seen[s] = true
			out = append(out, s)
			published = append(published, pub)
		}
	}
	if len(published) > 0 {
		w.note("ports %s answer inside the mesh only (on the node's overlay address); move to public-ports: those the world must reach", strings.Join(published, ", "))
	}
	for _, e := range svc.Expose {
		port, proto, _ := strings.Cut(e, "/")
		proto = strings.ToLower(proto)
		if proto == "" {
			proto = "tcp"
		}
		if strings.Contains(port, "-") {
			w.note("expose range %s: not carried over; list each port", e)
			continue
		}
		if !w.port("expose", port, proto) {
			continue
		}
		s := port + ":" + port + "/" + proto
		if !seen[s] {
			seen[s] = true
			out = append(out, s)
			w.note("expose %s -> published at %s on the node, where the name %s answers", e, port, w.module)
		}
	}
	return out
}

func (w *writer) health(h *types.HealthCheckConfig) map[string]any {
	if h == nil || h.Disable || len(h.Test) == 0 {
		return nil
	}
	var cmd []string
	switch h.Test[0] {
	case "NONE":
		return nil
	case "CMD":
		cmd = h.Test[1:]
	case "CMD-SHELL":
		cmd = []string{"/bin/sh", "-c", strings.Join(h.Test[1:], " ")}
	default:
		cmd = []string{"/bin/sh", "-c", strings.Join(h.Test, " ")}
	}
	if len(cmd) == 0 {
		return nil
	}
	out := map[string]any{"command": cmd}
	dur := func(k string, d *types.Duration) {
		if d != nil && *d > 0 {
			out[k] = time.Duration(*d).String()
		}
	}
	dur("interval", h.Interval)
	dur("timeout", h.Timeout)
	dur("start-period", h.StartPeriod)
	if h.Retries != nil && *h.Retries > 0 {
		out["retries"] = min(*h.Retries, 100)
	}
	if h.Interval != nil && h.Timeout != nil && *h.Timeout > *h.Interval {
		out["timeout"] = time.Duration(*h.Interval).String()
		w.note("healthcheck timeout longer than its interval: set to the interval")
	}
	return out
}

// dropped names what compose sets and the manifest cannot carry.
func (w *writer) dropped(svc types.ServiceConfig) {
	say := func(set bool, what, instead string) {
		if set {
			w.note("%s: dropped; %s", what, instead)
		}
	}
	say(svc.NetworkMode == "host", "network_mode: host", "publish the ports it listens on (ports:), the mesh runs every container on Podman's network")
	say(svc.NetworkMode != "" && svc.NetworkMode != "host", "network_mode: "+svc.NetworkMode, "containers reach each other by their module names")
	say(len(svc.Networks) > 0 && !onlyDefault(svc.Networks), "networks", "every container reaches every module by its name; no network is needed")
	say(svc.Privileged, "privileged", "add only the capabilities it needs (cap-add) and the devices (devices)")
	say(len(svc.Links) > 0, "links", "a service reaches another by its module name")
	say(len(svc.ExternalLinks) > 0, "external_links", "a service reaches another by its module name")
	say(svc.ContainerName != "", "container_name", "the container is "+w.module+".main")
	say(svc.Hostname != "", "hostname", "the module's name is how others reach it")
	say(len(svc.ExtraHosts) > 0, "extra_hosts", "the mesh's resolver answers the mesh's names; nothing about the roster is copied into a container")
	say(len(svc.DNS) > 0 || len(svc.DNSSearch) > 0 || len(svc.DNSOpts) > 0, "dns settings", "every container asks the node's resolver")
	say(len(svc.Configs) > 0, "configs", "declare each as a file with its content and mount it")
	say(len(svc.VolumesFrom) > 0, "volumes_from", "mount the same declared directory")
	say(len(svc.Ulimits) > 0, "ulimits", "the mesh sets none")
	say(len(svc.Sysctls) > 0, "sysctls", "the mesh sets none")
	say(len(svc.SecurityOpt) > 0, "security_opt", "the mesh sets none")
	say(svc.Logging != nil, "logging", "Podman's default log driver is used")
	say(svc.Scale != nil && *svc.Scale > 1, "scale", "assign the module to several nodes")
	say(svc.Deploy != nil && svc.Deploy.Replicas != nil && *svc.Deploy.Replicas > 1, "deploy.replicas", "assign the module to several nodes")
	say(svc.PullPolicy != "", "pull_policy", "set pull: always or newer if needed")
	say(svc.Init != nil && *svc.Init, "init", "the mesh sets none")
	say(svc.ShmSize > 0, "shm_size", "the mesh sets none")
}

func onlyDefault(n map[string]*types.ServiceNetworkConfig) bool {
	for k := range n {
		if k != "default" {
			return false
		}
	}
	return true
}

func envOf(m types.MappingWithEquals) map[string]string {
	out := map[string]string{}
	for k, v := range m {
		if v != nil {
			out[k] = *v
		} else {
			out[k] = ""
		}
	}
	return out
}

func safeBase(p string) string {
	b := strings.Trim(labelRE.ReplaceAllString(strings.ToLower(filepath.Base(filepath.Clean(p))), "-"), "-")
	if b == "" {
		b = "data"
	}
	return b
}

func isText(b []byte) bool {
	for _, c := range b {
		if c == 0 {
			return false
		}
	}
	return true
}
