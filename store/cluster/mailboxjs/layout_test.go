package mailboxjs

import (
	"context"
	"reflect"
	"slices"
	"testing"
	"time"
)

func TestHeadRoundTrip(t *testing.T) {
	h := Head{Max: 1 << 40, Count: 7, Bytes: 12345, Pruned: 3, EnvTAT: -5, PushTAT: 1 << 50, Active: 42,
		FirstStream: 99, CumInOrder: 1 << 33, PrunedCum: 17,
		Stored: []Run{{4, 6}, {9, 9}, {1 << 40, 1 << 40}}, OutOfOrder: []uint64{5, 9}}
	got, err := decodeHead(encodeHead(&h), 77)
	if err != nil {
		t.Fatal(err)
	}
	h.Rev = 77
	if !slices.Equal(got.Stored, h.Stored) || !slices.Equal(got.OutOfOrder, h.OutOfOrder) {
		t.Fatalf("lists: %+v", got)
	}
	got.Stored, got.OutOfOrder, h.Stored, h.OutOfOrder = nil, nil, nil, nil
	if !reflect.DeepEqual(got, h) {
		t.Fatalf("decoded %+v, want %+v", got, h)
	}
	for _, bad := range []string{"", "!!", "AA", encodeHead(&Head{})[:2] + "x", encodeHead(&Head{}) + "AA"} {
		if _, err := decodeHead(bad, 1); err == nil {
			t.Errorf("decoded %q", bad)
		}
	}
}

func TestHeadRuns(t *testing.T) {
	var h Head
	for _, seq := range []uint64{1, 2, 5, 4, 10, 3, 9} {
		h.add(seq, 1)
	}
	if want := []Run{{1, 5}, {9, 10}}; !slices.Equal(h.Stored, want) {
		t.Fatalf("runs %v, want %v", h.Stored, want)
	}
	if want := []uint64{3, 4, 9}; !slices.Equal(h.OutOfOrder, want) {
		t.Fatalf("out of order %v, want %v", h.OutOfOrder, want)
	}
	for seq, want := range map[uint64]bool{0: false, 1: true, 5: true, 6: false, 8: false, 9: true, 10: true, 11: false} {
		if h.Has(seq) != want {
			t.Errorf("Has(%d) = %v", seq, !want)
		}
	}
	if h.First() != 1 || h.Last() != 10 || h.Max != 10 || h.Count != 7 {
		t.Fatalf("%+v", h)
	}
	h.pruneThrough(3)
	if want := []Run{{4, 5}, {9, 10}}; !slices.Equal(h.Stored, want) || !slices.Equal(h.OutOfOrder, []uint64{4, 9}) || h.Pruned != 3 {
		t.Fatalf("after prune 3: %+v", h)
	}
	h.pruneThrough(9)
	if want := []Run{{10, 10}}; !slices.Equal(h.Stored, want) || len(h.OutOfOrder) != 0 {
		t.Fatalf("after prune 9: %+v", h)
	}
	h.pruneThrough(2) // a lower mark never lowers it
	if h.Pruned != 9 {
		t.Fatalf("pruned %d", h.Pruned)
	}
}

