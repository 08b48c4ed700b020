package state

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"regexp"
	"slices"
	"sort"
	"strings"
	"time"

	"mesh/state/manifest"
)

// The operator's secrets (issue "The operator's secrets"): a value a person
// brings (an SMTP password, an API key) for one module, set with `mesh
// secret set MODULE NAME`. The replicated state holds it sealed (age, as the
// credentials are) to the sealing keys of the nodes the module is assigned
// to, never in plain text; a node the module is not on cannot open it.
//
// The proposer (the node whose local API took the value) seals it and
// digests it; the FSM checks that it is sealed to exactly the keys of the
// module's nodes now, and stores it. When the module's nodes change (an
// assign, a move, an unassign), the secret is stale: a node that holds it
// (one it is sealed to) opens it and seals it again to the module's nodes,
// with secret.seal, which the FSM takes only for the same value (digest) and
// exactly those keys. A secret sealed only to nodes that have left cannot be
// opened by anyone: it says so and waits for `mesh secret set`.
//
// The digest is argon2id of the value with a salt kept in the row (the
// proposer computes it), not a bare hash: a replica that cannot open the
// value must not be able to guess a short password from its digest either.
// Setting the same value again gives the same digest (the same salt), which
// changes nothing; any other value changes the digest, which replaces the
// containers that read it, and only those.

// Ops of the operator's secrets (format 8).
const (
	OpSecretSet    = "secret.set"
	OpSecretRemove = "secret.rm"
	OpSecretSeal   = "secret.seal"
)

// MaxSecretSize bounds a secret's value.
const MaxSecretSize = 1 << 20

// secretFormat is the command format of the operator's secrets: their ops,
// and a manifest that names one.
const secretFormat = 8

// SecretRef names one of a module's secrets.
type SecretRef struct {
	Module string `json:"module"`
	Name   string `json:"name"`
}

func (r SecretRef) String() string { return r.Module + "/" + r.Name }

// SecretSetRequest sets a module's secret: its value sealed to Recipients
// (the sealing keys of the module's nodes, sorted), its digest, the salt of
// the digest and the value's size.
type SecretSetRequest struct {
	SecretRef
	Sealed     string   `json:"sealed"`
	Digest     string   `json:"digest"`
	Salt       string   `json:"salt"`
	Size       int      `json:"size"`
	Recipients []string `json:"recipients"`
	// Rollout is set by a proposer that sees the module's changes roll
	// out: the command then needs the format in which a changed value
	// rolls out too (rollout.go), and the FSM decides from its own state.
	Rollout bool `json:"rollout,omitempty"`
}

func (r *SecretSetRequest) formatNeeded() int { return iff(r.Rollout, secretRolloutFormat) }

// SecretRemoveRequest removes a module's secret.
type SecretRemoveRequest struct {
	SecretRef
}

// SecretSealRequest seals a secret again, to the module's nodes now: a node
// that holds it proposes it when the module's nodes changed. Digest is the
// value's, as stored: a value set since is never overwritten.
type SecretSealRequest struct {
	SecretRef
	Digest     string   `json:"digest"`
	Sealed     string   `json:"sealed"`
	Recipients []string `json:"recipients"`
}

func (*SecretSetRequest) Op() string    { return OpSecretSet }
func (*SecretRemoveRequest) Op() string { return OpSecretRemove }
func (*SecretSealRequest) Op() string   { return OpSecretSeal }

func (r *SecretSetRequest) describe() string {
	return "mesh secret set " + r.Module + " " + r.Name
}
func (r *SecretRemoveRequest) describe() string {
	return "mesh secret rm " + r.Module + " " + r.Name
}
func (r *SecretSealRequest) describe() string {
	return "secret " + r.String() + " sealed again to the module's nodes"
}

var hexRE = regexp.MustCompile(`^[0-9a-f]{32,128}$`)

