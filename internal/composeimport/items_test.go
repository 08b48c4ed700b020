package composeimport

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	"github.com/compose-spec/compose-go/v2/types"

	"mesh/state/manifest"
)

// writeProject writes files (name -> content) into a fresh directory and
// returns the compose file's path.
func writeProject(t *testing.T, files map[string]string) string {
	t.Helper()
	dir := t.TempDir()
	for name, content := range files {
		p := filepath.Join(dir, name)
		os.MkdirAll(filepath.Dir(p), 0o755)
		if err := os.WriteFile(p, []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return filepath.Join(dir, "compose.yaml")
}

func mustImport(t *testing.T, opts Options) *Result {
	t.Helper()
	if opts.Env == nil {
		opts.Env = []string{}
	}
	res, err := Import(context.Background(), opts)
	if err != nil {
		t.Fatal(err)
	}
	for _, m := range res.Manifests {
		if _, err := manifest.Parse(m.File, []byte(m.Text)); err != nil {
			t.Fatalf("%s does not pass mesh check: %v\n%s", m.File, err, m.Text)
		}
	}
	return res
}

func manifestOf(t *testing.T, r *Result, module string) string {
	t.Helper()
	for _, m := range r.Manifests {
		if m.Module == module {
			return m.Text
		}
	}
	t.Fatalf("no module %s in %v", module, r.Manifests)
	return ""
}

func hasNote(r *Result, kind, text string) bool {
	for _, n := range r.Notes {
		if (kind == "" || n.Kind == kind) && strings.Contains(n.String(), text) {
			return true
		}
	}
	return false
}

// Issue 31, item 1: the .env beside the file is read as docker compose
// reads it: ${VAR:?} and ${VAR} take its values, the environment wins over
// it, and its COMPOSE_PROJECT_NAME and COMPOSE_PROFILES apply.
func TestImportReadsDotEnv(t *testing.T) {
	file := writeProject(t, map[string]string{
		"compose.yaml": "services:\n  db:\n    image: \"postgres:${T:?set T}\"\n    environment:\n      POSTGRES_DB: ${DB}\n  extra:\n    image: busybox\n    profiles: [extra]\n",
		".env":         "T=16\nDB=app\nCOMPOSE_PROJECT_NAME=shop\nCOMPOSE_PROFILES=extra\n",
	})
	res := mustImport(t, Options{File: file})
	if res.Project != "shop" {
		t.Errorf("project %q, want shop from COMPOSE_PROJECT_NAME", res.Project)
	}
	if db := manifestOf(t, res, "db"); !strings.Contains(db, `image: "postgres:16"`) || !strings.Contains(db, `"POSTGRES_DB":"app"`) || !strings.Contains(db, `"/srv/shop-db"`) {
		t.Errorf("db:\n%s", db)
	}
	manifestOf(t, res, "extra") // its profile is active
	res = mustImport(t, Options{File: writeProject(t, map[string]string{"compose.yaml": "services:\n  db:\n    image: postgres:16\n    environment:\n      POSTGRES_PASSWORD: ${PW}\n"})})
	if !hasNote(res, NoteAction, `compose: The "PW" variable is not set. Defaulting to a blank string.`) {
		t.Errorf("compose-go's warning is not a note: %v", res.Lines())
	}
	res = mustImport(t, Options{File: file, Env: []string{"T=17", "COMPOSE_PROFILES="}})
	if db := manifestOf(t, res, "db"); !strings.Contains(db, `image: "postgres:17"`) {
		t.Errorf("the environment does not win over .env:\n%s", db)
	}
	if len(res.Manifests) != 1 || !hasNote(res, NoteDropped, "extra: not imported: its profile is not active") {
		t.Errorf("COMPOSE_PROFILES from the environment is not applied: %v", res.Lines())
	}
	if _, err := Import(context.Background(), Options{File: file, Env: []string{"COMPOSE_DISABLE_ENV_FILE=1"}}); err == nil || !strings.Contains(err.Error(), "set T") {
		t.Errorf("COMPOSE_DISABLE_ENV_FILE: %v, want the required variable's message", err)
	}
}

// The values compose-go fills in from the environment the import runs in
// (${VAR}, a bare environment entry, ${VAR} in an env_file) land in the
// manifests: one note names the variables the project's .env and env files
// do not set to that value, so the operator sees a token copied from the
// shell.
func TestImportSaysWhatTheEnvironmentFilledIn(t *testing.T) {
	file := writeProject(t, map[string]string{
		"compose.yaml": "include:\n  - path: inc.yaml\n    env_file: inc.env\nservices:\n  app:\n    image: \"busybox:${TAG}\"\n    env_file: app.env\n    environment:\n      GREETING: ${GITHUB_TOKEN}\n      PASSTHRU:\n      ESCAPED: $${NOT_FILLED}\n      D: ${UNSET:-d}\n      S: ${SOURCED}/${ONLY_DOTENV}\n    labels: {home: \"${HOME}\"}\n",
		".env":         "TAG=2\nSOURCED=same\nONLY_DOTENV=x\n",
		"app.env":      "DB_URL=postgres://u:${DB_PW}@db/x\n",
		"inc.yaml":     "services:\n  inc:\n    image: busybox\n    environment: {V: \"${INC}\"}\n",
		"inc.env":      "INC=1\n",
	})
	env := []string{"GITHUB_TOKEN=ghp_topsecret", "HOME=/home/op", "PASSTHRU=pp", "TAG=3", "SOURCED=same", "DB_PW=pw", "INC=1", "NOT_FILLED=x", "UNUSED=u"}
	res := mustImport(t, Options{File: file, Env: env})
	var said []Note
	for _, n := range res.Notes {
		if strings.Contains(n.Text, "from the environment the import ran in") {
			said = append(said, n)
		}
	}
	if len(said) != 1 || said[0].Service != "compose" || said[0].Kind != NoteAction || !strings.HasPrefix(said[0].Text, "variables DB_PW, GITHUB_TOKEN, HOME, PASSTHRU, TAG: ") {
		t.Fatalf("want one action note naming DB_PW, GITHUB_TOKEN, HOME, PASSTHRU, TAG; got %v", said)
	}
	// Nothing taken from the environment: nothing said.
	res = mustImport(t, Options{File: file, Env: []string{"SOURCED=same", "INC=1", "UNUSED=u"}})
	if hasNote(res, "", "from the environment the import ran in") {
		t.Errorf("%s", strings.Join(res.Lines(), "\n"))
	}
}

// A value the .env or an include's env file fills in from the environment
// (X=${TOKEN}) reaches the manifests through the variable it sets: the note
// names TOKEN when the files use X, not when nothing uses X, and not for
// ${TOKEN:+on}, which takes only whether TOKEN is set.
func TestImportSaysWhatTheEnvFilesFilledIn(t *testing.T) {
	file := writeProject(t, map[string]string{
		"compose.yaml": "include:\n  - path: inc.yaml\n    env_file: inc.env\nservices:\n  app:\n    image: busybox\n    environment:\n      V: ${X}\n      ON: ${SET}\n      PASSTHRU:\n",
		".env":         "X=prefix-${TOKEN}\nUNUSED=${NOT_USED}\nSET=${PRESENCE:+on}\nPASSTHRU=${VIA_BARE}\nCHAIN=${CHAINED}\n",
		"inc.env":      "I=${CHAIN}\n",
		"inc.yaml":     "services:\n  inc:\n    image: busybox\n    environment: {V: \"${I}\"}\n",
	})
	res := mustImport(t, Options{File: file, Env: []string{"TOKEN=ghp_topsecret", "NOT_USED=n", "PRESENCE=p", "VIA_BARE=b", "CHAINED=c"}})
	if !strings.Contains(manifestOf(t, res, "app"), "prefix-ghp_topsecret") {
		t.Fatalf("the .env's value is not in the manifest:\n%s", manifestOf(t, res, "app"))
	}
	if !hasNote(res, NoteAction, "variables CHAINED, TOKEN, VIA_BARE: ") {
		t.Fatalf("want a note naming CHAINED, TOKEN, VIA_BARE:\n%s", strings.Join(res.Lines(), "\n"))
	}
}

// Item 3: a service others depend on that publishes nothing is published
// at its image's ports (when the image is here) or its software's
// well-known one; else each edge is named with what to add.
func TestImportKeepsDependenciesReachable(t *testing.T) {
	file := writeProject(t, map[string]string{"compose.yaml": "services:\n  app:\n    image: busybox\n    depends_on: [db, cache, own]\n  db:\n    image: docker.io/library/postgres:16\n  cache:\n    image: redis:7-alpine\n  own:\n    image: example.org/own:1\n"})
	res := mustImport(t, Options{File: file})
	if !strings.Contains(manifestOf(t, res, "db"), `ports: ["5432:5432/tcp"]`) || !strings.Contains(manifestOf(t, res, "cache"), `ports: ["6379:6379/tcp"]`) {
		t.Errorf("db or cache not published:\n%s\n%s", manifestOf(t, res, "db"), manifestOf(t, res, "cache"))
	}
	if strings.Contains(manifestOf(t, res, "own"), "ports:") || !hasNote(res, NoteAction, `own: app depends on it, but it publishes no port`) {
		t.Errorf("own: %v", res.Lines())
	}
	res = mustImport(t, Options{File: file, Inspect: func(_ context.Context, image string) (Image, bool) {
		if image == "example.org/own:1" {
			return Image{Ports: []string{"8080/tcp", "9000/udp"}, User: "1001"}, true
		}
		return Image{}, false
	}})
	if !strings.Contains(manifestOf(t, res, "own"), `ports: ["8080:8080/tcp","9000:9000/udp"]`) || !hasNote(res, NoteCarried, "the ports its image exposes") {
		t.Errorf("own with its image's ports:\n%s", manifestOf(t, res, "own"))
	}
	if !hasNote(res, NoteCarried, "own: directories owned by 1001:1001, the user its image example.org/own:1 runs as") {
		t.Errorf("the image's user: %v", res.Lines())
	}
}

// Item 4: a host directory several services mount is declared once, by the
// first, and the others are told; one mounted twice in a service is one
// directory.
func TestImportSharedSources(t *testing.T) {
	// a sorts first, so a declares it; b is told.
	res := mustImport(t, Options{File: writeProject(t, map[string]string{
		"compose.yaml": "services:\n  a:\n    image: busybox\n    volumes: [./certs:/certs, ./certs:/also]\n  b:\n    image: busybox\n    volumes: [./certs:/etc/certs:ro]\n",
	})})
	a, b := manifestOf(t, res, "a"), manifestOf(t, res, "b")
	if strings.Count(a, `directory: "/srv/`) != 2 || !strings.Contains(a, `/certs:/certs"`) || !strings.Contains(a, `/certs:/also"`) {
		t.Errorf("a mounts one directory twice:\n%s", a)
	}
	if strings.Contains(b, "certs") || !hasNote(res, NoteAction, "b: bind mount of the directory") || !hasNote(res, "", "is shared with service a, whose module declares it as /srv/") {
		t.Errorf("b:\n%s\n%v", b, res.Lines())
	}
}

// Item 5: sources whose names would share a path get a path each, said;
// two services that would be one module are refused, naming both; --prefix
// names the modules and renames the hosts the services name.
func TestImportNames(t *testing.T) {
	res := mustImport(t, Options{File: writeProject(t, map[string]string{
		"compose.yaml": "services:\n  db:\n    image: busybox\n    volumes: [db_data:/a, db-data:/b, ./data:/c/f, data:/d]\nvolumes:\n  db_data: {}\n  db-data: {}\n  data: {}\n",
		"data":         "a file\n",
	})})
	db := manifestOf(t, res, "db")
	for _, want := range []string{`/db-data:/a"`, `/db-data-2:/b"`, `/data:/c/f"`, `/data-2:/d"`} {
		if !strings.Contains(db, want) {
			t.Errorf("no mount %s in\n%s", want, db)
		}
	}
	if !hasNote(res, "", "volume db-data -> /srv/") || !hasNote(res, "", "is volume db_data's already") {
		t.Errorf("the collision is not said: %v", res.Lines())
	}
	if _, err := Import(context.Background(), Options{Env: []string{}, File: writeProject(t, map[string]string{
		"compose.yaml": "services:\n  web_app:\n    image: busybox\n  web-app:\n    image: busybox\n",
	})}); err == nil || !strings.Contains(err.Error(), `"web-app" and "web_app" both become module "web-app"`) {
		t.Errorf("a module collision: %v", err)
	}
	res = mustImport(t, Options{Prefix: "shop", File: writeProject(t, map[string]string{
		"compose.yaml": "services:\n  db:\n    image: postgres:16\n  app:\n    image: busybox\n    command: [\"db\", \"db:5432\", \"--host\", \"db\", \"--name\", \"db\", \"--redis=db:6379\"]\n    environment:\n      DB_HOST: db\n      URL: postgres://u:p@db:5432/db\n      OTHER: dbx\n      POSTGRES_USER: db\n      HOSTS: \"db, db:1\"\n      FILE: file:///db/x\n      GITEA__database__HOST: db:5432\n    depends_on: [db]\n",
	})})
	app := manifestOf(t, res, "shop-app")
	for _, want := range []string{`"DB_HOST":"shop-db"`, `"URL":"postgres://u:p@shop-db:5432/db"`, `"OTHER":"dbx"`, `"provider": "shop-db"`, `"/srv/`,
		`"POSTGRES_USER":"db"`, `"HOSTS":"shop-db, shop-db:1"`, `"FILE":"file:///db/x"`, `"GITEA__database__HOST":"shop-db:5432"`} {
		if !strings.Contains(strings.ReplaceAll(app, `provider: "shop-db"`, `"provider": "shop-db"`), want) {
			t.Errorf("no %s in\n%s", want, app)
		}
	}
	if !strings.Contains(app, `command: ["db","shop-db:5432","--host","shop-db","--name","db","--redis=shop-db:6379"]`) {
		t.Errorf("a command's hosts (never its program, nor a word that is no host):\n%s", app)
	}
	if !hasNote(res, NoteAction, `shop-app: environment POSTGRES_USER is "db", the name of service db, left as it is`) && !hasNote(res, NoteAction, `app: environment POSTGRES_USER is "db", the name of service db, left as it is`) {
		t.Errorf("a value that names a service but is no host is not said: %v", res.Lines())
	}
	if _, err := Import(context.Background(), Options{Prefix: "Shop_", Env: []string{}, File: writeProject(t, map[string]string{"compose.yaml": "services:\n  a:\n    image: busybox\n"})}); !errors.As(err, new(UsageError)) {
		t.Errorf("a bad --prefix: %v", err)
	}
}

// Item 6: what used to be "a bug of the import": a ./secrets bind beside
// secrets:, an IPv6 host address, and a --root that is relative or the
// system's (a usage error now, before anything is read).
func TestImportFormerInternalErrors(t *testing.T) {
	res := mustImport(t, Options{File: writeProject(t, map[string]string{
		"compose.yaml": "services:\n  db:\n    image: busybox\n    volumes: [./secrets:/secrets:ro]\n    secrets: [pw]\n    ports: [\"[::1]:8080:80\"]\nsecrets:\n  pw:\n    file: ./pw.txt\n",
		"pw.txt":       "x",
	})})
	db := manifestOf(t, res, "db")
	if !strings.Contains(db, `/secrets:/secrets:ro"`) || !strings.Contains(db, `secret: "/srv/`+res.Project+`-db/secrets-2/pw"`) || !strings.Contains(db, `ports: ["8080:80/tcp"]`) {
		t.Errorf("db:\n%s", db)
	}
	for _, root := range []string{"/etc", "srv", "./srv", "/usr/local"} {
		_, err := Import(context.Background(), Options{Root: root, Env: []string{}, File: writeProject(t, map[string]string{"compose.yaml": "services:\n  a:\n    image: busybox\n"})})
		if !errors.As(err, new(UsageError)) || strings.Contains(err.Error(), "a bug") {
			t.Errorf("--root %s: %v, want a usage error", root, err)
		}
	}
}

// Item 8: each key of the list the issue names is carried or said.
func TestImportSaysEveryKey(t *testing.T) {
	res := mustImport(t, Options{File: writeProject(t, map[string]string{
		"compose.yaml": `services:
  a:
    image: busybox
    entrypoint: []
    command: ["run", "it"]
    runtime: nvidia
    platform: linux/amd64
    tty: true
    stdin_open: true
    init: true
    pid: host
    ipc: host
    group_add: ["video", "109"]
    pids_limit: 100
    mem_limit: 64m
    cpus: 0.5
    mem_reservation: 32m
    restart: on-failure:5
    environment:
      discovery.type: single-node
    healthcheck:
      test: ["CMD", "true"]
      start_interval: 1s
    networks:
      default:
        aliases: [other]
    volumes:
      - type: volume
        source: v
        target: /v
        volume: {subpath: sub}
      - type: tmpfs
        target: /t
        tmpfs: {size: 1048576, mode: 0o1777}
      - ./d:/z:z
    secrets:
      - source: s
        target: /run/s
        uid: "1000"
        gid: "1000"
        mode: 0o400
    depends_on:
      init:
        condition: service_completed_successfully
    gpus: all
    userns_mode: host
  init:
    image: busybox
    deploy:
      restart_policy: {condition: none, max_attempts: 3}
      resources:
        reservations:
          devices: [{capabilities: [gpu]}]
volumes:
  v: {}
secrets:
  s: {file: ./s.txt}
`,
		"s.txt": "x",
	})})
	a := manifestOf(t, res, "a")
	for _, want := range []string{
		`entrypoint: ["run","it"]`, `tty: true`, `init: true`, `group-add: ["video","109"]`, `pids-limit: 100`,
		`memory: "67108864"`, `cpus: 0.5`, `restart: "on-failure"`, `"discovery.type":"single-node"`,
		`"interval":"30s"`, `"timeout":"30s"`, `"retries":3`, `/v/sub:/v"`, `"/t:size=1048576,mode=1777"`,
		`/d:/z:z"`, `owner: "1000:1000"`, `mode: "0400"`,
	} {
		if !strings.Contains(a, want) {
			t.Errorf("no %s in\n%s", want, a)
		}
	}
	if strings.Contains(a, "command:") {
		t.Errorf("entrypoint: [] with a command: the command runs alone, as the entrypoint:\n%s", a)
	}
	for _, want := range []string{
		"a: runtime nvidia: dropped", "a: platform linux/amd64: dropped", "a: stdin_open: dropped", "a: pid: host: dropped",
		"a: ipc: host: dropped", "a: mem_reservation: dropped", "a: restart on-failure:5: the count 5 is dropped",
		"a: healthcheck start_interval: dropped", "a: network aliases other: dropped", "a: gpus: dropped",
		"a: userns_mode: dropped; the import does not carry it", "a: depends_on init (service_completed_successfully)",
		"init: deploy.restart_policy condition \"none\" -> restart no", "init: deploy.restart_policy max_attempts",
		"init: deploy.resources.reservations.devices (a GPU): dropped",
	} {
		if !hasNote(res, "", want) {
			t.Errorf("no note says %q:\n%s", want, strings.Join(res.Lines(), "\n"))
		}
	}
}

// A top-level jobs: section is not carried: each job, in an active profile
// or not, is named in a dropped note.
func TestImportSaysJobsDropped(t *testing.T) {
	res := mustImport(t, Options{File: writeProject(t, map[string]string{
		"compose.yaml": "services:\n  app:\n    image: busybox\njobs:\n  migrate:\n    image: busybox\n    command: [\"true\"]\n    triggers: {manual: true}\n  nightly:\n    image: busybox\n    triggers: {schedule: [\"0 3 * * *\"]}\n  debug:\n    image: busybox\n    triggers: {manual: true}\n    profiles: [debug]\n",
	})})
	for _, job := range []string{"debug", "migrate", "nightly"} {
		if !hasNote(res, NoteDropped, "compose: job "+job+": not imported; the import carries services only") {
			t.Errorf("no note says job %s is dropped:\n%s", job, strings.Join(res.Lines(), "\n"))
		}
	}
	if len(res.Manifests) != 1 {
		t.Errorf("%d manifests, want app's alone", len(res.Manifests))
	}
}

// Every key the writer claims to read is a key of a compose service: a
// misspelt one would hide a key that is then dropped without a note.
func TestCarriedKeysExist(t *testing.T) {
	keys := map[string]bool{}
	var walk func(t reflect.Type)
	walk = func(t reflect.Type) {
		for i := range t.NumField() {
			f := t.Field(i)
			if f.Anonymous && f.Type.Kind() == reflect.Struct {
				walk(f.Type)
				continue
			}
			k, _, _ := strings.Cut(f.Tag.Get("yaml"), ",")
			keys[k] = true
		}
	}
	walk(reflect.TypeOf(types.ServiceConfig{}))
	for k := range carried {
		if !keys[k] {
			t.Errorf("carried lists %q, which a compose service does not have", k)
		}
	}
}

// Item 9: a bind-mounted file outside the project's directory is copied
// only with --copy-host-files; a link leading out of it is never followed;
// an env_file outside it is refused unless asked.
func TestImportHostFiles(t *testing.T) {
	outside := filepath.Join(t.TempDir(), "id_ed25519")
	os.WriteFile(outside, []byte("PRIVATE KEY\n"), 0o600)
	file := writeProject(t, map[string]string{"compose.yaml": "services:\n  a:\n    image: busybox\n    volumes: [\"" + outside + ":/k:ro\", ./link:/l:ro, ./in.conf:/c:ro]\n", "in.conf": "mine\n"})
	os.Symlink(outside, filepath.Join(filepath.Dir(file), "link"))
	for _, copyHost := range []bool{false, true} {
		res := mustImport(t, Options{File: file, CopyHostFiles: copyHost})
		a := manifestOf(t, res, "a")
		if strings.Contains(a, "PRIVATE KEY") != copyHost {
			t.Errorf("copy-host-files %v: the outside file copied: %v\n%s", copyHost, strings.Contains(a, "PRIVATE KEY"), a)
		}
		if !strings.Contains(a, "mine") || !hasNote(res, NoteDropped, "a link leading out of the project's directory") {
			t.Errorf("copy-host-files %v:\n%s\n%v", copyHost, a, res.Lines())
		}
		want := []string{filepath.Join(filepath.Dir(file), "in.conf")}
		if copyHost {
			want = append([]string{outside}, want...)
		}
		if !reflect.DeepEqual(res.Copied, want) {
			t.Errorf("copy-host-files %v: copied %v, want %v", copyHost, res.Copied, want)
		}
		if copyHost && strings.Count(a, "PRIVATE KEY") != 1 {
			t.Errorf("the link was followed:\n%s", a)
		}
	}
	envOut := writeProject(t, map[string]string{"compose.yaml": "services:\n  a:\n    image: busybox\n    env_file: " + outside + "\n"})
	if _, err := Import(context.Background(), Options{File: envOut, Env: []string{}}); err == nil || !strings.Contains(err.Error(), "outside the project's directory") {
		t.Errorf("an env_file outside the project: %v", err)
	}
	linkEnv := writeProject(t, map[string]string{"compose.yaml": "services:\n  a:\n    image: busybox\n"})
	os.Symlink(outside, filepath.Join(filepath.Dir(linkEnv), ".env"))
	if _, err := Import(context.Background(), Options{File: linkEnv, Env: []string{}}); err == nil || !strings.Contains(err.Error(), "leads out of the project's directory") {
		t.Errorf("a .env linked out of the project: %v", err)
	}
}

// The official database images change their data directory's owner at
// every start: the import declares that owner, so no apply sets it back.
func TestImportDataOwners(t *testing.T) {
	res := mustImport(t, Options{File: writeProject(t, map[string]string{
		"compose.yaml": "services:\n  db:\n    image: docker.io/library/postgres:16\n    volumes: [pg:/var/lib/postgresql/data, other:/other]\n  adb:\n    image: postgres:16-alpine\n    volumes: [apg:/var/lib/postgresql/data]\n  mine:\n    image: postgres:16\n    user: \"1234:1234\"\n    volumes: [mpg:/var/lib/postgresql/data]\nvolumes: {pg: {}, other: {}, apg: {}, mpg: {}}\n",
	})})
	db, adb, mine := manifestOf(t, res, "db"), manifestOf(t, res, "adb"), manifestOf(t, res, "mine")
	if !strings.Contains(db, "/pg\"\n    owner: \"999:999\"\n    mode: \"0700\"") || !strings.Contains(db, "/other\"\n    owner: \"0:0\"\n    mode: \"0750\"") {
		t.Errorf("db:\n%s", db)
	}
	if !strings.Contains(adb, "/apg\"\n    owner: \"70:70\"") || !strings.Contains(mine, "/mpg\"\n    owner: \"1234:1234\"") {
		t.Errorf("adb or mine:\n%s\n%s", adb, mine)
	}
}

// A compose config becomes a file with its content (from the project's
// file, or inline), mounted read-only at its target with its owner and
// mode; one from outside the project is not read.
func TestImportConfigs(t *testing.T) {
	outside := filepath.Join(t.TempDir(), "host.conf")
	os.WriteFile(outside, []byte("HOST SECRET\n"), 0o600)
	res := mustImport(t, Options{File: writeProject(t, map[string]string{
		"compose.yaml": "services:\n  a:\n    image: busybox\n    configs:\n      - app\n      - source: inline\n        target: /etc/inline.conf\n        uid: \"100\"\n        mode: 0o440\n      - host\nconfigs:\n  app:\n    file: ./app.ini\n  inline:\n    content: |\n      key = 1\n  host:\n    file: " + outside + "\n",
		"app.ini":      "[app]\nname = shop\n",
	})})
	a := manifestOf(t, res, "a")
	for _, want := range []string{`content: "[app]\nname = shop\n"`, `/app:/app:ro"`, `content: "key = 1\n"`, `/inline:/etc/inline.conf:ro"`, `owner: "100:100"`, `mode: "0440"`} {
		if !strings.Contains(a, want) {
			t.Errorf("no %s in\n%s", want, a)
		}
	}
	if strings.Contains(a, "HOST SECRET") || !hasNote(res, NoteAction, "config host (file "+outside+"): outside the project's directory") {
		t.Errorf("a config from outside the project:\n%s\n%v", a, res.Lines())
	}
}

// A config whose content is an environment variable's (a token, often)
// becomes a secret, as a compose secret from the environment does: its
// value never lands in the manifest every node replicates.
func TestImportConfigFromTheEnvironment(t *testing.T) {
	res := mustImport(t, Options{Env: []string{"GITHUB_TOKEN=ghp_topsecret"}, File: writeProject(t, map[string]string{
		"compose.yaml": "services:\n  app:\n    image: busybox\n    configs:\n      - source: token\n        target: /etc/token\n        uid: \"100\"\n        mode: 0o400\n      - token\nconfigs:\n  token:\n    environment: GITHUB_TOKEN\n",
	})})
	app := manifestOf(t, res, "app")
	if strings.Contains(app, "ghp_topsecret") {
		t.Fatalf("the variable's value is in the manifest:\n%s", app)
	}
	for _, want := range []string{`secret: "/srv/` + res.Project + `-app/secrets/token"`, `name: "token"`, `/secrets/token:/token:ro"`, `/secrets/token:/etc/token:ro"`} {
		if !strings.Contains(app, want) {
			t.Errorf("no %s in\n%s", want, app)
		}
	}
	if !hasNote(res, NoteAction, `app: config token -> secret /srv/`+res.Project+`-app/secrets/token (name token, owner 100:100, mode 0400) mounted at /etc/token; once the module is added and assigned, set its value: printf '%s' "$GITHUB_TOKEN" | mesh secret set app token`) {
		t.Errorf("no mesh secret set line:\n%s", strings.Join(res.Lines(), "\n"))
	}
}
