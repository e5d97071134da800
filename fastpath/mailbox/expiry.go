package mailbox

import (
	"context"
	"time"
)

// Run does the background work until ctx ends: it sends push wake-ups,
// asks the store to erase mailboxes idle longer than RELAY_IDLE (they
// already answer 404 the moment they expire; this reclaims their space),
// and evicts idle rate-limit buckets.
func (h *Handler) Run(ctx context.Context) {
	go h.SendPushes(ctx)
	t := time.NewTicker(h.cfg.SweepEvery)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			h.Sweep()
		}
	}
}

// Sweep runs one round of the background work.
func (h *Handler) Sweep() {
	now := h.cfg.Now().UnixNano()
	h.ExpireIdle(now)
	h.limits.sweep(now)
}

// ExpireIdle has the store erase every mailbox whose last claim or write
// is older than RELAY_IDLE at now, and returns how many it erased.
func (h *Handler) ExpireIdle(now int64) int {
	n, err := h.cfg.Store.ExpireIdle(context.Background(), now)
	if err != nil {
		h.log.Error("idle expiry failed", "err", err)
	}
	h.m.mailboxesExpired.Add(float64(n))
	return n
}
