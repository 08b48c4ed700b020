// Package provision makes a provider accept the credentials the mesh
// delivered to it (`mesh provision postgres`). It reads the provider-side
// credential files (DESIGN.md, "Delivered files": CONSUMER.credential, `name=` and
// `secret=` lines) and makes PostgreSQL accept each: the role, its password
// and the consumer's database. It never drops a role or a database, compares
// credentials by digest only, and keeps no secret beyond the statement that
// sets it: the password goes to PostgreSQL as a SCRAM verifier computed here,
// so not even the server's statement log sees it.
package provision

import (
	"bufio"
	"bytes"
	"context"
	"crypto/hmac"
	"crypto/pbkdf2"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
)

// Outcomes of a consumer in a pass.
const (
	Created   = "created"   // role (and database) made
	Rotated   = "rotated"   // the password changed with the credential
	Unchanged = "unchanged" // nothing to do
	Failed    = "failed"    // this consumer only; retried on the next pass
	Withdrawn = "withdrawn" // its file went away; its role and database are kept
)

// Outcome is what a pass did for one consumer.
type Outcome struct {
	Consumer string
	Outcome  string
	Reason   string `json:",omitempty"`
}

// credential is one delivered file, read for one pass.
type credential struct {
	name   string
	secret string
	digest string
}

// maxCredential bounds what is read of a credential file.
const maxCredential = 4096

var roleRE = regexp.MustCompile(`^[a-z][a-z0-9_-]{0,62}$`)

// readCredentials reads every CONSUMER.credential of dir. A file that is not
// a whole credential fails that consumer only.
func readCredentials(dir string) ([]credential, []Outcome, error) {
	entries, err := os.ReadDir(dir)
	if err != nil {
		return nil, nil, fmt.Errorf("read the credentials directory %s: %w", dir, err)
	}
	var creds []credential
	var failed []Outcome
	for _, e := range entries {
		consumer, ok := strings.CutSuffix(e.Name(), ".credential")
		if !ok || !e.Type().IsRegular() {
			continue
		}
		c, err := readCredential(filepath.Join(dir, e.Name()), consumer)
		if err != nil {
			failed = append(failed, Outcome{Consumer: consumer, Outcome: Failed, Reason: err.Error()})
			continue
		}
		creds = append(creds, c)
	}
	sort.Slice(creds, func(i, j int) bool { return creds[i].name < creds[j].name })
	return creds, failed, nil
}

func readCredential(path, consumer string) (credential, error) {
	f, err := os.Open(path)
	if err != nil {
		return credential{}, err
	}
	defer f.Close()
	b, err := io.ReadAll(io.LimitReader(f, maxCredential+1))
	if err != nil {
		return credential{}, err
	}
	if len(b) > maxCredential {
		return credential{}, fmt.Errorf("%s is over %d bytes; not a credential", filepath.Base(path), maxCredential)
	}
	var c credential
	sc := bufio.NewScanner(bytes.NewReader(b))
	for sc.Scan() {
		k, v, ok := strings.Cut(sc.Text(), "=")
		if !ok {
			continue
		}
		switch k {
		case "name":
			c.name = v
		case "secret":
			c.secret = v
		}
	}
	switch {
	case c.name == "" || c.secret == "":
		return credential{}, fmt.Errorf("%s lacks a name= or a secret= line (half-written?); retried on the next pass", filepath.Base(path))
	case c.name != consumer:
		return credential{}, fmt.Errorf("%s names %q; a credential file is CONSUMER.credential with name=CONSUMER", filepath.Base(path), c.name)
	case !roleRE.MatchString(c.name):
		return credential{}, fmt.Errorf("%q is not a role name this provisioner makes (lower-case letters, digits, '-' and '_')", c.name)
	}
	h := sha256.Sum256([]byte(c.name + "\x00" + c.secret))
	c.digest = hex.EncodeToString(h[:])
	return c, nil
}

// Postgres provisions one PostgreSQL server.
type Postgres struct {
	// DSN reaches the server as a role that may create roles and databases.
	DSN string
	// Dir is the provider's accepts-credentials directory.
	Dir string
	Log *slog.Logger
	// Timeout bounds one pass (default 30 s).
	Timeout time.Duration
}

// digests is where the provisioner keeps what it last applied per role.
const digests = `CREATE TABLE IF NOT EXISTS mesh_provision (
	role TEXT PRIMARY KEY,
	digest TEXT NOT NULL,
	applied_at TIMESTAMPTZ NOT NULL DEFAULT now()
)`

