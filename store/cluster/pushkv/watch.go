package pushkv

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"edgerelay/store"
	"edgerelay/store/cluster"
)

// watchCheck is how often the key watch's health is checked (one stream
// info request to the leader; what the mirror lacks by then is read at
// once, readLag). A KV watcher (an ordered consumer) whose
// server went away during a quorum loss does not always come back by
// itself (measured: 2 of 3 runs still stale 40 s after quorum returned),
// so a watch that has not delivered, over a whole check, an entry the
// bucket already had is replaced, resuming after the last revision it
// delivered. Before that, each check reads from the leader what the
// mirror lacks (readLag), so a revoke reaches a node whose watch is
// stalled within about a check (TestCatchUpReadsWhatAStalledWatchLacks:
// 220 ms); after a quorum loss, once the stream answers again (measured
// 0.3 to 0.6 s after the write with a CPU hog beside, 6 runs).
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
			g.watchHold.RLock()
			g.applyWatched(e)
			g.watchHold.RUnlock()
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
		at := g.watchAt
		g.mu.RUnlock()
		ctx, cancel := context.WithTimeout(context.Background(), watchCheck)
		info, err := g.keysStream.Info(ctx)
		cancel()
		if err != nil {
			continue // no quorum: nothing new can have been written either
		}
		g.readLag(info.State.LastSeq)
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

// readLag reads from the leader what the bucket has up to last and the
// mirror lacks (at most maxDirect revisions), at each check: a revocation
// written while this node's watch is stalled (after a quorum loss, or on
// a loaded node) then holds here within a check, not only once the
// stalled watch has been noticed (two checks) and replaced. A live watch
// has almost always delivered it already, and then nothing is read.
func (g *Gateway) readLag(last uint64) {
	g.mu.RLock()
	known := g.known
	g.mu.RUnlock()
	if last <= known || last-known > maxDirect {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), watchCheck)
	defer cancel()
	g.readMissing(ctx, known, last)
}

// applyWatched applies one entry of the watch.
func (g *Gateway) applyWatched(e jetstream.KeyValueEntry) {
	g.applyRecord(e.Key(), e.Revision(), e.Operation() != jetstream.KeyValuePut, e.Value(), true)
}

// applyRecord applies the bucket's record of key at rev (deleted: a delete
// or purge marker) and marks every revision up to rev known; the caller
// applies a bucket's records in revision order. A record that does not
// decode (only this package writes there) drops the key rather than
// keeping an older version.
func (g *Gateway) applyRecord(key string, rev uint64, deleted bool, value []byte, watched bool) {
	var id string
	var k *store.PushKey
	mine := strings.HasPrefix(key, g.prefix)
	if mine {
		id = key[len(g.prefix):]
		if !deleted {
			if rec, err := store.DecodePushKey(value); err == nil {
				k = &rec
			}
		}
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	if mine {
		g.apply(id, rev, k)
		if k == nil {
			// The mirror has passed this delete: a stale write of this node
			// is at or below known now, so the tombstone has done its work.
			delete(g.gone, id)
		}
	}
	g.known = max(g.known, rev)
	if watched {
		g.watchAt = max(g.watchAt, rev)
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

// watchGrace is how long a catch-up lets the watch deliver the revisions
// it lacks before reading them itself: a live watch on a calm node
// delivers in a millisecond or two, but a loaded 2-core node's watch was
// seen more than a second behind.
const watchGrace = 20 * time.Millisecond

// maxDirect bounds the revisions one catch-up reads itself, one request
// each; a watch further behind than that is waited for instead (it
// delivers far faster than requests one by one, and the key bucket is
// written rarely, so a gap that long means the watch is being replaced).
const maxDirect = 64

// The header of a KV record's stream message that marks a delete or purge
// (the jetstream package keeps its names unexported); a put has none.
const (
	kvOpHeader = "KV-Operation"
	kvOpDelete = "DEL"
	kvOpPurge  = "PURGE"
)

// waitCaughtUp asks the leader for the bucket's last revision and returns
// once the mirror holds every record up to it: delivered by the watch, or,
// when the watch has not delivered them within watchGrace, read from the
// leader by readMissing.
func (g *Gateway) waitCaughtUp() {
	ctx, cancel := context.WithTimeout(context.Background(), missWait)
	defer cancel()
	info, err := g.keysStream.Info(ctx)
	if err != nil {
		return
	}
	last := info.State.LastSeq
	grace := time.NewTimer(watchGrace)
	defer grace.Stop()
	for {
		g.mu.RLock()
		at := g.known
		g.mu.RUnlock()
		if at >= last {
			return
		}
		select {
		case <-ctx.Done():
			return
		case <-g.stop:
			return
		case <-grace.C:
			if last-at <= maxDirect {
				g.readMissing(ctx, at, last)
				return
			}
		case <-time.After(time.Millisecond):
		}
	}
}

// readMissing reads the bucket's records after revision from up to last
// from the stream's leader (the bucket has AllowDirect off, so a lagging
// follower never answers) and applies them in order. A revision the
// leader no longer has was replaced by a later record of its key (the
// bucket keeps one per key) or expired: there is nothing to apply. It
// stops at the first other error; the watch brings the rest.
func (g *Gateway) readMissing(ctx context.Context, from, last uint64) {
	subjectPrefix := "$KV." + keysBucket + "."
	for rev := from + 1; rev <= last; rev++ {
		msg, err := g.keysStream.GetMsg(ctx, rev)
		switch {
		case errors.Is(err, jetstream.ErrMsgNotFound):
			g.applyRecord("", rev, true, nil, false)
		case err != nil:
			return
		default:
			op := msg.Header.Get(kvOpHeader)
			g.applyRecord(strings.TrimPrefix(msg.Subject, subjectPrefix), rev,
				op == kvOpDelete || op == kvOpPurge, msg.Data, false)
		}
	}
}
