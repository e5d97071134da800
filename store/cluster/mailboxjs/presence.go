package mailboxjs

import (
	"context"
	"encoding/json"
	"errors"
	"strconv"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"edgerelay/store"
	"edgerelay/store/cluster"
)

// Watcher places and the foreground mark: what the 8-watcher limit and
// the 45 s rule need to see across nodes.
//
// A place is one of the MaxWatchers keys <app>.<id>.<dir>.<0-7> of the
// er_watch bucket, written by create-if-absent with a per-key TTL
// (slotTTL, 90 s) and refreshed by the node every slotRefresh (30 s) by a
// direct publish with Nats-TTL and a compare-and-set on its revision
// (kv.Update cannot renew a TTL, CLUSTER.md §1.3); the value names the
// node and its incarnation, so a place whose node is dead (cluster.Alive)
// is free and is taken over by compare-and-set on its revision. Leaving
// replaces it, by compare-and-set, with a delete marker that expires by
// itself, so no key outlives its watcher by more than a second.
//
// Foreground: the mark is kept with this node's places of the direction
// (SetForeground on a direction this node holds no place of is ignored,
// and the mark goes with the last place). While it holds one, the node
// answers core requests on er.fg.<app>.<id>.<dir>, only when the mark is
// ahead of the asker's now; so "no responders" answers at once when no
// node watches, and a question to a direction watched only in the
// background waits fgTimeout.

// dirPresence is one direction's places held on this node.
type dirPresence struct {
	places  int
	fgUntil int64
	sub     *nats.Subscription // er.fg.<app>.<id>.<dir> while places > 0
}

// slot is one place this node holds.
type slot struct {
	m       *Mailboxes
	key     string // cacheKey of the direction
	subject string // $KV.er_watch.<app>.<id>.<dir>.<i>

	mu   sync.Mutex
	rev  uint64
	left bool
	once sync.Once
}

func ownerValue(node, incarnation string) []byte {
	b, _ := json.Marshal(slotOwner{Node: node, Incarnation: incarnation})
	return b
}

type slotOwner struct {
	Node        string `json:"node"`
	Incarnation string `json:"incarnation"`
}

const (
	hdrTTL        = "Nats-TTL"
	hdrKVOp       = "KV-Operation"
	hdrMarkReason = "Nats-Marker-Reason"
)

func (n names) fg(dir byte) string { return "er.fg." + n.app + "." + n.id + "." + dirToken(dir) }

func (n names) slotSubject(dir byte, i int) string {
	return "$KV." + WatchBucket + "." + n.app + "." + n.id + "." + dirToken(dir) + "." + strconv.Itoa(i)
}

// JoinWatchers takes the first free place of the direction.
func (h *mailbox) JoinWatchers(ctx context.Context, dir byte) (func(), error) {
	m := h.m
	n, err := m.s.names(h.e.name)
	if err != nil {
		return nil, err
	}
	alive := map[slotOwner]bool{} // each owner's liveness read once a join
	for i := range store.MaxWatchers {
		subject := n.slotSubject(dir, i)
		rev, ok, err := m.takeSlot(ctx, subject, alive)
		if err != nil {
			return nil, err
		}
		if !ok {
			continue
		}
		sl := &slot{m: m, key: cacheKey(h.e.name, dir), subject: subject, rev: rev}
		if err := m.hold(sl, n, dir); err != nil {
			sl.leave()
			return nil, err
		}
		return sl.leave, nil
	}
	return nil, store.ErrTooManyWatchers
}

// takeSlot writes this node's owner value to a place if it is free (no
// value, deleted, expired, or its owner's node incarnation is gone).
func (m *Mailboxes) takeSlot(ctx context.Context, subject string, alive map[slotOwner]bool) (uint64, bool, error) {
	var expect uint64
	for range 4 {
		ack, err := m.publishSlot(ctx, subject, m.owner, expect, m.slotTTL, false)
		if err == nil {
			return ack.Sequence, true, nil
		}
		if !cluster.Conflict(err) {
			return 0, false, cluster.Fail("watcher place", err)
		}
		raw, err := m.slots.GetLastMsgForSubject(ctx, subject)
		if errors.Is(err, jetstream.ErrMsgNotFound) {
			expect = 0
			continue
		}
		if err != nil {
			return 0, false, cluster.Fail("watcher place", err)
		}
		expect = raw.Sequence
		if raw.Header.Get(hdrKVOp) != "" || raw.Header.Get(hdrMarkReason) != "" || len(raw.Data) == 0 {
			continue // deleted or expired
		}
		var o slotOwner
		if json.Unmarshal(raw.Data, &o) != nil {
			continue // not ours to keep
		}
		live, known := alive[o]
		if !known {
			if live, err = m.s.c.Alive(ctx, o.Node, o.Incarnation); err != nil {
				return 0, false, err
			}
			alive[o] = live
		}
		if live {
			return 0, false, nil
		}
	}
	return 0, false, nil // contended: counts as taken
}

// publishSlot writes a place by compare-and-set on expect (0: absent),
// with its TTL; del writes the delete marker instead of the owner.
func (m *Mailboxes) publishSlot(ctx context.Context, subject string, value []byte, expect uint64, ttl time.Duration, del bool) (*jetstream.PubAck, error) {
	msg := nats.NewMsg(subject)
	msg.Data = value
	msg.Header.Set(hdrExpSeq, strconv.FormatUint(expect, 10))
	msg.Header.Set(hdrTTL, ttl.String())
	if del {
		msg.Header.Set(hdrKVOp, "DEL")
	}
	return m.s.js.PublishMsg(ctx, msg)
}

