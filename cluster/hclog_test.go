package cluster

import (
	"bytes"
	"errors"
	"log/slog"
	"testing"

	"github.com/hashicorp/go-hclog"

	"mesh/internal/testutil"
)

// Raft's lines through the adapter into a JSON handler: one object a line,
// at Raft's own level, with hclog.Fmt values and Stringers as text.
func TestHclogAdapterJSON(t *testing.T) {
	var buf bytes.Buffer
	l := newHclog(slog.New(slog.NewJSONHandler(&buf, nil)), "raft")
	l.Warn("heartbeat timeout reached, starting election", "last-leader-addr", hclog.Fmt("%s:%d", "10.0.0.1", 7430), "err", errors.New("boom"))
	l.Debug("not shown at the default level")
	l.Info("entering follower state", "follower", stringer("Node at 10.0.0.2 [Follower]"))
	lines := testutil.JSONLines(t, buf.String(), 2)
	w, i := lines[0], lines[1]
	if w["level"] != "WARN" || w["component"] != "raft" || w["last-leader-addr"] != "10.0.0.1:7430" || w["err"] != "boom" {
		t.Fatalf("warn line: %v", w)
	}
	if i["level"] != "INFO" || i["follower"] != "Node at 10.0.0.2 [Follower]" {
		t.Fatalf("info line: %v", i)
	}
}

type stringer string

func (s stringer) String() string { return string(s) }
