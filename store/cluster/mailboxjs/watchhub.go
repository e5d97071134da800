package mailboxjs

import (
	"context"
	"errors"
	"strconv"
	"sync"
	"time"

	"github.com/nats-io/nats.go"

	"edgerelay/store"
	"edgerelay/store/cluster"
)

// opTimeout bounds one check of a watch.
const opTimeout = 5 * time.Second

// The watches of Mailboxes: the same protocol as Store.Watch (subscribe to
// the RePublish subject, read the head through the leader, backfill up to
// it, then follow the chain of compare-and-set predecessors, reading a gap
// back from the stream), shaped so that a waiting watch costs no
// goroutine: every watch's subscription is a ChanSubscribe onto the
// node's one channel (nats.go runs no goroutine for it), read by the
// node's one dispatcher, which hands each message to its watch. A live
// message next in the chain is delivered right there (store.WatchConfig:
// a live Deliver does not block); the backfill, and the read-back of a
// gap, run on a goroutine of their own that ends with them, while the
// dispatcher queues what arrives meanwhile (at most watchQueueBytes: past
// it the watch ends with store.ErrWatchOverflow). Erased reaches the
// watches through the node's control subscription, not one per watch.
// What no notice says (the last notification lost, with nothing after it
// to show the gap; an erased notice lost) is found by resync every
// slotRefresh after a reconnect or a slow consumer's drop.

// hubQueueLen is the node's channel of republished messages: a dispatcher
// that falls this far behind makes nats.go drop messages (a slow
// consumer), which each watch then reads back as a gap.
const hubQueueLen = 1 << 16

// watchQueueBytes bounds what waits for one watch's backfill or read-back.
const watchQueueBytes = 1 << 20

type hub struct {
	ch     chan *nats.Msg
	mu     sync.Mutex
	subs   map[*nats.Subscription]*liveWatch
	byName map[string]map[*liveWatch]struct{}
	// fg: the foreground questions' subscriptions (presence.go), by the
	// direction they answer for; answer answers one.
	fg     map[*nats.Subscription]string
	answer func(key string, m *nats.Msg)
}

func newHub(answer func(key string, m *nats.Msg)) *hub {
	return &hub{
		ch: make(chan *nats.Msg, hubQueueLen), subs: map[*nats.Subscription]*liveWatch{},
		byName: map[string]map[*liveWatch]struct{}{}, fg: map[*nats.Subscription]string{}, answer: answer,
	}
}

// run dispatches until stop.
func (h *hub) run(stop <-chan struct{}, done chan<- struct{}) {
	defer close(done)
	for {
		select {
		case <-stop:
			return
		case m := <-h.ch:
			h.mu.Lock()
			w := h.subs[m.Sub]
			key, fg := h.fg[m.Sub]
			h.mu.Unlock()
			switch {
			case w != nil:
				w.onMsg(m)
			case fg:
				h.answer(key, m)
			}
		}
	}
}

// erased ends the watches of name on this node that began under a claim
// record of revision upTo or older (0: every one).
func (h *hub) erased(name string, upTo uint64) {
	h.mu.Lock()
	var ws []*liveWatch
	for w := range h.byName[name] {
		if upTo == 0 || w.claimRev <= upTo {
			ws = append(ws, w)
		}
	}
	h.mu.Unlock()
	for _, w := range ws {
		w.finish(store.ErrErased)
	}
}

func (h *hub) remove(w *liveWatch) {
	h.mu.Lock()
	delete(h.subs, w.sub)
	if set := h.byName[w.name]; set != nil {
		delete(set, w)
		if len(set) == 0 {
			delete(h.byName, w.name)
		}
	}
	h.mu.Unlock()
}

// resync, run every slotRefresh, covers what the chain cannot see: a
// notification lost with nothing after it, and an erased notice lost. After
// the connection reconnected (core messages are lost meanwhile) the claim
// cache is dropped and every watch is checked; otherwise only the watches
// whose subscription dropped messages (the dispatcher fell behind).
func (m *Mailboxes) resync(force bool) {
	reconnects := m.s.nc.Stats().Reconnects
	all := m.reconnects.Swap(reconnects) != reconnects || force
	if all {
		m.mu.Lock()
		clear(m.claims)
		m.mu.Unlock()
	}
	m.hub.mu.Lock()
	var ws []*liveWatch
	for sub, w := range m.hub.subs {
		dropped, _ := sub.Dropped()
		if all || dropped != w.dropped {
			w.dropped = dropped
			ws = append(ws, w)
		}
	}
	m.hub.mu.Unlock()
	_ = cluster.Each(len(ws), func(i int) error {
		ws[i].check()
		return nil
	})
}

