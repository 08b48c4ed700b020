package composeimport

import (
	"bytes"
	"crypto/sha256"
	"errors"
	"fmt"
	"io/fs"
	"maps"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"

	"github.com/compose-spec/compose-go/v2/dotenv"
	"github.com/compose-spec/compose-go/v2/template"
	"go.yaml.in/yaml/v4"
)

// Every file compose-go reads while loading a project (the compose file, its
// .env, each env_file and label_file, a service's and a pre_start hook's,
// each file an extends or include names) is read whole, with no limit: a
// compose file naming /dev/zero, a FIFO or a huge file would make `mesh
// import compose` hang and eat memory. guardFiles checks them first: each
// must be a regular file (after following links) of at most maxComposeFile
// bytes. Paths are interpolated as compose-go would, with the same
// environment and .env, and files named by extends and include are checked
// the same way, to a bounded depth.
//
// compose-go's time also grows with what a small file expands to: each YAML
// node costs it tens of microseconds, and it copies nodes for every alias,
// for every service an extends copies, and for every port of a range
// ("1-65535" in a ports entry is 65,535 ports, three seconds; three of them
// in one file took fifteen). So the guard counts the nodes the whole walk
// will expand to (aliases, extends copies and port ranges included, from the
// YAML nodes, before anything is expanded) and refuses a compose file past
// maxComposeNodes: under a second of compose-go's time on a 2-core machine,
// and about ten times what a 650-line compose file such as mailcow's has
// (the real files in testdata have 50 to 130).
//
// compose-go's work per node also grows with how deep the node lies (it
// carries each node's path): 2,000 nested mappings took it 3 s, 9,000 nested
// sequences (an 18 KB file) 41 s and 320 MB. So the guard also bounds the
// depth, aliases followed, at maxComposeDepth: real compose files nest less
// than 15 deep.

const (
	maxComposeFile  = 4 << 20
	maxGuardDepth   = 8
	maxComposeNodes = 10000
	maxComposeDepth = 64
	// maxServicePorts bounds the ports one service publishes: a manifest
	// lists each, and Podman sets each up.
	maxServicePorts = 1024
)

// guardFiles checks the files as above, and returns the variables whose
// values the files take from env alone: compose-go fills them in (${VAR}, a
// bare "environment: [VAR]", ${VAR} in an env_file, ${VAR} in the .env or
// an include's env file for a variable the files use) from the environment
// the import runs in, and neither the .env nor an include's env file gives
// them that value, so the operator's own values (a token exported in the
// shell) end up in manifests every node replicates, which the import says.
func guardFiles(file string, env []string, project projectDir, hostFiles bool) ([]string, error) {
	dir := filepath.Dir(file)
	vars := map[string]string{}
	for _, kv := range env {
		if k, v, ok := strings.Cut(kv, "="); ok {
			vars[k] = v
		}
	}
	g := &guard{env: maps.Clone(vars), files: map[walked]*guarded{}, project: project, hostFiles: hostFiles,
		fileValues: map[string][]string{}, filledFrom: map[string][]string{}, used: map[string]bool{}}
	if err := regularFile(file, "the compose file"); err != nil {
		return nil, err
	}
	dotEnv := filepath.Join(dir, ".env")
	if _, err := os.Lstat(dotEnv); err == nil {
		if err := regularFile(dotEnv, "the .env beside it"); err != nil {
			return nil, err
		}
		if err := insideProject(dotEnv, "the .env beside it", project, hostFiles); err != nil {
			return nil, err
		}
		// Read as Import has compose-go read it (cli.WithDotEnv): not at
		// all when COMPOSE_DISABLE_ENV_FILE is set, else with ${VAR} in
		// its values filled in from the environment.
		if !envFlag(env, "COMPOSE_DISABLE_ENV_FILE") {
			g.readEnvFiles(vars, []string{dotEnv})
		}
	}
	g.vars = vars
	if _, err := g.file(file, dir, 0, false, false); err != nil {
		return nil, err
	}
	if g.nodes > maxComposeNodes {
		return nil, fmt.Errorf("the compose file %s expands to more than %d YAML nodes (counting what anchors, extends, include and port ranges copy); the import reads compose files up to that size: split it, or import its services from smaller files", file, maxComposeNodes)
	}
	// A variable an env file filled in from the environment reaches the
	// manifests through each variable it set that the files use.
	for queue := sortedKeys(g.used); len(queue) > 0; queue = queue[1:] {
		for _, k := range g.filledFrom[queue[0]] {
			if !g.used[k] {
				g.used[k] = true
				queue = append(queue, k)
			}
		}
	}
	var fromEnv []string
	for _, k := range sortedKeys(g.used) {
		// Equal to the project's own (a shell that sourced the .env):
		// nothing of the operator's.
		if v, ok := g.env[k]; ok && !slices.Contains(g.fileValues[k], v) {
			fromEnv = append(fromEnv, k)
		}
	}
	return fromEnv, nil
}

