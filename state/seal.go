package state

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"maps"
	"regexp"
	"slices"
	"sort"
	"strings"
	"time"

	"mesh/state/manifest"
)

// Sealed credentials (issue 14). A credential's secret is never in the
// replicated state or the log in plain text: the proposer seals it
// (internal/seal) to the nodes that deliver it, the nodes running the
// consumer and those running the provider, and the FSM keeps the sealed
// form, the recipients it is sealed to and the secret's digest. Every node
// compares digests; only those nodes can open it.
//
// A sealed secret goes stale when a node that delivers it cannot open it (the
// consumer or the provider moved there), or when it is still sealed to a key
// no node in the mesh holds (a removed node, a replaced key). A stale secret
// is rotated: the next proposer seals a new secret to the nodes that deliver
// it now, the provider's provisioner applies it, and the consumer gets it.
// A secret an older mesh kept in plain text is sealed as it is (no
// rotation), so that upgrading changes no password.

// SealNeed is a credential whose secret must be sealed (again), and to whom.
type SealNeed struct {
	Pair
	// Keys are the recipients it must be sealed to, and Nodes their nodes,
	// both sorted by node.
	Keys  []string
	Nodes []string
	// Plain is a secret an older mesh kept in plain text: seal it as it is.
	Plain string
	// Reason says why, in the operator's words.
	Reason string
}

// Rotates says whether sealing this need makes a new secret.
func (n SealNeed) Rotates() bool { return n.Plain == "" }

// sealedRow is a credential as stored.
type sealedRow struct {
	plain, sealed, digest string
	recipients            []string
}

