package state

import (
	"encoding/json"
	"fmt"
	"time"
)

// legacyCommand is a command of formats 1 and 2: one flat struct for every
// op, manifests as text. Logs and snapshots written by those binaries still
// hold them; Decode converts each to the envelope of format 3, so the FSM
// has one apply function per op and no second path.
type legacyCommand struct {
	Op      string       `json:"op"`
	V       int          `json:"v,omitempty"`
	Time    time.Time    `json:"time"`
	MeshID  string       `json:"mesh_id,omitempty"`
	Domain  string       `json:"domain,omitempty"`
	Node    *Node        `json:"node,omitempty"`
	Name    string       `json:"name,omitempty"`
	Modules []legacyText `json:"modules,omitempty"`
	Assign  *Assignment  `json:"assign,omitempty"`
	Secrets []Secret     `json:"secrets,omitempty"`
	Report  *Report      `json:"report,omitempty"`
	Force   bool         `json:"force,omitempty"`

	CACert     string `json:"ca_cert,omitempty"`
	CAKey      string `json:"ca_key,omitempty"`
	JoinSecret string `json:"join_secret,omitempty"`
	Voters     int    `json:"voters,omitempty"`

	Restore *RestoreBody `json:"restore,omitempty"`
}

type legacyText struct {
	File string `json:"file"`
	Text string `json:"text"`
}

// fromLegacy converts a flat command. Its manifests are parsed here, once, on
// the way into the envelope: the only place the FSM path meets YAML, and only
// for history older than format 3. A manifest that no longer parses becomes
// a spec without a parsed form, which the FSM refuses as a rule error, as the
// old binary did. Missing bodies become empty requests, which the apply
// functions refuse as rule errors, also as before.
func fromLegacy(data []byte) (*Command, error) {
	var l legacyCommand
	if err := json.Unmarshal(data, &l); err != nil {
		return nil, err
	}
	var r Request
	switch l.Op {
	case OpInit:
		ir := &InitRequest{MeshID: l.MeshID, Domain: l.Domain, CACert: l.CACert, CAKey: l.CAKey, JoinSecret: l.JoinSecret, Voters: l.Voters}
		if l.Node != nil {
			ir.Node = *l.Node
		}
		r = ir
	case OpNodeAdd:
		nr := &NodeAddRequest{}
		if l.Node != nil {
			nr.Node = *l.Node
		}
		r = nr
	case OpNodeRemove:
		r = &NodeRemoveRequest{Name: l.Name, Force: l.Force}
	case OpPublicDomain:
		r = &PublicDomainRequest{Node: l.Name, Domain: l.Domain}
	case OpModuleAdd:
		mr := &ModuleAddRequest{Secrets: l.Secrets}
		for _, mt := range l.Modules {
			mr.Modules = append(mr.Modules, legacySpec(mt.File, mt.Text))
		}
		r = mr
	case OpModuleRemove:
		r = &ModuleRemoveRequest{Name: l.Name}
	case OpAssign, OpUnassign:
		var a Assignment
		if l.Assign != nil {
			a = *l.Assign
		}
		if l.Op == OpAssign {
			r = &AssignRequest{Assignment: a, Secrets: l.Secrets}
		} else {
			r = &UnassignRequest{Assignment: a}
		}
	case OpReport:
		rr := &ReportRequest{}
		if l.Report != nil {
			rr.Report = *l.Report
		}
		r = rr
	case OpTokenRotate:
		r = &TokenRotateRequest{JoinSecret: l.JoinSecret}
	case OpRestore:
		if l.Restore == nil {
			return nil, fmt.Errorf("a restore command without a snapshot")
		}
		// A module that no longer parses is refused by the FSM, as before.
		_ = l.Restore.ParseSpecs()
		r = l.Restore
	default:
		// Unknown to this binary: keep op and format, so the FSM stops on it.
		return &Command{Op: l.Op, V: max(l.V, 1), Time: l.Time}, nil
	}
	// Now an envelope of this format: what the log gets if it is proposed again.
	c := NewCommand(r)
	c.Time = l.Time
	return c, nil
}

// legacySpec is the spec of a manifest that travelled as text.
func legacySpec(file, text string) ModuleSpec {
	sp, err := SpecOf(file, text)
	if err != nil {
		return ModuleSpec{File: file, Text: text, Digest: "unparsed: " + err.Error()}
	}
	return sp
}
