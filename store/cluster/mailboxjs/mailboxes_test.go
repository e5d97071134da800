package mailboxjs

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"edgerelay/store"
	"edgerelay/store/cluster/clustertest"
	"edgerelay/store/storetest"
)

// TestMailboxesOnThreeNodes tests what Mailboxes adds to the Store on one
// node and across nodes (one 3-node cluster, a mailbox per subtest).
func TestMailboxesOnThreeNodes(t *testing.T) {
	lim := storetest.MailboxTestLimits()
	mbs, _ := startMailboxes(t, lim)
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC).UnixNano()
	tok := store.Hash{7}
	ctx := func(t *testing.T) context.Context { return clustertest.Context(t) }
	claim := func(t *testing.T, m *Mailboxes, name string) {
		t.Helper()
		if o, err := m.Claim(ctx(t), []byte(name), tok, t0); err != nil || o != store.ClaimCreated {
			t.Fatalf("claim %s: %v %v", name, o, err)
		}
	}
	open := func(t *testing.T, m *Mailboxes, name string) store.Mailbox {
		t.Helper()
		h, err := m.Open(ctx(t), []byte(name), tok, t0)
		if err != nil {
			t.Fatalf("open %s: %v", name, err)
		}
		t.Cleanup(h.Release)
		return h
	}
	put := func(t *testing.T, h store.Mailbox, dir byte, seq uint64, env []byte) {
		t.Helper()
		res, err := h.Put(ctx(t), dir, seq, env, false, t0+int64(seq)*int64(time.Second))
		if err != nil || res.Outcome != store.PutCreated {
			t.Fatalf("put %d: %+v %v", seq, res, err)
		}
	}
	cached := func(m *Mailboxes, name string) bool {
		m.mu.Lock()
		defer m.mu.Unlock()
		return m.claims[name] != nil
	}

	t.Run("AnAuthorizedOpenCostsNoRoundTrip", func(t *testing.T) {
		name := "mx/cache1"
		claim(t, mbs[0], name)
		nc := mbs[0].s.nc
		before := nc.Stats().OutMsgs
		for range 100 {
			open(t, mbs[0], name).Release()
		}
		if n := nc.Stats().OutMsgs - before; n != 0 {
			t.Fatalf("100 Opens from the cache sent %d messages", n)
		}
		// Another node reads the record once, then answers from its
		// cache, a wrong bearer too.
		open(t, mbs[1], name)
		before = mbs[1].s.nc.Stats().OutMsgs
		open(t, mbs[1], name)
		if _, err := mbs[1].Open(ctx(t), []byte(name), store.Hash{8}, t0); !errors.Is(err, store.ErrForbidden) {
			t.Fatalf("a wrong bearer: %v", err)
		}
		if n := mbs[1].s.nc.Stats().OutMsgs - before; n != 0 {
			t.Fatalf("cached Opens on node 1 sent %d messages", n)
		}
	})

	t.Run("ARefusedOpenKeepsNothing", func(t *testing.T) {
		name := "mx/cache2"
		claim(t, mbs[0], name)
		for _, c := range []struct {
			name string
			tok  store.Hash
			want error
		}{{name, store.Hash{8}, store.ErrForbidden}, {"mx/none", tok, store.ErrNotFound}} {
			if _, err := mbs[2].Open(ctx(t), []byte(c.name), c.tok, t0); !errors.Is(err, c.want) {
				t.Fatalf("open %s: %v, want %v", c.name, err, c.want)
			}
			if cached(mbs[2], c.name) {
				t.Fatalf("a refused Open of %s left a cache entry", c.name)
			}
		}
		// An Open refused because the mailbox idled out drops the entry.
		open(t, mbs[0], name)
		if _, err := mbs[0].Open(ctx(t), []byte(name), tok, t0+int64(lim.Idle)+1); !errors.Is(err, store.ErrNotFound) {
			t.Fatalf("open past idle: %v", err)
		}
		if cached(mbs[0], name) {
			t.Fatal("an idle mailbox stays cached")
		}
	})

	t.Run("ALostControlMessageIsBoundedByTouchEvery", func(t *testing.T) {
		// The claim goes without its erased (as if the control message
		// were lost): the cache answers until the entry is TouchEvery old,
		// then the record is read again.
		name := "mx/lost1"
		claim(t, mbs[0], name)
		open(t, mbs[0], name)
		n, _ := mbs[0].s.names(name)
		if err := mbs[0].s.streams[n.shard].Purge(ctx(t), jetstream.WithPurgeSubject(n.claim())); err != nil {
			t.Fatal(err)
		}
		if h, err := mbs[0].Open(ctx(t), []byte(name), tok, t0+int64(lim.TouchEvery)); err != nil {
			t.Fatalf("open within TouchEvery: %v", err)
		} else {
			h.Release()
		}
		if _, err := mbs[0].Open(ctx(t), []byte(name), tok, t0+int64(lim.TouchEvery)+1); !errors.Is(err, store.ErrNotFound) {
			t.Fatalf("open past TouchEvery: %v", err)
		}
	})

	t.Run("TheClaimCacheIsBounded", func(t *testing.T) {
		m := mbs[1]
		m.mu.Lock()
		old := m.claimCap
		m.claimCap = len(m.claims) + 3
		m.mu.Unlock()
		defer func() { m.mu.Lock(); m.claimCap = old; m.mu.Unlock() }()
		held := open(t, mbs[0], "mx/cache1") // any handle works once evicted
		for i := range 10 {
			claim(t, m, fmt.Sprint("mx/bound", i))
		}
		m.mu.Lock()
		n, capN := len(m.claims), m.claimCap
		m.mu.Unlock()
		if n > capN {
			t.Fatalf("%d cache entries, bound %d", n, capN)
		}
		for i := range 10 {
			open(t, m, fmt.Sprint("mx/bound", i)) // evicted ones are read again
		}
		if st, err := held.State(ctx(t), 'p'); err != nil || st.Count != 0 {
			t.Fatalf("state: %+v %v", st, err)
		}
	})

	t.Run("AWriteTouchesTheRecordOncePerTouchEvery", func(t *testing.T) {
		name := "mx/touch1"
		claim(t, mbs[0], name)
		h := open(t, mbs[1], name)
		rec := func() int64 {
			r, err := mbs[2].s.Mailbox(ctx(t), name)
			if err != nil {
				t.Fatal(err)
			}
			return r.LastActive
		}
		every := int64(lim.TouchEvery)
		for i, at := range []int64{every - 1, every, every + 1, 2*every - 1, 2 * every} {
			res, err := h.Put(ctx(t), 'p', uint64(i+1), envelope(uint64(i+1), "x"), false, t0+at)
			if err != nil || res.Outcome != store.PutCreated {
				t.Fatalf("put: %+v %v", res, err)
			}
			want := t0
			switch {
			case at >= 2*every:
				want = t0 + 2*every
			case at >= every:
				want = t0 + every
			}
			if got := rec(); got != want {
				t.Fatalf("after a write at %d: LastActive %d, want %d", at, got-t0, want-t0)
			}
		}
	})

	t.Run("WatchGapIsReadBack", func(t *testing.T) {
		// Node 2 loses two of every three live notifications; its watcher
		// still gets every envelope once, in order.
		name := "mx/gap1"
		claim(t, mbs[0], name)
		var n atomic.Int64
		drop := func(m *nats.Msg) bool { return n.Add(1)%3 != 0 }
		mbs[2].dropLive.Store(&drop)
		defer mbs[2].dropLive.Store(nil)
		r := &liveRecorder{}
		stop, err := open(t, mbs[2], name).Watch(ctx(t), 'c', r.config())
		if err != nil {
			t.Fatal(err)
		}
		defer stop()
		w := open(t, mbs[0], name)
		want := make([]uint64, 0, 30)
		for seq := uint64(1); seq <= 30; seq++ {
			put(t, w, 'c', seq, envelope(seq, "m"))
			want = append(want, seq)
		}
		r.waitFor(t, want)
		if r.replays() != 0 {
			t.Fatalf("%d live envelopes delivered as replayed", r.replays())
		}
	})

	t.Run("ResyncFindsWhatNoNoticeSaid", func(t *testing.T) {
		// Node 2 loses every live notification (the last one has nothing
		// after it to show the gap) and the erased notice: the periodic
		// check delivers the envelopes, then ends the watch.
		name := "mx/resync1"
		claim(t, mbs[0], name)
		r := &liveRecorder{}
		ended := make(chan error, 1)
		cfg := r.config()
		cfg.End = func(err error) { ended <- err }
		dropAll := func(*nats.Msg) bool { return true }
		mbs[2].dropLive.Store(&dropAll)
		stop, err := open(t, mbs[2], name).Watch(ctx(t), 'p', cfg)
		if err != nil {
			t.Fatal(err)
		}
		defer stop()
		w := open(t, mbs[0], name)
		for seq := uint64(1); seq <= 3; seq++ {
			put(t, w, 'p', seq, envelope(seq, "m"))
		}
		mbs[2].resync(true)
		r.waitFor(t, []uint64{1, 2, 3})
		mbs[2].dropLive.Store(nil)
		n, _ := mbs[0].s.names(name)
		if err := mbs[0].s.streams[n.shard].Purge(ctx(t), jetstream.WithPurgeSubject(n.base+".>")); err != nil {
			t.Fatal(err) // an erase whose notice was lost
		}
		mbs[2].resync(true)
		select {
		case err := <-ended:
			if !errors.Is(err, store.ErrErased) {
				t.Fatalf("ended with %v", err)
			}
		case <-time.After(10 * time.Second):
			t.Fatal("the watch of an erased mailbox did not end")
		}
		if cached(mbs[2], name) {
			t.Fatal("the claim cache survived a resync after a reconnect")
		}
	})

	t.Run("WatchReplayedFlag", func(t *testing.T) {
		name := "mx/replay1"
		claim(t, mbs[0], name)
		w := open(t, mbs[0], name)
		for seq := uint64(1); seq <= 3; seq++ {
			put(t, w, 'p', seq, envelope(seq, "m"))
		}
		r := &liveRecorder{}
		stop, err := open(t, mbs[1], name).Watch(ctx(t), 'p', r.config())
		if err != nil {
			t.Fatal(err)
		}
		defer stop()
		r.waitFor(t, []uint64{1, 2, 3})
		put(t, w, 'p', 4, envelope(4, "m"))
		r.waitFor(t, []uint64{1, 2, 3, 4})
		if r.replays() != 3 {
			t.Fatalf("%d replayed, want the 3 stored ones", r.replays())
		}
	})

	t.Run("ATakeoverNoticeSparesTheNewHoldersWatch", func(t *testing.T) {
		// A takeover's erased names the expired claim: reaching a node
		// after the new holder's watch began there, it leaves that watch
		// alone (an erase's ends every watch).
		name := "mx/takeover1"
		claim(t, mbs[0], name)
		n, _ := mbs[0].s.names(name)
		_, oldRev, err := mbs[0].s.readClaim(ctx(t), n)
		if err != nil {
			t.Fatal(err)
		}
		newTok := store.Hash{9}
		later := t0 + int64(lim.Idle) + 1
		if o, err := mbs[1].Claim(ctx(t), []byte(name), newTok, later); err != nil || o != store.ClaimCreated {
			t.Fatalf("takeover: %v %v", o, err)
		}
		h, err := mbs[2].Open(ctx(t), []byte(name), newTok, later)
		if err != nil {
			t.Fatal(err)
		}
		defer h.Release()
		ended := make(chan error, 1)
		r := &liveRecorder{}
		cfg := r.config()
		cfg.End = func(err error) { ended <- err }
		stop, err := h.Watch(ctx(t), 'p', cfg)
		if err != nil {
			t.Fatal(err)
		}
		defer stop()
		var notices atomic.Int64
		mbs[2].OnGone(func(got string) {
			if got == name {
				notices.Add(1)
			}
		})
		late := &nats.Msg{Subject: n.control(), Data: []byte(ctlErased), Header: nats.Header{hdrClaimRev: {strconv.FormatUint(oldRev, 10)}}}
		if err := mbs[0].s.nc.PublishMsg(late); err != nil {
			t.Fatal(err)
		}
		deadline := time.Now().Add(10 * time.Second)
		for notices.Load() == 0 {
			if time.Now().After(deadline) {
				t.Fatal("the late notice never came")
			}
			time.Sleep(time.Millisecond)
		}
		res, err := h.Put(ctx(t), 'p', 1, envelope(1, "m"), false, later)
		if err != nil || res.Outcome != store.PutCreated {
			t.Fatalf("put: %+v %v", res, err)
		}
		r.waitFor(t, []uint64{1})
		if err := h.Erase(ctx(t)); err != nil {
			t.Fatal(err)
		}
		select {
		case err := <-ended:
			if !errors.Is(err, store.ErrErased) {
				t.Fatalf("ended with %v", err)
			}
		case <-time.After(10 * time.Second):
			t.Fatal("an erase did not end the watch")
		}
	})

	t.Run("WatchOverflowEnds", func(t *testing.T) {
		// A reader stuck in its replay (paced) while more than 1 MiB is
		// written after it: the watch ends with ErrWatchOverflow.
		name := "mx/overflow1"
		claim(t, mbs[0], name)
		w := open(t, mbs[0], name)
		put(t, w, 'p', 1, envelope(1, "m"))
		release := make(chan struct{})
		ended := make(chan error, 1)
		stop, err := open(t, mbs[2], name).Watch(ctx(t), 'p', store.WatchConfig{
			Deliver: func(ctx context.Context, env []byte, replayed bool) error {
				if replayed {
					<-release
				}
				return nil
			},
			End: func(err error) { ended <- err },
		})
		if err != nil {
			t.Fatal(err)
		}
		defer stop()
		defer close(release)
		big := string(make([]byte, 64<<10-25))
		for seq := uint64(2); seq <= 20; seq++ {
			put(t, w, 'p', seq, envelope(seq, big))
		}
		select {
		case err := <-ended:
			if !errors.Is(err, store.ErrWatchOverflow) {
				t.Fatalf("ended with %v", err)
			}
		case <-time.After(10 * time.Second):
			t.Fatal("no overflow")
		}
	})

	t.Run("DeadOwnersPlacesAreFree", func(t *testing.T) {
		// Every place held by an incarnation that no longer runs (here
		// written as node 0's older self) is free; a live node's is not.
		name := "mx/places1"
		claim(t, mbs[0], name)
		n, _ := mbs[0].s.names(name)
		dead := ownerValue(mbs[0].s.c.Node(), "gone")
		for i := range store.MaxWatchers {
			owner := dead
			if i == 5 {
				owner = mbs[1].owner
			}
			if _, err := mbs[0].publishSlot(ctx(t), n.slotSubject('p', i), owner, 0, time.Minute, false); err != nil {
				t.Fatal(err)
			}
		}
		var leaves []func()
		defer func() {
			for _, l := range leaves {
				l()
			}
		}()
		for i := range store.MaxWatchers - 1 {
			leave, err := open(t, mbs[i%3], name).JoinWatchers(ctx(t), 'p')
			if err != nil {
				t.Fatalf("join %d: %v", i, err)
			}
			leaves = append(leaves, leave)
		}
		if _, err := open(t, mbs[2], name).JoinWatchers(ctx(t), 'p'); !errors.Is(err, store.ErrTooManyWatchers) {
			t.Fatalf("join past the live node's place: %v", err)
		}
	})

	t.Run("PlacesAreRenewedAndExpire", func(t *testing.T) {
		// Short TTLs on a node of its own: a held place outlives its TTL
		// through the refresher; a place nobody renews expires by itself.
		s := mbs[2].s
		m, err := newMailboxes(ctx(t), s, lim, nil, func(m *Mailboxes) {
			m.slotTTL, m.slotRefresh = time.Second, 200*time.Millisecond
		})
		if err != nil {
			t.Fatal(err)
		}
		defer m.Close()
		name := "mx/places2"
		claim(t, m, name)
		h := open(t, m, name)
		leave, err := h.JoinWatchers(ctx(t), 'c')
		if err != nil {
			t.Fatal(err)
		}
		n, _ := s.names(name)
		subject := n.slotSubject('c', 0)
		owner := func() string {
			raw, err := m.slots.GetLastMsgForSubject(ctx(t), subject)
			if errors.Is(err, jetstream.ErrMsgNotFound) {
				return ""
			}
			if err != nil {
				t.Fatal(err)
			}
			if raw.Header.Get(hdrKVOp) != "" || raw.Header.Get(hdrMarkReason) != "" {
				return ""
			}
			if ttl := raw.Header.Get(hdrTTL); ttl != "1s" {
				t.Fatalf("place written with TTL %q", ttl)
			}
			return string(raw.Data)
		}
		first, _ := m.slots.GetLastMsgForSubject(ctx(t), subject)
		deadline := time.Now().Add(2500 * time.Millisecond) // past two TTLs
		for time.Now().Before(deadline) {
			if owner() != string(m.owner) {
				t.Fatal("a held place expired")
			}
			time.Sleep(50 * time.Millisecond)
		}
		if last, _ := m.slots.GetLastMsgForSubject(ctx(t), subject); last.Sequence == first.Sequence {
			t.Fatal("the place was never renewed")
		}
		leave()
		if got := owner(); got != "" {
			t.Fatalf("place after leave: %q", got)
		}
		// A place written and never renewed is gone after its TTL.
		other := n.slotSubject('c', 1)
		if _, err := m.publishSlot(ctx(t), other, mbs[0].owner, 0, time.Second, false); err != nil {
			t.Fatal(err)
		}
		subject = other
		deadline = time.Now().Add(10 * time.Second)
		for owner() != "" {
			if time.Now().After(deadline) {
				t.Fatal("an unrenewed place did not expire")
			}
			time.Sleep(50 * time.Millisecond)
		}
	})

	t.Run("CloseGivesPlacesBack", func(t *testing.T) {
		m, err := NewMailboxes(ctx(t), mbs[1].s, lim, nil)
		if err != nil {
			t.Fatal(err)
		}
		name := "mx/places3"
		claim(t, m, name)
		for range store.MaxWatchers {
			if _, err := open(t, m, name).JoinWatchers(ctx(t), 'p'); err != nil {
				t.Fatal(err)
			}
		}
		if err := m.Close(); err != nil {
			t.Fatal(err)
		}
		leave, err := open(t, mbs[0], name).JoinWatchers(ctx(t), 'p')
		if err != nil {
			t.Fatalf("join after the holder closed: %v", err)
		}
		leave()
	})
}

