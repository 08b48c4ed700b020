package reconciler

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
)

// Ledger is node-local: what the mesh put where, and each step's marker. It is
// never replicated, so a snapshot restore of the state cannot touch it.
type Ledger struct {
	// Paths maps every path the mesh created or wrote to what it put there.
	Paths map[string]PathEntry `json:"paths"`
	// Markers maps MODULE.STEP to the digest the step last succeeded with.
	Markers map[string]Marker `json:"markers"`

	path  string
	saved []byte
}

// PathEntry is one path the mesh owns.
type PathEntry struct {
	Kind   string `json:"kind"`
	Module string `json:"module"`
	// Digest of the content the mesh wrote (files); empty for directories.
	Digest string `json:"digest,omitempty"`
}

// Marker is a step's last successful run: its digest and what went into it,
// so a rerun can say which input moved.
type Marker struct {
	Digest string            `json:"digest"`
	Decl   string            `json:"decl"`
	Inputs map[string]string `json:"inputs,omitempty"`
}

// LoadLedger reads the ledger at path; a missing file is an empty ledger.
func LoadLedger(path string) (*Ledger, error) {
	l := &Ledger{Paths: map[string]PathEntry{}, Markers: map[string]Marker{}, path: path}
	b, err := os.ReadFile(path)
	if errors.Is(err, os.ErrNotExist) {
		return l, nil
	}
	if err != nil {
		return nil, fmt.Errorf("read ledger: %w", err)
	}
	if err := json.Unmarshal(b, l); err != nil {
		return nil, fmt.Errorf("ledger %s is damaged (%v); move it aside to start afresh, and the mesh will keep, not remove, what it no longer knows it wrote", path, err)
	}
	if l.Paths == nil {
		l.Paths = map[string]PathEntry{}
	}
	if l.Markers == nil {
		l.Markers = map[string]Marker{}
	}
	l.saved = b
	return l, nil
}

// Save writes the ledger atomically, and only when it changed.
func (l *Ledger) Save() error {
	b, err := json.MarshalIndent(l, "", "  ")
	if err != nil {
		return err
	}
	if bytes.Equal(b, l.saved) {
		return nil
	}
	dir := filepath.Dir(l.path)
	f, err := os.CreateTemp(dir, ".ledger-*")
	if err != nil {
		return fmt.Errorf("write ledger: %w", err)
	}
	defer os.Remove(f.Name())
	if _, err := f.Write(b); err != nil {
		f.Close()
		return fmt.Errorf("write ledger: %w", err)
	}
	if err := f.Sync(); err != nil {
		f.Close()
		return fmt.Errorf("write ledger: %w", err)
	}
	if err := f.Close(); err != nil {
		return err
	}
	if err := os.Rename(f.Name(), l.path); err != nil {
		return fmt.Errorf("write ledger: %w", err)
	}
	l.saved = b
	return nil
}
