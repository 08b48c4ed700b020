// Package manifest parses and checks module manifests (DESIGN.md, "The manifest").
//
// It is pure: bytes in, a Manifest or positioned errors out. It never reads the
// catalogue itself; checks that need other modules (a binding's provider) take
// a lookup function. Every error carries the file and line it is about and a
// sentence that says what to do.
package manifest

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"path"
	"path/filepath"
	"regexp"
	"slices"
	"sort"
	"strings"
	"time"

	"github.com/goccy/go-yaml"
	"github.com/goccy/go-yaml/ast"
	"github.com/goccy/go-yaml/lexer"
	"github.com/goccy/go-yaml/parser"
	"github.com/goccy/go-yaml/token"
)

// Kinds of resource, as they are spelled in a manifest.
const (
	KindDirectory  = "directory"
	KindFile       = "file"
	KindRoutesFile = "routes-file"
	KindBinding    = "binding"
	KindCredential = "credential"
	// KindSecret is a file holding an operator's secret (`mesh secret set`),
	// delivered from the replica where the module runs.
	KindSecret    = "secret"
	KindStep      = "step"
	KindContainer = "container"
)

// Bounds on what is parsed at all, checked on the tokens before the parser
// builds a tree (its cost grows with the square of the nesting depth). A
// manifest is a small, shallow document; these are far above any real one.
const (
	// MaxSize is the largest manifest accepted, so that a stray binary file
	// given to `mesh module add` is refused before it is parsed.
	MaxSize = 1 << 20
	// MaxDepth is the deepest nesting of mappings and sequences accepted.
	MaxDepth = 32
	// MaxTokens is the most YAML tokens accepted.
	MaxTokens = 100000
)

// Manifest is one module's declaration.
type Manifest struct {
	Module             string     `yaml:"module" json:"module" jsonschema:"required"`
	Routes             []Route    `yaml:"routes,omitempty" json:"routes,omitempty"`
	AcceptsCredentials string     `yaml:"accepts-credentials,omitempty" json:"accepts-credentials,omitempty"`
	Resources          []Resource `yaml:"resources,omitempty" json:"resources,omitempty"`
	// Update is how a change to the module rolls out over its nodes.
	Update *Update `yaml:"update,omitempty" json:"update,omitempty" jsonschema:"description=How a change rolls out over the module's nodes: max-parallel nodes at a time, each healthy for healthy-for before the next; auto-revert goes back to the previous version when one fails. The defaults (1, 10s, true) apply to a module on several nodes with a health check"`
	// Backup is when the module's data directories are copied to the
	// mesh's restic repository, and which copies are kept (backup.go).
	Backup *Backup `yaml:"backup,omitempty" json:"backup,omitempty" jsonschema:"description=Backups of the module's data directories (data: true) to the mesh's restic repository: on schedule: (daily or hourly or weekly or every 6h or a cron line in UTC)\\, keeping the snapshots keep: names\\, with the module's containers paused during the copy when pause: is true; a step with before-backup: true runs first"`

	// Digest is the sha256 of the manifest text, hex.
	Digest string `yaml:"-" json:"-"`
	// File is the name the manifest was read from, used in error messages.
	File string `yaml:"-" json:"-"`
	// Lines holds the line of each resource, by index, for messages. It
	// travels with the parsed form, so a check made after the log carried
	// the manifest still names the line.
	Lines []int `yaml:"-" json:"lines,omitempty"`

	// bindsTo and takesFrom are the modules its bindings and its
	// credentials name, in the order of its resources, once Parse or
	// IndexProviders found them (indexed, with heads); otherwise its resources
	// are walked. Composition asks them of every module on a node with
	// every command, and each walk read every resource's declaration.
	bindsTo, takesFrom []string
	indexed            bool
	// heads are what composition reads of each resource with every
	// command, once IndexProviders made them (else made at each ask).
	heads []Head
}

// Head is what composition reads of a resource with every command that
// composes its node: kept in one array per manifest, apart from the
// declarations (1.2 kB each), which a node of 100 modules has 500 of:
// at 10,000 modules reading them from memory was most of composing a
// node (issue "scale").
type Head struct {
	Kind, Name string
	// Secrets are the module's secrets it reads (SecretNames).
	Secrets []string
	Content string
}

// Heads are m's resources' heads, in order.
func (m *Manifest) Heads() []Head {
	if m.indexed {
		return m.heads
	}
	return m.headsOf()
}

func (m *Manifest) headsOf() []Head {
	hs := make([]Head, len(m.Resources))
	for i := range m.Resources {
		r := &m.Resources[i]
		k, n := r.kindName()
		hs[i] = Head{Kind: k, Name: n, Secrets: r.SecretNames(), Content: r.Content}
	}
	return hs
}

// SecretNames are the module's secrets r reads, sorted: the one a secret
// file holds and those its env-secrets name.
func (r *Resource) SecretNames() []string {
	var out []string
	if r.Kind() == KindSecret && r.SecretName != "" {
		out = append(out, r.SecretName)
	}
	for _, n := range r.EnvSecrets {
		out = append(out, n)
	}
	sort.Strings(out)
	return slices.Compact(out)
}

// BindingProviders are the modules m's bindings name, in the order of its
// resources.
func (m *Manifest) BindingProviders() []string {
	if m.indexed {
		return m.bindsTo
	}
	return m.providersOf(KindBinding)
}

// CredentialProviders are the modules m's credentials are taken from, in
// the order of its resources.
func (m *Manifest) CredentialProviders() []string {
	if m.indexed {
		return m.takesFrom
	}
	return m.providersOf(KindCredential)
}

// IndexProviders keeps what BindingProviders and CredentialProviders
// give: for a manifest decoded from its parsed form, before it is shared
// (a manifest is never changed after).
// One already indexed is left as it is (never written twice).
func (m *Manifest) IndexProviders() {
	if !m.indexed {
		m.bindsTo, m.takesFrom, m.heads, m.indexed = m.providersOf(KindBinding), m.providersOf(KindCredential), m.headsOf(), true
	}
}

func (m *Manifest) providersOf(kind string) []string {
	var out []string
	for i := range m.Resources {
		if r := &m.Resources[i]; r.Kind() == kind {
			out = append(out, r.Provider)
		}
	}
	return out
}

// Pull policies.
const (
	PullMissing = "missing"
	PullAlways  = "always"
	PullNewer   = "newer"
)

