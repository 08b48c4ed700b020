package testutil

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
)

// Postgres is a private PostgreSQL server for one test.
type Postgres struct {
	t    testing.TB
	dir  string
	sock string
	log  string
}

// StartPostgres runs a private PostgreSQL until the test ends: its own data
// dir, its socket in sockDir (a new directory when empty), SCRAM logins for
// every role but the superuser, every statement in its log. As root the
// server runs as the postgres user (initdb refuses root).
func StartPostgres(t testing.TB, sockDir string) *Postgres {
	t.Helper()
	bins, _ := filepath.Glob("/usr/lib/postgresql/*/bin/initdb")
	if len(bins) == 0 {
		t.Fatal("PostgreSQL is not installed; contrib/test.sh installs it (apt-get install postgresql)")
	}
	bin := filepath.Dir(bins[len(bins)-1])
	base, err := os.MkdirTemp("", "mesh-pg-")
	if err != nil {
		t.Fatal(err)
	}
	if sockDir == "" {
		sockDir = base
	}
	s := &Postgres{t: t, dir: filepath.Join(base, "data"), sock: sockDir, log: filepath.Join(base, "server.log")}
	run := func(args ...string) {
		t.Helper()
		var cmd *exec.Cmd
		if os.Geteuid() == 0 {
			// initdb refuses root: the server runs as the postgres user.
			cmd = exec.Command("runuser", append([]string{"-u", "postgres", "--"}, args...)...)
		} else {
			cmd = exec.Command(args[0], args[1:]...)
		}
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("%s: %v\n%s", strings.Join(args, " "), err, out)
		}
	}
	if os.Geteuid() == 0 {
		if out, err := exec.Command("chown", "postgres:postgres", base).CombinedOutput(); err != nil {
			t.Fatalf("chown: %v %s", err, out)
		}
	}
	run(filepath.Join(bin, "initdb"), "-D", s.dir, "-U", "postgres", "--auth-local=trust", "--auth-host=reject", "-E", "UTF8")
	hba := "local all postgres trust\nlocal all all scram-sha-256\n"
	run("sh", "-c", fmt.Sprintf("printf '%s' > %s/pg_hba.conf", strings.ReplaceAll(hba, "\n", `\n`), s.dir))
	run(filepath.Join(bin, "pg_ctl"), "-D", s.dir, "-l", s.log, "-w", "-o",
		fmt.Sprintf("-c listen_addresses='' -k %s -p 5432 -c log_statement=all -c password_encryption=scram-sha-256", s.sock), "start")
	t.Cleanup(func() {
		args := []string{filepath.Join(bin, "pg_ctl"), "-D", s.dir, "-m", "immediate", "stop"}
		if os.Geteuid() == 0 {
			exec.Command("runuser", append([]string{"-u", "postgres", "--"}, args...)...).Run()
		} else {
			exec.Command(args[0], args[1:]...).Run()
		}
		os.RemoveAll(base)
	})
	return s
}

// AdminDSN reaches it as the superuser.
func (s *Postgres) AdminDSN() string {
	return fmt.Sprintf("host=%s port=5432 user=postgres dbname=postgres", s.sock)
}

// Login connects as a consumer with its secret, to its own database, and
// says who owns that database.
func (s *Postgres) Login(name, secret string) (owner string, err error) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	c, err := pgx.Connect(ctx, fmt.Sprintf("host=%s port=5432 user=%s password=%s dbname=%s", s.sock, name, secret, name))
	if err != nil {
		return "", err
	}
	defer c.Close(ctx)
	err = c.QueryRow(ctx, `SELECT pg_get_userbyid(datdba) FROM pg_database WHERE datname = current_database()`).Scan(&owner)
	return owner, err
}

// Statements counts the statements in the server's own log that contain s.
func (s *Postgres) Statements(sub string) int {
	b, err := os.ReadFile(s.log)
	if err != nil {
		s.t.Fatal(err)
	}
	n := 0
	for _, l := range strings.Split(string(b), "\n") {
		if strings.Contains(l, "statement:") && strings.Contains(l, sub) {
			n++
		}
	}
	return n
}
