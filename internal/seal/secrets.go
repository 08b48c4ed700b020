package seal

import (
	"crypto/rand"
	"encoding/base64"
	"fmt"

	"mesh/state"
)

// Secrets makes what a command carries for each need: a new random secret
// (or, for one an older mesh kept in plain text, that secret), sealed to the
// need's keys, with its digest. Only the proposer calls it; the plain
// secret never leaves this function.
func Secrets(needs []state.SealNeed) ([]state.Secret, error) {
	var out []state.Secret
	for _, n := range needs {
		plain := n.Plain
		if plain == "" {
			b := make([]byte, 24)
			if _, err := rand.Read(b); err != nil {
				return nil, fmt.Errorf("generate a secret: %w", err)
			}
			plain = base64.RawURLEncoding.EncodeToString(b)
		}
		sealed, err := Seal(plain, n.Keys)
		if err != nil {
			return nil, fmt.Errorf("credential %s -> %s: %w", n.Consumer, n.Provider, err)
		}
		out = append(out, state.Secret{Pair: n.Pair, Sealed: sealed, Digest: state.SecretDigest(plain), Recipients: n.Keys, Reason: n.Reason})
	}
	return out, nil
}
