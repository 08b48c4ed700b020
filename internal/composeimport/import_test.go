package composeimport

import (
	"context"
	"flag"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"mesh/state/manifest"
)

var update = flag.Bool("update", false, "rewrite the golden manifests under testdata/*/want")

// Issue 15: three real-world compose files import deterministically into
// manifests that pass mesh check, the same as the golden ones, and every
// decision and drop is said.
func TestImportRealWorldFiles(t *testing.T) {
	env := []string{"PATH=/usr/bin"} // no GITEA_VERSION: its default applies
	notes := map[string][]string{
		"nextcloud": {
			"app: depends_on db (service_healthy) -> binding /srv/cloud-app/db.binding with healthy: true: the container starts once db's instance it points at passes its health check",
			"app: named volume html -> data directory /srv/cloud-app/html (owner 0:0, mode 0750; kept when the module goes)",
			"app: bind mount of the file ",
			"app: env_file read into env",
			"app: networks: dropped",
			"cron: volume html is shared with service app, whose module declares it",
			"cron: links: dropped",
			"db: secret db_password -> secret /srv/cloud-db/secrets/db_password (name db_password, owner 0:0, mode 0600) mounted at /run/secrets/db_password; once the module is added and assigned, set its value: mesh secret set db db_password --from-file ",
			"redis: expose 6379 -> published at 6379 on the node, where the name redis answers",
			"redis: directories owned by 999:999, the service's user",
		},
		"gitea": {
			"server: container_name: dropped",
			"server: stop_grace_period 2m0s: the mesh waits at most 90s; set to 90s",
			"db: shm_size: dropped",
			"runner: not imported: its profile is not active",
			"db: expose 5432 -> published at 5432 on the node",
			"db: environment POSTGRES_PASSWORD looks like a secret",
		},
		"traefik": {
			"traefik: bind mount /var/run/docker.sock: not carried over",
			"traefik: network_mode: host: dropped",
			"whoami: deploy.replicas: dropped; assign the module to several nodes",
			"whoami: extra_hosts: dropped",
			"traefik: named volume letsencrypt -> data directory /srv/edge-traefik/letsencrypt",
		},
	}
	for _, name := range []string{"nextcloud", "gitea", "traefik"} {
		t.Run(name, func(t *testing.T) {
			dir := filepath.Join("testdata", name)
			res, err := Import(context.Background(), Options{File: filepath.Join(dir, "compose.yaml"), Env: env})
			if err != nil {
				t.Fatal(err)
			}
			again, err := Import(context.Background(), Options{File: filepath.Join(dir, "compose.yaml"), Env: env})
			if err != nil {
				t.Fatal(err)
			}
			all := strings.Join(res.Lines(), "\n")
			if all != strings.Join(again.Lines(), "\n") || len(res.Manifests) != len(again.Manifests) {
				t.Fatal("two imports of one file differ")
			}
			for i, m := range res.Manifests {
				if m.Text != again.Manifests[i].Text {
					t.Fatalf("%s: two imports differ:\n%s\n---\n%s", m.File, m.Text, again.Manifests[i].Text)
				}
				if _, err := manifest.Parse(m.File, []byte(m.Text)); err != nil {
					t.Fatalf("%s does not pass mesh check: %v", m.File, err)
				}
				want := filepath.Join(dir, "want", m.File)
				if *update {
					os.MkdirAll(filepath.Dir(want), 0o755)
					os.WriteFile(want, []byte(m.Text), 0o644)
					continue
				}
				b, err := os.ReadFile(want)
				if err != nil || string(b) != m.Text {
					t.Fatalf("%s differs from %s (go test -update rewrites it):\n%s", m.File, want, m.Text)
				}
			}
			// Checked together, as mesh check FILES... checks them.
			parsed := map[string]*manifest.Manifest{}
			for _, m := range res.Manifests {
				pm, _ := manifest.Parse(m.File, []byte(m.Text))
				parsed[pm.Module] = pm
			}
			for _, pm := range parsed {
				if err := manifest.CheckProvidersOffline(pm, func(n string) (*manifest.Manifest, bool) { p, ok := parsed[n]; return p, ok }); err != nil {
					t.Errorf("%s: %v", pm.Module, err)
				}
			}
			for _, n := range notes[name] {
				if !strings.Contains(all, n) {
					t.Errorf("no note says %q; the notes:\n%s", n, all)
				}
			}
			if strings.Contains(strings.Join(texts(res), ""), "s3cret-db") {
				t.Error("a secret's value is in a manifest")
			}
		})
	}
}

