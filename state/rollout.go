package state

// Rollouts (issue 29 item 3): a change to a module that runs on several
// nodes and declares a health check (or `update:`) is applied to a few of
// its nodes at a time, in assignment order. The rollout is replicated state:
// which version the module goes from and to, which nodes it has reached,
// and how it stands. Composition gives the nodes not reached yet the
// previous version's manifest (Input.Held), so their plans do not change.
// The leader's driver (agent/rollout.go) reads the nodes' reports, decides
// with Progress (pure, here) and proposes each step as a rollout.step
// command, whose description is what `mesh why` and the plans' history say
// of it. A failed step with auto-revert puts the previous version back in
// the catalogue; every reached node goes back to it.
//
// Every version a module is given from this format on is kept in
// module_history (manifest, digest, when, the command), so a revert is
// exact: the previous manifest, from the history, not from memory.

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"slices"
	"sort"
	"strings"
	"time"

	"mesh/state/manifest"
)

// rolloutFormat is the command format of rollouts: rollout.step,
// module.revert, and module.add of a manifest that rolls out (one with
// `update:` or a health check), which records the module's history.
const rolloutFormat = 10

// Ops of rollouts.
const (
	OpRolloutStep  = "rollout.step"
	OpModuleRevert = "module.revert"
)

// Rollout states.
const (
	RolloutRunning  = "running"
	RolloutDone     = "done"
	RolloutFailed   = "failed"   // stopped; the reached nodes keep the new version
	RolloutReverted = "reverted" // stopped; every node is back on the previous version
)

// Policy is how a module's changes roll out.
type Policy struct {
	MaxParallel int           `json:"max_parallel"`
	HealthyFor  time.Duration `json:"healthy_for"`
	AutoRevert  bool          `json:"auto_revert"`
}

// Policy defaults (the issue's): one node at a time, healthy for 10 s,
// reverted on failure.
const (
	DefaultMaxParallel = 1
	DefaultHealthyFor  = 10 * time.Second
)

// PolicyOf is the rollout policy of m when it runs on nodes nodes: its
// `update:`, or the defaults when it declares a health check and runs on
// more than one node; false when its changes apply everywhere at once.
func PolicyOf(m *manifest.Manifest, nodes int) (Policy, bool) {
	p := Policy{MaxParallel: DefaultMaxParallel, HealthyFor: DefaultHealthyFor, AutoRevert: true}
	if m == nil {
		return p, false
	}
	if u := m.Update; u != nil {
		if u.MaxParallel > 0 {
			p.MaxParallel = u.MaxParallel
		}
		if u.HealthyFor != "" {
			if d, err := time.ParseDuration(u.HealthyFor); err == nil {
				p.HealthyFor = d
			}
		}
		if u.AutoRevert != nil {
			p.AutoRevert = *u.AutoRevert
		}
		return p, nodes > 0
	}
	return p, nodes > 1 && hasHealthCheck(m)
}

func hasHealthCheck(m *manifest.Manifest) bool {
	for i := range m.Resources {
		if m.Resources[i].Container != "" && m.Resources[i].Typed.Health != nil {
			return true
		}
	}
	return false
}

// rollsOut says whether module.add of m needs the rollout format: a
// manifest that declares how it rolls out, or a health check (the default
// policy's condition).
func rollsOut(m *manifest.Manifest) bool {
	return m != nil && (m.Update != nil || hasHealthCheck(m))
}

// Rollout is a module's rollout, as the state holds it.
type Rollout struct {
	Module string `json:"module"`
	// From and To are the versions (the log index of the command that gave
	// the module each manifest, module_history's version).
	From    uint64   `json:"from_version"`
	To      uint64   `json:"to_version"`
	State   string   `json:"state"`
	Reached []string `json:"reached"`
	// Nodes are the module's nodes, in assignment order.
	Nodes     []string  `json:"nodes"`
	Reason    string    `json:"reason,omitempty"`
	StartedAt time.Time `json:"started_at"`
	// StepIndex and StepAt are the last step's command and time.
	StepIndex uint64    `json:"step_index"`
	StepAt    time.Time `json:"step_at"`
	Policy    Policy    `json:"policy"`
	// FromPull and ToPull are set on the rollout of a `mesh module pull`
	// (the manifest stays; To is the pull's index): the pull index the
	// nodes not reached keep, and the pull's.
	FromPull uint64 `json:"from_pull,omitempty"`
	ToPull   uint64 `json:"to_pull,omitempty"`
	// Secret is set on the rollout of a new value of one of the module's
	// secrets (mesh secret set; To is its index): the nodes not reached
	// keep the value before, which held_secrets holds until it ends.
	Secret string `json:"secret,omitempty"`
}

