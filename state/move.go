package state

import (
	"cmp"
	"context"
	"database/sql"
	"fmt"
	"slices"
	"strings"
	"time"

	"mesh/state/manifest"
)

// Moving a module with its data (issue 30, "A module's data", item 4).
// mesh move MODULE FROM TO writes a move; each of its phases is a state
// of the replicated state, so a kill of any agent, of the CLI or of the
// leader leaves it where it was, and whoever comes back goes on:
//
//   - copy: FROM's plan keeps the module's directories and files but none
//     of its containers or steps, so FROM stops it and nothing writes its
//     data; FROM's agent then copies the data directories to TO over the
//     peer API (checked by digest, step markers with them) and proposes
//     move.step to start; a copy that keeps failing proposes move.abort;
//   - start: the module is assigned to TO (names and bindings follow as
//     for any assign: FROM no longer provides it); TO's agent proposes
//     done once the module applied there and its health checks pass, or
//     abort when it fails;
//   - done: FROM's assignment is gone; its copy of the data is kept, and
//     reported, until mesh move --finish (which purges it) or until the
//     module is assigned there again;
//   - aborted: TO's assignment is gone and FROM runs it again, as before;
//     the reason is kept for mesh move and status.

// Move ops (format 13, backupFormat).
const (
	OpModuleMove = "module.move"
	OpMoveStep   = "move.step"
)

// Move phases.
const (
	MoveCopy    = "copy"
	MoveStart   = "start"
	MoveDone    = "done"
	MoveAborted = "aborted"
)

// ModuleMoveRequest starts a move.
type ModuleMoveRequest struct {
	Module string `json:"module"`
	From   string `json:"from"`
	To     string `json:"to"`
}

func (*ModuleMoveRequest) Op() string { return OpModuleMove }
func (r *ModuleMoveRequest) describe() string {
	return fmt.Sprintf("move %s %s %s", r.Module, r.From, r.To)
}

// MoveStepRequest takes a move from one phase to the next: From is the
// phase it must be in (a step proposed twice, or late, changes nothing),
// ID the move (the index of its module.move).
type MoveStepRequest struct {
	Module string `json:"module"`
	ID     uint64 `json:"id"`
	From   string `json:"from_phase"`
	To     string `json:"to_phase"`
	// Reason is why, for an abort; Note what the copy did, for start.
	Reason string `json:"reason,omitempty"`
	// Finish, on a done move, purges FROM's copy and forgets the move; on
	// an aborted one, forgets it.
	Finish bool `json:"finish,omitempty"`
}

func (*MoveStepRequest) Op() string { return OpMoveStep }
func (r *MoveStepRequest) describe() string {
	if r.Finish {
		return "move.finish " + r.Module
	}
	return fmt.Sprintf("move.step %s %s -> %s", r.Module, r.From, r.To)
}

// MaxMoveReason bounds a move's reason.
const MaxMoveReason = 2048

// MoveInfo is a move as the state has it.
type MoveInfo struct {
	Module string    `json:"module"`
	ID     uint64    `json:"id"`
	From   string    `json:"from"`
	To     string    `json:"to"`
	Phase  string    `json:"phase"`
	Reason string    `json:"reason,omitempty"`
	Since  time.Time `json:"since"`
	// Data are the data directories moved (FROM keeps its copy of them
	// until mesh move --finish).
	Data []string `json:"data,omitempty"`
}

