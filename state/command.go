package state

import (
	"encoding/json"
	"fmt"
	"maps"
	"slices"
	"sort"
	"strings"
	"time"

	"mesh/state/manifest"
)

// Ops, the kinds of command.
const (
	OpInit         = "init"
	OpNodeAdd      = "node.add"
	OpNodeRemove   = "node.remove"
	OpPublicDomain = "node.public-domain"
	OpModuleAdd    = "module.add"
	OpModuleRemove = "module.remove"
	OpAssign       = "assign"
	OpUnassign     = "unassign"
	OpReport       = "report"
	OpTokenRotate  = "token.rotate"
	OpRestore      = "restore"
	OpModulePull   = "module.pull"
	OpSeal         = "credential.seal"
	OpNodeKey      = "node.key"
	OpNodeCert     = "node.cert"
	OpNodeOverlay  = "node.overlay"
	// The operator's secrets' ops are in secret.go.

	timeLayout = time.RFC3339Nano
)

// CommandVersion is the newest command format this binary applies. A
// command carries the format it needs (V); a node that meets a newer one
// stops applying and says so (it never skips it, which would let replicas
// diverge), and a leader refuses to propose one that a node it knows of
// cannot apply yet.
//
// Formats: 1, flat commands that carried manifest text; 2, the restore op;
// 3, the envelope below with one typed request per op, manifests parsed by
// the proposer; 4, the module.pull op; 5, sealed credentials (seal.go): the
// credential.seal, node.key and node.cert ops, nodes with a sealing key, and secrets
// carried sealed; 6, node.cert with the key of the node's certificate, which
// its peers then require of it (a key pinned per node); 7, the overlay
// (overlay.go): node.overlay, a mesh's overlay prefix at init and a node's
// overlay key and endpoint in init and node.add. Entries of formats 1 and 2
// still in a log are converted on replay (legacy.go); 8, the operator's
// secrets (secret.go): secret.set, secret.rm and secret.seal, a manifest
// that names one (a secret resource, env-secrets), and a restore that
// carries them; and the CA's rotation (ca.go): ca.rotate, node.cert with the
// digest of the certificate's CA, credential.seal with the new CA's key.
// 9, the public edge (edge.go): node.acme, several public domains, routes
// with hosts; node.drain (drain.go) and module.restart (restart.go).
// 10, rollouts (rollout.go): rollout.step, module.revert, and module.add of
// a manifest that rolls out, which keeps the module's history.
// 11, a manifest with a container's tty:, init:, pids-limit: or group-add:
// (containerKeysFormat).
// 12, a manifest with a data directory (data: true, dataFormat): an older
// node would remove it, empty, when the module goes; an unassign with
// --purge-data; history.keep, and an init that sets the history's bound
// (historyFormat, history.go).
// 13, a manifest with backup: or a before-backup step (backupFormat): an
// older node would store the module without its backups, and run its
// before-backup steps at every apply as ordinary steps; backup.repo.set
// (backup.go), the repository and its password sealed to every node;
// module.move and move.step (move.go).
// 14, a secret.set that rolls out (secretRolloutFormat, rollout.go): an
// older node would give every node the new value at once.
// 15, an assign or an unassign of several modules (batchFormat): an older
// node would take the first module alone.
// 16, an assign of several modules that checks the rule on host names once,
// the whole batch against the state before it (batchHostsFormat): format
// 15 checked it after each module, reading and sorting the whole fleet's
// routes each time (at 10,000 modules a batch of 100 took seconds), and
// the two can tell a contrived batch apart by which clash it names or,
// where a module takes a host's first claim from another, by whether it
// is refused.
// 17, a module add, an assign or an unassign of more than describedNames
// modules (shortCauseFormat): its cause, kept with each version of a module
// it adds, each plan it changes and each name it moves, names the first
// describedNames files or modules and how many more. Format 16 named every
// one: a module add of 2,000 modules that roll out kept 44 MB of causes
// (22 kB for each module's version), and one of 10,000 would keep 1.1 GB.
// 18, a module.move that refuses a module that would not compose on TO
// next to what runs there (moveFitFormat, move.go): an older node would
// take it, and TO would receive the module's data (inside another
// module's mounted directory, say) before its plan said no.
// 19, a move.step that finishes a done move only while TO still runs the
// module (finishFormat, move.go): an older node would purge FROM's copy of
// the data of a module unassigned from TO since, maybe the last one.
// 20, an unassign with --purge-data (purgeMovedFormat, move.go) that
// refuses to purge TO's copy of a module moved there while FROM still
// keeps its own: an older node would purge it, and a finish once the
// module was assigned there again would purge FROM's, the last copy.
// 21, a snapshot restore that rewrites the secrets (keepRepoFormat,
// restore.go) and keeps the mesh's own (the backup repository's password)
// as they are: an older node would put the snapshot's back, or none,
// beside the repository's URL of now, which the restore keeps, and every
// backup made since could no longer be read.
const CommandVersion = 21

