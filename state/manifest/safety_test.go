package manifest

import (
	"strings"
	"testing"
)

// Issue 8 item 5: system paths and the data dir are refused with a line.
func TestSystemPathsAreRefused(t *testing.T) {
	for _, p := range []string{"/etc", "/etc/nginx", "/usr/local/x", "/proc/1", "/sys/x", "/dev/sda", "/boot", "/var/lib/mesh/x", "/run/x", "/lib64"} {
		_, err := Parse("m.yaml", []byte("module: a\nresources:\n  - directory: "+p+"\n"))
		if err == nil || !strings.Contains(err.Error(), "m.yaml:3: directory \""+p+"\"") || !strings.Contains(err.Error(), "belongs to the system") {
			t.Errorf("%s: %v", p, err)
		}
	}
	// A parent of a system tree holds it (/var/lib holds dpkg's state and
	// the container engine's), and the spools are the system's.
	for _, p := range []string{"/var/lib", "/var", "/var/spool/cron", "/var/lib/dpkg/info", "/var/lib/systemd"} {
		_, err := Parse("m.yaml", []byte("module: a\nresources:\n  - directory: "+p+"\n"))
		if err == nil || !strings.Contains(err.Error(), "belongs to the system") {
			t.Errorf("%s: %v", p, err)
		}
	}
	// The trees everything on the host shares: a directory inside one is a
	// module's, the tree itself is not (declared, a module would own and
	// chmod /tmp; mounted, /home gives a container every user's files).
	for _, p := range []string{"/home", "/tmp", "/srv", "/opt", "/mnt", "/media", "/var/tmp", "/var/log", "/var/cache", "/var/mail", "/var/backups"} {
		_, err := Parse("m.yaml", []byte("module: a\nresources:\n  - directory: "+p+"\n"))
		if err == nil || !strings.Contains(err.Error(), "m.yaml:3: directory \""+p+"\"") || !strings.Contains(err.Error(), "shared by everything on the host") {
			t.Errorf("%s: %v", p, err)
		}
		_, err = Parse("m.yaml", []byte("module: a\nresources:\n  - container: a.c\n    image: i\n    mounts: [\""+p+":/x\"]\n"))
		if err == nil || !strings.Contains(err.Error(), "shared by everything on the host") {
			t.Errorf("mount of %s: %v", p, err)
		}
		if err := CheckHostPath(p); err == nil {
			t.Errorf("CheckHostPath(%s) passed", p)
		}
	}
	for _, p := range []string{"/srv/a", "/var/lib/gitea", "/home/u/x", "/home/git", "/tmp/bed/x", "/opt/app", "/mnt/disk/photos", "/var/log/app", "/etcetera", "/usrdata", "/var/libx", "/srvx", "/homes"} {
		if _, err := Parse("m.yaml", []byte("module: a\nresources:\n  - directory: "+p+"\n")); err != nil {
			t.Errorf("%s refused: %v", p, err)
		}
	}
	m, err := Parse("m.yaml", []byte("module: a\nresources:\n  - directory: /srv/mesh\n  - directory: /srv/mesh/x\n  - container: a.c\n    image: i\n    mounts: [\"/srv/mesh/x:/x\"]\n"))
	if err != nil {
		t.Fatal(err)
	}
	if err := CheckDataDir(m, "/srv/mesh/x"); err == nil || !strings.Contains(err.Error(), "m.yaml:3: directory \"/srv/mesh\"") {
		t.Fatalf("data dir: %v", err)
	}
	if err := CheckDataDir(m, "/var/lib/mesh"); err != nil {
		t.Fatal(err)
	}
}

