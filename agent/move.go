package agent

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"mesh/internal/datacopy"
	"mesh/internal/safefs"
	"mesh/reconciler"
	"mesh/state"
	"mesh/state/manifest"
)

// Moves of a module with its data (issue 30, item 4; state/move.go): the
// agents drive them from the replicated state, so a kill of either end, of
// the CLI or of the leader leaves a move where it was and it goes on.
// FROM's agent, once its plan holds the module stopped, copies the data
// directories to TO's over the peer API (holding its node: no apply
// meanwhile) and proposes the start; a copy that fails moveTries times
// proposes the abort, and the module runs on FROM again as before. TO's
// agent writes the copy beside each directory, checks its digest, swaps it
// in (what was there is kept aside), takes FROM's step markers, and, once
// the module applied there and its health checks pass, proposes done; a
// failure there proposes the abort.

// moveTries is how many times a copy is tried before the move is aborted;
// moveBackoff the first wait between tries (doubling).
const (
	moveTries   = 5
	moveBackoff = 3 * time.Second
	moveEvery   = 2 * time.Second
	// moveLimit bounds a move without its CLI: FROM aborts one whose phase
	// has not changed for that long (the CLI's --timeout aborts sooner).
	moveLimit = 2 * time.Hour
	// moveIdle ends a copy whose stream carried nothing for that long (a
	// sender or receiver that stalled), freeing both nodes.
	moveIdle = time.Minute
	// moveSettle is how long TO's containers without a health check run,
	// without an exit, before the move is done.
	moveSettle = 10 * time.Second
)

// Suffixes of a move's directories on TO: the copy while it is written,
// and what was at the path before the copy was swapped in.
const (
	moveStaging = ".mesh-moving"
	moveAside   = ".mesh-before-move"
	// moveStale is an earlier copy of the same move, replaced by the
	// copy tried again (swapCopiesIn), until it is removed.
	moveStale = ".mesh-moved-before"
)

// moveResult is what TO answers a copy with.
type moveResult struct {
	Summary datacopy.Summary  `json:"summary"`
	Aside   map[string]string `json:"aside,omitempty"`
}

// moveMeta travels with the data: FROM's markers of the module's steps.
type moveMeta struct {
	Markers map[string]reconciler.Marker `json:"markers"`
}

type movers struct {
	a       *Agent
	mu      sync.Mutex
	copying map[uint64]bool // the moves whose copy runs here now
	logged  map[uint64]string
	swept   map[uint64]bool // the started moves whose replaced copies were looked for
	// removing are the staging directories being removed (sweepStaging).
	removing map[string]bool
	// owner is the module the ledger gives a path, or one under it, to
	// ("" if none), read while no apply writes the ledger (ownerOf).
	owner func(ctx context.Context, p string) (string, error)
}

// ownerOf is movers.owner for the node's reconciler: a path beside a data
// directory that a module's manifest declares (a hostile one may name
// /srv/db.mesh-moving) is that module's, and never removed as a leftover
// of a move.
func (a *Agent) ownerOf(ctx context.Context, p string) (string, error) {
	var owner string
	err := a.reconciler.Exclusive(ctx, func(context.Context) error {
		owner = a.reconciler.OwnerAt(p)
		return nil
	})
	return owner, err
}

// driveMoves runs this node's part of every move, until ctx ends.
func (a *Agent) driveMoves(ctx context.Context) {
	<-a.backups.ready
	m := &movers{a: a, copying: map[uint64]bool{}, logged: map[uint64]string{}, swept: map[uint64]bool{}, removing: map[string]bool{}, owner: a.ownerOf}
	store := a.member.Store
	for nextChange(ctx, store, moveEvery) {
		moves, err := store.Moves(ctx, "")
		if err != nil {
			continue
		}
		m.forget(moves)
		for _, mv := range moves {
			if (mv.Phase == state.MoveCopy || mv.Phase == state.MoveStart) && mv.From == a.member.ID.Name && time.Since(mv.Since) > moveLimit {
				m.step(ctx, mv, state.MoveAborted, fmt.Sprintf("it was at %s for more than %s", mv.Phase, moveLimit))
				continue
			}
			switch {
			case mv.Phase == state.MoveCopy && mv.From == a.member.ID.Name:
				m.mu.Lock()
				busy := m.copying[mv.ID]
				m.copying[mv.ID] = true
				m.mu.Unlock()
				if !busy {
					go m.copyOut(ctx, mv)
				}
			case mv.Phase == state.MoveStart && mv.To == a.member.ID.Name:
				m.checkStarted(ctx, mv)
			}
			if mv.Phase != state.MoveCopy && mv.To == a.member.ID.Name {
				m.sweepStaging(ctx, mv)
			}
		}
	}
}