// guard walks a compose file and the files it names, once each.
type guard struct {
	project   projectDir
	hostFiles bool // --copy-host-files: files outside it may be read
	vars      map[string]string
	files     map[walked]*guarded // nil while the file is being walked (a cycle)
	nodes     int                 // what compose-go will expand, so far
	// env is the environment the import runs in, fileValues what the
	// project's .env and include env files set each variable to,
	// filledFrom the variables of the environment they were read in that
	// those values were filled in from (by name, whichever include), and
	// used the variables the walked files take from the environment.
	env        map[string]string
	fileValues map[string][]string
	filledFrom map[string][]string
	used       map[string]bool
}

// readEnvFiles reads the .env or an include's env files as compose-go
// reads them, with dotenv.GetEnvFromFile and vars, the environment they are
// read in: ${VAR} in their values is filled in from vars, then from what
// they set before. It adds to vars what they set and vars does not (vars
// wins, as in compose-go), keeps their values as the project's, and notes
// which variables of vars each value in effect was filled in from.
func (g *guard) readEnvFiles(vars map[string]string, paths []string) {
	m, err := dotenv.GetEnvFromFile(vars, paths)
	if err != nil {
		return // compose-go fails on the same error
	}
	from := filledFrom(vars, paths)
	for k, v := range m {
		if _, set := vars[k]; !set {
			vars[k] = v
		}
		g.fileValues[k] = append(g.fileValues[k], v)
		if vars[k] == v {
			g.filledFrom[k] = append(g.filledFrom[k], from[k]...)
		}
	}
}

// marker stands for a variable's value in filledFrom's parse.
var marker = regexp.MustCompile("\x00([^\x00]+)\x00")

// filledFrom says which variables of vars each value env files set was
// filled in from: it parses them as GetEnvFromFile does (one after the
// other, a value taking from vars first, then from what they set before),
// with each value of vars that is not empty replaced by a marker naming
// it, and finds the markers in what they set. A variable the value only
// tests (${V:+x}), or one set empty, has put nothing of its own there.
func filledFrom(vars map[string]string, paths []string) map[string][]string {
	var src bytes.Buffer
	for _, p := range paths {
		real, err := filepath.EvalSymlinks(p)
		if err != nil {
			return nil
		}
		b, err := readSmall(real, maxComposeFile)
		if err != nil {
			return nil
		}
		src.Write(bytes.TrimPrefix(b, []byte("\uFEFF")))
		src.WriteByte('\n')
	}
	set, err := dotenv.ParseWithLookup(&src, func(k string) (string, bool) {
		v, ok := vars[k]
		if ok && v != "" {
			v = "\x00" + k + "\x00"
		}
		return v, ok
	})
	if err != nil {
		return nil
	}
	out := map[string][]string{}
	for k, v := range set {
		for _, m := range marker.FindAllStringSubmatch(v, -1) {
			out[k] = append(out[k], m[1])
		}
	}
	return out
}

// walked is a file as compose-go loads it, each way of which can name
// different files: as an extends base (asBase) it resolves the file's paths
// before following its extends, otherwise not; its relative paths start at
// base (an include's project_directory); and it is interpolated with vars
// (digested), which an include's env files change. compose-go loads a file
// again for each of these that differs.
type walked struct {
	path   string
	asBase bool
	base   string
	vars   [sha256.Size]byte
}

