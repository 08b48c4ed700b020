package manifest

import (
	"encoding/json"
	"reflect"
	"slices"
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
		refusedAtLine5(t, tc.line, tc.want)
	}
	// The fields belong to steps and containers only.
	if _, err := Parse("cf.yaml", []byte("module: cf\nresources:\n  - directory: /srv/cf\n    user: root\n")); err == nil || !strings.Contains(err.Error(), "user") {
		t.Errorf("a directory with a user: %v", err)
	}
}

// The keys `mesh import compose` carries from compose's tty, init,
// pids_limit and group_add, and the SELinux labels of a mount (z, Z): each
// is checked at parse with its key and line, and typed once.
func TestComposeKeys(t *testing.T) {
	src := `module: cf
resources:
  - directory: /srv/cf
  - container: cf.app
    image: busybox
    tty: true
    init: true
    pids-limit: 512
    group-add: ["1000", video, 0]
    mounts: ["/srv/cf:/data:z", "/srv/cf:/conf:ro,Z"]
`
	m, err := Parse("cf.yaml", []byte(src))
	if err != nil {
		t.Fatal(err)
	}
	r := m.Resources[1]
	if !r.TTY || !r.Init || r.PidsLimit == nil || *r.PidsLimit != 512 || r.Typed.PidsLimit != 512 {
		t.Fatalf("tty %v, init %v, pids-limit %v (typed %d)", r.TTY, r.Init, r.PidsLimit, r.Typed.PidsLimit)
	}
	if strings.Join(r.GroupAdd, " ") != "1000 video 0" {
		t.Fatalf("group-add: %q", r.GroupAdd)
	}
	mt := r.Typed.Mounts
	if len(mt) != 2 || strings.Join(mt[0].Options, ",") != "z" || mt[0].ReadOnly || strings.Join(mt[1].Options, ",") != "ro,Z" || !mt[1].ReadOnly {
		t.Fatalf("mounts: %+v", mt)
	}
	// Unset, each is absent: no limit of the mesh's, no typed value.
	plain, err := Parse("cf.yaml", []byte("module: cf\nresources:\n  - container: cf.app\n    image: busybox\n"))
	if err != nil {
		t.Fatal(err)
	}
	if p := plain.Resources[0]; p.TTY || p.Init || p.PidsLimit != nil || p.Typed.PidsLimit != 0 || p.GroupAdd != nil {
		t.Fatalf("a container without the keys: %+v", p)
	}
	for _, tc := range []struct{ line, want string }{
		{`pids-limit: 0`, `container "cf.app": pids-limit 0 is not between 1 and 4194304; leave it out for Podman's default`},
		{`pids-limit: -1`, "pids-limit -1 is not between 1 and 4194304"},
		{`pids-limit: 4194305`, "pids-limit 4194305 is not between 1 and 4194304"},
		{`pids-limit: lots`, "`pids-limit` must be a whole number, e.g. pids-limit: 512"},
		{`pids-limit: 1.5`, "`pids-limit` must be a whole number"},
		{`tty: "yes"`, "`tty` must be true or false"},
		{`init: 1`, "`init` must be true or false"},
		{`group-add: video`, "`group-add` must be a list"},
		{`group-add: ["wheel staff"]`, `group-add "wheel staff" is not a group: a numeric gid (0 to 2147483647) or a name`},
		{`group-add: ["2147483648"]`, `group-add "2147483648" is not a group`},
		{`group-add: [-staff]`, `group-add "-staff" is not a group`},
		{`group-add: [keep-groups]`, "group-add keep-groups is Podman's own"},
		{`mounts: ["/srv/cf:/d:z,Z"]`, "options z and Z: give one of z (a label shared with other containers) and Z (a label private to this one)"},
		{`mounts: ["/srv/cf:/d:Z,Z"]`, "options Z and Z: give one of z"},
		{`mounts: ["/srv/cf:/d:ro,rw"]`, "options ro and rw: give one of ro and rw"},
		{`mounts: ["/srv/cf:/d:shared"]`, `option "shared" is not one of ro, rw, z, Z`},
	} {
		refusedAtLine5(t, tc.line, tc.want)
	}
	for _, key := range []string{"tty: true", "init: true", "pids-limit: 5", "group-add: [video]"} {
		if _, err := Parse("cf.yaml", []byte("module: cf\nresources:\n  - directory: /srv/cf\n    "+key+"\n")); err == nil || !strings.Contains(err.Error(), "a directory does not take `"+strings.Split(key, ":")[0]+"`") {
			t.Errorf("a directory with %s: %v", key, err)
		}
	}
	for g, ok := range map[string]bool{"0": true, "1000": true, "2147483647": true, "video": true, "_ssh": true, "www-data": true, "a.b": true,
		"2147483648": false, "": false, "-a": false, ".a": false, "a:b": false, "a b": false, strings.Repeat("g", 33): false} {
		if ValidGroup(g) != ok {
			t.Errorf("ValidGroup(%q) = %v, want %v", g, !ok, ok)
		}
	}
}