// keepRepoFormat is the format of a restore that keeps the mesh's own
// secrets (MeshSecrets) as they are.
const keepRepoFormat = 21

// purgeMovedFormat is the format of an unassign with --purge-data that
// refuses while a done move keeps FROM's copy of the module's data.
const purgeMovedFormat = 20

// finishFormat is the format of a move.step --finish that refuses when
// the move's TO no longer runs the module.
const finishFormat = 19

// moveFitFormat is the format of a module.move that checks the module
// composes on TO.
const moveFitFormat = 18

// shortCauseFormat is the format of a command whose cause lists at most
// describedNames files or modules (causeAt).
const shortCauseFormat = 17

// describedNames is how many files or modules a cause names.
const describedNames = 10

// batchFormat is the format of an assign or an unassign of several modules.
const batchFormat = 15

// batchHostsFormat is the format of an assign of several modules.
const batchHostsFormat = 16

// backupFormat is the format of a manifest that declares backups: a
// backup: policy, or a step with before-backup: true.
const backupFormat = 13

// dataFormat is the format of a manifest that marks a directory as data.
const dataFormat = 12

// containerKeysFormat is the format of a manifest that declares a
// container's (or step's) tty:, init:, pids-limit: or group-add:.
const containerKeysFormat = 11

// ops is every op this binary knows, one row each: the one place an op is
// registered. NewCommand, NeedsVersion, Encode, Request and Apply all read
// it, so no op is known to one of them and unknown to another.
var ops = map[string]opDef{
	OpInit:          opOf(5, (*applier).init),
	OpNodeAdd:       opOf(3, (*applier).nodeAdd),
	OpNodeRemove:    opOf(3, (*applier).nodeRemove),
	OpPublicDomain:  nodeScoped(opOf(3, (*applier).publicDomain)),
	OpModuleAdd:     opOf(3, (*applier).moduleAdd),
	OpModuleRemove:  opOf(3, (*applier).moduleRemove),
	OpAssign:        opOf(3, (*applier).assign),
	OpUnassign:      opOf(3, (*applier).unassign),
	OpReport:        opOf(3, (*applier).report),
	OpTokenRotate:   opOf(3, (*applier).tokenRotate),
	OpRestore:       opOf(3, (*applier).restore),
	OpModulePull:    scoped(opOf(4, (*applier).modulePull)),
	OpSeal:          opOf(5, (*applier).seal),
	OpNodeKey:       opOf(5, (*applier).nodeKey),
	OpNodeCert:      opOf(5, (*applier).nodeCert),
	OpNodeOverlay:   opOf(7, (*applier).nodeOverlay),
	OpSecretSet:     scoped(opOf(secretFormat, (*applier).secretSet)),
	OpSecretRemove:  scoped(opOf(secretFormat, (*applier).secretRemove)),
	OpSecretSeal:    opOf(secretFormat, (*applier).secretSeal),
	OpCARotate:      opOf(secretFormat, (*applier).caRotate),
	OpNodeACME:      nodeScoped(opOf(edgeFormat, (*applier).nodeACME)),
	OpNodeDrain:     opOf(edgeFormat, (*applier).nodeDrain),
	OpModuleRestart: scoped(opOf(edgeFormat, (*applier).moduleRestart)),
	OpRolloutStep:   scoped(opOf(rolloutFormat, (*applier).rolloutStep)),
	OpModuleRevert:  scoped(opOf(rolloutFormat, (*applier).moduleRevert)),
	OpHistoryKeep:   opOf(historyFormat, (*applier).historyKeep),
	OpBackupRepoSet: opOf(backupFormat, (*applier).backupRepoSet),
	OpModuleMove:    opOf(backupFormat, (*applier).moduleMove),
	OpMoveStep:      opOf(backupFormat, (*applier).moveStep),
}

// opDef is one op: the format it needs when this binary writes it, a fresh
// request to decode its body into, and its apply function (fsm.go).
type opDef struct {
	format  int
	request func() Request
	apply   func(ap *applier, r Request) (bool, error)
}

