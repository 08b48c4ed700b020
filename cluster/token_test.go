package cluster

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"mesh/state"
)

// A token with an end (mesh token --ttl) joins until then and not after,
// and what it carries cannot be made into a token that lasts longer: its
// secret is derived from the join secret and its end, never the join
// secret itself.
func TestTokenWithAnEnd(t *testing.T) {
	ctx := context.Background()
	a, _ := leadingAgent(t)
	id, err := a.Store.Identity(ctx)
	if err != nil {
		t.Fatal(err)
	}
	joinSecret, err := a.Node.JoinSecret(id)
	if err != nil {
		t.Fatal(err)
	}
	token := func(secret string, until int64) string {
		return Token{MeshID: id.MeshID, CADigest: CADigest([]byte(id.CACert)), Secret: secret, Until: until}.String()
	}
	n := 1
	join := func(tok string) (string, error) {
		n++
		name := fmt.Sprintf("n%d", n)
		return name, Join(ctx, JoinConfig{DataDir: filepath.Join(t.TempDir(), name), Peer: fmt.Sprintf("127.0.0.1:%d", a.ID.Port), Token: tok, Name: name, Address: fmt.Sprintf("127.0.0.%d", n), Port: freePort(t)})
	}
	refused := func(tok, want string) {
		t.Helper()
		name, err := join(tok)
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Fatalf("join: %v, want it refused with %q", err, want)
		}
		if _, err := a.Store.Node(ctx, name); !errors.Is(err, state.ErrNotFound) {
			t.Fatalf("%s is in the state after a refused join: %v", name, err)
		}
	}

	until := time.Now().Add(time.Hour).Unix()
	derived := TokenSecret(joinSecret, until)
	if derived == joinSecret || strings.Contains(token(derived, until), joinSecret) {
		t.Fatal("a token with an end carries the join secret")
	}
	if name, err := join(token(derived, until)); err != nil {
		t.Fatalf("a token that ends in an hour: %v", err)
	} else if _, err := a.Store.Node(ctx, name); err != nil {
		t.Fatalf("%s joined, but: %v", name, err)
	}
	// Its secret with a later end, or with none.
	refused(token(derived, until+365*24*3600), "secret is not valid")
	refused(token(derived, 0), "secret is not valid")
	// The join secret with an end is not a derived secret either.
	refused(token(joinSecret, until), "secret is not valid")
	// Past its end, however right its secret; a wrong secret is told
	// only that, past its end or not (a stranger learns nothing).
	ended := time.Now().Add(-time.Second).Unix()
	refused(token(TokenSecret(joinSecret, ended), ended), "the join token ended at")
	refused(token("bogus", ended), "secret is not valid")
	// An end before 1970, sent as it is (ParseToken refuses it).
	if _, _, err := a.Node.checkToken(ctx, JoinRequest{MeshID: id.MeshID, Secret: joinSecret, Until: -1}); err == nil || !strings.Contains(err.Error(), "secret is not valid") {
		t.Fatalf("a request with an end before 1970: %v", err)
	}
	// A token without end still joins.
	if _, err := join(token(joinSecret, 0)); err != nil {
		t.Fatalf("a token without end: %v", err)
	}
	if _, err := ParseToken(token(derived, -1)); err == nil {
		t.Fatal("a token that ends before 1970 parses")
	}
}