// Update is a module's rollout policy (issue 29).
type Update struct {
	MaxParallel int    `yaml:"max-parallel,omitempty" json:"max-parallel,omitempty" jsonschema:"minimum=1,maximum=1000"`
	HealthyFor  string `yaml:"healthy-for,omitempty" json:"healthy-for,omitempty" jsonschema:"description=How long the changed containers of a node stay healthy before the next node changes (e.g. 10s)"`
	AutoRevert  *bool  `yaml:"auto-revert,omitempty" json:"auto-revert,omitempty"`
}

// Route makes NAME.<node's public domain> point at the node the module runs on.
type Route struct {
	Name string `yaml:"name" json:"name" jsonschema:"required"`
	Port int    `yaml:"port" json:"port" jsonschema:"required,minimum=1,maximum=65535"`
	// Hosts are whole host names the route is served at too, on whichever
	// node the module runs, besides NAME under each of the node's public
	// domains (issue 28: one module at git.example.org and code.example.com).
	Hosts []string `yaml:"hosts,omitempty" json:"hosts,omitempty" jsonschema:"description=Whole host names the route is also served at (e.g. code.example.com), besides NAME under each public domain of its node"`
}

// Resource is one entry of `resources:`. Exactly one of the kind keys is set.
type Resource struct {
	Directory  string `yaml:"directory,omitempty" json:"directory,omitempty"`
	File       string `yaml:"file,omitempty" json:"file,omitempty"`
	RoutesFile string `yaml:"routes-file,omitempty" json:"routes-file,omitempty"`
	Binding    string `yaml:"binding,omitempty" json:"binding,omitempty"`
	Credential string `yaml:"credential,omitempty" json:"credential,omitempty"`
	Secret     string `yaml:"secret,omitempty" json:"secret,omitempty" jsonschema:"description=A file holding the module's secret named by name: (set with mesh secret set MODULE NAME); mode 0600 unless mode: says otherwise (never readable by others)"`
	Step       string `yaml:"step,omitempty" json:"step,omitempty"`
	Container  string `yaml:"container,omitempty" json:"container,omitempty"`

	Owner    string `yaml:"owner,omitempty" json:"owner,omitempty"`
	Mode     string `yaml:"mode,omitempty" json:"mode,omitempty"`
	Content  string `yaml:"content,omitempty" json:"content,omitempty"`
	Provider string `yaml:"provider,omitempty" json:"provider,omitempty"`
	// SecretName, on a secret, is the module's secret it holds.
	SecretName string `yaml:"name,omitempty" json:"name,omitempty" jsonschema:"description=On a secret: the name of the module's secret it holds (mesh secret set MODULE NAME)"`
	// Template, on a routes-file, is a text/template the node's routing
	// table is written through (RoutesData), in the proxy's own format.
	Template string `yaml:"template,omitempty" json:"template,omitempty" jsonschema:"description=On a routes-file: a Go text/template executed with .Routes (Name Module Port) .Node .Address .Domain .MeshDomain; the file is written in the proxy's own format instead of JSON"`

	Image   string            `yaml:"image,omitempty" json:"image,omitempty"`
	Command []string          `yaml:"command,omitempty" json:"command,omitempty"`
	Env     map[string]string `yaml:"env,omitempty" json:"env,omitempty"`
	// EnvSecrets puts the module's secrets into the process's environment:
	// variable -> secret name. Podman never holds them (podman inspect
	// does not show them).
	EnvSecrets map[string]string `yaml:"env-secrets,omitempty" json:"env-secrets,omitempty" jsonschema:"description=VAR: SECRET-NAME: the module's secret (mesh secret set MODULE NAME) in the process's environment; podman inspect does not show it; the container is replaced when the secret changes"`
	Mounts     []string          `yaml:"mounts,omitempty" json:"mounts,omitempty"`
	Ports      []string          `yaml:"ports,omitempty" json:"ports,omitempty" jsonschema:"description=HOST:CONTAINER[/udp]: published on the node's overlay address only (its mesh address when the overlay is off): reachable from inside the mesh"`
	// PublicPorts are published on every interface (or the IP they name):
	// what the world must reach.
	PublicPorts []string `yaml:"public-ports,omitempty" json:"public-ports,omitempty" jsonschema:"description=[IP:]HOST:CONTAINER[/udp]: published on every interface (or the IP named): what the world reaches"`
	Restart     string   `yaml:"restart,omitempty" json:"restart,omitempty"`
	RestartOn   []string `yaml:"restart-on,omitempty" json:"restart-on,omitempty"`
	// Pull is when the image is fetched: missing (default: only when it is
	// not in local storage), always or newer (when a container or step is
	// created or replaced: always pulls, newer pulls when the registry has
	// another image under the name).
	Pull string `yaml:"pull,omitempty" json:"pull,omitempty" jsonschema:"enum=missing,enum=always,enum=newer,description=When the image is fetched: missing (default) or always/newer at each create or replace; mesh module pull fetches at once and replaces what changed"`

	// TakeOver lets the module take over a file that exists and that the
	// mesh did not write: its bytes are kept in the node's data dir and put
	// back when the module no longer declares the file. Without it such a
	// file makes the module fail, and nothing is written.
	TakeOver bool `yaml:"take-over,omitempty" json:"take-over,omitempty" jsonschema:"description=Take over a file that exists and that the mesh did not write (its original is kept in the node's data dir), or a directory the mesh did not make whose owner or mode differ (they are recorded); either is put back when the module lets go of it"`
	// Schedule, on a step, runs it again on that schedule on the node that
	// holds it (issue 30): daily, hourly, weekly, every DURATION, or a cron
	// line (UTC). Nothing that names the step is recreated by those runs.
	Schedule string `yaml:"schedule,omitempty" json:"schedule,omitempty" jsonschema:"description=On a step: run it again on this schedule (daily or hourly or weekly or every 15m or a cron line in UTC); a failed run is reported and tried at the next slot; runs never overlap; nothing that names the step is recreated"`
	// Data, on a directory, marks it as the module's data (issue 30): what
	// a person backs up. The mesh never removes a data directory, even
	// empty, when the module goes: only mesh unassign --purge-data does.
	Data bool `yaml:"data,omitempty" json:"data,omitempty" jsonschema:"description=On a directory: the module's data (what a person backs up); the mesh never removes it when the module goes (even empty) but for mesh unassign --purge-data"`
	// BeforeBackup, on a step, runs it before each backup of the module
	// (a pg_dump into a data directory, say) instead of at applies.
	BeforeBackup bool `yaml:"before-backup,omitempty" json:"before-backup,omitempty" jsonschema:"description=On a step: never run by an apply; it runs before each backup of the module instead (a pg_dump into a data directory\\, say). Not with schedule: and never named by restart-on"`

	// Healthy, on a binding, holds the resources after it until the
	// provider's instance it points at is healthy (a health gate).
	Healthy bool `yaml:"healthy,omitempty" json:"healthy,omitempty" jsonschema:"description=On a binding: the resources after it wait until the provider's instance it points at passes its health check"`

	// Health is the container's health check, run by Podman.
	Health *Health `yaml:"health,omitempty" json:"health,omitempty" jsonschema:"description=A health check: --wait waits for it and the resolver leaves out instances that fail it"`

	// What compose users set on a container (container.go). Each is part of
	// the container's digest; unset, it changes no digest.
	User        string            `yaml:"user,omitempty" json:"user,omitempty" jsonschema:"description=The user the process runs as: UID[:GID] or a name the image knows"`
	Entrypoint  []string          `yaml:"entrypoint,omitempty" json:"entrypoint,omitempty" jsonschema:"description=Replaces the image's entrypoint"`
	WorkingDir  string            `yaml:"working-dir,omitempty" json:"working-dir,omitempty" jsonschema:"description=The process's working directory in the container (absolute)"`
	CapAdd      []string          `yaml:"cap-add,omitempty" json:"cap-add,omitempty" jsonschema:"description=Capabilities to add, e.g. NET_ADMIN"`
	CapDrop     []string          `yaml:"cap-drop,omitempty" json:"cap-drop,omitempty" jsonschema:"description=Capabilities to drop, e.g. ALL"`
	Devices     []string          `yaml:"devices,omitempty" json:"devices,omitempty" jsonschema:"description=Host devices: /dev/PATH[:CONTAINER_PATH[:rwm]]; each must be a device node on the host (never created, never a link)"`
	ReadOnly    bool              `yaml:"read-only,omitempty" json:"read-only,omitempty" jsonschema:"description=Mount the container's root filesystem read-only"`
	Tmpfs       []string          `yaml:"tmpfs,omitempty" json:"tmpfs,omitempty" jsonschema:"description=tmpfs mounts: PATH[:OPTIONS], e.g. /run:size=64m"`
	Memory      string            `yaml:"memory,omitempty" json:"memory,omitempty" jsonschema:"description=Memory limit: a number of bytes with an optional unit b k m g, e.g. 512m"`
	LogMaxSize  string            `yaml:"log-max-size,omitempty" json:"log-max-size,omitempty" jsonschema:"description=Bound of the container's log, 8k to 1g (default 10m): Podman's log is cut when it would grow past it"`
	CPUs        float64           `yaml:"cpus,omitempty" json:"cpus,omitempty" jsonschema:"description=CPU limit in cores, e.g. 1.5"`
	StopSignal  string            `yaml:"stop-signal,omitempty" json:"stop-signal,omitempty" jsonschema:"description=The signal that stops the container, e.g. SIGQUIT"`
	StopTimeout string            `yaml:"stop-timeout,omitempty" json:"stop-timeout,omitempty" jsonschema:"description=How long a stop waits before it kills (a Go duration up to 90s, e.g. 30s; default 10s)"`
	Labels      map[string]string `yaml:"labels,omitempty" json:"labels,omitempty" jsonschema:"description=Container labels; keys starting with mesh. are the mesh's own"`
	// Compose's tty, init, pids_limit and group_add. PidsLimit is a
	// pointer so that an explicit 0 is refused, not taken for no key.
	TTY       bool     `yaml:"tty,omitempty" json:"tty,omitempty" jsonschema:"description=Give the process a terminal (compose's tty)"`
	Init      bool     `yaml:"init,omitempty" json:"init,omitempty" jsonschema:"description=Run Podman's init as PID 1 (catatonit: it reaps zombies and passes signals on); the node needs Podman's init binary (containers.conf init_path)"`
	PidsLimit *int64   `yaml:"pids-limit,omitempty" json:"pids-limit,omitempty" jsonschema:"minimum=1,maximum=4194304,description=Most processes (and threads) the container may have at once; without it Podman's default applies (containers.conf pids_limit: 2048 unless changed)"`
	GroupAdd  []string `yaml:"group-add,omitempty" json:"group-add,omitempty" jsonschema:"description=Supplementary groups of the process: numeric gids or group names the image knows"`

	// Typed holds the values parsed from the strings above. It travels in
	// the log with the rest (the FSM never parses a manifest's text).
	Typed Typed `yaml:"-" json:"typed"`
}