func (ap *applier) moduleMove(r *ModuleMoveRequest) (bool, error) {
	tx := ap.tx
	if r.From == r.To {
		return false, ruleErr(ErrInvalid, "move %s: FROM and TO are both %s", r.Module, r.From)
	}
	for _, n := range []string{r.From, r.To} {
		if err := needNode(tx, n); err != nil {
			return false, err
		}
	}
	if err := needModule(tx, r.Module, "mesh module list"); err != nil {
		return false, err
	}
	on, err := has(tx, `SELECT 1 FROM assignments WHERE node = ? AND module = ?`, r.From, r.Module)
	if err != nil {
		return false, err
	}
	if !on {
		nodes, err := listOf(tx, `SELECT node FROM assignments WHERE module = ? ORDER BY node`, "it runs nowhere", r.Module)
		if err != nil {
			return false, err
		}
		return false, ruleErr(ErrNotFound, "module %s does not run on %s (%s)", r.Module, r.From, nodes)
	}
	if on, err := has(tx, `SELECT 1 FROM assignments WHERE node = ? AND module = ?`, r.To, r.Module); err != nil || on {
		if err != nil {
			return false, err
		}
		return false, ruleErr(ErrConflict, "module %s already runs on %s", r.Module, r.To)
	}
	var phase string
	err = tx.QueryRow(`SELECT phase FROM moves WHERE module = ?`, r.Module).Scan(&phase)
	if err != nil && err != sql.ErrNoRows {
		return false, err
	}
	if phase == MoveCopy || phase == MoveStart {
		return false, ruleErr(ErrConflict, "module %s is being moved already (mesh status shows how far; mesh move --abort %s ends it)", r.Module, r.Module)
	}
	if rolling, err := has(tx, `SELECT 1 FROM rollouts WHERE module = ? AND state = 'running'`, r.Module); err != nil || rolling {
		if err != nil {
			return false, err
		}
		return false, ruleErr(ErrConflict, "module %s is rolling out a change; move it once the rollout ends", r.Module)
	}
	if err := ap.refuseDraining(r.To, r.Module); err != nil {
		return false, err
	}
	cat, err := ap.catalogue()
	if err != nil {
		return false, err
	}
	if err := checkProviders(cat, r.Module); err != nil {
		return false, err
	}
	if ap.v >= moveFitFormat {
		if err := ap.composesOn(r.To, r.Module, cat); err != nil {
			return false, err
		}
	}
	// The outermost data directories: an inner one travels inside its
	// outer one.
	var data []string
	if m := cat[r.Module]; m != nil {
		all := m.DataDirs()
		for _, d := range all {
			if !slices.ContainsFunc(all, func(o string) bool { return o != d && manifest.Within(d, o) }) {
				data = append(data, d)
			}
		}
	}
	// A purge TO was asked for (a move off it finished, an unassign
	// --purge-data) would remove the copy it is about to receive.
	purges, err := listRows(tx, `SELECT path FROM purges WHERE node = ?`, r.To)
	if err != nil {
		return false, err
	}
	for _, p := range purges {
		if slices.ContainsFunc(data, func(d string) bool { return manifest.Within(p, d) || manifest.Within(d, p) }) {
			if err := exec(tx, `DELETE FROM purges WHERE node = ? AND path = ?`, r.To, p); err != nil {
				return false, err
			}
		}
	}
	if err := exec(tx, `DELETE FROM purges WHERE node = ? AND module = ?`, r.To, r.Module); err != nil {
		return false, err
	}
	// A move done before (FROM's copy kept) is replaced: its copy stays
	// where it is, a data directory like any other.
	return true, exec(tx, `INSERT INTO moves (module, id, from_node, to_node, phase, reason, since, data) VALUES (?, ?, ?, ?, ?, '', ?, ?)
		ON CONFLICT (module) DO UPDATE SET id = excluded.id, from_node = excluded.from_node, to_node = excluded.to_node, phase = excluded.phase,
		reason = '', since = excluded.since, data = excluded.data`,
		r.Module, ap.index, r.From, r.To, MoveCopy, ap.at, strings.Join(data, "\n"))
}

