package manifest

import (
	"strings"
	"testing"
)

// Issue 15 item 4: the container fields compose users rely on are checked
// at parse, with the key and line of each error, and typed once.
func TestContainerFields(t *testing.T) {
	src := `module: cf
resources:
  - directory: /srv/cf
  - container: cf.app
    image: busybox
    user: "1000:1000"
    entrypoint: ["/bin/sh", "-c"]
    command: ["sleep 1000"]
    working-dir: /srv
    cap-add: [NET_ADMIN]
    cap-drop: [ALL]
    devices: ["/dev/null:/dev/mynull:rw"]
    read-only: true
    tmpfs: ["/run:size=16m,mode=1777", /tmp]
    memory: 64m
    cpus: 0.5
    stop-signal: SIGQUIT
    stop-timeout: 30s
    labels: {com.example.team: web}
`
	m, err := Parse("cf.yaml", []byte(src))
	if err != nil {
		t.Fatal(err)
	}
	r := m.Resources[1]
	ty := r.Typed
	if ty.Memory != 64<<20 || ty.StopSignal != 3 || ty.StopTimeout == nil || *ty.StopTimeout != 30 || r.CPUs != 0.5 || !r.ReadOnly || r.User != "1000:1000" {
		t.Fatalf("typed: %+v (resource %+v)", ty, r)
	}
	if len(ty.Devices) != 1 || ty.Devices[0] != (Device{Host: "/dev/null", Container: "/dev/mynull", Permissions: "rw"}) {
		t.Fatalf("devices: %+v", ty.Devices)
	}
	if len(ty.Tmpfs) != 2 || ty.Tmpfs[0].Path != "/run" || strings.Join(ty.Tmpfs[0].Options, ",") != "size=16m,mode=1777" || ty.Tmpfs[1].Path != "/tmp" {
		t.Fatalf("tmpfs: %+v", ty.Tmpfs)
	}
	for _, tc := range []struct{ line, want string }{
		{`user: "root; rm -rf /"`, `user "root; rm -rf /" is not USER[:GROUP]`},
		{`entrypoint: []`, "entrypoint is empty"},
		{`working-dir: srv`, `working-dir "srv" is not a clean absolute path`},
		{`working-dir: /srv/../etc`, `is not a clean absolute path`},
		{`cap-add: [net_admin]`, `"net_admin" is not a capability name`},
		{`devices: [/etc/passwd]`, "the host side must be a clean path under /dev/"},
		{`devices: ["/dev/null:/x:rwx"]`, `permissions "rwx"`},
		{`tmpfs: [run]`, "clean absolute path"},
		{`tmpfs: ["/run:exec=yes"]`, `option "exec=yes"`},
		{`memory: lots`, `memory "lots" is not a size`},
		{`memory: 1k`, "below 6m"},
		{`cpus: -1`, "not between"},
		{`stop-signal: SIGFOO`, `stop-signal "SIGFOO" is not a signal`},
		{`stop-timeout: 2h`, "between 0s and 90s"},
		{`labels: {mesh.digest: x}`, "keys starting with mesh. are the mesh's own"},
		{`read-only: "yes"`, "read-only"},
	} {
		bad := "module: cf\nresources:\n  - container: cf.app\n    image: busybox\n    " + tc.line + "\n"
		_, err := Parse("cf.yaml", []byte(bad))
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: %v, want %q", tc.line, err, tc.want)
			continue
		}
		if !strings.Contains(err.Error(), "cf.yaml:5") {
			t.Errorf("%s: the error does not name line 5: %v", tc.line, err)
		}
	}
	// The fields belong to steps and containers only.
	if _, err := Parse("cf.yaml", []byte("module: cf\nresources:\n  - directory: /srv/cf\n    user: root\n")); err == nil || !strings.Contains(err.Error(), "user") {
		t.Errorf("a directory with a user: %v", err)
	}
}
