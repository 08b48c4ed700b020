package provision

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"mesh/internal/testutil"
)

// deliver writes a credential as the host does: a temp file, then rename.
func deliver(t *testing.T, dir, name, secret string) {
	t.Helper()
	tmp := filepath.Join(dir, "."+name+".tmp")
	if err := os.WriteFile(tmp, []byte("name="+name+"\nsecret="+secret+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(tmp, filepath.Join(dir, name+".credential")); err != nil {
		t.Fatal(err)
	}
}

func outcomeOf(out []Outcome, consumer string) Outcome {
	for _, o := range out {
		if o.Consumer == consumer {
			return o
		}
	}
	return Outcome{}
}

// Issue 11 items 1 and 2, against a real PostgreSQL: a delivered credential
// logs in and owns its database; a rotated one replaces the password; passes
// with nothing changed issue no ALTER ROLE (counted in the server's log);
// a broken file fails that consumer only; a withdrawn one is reported and
// its role kept. No secret reaches the server's statement log.
func TestPostgres(t *testing.T) {
	s := testutil.StartPostgres(t, "")
	dir := t.TempDir()
	p := &Postgres{DSN: s.AdminDSN(), Dir: dir}
	ctx := context.Background()

	deliver(t, dir, "gitea", "first-secret-1")
	deliver(t, dir, "photos", "photos-secret")
	os.WriteFile(filepath.Join(dir, "broken.credential"), []byte("name=broken\n"), 0o600)
	out, err := p.Pass(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if o := outcomeOf(out, "gitea"); o.Outcome != Created {
		t.Fatalf("gitea: %+v", out)
	}
	if o := outcomeOf(out, "broken"); o.Outcome != Failed || !strings.Contains(o.Reason, "lacks a name= or a secret=") {
		t.Fatalf("broken: %+v", o)
	}
	if owner, err := s.Login("gitea", "first-secret-1"); err != nil || owner != "gitea" {
		t.Fatalf("gitea logs in: owner %q, %v", owner, err)
	}
	if owner, err := s.Login("photos", "photos-secret"); err != nil || owner != "photos" {
		t.Fatalf("photos (next to a broken file) logs in: owner %q, %v", owner, err)
	}

	// Nothing changed: several passes, no ALTER ROLE, no CREATE.
	alters, creates := s.Statements("ALTER ROLE"), s.Statements("CREATE ROLE")
	for i := 0; i < 3; i++ {
		out, err := p.Pass(ctx)
		if err != nil || outcomeOf(out, "gitea").Outcome != Unchanged {
			t.Fatalf("quiet pass: %+v %v", out, err)
		}
	}
	if a, c := s.Statements("ALTER ROLE"), s.Statements("CREATE ROLE"); a != alters || c != creates {
		t.Fatalf("quiet passes issued %d ALTER ROLE and %d CREATE ROLE", a-alters, c-creates)
	}

	// Rotated: the old password is refused, the new one accepted.
	deliver(t, dir, "gitea", "second-secret-2")
	out, _ = p.Pass(ctx)
	if o := outcomeOf(out, "gitea"); o.Outcome != Rotated {
		t.Fatalf("rotation: %+v", o)
	}
	if a := s.Statements("ALTER ROLE"); a != alters+1 {
		t.Fatalf("a rotation issued %d ALTER ROLE, want 1", a-alters)
	}
	if _, err := s.Login("gitea", "first-secret-1"); err == nil {
		t.Fatal("the old password still logs in")
	}
	if _, err := s.Login("gitea", "second-secret-2"); err != nil {
		t.Fatalf("the new password: %v", err)
	}

	// Withdrawn: reported, kept.
	os.Remove(filepath.Join(dir, "photos.credential"))
	out, _ = p.Pass(ctx)
	if o := outcomeOf(out, "photos"); o.Outcome != Withdrawn {
		t.Fatalf("withdrawn: %+v", out)
	}
	if _, err := s.Login("photos", "photos-secret"); err != nil {
		t.Fatalf("a withdrawn consumer's role was touched: %v", err)
	}
	if n := s.Statements("DROP"); n != 0 {
		t.Fatalf("%d DROP statements", n)
	}
	for _, secret := range []string{"first-secret-1", "second-secret-2", "photos-secret"} {
		if n := s.Statements(secret); n != 0 {
			t.Fatalf("the secret %q is in the server's statement log", secret)
		}
	}
}

// Issue 11 item 3: with --watch, 20 atomic replacements in a row: the last
// wins and nothing partial is ever applied.
func TestPostgresWatch(t *testing.T) {
	s := testutil.StartPostgres(t, "")
	dir := t.TempDir()
	p := &Postgres{DSN: s.AdminDSN(), Dir: dir}
	ctx, cancel := context.WithCancel(context.Background())
	var mu sync.Mutex
	var failures []string
	done := make(chan struct{})
	go func() {
		defer close(done)
		p.Watch(ctx, 20*time.Millisecond, func(out []Outcome, err error) {
			mu.Lock()
			defer mu.Unlock()
			if err != nil {
				failures = append(failures, err.Error())
			}
			for _, o := range out {
				if o.Outcome == Failed {
					failures = append(failures, o.Consumer+": "+o.Reason)
				}
			}
		})
	}()
	defer func() { cancel(); <-done }()
	for i := 1; i <= 20; i++ {
		deliver(t, dir, "app", fmt.Sprintf("secret-%02d", i))
		time.Sleep(7 * time.Millisecond)
	}
	deadline := time.Now().Add(20 * time.Second)
	for {
		if _, err := s.Login("app", "secret-20"); err == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the last credential was not applied within 20s")
		}
		time.Sleep(50 * time.Millisecond)
	}
	if _, err := s.Login("app", "secret-19"); err == nil {
		t.Fatal("an older credential still logs in")
	}
	mu.Lock()
	defer mu.Unlock()
	if len(failures) > 0 {
		t.Fatalf("atomic replacements made failures: %v", failures)
	}
}

// Hardening, item 6: the provisioner manages only the roles it made. A
// credential named after the superuser, after an operator's role, or after a
// role of its own that someone gave more rights, fails with a reason and
// changes no password.
func TestPostgresTouchesOnlyItsRoles(t *testing.T) {
	s := testutil.StartPostgres(t, "")
	dir := t.TempDir()
	p := &Postgres{DSN: s.AdminDSN(), Dir: dir}
	ctx := context.Background()
	admin, err := pgx.Connect(ctx, s.AdminDSN())
	if err != nil {
		t.Fatal(err)
	}
	defer admin.Close(ctx)
	password := func(role string) string {
		var v string
		if err := admin.QueryRow(ctx, `SELECT coalesce(rolpassword, '') FROM pg_authid WHERE rolname = $1`, role).Scan(&v); err != nil {
			t.Fatal(err)
		}
		return v
	}
	// The operator's own role and database.
	if _, err := admin.Exec(ctx, `CREATE ROLE alice LOGIN PASSWORD 'alices-own'`); err != nil {
		t.Fatal(err)
	}
	if _, err := admin.Exec(ctx, `CREATE DATABASE alice OWNER alice`); err != nil {
		t.Fatal(err)
	}
	superBefore, aliceBefore := password("postgres"), password("alice")
	deliver(t, dir, "postgres", "take-over-the-superuser")
	deliver(t, dir, "alice", "take-over-alice")
	deliver(t, dir, "gitea", "gitea-secret")
	out, err := p.Pass(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if o := outcomeOf(out, "postgres"); o.Outcome != Failed || !strings.Contains(o.Reason, "more rights than the provisioner gives") {
		t.Fatalf("a credential named postgres: %+v", o)
	}
	if o := outcomeOf(out, "alice"); o.Outcome != Failed || !strings.Contains(o.Reason, "the provisioner did not make it") {
		t.Fatalf("a credential named alice: %+v", o)
	}
	if password("postgres") != superBefore || password("alice") != aliceBefore {
		t.Fatal("a password the provisioner does not own was changed")
	}
	if _, err := s.Login("alice", "alices-own"); err != nil {
		t.Fatalf("alice's own password: %v", err)
	}
	if o := outcomeOf(out, "gitea"); o.Outcome != Created {
		t.Fatalf("gitea beside them: %+v", o)
	}
	// Its own role given more rights by hand: no longer touched.
	if _, err := admin.Exec(ctx, `ALTER ROLE gitea CREATEROLE`); err != nil {
		t.Fatal(err)
	}
	giteaBefore := password("gitea")
	deliver(t, dir, "gitea", "gitea-rotated")
	out, err = p.Pass(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if o := outcomeOf(out, "gitea"); o.Outcome != Failed || !strings.Contains(o.Reason, "more rights") || password("gitea") != giteaBefore {
		t.Fatalf("its own role with CREATEROLE: %+v", o)
	}
}