func (ap *applier) moveStep(r *MoveStepRequest) (bool, error) {
	tx := ap.tx
	var mv MoveInfo
	var data, since string
	err := tx.QueryRow(`SELECT id, from_node, to_node, phase, data, since FROM moves WHERE module = ?`, r.Module).Scan(&mv.ID, &mv.From, &mv.To, &mv.Phase, &data, &since)
	if err == sql.ErrNoRows {
		return false, ruleErr(ErrNotFound, "module %s is not being moved", r.Module)
	}
	if err != nil {
		return false, err
	}
	if r.ID != 0 && r.ID != mv.ID {
		return false, nil // a step of an earlier move: nothing to do
	}
	if r.Finish {
		if mv.Phase == MoveAborted {
			// Read: the reason is seen; nothing of the data moves.
			return false, exec(tx, `DELETE FROM moves WHERE module = ?`, r.Module)
		}
		if mv.Phase != MoveDone {
			return false, ruleErr(ErrConflict, "the move of %s is at %s, not done: nothing to finish (mesh move --abort %s ends it)", r.Module, mv.Phase, r.Module)
		}
		// FROM's copy may be the only one left once TO no longer runs
		// the module (unassigned there since, --purge-data maybe).
		if ap.v >= finishFormat {
			var on int
			if err := tx.QueryRow(`SELECT count(*) FROM assignments WHERE node = ? AND module = ?`, mv.To, r.Module).Scan(&on); err != nil {
				return false, err
			}
			if on == 0 {
				return false, ruleErr(ErrConflict, "module %s no longer runs on %s, where it moved: %s's copy of its data may be the only one left, so it is kept (mesh assign %s %s runs the module on that copy; mesh unassign %s %s --purge-data then removes it)",
					r.Module, mv.To, mv.From, mv.From, r.Module, mv.From, r.Module)
			}
		}
		// FROM removes its copy, as an unassign --purge-data would have.
		for _, p := range splitLines(data) {
			if err := exec(tx, `INSERT INTO purges (node, module, path, idx) VALUES (?, ?, ?, ?) ON CONFLICT (node, path) DO UPDATE SET module = excluded.module, idx = excluded.idx`, mv.From, r.Module, p, ap.index); err != nil {
				return false, err
			}
		}
		return true, exec(tx, `DELETE FROM moves WHERE module = ?`, r.Module)
	}
	if r.To == MoveAborted && (mv.Phase == MoveDone || mv.Phase == MoveAborted) {
		return false, ruleErr(ErrConflict, "the move of %s is %s already: nothing to abort", r.Module, mv.Phase)
	}
	// An abort ends a move at whichever phase it is (the operator's, or
	// the CLI's at its timeout, may have read an earlier one); any other
	// step only from the phase it names.
	if mv.Phase != r.From && r.To != MoveAborted {
		return false, nil // taken already, by this proposer's earlier try or another's
	}
	r.From = mv.Phase
	reason := Tail(r.Reason, MaxMoveReason)
	switch {
	case r.From == MoveCopy && r.To == MoveStart:
		if err := ap.refuseDraining(mv.To, r.Module); err != nil {
			return false, err
		}
		if err := exec(tx, `INSERT INTO assignments (node, module, seq) VALUES (?, ?, ?) ON CONFLICT DO NOTHING`, mv.To, r.Module, ap.index); err != nil {
			return false, err
		}
		ap.assignedInsert(Assignment{Node: mv.To, Module: r.Module, Seq: ap.index})
		if err := exec(tx, `DELETE FROM purges WHERE node = ? AND module = ?`, mv.To, r.Module); err != nil {
			return false, err
		}
	case r.From == MoveStart && r.To == MoveDone:
		if err := exec(tx, `DELETE FROM assignments WHERE node = ? AND module = ?`, mv.From, r.Module); err != nil {
			return false, err
		}
		ap.assignedDelete(mv.From, r.Module)
	case (r.From == MoveCopy || r.From == MoveStart) && r.To == MoveAborted:
		if err := exec(tx, `DELETE FROM assignments WHERE node = ? AND module = ?`, mv.To, r.Module); err != nil {
			return false, err
		}
		ap.assignedDelete(mv.To, r.Module)
	default:
		return false, ruleErr(ErrInvalid, "a move goes copy -> start -> done, or to aborted before done; not %s -> %s", r.From, r.To)
	}
	return true, exec(tx, `UPDATE moves SET phase = ?, reason = ?, since = ? WHERE module = ?`, r.To, reason, ap.at, r.Module)
}

func splitLines(s string) []string {
	if s == "" {
		return nil
	}
	return strings.Split(s, "\n")
}

// Moves lists the moves the state holds (module "" for every module's).
func (s *Store) Moves(ctx context.Context, module string) ([]MoveInfo, error) {
	return readMoves(ctx, s.db, module)
}

func readMoves(ctx context.Context, q queryer, module string) ([]MoveInfo, error) {
	var out []MoveInfo
	err := eachRow(ctx, q, "moves", `SELECT module, id, from_node, to_node, phase, reason, since, data FROM moves WHERE ? = '' OR module = ? ORDER BY module`, func(rows *sql.Rows) error {
		var mv MoveInfo
		var since, data string
		if err := rows.Scan(&mv.Module, &mv.ID, &mv.From, &mv.To, &mv.Phase, &mv.Reason, &since, &data); err != nil {
			return err
		}
		mv.Since, _ = time.Parse(timeLayout, since)
		mv.Data = splitLines(data)
		out = append(out, mv)
		return nil
	}, module, module)
	return out, err
}

