package agent

import (
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"time"

	"mesh/cluster"
	"mesh/internal/seal"
	"mesh/state"
	"mesh/state/manifest"
)

// sealer is the agent's side of sealed credentials (state/seal.go): it opens
// the secrets sealed to this node for the reconciler, gives the node's
// sealing key to the state when the state lacks it, and, while this node
// leads, seals again the credentials that went stale without a command
// that sealed them (a removed node, a replaced key, a secret an older mesh
// kept in plain text, a restore).
type sealer struct {
	id    *seal.Identity
	store sealStore
	node  sealNode
	name  string
	log   *slog.Logger

	// verified holds the sealed values of the operator's secrets whose
	// value was seen to have the digest the state records (argon2id is
	// slow on purpose: once per value, not once per pass).
	mu       sync.Mutex
	verified map[[32]byte]bool
}

// sealStore is what the sealer reads of the replica.
type sealStore interface {
	SealedSecret(ctx context.Context, p state.Pair) (state.SealedSecret, error)
	Node(ctx context.Context, name string) (state.NodeInfo, error)
	SealNeeds(ctx context.Context, extra []state.Assignment, added []*manifest.Manifest) ([]state.SealNeed, error)
	VoterSealStale(ctx context.Context) (map[string]bool, error)
	Identity(ctx context.Context) (state.Identity, error)
	VoterKeys(ctx context.Context) ([]string, error)
	SecretSealedAt(ctx context.Context, ref state.SecretRef, digest string) (state.SealedValue, error)
	StaleSecrets(ctx context.Context, key string) ([]state.StaleSecret, error)
	Changed() <-chan struct{}
}

// sealNode is what the sealer asks of this node's member.
type sealNode interface {
	Propose(ctx context.Context, req state.Request) (uint64, error)
	State() string
	OpenIdentity(id state.Identity) (caKey, joinSecret string, err error)
	OpenNextCAKey(id state.Identity) (string, error)
	SealToVoters(secret string, keys []string) (*state.VoterSecret, error)
}

var (
	_ sealStore = (*state.Store)(nil)
	_ sealNode  = (*cluster.Node)(nil)
)

// Secret opens one credential's secret, for the reconciler to deliver.
func (s *sealer) Secret(ctx context.Context, p state.Pair) (string, error) {
	row, err := s.store.SealedSecret(ctx, p)
	if err != nil {
		return "", err
	}
	if row.Sealed == "" {
		if row.Plain == "" {
			// Never deliver an empty secret (a provider would take it as
			// the password); a restore of a damaged snapshot could hold one.
			return "", fmt.Errorf("the state holds no secret for it; the leader seals a new one")
		}
		return row.Plain, nil // from an older mesh, until the leader seals it
	}
	plain, err := s.id.Open(row.Sealed)
	if errors.Is(err, seal.ErrNotForUs) {
		return "", fmt.Errorf("it is sealed to other nodes' keys, not to this node's; the leader seals a new one for the nodes that deliver it, and the next pass delivers that")
	}
	if err != nil {
		return "", err
	}
	if state.SecretDigest(plain) != row.Digest {
		return "", fmt.Errorf("it opens to a secret whose digest is not the one the state records; the state is damaged")
	}
	return plain, nil
}

// run keeps the node's key given and, on the leader, the secrets sealed. It
// looks after each change of the replica (at most every 200 ms) and every
// 30 s; a pass that fails is tried again after 2 s, doubling to a minute
// (a mesh halfway through an upgrade refuses the new commands until every
// node runs the new binary).
func (s *sealer) run(ctx context.Context) {
	backoff := time.Duration(0)
	for {
		changed := s.store.Changed()
		wait := 30 * time.Second
		if err := s.pass(ctx); err != nil {
			if ctx.Err() != nil {
				return
			}
			backoff = min(max(2*backoff, 2*time.Second), time.Minute)
			s.log.Warn("sealing credentials: will try again", "err", err, "in", backoff)
			wait = backoff
		} else {
			backoff = 0
		}
		select {
		case <-ctx.Done():
			return
		case <-changed:
		case <-time.After(wait):
		}
		select {
		case <-ctx.Done():
			return
		case <-time.After(200 * time.Millisecond):
		}
	}
}

func (s *sealer) pass(ctx context.Context) error {
	me, err := s.store.Node(ctx, s.name)
	if err != nil {
		return nil // not in the state (yet, or any more): nothing to give
	}
	if me.SealKey != s.id.Recipient() {
		pctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		_, err := s.node.Propose(pctx, &state.NodeKeyRequest{Node: s.name, SealKey: s.id.Recipient()})
		cancel()
		if err != nil {
			return fmt.Errorf("give this node's sealing key: %w", err)
		}
		s.log.Info("gave this node's sealing key to the mesh", "replaced", me.SealKey != "")
	}
	if me.Voter {
		if err := s.sealVoterSecrets(ctx); err != nil {
			return err
		}
	}
	// A secret that cannot be sealed again is said and tried again at the
	// next pass; it does not hold back anything else.
	s.sealOperatorSecrets(ctx)
	if s.node.State() != "Leader" {
		return nil
	}
	needs, err := s.store.SealNeeds(ctx, nil, nil)
	if err != nil || len(needs) == 0 {
		return err
	}
	secrets, err := seal.Secrets(needs)
	if err != nil {
		return err
	}
	pctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	if _, err := s.node.Propose(pctx, &state.SealRequest{Secrets: secrets}); err != nil {
		return fmt.Errorf("seal %d credentials: %w", len(secrets), err)
	}
	for _, n := range needs {
		verb := "sealed"
		if n.Rotates() && n.Reason != "new" {
			verb = "rotated"
		}
		s.log.Info("credential "+verb, "credential", n.Consumer+" -> "+n.Provider, "reason", n.Reason, "sealed_to", strings.Join(n.Nodes, ","))
	}
	return nil
}

