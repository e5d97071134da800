package channelload

import (
	"context"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"edgerelay/bench/baseline/channel"

	"github.com/gorilla/websocket"
)

// baseline starts the baseline relay with the given claim keys.
func baseline(t testing.TB, keys ...string) *httptest.Server {
	t.Helper()
	claimKeys := make(map[string]string)
	for _, k := range keys {
		claimKeys[k] = "bench"
	}
	srv := httptest.NewServer(channel.New(claimKeys))
	t.Cleanup(srv.Close)
	return srv
}

func TestRunAgainstBaseline(t *testing.T) {
	key := NewToken()
	srv := baseline(t, key)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	res, err := Run(ctx, Options{Origin: srv.URL, ClaimKey: key, Phones: 4, Frames: 2000})
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("%d frames in %v: %.0f frames/s, p50 %v, p99 %v",
		res.Frames, res.Elapsed, res.FramesPerSec, res.P50, res.P99)
	if res.Frames != 2000 || res.Elapsed <= 0 || res.FramesPerSec <= 0 ||
		res.P50 <= 0 || res.P99 < res.P50 || res.P99 > res.Elapsed {
		t.Errorf("implausible result %+v", res)
	}
	// Frames/s is what Frames and Elapsed say it is.
	if got := float64(res.Frames) / res.Elapsed.Seconds(); got != res.FramesPerSec {
		t.Errorf("FramesPerSec %v, want %v", res.FramesPerSec, got)
	}

	// The claim key is spent now.
	if _, err := Run(ctx, Options{Origin: srv.URL, ClaimKey: key, Frames: 1}); err == nil ||
		!strings.Contains(err.Error(), "409") {
		t.Errorf("second run with the same key: %v, want a 409", err)
	}
}

func TestRunLargestFramesUnevenSplit(t *testing.T) {
	key := NewToken()
	srv := baseline(t, key)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	// 7 frames over 3 phones: 3, 2 and 2, each of the protocol's largest size.
	res, err := Run(ctx, Options{Origin: srv.URL + "/", ClaimKey: key, Phones: 3, FrameSize: maxFrame, Frames: 7, Window: 2})
	if err != nil {
		t.Fatal(err)
	}
	if res.Frames != 7 {
		t.Errorf("Frames %d", res.Frames)
	}
}

func TestRunRejectsBadOptions(t *testing.T) {
	for _, o := range []Options{
		{Origin: "http://127.0.0.1:1", Frames: 0},
		{Origin: "http://127.0.0.1:1", Frames: 1, FrameSize: headerLen - 1},
		{Origin: "http://127.0.0.1:1", Frames: 1, FrameSize: maxFrame + 1},
		{Origin: "ftp://127.0.0.1:1", Frames: 1},
	} {
		if _, err := Run(context.Background(), o); err == nil {
			t.Errorf("%+v: no error", o)
		}
	}
}

// TestRunDetectsMismatch points Run at fake relays that echo phone frames straight
// back, with one change each: the run must fail rather than count them.
func TestRunDetectsMismatch(t *testing.T) {
	for name, tamper := range map[string]func(seq int, frame []byte) []byte{
		"corrupted byte": func(seq int, frame []byte) []byte {
			if seq == 5 {
				frame[len(frame)-1] ^= 1
			}
			return frame
		},
		"truncated": func(seq int, frame []byte) []byte {
			if seq == 5 {
				return frame[:len(frame)-1]
			}
			return frame
		},
		"dropped": func(seq int, frame []byte) []byte {
			if seq == 5 {
				return nil
			}
			return frame
		},
	} {
		t.Run(name, func(t *testing.T) {
			srv := httptest.NewServer(fakeRelay(tamper))
			defer srv.Close()
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			_, err := Run(ctx, Options{Origin: srv.URL, ClaimKey: "any", Frames: 20, Window: 4})
			if err == nil || !strings.Contains(err.Error(), "frame 5") {
				t.Errorf("got %v, want an error about frame 5", err)
			}
		})
	}
}

