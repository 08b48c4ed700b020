package composeimport

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
)

// What a review found: odd values of compose's keys became manifests that
// fail mesh check ("a bug of the import"). Each is dropped or mended now,
// with a note, and the manifest passes.
func TestImportMendsOddValues(t *testing.T) {
	for _, c := range []struct{ name, svc, want, note string }{
		{"colon in a volume target", `volumes: [{type: volume, source: data, target: "/a:b"}]`, "", "may not hold ':'"},
		{"colon in a secret target", `secrets: [{source: s, target: "x:y"}]`, "", "may not hold ':'"},
		{"config mode with setuid", `configs: [{source: c, target: /bin/run, mode: 0o4755}]`, `mode: "04755"`, ""},
		{"whole volume and its subpath", `volumes: [data:/data, {type: volume, source: data, target: /other, volume: {subpath: sub}}]`, "", "it lies inside (or around) the writable mount"},
		{"interval under a second", `healthcheck: {test: [CMD, "true"], interval: 500ms, timeout: 100ms}`, `"interval":"1s"`, "healthcheck interval 500ms: set to 1s"},
		{"start period over a day", `healthcheck: {test: [CMD, "true"], start_period: 48h, retries: 1000}`, `"retries":100`, "set to 100"},
		{"empty check", `healthcheck: {test: ["CMD", ""]}`, "", "it names no command"},
		{"negative grace", `stop_grace_period: -5s`, "", "stop_grace_period -5s: dropped"},
		{"working dir with a slash", `working_dir: /app/`, `working-dir: "/app"`, ""},
		{"relative working dir", `working_dir: app`, "", "working_dir \"app\": dropped"},
		{"odd restart", `restart: sometimes`, "", `restart "sometimes": dropped`},
		{"empty label key", `labels: ["=v", "ok=1"]`, `"ok":"1"`, `label "": dropped`},
		{"too many cpus", `cpus: 2000`, "", "cpus 2000: dropped"},
		{"too few cpus", `cpus: 0.004`, "", "cpus 0.004: dropped"},
		{"too many pids", `pids_limit: 5000000`, "", "pids_limit 5000000: dropped"},
		{"a host port twice", `ports: ["8080:80", "8080:81"]`, `ports: ["8080:80/tcp"]`, "host port 8080/tcp is 8080:80/tcp's already"},
		{"expose on a published host port", `ports: ["80:8080"]` + "\n    expose: [\"80\"]", `ports: ["80:8080/tcp"]`, "expose 80: not published at 80"},
		{"keep-groups", `group_add: [keep-groups, video]`, `group-add: ["video"]`, "group_add keep-groups: dropped"},
		{"a NUL in env", `environment: {A: "a` + "\\u0000" + `b", B: ok}`, `"B":"ok"`, "environment A: dropped; its value holds a NUL"},
		{"root user", `user: "0"`, `user: "0"`, "directories owned by 0:0, the service's user (root)"},
	} {
		t.Run(c.name, func(t *testing.T) {
			file := writeProject(t, map[string]string{
				"compose.yaml": "services:\n  app:\n    image: busybox\n    " + c.svc + "\nvolumes: {data: {}}\nsecrets: {s: {file: ./s}}\nconfigs: {c: {content: x}}\n",
				"s":            "x",
			})
			res := mustImport(t, Options{File: file})
			app := manifestOf(t, res, "app")
			if c.want != "" && !strings.Contains(app, c.want) {
				t.Errorf("no %s in\n%s", c.want, app)
			}
			if c.note != "" && !hasNote(res, "", c.note) {
				t.Errorf("no note says %q:\n%s", c.note, strings.Join(res.Lines(), "\n"))
			}
		})
	}
}

// Files copied into a manifest stay under a budget (a manifest is at most
// 1 MiB), and only text that JSON carries as it is (valid UTF-8, no control
// characters) is copied.
func TestImportBoundsCopiedFiles(t *testing.T) {
	files := map[string]string{"latin1.conf": "name=caf\xe9\n", "ctl.conf": strings.Repeat("\x01", 100)}
	var vols []string
	for i := range 17 {
		n := "f" + string(rune('a'+i)) + ".conf"
		files[n] = strings.Repeat("x", 63<<10)
		vols = append(vols, "./"+n+":/etc/"+n+":ro")
	}
	vols = append(vols, "./latin1.conf:/l:ro", "./ctl.conf:/c:ro")
	files["compose.yaml"] = "services:\n  app:\n    image: busybox\n    volumes: [" + strings.Join(vols, ", ") + "]\n"
	res := mustImport(t, Options{File: writeProject(t, files)})
	if n := len(res.Copied); n != 8 {
		t.Errorf("%d files copied, want the 8 that fit in 512 KiB: %v", n, res.Copied)
	}
	if !hasNote(res, NoteDropped, "the manifest's copied files would pass 512 KiB") || !hasNote(res, NoteDropped, "latin1.conf is not text") || !hasNote(res, NoteDropped, "ctl.conf is not text") {
		t.Errorf("%s", strings.Join(res.Lines(), "\n"))
	}
}

