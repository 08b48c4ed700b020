package composeimport

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"go.yaml.in/yaml/v4"

	"mesh/state/manifest"
)

// compose-go reads every file a compose file names whole: one naming a
// device, a FIFO, a directory or a huge file, directly, through a link,
// through interpolation, or from a file an extends or include names, must
// get an error that names it, at once, instead of a hang that eats memory.
func TestImportRefusesFilesItCannotReadWhole(t *testing.T) {
	dir := t.TempDir()
	fifo := filepath.Join(dir, "fifo")
	if err := syscall.Mkfifo(fifo, 0o600); err != nil {
		t.Fatal(err)
	}
	huge := filepath.Join(dir, "huge.env")
	f, err := os.Create(huge)
	if err != nil {
		t.Fatal(err)
	}
	f.Truncate(maxComposeFile + 1) // sparse
	f.Close()
	link := filepath.Join(dir, "zero-link")
	os.Symlink("/dev/zero", link)
	nestedBad := filepath.Join(dir, "base.yaml")
	os.WriteFile(nestedBad, []byte("services:\n  b:\n    image: busybox\n    env_file: /dev/zero\n"), 0o644)
	os.WriteFile(filepath.Join(dir, "good.yaml"), []byte("services:\n  g:\n    image: busybox\n"), 0o644)

	cases := []struct{ name, compose, dotEnv, want string }{
		{"env_file a device", "services:\n  a:\n    image: busybox\n    env_file: /dev/zero\n", "", "env_file of service a: /dev/zero is a device"},
		{"env_file long form, a FIFO", "services:\n  a:\n    image: busybox\n    env_file:\n      - path: " + fifo + "\n", "", "is a named pipe"},
		{"label_file a link to a device", "services:\n  a:\n    image: busybox\n    label_file: " + link + "\n", "", "is a device"},
		{"env_file too big", "services:\n  a:\n    image: busybox\n    env_file: huge.env\n", "", "more than the import reads"},
		{"extends a directory", "services:\n  a:\n    image: busybox\n    extends:\n      file: " + dir + "\n      service: b\n", "", "is a directory"},
		{"extends through interpolation", "services:\n  a:\n    extends:\n      file: ${NOPE:-/dev/zero}\n      service: b\n", "", "is a device"},
		{"extends a file that names a device", "services:\n  a:\n    extends:\n      file: base.yaml\n      service: b\n", "", "env_file of service b: /dev/zero is a device"},
		{"include a device", "include:\n  - /dev/zero\nservices:\n  a:\n    image: busybox\n", "", "is a device"},
		{"include's env_file a FIFO", "include:\n  - path: good.yaml\n    env_file: " + fifo + "\nservices:\n  a:\n    image: busybox\n", "", "is a named pipe"},
		{"path from .env", "services:\n  a:\n    image: busybox\n    env_file: ${WHERE}\n", "WHERE=/dev/zero\n", "is a device"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			d := t.TempDir()
			for _, p := range []string{"huge.env", "base.yaml", "good.yaml"} {
				os.Link(filepath.Join(dir, p), filepath.Join(d, p)) // a link out of the project is refused
			}
			file := filepath.Join(d, "compose.yaml")
			os.WriteFile(file, []byte(c.compose), 0o644)
			if c.dotEnv != "" {
				os.WriteFile(filepath.Join(d, ".env"), []byte(c.dotEnv), 0o644)
			}
			done := make(chan error, 1)
			go func() {
				_, err := Import(context.Background(), Options{File: file, Env: []string{}})
				done <- err
			}()
			select {
			case err := <-done:
				if err == nil || !strings.Contains(err.Error(), c.want) {
					t.Fatalf("got %v, want an error saying %q", err, c.want)
				}
			case <-time.After(20 * time.Second):
				t.Fatal("the import hung")
			}
		})
	}
	// The compose file and its .env themselves.
	d := t.TempDir()
	os.Symlink(fifo, filepath.Join(d, ".env"))
	os.WriteFile(filepath.Join(d, "compose.yaml"), []byte("services:\n  a:\n    image: busybox\n"), 0o644)
	if _, err := Import(context.Background(), Options{File: filepath.Join(d, "compose.yaml"), Env: []string{}}); err == nil || !strings.Contains(err.Error(), "the .env beside it") {
		t.Fatalf("a FIFO for .env: %v", err)
	}
	if _, err := Import(context.Background(), Options{File: "/dev/zero", Env: []string{}}); err == nil || !strings.Contains(err.Error(), "the compose file /dev/zero is a device") {
		t.Fatalf("/dev/zero as the compose file: %v", err)
	}
}

