package podman

import (
	"bytes"
	"log/slog"
	"testing"

	"github.com/sirupsen/logrus"

	"mesh/internal/testutil"
)

// What the bindings log through logrus comes out of the agent's logger, at
// its level, and nowhere else.
func TestRouteLogs(t *testing.T) {
	var buf bytes.Buffer
	RouteLogs(slog.New(slog.NewJSONHandler(&buf, &slog.HandlerOptions{Level: slog.LevelDebug})))
	logrus.WithField("alias", "x").Warnf("ssh_config alias found: %s", "x")
	logrus.Debug("a debug line")
	w := testutil.JSONLines(t, buf.String(), 2)[0]
	if w["level"] != "WARN" || w["msg"] != "ssh_config alias found: x" || w["alias"] != "x" || w["component"] != "podman-bindings" {
		t.Fatalf("%v", w)
	}
}