// sweepStaging removes what a copy into this node left at its staging
// paths once the move is past its copy (TO's agent killed while it wrote
// one, the move then aborted): receive removes it only before a copy of
// the same module, so a move that was not tried again kept a partial
// copy of its data for good. Removed aside from the loop (a large copy
// takes a while).
func (m *movers) sweepStaging(ctx context.Context, mv state.MoveInfo) {
	for _, d := range mv.Data {
		p := d + moveStaging
		if d != filepath.Clean(d) || !filepath.IsAbs(d) {
			continue
		}
		if _, err := os.Lstat(p); err != nil {
			continue
		}
		m.mu.Lock()
		busy := m.removing[p]
		m.removing[p] = true
		m.mu.Unlock()
		if busy {
			continue
		}
		go func() {
			defer func() {
				m.mu.Lock()
				delete(m.removing, p)
				m.mu.Unlock()
			}()
			// No copy is written into this node meanwhile (receive holds
			// moveMu for its whole run): a new move of the module writes
			// its copy at this same path, and a removal going on under it
			// would take files of the new copy.
			m.a.moveMu.Lock()
			defer m.a.moveMu.Unlock()
			if _, err := os.Lstat(p); err != nil {
				return // a copy since removed it, or swapped it in
			}
			if owner, err := m.owner(ctx, p); err != nil || owner != "" {
				if owner != "" {
					m.a.log.Warn("move: a staging path is a module's: left", "module", mv.Module, "path", p, "owner", owner)
				}
				return
			}
			err := os.RemoveAll(p)
			if err != nil {
				m.a.log.Warn("move: a copy cut short here cannot be removed", "module", mv.Module, "path", p, "err", err)
			} else {
				m.a.log.Info("move: removed a copy cut short here", "module", mv.Module, "path", p, "phase", mv.Phase)
			}
		}()
	}
}

