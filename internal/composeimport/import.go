// Package composeimport turns a docker-compose file into mesh manifests
// (`mesh import compose`). The file is read by compose-go, the parser
// `docker compose` uses, so env files, interpolation, extends and profiles
// resolve as they do there. Each service becomes a module of its own name,
// so its short compose name resolves from every container (the mesh's
// domain is every container's search domain). Everything it decides, and
// everything it cannot carry over, is said in one line each.
package composeimport

import (
	"cmp"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"io/fs"
	"maps"
	"math"
	"os"
	"path"
	"path/filepath"
	"reflect"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"
	"unicode/utf8"

	"github.com/compose-spec/compose-go/v2/cli"
	"github.com/compose-spec/compose-go/v2/types"
	"github.com/sirupsen/logrus"

	"mesh/state/manifest"
)

// Options says what to import.
type Options struct {
	File    string // the compose file
	Project string // overrides the project name ("" keeps compose's)
	// Root is where the services' host paths go: ROOT/PROJECT-SERVICE
	// (default /srv). It must be absolute and a place a manifest may
	// declare (not /etc, /usr, ...).
	Root string
	// Prefix names each module PREFIX-SERVICE ("" keeps the service's
	// name, which is how the other services reach it under compose).
	Prefix string
	// CopyHostFiles lets a bind-mounted text file outside the project's
	// directory (an absolute host path) be read into its manifest. A link
	// leading out of the project's directory is never followed.
	CopyHostFiles bool
	// Env replaces the process environment for interpolation (nil: the
	// process's own). The .env beside the compose file fills in what it
	// does not set, as docker compose does.
	Env []string
	// Inspect, when set, says what an image present on this machine
	// declares (false when it is not here): its ports, so a service others
	// depend on can be published where they reach it, and its user, who
	// owns the service's directories.
	Inspect func(ctx context.Context, image string) (Image, bool)
}

// Image is what an image declares that the import uses.
type Image struct {
	Ports   []string // exposed, "5432/tcp"
	User    string   // USER, "" for root
	Volumes []string // VOLUME paths
}

// UsageError is an option the import cannot work with (a relative or
// system --root): the command was called wrongly, not the file.
type UsageError struct{ error }

func (e UsageError) Unwrap() error { return e.error }

// Manifest is one module written from a service.
type Manifest struct {
	Service string
	Module  string
	File    string // MODULE.yaml
	Text    string
	// Private: it carries the content of a file others may not read, so
	// it is written readable by its owner only.
	Private bool
}

// The kinds of notes: what a key became, what was not carried (and what to
// do instead), and what the operator must do before the module runs as it
// did under compose.
const (
	NoteCarried = "carried"
	NoteDropped = "dropped"
	NoteAction  = "action"
)

// Note is one line of what the import decided, for one service.
type Note struct {
	Service string `json:"service"`
	Kind    string `json:"kind"`
	Text    string `json:"text"`
}

func (n Note) String() string { return n.Service + ": " + n.Text }

// Result is the manifests and the lines that say what was decided.
type Result struct {
	Project   string
	Manifests []Manifest
	Notes     []Note
	// Copied lists the host files whose content is now in a manifest.
	Copied []string
}

