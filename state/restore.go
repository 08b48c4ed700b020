package state

import (
	"bytes"
	"context"
	"fmt"
	"slices"
	"sort"
	"strings"
)

// RestoreBody is what a restore (OpRestore) carries: the part of a snapshot
// that composition reads. A restore replaces the catalogue, the assignments,
// the credentials, the bindings and the nodes' public domains with those of
// a snapshot, through Raft, so every node ends with that state and its plan
// follows from it. Membership (the nodes, the CA, the join secret) is the
// mesh's as it is now: a restore never removes or adds a node, and
// assignments to nodes that are not in the mesh are dropped.
type RestoreBody struct {
	MeshID        string            `json:"mesh_id"`
	Index         uint64            `json:"index"`
	Modules       []RestoredModule  `json:"modules"`
	Assignments   []Assignment      `json:"assignments"`
	Credentials   []Secret          `json:"credentials"`
	Bindings      []RestoredBinding `json:"bindings,omitempty"`
	PublicDomains map[string]string `json:"public_domains,omitempty"`
	// Secrets are the operator's secrets of the snapshot, sealed as they
	// were (nil: a snapshot of a mesh older than them, which keeps those
	// of now).
	Secrets *[]RestoredSecret `json:"secrets,omitempty"`
	// ACME is each node's ACME settings of the snapshot (edge.go).
	ACME map[string]ACME `json:"acme,omitempty"`
}

// RestoredSecret is one of the operator's secrets of a snapshot, sealed.
type RestoredSecret struct {
	SecretRef
	Sealed     string   `json:"sealed"`
	Digest     string   `json:"digest"`
	Salt       string   `json:"salt"`
	Size       int      `json:"size"`
	SetAt      string   `json:"set_at"`
	SetIndex   uint64   `json:"set_index"`
	Recipients []string `json:"recipients"`
}

// RestoredModule is one catalogue entry of a snapshot, with its parsed form
// (filled by the proposer: the FSM never parses a manifest).
type RestoredModule struct {
	ModuleSpec
	Version int64  `json:"version"`
	AddedAt string `json:"added_at"`
}

// ParseSpecs parses each module's text into the parsed form the FSM reads
// (a snapshot is text on disk; the proposer parses it before it proposes).
// A parsed form that came with the request is replaced, not trusted: it
// could say what its text does not, past every check the parser makes. A
// module that does not parse keeps none, which the FSM refuses as a rule
// error; the first such is returned.
func (b *RestoreBody) ParseSpecs() error {
	var first error
	for i := range b.Modules {
		m := &b.Modules[i]
		m.Manifest = nil
		sp, err := SpecOf(m.File, m.Text)
		if err != nil {
			if first == nil {
				first = fmt.Errorf("the snapshot's module from %s does not parse with this mesh binary: %w", m.File, err)
			}
			continue
		}
		m.ModuleSpec = sp
	}
	return first
}

// RestoredBinding is where a binding pointed in the snapshot.
type RestoredBinding struct {
	BindKey
	ProviderNode string `json:"provider_node"`
}

// RestoreBody extracts from a snapshot what a restore carries.
func (sn *Snapshot) RestoreBody() (*RestoreBody, error) {
	b := &RestoreBody{Index: sn.Index, PublicDomains: map[string]string{}, MeshID: sn.Setting("mesh_id")}
	if b.MeshID == "" {
		return nil, fmt.Errorf("the snapshot names no mesh; is it a file written by mesh snapshot save?")
	}
	str := func(row map[string]any, col string) string {
		if v, ok := row[col].(string); ok {
			return v
		}
		return ""
	}
	num := func(row map[string]any, col string) int64 {
		switch v := row[col].(type) {
		case float64:
			return int64(v)
		case int64:
			return v
		case interface{ Int64() (int64, error) }:
			n, _ := v.Int64()
			return n
		}
		return 0
	}
	for _, r := range sn.Rows("modules") {
		b.Modules = append(b.Modules, RestoredModule{ModuleSpec: ModuleSpec{File: str(r, "file"), Text: str(r, "manifest")}, Version: num(r, "version"), AddedAt: str(r, "added_at")})
	}
	for _, r := range sn.Rows("assignments") {
		b.Assignments = append(b.Assignments, Assignment{Node: str(r, "node"), Module: str(r, "module"), Seq: uint64(num(r, "seq"))})
	}
	for _, r := range sn.Rows("credentials") {
		b.Credentials = append(b.Credentials, Secret{Pair: Pair{Consumer: str(r, "consumer"), Provider: str(r, "provider")}, Value: str(r, "secret"),
			Sealed: str(r, "sealed"), Digest: str(r, "digest"), Recipients: splitNonEmpty(str(r, "recipients"))})
	}
	for _, r := range sn.Rows("bindings") {
		b.Bindings = append(b.Bindings, RestoredBinding{BindKey: BindKey{Node: str(r, "node"), Module: str(r, "module"), Path: str(r, "path")}, ProviderNode: str(r, "provider_node")})
	}
	for _, r := range sn.Rows("nodes") {
		b.PublicDomains[str(r, "name")] = str(r, "public_domain")
		if a := (ACME{Directory: str(r, "acme_directory"), Email: str(r, "acme_email"), CARoot: str(r, "acme_ca_root")}); a != (ACME{}) {
			if b.ACME == nil {
				b.ACME = map[string]ACME{}
			}
			b.ACME[str(r, "name")] = a
		}
	}
	if rows, ok := sn.Tables["secrets"]; ok {
		list := []RestoredSecret{}
		for _, r := range rows {
			list = append(list, RestoredSecret{SecretRef: SecretRef{Module: str(r, "module"), Name: str(r, "name")}, Sealed: str(r, "sealed"), Digest: str(r, "digest"),
				Salt: str(r, "salt"), Size: int(num(r, "size")), SetAt: str(r, "set_at"), SetIndex: uint64(num(r, "set_index")), Recipients: splitNonEmpty(str(r, "recipients"))})
		}
		b.Secrets = &list
	}
	return b, nil
}

