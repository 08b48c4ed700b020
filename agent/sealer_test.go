package agent

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"strings"
	"testing"

	"mesh/internal/seal"
	"mesh/state"
	"mesh/state/manifest"
)

// fakeSealStore answers the sealer's reads from fields.
type fakeSealStore struct {
	secrets map[state.Pair]state.SealedSecret
	me      *state.NodeInfo
	needs   []state.SealNeed
	values  map[state.SecretRef]state.SealedValue
	stale   []state.StaleSecret
}

func (f *fakeSealStore) SecretSealedAt(_ context.Context, ref state.SecretRef, _ string) (state.SealedValue, error) {
	v, ok := f.values[ref]
	if !ok {
		return v, state.ErrNotFound
	}
	return v, nil
}

func (f *fakeSealStore) StaleSecrets(_ context.Context, key string) ([]state.StaleSecret, error) {
	var out []state.StaleSecret
	for _, st := range f.stale {
		for _, k := range st.Recipients {
			if k == key {
				out = append(out, st)
			}
		}
	}
	return out, nil
}

func (f *fakeSealStore) SealedSecret(_ context.Context, p state.Pair) (state.SealedSecret, error) {
	r, ok := f.secrets[p]
	if !ok {
		return r, errors.New("no such credential")
	}
	return r, nil
}

func (f *fakeSealStore) Node(context.Context, string) (state.NodeInfo, error) {
	if f.me == nil {
		return state.NodeInfo{}, state.ErrNotFound
	}
	return *f.me, nil
}

func (f *fakeSealStore) SealNeeds(context.Context, []state.Assignment, []*manifest.Manifest) ([]state.SealNeed, error) {
	return f.needs, nil
}
func (f *fakeSealStore) VoterSealStale(context.Context) (map[string]bool, error) { return nil, nil }
func (f *fakeSealStore) Identity(context.Context) (state.Identity, error) {
	return state.Identity{}, nil
}
func (f *fakeSealStore) VoterKeys(context.Context) ([]string, error) { return nil, nil }
func (f *fakeSealStore) Changed() <-chan struct{}                    { return make(chan struct{}) }

// fakeSealNode records what the sealer proposes.
type fakeSealNode struct {
	leader   bool
	proposed []state.Request
}

func (f *fakeSealNode) Propose(_ context.Context, req state.Request) (uint64, error) {
	f.proposed = append(f.proposed, req)
	return uint64(len(f.proposed)), nil
}

func (f *fakeSealNode) State() string {
	if f.leader {
		return "Leader"
	}
	return "Follower"
}

func (f *fakeSealNode) OpenIdentity(state.Identity) (string, string, error) {
	return "", "", errors.New("not a voter here")
}

func (f *fakeSealNode) OpenNextCAKey(state.Identity) (string, error) {
	return "", errors.New("not a voter here")
}

func (f *fakeSealNode) SealToVoters(string, []string) (*state.VoterSecret, error) {
	return nil, errors.New("not a voter here")
}

func identity(t *testing.T) *seal.Identity {
	t.Helper()
	id, err := seal.LoadOrCreate(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	return id
}

func sealTo(t *testing.T, secret string, ids ...*seal.Identity) string {
	t.Helper()
	var keys []string
	for _, id := range ids {
		keys = append(keys, id.Recipient())
	}
	s, err := seal.Seal(secret, keys)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

var discard = slog.New(slog.NewTextHandler(io.Discard, nil))

// The secret delivered to a container is exactly the one sealed to this
// node, whose digest the state records; anything else is an error and
// never an empty or wrong secret.
func TestSealerDeliversOnlyTheRecordedSecret(t *testing.T) {
	me, other := identity(t), identity(t)
	pair := state.Pair{Consumer: "gitea", Provider: "postgres"}
	cases := []struct {
		name    string
		row     state.SealedSecret
		want    string
		wantErr string
	}{
		{"sealed to this node", state.SealedSecret{Sealed: sealTo(t, "s3cret", me, other), Digest: state.SecretDigest("s3cret")}, "s3cret", ""},
		{"sealed to other nodes only", state.SealedSecret{Sealed: sealTo(t, "s3cret", other), Digest: state.SecretDigest("s3cret")}, "", "not to this node's"},
		{"opens to a secret of another digest", state.SealedSecret{Sealed: sealTo(t, "s3cret", me), Digest: state.SecretDigest("another")}, "", "damaged"},
		{"nothing at all (a damaged restore)", state.SealedSecret{Digest: state.SecretDigest("")}, "", "no secret"},
		{"plain text of an older mesh", state.SealedSecret{Plain: "old", Digest: state.SecretDigest("old")}, "old", ""},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			s := &sealer{id: me, store: &fakeSealStore{secrets: map[state.Pair]state.SealedSecret{pair: tc.row}}, node: &fakeSealNode{}, name: "n1", log: discard}
			got, err := s.Secret(context.Background(), pair)
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) || got != "" {
					t.Fatalf("got %q, %v; want no secret and an error saying %q", got, err, tc.wantErr)
				}
				return
			}
			if err != nil || got != tc.want {
				t.Fatalf("got %q, %v; want %q", got, err, tc.want)
			}
		})
	}
}

