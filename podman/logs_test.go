package podman

import (
	"bytes"
	"encoding/json"
	"log/slog"
	"strings"
	"testing"

	"github.com/sirupsen/logrus"
)

// What the bindings log through logrus comes out of the agent's logger, at
// its level, and nowhere else.
func TestRouteLogs(t *testing.T) {
	var buf bytes.Buffer
	RouteLogs(slog.New(slog.NewJSONHandler(&buf, &slog.HandlerOptions{Level: slog.LevelDebug})))
	logrus.WithField("alias", "x").Warnf("ssh_config alias found: %s", "x")
	logrus.Debug("a debug line")
	lines := strings.Split(strings.TrimSpace(buf.String()), "\n")
	if len(lines) != 2 {
		t.Fatalf("want 2 lines, got %q", buf.String())
	}
	var w map[string]any
	if err := json.Unmarshal([]byte(lines[0]), &w); err != nil {
		t.Fatal(err)
	}
	if w["level"] != "WARN" || w["msg"] != "ssh_config alias found: x" || w["alias"] != "x" || w["component"] != "podman-bindings" {
		t.Fatalf("%v", w)
	}
}
