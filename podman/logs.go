package podman

import (
	"context"
	"io"
	"log/slog"
	"strings"

	"github.com/sirupsen/logrus"
)

// RouteLogs sends what the Podman bindings log (through logrus) to log, at
// logrus's level, so an agent's output is one format with one timestamp.
func RouteLogs(log *slog.Logger) {
	logrus.SetOutput(io.Discard)
	logrus.SetLevel(logrus.DebugLevel)
	logrus.StandardLogger().ReplaceHooks(logrus.LevelHooks{})
	logrus.AddHook(slogHook{log.With("component", "podman-bindings")})
}

type slogHook struct{ log *slog.Logger }

func (slogHook) Levels() []logrus.Level { return logrus.AllLevels }

func (h slogHook) Fire(e *logrus.Entry) error {
	lvl := slog.LevelInfo
	switch e.Level {
	case logrus.TraceLevel, logrus.DebugLevel:
		lvl = slog.LevelDebug
	case logrus.WarnLevel:
		lvl = slog.LevelWarn
	case logrus.ErrorLevel, logrus.FatalLevel, logrus.PanicLevel:
		lvl = slog.LevelError
	}
	args := make([]any, 0, 2*len(e.Data))
	for k, v := range e.Data {
		args = append(args, k, v)
	}
	h.log.Log(context.Background(), lvl, strings.TrimSpace(e.Message), args...)
	return nil
}