// check reads the claim and the head through the leader: a mailbox gone
// ends the watch; a head past the last message handled is read back.
func (w *liveWatch) check() {
	ctx, cancel := context.WithTimeout(w.life, opTimeout)
	defer cancel()
	rec, _, err := w.m.s.readClaim(ctx, w.n)
	switch {
	case errors.Is(err, store.ErrNotFound) || (err == nil && rec.Token != w.token):
		w.finish(store.ErrErased) // erased, or taken over by another token
		return
	case err != nil:
		return // asked again next round
	}
	head, err := w.m.s.readHead(ctx, w.n, w.dir)
	if err != nil {
		return
	}
	// A marker as if head's message had come with an unknown predecessor:
	// drain reads (last, head] back and delivers what it holds.
	marker := &nats.Msg{Header: nats.Header{hdrStreamSq: {strconv.FormatUint(head.Rev, 10)}, hdrExpSeq: {strconv.FormatUint(^uint64(0), 10)}}}
	w.mu.Lock()
	if w.ended || head.Rev <= w.last {
		w.mu.Unlock()
		return
	}
	w.pending = append(w.pending, marker)
	start := !w.replaying
	w.replaying = true
	w.mu.Unlock()
	if start {
		go w.drain()
	}
}

// liveWatch is one watch of Mailboxes.
type liveWatch struct {
	m    *Mailboxes
	n    names
	name string
	dir  byte
	cfg  store.WatchConfig
	// ctx is the caller's, given to Deliver; life ends with the watch:
	// the store reads of a read-back use it.
	ctx    context.Context
	life   context.Context
	cancel context.CancelFunc
	sub    *nats.Subscription
	// claimRev is the claim record's revision when the watch began (set
	// before the watch is registered for erased notices).
	claimRev uint64
	token    store.Hash
	dropped  int // the subscription's dropped messages, as of the last resync (hub.mu)

	mu        sync.Mutex // held briefly, never while delivering or reading
	replaying bool       // a goroutine backfills or reads back; onMsg queues
	pending   []*nats.Msg
	queued    int    // bytes in pending
	last      uint64 // the last message of the direction handled
	ended     bool
	stopped   bool // stop was called: End is not
	endMu     sync.Mutex
}

// Watch starts a watch of the direction and returns at once (see the
// interface, and the comment at the top of this file). The backfill is
// delivered with replayed true, the rest false. ctx bounds the backfill
// and is Deliver's; End gets store.ErrErased, store.ErrWatchOverflow,
// Deliver's error or a store error (wrapping store.ErrUnavailable), never
// after stop has returned.
func (h *mailbox) Watch(ctx context.Context, dir byte, cfg store.WatchConfig) (func(), error) {
	m := h.m
	n, err := m.s.names(h.e.name)
	if err != nil {
		return nil, err
	}
	w := &liveWatch{m: m, n: n, name: h.e.name, dir: dir, cfg: cfg, ctx: ctx, replaying: true, claimRev: ^uint64(0), token: h.e.token}
	w.life, w.cancel = context.WithCancel(context.Background())
	// Registered under the hub's lock, so that the dispatcher cannot see
	// a message of the subscription before it knows the watch.
	m.hub.mu.Lock()
	w.sub, err = m.s.nc.ChanSubscribe(n.watch(dir), m.hub.ch)
	if err == nil {
		m.hub.subs[w.sub] = w
		set := m.hub.byName[w.name]
		if set == nil {
			set = map[*liveWatch]struct{}{}
			m.hub.byName[w.name] = set
		}
		set[w] = struct{}{}
	}
	m.hub.mu.Unlock()
	if err != nil {
		w.cancel()
		return nil, cluster.Fail("watch "+w.name, err)
	}
	fail := func(err error) (func(), error) {
		w.close()
		return nil, err
	}
	// The subscription reaches the server before the head is read, so a
	// message stored after that read is republished to this watch; one
	// lost anyway shows as a gap at the next one.
	bctx, cancel := bounded(ctx)
	defer cancel()
	if err := m.s.nc.FlushWithContext(bctx); err != nil {
		return fail(cluster.Fail("watch "+w.name, err))
	}
	head, err := m.s.readHead(bctx, n, dir)
	if err != nil {
		return fail(unavailable("watch "+w.name, err))
	}
	// The mailbox may have gone between Open and the subscription, and
	// its erased then reached nobody: the record tells.
	rec, rev, err := m.s.readClaim(bctx, n)
	if errors.Is(err, store.ErrNotFound) || (err == nil && rec.Token != h.e.token) {
		return fail(store.ErrErased)
	}
	if err != nil {
		return fail(unavailable("watch "+w.name, err))
	}
	m.hub.mu.Lock()
	w.claimRev = rev
	m.hub.mu.Unlock()
	w.mu.Lock()
	w.last = head.Rev
	w.mu.Unlock()
	go w.backfill(ctx, head)
	return w.stop, nil
}

// stop ends the watch; End is not called once it has returned.
func (w *liveWatch) stop() {
	w.endMu.Lock()
	w.stopped = true
	w.endMu.Unlock()
	w.close()
}

