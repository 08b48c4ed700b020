package api

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"slices"
	"time"

	"mesh/state"
)

// Backups of a module's data with restic (issue 30, item 2). The local
// API's /v1/backup runs one on the node(s) holding the module's data, this
// one's own or another's through its peer API, and streams its progress as
// NDJSON events, the last one its result or its error.

// Backup ops.
const (
	BackupRun     = "backup"
	BackupRestore = "restore"
	BackupList    = "list"
	// BackupSize measures the module's data directories (mesh move
	// --dry-run).
	BackupSize = "size"
)

// BackupRequest asks for a backup, a restore or a list of snapshots.
type BackupRequest struct {
	Op     string `json:"op"`
	Module string `json:"module"`
	// Node, when set, is the one node to run it on.
	Node string `json:"node,omitempty"`
	// Snapshot is the snapshot a restore restores ("" the module's latest).
	Snapshot string `json:"snapshot,omitempty"`
	// By is who asked, for the record (the CLI's node).
	By string `json:"by,omitempty"`
}

// BackupEvent is one line of the stream: progress, or the end (Result or
// Error) of one node's run.
type BackupEvent struct {
	Node     string        `json:"node"`
	Progress string        `json:"progress,omitempty"`
	Result   *BackupResult `json:"result,omitempty"`
	Error    string        `json:"error,omitempty"`
}

// BackupResult is what one node's backup, restore or list did.
type BackupResult struct {
	Module string `json:"module"`
	Node   string `json:"node"`
	// Snapshot is the snapshot made (backup) or restored (restore).
	Snapshot string   `json:"snapshot,omitempty"`
	Dirs     []string `json:"dirs,omitempty"`
	// Backup's figures.
	Files    int    `json:"files,omitempty"`
	Bytes    int64  `json:"bytes,omitempty"`
	Added    int64  `json:"added,omitempty"`
	Duration string `json:"duration,omitempty"`
	// Forgotten are the snapshots keep: pruned after it.
	Forgotten []string `json:"forgotten,omitempty"`
	// Warning is what a backup that succeeded says the operator should
	// know: it read with links under the data directories followable,
	// while the module's containers ran (no pause:).
	Warning string `json:"warning,omitempty"`
	// Restore's: the containers it stopped (the node's next apply starts
	// them) and where each data directory's content before it is kept.
	Stopped []string          `json:"stopped,omitempty"`
	Kept    map[string]string `json:"kept,omitempty"`
	// StoppedAt is when the node had them stopped, on its clock: the
	// apply that starts them again is one its report says began after
	// (a report of before, of containers created then, is not it).
	StoppedAt time.Time `json:"stopped_at,omitzero"`
	// Created says the repository was initialised by this backup.
	Created bool `json:"created,omitempty"`
	// Snapshots is a list's answer, oldest first.
	Snapshots []Snapshot `json:"snapshots,omitempty"`
}

// Snapshot is one restic snapshot of a module.
type Snapshot struct {
	ID       string    `json:"id"`
	Time     time.Time `json:"time"`
	Node     string    `json:"node"`
	Plan     string    `json:"plan,omitempty"`
	Manifest string    `json:"manifest,omitempty"`
	Paths    []string  `json:"paths"`
}

// Backup runs req through the local agent, calling each for every event.
func (c *Client) Backup(ctx context.Context, req BackupRequest, each func(BackupEvent) error) error {
	b, err := json.Marshal(req)
	if err != nil {
		return err
	}
	hr, err := http.NewRequestWithContext(ctx, http.MethodPost, "http://mesh/v1/backup", bytes.NewReader(b))
	if err != nil {
		return err
	}
	hr.Header.Set("Content-Type", "application/json")
	resp, err := c.Streams().Do(hr)
	if err != nil {
		return fmt.Errorf("ask the local agent: %w", err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return errors.New(ErrorBody(resp))
	}
	return ReadBackupEvents(resp.Body, "the local agent", each)
}

// ReadBackupEvents reads a stream of events from who.
func ReadBackupEvents(r interface{ Read([]byte) (int, error) }, who string, each func(BackupEvent) error) error {
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 64<<10), MaxRecord)
	for sc.Scan() {
		var ev BackupEvent
		if err := json.Unmarshal(sc.Bytes(), &ev); err != nil {
			return fmt.Errorf("%s sent a bad event: %w", who, err)
		}
		if err := each(ev); err != nil {
			return err
		}
	}
	if err := sc.Err(); err != nil {
		return fmt.Errorf("the stream from %s broke: %w", who, err)
	}
	return nil
}