// opOf makes an op's row from its apply function: the request its body
// decodes into is the type that function takes, so the two cannot differ.
func opOf[R any, P interface {
	*R
	Request
}](format int, apply func(*applier, P) (bool, error)) opDef {
	return opDef{
		format:  format,
		request: func() Request { return P(new(R)) },
		apply:   func(ap *applier, r Request) (bool, error) { return apply(ap, r.(P)) },
	}
}

// Command is one replicated change: an envelope of the op, the format it
// needs, the proposer's time, and the op's typed request. Everything Apply
// needs that is not already in the state travels in it: the time, generated
// secrets, and manifests already parsed and checked by the proposer.
type Command struct {
	Op   string          `json:"op"`
	V    int             `json:"v"`
	Time time.Time       `json:"time"`
	Body json.RawMessage `json:"body,omitempty"`
}

// Request is the body of one op.
type Request interface {
	Op() string
	describe() string
}

// Describe is what a request's command says of itself (plans' causes, mesh
// why, the log).
func Describe(r Request) string { return r.describe() }

// NewCommand wraps r in an envelope; the proposer stamps Time.
func NewCommand(r Request) *Command {
	b, err := json.Marshal(r)
	if err != nil {
		panic(fmt.Sprintf("state: encode a %s request: %v", r.Op(), err))
	}
	v := ops[r.Op()].format
	if x, ok := r.(interface{ formatNeeded() int }); ok {
		v = max(v, x.formatNeeded())
	}
	return &Command{Op: r.Op(), V: v, Body: b}
}

// Requests whose format depends on what they carry: one that carries
// something sealed (seal.go) needs format 5, so a node whose binary is
// older is never asked to apply what it would read differently; one that
// does not stays at its op's format, so a rolling upgrade can go on
// assigning.
func (r *AssignRequest) formatNeeded() int {
	return max(sealedFormat(r.Secrets), iff(len(r.More) > 0, batchHostsFormat), iff(len(r.More)+1 > describedNames, shortCauseFormat))
}
func (r *ModuleAddRequest) formatNeeded() int {
	v := max(sealedFormat(r.Secrets), iff(len(r.Modules) > describedNames, shortCauseFormat))
	for _, sp := range r.Modules {
		v = max(v, specFormat(sp), iff(rollsOut(sp.Manifest), rolloutFormat))
	}
	return v
}
func (r *RestoreBody) formatNeeded() int {
	v := sealedFormat(r.Credentials)
	if len(r.ACME) > 0 || slices.ContainsFunc(slices.Collect(maps.Values(r.PublicDomains)), func(d string) bool { return d != "" && !validDomain(d) }) {
		v = edgeFormat
	} else if r.Secrets != nil && len(*r.Secrets) > 0 {
		v = secretFormat
	}
	if r.Secrets != nil {
		v = max(v, keepRepoFormat)
	}
	for _, m := range r.Modules {
		v = max(v, specFormat(m.ModuleSpec))
	}
	return v
}
func (r *ModuleMoveRequest) formatNeeded() int { return moveFitFormat }
func (r *MoveStepRequest) formatNeeded() int   { return iff(r.Finish, finishFormat) }
func (r *NodeAddRequest) formatNeeded() int {
	return max(iff(r.Node.SealKey != "", 5), iff(r.Node.OverlayKey != "", 7))
}

// An init by this binary sets the history's default bound (history.go).
func (r *InitRequest) formatNeeded() int {
	return max(iff(r.Overlay != "" || r.Node.OverlayKey != "", 7), historyFormat)
}
func (r *TokenRotateRequest) formatNeeded() int { return iff(r.Sealed != nil, 5) }
func (r *PublicDomainRequest) formatNeeded() int {
	return iff(len(r.Domains) > 1 || len(r.Add) > 0 || len(r.Remove) > 0, edgeFormat)
}
func (r *NodeCertRequest) formatNeeded() int {
	return max(iff(r.Key != "", 6), iff(r.CA != "", secretFormat))
}

func sealedFormat(secrets []Secret) int {
	for _, s := range secrets {
		if s.Sealed != "" {
			return 5
		}
	}
	return 0
}

func iff(cond bool, v int) int {
	if cond {
		return v
	}
	return 0
}

// NeedsVersion is the command format c needs (0 for an unknown op).
func (c *Command) NeedsVersion() int {
	if c.V > 0 {
		return c.V
	}
	return ops[c.Op].format
}