// forget drops what the loop keeps of the moves no longer copying or
// starting (all of them but these), so that an agent that runs for years
// keeps an entry for none of its past moves.
func (m *movers) forget(moves []state.MoveInfo) {
	live := map[uint64]bool{}
	for _, mv := range moves {
		if mv.Phase == state.MoveCopy || mv.Phase == state.MoveStart {
			live[mv.ID] = true
		}
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	maps.DeleteFunc(m.logged, func(id uint64, _ string) bool { return !live[id] })
	maps.DeleteFunc(m.swept, func(id uint64, _ bool) bool { return !live[id] })
}

// step proposes a move's next phase.
func (m *movers) step(ctx context.Context, mv state.MoveInfo, to, reason string) error {
	pctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	req := &state.MoveStepRequest{Module: mv.Module, ID: mv.ID, From: mv.Phase, To: to, Reason: reason}
	if _, err := m.a.member.Node.Propose(pctx, req); err != nil {
		m.a.log.Warn("move step not taken", "module", mv.Module, "to", to, "err", err)
		return err
	}
	m.a.log.Info("move step", "module", mv.Module, "from", mv.From, "to_node", mv.To, "phase", to, "reason", reason)
	return nil
}

// copyOut is FROM's side: the copy, tried again after a failure, then the
// start or the abort.
func (m *movers) copyOut(ctx context.Context, mv state.MoveInfo) {
	defer func() {
		m.mu.Lock()
		delete(m.copying, mv.ID)
		m.mu.Unlock()
	}()
	wait := moveBackoff
	var last error
	for try := 1; try <= moveTries; try++ {
		if !m.stillAt(ctx, mv) {
			return
		}
		began := time.Now()
		res, err := m.send(ctx, mv)
		if ctx.Err() != nil {
			return
		}
		if err == nil {
			note := fmt.Sprintf("copied %d files (%s) to %s in %s, digest %s", res.Summary.Files, size(res.Summary.Bytes), mv.To, time.Since(began).Round(time.Millisecond), short(res.Summary.Digest))
			for _, d := range slices.Sorted(maps.Keys(res.Aside)) {
				note += fmt.Sprintf("; what %s held at %s is kept as %s", mv.To, d, res.Aside[d])
			}
			if len(res.Summary.Skipped) > 0 {
				note += "; not copied: " + strings.Join(res.Summary.Skipped, ", ")
			}
			m.a.log.Info("move copied", "module", mv.Module, "to", mv.To, "note", note)
			m.start(ctx, mv, note)
			return
		}
		last = err
		if errors.Is(err, errNotMovable) {
			// Trying again changes nothing, and the module is held
			// stopped meanwhile: the move is aborted at once.
			if m.stillAt(ctx, mv) {
				m.step(ctx, mv, state.MoveAborted, err.Error())
			}
			return
		}
		m.a.log.Warn("move: the copy failed; trying again", "module", mv.Module, "to", mv.To, "try", try, "err", err)
		select {
		case <-ctx.Done():
			return
		case <-time.After(wait):
		}
		wait *= 2
	}
	if m.stillAt(ctx, mv) {
		m.step(ctx, mv, state.MoveAborted, fmt.Sprintf("the copy to %s failed %d times; the last: %v", mv.To, moveTries, last))
	}
}

// start proposes the start once the copy is on TO: tried again while the
// leader cannot be reached, never by copying again; a start the state
// refuses (TO began draining, say) aborts the move.
func (m *movers) start(ctx context.Context, mv state.MoveInfo, note string) {
	wait := moveBackoff
	for try := 1; ; try++ {
		err := m.step(ctx, mv, state.MoveStart, note)
		var rule *state.RuleError
		switch {
		case err == nil || !m.stillAt(ctx, mv):
			return
		case errors.As(err, &rule) || try == moveTries:
			m.step(ctx, mv, state.MoveAborted, fmt.Sprintf("the copy is on %s, but its start was not taken: %v", mv.To, err))
			return
		}
		select {
		case <-ctx.Done():
			return
		case <-time.After(wait):
		}
		wait *= 2
	}
}

// stillAt says whether mv is still the module's move, at its phase (not
// when the state cannot be read).
func (m *movers) stillAt(ctx context.Context, mv state.MoveInfo) bool {
	still, err := moveStill(ctx, m.a.member.Store, mv.Module, mv.ID, mv.Phase)
	return err == nil && still
}

// moveStill says whether move id is still module's move, at phase.
func moveStill(ctx context.Context, st *state.Store, module string, id uint64, phase string) (bool, error) {
	l, err := st.Moves(ctx, module)
	if err != nil {
		return false, err
	}
	return len(l) == 1 && l[0].ID == id && l[0].Phase == phase, nil
}

// errNotMovable: FROM does not send the module, and trying again changes
// nothing (copyOut aborts the move at once).
var errNotMovable = errors.New("not moved")

// send stops the module here and streams its data directories to TO,
// holding the node so that no apply starts anything of it meanwhile.
func (m *movers) send(ctx context.Context, mv state.MoveInfo) (moveResult, error) {
	var res moveResult
	a := m.a
	addr := a.member.Node.PeerAddr(mv.To)
	if addr == "" {
		return res, fmt.Errorf("no address is known for %s", mv.To)
	}
	// What the host does not touch for a module is not sent either: a
	// manifest that names this node's data dir (which the state cannot
	// know) would have its keys and state copied to TO.
	for _, d := range mv.Data {
		if why := a.reconciler.RefusedPath(d); why != "" {
			return res, fmt.Errorf("%w: data directory %s is not sent: %s", errNotMovable, d, why)
		}
	}
	if a.backups.holds(mv.Module) {
		return res, fmt.Errorf("%w: %s is held stopped here: a restore of it failed and could not be put back, and its journal stays (the agent's log says where each copy is); it is not moved on a mix", errNotMovable, mv.Module)
	}
	// Holding the node only to stop the module and read its markers: the
	// plan holds none of its containers or steps from the copy on, so no
	// apply starts anything of it, and no node waits on another's copy (two
	// moves the other way round would hold each other for ever).
	var meta []byte
	err := a.reconciler.Exclusive(ctx, func(ctx context.Context) error {
		// The module is stopped in the plan; what of it still runs goes.
		if stopped, err := a.reconciler.StopAll(ctx, mv.Module); err != nil {
			return fmt.Errorf("stop %s here: %w", mv.Module, err)
		} else if len(stopped) > 0 {
			a.log.Info("move: stopped", "module", mv.Module, "containers", stopped)
		}
		var err error
		meta, err = json.Marshal(moveMeta{Markers: a.reconciler.MarkersOf(mv.Module)})
		return err
	})
	if err != nil {
		return res, err
	}
	for _, d := range mv.Data {
		if fi, err := os.Lstat(d); err != nil || !fi.IsDir() {
			return res, fmt.Errorf("data directory %s is not a directory here: %v", d, errOr(err, "not a directory"))
		}
	}
	err = func() error {
		ctx, cancel := context.WithCancel(ctx)
		defer cancel()
		pr, pw := io.Pipe()
		sent := make(chan error, 1)
		var sum datacopy.Summary
		// TO reads as fast as it writes: a stream that takes nothing for
		// moveIdle is a TO that stalled.
		stall := time.AfterFunc(moveIdle, cancel)
		go func() {
			var err error
			sum, err = datacopy.Send(ctx, &idle{w: pw, t: stall}, mv.Data, meta)
			stall.Stop() // TO checks what it wrote now: that takes its time
			pw.CloseWithError(err)
			sent <- err
		}()
		// What the data takes here: TO refuses a copy it has not the
		// room for before anything is sent.
		v := url.Values{"module": {mv.Module}, "id": {strconv.FormatUint(mv.ID, 10)}, "size": {sizesParam(dataSizes(mv.Data))}}
		req, err := http.NewRequestWithContext(ctx, http.MethodPost, "https://"+addr+"/v1/op/move/receive?"+v.Encode(), pr)
		if err != nil {
			pr.Close()
			<-sent
			return err
		}
		resp, err := a.member.Node.StreamClient().Do(req)
		pr.CloseWithError(errors.New("the request ended"))
		serr := <-sent
		if err != nil {
			return fmt.Errorf("%s did not take the copy: %w", mv.To, err)
		}
		defer resp.Body.Close()
		body, _ := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
		if resp.StatusCode == http.StatusInsufficientStorage || resp.StatusCode == http.StatusPreconditionFailed {
			// A try again would fill TO's disk again, or meet the swap
			// TO could not put back again: aborted at once.
			return fmt.Errorf("%w: %s refused the copy: %s", errNotMovable, mv.To, strings.TrimSpace(string(body)))
		}
		if resp.StatusCode != http.StatusOK {
			return fmt.Errorf("%s refused the copy: %s", mv.To, strings.TrimSpace(string(body)))
		}
		if serr != nil {
			return fmt.Errorf("read the data here: %w", serr)
		}
		if err := json.Unmarshal(body, &res); err != nil {
			return fmt.Errorf("%s answered the copy with %q", mv.To, body)
		}
		if res.Summary.Digest != sum.Digest {
			return fmt.Errorf("%s wrote a copy whose digest %s is not this node's %s", mv.To, short(res.Summary.Digest), short(sum.Digest))
		}
		res.Summary.Skipped = sum.Skipped
		return nil
	}()
	return res, err
}

// idle puts off t at each write or read that moves bytes: t ends a
// stream that stalled.
type idle struct {
	r io.Reader
	w io.Writer
	t *time.Timer
}

func (s *idle) Write(p []byte) (int, error) { return s.moved(s.w.Write(p)) }
func (s *idle) Read(p []byte) (int, error)  { return s.moved(s.r.Read(p)) }

func (s *idle) moved(n int, err error) (int, error) {
	switch {
	case err != nil:
		// The stream ended: no more bytes to wait for. TO reads back and
		// hashes what it wrote after the end, which takes its time with
		// no byte coming (a minute of it cancelled every copy of tens of
		// gigabytes, taken for a FROM that sent nothing).
		s.t.Stop()
	case n > 0:
		s.t.Reset(moveIdle)
	}
	return n, err
}

func errOr(err error, s string) string {
	if err != nil {
		return err.Error()
	}
	return s
}

// receive is TO's side of a copy: the peer API's POST /v1/op/move/receive.
func (a *Agent) receiveMove(w http.ResponseWriter, r *http.Request) {
	module := r.URL.Query().Get("module")
	id, _ := strconv.ParseUint(r.URL.Query().Get("id"), 10, 64)
	sizes := r.URL.Query().Get("size") // each data directory's, as FROM counts them
	select {
	case <-a.backups.ready: // the reconciler is made
	case <-r.Context().Done():
		return
	}
	res, code, err := a.receive(r.Context(), a.member.Node.PeerName(r), module, id, sizes, r.Body)
	if err != nil {
		http.Error(w, err.Error(), code)
		return
	}
	w.Header().Set("Content-Type", "application/json")
	json.NewEncoder(w).Encode(res)
}

func (a *Agent) receive(ctx context.Context, peer, module string, id uint64, sizes string, body io.Reader) (moveResult, int, error) {
	var res moveResult
	l, err := a.member.Store.Moves(ctx, module)
	if err != nil || len(l) != 1 {
		return res, http.StatusNotFound, fmt.Errorf("no move of %q is known here", module)
	}
	mv := l[0]
	if mv.ID != id || mv.To != a.member.ID.Name || mv.Phase != state.MoveCopy {
		return res, http.StatusConflict, fmt.Errorf("the move of %s here is #%d to %s at %s, not #%d to this node at copy", module, mv.ID, mv.To, mv.Phase, id)
	}
	if peer != mv.From {
		// Only the node the module moves from sends its data.
		return res, http.StatusForbidden, fmt.Errorf("the move of %s comes from %s, not from %s", module, mv.From, peer)
	}
	a.moveMu.Lock() // one copy into this node at a time
	defer a.moveMu.Unlock()
	if j := unsettledJournal(a.dir); j != "" {
		// A swap here was not put back whole: another one over it would
		// take what it left for the copy's "what TO held".
		return res, http.StatusPreconditionFailed, fmt.Errorf("%s keeps %s: a move's copy swapped in here earlier could not be put back whole (the agent's log says where each directory is); check the data directories it names, remove it, and move again", a.member.ID.Name, j)
	}
	for _, d := range mv.Data {
		if d != filepath.Clean(d) || !filepath.IsAbs(d) {
			return res, http.StatusBadRequest, fmt.Errorf("data directory %q is not a clean absolute path", d)
		}
		if msg := a.reconciler.RefusedPath(d); msg != "" {
			return res, http.StatusBadRequest, fmt.Errorf("%s: %s", d, msg)
		}
		if _, err := os.Lstat(d); err == nil {
			if err := sameDevice(d); err != nil {
				return res, http.StatusConflict, err
			}
		}
	}
	// A path of another module here is never taken, nor one of theirs
	// under it, which setting the directory aside would take from them
	// (the ledger is read while no apply writes it). The state refuses a
	// move whose module would not compose here (format 18); this holds
	// for a module assigned here after the move began, and for a log of
	// an older format.
	// A directory there that no module has (an operator's) is not set
	// aside either, unless the manifest takes it over: the host never
	// takes one without take-over: true (the module would have been
	// refused it here by an assign).
	takeOver := map[string]bool{}
	m, merr := a.member.Store.Manifest(ctx, module) // also for what the copy brings inside the data (Adopt)
	if merr == nil {
		for i, h := range m.Heads() {
			if h.Kind == manifest.KindDirectory && m.Resources[i].TakeOver {
				takeOver[h.Name] = true
			}
		}
	}
	othersPath := func() error {
		for _, d := range mv.Data {
			if other := a.reconciler.PathModule(d); other != "" && other != module {
				return fmt.Errorf("%s is module %s's on %s; the move would take it", d, other, mv.To)
			}
			if err := foreignAt(d, mv.To, a.reconciler.PathModule(d), takeOver[d]); err != nil {
				return err
			}
			if under := a.reconciler.OthersUnder(d, module); under != "" {
				return fmt.Errorf("%s holds %s on %s; the move would set it aside with %s", d, under, mv.To, d)
			}
			// Where the copy is written, and an earlier one goes, are
			// removed first: never a module's (a manifest may declare
			// /srv/db.mesh-moving).
			for _, p := range []string{d + moveStaging, d + moveStale} {
				if owner := a.reconciler.OwnerAt(p); owner != "" {
					return fmt.Errorf("%s, where the move writes its copy of %s, is module %s's on %s (or holds its files); the move would remove it", p, d, owner, mv.To)
				}
			}
		}
		return nil
	}
	err = a.reconciler.Exclusive(ctx, func(context.Context) error { return othersPath() })
	if err != nil {
		return res, http.StatusConflict, err
	}
	// The copy is written beside each directory, on its filesystem, while
	// the node goes on applying (nothing of the module is in its plan
	// yet); only the swap and the ledger hold the node.
	// The parents made for the data directories are recorded before they
	// are made (madeParents): a copy cut by a kill of this node is sent
	// again, and finds them; the module would fail on them ("exists and
	// the mesh did not make it") had the ledger not taken them with it.
	parents, earlier := a.parentsMadeBefore(ctx, module, id)
	adopted := false
	defer func() {
		// The record goes once its directories were looked at: a
		// removal that could not hold the node keeps it for the next copy.
		if !adopted && a.removeMadeParents(ctx, parents) {
			a.settleMadeParents(ctx, earlier)
		}
	}()
	for _, d := range mv.Data {
		missing, err := missingParents(filepath.Dir(d))
		if err != nil {
			return res, http.StatusInternalServerError, err
		}
		if len(missing) > 0 {
			parents = append(parents, missing...)
			if err := writeMadeParents(a.dir, madeParents{Module: module, Move: id, Paths: parents, Stale: earlier}); err != nil {
				return res, http.StatusInternalServerError, err
			}
			for _, q := range missing {
				if err := os.Mkdir(q, 0o755); err != nil && !errors.Is(err, os.ErrExist) {
					return res, http.StatusInternalServerError, err
				}
			}
		}
		for _, left := range []string{d + moveStaging, d + moveStale} { // a copy cut short, one replaced before a kill
			if err := os.RemoveAll(left); err != nil {
				return res, http.StatusInternalServerError, err
			}
		}
	}
	cleanup := func() {
		for _, d := range mv.Data {
			os.RemoveAll(d + moveStaging)
		}
	}
	if err := roomFor(a.member.ID.Name, mv.Data, parseSizes(sizes, len(mv.Data))); err != nil {
		return res, http.StatusInsufficientStorage, err
	}
	// The copy ends with the move: an abort (the operator's, the CLI's
	// --timeout, FROM's after moveLimit) or a move of the module made
	// anew ends it here too, and none outlives moveLimit, however slowly
	// FROM sends (it holds moveMu: every other copy into this node waits).
	rctx, cancel := context.WithTimeout(ctx, moveLimit)
	defer cancel()
	var ended atomic.Bool
	go func() {
		for nextChange(rctx, a.member.Store, moveEvery) {
			if still, err := moveStill(rctx, a.member.Store, module, id, state.MoveCopy); err == nil && !still {
				ended.Store(true)
				cancel()
				return
			}
		}
	}()
	var stalled atomic.Bool
	stall := time.AfterFunc(moveIdle, func() { stalled.Store(true); cancel() })
	room := &roomGuard{r: &idle{r: body, t: stall}, node: a.member.ID.Name, data: mv.Data}
	raw, sum, err := datacopy.Receive(rctx, room, mv.Data, func(root string) string { return root + moveStaging })
	stall.Stop()
	cancel()
	if err != nil {
		cleanup()
		switch rerr := room.failed(); {
		case rerr != nil:
			return res, http.StatusInsufficientStorage, rerr
		case ended.Load():
			err = fmt.Errorf("the move of %s ended while its copy was written: %w", module, err)
		case stalled.Load() && ctx.Err() == nil:
			err = fmt.Errorf("%s sent nothing for %s: %w", mv.From, moveIdle, err)
		case errors.Is(rctx.Err(), context.DeadlineExceeded) && ctx.Err() == nil:
			err = fmt.Errorf("the copy took more than %s: %w", moveLimit, err)
		}
		return res, http.StatusInternalServerError, err
	}
	var meta moveMeta
	if err := json.Unmarshal(raw, &meta); err != nil {
		meta = moveMeta{} // no markers: the steps run again here
	}
	res.Summary, res.Aside = sum, map[string]string{}
	var stale []string // earlier copies of this move, replaced
	err = a.reconciler.Exclusive(ctx, func(ctx context.Context) error {
		// Still this move, still at its copy: a move aborted meanwhile
		// leaves the node as it was.
		if still, err := moveStill(ctx, a.member.Store, module, id, state.MoveCopy); err != nil || !still {
			return fmt.Errorf("the move of %s ended while its copy was written", module)
		}
		if err := othersPath(); err != nil {
			return err
		}
		// A copy of this move already swapped in replaces nothing of
		// the operator's: what the first one set aside stays there, and
		// is reported again.
		prev, again := a.reconciler.Arrived(module, id)
		// The markers are kept until the start reaches this node; a move
		// still at its copy moveLimit after its phase began is aborted
		// by FROM, so twice that (for the clocks of two nodes) outlives
		// every move that can still start.
		until := time.Now().Add(2 * moveLimit)
		ops := hostSwap
		ops.journal = func(plan []movedDir) error { return writeMoveJournal(a.dir, module, id, until, plan) }
		undo, replaced, err := swapCopiesIn(mv.Data, res.Aside, func(d string) bool {
			return again && a.reconciler.PathModule(d) == module
		}, ops)
		if err != nil {
			a.settleMoveJournal(module, err)
			return err
		}
		for d, w := range prev.Aside {
			if _, ok := res.Aside[d]; !ok && slices.Contains(mv.Data, d) {
				res.Aside[d] = w
			}
		}
		arr := reconciler.Arrival{Move: id, Until: until, Aside: res.Aside}
		var within map[string]string
		if merr == nil {
			within = reconciler.DeclaredInData(m, mv.Data)
		}
		if err := a.reconciler.Adopt(module, arr, meta.Markers, mv.Data, parents, within); err != nil {
			if uerr := undo(); uerr != nil {
				err = fmt.Errorf("%w; and %w", err, uerr)
			}
			a.settleMoveJournal(module, err)
			return err
		}
		// The ledger holds the copy: a journal left now (its removal
		// failed) is only removed at the next start, which puts nothing
		// back while the ledger holds this arrival or the state runs the
		// module here (undoCutMoveSwap).
		if err := removeMoveJournal(a.dir); err != nil {
			a.log.Warn("move: the copy is in, but its journal stays (the next start removes it)", "module", module, "err", err)
		}
		stale = replaced
		return nil
	})
	if err != nil {
		cleanup()
		return res, http.StatusInternalServerError, err
	}
	adopted = true // the ledger holds the parents made, with the module
	a.settleMadeParents(ctx, earlier)
	for _, w := range stale {
		if err := os.RemoveAll(w); err != nil {
			a.log.Warn("move: the copy this one replaced is left", "module", module, "path", w, "err", err)
		}
	}
	a.log.Info("move: received", "module", module, "from", mv.From, "files", res.Summary.Files, "bytes", res.Summary.Bytes, "aside", res.Aside)
	return res, http.StatusOK, nil
}

// swapOps are the host operations swapCopiesIn makes (a test's fail).
// journal, when set, is called with the swaps about to be made, before
// the first of them: it records them durably (writeMoveJournal), so that
// a kill part way through is put back at the next start.
type swapOps struct {
	rename  func(from, to string) error
	syncDir func(dir string) error
	journal func([]movedDir) error
}

var hostSwap = swapOps{rename: os.Rename, syncDir: safefs.SyncDir}

// swapCopiesIn swaps each directory's copy (at d+moveStaging) in at d,
// setting what was at d aside (recorded in aside, d -> where). What was at
// d is an earlier copy of the same move when again(d) says so (its answer
// was lost, or FROM stopped before the start): that one never ran, and is
// set at d+moveStale, returned in stale for the caller to remove once the
// ledger holds the new one, rather than kept aside with every try. A
// failure puts back every directory swapped so far (the copy to its
// staging path, which the caller removes; what was there to d) and is
// returned: the node is as it was, and the copy is tried again. undo does
// the same after a success, for a later step that fails (the ledger's
// save). A put back that fails too is said, wrapping errNotPutBack: the
// node is not as it was, and the journal must stay for the operator.
func swapCopiesIn(data []string, aside map[string]string, again func(d string) bool, ops swapOps) (undo func() error, stale []string, err error) {
	var swapped []string
	was := map[string]string{} // d -> where what it held is now
	undo = func() error {
		var errs, unsynced []error
		for _, d := range slices.Backward(swapped) {
			if err := ops.rename(d, d+moveStaging); err != nil {
				errs = append(errs, err)
			}
			if w, ok := was[d]; ok {
				if err := ops.rename(w, d); err != nil {
					errs = append(errs, err)
				}
				delete(was, d)
			}
			if err := ops.syncDir(filepath.Dir(d)); err != nil {
				unsynced = append(unsynced, err)
			}
		}
		swapped = nil
		clear(aside)
		if err := errors.Join(errs...); err != nil {
			return fmt.Errorf("%w: %w", errNotPutBack, err)
		}
		// Put back, but maybe not durably: said, not taken for a put
		// back that failed (the journal, removed after, is synced).
		return errors.Join(unsynced...)
	}
	failed := func(err error) (func() error, []string, error) {
		if uerr := undo(); uerr != nil {
			return nil, nil, fmt.Errorf("%w; and %w", err, uerr)
		}
		return nil, nil, err
	}
	// Where what is at each directory goes, decided before anything moves.
	plan := make([]movedDir, len(data))
	for i, d := range data {
		plan[i].Dir = d
		if _, err := os.Lstat(d); err == nil {
			w := d + moveAside
			if again != nil && again(d) {
				w = d + moveStale
			} else if _, err := os.Lstat(w); err == nil {
				w = fmt.Sprintf("%s-%d", w, time.Now().Unix())
			}
			plan[i].Aside = w
		}
	}
	if ops.journal != nil {
		if err := ops.journal(plan); err != nil {
			return nil, nil, err
		}
	}
	for _, pd := range plan {
		d := pd.Dir
		if w := pd.Aside; w != "" {
			if err := ops.rename(d, w); err != nil {
				return failed(err)
			}
			was[d] = w
		}
		if err := ops.rename(d+moveStaging, d); err != nil {
			if w, ok := was[d]; ok {
				delete(was, d)
				if rerr := ops.rename(w, d); rerr != nil { // as it was
					uerr := undo()
					return nil, nil, fmt.Errorf("%w; and %w: what %s held stays at %s (%v)%s", err, errNotPutBack, d, w, rerr, errSuffix(uerr))
				}
			}
			return failed(err)
		}
		swapped = append(swapped, d)
		// The renames are durable before the ledger and the state say
		// the copy is in: after a power cut the module must not start
		// on what was at d before, while FROM lets its copy go.
		if err := ops.syncDir(filepath.Dir(d)); err != nil {
			return failed(err)
		}
	}
	for _, d := range data {
		if w, ok := was[d]; ok && w == d+moveStale {
			stale = append(stale, w)
		} else if ok {
			aside[d] = w
		}
	}
	return undo, stale, nil
}

// errNotPutBack: a swap that failed, or its undo, could not put every
// directory back as it was.
var errNotPutBack = errors.New("not all was put back")

func errSuffix(err error) string {
	if err == nil {
		return ""
	}
	return "; " + err.Error()
}

// foreignAt refuses a data directory d that exists on node to and that no
// module has there (owner ""), unless the manifest takes it over: the
// move would set an operator's directory aside.
func foreignAt(d, to, owner string, takeOver bool) error {
	if _, err := os.Lstat(d); err != nil || owner != "" || takeOver {
		return nil
	}
	return fmt.Errorf("%s exists on %s and the mesh did not make it; the move would set it aside. Move it away (mv %s %s.orig), or add take-over: true to the directory in the manifest, and move again", d, to, d, d)
}

// missingParents is p and its parents that do not exist, outermost first,
// following no link: an existing component must be a directory. (The
// receive makes them, 0755, root's, once it has recorded them.)
func missingParents(p string) ([]string, error) {
	var missing []string
	for q := p; q != "/"; q = filepath.Dir(q) {
		fi, err := os.Lstat(q)
		if err == nil {
			if !fi.IsDir() {
				return nil, fmt.Errorf("%s is not a directory (a link is never followed)", q)
			}
			break
		}
		if !errors.Is(err, os.ErrNotExist) {
			return nil, err
		}
		missing = append(missing, q)
	}
	slices.Reverse(missing)
	return missing, nil
}

// madeParents is the record (move-parents.json in the agent's directory)
// of the directories a move's copy into this node made for its data
// directories' parents, written before they are made and removed once the
// ledger holds them (or they are removed): one copy into a node at a time
// (moveMu), so one record. Stale are those an earlier move's copy made
// that could not be looked at yet (the node was held): kept in the record
// until a later copy removes them.
type madeParents struct {
	Module string   `json:"module"`
	Move   uint64   `json:"move"`
	Paths  []string `json:"paths"`
	Stale  []string `json:"stale,omitempty"`
}

const moveParents = "move-parents.json"

func writeMadeParents(dir string, r madeParents) error {
	raw, err := json.Marshal(r)
	if err != nil {
		return err
	}
	if err := safefs.WriteFile(filepath.Join(dir, moveParents), raw, 0o600); err != nil {
		return fmt.Errorf("record the directories a move's copy makes: %w", err)
	}
	return nil
}

// parentsMadeBefore is what an earlier copy of move id of module made and
// recorded (cut by a kill: the copy is sent again), those still there
// (mine), and what other moves' copies made and recorded, to be removed
// (their copies are over: one copy at a time): removed now, with the
// record, or, when the node cannot be held, returned as stale, for the
// record to keep (settleMadeParents).
func (a *Agent) parentsMadeBefore(ctx context.Context, module string, id uint64) (mine, stale []string) {
	raw, err := os.ReadFile(filepath.Join(a.dir, moveParents))
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	var r madeParents
	if err == nil {
		err = json.Unmarshal(raw, &r)
	}
	if err != nil {
		a.log.Warn("move: the record of the directories an earlier copy made cannot be read; they stay", "err", err)
		a.forgetMadeParents()
		return nil, nil
	}
	there := func(l []string) []string {
		var out []string
		for _, p := range l {
			if p == filepath.Clean(p) && filepath.IsAbs(p) && safefs.IsDir(p) {
				out = append(out, p)
			}
		}
		return out
	}
	mine, stale = there(r.Paths), there(r.Stale)
	if r.Module != module || r.Move != id {
		stale, mine = append(stale, mine...), nil
	}
	if len(stale) > 0 && a.removeMadeParents(ctx, stale) {
		stale = nil
		if len(mine) == 0 {
			a.forgetMadeParents()
		}
	}
	return mine, stale
}

// settleMadeParents ends the record once a copy's own parents are settled
// (in the ledger, or removed): it goes, or keeps only stale, those of
// earlier copies still to be removed, tried again first.
func (a *Agent) settleMadeParents(ctx context.Context, stale []string) {
	if len(stale) > 0 && a.removeMadeParents(ctx, stale) {
		stale = nil
	}
	if len(stale) == 0 {
		a.forgetMadeParents()
		return
	}
	if err := writeMadeParents(a.dir, madeParents{Stale: stale}); err != nil {
		a.log.Warn("move: the directories earlier copies made are left unrecorded", "paths", stale, "err", err)
	}
}

// forgetMadeParents removes the record.
func (a *Agent) forgetMadeParents() {
	if err := os.Remove(filepath.Join(a.dir, moveParents)); err != nil && !errors.Is(err, os.ErrNotExist) {
		a.log.Warn("move: remove the record of the directories a copy made", "err", err)
	}
}

// removeMadeParents removes the directories a copy made for its data
// directories' parents (made, parents first) once the copy did not come
// in: the deepest first, each only while it is empty (something put there
// since stays, and so do the parents above it) and no module's path (one
// assigned here meanwhile may declare it). It says whether the removal
// ran: false when it could not hold the node (the directories are left,
// and their record should stay for a later try).
func (a *Agent) removeMadeParents(ctx context.Context, made []string) bool {
	if len(made) == 0 {
		return true
	}
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), removeParentsWait)
	defer cancel()
	err := a.reconciler.Exclusive(ctx, func(context.Context) error {
		removeEmptyParents(made, a.reconciler.OwnerAt)
		return nil
	})
	if err != nil {
		a.log.Warn("move: the directories made for a copy that did not come in are left (a later copy looks again)", "paths", made, "err", err)
		return false
	}
	return true
}

