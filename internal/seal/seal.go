// Package seal seals secrets to nodes: each node holds an age X25519
// identity in its data dir, the replicated state holds each node's public
// recipient, and a secret is stored only as ciphertext that the nodes it is
// sealed to can open (DESIGN.md rule 7). Other nodes replicate the
// ciphertext and the digest, never the secret.
package seal

import (
	"bytes"
	"encoding/base64"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"

	"filippo.io/age"

	"mesh/internal/safefs"
)

// IdentityFile is the node's sealing key in its data dir (0600).
const IdentityFile = "seal.key"

// Identity is a node's private sealing key.
type Identity struct{ id *age.X25519Identity }

// Recipient is the public key that others seal to ("age1...").
func (i *Identity) Recipient() string { return i.id.Recipient().String() }

// LoadOrCreate reads the node's identity from dir, making one (0600,
// written whole before it is renamed into place) when there is none.
func LoadOrCreate(dir string) (*Identity, error) {
	path := filepath.Join(dir, IdentityFile)
	b, err := os.ReadFile(path)
	if err == nil {
		id, err := age.ParseX25519Identity(strings.TrimSpace(string(b)))
		if err != nil {
			return nil, fmt.Errorf("%s is not an age identity (%v): what the mesh sealed to this node opens only with the key it held; put it back from a backup of the data dir (a node the mesh does not know yet makes a new one once it is moved aside)", path, err)
		}
		return &Identity{id}, nil
	}
	if !errors.Is(err, os.ErrNotExist) {
		return nil, err
	}
	id, err := age.GenerateX25519Identity()
	if err != nil {
		return nil, fmt.Errorf("generate a sealing key: %w", err)
	}
	// Written as the mesh writes its own files (safefs.WriteFile): to a
	// temporary name of its own made 0600, renamed, and the directory
	// synced, so a kill or a power cut leaves the key or nothing.
	if err := safefs.WriteFile(path, []byte(id.String()+"\n"), 0o600); err != nil {
		return nil, fmt.Errorf("write the sealing key %s: %w", path, err)
	}
	return &Identity{id}, nil
}

// CheckRecipient says whether s is a recipient a secret can be sealed to.
func CheckRecipient(s string) error {
	_, err := age.ParseX25519Recipient(s)
	return err
}

// Seal encrypts secret to every recipient; the result is printable.
func Seal(secret string, recipients []string) (string, error) {
	if len(recipients) == 0 {
		return "", errors.New("seal a secret: no recipient")
	}
	var rs []age.Recipient
	for _, s := range recipients {
		r, err := age.ParseX25519Recipient(s)
		if err != nil {
			return "", fmt.Errorf("seal a secret: recipient %q: %w", s, err)
		}
		rs = append(rs, r)
	}
	var buf bytes.Buffer
	w, err := age.Encrypt(&buf, rs...)
	if err != nil {
		return "", fmt.Errorf("seal a secret: %w", err)
	}
	if _, err := io.WriteString(w, secret); err != nil {
		return "", err
	}
	if err := w.Close(); err != nil {
		return "", err
	}
	return base64.StdEncoding.EncodeToString(buf.Bytes()), nil
}

// ErrNotForUs: the secret is sealed to other nodes.
var ErrNotForUs = errors.New("the secret is sealed to other nodes")

// Open decrypts a sealed secret with the node's identity.
func (i *Identity) Open(sealed string) (string, error) {
	b, err := base64.StdEncoding.DecodeString(sealed)
	if err != nil {
		return "", fmt.Errorf("the sealed secret is damaged: %w", err)
	}
	r, err := age.Decrypt(bytes.NewReader(b), i.id)
	if err != nil {
		var nm *age.NoIdentityMatchError
		if errors.As(err, &nm) {
			return "", ErrNotForUs
		}
		return "", fmt.Errorf("the sealed secret does not open: %w", err)
	}
	out, err := io.ReadAll(io.LimitReader(r, 1<<20))
	if err != nil {
		return "", fmt.Errorf("the sealed secret does not open: %w", err)
	}
	return string(out), nil
}