// close ends the watch without End.
func (w *liveWatch) close() {
	w.mu.Lock()
	was := w.ended
	w.ended = true
	w.pending, w.queued = nil, 0
	w.mu.Unlock()
	if !was {
		w.cancel()
		_ = w.sub.Unsubscribe()
		w.m.hub.remove(w)
	}
}

// finish ends the watch by itself and tells End why (once, never after
// stop). End runs with endMu held, so stop waits for it.
func (w *liveWatch) finish(err error) {
	w.mu.Lock()
	was := w.ended
	w.mu.Unlock()
	if was {
		return
	}
	w.close()
	w.endMu.Lock()
	defer w.endMu.Unlock()
	if !w.stopped && w.cfg.End != nil {
		w.cfg.End(err)
	}
}

// onMsg runs on the dispatcher: it must not block.
func (w *liveWatch) onMsg(m *nats.Msg) {
	if drop := w.m.dropLive.Load(); drop != nil && (*drop)(m) {
		return
	}
	w.mu.Lock()
	if w.ended {
		w.mu.Unlock()
		return
	}
	if w.replaying {
		w.queued += len(m.Data) + 64
		if w.queued > watchQueueBytes {
			w.mu.Unlock()
			w.finish(store.ErrWatchOverflow)
			return
		}
		w.pending = append(w.pending, m)
		w.mu.Unlock()
		return
	}
	seq, prev := chainOf(m)
	if seq <= w.last {
		w.mu.Unlock()
		return // read back already
	}
	if prev != w.last {
		// A lost notification: read the gap back on a goroutine; this
		// message waits for it.
		w.replaying = true
		w.pending = append(w.pending, m)
		w.queued += len(m.Data) + 64
		w.mu.Unlock()
		go w.drain()
		return
	}
	w.last = seq
	w.mu.Unlock()
	if err := w.handle(w.ctx, m.Subject, m.Data, false); err != nil {
		w.finish(err)
	}
}

// chainOf is a republished message's stream sequence and its
// predecessor's (its compare-and-set expectation).
func chainOf(m *nats.Msg) (seq, prev uint64) {
	seq, _ = strconv.ParseUint(m.Header.Get(hdrStreamSq), 10, 64)
	prev, _ = strconv.ParseUint(m.Header.Get(hdrExpSeq), 10, 64)
	return seq, prev
}

// handle delivers a direction message if it is an envelope above After
// (a prune mark only moves the chain on).
func (w *liveWatch) handle(ctx context.Context, subject string, data []byte, replayed bool) error {
	if len(subject) >= 2 && subject[len(subject)-2:] == ".m" {
		return nil
	}
	if c := envelopeSeq(data); c > w.cfg.After {
		if err := w.cfg.Deliver(ctx, data, replayed); err != nil {
			return err
		}
	}
	return nil
}

// backfill delivers every stored envelope above After as of head, then
// what arrived meanwhile, then leaves the watch to the dispatcher.
func (w *liveWatch) backfill(ctx context.Context, head Head) {
	// ctx bounds the backfill; stop ends it too.
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	stopBackfill := context.AfterFunc(w.life, cancel)
	defer stopBackfill()
	var derr error
	_, err := w.m.s.scan(ctx, w.n, w.dir, &head, w.cfg.After, 0, func(seq uint64, env []byte) bool {
		derr = w.cfg.Deliver(ctx, env, true)
		return derr == nil
	})
	switch {
	case w.life.Err() != nil:
		return // stopped or ended
	case ctx.Err() != nil:
		w.close() // the caller's ctx ended the backfill: no End
		return
	case derr != nil:
		w.finish(derr)
		return
	case err != nil:
		w.finish(unavailable("watch "+w.name, err))
		return
	}
	w.drain()
}

// drain handles what the dispatcher queued while a goroutine had the
// watch, reading gaps back from the stream, until nothing is queued; then
// the dispatcher has the watch again.
func (w *liveWatch) drain() {
	for {
		w.mu.Lock()
		if w.ended {
			w.mu.Unlock()
			return
		}
		batch := w.pending
		w.pending, w.queued = nil, 0
		if len(batch) == 0 {
			w.replaying = false
			w.mu.Unlock()
			return
		}
		last := w.last
		w.mu.Unlock()
		for _, m := range batch {
			seq, prev := chainOf(m)
			if seq <= last {
				continue
			}
			if prev != last {
				var derr error
				var err error
				last, err = w.m.s.readBack(w.life, w.n, w.dir, last, seq, func(subject string, data []byte) bool {
					derr = w.handle(w.ctx, subject, data, false)
					return derr == nil
				})
				switch {
				case w.life.Err() != nil:
					return
				case derr != nil:
					w.finish(derr)
					return
				case err != nil:
					w.finish(unavailable("watch "+w.name, err))
					return
				}
				if seq <= last {
					continue
				}
			}
			last = seq
			if err := w.handle(w.ctx, m.Subject, m.Data, false); err != nil {
				w.finish(err)
				return
			}
		}
		w.mu.Lock()
		w.last = last
		w.mu.Unlock()
	}
}