// A pass gives this node's key when the state lacks it, and only the
// leader seals what is stale, each secret to exactly the keys it needs.
func TestSealerPass(t *testing.T) {
	me, other := identity(t), identity(t)
	need := state.SealNeed{Pair: state.Pair{Consumer: "gitea", Provider: "postgres"}, Keys: []string{me.Recipient(), other.Recipient()}, Nodes: []string{"n1", "n2"}, Reason: "new"}

	t.Run("not in the state yet", func(t *testing.T) {
		n := &fakeSealNode{leader: true}
		s := &sealer{id: me, store: &fakeSealStore{needs: []state.SealNeed{need}}, node: n, name: "n1", log: discard}
		if err := s.pass(context.Background()); err != nil || len(n.proposed) != 0 {
			t.Fatalf("a node not in the state proposed %v (%v)", n.proposed, err)
		}
	})
	t.Run("the state lacks this node's key", func(t *testing.T) {
		n := &fakeSealNode{}
		s := &sealer{id: me, store: &fakeSealStore{me: &state.NodeInfo{Node: state.Node{Name: "n1", SealKey: other.Recipient()}}}, node: n, name: "n1", log: discard}
		if err := s.pass(context.Background()); err != nil {
			t.Fatal(err)
		}
		if len(n.proposed) != 1 {
			t.Fatalf("proposed %v, want one node.key", n.proposed)
		}
		k, ok := n.proposed[0].(*state.NodeKeyRequest)
		if !ok || k.Node != "n1" || k.SealKey != me.Recipient() {
			t.Fatalf("proposed %+v, want n1's own key %s", n.proposed[0], me.Recipient())
		}
	})
	t.Run("a follower seals nothing", func(t *testing.T) {
		n := &fakeSealNode{}
		s := &sealer{id: me, store: &fakeSealStore{me: &state.NodeInfo{Node: state.Node{Name: "n1", SealKey: me.Recipient()}}, needs: []state.SealNeed{need}}, node: n, name: "n1", log: discard}
		if err := s.pass(context.Background()); err != nil || len(n.proposed) != 0 {
			t.Fatalf("a follower proposed %v (%v)", n.proposed, err)
		}
	})
	t.Run("the leader seals to the needed keys", func(t *testing.T) {
		n := &fakeSealNode{leader: true}
		s := &sealer{id: me, store: &fakeSealStore{me: &state.NodeInfo{Node: state.Node{Name: "n1", SealKey: me.Recipient()}}, needs: []state.SealNeed{need}}, node: n, name: "n1", log: discard}
		if err := s.pass(context.Background()); err != nil {
			t.Fatal(err)
		}
		if len(n.proposed) != 1 {
			t.Fatalf("proposed %v, want one credential.seal", n.proposed)
		}
		req, ok := n.proposed[0].(*state.SealRequest)
		if !ok || len(req.Secrets) != 1 {
			t.Fatalf("proposed %+v, want one sealed secret", n.proposed[0])
		}
		sec := req.Secrets[0]
		if sec.Pair != need.Pair || sec.Value != "" {
			t.Fatalf("sealed %+v: wrong pair, or the secret in plain text", sec)
		}
		for _, id := range []*seal.Identity{me, other} {
			plain, err := id.Open(sec.Sealed)
			if err != nil || plain == "" || state.SecretDigest(plain) != sec.Digest {
				t.Fatalf("a node it is sealed to opens %q (%v); digest %s", plain, err, sec.Digest)
			}
		}
		if _, err := identity(t).Open(sec.Sealed); err == nil {
			t.Fatal("a node it is not sealed to opens it")
		}
	})
}

