package channelcheck_test

import (
	"context"
	"fmt"
	"net"
	"testing"
	"time"

	"github.com/valyala/fasthttp"

	"edgerelay/fastpath/channel"
	"edgerelay/sdk/channelcheck"
	"edgerelay/store"
)

// ourRelay is our channel relay served in-process by fasthttp on a fixed
// loopback address, so that it can be restarted on the same origin with
// the same data directory, as an operator's restart would.
type ourRelay struct {
	dir  string
	addr string
	db   *store.DB
	h    *channel.Handler
	srv  *fasthttp.Server
	done chan struct{} // closed when Serve returns
}

func startOurRelay(dir, addr string) (*ourRelay, error) {
	db, err := store.Open(dir, nil)
	if err != nil {
		return nil, err
	}
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		_ = db.Close()
		return nil, fmt.Errorf("listen %s: %w", addr, err)
	}
	h := channel.New(channel.Config{Claims: store.NewChannelClaims(db)})
	r := &ourRelay{dir: dir, addr: ln.Addr().String(), db: db, h: h,
		srv:  &fasthttp.Server{Handler: h.ServeHTTP, MaxRequestBodySize: 64 << 10},
		done: make(chan struct{})}
	go func() {
		defer close(r.done)
		_ = r.srv.Serve(ln)
	}()
	return r, nil
}

func (r *ourRelay) origin() string { return "http://" + r.addr }

// stop shuts the server down, closes every socket and releases the store.
func (r *ourRelay) stop(ctx context.Context) error {
	if err := r.srv.ShutdownWithContext(ctx); err != nil {
		return fmt.Errorf("shutdown: %w", err)
	}
	<-r.done
	if err := r.h.Drain(ctx); err != nil {
		return fmt.Errorf("drain: %w", err)
	}
	return r.db.Close()
}

func TestRunPassesAgainstOurRelay(t *testing.T) {
	dir := t.TempDir()
	r, err := startOurRelay(dir, "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	keys := channel.Keys{Claims: store.NewChannelClaims(r.db)}
	keyA, err := keys.Add("host-a")
	if err != nil {
		t.Fatal(err)
	}
	keyB, err := keys.Add("host-b")
	if err != nil {
		t.Fatal(err)
	}
	restarts := 0
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		if err := r.stop(ctx); err != nil {
			t.Errorf("stop relay: %v", err)
		}
	})

	rep := channelcheck.Run(context.Background(), channelcheck.Options{
		Origin: r.origin(),
		KeyA:   keyA,
		KeyB:   keyB,
		Restart: func(ctx context.Context) error {
			restarts++
			if err := r.stop(ctx); err != nil {
				return err
			}
			next, err := startOurRelay(dir, r.addr)
			if err != nil {
				return err
			}
			r = next
			return nil
		},
		Log: t.Output(),
	})
	for _, c := range rep.Checks {
		if c.Err != nil {
			t.Errorf("FAIL %s: %v", c.Name, c.Err)
		}
	}
	if !rep.Passed() {
		t.Fatal("conformance failed against our own relay")
	}
	if restarts != 1 {
		t.Errorf("Restart called %d times, want 1", restarts)
	}
	if len(rep.Checks) < 30 {
		t.Errorf("only %d checks ran", len(rep.Checks))
	}
	if n := r.h.Open(); n != 0 {
		t.Errorf("%d sockets still open on the relay after Run", n)
	}
}