func texts(r *Result) []string {
	var out []string
	for _, m := range r.Manifests {
		out = append(out, m.Text)
	}
	return out
}

// What a compose file allows and a manifest does not is dropped or adapted,
// each with a line; a file compose-go cannot read is an error, and nothing
// is made.
func TestImportOddFile(t *testing.T) {
	res, err := Import(context.Background(), Options{File: "testdata/odd/compose.yaml", Env: []string{}})
	if err != nil {
		t.Fatal(err)
	}
	all := strings.Join(res.Lines(), "\n")
	for _, want := range []string{
		"My_App: becomes module my-app",

		"My_App: device /etc/passwd:/dev/x:rwm: dropped",
		"My_App: memory limit 1024 bytes: dropped",
		"My_App: stop_signal SIGNOPE: dropped",
		`My_App: user "app user": dropped`,
		"worker: build: not carried over",
	} {
		if !strings.Contains(all, want) {
			t.Errorf("no note says %q:\n%s", want, all)
		}
	}
	for _, m := range res.Manifests {
		if _, err := manifest.Parse(m.File, []byte(m.Text)); err != nil {
			t.Fatalf("%s: %v\n%s", m.File, err, m.Text)
		}
	}
	if !strings.Contains(res.Manifests[0].Text, `"/srv/odd-my-app/data:/var/lib/app"`) || !strings.Contains(res.Manifests[0].Text, `tmpfs: ["/cache"]`) || !strings.Contains(res.Manifests[0].Text, `cap-add: ["NET_ADMIN"]`) ||
		!strings.Contains(res.Manifests[0].Text, `ports: ["9000:9000/tcp","9001:9001/tcp","9002:9002/tcp"]`) {
		t.Fatalf("my-app:\n%s", res.Manifests[0].Text)
	}
	if _, err := Import(context.Background(), Options{File: "testdata/odd/broken.yaml", Env: []string{}}); err == nil {
		t.Fatal("a broken compose file imported")
	}
}

// A port compose leaves to chance ("0:8") is published at its target, as one
// with no host port is; one with no manifest form (0, past 65535, sctp) is an
// error naming it, never a manifest that fails mesh check.
func TestImportPorts(t *testing.T) {
	for _, c := range []struct{ ports, want, err string }{
		{`ports: ["0:8"]`, `ports: ["8:8/tcp"]`, ""},
		{`ports: ["127.0.0.1:0:80/UDP"]`, `ports: ["80:80/udp"]`, ""}, // internal: the overlay address, not the compose file's
		{`ports: [{target: 80, published: "0"}]`, `ports: ["80:80/tcp"]`, ""},
		{`expose: ["53/UDP"]`, `ports: ["53:53/udp"]`, ""},
		{`ports: [{target: 0}]`, "", `target port "0" is not a port`},
		{`ports: [{target: 70000}]`, "", `target port "70000" is not a port`},
		{`ports: [{target: 80, published: "x"}]`, "", `published port "x" is not a port`},
		{`ports: ["80:80/sctp"]`, "", `protocol "sctp"`},
		{`expose: ["0"]`, "", `expose port "0" is not a port`},
		{`expose: [70000]`, "", `expose port "70000" is not a port`},
	} {
		d := t.TempDir()
		f := filepath.Join(d, "compose.yaml")
		os.WriteFile(f, []byte("services:\n  a:\n    image: busybox\n    "+c.ports+"\n"), 0o644)
		res, err := Import(context.Background(), Options{File: f, Env: []string{}})
		if c.err != "" {
			if err == nil || !strings.Contains(err.Error(), c.err) || strings.Contains(err.Error(), "a bug of the import") {
				t.Errorf("%s: %v, want an error saying %q", c.ports, err, c.err)
			}
			continue
		}
		if err != nil || !strings.Contains(res.Manifests[0].Text, c.want) {
			t.Errorf("%s: %v, want %s in\n%v", c.ports, err, c.want, res)
			continue
		}
		// Compose's ports are the mesh's internal ports, and the notes say
		// how to make one public.
		if strings.HasPrefix(c.ports, "ports:") && !strings.Contains(strings.Join(res.Lines(), "\n"), "move to public-ports: those the world must reach") {
			t.Errorf("%s: no note on public-ports: %q", c.ports, res.Lines())
		}
	}
}
