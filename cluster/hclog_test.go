package cluster

import (
	"bytes"
	"encoding/json"
	"errors"
	"log/slog"
	"strings"
	"testing"

	"github.com/hashicorp/go-hclog"
)

// Raft's lines through the adapter into a JSON handler: one object a line,
// at Raft's own level, with hclog.Fmt values and Stringers as text.
func TestHclogAdapterJSON(t *testing.T) {
	var buf bytes.Buffer
	l := newHclog(slog.New(slog.NewJSONHandler(&buf, nil)), "raft")
	l.Warn("heartbeat timeout reached, starting election", "last-leader-addr", hclog.Fmt("%s:%d", "10.0.0.1", 7430), "err", errors.New("boom"))
	l.Debug("not shown at the default level")
	l.Info("entering follower state", "follower", stringer("Node at 10.0.0.2 [Follower]"))
	lines := strings.Split(strings.TrimSpace(buf.String()), "\n")
	if len(lines) != 2 {
		t.Fatalf("want 2 lines, got %q", buf.String())
	}
	var w map[string]any
	if err := json.Unmarshal([]byte(lines[0]), &w); err != nil {
		t.Fatal(err)
	}
	if w["level"] != "WARN" || w["component"] != "raft" || w["last-leader-addr"] != "10.0.0.1:7430" || w["err"] != "boom" {
		t.Fatalf("warn line: %v", w)
	}
	var i map[string]any
	json.Unmarshal([]byte(lines[1]), &i)
	if i["level"] != "INFO" || i["follower"] != "Node at 10.0.0.2 [Follower]" {
		t.Fatalf("info line: %v", i)
	}
}

type stringer string

func (s stringer) String() string { return string(s) }
