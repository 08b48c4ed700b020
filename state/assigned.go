package state

import (
	"cmp"
	"context"
	"database/sql"
	"fmt"
	"maps"
	"slices"
)

// The assignments as the FSM keeps them (issue "scale", item 1). Every
// command that recomposes builds its Input, and reading the assignments
// table for it was most of that: 10,000 rows, the largest part of an
// assign's 28 ms at 10,000 modules (a CPU profile of bench/scale.sh). The
// store keeps the table in memory, sorted as input() reads it (node, then
// module): a command edits its own copy beside each of its writes to the
// table (assignedInsert, assignedDelete, assignedDeleteNode, or
// assignedForget where it rewrites the table whole), and the copy replaces
// the store's only when the command commits. The copy is the store's own,
// edited in place, which the store forgets at the first edit: after a
// broken rule, a full disk or a failure it keeps none, and the next
// command reads the table. With
// checkComposition on (the tests and the fuzz targets), every use of the
// kept list is compared with a read of the table: a write that does not
// edit the copy fails there.

// With the list, the store keeps each module's assignments (assignedAt),
// edited with it: whether a consumer runs anywhere decides whether its
// provider's accepts-credentials directory receives its credential, and
// walking the fleet's assignments for it, per consumer of each provider on
// a composed node, was most of an assign in a fleet of wired modules
// (BenchmarkFleetWired); a node whose modules bind to a hundred databases
// walked them too for where the databases run (groupFor).

// keptAssignments is this command's view of the assignments table: its own
// copy once it edited it, else the store's; ok is false when neither is
// known (the table is to be read).
func (ap *applier) keptAssignments() (as []Assignment, ok bool) {
	if ap.assignedDirty {
		return ap.assigned, ap.assignedKnown
	}
	return ap.s.assigned, ap.s.assigned != nil
}

// editAssigned applies edit to this command's copy, made on its first
// edit; unknown stays unknown.
func (ap *applier) editAssigned(edit func([]Assignment) []Assignment) {
	cur, ok := ap.keptAssignments()
	if !ok {
		ap.assigned, ap.assignedKnown, ap.assignedDirty = nil, false, true
		return
	}
	if !ap.assignedDirty {
		// The command takes the store's copy and edits it in place (a copy
		// of 10,000 assignments was a sixth of an assign's garbage): the
		// store keeps none until the command commits, so after a failure
		// or a broken rule the next command reads the table.
		ap.assignedAt = ap.s.assignedAt
		ap.s.assigned, ap.s.assignedAt = nil, nil
	}
	if ap.assignedAt == nil {
		ap.assignedAt = indexModules(cur)
	}
	ap.assigned, ap.assignedKnown, ap.assignedDirty = edit(cur), true, true
	if ap.assigned == nil {
		ap.assigned = []Assignment{}
	}
}

func compareAssignment(a Assignment, node, module string) int {
	return cmp.Or(cmp.Compare(a.Node, node), cmp.Compare(a.Module, module))
}

// assignedInsert follows an INSERT (or INSERT ... ON CONFLICT DO NOTHING)
// of a into the table: a row already there is kept as it is.
func (ap *applier) assignedInsert(a Assignment) {
	ap.editAssigned(func(as []Assignment) []Assignment {
		i, found := slices.BinarySearchFunc(as, a, func(x, y Assignment) int { return compareAssignment(x, y.Node, y.Module) })
		if found {
			return as
		}
		ap.assignedAt[a.Module] = append(ap.assignedAt[a.Module], a)
		return slices.Insert(as, i, a)
	})
}

// assignedDelete follows a DELETE of node's row of module.
func (ap *applier) assignedDelete(node, module string) {
	ap.editAssigned(func(as []Assignment) []Assignment {
		i, found := slices.BinarySearchFunc(as, Assignment{Node: node, Module: module}, func(x, y Assignment) int { return compareAssignment(x, y.Node, y.Module) })
		if !found {
			return as
		}
		ap.unindex(node, module)
		return slices.Delete(as, i, i+1)
	})
}