// Pass makes the server accept every delivered credential once. An error is
// the server or the directory failing (the whole pass); a consumer's own
// failure is its Outcome.
func (p *Postgres) Pass(ctx context.Context) ([]Outcome, error) {
	timeout := p.Timeout
	if timeout == 0 {
		timeout = 30 * time.Second
	}
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	creds, out, err := readCredentials(p.Dir)
	if err != nil {
		return nil, err
	}
	conn, err := pgx.Connect(ctx, p.DSN)
	if err != nil {
		return nil, fmt.Errorf("connect to PostgreSQL: %w", err)
	}
	defer conn.Close(context.Background())
	if _, err := conn.Exec(ctx, digests); err != nil {
		return nil, fmt.Errorf("keep the applied digests (mesh_provision): %w", err)
	}
	seen := map[string]bool{}
	for _, c := range creds {
		seen[c.name] = true
		o := p.apply(ctx, conn, c)
		out = append(out, o)
	}
	for _, o := range out {
		seen[o.Consumer] = true
	}
	rows, err := conn.Query(ctx, `SELECT role FROM mesh_provision ORDER BY role`)
	if err != nil {
		return out, fmt.Errorf("read the applied digests: %w", err)
	}
	roles, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		return out, fmt.Errorf("read the applied digests: %w", err)
	}
	for _, r := range roles {
		if !seen[r] {
			out = append(out, Outcome{Consumer: r, Outcome: Withdrawn, Reason: "its credential is no longer delivered; the role and its database are kept (drop them by hand if they are no longer wanted)"})
		}
	}
	sort.SliceStable(out, func(i, j int) bool { return out[i].Consumer < out[j].Consumer })
	return out, nil
}