// Lines is the notes as printed, one "SERVICE: text" each.
func (r *Result) Lines() []string {
	out := make([]string, len(r.Notes))
	for i, n := range r.Notes {
		out[i] = n.String()
	}
	return out
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

// checkRoot says why root cannot hold the project's directories.
func checkRoot(root, project string) error {
	if !filepath.IsAbs(root) {
		return UsageError{fmt.Errorf("--root %q is not an absolute path; write where the host paths go, e.g. --root /srv", root)}
	}
	if err := manifest.CheckHostPath(filepath.Join(filepath.Clean(root), project+"-x")); err != nil {
		return UsageError{fmt.Errorf("--root %s: %v", root, err)}
	}
	return nil
}

// Import reads opts.File and returns the manifests, each checked by the
// same parser as `mesh check`.
func Import(ctx context.Context, opts Options) (*Result, error) {
	if opts.Root == "" {
		opts.Root = "/srv"
	}
	if !filepath.IsAbs(opts.Root) {
		return nil, checkRoot(opts.Root, "")
	}
	opts.Root = filepath.Clean(opts.Root)
	if opts.Prefix != "" && moduleName(opts.Prefix) != opts.Prefix {
		return nil, UsageError{fmt.Errorf("--prefix %q is not a DNS label (lower-case letters, digits, '-'); try --prefix %s", opts.Prefix, moduleName(opts.Prefix))}
	}
	abs, err := filepath.Abs(opts.File)
	if err != nil {
		return nil, err
	}
	env := opts.Env
	if env == nil {
		env = os.Environ()
	}
	dir := projectDir{named: filepath.Dir(abs), real: filepath.Dir(abs)}
	if real, err := filepath.EvalSymlinks(dir.named); err == nil {
		dir.real = real
	}
	// What the guard's interpolation warns of, compose-go warns of again
	// below, where it becomes a note.
	var fromEnv []string
	silenced(nil, func() { fromEnv, err = guardFiles(abs, env, dir, opts.CopyHostFiles) })
	if err != nil {
		return nil, err
	}
	fns := []cli.ProjectOptionsFn{cli.WithWorkingDirectory(filepath.Dir(abs)), cli.WithEnv(env)}
	// The .env beside the file: read as docker compose reads it (what the
	// environment sets wins), COMPOSE_PROJECT_NAME and COMPOSE_PROFILES
	// included, unless COMPOSE_DISABLE_ENV_FILE says not to.
	dotEnv := filepath.Join(filepath.Dir(abs), ".env")
	if fi, err := os.Stat(dotEnv); err == nil && fi.Mode().IsRegular() && !envFlag(env, "COMPOSE_DISABLE_ENV_FILE") {
		fns = append(fns, cli.WithEnvFiles(dotEnv), cli.WithDotEnv)
	}
	fns = append(fns, cli.WithDefaultProfiles(),
		cli.WithResolvedPaths(true), cli.WithInterpolation(true), cli.WithNormalization(true))
	if opts.Project != "" {
		fns = append(fns, cli.WithName(opts.Project))
	}
	po, err := cli.NewProjectOptions([]string{abs}, fns...)
	if err != nil {
		return nil, err
	}
	proj, warnings, err := load(ctx, po)
	if err != nil {
		return nil, fmt.Errorf("read %s: %w", opts.File, err)
	}
	if err := checkRoot(opts.Root, proj.Name); err != nil {
		return nil, err
	}
	if len(proj.Name) > 100 {
		return nil, UsageError{fmt.Errorf("the project's name is %d characters; host paths are ROOT/PROJECT-MODULE, and a path's element is at most 255 bytes: give --project a shorter one (at most 100)", len(proj.Name))}
	}
	p := &project{opts: opts, proj: proj, dir: dir, res: &Result{Project: proj.Name}}
	for _, w := range warnings {
		p.res.Notes = append(p.res.Notes, Note{"compose", NoteAction, w})
	}
	// The operator's own values, filled in silently, would otherwise go
	// unseen into manifests every node replicates.
	if len(fromEnv) > 0 {
		p.res.Notes = append(p.res.Notes, Note{"compose", NoteAction, fmt.Sprintf("variables %s: the compose files take their values from the environment the import ran in, not from the project's .env or env files; the values are now in the manifests wherever the files use them, and every node replicates a manifest: keep a secret one in a secret (compose's secrets: or configs: with environment:, or a container's env-secrets:), set with mesh secret set", strings.Join(fromEnv, ", "))})
	}
	return p.run(ctx)
}

// load reads the project, keeping what compose-go warns of (a variable
// not set, "defaulting to a blank string": an empty password) as notes
// instead of log lines on stderr.
func load(ctx context.Context, po *cli.ProjectOptions) (proj *types.Project, lines []string, err error) {
	h := &warnHook{}
	silenced(h, func() { proj, err = po.LoadProject(ctx) })
	return proj, h.lines, err
}

// silenced runs f with what the standard logger logs (compose-go's
// warnings) going to hook alone, or nowhere when it is nil.
func silenced(hook logrus.Hook, f func()) {
	std := logrus.StandardLogger()
	hooks, out := std.ReplaceHooks(logrus.LevelHooks{}), std.Out
	if hook != nil {
		std.AddHook(hook)
	}
	std.SetOutput(io.Discard)
	defer func() { std.ReplaceHooks(hooks); std.SetOutput(out) }()
	f()
}

type warnHook struct{ lines []string }

func (*warnHook) Levels() []logrus.Level {
	return []logrus.Level{logrus.PanicLevel, logrus.FatalLevel, logrus.ErrorLevel, logrus.WarnLevel}
}

func (h *warnHook) Fire(e *logrus.Entry) error {
	if !slices.Contains(h.lines, e.Message) {
		h.lines = append(h.lines, e.Message)
	}
	return nil
}

// envFlag says whether env sets k to a true value.
func envFlag(env []string, k string) bool {
	for _, kv := range env {
		if v, ok := strings.CutPrefix(kv, k+"="); ok {
			b, _ := strconv.ParseBool(v)
			return b
		}
	}
	return false
}

// project is one import: what the services share, decided before any is
// written.
type project struct {
	opts Options
	proj *types.Project
	dir  projectDir
	res  *Result
	// modules maps each service to its module.
	modules map[string]string
	// volOwner is the service whose module declares a named volume, and
	// bindOwner the one that declares a host directory several mount: the
	// first by name; the mesh gives a path to one module only.
	volOwner, bindOwner map[string]string
	// dependants lists, per service, the services that depend on it.
	dependants map[string][]string
	// renamed: some service's module is not its name (--prefix, or a name
	// that is no DNS label), so the hosts its dependants name are renamed.
	renamed bool
}

func (p *project) run(ctx context.Context) (*Result, error) {
	proj := p.proj
	names := sortedKeys(proj.Services)
	p.modules = map[string]string{}
	byModule := map[string]string{}
	for _, n := range names {
		m := moduleName(n)
		if p.opts.Prefix != "" {
			m = moduleName(p.opts.Prefix + "-" + n)
		}
		if m == "" {
			return nil, fmt.Errorf("service %q has no letter or digit to name a module with", n)
		}
		if other, dup := byModule[m]; dup {
			return nil, fmt.Errorf("services %q and %q both become module %q; rename one", other, n, m)
		}
		byModule[m] = n
		p.modules[n] = m
		p.renamed = p.renamed || m != n
	}
	p.volOwner, p.bindOwner, p.dependants = map[string]string{}, map[string]string{}, map[string][]string{}
	for _, n := range names {
		svc := proj.Services[n]
		for _, v := range svc.Volumes {
			switch {
			case v.Type == types.VolumeTypeVolume && v.Source != "" && p.volOwner[v.Source] == "":
				p.volOwner[v.Source] = n
			case v.Type == types.VolumeTypeBind && v.Source != "" && p.bindOwner[filepath.Clean(v.Source)] == "":
				p.bindOwner[filepath.Clean(v.Source)] = n
			}
		}
		for _, d := range sortedKeys(svc.DependsOn) {
			// One that waits for d to finish needs no port of it.
			if svc.DependsOn[d].Condition != types.ServiceConditionCompletedSuccessfully {
				p.dependants[d] = append(p.dependants[d], n)
			}
		}
		// A service named as a host in the environment or the command
		// (DATABASE_URL: postgres://u@db/x) is reached too, depends_on or
		// not.
		named := map[string]bool{}
		for k, v := range envOf(svc.Environment) {
			p.hosts(k, v, named)
		}
		for _, args := range [][]string{svc.Entrypoint, svc.Command} {
			p.argHosts(args, named)
		}
		for _, d := range sortedKeys(named) {
			if _, dep := svc.DependsOn[d]; !dep && d != n {
				p.dependants[d] = append(p.dependants[d], n)
			}
		}
	}
	for d := range p.dependants {
		slices.Sort(p.dependants[d])
		p.dependants[d] = slices.Compact(p.dependants[d])
	}
	for _, n := range names {
		m := p.modules[n]
		svc := proj.Services[n]
		w := &writer{p: p, svc: n, module: m, root: filepath.Join(p.opts.Root, proj.Name+"-"+m)}
		if m != n {
			w.note(NoteCarried, "becomes module %s (a module's name is a DNS label, unique in the mesh); other services reach it as %s", m, m)
		}
		w.service(ctx, svc)
		if w.err != nil {
			return nil, w.err
		}
		text := w.text()
		if _, err := manifest.Parse(m+".yaml", []byte(text)); err != nil {
			return nil, fmt.Errorf("the manifest made from service %s does not pass mesh check (a bug of the import; please report it with the compose file):\n%v\n---\n%s", n, err, text)
		}
		p.res.Manifests = append(p.res.Manifests, Manifest{Service: n, Module: m, File: m + ".yaml", Text: text, Private: w.private})
		p.res.Notes = append(p.res.Notes, w.notes...)
		p.res.Copied = append(p.res.Copied, w.copied...)
	}
	for _, n := range sortedKeys(proj.DisabledServices) {
		p.res.Notes = append(p.res.Notes, Note{n, NoteDropped, "not imported: its profile is not active (set COMPOSE_PROFILES, in the environment or .env, to import it)"})
	}
	// A job runs to its end, on demand or on a schedule, where a module's
	// containers keep running: none is imported, and each is said.
	for _, n := range sortedKeys(proj.AllJobs()) {
		p.res.Notes = append(p.res.Notes, Note{"compose", NoteDropped, fmt.Sprintf("job %s: not imported; the import carries services only: make its work a step of a module (a step runs to its end before the containers start; schedule: runs it again on a cron line)", n)})
	}
	return p.res, nil
}

func sortedKeys[V any](m map[string]V) []string { return slices.Sorted(maps.Keys(m)) }

// writer builds one module's manifest.
type writer struct {
	p                  *project
	svc, module, root  string
	lines              []string
	notes              []Note
	copied             []string
	owner              string
	copiedBytes        int
	private            bool  // a copied file's mode denies others
	image              Image // what the local Podman says of its image
	inspected          bool
	mounts, tmpfs      []string
	devices, restartOn []string
	// paths maps each declared path to what it stands for ("volume
	// db_data", "bind /x/certs"), so two sources that would share a name
	// get two directories; sources maps the other way.
	paths, sources map[string]string
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

func (w *writer) note(kind, format string, a ...any) {
	w.notes = append(w.notes, Note{w.svc, kind, fmt.Sprintf(format, a...)})
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

// Header starts the first line of every manifest the import writes:
// "HEADER SERVICE of project PROJECT" (mesh module add reads it, to refuse a
// module of another project's under the same name).
const Header = "# made by mesh import compose from service "

func (w *writer) text() string {
	return Header + w.svc + " of project " + w.p.proj.Name + "\nmodule: " + w.module + "\nresources:\n" + strings.Join(w.lines, "\n") + "\n"
}

// path is the declared path for a source under the module's directory:
// ROOT/PROJECT-MODULE/BASE, or BASE-2, BASE-3... when another source took
// that name (volumes db_data and db-data, a file ./data and a volume data),
// said so; the same source always gets the same path.
func (w *writer) path(source, base string) (p string, fresh bool) {
	if p, ok := w.sources[source]; ok {
		return p, false
	}
	p = filepath.Join(w.root, base)
	for i := 2; w.paths[p] != ""; i++ {
		p = filepath.Join(w.root, base+"-"+strconv.Itoa(i))
	}
	if q := filepath.Join(w.root, base); p != q {
		w.note(NoteCarried, "%s -> %s: %s is %s's already", source, p, q, w.paths[q])
	}
	w.paths[p], w.sources[source] = source, p
	return p, true
}

// unclaim gives back a path that path took for a source not carried.
func (w *writer) unclaim(source, p string) {
	delete(w.paths, p)
	delete(w.sources, source)
}

// ownerOf is who owns the service's directories: its numeric user, else
// root (the image's user is not known here), said so.
func ownerOf(user string) string {
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

func (w *writer) service(ctx context.Context, svc types.ServiceConfig) {
	w.paths, w.sources = map[string]string{}, map[string]string{}
	if w.p.opts.Inspect != nil && svc.Image != "" {
		w.image, w.inspected = w.p.opts.Inspect(ctx, svc.Image)
	}
	w.owner = ownerOf(svc.User)
	if svc.User == "" && w.inspected && ownerOf(w.image.User) != "0:0" {
		w.owner = ownerOf(w.image.User)
		w.note(NoteCarried, "directories owned by %s, the user its image %s runs as", w.owner, svc.Image)
	} else if w.owner == "0:0" {
		if u, _, _ := strings.Cut(svc.User, ":"); u == "0" || u == "root" {
			w.note(NoteCarried, "directories owned by 0:0, the service's user (root)")
		} else if svc.User != "" {
			w.note(NoteAction, "directories owned by 0:0: user %q is not numeric, so its ids are not known here; set owner if the image runs as another user", svc.User)
		} else {
			w.note(NoteAction, "directories owned by 0:0 (root in the container): the image's user is not known here; set owner if the image runs as another user")
		}
	} else {
		w.note(NoteCarried, "directories owned by %s, the service's user", w.owner)
	}
	w.res("directory", w.root, "owner", "0:0", "mode", "0755")
	w.paths[w.root] = "the module's directory"
	for _, v := range svc.Volumes {
		w.volume(v)
	}
	w.imageData(svc)
	w.secrets(svc)
	w.configs(svc)
	w.dependsOn(svc)

	name := w.module + ".main"
	kv := []any{"image", svc.Image}
	if svc.Image == "" {
		kv[1] = "localhost/" + w.p.proj.Name + "-" + w.module + ":latest"
		w.note(NoteAction, "build: not carried over: mesh runs images; build it (podman build -t %s ...) on each node or push it to a registry, then set image", kv[1])
	} else if svc.Build != nil {
		w.note(NoteDropped, "build: dropped; mesh runs the image %s", svc.Image)
	}
	add := func(k string, v any) { kv = append(kv, k, v) }
	entrypoint, command := []string(svc.Entrypoint), []string(svc.Command)
	if svc.Entrypoint != nil && len(svc.Entrypoint) == 0 {
		// entrypoint: [] clears the image's entrypoint: the command runs
		// alone, so it becomes the entrypoint.
		if len(command) > 0 {
			entrypoint, command = command, nil
			w.note(NoteCarried, "entrypoint: [] (the image's entrypoint cleared) -> entrypoint %s, the command run alone", js(entrypoint))
		} else {
			w.note(NoteAction, "entrypoint: [] clears the image's entrypoint, and no command is given: the image's command is not known here; set entrypoint to it (mesh cannot send an empty one)")
		}
	}
	entrypoint, command = w.rename("entrypoint", entrypoint), w.rename("command", command)
	if len(entrypoint) > 0 {
		add("entrypoint", entrypoint)
	}
	if len(command) > 0 {
		add("command", command)
	}
	env := envOf(svc.Environment)
	for _, k := range sortedKeys(env) {
		if strings.ContainsRune(env[k], 0) {
			w.note(NoteDropped, "environment %s: dropped; its value holds a NUL byte, which no process's environment can", k)
			delete(env, k)
			continue
		}
		if !manifest.ValidEnvKey(k) {
			w.note(NoteDropped, "environment %s: dropped; %s", k, manifest.EnvKeyRule)
			delete(env, k)
			continue
		}
		if v := w.renameValue(k, env[k]); v != env[k] {
			w.note(NoteCarried, "environment %s: %q -> %q (the services' module names)", k, env[k], v)
			env[k] = v
		} else if m, ok := w.p.modules[v]; ok && w.p.renamed && m != v {
			w.note(NoteAction, "environment %s is %q, the name of service %s, left as it is: if it is a host, write %s (the module's name)", k, v, v, m)
		}
	}
	for _, k := range sortedKeys(env) {
		if manifest.LooksSecret(k, env[k]) {
			w.note(NoteAction, "environment %s looks like a secret: its value is now in the manifest, which every node replicates; move it to env-secrets: {%s: %s} and set it with: printf '%%s' \"$VALUE\" | mesh secret set %s %s", k, k, secretName(k), w.module, secretName(k))
		}
	}
	if len(env) > 0 {
		add("env", env)
		if len(svc.EnvFiles) > 0 {
			w.note(NoteCarried, "env_file read into env (%d variables in all)", len(env))
		}
	}
	if len(w.mounts) > 0 {
		add("mounts", w.mounts)
	}
	if ports := w.ports(ctx, svc); len(ports) > 0 {
		add("ports", ports)
	}
	if r := w.restart(svc); r != "" {
		add("restart", r)
	}
	if len(w.restartOn) > 0 {
		add("restart-on", w.restartOn)
	}
	if h := w.health(svc.HealthCheck); h != nil {
		add("health", h)
	}
	if svc.User != "" {
		if manifest.ValidUser(svc.User) {
			add("user", svc.User)
		} else {
			w.note(NoteDropped, "user %q: dropped; write USER[:GROUP]", svc.User)
		}
	}
	if wd := svc.WorkingDir; wd != "" {
		if path.IsAbs(wd) {
			add("working-dir", path.Clean(wd))
		} else {
			w.note(NoteDropped, "working_dir %q: dropped; it is not an absolute path (the image's own applies)", wd)
		}
	}
	caps := func(key string, in []string) {
		var out []string
		for _, c := range in {
			if u := strings.ToUpper(c); manifest.ValidCapability(u) {
				out = append(out, u)
			} else {
				w.note(NoteDropped, "%s %q: dropped; not a capability name", key, c)
			}
		}
		if len(out) > 0 {
			add(key, out)
		}
	}
	caps("cap-add", svc.CapAdd)
	caps("cap-drop", svc.CapDrop)
	for _, d := range svc.Devices {
		s := d.Source + ":" + d.Target
		if d.Permissions != "" {
			s += ":" + d.Permissions
		}
		w.device(s)
	}
	if len(w.devices) > 0 {
		add("devices", w.devices)
	}
	if svc.ReadOnly {
		add("read-only", true)
	}
	for _, t := range svc.Tmpfs {
		w.addTmpfs(t)
	}
	if len(w.tmpfs) > 0 {
		add("tmpfs", w.tmpfs)
	}
	w.limits(svc, add)
	if svc.Tty {
		add("tty", true)
	}
	if svc.Init != nil && *svc.Init {
		add("init", true)
		w.note(NoteAction, "init: true -> init: true: Podman runs its catatonit as PID 1, which each node that runs the module needs (Debian: apt install catatonit)")
	}
	if len(svc.GroupAdd) > 0 {
		var groups []string
		for _, g := range svc.GroupAdd {
			if g == "keep-groups" {
				w.note(NoteDropped, "group_add keep-groups: dropped; it is Podman's own (rootless with crun), not a group: name the groups the process needs")
			} else if manifest.ValidGroup(g) {
				groups = append(groups, g)
			} else {
				w.note(NoteDropped, "group_add %q: dropped; write a group name or a numeric id", g)
			}
		}
		if len(groups) > 0 {
			add("group-add", groups)
		}
	}
	if svc.StopSignal != "" {
		if _, err := manifest.ParseSignal(svc.StopSignal); err != nil {
			w.note(NoteDropped, "stop_signal %s: dropped (%v)", svc.StopSignal, err)
		} else {
			add("stop-signal", svc.StopSignal)
		}
	}
	if g := svc.StopGracePeriod; g != nil && time.Duration(*g) < 0 {
		w.note(NoteDropped, "stop_grace_period %s: dropped; not a duration of 0s or more", time.Duration(*g))
	} else if g != nil {
		d := time.Duration(*g)
		if d > 90*time.Second {
			w.note(NoteCarried, "stop_grace_period %s: the mesh waits at most 90s; set to 90s", d)
			d = 90 * time.Second
		}
		add("stop-timeout", d.String())
	}
	if len(svc.Labels) > 0 {
		labels := map[string]string{}
		for k, v := range svc.Labels {
			if strings.HasPrefix(k, "mesh.") || k == "" {
				w.note(NoteDropped, "label %q: dropped (empty, or mesh. labels are the mesh's own)", k)
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

// volume carries one entry of volumes: a named volume or a bind of a
// directory becomes a declared directory, a bind of a small text file in
// the project a file with its content, a bind of a device a device, a tmpfs
// a tmpfs; the rest is said.
func (w *writer) volume(v types.ServiceVolumeConfig) {
	opts := []string{}
	if v.ReadOnly {
		opts = append(opts, "ro")
	}
	if v.Bind != nil && (v.Bind.SELinux == "z" || v.Bind.SELinux == "Z") {
		opts = append(opts, v.Bind.SELinux)
	}
	mount := func(p string) {
		w.mount(p, path.Clean(v.Target), opts)
	}
	if !path.IsAbs(v.Target) {
		w.refuse("volume %s: its container path %q is not absolute; fix the compose file", v.Source, v.Target)
		return
	}
	if badTarget(v.Target) {
		w.note(NoteDropped, "volume %s at %q: not carried over; a mesh mount's container path may not hold ':', ',' or a newline", v.Source, v.Target)
		return
	}
	if v.Bind != nil && !bool(v.Bind.CreateHostPath) && v.Type == types.VolumeTypeBind {
		w.note(NoteCarried, "bind mount %s: create_host_path: false; the mesh makes the directory it declares all the same", v.Source)
	}
	if v.Bind != nil && v.Bind.Propagation != "" {
		w.note(NoteDropped, "volume %s: bind propagation %s dropped; the mesh's mounts are private", v.Target, v.Bind.Propagation)
	}
	if v.Volume != nil && v.Volume.NoCopy {
		w.note(NoteCarried, "volume %s: nocopy: the mesh's directories start empty anyway (the image's files at %s are not copied in)", v.Source, v.Target)
	}
	switch v.Type {
	case types.VolumeTypeVolume:
		if v.Source == "" {
			w.note(NoteDropped, "anonymous volume at %s: not carried over (the container's own storage keeps it until it is replaced); name it to keep its data", v.Target)
			return
		}
		if owner := w.p.volOwner[v.Source]; owner != w.svc {
			w.note(NoteAction, "volume %s is shared with service %s, whose module declares it; the mesh gives a path to one module only: not mounted here (mount a directory of its own, or run both in one module)", v.Source, owner)
			return
		}
		p, fresh := w.path("volume "+v.Source, safeBase(v.Source))
		if fresh {
			owner, mode := w.dirOwner(v.Target)
			w.res("directory", p, "owner", owner, "mode", mode, "data", true)
			w.note(NoteCarried, "named volume %s -> data directory %s (owner %s, mode %s; kept when the module goes)", v.Source, p, owner, mode)
			w.volumeKind(v.Source, p)
		}
		if v.Volume != nil && v.Volume.Subpath != "" {
			sub := path.Clean(v.Volume.Subpath)
			if path.IsAbs(sub) || sub == ".." || strings.HasPrefix(sub, "../") || strings.ContainsAny(sub, ":,\n") {
				w.refuse("volume %s: subpath %q does not stay inside the volume", v.Source, v.Volume.Subpath)
				return
			}
			if sub != "." {
				q := filepath.Join(p, sub)
				if w.paths[q] == "" {
					w.paths[q] = "volume " + v.Source + " subpath " + sub
					w.res("directory", q, "owner", w.owner, "mode", "0750", "data", true)
					w.note(NoteCarried, "volume %s subpath %s -> directory %s", v.Source, sub, q)
				}
				p = q
			}
		}
		mount(p)
	case types.VolumeTypeBind:
		src := filepath.Clean(v.Source)
		if strings.HasSuffix(src, ".sock") || manifest.Within(src, "/var/run") || manifest.Within(src, "/run") {
			w.note(NoteDropped, "bind mount %s: not carried over; the mesh hands no container a host socket or a path under /run (a container that drives the engine does not fit the mesh)", v.Source)
			return
		}
		st, err := os.Stat(src)
		switch {
		case err == nil && st.Mode()&fs.ModeDevice != 0:
			w.device(src + ":" + path.Clean(v.Target))
			return
		case err == nil && !st.IsDir() && !st.Mode().IsRegular():
			w.note(NoteDropped, "bind mount %s is %s: not carried over; the mesh mounts directories and files it declares", v.Source, kindOf(st.Mode()))
			return
		case err == nil && st.Mode().IsRegular():
			p, fresh := w.path("bind "+src, safeBase(src))
			// A file others may not read (a private key, 0600) is declared
			// no wider, owned by the service's user, who read it under
			// compose: as 0644 every local user of a node could read it.
			owner, mode := "0:0", "0644"
			if perm := st.Mode().Perm(); perm&0o004 == 0 {
				owner, mode = w.owner, fmt.Sprintf("%04o", perm&0o644|0o400)
			}
			if fresh && !w.hostFile("bind mount of the file "+src, src, p, owner, mode) {
				w.unclaim("bind "+src, p)
				return
			}
			mount(p)
			return
		}
		if owner := w.p.bindOwner[src]; owner != w.svc {
			w.note(NoteAction, "bind mount of the directory %s is shared with service %s, whose module declares it as %s; the mesh gives a path to one module only: not mounted here (run both services as containers of one module to share it)", v.Source, owner, filepath.Join(w.p.opts.Root, w.p.proj.Name+"-"+w.p.modules[owner], safeBase(src)))
			return
		}
		p, fresh := w.path("bind "+src, safeBase(src))
		if fresh {
			owner, mode := w.dirOwner(v.Target)
			w.res("directory", p, "owner", owner, "mode", mode, "data", true)
			if err == nil {
				w.note(NoteAction, "bind mount of the directory %s -> data directory %s (owner %s, mode %s); copy its contents there before the first start", v.Source, p, owner, mode)
			} else {
				w.note(NoteCarried, "bind mount %s (absent here) -> data directory %s (owner %s, mode %s)", v.Source, p, owner, mode)
			}
		}
		mount(p)
	case types.VolumeTypeTmpfs:
		t := path.Clean(v.Target)
		var o []string
		if v.Tmpfs != nil && v.Tmpfs.Size > 0 {
			o = append(o, "size="+strconv.FormatInt(int64(v.Tmpfs.Size), 10))
		}
		if v.Tmpfs != nil && v.Tmpfs.Mode != 0 {
			o = append(o, "mode="+strconv.FormatUint(uint64(v.Tmpfs.Mode), 8))
		}
		if len(o) > 0 {
			t += ":" + strings.Join(o, ",")
		}
		w.addTmpfs(t)
	default:
		w.note(NoteDropped, "volume of type %s at %s: not carried over", v.Type, v.Target)
	}
}

// dataOwners are the owners the official images of common databases give
// their data directory (their entrypoint starts as root, changes the
// directory's owner, and drops to that user): declared as another owner,
// every apply would set it back and the server would lose its data.
var dataOwners = []struct {
	image, alpine, target, owner, alpineOwner, mode string
}{
	{"postgres", "", "/var/lib/postgresql/data", "999:999", "70:70", "0700"},
	{"postgis", "", "/var/lib/postgresql/data", "999:999", "70:70", "0700"},
	// postgres 18's volume is the parent; PGDATA is 18/docker under it.
	{"postgres", "", "/var/lib/postgresql", "999:999", "70:70", "0750"},
	{"postgis", "", "/var/lib/postgresql", "999:999", "70:70", "0750"},
	{"mysql", "", "/var/lib/mysql", "999:999", "999:999", "0750"},
	{"mariadb", "", "/var/lib/mysql", "999:999", "999:999", "0750"},
	{"redis", "", "/data", "999:999", "999:1000", "0750"},
	{"mongo", "", "/data/db", "999:999", "999:999", "0750"},
}

// dirOwner is the owner and mode of a directory the service mounts at
// target: its database's own, for the images above, else the service's.
func (w *writer) dirOwner(target string) (owner, mode string) {
	name, tag := imageName(w.p.proj.Services[w.svc].Image)
	for _, d := range dataOwners {
		if d.image == name && manifest.Within(path.Clean(target), d.target) && w.p.proj.Services[w.svc].User == "" {
			owner = d.owner
			if strings.Contains(tag, "alpine") {
				owner = d.alpineOwner
			}
			w.note(NoteCarried, "%s: owner %s, mode %s, as %s's image owns its data directory (its entrypoint changes the owner to it at every start)", target, owner, d.mode, name)
			return owner, d.mode
		}
	}
	return w.owner, "0750"
}

// imageData keeps what the image keeps at each VOLUME of it that no mount
// or tmpfs of the service holds: compose makes such a path an anonymous
// volume and carries it over when it recreates the container, and the
// mesh refuses to run a container whose image's VOLUME nothing holds (a
// volume Podman made would be left behind at each replacement, the data
// with it). Each becomes a data directory of the module, mounted there.
// The VOLUMEs are the image's as this machine's Podman has it, and a known
// database's data directory (its image not here to ask).
func (w *writer) imageData(svc types.ServiceConfig) {
	held := func(t string) bool {
		for _, m := range w.mounts {
			if _, rest, ok := strings.Cut(m, ":"); ok {
				if mt, _, _ := strings.Cut(rest, ":"); manifest.Within(t, path.Clean(mt)) {
					return true
				}
			}
		}
		for _, x := range append(slices.Clone(w.tmpfs), svc.Tmpfs...) {
			// (One the manifest cannot carry is dropped below: it holds
			// nothing.)
			if tf, err := manifest.ParseTmpfs(x); err == nil && manifest.Within(t, tf.Path) {
				return true
			}
		}
		return false
	}
	var targets []string
	if w.inspected {
		targets = w.image.Volumes
	} else {
		// A known database's data directory, one of its releases' (any
		// of them held is taken for the one the tag has).
		name, tag := imageName(svc.Image)
		var alts []string
		for _, d := range dataOwners {
			if d.image == name {
				alts = append(alts, d.target)
			}
		}
		if len(alts) > 0 && !slices.ContainsFunc(alts, held) {
			targets = alts[:1]
			if (name == "postgres" || name == "postgis") && !pgBefore18(tag) {
				targets = alts[len(alts)-1:] // 18 and later: the parent
			}
		}
	}
	for _, t := range targets {
		t = path.Clean("/" + t)
		if held(t) {
			continue
		}
		if t == "/" || badTarget(t) {
			w.note(NoteAction, "its image %s keeps data at %q (VOLUME), which a manifest cannot mount: the node refuses a container whose image's VOLUME nothing holds; run an image without it", svc.Image, t)
			continue
		}
		p, fresh := w.path("image volume "+t, safeBase(t))
		if fresh {
			owner, mode := w.dirOwner(t)
			w.res("directory", p, "owner", owner, "mode", mode, "data", true)
			w.note(NoteCarried, "its image %s keeps data at %s (VOLUME), which no volume of it mounts: compose keeps that anonymous volume when it recreates the container -> data directory %s (owner %s, mode %s; kept when the module goes)", svc.Image, t, p, owner, mode)
		}
		w.mount(p, t, nil)
	}
}

// pgBefore18 says a postgres (or postgis) tag is of a release before 18,
// whose VOLUME is /var/lib/postgresql/data (18's is its parent): its
// leading number (15, 16-alpine, 17.2); a tag without one (latest,
// alpine) is taken for 18 or later.
func pgBefore18(tag string) bool {
	i := 0
	for i < len(tag) && tag[i] >= '0' && tag[i] <= '9' {
		i++
	}
	n, err := strconv.Atoi(tag[:i])
	return err == nil && n < 18
}

// badTarget says whether a container path cannot be written in a mount
// (HOST:CONTAINER[:OPTIONS]).
func badTarget(t string) bool { return strings.ContainsAny(t, ":,\n") }

// mount adds HOST:CONTAINER[:OPTIONS], once; one whose host path lies inside
// (or around) another writable one of the service is dropped, said: a
// container that can write the outer could swap the inner for a link.
func (w *writer) mount(src, target string, opts []string) {
	m := src + ":" + target
	if len(opts) > 0 {
		m += ":" + strings.Join(opts, ",")
	}
	if slices.Contains(w.mounts, m) {
		return
	}
	ro := slices.Contains(opts, "ro")
	for _, o := range w.mounts {
		osrc, _, _ := strings.Cut(o, ":")
		ors := strings.HasSuffix(o, ":ro") || strings.Contains(o, ":ro,")
		if osrc != src && (manifest.Within(src, osrc) && !ors || manifest.Within(osrc, src) && !ro) {
			w.note(NoteDropped, "mount %s at %s: dropped; it lies inside (or around) the writable mount %s, which the mesh refuses (mount one of them :ro, or mount only the outer)", src, target, o)
			return
		}
	}
	w.mounts = append(w.mounts, m)
}

// volumeKind says what a top-level volume's own settings meant, which a
// declared directory does not carry: an external volume's data lives in
// the engine, an NFS one on another machine.
func (w *writer) volumeKind(name, p string) {
	vc, ok := w.p.proj.Volumes[name]
	if !ok {
		return
	}
	if bool(vc.External) {
		w.note(NoteAction, "volume %s is external (made outside compose): its data is not carried; the directory %s starts empty: copy the volume's data there (podman volume export, or its mountpoint) before the first start", name, p)
	}
	if len(vc.DriverOpts) > 0 || vc.Driver != "" && vc.Driver != "local" {
		how := "its driver's"
		if t := vc.DriverOpts["type"]; t != "" {
			how = t
		}
		w.note(NoteAction, "volume %s is a %s mount (driver %q, driver_opts %s): not carried; mount it on the host of each node that runs the module at %s (e.g. in /etc/fstab) before the module starts", name, how, vc.Driver, js(vc.DriverOpts), p)
	}
}

func kindOf(m fs.FileMode) string {
	switch t := m.Type(); {
	case t&fs.ModeNamedPipe != 0:
		return "a named pipe"
	case t&fs.ModeSocket != 0:
		return "a socket"
	case t&fs.ModeDevice != 0:
		return "a device"
	}
	return "not a file or a directory"
}

// hostFile declares p as a file with src's content, when src is a small
// text file the import may read: inside the project's directory (a link
// leading out of it is never followed), or anywhere with --copy-host-files.
// what names the source in notes ("bind mount of the file X").
func (w *writer) hostFile(what, src, p, owner, mode string) bool {
	real, err := filepath.EvalSymlinks(src)
	inside := err == nil && manifest.Within(real, w.p.dir.real)
	switch {
	case err != nil:
		w.note(NoteDropped, "%s: not carried over (%v)", what, err)
		return false
	case !inside && w.p.dir.holds(src):
		w.note(NoteDropped, "%s: a link leading out of the project's directory (to %s): not followed, not copied; copy the file into the project, or declare it as a file with its content", what, real)
		return false
	case !inside && !w.p.opts.CopyHostFiles:
		w.note(NoteAction, "%s: outside the project's directory: not copied into the manifest, which every node replicates; pass --copy-host-files to copy it, or declare it as a file with its content", what)
		return false
	}
	b, err := readSmall(real, 64<<10)
	if err != nil {
		w.note(NoteDropped, "%s: not carried over (%v); copy it into a declared directory", what, err)
		return false
	}
	if !isText(b) {
		w.note(NoteDropped, "%s is not text (UTF-8 without control characters): not carried over; declare it as a file or copy it into a declared directory", what)
		return false
	}
	if !w.spend(len(b)) {
		w.note(NoteDropped, "%s: not copied; the manifest's copied files would pass %d KiB (a manifest is at most 1 MiB): copy it into a declared directory", what, maxCopied>>10)
		return false
	}
	w.res("file", p, "owner", owner, "mode", mode, "content", string(b))
	if m, err := strconv.ParseUint(mode, 8, 32); err != nil || m&0o004 == 0 {
		w.private = true
	}
	w.copied = append(w.copied, src)
	w.note(NoteCarried, "%s -> file %s with its content, copied (owner %s, mode %s); the content is now in the manifest, which every node replicates: keep secrets out of it", what, p, owner, mode)
	return true
}

// configs: each becomes a file with its content (from its file in the
// project, or inline), mounted read-only where compose puts it; one whose
// content is an environment variable's becomes a secret.
func (w *writer) configs(svc types.ServiceConfig) {
	for _, c := range svc.Configs {
		target := c.Target
		if target == "" {
			target = "/" + c.Source
		}
		if !path.IsAbs(target) {
			target = "/" + target
		}
		cfg := w.p.proj.Configs[c.Source]
		if cfg.Environment != "" && !bool(cfg.External) {
			// Its content is the value of a variable of the environment
			// the import runs in (a token, often): as a file's content it
			// would be in the manifest every node replicates, so it is a
			// secret, as a compose secret from the environment is.
			if _, again := w.sources["config "+c.Source]; !again {
				w.note(NoteCarried, "config %s takes its value from the environment variable %s: it becomes a secret, its value kept out of the manifest", c.Source, cfg.Environment)
			}
			set := func(name string) string { return w.setFrom(cfg.Environment, name) }
			if !w.secret("config", types.FileReferenceConfig(c), target, set) {
				return
			}
			continue
		}
		owner, mode := "0:0", "0444"
		if c.UID != "" || c.GID != "" {
			u, g := cmp.Or(c.UID, "0"), cmp.Or(c.GID, c.UID, "0")
			if _, _, err := manifest.ParseOwner(u + ":" + g); err == nil {
				owner = u + ":" + g
			} else {
				w.note(NoteDropped, "config %s: uid %q, gid %q: dropped (%v)", c.Source, c.UID, c.GID, err)
			}
		}
		if c.Mode != nil {
			mode = fmt.Sprintf("0%03o", uint32(*c.Mode)&0o7777)
		}
		if badTarget(target) {
			w.note(NoteDropped, "config %s at %q: not carried over; a mesh mount's container path may not hold ':', ',' or a newline", c.Source, target)
			continue
		}
		p, fresh := w.path("config "+c.Source, safeBase(c.Source))
		switch {
		case !fresh:
		case bool(cfg.External):
			w.note(NoteAction, "config %s is external (made outside compose): not carried; declare %s as a file with its content, and mount it at %s", c.Source, p, target)
			continue
		case cfg.File != "":
			// Without a mode of its own, a file others may not read stays
			// so, owned by the service's user unless uid/gid say (as a
			// bind-mounted file does).
			if st, err := os.Stat(cfg.File); err == nil && c.Mode == nil && st.Mode().Perm()&0o004 == 0 {
				mode = fmt.Sprintf("%04o", st.Mode().Perm()&0o444|0o400)
				if c.UID == "" && c.GID == "" {
					owner = w.owner
				}
			}
			if !w.hostFile("config "+c.Source+" (file "+cfg.File+")", cfg.File, p, owner, mode) {
				w.unclaim("config "+c.Source, p)
				continue
			}
		case cfg.Content != "" && isText([]byte(cfg.Content)) && len(cfg.Content) <= 64<<10 && w.spend(len(cfg.Content)):
			w.res("file", p, "owner", owner, "mode", mode, "content", cfg.Content)
			w.note(NoteCarried, "config %s -> file %s with its content (owner %s, mode %s)", c.Source, p, owner, mode)
		default:
			w.note(NoteDropped, "config %s: no file in the project, nor text content of at most 64 KiB: not carried; declare it as a file", c.Source)
			w.unclaim("config "+c.Source, p)
			continue
		}
		w.mounts = append(w.mounts, p+":"+path.Clean(target)+":ro")
	}
}

// maxCopied bounds the bytes of files one manifest carries (copied files,
// configs), under manifest.MaxSize with room for the rest and for escapes.
const maxCopied = 512 << 10

// spend takes n bytes of the manifest's budget for copied content.
func (w *writer) spend(n int) bool {
	if w.copiedBytes+n > maxCopied {
		return false
	}
	w.copiedBytes += n
	return true
}

// readSmall reads a regular file of at most max bytes, opened without
// following a link at its last component (EvalSymlinks resolved the rest).
func readSmall(p string, max int64) ([]byte, error) {
	f, err := os.OpenFile(p, os.O_RDONLY|syscall.O_NOFOLLOW|syscall.O_NONBLOCK, 0)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return nil, err
	}
	if !st.Mode().IsRegular() {
		return nil, fmt.Errorf("%s is %s", p, kindOf(st.Mode()))
	}
	if st.Size() > max {
		return nil, fmt.Errorf("a file over %d KiB", max>>10)
	}
	b, err := io.ReadAll(io.LimitReader(f, max+1))
	if err == nil && int64(len(b)) > max {
		err = fmt.Errorf("a file over %d KiB", max>>10)
	}
	return b, err
}

func (w *writer) device(s string) {
	if _, err := manifest.ParseDevice(s); err != nil {
		w.note(NoteDropped, "device %s: dropped (%v)", s, err)
		return
	}
	if !slices.Contains(w.devices, s) {
		w.devices = append(w.devices, s)
	}
}

func (w *writer) addTmpfs(t string) {
	if _, err := manifest.ParseTmpfs(t); err != nil {
		w.note(NoteDropped, "tmpfs %s: dropped (%v)", t, err)
		return
	}
	if !slices.Contains(w.tmpfs, t) {
		w.tmpfs = append(w.tmpfs, t)
	}
}

// secrets: each becomes a secret resource (its value set with mesh secret
// set, sealed to the nodes the module runs on), mounted where compose put
// it, owned and moded as compose says.
func (w *writer) secrets(svc types.ServiceConfig) {
	for _, s := range svc.Secrets {
		target := s.Target
		if target == "" {
			target = s.Source
		}
		if !path.IsAbs(target) {
			target = "/run/secrets/" + target
		}
		how := func(name string) string {
			if sc, ok := w.p.proj.Secrets[s.Source]; ok && sc.File != "" {
				return fmt.Sprintf("mesh secret set %s %s --from-file %s", w.module, name, sc.File)
			} else if ok && sc.Environment != "" {
				return w.setFrom(sc.Environment, name)
			}
			return fmt.Sprintf("printf '%%s' \"$VALUE\" | mesh secret set %s %s", w.module, name)
		}
		if !w.secret("secret", types.FileReferenceConfig(s), target, how) {
			return
		}
	}
}

// setFrom is the line that sets a mesh secret to the value of an
// environment variable.
func (w *writer) setFrom(variable, name string) string {
	return fmt.Sprintf("printf '%%s' \"$%s\" | mesh secret set %s %s", variable, w.module, name)
}

// secret declares one secret resource for a compose secret or config (kind)
// mounted at target, and says the mesh secret set line to run (how, given
// the mesh secret's name). It says false when the import must fail.
func (w *writer) secret(kind string, s types.FileReferenceConfig, target string, how func(name string) string) bool {
	dir, fresh := w.path("the module's secrets", "secrets")
	if fresh {
		w.res("directory", dir, "owner", w.owner, "mode", "0700")
	}
	name := secretName(s.Source)
	if !manifest.SecretNameRE.MatchString(name) {
		w.refuse("%s %q has no letter or digit to name a mesh secret with; rename it", kind, s.Source)
		return false
	}
	if badTarget(target) {
		w.note(NoteDropped, "%s %s at %q: not carried over; a mesh mount's container path may not hold ':', ',' or a newline", kind, s.Source, target)
		return true
	}
	if p, ok := w.sources[kind+" "+s.Source]; ok {
		// One secret at a second place: mounted there too.
		w.mounts = append(w.mounts, p+":"+path.Clean(target)+":ro")
		w.note(NoteCarried, "%s %s mounted at %s too", kind, s.Source, path.Clean(target))
		return true
	}
	p := filepath.Join(dir, name)
	for i := 2; w.paths[p] != ""; i++ {
		name = secretName(s.Source) + "-" + strconv.Itoa(i)
		p = filepath.Join(dir, name)
	}
	if name != secretName(s.Source) {
		w.note(NoteCarried, "%s %s is mesh secret %s: %s is another of its secrets' name", kind, s.Source, name, secretName(s.Source))
	}
	w.paths[p], w.sources[kind+" "+s.Source] = kind+" "+s.Source, p
	owner := w.owner
	if s.UID != "" || s.GID != "" {
		u, g := s.UID, s.GID
		if u == "" {
			u = "0"
		}
		if g == "" {
			g = u
		}
		if _, _, err := manifest.ParseOwner(u + ":" + g); err == nil {
			owner = u + ":" + g
		} else {
			w.note(NoteDropped, "%s %s: uid %q, gid %q: dropped (%v)", kind, s.Source, s.UID, s.GID, err)
		}
	}
	mode := "0600"
	if s.Mode != nil {
		m := uint32(*s.Mode) & 0o777
		switch {
		case m&0o077 != 0:
			w.note(NoteCarried, "%s %s: mode %04o lets group or others read it; the mesh keeps a secret its owner's alone: 0600", kind, s.Source, m)
		case m&0o200 == 0:
			mode = "0400"
		}
	}
	w.res("secret", p, "name", name, "owner", owner, "mode", mode)
	w.mounts = append(w.mounts, p+":"+path.Clean(target)+":ro")
	// A file mount keeps the file it found (a new value is a new file,
	// renamed over): under restart-on, a new value replaces the
	// container; without, it read the old value until something else
	// made it again.
	w.restartOn = append(w.restartOn, p)
	w.note(NoteAction, "%s %s -> secret %s (name %s, owner %s, mode %s) mounted at %s; once the module is added and assigned, set its value: %s", kind, s.Source, p, name, owner, mode, path.Clean(target), how(name))
	return true
}

// dependsOn: a binding to each dependency, so it is applied first on a node
// that runs both, and the service is recreated when it moves.
func (w *writer) dependsOn(svc types.ServiceConfig) {
	for _, d := range sortedKeys(svc.DependsOn) {
		dm, ok := w.p.modules[d]
		if !ok {
			// compose-go refuses a dependency on no service: d is one of
			// an inactive profile (required: false), not imported.
			w.note(NoteDropped, "depends_on %s: no binding; %s is not imported (its profile is not active)", d, d)
			continue
		}
		p, _ := w.path("binding "+d, dm+".binding")
		w.restartOn = append(w.restartOn, p)
		dep := svc.DependsOn[d]
		switch dep.Condition {
		case types.ServiceConditionHealthy:
			w.res("binding", p, "provider", dm, "healthy", true)
			w.note(NoteCarried, "depends_on %s (service_healthy) -> binding %s with healthy: true: the container starts once %s's instance it points at passes its health check", d, p, d)
		case types.ServiceConditionCompletedSuccessfully:
			w.res("binding", p, "provider", dm)
			w.note(NoteAction, "depends_on %s (service_completed_successfully) -> binding %s: the mesh does not wait for %s to finish; make what it does a step of this module (a step runs to its end before the containers start)", d, p, d)
		default:
			w.res("binding", p, "provider", dm)
			w.note(NoteCarried, "depends_on %s -> binding %s (applied after it, recreated when it moves)", d, p)
		}
		if dep.Restart {
			w.note(NoteCarried, "depends_on %s: restart: the binding's restart-on recreates this container when %s moves", d, d)
		}
	}
}

// rename replaces, in a command, the hosts that name services whose module
// is another name (--prefix, or a service plausible_db that is module
// plausible-db): never its first word (a program), only a URL's host, a
// HOST:PORT, and a word that follows a flag naming a host (-h, --host,
// --redis-host).
func (w *writer) rename(key string, args []string) []string {
	if !w.p.renamed || len(args) == 0 {
		return args
	}
	out := w.p.argHosts(args, nil)
	for i := range args {
		if out[i] != args[i] {
			w.note(NoteCarried, "%s %q -> %q (the services' module names)", key, args[i], out[i])
		}
	}
	return out
}

// argHosts is hosts for a command's words: never its first (a program), a
// word after a flag (-h db) read with that flag as its key.
func (p *project) argHosts(args []string, seen map[string]bool) []string {
	out := slices.Clone(args)
	for i := 1; i < len(args); i++ {
		flag := ""
		if strings.HasPrefix(args[i-1], "-") && !strings.Contains(args[i-1], "=") {
			flag = args[i-1]
		}
		out[i] = p.hosts(flag, args[i], seen)
	}
	return out
}

// renameValue is rename for one environment value, its key saying whether
// a lone word in it is a host (DB_HOST: db, REDIS_ADDR, *_SERVER).
func (w *writer) renameValue(key, v string) string {
	if !w.p.renamed {
		return v
	}
	return w.p.hosts(key, v, nil)
}

var (
	// tokenRE is a word of a value: separated by spaces, commas or
	// semicolons.
	tokenRE = regexp.MustCompile(`[^\s,;]+`)
	// urlRE is a URL's scheme and user part, then its host.
	urlRE = regexp.MustCompile(`^([A-Za-z][A-Za-z0-9+.-]*://(?:[^@/?#]*@)?)([A-Za-z0-9_.-]+)(.*)$`)
	// hostPortRE is HOST:PORT, or [FLAG=]HOST:PORT.
	hostPortRE = regexp.MustCompile(`^([A-Za-z0-9_.-]+)(:[0-9]{1,5})((?:/.*)?)$`)
)

// hostKey says whether an env key or a flag names a host, so that a lone
// word after it is one.
func hostKey(k string) bool {
	u := strings.ToUpper(strings.TrimLeft(k, "-"))
	return k == "-h" || strings.Contains(u, "HOST") || strings.Contains(u, "ADDR") || strings.Contains(u, "SERVER") || strings.Contains(u, "ENDPOINT")
}

// hosts finds, in a value, the services it names as hosts (a URL's host,
// HOST:PORT, or a lone word when key names a host) and, when the service's
// module has another name, writes the module's; seen, when set, collects
// the services named (their dependants must reach them).
func (p *project) hosts(key, v string, seen map[string]bool) string {
	service := func(h string) (string, bool) {
		if _, ok := p.proj.Services[h]; ok {
			return h, true
		}
		return "", false
	}
	sub := func(h string) string {
		if n, ok := service(h); ok {
			if seen != nil {
				seen[n] = true
			}
			return p.modules[n]
		}
		return h
	}
	return tokenRE.ReplaceAllStringFunc(v, func(tok string) string {
		k := key
		prefix := ""
		if f, rest, ok := strings.Cut(tok, "="); ok && !strings.Contains(f, "://") && !strings.Contains(f, "/") {
			k, prefix, tok = f, f+"=", rest
		}
		if m := urlRE.FindStringSubmatch(tok); m != nil {
			return prefix + m[1] + sub(m[2]) + m[3]
		}
		if m := hostPortRE.FindStringSubmatch(tok); m != nil {
			return prefix + sub(m[1]) + m[2] + m[3]
		}
		if hostKey(k) {
			return prefix + sub(tok)
		}
		return prefix + tok
	})
}

// restart maps compose's restart (or deploy.restart_policy, which docker
// compose applies when restart is not set) to the mesh's.
func (w *writer) restart(svc types.ServiceConfig) string {
	r := svc.Restart
	if rp := deployOf(svc).RestartPolicy; rp != nil {
		if r == "" {
			switch rp.Condition {
			case "any", "":
				r = "always"
			case "on-failure":
				r = "on-failure"
			case "none":
				r = "no"
			}
			w.note(NoteCarried, "deploy.restart_policy condition %q -> restart %s", rp.Condition, r)
		}
		if rp.MaxAttempts != nil || rp.Delay != nil || rp.Window != nil {
			w.note(NoteDropped, "deploy.restart_policy max_attempts, delay and window: dropped; Podman restarts at once, without a count")
		}
	}
	switch {
	case r == "":
		w.note(NoteCarried, "restart: none given; the mesh keeps containers running (restart always)")
		return ""
	case strings.HasPrefix(r, "on-failure:"):
		w.note(NoteDropped, "restart %s: the count %s is dropped; the mesh restarts on failure without a count", r, strings.TrimPrefix(r, "on-failure:"))
		return "on-failure"
	case r != "no" && r != "always" && r != "on-failure" && r != "unless-stopped":
		w.note(NoteDropped, "restart %q: dropped; not one of no, always, on-failure, unless-stopped (the mesh keeps it running)", r)
		return ""
	}
	return r
}

// deployOf is the service's deploy section, empty when it has none.
func deployOf(svc types.ServiceConfig) types.DeployConfig {
	if svc.Deploy == nil {
		return types.DeployConfig{}
	}
	return *svc.Deploy
}

// limits carries memory, CPU and process limits and names the ones the mesh
// does not set.
func (w *writer) limits(svc types.ServiceConfig, add func(string, any)) {
	mem, cpus, pids := int64(svc.MemLimit), float64(svc.CPUS), svc.PidsLimit
	d := deployOf(svc)
	if l := d.Resources.Limits; l != nil {
		if mem == 0 && l.MemoryBytes > 0 {
			mem = int64(l.MemoryBytes)
		}
		if cpus == 0 && l.NanoCPUs > 0 {
			cpus = float64(l.NanoCPUs.Value())
		}
		if pids == 0 && l.Pids > 0 {
			pids = l.Pids
		}
	}
	if mem > 0 {
		if _, err := manifest.ParseMemory(strconv.FormatInt(mem, 10)); err != nil {
			w.note(NoteDropped, "memory limit %d bytes: dropped (%v)", mem, err)
		} else {
			add("memory", strconv.FormatInt(mem, 10))
		}
	}
	switch c := math.Round(cpus*100) / 100; {
	case cpus <= 0:
	case c < 0.01 || c > 1024:
		w.note(NoteDropped, "cpus %.4g: dropped; not between 0.01 and 1024", cpus)
	default:
		add("cpus", c)
	}
	switch {
	case pids <= 0:
	case pids > manifest.MaxPidsLimit:
		w.note(NoteDropped, "pids_limit %d: dropped; over %d, the kernel's bound", pids, manifest.MaxPidsLimit)
	default:
		add("pids-limit", pids)
	}
	if r := d.Resources.Reservations; r != nil {
		if len(r.Devices) > 0 || len(r.GenericResources) > 0 {
			w.note(NoteAction, "deploy.resources.reservations.devices (a GPU): dropped; list the GPU's device nodes under devices: (e.g. /dev/dri, or /dev/nvidia0, /dev/nvidiactl, /dev/nvidia-uvm) and assign the module to a node that has it")
		}
		if r.MemoryBytes > 0 || r.NanoCPUs > 0 {
			w.note(NoteDropped, "deploy.resources.reservations memory and cpus: dropped; the mesh reserves nothing (memory: and cpus: are limits)")
		}
	}
	say := func(set bool, key string) {
		if set {
			w.note(NoteDropped, "%s: dropped; the mesh sets memory, cpus and pids-limit only", key)
		}
	}
	say(svc.MemReservation > 0, "mem_reservation")
	say(svc.MemSwapLimit != 0, "memswap_limit")
	say(svc.MemSwappiness != 0, "mem_swappiness")
	say(svc.CPUShares != 0, "cpu_shares")
	say(svc.CPUQuota != 0 || svc.CPUPeriod != 0, "cpu_quota/cpu_period")
	say(svc.CPUSet != "", "cpuset")
	say(svc.CPUCount != 0 || svc.CPUPercent != 0, "cpu_count/cpu_percent")
	say(svc.CPURTPeriod != 0 || svc.CPURTRuntime != 0, "cpu_rt_period/cpu_rt_runtime")
	say(svc.OomKillDisable, "oom_kill_disable")
	say(svc.OomScoreAdj != 0, "oom_score_adj")
	say(svc.BlkioConfig != nil, "blkio_config")
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
// at its node's address (the name answers that). A service others depend on
// that publishes nothing is published at the ports its image exposes, or
// its software's well-known port; else each dependant's edge is named.
func (w *writer) ports(ctx context.Context, svc types.ServiceConfig) []string {
	var out, published, targets []string
	seen := map[string]bool{}
	hostPort := map[string]string{} // "8080/tcp" -> the entry publishing it
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
			w.note(NoteCarried, "port %d has no published port; published at %s on the node (compose would pick one at random)", p.Target, pub)
		}
		if strings.Contains(pub, "-") {
			w.note(NoteDropped, "port range %s: not carried over; list each port", pub)
			continue
		}
		if !w.port("ports: published", pub, proto) {
			continue
		}
		s := pub + ":" + strconv.Itoa(int(p.Target)) + "/" + proto
		if p.HostIP != "" {
			w.note(NoteCarried, "port %s was published on %s; in the mesh ports: answer on the node's overlay address only", s, p.HostIP)
		}
		if p.Mode == "host" || p.Name != "" || p.AppProtocol != "" {
			w.note(NoteDropped, "port %s: mode, name and app_protocol dropped", s)
		}
		if seen[s] {
			continue
		}
		if other := hostPort[pub+"/"+proto]; other != "" {
			w.note(NoteDropped, "port %s: dropped; host port %s/%s is %s's already (a node publishes a port once)", s, pub, proto, other)
			continue
		}
		seen[s], hostPort[pub+"/"+proto] = true, s
		out = append(out, s)
		published = append(published, pub)
		if t := strconv.Itoa(int(p.Target)); t != pub && len(w.p.dependants[w.svc]) > 0 {
			targets = append(targets, t+":"+t+"/"+proto)
		}
	}
	// Compose's services reach each other at the container's port (api:3000
	// where ports: says 8080:3000); in the mesh a name answers with the
	// node's address, so that port is published too.
	for _, t := range targets {
		hp := strings.SplitN(t, ":", 2)[0] + "/" + t[strings.LastIndex(t, "/")+1:]
		if seen[t] || hostPort[hp] != "" {
			w.note(NoteAction, "%s reach it at its container's port %s under compose; that host port is taken here, so they must use the published one", strings.Join(w.p.dependants[w.svc], ", "), t)
			continue
		}
		seen[t], hostPort[hp] = true, t
		out = append(out, t)
		w.note(NoteCarried, "port %s published too inside the mesh: under compose %s reach it at its container's port", t, strings.Join(w.p.dependants[w.svc], ", "))
	}
	if len(published) > 0 {
		w.note(NoteAction, "ports %s answer inside the mesh only (on the node's overlay address); move to public-ports: those the world must reach", strings.Join(published, ", "))
	}
	for _, e := range svc.Expose {
		port, proto, _ := strings.Cut(e, "/")
		proto = strings.ToLower(proto)
		if proto == "" {
			proto = "tcp"
		}
		if strings.Contains(port, "-") {
			w.note(NoteDropped, "expose range %s: not carried over; list each port", e)
			continue
		}
		if !w.port("expose", port, proto) {
			continue
		}
		s := port + ":" + port + "/" + proto
		if seen[s] {
			continue
		}
		if other := hostPort[port+"/"+proto]; other != "" {
			w.note(NoteDropped, "expose %s: not published at %s; that host port is %s's (a node publishes a port once)", e, port, other)
			continue
		}
		seen[s], hostPort[port+"/"+proto] = true, s
		out = append(out, s)
		w.note(NoteCarried, "expose %s -> published at %s on the node, where the name %s answers", e, port, w.module)
	}
	deps := w.p.dependants[w.svc]
	if len(out) > 0 || len(deps) == 0 {
		return out
	}
	// Compose's services reach each other on any port; the mesh's, on the
	// published ones only.
	var found []string
	from := ""
	if w.inspected {
		for _, e := range w.image.Ports {
			port, proto, _ := strings.Cut(e, "/")
			if proto == "" {
				proto = "tcp"
			}
			if n, err := strconv.Atoi(port); err == nil && n > 0 && n < 65536 && (proto == "tcp" || proto == "udp") {
				found = append(found, port+":"+port+"/"+proto)
			}
		}
		from = "the ports its image exposes"
	}
	if len(found) == 0 {
		if p, sw := wellKnownPort(svc.Image); p != 0 {
			found = []string{strconv.Itoa(p) + ":" + strconv.Itoa(p) + "/tcp"}
			from = "the well-known port of " + sw
		}
	}
	if len(found) > 0 {
		slices.Sort(found)
		found = slices.Compact(found)
		w.note(NoteCarried, "published at %s inside the mesh (%s), for %s to reach it: compose's services reach each other on any port, the mesh's on published ones", strings.Join(found, ", "), from, strings.Join(deps, ", "))
		return found
	}
	for _, d := range deps {
		w.note(NoteAction, "%s depends on it, but it publishes no port and its image's ports are not known here: add the port %s connects to under ports: of %s.main (\"PORT:PORT/tcp\"), or %s cannot reach it", d, d, w.module, d)
	}
	return out
}

// wellKnown maps an image's name (its last path element, no tag) to the port
// its software listens on.
var wellKnown = map[string]int{
	"postgres": 5432, "postgis": 5432, "timescaledb": 5432, "pgvector": 5432, "pgvecto-rs": 5432,
	"mysql": 3306, "mariadb": 3306, "percona": 3306,
	"redis": 6379, "valkey": 6379, "keydb": 6379, "redis-stack-server": 6379,
	"mongo": 27017, "memcached": 11211, "rabbitmq": 5672,
	"elasticsearch": 9200, "opensearch": 9200, "meilisearch": 7700, "typesense": 8108,
	"clickhouse-server": 8123, "minio": 9000, "nats": 4222, "etcd": 2379,
	"zookeeper": 2181, "kafka": 9092, "influxdb": 8086, "couchdb": 5984,
	"cassandra": 9042, "neo4j": 7687, "qdrant": 6333, "ollama": 11434,
	"gotenberg": 3000, "tika": 9998, "nginx": 80, "httpd": 80, "caddy": 80,
	"immich-machine-learning": 3003,
}

func wellKnownPort(image string) (int, string) {
	name, _ := imageName(image)
	return wellKnown[name], name
}

// imageName is an image reference's last path element and its tag:
// docker.io/library/postgres:16-alpine is postgres, 16-alpine.
func imageName(image string) (name, tag string) {
	name, _, _ = strings.Cut(image, "@")
	name = name[strings.LastIndex(name, "/")+1:]
	name, tag, _ = strings.Cut(name, ":")
	return name, tag
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
	if len(cmd) == 0 || cmd[0] == "" {
		w.note(NoteDropped, "healthcheck %q: dropped; it names no command", []string(h.Test))
		return nil
	}
	// Compose's defaults, which differ from the mesh's (10s): a check
	// healthy under compose stays healthy here.
	out := map[string]any{"command": cmd, "interval": "30s", "timeout": "30s", "retries": 3}
	dur := func(k string, d *types.Duration, least time.Duration) time.Duration {
		if d == nil || *d <= 0 {
			v, _ := time.ParseDuration(fmt.Sprint(out[k]))
			return v
		}
		v := time.Duration(*d)
		if c := min(max(v, least), 24*time.Hour); c != v {
			w.note(NoteCarried, "healthcheck %s %s: set to %s (the mesh takes %s to 24h)", k, v, c, least)
			v = c
		}
		out[k] = v.String()
		return v
	}
	iv := dur("interval", h.Interval, time.Second)
	to := dur("timeout", h.Timeout, time.Second)
	dur("start-period", h.StartPeriod, 0)
	if h.Retries != nil && *h.Retries > 0 {
		out["retries"] = min(*h.Retries, 100)
		if *h.Retries > 100 {
			w.note(NoteCarried, "healthcheck retries %d: set to 100, the most the mesh takes", *h.Retries)
		}
	}
	if to > iv {
		out["timeout"] = iv.String()
		if h.Timeout != nil && *h.Timeout > 0 {
			w.note(NoteCarried, "healthcheck timeout %s longer than its interval %s: set to the interval", to, iv)
		}
	}
	if h.StartInterval != nil {
		w.note(NoteDropped, "healthcheck start_interval: dropped; the check runs every interval from the start (start-period still forgives its failures)")
	}
	return out
}

// carried lists the compose keys of a service the writer reads (carried, or
// said in a note of its own); dropped names every other key a service sets,
// so none is dropped without a line.
var carried = map[string]bool{
	"name": true, "image": true, "build": true, "entrypoint": true, "command": true,
	"environment": true, "env_file": true, "label_file": true, "volumes": true, "secrets": true,
	"depends_on": true, "ports": true, "expose": true, "restart": true, "deploy": true,
	"healthcheck": true, "user": true, "working_dir": true, "cap_add": true, "cap_drop": true,
	"devices": true, "read_only": true, "tmpfs": true, "mem_limit": true, "cpus": true,
	"pids_limit": true, "tty": true, "init": true, "group_add": true, "stop_signal": true,
	"stop_grace_period": true, "labels": true, "profiles": true, "extends": true,
	"mem_reservation": true, "memswap_limit": true, "mem_swappiness": true, "cpu_shares": true,
	"cpu_quota": true, "cpu_period": true, "cpuset": true, "cpu_count": true, "cpu_percent": true,
	"cpu_rt_period": true, "cpu_rt_runtime": true, "oom_kill_disable": true, "oom_score_adj": true,
	"blkio_config": true,
	// said by dropped below, with what to do instead
	"network_mode": true, "networks": true, "privileged": true, "links": true, "external_links": true,
	"container_name": true, "hostname": true, "extra_hosts": true, "dns": true, "dns_search": true,
	"dns_opt": true, "configs": true, "volumes_from": true, "ulimits": true, "sysctls": true,
	"security_opt": true, "logging": true, "scale": true, "pull_policy": true, "shm_size": true,
	"gpus": true, "runtime": true, "platform": true, "stdin_open": true, "pid": true, "ipc": true,
}

// deployCarried lists the deploy keys the writer reads.
var deployCarried = map[string]bool{"resources": true, "restart_policy": true, "replicas": true}

// dropped names what compose sets and the manifest cannot carry.
func (w *writer) dropped(svc types.ServiceConfig) {
	say := func(set bool, what, instead string) {
		if set {
			w.note(NoteDropped, "%s: dropped; %s", what, instead)
		}
	}
	say(svc.NetworkMode == "host", "network_mode: host", "publish the ports it listens on (ports:), the mesh runs every container on Podman's network")
	say(svc.NetworkMode != "" && svc.NetworkMode != "host", "network_mode: "+svc.NetworkMode, "containers reach each other by their module names")
	say(len(svc.Networks) > 0 && !onlyDefault(svc.Networks), "networks", "every container reaches every module by its name; no network is needed")
	for _, n := range sortedKeys(svc.Networks) {
		if c := svc.Networks[n]; c != nil && len(c.Aliases) > 0 {
			say(true, "network aliases "+strings.Join(c.Aliases, ", "), "others reach it as "+w.module+" (a module answers to its name only)")
		}
	}
	say(svc.Privileged, "privileged", "add only the capabilities it needs (cap-add) and the devices (devices)")
	say(len(svc.Links) > 0, "links", "a service reaches another by its module name")
	say(len(svc.ExternalLinks) > 0, "external_links", "a service reaches another by its module name")
	say(svc.ContainerName != "", "container_name", "the container is "+w.module+".main")
	say(svc.Hostname != "", "hostname", "the module's name is how others reach it")
	say(len(svc.ExtraHosts) > 0, "extra_hosts", "the mesh's resolver answers the mesh's names; nothing about the roster is copied into a container")
	say(len(svc.DNS) > 0 || len(svc.DNSSearch) > 0 || len(svc.DNSOpts) > 0, "dns settings", "every container asks the node's resolver")
	say(len(svc.VolumesFrom) > 0, "volumes_from", "mount the same declared directory")
	say(len(svc.Ulimits) > 0, "ulimits", "the mesh sets none; Podman's defaults apply")
	say(len(svc.Sysctls) > 0, "sysctls", "the mesh sets none")
	say(len(svc.SecurityOpt) > 0, "security_opt", "the mesh sets none")
	say(svc.Logging != nil, "logging", "Podman's default log driver is used (log-max-size bounds it)")
	say(svc.Scale != nil && *svc.Scale > 1, "scale", "assign the module to several nodes")
	say(svc.Deploy != nil && svc.Deploy.Replicas != nil && *svc.Deploy.Replicas > 1, "deploy.replicas", "assign the module to several nodes")
	if svc.Scale != nil && *svc.Scale == 0 || svc.Deploy != nil && svc.Deploy.Replicas != nil && *svc.Deploy.Replicas == 0 {
		w.note(NoteAction, "scale 0: compose does not start it; the mesh runs a module wherever it is assigned: do not assign %s until it should run", w.module)
	}
	if svc.Deploy != nil {
		for _, k := range unknownKeys(reflect.ValueOf(*svc.Deploy), deployCarried) {
			say(true, "deploy."+k, "the mesh places a module where it is assigned, one instance a node")
		}
	}
	for _, n := range sortedKeys(svc.Networks) {
		if c := svc.Networks[n]; c != nil {
			for _, k := range unknownKeys(reflect.ValueOf(*c), map[string]bool{"aliases": true}) {
				say(true, "networks."+n+"."+k, "the mesh gives each container Podman's address; others reach it by its module's name")
			}
		}
	}
	say(svc.PullPolicy != "", "pull_policy", "set pull: always or newer if needed")
	say(svc.ShmSize > 0, "shm_size", "the mesh sets none; mount a tmpfs at /dev/shm (tmpfs: [\"/dev/shm:size=N\"]) if it needs more")
	say(len(svc.Gpus) > 0, "gpus", "list the GPU's device nodes under devices: (e.g. /dev/nvidia0, /dev/nvidiactl, /dev/nvidia-uvm, or /dev/dri)")
	say(svc.Runtime != "", "runtime "+svc.Runtime, "the node's Podman runs every container with its own runtime; for a GPU list its devices")
	say(svc.Platform != "", "platform "+svc.Platform, "the node pulls the image for its own architecture")
	say(svc.StdinOpen, "stdin_open", "a container's input is closed; use mesh exec -i for an interactive command")
	say(svc.Pid != "", "pid: "+svc.Pid, "the container keeps its own process namespace")
	say(svc.Ipc != "", "ipc: "+svc.Ipc, "the container keeps its own IPC namespace")
	for _, k := range unknownKeys(reflect.ValueOf(svc), carried) {
		say(true, k, "the import does not carry it")
	}
}

// unknownKeys lists the keys a service sets (a non-zero field, embedded
// structs walked) that the writer does not read.
func unknownKeys(v reflect.Value, carried map[string]bool) []string {
	var out []string
	t := v.Type()
	for i := range t.NumField() {
		f := t.Field(i)
		if f.Anonymous && f.Type.Kind() == reflect.Struct {
			out = append(out, unknownKeys(v.Field(i), carried)...)
			continue
		}
		key, _, _ := strings.Cut(f.Tag.Get("yaml"), ",")
		if key == "" || key == "-" || strings.HasPrefix(key, "#") || carried[key] {
			continue
		}
		if !v.Field(i).IsZero() {
			out = append(out, key)
		}
	}
	return out
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

// isText says whether b is text a manifest carries as it is: valid UTF-8
// (JSON would replace a bad byte), no control character but tab, newline
// and carriage return (each would be six bytes escaped).
func isText(b []byte) bool {
	if !utf8.Valid(b) {
		return false
	}
	for _, c := range b {
		if c < 0x20 && c != '\t' && c != '\n' && c != '\r' || c == 0x7f {
			return false
		}
	}
	return true
}
