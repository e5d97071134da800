package turn

import (
	"context"
	"fmt"
	"log/slog"

	"github.com/pion/logging"
)

// pionLogger routes pion's log lines into our slog logger. pion logs at
// Info for things a client can cause at will (a datagram from a peer
// without a permission, a denied peer), so Trace, Debug and Info all
// become Debug: a client must not be able to fill the operator's logs.
// Formatting happens only when the level is enabled.
type pionLogger struct {
	log *slog.Logger
}

func (f pionLogger) NewLogger(scope string) logging.LeveledLogger {
	return pionLogger{log: f.log.With("pion", scope)}
}

func (l pionLogger) logf(level slog.Level, format string, args ...any) {
	if l.log.Enabled(context.Background(), level) {
		l.log.Log(context.Background(), level, fmt.Sprintf(format, args...))
	}
}

func (l pionLogger) Trace(msg string)                  { l.logf(slog.LevelDebug, "%s", msg) }
func (l pionLogger) Tracef(format string, args ...any) { l.logf(slog.LevelDebug, format, args...) }
func (l pionLogger) Debug(msg string)                  { l.logf(slog.LevelDebug, "%s", msg) }
func (l pionLogger) Debugf(format string, args ...any) { l.logf(slog.LevelDebug, format, args...) }
func (l pionLogger) Info(msg string)                   { l.logf(slog.LevelDebug, "%s", msg) }
func (l pionLogger) Infof(format string, args ...any)  { l.logf(slog.LevelDebug, format, args...) }
func (l pionLogger) Warn(msg string)                   { l.logf(slog.LevelWarn, "%s", msg) }
func (l pionLogger) Warnf(format string, args ...any)  { l.logf(slog.LevelWarn, format, args...) }
func (l pionLogger) Error(msg string)                  { l.logf(slog.LevelWarn, "%s", msg) }
func (l pionLogger) Errorf(format string, args ...any) { l.logf(slog.LevelWarn, format, args...) }