func checkRef(r SecretRef) error {
	if r.Module == "" || r.Name == "" {
		return ruleErr(ErrInvalid, "a secret needs a module and a name")
	}
	if !manifest.SecretNameRE.MatchString(r.Name) {
		return ruleErr(ErrInvalid, "secret name %q: %s", r.Name, manifest.SecretNameRule)
	}
	return nil
}

func (ap *applier) secretSet(r *SecretSetRequest) (bool, error) {
	if r.Module == MeshSecrets {
		return false, ruleErr(ErrInvalid, "secret %s is the mesh's own (mesh backup repo set sets it)", r.SecretRef)
	}
	return ap.setSecret(r)
}

// setSecret stores a sealed value: an operator's secret of a module, or
// one of the mesh's own (backupRepoSet).
func (ap *applier) setSecret(r *SecretSetRequest) (bool, error) {
	if err := checkRef(r.SecretRef); err != nil {
		return false, err
	}
	if r.Module != MeshSecrets {
		if err := needModule(ap.tx, r.Module, "mesh module list"); err != nil {
			return false, err
		}
	}
	if r.Size <= 0 || r.Size > MaxSecretSize {
		return false, ruleErr(ErrInvalid, "secret %s: a value of %d bytes; a secret holds 1 byte to 1 MiB", r, r.Size)
	}
	if r.Sealed == "" || !hexRE.MatchString(r.Digest) || !hexRE.MatchString(r.Salt) {
		return false, ruleErr(ErrInvalid, "secret %s: the request carries no sealed value, digest or salt", r)
	}
	want, err := secretRecipients(ap.ctx, ap.tx, r.Module)
	if err != nil {
		return false, err
	}
	rec := slices.Clone(r.Recipients)
	sort.Strings(rec)
	if !slices.Equal(rec, want) {
		if r.Module == MeshSecrets {
			return false, ruleErr(ErrConflict, "secret %s was sealed to other nodes than the mesh has now (one joined or left meanwhile); run the command again", r)
		}
		return false, ruleErr(ErrConflict, "secret %s was sealed to other nodes than module %s runs on now (it was assigned or moved meanwhile); run mesh secret set again", r, r.Module)
	}
	var digest, have string
	err = ap.tx.QueryRow(`SELECT digest, recipients FROM secrets WHERE module = ? AND name = ?`, r.Module, r.Name).Scan(&digest, &have)
	if err != nil && err != sql.ErrNoRows {
		return false, fmt.Errorf("read secret %s: %w", r, err)
	}
	// A module with a rollout of a secret is handled so by any command:
	// such a row exists only after a command of the format, which every
	// replica that goes on applying knows (as module.add does).
	rolls := r.Module != MeshSecrets && ap.v >= secretRolloutFormat
	if r.Module != MeshSecrets && !rolls {
		if rolls, err = has(ap.tx, `SELECT 1 FROM rollouts WHERE module = ? AND secret != ''`, r.Module); err != nil {
			return false, err
		}
	}
	if rolls && digest != r.Digest {
		if err := refuseDuringRollout(ap.tx, r.Module); err != nil {
			return false, err
		}
		// The value the nodes run now, for those a rollout of the new
		// one has not reached yet (startSecretRollout keeps it or drops it).
		if digest != "" {
			if err := exec(ap.tx, `INSERT INTO held_secrets (module, name, sealed, digest, salt, size, set_at, set_index, recipients)
				SELECT module, name, sealed, digest, salt, size, set_at, set_index, recipients FROM secrets WHERE module = ? AND name = ?
				ON CONFLICT (module, name) DO NOTHING`, r.Module, r.Name); err != nil {
				return false, err
			}
		}
	}
	if digest == r.Digest {
		if have == strings.Join(rec, ",") {
			return false, nil // the same value, sealed so already: nothing changes
		}
		// The same value, for nodes that could not open it (it was lost,
		// or its holders are down): sealed anew, and no reader changes.
		ap.markSecret(SecretRef{Module: r.Module, Name: r.Name})
		return false, exec(ap.tx, `UPDATE secrets SET sealed = ?, recipients = ? WHERE module = ? AND name = ?`, r.Sealed, strings.Join(rec, ","), r.Module, r.Name)
	}
	ap.markSecret(SecretRef{Module: r.Module, Name: r.Name})
	if err := exec(ap.tx, `INSERT INTO secrets (module, name, sealed, digest, salt, size, set_at, set_index, recipients) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)
		ON CONFLICT (module, name) DO UPDATE SET sealed = excluded.sealed, digest = excluded.digest, salt = excluded.salt, size = excluded.size,
		set_at = excluded.set_at, set_index = excluded.set_index, recipients = excluded.recipients`,
		r.Module, r.Name, r.Sealed, r.Digest, r.Salt, r.Size, ap.at, ap.index, strings.Join(rec, ",")); err != nil {
		return false, err
	}
	if rolls && digest != "" {
		return true, ap.startSecretRollout(r.SecretRef)
	}
	return true, nil
}

