package ratelog

import (
	"bytes"
	"encoding/json"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"
)

type clock struct {
	mu sync.Mutex
	t  time.Time
}

func (c *clock) now() time.Time { c.mu.Lock(); defer c.mu.Unlock(); return c.t }
func (c *clock) add(d time.Duration) {
	c.mu.Lock()
	c.t = c.t.Add(d)
	c.mu.Unlock()
}

func lines(t *testing.T, buf *bytes.Buffer) []map[string]any {
	t.Helper()
	var out []map[string]any
	for _, l := range strings.Split(strings.TrimSpace(buf.String()), "\n") {
		if l == "" {
			continue
		}
		var m map[string]any
		if err := json.Unmarshal([]byte(l), &m); err != nil {
			t.Fatalf("line %q: %v", l, err)
		}
		out = append(out, m)
	}
	buf.Reset()
	return out
}

func count(ls []map[string]any, msg string) int {
	n := 0
	for _, l := range ls {
		if l["msg"] == msg {
			n++
		}
	}
	return n
}

func TestBurstThenCountedThenSummary(t *testing.T) {
	var buf bytes.Buffer
	c := &clock{t: time.Unix(1000, 0)}
	log := slog.New(New(slog.NewJSONHandler(&buf, nil), Config{Burst: 3, Interval: time.Second, Now: c.now}))
	svc := log.With("service", "mailbox")
	for range 3 { // the burst, to the limit
		svc.Error("write failed", "err", "disk full")
	}
	if got := count(lines(t, &buf), "write failed"); got != 3 {
		t.Fatalf("%d lines of the burst passed, want 3", got)
	}
	for range 100 { // one past the limit and on
		svc.Error("write failed", "err", "disk full")
	}
	log.Error("other message")
	ls := lines(t, &buf)
	if got := count(ls, "write failed"); got != 0 {
		t.Fatalf("%d lines past the burst passed, want 0", got)
	}
	if got := count(ls, "other message"); got != 1 {
		t.Fatalf("another message was limited too: %d lines", got)
	}
	c.add(time.Second)
	svc.Error("write failed", "err", "disk full")
	ls = lines(t, &buf)
	if got := count(ls, "write failed"); got != 1 {
		t.Fatalf("%d lines in the next window, want 1", got)
	}
	var sum map[string]any
	for _, l := range ls {
		if l["msg"] == "log lines suppressed" {
			sum = l
		}
	}
	if sum == nil || sum["message"] != "write failed" || sum["suppressed"] != float64(100) || sum["level"] != "ERROR" {
		t.Fatalf("summary %v, want 100 lines of \"write failed\" at ERROR", sum)
	}
	if _, ok := sum["service"]; ok {
		t.Fatalf("summary carries a derived handler's attributes: %v", sum)
	}
}

// A message that stops repeating is summed up once another line comes
// after its window.
func TestSummaryOfAStormThatStopped(t *testing.T) {
	var buf bytes.Buffer
	c := &clock{t: time.Unix(1000, 0)}
	log := slog.New(New(slog.NewJSONHandler(&buf, nil), Config{Burst: 1, Interval: time.Second, Now: c.now}))
	for range 5 {
		log.Warn("flush failed")
	}
	c.add(2 * time.Second)
	log.Warn("something else")
	ls := lines(t, &buf)
	if count(ls, "flush failed") != 1 || count(ls, "log lines suppressed") != 1 || count(ls, "something else") != 1 {
		t.Fatalf("lines %v: want 1 flush failed, 1 summary, 1 something else", ls)
	}
}

func TestInfoPassesAndUnlimited(t *testing.T) {
	var buf bytes.Buffer
	log := slog.New(New(slog.NewJSONHandler(&buf, nil), Config{Burst: 1}))
	for range 20 {
		log.Info("listening")
	}
	gw := Unlimited(log.With("service", "push-fcm"))
	for range 20 {
		gw.Error("request")
	}
	ls := lines(t, &buf)
	if count(ls, "listening") != 20 {
		t.Fatalf("info lines limited: %d of 20", count(ls, "listening"))
	}
	if count(ls, "request") != 20 || ls[len(ls)-1]["service"] != "push-fcm" {
		t.Fatalf("unlimited logger limited or lost its attributes: %d of 20, %v", count(ls, "request"), ls[len(ls)-1])
	}
}

func TestMessagesTrackedAreBounded(t *testing.T) {
	var buf bytes.Buffer
	h := New(slog.NewJSONHandler(&buf, nil), Config{Burst: 1, MaxMessages: 4})
	log := slog.New(h)
	for i := range 10 {
		for range 3 {
			log.Error("m" + string(rune('a'+i)))
		}
	}
	if n := len(h.st.windows); n != 4 {
		t.Fatalf("%d messages tracked, want the bound 4", n)
	}
	ls := lines(t, &buf)
	// 4 tracked messages pass once each; the 6 untracked pass all 3 lines.
	if len(ls) != 4+6*3 {
		t.Fatalf("%d lines, want %d", len(ls), 4+6*3)
	}
}