// Version is one of a module's versions.
type Version struct {
	Module  string    `json:"module"`
	Version uint64    `json:"version"`
	Digest  string    `json:"digest"`
	File    string    `json:"file"`
	At      time.Time `json:"at"`
	Cause   string    `json:"cause"`
	Current bool      `json:"current"`
}

// RolloutStepRequest is one step of a rollout, proposed by the leader's
// driver: reach more nodes, end it, or stop it (Failed: why). It is taken
// only while the rollout is still at To and running, so a step decided on
// an older state is refused.
type RolloutStepRequest struct {
	Module string   `json:"module"`
	To     uint64   `json:"to"`
	Reach  []string `json:"reach,omitempty"`
	Done   bool     `json:"done,omitempty"`
	Failed string   `json:"failed,omitempty"`
	// Why is what the driver saw (n1 healthy for 10s).
	Why string `json:"why,omitempty"`
	// Secret names the secret the rollout carries, for the description
	// only (the FSM reads the rollout's own).
	Secret string `json:"secret,omitempty"`
}

func (*RolloutStepRequest) Op() string { return OpRolloutStep }
func (r *RolloutStepRequest) describe() string {
	what := RolloutName(r.Module, r.To, r.Secret)
	switch {
	case r.Failed != "":
		return fmt.Sprintf("%s stopped: %s", what, r.Failed)
	case r.Done:
		return fmt.Sprintf("%s done (%s)", what, r.Why)
	default:
		return fmt.Sprintf("%s moves on to %s (%s)", what, strings.Join(r.Reach, ", "), r.Why)
	}
}

// RolloutName is how the log, why and status name a rollout: "rollout of
// gitea to v812", or of a secret's new value "rollout of gitea's secret
// smtp (v812)".
func RolloutName(module string, to uint64, secret string) string {
	if secret != "" {
		return fmt.Sprintf("rollout of %s's secret %s (v%d)", module, secret, to)
	}
	return fmt.Sprintf("rollout of %s to v%d", module, to)
}

// ModuleRevertRequest gives a module back a version it had (To; 0: the
// one before the current), through a rollout like any change; during a
// running rollout, it stops it and puts every node back on its previous
// version at once.
type ModuleRevertRequest struct {
	Module string `json:"module"`
	To     uint64 `json:"to,omitempty"`
}

func (*ModuleRevertRequest) Op() string { return OpModuleRevert }
func (r *ModuleRevertRequest) describe() string {
	if r.To != 0 {
		return fmt.Sprintf("mesh module revert %s --to %d", r.Module, r.To)
	}
	return "mesh module revert " + r.Module
}

// bg is the context of the FSM's reads (they carry nothing: applyTx).
var bg = context.Background()

// listRowsQ is listRows for any reader.
func listRowsQ(q queryer, query string, args ...any) ([]string, error) {
	var out []string
	err := eachRow(bg, q, "rows", query, func(rows *sql.Rows) error {
		var s string
		if err := rows.Scan(&s); err != nil {
			return err
		}
		out = append(out, s)
		return nil
	}, args...)
	return out, err
}

// HeldKey names a node's module held at its previous version by a rollout.
type HeldKey struct{ Node, Module string }

// keepHistory records, before the catalogue row of name changes, its
// current version (the first time this format sees it), and after it the
// new one: called by module.add and module.revert of the rollout format.
func (ap *applier) keepHistory(name string) error {
	return exec(ap.tx, `INSERT OR IGNORE INTO module_history (module, version, file, manifest, digest, spec, at, cause)
		SELECT name, version, file, manifest, digest, spec, added_at, '' FROM modules WHERE name = ?`, name)
}

func (ap *applier) recordVersion(name, cause string) error {
	if err := exec(ap.tx, `INSERT OR IGNORE INTO module_history (module, version, file, manifest, digest, spec, at, cause)
		SELECT name, version, file, manifest, digest, spec, added_at, ? FROM modules WHERE name = ?`, cause, name); err != nil {
		return err
	}
	b, err := historyBound(ap.tx)
	if err != nil || !b.Set {
		return err
	}
	return ap.pruneModule(b, name)
}