// Kind is the resource's kind key, or "" when none is set.
func (r *Resource) Kind() string {
	k, _ := r.kindName()
	return k
}

// Name is what the resource is called: its path, or its step or container name.
func (r *Resource) Name() string {
	_, n := r.kindName()
	return n
}

func (r *Resource) kindName() (string, string) {
	// kinds' order, without building its list: composition asks each
	// resource's kind several times (TestKindNameIsKindsFirst).
	switch {
	case r.Directory != "":
		return KindDirectory, r.Directory
	case r.File != "":
		return KindFile, r.File
	case r.RoutesFile != "":
		return KindRoutesFile, r.RoutesFile
	case r.Binding != "":
		return KindBinding, r.Binding
	case r.Credential != "":
		return KindCredential, r.Credential
	case r.Secret != "":
		return KindSecret, r.Secret
	case r.Step != "":
		return KindStep, r.Step
	case r.Container != "":
		return KindContainer, r.Container
	}
	return "", ""
}

func (r *Resource) kinds() [][2]string {
	return [][2]string{
		{KindDirectory, r.Directory}, {KindFile, r.File}, {KindRoutesFile, r.RoutesFile},
		{KindBinding, r.Binding}, {KindCredential, r.Credential}, {KindSecret, r.Secret},
		{KindStep, r.Step}, {KindContainer, r.Container},
	}
}

// IsPath reports whether the resource is a path on the host.
func (r *Resource) IsPath() bool {
	switch r.Kind() {
	case KindStep, KindContainer, "":
		return false
	}
	return true
}

// Error is one problem in a manifest, at a line.
type Error struct {
	File string
	Line int
	Msg  string
}

func (e *Error) Error() string {
	if e.Line > 0 {
		return fmt.Sprintf("%s:%d: %s", e.File, e.Line, e.Msg)
	}
	return fmt.Sprintf("%s: %s", e.File, e.Msg)
}

// Errors is every problem found in one manifest, in line order.
type Errors []*Error

func (es Errors) Error() string {
	s := make([]string, len(es))
	for i, e := range es {
		s[i] = e.Error()
	}
	return strings.Join(s, "\n")
}

// Line is the line of resource i, 0 if unknown.
func (m *Manifest) Line(i int) int {
	if i >= 0 && i < len(m.Lines) {
		return m.Lines[i]
	}
	return 0
}

