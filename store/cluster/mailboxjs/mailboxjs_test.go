package mailboxjs

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"edgerelay/store"
	"edgerelay/store/cluster/clustertest"
)

// start runs a 3-node cluster with a Store on each node.
func start(t *testing.T) (*clustertest.Nodes, []*Store) {
	t.Helper()
	nodes := clustertest.Start(t, 3)
	stores := make([]*Store, 3)
	for i := range stores {
		s, err := Open(clustertest.Context(t), nodes.Node(i), Config{Shards: 2})
		if err != nil {
			t.Fatal(err)
		}
		stores[i] = s
	}
	return nodes, stores
}

// envelope is a well-formed envelope of seq with body b.
func envelope(seq uint64, b string) []byte {
	e := []byte{1}
	e = binary.BigEndian.AppendUint64(e, seq)
	e = append(e, b...)
	return append(e, make([]byte, 16)...)
}

// claim makes name exist, as the handler's claim does before any write.
func claim(t *testing.T, s *Store, names ...string) {
	t.Helper()
	for _, name := range names {
		if _, err := s.Claim(clustertest.Context(t), name, store.Hash{1}, time.Now().UnixNano(), time.Hour, idle); err != nil {
			t.Fatal(err)
		}
	}
}

var noLimits = Limits{MaxStored: 4096, MaxStoredBytes: 32 << 20}

// idle is RELAY_IDLE's default.
const idle = 720 * time.Hour

func mustPut(t *testing.T, s *Store, name string, dir byte, seq uint64, env []byte, want Outcome) PutResult {
	t.Helper()
	r, err := s.Put(clustertest.Context(t), name, dir, seq, env, noLimits, time.Now().UnixNano())
	if err != nil {
		t.Fatalf("put %d: %v", seq, err)
	}
	if r.Outcome != want {
		t.Fatalf("put %d: outcome %d, want %d", seq, r.Outcome, want)
	}
	return r
}

func scanAll(t *testing.T, s *Store, name string, dir byte, after uint64) []uint64 {
	t.Helper()
	return scanBytes(t, s, name, dir, after, 0)
}

func scanBytes(t *testing.T, s *Store, name string, dir byte, after uint64, maxBytes int) []uint64 {
	t.Helper()
	var got []uint64
	err := s.Scan(clustertest.Context(t), name, dir, after, maxBytes, func(seq uint64, env []byte) bool {
		if !bytes.Equal(env, envelope(seq, fmt.Sprint("m", seq))) {
			t.Errorf("scan: envelope %d has other bytes", seq)
		}
		got = append(got, seq)
		return true
	})
	if err != nil {
		t.Fatal(err)
	}
	return got
}

// recorder collects what a watch delivers.
type recorder struct {
	mu   sync.Mutex
	seqs []uint64
	end  chan error
}

func newRecorder() *recorder { return &recorder{end: make(chan error, 1)} }

func (r *recorder) deliver(seq uint64, env []byte) {
	r.mu.Lock()
	r.seqs = append(r.seqs, seq)
	r.mu.Unlock()
}

func (r *recorder) got() []uint64 {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Clone(r.seqs)
}

// waitFor polls until the recorder holds n envelopes (or fails after 10 s).
func (r *recorder) waitFor(t *testing.T, n int) []uint64 {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for time.Now().Before(deadline) {
		if g := r.got(); len(g) >= n {
			return g
		}
		time.Sleep(5 * time.Millisecond)
	}
	t.Fatalf("watch delivered %d envelopes, want %d: %v", len(r.got()), n, r.got())
	return nil
}

func watch(t *testing.T, s *Store, name string, dir byte, after uint64, r *recorder) *Watch {
	t.Helper()
	w, err := s.Watch(clustertest.Context(t), name, dir, WatchConfig{After: after, Deliver: r.deliver, End: func(err error) { r.end <- err }})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(w.Close)
	return w
}

func exactlyOnce(t *testing.T, got []uint64, want []uint64) {
	t.Helper()
	s := slices.Clone(got)
	slices.Sort(s)
	w := slices.Clone(want)
	slices.Sort(w)
	if !slices.Equal(s, w) {
		t.Fatalf("delivered %v, want each of %v once", got, want)
	}
}

