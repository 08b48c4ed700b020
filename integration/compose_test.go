package integration

import (
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// Issue 15: a compose file of two services, where one reaches the other by
// its short compose name through an expose:d port, with a named volume and
// a bind mount: imported, added, assigned to two nodes, running.
const bedCompose = `name: bedproj
services:
  bedcweb:
    image: localhost/mesh-bed-busybox:1
    command: ["httpd", "-f", "-p", "18083", "-h", "/www"]
    expose: ["18083"]
    volumes:
      - ./site:/www:ro
    healthcheck:
      test: ["CMD", "test", "-f", "/www/index.html"]
      interval: 1s
      start_period: 5m
  bedcclient:
    image: localhost/mesh-bed-busybox:1
    command: ["sh", "-c", "while true; do wget -q -O /data/page.tmp http://bedcweb:18083/ && mv /data/page.tmp /data/page; sleep 1; done"]
    depends_on:
      bedcweb:
        condition: service_healthy
    volumes:
      - pages:/data
volumes:
  pages: {}
`

func TestComposeImportBed(t *testing.T) {
	n, _ := startThree(t)
	dir := filepath.Join(n[1].h.dir, "compose")
	os.MkdirAll(filepath.Join(dir, "site"), 0o755)
	os.WriteFile(filepath.Join(dir, "compose.yaml"), []byte(bedCompose), 0o644)
	os.WriteFile(filepath.Join(dir, "site", "index.html"), []byte("from-compose"), 0o644)
	root := filepath.Join(n[1].h.dir, "srv")
	out := n[1].run("import", "compose", filepath.Join(dir, "compose.yaml"), "--output", filepath.Join(dir, "mesh"), "--root", root)
	for _, want := range []string{
		"bedcclient: named volume pages -> data directory " + root + "/bedproj-bedcclient/pages",
		"bedcweb: expose 18083 -> published at 18083 on the node, where the name bedcweb answers",
		"bedcweb: bind mount of the directory " + dir + "/site -> data directory " + root + "/bedproj-bedcweb/site",
		"wrote 2 manifests for project bedproj",
	} {
		if !strings.Contains(out, want) {
			t.Fatalf("import output lacks %q:\n%s", want, out)
		}
	}
	n[1].run("check", filepath.Join(dir, "mesh", "bedcweb.yaml"), filepath.Join(dir, "mesh", "bedcclient.yaml"))
	n[1].mesh("module", "add", filepath.Join(dir, "mesh", "bedcweb.yaml"), filepath.Join(dir, "mesh", "bedcclient.yaml"))
	// Module names are the mesh's: another project's bedcweb is refused,
	// naming both, and nothing is added.
	n[1].run("import", "compose", filepath.Join(dir, "compose.yaml"), "--project", "otherproj", "--output", filepath.Join(dir, "other"), "--root", root)
	if out := n[1].meshFails("module", "add", filepath.Join(dir, "other", "bedcweb.yaml")); !strings.Contains(out, "bedcweb.yaml (project otherproj's service bedcweb) would replace the module bedcweb, which is project bedproj's service bedcweb; import this project with --prefix otherproj") {
		t.Fatalf("another project's module of the same name:\n%s", out)
	}
	if m := n[1].mesh("module", "show", "bedcweb"); !strings.Contains(m, "of project bedproj") {
		t.Fatalf("the refused add changed bedcweb:\n%s", m)
	}
	n[1].mesh("assign", "n2", "bedcweb")
	// The bind mount became a declared directory; its contents are the
	// operator's to copy (the import said so). Until they are there,
	// bedcweb's health check fails (it is starting).
	site := filepath.Join(root, "bedproj-bedcweb", "site")
	eventually(t, 30*time.Second, "bedcweb's site directory is made", func() (bool, string) {
		st, err := os.Stat(site)
		return err == nil && st.IsDir(), errString(err)
	})
	// service_healthy: bedcclient waits at its binding's health gate,
	// `assign --wait` waits through it, and nothing after the gate is made.
	waited := make(chan string, 1)
	go func() {
		out, err := n[1].command("assign", "n1", "bedcclient", "--wait", "--timeout", "2m", "--data-dir", n[1].n.dir).CombinedOutput()
		waited <- string(out) + errString(err)
	}()
	eventually(t, 30*time.Second, "n1 says bedcclient waits for bedcweb to be healthy", func() (bool, string) {
		st := n[1].mesh("status")
		return strings.Contains(st, "waiting: bedcclient: binding") && strings.Contains(st, "waits for bedcweb on n2 to be healthy"), st
	})
	if id := n[1].h.containerID("bedcclient.main"); id != "" {
		t.Fatal("bedcclient.main was made behind a closed health gate")
	}
	os.WriteFile(filepath.Join(site, "index.html"), []byte("from-compose"), 0o644)
	select {
	case out := <-waited:
		if !strings.Contains(out, "waits for bedcweb on n2 to be healthy") || !strings.Contains(out, "n1 applied plan") {
			t.Fatalf("assign --wait through the gate:\n%s", out)
		}
	case <-time.After(90 * time.Second):
		t.Fatal("assign --wait did not return within 90s of bedcweb turning healthy")
	}
	if out := n[1].resolve("bedcweb.internal"); !strings.Contains(out, n[2].oaddr()) {
		t.Fatalf("bedcweb.internal: %s", out)
	}
	page := filepath.Join(root, "bedproj-bedcclient", "pages", "page")
	eventually(t, 30*time.Second, "bedcclient on n1 fetched bedcweb's page on n2 by its short compose name", func() (bool, string) {
		b, err := os.ReadFile(page)
		return err == nil && string(b) == "from-compose", string(b) + errString(err)
	})
	if st, err := os.Stat(filepath.Dir(page)); err != nil || st.Mode().Perm() != 0o750 {
		t.Fatalf("the named volume's directory: %v %v", st, err)
	}
}

// TestComposeImportRootless: the same file on a rootless host, one node
// whose mesh address is the bed's resolver address (reachable from rootless
// containers): imported by the bed's user, both services on the node, the
// named volume's directory owned by the container's root as mapped.
func TestComposeImportRootless(t *testing.T) {
	h := newHost(t, true)
	a := h.newAgentAt(t, h.dnsAddr)
	dir := filepath.Join(h.dir, "compose")
	uid, _ := strconv.Atoi(h.usr.Uid)
	gid, _ := strconv.Atoi(h.usr.Gid)
	for _, d := range []string{dir, filepath.Join(dir, "site")} {
		os.MkdirAll(d, 0o755)
		os.Chown(d, uid, gid)
	}
	os.WriteFile(filepath.Join(dir, "compose.yaml"), []byte(bedCompose), 0o644)
	os.WriteFile(filepath.Join(dir, "site", "index.html"), []byte("from-compose"), 0o644)
	root := filepath.Join(h.dir, "srv")
	out := a.run("import", "compose", filepath.Join(dir, "compose.yaml"), "--output", filepath.Join(dir, "mesh"), "--root", root)
	if !strings.Contains(out, "wrote 2 manifests for project bedproj") {
		t.Fatalf("import:\n%s", out)
	}
	a.mesh("module", "add", filepath.Join(dir, "mesh", "bedcweb.yaml"), filepath.Join(dir, "mesh", "bedcclient.yaml"))
	a.mesh("assign", "ace", "bedcweb")
	site := filepath.Join(root, "bedproj-bedcweb", "site")
	eventually(t, 30*time.Second, "bedcweb's site directory is made", func() (bool, string) {
		st, err := os.Stat(site)
		return err == nil && st.IsDir(), errString(err)
	})
	if err := os.WriteFile(filepath.Join(site, "index.html"), []byte("from-compose"), 0o644); err != nil {
		t.Fatalf("the bind mount's directory: %v", err)
	}
	a.mesh("assign", "ace", "bedcclient", "--wait", "--timeout", "2m")
	page := filepath.Join(root, "bedproj-bedcclient", "pages", "page")
	eventually(t, 30*time.Second, "bedcclient fetched bedcweb's page by its short compose name", func() (bool, string) {
		b, err := os.ReadFile(page)
		return err == nil && string(b) == "from-compose", string(b) + errString(err)
	})
	var st syscall.Stat_t
	if err := syscall.Stat(filepath.Dir(page), &st); err != nil || int(st.Uid) != h.hostID(0) || st.Mode&0o7777 != 0o750 {
		t.Fatalf("the named volume's directory: uid %d (want %d, the container's root as mapped), mode %o, %v", st.Uid, h.hostID(0), st.Mode&0o7777, err)
	}
}

// Issue 31: a three-service application as people write it (a web front, a
// worker and a database, none with a port for the others, passwords in a
// .env), imported from its own directory by a relative path into the
// default ./PROJECT, the modules prefixed, assigned to two nodes: the web on
// n3 answers a request by reading what the worker on n3 wrote into the
// PostgreSQL on n2. Run in the examples bed, whose nodes hold the images.
const appCompose = `services:
  web:
    image: docker.io/library/postgres:15
    # A CGI script that asks the database, written at start with the
    # connection's settings (busybox httpd gives a script no environment).
    command:
      - sh
      - -c
      - >-
        mkdir -p /tmp/www/cgi-bin &&
        printf '#!/bin/sh\necho Content-Type: text/plain\necho\nPGHOST=%s PGPASSWORD=%s /usr/lib/postgresql/15/bin/psql -U postgres -d postgres -tAc "SELECT count(*) || chr(32) || max(note) FROM notes" 2>&1\n' "$$PGHOST" "$$PGPASSWORD" >/tmp/www/cgi-bin/rows &&
        chmod +x /tmp/www/cgi-bin/rows &&
        exec httpd -f -p 8080 -h /tmp/www
    environment:
      PGHOST: db
      PGPASSWORD: ${DB_PASSWORD:?set DB_PASSWORD in .env}
    ports: ["${WEB_PORT:-8080}:8080"]
    depends_on:
      db:
        condition: service_healthy
  worker:
    image: docker.io/library/postgres:15
    command: ["sh", "-c", "until psql -U postgres -d postgres -c 'CREATE TABLE IF NOT EXISTS notes (id serial PRIMARY KEY, note text)' -c \"INSERT INTO notes (note) VALUES ('from-the-worker')\"; do sleep 1; done; exec sleep 100000"]
    environment:
      PGHOST: db
      PGPASSWORD: ${DB_PASSWORD}
    depends_on: [db]
  db:
    image: docker.io/library/postgres:15
    environment:
      POSTGRES_PASSWORD: ${DB_PASSWORD}
    volumes:
      - dbdata:/var/lib/postgresql/data
    healthcheck:
      test: ["CMD-SHELL", "pg_isready -q -h 127.0.0.1 -U postgres"]
      interval: 2s
      timeout: 2s
volumes:
  dbdata: {}
`

func composeApp(t *testing.T, n []*agent) {
	dir := filepath.Join(t.TempDir(), "shop-src")
	os.MkdirAll(dir, 0o755)
	os.WriteFile(filepath.Join(dir, "compose.yaml"), []byte(appCompose), 0o644)
	os.WriteFile(filepath.Join(dir, ".env"), []byte("COMPOSE_PROJECT_NAME=shop\nDB_PASSWORD=bed-db-password\nWEB_PORT=18090\n"), 0o644)
	// Relative: the file and the default output (./shop), from its
	// directory, as a user runs it.
	imp := exec.Command(meshBin, "import", "compose", "compose.yaml", "--prefix", "shop", "--json")
	imp.Dir = dir
	out, err := imp.CombinedOutput()
	if err != nil {
		t.Fatalf("mesh import compose compose.yaml: %v\n%s", err, out)
	}
	var res struct {
		Project, Output string
		Files           []string
		Notes           []struct{ Service, Kind, Text string }
	}
	if err := json.Unmarshal(out, &res); err != nil || res.Project != "shop" || res.Output != filepath.Join(dir, "shop") || len(res.Files) != 3 {
		t.Fatalf("the import: %v %+v\n%s", err, res, out)
	}
	said := func(service, text string) bool {
		for _, n := range res.Notes {
			if n.Service == service && strings.Contains(n.Text, text) {
				return true
			}
		}
		return false
	}
	for _, want := range [][2]string{
		{"db", "published at 5432:5432/tcp inside the mesh (the well-known port of postgres"},
		{"web", `environment PGHOST: "db" -> "shop-db"`},
		{"worker", `environment PGHOST: "db" -> "shop-db"`},
		{"web", "depends_on db (service_healthy) -> binding"},
	} {
		if !said(want[0], want[1]) {
			t.Fatalf("no note of %s says %q:\n%s", want[0], want[1], out)
		}
	}
	n[1].mesh(append([]string{"check"}, res.Files...)...)
	n[1].mesh(append([]string{"module", "add"}, res.Files...)...)
	n[1].mesh("assign", "n2", "shop-db", "--wait", "--timeout", "3m")
	n[1].mesh("assign", "n3", "shop-worker", "--wait", "--timeout", "2m")
	n[1].mesh("assign", "n3", "shop-web", "--wait", "--timeout", "2m")
	// From n1: the web's internal port on n3's overlay address.
	url := "http://" + n[3].oaddr() + ":18090/cgi-bin/rows"
	eventually(t, 90*time.Second, "the web on n3 reads the worker's row from the database on n2", func() (bool, string) {
		out, err := exec.Command("ip", "netns", "exec", n[1].h.netns, "curl", "-sS", "-m", "5", url).CombinedOutput()
		return err == nil && strings.HasSuffix(strings.TrimSpace(string(out)), " from-the-worker"), string(out) + errString(err)
	})
	// The database's data is in its declared directory on n2, none on n3.
	if _, err := os.Stat(filepath.Join(n[2].h.dir, "srv", "shop-shop-db", "dbdata", "PG_VERSION")); err != nil {
		t.Fatalf("the database's volume on n2: %v", err)
	}
}