// RepoSet is the body of mesh backup repo set.
type RepoSet struct {
	URL      string `json:"url"`
	Password []byte `json:"password"`
}

// RepoWrite is what a repo set answers.
type RepoWrite struct {
	WriteResult
	SealedTo []string `json:"sealed_to,omitempty"`
}

// setBackupRepo seals the password to every node and proposes the
// repository (the FSM refuses it if the nodes changed meanwhile).
func (a *API) setBackupRepo(w http.ResponseWriter, r *http.Request) {
	var body RepoSet
	if err := decode(r, &body); err != nil {
		fail(w, err)
		return
	}
	if err := state.CheckRepoURL(body.URL); err != nil {
		fail(w, err)
		return
	}
	if err := state.CheckRepoPassword(body.URL); err != nil {
		fail(w, err)
		return
	}
	switch {
	case len(body.Password) == 0:
		fail(w, &state.RuleError{Kind: state.ErrInvalid, Msg: "the repository's password is empty; give it with --password-file"})
		return
	case len(body.Password) > state.MaxSecretSize:
		fail(w, &state.RuleError{Kind: state.ErrInvalid, Msg: "the repository's password is larger than 1 MiB"})
		return
	}
	set, t, err := a.sealSecret(r.Context(), state.BackupPassword, body.Password)
	if err != nil {
		fail(w, err)
		return
	}
	req := &state.BackupRepoSetRequest{URL: body.URL, Password: *set}
	res := RepoWrite{SealedTo: slices.Sorted(slices.Values(t.Nodes))}
	if err := a.writeInto(r, req, &res.WriteResult); err != nil {
		fail(w, err)
		return
	}
	reply(w, res)
}

func (a *API) backupRepo(w http.ResponseWriter, r *http.Request) {
	repo, err := a.store.BackupRepo(r.Context())
	if err != nil {
		fail(w, err)
		return
	}
	repo.URL = state.RedactRepoURL(repo.URL)
	reply(w, repo)
}

// SetBackupRepo sets the mesh's backup repository.
func (c *Client) SetBackupRepo(ctx context.Context, url string, password []byte) (RepoWrite, error) {
	var res RepoWrite
	return res, c.do(ctx, "PUT", "/v1/backup/repo", RepoSet{URL: url, Password: password}, &res)
}

// BackupRepo reads the mesh's backup repository.
func (c *Client) BackupRepo(ctx context.Context) (state.BackupRepo, error) {
	var res state.BackupRepo
	return res, c.do(ctx, "GET", "/v1/backup/repo", nil, &res)
}

// moveModule starts a move (mesh move MODULE FROM TO).
func (a *API) moveModule(w http.ResponseWriter, r *http.Request) {
	var req state.ModuleMoveRequest
	if err := decode(r, &req); err != nil {
		fail(w, err)
		return
	}
	a.write(w, r, &req)
}

// moveStep aborts a move or finishes one (mesh move --abort, --finish).
func (a *API) moveStep(w http.ResponseWriter, r *http.Request) {
	var req state.MoveStepRequest
	if err := decode(r, &req); err != nil {
		fail(w, err)
		return
	}
	req.Module = r.PathValue("module")
	// The operator ends a move, or finishes one; its other steps are the
	// agents' (a start proposed here would skip the copy).
	if !req.Finish && req.To != state.MoveAborted {
		fail(w, &state.RuleError{Kind: state.ErrInvalid, Msg: "a move is only aborted or finished from the command line (mesh move --abort|--finish MODULE)"})
		return
	}
	a.write(w, r, &req)
}

// MoveModule starts moving module from one node to another (a preview on
// a DryRun client).
func (c *Client) MoveModule(ctx context.Context, module, from, to string) (WriteResult, error) {
	var res WriteResult
	return res, c.do(ctx, "POST", "/v1/moves", state.ModuleMoveRequest{Module: module, From: from, To: to}, &res)
}

// MoveStep takes a module's move to its next phase (abort, finish).
func (c *Client) MoveStep(ctx context.Context, req state.MoveStepRequest) (WriteResult, error) {
	var res WriteResult
	return res, c.do(ctx, "POST", "/v1/moves/"+url.PathEscape(req.Module)+"/step", req, &res)
}
