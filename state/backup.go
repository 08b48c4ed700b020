package state

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"net/url"
	"sort"
	"strings"
	"unicode"
)

// Backups with restic (issue 30, "A module's data", item 2). The mesh keeps
// one repository for the whole fleet: its URL in the settings, its password
// as one of the mesh's own secrets (MeshSecrets), sealed like an operator's
// secret but to every node, since any node may run a module it backs up.
// A node that joins later gets it sealed again by a node that can open it
// (StaleSecrets), as a module's secret follows its nodes.

// OpBackupRepoSet sets the backup repository.
const OpBackupRepoSet = "backup.repo.set"

// MeshSecrets is the module name of the mesh's own secrets: no module can
// be called so (a module's name is a DNS label), so mesh secret set
// and rm never reach them.
const MeshSecrets = "@mesh"

// BackupPassword is the secret that holds the repository's password.
var BackupPassword = SecretRef{Module: MeshSecrets, Name: "backup-password"}

// MaxRepoURL bounds a repository's URL.
const MaxRepoURL = 1024

// BackupRepoSetRequest sets the repository: its URL, and its password
// sealed to every node (a secret.set of BackupPassword).
type BackupRepoSetRequest struct {
	URL      string           `json:"url"`
	Password SecretSetRequest `json:"password"`
}

func (*BackupRepoSetRequest) Op() string { return OpBackupRepoSet }
func (r *BackupRepoSetRequest) describe() string {
	return "backup.repo.set " + RedactRepoURL(r.URL)
}

// RedactRepoURL is a repository's URL with the password of a rest: or s3:
// URL's user (rest:https://user:secret@host/) left out, for whatever shows
// it: status, logs, mesh backup repo show.
func RedactRepoURL(u string) string {
	scheme, rest, ok := strings.Cut(u, ":")
	if !ok || !strings.Contains(rest, "@") {
		return u
	}
	parsed, err := url.Parse(rest)
	if err != nil || parsed.User == nil {
		return u
	}
	if _, has := parsed.User.Password(); !has {
		return u
	}
	return scheme + ":" + parsed.Redacted()
}

// CheckRepoPassword refuses, where an operator proposes a repository, a
// URL with a user's password that RedactRepoURL cannot find: one that does
// not parse as a URL (a password holding '/', '#', '?', a space or a bad
// '%' escape), which restic could not read either, and whose password
// would show in status, logs and the mesh's history. Not part of
// CheckRepoURL, which the FSM runs: a command it took before must still
// be taken.
func CheckRepoPassword(u string) error {
	_, rest, ok := strings.Cut(u, ":")
	if !ok || !strings.Contains(rest, "://") || !strings.Contains(rest, "@") {
		return nil
	}
	if _, err := url.Parse(rest); err != nil {
		return ruleErr(ErrInvalid, "the repository's URL does not read as a URL (%v), and the password in it would show in status, logs and the history: write the password percent-encoded (/ as %%2F, # as %%23, ? as %%3F, %% as %%25, a space as %%20), as restic reads it", urlError(err))
	}
	return nil
}

// urlError is a URL parser's error without the URL it quotes (which holds
// the password).
func urlError(err error) string {
	var ue *url.Error
	if errors.As(err, &ue) {
		return ue.Err.Error()
	}
	return "it does not parse"
}

// CheckRepoURL says what is wrong with a repository's URL, nil if nothing.
// It is given to restic as RESTIC_REPOSITORY, never on a command line, but
// a URL that reads as a flag or holds a control character is refused all
// the same: it is shown in status and logs.
func CheckRepoURL(u string) error {
	switch {
	case u == "":
		return ruleErr(ErrInvalid, "the repository's URL is empty (a local path, sftp:HOST:/PATH, s3:URL/BUCKET or rest:URL, as restic takes them)")
	case len(u) > MaxRepoURL:
		return ruleErr(ErrInvalid, "the repository's URL is %d bytes; at most %d", len(u), MaxRepoURL)
	case strings.HasPrefix(u, "-"):
		return ruleErr(ErrInvalid, "the repository's URL %q starts with -", u)
	case strings.IndexFunc(u, unicode.IsControl) >= 0:
		return ruleErr(ErrInvalid, "the repository's URL holds a control character")
	}
	return nil
}

func (ap *applier) backupRepoSet(r *BackupRepoSetRequest) (bool, error) {
	if err := CheckRepoURL(r.URL); err != nil {
		return false, err
	}
	if r.Password.SecretRef != BackupPassword {
		return false, ruleErr(ErrInvalid, "backup.repo.set carries secret %s, not %s", r.Password.SecretRef, BackupPassword)
	}
	if _, err := ap.setSecret(&r.Password); err != nil {
		return false, err
	}
	// No plan changes: a backup reads the repository when it runs.
	return false, exec(ap.tx, `INSERT INTO settings (key, value) VALUES ('backup_repo', ?) ON CONFLICT (key) DO UPDATE SET value = excluded.value`, r.URL)
}

// BackupRepo is the repository as this replica knows it.
type BackupRepo struct {
	// URL is "" when none is set (mesh backup repo set).
	URL string `json:"url"`
	// SealedTo are the nodes that can open its password.
	SealedTo []string `json:"sealed_to,omitempty"`
}

// BackupRepo reads the repository's URL and who can open its password.
func (s *Store) BackupRepo(ctx context.Context) (BackupRepo, error) {
	var out BackupRepo
	err := s.db.QueryRowContext(ctx, `SELECT value FROM settings WHERE key = 'backup_repo'`).Scan(&out.URL)
	if err == sql.ErrNoRows {
		return out, nil
	}
	if err != nil {
		return out, fmt.Errorf("read the backup repository: %w", err)
	}
	l, err := s.Secrets(ctx, MeshSecrets)
	if err != nil {
		return out, err
	}
	for _, sec := range l {
		if sec.SecretRef == BackupPassword {
			out.SealedTo = sec.SealedTo
		}
	}
	return out, nil
}

// meshRecipients are the sealing keys of every node, sorted: whom the
// mesh's own secrets are sealed to.
func meshRecipients(ctx context.Context, q queryer) ([]string, error) {
	keys, missing, err := sealKeys(ctx, q, "the nodes", `SELECT name, seal_key FROM nodes ORDER BY name`)
	if err != nil {
		return nil, err
	}
	if len(missing) > 0 {
		return nil, ruleErr(ErrConflict, "node %s has not given its sealing key yet (it does within seconds of starting); try again", strings.Join(missing, ", "))
	}
	if len(keys) == 0 {
		return nil, ruleErr(ErrConflict, "no node has given its sealing key yet; try again")
	}
	return keys, nil
}

// sealKeys reads the rows (name, seal_key) of query: the keys, sorted, and
// the nodes that have not given one yet.
func sealKeys(ctx context.Context, q queryer, what, query string, args ...any) (keys, missing []string, err error) {
	err = eachRow(ctx, q, what, query, func(rows *sql.Rows) error {
		var n, k string
		if err := rows.Scan(&n, &k); err != nil {
			return err
		}
		if k == "" {
			missing = append(missing, n)
		} else {
			keys = append(keys, k)
		}
		return nil
	}, args...)
	sort.Strings(keys)
	return keys, missing, err
}