// assignedDeleteNode follows a DELETE of every row of node.
func (ap *applier) assignedDeleteNode(node string) {
	ap.editAssigned(func(as []Assignment) []Assignment {
		return slices.DeleteFunc(as, func(a Assignment) bool {
			if a.Node == node {
				ap.unindex(node, a.Module)
				return true
			}
			return false
		})
	})
}

// assignedForget follows a rewrite of the table: the next input reads it.
func (ap *applier) assignedForget() {
	ap.assigned, ap.assignedAt, ap.assignedKnown, ap.assignedDirty = nil, nil, false, true
}

// unindex takes node's assignment of module out of assignedAt.
func (ap *applier) unindex(node, module string) {
	at := slices.DeleteFunc(ap.assignedAt[module], func(a Assignment) bool { return a.Node == node })
	if len(at) == 0 {
		delete(ap.assignedAt, module)
	} else {
		ap.assignedAt[module] = at
	}
}

// indexModules is each module's assignments in as, in as's order.
func indexModules(as []Assignment) map[string][]Assignment {
	at := make(map[string][]Assignment, len(as))
	for _, a := range as {
		at[a.Module] = append(at[a.Module], a)
	}
	return at
}

// sameIndex says two indexes hold the same assignments of each module, in
// any order.
func sameIndex(a, b map[string][]Assignment) bool {
	return maps.EqualFunc(a, b, func(x, y []Assignment) bool {
		return len(x) == len(y) && !slices.ContainsFunc(x, func(a Assignment) bool { return !slices.Contains(y, a) })
	})
}

// assignedIndex is each module's assignments, as assignmentsFor's list
// says (after it).
func (ap *applier) assignedIndex() map[string][]Assignment {
	if !ap.assignedDirty {
		if ap.s.assigned == nil {
			return nil
		}
		if ap.s.assignedAt == nil {
			ap.s.assignedAt = indexModules(ap.s.assigned)
		}
		return ap.s.assignedAt
	}
	if ap.assignedAt == nil && ap.assignedKnown {
		ap.assignedAt = indexModules(ap.assigned)
	}
	return ap.assignedAt
}

// assignmentsFor is the assignments an input of this command holds: the
// kept ones, checked against the table when checkComposition is on, or
// the table read (and kept from here on).
func (ap *applier) assignmentsFor() ([]Assignment, error) {
	if as, ok := ap.keptAssignments(); ok {
		if checkComposition {
			read, err := readAssignments(ap.ctx, ap.tx)
			if err != nil {
				return nil, err
			}
			if !slices.Equal(read, as) {
				return nil, fmt.Errorf("the kept assignments (%d) are not the table's (%d): a write to the table did not edit them", len(as), len(read))
			}
			if at := ap.assignedIndex(); at != nil && !sameIndex(at, indexModules(read)) {
				return nil, fmt.Errorf("the kept index of each module's assignments is not the table's: an edit of the assignments did not index")
			}
		}
		return as, nil
	}
	read, err := readAssignments(ap.ctx, ap.tx)
	if err != nil {
		return nil, err
	}
	ap.assigned, ap.assignedAt, ap.assignedKnown, ap.assignedDirty = read, indexModules(read), true, true
	return read, nil
}

// readAssignments reads the table, sorted by node and module; never nil.
func readAssignments(ctx context.Context, q queryer) ([]Assignment, error) {
	as := []Assignment{}
	err := eachRow(ctx, q, "assignments", `SELECT node, module, seq FROM assignments ORDER BY node, module`, func(rows *sql.Rows) error {
		var a Assignment
		if err := rows.Scan(&a.Node, &a.Module, &a.Seq); err != nil {
			return err
		}
		as = append(as, a)
		return nil
	})
	return as, err
}
