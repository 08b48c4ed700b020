package main

import (
	"bytes"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"testing"

	"mesh/internal/testutil"
)

// A full disk while the manifests are written leaves the output directory
// as it was: no manifest cut short, none of a half-done import, no
// temporary file, and an earlier import's manifests (perhaps edited since)
// untouched under --force.
func TestImportWritesAllOrNothing(t *testing.T) {
	dir := t.TempDir()
	file := filepath.Join(dir, "compose.yaml")
	os.WriteFile(file, []byte("name: shop\nservices:\n  a:\n    image: busybox\n  b:\n    image: busybox\n  c:\n    image: busybox\n"), 0o644)
	out := filepath.Join(dir, "out")
	// Three pages: one for the filler, room for two manifests of three.
	testutil.Tmpfs(t, out, "size=12k")
	if err := os.WriteFile(filepath.Join(out, ".filler"), []byte("x"), 0o600); err != nil {
		t.Fatal(err)
	}
	list := func() []string {
		ents, _ := os.ReadDir(out)
		var names []string
		for _, e := range ents {
			names = append(names, e.Name())
		}
		sort.Strings(names)
		return names
	}
	g := &Globals{out: &bytes.Buffer{}}
	err := (&ImportComposeCmd{File: file, Output: out, Root: "/srv"}).Run(g)
	if err == nil || !strings.Contains(err.Error(), "no space left") || !strings.Contains(err.Error(), "nothing was written") {
		t.Fatalf("import onto a full disk: %v", err)
	}
	if got := strings.Join(list(), " "); got != ".filler" {
		t.Fatalf("after a failed import the output holds: %s", got)
	}
	// An earlier import's manifests, edited by the operator, and --force.
	os.Remove(filepath.Join(out, ".filler"))
	if err := (&ImportComposeCmd{File: file, Output: out, Root: "/srv"}).Run(g); err != nil {
		t.Fatal(err)
	}
	os.WriteFile(filepath.Join(out, "a.yaml"), []byte("# edited\n"), 0o644)
	if err := os.WriteFile(filepath.Join(out, ".filler"), bytes.Repeat([]byte("x"), 100), 0o600); err == nil {
		t.Fatal("the tmpfs has room for a fourth page")
	}
	before := list()
	err = (&ImportComposeCmd{File: file, Output: out, Root: "/srv", Force: true}).Run(g)
	if err == nil || !strings.Contains(err.Error(), "no space left") {
		t.Fatalf("import --force onto a full disk: %v", err)
	}
	if b, _ := os.ReadFile(filepath.Join(out, "a.yaml")); string(b) != "# edited\n" {
		t.Fatalf("an edited manifest was replaced by a failed import: %q", b)
	}
	if got, want := strings.Join(list(), " "), strings.Join(before, " "); got != want {
		t.Fatalf("after a failed import --force the output holds %s, not %s", got, want)
	}
}

// Issue 31, item 2: a relative --output, the default ./PROJECT included,
// works, and prints the notes; --json gives them with their kinds.
func TestImportRelativeOutput(t *testing.T) {
	dir := t.TempDir()
	os.WriteFile(filepath.Join(dir, "compose.yaml"), []byte("name: shop\nservices:\n  db:\n    image: postgres:16\n  app:\n    image: busybox\n    depends_on: [db]\n"), 0o644)
	wd, _ := os.Getwd()
	t.Cleanup(func() { os.Chdir(wd) })
	if err := os.Chdir(dir); err != nil {
		t.Fatal(err)
	}
	for _, out := range []string{"", "out", "./deeper/out"} {
		var buf bytes.Buffer
		if err := (&ImportComposeCmd{File: "compose.yaml", Output: out, Root: "/srv"}).Run(&Globals{out: &buf}); err != nil {
			t.Fatalf("--output %q: %v", out, err)
		}
		want := out
		if want == "" {
			want = "shop"
		}
		if _, err := os.Stat(filepath.Join(dir, want, "db.yaml")); err != nil {
			t.Errorf("--output %q: %v", out, err)
		}
		if !strings.Contains(buf.String(), "db: published at 5432:5432/tcp inside the mesh") || !strings.Contains(buf.String(), "wrote 2 manifests") {
			t.Errorf("--output %q printed:\n%s", out, buf.String())
		}
	}
	var buf bytes.Buffer
	if err := (&ImportComposeCmd{File: "compose.yaml", Output: "j", Root: "/srv", JSON: true}).Run(&Globals{out: &buf}); err != nil {
		t.Fatal(err)
	}
	var got struct {
		Project, Output string
		Files           []string
		Notes           []struct{ Service, Kind, Text string }
	}
	if err := json.Unmarshal(buf.Bytes(), &got); err != nil || got.Project != "shop" || got.Output != filepath.Join(dir, "j") || len(got.Files) != 2 || len(got.Notes) == 0 || got.Notes[0].Kind == "" {
		t.Fatalf("--json: %v %+v\n%s", err, got, buf.String())
	}
	err := (&ImportComposeCmd{File: "compose.yaml", Output: "k", Root: "rel"}).Run(&Globals{out: &buf})
	var ue usageError
	if !errors.As(err, &ue) {
		t.Fatalf("--root rel: %v, want a usage error", err)
	}
}

// A manifest that carries the content of a file only its owner may read
// is written readable by its owner only; the others as before.
func TestImportWritesPrivateManifestsPrivate(t *testing.T) {
	dir := t.TempDir()
	file := filepath.Join(dir, "compose.yaml")
	os.WriteFile(file, []byte("name: shop\nservices:\n  a:\n    image: busybox\n    volumes: [./key.pem:/key.pem:ro]\n  b:\n    image: busybox\n"), 0o644)
	os.WriteFile(filepath.Join(dir, "key.pem"), []byte("secret\n"), 0o600)
	out := filepath.Join(dir, "out")
	if err := (&ImportComposeCmd{File: file, Output: out, Root: "/srv"}).Run(&Globals{out: &bytes.Buffer{}}); err != nil {
		t.Fatal(err)
	}
	for name, want := range map[string]os.FileMode{"a.yaml": 0o600, "b.yaml": 0o644} {
		fi, err := os.Stat(filepath.Join(out, name))
		if err != nil {
			t.Fatal(err)
		}
		if fi.Mode().Perm() != want {
			t.Errorf("%s: mode %04o, want %04o", name, fi.Mode().Perm(), want)
		}
	}
}
