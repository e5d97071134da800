package mailboxlocal

import (
	"context"
	"slices"
	"sync"

	"edgerelay/store"
)

// watcher is one Watch. While it replays stored envelopes, live ones are
// only noted (by sequence) and sent after the replay, so that the reader
// sees every envelope above After exactly once.
type watcher struct {
	m   *mailbox
	dir byte
	// ctx is Watch's own, for live deliveries (which never wait); the
	// replay runs under a cancelable child of it that is let go when the
	// replay ends, so an idle watch keeps no context of its own.
	ctx context.Context
	cfg store.WatchConfig
	// endMu orders End against stop: once done, End is never called.
	endMu sync.Mutex
	done  bool
	// stopReplay cancels a replay still running (nil once it ended);
	// stopped makes stop run once.
	stopReplay context.CancelFunc
	stopped    bool

	mu        sync.Mutex
	replaying bool
	missed    []uint64 // live sequences stored during the replay
	// skip holds sequences the replay already sent whose writes were
	// visible in the store but had not yet reached deliver when the
	// replay ended: deliver drops them once.
	skip map[uint64]struct{}
}

// end tells End why the watch ended (the first reason wins, and none
// after stop).
func (w *watcher) end(err error) {
	w.endMu.Lock()
	defer w.endMu.Unlock()
	if !w.done {
		w.done = true
		w.cfg.End(err)
	}
}

// deliver sends a newly stored envelope (mailbox mu held).
func (w *watcher) deliver(seq uint64, env []byte) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.replaying {
		w.missed = append(w.missed, seq)
		return
	}
	if _, dup := w.skip[seq]; dup {
		delete(w.skip, seq)
		return
	}
	if err := w.cfg.Deliver(w.ctx, env, false); err != nil {
		w.end(err)
	}
}

// Watch registers the watcher, replays the stored envelopes above
// cfg.After on a goroutine that ends with the replay, then the ones stored
// meanwhile; after that each new one is delivered by the write that
// stored it, so a waiting watch holds no goroutine.
func (m *mailbox) Watch(ctx context.Context, dir byte, cfg store.WatchConfig) (func(), error) {
	replayCtx, cancel := context.WithCancel(ctx)
	w := &watcher{m: m, dir: dir, ctx: ctx, cfg: cfg, replaying: true, stopReplay: cancel}
	m.mu.Lock()
	if !m.exists {
		m.mu.Unlock()
		cancel()
		return nil, store.ErrErased
	}
	d, err := m.direction(dir)
	if err != nil {
		m.mu.Unlock()
		cancel()
		return nil, err
	}
	d.watchers = append(d.watchers, w)
	m.refs.Add(1) // the watch holds the mailbox in memory until stopped
	m.mu.Unlock()
	go func() {
		err := m.replay(replayCtx, dir, w)
		if err != nil && replayCtx.Err() == nil {
			w.end(err)
		}
		w.endMu.Lock()
		w.stopReplay = nil
		w.endMu.Unlock()
		cancel()
	}()
	return w.stop, nil
}

// stop ends the watch (the function Watch returns): End is not called
// after it, a replay still running is cancelled, and the mailbox is let
// go. Only the first call does anything.
func (w *watcher) stop() {
	w.endMu.Lock()
	if w.stopped {
		w.endMu.Unlock()
		return
	}
	w.stopped, w.done = true, true
	cancel := w.stopReplay
	w.stopReplay = nil
	w.endMu.Unlock()
	if cancel != nil {
		cancel()
	}
	w.m.removeWatcher(w.dir, w)
	w.m.Release()
}

func (m *mailbox) removeWatcher(dir byte, w *watcher) {
	m.mu.Lock()
	defer m.mu.Unlock()
	d := &m.dirs[dirIndex(dir)]
	if i := slices.Index(d.watchers, w); i >= 0 {
		// slices.Delete clears the vacated slot: a watcher left there
		// would keep its socket reachable for as long as the mailbox
		// stays in memory.
		d.watchers = slices.Delete(d.watchers, i, i+1)
	}
}

// replay sends every stored envelope above After (Deliver paces them),
// then the ones stored meanwhile, then switches w to live delivery.
func (m *mailbox) replay(ctx context.Context, dir byte, w *watcher) error {
	after := w.cfg.After
	sent := make(map[uint64]struct{})
	var failed error
	err := m.s.log.Scan(m.name, dir, after, func(seq uint64, env []byte) bool {
		sent[seq] = struct{}{}
		failed = w.cfg.Deliver(ctx, env, true)
		return failed == nil
	})
	if err != nil {
		return err
	}
	if failed != nil {
		return failed
	}
	// Send what was stored during the replay, then go live. The lock
	// order (mailbox, then watcher) matches deliver's.
	for {
		m.mu.Lock()
		w.mu.Lock()
		missed := w.missed
		w.missed = nil
		if len(missed) == 0 {
			// Writes still between their sync and their deliver are
			// exactly the in-flight ones.
			for seq := range m.dirs[dirIndex(dir)].inflight {
				if _, dup := sent[seq]; dup {
					if w.skip == nil {
						w.skip = make(map[uint64]struct{})
					}
					w.skip[seq] = struct{}{}
				}
			}
			w.replaying = false
			w.mu.Unlock()
			m.mu.Unlock()
			return nil
		}
		w.mu.Unlock()
		m.mu.Unlock()
		for _, seq := range missed {
			if _, dup := sent[seq]; dup || seq <= after {
				continue
			}
			sent[seq] = struct{}{}
			if _, err := m.s.log.Envelope(m.name, dir, seq, func(env []byte) { failed = w.cfg.Deliver(ctx, env, true) }); err != nil {
				return err
			}
			if failed != nil {
				return failed
			}
		}
	}
}