func (ap *applier) secretRemove(r *SecretRemoveRequest) (bool, error) {
	if err := checkRef(r.SecretRef); err != nil {
		return false, err
	}
	if r.Module == MeshSecrets {
		return false, ruleErr(ErrInvalid, "secret %s is the mesh's own (mesh backup repo set replaces it)", r)
	}
	ok, err := has(ap.tx, `SELECT 1 FROM secrets WHERE module = ? AND name = ?`, r.Module, r.Name)
	if err != nil {
		return false, err
	}
	if !ok {
		known, err := listOf(ap.tx, `SELECT name FROM secrets WHERE module = ? ORDER BY name`, "set one with mesh secret set MODULE NAME", r.Module)
		if err != nil {
			return false, err
		}
		return false, ruleErr(ErrNotFound, "module %s has no secret %q (%s)", r.Module, r.Name, known)
	}
	// A rollout of a new value of it (rows of the secret-rollout format,
	// which every replica applying this knows): the nodes it has not
	// reached run the value before, which a removal would take from them
	// mid-rollout.
	ro, err := readRollout(ap.tx, r.Module)
	if err != nil {
		return false, err
	}
	if ro != nil && ro.Secret == r.Name && ro.State == RolloutRunning {
		return false, ruleErr(ErrConflict, "module %s is rolling out a new value of secret %s (%d of its nodes reached): wait for it to end (mesh status), or go back with `mesh module revert %s`, then remove it", r.Module, r.Name, len(ro.Reached), r.Module)
	}
	if err := exec(ap.tx, `DELETE FROM held_secrets WHERE module = ? AND name = ?`, r.Module, r.Name); err != nil {
		return false, err
	}
	ap.markSecret(SecretRef{Module: r.Module, Name: r.Name})
	return true, exec(ap.tx, `DELETE FROM secrets WHERE module = ? AND name = ?`, r.Module, r.Name)
}

func (ap *applier) secretSeal(r *SecretSealRequest) (bool, error) {
	if err := checkRef(r.SecretRef); err != nil {
		return false, err
	}
	if r.Sealed == "" || len(r.Recipients) == 0 {
		return false, ruleErr(ErrInvalid, "secret %s: sealed again without a value or a recipient", r)
	}
	var digest, have string
	err := ap.tx.QueryRow(`SELECT digest, recipients FROM secrets WHERE module = ? AND name = ?`, r.Module, r.Name).Scan(&digest, &have)
	if err == sql.ErrNoRows {
		return false, nil // removed meanwhile
	}
	if err != nil {
		return false, fmt.Errorf("read secret %s: %w", r, err)
	}
	want, err := secretRecipients(ap.ctx, ap.tx, r.Module)
	var rule *RuleError
	if errors.As(err, &rule) {
		return false, nil // it runs nowhere now: it stays sealed to its last nodes
	}
	if err != nil {
		return false, err
	}
	rec := slices.Clone(r.Recipients)
	sort.Strings(rec)
	if digest != r.Digest || !slices.Equal(rec, want) || strings.Join(want, ",") == have {
		return false, nil // set again, moved again, or already sealed so
	}
	ap.markSecret(SecretRef{Module: r.Module, Name: r.Name})
	return false, exec(ap.tx, `UPDATE secrets SET sealed = ?, recipients = ? WHERE module = ? AND name = ?`, r.Sealed, strings.Join(rec, ","), r.Module, r.Name)
}