func valueOf(t *testing.T, value []byte, ids ...*seal.Identity) state.SealedValue {
	t.Helper()
	salt := seal.NewSalt()
	d, err := seal.ValueDigest(value, salt)
	if err != nil {
		t.Fatal(err)
	}
	v := state.SealedValue{Sealed: sealTo(t, string(value), ids...), Digest: d, Salt: salt}
	for _, id := range ids {
		v.Recipients = append(v.Recipients, id.Recipient())
	}
	return v
}

// An operator's secret opens, byte for byte (NULs and all), only on a node
// it is sealed to, and only to the value whose digest the state records.
func TestSealerOpensOperatorSecrets(t *testing.T) {
	me, other := identity(t), identity(t)
	ref := state.SecretRef{Module: "mail", Name: "smtp"}
	value := []byte("pa\x00ss\nword\xff")
	damaged := valueOf(t, value, me)
	damaged.Digest = strings.Repeat("0", 64)
	cases := []struct {
		name    string
		row     *state.SealedValue
		wantErr string
	}{
		{"sealed to this node", ptr(valueOf(t, value, me, other)), ""},
		{"sealed to another node", ptr(valueOf(t, value, other)), "not sealed to this node yet"},
		{"a digest of another value", &damaged, "damaged"},
		{"not set", nil, "not found"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			st := &fakeSealStore{values: map[state.SecretRef]state.SealedValue{}}
			if tc.row != nil {
				st.values[ref] = *tc.row
			}
			s := &sealer{id: me, store: st, node: &fakeSealNode{}, name: "n1", log: discard}
			got, err := s.OperatorSecret(context.Background(), ref, "")
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) || got != nil {
					t.Fatalf("got %q, %v; want nothing and an error saying %q", got, err, tc.wantErr)
				}
				return
			}
			if err != nil || string(got) != string(value) {
				t.Fatalf("got %q, %v", got, err)
			}
		})
	}
}

func ptr[T any](v T) *T { return &v }

// A node that holds a secret whose module moved seals it again to the new
// nodes, which can then open it; a node that does not hold it proposes
// nothing.
func TestSealerSealsMovedSecretsAgain(t *testing.T) {
	n1, n2 := identity(t), identity(t)
	ref := state.SecretRef{Module: "mail", Name: "smtp"}
	v := valueOf(t, []byte("hunter2"), n1)
	st := &fakeSealStore{me: &state.NodeInfo{}, stale: []state.StaleSecret{{SecretRef: ref, SealedValue: v, Keys: []string{n2.Recipient()}, Nodes: []string{"n2"}}}}
	st.me.SealKey = n1.Recipient()
	node := &fakeSealNode{}
	s := &sealer{id: n1, store: st, node: node, name: "n1", log: discard}
	if err := s.pass(context.Background()); err != nil {
		t.Fatal(err)
	}
	if len(node.proposed) != 1 {
		t.Fatalf("proposed %d commands, want 1", len(node.proposed))
	}
	r, ok := node.proposed[0].(*state.SecretSealRequest)
	if !ok || r.Digest != v.Digest || strings.Join(r.Recipients, ",") != n2.Recipient() {
		t.Fatalf("proposed %+v", node.proposed[0])
	}
	if got, err := n2.Open(r.Sealed); err != nil || got != "hunter2" {
		t.Fatalf("n2 opens %q, %v", got, err)
	}
	if _, err := n1.Open(r.Sealed); err == nil {
		t.Fatal("n1, which the module left, still opens the new seal")
	}
	st2 := &fakeSealStore{me: &state.NodeInfo{}, stale: st.stale}
	st2.me.SealKey = n2.Recipient()
	node2 := &fakeSealNode{}
	if err := (&sealer{id: n2, store: st2, node: node2, name: "n2", log: discard}).pass(context.Background()); err != nil || len(node2.proposed) != 0 {
		t.Fatalf("a node that does not hold it proposed %d (%v)", len(node2.proposed), err)
	}
}