// hold records a taken place: the refresher renews it, and the node
// answers foreground questions for the direction while it holds one.
func (m *Mailboxes) hold(sl *slot, n names, dir byte) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.closed {
		return cluster.Fail("join watchers", errors.New("closed"))
	}
	p := m.dirs[sl.key]
	if p == nil {
		// Onto the hub's channel: no goroutine per watched direction.
		p = &dirPresence{}
		m.hub.mu.Lock()
		sub, err := m.s.nc.ChanSubscribe(n.fg(dir), m.hub.ch)
		if err == nil {
			m.hub.fg[sub] = sl.key
		}
		m.hub.mu.Unlock()
		if err != nil {
			return cluster.Fail("subscribe foreground", err)
		}
		p.sub = sub
		m.dirs[sl.key] = p
	}
	p.places++
	m.held[sl] = struct{}{}
	return nil
}

// leave gives the place back (once): the direction's presence here ends
// with its last place.
func (sl *slot) leave() {
	sl.once.Do(func() {
		m := sl.m
		m.mu.Lock()
		if _, ok := m.held[sl]; ok {
			delete(m.held, sl)
			if p := m.dirs[sl.key]; p != nil {
				if p.places--; p.places <= 0 {
					_ = p.sub.Unsubscribe()
					m.hub.mu.Lock()
					delete(m.hub.fg, p.sub)
					m.hub.mu.Unlock()
					delete(m.dirs, sl.key)
				}
			}
		}
		m.mu.Unlock()
		sl.mu.Lock()
		defer sl.mu.Unlock()
		sl.left = true
		ctx, cancel := cluster.Context()
		defer cancel()
		// A conflict: another node took the place (this one looked dead);
		// any other failure: the TTL frees it.
		_, _ = m.publishSlot(ctx, sl.subject, nil, sl.rev, time.Second, true)
	})
}

func (m *Mailboxes) refreshLoop() {
	defer close(m.done)
	t := time.NewTicker(m.slotRefresh)
	defer t.Stop()
	for {
		select {
		case <-m.stop:
			return
		case <-t.C:
		}
		m.resync(false)
		m.mu.Lock()
		held := make([]*slot, 0, len(m.held))
		for sl := range m.held {
			held = append(held, sl)
		}
		m.mu.Unlock()
		// Side by side (8 at a time): 10k places take a few seconds a
		// round, well inside the TTL.
		_ = cluster.Each(len(held), func(i int) error {
			select {
			case <-m.stop:
			default:
				held[i].refresh()
			}
			return nil
		})
	}
}

// refresh renews a place's TTL by compare-and-set on its revision.
func (sl *slot) refresh() {
	sl.mu.Lock()
	defer sl.mu.Unlock()
	if sl.left {
		return
	}
	ctx, cancel := cluster.Context()
	defer cancel()
	ack, err := sl.m.publishSlot(ctx, sl.subject, sl.m.owner, sl.rev, sl.m.slotTTL, false)
	switch {
	case err == nil:
		sl.rev = ack.Sequence
	case cluster.Conflict(err):
		// Taken over: this node looked dead to another (its liveness
		// record lapsed). The watcher keeps running; the place is not
		// this node's to renew any more.
		sl.m.log.Warn("mailbox watcher place taken over by another node")
		sl.left = true
	default:
		sl.m.log.Warn("mailbox watcher place not renewed", "err", err)
	}
}

// SetForeground marks the direction's reader in the foreground until
// until, on this node, while the node holds a place of the direction.
func (h *mailbox) SetForeground(dir byte, until int64) {
	m := h.m
	m.mu.Lock()
	if p := m.dirs[cacheKey(h.e.name, dir)]; p != nil {
		p.fgUntil = max(p.fgUntil, until)
	}
	m.mu.Unlock()
}

// Foreground reports whether a reader of the direction is in the
// foreground at now: this node's mark first, else a question to the
// nodes that hold a place of it.
func (h *mailbox) Foreground(ctx context.Context, dir byte, now int64) bool {
	m := h.m
	if m.localForeground(h.e.name, dir, now) {
		return true
	}
	n, err := m.s.names(h.e.name)
	if err != nil {
		return false
	}
	ctx, cancel := context.WithTimeout(ctx, m.fgTimeout)
	defer cancel()
	resp, err := m.s.nc.RequestWithContext(ctx, n.fg(dir), strconv.AppendInt(nil, now, 10))
	return err == nil && string(resp.Data) == "1"
}

// localForeground is this node's mark.
func (m *Mailboxes) localForeground(name string, dir byte, now int64) bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	p := m.dirs[cacheKey(name, dir)]
	return p != nil && p.fgUntil > now
}

// answerForeground runs on the subscription's goroutine: it answers only
// when this node's mark is ahead of the asker's now.
func (m *Mailboxes) answerForeground(key string, msg *nats.Msg) {
	now, err := strconv.ParseInt(string(msg.Data), 10, 64)
	if err != nil {
		return
	}
	m.mu.Lock()
	p := m.dirs[key]
	fg := p != nil && p.fgUntil > now
	m.mu.Unlock()
	if fg {
		_ = msg.Respond([]byte("1"))
	}
}
