package link

import "errors"

// ErrReplay: the envelope authenticates but its sequence was accepted before
// (or, for Reader, lies so far behind the newest one that Reader no longer
// tracks it; see ReplayWindow). For signal frames: the counter is at or below
// the last one accepted.
var ErrReplay = errors.New("link: sequence already accepted (replay)")

// ReplayWindow is how many sequences above its floor a Reader tracks one by
// one. It matches the relay's default RELAY_MAX_STORED (4,096 envelopes per
// direction): a reader that fetches whatever the relay holds, in any order,
// stays inside the window. It costs 512 bytes per Reader.
const ReplayWindow = 4096

// Reader opens the envelopes of one direction and drops replays, as the spec
// asks of a reader: "a reader drops an envelope whose tag fails or whose
// sequence it has already accepted".
//
// Memory is bounded. Reader keeps a floor, below and at which every sequence
// counts as accepted, and one bit for each of the ReplayWindow sequences
// above it. The floor rises over every run of accepted sequences, so a
// reader that accepts in order (the relay serves ascending sequences) keeps
// no bits at all, and one that accepts out of order (3, then 2) keeps a bit
// per gap-straddling envelope until the gap fills.
//
// An envelope more than ReplayWindow above the floor moves the floor up to
// ReplayWindow below it. Sequences the floor passes over without having been
// accepted are given up: should they arrive later they are refused as
// replays. That is the price of the bound, and it is paid only by a reader
// whose gaps span more than the relay can store.
//
// A Reader is not safe for concurrent use.
type Reader struct {
	sealer *Sealer
	// floor: every sequence at or below it was accepted or given up.
	floor uint64
	// seen has bit s%ReplayWindow set when sequence s, with
	// floor < s <= floor+ReplayWindow, was accepted. Bits at or below the
	// floor are kept clear, so each bit stands for one sequence at a time.
	seen [ReplayWindow / 64]uint64
}

// NewReader returns a Reader for an envelope key (Link.EnvelopeKey of the
// direction it reads) that counts every sequence at or below floor as
// accepted. A new link starts at 0; a reader that persists Floor resumes from
// it, and may also pass it as the relay's after= to fetch only what is new.
func NewReader(key [KeySize]byte, floor uint64) (*Reader, error) {
	s, err := NewSealer(key)
	if err != nil {
		return nil, err
	}
	return &Reader{sealer: s, floor: floor}, nil
}

// Floor is the highest sequence at or below which every sequence was accepted
// (or given up). It is the value to persist: accepted sequences above it are
// held only in memory.
func (r *Reader) Floor() uint64 { return r.floor }

// Accept opens an envelope (see Sealer.Open for dst) and accepts its sequence.
// It fails with ErrMalformed or ErrBadTag as Open does, and with ErrReplay for
// a sequence accepted before; in all three cases nothing changes, so a forged
// envelope cannot disturb what Reader remembers.
func (r *Reader) Accept(dst, envelope []byte) (seq uint64, plaintext []byte, err error) {
	seq, plaintext, err = r.sealer.Open(dst, envelope)
	if err != nil {
		return 0, nil, err
	}
	switch {
	case seq <= r.floor:
		return 0, nil, ErrReplay
	case seq-r.floor > ReplayWindow:
		// Beyond the window: no bit stands for seq yet. Raising the
		// floor clears the bit seq takes over.
		r.raiseFloor(seq - ReplayWindow)
	case r.has(seq):
		return 0, nil, ErrReplay
	}
	r.set(seq)
	for r.has(r.floor + 1) {
		r.clear(r.floor + 1)
		r.floor++
	}
	return seq, plaintext, nil
}

// raiseFloor moves the floor up to f, clearing the bits of the sequences it
// passes, so that they can stand for sequences above the new window.
func (r *Reader) raiseFloor(f uint64) {
	if f-r.floor >= ReplayWindow {
		r.seen = [ReplayWindow / 64]uint64{}
	} else {
		for s := r.floor + 1; s <= f; s++ {
			r.clear(s)
		}
	}
	r.floor = f
}

// has reports the bit of seq, which must lie within the window.
func (r *Reader) has(seq uint64) bool {
	i := seq % ReplayWindow
	return r.seen[i/64]&(1<<(i%64)) != 0
}

func (r *Reader) set(seq uint64) {
	i := seq % ReplayWindow
	r.seen[i/64] |= 1 << (i % 64)
}

func (r *Reader) clear(seq uint64) {
	i := seq % ReplayWindow
	r.seen[i/64] &^= 1 << (i % 64)
}