// importWithin imports, failing the test when the import has not returned
// after 20 s (a FIFO opened blocks for good).
func importWithin(t *testing.T, opts Options) (*Result, error) {
	t.Helper()
	type result struct {
		res *Result
		err error
	}
	done := make(chan result, 1)
	go func() {
		res, err := Import(context.Background(), opts)
		done <- result{res, err}
	}()
	select {
	case r := <-done:
		return r.res, r.err
	case <-time.After(20 * time.Second):
		t.Fatal("the import hung")
		return nil, nil
	}
}

// compose-go reads an env_file or label_file "~/x.env" from the home of the
// process, so the guard checks that file: one outside the project is
// refused unless --copy-host-files, a FIFO always. The extends and include
// paths of the compose file and of included files compose-go joins to the
// directory as they are ("~" a directory of the project), and the guard
// checks them there; an extends path in a file an extends names it expands
// as an env_file's (TestImportExpandsHomeInExtendsBases).
func TestImportExpandsHomeAsComposeGoDoes(t *testing.T) {
	home := t.TempDir()
	os.WriteFile(filepath.Join(home, "secret.env"), []byte("TOKEN=operator-private\n"), 0o600)
	if err := syscall.Mkfifo(filepath.Join(home, "fifo"), 0o600); err != nil {
		t.Fatal(err)
	}
	t.Setenv("HOME", home)
	for _, c := range []struct {
		name, svc string
		copyHost  bool
		want      string
	}{
		{"env_file", `env_file: ["~/secret.env"]`, false, "env_file of service a: " + home + "/secret.env is outside the project's directory"},
		{"label_file", `label_file: ["~/secret.env"]`, false, "label_file of service a: " + home + "/secret.env is outside the project's directory"},
		{"env_file long form, ~ then a name", `env_file: [{path: "~secret.env"}]`, false, home + "/secret.env is outside"},
		{"env_file a FIFO", `env_file: ["~/fifo"]`, true, "env_file of service a: " + home + "/fifo is a named pipe"},
		{"label_file a FIFO", `label_file: ["~/fifo"]`, true, home + "/fifo is a named pipe"},
	} {
		t.Run(c.name, func(t *testing.T) {
			file := writeProject(t, map[string]string{"compose.yaml": "services:\n  a:\n    image: busybox\n    " + c.svc + "\n"})
			_, err := importWithin(t, Options{File: file, Env: []string{}, CopyHostFiles: c.copyHost})
			if err == nil || !strings.Contains(err.Error(), c.want) {
				t.Fatalf("got %v, want an error saying %q", err, c.want)
			}
		})
	}
	// Asked for, the home's file is read, as compose-go reads it.
	file := writeProject(t, map[string]string{"compose.yaml": "services:\n  a:\n    image: busybox\n    env_file: [\"~/secret.env\"]\n"})
	res, err := importWithin(t, Options{File: file, Env: []string{}, CopyHostFiles: true})
	if err != nil || !strings.Contains(manifestOf(t, res, "a"), `"TOKEN":"operator-private"`) {
		t.Fatalf("with --copy-host-files: %v", err)
	}
	for name, compose := range map[string]string{
		"include's env_file": "include:\n  - path: inc.yaml\n    env_file: \"~/fifo\"\nservices:\n  a:\n    image: busybox\n",
		"extends file":       "services:\n  a:\n    extends: {file: \"~/fifo\", service: b}\n",
	} {
		d := filepath.Dir(writeProject(t, map[string]string{"compose.yaml": compose, "inc.yaml": "services:\n  i:\n    image: busybox\n"}))
		os.Mkdir(filepath.Join(d, "~"), 0o755)
		syscall.Mkfifo(filepath.Join(d, "~", "fifo"), 0o600)
		_, err := importWithin(t, Options{File: filepath.Join(d, "compose.yaml"), Env: []string{}})
		if err == nil || !strings.Contains(err.Error(), filepath.Join(d, "~", "fifo")+" is a named pipe") {
			t.Errorf("%s: %v, want the project's ~/fifo refused", name, err)
		}
	}
}

