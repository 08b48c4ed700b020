package cluster

import (
	"encoding/base64"
	"strings"
	"testing"
)

// FuzzParseToken: a token (or an Authorization header carrying one) from
// anyone, the binary's download and `mesh join` parse it before anything
// else. It never panics, what it accepts is whole (a mesh, a CA digest, a
// secret, no end before 1970) and encodes back to itself, and what it
// refuses is refused in one of its fixed sentences, never echoing the
// input (the refusal is the body of the node's 401).
func FuzzParseToken(f *testing.F) {
	good := Token{MeshID: "m-1", CADigest: "sha256:ab", Secret: "s3cret", Until: 1893456000}.String()
	enc := func(s string) string { return tokenPrefix + base64.RawURLEncoding.EncodeToString([]byte(s)) }
	for _, s := range []string{
		good,
		"Bearer " + good,
		"bearer  " + good + " ",
		Token{MeshID: "m", CADigest: "c", Secret: "s"}.String(),
		tokenPrefix,
		"mesh1",
		good[:len(good)-3],
		good + "==",
		enc(`{"m":"m","c":"c","s":"s","u":-1}`),
		enc(`{"m":"m","c":"c","s":"s","u":1e3}`),
		enc(`{"m":"m","c":"c","s":"s","u":99999999999999999999}`),
		enc(`{"m":"m","m":"n","c":"c","s":"s"}`),
		enc(`{"m":"\u0000","c":"c","s":"s","x":[1,2]}`),
		enc(`[]`),
		enc(`null`),
		"Basic " + good,
	} {
		f.Add(s)
	}
	refusals := map[string]bool{}
	for _, s := range []string{"", "x", "Bearer x", "mesh1.!", enc(`{}`)} {
		if _, err := bearerToken(s); err != nil {
			refusals[err.Error()] = true
		}
		if _, err := ParseToken(s); err != nil {
			refusals[err.Error()] = true
		}
	}
	if len(refusals) != 3 {
		f.Fatalf("the seeds' refusals: %v", refusals)
	}
	f.Fuzz(func(t *testing.T, s string) {
		for _, parse := range []func(string) (Token, error){ParseToken, bearerToken} {
			tok, err := parse(s)
			if err != nil {
				if !refusals[err.Error()] {
					t.Fatalf("%q refused in a sentence of its own: %v", s, err)
				}
				continue
			}
			if tok.MeshID == "" || tok.CADigest == "" || tok.Secret == "" || tok.Until < 0 {
				t.Fatalf("%q accepted as a token that is not whole: %+v", s, tok)
			}
			if !strings.Contains(s, tokenPrefix) {
				t.Fatalf("%q accepted without %s", s, tokenPrefix)
			}
			again, err := ParseToken(tok.String())
			if err != nil || again != tok {
				t.Fatalf("%q: %+v encodes to %s, read back as %+v, %v", s, tok, tok.String(), again, err)
			}
		}
	})
}