// digest stands for vars in a walked file's key.
func digest(vars map[string]string) [sha256.Size]byte {
	h := sha256.New()
	for _, k := range sortedKeys(vars) {
		fmt.Fprintf(h, "%d:%s%d:%s", len(k), k, len(vars[k]), vars[k])
	}
	var d [sha256.Size]byte
	h.Sum(d[:0])
	return d
}

// guarded is what one walked file costs and what each of its services
// weighs once its extends are copied in.
type guarded struct {
	cost     int
	services map[string]int
}

// spend adds n to the nodes counted, saturating well past the limit so no
// sum of hostile numbers wraps.
func (g *guard) spend(n int) {
	g.nodes = min(g.nodes+n, 4*maxComposeNodes)
}

func (g *guard) over() bool { return g.nodes > maxComposeNodes }

// regularFile says why p is not a regular file of a bounded size.
func regularFile(p, what string) error {
	fi, err := os.Stat(p)
	if errors.Is(err, fs.ErrNotExist) {
		return nil // compose-go says whether a missing one matters
	}
	if err != nil {
		return fmt.Errorf("%s %s: %w", what, p, err)
	}
	if !fi.Mode().IsRegular() {
		kind := "not a regular file"
		switch t := fi.Mode().Type(); {
		case t&fs.ModeDir != 0:
			kind = "a directory"
		case t&fs.ModeDevice != 0:
			kind = "a device"
		case t&fs.ModeNamedPipe != 0:
			kind = "a named pipe"
		case t&fs.ModeSocket != 0:
			kind = "a socket"
		}
		return fmt.Errorf("%s %s is %s; the import reads only regular files", what, p, kind)
	}
	if fi.Size() > maxComposeFile {
		return fmt.Errorf("%s %s is %d bytes, more than the import reads (%d)", what, p, fi.Size(), maxComposeFile)
	}
	return nil
}

// insideProject refuses a file whose values would be read into a manifest
// (an env_file, a label_file, the .env) when it lies outside the project's
// directory once links are followed: a link to /root/secrets.env, or an
// absolute host path, unless --copy-host-files asks for it.
func insideProject(p, what string, project projectDir, hostFiles bool) error {
	real, err := filepath.EvalSymlinks(p)
	if err != nil || project.real == "" || withinDir(real, project.real) {
		return nil // absent: compose-go says whether that matters
	}
	if project.holds(p) {
		// In the project by its name, out of it by a link (at any level):
		// never followed.
		return fmt.Errorf("%s %s leads out of the project's directory %s (to %s): the import follows no link out of it; copy the file into the project", what, p, project.real, real)
	}
	if hostFiles {
		return nil
	}
	return fmt.Errorf("%s %s is outside the project's directory %s: the import reads into manifests, which every node replicates, only the project's own files; copy it into the project, or pass --copy-host-files", what, p, project.real)
}

// projectDir is the compose file's directory as it was named (a link to
// it included) and with links resolved.
type projectDir struct{ named, real string }

// holds says whether p is in the project by its name: under the directory
// as named or as resolved, whatever links lie below it.
func (d projectDir) holds(p string) bool {
	p = filepath.Clean(p)
	return d.named != "" && withinDir(p, d.named) || d.real != "" && withinDir(p, d.real)
}

func withinDir(p, dir string) bool {
	rel, err := filepath.Rel(dir, p)
	return err == nil && rel != ".." && !strings.HasPrefix(rel, "../")
}