// moving says whether a move of module holds it now (phase copy or
// start), with the phase and its nodes.
func (ap *applier) moving(module string) (moving bool, phase, from, to string, err error) {
	err = ap.tx.QueryRow(`SELECT phase, from_node, to_node FROM moves WHERE module = ?`, module).Scan(&phase, &from, &to)
	if err == sql.ErrNoRows {
		return false, "", "", "", nil
	}
	return err == nil && (phase == MoveCopy || phase == MoveStart), phase, from, to, err
}

// refuseMovedHere refuses an unassign --purge-data of a module from the
// TO of its done move while FROM still keeps its copy (format 20,
// purgeMovedFormat): once TO's copy is gone, an assign there again would
// run the module on empty directories, and the finish the operator then
// runs, believing TO holds the data, would purge FROM's copy, the last.
func (ap *applier) refuseMovedHere(a Assignment) error {
	var from, data string
	err := ap.tx.QueryRow(`SELECT from_node, data FROM moves WHERE module = ? AND to_node = ? AND phase = ?`, a.Module, a.Node, MoveDone).Scan(&from, &data)
	if err == sql.ErrNoRows {
		return nil
	}
	if err != nil {
		return err
	}
	return ruleErr(ErrConflict, "module %s moved to %s from %s, which still keeps its copy of %s: --purge-data now could leave no copy once the move is finished; nothing was changed. Run mesh move --finish %s first (it purges %s's copy), or mesh assign %s %s to run it on that copy (its data as the move found it), then unassign again",
		a.Module, a.Node, from, strings.Join(splitLines(data), ", "), a.Module, from, from, a.Module)
}

// refuseMoving refuses what would change where module runs while a move
// of it goes on.
func (ap *applier) refuseMoving(module, what string) error {
	moving, phase, from, to, err := ap.moving(module)
	if err != nil || !moving {
		return err
	}
	return ruleErr(ErrConflict, "module %s is being moved from %s to %s (%s): %s once the move ends, or end it with mesh move --abort %s", module, from, to, phase, what, module)
}

// composesOn refuses a move of module to node when node's plan would not
// compose with it: TO receives the module's data during the copy, while
// the module is not yet in its plan, so what composition refuses (the
// module's data directory inside a directory another module there mounts
// writable, or around one; a path or a route another module there
// claims) would only show at the move's start, the data already written
// (inside the other module's mount, where its container reads it).
func (ap *applier) composesOn(node, module string, cat map[string]*manifest.Manifest) error {
	as, err := ap.assignmentsFor()
	if err != nil {
		return err
	}
	with := make([]Assignment, 0, len(as)+1)
	with = append(with, as...)
	with = append(with, Assignment{Node: node, Module: module, Seq: ap.index})
	slices.SortFunc(with, func(a, b Assignment) int { return cmp.Or(cmp.Compare(a.Node, b.Node), cmp.Compare(a.Module, b.Module)) })
	in, err := ap.input(cat, with, nil)
	if err != nil {
		return err
	}
	only := map[string]bool{node: true}
	if in.Bound, err = readBound(ap.ctx, ap.q, only); err != nil {
		return err
	}
	out := ComposeNodes(in, only)
	defer out.releasePlans()
	msg, failed := out.Errors[node]
	if !failed {
		return nil
	}
	// An error TO's plan has without the module refuses the move too:
	// composition says its first error only, and one of TO's own (a
	// secret not yet sealed to another module there, say) would hide the
	// module's (a nesting in another's mount is checked last). It is named
	// as TO's.
	in.Assignments = as
	before := ComposeNodes(in, only)
	defer before.releasePlans()
	if was, ok := before.Errors[node]; ok && was == msg {
		return ruleErr(ErrConflict, "%s's plan does not compose now (%s): a move of %s there is refused until it does (composition names its first error only, which would hide one the module brings; the data is copied first)", node, msg, module)
	}
	return ruleErr(ErrConflict, "module %s would not run on %s: %s (a move copies the data first, so it is refused before)", module, node, msg)
}