// apply makes one credential true. Errors name the step, never the secret.
func (p *Postgres) apply(ctx context.Context, conn *pgx.Conn, c credential) Outcome {
	fail := func(step string, err error) Outcome {
		var msg string
		var pe interface{ SQLState() string }
		if errors.As(err, &pe) {
			msg = fmt.Sprintf("%s: SQLSTATE %s", step, pe.SQLState())
		} else {
			msg = step + ": " + err.Error()
		}
		return Outcome{Consumer: c.name, Outcome: Failed, Reason: msg}
	}
	ident := pgx.Identifier{c.name}.Sanitize()
	var stored string
	err := conn.QueryRow(ctx, `SELECT digest FROM mesh_provision WHERE role = $1`, c.name).Scan(&stored)
	ours := err == nil
	if err != nil && !errors.Is(err, pgx.ErrNoRows) {
		return fail("read its applied digest", err)
	}
	var r struct {
		exists                                           bool
		super, createRole, createDB, replication, bypass bool
	}
	err = conn.QueryRow(ctx, `SELECT rolsuper, rolcreaterole, rolcreatedb, rolreplication, rolbypassrls FROM pg_roles WHERE rolname = $1`, c.name).
		Scan(&r.super, &r.createRole, &r.createDB, &r.replication, &r.bypass)
	switch {
	case err == nil:
		r.exists = true
	case !errors.Is(err, pgx.ErrNoRows):
		return fail("look up the role", err)
	}
	// The provisioner manages only the roles it made (each recorded in
	// mesh_provision as it is made), and never one with more rights than it
	// gives (LOGIN, and the consumer's own database): a credential named
	// after the superuser or an operator's role must not set its password.
	switch {
	case r.exists && (r.super || r.createRole || r.createDB || r.replication || r.bypass):
		return Outcome{Consumer: c.name, Outcome: Failed, Reason: fmt.Sprintf("role %q exists with more rights than the provisioner gives (superuser, CREATEROLE, CREATEDB, REPLICATION or BYPASSRLS); the provisioner never touches such a role: name the consumer module otherwise", c.name)}
	case r.exists && !ours:
		return Outcome{Consumer: c.name, Outcome: Failed, Reason: fmt.Sprintf("role %q exists and the provisioner did not make it; it manages only the roles it made (table mesh_provision): name the consumer module otherwise, or, if that role is to be the consumer's, drop it and its database so the provisioner makes them", c.name)}
	}
	outcome := Unchanged
	switch {
	case !r.exists:
		v, err := scramVerifier(c.secret)
		if err != nil {
			return fail("make the password verifier", err)
		}
		// Recorded as the provisioner's in the same transaction that makes
		// it, so a crash leaves neither a role it made but does not know,
		// nor a record of one it did not make.
		tx, err := conn.Begin(ctx)
		if err != nil {
			return fail("begin", err)
		}
		defer tx.Rollback(context.Background())
		if _, err := tx.Exec(ctx, `INSERT INTO mesh_provision (role, digest) VALUES ($1, $2)
			ON CONFLICT (role) DO UPDATE SET digest = excluded.digest, applied_at = now()`, c.name, c.digest); err != nil {
			return fail("record the role", err)
		}
		if _, err := tx.Exec(ctx, `CREATE ROLE `+ident+` LOGIN PASSWORD '`+v+`'`); err != nil {
			return fail("create the role", err)
		}
		if err := tx.Commit(ctx); err != nil {
			return fail("create the role", err)
		}
		stored = c.digest
		outcome = Created
	case stored != c.digest:
		v, err := scramVerifier(c.secret)
		if err != nil {
			return fail("make the password verifier", err)
		}
		if _, err := conn.Exec(ctx, `ALTER ROLE `+ident+` LOGIN PASSWORD '`+v+`'`); err != nil {
			return fail("set the role's password", err)
		}
		outcome = Rotated
	}
	var dbExists bool
	if err := conn.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM pg_database WHERE datname = $1)`, c.name).Scan(&dbExists); err != nil {
		return fail("look up the database", err)
	}
	if !dbExists {
		if _, err := conn.Exec(ctx, `CREATE DATABASE `+ident+` OWNER `+ident); err != nil {
			return fail("create the database", err)
		}
		if outcome == Unchanged {
			outcome = Created
		}
	}
	if outcome != Unchanged || stored != c.digest {
		if _, err := conn.Exec(ctx, `INSERT INTO mesh_provision (role, digest) VALUES ($1, $2)
			ON CONFLICT (role) DO UPDATE SET digest = excluded.digest, applied_at = now()`, c.name, c.digest); err != nil {
			return fail("record its applied digest", err)
		}
	}
	if outcome != Unchanged && p.Log != nil {
		p.Log.Info("credential applied", "consumer", c.name, "outcome", outcome)
	}
	return Outcome{Consumer: c.name, Outcome: outcome}
}

// scramVerifier is PostgreSQL's SCRAM-SHA-256 verifier of a password (RFC
// 5802, RFC 7677; PostgreSQL's format): the server stores it as given and
// never sees the password.
func scramVerifier(password string) (string, error) {
	const iterations = 4096
	salt := make([]byte, 16)
	if _, err := rand.Read(salt); err != nil {
		return "", err
	}
	salted, err := pbkdf2.Key(sha256.New, password, salt, iterations, 32)
	if err != nil {
		return "", err
	}
	mac := func(key []byte, msg string) []byte {
		h := hmac.New(sha256.New, key)
		h.Write([]byte(msg))
		return h.Sum(nil)
	}
	clientKey := mac(salted, "Client Key")
	stored := sha256.Sum256(clientKey)
	serverKey := mac(salted, "Server Key")
	b64 := base64.StdEncoding.EncodeToString
	return fmt.Sprintf("SCRAM-SHA-256$%d:%s$%s:%s", iterations, b64(salt), b64(stored[:]), b64(serverKey)), nil
}

// Fingerprint is the state of the delivered files: a pass is due when it
// moves. It reads digests only.
func Fingerprint(dir string) string {
	creds, failed, err := readCredentials(dir)
	if err != nil {
		return "error: " + err.Error()
	}
	var b strings.Builder
	for _, c := range creds {
		b.WriteString(c.name + " " + c.digest + "\n")
	}
	for _, f := range failed {
		b.WriteString(f.Consumer + " failed\n")
	}
	return b.String()
}

// Watch runs a pass now and again whenever what was delivered changes (the
// host replaces files atomically, so a poll of the files, every interval,
// and not an inotify watch on a path), and after a pass that failed, until
// ctx ends. report is told each pass's outcomes.
func (p *Postgres) Watch(ctx context.Context, interval time.Duration, report func([]Outcome, error)) {
	last := ""
	retry := true
	for {
		if fp := Fingerprint(p.Dir); fp != last || retry {
			out, err := p.Pass(ctx)
			if ctx.Err() != nil {
				return
			}
			report(out, err)
			retry = err != nil
			for _, o := range out {
				retry = retry || o.Outcome == Failed
			}
			last = fp
		}
		select {
		case <-ctx.Done():
			return
		case <-time.After(interval):
		}
	}
}