// moduleNodes lists a module's nodes in assignment order.
func moduleNodes(q queryer, module string) ([]string, error) {
	return listRowsQ(q, `SELECT node FROM assignments WHERE module = ? ORDER BY seq, node`, module)
}

// readRollout reads a module's rollout row (nil: none).
func readRollout(q queryer, module string) (*Rollout, error) {
	r := &Rollout{Module: module}
	var reached, started, stepAt string
	err := q.QueryRowContext(bg, `SELECT from_version, to_version, state, reached, reason, started_at, step_index, step_at, from_pull, to_pull, secret FROM rollouts WHERE module = ?`, module).
		Scan(&r.From, &r.To, &r.State, &reached, &r.Reason, &started, &r.StepIndex, &stepAt, &r.FromPull, &r.ToPull, &r.Secret)
	if errors.Is(err, sql.ErrNoRows) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("read the rollout of %s: %w", module, err)
	}
	r.Reached = strings.Fields(reached)
	r.StartedAt, _ = time.Parse(time.RFC3339Nano, started)
	r.StepAt, _ = time.Parse(time.RFC3339Nano, stepAt)
	return r, nil
}

// startRollout begins the rollout of module name's new version when its
// policy asks for one; from is the version its nodes run now.
func (ap *applier) startRollout(name string, m *manifest.Manifest, from uint64) error {
	nodes, err := moduleNodes(ap.tx, name)
	if err != nil {
		return err
	}
	p, ok := PolicyOf(m, len(nodes))
	old, err := readRollout(ap.tx, name)
	if err != nil {
		return err
	}
	if old != nil && old.State == RolloutFailed {
		if old.ToPull > 0 {
			// A stopped pull: taken back everywhere (the nodes it reached
			// put back their image) before the new version rolls out.
			if err := ap.putPull(name, old.FromPull); err != nil {
				return err
			}
		} else {
			// A fix after a stop: the nodes not reached still run its start.
			from = old.From
		}
	}
	if !ok {
		// Applied everywhere at once: a stopped rollout ends with it.
		return ap.dropRollout(name)
	}
	first := nodes[:min(p.MaxParallel, len(nodes))]
	return ap.writeRollout(name, from, ap.index, 0, 0, "", first)
}

// writeRollout starts a module's rollout (replacing the row of the last).
// A secret's value held by the last one goes: the nodes it had not reached
// take the new value with the new rollout's first step or its held
// manifest (only a rollout of the same secret keeps what they ran).
func (ap *applier) writeRollout(name string, from, to, fromPull, toPull uint64, secret string, first []string) error {
	if err := exec(ap.tx, `DELETE FROM held_secrets WHERE module = ? AND name != ?`, name, secret); err != nil {
		return err
	}
	return exec(ap.tx, `INSERT INTO rollouts (module, from_version, to_version, state, reached, reason, started_at, step_index, step_at, from_pull, to_pull, secret)
		VALUES (?, ?, ?, ?, ?, '', ?, ?, ?, ?, ?, ?)
		ON CONFLICT (module) DO UPDATE SET from_version = excluded.from_version, to_version = excluded.to_version, state = excluded.state,
			reached = excluded.reached, reason = '', started_at = excluded.started_at, step_index = excluded.step_index, step_at = excluded.step_at,
			from_pull = excluded.from_pull, to_pull = excluded.to_pull, secret = excluded.secret`,
		name, from, to, RolloutRunning, strings.Join(first, " "), ap.at, ap.index, ap.at, fromPull, toPull, secret)
}

// secretRolloutFormat is the format of a secret.set whose new value rolls
// out: its proposer saw the module's changes roll out.
const secretRolloutFormat = 14

