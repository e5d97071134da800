package admin_test

import (
	"fmt"
	"log/slog"
	"sync/atomic"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/valyala/fasthttp"

	"edgerelay/fastpath/admin"
	"edgerelay/store"
)

func get(h *admin.Handler, path string) (int, string) {
	var ctx fasthttp.RequestCtx
	ctx.Request.SetRequestURI(path)
	h.ServeHTTP(&ctx)
	return ctx.Response.StatusCode(), string(ctx.Response.Body())
}

func TestReadyzFollowsTheStore(t *testing.T) {
	var refusing atomic.Bool
	h := admin.New(admin.Config{
		Gatherer: prometheus.NewRegistry(), Log: slog.New(slog.DiscardHandler),
		Storage: func() error {
			if refusing.Load() {
				return fmt.Errorf("%w: disk full", store.ErrUnavailable)
			}
			return nil
		},
	})
	if code, _ := get(h, "/readyz"); code != 503 {
		t.Fatalf("before SetReady: %d, want 503", code)
	}
	h.SetReady(true)
	if code, body := get(h, "/readyz"); code != 200 || body != `{"status":"ready"}` {
		t.Fatalf("ready: %d %s", code, body)
	}
	refusing.Store(true)
	if code, body := get(h, "/readyz"); code != 503 || body != `{"status":"storage unavailable"}` {
		t.Fatalf("store refusing writes: %d %s, want 503 storage unavailable", code, body)
	}
	if code, _ := get(h, "/healthz"); code != 200 {
		t.Fatalf("healthz while the store refuses writes: %d, want 200 (the process is alive)", code)
	}
	refusing.Store(false)
	if code, _ := get(h, "/readyz"); code != 200 {
		t.Fatalf("store back: %d, want 200", code)
	}
}

func TestStoreWritesRefusedGauge(t *testing.T) {
	var refusing atomic.Bool
	reg := prometheus.NewRegistry()
	if err := admin.RegisterStorage(reg, func() error {
		if refusing.Load() {
			return store.ErrUnavailable
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	value := func() float64 {
		mfs, err := reg.Gather()
		if err != nil || len(mfs) != 1 || mfs[0].GetName() != "edgerelay_store_writes_refused" {
			t.Fatalf("gathered %v, %v", mfs, err)
		}
		return mfs[0].GetMetric()[0].GetGauge().GetValue()
	}
	if v := value(); v != 0 {
		t.Fatalf("writable store: %v, want 0", v)
	}
	refusing.Store(true)
	if v := value(); v != 1 {
		t.Fatalf("store refusing writes: %v, want 1", v)
	}
}