// removeParentsWait bounds how long removeMadeParents waits for the node.
var removeParentsWait = time.Minute

// removeEmptyParents is removeMadeParents's removal, owner naming the
// module whose path p is or holds ("" for none).
func removeEmptyParents(made []string, owner func(p string) string) {
	for _, p := range slices.Backward(made) {
		if owner(p) != "" {
			return
		}
		if err := os.Remove(p); err != nil && !errors.Is(err, os.ErrNotExist) {
			return // (os.Remove takes an empty directory alone)
		}
	}
}

// removeReplaced removes the earlier copies of mv's data a copy sent again
// replaced and a kill left (checkStarted).
func (m *movers) removeReplaced(ctx context.Context, mv state.MoveInfo) {
	for _, d := range mv.Data {
		if d != filepath.Clean(d) || !filepath.IsAbs(d) {
			continue
		}
		if _, err := os.Lstat(d + moveStale); err != nil {
			continue
		}
		if owner, err := m.owner(ctx, d+moveStale); err != nil || owner != "" {
			if owner != "" {
				m.a.log.Warn("move: a replaced copy's path is a module's: left", "module", mv.Module, "path", d+moveStale, "owner", owner)
			}
			continue
		}
		if err := os.RemoveAll(d + moveStale); err != nil {
			m.a.log.Warn("move: the copy a copy sent again replaced cannot be removed", "module", mv.Module, "path", d+moveStale, "err", err)
			continue
		}
		m.a.log.Info("move: removed the copy a copy sent again replaced", "module", mv.Module, "path", d+moveStale)
	}
}