// Digest returns the hex sha256 of b.
func Digest(b []byte) string {
	s := sha256.Sum256(b)
	return hex.EncodeToString(s[:])
}

// Parse decodes and checks one manifest. file names it in errors. The error is
// an Errors listing every problem, or a single *Error for text that is not a
// manifest at all.
//
// Parse never panics and never runs away on hostile input: size, nesting
// depth and token count are bounded before the parser builds a tree, tags,
// anchors and aliases are refused, and a panic inside the YAML library is
// turned into an error naming the file.
func Parse(file string, src []byte) (m *Manifest, err error) {
	defer func() {
		if r := recover(); r != nil {
			m, err = nil, Errors{{File: file, Msg: fmt.Sprintf("the YAML library failed on this file (%v); simplify it, or report it with the file", r)}}
		}
	}()
	if len(src) > MaxSize {
		return nil, Errors{{File: file, Msg: fmt.Sprintf("manifest is %d bytes, more than the %d allowed; is this the right file?", len(src), MaxSize)}}
	}
	if !isText(src) {
		return nil, Errors{{File: file, Msg: "manifest is not UTF-8 text; give the module's YAML file"}}
	}
	if e := bounded(file, src); e != nil {
		return nil, Errors{e}
	}
	f, err := parser.ParseBytes(src, 0)
	if err != nil {
		return nil, Errors{yamlError(file, err)}
	}
	if len(f.Docs) != 1 || f.Docs[0].Body == nil {
		if len(f.Docs) > 1 {
			return nil, Errors{{File: file, Line: docLine(f.Docs[1]), Msg: "more than one YAML document; put each module in its own file"}}
		}
		return nil, Errors{{File: file, Msg: "manifest is empty; it needs at least `module: NAME`"}}
	}
	body := f.Docs[0].Body
	if _, ok := body.(*ast.MappingNode); !ok {
		if _, ok := body.(*ast.MappingValueNode); !ok {
			return nil, Errors{{File: file, Line: line(body), Msg: "a manifest is a mapping with `module:` and `resources:`; see `mesh schema`"}}
		}
	}
	if errs := checkShape(file, body); len(errs) > 0 {
		return nil, errs
	}
	m = &Manifest{File: file, Digest: Digest(src)}
	dec := yaml.NewDecoder(bytes.NewReader(src), yaml.Strict(), yaml.DisallowUnknownField())
	if err := dec.DecodeFromNode(body, m); err != nil {
		return nil, Errors{yamlError(file, err)}
	}
	m.Digest = Digest(src)
	m.File = file
	if res := mapValue(body, "resources"); res != nil {
		if seq, ok := res.(*ast.SequenceNode); ok {
			for _, v := range seq.Values {
				m.Lines = append(m.Lines, line(v))
			}
		}
	}
	pos := positions{file: file, body: body}
	if errs := m.check(&pos); len(errs) > 0 {
		return nil, errs
	}
	m.IndexProviders()
	return m, nil
}

// bounded refuses, on the tokens alone, what no manifest needs and what makes
// the parser slow or large: deep nesting, too many tokens, tags, anchors and
// aliases (an alias bomb is a few lines).
func bounded(file string, src []byte) *Error {
	toks := lexer.Tokenize(string(src))
	if len(toks) > MaxTokens {
		return &Error{File: file, Msg: fmt.Sprintf("manifest has more than %d YAML tokens; a module's manifest is far smaller, is this the right file?", MaxTokens)}
	}
	flow := 0
	var indents []int // columns of the open block levels
	lastLine := 0
	for _, tk := range toks {
		ln := tk.Position.Line
		switch tk.Type {
		case token.TagType:
			return &Error{File: file, Line: ln, Msg: fmt.Sprintf("YAML tag %s: a manifest takes no tags; write the value plainly", tk.Value)}
		case token.AnchorType, token.AliasType, token.MergeKeyType:
			return &Error{File: file, Line: ln, Msg: "YAML anchors, aliases and merge keys are not taken in a manifest; write each value out"}
		case token.MappingStartType, token.SequenceStartType:
			flow++
		case token.MappingEndType, token.SequenceEndType:
			flow--
		}
		// Block nesting shows as indentation: a token that starts a line, or a
		// `- ` entry, opens a level when it stands right of the open ones.
		if flow == 0 && (ln != lastLine || tk.Type == token.SequenceEntryType) {
			col := tk.Position.Column
			for len(indents) > 0 && indents[len(indents)-1] > col {
				indents = indents[:len(indents)-1]
			}
			if len(indents) == 0 || indents[len(indents)-1] < col {
				indents = append(indents, col)
			}
		}
		lastLine = ln
		if flow+len(indents) > MaxDepth {
			return &Error{File: file, Line: ln, Msg: fmt.Sprintf("manifest nests deeper than %d levels; a manifest is shallow, is this the right file?", MaxDepth)}
		}
	}
	return nil
}

func isText(b []byte) bool {
	return !bytes.ContainsRune(b, 0) && strings.ToValidUTF8(string(b), "\uFFFD") == string(b)
}

func docLine(d *ast.DocumentNode) int {
	if d.Start != nil {
		return d.Start.Position.Line
	}
	if d.Body != nil {
		return line(d.Body)
	}
	return 0
}

func line(n ast.Node) int {
	if n == nil || n.GetToken() == nil {
		return 0
	}
	return n.GetToken().Position.Line
}

// yamlError turns a go-yaml error into ours, keeping its line and making the
// usual ones say what to do.
func yamlError(file string, err error) *Error {
	var ye yaml.Error
	e := &Error{File: file, Msg: err.Error()}
	if errors.As(err, &ye) {
		if tk := ye.GetToken(); tk != nil {
			e.Line = tk.Position.Line
		}
		e.Msg = ye.GetMessage()
	}
	var uf *yaml.UnknownFieldError
	var te *yaml.TypeError
	var dk *yaml.DuplicateKeyError
	switch {
	case errors.As(err, &uf):
		e.Msg = strings.Replace(e.Msg, "unknown field", "unknown key", 1) + "; `mesh schema` lists the keys a manifest may hold"
	case errors.As(err, &te):
		e.Msg = "wrong type: " + e.Msg + "; `mesh schema` gives each key's type"
	case errors.As(err, &dk) || strings.Contains(e.Msg, "already defined"):
		e.Msg += "; keep one of them"
	}
	return e
}

// mapValue finds key's value in a mapping node.
func mapValue(n ast.Node, key string) ast.Node {
	var values []*ast.MappingValueNode
	switch m := n.(type) {
	case *ast.MappingNode:
		values = m.Values
	case *ast.MappingValueNode:
		values = []*ast.MappingValueNode{m}
	default:
		return nil
	}
	for _, v := range values {
		if v.Key != nil && v.Key.GetToken() != nil && v.Key.GetToken().Value == key {
			return v.Value
		}
	}
	return nil
}

