package seal

import (
	"crypto/rand"
	"encoding/base64"
	"encoding/hex"
	"fmt"

	"golang.org/x/crypto/argon2"

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

// The digest of an operator's secret (state/secret.go): argon2id with the
// parameters OWASP recommends for a password store (19 MiB, 2 passes, one
// lane), so that a replica that cannot open a short password cannot guess
// it from its digest either. About 19 ms and 19 MiB, once per set
// (BenchmarkValueDigest on the 2-core bed machine, 2026-12-01).
const (
	valueTime    = 2
	valueMemory  = 19 * 1024 // KiB
	valueThreads = 1
)

// NewSalt is a digest's salt: 16 random bytes, hex.
func NewSalt() string {
	b := make([]byte, 16)
	rand.Read(b)
	return hex.EncodeToString(b)
}

// ValueDigest is the digest of an operator's secret with salt (hex).
func ValueDigest(value []byte, salt string) (string, error) {
	s, err := hex.DecodeString(salt)
	if err != nil || len(s) < 16 {
		return "", fmt.Errorf("the secret's salt %q is not 16 or more hex bytes", salt)
	}
	return hex.EncodeToString(argon2.IDKey(value, s, valueTime, valueMemory, valueThreads, 32)), nil
}
