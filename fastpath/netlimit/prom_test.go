package netlimit

import (
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/valyala/fasthttp"

	"edgerelay/fastpath/promtest"
)

func TestPromMetricsSharedAcrossServices(t *testing.T) {
	reg := prometheus.NewRegistry()
	m, err := NewPromMetrics(reg)
	if err != nil {
		t.Fatal(err)
	}
	mailbox, agent := m.For("mailbox"), m.For("agent")
	mailbox.Refused(ReasonRate)
	mailbox.Refused(ReasonRate)
	agent.Refused(ReasonTotal)
	agent.Refused(ReasonFDs)
	agent.Refused(ReasonSilent)
	agent.Refused("other") // an unknown reason still counts, under its own label

	// A second PromMetrics on the same registry shares the counter.
	m2, err := NewPromMetrics(reg)
	if err != nil {
		t.Fatal(err)
	}
	m2.For("mailbox").Refused(ReasonRate)

	for _, tc := range []struct {
		service, reason string
		want            float64
	}{
		{"mailbox", ReasonRate, 3},
		{"mailbox", ReasonTotal, 0}, // present at zero before any refusal
		{"mailbox", ReasonPerIP, 0},
		{"mailbox", ReasonFDs, 0},
		{"mailbox", ReasonSilent, 0},
		{"agent", ReasonTotal, 1},
		{"agent", ReasonFDs, 1},
		{"agent", ReasonSilent, 1},
		{"agent", "other", 1},
	} {
		got, ok := promtest.Value(t, reg, "edgerelay_listener_refused_total", map[string]string{"service": tc.service, "reason": tc.reason})
		if !ok || got != tc.want {
			t.Errorf("refused{service=%s,reason=%s} = %v (present %v), want %v", tc.service, tc.reason, got, ok, tc.want)
		}
	}
}

func TestPromMetricsFromListener(t *testing.T) {
	reg := prometheus.NewRegistry()
	m, err := NewPromMetrics(reg)
	if err != nil {
		t.Fatal(err)
	}
	h := start(t, Limits{MaxConns: 1}, func(l *Listener) { l.counters = m.For("channel") })
	if err := m.TrackOpen("channel", h.l); err != nil {
		t.Fatal(err)
	}
	if err := m.TrackOpen("channel", h.l); err == nil || !strings.Contains(err.Error(), "channel") {
		t.Errorf("second TrackOpen for one service: %v, want an error naming it", err)
	}

	if got, ok := promtest.Value(t, reg, "edgerelay_listener_waiting_connections", map[string]string{"service": "channel"}); !ok || got != 0 {
		t.Errorf("waiting connections without a set = %v (present %v), want 0", got, ok)
	}
	c := h.expectAccepted(h.dial("127.0.0.1"))
	h.expectRefused(h.dial("127.0.0.1"))
	if got, _ := promtest.Value(t, reg, "edgerelay_listener_refused_total", map[string]string{"service": "channel", "reason": ReasonTotal}); got != 1 {
		t.Errorf("refused total = %v, want 1", got)
	}
	if got, _ := promtest.Value(t, reg, "edgerelay_listener_open_connections", map[string]string{"service": "channel"}); got != 1 {
		t.Errorf("open connections = %v, want 1", got)
	}
	c.Close()
	if got, _ := promtest.Value(t, reg, "edgerelay_listener_open_connections", map[string]string{"service": "channel"}); got != 0 {
		t.Errorf("open connections after close = %v, want 0", got)
	}
}

// The waiting gauge follows the connections parked until their first
// byte, and a silent one's closing is counted under its reason.
func TestPromMetricsWaitingAndSilent(t *testing.T) {
	reg := prometheus.NewRegistry()
	m, err := NewPromMetrics(reg)
	if err != nil {
		t.Fatal(err)
	}
	s := startParked(t, Limits{}, 300*time.Millisecond, nil, func(l *Listener, _ *fasthttp.Server) { l.counters = m.For("mailbox") })
	if err := m.TrackOpen("mailbox", s.l); err != nil {
		t.Fatal(err)
	}
	s.dial("127.0.0.1")
	waitFor(t, "gauge at 1", func() bool {
		got, _ := promtest.Value(t, reg, "edgerelay_listener_waiting_connections", map[string]string{"service": "mailbox"})
		return got == 1
	})
	waitFor(t, "silent counted", func() bool {
		got, _ := promtest.Value(t, reg, "edgerelay_listener_refused_total", map[string]string{"service": "mailbox", "reason": ReasonSilent})
		return got == 1
	})
	if got, _ := promtest.Value(t, reg, "edgerelay_listener_waiting_connections", map[string]string{"service": "mailbox"}); got != 0 {
		t.Errorf("waiting after the wait = %v, want 0", got)
	}
}
