package state

import (
	"context"
	"fmt"
	"testing"

	"mesh/state/manifest"
)

// A manifest with tty:, init:, pids-limit: or group-add: needs format 11:
// a node whose binary is older would store it without them and run another
// container than the newer nodes do. One without them, or with a dotted env
// key (which every binary passes to Podman as it is), keeps its format.
func TestContainerKeysFormat(t *testing.T) {
	src := func(extra string) string {
		return "module: ck\nresources:\n  - container: ck.app\n    image: b:1\n" + extra
	}
	for _, c := range []struct {
		extra string
		want  int
	}{
		{"", 3},
		{"    env: {discovery.type: single-node}\n", 3},
		{"    tty: true\n", containerKeysFormat},
		{"    init: true\n", containerKeysFormat},
		{"    pids-limit: 512\n", containerKeysFormat},
		{"    group-add: [video]\n", containerKeysFormat},
	} {
		if v := NewCommand(&ModuleAddRequest{Modules: []ModuleSpec{spec("ck.yaml", src(c.extra))}}).V; v != c.want {
			t.Errorf("%q: format %d, want %d", c.extra, v, c.want)
		}
		if v := NewCommand(&RestoreBody{Modules: []RestoredModule{{ModuleSpec: spec("ck.yaml", src(c.extra))}}}).V; v < c.want {
			t.Errorf("restore of %q: format %d, want at least %d", c.extra, v, c.want)
		}
	}
	if containerKeysFormat > CommandVersion {
		t.Fatalf("this binary writes format %d and applies up to %d", containerKeysFormat, CommandVersion)
	}

	// This binary applies it, and the keys are in the stored form.
	s := openStore(t)
	var idx uint64
	mustApply(t, s, &idx, &InitRequest{MeshID: "m-1", Node: Node{Name: "ace", Address: "10.0.0.1"}})
	mustApply(t, s, &idx, &ModuleAddRequest{Modules: []ModuleSpec{spec("ck.yaml", src("    tty: true\n    init: true\n    pids-limit: 512\n    group-add: [\"1000\", video]\n"))}})
	m, err := s.Manifest(context.Background(), "ck")
	if err != nil {
		t.Fatal(err)
	}
	r := m.Resources[0]
	if !r.TTY || !r.Init || r.PidsLimit == nil || *r.PidsLimit != 512 || r.Typed.PidsLimit != 512 || len(r.GroupAdd) != 2 || r.GroupAdd[1] != "video" {
		t.Fatalf("stored: %+v", r)
	}
}

// A manifest with a data directory needs format 12: an older node would
// remove the directory, empty, when the module goes (issue 30).
func TestDataFormat(t *testing.T) {
	src := func(extra string) string {
		return "module: dk\nresources:\n  - directory: /srv/dk\n    owner: \"0:0\"\n    mode: \"0750\"\n" + extra + "  - container: dk.app\n    image: b:1\n    tty: true\n"
	}
	if v := NewCommand(&ModuleAddRequest{Modules: []ModuleSpec{spec("dk.yaml", src(""))}}).V; v != containerKeysFormat {
		t.Errorf("without data: format %d, want %d", v, containerKeysFormat)
	}
	if v := NewCommand(&ModuleAddRequest{Modules: []ModuleSpec{spec("dk.yaml", src("    data: true\n"))}}).V; v != dataFormat {
		t.Errorf("with data: format %d, want %d", v, dataFormat)
	}
	if dataFormat > CommandVersion {
		t.Fatalf("this binary writes format %d and applies up to %d", dataFormat, CommandVersion)
	}
}

// A manifest that declares backups (backup:, or a step with before-backup:
// true) needs format 13: an older node would store the module without them
// and run the before-backup step at every apply. This binary applies it,
// and the stored form keeps both.
func TestBackupFormat(t *testing.T) {
	const module = "module: bk\n%sresources:\n  - directory: /srv/bk\n    owner: \"0:0\"\n    mode: \"0750\"\n    data: true\n  - step: dump\n    image: b:1\n    mounts: [\"/srv/bk:/data\"]\n%s  - container: bk.app\n    image: b:1\n"
	src := func(backup, step string) string { return fmt.Sprintf(module, backup, step) }
	for _, c := range []struct {
		name         string
		backup, step string
		want         int
	}{
		{"data only", "", "", dataFormat},
		{"backup:", "backup: {schedule: daily}\n", "", backupFormat},
		{"backup: with keep only", "backup: {keep: {daily: 7}}\n", "", backupFormat},
		{"before-backup", "", "    before-backup: true\n", backupFormat},
		{"both", "backup: {schedule: hourly, pause: true}\n", "    before-backup: true\n", backupFormat},
	} {
		sp := spec("bk.yaml", src(c.backup, c.step))
		if v := NewCommand(&ModuleAddRequest{Modules: []ModuleSpec{sp}}).V; v != c.want {
			t.Errorf("%s: module.add of format %d, want %d", c.name, v, c.want)
		}
		if v := NewCommand(&RestoreBody{Modules: []RestoredModule{{ModuleSpec: sp}}}).V; v < c.want {
			t.Errorf("%s: restore of format %d, want at least %d", c.name, v, c.want)
		}
	}
	if backupFormat > CommandVersion {
		t.Fatalf("this binary writes format %d and applies up to %d", backupFormat, CommandVersion)
	}

	s := openStore(t)
	var idx uint64
	mustApply(t, s, &idx, &InitRequest{MeshID: "m-1", Node: Node{Name: "ace", Address: "10.0.0.1"}})
	mustApply(t, s, &idx, &ModuleAddRequest{Modules: []ModuleSpec{spec("bk.yaml", src("backup:\n  schedule: daily\n  keep: {last: 3, daily: 7}\n  pause: true\n", "    before-backup: true\n"))}})
	m, err := s.Manifest(context.Background(), "bk")
	if err != nil {
		t.Fatal(err)
	}
	if b := m.Backup; b == nil || b.Schedule != "daily" || !b.Pause || b.Keep == nil || *b.Keep != (manifest.Keep{Last: 3, Daily: 7}) {
		t.Fatalf("stored backup: %+v", b)
	}
	if !m.Resources[1].BeforeBackup || m.Resources[2].BeforeBackup {
		t.Fatalf("stored resources: %+v", m.Resources)
	}
}
