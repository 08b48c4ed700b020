package cluster

import (
	"errors"
	"fmt"
	"sync"

	"mesh/internal/seal"
	"mesh/state"
)

// Seal is this node's sealing key.
func (n *Node) Seal() *seal.Identity { return n.seal }

// ErrNotAVoter: this node does not hold the CA key or the join secret.
var ErrNotAVoter = errors.New("only voters hold the mesh's CA key and join secret")

// OpenIdentity opens the CA key and the join secret of the mesh, which are
// sealed to the voters (state/seal.go). A mesh made by an older binary may
// still hold them in plain text, until a voter seals them.
func (n *Node) OpenIdentity(id state.Identity) (caKey, joinSecret string, err error) {
	if caKey, err = n.openVoterSecret(id.CAKey, id.CAKeySealed, "CA key"); err != nil {
		return "", "", err
	}
	if joinSecret, err = n.JoinSecret(id); err != nil {
		return "", "", err
	}
	return caKey, joinSecret, nil
}

// JoinSecret opens the join secret alone (for `mesh token`, and for each
// token a join or a download of the binary carries). The secret opened is
// kept by its sealed form, which a voter seals anew when the voters or the
// secret change: opening it (age, a third of a millisecond with three
// voters) for every token anybody on the network sends, right in form and
// wrong in secret, was a stranger's way to spend a node's processors.
func (n *Node) JoinSecret(id state.Identity) (string, error) {
	if id.JoinSecret != "" || id.JoinSecretSealed == "" {
		return n.openVoterSecret(id.JoinSecret, id.JoinSecretSealed, "join secret")
	}
	o := &n.joinOpened
	o.mu.Lock()
	defer o.mu.Unlock()
	if o.sealed == id.JoinSecretSealed {
		return o.plain, o.err
	}
	// Kept failed too: opening a form this node cannot open (a non-voter's,
	// or one sealed before this voter's key was known) fails the same way
	// each time, and costs as much as one that opens.
	v, err := n.openVoterSecret("", id.JoinSecretSealed, "join secret")
	o.sealed, o.plain, o.err, o.opens = id.JoinSecretSealed, v, err, o.opens+1
	return v, err
}

// openedSecret is a voter's secret as last opened, by its sealed form (or
// why it did not open), and how many times it was opened (tests).
type openedSecret struct {
	mu            sync.Mutex
	sealed, plain string
	err           error
	opens         int
}

// opened is how many times the secret was opened.
func (o *openedSecret) opened() int {
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.opens
}

// openVoterSecret is a plain copy of an older mesh, else the sealed form
// opened with this node's key.
func (n *Node) openVoterSecret(plain, sealed, what string) (string, error) {
	if plain != "" {
		return plain, nil
	}
	if sealed == "" {
		return "", fmt.Errorf("this replica holds no %s (is the mesh initialised?)", what)
	}
	v, err := n.seal.Open(sealed)
	if errors.Is(err, seal.ErrNotForUs) {
		return "", &state.RuleError{Kind: state.ErrConflict, Msg: fmt.Sprintf("%v: node %s cannot open the %s (a non-voter, or a voter it was not sealed to yet: a voter seals it again within seconds); ask a voter, e.g. run `mesh token` there (mesh node list shows them)", ErrNotAVoter, n.cfg.ID, what)}
	}
	return v, err
}

// SealToVoters seals a secret to the voters' keys as this replica knows them.
func (n *Node) SealToVoters(secret string, keys []string) (*state.VoterSecret, error) {
	if len(keys) == 0 {
		return nil, errors.New("no voter has given its sealing key yet")
	}
	s, err := seal.Seal(secret, keys)
	if err != nil {
		return nil, err
	}
	return &state.VoterSecret{Sealed: s, Recipients: keys}, nil
}
