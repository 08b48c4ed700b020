package main

import (
	"bytes"
	"strings"
	"testing"
	"time"

	"mesh/cluster/api"
	"mesh/state"
)

// hostile is a line a container may write to take over the operator's
// terminal: a window title, a clear screen, a carriage return that
// prints over the line, a clipboard write (OSC 52), a C1 CSI, DEL; with a
// colour and a tab, which are fine.
const hostile = "\x1b]0;pwned\x07\x1b[2J\rfake\x1b]52;c;ZXZpbA==\x07\u009b1m\x7f \x1b[1;31mred\x1b[0m\tend"

// On a terminal, mesh logs shows what a container wrote with its control
// characters escaped, colours and tabs kept; to a pipe or a file, as it
// was written.
func TestLogsLineEscapesForATerminal(t *testing.T) {
	c := &LogsCmd{}
	r := api.Record{Node: "ace", Container: "app.server", Time: time.Unix(100, 0), Text: hostile}
	got := c.line(r, true, true)
	want := `ace app.server | \x1b]0;pwned\x07\x1b[2J\x0dfake\x1b]52;c;ZXZpbA==\x07\x9b1m\x7f ` + "\x1b[1;31mred\x1b[0m\tend\x1b[0m\n"
	if got != want {
		t.Fatalf("on a terminal:\n got %q\nwant %q", got, want)
	}
	if got := c.line(r, false, false); got != hostile+"\n" {
		t.Fatalf("to a pipe: %q, want the bytes as written", got)
	}
	if got := terminalText("\x1b[?25l\x1b[1;31"); got != `\x1b[?25l\x1b[1;31` {
		t.Fatalf("sequences that are not whole colours: %q", got)
	}
	// What a line sets ends with it: hidden text, or a colour never reset,
	// does not reach the lines after it (another container's, mesh's).
	for in, want := range map[string]string{
		"\x1b[8mhidden":       "\x1b[8mhidden\x1b[0m",
		"\x1b[30;40mon black": "\x1b[30;40mon black\x1b[0m",
		"plain":               "plain",
	} {
		if got := terminalText(in); got != want {
			t.Errorf("terminalText(%q) = %q, want %q", in, got, want)
		}
	}
}

// mesh status never sends a container's text to the terminal raw: a
// scheduled step's failure and a container's last lines are escaped.
func TestStatusEscapesContainerText(t *testing.T) {
	st := api.Status{Nodes: []api.NodeStatus{{NodeInfo: state.NodeInfo{Node: state.Node{Name: "ace"}}, Reachable: true, Report: &state.Report{
		Scheduled: []state.ScheduledRun{{Step: "app.job", Module: "app", Last: time.Unix(100, 0), Next: time.Unix(200, 0), Reason: "exit 1: \x1b]52;c;ZXZpbA==\x07"}},
		Exits:     []state.ContainerExit{{Container: "app.server", Module: "app", ExitCode: 1, Logs: "one\x1b[2J\ntwo\r"}},
		// A step's output in a failure, the names of entries a container
		// left in a directory the mesh keeps, an apply error.
		Failures:  []state.ModuleFailure{{Module: "app", Resource: "step app.init", Reason: "exited with code 1: \x1b[2Jfake\nsecond \x1b]0;t\x07"}},
		Resources: []state.ResourceReport{{Module: "app", Kind: "directory", Name: "/srv/app", Outcome: state.Kept, Reason: "holds 1 entry the mesh did not put there (\x1b[2J)"}},
	}, ApplyError: "step app.init: \x1b]52;c;eA==\x07"}}}
	var b bytes.Buffer
	if err := renderStatus(&b, st); err != nil {
		t.Fatal(err)
	}
	out := b.String()
	if strings.ContainsAny(out, "\x1b\x07\r") {
		t.Fatalf("status sent control characters to the terminal:\n%q", out)
	}
	for _, want := range []string{`exit 1: \x1b]52;c;ZXZpbA==\x07`, "  last lines:\n    one\\x1b[2J\n    two\\x0d\n", `exited with code 1: \x1b[2Jfake`, `(\x1b[2J)`, `\x1b]52;c;eA==\x07`} {
		if !strings.Contains(out, want) {
			t.Fatalf("status does not show %q:\n%s", want, out)
		}
	}
}

// What mesh assign --wait prints of an apply: a failed step's output is
// the container's text, and goes to the terminal escaped.
func TestOutcomesEscapeContainerText(t *testing.T) {
	var b bytes.Buffer
	printOutcomes(&b, &state.Report{Resources: []state.ResourceReport{
		{Module: "app", Kind: "step", Name: "app.init", Outcome: state.Failed, Reason: "exited with code 1: \x1b]0;owned\x07cannot reach the database\r"},
	}})
	if out := b.String(); strings.ContainsAny(out, "\x1b\x07\r") || !strings.Contains(out, `exited with code 1: \x1b]0;owned\x07cannot reach the database\x0d`) {
		t.Fatalf("printOutcomes: %q", out)
	}
}

// A backup that succeeded with a warning (it read unconfined while its
// module ran) says so in mesh status, escaped; one without says nothing
// more; a failed one says its reason as an error.
func TestStatusSaysABackupsWarning(t *testing.T) {
	now := time.Unix(1000, 0)
	var b bytes.Buffer
	renderBackups(&b, "ace", []state.BackupRun{
		{Module: "db", Last: now.Add(-time.Minute), LastOK: now.Add(-time.Minute), OK: true, Snapshot: "0123abcd", Reason: "read with links followable\x1b[2J"},
		{Module: "web", Last: now.Add(-time.Minute), LastOK: now.Add(-time.Minute), OK: true, Snapshot: "4567ef01"},
		{Module: "mail", Last: now.Add(-time.Minute), OK: false, Reason: "locked"},
	}, now)
	lines := strings.Split(strings.TrimSpace(b.String()), "\n")
	if len(lines) != 3 {
		t.Fatalf("%q", b.String())
	}
	if want := `ace: backup of db: snapshot 0123abcd, 1m0s ago; warning: read with links followable\x1b[2J`; lines[0] != want {
		t.Errorf("with a warning:\n got %q\nwant %q", lines[0], want)
	}
	if want := "ace: backup of web: snapshot 4567ef01, 1m0s ago"; lines[1] != want {
		t.Errorf("without:\n got %q\nwant %q", lines[1], want)
	}
	if !strings.Contains(lines[2], "error: backup of mail failed") || !strings.HasSuffix(lines[2], ": locked") {
		t.Errorf("a failed one: %q", lines[2])
	}
}