// TestMailboxOnThreeNodes runs the behaviour tests on one 3-node cluster
// (starting one takes seconds on a busy 2-core box); each uses its own
// mailbox. The tests that stop nodes start their own.
func TestMailboxOnThreeNodes(t *testing.T) {
	_, st := start(t)
	for _, tc := range []struct {
		name string
		fn   func(*testing.T, []*Store)
	}{
		{"PutOnNode0WatchOnNode2", testPutOnNode0WatchOnNode2},
		{"RacingWritersOneDirection", testRacingWritersOneDirection},
		{"WatchGapIsReadBack", testWatchGapIsReadBack},
		{"WatchGapPrunedMeanwhile", testWatchGapPrunedMeanwhile},
		{"RetryAndConflict", testRetryAndConflict},
		{"LimitsAtTheEdge", testLimitsAtTheEdge},
		{"PruneThenScan", testPruneThenScan},
		{"EraseRemovesEverythingAndNotifies", testEraseRemovesEverythingAndNotifies},
		{"ClaimOneWinnerAcrossNodes", testClaimOneWinnerAcrossNodes},
		{"ClaimOfAnExpiredMailbox", testClaimOfAnExpiredMailbox},
		{"PushRegistration", testPushRegistration},
		{"WatchOverflowEnds", testWatchOverflowEnds},
		{"SweeperUnderLease", testSweeperUnderLease},
	} {
		t.Run(tc.name, func(t *testing.T) { tc.fn(t, st) })
	}
}

func testPutOnNode0WatchOnNode2(t *testing.T, st []*Store) {
	name := "app/mailbox0000000001"
	claim(t, st[0], name)
	r := newRecorder()
	w := watch(t, st[2], name, 'p', 0, r)
	mustPut(t, st[0], name, 'p', 1, envelope(1, "m1"), Created)
	if got := r.waitFor(t, 1); !slices.Equal(got, []uint64{1}) {
		t.Fatalf("watch got %v", got)
	}
	// A watch opened afterwards replays it, and a later one arrives live.
	r2 := newRecorder()
	watch(t, st[1], name, 'p', 0, r2)
	mustPut(t, st[2], name, 'p', 2, envelope(2, "m2"), Created)
	if got := r2.waitFor(t, 2); !slices.Equal(got, []uint64{1, 2}) {
		t.Fatalf("second watch got %v", got)
	}
	if got := r.waitFor(t, 2); !slices.Equal(got, []uint64{1, 2}) {
		t.Fatalf("first watch got %v", got)
	}
	// A mailbox nobody claimed takes no envelope.
	mustPut(t, st[1], "app/neverclaimed000001", 'p', 1, envelope(1, "m1"), NoMailbox)
	// The other direction saw nothing.
	if got := scanAll(t, st[1], name, 'c', 0); len(got) != 0 {
		t.Fatalf("c2p holds %v", got)
	}
	exactlyOnce(t, r.got(), []uint64{1, 2})
	// Each republished envelope named the one before it: nothing was read
	// back from the stream.
	if n := w.readBacks.Load(); n != 0 {
		t.Fatalf("%d gaps read back without a loss", n)
	}
}

