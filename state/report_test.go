package state

import (
	"fmt"
	"strings"
	"testing"
	"unicode/utf8"
)

// What a report carries is bounded whatever a container prints, keeps the
// end (where the error is), says how much went, and cutting again changes
// nothing.
func TestReportBound(t *testing.T) {
	huge := strings.Repeat("x", 1500000) + "\nerror: the real reason"
	r := Report{
		Error:     strings.Repeat("e", 100000),
		Resources: []ResourceReport{{Name: "m.step", Outcome: Failed, Reason: "exited with code 1; last lines:\n" + huge}},
		Failures:  []ModuleFailure{{Module: "m", Reason: huge}},
		Health:    []ContainerHealth{{Output: huge}},
		Exits:     []ContainerExit{{Logs: strings.Repeat("é", 100000)}},
	}
	r.Bound()
	for name, s := range map[string]string{"reason": r.Resources[0].Reason, "failure": r.Failures[0].Reason, "health": r.Health[0].Output, "exit": r.Exits[0].Logs} {
		if len(s) > MaxText {
			t.Fatalf("%s: %d bytes, over %d", name, len(s), MaxText)
		}
		if !strings.HasPrefix(s, "[cut: ") || !utf8.ValidString(s) {
			t.Fatalf("%s does not say it was cut, or cuts a character: %.80q", name, s)
		}
	}
	if !strings.HasSuffix(r.Resources[0].Reason, "error: the real reason") {
		t.Fatal("the end of the text, where the error is, was lost")
	}
	if len(r.Error) > MaxError {
		t.Fatalf("error: %d bytes", len(r.Error))
	}
	// The count says what went: the original length less what stayed.
	want := len("exited with code 1; last lines:\n" + huge)
	var cut int
	line, rest, _ := strings.Cut(r.Resources[0].Reason, "\n")
	if _, err := sscan(line, &cut); err != nil || cut+len(rest) != want {
		t.Fatalf("%q: %d cut and %d kept of %d", line, cut, len(rest), want)
	}
	before := r.Resources[0].Reason
	r.Bound()
	if r.Resources[0].Reason != before {
		t.Fatal("bounding twice changed the text")
	}
	if s := Tail("short", MaxText); s != "short" {
		t.Fatalf("a short text changed: %q", s)
	}
}

func sscan(line string, n *int) (int, error) {
	return fmt.Sscanf(strings.TrimPrefix(line, "[cut: "), "%d", n)
}