// compose-go resolves the paths of a file an extends names (an extends base)
// before it follows that file's own extends, and so reads an extends file
// "~/c.yaml" named there from the home of the process; the guard checks
// that file, not the project's "~/c.yaml": one outside the project is
// refused unless --copy-host-files, a FIFO always, and with the flag the
// home's file is what compose-go reads.
func TestImportExpandsHomeInExtendsBases(t *testing.T) {
	home := t.TempDir()
	os.WriteFile(filepath.Join(home, "c.yaml"), []byte("services:\n  c:\n    image: busybox\n    environment: [FROM_HOME=operator-private]\n"), 0o600)
	if err := syscall.Mkfifo(filepath.Join(home, "fifo.yaml"), 0o600); err != nil {
		t.Fatal(err)
	}
	t.Setenv("HOME", home)
	compose := "services:\n  a:\n    extends: {file: b.yaml, service: b}\n"
	for _, c := range []struct {
		name, base string
		copyHost   bool
		want       string
	}{
		{"outside", "services:\n  b:\n    extends: {file: \"~/c.yaml\", service: c}\n", false, "extends file of service b: " + home + "/c.yaml is outside the project's directory"},
		{"~ then a name", "services:\n  b:\n    extends: {file: \"~c.yaml\", service: c}\n", false, home + "/c.yaml is outside"},
		{"through a service of the base", "services:\n  b:\n    extends: b2\n  b2:\n    extends: {file: \"~/c.yaml\", service: c}\n", false, "extends file of service b2: " + home + "/c.yaml is outside"},
		{"a FIFO", "services:\n  b:\n    extends: {file: \"~/fifo.yaml\", service: c}\n", true, "extends file of service b: " + home + "/fifo.yaml is a named pipe"},
	} {
		t.Run(c.name, func(t *testing.T) {
			// The project's own "~/c.yaml", which compose-go does not read.
			file := writeProject(t, map[string]string{"compose.yaml": compose, "b.yaml": c.base, "~/c.yaml": "services:\n  c:\n    image: busybox\n", "~/fifo.yaml": "services:\n  c:\n    image: busybox\n"})
			_, err := importWithin(t, Options{File: file, Env: []string{}, CopyHostFiles: c.copyHost})
			if err == nil || !strings.Contains(err.Error(), c.want) {
				t.Fatalf("got %v, want an error saying %q", err, c.want)
			}
		})
	}
	file := writeProject(t, map[string]string{"compose.yaml": compose, "b.yaml": "services:\n  b:\n    extends: {file: \"~/c.yaml\", service: c}\n"})
	res, err := importWithin(t, Options{File: file, Env: []string{}, CopyHostFiles: true})
	if err != nil || !strings.Contains(manifestOf(t, res, "a"), "operator-private") {
		t.Fatalf("with --copy-host-files: %v", err)
	}
}

// compose-go applies the extends of jobs as it does services', reading the
// file a job's extends names: each is checked as a service's extends file
// (a FIFO refused at once, a file outside the project unless
// --copy-host-files), and what a job's extends copies counts toward the
// bound on what the files expand to.
func TestImportGuardsJobsExtends(t *testing.T) {
	out := t.TempDir()
	os.WriteFile(filepath.Join(out, "bad.yaml"), []byte("services:\n  c:\n    image: busybox\n    environment: [FROM_OUTSIDE=operator-private]\n"), 0o600)
	if err := syscall.Mkfifo(filepath.Join(out, "fifo.yaml"), 0o600); err != nil {
		t.Fatal(err)
	}
	job := func(extends string) string {
		return "services:\n  app:\n    image: busybox\njobs:\n  j:\n    extends: " + extends + "\n    triggers: {manual: true}\n"
	}
	env := func(n int) string {
		var b strings.Builder
		for i := range n {
			fmt.Fprintf(&b, "      V%d: x\n", i)
		}
		return b.String()
	}
	var copies strings.Builder
	copies.WriteString("services:\n  app:\n    image: busybox\njobs:\n  base:\n    image: busybox\n    triggers: {manual: true}\n    environment:\n" + env(400))
	for i := range 30 {
		fmt.Fprintf(&copies, "  j%d:\n    extends: base\n    triggers: {manual: true}\n", i)
	}
	for _, c := range []struct {
		name, compose string
		copyHost      bool
		want          string
	}{
		{"outside", job("{file: \"${HOME}/bad.yaml\", service: c}"), false, "extends file of job j: " + out + "/bad.yaml is outside the project's directory"},
		{"a FIFO", job("{file: " + out + "/fifo.yaml, service: c}"), true, "extends file of job j: " + out + "/fifo.yaml is a named pipe"},
		{"a job extends a job", job("k") + "  k:\n    extends: {file: " + out + "/bad.yaml, service: c}\n    triggers: {manual: true}\n", false, "extends file of job k: " + out + "/bad.yaml is outside"},
		{"extends copies", copies.String(), false, "expands to more than"},
		{"in the project", job("{file: base.yaml, service: c}"), false, ""},
	} {
		t.Run(c.name, func(t *testing.T) {
			file := writeProject(t, map[string]string{"compose.yaml": c.compose, "base.yaml": "services:\n  c:\n    image: busybox\n"})
			_, err := importWithin(t, Options{File: file, Env: []string{"HOME=" + out}, CopyHostFiles: c.copyHost})
			if c.want == "" && err != nil || c.want != "" && (err == nil || !strings.Contains(err.Error(), c.want)) {
				t.Fatalf("got %v, want an error saying %q", err, c.want)
			}
		})
	}
}