// include: each included file is read with its own .env and env files,
// and none of them, nor its project_directory, may lie outside the project
// (their values land in manifests) or be a FIFO (a hang).
func TestImportGuardsIncludes(t *testing.T) {
	outside := t.TempDir()
	os.WriteFile(filepath.Join(outside, "secret.env"), []byte("LEAK=outside\n"), 0o600)
	os.WriteFile(filepath.Join(outside, "compose.yaml"), []byte("services:\n  o:\n    image: busybox\n"), 0o644)
	os.WriteFile(filepath.Join(outside, ".env"), []byte("T=outside\n"), 0o600)
	fifoDir := t.TempDir()
	syscall.Mkfifo(filepath.Join(fifoDir, ".env"), 0o600)
	os.WriteFile(filepath.Join(fifoDir, "compose.yaml"), []byte("services:\n  f:\n    image: busybox\n"), 0o644)
	for _, c := range []struct {
		name  string
		files map[string]string
		want  string
	}{
		{"project_directory outside", map[string]string{
			"compose.yaml": "include:\n  - path: inc.yaml\n    project_directory: " + outside + "\n",
			"inc.yaml":     "services:\n  app:\n    image: busybox\n    env_file: secret.env\n",
		}, "project_directory of an include: " + outside + " is outside the project's directory"},
		{"an included file outside", map[string]string{"compose.yaml": "include: [" + outside + "/compose.yaml]\n"}, "is outside the project's directory"},
		{"an env file outside through the included .env", map[string]string{
			"compose.yaml":     "include: [sub/compose.yaml]\n",
			"sub/.env":         "F=" + outside + "/secret.env\n",
			"sub/compose.yaml": "services:\n  app:\n    image: busybox\n    env_file: ${F}\n",
		}, "env_file of service app: " + outside + "/secret.env is outside the project's directory"},
		{"an included .env that is a FIFO", map[string]string{"compose.yaml": "include: [" + fifoDir + "/compose.yaml]\n"}, "is a named pipe"},
	} {
		t.Run(c.name, func(t *testing.T) {
			_, err := Import(context.Background(), Options{File: writeProject(t, c.files), Env: []string{}})
			if err == nil || !strings.Contains(err.Error(), c.want) {
				t.Fatalf("%v, want an error saying %q", err, c.want)
			}
		})
	}
	// With --copy-host-files an outside include is read, but a FIFO is
	// still refused, at once.
	_, err := Import(context.Background(), Options{File: writeProject(t, map[string]string{"compose.yaml": "include: [" + fifoDir + "/compose.yaml]\n"}), Env: []string{}, CopyHostFiles: true})
	if err == nil || !strings.Contains(err.Error(), "is a named pipe") {
		t.Fatalf("a FIFO .env of an include with --copy-host-files: %v", err)
	}
}

// A project reached through a linked directory (/home -> var/home): a link
// inside it leading out is still never followed, --copy-host-files or not.
func TestImportLinkedProjectDirectory(t *testing.T) {
	outside := filepath.Join(t.TempDir(), "secret.txt")
	os.WriteFile(outside, []byte("SECRET\n"), 0o600)
	file := writeProject(t, map[string]string{"compose.yaml": "services:\n  app:\n    image: busybox\n    volumes: [./link.txt:/etc/app.conf:ro]\n"})
	real := filepath.Dir(file)
	os.Symlink(outside, filepath.Join(real, "link.txt"))
	via := filepath.Join(t.TempDir(), "via")
	os.Symlink(real, via)
	for _, copyHost := range []bool{false, true} {
		res := mustImport(t, Options{File: filepath.Join(via, "compose.yaml"), CopyHostFiles: copyHost})
		if app := manifestOf(t, res, "app"); strings.Contains(app, "SECRET") || !hasNote(res, NoteDropped, "a link leading out of the project's directory") {
			t.Fatalf("copy-host-files %v:\n%s\n%v", copyHost, app, res.Lines())
		}
	}
}