func TestRunStopsAtDeadline(t *testing.T) {
	// Echoing nothing, the fake relay leaves every frame in flight forever.
	srv := httptest.NewServer(fakeRelay(func(int, []byte) []byte { return nil }))
	defer srv.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel()
	begin := time.Now()
	_, err := Run(ctx, Options{Origin: srv.URL, ClaimKey: "any", Frames: 100})
	if err == nil || !strings.Contains(err.Error(), context.DeadlineExceeded.Error()) {
		t.Errorf("got %v, want the deadline", err)
	}
	if waited := time.Since(begin); waited > 5*time.Second {
		t.Errorf("Run took %v to notice its deadline", waited)
	}
}

// fakeRelay accepts any claim and any computer, and answers each phone frame itself
// with tamper(seq, frame), sending nothing when that returns nil.
func fakeRelay(tamper func(seq int, frame []byte) []byte) http.Handler {
	var upgrader websocket.Upgrader
	mux := http.NewServeMux()
	mux.HandleFunc("POST /claim", func(w http.ResponseWriter, _ *http.Request) {
		w.Write([]byte(`{"claimed":true,"host":"fake"}`))
	})
	mux.HandleFunc("GET /host", func(w http.ResponseWriter, r *http.Request) {
		ws, err := upgrader.Upgrade(w, r, nil)
		if err != nil {
			return
		}
		defer ws.Close()
		for {
			if _, _, err := ws.ReadMessage(); err != nil {
				return
			}
		}
	})
	mux.HandleFunc("GET /botharness-device/channel", func(w http.ResponseWriter, r *http.Request) {
		ws, err := upgrader.Upgrade(w, r, nil)
		if err != nil {
			return
		}
		defer ws.Close()
		for seq := 0; ; seq++ {
			_, frame, err := ws.ReadMessage()
			if err != nil {
				return
			}
			if out := tamper(seq, frame); out != nil {
				if err := ws.WriteMessage(websocket.TextMessage, out); err != nil {
					return
				}
			}
		}
	})
	return mux
}

func TestFillFrame(t *testing.T) {
	frame := make([]byte, 40)
	fillFrame(frame, 0x2a, 0x1234)
	if got, want := string(frame[:headerLen]), "p002a:0000000000001234:"; got != want {
		t.Errorf("header %q, want %q", got, want)
	}
	for _, c := range frame {
		if c < ' ' || c > '~' {
			t.Fatalf("frame %q is not printable ASCII", frame)
		}
	}
}

func TestMessageType(t *testing.T) {
	for msg, want := range map[string]string{
		`{"type":"data","id":"x","data":"y"}`:      "data",
		`{"type":"open","id":"x"}`:                 "open",
		`{"type":"close","id":"x"}`:                "close",
		`{"id":"x","type":"data","data":"y"}`:      "data",
		` { "type" : "data" , "id":"x","data":""}`: "data",
		`{"type":"database","id":"x"}`:             "database",
	} {
		if got, err := messageType([]byte(msg)); err != nil || got != want {
			t.Errorf("%s: got %q, %v; want %q", msg, got, err, want)
		}
	}
	if _, err := messageType([]byte(`{"type":"data"`)); err == nil {
		t.Error("truncated message accepted")
	}
}

func TestHistogram(t *testing.T) {
	var h histogram
	if h.quantile(0.5) != 0 {
		t.Error("empty histogram has a median")
	}
	for i := 1; i <= 1000; i++ {
		h.record(time.Duration(i) * time.Microsecond)
	}
	for q, want := range map[float64]time.Duration{0.5: 500 * time.Microsecond, 0.99: 990 * time.Microsecond} {
		got := h.quantile(q)
		if diff := got - want; diff < -want/100 || diff > want/100 {
			t.Errorf("quantile(%v) = %v, want %v within 1%%", q, got, want)
		}
	}
	// Every value falls in a bucket whose middle is within 1% of it.
	for _, v := range []uint64{0, 1, 63, 64, 65, 127, 128, 1000, 123456789, 1 << 62, 1<<63 - 1} {
		mid := uint64(bucketMid(bucketOf(v)))
		if d := max(mid, v) - min(mid, v); d > v/100 {
			t.Errorf("value %d lands in bucket with middle %d", v, mid)
		}
	}
}