// secretRecipients are the sealing keys of the nodes module is assigned
// to, sorted: whom its secrets are sealed to. It is a rule error when the
// module runs nowhere (nothing could open it) or a node of it has not
// given its key yet.
func secretRecipients(ctx context.Context, q queryer, module string) ([]string, error) {
	if module == MeshSecrets {
		return meshRecipients(ctx, q)
	}
	keys, missing, err := sealKeys(ctx, q, "the module's nodes", `SELECT n.name, n.seal_key FROM assignments a JOIN nodes n ON n.name = a.node WHERE a.module = ? ORDER BY n.name`, module)
	if err != nil {
		return nil, err
	}
	if len(missing) > 0 {
		return nil, ruleErr(ErrConflict, "node %s runs module %s and has not given its sealing key yet (it does within seconds of starting); try again", strings.Join(missing, ", "), module)
	}
	if len(keys) == 0 {
		return nil, ruleErr(ErrConflict, "module %s is assigned to no node, so no node could open its secret; assign it first (mesh assign NODE %s), then set the secret", module, module)
	}
	return keys, nil
}

// SecretInfo is what `mesh secret list` shows of a secret: never its value.
type SecretInfo struct {
	SecretRef
	// Digest is the first 12 hex digits of the value's digest.
	Digest string    `json:"digest"`
	Size   int       `json:"size"`
	SetAt  time.Time `json:"set_at"`
	// SealedTo are the nodes that can open it now; State is "sealed" (to
	// the module's nodes), "resealing" (a node that holds it seals it again
	// to the module's nodes now), "unassigned" (the module runs nowhere; it
	// stays sealed to its last nodes) or "lost" (sealed only to nodes that
	// left: set it again); Advice says what to do when it is not sealed.
	SealedTo []string `json:"sealed_to"`
	State    string   `json:"state"`
	Advice   string   `json:"advice,omitempty"`
}

// Secret states.
const (
	SecretSealed     = "sealed"
	SecretResealing  = "resealing"
	SecretUnassigned = "unassigned"
	SecretLost       = "lost"
)

// storedSecret is a secret's row.
type storedSecret struct {
	SecretRef
	sealed, digest, salt, setAt string
	size                        int
	recipients                  []string
}

func readSecrets(ctx context.Context, q queryer, module string) ([]storedSecret, error) {
	query, args := `SELECT module, name, sealed, digest, salt, size, set_at, recipients FROM secrets ORDER BY module, name`, []any{}
	if module != "" {
		query, args = `SELECT module, name, sealed, digest, salt, size, set_at, recipients FROM secrets WHERE module = ? ORDER BY name`, []any{module}
	}
	var out []storedSecret
	err := eachRow(ctx, q, "the secrets", query, func(rows *sql.Rows) error {
		var s storedSecret
		var rec string
		if err := rows.Scan(&s.Module, &s.Name, &s.sealed, &s.digest, &s.salt, &s.size, &s.setAt, &rec); err != nil {
			return err
		}
		s.recipients = splitNonEmpty(rec)
		out = append(out, s)
		return nil
	}, args...)
	return out, err
}