// Env keys are what images read, dotted ones too (elasticsearch's
// discovery.type): letters, digits, '_', '.' and '-', starting with a
// letter or '_', in env and env-secrets alike.
func TestEnvKeys(t *testing.T) {
	src := "module: es\nresources:\n  - container: es.main\n    image: es\n    env: {discovery.type: single-node, xpack.security.enabled: \"false\", ES_JAVA_OPTS: -Xmx1g, _x: \"1\", a-b: \"2\"}\n    env-secrets: {elastic.password: pw}\n"
	m, err := Parse("es.yaml", []byte(src))
	if err != nil {
		t.Fatal(err)
	}
	r := m.Resources[0]
	if r.Env["discovery.type"] != "single-node" || r.Env["xpack.security.enabled"] != "false" || r.EnvSecrets["elastic.password"] != "pw" {
		t.Fatalf("env %v, env-secrets %v", r.Env, r.EnvSecrets)
	}
	for k, ok := range map[string]bool{"discovery.type": true, "A": true, "_": true, "a-b": true, "X1.y_z-2": true,
		"": false, "1X": false, ".a": false, "-a": false, "A B": false, "A=B": false, "é": false, "a\x00": false} {
		if ValidEnvKey(k) != ok {
			t.Errorf("ValidEnvKey(%q) = %v, want %v", k, !ok, ok)
		}
	}
	for key, want := range map[string]string{
		`env: {"1X": x}`:           `es.yaml:5: env key "1X" is not a variable name; use letters, digits, '_', '.' and '-', starting with a letter or '_'`,
		`env: {".hidden": x}`:      `env key ".hidden" is not a variable name`,
		`env-secrets: {"A=B": pw}`: `es.yaml:5: env-secrets key "A=B" is not a variable name; use letters, digits`,
	} {
		_, err := Parse("es.yaml", []byte("module: es\nresources:\n  - container: es.main\n    image: es\n    "+key+"\n"))
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("%s: %v, want %q", key, err, want)
		}
	}
}

// Every key of a resource is handled where keys are: the shape check
// knows it, the schema lists it, setFields reports it when it is set (so a
// kind that does not take it refuses it), and every key a kind takes is a
// key of a resource. A field added to Resource and forgotten in one of
// these fails here.
func TestEveryKeyIsHandled(t *testing.T) {
	b, err := Schema()
	if err != nil {
		t.Fatal(err)
	}
	var schema struct {
		Defs map[string]struct {
			Properties map[string]json.RawMessage `json:"properties"`
		} `json:"$defs"`
	}
	if err := json.Unmarshal(b, &schema); err != nil {
		t.Fatal(err)
	}
	props := schema.Defs["Resource"].Properties
	if len(props) == 0 {
		t.Fatalf("the schema has no Resource: %s", b)
	}
	kinds := map[string]bool{}
	for _, kv := range (&Resource{}).kinds() {
		kinds[kv[0]] = true
	}
	keys := map[string]bool{}
	rt := reflect.TypeOf(Resource{})
	for i := 0; i < rt.NumField(); i++ {
		f := rt.Field(i)
		key, _, _ := strings.Cut(f.Tag.Get("yaml"), ",")
		if key == "-" || key == "" {
			continue
		}
		keys[key] = true
		if resourceShape.fields[key] == nil {
			t.Errorf("%s: not in the shape check (shape.go)", key)
		}
		if props[key] == nil {
			t.Errorf("%s: not in the schema", key)
		}
		if kinds[key] {
			continue
		}
		var r Resource
		v := reflect.ValueOf(&r).Elem().Field(i)
		switch v.Kind() {
		case reflect.String:
			v.SetString("x")
		case reflect.Bool:
			v.SetBool(true)
		case reflect.Int, reflect.Int64:
			v.SetInt(1)
		case reflect.Float64:
			v.SetFloat(1)
		case reflect.Slice:
			v.Set(reflect.MakeSlice(v.Type(), 1, 1))
		case reflect.Map:
			v.Set(reflect.MakeMap(v.Type()))
		case reflect.Pointer:
			v.Set(reflect.New(v.Type().Elem()))
		default:
			t.Errorf("%s: a %s; teach this test to set one", key, v.Kind())
			continue
		}
		if set := r.setFields(); len(set) != 1 || set[0] != key {
			t.Errorf("%s set: setFields says %v", key, set)
		}
	}
	for kind, ks := range fields {
		for _, k := range ks {
			if !keys[k] {
				t.Errorf("a %s takes %q, which no field of Resource is", kind, k)
			}
		}
	}
	for _, k := range containerFields {
		if !slices.Contains(Keys(KindContainer), k) || !slices.Contains(Keys(KindStep), k) {
			t.Errorf("%s: not taken by both steps and containers", k)
		}
	}
}

// refusedAtLine5 checks that a container with line as its fifth line is
// refused, saying want and naming that line.
func refusedAtLine5(t *testing.T, line, want string) {
	t.Helper()
	_, err := Parse("cf.yaml", []byte("module: cf\nresources:\n  - container: cf.app\n    image: busybox\n    "+line+"\n"))
	if err == nil || !strings.Contains(err.Error(), want) {
		t.Errorf("%s: %v, want %q", line, err, want)
		return
	}
	if !strings.Contains(err.Error(), "cf.yaml:5") {
		t.Errorf("%s: the error does not name line 5: %v", line, err)
	}
}
