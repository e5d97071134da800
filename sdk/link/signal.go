package link

import (
	"errors"
	"time"
)

// SignalMaxSkew is how far a signal frame's counter may lie from the
// receiver's clock, either way, before the frame is dropped as stale.
const SignalMaxSkew = 5 * time.Minute

// ErrStale: a signal frame's counter is more than SignalMaxSkew away from the
// receiver's clock. A frame from the past may be a recording being replayed
// to a receiver that has forgotten its last counter; one from the future
// would lock the receiver out of every honest frame until its clock caught up.
var ErrStale = errors.New("link: signal frame counter more than 5 minutes from this clock (stale)")

// SignalSender seals the signal frames one device sends (under
// Link.SignalKey of its sending direction).
//
// A signal frame is an envelope whose sequence is a counter of milliseconds
// since 1970. A clock needs no stored state, so a device that restarts keeps
// numbering upward without remembering anything; SignalSender makes the
// counter strictly increasing on top of that (two frames in one millisecond,
// a clock stepped back), because the counter is also the GCM nonce and must
// never repeat under the key.
//
// A SignalSender is not safe for concurrent use; a socket has one writer.
type SignalSender struct {
	sealer *Sealer
	now    func() time.Time
	last   uint64
}

// NewSignalSender returns a SignalSender for key that reads the time from
// now (time.Now when nil).
func NewSignalSender(key [KeySize]byte, now func() time.Time) (*SignalSender, error) {
	s, err := NewSealer(key)
	if err != nil {
		return nil, err
	}
	if now == nil {
		now = time.Now
	}
	return &SignalSender{sealer: s, now: now}, nil
}

// Seal appends the frame of plaintext to dst and returns the extended slice,
// without allocating when dst has room (len(plaintext)+Overhead). Its counter
// is the clock in milliseconds, or one more than the previous frame's when the
// clock has not moved past it. The relay forwards frames of at most 64 KiB.
func (s *SignalSender) Seal(dst, plaintext []byte) []byte {
	counter := s.last + 1
	if now := s.now().UnixMilli(); now > 0 && uint64(now) > counter {
		counter = uint64(now)
	}
	s.last = counter
	return s.sealer.seal(dst, counter, plaintext)
}

// Last is the counter of the last frame sealed, 0 before the first.
func (s *SignalSender) Last() uint64 { return s.last }

// SignalReceiver opens the signal frames from the other device (under
// Link.SignalKey of the other device's sending direction). It drops a frame
// whose counter is at or below the last it accepted, or more than
// SignalMaxSkew from its own clock.
//
// A SignalReceiver is not safe for concurrent use.
type SignalReceiver struct {
	sealer *Sealer
	now    func() time.Time
	last   uint64
}

// NewSignalReceiver returns a SignalReceiver for key that reads the time from
// now (time.Now when nil).
func NewSignalReceiver(key [KeySize]byte, now func() time.Time) (*SignalReceiver, error) {
	s, err := NewSealer(key)
	if err != nil {
		return nil, err
	}
	if now == nil {
		now = time.Now
	}
	return &SignalReceiver{sealer: s, now: now}, nil
}

// Open checks a frame and appends its plaintext to dst (see Sealer.Open).
// It fails with ErrMalformed or ErrBadTag as Sealer.Open does, ErrReplay for a
// counter at or below the last accepted and ErrStale for one more than
// SignalMaxSkew from the clock; a failed frame changes nothing.
func (r *SignalReceiver) Open(dst, frame []byte) ([]byte, error) {
	counter, plaintext, err := r.sealer.Open(dst, frame)
	if err != nil {
		return nil, err
	}
	if counter <= r.last {
		return nil, ErrReplay
	}
	if !withinSkew(counter, r.now().UnixMilli()) {
		return nil, ErrStale
	}
	r.last = counter
	return plaintext, nil
}

// Last is the counter of the last frame accepted, 0 before the first.
func (r *SignalReceiver) Last() uint64 { return r.last }

// withinSkew reports whether counter lies within SignalMaxSkew of now (both
// in milliseconds), inclusive. It compares in uint64 so that neither a
// counter above the int64 range nor a clock before 1970 can overflow.
func withinSkew(counter uint64, now int64) bool {
	const skew = uint64(SignalMaxSkew / time.Millisecond)
	if now < 0 {
		now = 0
	}
	n := uint64(now)
	if counter >= n {
		return counter-n <= skew
	}
	return n-counter <= skew
}
