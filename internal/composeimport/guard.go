package composeimport

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"

	"github.com/compose-spec/compose-go/v2/dotenv"
	"github.com/compose-spec/compose-go/v2/template"
	"github.com/goccy/go-yaml"
)

// Every file compose-go reads while loading a project (the compose file, its
// .env, each env_file and label_file, each file an extends or include names)
// is read whole, with no limit: a compose file naming /dev/zero, a FIFO or a
// huge file would make `mesh import compose` hang and eat memory. guardFiles
// checks them first: each must be a regular file (after following links) of
// at most maxComposeFile bytes. Paths are interpolated as compose-go would,
// with the same environment and .env, and files named by extends and include
// are checked the same way, to a bounded depth.

const (
	maxComposeFile = 4 << 20
	maxGuardDepth  = 8
)

func guardFiles(file string, env []string) error {
	dir := filepath.Dir(file)
	vars := map[string]string{}
	for _, kv := range env {
		if k, v, ok := strings.Cut(kv, "="); ok {
			vars[k] = v
		}
	}
	if err := regularFile(file, "the compose file"); err != nil {
		return err
	}
	dotEnv := filepath.Join(dir, ".env")
	if _, err := os.Lstat(dotEnv); err == nil {
		if err := regularFile(dotEnv, "the .env beside it"); err != nil {
			return err
		}
		if m, err := dotenv.Read(dotEnv); err == nil {
			for k, v := range m {
				if _, set := vars[k]; !set {
					vars[k] = v
				}
			}
		}
	}
	return guardComposeFile(file, vars, map[string]bool{}, 0)
}

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

func guardComposeFile(file string, vars map[string]string, seen map[string]bool, depth int) error {
	if seen[file] {
		return nil
	}
	seen[file] = true
	if depth > maxGuardDepth {
		return fmt.Errorf("%s: extends and include nest more than %d files deep", file, maxGuardDepth)
	}
	if err := regularFile(file, "compose file"); err != nil {
		return err
	}
	raw, err := os.ReadFile(file)
	if err != nil {
		return err
	}
	var doc map[string]any
	if yaml.Unmarshal(raw, &doc) != nil {
		return nil // compose-go says what is wrong with it
	}
	dir := filepath.Dir(file)
	resolve := func(p string) (string, bool) {
		s, err := template.Substitute(p, func(k string) (string, bool) { v, ok := vars[k]; return v, ok })
		if err != nil || s == "" {
			return "", false
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
		if path, ok := resolve(s); ok {
			return regularFile(path, what)
		}
		return nil
	}
	nested := func(p any, what string) error {
		s, ok := p.(string)
		if !ok {
			return nil
		}
		if path, ok := resolve(s); ok && !strings.Contains(path, "://") {
			if err := regularFile(path, what); err != nil {
				return err
			}
			return guardComposeFile(path, vars, seen, depth+1)
		}
		return nil
	}
	services, _ := doc["services"].(map[string]any)
	for name, s := range services {
		svc, _ := s.(map[string]any)
		for _, key := range []string{"env_file", "label_file"} {
			for _, p := range pathsOf(svc[key]) {
				if err := check(p, fmt.Sprintf("%s of service %s:", key, name)); err != nil {
					return err
				}
			}
		}
		if ext, ok := svc["extends"].(map[string]any); ok {
			if err := nested(ext["file"], fmt.Sprintf("extends file of service %s:", name)); err != nil {
				return err
			}
		}
	}
	includes, _ := doc["include"].([]any)
	for _, inc := range includes {
		switch v := inc.(type) {
		case string:
			if err := nested(v, "include"); err != nil {
				return err
			}
		case map[string]any:
			for _, p := range pathsOf(v["path"]) {
				if err := nested(p, "include"); err != nil {
					return err
				}
			}
			for _, p := range pathsOf(v["env_file"]) {
				if err := check(p, "env_file of an include:"); err != nil {
					return err
				}
			}
		}
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
