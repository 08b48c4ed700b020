package state

import (
	"fmt"
	"strings"
	"time"
	"unicode/utf8"
)

// Outcome is what an apply did with one resource: the word reports, log
// lines, metrics and the CLI all use. Every room names these constants and
// never spells the words itself.
type Outcome string

// Outcomes of a resource in an apply.
const (
	Unchanged Outcome = "unchanged"
	Created   Outcome = "created"
	Updated   Outcome = "updated"
	Replaced  Outcome = "replaced"
	Started   Outcome = "started"
	Restarted Outcome = "restarted" // `mesh restart`: the same container, stopped and started
	Ran       Outcome = "ran"
	Kept      Outcome = "kept"
	Removed   Outcome = "removed"
	Restored  Outcome = "restored" // a taken-over file's original was put back
	Stopped   Outcome = "stopped"  // a running container whose mount went bad
	Failed    Outcome = "failed"
	Waiting   Outcome = "waiting" // not applied: its module, or a provider, failed first
)

// Report is what a node says it last applied.
type Report struct {
	Node      string           `json:"node"`
	Version   uint64           `json:"version"`
	AppliedAt time.Time        `json:"applied_at"`
	Error     string           `json:"error,omitempty"`
	Resources []ResourceReport `json:"resources,omitempty"`
	// Mutations counts the changes the apply made: mutating Podman calls and
	// files or directories written or removed. Zero when nothing changed.
	Mutations int `json:"mutations"`
	// Failures lists each module that failed in this apply: where, why, and
	// which of its resources (or its consumers') wait behind it.
	Failures []ModuleFailure `json:"failures,omitempty"`
	// Health is each health-checked container's health, as the node last
	// saw it (a change of health sends the report again, without an apply).
	Health []ContainerHealth `json:"health,omitempty"`
	// Exits lists the containers that exited since the mesh made them
	// (a crash, or a restart loop), as the node last saw them.
	Exits []ContainerExit `json:"exits,omitempty"`
	// Certificates is, per public routed name of the node, the certificate
	// its route proxy serves on port 443, or why it serves none (issue 28).
	Certificates []CertStatus `json:"certificates,omitempty"`
	// Scheduled is each scheduled step's last run and next slot (issue 30).
	Scheduled []ScheduledRun `json:"scheduled,omitempty"`
	// Backups is, per module of the node with data, its last backup and,
	// for one with backup: schedule:, its next (issue 30).
	Backups []BackupRun `json:"backups,omitempty"`
}

// BackupRun is a module's backups on its node: the last one (when, whether
// it succeeded and why not, the snapshot it made), the last that
// succeeded, and for a scheduled one its next slot and whether it is
// overdue.
type BackupRun struct {
	Module   string    `json:"module"`
	Last     time.Time `json:"last,omitzero"`
	OK       bool      `json:"ok"`
	Reason   string    `json:"reason,omitempty"`
	Snapshot string    `json:"snapshot,omitempty"`
	// LastOK is when the last backup that succeeded ended.
	LastOK   time.Time `json:"last_ok,omitzero"`
	Schedule string    `json:"schedule,omitempty"`
	Next     time.Time `json:"next,omitzero"`
	// By is who asked for the last one: "schedule" or the command's node.
	By string `json:"by,omitempty"`
}

// ScheduledRun is a scheduled step as its node last ran it: when, whether
// it succeeded (why not), and its next slot.
type ScheduledRun struct {
	Module string    `json:"module"`
	Step   string    `json:"step"`
	Last   time.Time `json:"last,omitzero"`
	OK     bool      `json:"ok"`
	Reason string    `json:"reason,omitempty"`
	Next   time.Time `json:"next"`
}

// MaxScheduled caps the scheduled steps one report tells of.
const MaxScheduled = 256

// MaxCertificates caps the names one report tells certificates of, and
// MaxCertError the text of each one's error (with both, a report's
// certificates are at most about 0.8 MB).
const (
	MaxCertificates = 512
	MaxCertError    = 1024
)

// CertStatus is what a node's route proxy serves for one routed name, as
// the node last looked: the certificate's issuer and expiry, or the error
// (the handshake's, and the last error the proxy logged for the name).
type CertStatus struct {
	Name     string    `json:"name"`
	Module   string    `json:"module"`
	Issuer   string    `json:"issuer,omitempty"`
	NotAfter time.Time `json:"not_after,omitzero"`
	Error    string    `json:"error,omitempty"`
}