// startSecretRollout begins the rollout of a new value of one of a
// module's secrets (secretSet has just stored it, and kept the value
// before in held_secrets) when the module's policy asks for one and its
// manifest reads the secret; otherwise the new value goes everywhere at
// once and nothing is held.
func (ap *applier) startSecretRollout(ref SecretRef) error {
	old, err := readRollout(ap.tx, ref.Module)
	if err != nil {
		return err
	}
	// At once everywhere: the value held for this set goes, and a stopped
	// rollout of this secret ends with it (every node takes the new value).
	atOnce := func() error {
		if old != nil && old.Secret == ref.Name {
			return ap.dropRollout(ref.Module)
		}
		return exec(ap.tx, `DELETE FROM held_secrets WHERE module = ? AND name = ?`, ref.Module, ref.Name)
	}
	nodes, err := moduleNodes(ap.tx, ref.Module)
	if err != nil {
		return err
	}
	cat, err := ap.catalogue()
	if err != nil {
		return err
	}
	m := cat[ref.Module]
	p, ok := PolicyOf(m, len(nodes))
	if !ok || m == nil || !manifestReads(m, ref.Name) {
		return atOnce()
	}
	// During a move (a move waits for no rollout, and none starts during
	// one): the module's FROM runs none of its containers, so there is no
	// health to wait on; the value goes to TO and FROM at once.
	if moving, _, _, _, err := ap.moving(ref.Module); err != nil || moving {
		if err != nil {
			return err
		}
		return atOnce()
	}
	if old != nil && old.State == RolloutFailed {
		if old.Secret != ref.Name {
			// Another change stopped midway: the nodes it did not reach
			// keep what it held, and this value goes everywhere at once.
			return atOnce()
		}
		// A fix after a stopped rollout of this secret: the nodes it did
		// not reach still run the value from before it (kept), and the
		// new value rolls out from the start.
	}
	var version uint64
	if err := ap.tx.QueryRow(`SELECT version FROM modules WHERE name = ?`, ref.Module).Scan(&version); err != nil {
		return err
	}
	return ap.writeRollout(ref.Module, version, ap.index, 0, 0, ref.Name, nodes[:min(p.MaxParallel, len(nodes))])
}

// manifestReads says whether a resource of m reads the module's secret name.
func manifestReads(m *manifest.Manifest, name string) bool {
	for i := range m.Resources {
		if slices.Contains(SecretsOf(&m.Resources[i]), name) {
			return true
		}
	}
	return false
}

// dropRollout forgets a module's rollout and what it held.
func (ap *applier) dropRollout(module string) error {
	if err := exec(ap.tx, `DELETE FROM held_secrets WHERE module = ?`, module); err != nil {
		return err
	}
	return exec(ap.tx, `DELETE FROM rollouts WHERE module = ?`, module)
}

// putSecret puts a rollout's held value of a module's secret back as its
// value (a revert): the nodes not reached run it still, the reached ones
// go back to it. Sealed to the nodes of then; a node assigned since gets
// it when a holder seals it again (StaleSecrets).
func (ap *applier) putSecret(module, name string) error {
	ap.markSecret(SecretRef{Module: module, Name: name})
	if err := exec(ap.tx, `INSERT INTO secrets (module, name, sealed, digest, salt, size, set_at, set_index, recipients)
		SELECT module, name, sealed, digest, salt, size, set_at, set_index, recipients FROM held_secrets WHERE module = ? AND name = ?
		ON CONFLICT (module, name) DO UPDATE SET sealed = excluded.sealed, digest = excluded.digest, salt = excluded.salt, size = excluded.size,
			set_at = excluded.set_at, set_index = excluded.set_index, recipients = excluded.recipients`, module, name); err != nil {
		return err
	}
	return exec(ap.tx, `DELETE FROM held_secrets WHERE module = ?`, module)
}

// startPullRollout begins the rollout of a `mesh module pull` when the
// module's policy asks for one: the nodes not reached keep the pull index
// prev (from a stopped rollout: the one they kept).
func (ap *applier) startPullRollout(name string, prev uint64) error {
	nodes, err := moduleNodes(ap.tx, name)
	if err != nil {
		return err
	}
	cat, err := ap.catalogue()
	if err != nil {
		return err
	}
	p, ok := PolicyOf(cat[name], len(nodes))
	if !ok {
		return ap.dropRollout(name)
	}
	old, err := readRollout(ap.tx, name)
	if err != nil {
		return err
	}
	if old != nil && old.State == RolloutFailed {
		if old.ToPull > 0 {
			prev = old.FromPull
		} else if old.From != old.To {
			// A stopped manifest rollout: the pull goes everywhere at once
			// (the nodes not reached keep their manifest, with the pull).
			return nil
		}
	}
	var version uint64
	if err := ap.tx.QueryRow(`SELECT version FROM modules WHERE name = ?`, name).Scan(&version); err != nil {
		return err
	}
	if err := ap.keepHistory(name); err != nil {
		return err
	}
	// Its To is the pull's own index, so no step of an older rollout of the
	// same manifest is taken for it.
	return ap.writeRollout(name, version, ap.index, prev, ap.index, "", nodes[:min(p.MaxParallel, len(nodes))])
}