// positions finds the line of a value inside the document, for messages.
type positions struct {
	file string
	body ast.Node
}

// at returns the line of resources[i].key[j] (j < 0: the key itself).
func (p *positions) at(i int, key string, j int) int {
	res, ok := mapValue(p.body, "resources").(*ast.SequenceNode)
	if !ok || i >= len(res.Values) {
		return 0
	}
	item := res.Values[i]
	if key == "" {
		return line(item)
	}
	v := mapValue(item, key)
	if v == nil {
		return line(item)
	}
	if seq, ok := v.(*ast.SequenceNode); ok && j >= 0 && j < len(seq.Values) {
		return line(seq.Values[j])
	}
	return line(v)
}

func (p *positions) top(key string) int {
	if v := mapValue(p.body, key); v != nil {
		return line(v)
	}
	return line(p.body)
}

// topAt returns the line of a value nested under a top-level key
// (backup.keep.daily), or of the nearest enclosing one found.
func (p *positions) topAt(keys ...string) int {
	n, ln := p.body, line(p.body)
	for _, k := range keys {
		if n = mapValue(n, k); n == nil {
			break
		}
		ln = line(n)
	}
	return ln
}

var secretishRE = regexp.MustCompile(`(?i)(pass(word|wd)?|secret|token|api_?key|private_?key)`)

// LooksSecret says whether an env: entry looks like a secret (by its
// name: PASSWORD, TOKEN, API_KEY...) with a value in the manifest, which
// every node replicates: it belongs in env-secrets. A *_FILE variable names
// a file, not a value.
func LooksSecret(key, value string) bool {
	return value != "" && secretishRE.MatchString(key) && !strings.HasSuffix(strings.ToUpper(key), "_FILE")
}

// SecretNameRE is what a secret's name may be (`mesh secret set MODULE
// NAME`), and SecretNameRule says it in words.
var SecretNameRE = regexp.MustCompile(`^[a-z0-9][a-z0-9_.-]{0,62}$`)

const SecretNameRule = "use 1 to 63 lower-case letters, digits, '.', '_' and '-', starting with a letter or digit"

var (
	labelRE   = regexp.MustCompile(`^[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?$`)
	nameRE    = regexp.MustCompile(`^[a-z0-9][a-z0-9_.-]{0,127}$`)
	ownerRE   = regexp.MustCompile(`^[0-9]{1,10}:[0-9]{1,10}$`)
	restartOK = map[string]bool{"": true, "no": true, "always": true, "on-failure": true, "unless-stopped": true}
	pullOK    = map[string]bool{"": true, PullMissing: true, PullAlways: true, PullNewer: true}
)

// fields lists which optional keys each kind may carry.
var fields = map[string][]string{
	KindDirectory:  {"owner", "mode", "take-over", "data"},
	KindFile:       {"owner", "mode", "content", "take-over"},
	KindRoutesFile: {"owner", "mode", "template", "take-over"},
	KindBinding:    {"owner", "mode", "provider", "take-over", "healthy"},
	KindCredential: {"owner", "mode", "provider", "take-over"},
	KindSecret:     {"name", "owner", "mode"},
	KindStep:       append([]string{"image", "command", "env", "env-secrets", "mounts", "restart-on", "pull", "schedule", "before-backup"}, containerFields...),
	KindContainer:  append([]string{"image", "command", "env", "env-secrets", "mounts", "ports", "public-ports", "restart", "restart-on", "health", "pull"}, containerFields...),
}

// Keys lists the optional keys a resource of kind takes (besides its kind
// key), as `mesh check` names them.
func Keys(kind string) []string { return slices.Clone(fields[kind]) }

func (r *Resource) setFields() []string {
	var s []string
	add := func(k string, set bool) {
		if set {
			s = append(s, k)
		}
	}
	add("owner", r.Owner != "")
	add("mode", r.Mode != "")
	add("content", r.Content != "")
	add("provider", r.Provider != "")
	add("template", r.Template != "")
	add("image", r.Image != "")
	add("command", r.Command != nil)
	add("env", r.Env != nil)
	add("env-secrets", r.EnvSecrets != nil)
	add("name", r.SecretName != "")
	add("mounts", r.Mounts != nil)
	add("ports", r.Ports != nil)
	add("public-ports", r.PublicPorts != nil)
	add("restart", r.Restart != "")
	add("restart-on", r.RestartOn != nil)
	add("take-over", r.TakeOver)
	add("data", r.Data)
	add("schedule", r.Schedule != "")
	add("before-backup", r.BeforeBackup)
	add("health", r.Health != nil)
	add("pull", r.Pull != "")
	add("user", r.User != "")
	add("entrypoint", r.Entrypoint != nil)
	add("working-dir", r.WorkingDir != "")
	add("cap-add", r.CapAdd != nil)
	add("cap-drop", r.CapDrop != nil)
	add("devices", r.Devices != nil)
	add("read-only", r.ReadOnly)
	add("tmpfs", r.Tmpfs != nil)
	add("memory", r.Memory != "")
	add("log-max-size", r.LogMaxSize != "")
	add("cpus", r.CPUs != 0)
	add("stop-signal", r.StopSignal != "")
	add("stop-timeout", r.StopTimeout != "")
	add("labels", r.Labels != nil)
	add("tty", r.TTY)
	add("init", r.Init)
	add("pids-limit", r.PidsLimit != nil)
	add("group-add", r.GroupAdd != nil)
	add("healthy", r.Healthy)
	return s
}

