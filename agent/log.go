package agent

import (
	"io"
	"log/slog"

	"mesh/podman"
)

// NewLogger is the agent's one logger: text (key=value) or json (one object
// a line) at lvl. Everything else that logs is routed into it: the standard
// library's log package (slog.SetDefault), Raft (cluster's hclog adapter)
// and the Podman bindings' logrus (podman.RouteLogs).
func NewLogger(w io.Writer, format string, lvl slog.Level) *slog.Logger {
	opts := &slog.HandlerOptions{Level: lvl}
	var h slog.Handler = slog.NewTextHandler(w, opts)
	if format == "json" {
		h = slog.NewJSONHandler(w, opts)
	}
	log := slog.New(h)
	slog.SetDefault(log)
	podman.RouteLogs(log)
	return log
}
