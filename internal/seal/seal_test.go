package seal

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestSealOpensOnlyForItsRecipients(t *testing.T) {
	dir := t.TempDir()
	a, err := LoadOrCreate(filepath.Join(dir))
	if err != nil {
		t.Fatal(err)
	}
	other := t.TempDir()
	b, _ := LoadOrCreate(other)
	c, _ := LoadOrCreate(t.TempDir())
	sealed, err := Seal("s3cret", []string{a.Recipient(), b.Recipient()})
	if err != nil {
		t.Fatal(err)
	}
	if strings.Contains(sealed, "s3cret") {
		t.Fatal("the sealed form holds the secret")
	}
	for _, id := range []*Identity{a, b} {
		got, err := id.Open(sealed)
		if err != nil || got != "s3cret" {
			t.Fatalf("a recipient opens %q, %v", got, err)
		}
	}
	if _, err := c.Open(sealed); !errors.Is(err, ErrNotForUs) {
		t.Fatalf("another node opened it or failed otherwise: %v", err)
	}
	if _, err := a.Open(sealed[:len(sealed)/2]); err == nil || errors.Is(err, ErrNotForUs) {
		t.Fatalf("a damaged secret: %v", err)
	}
	if _, err := Seal("x", nil); err == nil {
		t.Fatal("sealed to nobody")
	}
	if _, err := Seal("x", []string{"age1nonsense"}); err == nil {
		t.Fatal("sealed to a bad recipient")
	}
}

func TestIdentityIsKept(t *testing.T) {
	dir := t.TempDir()
	a, err := LoadOrCreate(dir)
	if err != nil {
		t.Fatal(err)
	}
	st, err := os.Stat(filepath.Join(dir, IdentityFile))
	if err != nil || st.Mode().Perm() != 0o600 {
		t.Fatalf("identity file: %v %v", st, err)
	}
	again, err := LoadOrCreate(dir)
	if err != nil || again.Recipient() != a.Recipient() {
		t.Fatalf("the identity changed on reload: %v", err)
	}
	os.WriteFile(filepath.Join(dir, IdentityFile), []byte("garbage\n"), 0o600)
	if _, err := LoadOrCreate(dir); err == nil || !strings.Contains(err.Error(), "put it back from a backup") {
		t.Fatalf("a damaged identity: %v", err)
	}
}

// BenchmarkValueDigest is what one mesh secret set costs its proposer
// (argon2id, 19 MiB, 2 passes).
func BenchmarkValueDigest(b *testing.B) {
	salt := NewSalt()
	v := []byte("correct horse battery staple")
	b.ReportAllocs()
	for b.Loop() {
		if _, err := ValueDigest(v, salt); err != nil {
			b.Fatal(err)
		}
	}
}

// The digest is the same for the same value and salt, differs for another
// value or salt, and a salt that is not hex is refused.
func TestValueDigest(t *testing.T) {
	s1, s2 := NewSalt(), NewSalt()
	a, _ := ValueDigest([]byte("pw"), s1)
	b, _ := ValueDigest([]byte("pw"), s1)
	c, _ := ValueDigest([]byte("pw2"), s1)
	d, _ := ValueDigest([]byte("pw"), s2)
	if a != b || a == c || a == d || len(a) != 64 {
		t.Fatalf("digests %s %s %s %s", a, b, c, d)
	}
	if _, err := ValueDigest([]byte("pw"), "zz"); err == nil {
		t.Fatal("a salt that is not hex was taken")
	}
}