// restore is OpRestore's apply function. It replaces the catalogue: what
// the store keeps of it, and of the roster, is not trusted across it.
func (ap *applier) restore(b *RestoreBody) (bool, error) {
	ap.catalogueChanges()
	ap.rosterChanges()
	ap.forgetInputs()
	tx := ap.tx
	names, err := listRows(tx, `SELECT name FROM nodes ORDER BY name`)
	if err != nil {
		return false, err
	}
	nodes := map[string]bool{}
	for _, n := range names {
		nodes[n] = true
	}
	mods := map[string]bool{}
	// A rollout does not go on across a restore, and the history is the
	// snapshot's modules' (a version number of another mesh's history
	// could name another manifest).
	if err := exec(tx, `DELETE FROM rollouts`); err != nil {
		return false, err
	}
	if err := exec(tx, `DELETE FROM held_secrets`); err != nil {
		return false, err
	}
	if err := exec(tx, `DELETE FROM module_history`); err != nil {
		return false, err
	}
	// Nor does a purge: the snapshot's assignments say what runs, and a
	// data directory is removed only when an operator asks after it.
	if err := exec(tx, `DELETE FROM purges`); err != nil {
		return false, err
	}
	// Nor a move: the snapshot's assignments say where a module runs.
	if err := exec(tx, `DELETE FROM moves`); err != nil {
		return false, err
	}
	if err := exec(tx, `DELETE FROM modules`); err != nil {
		return false, err
	}
	for i := range b.Modules {
		m := &b.Modules[i]
		if err := m.check(); err != nil {
			return false, err
		}
		name := m.Manifest.Module
		if m.Version < 0 {
			return false, ruleErr(ErrInvalid, "the snapshot gives module %q the version %d", name, m.Version)
		}
		if mods[name] {
			return false, ruleErr(ErrInvalid, "the snapshot holds module %q twice", name)
		}
		mods[name] = true
		if err := exec(tx, `INSERT INTO modules (name, file, manifest, digest, version, added_at, spec) VALUES (?, ?, ?, ?, ?, ?, ?)`, name, m.File, m.Text, m.Digest, m.Version, m.AddedAt, m.specJSON()); err != nil {
			return false, err
		}
	}
	if err := exec(tx, `DELETE FROM assignments`); err != nil {
		return false, err
	}
	ap.assignedForget()
	for _, a := range b.Assignments {
		if nodes[a.Node] && mods[a.Module] {
			if err := exec(tx, `INSERT OR IGNORE INTO assignments (node, module, seq) VALUES (?, ?, ?)`, a.Node, a.Module, a.Seq); err != nil {
				return false, err
			}
		}
	}
	// Credentials come back as they were, sealed to the keys of then; the
	// leader seals again (rotating) those that no node here can open.
	if err := exec(tx, `DELETE FROM credentials`); err != nil {
		return false, err
	}
	for _, c := range b.Credentials {
		d := c.Digest
		if c.Sealed == "" {
			d = SecretDigest(c.Value)
		}
		if err := exec(tx, `INSERT OR IGNORE INTO credentials (consumer, provider, secret, digest, sealed, recipients) VALUES (?, ?, ?, ?, ?, ?)`,
			c.Consumer, c.Provider, c.Value, d, c.Sealed, strings.Join(c.Recipients, ",")); err != nil {
			return false, err
		}
	}
	// The operator's secrets come back sealed as they were: a node of then
	// that is still here seals them again to the module's nodes now; one
	// sealed only to nodes that left says to set it again. The mesh's own
	// (the backup repository's password) stay as they are, as the
	// repository's URL does (keepRepoFormat): the snapshot's password, or
	// none, beside the URL of now would leave every backup made since
	// unreadable.
	if b.Secrets != nil {
		keepRepo := ap.v >= keepRepoFormat
		if err := exec(tx, `DELETE FROM secrets WHERE module != ? OR NOT ?`, MeshSecrets, keepRepo); err != nil {
			return false, err
		}
		for _, sc := range *b.Secrets {
			if err := checkRef(sc.SecretRef); err != nil {
				return false, err
			}
			if keepRepo && sc.Module == MeshSecrets {
				continue
			}
			if sc.Sealed == "" || !hexRE.MatchString(sc.Digest) || !hexRE.MatchString(sc.Salt) || sc.Size <= 0 || sc.Size > MaxSecretSize {
				return false, ruleErr(ErrInvalid, "the snapshot's secret %s is malformed (no sealed value, digest or size)", sc.SecretRef)
			}
			rec := slices.Clone(sc.Recipients)
			sort.Strings(rec)
			if err := exec(tx, `INSERT OR IGNORE INTO secrets (module, name, sealed, digest, salt, size, set_at, set_index, recipients) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)`,
				sc.Module, sc.Name, sc.Sealed, sc.Digest, sc.Salt, sc.Size, sc.SetAt, sc.SetIndex, strings.Join(rec, ",")); err != nil {
				return false, err
			}
		}
	}
	if err := exec(tx, `DELETE FROM bindings`); err != nil {
		return false, err
	}
	for _, bd := range b.Bindings {
		if nodes[bd.Node] {
			if err := exec(tx, `INSERT OR IGNORE INTO bindings VALUES (?, ?, ?, ?)`, bd.Node, bd.Module, bd.Path, bd.ProviderNode); err != nil {
				return false, err
			}
		}
	}
	sort.Strings(names)
	for _, n := range names {
		ds := splitDomains(b.PublicDomains[n])
		if _, err := (&PublicDomainRequest{Node: n, Domains: ds}).changeDomains(nil); err != nil {
			return false, ruleErr(ErrInvalid, "the snapshot's public domains of node %s: %v", n, err)
		}
		a := b.ACME[n]
		if err := a.Check(); err != nil {
			return false, ruleErr(ErrInvalid, "the snapshot's ACME settings of node %s: %v", n, err)
		}
		if a.CARoot != "" {
			a.CARoot, _ = canonicalRoots(a.CARoot, false)
		}
		if err := exec(tx, `UPDATE nodes SET public_domain = ?, acme_directory = ?, acme_email = ?, acme_ca_root = ? WHERE name = ?`,
			strings.Join(ds, " "), a.Directory, a.Email, a.CARoot, n); err != nil {
			return false, err
		}
	}
	return true, nil
}