// compose-go reads the .env and an include's env files with
// dotenv.GetEnvFromFile, filling ${VAR} in their values from the
// environment (and the includer's .env), and skips the .env when
// COMPOSE_DISABLE_ENV_FILE is set: the guard reads them the same way, so a
// path built from their values is the one compose-go reads, and is
// checked (a FIFO refused at once, a file outside the project unless
// --copy-host-files).
func TestImportReadsEnvFilesAsComposeGoDoes(t *testing.T) {
	out := t.TempDir()
	os.WriteFile(filepath.Join(out, "secret.env"), []byte("S=operator-private\n"), 0o600)
	svc := func(envFile string) string {
		return "services:\n  a:\n    image: busybox\n    env_file: [\"" + envFile + "\"]\n"
	}
	inc := "include:\n  - path: inc.yaml\n    env_file: inc.env\nservices:\n  a:\n    image: busybox\n"
	for _, c := range []struct {
		name  string
		files map[string]string
		env   []string
		want  string
	}{
		{".env fills a path from the environment", map[string]string{"compose.yaml": svc("${EF}"), ".env": "EF=${HOME}/secret.env\n"}, nil,
			"env_file of service a: " + out + "/secret.env is outside the project's directory"},
		{".env sets a path when the environment sets a variable", map[string]string{"compose.yaml": svc("${EF}"), ".env": "EF=${HOME:+fifo}\n"}, nil,
			"fifo is a named pipe"},
		{".env from an earlier line", map[string]string{"compose.yaml": svc("${EF}"), ".env": "D=${HOME}\nEF=${D}/secret.env\n"}, nil,
			out + "/secret.env is outside"},
		{"an include's env file fills a path from the environment", map[string]string{"compose.yaml": inc, "inc.env": "IEF=${HOME}/secret.env\n",
			"inc.yaml": "services:\n  i:\n    image: busybox\n    env_file: [\"${IEF}\"]\n"}, nil,
			"env_file of service i: " + out + "/secret.env is outside"},
		{"an include's env file takes the includer's .env", map[string]string{"compose.yaml": inc, ".env": "W=fifo\n", "inc.env": "IEF=${W}\n",
			"inc.yaml": "services:\n  i:\n    image: busybox\n    env_file: [\"${IEF}\"]\n"}, nil,
			"env_file of service i: "},
		{"COMPOSE_DISABLE_ENV_FILE", map[string]string{"compose.yaml": svc("${EF:-fifo}"), ".env": "EF=ok.env\n", "ok.env": "OK=1\n"}, []string{"COMPOSE_DISABLE_ENV_FILE=1"},
			"fifo is a named pipe"},
		{"an include's env file /dev/null", map[string]string{"compose.yaml": "include:\n  - path: inc.yaml\n    env_file: /dev/null\nservices:\n  a:\n    image: busybox\n",
			"inc.yaml": "services:\n  i:\n    image: busybox\n"}, nil, ""},
	} {
		t.Run(c.name, func(t *testing.T) {
			file := writeProject(t, c.files)
			if err := syscall.Mkfifo(filepath.Join(filepath.Dir(file), "fifo"), 0o600); err != nil {
				t.Fatal(err)
			}
			_, err := importWithin(t, Options{File: file, Env: append([]string{"HOME=" + out}, c.env...)})
			if c.want == "" && err != nil || c.want != "" && (err == nil || !strings.Contains(err.Error(), c.want)) {
				t.Fatalf("got %v, want an error saying %q", err, c.want)
			}
		})
	}
}

