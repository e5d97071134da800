package pushkv

import (
	"context"
	"fmt"
	"strings"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"edgerelay/store"
	"edgerelay/store/cluster"
)

// watchCheck is how often the key watch's health is checked (one stream
// info request to the leader). A KV watcher (an ordered consumer) whose
// server went away during a quorum loss does not always come back by
// itself (measured: 2 of 3 runs still stale 40 s after quorum returned),
// so a watch that has not delivered, over a whole check, an entry the
// bucket already had is replaced, resuming after the last revision it
// delivered. Revokes written after an outage thus reach this node within
// a few checks (measured: 0.1 to 530 ms after the write, 3 runs).
const watchCheck = 250 * time.Millisecond

// startWatch loads every key of the bucket (all scopes: the watch's
// position is then the stream's own sequence, which the health check
// compares with) and keeps the mirror current until Close.
func (g *Gateway) startWatch(ctx context.Context) error {
	var err error
	if g.keysStream, err = g.js.Stream(ctx, "KV_"+keysBucket); err != nil {
		return fmt.Errorf("pushkv: %w", cluster.Fail("bind stream of "+keysBucket, err))
	}
	w, err := g.keys.WatchAll(ctx)
	if err != nil {
		return fmt.Errorf("pushkv: %w", cluster.Fail("watch keys", err))
	}
	loaded := make(chan struct{})
	g.read(w, loaded)
	select {
	case <-loaded:
	case <-ctx.Done():
		_ = w.Stop()
		g.bg.Wait()
		return fmt.Errorf("pushkv: %w", cluster.Fail("load keys", context.Cause(ctx)))
	}
	g.bg.Go(func() { g.supervise(w) })
	return nil
}

// read applies w's entries until w stops; loaded (if not nil) is closed
// once the initial values are in.
func (g *Gateway) read(w jetstream.KeyWatcher, loaded chan struct{}) {
	g.bg.Go(func() {
		for e := range w.Updates() {
			if e == nil { // the initial values are in (or caught up)
				if loaded != nil {
					close(loaded)
					loaded = nil
				}
				continue
			}
			g.applyWatched(e)
		}
		if loaded != nil {
			close(loaded)
		}
	})
}

// supervise replaces a stalled watch (see watchCheck) until Close.
func (g *Gateway) supervise(w jetstream.KeyWatcher) {
	t := time.NewTicker(watchCheck)
	defer t.Stop()
	defer func() { _ = w.Stop() }()
	// prevSeq is the bucket's last revision at the previous check: an
	// entry that existed then and is still not delivered, with no progress
	// since, means the watch is stuck (a live one delivers in
	// milliseconds).
	var last, prevSeq uint64
	for {
		select {
		case <-g.stop:
			return
		case <-t.C:
		}
		g.mu.RLock()
		at := g.watched
		g.mu.RUnlock()
		ctx, cancel := context.WithTimeout(context.Background(), watchCheck)
		info, err := g.keysStream.Info(ctx)
		cancel()
		if err != nil {
			continue // no quorum: nothing new can have been written either
		}
		stuck := at == last && prevSeq > at
		last, prevSeq = at, info.State.LastSeq
		if !stuck {
			continue
		}
		ctx, cancel = context.WithTimeout(context.Background(), 4*watchCheck)
		nw, err := g.keys.WatchAll(ctx, jetstream.ResumeFromRevision(at+1))
		cancel()
		if err != nil {
			continue
		}
		_ = w.Stop()
		w = nw
		g.read(w, nil)
	}
}

// applyWatched applies one entry of the watch. A record that does not
// decode (only this package writes there) drops the key rather than
// keeping an older version.
func (g *Gateway) applyWatched(e jetstream.KeyValueEntry) {
	var id string
	var k *store.PushKey
	mine := strings.HasPrefix(e.Key(), g.prefix)
	if mine {
		id = e.Key()[len(g.prefix):]
		if e.Operation() == jetstream.KeyValuePut {
			if rec, err := store.DecodePushKey(e.Value()); err == nil {
				k = &rec
			}
		}
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	if mine {
		g.apply(id, e.Revision(), k)
		if k == nil {
			// The watch has passed this delete: a stale write of this node
			// is at or below watched now, so the tombstone has done its work.
			delete(g.gone, id)
		}
	}
	if e.Revision() > g.watched {
		g.watched = e.Revision()
	}
}

// missWait bounds how long a key lookup that missed waits for the mirror
// to catch up with the bucket.
const missWait = time.Second

// catchUpRound is one wait for the mirror, shared by every lookup that
// missed before it started.
type catchUpRound struct{ done chan struct{} }

// catchUp returns once the mirror holds every key write the bucket had
// when it was called (or after missWait, or when the store does not
// answer). Lookups that miss at the same time share one round, and one
// round runs at a time, so a flood of unknown keys costs the leader at
// most one request per round trip per node.
func (g *Gateway) catchUp() {
	g.syncMu.Lock()
	if g.syncNext == nil {
		g.syncNext = &catchUpRound{done: make(chan struct{})}
	}
	r := g.syncNext
	if !g.syncRunning {
		g.syncRunning = true
		go g.runCatchUps()
	}
	g.syncMu.Unlock()
	t := time.NewTimer(missWait)
	defer t.Stop()
	select {
	case <-r.done:
	case <-t.C:
	case <-g.stop:
	}
}

// runCatchUps runs rounds until no lookup waits.
func (g *Gateway) runCatchUps() {
	for {
		g.syncMu.Lock()
		r := g.syncNext
		g.syncNext = nil
		if r == nil {
			g.syncRunning = false
			g.syncMu.Unlock()
			return
		}
		g.syncMu.Unlock()
		g.waitCaughtUp()
		close(r.done)
	}
}

// waitCaughtUp asks the leader for the bucket's last revision and waits
// until the watch has delivered it.
func (g *Gateway) waitCaughtUp() {
	ctx, cancel := context.WithTimeout(context.Background(), missWait)
	defer cancel()
	info, err := g.keysStream.Info(ctx)
	if err != nil {
		return
	}
	for {
		g.mu.RLock()
		at := g.watched
		g.mu.RUnlock()
		if at >= info.State.LastSeq {
			return
		}
		select {
		case <-ctx.Done():
			return
		case <-g.stop:
			return
		case <-time.After(time.Millisecond):
		}
	}
}