// ContainerExit is a container that exited: how, how often, and its last
// lines of output.
type ContainerExit struct {
	Module    string    `json:"module"`
	Container string    `json:"container"`
	ExitCode  int       `json:"exit_code"`
	Restarts  int       `json:"restarts"` // Podman's restart count
	At        time.Time `json:"at"`       // the last exit
	Logs      string    `json:"logs,omitempty"`
}

// Container health statuses (Podman's words).
const (
	HealthStarting  = "starting"
	HealthHealthy   = "healthy"
	HealthUnhealthy = "unhealthy"
)

// ContainerHealth is one container's health as its node last saw it.
type ContainerHealth struct {
	Module    string `json:"module"`
	Container string `json:"container"`
	Status    string `json:"status"`
	// Output is the last run's output (trimmed), FailingStreak the failed
	// runs in a row, Since when the status last changed.
	Output        string    `json:"output,omitempty"`
	FailingStreak int       `json:"failing_streak,omitempty"`
	Since         time.Time `json:"since"`
}

// Unhealthy lists the modules with an unhealthy container in this report.
func (r *Report) Unhealthy() map[string]bool {
	out := map[string]bool{}
	for _, h := range r.Health {
		if h.Status == HealthUnhealthy {
			out[h.Module] = true
		}
	}
	return out
}

// ModuleFailure is one module's failure in an apply.
type ModuleFailure struct {
	Module   string `json:"module"`
	Resource string `json:"resource"` // "KIND NAME" of the resource that failed
	Reason   string `json:"reason"`
	// Provider is set when the module waits for a provider that failed, or,
	// with HealthGate, for a provider to be healthy (a binding's gate:
	// not an error, the node tries again as the provider's health changes).
	Provider   string `json:"provider,omitempty"`
	HealthGate bool   `json:"health_gate,omitempty"`
	// Secret is set when the module waits for one of its secrets: not set
	// yet (mesh secret set), or not sealed to this node yet (a node that
	// holds it seals it again within seconds). Not an error either.
	Secret string `json:"secret,omitempty"`
	// SecretUnset: the secret is not set (only mesh secret set ends it).
	SecretUnset bool `json:"secret_unset,omitempty"`
	// Backup is set when the module waits for a backup of that module,
	// which reads the directory a secret's file of it is to be written in
	// (restic would copy the file into the snapshot): written once restic
	// has read. Not an error either.
	Backup string `json:"backup,omitempty"`
	// Running, with Backup: every container of the module runs as it ran
	// before the wait (only a file waits). A module that waits before its
	// containers ever ran (one assigned while the backup reads, a consumer
	// behind its provider's wait) does not pass a health gate.
	Running bool `json:"running,omitempty"`
	// Since, with Backup: when the node first saw the module wait for a
	// backup, kept from pass to pass while it waits (a rollout's deadline
	// starts again for a backup's wait for a bounded time from it).
	Since   time.Time `json:"since,omitzero"`
	Waiting []string  `json:"waiting,omitempty"`
}

// Wait says f is a wait, not an error: a health gate, a secret, a backup;
// the node goes on as they change.
func (f *ModuleFailure) Wait() bool { return f.HealthGate || f.Secret != "" || f.Backup != "" }

// UnsetSecret is the first failure of the report that waits for a secret
// nobody set: a wait that only an operator ends.
func (r *Report) UnsetSecret() *ModuleFailure {
	for i := range r.Failures {
		if r.Failures[i].SecretUnset {
			return &r.Failures[i]
		}
	}
	return nil
}

// OnlyGates says whether every failure of the report is a wait (a health
// gate, a secret, a backup: ModuleFailure.Wait), and there is one.
func (r *Report) OnlyGates() bool {
	for i := range r.Failures {
		if !r.Failures[i].Wait() {
			return false
		}
	}
	return len(r.Failures) > 0
}

// OnlyBackups says whether every failure of the report is a wait for a
// backup, and there is one: the backup's end, not time, ends them.
func (r *Report) OnlyBackups() bool {
	for _, f := range r.Failures {
		if f.Backup == "" {
			return false
		}
	}
	return len(r.Failures) > 0
}

// WaitReason is what a resource of module that waits behind f says.
func (f *ModuleFailure) WaitReason(module string) string {
	if f.HealthGate && f.Module == module {
		return "waits for its provider " + f.Provider + " to be healthy"
	}
	if f.Secret != "" && f.Module == module {
		return "waits for secret " + f.Secret + " (" + f.Reason + ")"
	}
	if f.Backup != "" {
		if f.Module == module {
			return "waits: " + f.Reason
		}
		return "waits for its provider " + f.Module + ", which waits: " + f.Reason
	}
	if f.Module != module || f.Provider != "" {
		p := f.Provider
		if f.Module != module {
			p = f.Module
		}
		return "waits for its provider " + p + ", which failed"
	}
	return "waits: " + f.Resource + " failed before it"
}