// compose-go loads a file included twice once for each include whose env
// files or project_directory differ, and each load can name other files:
// the guard walks it each way, so a FIFO the second include's values lead
// to is refused, not read.
func TestImportWalksEachIncludeOfAFile(t *testing.T) {
	for _, c := range []struct {
		name  string
		files map[string]string
	}{
		{"env files", map[string]string{
			"compose.yaml": "include:\n  - path: a.yaml\n    env_file: good.env\n  - path: a.yaml\n    env_file: bad.env\nservices:\n  m:\n    image: busybox\n",
			"a.yaml":       "services:\n  x:\n    image: busybox\n    env_file: [\"${E}\"]\n",
			"good.env":     "E=ok.env\n", "ok.env": "K=1\n", "bad.env": "E=fifo\n",
		}},
		{"project directories", map[string]string{
			"compose.yaml": "include:\n  - path: a.yaml\n    project_directory: good\n  - path: a.yaml\n    project_directory: .\nservices:\n  m:\n    image: busybox\n",
			"a.yaml":       "services:\n  x:\n    image: busybox\n    env_file: [fifo]\n",
			"good/fifo":    "K=1\n",
		}},
	} {
		t.Run(c.name, func(t *testing.T) {
			file := writeProject(t, c.files)
			fifo := filepath.Join(filepath.Dir(file), "fifo")
			if err := syscall.Mkfifo(fifo, 0o600); err != nil {
				t.Fatal(err)
			}
			_, err := importWithin(t, Options{File: file, Env: []string{}})
			if want := "env_file of service x: " + fifo + " is a named pipe"; err == nil || !strings.Contains(err.Error(), want) {
				t.Fatalf("got %v, want an error saying %q", err, want)
			}
		})
	}
}

