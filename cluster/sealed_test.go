package cluster

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"

	"mesh/internal/seal"
)

// The join secret is opened once for its sealed form: strangers' tokens,
// right in form and wrong in secret, open nothing more; sealed anew (the
// voters changed, or the secret), it is opened again.
func TestJoinSecretOpenedOnceBySealedForm(t *testing.T) {
	a := startAgent(t, initDir(t, LogStoreWAL))
	t.Cleanup(func() { a.Stop() })
	waitLeader(t, a)
	id, err := a.Store.Identity(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if id.JoinSecretSealed == "" {
		t.Fatal("the mesh holds its join secret unsealed")
	}
	secret, err := a.Node.JoinSecret(id)
	if err != nil {
		t.Fatal(err)
	}
	before := a.Node.joinOpened.opened()
	for i := 0; i < 20; i++ {
		if s, err := a.Node.JoinSecret(id); err != nil || s != secret {
			t.Fatalf("opened again: %q %v", s, err)
		}
	}
	tok, err := ParseToken(joinToken(t, a))
	if err != nil {
		t.Fatal(err)
	}
	tok.Secret = "not-the-secret"
	addr := fmt.Sprintf("127.0.0.1:%d", a.ID.Port)
	for i := 0; i < 10; i++ {
		resp, conn, err := askBinary(addr, "127.0.5.1", "Authorization: Bearer "+tok.String())
		if err != nil {
			t.Fatal(err)
		}
		io.Copy(io.Discard, resp.Body)
		conn.Close()
		if resp.StatusCode != http.StatusForbidden {
			t.Fatalf("a stranger's token: %d", resp.StatusCode)
		}
	}
	if n := a.Node.joinOpened.opened() - before; n != 0 {
		t.Fatalf("the join secret was opened %d times more for one sealed form", n)
	}
	resealed, err := seal.Seal(secret, []string{a.Node.Seal().Recipient()})
	if err != nil {
		t.Fatal(err)
	}
	id.JoinSecretSealed = resealed
	if s, err := a.Node.JoinSecret(id); err != nil || s != secret || a.Node.joinOpened.opened()-before != 1 {
		t.Fatalf("sealed anew: %q %v, %d openings", s, err, a.Node.joinOpened.opened()-before)
	}
	// One that is not this node's to open is not taken from what was kept.
	other, err := seal.LoadOrCreate(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	notOurs, err := seal.Seal(secret, []string{other.Recipient()})
	if err != nil {
		t.Fatal(err)
	}
	id.JoinSecretSealed = notOurs
	opened := a.Node.joinOpened.opened()
	if s, err := a.Node.JoinSecret(id); err == nil {
		t.Fatalf("a join secret sealed to another node opened: %q", s)
	}
	// Nor tried again for every token: it fails as it failed (a
	// non-voter's lot, for each token a stranger sends it).
	for i := 0; i < 10; i++ {
		if s, err := a.Node.JoinSecret(id); err == nil || !errors.Is(err, ErrNotAVoter) && !strings.Contains(err.Error(), ErrNotAVoter.Error()) {
			t.Fatalf("sealed to another node, asked again: %q %v", s, err)
		}
	}
	if n := a.Node.joinOpened.opened() - opened; n != 1 {
		t.Fatalf("a form this node cannot open was opened %d times", n)
	}
	id.JoinSecretSealed = resealed
	if s, err := a.Node.JoinSecret(id); err != nil || s != secret {
		t.Fatalf("its own form again: %q %v", s, err)
	}
}