// Eight writers on three nodes race one direction with distinct
// sequences; watchers opened before and during the race see each once,
// and a scan returns all of them ascending.
func testRacingWritersOneDirection(t *testing.T, st []*Store) {
	name := "app/racing0000000000001"
	claim(t, st[0], name)
	const writers, each = 8, 32
	before := newRecorder()
	watch(t, st[2], name, 'c', 0, before)
	var all []uint64
	for i := 1; i <= writers*each; i++ {
		all = append(all, uint64(i))
	}
	revs := make(map[uint64]uint64)
	var mu sync.Mutex
	var wg sync.WaitGroup
	started := make(chan struct{})
	var once sync.Once
	for w := range writers {
		wg.Go(func() {
			for i := range each {
				seq := uint64(i*writers + w + 1)
				r, err := st[w%3].Put(clustertest.Context(t), name, 'c', seq, envelope(seq, fmt.Sprint("m", seq)), noLimits, time.Now().UnixNano())
				if err != nil || r.Outcome != Created {
					t.Errorf("writer %d seq %d: %v %v", w, seq, r.Outcome, err)
					return
				}
				mu.Lock()
				revs[seq] = r.Rev
				mu.Unlock()
				if i == each/3 {
					once.Do(func() { close(started) })
				}
			}
		})
	}
	<-started
	during := newRecorder()
	watch(t, st[1], name, 'c', 0, during) // opens while writes race its replay
	wg.Wait()
	if t.Failed() {
		return
	}
	exactlyOnce(t, before.waitFor(t, len(all)), all)
	exactlyOnce(t, during.waitFor(t, len(all)), all)
	// The watcher that was there first saw them as they were stored.
	got := before.got()
	if !slices.IsSortedFunc(got, func(a, b uint64) int { return int(revs[a]) - int(revs[b]) }) {
		t.Fatalf("live delivery out of stream order: %v", got)
	}
	if got := scanAll(t, st[0], name, 'c', 0); !slices.Equal(got, all) {
		t.Fatalf("scan: %v", got)
	}
	if got := scanAll(t, st[1], name, 'c', 50); !slices.Equal(got, all[50:]) {
		t.Fatalf("scan after 50: %v", got)
	}
	// One envelope per read: the batches join up without a gap or a repeat.
	if got := scanBytes(t, st[2], name, 'c', 10, 1); !slices.Equal(got, all[10:]) {
		t.Fatalf("scan in 1-byte batches: %v", got)
	}
	h, err := st[2].State(clustertest.Context(t), name, 'c')
	if err != nil {
		t.Fatal(err)
	}
	if h.Count != len(all) || h.First() != 1 || h.Last() != uint64(len(all)) || len(h.Stored) != 1 {
		t.Fatalf("head %+v", h)
	}
	// Every envelope, in order or not, reads back by sequence.
	for _, seq := range all {
		env, ok, err := st[(seq%3)].Envelope(clustertest.Context(t), name, 'c', seq)
		if err != nil || !ok || !bytes.Equal(env, envelope(seq, fmt.Sprint("m", seq))) {
			t.Fatalf("envelope %d: %v %v", seq, ok, err)
		}
	}
}