// A link at any level inside the project (a directory ./conf linked to
// /elsewhere) leads out of it just the same: the file under it is never
// read, --copy-host-files or not, nor an env_file under it.
func TestImportLinkAtAnyLevel(t *testing.T) {
	outside := t.TempDir()
	os.WriteFile(filepath.Join(outside, "app.ini"), []byte("SECRET\n"), 0o600)
	os.WriteFile(filepath.Join(outside, "app.env"), []byte("LEAK=1\n"), 0o600)
	file := writeProject(t, map[string]string{"compose.yaml": "services:\n  app:\n    image: busybox\n    volumes: [./conf/app.ini:/etc/app.ini:ro]\n"})
	os.Symlink(outside, filepath.Join(filepath.Dir(file), "conf"))
	for _, copyHost := range []bool{false, true} {
		res := mustImport(t, Options{File: file, CopyHostFiles: copyHost})
		if app := manifestOf(t, res, "app"); strings.Contains(app, "SECRET") || !hasNote(res, NoteDropped, "a link leading out of the project's directory") {
			t.Fatalf("copy-host-files %v:\n%s\n%v", copyHost, app, res.Lines())
		}
	}
	envFile := writeProject(t, map[string]string{"compose.yaml": "services:\n  app:\n    image: busybox\n    env_file: conf/app.env\n"})
	os.Symlink(outside, filepath.Join(filepath.Dir(envFile), "conf"))
	_, err := Import(context.Background(), Options{File: envFile, Env: []string{}, CopyHostFiles: true})
	if err == nil || !strings.Contains(err.Error(), "leads out of the project's directory") {
		t.Fatalf("an env_file under a linked directory with --copy-host-files: %v", err)
	}
}