func (m *Manifest) check(p *positions) Errors {
	var errs Errors
	add := func(line int, format string, a ...any) {
		errs = append(errs, &Error{File: p.file, Line: line, Msg: fmt.Sprintf(format, a...)})
	}
	if m.Module == "" {
		add(line(p.body), "`module:` is missing; name the module, e.g. `module: gitea`")
	} else if !labelRE.MatchString(m.Module) {
		add(p.top("module"), "module name %q is not a DNS label; use lower-case letters, digits and '-' (it becomes %s.<domain>)", m.Module, "NAME")
	}
	if u := m.Update; u != nil {
		ln := p.top("update")
		if u.MaxParallel < 0 || u.MaxParallel > 1000 {
			add(ln, "update: max-parallel %d is not between 1 and 1000", u.MaxParallel)
		}
		if u.HealthyFor != "" {
			if d, err := time.ParseDuration(u.HealthyFor); err != nil || d < 0 || d > 24*time.Hour {
				add(ln, "update: healthy-for %q is not a duration between 0s and 24h, such as 10s", u.HealthyFor)
			}
		}
	}
	routes, hosts := map[string]bool{}, map[string]bool{}
	for i, r := range m.Routes {
		ln := p.top("routes")
		if seq, ok := mapValue(p.body, "routes").(*ast.SequenceNode); ok && i < len(seq.Values) {
			ln = line(seq.Values[i])
		}
		if !labelRE.MatchString(r.Name) {
			add(ln, "route name %q is not a DNS label; use lower-case letters, digits and '-'", r.Name)
		}
		if r.Port < 1 || r.Port > 65535 {
			add(ln, "route %q: port %d is not between 1 and 65535", r.Name, r.Port)
		}
		if routes[r.Name] {
			add(ln, "route %q is listed twice; keep one", r.Name)
		}
		routes[r.Name] = true
		for _, h := range r.Hosts {
			if !ValidHost(h) {
				add(ln, "route %q: host %q is not a lower-case host name with a dot, such as code.example.com", r.Name, h)
			} else if hosts[h] {
				add(ln, "route %q: host %q is listed twice; keep one", r.Name, h)
			}
			hosts[h] = true
		}
	}

	// pathAt: each path -> the indexes that declare it (one pass, so that a
	// parent declared after its child is found without a scan per resource).
	pathAt := map[string][]int{}
	for i := range m.Resources {
		if r := &m.Resources[i]; r.IsPath() {
			pathAt[r.Name()] = append(pathAt[r.Name()], i)
		}
	}
	// declared: name -> index, for paths, steps and containers alike.
	declared := map[string]int{}
	kindOf := map[string]string{}
	for i := range m.Resources {
		r := &m.Resources[i]
		ln := p.at(i, "", -1)
		var set []string
		for _, kv := range r.kinds() {
			if kv[1] != "" {
				set = append(set, kv[0])
			}
		}
		if len(set) == 0 {
			add(ln, "resource has no kind; start it with one of directory, file, routes-file, binding, credential, secret, step, container")
			continue
		}
		if len(set) > 1 {
			add(ln, "resource has %d kinds (%s); give each its own `- ` entry", len(set), strings.Join(set, ", "))
			continue
		}
		kind, name := set[0], r.Name()
		allowed := map[string]bool{}
		for _, f := range fields[kind] {
			allowed[f] = true
		}
		for _, f := range r.setFields() {
			if !allowed[f] {
				add(p.at(i, f, -1), "a %s does not take `%s`; it takes %s", kind, f, strings.Join(fields[kind], ", "))
			}
		}
		if r.IsPath() {
			if msg := checkPath(name); msg != "" {
				add(ln, "%s %q: %s", kind, name, msg)
				continue
			}
		} else if !nameRE.MatchString(name) {
			add(ln, "%s name %q: use lower-case letters, digits, '.', '_' and '-' (Podman's DNS folds case)", kind, name)
			continue
		}
		if j, dup := declared[name]; dup {
			add(ln, "%q is declared twice (first at line %d); keep one", name, m.Line(j))
			continue
		}
		if r.IsPath() {
			// The parent must come first; a parent declared later is an ordering error,
			// a parent that is a file is a type error.
			parent := path.Dir(name)
			if j, ok := declared[parent]; ok && kindOf[parent] != KindDirectory {
				add(ln, "%q is inside %q, which is a %s (line %d), not a directory", name, parent, kindOf[parent], m.Line(j))
			}
			for _, j := range pathAt[parent] {
				if j > i {
					add(ln, "%q is declared before its parent %q (line %d); move the parent above it, the host applies resources in the order written", name, parent, m.Line(j))
				}
			}
		}
		declared[name] = i
		kindOf[name] = kind

		if r.Template != "" && kind == KindRoutesFile {
			if _, err := ParseTemplate(r.Template); err != nil {
				add(p.at(i, "template", -1), "%s", err)
			}
		}
		if !pullOK[r.Pull] {
			add(p.at(i, "pull", -1), "pull %q is not one of missing, always, newer", r.Pull)
		}
		if r.Schedule != "" {
			if _, err := ParseSchedule(r.Schedule); err != nil {
				add(p.at(i, "schedule", -1), "%s", err)
			}
		}
		if r.Mode != "" {
			if _, err := ParseMode(r.Mode); err != nil {
				add(p.at(i, "mode", -1), "%s", err)
			}
		}
		if r.Owner != "" {
			if _, _, err := ParseOwner(r.Owner); err != nil {
				add(p.at(i, "owner", -1), "%s", err)
			}
		}
		switch kind {
		case KindBinding, KindCredential:
			if r.Provider == "" {
				add(ln, "%s %q has no `provider:`; name the module it connects to", kind, name)
			} else if !labelRE.MatchString(r.Provider) {
				add(p.at(i, "provider", -1), "provider %q is not a module name", r.Provider)
			} else if kind == KindCredential && r.Provider == m.Module {
				add(p.at(i, "provider", -1), "credential %q names its own module as provider; a credential is between two modules", name)
			}
		case KindSecret:
			if r.SecretName == "" {
				add(ln, "secret %q has no `name:`; name the module's secret it holds (mesh secret set %s NAME)", name, m.Module)
			} else if !SecretNameRE.MatchString(r.SecretName) {
				add(p.at(i, "name", -1), "secret name %q: %s", r.SecretName, SecretNameRule)
			}
			if m, err := ParseMode(r.Mode); r.Mode != "" && err == nil && m&0o077 != 0 {
				add(p.at(i, "mode", -1), "secret %q: mode %s lets group or others read it; a secret's file is its owner's alone: use 0600 or 0400, and owner: the container's user", name, r.Mode)
			}
		case KindStep, KindContainer:
			if r.Image == "" {
				add(ln, "%s %q has no `image:`; name the image it runs, e.g. docker.io/library/busybox:1.36", kind, name)
			}
			for k := range r.Env {
				if !ValidEnvKey(k) {
					add(p.at(i, "env", -1), "env key %q is not a variable name; %s", k, EnvKeyRule)
				}
			}
			for k, v := range r.EnvSecrets {
				switch {
				case !ValidEnvKey(k):
					add(p.at(i, "env-secrets", -1), "env-secrets key %q is not a variable name; %s", k, EnvKeyRule)
				case !SecretNameRE.MatchString(v):
					add(p.at(i, "env-secrets", -1), "env-secrets %s: secret name %q: %s", k, v, SecretNameRule)
				}
				if _, both := r.Env[k]; both {
					add(p.at(i, "env-secrets", -1), "%s is in both env and env-secrets; keep it in env-secrets", k)
				}
			}
			if !restartOK[r.Restart] {
				add(p.at(i, "restart", -1), "restart %q is not one of no, always, on-failure, unless-stopped", r.Restart)
			}
			for j, mt := range r.Mounts {
				if msg := checkMount(mt, declared, kindOf); msg != "" {
					add(p.at(i, "mounts", j), "mount %q: %s", mt, msg)
				}
			}
			published := map[string]string{} // HOST/proto -> the key that publishes it
			for _, key := range []string{"ports", "public-ports"} {
				list := r.Ports
				if key == "public-ports" {
					list = r.PublicPorts
				}
				for j, pt := range list {
					pp, err := ParsePort(pt)
					if err != nil {
						add(p.at(i, key, j), "port %q: %s", pt, err)
						continue
					}
					if key == "ports" && pp.HostIP != "" {
						add(p.at(i, key, j), "port %q names an address; ports: are published on the node's overlay address only: write %d:%d, or move it to public-ports: if the world must reach it", pt, pp.HostPort, pp.ContainerPort)
					}
					hp := fmt.Sprintf("%d/%s", pp.HostPort, pp.Protocol)
					if other, dup := published[hp]; dup {
						add(p.at(i, key, j), "host port %s is published twice (in %s and %s); publish it once", hp, other, key)
					}
					published[hp] = key
				}
			}
			for _, e := range checkContainerFields(r) {
				add(p.at(i, e.key, e.index), "%s %q: %s", kind, name, e.msg)
			}
			for j, on := range r.RestartOn {
				if _, ok := declared[on]; !ok || on == name {
					add(p.at(i, "restart-on", j), "restart-on %q names nothing declared above it in this manifest; name a path or a step listed before %q", on, name)
				} else if kindOf[on] == KindContainer {
					add(p.at(i, "restart-on", j), "restart-on %q names a container; name a path or a step", on)
				} else if kindOf[on] == KindStep && m.Resources[declared[on]].BeforeBackup {
					add(p.at(i, "restart-on", j), "%s", beforeBackupNamed(on))
				}
			}
		}
	}
	if len(errs) == 0 {
		for i := range m.Resources {
			r := &m.Resources[i]
			t, err := TypeOf(r)
			if err != nil {
				add(p.at(i, "", -1), "%s %q: %s", r.Kind(), r.Name(), err)
				continue
			}
			r.Typed = t
		}
		for _, c := range NestedMounts(m.Mounts()) {
			add(p.at(c.Inner.Resource, "mounts", c.Inner.Index), "%s", c)
		}
	}
	m.checkBackup(p, add)
	if m.AcceptsCredentials != "" {
		if _, ok := declared[m.AcceptsCredentials]; !ok || kindOf[m.AcceptsCredentials] != KindDirectory {
			add(p.top("accepts-credentials"), "accepts-credentials %q is not a directory declared in this manifest; declare it under resources", m.AcceptsCredentials)
		}
	}
	sort.SliceStable(errs, func(a, b int) bool { return errs[a].Line < errs[b].Line })
	return errs
}

