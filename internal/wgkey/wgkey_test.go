package wgkey

import (
	"os"
	"path/filepath"
	"testing"
)

func TestKeyIsKeptAndPrivate(t *testing.T) {
	dir := t.TempDir()
	a, err := LoadOrCreate(dir)
	if err != nil {
		t.Fatal(err)
	}
	b, err := LoadOrCreate(dir)
	if err != nil {
		t.Fatal(err)
	}
	if a.Public() != b.Public() || a.PrivateHex() != b.PrivateHex() {
		t.Fatal("a second load made another key")
	}
	fi, err := os.Stat(filepath.Join(dir, File))
	if err != nil || fi.Mode().Perm() != 0o600 {
		t.Fatalf("key file: %v %v", fi, err)
	}
	if _, err := PublicHex(a.Public()); err != nil {
		t.Fatal(err)
	}
	c, _ := Generate()
	if c.Public() == a.Public() {
		t.Fatal("two keys are the same")
	}
	// A damaged key is named, never replaced.
	os.WriteFile(filepath.Join(dir, File), []byte("garbage\n"), 0o600)
	if _, err := LoadOrCreate(dir); err == nil {
		t.Fatal("a damaged key was taken or replaced")
	}
}