// Issue 8 item 4: a writable mount may not contain another mount's source.
func TestNestedWritableMountsAreRefused(t *testing.T) {
	src := `module: a
resources:
  - directory: /srv/a
  - directory: /srv/a/child
  - container: a.parent
    image: i
    mounts: ["/srv/a:/a"]
  - container: a.child
    image: i
    mounts: ["/srv/a/child:/c"]
`
	_, err := Parse("m.yaml", []byte(src))
	if err == nil || !strings.Contains(err.Error(), `m.yaml:10: mount "/srv/a/child:/c" of a.child: its host path is inside "/srv/a", which a.parent mounts writable`) {
		t.Fatalf("%v", err)
	}
	ro := strings.Replace(src, `"/srv/a:/a"`, `"/srv/a:/a:ro"`, 1)
	if _, err := Parse("m.yaml", []byte(ro)); err != nil {
		t.Fatalf("read-only parent refused: %v", err)
	}
	same := strings.Replace(src, `"/srv/a/child:/c"`, `"/srv/a:/c"`, 1)
	if _, err := Parse("m.yaml", []byte(same)); err != nil {
		t.Fatalf("the same path mounted twice refused: %v", err)
	}
}

// take-over is a key of file kinds and directories (not of steps or
// containers), and is in the schema.
func TestTakeOverKey(t *testing.T) {
	m, err := Parse("m.yaml", []byte("module: a\nresources:\n  - directory: /srv/a\n    take-over: true\n  - file: /srv/a/f\n    take-over: true\n"))
	if err != nil || !m.Resources[0].TakeOver || !m.Resources[1].TakeOver {
		t.Fatalf("%v", err)
	}
	_, err = Parse("m.yaml", []byte("module: a\nresources:\n  - container: a.c\n    image: i\n    take-over: true\n"))
	if err == nil || !strings.Contains(err.Error(), "does not take `take-over`") {
		t.Fatalf("%v", err)
	}
	b, _ := Schema()
	if !strings.Contains(string(b), `"take-over"`) {
		t.Fatal("take-over is not in the schema")
	}
}

// Issue 8 item 10: hostile manifests get an error with a line, never a panic.
func TestHostileManifests(t *testing.T) {
	deepBlock := "module: a\nx:\n"
	for i := 1; i < 200; i++ {
		deepBlock += strings.Repeat(" ", i) + "a:\n"
	}
	for name, tc := range map[string]struct{ src, want string }{
		"tag on resources":  {"resources: !!map {}\n", "m.yaml:1: YAML tag !!map"},
		"tag on routes":     {"module: a\nroutes: !!map {}\n", "m.yaml:2: YAML tag !!map"},
		"custom tag":        {"module: !foo a\n", "YAML tag !foo"},
		"alias bomb":        {"a: &a [x,x]\nb: [*a,*a]\nmodule: x\n", "m.yaml:1: YAML anchors, aliases and merge keys"},
		"merge key":         {"module: a\n<<: {b: 1}\n", "merge keys"},
		"deep flow":         {"module: a\nx: " + strings.Repeat("{a: ", 5000) + strings.Repeat("}", 5000) + "\n", "nests deeper than 32 levels"},
		"deep block":        {deepBlock, "nests deeper than 32 levels"},
		"deep sequence":     {"module: a\nx: " + strings.Repeat("- ", 100) + "a\n", "nests deeper"},
		"nul":               {"module: a\x00\n", "not UTF-8 text"},
		"invalid utf8":      {"module: \xff\n", "not UTF-8 text"},
		"too big":           {strings.Repeat("#", MaxSize+1), "more than the 1048576 allowed"},
		"too many tokens":   {"module: a\nx: [" + strings.Repeat("1,", MaxTokens) + "1]\n", "more than 100000 YAML tokens"},
		"scalar document":   {"just text\n", "a manifest is a mapping"},
		"empty":             {"", "manifest is empty"},
		"two documents":     {"module: a\n---\nmodule: b\n", "more than one YAML document"},
		"unbalanced":        {"module: [a\n", "m.yaml"},
		"tab indentation":   {"module: a\nresources:\n\t- directory: /srv/a\n", "m.yaml"},
		"number for a list": {"module: a\nresources: 3\n", "m.yaml:2: `resources` must be a list, e.g. resources: [{directory: /srv/web}]; got the number 3"},
	} {
		t.Run(name, func(t *testing.T) {
			_, err := Parse("m.yaml", []byte(tc.src))
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("want %q, got %v", tc.want, err)
			}
			if strings.Contains(err.Error(), "the YAML library failed") {
				t.Fatalf("the library panicked: %v", err)
			}
		})
	}
}
