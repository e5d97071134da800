// Package ratelog is a slog.Handler that bounds repeated log lines: of
// each message (level and text) at most Burst lines per Interval go
// through, the rest are counted, and once the interval is over one line
// says how many were left out. A store that fails every write, or a
// background job that retries in a loop, then costs a few lines a second
// instead of thousands, and the first lines of each kind still show.
package ratelog

import (
	"context"
	"log/slog"
	"sync"
	"time"
)

// Config bounds the lines; zero fields take the defaults.
type Config struct {
	// Burst is how many lines of one message pass per Interval (10).
	Burst int
	// Interval is the window of Burst (10 s).
	Interval time.Duration
	// MinLevel is the least severe level limited (nil: slog.LevelWarn):
	// info lines record single events (a claim, a key added) and pass as
	// they are; storms are made of warnings and errors.
	MinLevel slog.Leveler
	// MaxMessages bounds the messages tracked at once (1024); past it new
	// messages pass unlimited until old windows end, so memory stays
	// bounded whatever is logged.
	MaxMessages int
	// Now is the clock (time.Now); tests set it.
	Now func() time.Time
}

// Handler is the limiting handler. Handlers derived with WithAttrs and
// WithGroup share one count, so a message is limited across them.
type Handler struct {
	next slog.Handler
	st   *state
}

type key struct {
	level slog.Level
	msg   string
}

type window struct {
	start      time.Time
	passed     int
	suppressed int
}

type state struct {
	cfg       Config
	root      slog.Handler // where the summaries go, without derived attrs
	mu        sync.Mutex
	windows   map[key]*window
	nextSweep time.Time
}

// New wraps next.
func New(next slog.Handler, cfg Config) *Handler {
	if cfg.MinLevel == nil {
		cfg.MinLevel = slog.LevelWarn
	}
	if cfg.Burst <= 0 {
		cfg.Burst = 10
	}
	if cfg.Interval <= 0 {
		cfg.Interval = 10 * time.Second
	}
	if cfg.MaxMessages <= 0 {
		cfg.MaxMessages = 1024
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	return &Handler{next: next, st: &state{cfg: cfg, root: next, windows: map[key]*window{}}}
}

// Unlimited returns l without the limit when l's handler is a Handler
// (the attributes already added stay), else l: for lines a contract wants
// one of per request, such as the push gateway's.
func Unlimited(l *slog.Logger) *slog.Logger {
	if h, ok := l.Handler().(*Handler); ok {
		return slog.New(h.next)
	}
	return l
}

// Enabled reports whether the wrapped handler logs level.
func (h *Handler) Enabled(ctx context.Context, level slog.Level) bool {
	return h.next.Enabled(ctx, level)
}

// WithAttrs derives a handler that shares the count.
func (h *Handler) WithAttrs(as []slog.Attr) slog.Handler {
	return &Handler{next: h.next.WithAttrs(as), st: h.st}
}

// WithGroup derives a handler that shares the count.
func (h *Handler) WithGroup(name string) slog.Handler {
	return &Handler{next: h.next.WithGroup(name), st: h.st}
}

// Handle passes r on unless its message has used up its burst.
func (h *Handler) Handle(ctx context.Context, r slog.Record) error {
	if r.Level < h.st.cfg.MinLevel.Level() {
		return h.next.Handle(ctx, r)
	}
	pass, summaries := h.st.admit(key{r.Level, r.Message})
	for _, s := range summaries {
		_ = h.st.root.Handle(ctx, s)
	}
	if !pass {
		return nil
	}
	return h.next.Handle(ctx, r)
}

// admit counts one line of k and says whether it passes; it also returns
// the summary lines of windows that have ended (at most one sweep per
// Interval, so a line costs a map lookup).
func (s *state) admit(k key) (bool, []slog.Record) {
	now := s.cfg.Now()
	s.mu.Lock()
	defer s.mu.Unlock()
	var summaries []slog.Record
	if !now.Before(s.nextSweep) {
		s.nextSweep = now.Add(s.cfg.Interval)
		for wk, w := range s.windows {
			if now.Sub(w.start) < s.cfg.Interval {
				continue
			}
			if w.suppressed > 0 {
				summaries = append(summaries, summary(now, wk, w))
			}
			delete(s.windows, wk)
		}
	}
	w := s.windows[k]
	if w != nil && now.Sub(w.start) >= s.cfg.Interval {
		if w.suppressed > 0 {
			summaries = append(summaries, summary(now, k, w))
		}
		w.start, w.passed, w.suppressed = now, 0, 0
	}
	if w == nil {
		if len(s.windows) >= s.cfg.MaxMessages {
			return true, summaries
		}
		w = &window{start: now}
		s.windows[k] = w
	}
	if w.passed < s.cfg.Burst {
		w.passed++
		return true, summaries
	}
	w.suppressed++
	return false, summaries
}

func summary(now time.Time, k key, w *window) slog.Record {
	r := slog.NewRecord(now, k.level, "log lines suppressed", 0)
	r.AddAttrs(slog.String("message", k.msg), slog.Int("suppressed", w.suppressed),
		slog.Duration("window", now.Sub(w.start)))
	return r
}