// refuseAfterStoppedSecret refuses a new manifest or pull of a module
// whose rollout of a secret's new value stopped without going back: the
// nodes it did not reach run the value before, which a rollout of another
// kind could not keep for them (nor give back, reverted).
func refuseAfterStoppedSecret(q queryer, name string) error {
	r, err := readRollout(q, name)
	if err != nil || r == nil || r.State != RolloutFailed || r.Secret == "" {
		return err
	}
	return ruleErr(ErrConflict, "module %s's rollout of a new value of secret %s stopped (reached: %s; its other nodes run the value before): set a fixed value (mesh secret set %s %s) or go back (mesh module revert %s) first", name, r.Secret, strings.Join(r.Reached, ", "), name, r.Secret, name)
}

// refuseDuringRollout refuses a new version of a module while one rolls out.
func refuseDuringRollout(q queryer, name string) error {
	r, err := readRollout(q, name)
	if err != nil || r == nil || r.State != RolloutRunning {
		return err
	}
	what := fmt.Sprintf("v%d", r.To)
	if r.Secret != "" {
		what = fmt.Sprintf("a new value of secret %s (v%d)", r.Secret, r.To)
	}
	return ruleErr(ErrConflict, "module %s is rolling out %s (%d of its nodes reached): wait for it to end (mesh status), or stop it and go back with `mesh module revert %s`", name, what, len(r.Reached), name)
}

func (ap *applier) rolloutStep(r *RolloutStepRequest) (bool, error) {
	ro, err := readRollout(ap.tx, r.Module)
	if err != nil {
		return false, err
	}
	if ro == nil || ro.To != r.To || ro.State != RolloutRunning {
		return false, ruleErr(ErrConflict, "the rollout of %s to v%d is not running (any more)", r.Module, r.To)
	}
	switch {
	case r.Failed != "":
		cat, err := ap.catalogue()
		if err != nil {
			return false, err
		}
		p, _ := PolicyOf(cat[r.Module], 1)
		return true, ap.stopRollout(ro, r.Failed, p.AutoRevert)
	case r.Done:
		nodes, err := moduleNodes(ap.tx, r.Module)
		if err != nil {
			return false, err
		}
		for _, n := range nodes {
			if !slices.Contains(ro.Reached, n) {
				return false, ruleErr(ErrConflict, "the rollout of %s to v%d has not reached %s yet", r.Module, r.To, n)
			}
		}
		// Every node runs the new version: a value held for the others goes.
		if err := exec(ap.tx, `DELETE FROM held_secrets WHERE module = ?`, r.Module); err != nil {
			return false, err
		}
		return true, exec(ap.tx, `UPDATE rollouts SET state = ?, reason = ?, step_index = ?, step_at = ? WHERE module = ?`, RolloutDone, r.Why, ap.index, ap.at, r.Module)
	}
	nodes, err := moduleNodes(ap.tx, r.Module)
	if err != nil {
		return false, err
	}
	if len(r.Reach) == 0 {
		return false, ruleErr(ErrInvalid, "a rollout step names the nodes it reaches, ends it or stops it")
	}
	reached := slices.Clone(ro.Reached)
	for _, n := range r.Reach {
		if !slices.Contains(nodes, n) {
			return false, ruleErr(ErrConflict, "module %s is not assigned to %s", r.Module, n)
		}
		if !slices.Contains(reached, n) {
			reached = append(reached, n)
		}
	}
	return true, exec(ap.tx, `UPDATE rollouts SET reached = ?, step_index = ?, step_at = ? WHERE module = ?`, strings.Join(reached, " "), ap.index, ap.at, r.Module)
}

// stopRollout stops a running rollout: reverting, the previous version
// goes back into the catalogue (every node runs it again); else the
// reached nodes keep the new one.
func (ap *applier) stopRollout(ro *Rollout, why string, revert bool) error {
	if !revert {
		return exec(ap.tx, `UPDATE rollouts SET state = ?, reason = ?, step_index = ?, step_at = ? WHERE module = ?`, RolloutFailed, why, ap.index, ap.at, ro.Module)
	}
	if ro.Secret != "" {
		// A secret's rollout: the value before is the secret's again.
		if err := ap.putSecret(ro.Module, ro.Secret); err != nil {
			return err
		}
	} else if ro.ToPull > 0 {
		// A pull's rollout: the pull index goes back; the reached nodes put
		// back the image their containers ran before it (their ledgers keep it).
		if err := ap.putPull(ro.Module, ro.FromPull); err != nil {
			return err
		}
	} else if err := ap.putVersion(ro.Module, ro.From); err != nil {
		return err
	}
	return exec(ap.tx, `UPDATE rollouts SET state = ?, reason = ?, step_index = ?, step_at = ? WHERE module = ?`, RolloutReverted, why, ap.index, ap.at, ro.Module)
}