// Secrets lists the secrets of module (every module's when empty).
func (s *Store) Secrets(ctx context.Context, module string) ([]SecretInfo, error) {
	rows, err := readSecrets(ctx, s.db, module)
	if err != nil {
		return nil, err
	}
	holder, err := keyHolders(ctx, s.db)
	if err != nil {
		return nil, err
	}
	out := make([]SecretInfo, 0, len(rows))
	for _, r := range rows {
		info := SecretInfo{SecretRef: r.SecretRef, Digest: r.digest[:min(12, len(r.digest))], Size: r.size, SealedTo: []string{}}
		info.SetAt, _ = time.Parse(timeLayout, r.setAt)
		for _, k := range r.recipients {
			if n := holder[k]; n != "" {
				info.SealedTo = append(info.SealedTo, n)
			}
		}
		sort.Strings(info.SealedTo)
		want, werr := secretRecipients(ctx, s.db, r.Module)
		switch {
		case len(info.SealedTo) == 0:
			info.State, info.Advice = SecretLost, fmt.Sprintf("it is sealed only to nodes that left the mesh, and nobody can open it; set it again: mesh secret set %s %s", r.Module, r.Name)
		case werr != nil:
			info.State = SecretUnassigned
		case slices.Equal(want, r.recipients):
			info.State = SecretSealed
		default:
			info.State, info.Advice = SecretResealing, "a node it is sealed to seals it again to the module's nodes now (it must be up)"
		}
		out = append(out, info)
	}
	return out, nil
}

// keyHolders maps each sealing key to its node.
func keyHolders(ctx context.Context, q queryer) (map[string]string, error) {
	holder := map[string]string{}
	err := eachRow(ctx, q, "the sealing keys", `SELECT name, seal_key FROM nodes WHERE seal_key != ''`, func(rows *sql.Rows) error {
		var n, k string
		if err := rows.Scan(&n, &k); err != nil {
			return err
		}
		holder[k] = n
		return nil
	})
	return holder, err
}

// SealedValue is a secret as this replica holds it, for the node that opens it.
type SealedValue struct {
	Sealed, Digest, Salt string
	Recipients           []string
}

// SecretSealed reads one secret's sealed value; ErrNotFound when it is not set.
func (s *Store) SecretSealed(ctx context.Context, ref SecretRef) (SealedValue, error) {
	var v SealedValue
	var rec string
	err := s.db.QueryRowContext(ctx, `SELECT sealed, digest, salt, recipients FROM secrets WHERE module = ? AND name = ?`, ref.Module, ref.Name).Scan(&v.Sealed, &v.Digest, &v.Salt, &rec)
	if err == sql.ErrNoRows {
		return v, ruleErr(ErrNotFound, "module %s has no secret %q; set it with: mesh secret set %s %s", ref.Module, ref.Name, ref.Module, ref.Name)
	}
	if err != nil {
		return v, fmt.Errorf("read secret %s: %w", ref, err)
	}
	v.Recipients = splitNonEmpty(rec)
	return v, nil
}

// SecretSealedAt reads the sealed value of one secret whose digest is
// digest: the current value, or the one a rollout of a new value keeps for
// the nodes it has not reached (held_secrets). An empty digest reads the
// current value. A digest that is neither (the plan was composed before a
// later change) is a wait: the node's next plan names the value it needs.
func (s *Store) SecretSealedAt(ctx context.Context, ref SecretRef, digest string) (SealedValue, error) {
	v, err := s.SecretSealed(ctx, ref)
	if err != nil || digest == "" || v.Digest == digest {
		return v, err
	}
	var rec string
	held := SealedValue{Digest: digest}
	err = s.db.QueryRowContext(ctx, `SELECT sealed, salt, recipients FROM held_secrets WHERE module = ? AND name = ? AND digest = ?`, ref.Module, ref.Name, digest).Scan(&held.Sealed, &held.Salt, &rec)
	if err == sql.ErrNoRows {
		return v, fmt.Errorf("secret %s has changed since this node's plan was made; it delivers the value its next plan names", ref)
	}
	if err != nil {
		return v, fmt.Errorf("read secret %s: %w", ref, err)
	}
	held.Recipients = splitNonEmpty(rec)
	return held, nil
}

// SecretTarget is what the proposer of `mesh secret set` needs: the keys
// to seal to (those of the module's nodes), their nodes, and the salt of
// the digest stored (empty when the secret is new), so that the same value
// gives the same digest.
type SecretTarget struct {
	Keys  []string
	Nodes []string
	Salt  string
}

