package state

// Draining a node (issue 29 item 4): `mesh node drain NODE` marks it, new
// assigns to it are refused, and what runs there keeps running; `--undo`
// ends it. (Moving its modules elsewhere is `mesh move`'s, not this.) The
// op is of format 9; the assign rule reads a mark only a node.drain can
// set, so every replica that meets the mark knows the rule.

// OpNodeDrain marks a node draining, or (Undo) ends it.
const OpNodeDrain = "node.drain"

// NodeDrainRequest marks or unmarks a node.
type NodeDrainRequest struct {
	Node string `json:"node"`
	Undo bool   `json:"undo,omitempty"`
}

func (*NodeDrainRequest) Op() string { return OpNodeDrain }
func (r *NodeDrainRequest) describe() string {
	if r.Undo {
		return "mesh node drain " + r.Node + " --undo"
	}
	return "mesh node drain " + r.Node
}

func (ap *applier) nodeDrain(r *NodeDrainRequest) (bool, error) {
	if err := needNode(ap.tx, r.Node); err != nil {
		return false, err
	}
	// Nothing of a plan changes: no recomposition.
	return false, exec(ap.tx, `UPDATE nodes SET draining = ? WHERE name = ?`, !r.Undo, r.Node)
}

// refuseDraining is the assign rule: no new module on a draining node.
func (ap *applier) refuseDraining(node, module string) error {
	draining, err := has(ap.tx, `SELECT 1 FROM nodes WHERE name = ? AND draining`, node)
	if err != nil || !draining {
		return err
	}
	return ruleErr(ErrConflict, "node %s is draining: it takes no new module (assign %s to another node, or end the drain with `mesh node drain %s --undo`)", node, module, node)
}