// putPull sets a module's pull index back (0: no pull).
func (ap *applier) putPull(module string, idx uint64) error {
	ap.markPull(module)
	if idx == 0 {
		return exec(ap.tx, `DELETE FROM pulls WHERE module = ?`, module)
	}
	return exec(ap.tx, `UPDATE pulls SET idx = ? WHERE module = ?`, idx, module)
}

// putVersion puts a version of the module's history back in the catalogue
// as it was (its version number too).
func (ap *applier) putVersion(module string, version uint64) error {
	var file, text, digest, spec string
	err := ap.tx.QueryRow(`SELECT file, manifest, digest, spec FROM module_history WHERE module = ? AND version = ?`, module, version).Scan(&file, &text, &digest, &spec)
	if errors.Is(err, sql.ErrNoRows) {
		return ruleErr(ErrNotFound, "module %s has no version %d in its history (mesh module history %s)", module, version, module)
	}
	if err != nil {
		return err
	}
	m, err := ap.s.manifestOf(file, digest, spec)
	if err != nil {
		return fmt.Errorf("decode version %d of module %s: %w", version, module, err)
	}
	if err := ap.catalogueSet(module, m); err != nil {
		return err
	}
	return exec(ap.tx, `UPDATE modules SET file = ?, manifest = ?, digest = ?, spec = ?, version = ? WHERE name = ?`, file, text, digest, spec, version, module)
}

func (ap *applier) moduleRevert(r *ModuleRevertRequest) (bool, error) {
	if err := needModule(ap.tx, r.Module, "mesh module list"); err != nil {
		return false, err
	}
	if err := ap.refuseMoving(r.Module, "revert it"); err != nil {
		return false, err
	}
	ro, err := readRollout(ap.tx, r.Module)
	if err != nil {
		return false, err
	}
	if ro != nil && ro.State == RolloutRunning && (r.To == 0 || r.To == ro.From) {
		return true, ap.stopRollout(ro, "stopped by mesh module revert", true)
	}
	if ro != nil && ro.State == RolloutFailed && (ro.ToPull > 0 || ro.Secret != "") && r.To == 0 {
		// A stopped pull or secret: what goes back is the pull or the
		// secret's value, not the manifest.
		if ro.Secret != "" {
			if err := ap.putSecret(r.Module, ro.Secret); err != nil {
				return false, err
			}
		} else if err := ap.putPull(r.Module, ro.FromPull); err != nil {
			return false, err
		}
		return true, exec(ap.tx, `UPDATE rollouts SET state = ?, reason = ?, step_index = ?, step_at = ? WHERE module = ?`,
			RolloutReverted, ro.Reason+"; taken back by mesh module revert", ap.index, ap.at, r.Module)
	}
	if ro != nil && ro.State == RolloutRunning {
		return false, ruleErr(ErrConflict, "module %s is rolling out v%d: `mesh module revert %s` stops it first", r.Module, ro.To, r.Module)
	}
	var cur uint64
	var curDigest string
	if err := ap.tx.QueryRow(`SELECT version, digest FROM modules WHERE name = ?`, r.Module).Scan(&cur, &curDigest); err != nil {
		return false, err
	}
	if err := ap.keepHistory(r.Module); err != nil {
		return false, err
	}
	to := r.To
	if to == 0 {
		err := ap.tx.QueryRow(`SELECT version FROM module_history WHERE module = ? AND version < ? AND digest != ? ORDER BY version DESC LIMIT 1`, r.Module, cur, curDigest).Scan(&to)
		if errors.Is(err, sql.ErrNoRows) {
			return false, ruleErr(ErrNotFound, "module %s has no earlier version in its history to go back to (mesh module history %s)", r.Module, r.Module)
		}
		if err != nil {
			return false, err
		}
	}
	if to == cur {
		return false, ruleErr(ErrConflict, "module %s is at version %d already", r.Module, to)
	}
	var file, text, digest, spec string
	err = ap.tx.QueryRow(`SELECT file, manifest, digest, spec FROM module_history WHERE module = ? AND version = ?`, r.Module, to).Scan(&file, &text, &digest, &spec)
	if errors.Is(err, sql.ErrNoRows) {
		return false, ruleErr(ErrNotFound, "module %s has no version %d in its history (mesh module history %s)", r.Module, to, r.Module)
	}
	if err != nil {
		return false, err
	}
	if digest == curDigest {
		return false, ruleErr(ErrConflict, "version %d of module %s is the manifest it runs now (version %d): there is nothing to go back to", to, r.Module, cur)
	}
	// The old manifest as a new version, rolled out as any change.
	m, err := ap.s.manifestOf(file, digest, spec)
	if err != nil {
		return false, err
	}
	if err := ap.catalogueSet(r.Module, m); err != nil {
		return false, err
	}
	if err := exec(ap.tx, `UPDATE modules SET file = ?, manifest = ?, digest = ?, spec = ?, version = ?, added_at = ? WHERE name = ?`, file, text, digest, spec, ap.index, ap.at, r.Module); err != nil {
		return false, err
	}
	if err := ap.recordVersion(r.Module, fmt.Sprintf("%s (the manifest of v%d)", r.describe(), to)); err != nil {
		return false, err
	}
	return true, ap.startRollout(r.Module, m, cur)
}

