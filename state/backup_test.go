package state

import (
	"context"
	"errors"
	"slices"
	"strings"
	"testing"
)

// The backup repository's password is one of the mesh's own secrets: sealed
// to every node (not to a module's), refused until every node has a key,
// never set or removed through the operator's secret ops, and sealed again
// by a holder when a node joins.
func TestBackupRepoSet(t *testing.T) {
	ctx := context.Background()
	s := openStore(t)
	var idx uint64
	mustApply(t, s, &idx, &InitRequest{MeshID: "m-1", Node: Node{Name: "ace", Address: "10.0.0.1", SealKey: "kZ"}})
	mustApply(t, s, &idx, &NodeAddRequest{Node: Node{Name: "bee", Address: "10.0.0.2", SealKey: "kB"}})

	if r, err := s.BackupRepo(ctx); err != nil || r.URL != "" {
		t.Fatalf("a new mesh has a repository: %+v %v", r, err)
	}
	tgt, err := s.SecretTarget(ctx, BackupPassword)
	if err != nil {
		t.Fatal(err)
	}
	// Keys sorted (as the FSM compares them), nodes in the keys' order.
	if !slices.Equal(tgt.Keys, []string{"kB", "kZ"}) || !slices.Equal(tgt.Nodes, []string{"bee", "ace"}) {
		t.Fatalf("the password is sealed to %v (%v), not to every node", tgt.Keys, tgt.Nodes)
	}
	pw := *setReq(MeshSecrets, "backup-password", "hunter2", "kB", "kZ")
	set := &BackupRepoSetRequest{URL: "/srv/backups/restic", Password: pw}
	if c := NewCommand(set); c.V != backupFormat {
		t.Fatalf("backup.repo.set is written in format %d", c.V)
	}
	mustApply(t, s, &idx, set)
	r, err := s.BackupRepo(ctx)
	if err != nil || r.URL != "/srv/backups/restic" || !slices.Equal(r.SealedTo, []string{"ace", "bee"}) {
		t.Fatalf("repository: %+v %v", r, err)
	}
	sv, err := s.SecretSealed(ctx, BackupPassword)
	if err != nil || sv.Sealed != "SEALED:hunter2" {
		t.Fatalf("sealed password: %+v %v", sv, err)
	}

	// Sealed to fewer nodes than the mesh has: refused, nothing changes.
	short := &BackupRepoSetRequest{URL: "/elsewhere", Password: *setReq(MeshSecrets, "backup-password", "other", "kZ")}
	if err := applyErr(t, s, &idx, short); !errors.Is(err, ErrConflict) {
		t.Fatalf("sealed to one node of two: %v", err)
	}
	// Bad URLs and another secret's name: refused.
	for _, u := range []string{"", "-o=evil", "a\nb", strings.Repeat("x", MaxRepoURL+1)} {
		if err := applyErr(t, s, &idx, &BackupRepoSetRequest{URL: u, Password: pw}); !errors.Is(err, ErrInvalid) {
			t.Fatalf("URL %q: %v", u, err)
		}
	}
	other := pw
	other.Name = "other"
	if err := applyErr(t, s, &idx, &BackupRepoSetRequest{URL: "/x", Password: other}); !errors.Is(err, ErrInvalid) {
		t.Fatalf("another secret: %v", err)
	}
	if r, _ := s.BackupRepo(ctx); r.URL != "/srv/backups/restic" {
		t.Fatalf("a refused set changed the repository to %q", r.URL)
	}
	// The operator's secret ops never reach the mesh's own.
	if err := applyErr(t, s, &idx, setReq(MeshSecrets, "backup-password", "mine", "kB", "kZ")); !errors.Is(err, ErrInvalid) {
		t.Fatalf("secret.set of the mesh's own: %v", err)
	}
	if err := applyErr(t, s, &idx, &SecretRemoveRequest{SecretRef: BackupPassword}); !errors.Is(err, ErrInvalid) {
		t.Fatalf("secret.rm of the mesh's own: %v", err)
	}
	if sv, _ := s.SecretSealed(ctx, BackupPassword); sv.Sealed != "SEALED:hunter2" {
		t.Fatalf("the password changed: %q", sv.Sealed)
	}

	// A node without a key yet: a new set waits for it.
	mustApply(t, s, &idx, &NodeAddRequest{Node: Node{Name: "cat", Address: "10.0.0.3"}})
	if _, err := s.SecretTarget(ctx, BackupPassword); !errors.Is(err, ErrConflict) || !strings.Contains(err.Error(), "cat") {
		t.Fatalf("a node without a key: %v", err)
	}
	// Once it has one, a holder seals the password again to all three.
	mustApply(t, s, &idx, &NodeKeyRequest{Node: "cat", SealKey: "kC"})
	stale, err := s.StaleSecrets(ctx, "kZ")
	if err != nil || len(stale) != 1 || stale[0].SecretRef != BackupPassword || !slices.Equal(stale[0].Nodes, []string{"bee", "cat", "ace"}) {
		t.Fatalf("stale for kZ: %+v %v", stale[0].Nodes, err)
	}
	mustApply(t, s, &idx, &SecretSealRequest{SecretRef: BackupPassword, Sealed: "SEALED:hunter2", Digest: pw.Digest, Recipients: []string{"kB", "kZ", "kC"}})
	if r, _ := s.BackupRepo(ctx); !slices.Equal(r.SealedTo, []string{"ace", "bee", "cat"}) {
		t.Fatalf("after the reseal: %v", r.SealedTo)
	}
}

