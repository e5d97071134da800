package link_test

import (
	"errors"
	"math/rand/v2"
	"testing"

	"edgerelay/sdk/link"
)

func newReader(t *testing.T, floor uint64) (*link.Reader, *link.Sealer) {
	t.Helper()
	var key [32]byte
	key[0] = 7
	r, err := link.NewReader(key, floor)
	if err != nil {
		t.Fatal(err)
	}
	return r, newSealer(t)
}

func accept(t *testing.T, r *link.Reader, s *link.Sealer, seq uint64) error {
	t.Helper()
	got, pt, err := r.Accept(nil, seal(t, s, seq, "m"))
	if err == nil && (got != seq || string(pt) != "m") {
		t.Fatalf("Accept(%d) = %d, %q", seq, got, pt)
	}
	return err
}

func TestReaderReplay(t *testing.T) {
	r, s := newReader(t, 0)
	if err := accept(t, r, s, 1); err != nil {
		t.Fatal(err)
	}
	if err := accept(t, r, s, 1); !errors.Is(err, link.ErrReplay) {
		t.Fatalf("second 1: %v, want ErrReplay", err)
	}
	if r.Floor() != 1 {
		t.Fatalf("Floor = %d, want 1", r.Floor())
	}
}

func TestReaderOutOfOrder(t *testing.T) {
	r, s := newReader(t, 0)
	for _, step := range []struct {
		seq    uint64
		replay bool
		floor  uint64
	}{
		{1, false, 1},
		{3, false, 1},
		{3, true, 1},
		{2, false, 3}, // fills the gap: the floor jumps over 3
		{2, true, 3},
		{3, true, 3},
		{10, false, 3},
		{5, false, 3},
		{4, false, 5},
		{10, true, 5},
		{6, false, 6},
	} {
		err := accept(t, r, s, step.seq)
		if step.replay != errors.Is(err, link.ErrReplay) || (!step.replay && err != nil) {
			t.Fatalf("Accept(%d) = %v, want replay %v", step.seq, err, step.replay)
		}
		if r.Floor() != step.floor {
			t.Fatalf("after %d: Floor = %d, want %d", step.seq, r.Floor(), step.floor)
		}
	}
}

func TestReaderResumesFromFloor(t *testing.T) {
	r, s := newReader(t, 100)
	if err := accept(t, r, s, 100); !errors.Is(err, link.ErrReplay) {
		t.Fatalf("at the floor: %v", err)
	}
	if err := accept(t, r, s, 101); err != nil || r.Floor() != 101 {
		t.Fatalf("101: %v, floor %d", err, r.Floor())
	}
}

// TestReaderFailureChangesNothing: an envelope that fails to authenticate
// does not touch the replay state, so a forger cannot burn sequences.
func TestReaderFailureChangesNothing(t *testing.T) {
	r, s := newReader(t, 0)
	var other [32]byte
	o, _ := link.NewSealer(other)
	if _, _, err := r.Accept(nil, seal(t, o, 1, "forged")); !errors.Is(err, link.ErrBadTag) {
		t.Fatalf("forged: %v", err)
	}
	if _, _, err := r.Accept(nil, seal(t, o, 1_000_000, "forged")); !errors.Is(err, link.ErrBadTag) {
		t.Fatalf("forged far ahead: %v", err)
	}
	if r.Floor() != 0 {
		t.Fatalf("Floor = %d after forgeries", r.Floor())
	}
	if err := accept(t, r, s, 1); err != nil {
		t.Fatalf("genuine 1 after a forged 1: %v", err)
	}
	if _, _, err := r.Accept(nil, []byte{1, 2}); !errors.Is(err, link.ErrMalformed) {
		t.Fatalf("short: %v", err)
	}
}

// TestReaderWindow: a sequence more than ReplayWindow above the floor moves
// the window; sequences it passes over are then refused, the ones still
// inside it are tracked one by one.
func TestReaderWindow(t *testing.T) {
	const w = link.ReplayWindow
	r, s := newReader(t, 0)
	if err := accept(t, r, s, 1); err != nil {
		t.Fatal(err)
	}
	if err := accept(t, r, s, 1+w); err != nil { // exactly at the window's top
		t.Fatal(err)
	}
	if r.Floor() != 1 {
		t.Fatalf("Floor = %d, want 1", r.Floor())
	}
	if err := accept(t, r, s, 3+w); err != nil { // one past: the floor moves to 3
		t.Fatal(err)
	}
	if r.Floor() != 3 {
		t.Fatalf("Floor = %d, want 3", r.Floor())
	}
	if err := accept(t, r, s, 2); !errors.Is(err, link.ErrReplay) {
		t.Fatalf("2, given up: %v", err)
	}
	for _, seq := range []uint64{1 + w, 3 + w} {
		if err := accept(t, r, s, seq); !errors.Is(err, link.ErrReplay) {
			t.Fatalf("%d again: %v", seq, err)
		}
	}
	if err := accept(t, r, s, 4); err != nil {
		t.Fatal(err)
	}
	// A jump of many windows clears everything and keeps working.
	far := uint64(10 * w)
	if err := accept(t, r, s, far); err != nil {
		t.Fatal(err)
	}
	if r.Floor() != far-w {
		t.Fatalf("Floor = %d, want %d", r.Floor(), far-w)
	}
	for _, seq := range []uint64{far - 1, far - w + 1} {
		if err := accept(t, r, s, seq); err != nil {
			t.Fatalf("%d inside the moved window: %v", seq, err)
		}
	}
	if err := accept(t, r, s, far); !errors.Is(err, link.ErrReplay) {
		t.Fatalf("far again: %v", err)
	}
}

// TestReaderModel checks the Reader against a plain set on random orders of
// sequences with duplicates, within the window (where nothing is given up).
func TestReaderModel(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	var key [32]byte
	key[0] = 7
	s := newSealer(t)
	envs := map[uint64][]byte{}
	for round := 0; round < 20; round++ {
		r, _ := link.NewReader(key, 0)
		accepted := map[uint64]bool{}
		n := 1 + rng.IntN(300)
		for i := 0; i < 3*n; i++ {
			seq := uint64(1 + rng.IntN(n))
			env, ok := envs[seq]
			if !ok {
				env = seal(t, s, seq, "m")
				envs[seq] = env
			}
			_, _, err := r.Accept(nil, env)
			if accepted[seq] != errors.Is(err, link.ErrReplay) || (!accepted[seq] && err != nil) {
				t.Fatalf("round %d: Accept(%d) = %v, accepted before: %v", round, seq, err, accepted[seq])
			}
			accepted[seq] = true
			var floor uint64
			for accepted[floor+1] {
				floor++
			}
			if r.Floor() != floor {
				t.Fatalf("round %d: Floor = %d, want %d", round, r.Floor(), floor)
			}
		}
	}
}