// sealVoterSecrets seals the CA key and the join secret again when the
// voters changed (or an older mesh kept them in plain text). Any voter that
// can open them does it; the first command to land wins and the others are
// ignored, as the secrets are no longer stale then.
func (s *sealer) sealVoterSecrets(ctx context.Context) error {
	stale, err := s.store.VoterSealStale(ctx)
	if err != nil || len(stale) == 0 {
		return err
	}
	id, err := s.store.Identity(ctx)
	if err != nil {
		return err
	}
	caKey, joinSecret, err := s.node.OpenIdentity(id)
	if errors.Is(err, cluster.ErrNotAVoter) {
		return nil // sealed before this voter gave its key: another voter seals it in
	}
	if err != nil {
		return err
	}
	keys, err := s.store.VoterKeys(ctx)
	if err != nil {
		return err
	}
	req := &state.SealRequest{}
	if stale["ca_key"] {
		if req.CAKey, err = s.node.SealToVoters(caKey, keys); err != nil {
			return err
		}
		req.CAKey.For = state.CertDigest(id.CACert)
	}
	if stale["join_secret"] {
		if req.JoinSecret, err = s.node.SealToVoters(joinSecret, keys); err != nil {
			return err
		}
	}
	if stale["ca_next_key"] {
		// The key of the CA a rotation brings in: sealed by a voter that
		// holds it (one that joined since cannot open it: another does).
		if k, err := s.node.OpenNextCAKey(id); err == nil {
			if req.CANextKey, err = s.node.SealToVoters(k, keys); err != nil {
				return err
			}
			req.CANextKey.For = state.CertDigest(id.CANextCert)
		}
	}
	if req.CAKey == nil && req.JoinSecret == nil && req.CANextKey == nil {
		return nil
	}
	pctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	if _, err := s.node.Propose(pctx, req); err != nil {
		return fmt.Errorf("seal the CA key and the join secret to the voters: %w", err)
	}
	s.log.Info("sealed the mesh's CA key and join secret to the voters", "voters", len(keys))
	return nil
}

// OperatorSecret opens one of the operator's secrets (state/secret.go) for
// the reconciler to deliver: the value of digest (its current one when
// empty). Only a node the module runs on can.
func (s *sealer) OperatorSecret(ctx context.Context, ref state.SecretRef, digest string) ([]byte, error) {
	row, err := s.store.SecretSealedAt(ctx, ref, digest)
	if err != nil {
		return nil, err
	}
	plain, err := s.id.Open(row.Sealed)
	if errors.Is(err, seal.ErrNotForUs) {
		return nil, fmt.Errorf("secret %s is not sealed to this node yet: a node that holds it seals it again to the module's nodes (it must be up; mesh secret list says which)", ref)
	}
	if err != nil {
		return nil, fmt.Errorf("secret %s: %w", ref, err)
	}
	if err := s.verify(row, []byte(plain)); err != nil {
		return nil, fmt.Errorf("secret %s: %w", ref, err)
	}
	return []byte(plain), nil
}

// verify checks, once per sealed value, that the value opened is the one
// whose digest the state records.
func (s *sealer) verify(row state.SealedValue, plain []byte) error {
	key := sha256.Sum256([]byte(row.Sealed + "\x00" + row.Digest))
	s.mu.Lock()
	ok := s.verified[key]
	s.mu.Unlock()
	if ok {
		return nil
	}
	d, err := seal.ValueDigest(plain, row.Salt)
	if err != nil {
		return err
	}
	if d != row.Digest {
		return errors.New("it opens to a value whose digest is not the one the state records; the state is damaged: set it again (mesh secret set)")
	}
	s.mu.Lock()
	if s.verified == nil || len(s.verified) > 4096 {
		s.verified = map[[32]byte]bool{}
	}
	s.verified[key] = true
	s.mu.Unlock()
	return nil
}

// sealOperatorSecrets seals again, to the module's nodes now, each of the
// operator's secrets this node holds whose module's nodes changed (an
// assign, a move). Every node that holds one does it; the first command to
// land wins and the FSM ignores the others.
func (s *sealer) sealOperatorSecrets(ctx context.Context) {
	stale, err := s.store.StaleSecrets(ctx, s.id.Recipient())
	if err != nil {
		s.log.Warn("reading the secrets to seal again: will try again", "err", err)
		return
	}
	for _, st := range stale {
		if err := s.sealAgain(ctx, st); err != nil {
			s.log.Warn("sealing a secret again to its module's nodes failed; will try again", "secret", st.SecretRef.String(), "err", err)
			continue
		}
		s.log.Info("secret sealed again to its module's nodes", "secret", st.SecretRef.String(), "sealed_to", strings.Join(st.Nodes, ","))
	}
}

func (s *sealer) sealAgain(ctx context.Context, st state.StaleSecret) error {
	plain, err := s.id.Open(st.Sealed)
	if err != nil {
		return fmt.Errorf("open it: %w", err)
	}
	if err := s.verify(st.SealedValue, []byte(plain)); err != nil {
		return err
	}
	sealed, err := seal.Seal(plain, st.Keys)
	if err != nil {
		return err
	}
	pctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	_, err = s.node.Propose(pctx, &state.SecretSealRequest{SecretRef: st.SecretRef, Digest: st.Digest, Sealed: sealed, Recipients: st.Keys})
	return err
}
