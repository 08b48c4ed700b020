package main

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// mesh check warns of an env: value that looks like a secret (it is
// replicated and shown in plain text), not of a *_FILE path or an empty one.
func TestCheckWarnsOfSecretsInEnv(t *testing.T) {
	dir := t.TempDir()
	f := filepath.Join(dir, "app.yaml")
	os.WriteFile(f, []byte(`module: app
resources:
  - container: app.main
    image: docker.io/library/busybox:1.36
    env: {SMTP_PASSWORD: hunter2, DB_PASSWORD_FILE: /run/secrets/db, API_TOKEN: "", LANG: C}
`), 0o644)
	var out bytes.Buffer
	g := &Globals{DataDir: filepath.Join(dir, "data"), out: &out}
	if err := (&CheckCmd{Files: []string{f}}).Run(g); err != nil {
		t.Fatal(err)
	}
	s := out.String()
	if !strings.Contains(s, "warning: app.main env SMTP_PASSWORD looks like a secret") || !strings.Contains(s, "mesh secret set app NAME") {
		t.Fatalf("no warning for SMTP_PASSWORD:\n%s", s)
	}
	for _, k := range []string{"DB_PASSWORD_FILE", "API_TOKEN", "LANG"} {
		if strings.Contains(s, "env "+k+" looks") {
			t.Fatalf("a warning for %s:\n%s", k, s)
		}
	}
}

// Issue 30, item 1: mesh check names each module's data directories, warns
// of a directory mounted writable that is not data, and refuses one a
// container mounts without its owner and mode.
func TestCheckReportsData(t *testing.T) {
	dir := t.TempDir()
	f := filepath.Join(dir, "gitea.yaml")
	os.WriteFile(f, []byte(`module: gitea
resources:
  - directory: /srv/gitea
    owner: "0:0"
    mode: "0755"
  - directory: /srv/gitea/data
    owner: "1000:1000"
    mode: "0750"
    data: true
  - directory: /srv/gitea/cache
    owner: "1000:1000"
    mode: "0750"
  - directory: /srv/gitea/conf
  - container: gitea.main
    image: docker.io/gitea/gitea:1.21
    mounts: ["/srv/gitea/data:/data", "/srv/gitea/cache:/cache", "/srv/gitea/conf:/conf:ro"]
`), 0o644)
	var out bytes.Buffer
	g := &Globals{DataDir: filepath.Join(dir, "data"), out: &out}
	err := (&CheckCmd{Files: []string{f}}).Run(g)
	s := out.String()
	if !strings.Contains(s, "gitea.yaml: data: /srv/gitea/data\n") || !strings.Contains(s, "warning: gitea.main mounts /srv/gitea/cache writable, and it is not data") {
		t.Fatalf("mesh check:\n%s", s)
	}
	if strings.Contains(s, "mounts /srv/gitea/data writable") || strings.Contains(s, "mounts /srv/gitea/conf writable") {
		t.Fatalf("a warning for data or a read-only mount:\n%s", s)
	}
	if err == nil || !strings.Contains(err.Error(), "directory /srv/gitea/conf is mounted by gitea.main but does not declare its owner and mode") || strings.Contains(err.Error(), "/srv/gitea/cache is mounted") {
		t.Fatalf("mesh check's error: %v", err)
	}
}
