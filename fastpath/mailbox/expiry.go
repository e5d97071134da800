package mailbox

import (
	"context"
	"time"

	"edgerelay/fastpath/ws"
	"edgerelay/store"
)

// cacheIdle is how long an unused mailbox stays in memory.
const cacheIdle = 10 * time.Minute

// Run does the background work until ctx ends: it sends push wake-ups,
// erases mailboxes idle
// longer than RELAY_IDLE (they already answer 404 the moment they expire;
// this reclaims their space), evicts idle rate-limit buckets, and drops
// unused mailboxes from memory.
func (h *Handler) Run(ctx context.Context) {
	every := h.cfg.Idle / 4
	if every > time.Minute {
		every = time.Minute
	}
	if every < 10*time.Millisecond {
		every = 10 * time.Millisecond
	}
	go h.SendPushes(ctx)
	t := time.NewTicker(every)
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
	h.cache.evictIdle(now - int64(cacheIdle))
}

// ExpireIdle erases every mailbox whose last claim or write is older than
// RELAY_IDLE at now, and returns how many it erased.
func (h *Handler) ExpireIdle(now int64) int {
	cutoff := now - int64(h.cfg.Idle)
	type entry struct {
		name string
		at   int64
	}
	var entries []entry
	err := h.cfg.Store.IdleBefore(cutoff, func(name string, at int64) bool {
		entries = append(entries, entry{name, at})
		return len(entries) < 1000 // a bounded batch per round
	})
	if err != nil {
		h.log.Error("idle scan failed", "err", err)
		return 0
	}
	erased := 0
	for _, e := range entries {
		// The sweeper's own work makes an entry; one it does not erase
		// is left unused (lastUse 0), for the next round to evict.
		m := h.cache.acquire([]byte(e.name))
		if h.expireOne(m, e.name, e.at, now) {
			erased++
		}
		h.cache.release(m)
	}
	return erased
}

// expireOne is ExpireIdle's work on one index entry (m held); it reports
// whether it erased the mailbox.
func (h *Handler) expireOne(m *mailbox, name string, at, now int64) bool {
	m.mu.Lock()
	if err := m.load(h.cfg.Store); err != nil {
		m.mu.Unlock()
		h.log.Error("expiry load failed", "err", err)
		return false
	}
	switch {
	case !m.exists || (at != m.persisted && !h.expired(m, now)):
		// A stale index entry (the mailbox was claimed or written
		// since, or is gone): drop the entry alone.
		if err := h.cfg.Store.DropIdle(at, name); err != nil {
			h.log.Error("idle index cleanup failed", "err", err)
		}
		m.mu.Unlock()
		return false
	case !h.expired(m, now):
		// Written since, but not yet persisted: persist it now, which
		// moves its index entry forward.
		rec := store.MailboxRecord{Token: m.rec.Token, LastActive: m.rec.LastActive}
		if err := h.cfg.Store.Claim(name, rec, at, false); err != nil {
			h.log.Error("idle touch failed", "err", err)
		} else {
			m.persisted = rec.LastActive
		}
		m.mu.Unlock()
		return false
	}
	h.waitInflight(m)
	if err := h.cfg.Store.Erase(name); err != nil {
		m.mu.Unlock()
		h.log.Error("expiry erase failed", "err", err)
		return false
	}
	if err := h.cfg.Store.DropIdle(at, name); err != nil {
		h.log.Error("idle index cleanup failed", "err", err)
	}
	conns := m.forget()
	m.mu.Unlock()
	for _, c := range conns {
		c.Close(ws.CloseNormal, "mailbox expired")
	}
	h.m.mailboxesExpired.Inc()
	return true
}