// Dropped lists what a restore leaves out because the node is not in the
// mesh now (for the operator; the FSM drops the same, deterministically).
func (b *RestoreBody) Dropped(current []string) []string {
	now := map[string]bool{}
	for _, n := range current {
		now[n] = true
	}
	var out []string
	for _, a := range b.Assignments {
		if !now[a.Node] {
			out = append(out, a.Module+" on "+a.Node)
		}
	}
	sort.Strings(out)
	return out
}

// PlainNeeds says how the secrets a restore carries in plain text (a
// snapshot of an older mesh, or a crafted one) are to be sealed before it
// is proposed: the restore is applied to a private copy of this replica,
// and each plain credential that some node of this mesh delivers there is
// a need (its value, the keys of the nodes that deliver it). Dropped lists
// the plain credentials no node delivers: they are left out of the restore
// (a new secret is made if one is needed later), never kept in plain text.
func (s *Store) PlainNeeds(ctx context.Context, b *RestoreBody) (needs []SealNeed, dropped []Pair, err error) {
	plain := map[Pair]bool{}
	for _, c := range b.Credentials {
		if c.Sealed == "" && c.Value != "" {
			plain[c.Pair] = true
		}
	}
	if len(plain) == 0 {
		return nil, nil, nil
	}
	var snap bytes.Buffer
	if err := s.WriteSnapshot(ctx, &snap); err != nil {
		return nil, nil, err
	}
	index, err := s.AppliedIndex()
	if err != nil {
		return nil, nil, err
	}
	scratch, cleanup, err := s.openScratch()
	if err != nil {
		return nil, nil, err
	}
	defer cleanup()
	if err := scratch.Restore(ctx, &snap); err != nil {
		return nil, nil, fmt.Errorf("copy the replica: %w", err)
	}
	c := NewCommand(b)
	if err := scratch.Apply(index+1, c.Encode()); err != nil {
		return nil, nil, err
	}
	all, err := scratch.SealNeeds(ctx, nil, nil)
	if err != nil {
		return nil, nil, err
	}
	for _, n := range all {
		if plain[n.Pair] && n.Plain != "" {
			needs = append(needs, n)
			delete(plain, n.Pair)
		}
	}
	for p := range plain {
		dropped = append(dropped, p)
	}
	sort.Slice(dropped, func(i, j int) bool {
		return dropped[i].Consumer+">"+dropped[i].Provider < dropped[j].Consumer+">"+dropped[j].Provider
	})
	return needs, dropped, nil
}