// Forbidden lists the host paths no manifest may declare or mount: the
// system's own trees, the container engine's storage, and the mesh's default
// data dir. A node's actual data dir is refused as well, by CheckDataDir and
// by the host at apply time.
var Forbidden = []string{
	"/bin", "/boot", "/dev", "/etc", "/lib", "/lib32", "/lib64", "/libx32", "/proc",
	"/root", "/run", "/sbin", "/sys", "/usr", "/var/run",
	"/var/lib/containers", "/var/lib/mesh",
	// The package manager's and the init system's state, and the spools
	// (cron's, mail's): a container given them runs as the system.
	"/var/lib/dpkg", "/var/lib/apt", "/var/lib/systemd", "/var/spool",
}

// Shared lists the host trees everything on a machine shares: users'
// homes, the temporary and log trees, the mount points, /srv and /opt. A
// module may keep a directory inside one (/srv/MODULE, /home/git), never
// the tree itself: declared, it would be the module's to own and chmod
// (/tmp would lose its sticky bit); mounted, it gives a container every
// user's or every module's files.
var Shared = []string{
	"/home", "/media", "/mnt", "/opt", "/srv", "/tmp",
	"/var/backups", "/var/cache", "/var/log", "/var/mail", "/var/tmp",
}

// SystemTree names the tree of the system (Forbidden) that p is inside
// or holds, or the shared tree (Shared) that p is or holds; "" when p is
// a module's to declare.
func SystemTree(p string) (tree string, shared bool) {
	for _, f := range Forbidden {
		if Within(p, f) || Within(f, p) {
			return f, false
		}
	}
	for _, f := range Shared {
		if Within(f, p) {
			return f, true
		}
	}
	return "", false
}

// Within reports whether p is dir or inside it.
func Within(p, dir string) bool {
	return p == dir || dir == "/" || len(p) > len(dir) && p[len(dir)] == '/' && strings.HasPrefix(p, dir)
}

func checkPath(p string) string {
	switch {
	case !strings.HasPrefix(p, "/"):
		return "path must be absolute"
	case p == "/":
		return "the root directory cannot be a resource"
	case path.Clean(p) != p:
		return fmt.Sprintf("path is not clean (no '..', '.', '//' or trailing '/'); write %q", path.Clean(p))
	case strings.ContainsAny(p, ":,\n"):
		return "path may not contain ':', ',' or a newline"
	}
	for _, f := range Forbidden {
		if Within(p, f) {
			return fmt.Sprintf("%s belongs to the system, not to a module; keep a module's files under a directory of its own, such as /srv/MODULE", f)
		}
	}
	switch tree, shared := SystemTree(p); {
	case tree == "":
	case !shared:
		// A parent of a system tree holds it: mounted writable, the
		// container gets the tree (/var/lib holds /var/lib/dpkg).
		return fmt.Sprintf("%s holds %s, which belongs to the system; keep a module's files under a directory of its own, such as /srv/MODULE", p, tree)
	default: // p is the tree: a tree that holds one is the system's (/var)
		return fmt.Sprintf("%s is shared by everything on the host, not a module's; keep a module's files under a directory of its own, such as /srv/MODULE", tree)
	}
	return ""
}