// sealNeeds lists the credentials whose sealed secret is missing or stale,
// given the catalogue, the assignments (plus those of extra) and each
// node's sealing key. The FSM and the proposer both use it, so they agree.
func sealNeeds(ctx context.Context, q queryer, cat map[string]*manifest.Manifest, extra []Assignment) (map[Pair]SealNeed, error) {
	keys := map[string]string{} // node -> key
	holder := map[string]string{}
	err := eachRow(ctx, q, "the sealing keys", `SELECT name, seal_key FROM nodes`, func(rows *sql.Rows) error {
		var n, k string
		if err := rows.Scan(&n, &k); err != nil {
			return err
		}
		if k != "" {
			keys[n] = k
			holder[k] = n
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	at := map[string][]string{}
	err = eachRow(ctx, q, "assignments", `SELECT node, module FROM assignments`, func(rows *sql.Rows) error {
		var n, m string
		if err := rows.Scan(&n, &m); err != nil {
			return err
		}
		at[m] = append(at[m], n)
		return nil
	})
	if err != nil {
		return nil, err
	}
	for _, e := range extra {
		if !slices.Contains(at[e.Module], e.Node) {
			at[e.Module] = append(at[e.Module], e.Node)
		}
	}
	stored := map[Pair]sealedRow{}
	err = eachRow(ctx, q, "credentials", `SELECT consumer, provider, secret, sealed, digest, recipients FROM credentials`, func(rows *sql.Rows) error {
		var p Pair
		var r sealedRow
		var rec string
		if err := rows.Scan(&p.Consumer, &p.Provider, &r.plain, &r.sealed, &r.digest, &rec); err != nil {
			return err
		}
		r.recipients = splitNonEmpty(rec)
		stored[p] = r
		return nil
	})
	if err != nil {
		return nil, err
	}
	out := map[Pair]SealNeed{}
	for mod, m := range cat {
		if len(at[mod]) == 0 {
			continue // delivered nowhere
		}
		for _, p := range NeededCredentials(m) {
			nodes := append(slices.Clone(at[p.Consumer]), at[p.Provider]...)
			sort.Strings(nodes)
			nodes = slices.Compact(nodes)
			need := SealNeed{Pair: p}
			for _, n := range nodes {
				if k, ok := keys[n]; ok {
					need.Nodes = append(need.Nodes, n)
					need.Keys = append(need.Keys, k)
				}
			}
			if len(need.Keys) == 0 {
				continue // no node that delivers it can open anything yet
			}
			row, ok := stored[p]
			switch {
			case !ok:
				need.Reason = "new"
			case row.sealed == "" && row.plain == "":
				need.Reason = "the state holds no secret for it (a damaged restore?)"
			case row.sealed == "":
				need.Plain, need.Reason = row.plain, "kept in plain text by an older mesh"
			default:
				for i, k := range need.Keys {
					if !slices.Contains(row.recipients, k) {
						need.Reason = "node " + need.Nodes[i] + " delivers it and cannot open it"
						break
					}
				}
				for _, k := range row.recipients {
					if need.Reason == "" && holder[k] == "" {
						need.Reason = "it was sealed to a key no node holds now (a removed node, or a replaced key)"
					}
				}
			}
			if need.Reason != "" {
				out[p] = need
			}
		}
	}
	return out, nil
}

// SealNeeds is the proposer's view: the credentials to seal with a command
// that adds the assignments extra or the manifests added (which
// replace those of the same name), in a stable order.
func (s *Store) SealNeeds(ctx context.Context, extra []Assignment, added []*manifest.Manifest) ([]SealNeed, error) {
	cat, err := s.publishedCatalogue(ctx)
	if err != nil {
		return nil, err
	}
	if len(added) > 0 {
		cat = maps.Clone(cat)
		for _, m := range added {
			cat[m.Module] = m
		}
	}
	needs, err := sealNeeds(ctx, s.db, cat, extra)
	if err != nil {
		return nil, err
	}
	out := make([]SealNeed, 0, len(needs))
	for _, n := range needs {
		out = append(out, n)
	}
	sort.Slice(out, func(i, j int) bool {
		if out[i].Consumer != out[j].Consumer {
			return out[i].Consumer < out[j].Consumer
		}
		return out[i].Provider < out[j].Provider
	})
	return out, nil
}

// takeSecrets keeps the secrets a command carries. A secret of an older
// mesh (plain Value) is kept if the pair has none, as before. A sealed one
// replaces what is stored only when that is missing or stale now (after the
// command's own change), and only if every key it is sealed to is a node's:
// a proposer whose replica was behind cannot undo a newer seal.
func (ap *applier) takeSecrets(secrets []Secret) error {
	var needs map[Pair]SealNeed
	for _, sc := range secrets {
		if sc.Sealed == "" {
			if sc.Value != "" {
				if err := exec(ap.tx, `INSERT INTO credentials (consumer, provider, secret, digest) VALUES (?, ?, ?, ?) ON CONFLICT DO NOTHING`, sc.Consumer, sc.Provider, sc.Value, SecretDigest(sc.Value)); err != nil {
					return err
				}
				ap.markCredential(sc.Pair)
				ap.touch("", sc.Consumer, sc.Provider)
			}
			continue
		}
		if sc.Value != "" || sc.Digest == "" || len(sc.Recipients) == 0 {
			return ruleErr(ErrInvalid, "the sealed secret for %s -> %s is malformed (a plain value, or no digest or recipient)", sc.Consumer, sc.Provider)
		}
		if needs == nil {
			cat, err := ap.catalogue()
			if err != nil {
				return err
			}
			if needs, err = sealNeeds(ap.ctx, ap.tx, cat, nil); err != nil {
				return fmt.Errorf("read the credentials to seal: %w", err)
			}
		}
		if _, stale := needs[sc.Pair]; !stale {
			continue
		}
		ok, err := ap.allNodeKeys(sc.Recipients)
		if err != nil {
			return err
		}
		if !ok {
			continue
		}
		rec := slices.Clone(sc.Recipients)
		sort.Strings(rec)
		if err := exec(ap.tx, `INSERT INTO credentials (consumer, provider, secret, digest, sealed, recipients) VALUES (?, ?, '', ?, ?, ?)
			ON CONFLICT (consumer, provider) DO UPDATE SET secret = '', digest = excluded.digest, sealed = excluded.sealed, recipients = excluded.recipients`,
			sc.Consumer, sc.Provider, sc.Digest, sc.Sealed, strings.Join(rec, ",")); err != nil {
			return err
		}
		ap.markCredential(sc.Pair)
		ap.touch("", sc.Consumer, sc.Provider)
		delete(needs, sc.Pair)
	}
	return nil
}

// allNodeKeys says whether every key is a node's.
func (ap *applier) allNodeKeys(keys []string) (bool, error) {
	for _, k := range keys {
		if k == "" {
			return false, nil
		}
		if ok, err := has(ap.tx, `SELECT 1 FROM nodes WHERE seal_key = ?`, k); err != nil || !ok {
			return false, err
		}
	}
	return true, nil
}

// SealRequest seals credentials (again): the leader proposes it for those
// gone stale without a command that sealed them (a removed node, a replaced
// key, a secret kept in plain text by an older mesh, a restore).
type SealRequest struct {
	Secrets []Secret `json:"secrets,omitempty"`
	// CAKey and JoinSecret seal the mesh's CA key and join secret to the
	// voters (again); a voter proposes them.
	CAKey      *VoterSecret `json:"ca_key,omitempty"`
	JoinSecret *VoterSecret `json:"join_secret,omitempty"`
	// CANextKey is the key of a CA a rotation brings in (ca.go).
	CANextKey *VoterSecret `json:"ca_next_key,omitempty"`
}

// NodeKeyRequest records a node's sealing key (a node that joined before
// keys existed, or that made a new one).
type NodeKeyRequest struct {
	Node    string `json:"node"`
	SealKey string `json:"seal_key"`
}

// NodeCertRequest records when a node's certificate expires (the node says
// so after it got or renewed one) and, from format 6, its key (the node, or
// the leader that admits it): its peers then refuse a certificate for its
// name with any other key.
type NodeCertRequest struct {
	Node    string    `json:"node"`
	Expires time.Time `json:"expires"`
	Key     string    `json:"key,omitempty"`
	// CA, from format 8, is the digest of the CA that signed it (ca.go).
	CA string `json:"ca,omitempty"`
}

func (*SealRequest) Op() string     { return OpSeal }
func (*NodeKeyRequest) Op() string  { return OpNodeKey }
func (*NodeCertRequest) Op() string { return OpNodeCert }

func (r *NodeCertRequest) describe() string {
	d := "node " + r.Node + "'s certificate valid until " + r.Expires.UTC().Format(time.RFC3339)
	if r.Key != "" {
		d += ", key " + r.Key[:min(len(r.Key), 12)]
	}
	return d
}

func (ap *applier) nodeCert(r *NodeCertRequest) (bool, error) {
	if err := needNode(ap.tx, r.Node); err != nil {
		return false, err
	}
	if r.Key != "" {
		if !certKeyRE.MatchString(r.Key) {
			return false, ruleErr(ErrInvalid, "node %s's certificate key %q is not a hex SHA-256 digest", r.Node, r.Key)
		}
		if err := refuseIf(ap.tx, ruleErr(ErrConflict, "another node's certificate already has that key"), `SELECT 1 FROM nodes WHERE cert_key = ? AND name != ?`, r.Key, r.Node); err != nil {
			return false, err
		}
		if err := exec(ap.tx, `UPDATE nodes SET cert_key = ? WHERE name = ?`, r.Key, r.Node); err != nil {
			return false, err
		}
	}
	if err := exec(ap.tx, `UPDATE nodes SET cert_expires = ? WHERE name = ?`, r.Expires.UTC().Format(timeLayout), r.Node); err != nil {
		return false, err
	}
	if r.CA != "" {
		if !certKeyRE.MatchString(r.CA) {
			return false, ruleErr(ErrInvalid, "node %s's certificate CA %q is not a hex SHA-256 digest", r.Node, r.CA)
		}
		if err := exec(ap.tx, `UPDATE nodes SET cert_ca = ? WHERE name = ?`, r.CA, r.Node); err != nil {
			return false, err
		}
		return false, ap.finishRotation()
	}
	return false, nil
}

var certKeyRE = regexp.MustCompile(`^[0-9a-f]{64}$`)

func (r *SealRequest) describe() string {
	var ps []string
	for _, s := range r.Secrets {
		d := "credential " + s.Consumer + " -> " + s.Provider
		if s.Reason != "" {
			d += " (" + s.Reason + ")"
		}
		ps = append(ps, d)
	}
	if r.CAKey != nil {
		ps = append(ps, "the CA key")
	}
	if r.JoinSecret != nil {
		ps = append(ps, "the join secret")
	}
	if r.CANextKey != nil {
		ps = append(ps, "the new CA key")
	}
	return "sealed again: " + strings.Join(ps, ", ")
}

func (r *NodeKeyRequest) describe() string { return "node " + r.Node + " gave its sealing key" }

func (ap *applier) seal(r *SealRequest) (bool, error) {
	if len(r.Secrets) == 0 && r.CAKey == nil && r.JoinSecret == nil && r.CANextKey == nil {
		return false, ruleErr(ErrInvalid, "credential.seal without a secret")
	}
	if _, err := ap.takeVoterSecret("ca_next_key", r.CANextKey); err != nil {
		return false, err
	}
	if _, err := ap.takeVoterSecret("ca_key", r.CAKey); err != nil {
		return false, err
	}
	if _, err := ap.takeVoterSecret("join_secret", r.JoinSecret); err != nil {
		return false, err
	}
	before, err := ap.credentialDigests()
	if err != nil {
		return false, err
	}
	if err := ap.takeSecrets(r.Secrets); err != nil {
		return false, err
	}
	after, err := ap.credentialDigests()
	if err != nil {
		return false, err
	}
	return after != before, nil
}

func (ap *applier) credentialDigests() (string, error) {
	d, err := listRows(ap.tx, `SELECT consumer || '>' || provider || '=' || digest FROM credentials ORDER BY consumer, provider`)
	return strings.Join(d, ","), err
}

func (ap *applier) nodeKey(r *NodeKeyRequest) (bool, error) {
	if err := needNode(ap.tx, r.Node); err != nil {
		return false, err
	}
	if r.SealKey == "" {
		return false, ruleErr(ErrInvalid, "node %s gave an empty sealing key", r.Node)
	}
	if err := refuseIf(ap.tx, ruleErr(ErrConflict, "another node already holds that sealing key"), `SELECT 1 FROM nodes WHERE seal_key = ? AND name != ?`, r.SealKey, r.Node); err != nil {
		return false, err
	}
	return false, exec(ap.tx, `UPDATE nodes SET seal_key = ? WHERE name = ?`, r.SealKey, r.Node)
}

// SealedSecret is a credential as this replica holds it: the sealed form
// (or, from an older mesh not yet sealed again, the plain one) and the
// digest. Only the agent reads it, to open it with its key and deliver it.
type SealedSecret struct {
	Sealed, Plain, Digest string
	Recipients            []string
}

// SealedSecret reads one credential.
func (s *Store) SealedSecret(ctx context.Context, p Pair) (SealedSecret, error) {
	var r SealedSecret
	var rec string
	err := s.db.QueryRowContext(ctx, `SELECT sealed, secret, digest, recipients FROM credentials WHERE consumer = ? AND provider = ?`, p.Consumer, p.Provider).Scan(&r.Sealed, &r.Plain, &r.Digest, &rec)
	if err == sql.ErrNoRows {
		return r, ruleErr(ErrNotFound, "no secret for %s -> %s yet", p.Consumer, p.Provider)
	}
	if err != nil {
		return r, fmt.Errorf("read the secret for %s -> %s: %w", p.Consumer, p.Provider, err)
	}
	r.Recipients = splitNonEmpty(rec)
	return r, nil
}

// rotations names, for a command's description, the credentials it seals
// because they rotate (what `mesh why` shows as the cause).
func rotations(secrets []Secret) string {
	var ps []string
	for _, s := range secrets {
		if s.Reason != "" && s.Reason != "new" {
			ps = append(ps, s.Consumer+" -> "+s.Provider+": "+s.Reason)
		}
	}
	if len(ps) == 0 {
		return ""
	}
	return " (credential rotated: " + strings.Join(ps, "; ") + ")"
}

// The mesh's CA private key and its join secret live on voters only (issue
// 14): each is kept sealed to the voters' keys, in the settings ca_key_sealed
// and join_secret_sealed, with the keys it is sealed to in ca_key_to and
// join_secret_to. Non-voters replicate the ciphertext and cannot open it.
// The plain settings ca_key and join_secret are those of older meshes, kept
// until a voter seals them.

// VoterSecret is the CA key or the join secret, sealed to the voters.
type VoterSecret struct {
	Sealed     string   `json:"sealed"`
	Recipients []string `json:"recipients"`
	// For, on a CA key, is the digest of the CA certificate it is the key
	// of: a seal proposed from a replica read before a rotation ended is
	// not taken for the CA that replaced it (ca.go).
	For string `json:"for,omitempty"`
}

// VoterKeys are the sealing keys of the voters the state knows, sorted.
func (s *Store) VoterKeys(ctx context.Context) ([]string, error) { return voterKeys(ctx, s.db) }

func voterKeys(ctx context.Context, q queryer) ([]string, error) {
	rows, err := q.QueryContext(ctx, `SELECT seal_key FROM nodes WHERE voter = 1 AND seal_key != '' ORDER BY seal_key`)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var out []string
	for rows.Next() {
		var k string
		if err := rows.Scan(&k); err != nil {
			return nil, err
		}
		out = append(out, k)
	}
	return out, rows.Err()
}

// voterSecretNames are the settings sealed to the voters.
var voterSecretNames = []string{"ca_key", "join_secret"}

// VoterSealStale says which of the CA key and the join secret must be
// sealed (again): kept in plain text by an older mesh, or sealed to other
// keys than the voters' now (a voter joined, gave a new key, or was
// removed). Nothing is stale while no voter has a key.
func (s *Store) VoterSealStale(ctx context.Context) (map[string]bool, error) {
	return voterSealStale(ctx, s.db)
}

func voterSealStale(ctx context.Context, q queryer) (map[string]bool, error) {
	keys, err := voterKeys(ctx, q)
	if err != nil || len(keys) == 0 {
		return nil, err
	}
	kv, err := readSettings(ctx, q)
	if err != nil {
		return nil, err
	}
	out := map[string]bool{}
	want := strings.Join(keys, ",")
	for _, name := range voterSecretNames {
		if kv[name] != "" || kv[name+"_to"] != want {
			out[name] = true
		}
	}
	if kv["ca_next_cert"] != "" && kv["ca_next_key_to"] != want {
		out["ca_next_key"] = true
	}
	return out, nil
}

// takeVoterSecret keeps a sealed CA key or join secret when what is stored
// is stale and the new one is sealed to the voters' keys exactly.
func (ap *applier) takeVoterSecret(name string, v *VoterSecret) (bool, error) {
	if v == nil {
		return false, nil
	}
	if v.Sealed == "" || len(v.Recipients) == 0 {
		return false, ruleErr(ErrInvalid, "the sealed %s is malformed", name)
	}
	if v.For != "" {
		kv, err := readSettings(ap.ctx, ap.tx)
		if err != nil {
			return false, err
		}
		cert := map[string]string{"ca_key": kv["ca_cert"], "ca_next_key": kv["ca_next_cert"]}[name]
		if CertDigest(cert) != v.For {
			return false, nil // the key of a CA that is not this one now
		}
	}
	stale, err := voterSealStale(ap.ctx, ap.tx)
	if errors.Is(err, ErrNotFound) {
		// Voters, and settings without a mesh id: the state is damaged,
		// which is no rule this command broke.
		return false, fmt.Errorf("read the voters' seals: the settings name no mesh")
	}
	if err != nil {
		return false, fmt.Errorf("read the voters' seals: %w", err)
	}
	keys, err := voterKeys(ap.ctx, ap.tx)
	if err != nil {
		return false, fmt.Errorf("read the voters' keys: %w", err)
	}
	rec := slices.Clone(v.Recipients)
	sort.Strings(rec)
	if !stale[name] || !slices.Equal(rec, keys) {
		return false, nil
	}
	return true, ap.setVoterSecret(name, v.Sealed, rec)
}

// setVoterSecret stores a sealed voter secret and drops any plain copy.
func (ap *applier) setVoterSecret(name, sealed string, recipients []string) error {
	for _, kv := range [][2]string{{name, ""}, {name + "_sealed", sealed}, {name + "_to", strings.Join(recipients, ",")}} {
		if err := exec(ap.tx, `INSERT INTO settings (key, value) VALUES (?, ?) ON CONFLICT (key) DO UPDATE SET value = excluded.value`, kv[0], kv[1]); err != nil {
			return err
		}
	}
	return nil
}