// A bind-mounted file only its owner may read (a private key, 0600) is
// declared no wider: as 0644 it was readable by every local user of each
// node the module runs on. It is owned by the service's user, who read it
// under compose; a file others may read keeps 0:0 and 0644.
func TestImportKeepsAFilePrivate(t *testing.T) {
	file := writeProject(t, map[string]string{
		"compose.yaml": "services:\n  app:\n    image: busybox\n    user: \"1000\"\n    volumes: [./key.pem:/etc/key.pem:ro, ./group.conf:/etc/group.conf:ro, ./app.conf:/etc/app.conf:ro]\n",
		"key.pem":      "-----BEGIN PRIVATE KEY-----\n",
		"group.conf":   "x=1\n",
		"app.conf":     "y=2\n",
	})
	dir := filepath.Dir(file)
	if err := os.Chmod(filepath.Join(dir, "key.pem"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(filepath.Join(dir, "group.conf"), 0o640); err != nil {
		t.Fatal(err)
	}
	res := mustImport(t, Options{File: file})
	if len(res.Manifests) != 1 || !res.Manifests[0].Private {
		t.Errorf("the manifest that carries key.pem's content is not marked private: %+v", res.Manifests)
	}
	app := manifestOf(t, res, "app")
	for _, want := range []string{
		"  - file: \"/srv/" + filepath.Base(dir) + "-app/key-pem\"\n    owner: \"1000:1000\"\n    mode: \"0600\"\n",
		"  - file: \"/srv/" + filepath.Base(dir) + "-app/group-conf\"\n    owner: \"1000:1000\"\n    mode: \"0640\"\n",
		"  - file: \"/srv/" + filepath.Base(dir) + "-app/app-conf\"\n    owner: \"0:0\"\n    mode: \"0644\"\n",
	} {
		if !strings.Contains(app, want) {
			t.Errorf("no\n%s\nin\n%s", want, app)
		}
	}
}

// The same for a config read from a file others may not read, when the
// config gives no mode of its own.
func TestImportKeepsAConfigFilePrivate(t *testing.T) {
	file := writeProject(t, map[string]string{
		"compose.yaml": "services:\n  app:\n    image: busybox\n    user: \"1000\"\n    configs: [db, {source: open, mode: 0o444}]\nconfigs:\n  db: {file: ./db.ini}\n  open: {file: ./open.ini}\n",
		"db.ini":       "password=x\n",
		"open.ini":     "password=y\n",
	})
	dir := filepath.Dir(file)
	for _, n := range []string{"db.ini", "open.ini"} {
		if err := os.Chmod(filepath.Join(dir, n), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	res := mustImport(t, Options{File: file})
	app := manifestOf(t, res, "app")
	for _, want := range []string{
		"  - file: \"/srv/" + filepath.Base(dir) + "-app/db\"\n    owner: \"1000:1000\"\n    mode: \"0400\"\n",
		"  - file: \"/srv/" + filepath.Base(dir) + "-app/open\"\n    owner: \"0:0\"\n    mode: \"0444\"\n",
	} {
		if !strings.Contains(app, want) {
			t.Errorf("no\n%s\nin\n%s", want, app)
		}
	}
	if !res.Manifests[0].Private {
		t.Errorf("the manifest that carries db.ini's content is not marked private")
	}
}

// A database image with no volume at its data directory keeps its data in
// an anonymous volume, which compose carries over when it recreates the
// container; the mesh refuses a container whose image's VOLUME nothing
// holds, so the import makes it a data directory of the module, mounted
// there, and says so; with a volume there (or its image's VOLUMEs asked of
// this machine's Podman, none of them), nothing of it.
func TestImportSaysWhereAnImageKeepsItsData(t *testing.T) {
	file := writeProject(t, map[string]string{
		"compose.yaml": "services:\n  db:\n    image: postgres:16\n  kept:\n    image: docker.io/library/mariadb:11\n    volumes: [data:/var/lib/mysql]\n  cache:\n    image: busybox\n  web:\n    image: localhost/web:1\n    tmpfs: [/srv/cache]\nvolumes: {data: {}}\n",
	})
	inspect := func(ctx context.Context, image string) (Image, bool) {
		if image == "localhost/web:1" {
			return Image{Volumes: []string{"/srv/cache/x", "/var/lib/web/"}}, true
		}
		return Image{}, false
	}
	res := mustImport(t, Options{File: file, Inspect: inspect})
	if !hasNote(res, NoteCarried, "db: its image postgres:16 keeps data at /var/lib/postgresql/data (VOLUME), which no volume of it mounts: compose keeps that anonymous volume when it recreates the container -> data directory") {
		t.Errorf("no note says where db's data is kept:\n%s", strings.Join(res.Lines(), "\n"))
	}
	if !hasNote(res, NoteCarried, "web: its image localhost/web:1 keeps data at /var/lib/web (VOLUME)") || hasNote(res, "", "web: its image localhost/web:1 keeps data at /srv/cache") {
		t.Errorf("web's VOLUMEs, one under its tmpfs:\n%s", strings.Join(res.Lines(), "\n"))
	}
	for _, svc := range []string{"kept: ", "cache: "} {
		if hasNote(res, "", svc+"its image") {
			t.Errorf("a note about %s's data:\n%s", svc, strings.Join(res.Lines(), "\n"))
		}
	}
	// A tmpfs the manifest cannot carry (dropped) holds nothing; postgres
	// 18 (and a tag without a release) keeps its data in the parent; a
	// VOLUME no manifest can mount is said.
	file2 := writeProject(t, map[string]string{
		"compose.yaml": "services:\n  r:\n    image: redis:7\n    tmpfs: [\"/data:noatime\"]\n  pg:\n    image: postgres:18\n  pgl:\n    image: postgres\n  root:\n    image: localhost/root:1\n",
	})
	res2 := mustImport(t, Options{File: file2, Inspect: func(ctx context.Context, image string) (Image, bool) {
		if image == "localhost/root:1" {
			return Image{Volumes: []string{"/", "/a:b"}}, true
		}
		return Image{}, false
	}})
	for _, want := range []string{
		"r: its image redis:7 keeps data at /data (VOLUME)",
		"pg: its image postgres:18 keeps data at /var/lib/postgresql (VOLUME)",
		"pgl: its image postgres keeps data at /var/lib/postgresql (VOLUME)",
	} {
		if !hasNote(res2, NoteCarried, want) {
			t.Errorf("no note %q:\n%s", want, strings.Join(res2.Lines(), "\n"))
		}
	}
	for _, v := range []string{`"/"`, `"/a:b"`} {
		if !hasNote(res2, NoteAction, "root: its image localhost/root:1 keeps data at "+v+" (VOLUME), which a manifest cannot mount") {
			t.Errorf("no note on the VOLUME %s:\n%s", v, strings.Join(res2.Lines(), "\n"))
		}
	}
	for _, m := range res.Manifests {
		switch m.Module {
		case "db":
			if !strings.Contains(m.Text, "data: true") || !strings.Contains(m.Text, ":/var/lib/postgresql/data\"") {
				t.Errorf("db's manifest keeps no data directory at its image's VOLUME:\n%s", m.Text)
			}
		case "web":
			if !strings.Contains(m.Text, ":/var/lib/web\"") || strings.Contains(m.Text, ":/srv/cache/x") {
				t.Errorf("web's manifest:\n%s", m.Text)
			}
		}
	}
}