// file walks one compose file and adds what it costs to g.nodes. A file
// walked before the same way (see walked) costs again when again is set:
// compose-go loads an included file for each include of it, but an
// extended one once. asBase says the file is walked as an extends names it
// (an extends base), not as the compose file or an included one.
func (g *guard) file(file, base string, depth int, again, asBase bool) (*guarded, error) {
	cur := walked{file, asBase, base, digest(g.vars)}
	if done, seen := g.files[cur]; seen {
		if done != nil && again {
			g.spend(done.cost)
		}
		return done, nil // nil: a cycle, which compose-go reports
	}
	if depth > maxGuardDepth {
		return nil, fmt.Errorf("%s: extends and include nest more than %d files deep", file, maxGuardDepth)
	}
	if err := regularFile(file, "compose file"); err != nil {
		return nil, err
	}
	raw, err := os.ReadFile(file)
	if err != nil {
		return nil, err
	}
	g.files[cur] = nil
	out := &guarded{services: map[string]int{}}
	before := g.nodes
	defer func() {
		out.cost = g.nodes - before
		g.files[cur] = out
	}()
	// Count every document's nodes as compose-go will expand them (it reads
	// with this YAML library too), before anything is expanded.
	var docs []*yaml.Node
	dec := yaml.NewDecoder(bytes.NewReader(raw))
	for {
		var n yaml.Node
		if err := dec.Decode(&n); err != nil {
			break // io.EOF, or an error compose-go reports
		}
		docs = append(docs, &n)
	}
	memo := map[*yaml.Node]size{}
	for _, d := range docs {
		m := measure(d, memo)
		g.spend(m.nodes)
		if m.depth > maxComposeDepth {
			return out, fmt.Errorf("%s nests more than %d levels deep (counting what anchors copy); the import reads compose files up to that depth, and real ones nest less than 15", file, maxComposeDepth)
		}
	}
	if g.over() {
		return out, nil
	}
	dir := base // where the file's relative paths start (an include's project_directory)
	// resolve is where compose-go reads a path the file names, once
	// interpolated; home says whether it expands a leading ~ there. It
	// expands one in every env_file and label_file (paths.ResolveRelativePaths
	// runs before it reads them), never in include paths (ApplyInclude runs
	// before that), and in extends paths only in an extends base: the
	// compose file's and an included file's extends are followed before
	// their paths are resolved, while loadExtendsBase resolves a base's
	// paths (its extends.file included) before its own extends are followed.
	resolve := func(p string, home bool) (string, bool) {
		s, err := template.Substitute(p, g.lookup)
		if err != nil || s == "" {
			return "", false
		}
		if home {
			s = expandUser(s)
		}
		if !filepath.IsAbs(s) {
			s = filepath.Join(dir, s)
		}
		return s, true
	}
	check := func(p any, what string) error {
		s, ok := p.(string)
		if !ok {
			return nil
		}
		if path, ok := resolve(s, true); ok {
			if err := regularFile(path, what); err != nil {
				return err
			}
			return insideProject(path, what, g.project, g.hostFiles)
		}
		return nil
	}
	// nested walks a file an extends (asBase) or include names: a regular
	// file, inside the project (its values land in manifests as an
	// env_file's do), from base.
	nested := func(p any, what string, again, asBase bool, base string) (*guarded, error) {
		s, ok := p.(string)
		if !ok {
			return nil, nil
		}
		// A leading ~ is the home in an extends path of a file that is
		// itself an extends base (cur.asBase), and nowhere else: not in
		// the compose file's or an included file's extends paths, nor in
		// include paths.
		if path, ok := resolve(s, asBase && cur.asBase); ok && !strings.Contains(path, "://") {
			if err := regularFile(path, what); err != nil {
				return nil, err
			}
			if err := insideProject(path, what, g.project, g.hostFiles); err != nil {
				return nil, err
			}
			if base == "" {
				base = filepath.Dir(path)
			}
			return g.file(path, base, depth+1, again, asBase)
		}
		return nil, nil
	}
	// include walks one include entry: its files, interpolated with its
	// env files (by default the .env of its project directory) under the
	// includer's environment, each checked as the top file's .env is.
	include := func(paths []any, projectDir any, envFiles []any) error {
		// compose-go (ApplyInclude) joins a relative env_file or
		// project_directory to the working directory it loads the file
		// that holds the include with. For an included file that is a
		// relative path (the project directory of the include that
		// loaded it, relative to its includer's, unless that include gave
		// an absolute project_directory), so compose-go then reads the
		// joined path from the directory the import runs in, not from the
		// project. Rather than depend on that directory, the guard refuses
		// them in every included file. (An extends base is not included:
		// compose-go applies no include in it.)
		if depth > 0 && !cur.asBase {
			var names []string
			for _, p := range paths {
				names = append(names, fmt.Sprint(p))
			}
			for i, v := range append([]any{projectDir}, envFiles...) {
				key := "env_file"
				if i == 0 {
					key = "project_directory"
				}
				s, _ := v.(string)
				if s, err := template.Substitute(s, g.lookup); err == nil && s != "" && !filepath.IsAbs(s) {
					return fmt.Errorf("%s: the %s %s of its include of %s is a relative path; compose-go resolves that, in an include inside an included file, against the directory the import runs in, not against the file's: write an absolute path, or move the include up to the top-level compose file", file, key, s, strings.Join(names, ", "))
				}
			}
		}
		incDir := ""
		if pd, ok := projectDir.(string); ok && pd != "" {
			p, ok := resolve(pd, false)
			if !ok {
				return nil
			}
			if err := insideProject(p, "project_directory of an include:", g.project, g.hostFiles); err != nil {
				return err
			}
			incDir = p
		} else if len(paths) > 0 {
			if s, ok := paths[0].(string); ok {
				if p, ok := resolve(s, false); ok {
					incDir = filepath.Dir(p)
				}
			}
		}
		// As compose-go's ApplyInclude: the project directory's .env when
		// no env_file is given, and /dev/null as an env_file is none.
		if len(envFiles) == 0 && incDir != "" {
			if fi, err := os.Stat(filepath.Join(incDir, ".env")); err == nil && !fi.IsDir() {
				envFiles = []any{filepath.Join(incDir, ".env")}
			}
		}
		var read []string
		for _, e := range envFiles {
			es, ok := e.(string)
			if !ok {
				continue
			}
			p, ok := resolve(es, false)
			if !ok || p == "/dev/null" {
				continue
			}
			if err := regularFile(p, "env_file of an include:"); err != nil {
				return err
			}
			if err := insideProject(p, "env_file of an include:", g.project, g.hostFiles); err != nil {
				return err
			}
			read = append(read, p)
		}
		vars := maps.Clone(g.vars)
		if len(read) > 0 {
			g.readEnvFiles(vars, read)
		}
		saved := g.vars
		g.vars = vars
		defer func() { g.vars = saved }()
		for _, p := range paths {
			if _, err := nested(p, "include", true, false, incDir); err != nil {
				return err
			}
		}
		return nil
	}
	for _, d := range docs {
		// Small enough now to expand: at most maxComposeNodes nodes.
		var doc map[string]any
		if d.Decode(&doc) != nil {
			continue // compose-go says what is wrong with it
		}
		for k := range template.ExtractVariables(doc, template.DefaultPattern) {
			g.used[k] = true
		}
		services, _ := doc["services"].(map[string]any)
		for _, name := range sortedKeys(services) {
			svc, _ := services[name].(map[string]any)
			// compose-go reads a pre_start hook's env_file and label_file
			// as a service's: a hook is a container of its own.
			specs := []map[string]any{svc}
			whose := []string{"service " + name}
			hooks, _ := svc["pre_start"].([]any)
			for i, h := range hooks {
				if hook, ok := h.(map[string]any); ok {
					specs = append(specs, hook)
					whose = append(whose, fmt.Sprintf("pre_start hook %d of service %s", i+1, name))
				}
			}
			for i, spec := range specs {
				for _, key := range []string{"env_file", "label_file"} {
					for _, p := range pathsOf(spec[key]) {
						if err := check(p, fmt.Sprintf("%s of %s:", key, whose[i])); err != nil {
							return out, err
						}
					}
				}
			}
			g.bareEnv(svc["environment"])
			for _, e := range envFiles(svc["env_file"]) {
				if p, ok := resolve(e.path, true); ok {
					g.envFileUses(p, e.format)
				}
			}
			if err := g.ports(name, svc); err != nil {
				return out, err
			}
		}
		// What each extends copies: the service it names, as that one
		// weighs with its own extends. compose-go's ApplyExtends treats
		// jobs as services: a job's extends names another job, or a
		// service of the file it names. It applies them in the compose
		// file and included files only: in an extends base it follows
		// the extends of the services the chain names, never of jobs.
		sections := []string{"services", "jobs"}
		if cur.asBase {
			sections = sections[:1]
		}
		for _, section := range sections {
			entries, _ := doc[section].(map[string]any)
			kind := strings.TrimSuffix(section, "s")
			// A service's weight is what other files' extends copy; a
			// job's no other file reads.
			weights := out.services
			if section == "jobs" {
				weights = map[string]int{}
			}
			weighing := map[string]bool{}
			var weigh func(name string) (int, error)
			weigh = func(name string) (int, error) {
				if n, ok := weights[name]; ok {
					return n, nil
				}
				if weighing[name] || g.over() {
					return 0, nil // a cycle (compose-go reports it), or already refused
				}
				weighing[name] = true
				svc, _ := entries[name].(map[string]any)
				ports := g.portCount(svc)
				n := nodesOf(svc) + ports
				var base int
				switch ext := svc["extends"].(type) {
				case string:
					b, err := weigh(ext)
					if err != nil {
						return 0, err
					}
					base = b
				case map[string]any:
					bname, _ := ext["service"].(string)
					if ext["file"] == nil {
						b, err := weigh(bname)
						if err != nil {
							return 0, err
						}
						base = b
					} else {
						other, err := nested(ext["file"], fmt.Sprintf("extends file of %s %s:", kind, name), false, true, "")
						if err != nil {
							return 0, err
						}
						if other != nil {
							base = other.services[bname]
						}
					}
				}
				g.spend(base + ports) // its own nodes are counted already
				weights[name] = n + base
				return n + base, nil
			}
			for _, name := range sortedKeys(entries) {
				if _, err := weigh(name); err != nil {
					return out, err
				}
			}
		}
		includes, _ := doc["include"].([]any)
		for _, inc := range includes {
			switch v := inc.(type) {
			case string:
				if err := include([]any{v}, nil, nil); err != nil {
					return out, err
				}
			case map[string]any:
				if err := include(pathsOf(v["path"]), v["project_directory"], pathsOf(v["env_file"])); err != nil {
					return out, err
				}
			}
		}
	}
	return out, nil
}