// endIfUnassigned drops the rollout of a module assigned nowhere any more:
// a node assigned to it later runs the catalogue's version. Called by
// unassign and node.remove, of any format (a rollout row exists only after
// a command of the rollout format).
func (ap *applier) endIfUnassigned(module string) error {
	if err := exec(ap.tx, `DELETE FROM held_secrets WHERE module = ? AND NOT EXISTS (SELECT 1 FROM assignments WHERE module = ?)`, module, module); err != nil {
		return err
	}
	return exec(ap.tx, `DELETE FROM rollouts WHERE module = ? AND NOT EXISTS (SELECT 1 FROM assignments WHERE module = ?)`, module, module)
}

// heldBack is what the nodes a rollout has not reached yet keep: the
// module's previous manifest (held), for a pull's rollout the pull index
// before it (pulls; the manifest is the same), for a secret's the digest
// of its value before (secrets; on the nodes that value was sealed to).
func heldBack(q queryer) (map[HeldKey]*manifest.Manifest, map[HeldKey]uint64, map[HeldKey]map[string]string, error) {
	held, pulls, secrets := map[HeldKey]*manifest.Manifest{}, map[HeldKey]uint64{}, map[HeldKey]map[string]string{}
	type row struct {
		module, file, digest, spec, secret string
		reached                            []string
		fromPull, toPull                   uint64
	}
	var rows []row
	err := eachRow(bg, q, "rollouts", `SELECT r.module, r.reached, r.from_pull, r.to_pull, r.secret, COALESCE(h.file, ''), COALESCE(h.digest, ''), COALESCE(h.spec, '')
		FROM rollouts r LEFT JOIN module_history h ON h.module = r.module AND h.version = r.from_version
		WHERE r.state IN ('running', 'failed') ORDER BY r.module`, func(rs *sql.Rows) error {
		var x row
		var reached string
		if err := rs.Scan(&x.module, &reached, &x.fromPull, &x.toPull, &x.secret, &x.file, &x.digest, &x.spec); err != nil {
			return err
		}
		x.reached = strings.Fields(reached)
		rows = append(rows, x)
		return nil
	})
	if err != nil {
		return nil, nil, nil, err
	}
	for _, x := range rows {
		nodes, err := moduleNodes(q, x.module)
		if err != nil {
			return nil, nil, nil, err
		}
		if x.secret != "" {
			if err := heldSecret(q, x.module, x.secret, nodes, x.reached, secrets); err != nil {
				return nil, nil, nil, err
			}
			continue
		}
		var m *manifest.Manifest
		if x.toPull == 0 {
			if x.digest == "" {
				continue // no previous version kept: nothing to hold
			}
			if m, err = decodeSpec(x.file, x.digest, x.spec); err != nil {
				return nil, nil, nil, fmt.Errorf("the previous version of %s does not decode: %w", x.module, err)
			}
		}
		for _, n := range nodes {
			if slices.Contains(x.reached, n) {
				continue
			}
			if k := (HeldKey{Node: n, Module: x.module}); m != nil {
				held[k] = m
			} else {
				pulls[k] = x.fromPull
			}
		}
	}
	return held, pulls, secrets, nil
}