// Encode serialises a command for the log.
func (c *Command) Encode() []byte {
	if c.V == 0 {
		c.V = ops[c.Op].format
	}
	b, err := json.Marshal(c)
	if err != nil {
		panic(err)
	}
	return b
}

// Decode reads a command as written to the log or sent to the leader: an
// envelope of this format, or a flat command of formats 1 and 2, which it
// converts. An error means the bytes are not a command at all.
func Decode(data []byte) (*Command, error) {
	var c Command
	if err := json.Unmarshal(data, &c); err != nil {
		return nil, err
	}
	if c.V >= 3 {
		return &c, nil
	}
	return fromLegacy(data)
}

// Request decodes the command's body into the request type of its op. An
// unknown op or a newer format is ErrUnknownCommand; a body that does not
// decode is an error of its own (the log is corrupt).
func (c *Command) Request() (Request, error) {
	if c.V > CommandVersion {
		return nil, fmt.Errorf("%w: a %q command of format v%d", ErrUnknownCommand, c.Op, c.V)
	}
	op, ok := ops[c.Op]
	if !ok {
		return nil, fmt.Errorf("%w: a %q command of format v%d", ErrUnknownCommand, c.Op, c.V)
	}
	r := op.request()
	if err := json.Unmarshal(c.Body, r); err != nil {
		return nil, fmt.Errorf("the body of a %s command does not decode: %w", c.Op, err)
	}
	return r, nil
}

// ErrUnknownCommand: the command is of an op or format this binary does not know.
var ErrUnknownCommand = fmt.Errorf("unknown command")

// Describe says what a command did, in the operator's words (no secrets).
func (c *Command) Describe() string {
	r, err := c.Request()
	if err != nil {
		return c.Op
	}
	return r.describe()
}

// InitRequest starts a mesh: its identity, chosen by the proposer so that
// any node can admit a joining one, and its first node.
type InitRequest struct {
	MeshID string `json:"mesh_id"`
	Domain string `json:"domain,omitempty"`
	Node   Node   `json:"node"`
	CACert string `json:"ca_cert"`
	// CAKey and JoinSecret in plain text are in commands of older meshes;
	// this one seals them to the first node (SealedCAKey, SealedJoinSecret).
	CAKey            string       `json:"ca_key,omitempty"`
	JoinSecret       string       `json:"join_secret,omitempty"`
	SealedCAKey      *VoterSecret `json:"sealed_ca_key,omitempty"`
	SealedJoinSecret *VoterSecret `json:"sealed_join_secret,omitempty"`
	Voters           int          `json:"voters,omitempty"`
	// Overlay is the mesh's overlay: a prefix, or OverlayOff (overlay.go).
	Overlay string `json:"overlay,omitempty"`
}

// NodeAddRequest admits a node.
type NodeAddRequest struct {
	Node Node `json:"node"`
}

// NodeRemoveRequest removes a node; Force also drops its assignments.
type NodeRemoveRequest struct {
	Name  string `json:"name"`
	Force bool   `json:"force,omitempty"`
}

// PublicDomainRequest sets (or, empty, clears) a node's public domain;
// Domains sets several (edge.go), and Add or Remove change the node's
// list in the FSM, so two operators adding one each both land.
type PublicDomainRequest struct {
	Node    string   `json:"node"`
	Domain  string   `json:"domain"`
	Domains []string `json:"domains,omitempty"`
	Add     []string `json:"add,omitempty"`
	Remove  []string `json:"remove,omitempty"`
}

// ModuleAddRequest adds or replaces manifests, with the secrets of the
// credentials they consume (generated by the proposer).
type ModuleAddRequest struct {
	Modules []ModuleSpec `json:"modules"`
	Secrets []Secret     `json:"secrets,omitempty"`
}

// ModuleRemoveRequest removes a module from the catalogue.
type ModuleRemoveRequest struct {
	Name string `json:"name"`
}

// ModulePullRequest asks every node running the module to pull its
// containers' images now and replace the containers whose image changed.
type ModulePullRequest struct {
	Module string `json:"module"`
	// Rollout: the proposer saw the module roll out (rollout.go); the
	// command then needs the rollout format, whose FSM rolls the pull out.
	Rollout bool `json:"rollout,omitempty"`
}

func (r *ModulePullRequest) formatNeeded() int { return iff(r.Rollout, rolloutFormat) }

// AssignRequest assigns a module to a node, with the secrets of the
// credentials it consumes (the FSM keeps the first secret it sees per pair).
type AssignRequest struct {
	Assignment
	// More is further modules the same command assigns to the same node:
	// `mesh assign NODE MODULE...`, all or none.
	More    []string `json:"more,omitempty"`
	Secrets []Secret `json:"secrets,omitempty"`
}