// CheckDataDir refuses a manifest that declares or mounts a path inside the
// node's data dir (the mesh's own state, keys and ledger).
func CheckDataDir(m *Manifest, dataDir string) error {
	if dataDir == "" {
		return nil
	}
	dataDir = path.Clean(dataDir)
	var errs Errors
	for i := range m.Resources {
		r := &m.Resources[i]
		paths := []string{}
		if r.IsPath() {
			paths = append(paths, r.Name())
		}
		for _, mt := range r.Typed.Mounts {
			paths = append(paths, mt.Source)
		}
		for _, p := range paths {
			if Within(p, dataDir) || Within(dataDir, p) {
				errs = append(errs, &Error{File: m.File, Line: m.Line(i), Msg: fmt.Sprintf("%s %q: %s holds the mesh's own data (this node's data dir); keep a module's files elsewhere, such as /srv/%s", r.Kind(), p, dataDir, m.Module)})
				break
			}
		}
	}
	if len(errs) > 0 {
		return errs
	}
	return nil
}

func checkMount(mt string, declared map[string]int, kindOf map[string]string) string {
	m, err := ParseMount(mt)
	if err != nil {
		return err.Error()
	}
	src := m.Source
	k, ok := kindOf[src]
	if _, dec := declared[src]; !dec || !ok || k == KindStep || k == KindContainer {
		return fmt.Sprintf("host path %q is not declared above it; declare it as a directory or file (with owner and mode) before the container, or the runtime creates it as root", src)
	}
	return ""
}

// MountAt is one mount of one resource: which resource (by index), which
// mount of it, and the module it belongs to.
type MountAt struct {
	Module   string
	Name     string // the step or container
	Resource int
	Index    int
	Mount    Mount
}

// Nesting is a mount whose host path lies inside another's writable one.
type Nesting struct {
	Outer, Inner MountAt
}

func (n Nesting) String() string {
	return fmt.Sprintf("mount %q of %s: its host path is inside %q, which %s mounts writable; a container that can write there could swap it for a link, and Podman would follow the link at the next start. Mount %q read-only (\":ro\"), or move %q out of it",
		n.Inner.Mount.Source+":"+n.Inner.Mount.Destination, n.Inner.Name, n.Outer.Mount.Source, n.Outer.Name, n.Outer.Mount.Source, n.Inner.Mount.Source)
}

// NestedMounts finds every mount whose host path lies strictly inside the
// host path of a writable mount (of the same container or another). Such a
// pair lets one container replace the other's mount source with a link; the
// mesh refuses it (DESIGN.md, "The manifest").
//
// The pairs come in the order of the outer mount, then of the inner one, as
// ms lists them. Composition runs this over every mount of a node at every
// command, so the inner mounts of each outer are found by a binary search
// over the sources sorted, not by comparing every pair.
func NestedMounts(ms []MountAt) []Nesting {
	bySource := make([]int, len(ms))
	for i := range bySource {
		bySource[i] = i
	}
	sort.SliceStable(bySource, func(a, b int) bool { return ms[bySource[a]].Mount.Source < ms[bySource[b]].Mount.Source })
	var out []Nesting
	var inner []int
	for _, outer := range ms {
		if outer.Mount.ReadOnly {
			continue
		}
		inner = inner[:0]
		if dir := outer.Mount.Source; dir == "/" {
			for i, m := range ms {
				if m.Mount.Source != dir {
					inner = append(inner, i)
				}
			}
		} else {
			// Every source under dir+"/" sorts at or after it and before
			// dir+"0" ('0' follows '/').
			lo := sort.Search(len(bySource), func(k int) bool { return ms[bySource[k]].Mount.Source >= dir+"/" })
			for k := lo; k < len(bySource) && strings.HasPrefix(ms[bySource[k]].Mount.Source, dir+"/"); k++ {
				inner = append(inner, bySource[k])
			}
			slices.Sort(inner)
		}
		for _, i := range inner {
			out = append(out, Nesting{Outer: outer, Inner: ms[i]})
		}
	}
	return out
}

// AppendMounts appends the manifest's mounts, typed, to out.
func (m *Manifest) AppendMounts(out []MountAt) []MountAt {
	for i := range m.Resources {
		r := &m.Resources[i]
		for j, mt := range r.Typed.Mounts {
			out = append(out, MountAt{Module: m.Module, Name: r.Name(), Resource: i, Index: j, Mount: mt})
		}
	}
	return out
}

// Mounts lists the manifest's mounts, typed, for checks across modules.
func (m *Manifest) Mounts() []MountAt { return m.AppendMounts(nil) }

// MountCount is len(m.Mounts()), without them.
func (m *Manifest) MountCount() int {
	n := 0
	for i := range m.Resources {
		n += len(m.Resources[i].Typed.Mounts)
	}
	return n
}

// CheckProviders checks what needs the catalogue: every binding and credential
// names a module that exists, and a credential's provider accepts credentials.
// lookup returns the catalogue's manifest for a module name.
func CheckProviders(m *Manifest, lookup func(string) (*Manifest, bool)) error {
	return checkProviders(m, lookup, "is not in the catalogue; add it first with `mesh module add`")
}

// CheckProvidersOffline is CheckProviders among the files `mesh check` was
// given together, which knows nothing of the catalogue.
func CheckProvidersOffline(m *Manifest, lookup func(string) (*Manifest, bool)) error {
	return checkProviders(m, lookup, "is in none of the files checked (mesh check reads files only, not the catalogue); "+
		"check it with its provider's file, e.g. `mesh check "+filepath.Base(m.File)+" PROVIDER.yaml`, and add the provider before this module is assigned")
}

func checkProviders(m *Manifest, lookup func(string) (*Manifest, bool), missing string) error {
	var errs Errors
	for i := range m.Resources {
		r := &m.Resources[i]
		k := r.Kind()
		if k != KindBinding && k != KindCredential {
			continue
		}
		pm, ok := lookup(r.Provider)
		if !ok {
			errs = append(errs, &Error{File: m.File, Line: m.Line(i), Msg: fmt.Sprintf("%s %q: provider %q %s", k, r.Name(), r.Provider, missing)})
			continue
		}
		if k == KindCredential && pm.AcceptsCredentials == "" {
			errs = append(errs, &Error{File: m.File, Line: m.Line(i), Msg: fmt.Sprintf("credential %q: provider %q does not declare `accepts-credentials:`, so it has nowhere to receive the secret", r.Name(), r.Provider)})
		}
	}
	if len(errs) > 0 {
		return errs
	}
	return nil
}

// ValidHost says whether h is a host name a route may be served at: at
// least two DNS labels of lower-case letters, digits and '-', no trailing
// dot. (What it admits is also safe to write into a proxy's configuration:
// no space, brace, quote or newline.)
func ValidHost(h string) bool {
	if len(h) > 253 || !strings.Contains(h, ".") {
		return false
	}
	for _, l := range strings.Split(h, ".") {
		if !labelRE.MatchString(l) {
			return false
		}
	}
	return true
}
