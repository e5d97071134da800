package turnbench

import (
	"context"
	"errors"
	"os"
	"strings"
	"testing"
	"time"
)

// TestWebRTCSmoke runs the real-traffic comparison once, short: two
// rounds of 2 MB through each server, the plumbing end to end (driver,
// page, relay-only pair, CPU and drop accounting). It starts Chromium, so
// it runs only when TURNBENCH_WEBRTC=1 (`make bench` runs the real one).
func TestWebRTCSmoke(t *testing.T) {
	if os.Getenv("TURNBENCH_WEBRTC") != "1" {
		t.Skip("set TURNBENCH_WEBRTC=1: starts headless Chromium and two TURN servers")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	rep, err := CompareWebRTC(ctx, WebRTCOptions{Rounds: 2, Bytes: 2_000_000, Progress: os.Stderr})
	if errors.Is(err, ErrNoChromium) {
		t.Skip(err)
	}
	if err != nil {
		t.Fatalf("CompareWebRTC: %v", err)
	}
	for _, s := range []WebRTCSide{rep.Ours, rep.Coturn} {
		if len(s.Runs) != 1 || s.Runs[0].Bytes != 2_000_000 || s.MBPerSec <= 0 || s.CPUPerMB <= 0 {
			t.Errorf("%s: %+v", s.Name, s)
		}
	}
	if !strings.Contains(rep.Markdown(), "| ours |") {
		t.Errorf("report:\n%s", rep.Markdown())
	}
}

// TestWebRTCNoChromium: a missing browser is ErrNoChromium (the report
// then says the comparison was skipped), before any server starts.
func TestWebRTCNoChromium(t *testing.T) {
	_, err := CompareWebRTC(context.Background(), WebRTCOptions{Chromium: "/nonexistent/chromium"})
	if !errors.Is(err, ErrNoChromium) {
		t.Fatalf("got %v, want ErrNoChromium", err)
	}
}