// liveRecorder collects what a Mailboxes watch delivers.
type liveRecorder struct {
	mu       sync.Mutex
	seqs     []uint64
	replayed int
}

func (r *liveRecorder) config() store.WatchConfig {
	return store.WatchConfig{Deliver: func(ctx context.Context, env []byte, replayed bool) error {
		r.mu.Lock()
		r.seqs = append(r.seqs, envelopeSeq(env))
		if replayed {
			r.replayed++
		}
		r.mu.Unlock()
		return nil
	}}
}

func (r *liveRecorder) replays() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.replayed
}

// waitFor waits until len(want) envelopes came, then checks them.
func (r *liveRecorder) waitFor(t *testing.T, want []uint64) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		r.mu.Lock()
		got := slices.Clone(r.seqs)
		r.mu.Unlock()
		if len(got) >= len(want) {
			if !slices.Equal(got, want) {
				t.Fatalf("delivered %v, want %v", got, want)
			}
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("delivered %v, want %v", got, want)
		}
		time.Sleep(2 * time.Millisecond)
	}
}

// BenchmarkMailboxes measures what Mailboxes adds per call on 3 nodes:
// go test -run '^$' -bench Mailboxes -benchtime 2s ./store/cluster/mailboxjs/
func BenchmarkMailboxes(b *testing.B) {
	nodes := clustertest.Start(b, 3)
	var mbs []*Mailboxes
	for i := range 3 {
		s, err := Open(clustertest.Context(b), nodes.Node(i), Config{Shards: 2})
		if err != nil {
			b.Fatal(err)
		}
		m, err := NewMailboxes(clustertest.Context(b), s, storetest.MailboxTestLimits(), nil)
		if err != nil {
			b.Fatal(err)
		}
		b.Cleanup(func() { _ = m.Close() })
		mbs = append(mbs, m)
	}
	ctx := context.Background()
	tok, now := store.Hash{1}, time.Now().UnixNano()
	name := []byte("bench/mbx1")
	if _, err := mbs[0].Claim(ctx, name, tok, now); err != nil {
		b.Fatal(err)
	}
	b.Run("OpenCached", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			h, err := mbs[0].Open(ctx, name, tok, now)
			if err != nil {
				b.Fatal(err)
			}
			h.Release()
		}
	})
	h, err := mbs[1].Open(ctx, name, tok, now)
	if err != nil {
		b.Fatal(err)
	}
	b.Run("JoinAndLeave", func(b *testing.B) {
		for b.Loop() {
			leave, err := h.JoinWatchers(ctx, 'p')
			if err != nil {
				b.Fatal(err)
			}
			leave()
		}
	})
	b.Run("ForegroundNoWatcher", func(b *testing.B) {
		for b.Loop() {
			if h.Foreground(ctx, 'c', now) {
				b.Fatal("foreground")
			}
		}
	})
	w, err := mbs[2].Open(ctx, name, tok, now)
	if err != nil {
		b.Fatal(err)
	}
	leave, err := w.JoinWatchers(ctx, 'p')
	if err != nil {
		b.Fatal(err)
	}
	defer leave()
	w.SetForeground('p', now+int64(time.Hour))
	for !h.Foreground(ctx, 'p', now) { // node 1 learns of node 2's interest
		time.Sleep(time.Millisecond)
	}
	b.Run("ForegroundOnAnotherNode", func(b *testing.B) {
		for b.Loop() {
			if !h.Foreground(ctx, 'p', now) {
				b.Fatal("not foreground")
			}
		}
	})
	w.SetForeground('p', 0)
	b.Run("BackgroundOnAnotherNode", func(b *testing.B) {
		for b.Loop() {
			if h.Foreground(ctx, 'p', now+int64(2*time.Hour)) {
				b.Fatal("foreground")
			}
		}
	})
}