func (g *guard) lookup(k string) (string, bool) { v, ok := g.vars[k]; return v, ok }

// expandUser is compose-go's paths.ExpandUser: a path that starts with ~ is
// under the home of the process (its HOME, whatever Options.Env says), "~x"
// as "~/x"; without a home it is left as it is. Joined to the project's
// directory instead, "~/x.env" would pass as absent while compose-go read
// the operator's own file into the manifest (or hung on a FIFO there).
func expandUser(p string) string {
	if !strings.HasPrefix(p, "~") {
		return p
	}
	home, err := os.UserHomeDir()
	if err != nil {
		return p
	}
	return filepath.Join(home, p[1:])
}

// size is what a node stands for once its aliases are copied: how many
// nodes, and how deep it nests.
type size struct{ nodes, depth int }

// measure computes n's size, each anchored node once (so a "billion
// laughs" is counted, not walked). An alias to a node that contains it adds
// nothing more: compose-go refuses it. Both counts stop past their bounds,
// so no hostile sum wraps and a deep nesting costs no more than the bound.
func measure(n *yaml.Node, memo map[*yaml.Node]size) size {
	if n == nil {
		return size{}
	}
	if c, ok := memo[n]; ok {
		return c
	}
	memo[n] = size{} // in progress
	c := size{nodes: 1}
	if n.Kind == yaml.AliasNode {
		c = measure(n.Alias, memo)
	}
	for _, k := range n.Content {
		m := measure(k, memo)
		c.nodes = min(c.nodes+m.nodes, 4*maxComposeNodes)
		c.depth = max(c.depth, m.depth)
	}
	c.depth = min(c.depth+1, maxComposeDepth+1)
	memo[n] = c
	return c
}