// A URL's password never shows: status, logs and repo show print it
// redacted.
func TestRedactRepoURL(t *testing.T) {
	for in, want := range map[string]string{
		"/srv/backups":                            "/srv/backups",
		"sftp:user@host:/srv/restic":              "sftp:user@host:/srv/restic",
		"rest:https://user:s3cret@host:8000/r":    "rest:https://user:xxxxx@host:8000/r",
		"rest:https://host:8000/r":                "rest:https://host:8000/r",
		"s3:https://key:secret@s3.example/bucket": "s3:https://key:xxxxx@s3.example/bucket",
	} {
		if got := RedactRepoURL(in); got != want {
			t.Errorf("%s: %s, want %s", in, got, want)
		}
	}
	// A password RedactRepoURL cannot find is refused where a repository
	// is proposed, and the refusal does not show it.
	for _, in := range []string{"rest:https://user:pa/ss@host:8000/r", "rest:https://user:pa#ss@host/r", "rest:https://user:pa?ss@host/r", "rest:https://user:pa%zzss@host/r", "rest:https://user:pa ss@host/r"} {
		if RedactRepoURL(in) != in {
			t.Errorf("%s: RedactRepoURL finds its password now (%s): the refusal may go", in, RedactRepoURL(in))
		}
		err := CheckRepoPassword(in)
		if err == nil || !strings.Contains(err.Error(), "percent-encoded") || strings.Contains(err.Error(), "ss@") {
			t.Errorf("%s: %v", in, err)
		}
	}
	for _, in := range []string{"/srv/b@ckups", "sftp:user@host:/srv/restic", "rest:https://user:pa%2Fss@host/r", "rest:https://host/r@x", "s3:https://key:secret@s3.example/bucket"} {
		if err := CheckRepoPassword(in); err != nil {
			t.Errorf("%s: %v", in, err)
		}
	}
}

// A snapshot restore keeps the backup repository as it is: its URL (never
// in a restore) and its password (format 21), whatever the snapshot held;
// the snapshot's password beside the URL of now would leave every backup
// made since unreadable. A log written before format 21 applies as it did.
func TestRestoreKeepsTheBackupRepository(t *testing.T) {
	ctx := context.Background()
	s := openStore(t)
	var idx uint64
	mustApply(t, s, &idx, &InitRequest{MeshID: "m-1", Node: Node{Name: "ace", Address: "10.0.0.1", SealKey: "kA"}})
	mustApply(t, s, &idx, &ModuleAddRequest{Modules: []ModuleSpec{spec("mail.yaml", secretAppSrc)}})
	mustApply(t, s, &idx, &AssignRequest{Assignment: Assignment{Node: "ace", Module: "mail"}})
	mustApply(t, s, &idx, setReq("mail", "smtp", "one", "kA"))
	body := func() *RestoreBody {
		sn, err := s.Dump(ctx)
		if err != nil {
			t.Fatal(err)
		}
		b, err := sn.RestoreBody()
		if err != nil {
			t.Fatal(err)
		}
		if err := b.ParseSpecs(); err != nil {
			t.Fatal(err)
		}
		return b
	}
	none := body() // before any repository
	mustApply(t, s, &idx, &BackupRepoSetRequest{URL: "/srv/backups/one", Password: *setReq(MeshSecrets, "backup-password", "first", "kA")})
	first := body()
	mustApply(t, s, &idx, &BackupRepoSetRequest{URL: "/srv/backups/two", Password: *setReq(MeshSecrets, "backup-password", "second", "kA")})
	mustApply(t, s, &idx, setReq("mail", "smtp", "two", "kA"))
	repo := func(wantURL, wantPW string) {
		t.Helper()
		r, err := s.BackupRepo(ctx)
		if err != nil || r.URL != wantURL {
			t.Fatalf("repository %+v %v, want %s", r, err, wantURL)
		}
		sv, err := s.SecretSealed(ctx, BackupPassword)
		if wantPW == "" {
			if !errors.Is(err, ErrNotFound) {
				t.Fatalf("password %+v %v, want none", sv, err)
			}
			return
		}
		if err != nil || sv.Sealed != "SEALED:"+wantPW {
			t.Fatalf("password %q %v, want %s", sv.Sealed, err, wantPW)
		}
	}
	for _, b := range []*RestoreBody{first, none} {
		if c := NewCommand(b); c.V != keepRepoFormat {
			t.Fatalf("a restore with secrets is written in format %d", c.V)
		}
		mustApply(t, s, &idx, b)
		repo("/srv/backups/two", "second")
		if l, _ := s.Secrets(ctx, "mail"); len(l) != 1 || l[0].Size != 3 {
			t.Fatalf("the operator's secrets were not restored: %+v", l)
		}
	}
	// Format 20: the snapshot's password (or none) beside the URL of now.
	for b, want := range map[*RestoreBody]string{first: "first", none: ""} {
		c := NewCommand(b)
		c.V = keepRepoFormat - 1
		idx++
		if err := s.Apply(idx, c.Encode()); err != nil {
			t.Fatal(err)
		}
		repo("/srv/backups/two", want)
	}
}