// All is every assignment the command makes, in order.
func (r *AssignRequest) All() []Assignment { return batch(r.Assignment, r.More) }

func batch(first Assignment, more []string) []Assignment {
	out := []Assignment{first}
	for _, m := range more {
		out = append(out, Assignment{Node: first.Node, Module: m})
	}
	return out
}

// UnassignRequest takes a module off a node. PurgeData lists the module's
// data directories the operator confirmed the node removes, with all they
// hold, once the module's containers are gone (issue 30): each must be one
// of the module's data directories.
type UnassignRequest struct {
	Assignment
	// More is further modules the same command takes off the same node.
	More      []string `json:"more,omitempty"`
	PurgeData []string `json:"purge_data,omitempty"`
}

// All is every assignment the command takes away, in order.
func (r *UnassignRequest) All() []Assignment { return batch(r.Assignment, r.More) }

// A purge needs format 12: an older replica would not record it, and its
// state would differ from the others'; and format 20, which refuses one
// on the TO of a done move (purgeMovedFormat).
func (r *UnassignRequest) formatNeeded() int {
	return max(iff(len(r.PurgeData) > 0, purgeMovedFormat), iff(len(r.More) > 0, batchFormat), iff(len(r.More)+1 > describedNames, shortCauseFormat))
}

// ReportRequest is what a node says it last applied.
type ReportRequest struct {
	Report Report `json:"report"`
}

// TokenRotateRequest replaces the join secret: sealed to the voters (the
// plain JoinSecret is in commands of older meshes).
type TokenRotateRequest struct {
	JoinSecret string       `json:"join_secret,omitempty"`
	Sealed     *VoterSecret `json:"sealed,omitempty"`
}

func (*InitRequest) Op() string         { return OpInit }
func (*ModulePullRequest) Op() string   { return OpModulePull }
func (*NodeAddRequest) Op() string      { return OpNodeAdd }
func (*NodeRemoveRequest) Op() string   { return OpNodeRemove }
func (*PublicDomainRequest) Op() string { return OpPublicDomain }
func (*ModuleAddRequest) Op() string    { return OpModuleAdd }
func (*ModuleRemoveRequest) Op() string { return OpModuleRemove }
func (*AssignRequest) Op() string       { return OpAssign }
func (*UnassignRequest) Op() string     { return OpUnassign }
func (*ReportRequest) Op() string       { return OpReport }
func (*TokenRotateRequest) Op() string  { return OpTokenRotate }
func (*RestoreBody) Op() string         { return OpRestore }

func (r *InitRequest) describe() string    { return "mesh init --name " + r.Node.Name }
func (r *NodeAddRequest) describe() string { return "node " + r.Node.Name + " joined" }
func (r *NodeRemoveRequest) describe() string {
	return "mesh node remove " + r.Name
}
func (r *PublicDomainRequest) describe() string {
	switch {
	case len(r.Add) > 0:
		return "mesh node public-domain " + r.Node + " --add " + strings.Join(r.Add, " ")
	case len(r.Remove) > 0:
		return "mesh node public-domain " + r.Node + " --remove " + strings.Join(r.Remove, " ")
	case len(r.Domains) > 0:
		return "mesh node public-domain " + r.Node + " " + strings.Join(r.Domains, " ")
	}
	if r.Domain == "" {
		return "mesh node public-domain " + r.Node + " --clear"
	}
	return "mesh node public-domain " + r.Node + " " + r.Domain
}
func (r *ModuleAddRequest) describe() string { return r.describeWith(joined) }
func (r *ModuleAddRequest) describeWith(list func([]string) string) string {
	var names []string
	for _, m := range r.Modules {
		names = append(names, m.File)
	}
	sort.Strings(names)
	return "mesh module add " + list(names)
}

// causeAt is what a command of format v keeps as the cause of what it
// changes: its description, whose list of files or modules is cut to
// describedNames from shortCauseFormat on.
func causeAt(req Request, v int) string {
	if v < shortCauseFormat {
		return req.describe()
	}
	if r, ok := req.(interface {
		describeWith(func([]string) string) string
	}); ok {
		return r.describeWith(listed)
	}
	return req.describe()
}

// joined is names joined by spaces: how a description lists them.
func joined(names []string) string { return strings.Join(names, " ") }