// The head's lists are capped: the write that would pass a cap is full.
func TestHeadCapsAtTheEdge(t *testing.T) {
	s := &Store{}
	lim := Limits{MaxStored: 1 << 20, MaxStoredBytes: 1 << 30}
	// Holes every other sequence are a bitmap: 4,000 runs fit in 1 KiB.
	var h Head
	for i := uint64(1); i <= 4000; i++ {
		h.add(2*i, 1)
	}
	if r, next, _ := s.decide(context.Background(), names{}, 'p', h, 8002, []byte("x"), lim, 0); next == nil || r.Outcome != Created {
		t.Fatalf("4,001st run of a dense set: %+v (%d bytes)", r, runsEncodedSize(h.Stored))
	}
	// Runs spread wide are a list of 4 bytes each (a 3-byte gap, a 1-byte
	// length): 256 fit in 1,024 bytes, a 257th does not.
	const gap = 1 << 15
	h = Head{}
	for i := uint64(1); i <= 255; i++ {
		h.add(i*gap, 1)
	}
	if r, next, _ := s.decide(context.Background(), names{}, 'p', h, 256*gap, []byte("x"), lim, 0); next == nil || r.Outcome != Created {
		t.Fatalf("256th run: %+v (%d bytes)", r, runsEncodedSize(h.Stored))
	}
	h.add(256*gap, 1)
	if got := runsEncodedSize(h.Stored); got != maxRunsBytes {
		t.Fatalf("%d bytes, want the cap", got)
	}
	if r, next, _ := s.decide(context.Background(), names{}, 'p', h, 257*gap, []byte("x"), lim, 0); next != nil || r.Outcome != Full {
		t.Fatalf("257th run: %+v", r)
	}
	// Filling a hole or growing a run is allowed at the cap: it adds no run.
	for _, seq := range []uint64{2*gap - 1, 256*gap + 1} {
		if r, next, _ := s.decide(context.Background(), names{}, 'p', h, seq, []byte("x"), lim, 0); next == nil || r.Outcome != Created {
			t.Fatalf("growing a run at the cap (seq %d): %+v", seq, r)
		}
	}
	// Out of order, dense (a bitmap): maxOutOfOrder below the max are
	// allowed, one more is full.
	h = Head{}
	h.add(100_000, 1)
	for i := uint64(1); i < maxOutOfOrder; i++ {
		h.add(100_000-i, 1)
	}
	last := uint64(100_000 - maxOutOfOrder)
	if r, next, _ := s.decide(context.Background(), names{}, 'p', h, last, []byte("x"), lim, 0); next == nil || r.Outcome != Created {
		t.Fatalf("last out-of-order entry: %+v", r)
	}
	h.add(last, 1)
	if r, next, _ := s.decide(context.Background(), names{}, 'p', h, last-1, []byte("x"), lim, 0); next != nil || r.Outcome != Full {
		t.Fatalf("one past the out-of-order cap: %+v", r)
	}
	// Out of order in clusters spread wide (a list: a 3-byte delta per
	// cluster, 1 byte per neighbour): the byte cap, below the runs cap.
	h = Head{}
	h.add(1<<40, 1)
	next := uint64(gap)
	for oooEncodedSize(h.OutOfOrder)+12 <= maxOutOfOrderBytes {
		for j := range uint64(10) {
			h.add(next+j, 1)
		}
		next += gap
	}
	next = h.OutOfOrder[len(h.OutOfOrder)-1] + 1
	for oooEncodedSize(h.OutOfOrder) < maxOutOfOrderBytes-1 {
		h.add(next, 1)
		next++
	}
	if len(h.Stored) > maxRuns {
		t.Fatalf("%d runs", len(h.Stored))
	}
	if r, n, _ := s.decide(context.Background(), names{}, 'p', h, next, []byte("x"), lim, 0); n == nil || r.Outcome != Created {
		t.Fatalf("at the byte cap: %+v", r)
	}
	h.add(next, 1)
	if got := oooEncodedSize(h.OutOfOrder); got != maxOutOfOrderBytes {
		t.Fatalf("%d bytes, want the cap", got)
	}
	if r, n, _ := s.decide(context.Background(), names{}, 'p', h, next+1, []byte("x"), lim, 0); n != nil || r.Outcome != Full {
		t.Fatalf("one byte past the cap: %+v", r)
	}
}

// The out-of-order set round-trips as a list and as a bitmap.
func TestOutOfOrderEncodings(t *testing.T) {
	dense := []uint64{}
	for i := uint64(10); i < 4000; i += 3 {
		dense = append(dense, i)
	}
	for _, set := range [][]uint64{nil, {7}, {1, 2, 3, 1 << 50}, dense} {
		h := Head{Max: 1 << 51, OutOfOrder: set, Stored: []Run{{1, 1 << 51}}}
		got, err := decodeHead(encodeHead(&h), 1)
		if err != nil {
			t.Fatalf("%d entries: %v", len(set), err)
		}
		if !slices.Equal(got.OutOfOrder, set) {
			t.Fatalf("%d entries came back as %d", len(set), len(got.OutOfOrder))
		}
	}
	// The stored set, as runs, round-trips both ways too.
	for _, runs := range [][]Run{{{1, 1}}, {{5, 9}, {1 << 40, 1 << 40}}, func() (r []Run) {
		for i := uint64(1); i < 2000; i += 2 {
			r = append(r, Run{i, i})
		}
		return r
	}()} {
		h := Head{Max: 1 << 41, Stored: runs}
		got, err := decodeHead(encodeHead(&h), 1)
		if err != nil || !slices.Equal(got.Stored, runs) {
			t.Fatalf("%d runs: %v (%d back)", len(runs), err, len(got.Stored))
		}
	}
	if l, bm := oooSizes(dense); bm >= l {
		t.Fatalf("dense set: list %d bytes, bitmap %d", l, bm)
	}
}

func TestGCRA(t *testing.T) {
	every := int64(time.Second)
	var tat int64
	now := int64(1000 * time.Second)
	for i := range 3 {
		var ok bool
		if tat, ok, _ = gcra(tat, now, 3, every); !ok {
			t.Fatalf("token %d of a burst of 3 refused", i+1)
		}
	}
	_, ok, wait := gcra(tat, now, 3, every)
	if ok || wait != every {
		t.Fatalf("4th: ok %v wait %v", ok, time.Duration(wait))
	}
	if _, ok, _ := gcra(tat, now+every, 3, every); !ok {
		t.Fatal("no token back after one interval")
	}
}