// checkStarted is TO's side once the module is assigned here: done when
// TO's plan holds the module, its apply of that plan created what the
// module runs, and its health checks pass (its containers without one have
// run moveSettle without an exit); the abort when it failed there. A wait
// (a health gate, a secret being sealed to TO, a provider) goes on.
func (m *movers) checkStarted(ctx context.Context, mv state.MoveInfo) {
	store := m.a.member.Store
	// An earlier copy that a copy sent again replaced is removed once the
	// ledger holds the new one (receive); a kill between the two left it,
	// and no copy comes after the start to remove it. Looked for once a
	// move, aside from this loop (a whole copy takes a while to remove).
	m.mu.Lock()
	sweep := !m.swept[mv.ID]
	m.swept[mv.ID] = true
	m.mu.Unlock()
	if sweep {
		go m.removeReplaced(ctx, mv)
	}
	if n, err := store.Node(ctx, mv.To); err == nil && n.ComposeError != "" {
		m.step(ctx, mv, state.MoveAborted, fmt.Sprintf("%s's plan does not compose with %s: %s", mv.To, mv.Module, n.ComposeError))
		return
	}
	pv, err := store.Plan(ctx, mv.To)
	if err != nil || pv.Plan == nil {
		return
	}
	var ctrs []string
	holds := false
	for _, res := range pv.Plan.Resources {
		if res.Module == mv.Module {
			holds = true
			if res.Kind == manifest.KindContainer {
				ctrs = append(ctrs, res.Name)
			}
		}
	}
	if !holds {
		return // the plan of the start is not composed here yet
	}
	reports, err := store.Reports(ctx)
	if err != nil {
		return
	}
	rep, ok := reports[mv.To]
	if !ok || rep.Version < pv.Version {
		return
	}
	if f := rep.Failed(mv.Module); f != nil {
		if f.SecretUnset {
			m.step(ctx, mv, state.MoveAborted, fmt.Sprintf("%s waits on %s for secret %s, which is not set (mesh secret set %s %s)", mv.Module, mv.To, f.Secret, mv.Module, f.Secret))
			return
		}
		if f.Wait() || f.Provider != "" {
			return // a wait, not a failure: it goes on as they change
		}
		m.step(ctx, mv, state.MoveAborted, fmt.Sprintf("%s failed on %s at %s: %s", mv.Module, mv.To, f.Resource, f.Reason))
		return
	}
	if rep.Error != "" && rep.Failed(mv.Module) == nil && len(rep.Failures) == 0 {
		return // the apply failed as a whole (Podman away): tried again
	}
	for _, e := range rep.Exits {
		if slices.Contains(ctrs, e.Container) && e.At.After(mv.Since) {
			m.step(ctx, mv, state.MoveAborted, fmt.Sprintf("%s exited on %s with code %d", e.Container, mv.To, e.ExitCode))
			return
		}
	}
	health := map[string]string{}
	for _, h := range rep.Health {
		health[h.Container] = h.Status
		if h.Status == state.HealthUnhealthy && slices.Contains(ctrs, h.Container) {
			m.step(ctx, mv, state.MoveAborted, fmt.Sprintf("%s is unhealthy on %s: %q", h.Container, mv.To, h.Output))
			return
		}
	}
	unchecked := false
	for _, c := range ctrs {
		st, checked := health[c]
		if !checked {
			unchecked = true
			continue
		}
		if st != state.HealthHealthy {
			if m.logged[mv.ID] != c {
				m.logged[mv.ID] = c
				m.a.log.Info("move waits for health", "module", mv.Module, "container", c, "status", st)
			}
			return
		}
	}
	if unchecked && time.Since(rep.AppliedAt) < moveSettle {
		return
	}
	m.step(ctx, mv, state.MoveDone, fmt.Sprintf("%s runs on %s (plan v%d), its health checks pass", mv.Module, mv.To, pv.Version))
}