// heldSecret adds to out the digest of the held value of module's secret
// for each node of nodes not reached that the value was sealed to (one
// assigned since could not open it: it takes the new value at once).
func heldSecret(q queryer, module, name string, nodes, reached []string, out map[HeldKey]map[string]string) error {
	var digest, recipients string
	err := q.QueryRowContext(bg, `SELECT digest, recipients FROM held_secrets WHERE module = ? AND name = ?`, module, name).Scan(&digest, &recipients)
	if errors.Is(err, sql.ErrNoRows) {
		return nil // nothing held (removed since, or a stopped rollout taken over)
	}
	if err != nil {
		return fmt.Errorf("read the held value of secret %s/%s: %w", module, name, err)
	}
	holder, err := keyHolders(bg, q)
	if err != nil {
		return err
	}
	for _, k := range splitNonEmpty(recipients) {
		n := holder[k]
		if n == "" || !slices.Contains(nodes, n) || slices.Contains(reached, n) {
			continue
		}
		key := HeldKey{Node: n, Module: module}
		if out[key] == nil {
			out[key] = map[string]string{}
		}
		out[key][name] = digest
	}
	return nil
}

// Rollouts reads every module's rollout, with its nodes and policy.
func (s *Store) Rollouts(ctx context.Context) ([]Rollout, error) {
	mods, err := listRowsQ(s.db, `SELECT module FROM rollouts ORDER BY module`)
	if err != nil {
		return nil, err
	}
	cat, err := s.readCatalogue(ctx, s.db)
	if err != nil {
		return nil, err
	}
	var out []Rollout
	for _, m := range mods {
		r, err := readRollout(s.db, m)
		if err != nil {
			return nil, err
		}
		if r == nil {
			continue // gone since the list
		}
		if r.Nodes, err = moduleNodes(s.db, m); err != nil {
			return nil, err
		}
		r.Policy, _ = PolicyOf(cat[m], len(r.Nodes))
		out = append(out, *r)
	}
	return out, nil
}

// History lists a module's versions, the newest first.
func (s *Store) History(ctx context.Context, module string) ([]Version, error) {
	if _, err := s.Module(ctx, module); err != nil {
		return nil, err
	}
	var cur uint64
	if err := s.db.QueryRowContext(ctx, `SELECT version FROM modules WHERE name = ?`, module).Scan(&cur); err != nil {
		return nil, err
	}
	var out []Version
	err := eachRow(ctx, s.db, "module_history", `SELECT version, digest, file, at, cause FROM module_history WHERE module = ? ORDER BY version DESC`, func(rows *sql.Rows) error {
		v := Version{Module: module}
		var at string
		if err := rows.Scan(&v.Version, &v.Digest, &v.File, &at, &v.Cause); err != nil {
			return err
		}
		v.At, _ = time.Parse(time.RFC3339Nano, at)
		v.Current = v.Version == cur
		out = append(out, v)
		return nil
	}, module)
	if err != nil {
		return nil, err
	}
	if len(out) == 0 || !slices.ContainsFunc(out, func(v Version) bool { return v.Current }) {
		// Versions given before the history was kept: the current one only.
		var v Version
		var at string
		if err := s.db.QueryRowContext(ctx, `SELECT version, digest, file, added_at FROM modules WHERE name = ?`, module).Scan(&v.Version, &v.Digest, &v.File, &at); err != nil {
			return nil, err
		}
		v.Module, v.Current = module, true
		v.At, _ = time.Parse(time.RFC3339Nano, at)
		out = append([]Version{v}, out...)
		sort.SliceStable(out, func(i, j int) bool { return out[i].Version > out[j].Version })
	}
	return out, nil
}

// RollsOut says whether a change to module rolls out now (its policy, on
// the nodes it runs on): the proposer of a pull asks for the rollout
// format then.
func (s *Store) RollsOut(ctx context.Context, module string) (bool, error) {
	cat, err := s.readCatalogue(ctx, s.db)
	if err != nil {
		return false, err
	}
	m, ok := cat[module]
	if !ok {
		return false, nil // the FSM says it is not in the catalogue
	}
	nodes, err := moduleNodes(s.db, module)
	if err != nil {
		return false, err
	}
	_, ok = PolicyOf(m, len(nodes))
	return ok, nil
}