// FailureSummary is the report's failures in one line each ("" if none).
func (r *Report) FailureSummary() string {
	var lines []string
	for _, f := range r.Failures {
		s := f.Resource
		if f.Module != "" {
			s = f.Module + ": " + s
		}
		s += ": " + f.Reason
		if n := len(f.Waiting); n > 0 {
			s += fmt.Sprintf(" (%d resource(s) wait: %s)", n, strings.Join(f.Waiting, ", "))
		}
		lines = append(lines, s)
	}
	return strings.Join(lines, "\n")
}

// Failed reports whether module failed (or waits) in this report.
func (r *Report) Failed(module string) *ModuleFailure {
	for i := range r.Failures {
		if r.Failures[i].Module == module {
			return &r.Failures[i]
		}
	}
	return nil
}

// ResourceReport is one resource's outcome in an apply.
type ResourceReport struct {
	Module  string  `json:"module"`
	Kind    string  `json:"kind"`
	Name    string  `json:"name"`
	Outcome Outcome `json:"outcome"`
	Reason  string  `json:"reason,omitempty"`
}

// Bounds on what a report carries. A report is replicated to every node and
// kept in every replica; a container that prints without end must not make
// it, `mesh status` or the data dir grow with it. Each text keeps its end
// (where the error is), and says how much was cut.
const (
	// MaxText bounds one text: a reason, a health check's output, an
	// exit's last lines.
	MaxText = 4096
	// MaxError bounds the report's error, its failures in one text.
	MaxError = 4 * MaxText
)

// Bound cuts every text of the report to its bound, in place. Applying it
// twice changes nothing, so the reconciler, the publisher and the FSM may
// all apply it.
func (r *Report) Bound() {
	r.Error = Tail(r.Error, MaxError)
	for i := range r.Resources {
		r.Resources[i].Reason = Tail(r.Resources[i].Reason, MaxText)
	}
	for i := range r.Failures {
		r.Failures[i].Reason = Tail(r.Failures[i].Reason, MaxText)
	}
	for i := range r.Health {
		r.Health[i].Output = Tail(r.Health[i].Output, MaxText)
	}
	for i := range r.Exits {
		r.Exits[i].Logs = Tail(r.Exits[i].Logs, MaxText)
	}
	if len(r.Certificates) > MaxCertificates {
		r.Certificates = r.Certificates[:MaxCertificates]
	}
	for i := range r.Certificates {
		c := &r.Certificates[i]
		c.Name, c.Module, c.Issuer = Tail(c.Name, 253), Tail(c.Module, 63), Tail(c.Issuer, 256)
		c.Error = Tail(c.Error, MaxCertError)
	}
	if len(r.Scheduled) > MaxScheduled {
		r.Scheduled = r.Scheduled[:MaxScheduled]
	}
	for i := range r.Scheduled {
		c := &r.Scheduled[i]
		c.Module, c.Step, c.Reason = Tail(c.Module, 63), Tail(c.Step, 200), Tail(c.Reason, MaxText)
	}
	if len(r.Backups) > MaxScheduled {
		r.Backups = r.Backups[:MaxScheduled]
	}
	for i := range r.Backups {
		c := &r.Backups[i]
		c.Module, c.Reason, c.Snapshot, c.Schedule, c.By = Tail(c.Module, 63), Tail(c.Reason, MaxText), Tail(c.Snapshot, 64), Tail(c.Schedule, 200), Tail(c.By, 63)
	}
}

// cutMark starts a text whose beginning was cut.
const cutMark = "[cut: "

// Tail is the end of s within n bytes: whole UTF-8 characters, after a
// line that says how much went before them. A text already cut is cut
// again from its own end, and says the sum.
func Tail(s string, n int) string {
	if len(s) <= n {
		return s
	}
	cut := 0
	if strings.HasPrefix(s, cutMark) {
		// Once cut: count what was cut then, and cut what follows the mark.
		if i := strings.IndexByte(s, '\n'); i > 0 {
			fmt.Sscanf(s[len(cutMark):i], "%d", &cut)
			s = s[i+1:]
		}
	}
	head := fmt.Sprintf("%s%d bytes before]\n", cutMark, cut+len(s)) // the longest the count can be
	keep := max(n-len(head), 0)
	start := len(s) - keep
	for start < len(s) && !utf8.RuneStart(s[start]) {
		start++
	}
	return fmt.Sprintf("%s%d bytes before]\n", cutMark, cut+start) + s[start:]
}
