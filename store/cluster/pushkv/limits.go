package pushkv

import (
	"context"
	"encoding/binary"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"edgerelay/store"
	"edgerelay/store/cluster"
)

// ---- minute limits ----

// RateLimiter returns the family name of minute limits, shared by every
// node that asks for the same name in this scope.
func (g *Gateway) RateLimiter(name string, perMinute int) (store.PushRateLimiter, error) {
	if perMinute < 1 {
		return nil, fmt.Errorf("pushkv: rate limit %s: %d a minute: want at least 1", name, perMinute)
	}
	if !kvToken(name) {
		return nil, fmt.Errorf("pushkv: rate limit name %q: want [-_.a-zA-Z0-9]+", name)
	}
	interval := time.Minute / time.Duration(perMinute)
	return &rateLimiter{
		g: g, prefix: g.prefix + name + ".",
		interval: int64(interval), tolerance: int64(perMinute-1) * int64(interval),
	}, nil
}

func kvToken(s string) bool {
	for _, c := range []byte(s) {
		if !(c == '-' || c == '_' || c == '.' || c >= '0' && c <= '9' || c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z') {
			return false
		}
	}
	return s != ""
}

// rateLimiter is GCRA (as fastpath/bucket) over KV: a bucket's whole state
// is its theoretical arrival time, 8 bytes big-endian unix ns, changed by
// compare-and-set, so that with no time passing exactly perMinute takes
// succeed across all nodes together.
type rateLimiter struct {
	g         *Gateway
	prefix    string
	interval  int64 // ns per token
	tolerance int64 // (burst-1) * interval
}

var errLimited = errors.New("pushkv: limited")

func (r *rateLimiter) Take(key store.Hash, now time.Time) (bool, error) {
	ctx, cancel, err := r.g.op()
	if err != nil {
		return false, err
	}
	defer cancel()
	n := now.UnixNano()
	_, err = cluster.Update(ctx, r.g.rate, r.prefix+hex.EncodeToString(key[:]), func(cur []byte, _ uint64) ([]byte, error) {
		tat := n
		if len(cur) == 8 {
			tat = max(int64(binary.BigEndian.Uint64(cur)), n)
		}
		if tat-n > r.tolerance {
			return nil, errLimited
		}
		return binary.BigEndian.AppendUint64(nil, uint64(tat+r.interval)), nil
	})
	switch {
	case errors.Is(err, errLimited):
		return false, nil
	case err != nil:
		return false, fmt.Errorf("pushkv: rate limit: %w", err)
	}
	return true, nil
}

// Sweep has nothing to do: idle buckets expire in the bucket (rateMaxAge).
func (r *rateLimiter) Sweep(time.Time) {}

// ---- daily budget ----

func (g *Gateway) budgetSubject(day int64) string {
	return budgetSubject + "." + string(rune(g.scope)) + "." + strconv.FormatInt(day, 10)
}

// incr adds delta to the day's counter and returns the new total.
func (g *Gateway) incr(ctx context.Context, day int64, delta string) (int64, error) {
	m := nats.NewMsg(g.budgetSubject(day))
	m.Header.Set("Nats-Incr", delta)
	ack, err := g.js.PublishMsg(ctx, m)
	if err != nil {
		return 0, cluster.Fail("count budget", err)
	}
	n, err := strconv.ParseInt(ack.Value, 10, 64)
	if err != nil {
		return 0, fmt.Errorf("pushkv: budget counter total %q: %w", ack.Value, err)
	}
	return n, nil
}

// DrawBudget counts one send against limit for now's UTC day: +1, and -1
// again when the new total is over the limit (see the package comment).
// An increment whose ack was lost may have counted: early, never late.
func (g *Gateway) DrawBudget(limit int64, now time.Time) (store.BudgetDraw, bool, error) {
	if limit <= 0 {
		return store.BudgetDraw{}, false, nil
	}
	ctx, cancel, err := g.op()
	if err != nil {
		return store.BudgetDraw{}, false, err
	}
	defer cancel()
	day := store.PushBudgetDay(now)
	n, err := g.incr(ctx, day, "+1")
	if err != nil {
		return store.BudgetDraw{}, false, err
	}
	if n > limit {
		// Refused; give the +1 back. If that fails the day counts one too
		// many: the gateway refuses early, never late.
		_, _ = g.incr(ctx, day, "-1")
		return store.BudgetDraw{}, false, nil
	}
	return store.NewBudgetDraw(day), true, nil
}

// RefundBudget gives back a draw whose send never reached the provider.
// A failed refund leaves the count one too high (early, never late).
func (g *Gateway) RefundBudget(d store.BudgetDraw) {
	day, ok := d.Day()
	if !ok {
		return
	}
	ctx, cancel, err := g.op()
	if err != nil {
		return
	}
	defer cancel()
	_, _ = g.incr(ctx, day, "-1")
}

// BudgetUsed returns the draws counted for now's UTC day, read from the
// counter stream's leader.
func (g *Gateway) BudgetUsed(now time.Time) (int64, error) {
	ctx, cancel, err := g.op()
	if err != nil {
		return 0, err
	}
	defer cancel()
	m, err := g.budget.GetLastMsgForSubject(ctx, g.budgetSubject(store.PushBudgetDay(now)))
	switch {
	case errors.Is(err, jetstream.ErrMsgNotFound):
		return 0, nil
	case err != nil:
		return 0, cluster.Fail("read budget", err)
	}
	var v struct {
		Val string `json:"val"`
	}
	if err := json.Unmarshal(m.Data, &v); err != nil {
		return 0, fmt.Errorf("pushkv: budget counter: %w", err)
	}
	n, err := strconv.ParseInt(v.Val, 10, 64)
	if err != nil {
		return 0, fmt.Errorf("pushkv: budget counter value %q: %w", v.Val, err)
	}
	return n, nil
}

// FlushBudget has nothing to write: every draw is counted exactly as it is
// made.
func (g *Gateway) FlushBudget() error { return nil }
