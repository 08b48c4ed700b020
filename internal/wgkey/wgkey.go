// Package wgkey is a node's WireGuard key pair in its data dir: made at
// mesh init or mesh join, kept 0600 and never sent anywhere; only its
// public half goes into the replicated state.
package wgkey

import (
	"crypto/rand"
	"encoding/base64"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"golang.org/x/crypto/curve25519"

	"mesh/internal/safefs"
)

// File is the node's overlay key in its data dir.
const File = "overlay.key"

// Key is a Curve25519 key pair, as WireGuard uses it.
type Key struct {
	private [32]byte
	public  [32]byte
}

// Public is the public key, base64 (as `wg` writes it).
func (k *Key) Public() string { return base64.StdEncoding.EncodeToString(k.public[:]) }

// PrivateHex is the private key in hex, as WireGuard's configuration
// protocol takes it.
func (k *Key) PrivateHex() string { return hex.EncodeToString(k.private[:]) }

// PublicHex turns a base64 public key into hex, checking it. Only the one
// spelling Public writes is taken: base64 spells a key several ways (the
// last character's unused bits, line breaks), and the state tells one
// node's key from another's by its string, so another spelling would let a
// second node hold a key that is already taken.
func PublicHex(b64 string) (string, error) {
	b, err := base64.StdEncoding.DecodeString(b64)
	if err != nil || len(b) != 32 || base64.StdEncoding.EncodeToString(b) != b64 {
		return "", fmt.Errorf("%q is not a WireGuard public key (32 bytes, base64)", b64)
	}
	return hex.EncodeToString(b), nil
}

// Generate makes a new key pair.
func Generate() (*Key, error) {
	var k Key
	if _, err := rand.Read(k.private[:]); err != nil {
		return nil, err
	}
	// Clamped as RFC 7748 (and wg genkey) do.
	k.private[0] &= 248
	k.private[31] = (k.private[31] & 127) | 64
	return k.derive()
}

func (k *Key) derive() (*Key, error) {
	pub, err := curve25519.X25519(k.private[:], curve25519.Basepoint)
	if err != nil {
		return nil, err
	}
	copy(k.public[:], pub)
	return k, nil
}

// Load reads the node's key from dir.
func Load(dir string) (*Key, error) {
	p := filepath.Join(dir, File)
	b, err := os.ReadFile(p)
	if err != nil {
		return nil, err
	}
	raw, err := base64.StdEncoding.DecodeString(strings.TrimSpace(string(b)))
	if err != nil || len(raw) != 32 {
		return nil, fmt.Errorf("%s is not a WireGuard private key; the node's overlay address and its peers' trust go with it: restore it from a backup of the data dir", p)
	}
	var k Key
	copy(k.private[:], raw)
	return k.derive()
}

// LoadOrCreate reads the node's key from dir, making one (0600, written
// whole before it is renamed into place) when there is none.
func LoadOrCreate(dir string) (*Key, error) {
	k, err := Load(dir)
	if !errors.Is(err, os.ErrNotExist) {
		return k, err
	}
	if k, err = Generate(); err != nil {
		return nil, fmt.Errorf("generate the overlay key: %w", err)
	}
	if err := safefs.WriteFile(filepath.Join(dir, File), []byte(base64.StdEncoding.EncodeToString(k.private[:])+"\n"), 0o600); err != nil {
		return nil, fmt.Errorf("write the overlay key: %w", err)
	}
	return k, nil
}
