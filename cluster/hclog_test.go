package cluster

import (
	"bytes"
	"log/slog"
	"strings"
	"testing"
)

// Issue 9 item 9: Raft's lines keep their level, so --log-level warn shows
// Raft's warnings and hides its chatter, with one timestamp.
func TestRaftLinesKeepTheirLevel(t *testing.T) {
	var b bytes.Buffer
	l := newHclog(slog.New(slog.NewTextHandler(&b, &slog.HandlerOptions{Level: slog.LevelWarn})), "raft")
	l.Info("entering follower state", "follower", "x")
	l.Warn("heartbeat timeout reached", "last-leader-id", "n1")
	l.Named("net").Error("failed to decode", "error", "eof")
	out := b.String()
	if strings.Contains(out, "entering follower state") {
		t.Fatalf("an info line passed a warn level:\n%s", out)
	}
	if !strings.Contains(out, `level=WARN msg="heartbeat timeout reached" component=raft last-leader-id=n1`) || !strings.Contains(out, `level=ERROR msg="failed to decode" component=raft error=eof`) {
		t.Fatalf("levels or pairs lost:\n%s", out)
	}
	if strings.Count(out, "time=") != 2 {
		t.Fatalf("one timestamp per line:\n%s", out)
	}
}