// listed is names joined by spaces, the first describedNames of them and
// how many more: how a cause of shortCauseFormat lists them.
func listed(names []string) string {
	if len(names) <= describedNames {
		return strings.Join(names, " ")
	}
	return strings.Join(names[:describedNames], " ") + fmt.Sprintf(" and %d more", len(names)-describedNames)
}
func (r *ModuleRemoveRequest) describe() string { return "mesh module remove " + r.Name }
func (r *ModulePullRequest) describe() string   { return "mesh module pull " + r.Module }
func (r *AssignRequest) describe() string       { return r.describeWith(joined) }
func (r *AssignRequest) describeWith(list func([]string) string) string {
	return "mesh assign " + r.Node + " " + list(append([]string{r.Module}, r.More...)) + rotations(r.Secrets)
}
func (r *UnassignRequest) describe() string { return r.describeWith(joined) }
func (r *UnassignRequest) describeWith(list func([]string) string) string {
	return "mesh unassign " + r.Node + " " + list(append([]string{r.Module}, r.More...))
}
func (r *ReportRequest) describe() string      { return "report of " + r.Report.Node }
func (r *TokenRotateRequest) describe() string { return "mesh token --rotate" }
func (r *RestoreBody) describe() string {
	return fmt.Sprintf("mesh snapshot restore (the state at index %d)", r.Index)
}

// ModuleSpec is one manifest as the proposer read, parsed and checked it: the
// text (kept for `mesh module show`), its digest, and the parsed form, which
// is all the FSM reads. The FSM never parses YAML, so two binaries whose
// parsers differ cannot make replicas disagree.
type ModuleSpec struct {
	File     string             `json:"file"`
	Text     string             `json:"text"`
	Digest   string             `json:"digest"`
	Manifest *manifest.Manifest `json:"manifest"`
}

// specFormat is the format a module's parsed form needs: an older binary
// decodes it without the keys it does not know (public-ports:,
// log-max-size:, both of format 7; tty:, init:, pids-limit:, group-add:,
// of format 11; backup: and before-backup:, of format 13) and would store
// and run another module than the newer nodes do.
func specFormat(sp ModuleSpec) int {
	if sp.Manifest == nil {
		return 0
	}
	if sp.Manifest.Backup != nil {
		return backupFormat
	}
	for i := range sp.Manifest.Resources {
		if sp.Manifest.Resources[i].BeforeBackup {
			return backupFormat
		}
	}
	format := 0
	for _, r := range sp.Manifest.Resources {
		if r.Data || r.Schedule != "" {
			return dataFormat
		}
		if r.TTY || r.Init || r.PidsLimit != nil || r.GroupAdd != nil {
			format = containerKeysFormat
		}
	}
	if format != 0 {
		return format
	}
	if manifestNeedsEdge(sp.Manifest) {
		return edgeFormat
	}
	if manifestNamesSecrets(sp.Manifest) {
		return secretFormat
	}
	for _, r := range sp.Manifest.Resources {
		if r.PublicPorts != nil || r.LogMaxSize != "" {
			return 7
		}
	}
	return 0
}

// SpecOf parses and checks a manifest for a command (the proposer's side).
func SpecOf(file, text string) (ModuleSpec, error) {
	m, err := manifest.Parse(file, []byte(text))
	if err != nil {
		return ModuleSpec{}, err
	}
	return ModuleSpec{File: file, Text: text, Digest: m.Digest, Manifest: m}, nil
}

// check is what the FSM verifies of a spec, without parsing: it is whole, and
// its digest is that of its text.
func (sp *ModuleSpec) check() error {
	if sp.Manifest == nil || sp.Manifest.Module == "" {
		return ruleErr(ErrInvalid, "the manifest from %s carries no parsed module (was it proposed by an older mesh?)", sp.File)
	}
	if sp.Digest != manifest.Digest([]byte(sp.Text)) {
		return ruleErr(ErrInvalid, "the manifest from %s does not match its digest", sp.File)
	}
	sp.Manifest.IndexProviders() // decoded with the command, not yet shared
	return nil
}

// specJSON is the parsed form as the catalogue stores it.
func (sp *ModuleSpec) specJSON() string { return jsonString(sp.Manifest) }

// decodeSpec reads a stored parsed form.
func decodeSpec(file, digest, spec string) (*manifest.Manifest, error) {
	var m manifest.Manifest
	if err := json.Unmarshal([]byte(spec), &m); err != nil {
		return nil, err
	}
	m.File, m.Digest = file, digest
	m.IndexProviders()
	return &m, nil
}