// For an include inside an included file, compose-go joins a relative
// env_file or project_directory to the included file's directory relative
// to the project (sub), then reads it from the directory the import runs
// in: run from the project's parent, "../proj/fifo" in proj/sub/inc.yaml
// is the project's own fifo to compose-go, while the file's directory
// makes it proj/proj/fifo (absent). The guard cannot check what compose-go
// reads without depending on that directory, so it refuses both, at once;
// absolute ones import, and are read.
func TestImportRefusesRelativePathsOfNestedIncludes(t *testing.T) {
	x := "services:\n  x:\n    image: busybox\n    environment: [\"V=${K:-unset}\"]\n"
	inc := func(entry string) string {
		if entry != "" {
			entry = "    " + entry + "\n"
		}
		return "include:\n  - path: x.yaml\n" + entry + "services:\n  i:\n    image: busybox\n"
	}
	for _, c := range []struct {
		name, entry, want string
	}{
		{"env_file", "env_file: ../proj/fifo", "the env_file ../proj/fifo of its include of x.yaml is a relative path"},
		{"env_file through a variable", "env_file: ${REL:-../proj/fifo}", "the env_file ../proj/fifo of its include"},
		{"project_directory", "project_directory: ../proj/d", "the project_directory ../proj/d of its include of x.yaml is a relative path"},
		{"absolute env_file", "env_file: ${P}/k.env", ""},
		{"env_file /dev/null", "env_file: /dev/null", ""},
		{"neither", "", ""},
	} {
		t.Run(c.name, func(t *testing.T) {
			file := writeProject(t, map[string]string{
				"proj/compose.yaml": "include:\n  - sub/inc.yaml\nservices:\n  a:\n    image: busybox\n",
				"proj/sub/inc.yaml": inc(c.entry),
				"proj/sub/x.yaml":   x,
				"proj/k.env":        "K=from-k-env\n",
			})
			parent := filepath.Dir(file)
			project := filepath.Join(parent, "proj")
			os.Mkdir(filepath.Join(project, "d"), 0o755)
			for _, f := range []string{"fifo", "d/.env"} {
				if err := syscall.Mkfifo(filepath.Join(project, f), 0o600); err != nil {
					t.Fatal(err)
				}
			}
			t.Chdir(parent)
			res, err := importWithin(t, Options{File: filepath.Join(project, "compose.yaml"), Env: []string{"P=" + project}})
			if c.want != "" {
				if err == nil || !strings.Contains(err.Error(), c.want) || !strings.Contains(err.Error(), "write an absolute path") {
					t.Fatalf("got %v, want an error saying %q", err, c.want)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			want := "unset"
			if strings.Contains(c.entry, "k.env") {
				want = "from-k-env"
			}
			if m := manifestOf(t, res, "x"); !strings.Contains(m, `"V":"`+want+`"`) {
				t.Fatalf("want V=%s in\n%s", want, m)
			}
		})
	}
}

// A pre_start hook is a container of its own, whose env_file and label_file
// compose-go reads as a service's: each is checked the same way (a FIFO
// refused at once, a file outside the project unless --copy-host-files).
func TestImportGuardsPreStartHooks(t *testing.T) {
	out := t.TempDir()
	outside := filepath.Join(out, "outside.env")
	os.WriteFile(outside, []byte("X=operator-private\n"), 0o600)
	fifo := filepath.Join(out, "fifo")
	if err := syscall.Mkfifo(fifo, 0o600); err != nil {
		t.Fatal(err)
	}
	hook := func(key, p string) string {
		return "services:\n  app:\n    image: busybox\n    pre_start:\n      - image: busybox\n        command: [\"true\"]\n      - image: busybox\n        " + key + ": [\"" + p + "\"]\n"
	}
	for _, c := range []struct {
		name, compose string
		copyHost      bool
		want          string
	}{
		{"env_file a FIFO", hook("env_file", fifo), true, "env_file of pre_start hook 2 of service app: " + fifo + " is a named pipe"},
		{"label_file a FIFO", hook("label_file", fifo), true, "label_file of pre_start hook 2 of service app: " + fifo + " is a named pipe"},
		{"env_file outside", hook("env_file", outside), false, "env_file of pre_start hook 2 of service app: " + outside + " is outside the project's directory"},
		{"label_file outside", hook("label_file", outside), false, outside + " is outside the project's directory"},
		{"in the project", hook("env_file", "hook.env"), false, ""},
	} {
		t.Run(c.name, func(t *testing.T) {
			file := writeProject(t, map[string]string{"compose.yaml": c.compose, "hook.env": "X=1\n"})
			_, err := importWithin(t, Options{File: file, Env: []string{}, CopyHostFiles: c.copyHost})
			if c.want == "" && err != nil || c.want != "" && (err == nil || !strings.Contains(err.Error(), c.want)) {
				t.Fatalf("got %v, want an error saying %q", err, c.want)
			}
		})
	}
}

// Any compose file: the import returns manifests that pass mesh check, or an
// error; it never panics and never hangs on what the file names.
func FuzzImport(f *testing.F) {
	for _, seed := range []string{
		"services:\n  a:\n    image: busybox\n",
		"services:\n  db:\n    image: postgres:16\n    volumes: [data:/var/lib/postgresql/data]\n    healthcheck: {test: [CMD, pg_isready], interval: 5s}\n  app:\n    image: app\n    depends_on: {db: {condition: service_healthy}}\n    ports: [\"8080:80\"]\n    environment: [A=1, B]\nvolumes:\n  data: {}\n",
		"services:\n  a:\n    image: ${IMG:-busybox}\n    env_file: [x.env]\n    extends: {file: other.yaml, service: b}\n",
		"include: [other.yaml]\nservices: {}\n",
		"services:\n  a: !!binary aGVsbG8=\n",
		"services:\n  a:\n    image: busybox\n    entrypoint: []\n    command: [x]\n    volumes: [./secrets:/s, {type: volume, source: v, target: /v, volume: {subpath: a/b}}, {type: tmpfs, target: /t, tmpfs: {size: 10, mode: 0o700}}]\n    secrets: [{source: s, uid: \"1\", mode: 0o444}]\n    depends_on: {b: {condition: service_completed_successfully}}\n  b_x:\n    image: redis\n    ports: [\"[::1]:1:2\"]\n    deploy: {restart_policy: {condition: none}, resources: {limits: {pids: 5}}}\nvolumes: {v: {external: true}}\nsecrets: {s: {file: ./s}}\n",
	} {
		f.Add([]byte(seed))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		dir := t.TempDir()
		file := filepath.Join(dir, "compose.yaml")
		if err := os.WriteFile(file, data, 0o644); err != nil {
			t.Fatal(err)
		}
		// The guard bounds an import near a second; an input that takes
		// far longer fails here, so the fuzzer keeps it, instead of
		// stalling the run past its deadline with nothing kept.
		type result struct {
			res *Result
			err error
		}
		done := make(chan result, 1)
		go func() {
			res, err := Import(context.Background(), Options{File: file, Env: []string{}, Root: "/srv"})
			done <- result{res, err}
		}()
		var r result
		select {
		case r = <-done:
		case <-time.After(10 * time.Second):
			t.Fatalf("the import took more than 10 s on this input (the guard bounds it near a second):\n%q", data)
		}
		res, err := r.res, r.err
		if err != nil {
			if strings.Contains(err.Error(), "a bug of the import") {
				t.Fatal(err)
			}
			return
		}
		for _, m := range res.Manifests {
			if _, err := manifest.Parse(m.File, []byte(m.Text)); err != nil {
				t.Fatalf("service %s: %v\n%s", m.Service, err, m.Text)
			}
		}
	})
}

// Files that extend each other in a cycle, or in a chain deeper than the
// guard follows, get an answer at once (compose-go's, or the guard's), never
// a loop; a device at the end of a deep chain is not reached by compose-go.
func TestImportGuardsCyclesAndDepth(t *testing.T) {
	d := t.TempDir()
	write := func(name, text string) {
		if err := os.WriteFile(filepath.Join(d, name), []byte(text), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	write("a.yaml", "services:\n  a:\n    image: busybox\n    extends: {file: b.yaml, service: b}\n")
	write("b.yaml", "services:\n  b:\n    image: busybox\n    extends: {file: a.yaml, service: a}\n")
	for i := 0; i < maxGuardDepth+3; i++ {
		write(fmt.Sprintf("d%d.yaml", i), fmt.Sprintf("services:\n  s:\n    image: busybox\n    extends: {file: d%d.yaml, service: s}\n", i+1))
	}
	write(fmt.Sprintf("d%d.yaml", maxGuardDepth+3), "services:\n  s:\n    image: busybox\n    env_file: /dev/zero\n")
	for file, want := range map[string]string{"a.yaml": "", "d0.yaml": "nest more than"} {
		done := make(chan error, 1)
		go func() {
			_, err := Import(context.Background(), Options{File: filepath.Join(d, file), Env: []string{}})
			done <- err
		}()
		select {
		case err := <-done:
			if err == nil || !strings.Contains(err.Error(), want) {
				t.Fatalf("%s: %v, want an error saying %q", file, err, want)
			}
		case <-time.After(20 * time.Second):
			t.Fatalf("%s: the import hung", file)
		}
	}
}

// What a small file expands to in compose-go (aliases, merge keys, the
// services an extends copies, port ranges) is counted before compose-go
// reads it, and a file past the budget gets an error at once; files under it,
// of the same shapes, import.
func TestImportGuardsExpansion(t *testing.T) {
	services := func(n int, body string) string {
		var b strings.Builder
		b.WriteString("services:\n")
		for i := 0; i < n; i++ {
			fmt.Fprintf(&b, "  s%d:\n%s", i, body)
		}
		return b.String()
	}
	env := func(n int) string {
		var b strings.Builder
		for i := 0; i < n; i++ {
			fmt.Fprintf(&b, "      V%d: x\n", i)
		}
		return b.String()
	}
	laughs := "x-a: &a [x, x, x, x, x, x, x, x, x, x]\nx-b: &b [*a, *a, *a, *a, *a, *a, *a, *a, *a, *a]\nx-c: &c [*b, *b, *b, *b, *b, *b, *b, *b, *b, *b]\n"
	for _, c := range []struct {
		name, compose, want string
	}{
		{"many nodes", "services:\n  a:\n    image: busybox\n    environment:\n" + env(6000), "expands to more than"},
		{"few nodes", "services:\n  a:\n    image: busybox\n    environment:\n" + env(100), ""},
		{"aliases", laughs + "x-d: &d [*c, *c, *c, *c, *c, *c, *c, *c, *c, *c]\nx-e: [*d, *d, *d, *d, *d, *d, *d, *d, *d, *d]\nservices:\n  a:\n    image: busybox\n", "expands to more than"},
		{"fewer aliases", laughs + "services:\n  a:\n    image: busybox\n", ""},
		{"extends copies", "x-env: &env\n" + strings.ReplaceAll(env(300), "      ", "  ") + "services:\n  base:\n    image: busybox\n    environment: *env\n" + strings.TrimPrefix(services(20, "    extends: base\n"), "services:\n"), "expands to more than"},
		{"fewer extends copies", "services:\n  base:\n    image: busybox\n    environment:\n" + env(100) + strings.TrimPrefix(services(20, "    extends: base\n"), "services:\n"), ""},
		{"merge keys with port ranges", "x-base: &base\n  image: busybox\n  ports: [\"8000-8999:8000-8999\"]\n" + services(12, "    <<: *base\n"), "expands to more than"},
		{"one wide range", "services:\n  a:\n    image: busybox\n    ports: [\"1-65535:1-65535\"]\n", `publish more than 1024 ports ("1-65535:1-65535" alone is 65535)`},
		{"a wide range through a variable", "services:\n  a:\n    image: busybox\n    ports: [\"${R:-1-65535}:${R:-1-65535}\"]\n", "publish more than 1024 ports"},
		{"a narrow range", "services:\n  a:\n    image: busybox\n    ports: [\"8000-8009:8000-8009\"]\n", ""},
	} {
		t.Run(c.name, func(t *testing.T) {
			d := t.TempDir()
			f := filepath.Join(d, "compose.yaml")
			os.WriteFile(f, []byte(c.compose), 0o644)
			done := make(chan error, 1)
			go func() {
				_, err := Import(context.Background(), Options{File: f, Env: []string{}})
				done <- err
			}()
			var err error
			select {
			case err = <-done:
			case <-time.After(60 * time.Second):
				t.Fatal("the import hung")
			}
			if c.want == "" {
				if err != nil {
					t.Fatalf("refused a file under the budget: %v", err)
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), c.want) {
				t.Fatalf("got %v, want an error saying %q", err, c.want)
			}
		})
	}
}

// The count is what compose-go expands: an anchored node is counted once
// however often it is aliased, and an alias of it as often as it appears.
func TestExpandedCountsAliases(t *testing.T) {
	var n yaml.Node
	if err := yaml.Unmarshal([]byte("a: &a [x, y]\nb: [*a, *a, *a]\n"), &n); err != nil {
		t.Fatal(err)
	}
	// document 1 + mapping 1 + keys a,b 2 + seq a 3 + seq b 1 + 3 copies of 3.
	if got := expanded(&n, map[*yaml.Node]size{}); got != 1+1+2+3+1+9 {
		t.Fatalf("expanded = %d, want 17", got)
	}
}

// Issue 31, item 7: compose-go's work grows with depth, so a small file
// that nests deep (9,000 sequences in 18 KB took it 41 s and 320 MB) is
// refused at once, aliases counted; one as deep as real files is not.
func TestImportGuardsNesting(t *testing.T) {
	for _, c := range []struct {
		name, body string
		refused    bool
	}{
		{"9000 nested sequences", "x-deep: " + strings.Repeat("[", 9000) + strings.Repeat("]", 9000), true},
		{"3000 nested mappings", "x-deep: " + strings.Repeat("{a: ", 3000) + "1" + strings.Repeat("}", 3000), true},
		{"deep through an alias", "x-a: &a " + strings.Repeat("[", 40) + strings.Repeat("]", 40) + "\nx-b: " + strings.Repeat("[", 30) + "*a" + strings.Repeat("]", 30), true},
		{"20 deep", "x-ok: " + strings.Repeat("[", 20) + strings.Repeat("]", 20), false},
	} {
		d := t.TempDir()
		f := filepath.Join(d, "compose.yaml")
		os.WriteFile(f, []byte("services:\n  a:\n    image: busybox\n"+c.body+"\n"), 0o644)
		_, err := Import(context.Background(), Options{File: f, Env: []string{}})
		if refused := err != nil && strings.Contains(err.Error(), "levels deep"); refused != c.refused {
			t.Errorf("%s: %v", c.name, err)
		}
	}
}

// BenchmarkImportAtTheBounds imports the costliest file the guard lets
// through that we know of: 9,000 nodes in chains 60 deep with 400-byte keys
// (1.8 MB): 0.79 s an import on the 2-core machine, the README's figure.
// Run with go test -bench ImportAtTheBounds ./internal/composeimport.
func BenchmarkImportAtTheBounds(b *testing.B) {
	key := strings.Repeat("k", 400)
	var doc strings.Builder
	doc.WriteString("services:\n  a:\n    image: busybox\n")
	for c := range 75 {
		fmt.Fprintf(&doc, "x-c%d: %s1%s\n", c, strings.Repeat("{"+key+": ", 60), strings.Repeat("}", 60))
	}
	f := filepath.Join(b.TempDir(), "compose.yaml")
	os.WriteFile(f, []byte(doc.String()), 0o644)
	for b.Loop() {
		if _, err := Import(context.Background(), Options{File: f, Env: []string{}}); err != nil {
			b.Fatal(err)
		}
	}
}