// A watcher that loses notifications finds the gap at the next one and
// reads the missed envelopes from the stream, in order.
func testWatchGapIsReadBack(t *testing.T, st []*Store) {
	name := "app/gaps00000000000001"
	claim(t, st[0], name)
	r := newRecorder()
	n := 0
	w, err := st[1].Watch(clustertest.Context(t), name, 'p', WatchConfig{
		Deliver: r.deliver, End: func(err error) { r.end <- err },
		drop: func(*nats.Msg) bool { n++; return n%3 != 0 }, // loses two of three
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(w.Close)
	var want []uint64
	for seq := uint64(1); seq <= 9; seq++ {
		mustPut(t, st[0], name, 'p', seq, envelope(seq, fmt.Sprint("m", seq)), Created)
		want = append(want, seq)
	}
	if got := r.waitFor(t, 9); !slices.Equal(got, want) {
		t.Fatalf("got %v", got)
	}
}

// A watcher that lost envelopes the reader has pruned since skips them
// (they are acknowledged) instead of waiting for them, and goes on.
func testWatchGapPrunedMeanwhile(t *testing.T, st []*Store) {
	name := "app/gapprune0000000001"
	claim(t, st[0], name)
	r := newRecorder()
	held := make(chan struct{})
	w, err := st[1].Watch(clustertest.Context(t), name, 'p', WatchConfig{
		Deliver: r.deliver, End: func(err error) { r.end <- err },
		drop: func(m *nats.Msg) bool {
			switch envelopeSeq(m.Data) {
			case 1, 2:
				return true // lost
			case 3:
				<-held // reaches the watcher only after the prune
			}
			return false
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(w.Close)
	for seq := uint64(1); seq <= 3; seq++ {
		mustPut(t, st[0], name, 'p', seq, envelope(seq, fmt.Sprint("m", seq)), Created)
	}
	if err := st[2].Prune(clustertest.Context(t), name, 'p', 3); err != nil {
		t.Fatal(err)
	}
	close(held)
	mustPut(t, st[0], name, 'p', 4, envelope(4, "m4"), Created)
	if got := r.waitFor(t, 1); !slices.Equal(got, []uint64{4}) {
		t.Fatalf("got %v", got)
	}
	select {
	case err := <-r.end:
		t.Fatalf("watch ended: %v", err)
	default:
	}
}

func testRetryAndConflict(t *testing.T, st []*Store) {
	name := "app/retry0000000000001"
	claim(t, st[0], name)
	mustPut(t, st[0], name, 'p', 1, envelope(1, "m1"), Created)
	mustPut(t, st[0], name, 'p', 3, envelope(3, "m3"), Created)
	mustPut(t, st[1], name, 'p', 2, envelope(2, "m2"), Created) // below the max: out of order
	for _, s := range st {
		for _, seq := range []uint64{1, 2, 3} {
			mustPut(t, s, name, 'p', seq, envelope(seq, fmt.Sprint("m", seq)), Retry)
			mustPut(t, s, name, 'p', seq, envelope(seq, "other"), Conflict)
		}
	}
	if got := scanAll(t, st[2], name, 'p', 0); !slices.Equal(got, []uint64{1, 2, 3}) {
		t.Fatalf("scan %v", got)
	}
	h, _ := st[2].State(clustertest.Context(t), name, 'p')
	if h.Count != 3 {
		t.Fatalf("count %d after retries", h.Count)
	}
}

func testLimitsAtTheEdge(t *testing.T, st []*Store) {
	now := time.Now().UnixNano()
	put := func(s *Store, name string, seq uint64, env []byte, lim Limits) PutResult {
		t.Helper()
		r, err := s.Put(clustertest.Context(t), name, 'p', seq, env, lim, now)
		if err != nil {
			t.Fatal(err)
		}
		return r
	}
	claim(t, st[0], "app/count000000000001", "app/bytes000000000001", "app/rate0000000000001")
	// Count: 3 stored, the 4th is full.
	lim := Limits{MaxStored: 3, MaxStoredBytes: 1 << 20}
	for seq := uint64(1); seq <= 3; seq++ {
		if r := put(st[seq%3], "app/count000000000001", seq, envelope(seq, "x"), lim); r.Outcome != Created {
			t.Fatalf("seq %d: %d", seq, r.Outcome)
		}
	}
	if r := put(st[1], "app/count000000000001", 4, envelope(4, "x"), lim); r.Outcome != Full {
		t.Fatalf("4th of 3: %d", r.Outcome)
	}
	// Bytes: exactly at the bound is stored, one byte past is full.
	e1 := envelope(1, "abcd")
	lim = Limits{MaxStored: 10, MaxStoredBytes: 2*len(e1) + 1}
	put(st[0], "app/bytes000000000001", 1, e1, lim)
	if r := put(st[1], "app/bytes000000000001", 2, envelope(2, "abcde"), lim); r.Outcome != Created {
		t.Fatalf("at the byte bound: %d", r.Outcome)
	}
	if r := put(st[2], "app/bytes000000000001", 3, envelope(3, ""), lim); r.Outcome != Full {
		t.Fatalf("past the byte bound: %d", r.Outcome)
	}
	// Envelope bucket: a burst of 3 across nodes, then 429 with a wait.
	lim = Limits{MaxStored: 10, MaxStoredBytes: 1 << 20, EnvelopeBurst: 3, EnvelopeEvery: time.Hour, Notify: true, PushBurst: 2, PushEvery: time.Hour}
	for seq := uint64(1); seq <= 3; seq++ {
		r := put(st[seq%3], "app/rate0000000000001", seq, envelope(seq, "x"), lim)
		if r.Outcome != Created || r.Push != (seq <= 2) {
			t.Fatalf("seq %d: %+v", seq, r)
		}
	}
	r := put(st[0], "app/rate0000000000001", 4, envelope(4, "x"), lim)
	if r.Outcome != RateLimited || r.RetryAfter <= 0 || r.RetryAfter > time.Hour {
		t.Fatalf("4th of a burst of 3: %+v", r)
	}
}

func testPruneThenScan(t *testing.T, st []*Store) {
	name := "app/prune000000000001"
	claim(t, st[0], name)
	for _, seq := range []uint64{1, 2, 3, 4, 6, 7, 8, 5, 9, 10} { // 5 out of order
		mustPut(t, st[seq%3], name, 'p', seq, envelope(seq, fmt.Sprint("m", seq)), Created)
	}
	if err := st[1].Prune(clustertest.Context(t), name, 'p', 5); err != nil {
		t.Fatal(err)
	}
	if got := scanAll(t, st[2], name, 'p', 0); !slices.Equal(got, []uint64{6, 7, 8, 9, 10}) {
		t.Fatalf("scan after prune: %v", got)
	}
	h, err := st[0].State(clustertest.Context(t), name, 'p')
	if err != nil {
		t.Fatal(err)
	}
	wantBytes := 0
	for seq := uint64(6); seq <= 10; seq++ {
		wantBytes += len(envelope(seq, fmt.Sprint("m", seq)))
	}
	if h.Count != 5 || h.Bytes != wantBytes || h.Pruned != 5 || h.First() != 6 {
		t.Fatalf("head after prune: %+v (bytes want %d)", h, wantBytes)
	}
	for _, seq := range []uint64{5, 3} {
		mustPut(t, st[0], name, 'p', seq, envelope(seq, fmt.Sprint("m", seq)), Pruned)
		if _, ok, _ := st[2].Envelope(clustertest.Context(t), name, 'p', seq); ok {
			t.Fatalf("envelope %d readable after prune", seq)
		}
	}
	// Pruning everything leaves an empty direction that keeps its mark.
	if err := st[2].Prune(clustertest.Context(t), name, 'p', 10); err != nil {
		t.Fatal(err)
	}
	h, _ = st[0].State(clustertest.Context(t), name, 'p')
	if h.Count != 0 || h.Bytes != 0 || h.Pruned != 10 {
		t.Fatalf("head after pruning all: %+v", h)
	}
	mustPut(t, st[1], name, 'p', 11, envelope(11, "m11"), Created)
	if got := scanAll(t, st[2], name, 'p', 0); !slices.Equal(got, []uint64{11}) {
		t.Fatalf("scan: %v", got)
	}
}

func testEraseRemovesEverythingAndNotifies(t *testing.T, st []*Store) {
	name := "app/erase000000000001"
	tok := store.Hash{1}
	ctx := clustertest.Context(t)
	if o, err := st[0].Claim(ctx, name, tok, time.Now().UnixNano(), time.Hour, idle); err != nil || o != ClaimCreated {
		t.Fatal(o, err)
	}
	mustPut(t, st[0], name, 'p', 1, envelope(1, "m1"), Created)
	mustPut(t, st[1], name, 'c', 1, envelope(1, "m1"), Created)
	if err := st[1].SetPushRegistration(ctx, name, 'p', []byte("sealed")); err != nil {
		t.Fatal(err)
	}
	r := newRecorder()
	watch(t, st[2], name, 'p', 0, r)
	r.waitFor(t, 1)
	if err := st[0].Erase(ctx, name); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-r.end:
		if !errors.Is(err, ErrErased) {
			t.Fatalf("watch ended with %v", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("watch not told of the erase")
	}
	for _, s := range st {
		if _, err := s.Mailbox(ctx, name); !errors.Is(err, store.ErrNotFound) {
			t.Fatalf("claim after erase: %v", err)
		}
		if _, err := s.PushRegistration(ctx, name, 'p'); !errors.Is(err, store.ErrNotFound) {
			t.Fatalf("registration after erase: %v", err)
		}
		for _, dir := range []byte{'p', 'c'} {
			if h, err := s.State(ctx, name, dir); err != nil || h.Rev != 0 || h.Count != 0 {
				t.Fatalf("head after erase: %+v %v", h, err)
			}
		}
	}
	// The node that wrote last has a stale cached head: its next write
	// finds the direction gone and no claim, and stores nothing.
	mustPut(t, st[0], name, 'p', 2, envelope(2, "late"), NoMailbox)
	mustPut(t, st[1], name, 'c', 1, envelope(1, "late"), NoMailbox)
	if o, err := st[2].Claim(ctx, name, store.Hash{2}, time.Now().UnixNano(), time.Hour, idle); err != nil || o != ClaimCreated {
		t.Fatal(o, err)
	}
	mustPut(t, st[0], name, 'p', 1, envelope(1, "m1"), Created)
	if got := scanBytes(t, st[1], name, 'p', 0, 0); len(got) != 1 {
		t.Fatalf("after the new claim: %v", got)
	}
}

func testClaimOneWinnerAcrossNodes(t *testing.T, st []*Store) {
	name := "app/claim000000000001"
	now := time.Now().UnixNano()
	outcomes := make([]ClaimOutcome, 6)
	var wg sync.WaitGroup
	for i := range outcomes {
		wg.Go(func() {
			var err error
			outcomes[i], err = st[i%3].Claim(clustertest.Context(t), name, store.Hash{byte(i % 2)}, now, time.Hour, idle)
			if err != nil {
				t.Error(err)
			}
		})
	}
	wg.Wait()
	if c := countOf(outcomes, ClaimCreated); c != 1 {
		t.Fatalf("%d claims created: %v", c, outcomes)
	}
	rec, err := st[2].Mailbox(clustertest.Context(t), name)
	if err != nil {
		t.Fatal(err)
	}
	for i, o := range outcomes {
		want := ClaimTaken
		if (store.Hash{byte(i % 2)}) == rec.Token {
			want = ClaimSame
		}
		if o != want && o != ClaimCreated {
			t.Fatalf("claim %d: %d, want %d", i, o, want)
		}
	}
	// A heartbeat moves the activity stamp once touchEvery has passed.
	later := now + int64(2*time.Hour)
	if o, err := st[1].Claim(clustertest.Context(t), name, rec.Token, later, time.Hour, idle); err != nil || o != ClaimSame {
		t.Fatal(o, err)
	}
	if rec, _ := st[0].Mailbox(clustertest.Context(t), name); rec.LastActive != later {
		t.Fatalf("heartbeat did not move LastActive: %d", rec.LastActive)
	}
}

// A claim record older than idle is expired unless a write is younger;
// an expired mailbox is claimed afresh, with nothing of the old holder's.
func testClaimOfAnExpiredMailbox(t *testing.T, st []*Store) {
	ctx := clustertest.Context(t)
	t0 := time.Now().UnixNano()
	a, b := store.Hash{0xa}, store.Hash{0xb}
	claimAt := func(s *Store, name string, tok store.Hash, at int64) ClaimOutcome {
		t.Helper()
		o, err := s.Claim(ctx, name, tok, at, time.Hour, idle)
		if err != nil {
			t.Fatal(err)
		}
		return o
	}
	name := "app/expired0000000001"
	claimAt(st[0], name, a, t0)
	if _, err := st[0].Put(ctx, name, 'p', 1, envelope(1, "m1"), noLimits, t0); err != nil {
		t.Fatal(err)
	}
	if err := st[0].SetPushRegistration(ctx, name, 'p', []byte("sealed")); err != nil {
		t.Fatal(err)
	}
	// At exactly idle it is alive; one nanosecond past, it is gone.
	if o := claimAt(st[1], name, b, t0+int64(idle)); o != ClaimTaken {
		t.Fatalf("claim at idle: %d", o)
	}
	if o := claimAt(st[2], name, b, t0+int64(idle)+1); o != ClaimCreated {
		t.Fatalf("claim past idle: %d", o)
	}
	if got := scanAll(t, st[0], name, 'p', 0); len(got) != 0 {
		t.Fatalf("the old holder's envelopes survived: %v", got)
	}
	if _, err := st[1].PushRegistration(ctx, name, 'p'); !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("the old holder's registration survived: %v", err)
	}
	if rec, err := st[0].Mailbox(ctx, name); err != nil || rec.Token != b {
		t.Fatalf("record %+v %v", rec, err)
	}
	// A write younger than idle keeps a mailbox whose claim is older.
	name = "app/expired0000000002"
	claimAt(st[0], name, a, t0)
	if _, err := st[1].Put(ctx, name, 'c', 1, envelope(1, "m1"), noLimits, t0+int64(idle)); err != nil {
		t.Fatal(err)
	}
	if o := claimAt(st[2], name, b, t0+int64(idle)+1); o != ClaimTaken {
		t.Fatalf("claim of a mailbox kept by a write: %d", o)
	}
	if o := claimAt(st[2], name, a, t0+int64(idle)+1); o != ClaimSame {
		t.Fatalf("heartbeat of a mailbox kept by a write: %d", o)
	}
	if rec, _ := st[0].Mailbox(ctx, name); rec.LastActive != t0+int64(idle)+1 {
		t.Fatalf("heartbeat did not move LastActive: %d", rec.LastActive)
	}
	if err := st[0].Touch(ctx, name, t0+int64(idle)+5); err != nil {
		t.Fatal(err)
	}
	if rec, _ := st[1].Mailbox(ctx, name); rec.LastActive != t0+int64(idle)+5 {
		t.Fatalf("touch did not move LastActive: %d", rec.LastActive)
	}
}

func countOf[T comparable](s []T, v T) int {
	n := 0
	for _, x := range s {
		if x == v {
			n++
		}
	}
	return n
}

func testPushRegistration(t *testing.T, st []*Store) {
	name := "app/push0000000000001"
	ctx := clustertest.Context(t)
	if _, err := st[0].PushRegistration(ctx, name, 'c'); !errors.Is(err, store.ErrNotFound) {
		t.Fatal(err)
	}
	for _, v := range []string{"one", "two"} {
		if err := st[0].SetPushRegistration(ctx, name, 'c', []byte(v)); err != nil {
			t.Fatal(err)
		}
		if got, err := st[2].PushRegistration(ctx, name, 'c'); err != nil || string(got) != v {
			t.Fatalf("got %q %v", got, err)
		}
	}
	if _, err := st[1].PushRegistration(ctx, name, 'p'); !errors.Is(err, store.ErrNotFound) {
		t.Fatal("the other direction has a registration")
	}
	if err := st[1].DeletePushRegistration(ctx, name, 'c'); err != nil {
		t.Fatal(err)
	}
	if _, err := st[2].PushRegistration(ctx, name, 'c'); !errors.Is(err, store.ErrNotFound) {
		t.Fatal(err)
	}
}

func testWatchOverflowEnds(t *testing.T, st []*Store) {
	name := "app/overflow000000001"
	claim(t, st[0], name)
	block := make(chan struct{})
	end := make(chan error, 1)
	w, err := st[1].Watch(clustertest.Context(t), name, 'p', WatchConfig{
		QueueBytes: 4096,
		Deliver:    func(uint64, []byte) { <-block },
		End:        func(err error) { end <- err },
	})
	if err != nil {
		t.Fatal(err)
	}
	for seq := uint64(1); seq <= 4; seq++ {
		mustPut(t, st[0], name, 'p', seq, envelope(seq, string(make([]byte, 2000))), Created)
	}
	close(block)
	select {
	case err := <-end:
		if !errors.Is(err, ErrOverflow) {
			t.Fatalf("ended with %v", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("a watcher 8 KiB behind a 4 KiB queue was not ended")
	}
	w.Close()
}

func testSweeperUnderLease(t *testing.T, st []*Store) {
	ctx := clustertest.Context(t)
	old := time.Now().Add(-48 * time.Hour).UnixNano()
	now := time.Now().UnixNano()
	for _, name := range []string{"app/idle0000000000001", "app/busy0000000000001", "app/written00000000001"} {
		if _, err := st[0].Claim(ctx, name, store.Hash{1}, old, time.Hour, idle); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := st[0].Claim(ctx, "app/busy0000000000001", store.Hash{1}, now, time.Hour, idle); err != nil {
		t.Fatal(err)
	}
	// A write stamps the head, not the claim: it keeps the mailbox too.
	mustPut(t, st[1], "app/written00000000001", 'c', 1, envelope(1, "m1"), Created)
	sw0, err := st[0].NewSweeper(ctx, time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	sw2, err := st[2].NewSweeper(ctx, time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	// While node 0 holds the lease, node 2 does not sweep.
	if _, err := sw0.kv.Create(ctx, sweeperKey, []byte("n0")); err != nil {
		t.Fatal(err)
	}
	if _, ran, err := sw2.Sweep(ctx, now-int64(time.Hour)); err != nil || ran {
		t.Fatalf("swept beside a held lease: %v %v", ran, err)
	}
	if err := sw0.kv.Delete(ctx, sweeperKey); err != nil {
		t.Fatal(err)
	}
	erased, ran, err := sw2.Sweep(ctx, now-int64(time.Hour))
	if err != nil || !ran {
		t.Fatalf("sweep: %v %v", ran, err)
	}
	if !slices.Equal(erased, []string{"app/idle0000000000001"}) {
		t.Fatalf("erased %v", erased)
	}
	if _, err := st[1].Mailbox(ctx, "app/idle0000000000001"); !errors.Is(err, store.ErrNotFound) {
		t.Fatal(err)
	}
	// The lease was given back.
	if _, ran, err := sw0.Sweep(ctx, now-int64(time.Hour)); err != nil || !ran {
		t.Fatalf("second sweep: %v %v", ran, err)
	}
}

// Stopping the stream leader mid-stream loses no acknowledged envelope;
// writes answer unavailable (503) during the election and resume.
func TestLeaderStopLosesNothingAcknowledged(t *testing.T) {
	nodes, st := start(t)
	name := "app/leader00000000001"
	claim(t, st[0], name)
	n, _ := st[0].names(name)
	ctx := clustertest.Context(t)
	info, err := st[0].streams[n.shard].Info(ctx)
	if err != nil {
		t.Fatal(err)
	}
	leader := -1
	for i := range 3 {
		if info.Cluster != nil && info.Cluster.Leader == fmt.Sprintf("n%d", i) {
			leader = i
		}
	}
	if leader < 0 {
		t.Fatalf("no leader in %+v", info.Cluster)
	}
	writer, reader := st[(leader+1)%3], st[(leader+2)%3]
	// A watcher on the third node, reopened with after = the last it
	// holds whenever it ends unavailable (as a client reconnects), sees
	// every acknowledged envelope once.
	r := newRecorder()
	var mu sync.Mutex
	var cur *Watch
	stopped := false
	var reopen func(after uint64)
	reopen = func(after uint64) {
		mu.Lock()
		defer mu.Unlock()
		if stopped {
			return
		}
		w, err := reader.Watch(clustertest.Context(t), name, 'p', WatchConfig{After: after, Deliver: r.deliver, End: func(err error) {
			if errors.Is(err, store.ErrUnavailable) {
				var last uint64
				if got := r.got(); len(got) > 0 {
					last = got[len(got)-1]
				}
				go reopen(last)
			}
		}})
		if err != nil {
			t.Errorf("reopen watch: %v", err)
			return
		}
		cur = w
	}
	t.Cleanup(func() {
		mu.Lock()
		stopped = true
		w := cur
		mu.Unlock()
		if w != nil {
			w.Close()
		}
	})
	reopen(0)
	var acked []uint64
	for seq := uint64(1); seq <= 40; seq++ {
		if seq == 10 {
			nodes.Stop(leader)
		}
		deadline := time.Now().Add(20 * time.Second)
		for {
			octx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
			r, err := writer.Put(octx, name, 'p', seq, envelope(seq, fmt.Sprint("m", seq)), noLimits, time.Now().UnixNano())
			cancel()
			if err == nil && (r.Outcome == Created || r.Outcome == Retry) {
				acked = append(acked, seq)
				break
			}
			if err != nil && !errors.Is(err, store.ErrUnavailable) {
				t.Fatalf("seq %d: %v", seq, err)
			}
			if time.Now().After(deadline) {
				t.Fatalf("seq %d not acknowledged in 20 s: %v %v", seq, r.Outcome, err)
			}
		}
	}
	if got := scanAll(t, reader, name, 'p', 0); !slices.Equal(got, acked) {
		t.Fatalf("after the leader stopped: %v, acknowledged %v", got, acked)
	}
	if got := r.waitFor(t, len(acked)); !slices.Equal(got, acked) {
		t.Fatalf("watch across the leader change: %v, acknowledged %v", got, acked)
	}
}

func TestNoQuorumIsUnavailable(t *testing.T) {
	nodes, st := start(t)
	name := "app/quorum00000000001"
	claim(t, st[0], name)
	mustPut(t, st[0], name, 'p', 1, envelope(1, "m1"), Created)
	nodes.Stop(1)
	nodes.Stop(2)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
	defer cancel()
	_, err := st[0].Put(ctx, name, 'p', 2, envelope(2, "m2"), noLimits, time.Now().UnixNano())
	if !errors.Is(err, store.ErrUnavailable) {
		t.Fatalf("put without quorum: %v", err)
	}
	ctx2, cancel2 := context.WithTimeout(context.Background(), 3*time.Second)
	defer cancel2()
	if _, err := st[0].Claim(ctx2, "app/quorum00000000002", store.Hash{1}, 1, time.Hour, idle); !errors.Is(err, store.ErrUnavailable) {
		t.Fatalf("claim without quorum: %v", err)
	}
}
