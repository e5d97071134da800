package mailbox_test

import (
	"bytes"
	"testing"
	"time"

	"github.com/fasthttp/websocket"
	"github.com/prometheus/client_golang/prometheus"

	"edgerelay/fastpath/mailbox"
	"edgerelay/fastpath/promtest"
)

// Every push outcome and both slow-socket series exist at zero before the
// first event: an alert on rate() has a series to look at from the start.
func TestMetricsSeriesExistAtStart(t *testing.T) {
	reg := prometheus.NewRegistry()
	mailbox.NewMetrics(reg)
	for _, o := range []string{"sent", "refused", "failed", "stale_removed", "foreground", "rate_limited", "queue_full", "unregistered", "unopenable", "no_module"} {
		if v := promtest.Must(t, reg, "edgerelay_mailbox_pushes_total", map[string]string{"outcome": o}); v != 0 {
			t.Fatalf("pushes_total{outcome=%q} = %v at start", o, v)
		}
	}
	for _, s := range []string{"watch", "signal"} {
		if v := promtest.Must(t, reg, "edgerelay_mailbox_slow_sockets_closed_total", map[string]string{"socket": s}); v != 0 {
			t.Fatalf("slow_sockets_closed_total{socket=%q} = %v at start", s, v)
		}
	}
}

// A watcher and a signal side that do not read are closed with 1013, and
// each close is counted once under its socket kind.
func TestSlowSocketsCounted(t *testing.T) {
	reg := prometheus.NewRegistry()
	r := start(t, opts{maxBehind: 64 << 10, maxBytes: 1 << 30, metrics: mailbox.NewMetrics(reg)})
	slow := func(socket string) float64 {
		return promtest.Must(t, reg, "edgerelay_mailbox_slow_sockets_closed_total", map[string]string{"socket": socket})
	}

	r.claim("notes")
	w := r.watch("notes", "p2c", "")
	// 24 MB unread: more than loopback's buffers and the 64 KiB queue.
	for seq := uint64(1); seq <= 400; seq++ {
		r.clock.advance(time.Second)
		expect(t, r.put("notes", "p2c", seq, envelope(seq, 60000, 1)), 201, "")
	}
	wantClose(t, w, 1013)
	if got, sig := slow("watch"), slow("signal"); got != 1 || sig != 0 {
		t.Fatalf("after one slow watcher: watch %v, signal %v; want 1, 0", got, sig)
	}

	r.claim("chat")
	p := r.signal("chat", "primary")
	c := r.signal("chat", "companion")
	wantText(t, p, "peer 1")
	wantText(t, c, "peer 1")
	// The companion reads nothing while the primary sends 400 frames of
	// 60 000 bytes (the side's whole frame bucket).
	frame := bytes.Repeat([]byte{7}, 60000)
	for range 400 {
		if err := p.WriteMessage(websocket.BinaryMessage, frame); err != nil {
			break // the relay may close the pair once the companion is gone
		}
	}
	wantClose(t, c, 1013)
	deadline := time.Now().Add(5 * time.Second)
	for slow("signal") != 1 {
		if time.Now().After(deadline) {
			t.Fatalf("signal slow closes %v, want 1", slow("signal"))
		}
		time.Sleep(10 * time.Millisecond)
	}
	if got := slow("watch"); got != 1 {
		t.Fatalf("watch slow closes %v after the signal test, want still 1", got)
	}
}
