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
	var h Head
	// maxRuns runs: 2, 4, 6, ... (holes between them).
	for i := uint64(1); i <= maxRuns; i++ {
		h.add(2*i, 1)
	}
	if len(h.Stored) != maxRuns {
		t.Fatalf("%d runs", len(h.Stored))
	}
	// Filling a hole joins two runs: allowed at the cap.
	if r, next, err := s.decide(context.Background(), names{}, 'p', h, 3, []byte("x"), lim, 0); err != nil || next == nil || r.Outcome != Created {
		t.Fatalf("joining at the cap: %+v %v", r, err)
	}
	// A new run past the cap is refused.
	if r, next, err := s.decide(context.Background(), names{}, 'p', h, 2*maxRuns+2, []byte("x"), lim, 0); err != nil || next != nil || r.Outcome != Full {
		t.Fatalf("one run past the cap: %+v %v", r, err)
	}
	// Out of order: maxOutOfOrder below the max are allowed, one more is full.
	h = Head{}
	h.add(10_000, 1)
	for i := uint64(1); i < maxOutOfOrder; i++ {
		h.add(10_000-i, 1)
	}
	if r, next, _ := s.decide(context.Background(), names{}, 'p', h, 1, []byte("x"), lim, 0); next == nil || r.Outcome != Created {
		t.Fatalf("last out-of-order entry: %+v", r)
	}
	h.add(1, 1)
	if r, next, _ := s.decide(context.Background(), names{}, 'p', h, 2, []byte("x"), lim, 0); next != nil || r.Outcome != Full {
		t.Fatalf("one past the out-of-order cap: %+v", r)
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
