package integration

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"mesh/internal/testutil"
)

const bedPG = `module: bedpg
accepts-credentials: {{root}}/bedpg/credentials
resources:
  - directory: {{root}}/bedpg
  - directory: {{root}}/bedpg/credentials
    mode: "0700"
  - directory: {{root}}/bedpg/run
    mode: "01777"
  - container: bedpg.provisioner
    image: localhost/mesh-bed:provision
    command: ["provision", "postgres", "--credentials", "/credentials", "--watch", "--interval", "1s"]
    env: {MESH_PROVISION_DSN: "host=/pgsock port=5432 user=postgres dbname=postgres"}
    mounts: ["{{root}}/bedpg/credentials:/credentials:ro", "{{root}}/bedpg/run:/pgsock"]
`

const bedPGUser = `module: bedpguser
resources:
  - directory: {{root}}/bedpguser
  - credential: {{root}}/bedpguser/db.password
    provider: bedpg
`

// Issue 11, the full path: the provisioner runs as a container of the
// provider module, from an image of the static binary alone
// (contrib/Containerfile), against a real PostgreSQL; a consumer assigned
// gets a role that logs in with the credential the mesh delivered to it; the
// consumer unassigned, its role is left alone.
func TestProvisionBed(t *testing.T) {
	h := newHost(t, false)
	a := h.newAgent(t)
	build := t.TempDir()
	b, err := os.ReadFile(meshBin)
	if err != nil {
		t.Fatal(err)
	}
	os.WriteFile(filepath.Join(build, "mesh"), b, 0o755)
	h.podman("build", "-f", "../contrib/Containerfile", "-t", "localhost/mesh-bed:provision", build)

	srv := filepath.Join(h.dir, "srv")
	a.mesh("module", "add", a.manifest("bedpg", bedPG, nil), a.manifest("bedpguser", bedPGUser, nil))
	a.mesh("assign", "ace", "bedpg", "--wait")
	// The server comes up after the provisioner, whose passes fail and are
	// retried until it does.
	pg := testutil.StartPostgres(t, filepath.Join(srv, "bedpg", "run"))
	a.mesh("assign", "ace", "bedpguser", "--wait")
	secret, err := os.ReadFile(filepath.Join(srv, "bedpguser", "db.password"))
	if err != nil {
		t.Fatal(err)
	}
	eventually(t, 30*time.Second, "the consumer logs in with its delivered credential", func() (bool, string) {
		owner, err := pg.Login("bedpguser", strings.TrimSpace(string(secret)))
		return err == nil && owner == "bedpguser", errString(err) + "\n" + h.podman("logs", "--tail", "5", "bedpg.provisioner")
	})
	if strings.Contains(h.podman("logs", "bedpg.provisioner"), strings.TrimSpace(string(secret))) {
		t.Fatal("the secret is in the provisioner's output")
	}
	a.mesh("unassign", "ace", "bedpguser", "--wait")
	eventually(t, 30*time.Second, "the provisioner reports the withdrawn consumer", func() (bool, string) {
		logs := h.podman("logs", "bedpg.provisioner")
		return strings.Contains(logs, "bedpguser: withdrawn"), logs
	})
	if _, err := pg.Login("bedpguser", strings.TrimSpace(string(secret))); err != nil {
		t.Fatalf("the withdrawn consumer's role was touched: %v", err)
	}
	if n := pg.Statements("DROP"); n != 0 {
		t.Fatalf("%d DROP statements", n)
	}
}
