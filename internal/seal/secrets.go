package seal

import (
	"crypto/rand"
	"encoding/base64"
	"fmt"

	"mesh/state"
)

// NewSecret is a random secret: 24 bytes from crypto/rand, base64url
// (credentials and the join secret). crypto/rand.Read never fails.
func NewSecret() string {
	b := make([]byte, 24)
	rand.Read(b)
	return base64.RawURLEncoding.EncodeToString(b)
}

// Secrets makes what a command carries for each need: a new random secret
// (or, for one an older mesh kept in plain text, that secret), sealed to the
// need's keys, with its digest. Only the proposer calls it; the plain
// secret never leaves this function.
func Secrets(needs []state.SealNeed) ([]state.Secret, error) {
	var out []state.Secret
	for _, n := range needs {
		plain := n.Plain
		if plain == "" {
			plain = NewSecret()
		}
		sealed, err := Seal(plain, n.Keys)
		if err != nil {
			return nil, fmt.Errorf("credential %s -> %s: %w", n.Consumer, n.Provider, err)
		}
		out = append(out, state.Secret{Pair: n.Pair, Sealed: sealed, Digest: state.SecretDigest(plain), Recipients: n.Keys, Reason: n.Reason})
	}
	return out, nil
}
