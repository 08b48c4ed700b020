package reconciler

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"time"

	"mesh/internal/safefs"
)

// Ledger is node-local: what the mesh put where, and each step's marker. It is
// never replicated, so a snapshot restore of the state cannot touch it.
//
// Every change is written through before the mutation it describes (a path)
// or right after it (a step's marker), so a kill -9 at any line leaves a
// ledger that still knows everything the mesh made: a path recorded but never
// made is simply absent, and a step whose marker was written never reruns.
type Ledger struct {
	// Paths maps every path the mesh created or wrote to what it put there.
	Paths map[string]PathEntry `json:"paths"`
	// Markers maps MODULE.STEP to the digest the step last succeeded with.
	Markers map[string]Marker `json:"markers"`
	// Pulled maps a container to the `mesh module pull` (its log index) it
	// last handled.
	Pulled map[string]uint64 `json:"pulled,omitempty"`
	// Restarted maps a container to the `mesh restart` (its log index) it
	// handled last.
	Restarted map[string]uint64 `json:"restarted,omitempty"`
	// PrePull maps a container that a `mesh module pull` replaced to the
	// image it ran before (issue 29): a pull's rollout that is reverted
	// puts that image back under the name.
	PrePull map[string]PrePull `json:"pre_pull,omitempty"`
	// Schedules maps a scheduled step (MODULE.STEP) to its runs.
	Schedules map[string]Scheduled `json:"schedules,omitempty"`
	// Arriving maps a module a move brought here (Adopt) to when its
	// markers stop being kept without the module in the plan: until its
	// start reaches this node the plan holds nothing of it, and an apply
	// meanwhile (a resync, another module's change) must not forget the
	// runs of its steps, or they run again on the data they ran on.
	Arriving map[string]Arrival `json:"arriving,omitempty"`

	path  string
	saved []byte
}

// Arrival is a move's copy swapped in here whose start has not reached the
// node yet (Ledger.Arriving).
type Arrival struct {
	// Move is the move's ID (the index of its module.move).
	Move uint64 `json:"move"`
	// Until is when its markers stop being kept without the module in
	// the plan (the move can no longer start).
	Until time.Time `json:"until"`
	// Aside is where the copy set what each data directory held before
	// (directory -> where), for a copy of the same move tried again.
	Aside map[string]string `json:"aside,omitempty"`
}

// PrePull is the image a container ran before the pull at Index.
type PrePull struct {
	Index   uint64 `json:"index"`
	ImageID string `json:"image_id"`
}

// PathEntry is one path the mesh owns.
type PathEntry struct {
	Kind   string `json:"kind"`
	Module string `json:"module"`
	// Digest of the content the mesh wrote (files); empty for directories.
	Digest string `json:"digest,omitempty"`
	// Prev is the digest of what the file held before the write that Digest
	// records; until that write is known to be done, either is the mesh's.
	Prev string `json:"prev,omitempty"`
	// Original is set when the mesh took over a file it did not write: the
	// original bytes are kept aside and put back when the module lets go.
	Original *Original `json:"original,omitempty"`
	// Data marks a directory its module declares as data: kept when the
	// module goes, even empty, until an unassign with --purge-data.
	Data bool `json:"data,omitempty"`
}

// Original is a file that was there before the mesh took it over.
type Original struct {
	// Kept is where its bytes are, in the node's data dir.
	Kept   string `json:"kept"`
	Digest string `json:"digest"`
	UID    int    `json:"uid"`
	GID    int    `json:"gid"`
	Mode   uint32 `json:"mode"`
}

// Marker is a step's last successful run: its digest and what went into it,
// so a rerun can say which input moved.
// Scheduled is a scheduled step's runs on this node (issue 30): its next
// slot, and how its last run went.
type Scheduled struct {
	Next   time.Time `json:"next"`
	Last   time.Time `json:"last,omitzero"`
	OK     bool      `json:"ok"`
	Reason string    `json:"reason,omitempty"`
	// Schedule is the schedule Next was computed from: a changed one
	// starts over.
	Schedule string `json:"schedule"`
}

type Marker struct {
	Digest string            `json:"digest"`
	Decl   string            `json:"decl"`
	Inputs map[string]string `json:"inputs,omitempty"`
}

// LoadLedger reads the ledger at path; a missing file is an empty ledger.
func LoadLedger(path string) (*Ledger, error) {
	l := &Ledger{Paths: map[string]PathEntry{}, Markers: map[string]Marker{}, Pulled: map[string]uint64{}, path: path}
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
	if l.Pulled == nil {
		l.Pulled = map[string]uint64{}
	}
	if l.Restarted == nil {
		l.Restarted = map[string]uint64{}
	}
	l.saved = b
	return l, nil
}

// Save writes the ledger atomically and durably, and only when it changed.
func (l *Ledger) Save() error {
	b, err := json.MarshalIndent(l, "", "  ")
	if err != nil {
		return err
	}
	if string(b) == string(l.saved) {
		return nil
	}
	if err := safefs.WriteFile(l.path, b, 0o600); err != nil {
		return fmt.Errorf("write ledger: %w", err)
	}
	l.saved = b
	return nil
}

// Put records a path and saves, before the caller makes or writes it. When
// the save fails (a full disk), the caller does not make the path, so the
// entry is taken back: the ledger in memory never claims more than the one
// on disk, and a later save must not record a path the mesh never made.
func (l *Ledger) Put(path string, e PathEntry) error {
	old, had := l.Paths[path]
	l.Paths[path] = e
	if err := l.Save(); err != nil {
		if had {
			l.Paths[path] = old
		} else {
			delete(l.Paths, path)
		}
		return err
	}
	return nil
}

// Drop forgets a path and saves, after the caller removed it.
func (l *Ledger) Drop(path string) error {
	delete(l.Paths, path)
	return l.Save()
}

// Mark records a step's successful run and saves.
func (l *Ledger) Mark(name string, m Marker) error {
	l.Markers[name] = m
	return l.Save()
}

// MarkRestarted records that container name handled the restart at index.
func (l *Ledger) MarkRestarted(name string, index uint64) {
	if l.Restarted == nil {
		l.Restarted = map[string]uint64{}
	}
	l.Restarted[name] = index
}

// SetPrePull records the image a container ran before a pull replaced it.
func (l *Ledger) SetPrePull(name string, p PrePull) {
	if l.PrePull == nil {
		l.PrePull = map[string]PrePull{}
	}
	l.PrePull[name] = p
}

// UndoPull records that a container's last pull was taken back: it has
// handled the pull at index (0: none) and its previous image is back.
func (l *Ledger) UndoPull(name string, index uint64) {
	delete(l.PrePull, name)
	if index == 0 {
		delete(l.Pulled, name)
		return
	}
	l.MarkPulled(name, index)
}

// MarkPulled records that container name handled the module pull at index
// (saved with the apply's ledger).
func (l *Ledger) MarkPulled(name string, index uint64) {
	if l.Pulled == nil {
		l.Pulled = map[string]uint64{}
	}
	l.Pulled[name] = index
}