// expanded is how many nodes n stands for.
func expanded(n *yaml.Node, memo map[*yaml.Node]size) int { return measure(n, memo).nodes }

// nodesOf counts the nodes of a decoded (already small) value.
func nodesOf(v any) int {
	switch v := v.(type) {
	case map[string]any:
		n := 1
		for _, e := range v {
			n += 1 + nodesOf(e)
		}
		return n
	case []any:
		n := 1
		for _, e := range v {
			n += nodesOf(e)
		}
		return n
	}
	return 1
}

// portRange matches a range of a ports entry's short form ("8000-8010").
var portRange = regexp.MustCompile(`(\d+)-(\d+)`)

// portCount is how many ports a service's ports entries become once
// compose-go expands their ranges, beyond one node per entry (counted with
// the file's nodes already).
func (g *guard) portCount(svc map[string]any) int {
	n := 0
	for _, e := range portEntries(svc) {
		n += g.portSpan(e) - 1
	}
	return n
}

func (g *guard) ports(name string, svc map[string]any) error {
	n := 0
	for _, e := range portEntries(svc) {
		span := g.portSpan(e)
		n += span
		if n > maxServicePorts {
			return fmt.Errorf("service %s: its ports entries publish more than %d ports (%q alone is %d); the import carries at most that many ports per service, each of which the manifest lists: publish the ports it listens on, not a range", name, maxServicePorts, fmt.Sprint(e), span)
		}
	}
	return nil
}

