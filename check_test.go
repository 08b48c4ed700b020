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
