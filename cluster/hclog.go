package cluster

import (
	"context"
	"fmt"
	"io"
	"log"
	"log/slog"

	"github.com/hashicorp/go-hclog"
)

// hclogSlog is an hclog.Logger over slog, so Raft's lines keep their level
// (a warning is a WARN, filtered by --log-level like every other line) and
// their key-value pairs, with one timestamp.
type hclogSlog struct {
	log   *slog.Logger
	name  string
	args  []any
	level hclog.Level
}

var _ hclog.Logger = (*hclogSlog)(nil)

func newHclog(l *slog.Logger, name string) hclog.Logger {
	return &hclogSlog{log: l.With("component", name), name: name, level: hclog.Info}
}

func slogLevel(l hclog.Level) slog.Level {
	switch l {
	case hclog.Trace, hclog.Debug:
		return slog.LevelDebug
	case hclog.Warn:
		return slog.LevelWarn
	case hclog.Error:
		return slog.LevelError
	}
	return slog.LevelInfo
}

func (h *hclogSlog) Log(level hclog.Level, msg string, args ...any) {
	if level < h.level {
		return
	}
	all := append(append([]any{}, h.args...), args...)
	for i := 1; i < len(all); i += 2 {
		all[i] = plainValue(all[i])
	}
	h.log.Log(context.Background(), slogLevel(level), msg, all...)
}

// plainValue renders what Raft passes as values the way hclog would: a
// hclog.Fmt formatted, a Stringer or an error as its text (a JSON handler
// would otherwise print ["%+v", ...] or a struct's fields).
func plainValue(v any) any {
	switch v := v.(type) {
	case hclog.Format:
		if len(v) > 0 {
			if f, ok := v[0].(string); ok {
				return fmt.Sprintf(f, v[1:]...)
			}
		}
		return fmt.Sprint(v...)
	case error:
		return v.Error()
	case fmt.Stringer:
		return v.String()
	}
	return v
}
func (h *hclogSlog) Trace(msg string, args ...any) { h.Log(hclog.Trace, msg, args...) }
func (h *hclogSlog) Debug(msg string, args ...any) { h.Log(hclog.Debug, msg, args...) }
func (h *hclogSlog) Info(msg string, args ...any)  { h.Log(hclog.Info, msg, args...) }
func (h *hclogSlog) Warn(msg string, args ...any)  { h.Log(hclog.Warn, msg, args...) }
func (h *hclogSlog) Error(msg string, args ...any) { h.Log(hclog.Error, msg, args...) }
func (h *hclogSlog) IsTrace() bool                 { return h.enabled(hclog.Trace) }
func (h *hclogSlog) IsDebug() bool                 { return h.enabled(hclog.Debug) }
func (h *hclogSlog) IsInfo() bool                  { return h.enabled(hclog.Info) }
func (h *hclogSlog) IsWarn() bool                  { return h.enabled(hclog.Warn) }
func (h *hclogSlog) IsError() bool                 { return h.enabled(hclog.Error) }
func (h *hclogSlog) ImpliedArgs() []any            { return h.args }
func (h *hclogSlog) Name() string                  { return h.name }
func (h *hclogSlog) SetLevel(l hclog.Level)        { h.level = l }
func (h *hclogSlog) GetLevel() hclog.Level         { return h.level }

func (h *hclogSlog) enabled(l hclog.Level) bool {
	return l >= h.level && h.log.Enabled(context.Background(), slogLevel(l))
}

func (h *hclogSlog) With(args ...any) hclog.Logger {
	c := *h
	c.args = append(append([]any{}, h.args...), args...)
	return &c
}

func (h *hclogSlog) Named(name string) hclog.Logger {
	c := *h
	if c.name != "" {
		name = c.name + "." + name
	}
	c.name = name
	return &c
}

func (h *hclogSlog) ResetNamed(name string) hclog.Logger {
	c := *h
	c.name = name
	return &c
}

func (h *hclogSlog) StandardLogger(opts *hclog.StandardLoggerOptions) *log.Logger {
	return log.New(h.StandardWriter(opts), "", 0)
}

func (h *hclogSlog) StandardWriter(opts *hclog.StandardLoggerOptions) io.Writer {
	return stdWriter{h}
}

// stdWriter takes lines from a standard logger (at INFO; Raft's transport
// uses one for a few messages).
type stdWriter struct{ h *hclogSlog }

func (w stdWriter) Write(p []byte) (int, error) {
	msg := string(p)
	for len(msg) > 0 && (msg[len(msg)-1] == '\n' || msg[len(msg)-1] == '\r') {
		msg = msg[:len(msg)-1]
	}
	w.h.Info(msg)
	return len(p), nil
}