func portEntries(svc map[string]any) []any {
	l, _ := svc["ports"].([]any)
	return l
}

// portSpan is how many ports one short-form entry ("[ip:]a-b:c-d/proto",
// interpolated) publishes: its widest range (compose-go pairs a host range
// with a container range of the same width). Long-form entries are one.
func (g *guard) portSpan(e any) int {
	var s string
	switch e := e.(type) {
	case string:
		s = e
		if sub, err := template.Substitute(e, g.lookup); err == nil {
			s = sub
		}
	default:
		return 1
	}
	span := 1
	for _, m := range portRange.FindAllStringSubmatch(s, -1) {
		lo, err1 := strconv.Atoi(m[1])
		hi, err2 := strconv.Atoi(m[2])
		if err1 == nil && err2 == nil && hi >= lo {
			span = max(span, min(hi-lo+1, 1<<20))
		}
	}
	return span
}

// bareEnv marks as used the variables an environment entry names without a
// value ("environment: [TOKEN]", or "TOKEN:"): compose-go gives them the
// environment's.
func (g *guard) bareEnv(e any) {
	switch e := e.(type) {
	case map[string]any:
		for k, v := range e {
			if v == nil {
				g.used[k] = true
			}
		}
	case []any:
		for _, x := range e {
			if s, ok := x.(string); ok && !strings.Contains(s, "=") {
				g.used[s] = true
			}
		}
	}
}

// envFileUses marks as used the variables an env_file (checked already)
// takes from the environment: compose-go fills ${VAR} in its values, and a
// line that is a name alone, from the project's environment first.
func (g *guard) envFileUses(p, format string) {
	real, err := filepath.EvalSymlinks(p)
	if err != nil {
		return
	}
	b, err := readSmall(real, maxComposeFile)
	if err != nil {
		return
	}
	dotenv.ParseWithFormat(bytes.NewReader(b), p, map[string]string{}, func(k string) (string, bool) {
		g.used[k] = true
		return g.lookup(k)
	}, format)
}

type envFile struct{ path, format string }

// envFiles lists an env_file field's files: a path, a list of paths, or a
// list of {path, format}.
func envFiles(v any) []envFile {
	switch v := v.(type) {
	case string:
		return []envFile{{path: v}}
	case []any:
		var out []envFile
		for _, e := range v {
			switch e := e.(type) {
			case string:
				out = append(out, envFile{path: e})
			case map[string]any:
				p, _ := e["path"].(string)
				f, _ := e["format"].(string)
				out = append(out, envFile{p, f})
			}
		}
		return out
	}
	return nil
}

// pathsOf lists the paths of a field that is a path, a list of paths, or a
// list of {path: ...} (env_file's long form).
func pathsOf(v any) []any {
	switch v := v.(type) {
	case string:
		return []any{v}
	case []any:
		var out []any
		for _, e := range v {
			if m, ok := e.(map[string]any); ok {
				out = append(out, m["path"])
			} else {
				out = append(out, e)
			}
		}
		return out
	}
	return nil
}