// SecretTarget reads it, with the rule errors of secret.set: an unknown
// module, a module assigned nowhere, a node without a key.
func (s *Store) SecretTarget(ctx context.Context, ref SecretRef) (SecretTarget, error) {
	var t SecretTarget
	if err := checkRef(ref); err != nil {
		return t, err
	}
	var mods []string
	err := eachRow(ctx, s.db, "the catalogue", `SELECT name FROM modules ORDER BY name`, func(rows *sql.Rows) error {
		var n string
		err := rows.Scan(&n)
		mods = append(mods, n)
		return err
	})
	if err != nil {
		return t, err
	}
	if !slices.Contains(mods, ref.Module) && ref.Module != MeshSecrets {
		known := "the catalogue is empty"
		if len(mods) > 0 {
			known = "known: " + strings.Join(mods, ", ")
		}
		return t, ruleErr(ErrNotFound, "module %q is not in the catalogue (%s); add it with mesh module add FILE", ref.Module, known)
	}
	keys, err := secretRecipients(ctx, s.db, ref.Module)
	if err != nil {
		return t, err
	}
	holder, err := keyHolders(ctx, s.db)
	if err != nil {
		return t, err
	}
	t.Keys = keys
	for _, k := range keys {
		t.Nodes = append(t.Nodes, holder[k])
	}
	err = s.db.QueryRowContext(ctx, `SELECT salt FROM secrets WHERE module = ? AND name = ?`, ref.Module, ref.Name).Scan(&t.Salt)
	if err != nil && err != sql.ErrNoRows {
		return t, fmt.Errorf("read secret %s: %w", ref, err)
	}
	return t, nil
}

// StaleSecret is a secret that must be sealed again to the module's nodes,
// and that this node (holding key) can open.
type StaleSecret struct {
	SecretRef
	SealedValue
	// Keys are the keys to seal it to now, Nodes their nodes.
	Keys  []string
	Nodes []string
}

// StaleSecrets lists the secrets sealed to key whose module's nodes changed:
// those this node must seal again.
func (s *Store) StaleSecrets(ctx context.Context, key string) ([]StaleSecret, error) {
	rows, err := readSecrets(ctx, s.db, "")
	if err != nil {
		return nil, err
	}
	holder, err := keyHolders(ctx, s.db)
	if err != nil {
		return nil, err
	}
	var out []StaleSecret
	for _, r := range rows {
		if !slices.Contains(r.recipients, key) {
			continue
		}
		want, err := secretRecipients(ctx, s.db, r.Module)
		if err != nil || slices.Equal(want, r.recipients) {
			continue // it runs nowhere (it stays sealed to its last nodes), or no change
		}
		st := StaleSecret{SecretRef: r.SecretRef, SealedValue: SealedValue{Sealed: r.sealed, Digest: r.digest, Salt: r.salt, Recipients: r.recipients}, Keys: want}
		for _, k := range want {
			st.Nodes = append(st.Nodes, holder[k])
		}
		out = append(out, st)
	}
	return out, nil
}

// secretDigests maps every secret to its digest, for composition.
func secretDigests(ctx context.Context, q queryer) (map[SecretRef]string, error) {
	out := map[SecretRef]string{}
	err := eachRow(ctx, q, "the secrets", `SELECT module, name, digest FROM secrets`, func(rows *sql.Rows) error {
		var r SecretRef
		var d string
		if err := rows.Scan(&r.Module, &r.Name, &d); err != nil {
			return err
		}
		out[r] = d
		return nil
	})
	return out, err
}

// SecretsOf lists the names of the secrets a resource reads: a secret
// file's, or a step's or container's env-secrets, sorted.
func SecretsOf(d *manifest.Resource) []string { return d.SecretNames() }

// manifestNamesSecrets says whether a manifest names an operator's secret.
func manifestNamesSecrets(m *manifest.Manifest) bool {
	for i := range m.Resources {
		if len(SecretsOf(&m.Resources[i])) > 0 {
			return true
		}
	}
	return false
}
