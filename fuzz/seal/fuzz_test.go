// Package seal fuzzes the envelope sealing of edgerelay/sdk/link: HKDF key
// derivation and AES-256-GCM seal/open round trips, and opening arbitrary
// bytes, which a reader does with whatever the relay (or an attacker who
// holds the bearer) hands it.
package seal

import (
	"bytes"
	"encoding/binary"
	"errors"
	"math"
	"testing"
	"time"

	"edgerelay/sdk/link"
)

// FuzzSealOpen: for any key, any link id, any sequence >= 1 and any message,
// the envelope has the spec's layout, opens back to the message under the
// same key, and fails with ErrBadTag when any one bit of it is flipped
// (ErrMalformed when the flip hits the version byte or zeroes the sequence).
func FuzzSealOpen(f *testing.F) {
	f.Add([]byte("0123456789abcdef0123456789abcdef"), "AAECAwQFBgcICQoLDA0ODw", uint64(1), []byte("hello"), uint16(0))
	f.Add([]byte{}, "", uint64(1<<63), []byte{}, uint16(3))
	f.Add([]byte{0xff}, "x", ^uint64(0), bytes.Repeat([]byte{0}, 300), uint16(200))
	f.Fuzz(func(t *testing.T, keyBytes []byte, id string, seq uint64, msg []byte, flip uint16) {
		if seq == 0 {
			seq = 1
		}
		// Any bytes make a key: spread them over the 32 bytes so that the
		// fuzzer reaches every one, and derive through HKDF as clients do.
		var l link.Link
		for i, b := range keyBytes {
			l.Key[i%link.KeySize] ^= b
		}
		l.ID = id
		d := link.P2C
		if seq%2 == 0 {
			d = link.C2P
		}
		s, err := link.NewSealer(l.EnvelopeKey(d))
		if err != nil {
			t.Fatal(err)
		}
		env, err := s.Seal(nil, seq, msg)
		if err != nil {
			t.Fatal(err)
		}
		if len(env) != len(msg)+link.Overhead || env[0] != link.Version ||
			binary.BigEndian.Uint64(env[1:link.HeaderSize]) != seq {
			t.Fatalf("layout: %x", env)
		}
		gotSeq, pt, err := s.Open(nil, env)
		if err != nil || gotSeq != seq || !bytes.Equal(pt, msg) {
			t.Fatalf("Open = %d, %x, %v; want %d, %x", gotSeq, pt, err, seq, msg)
		}

		bit := int(flip) % (8 * len(env))
		bad := bytes.Clone(env)
		bad[bit/8] ^= 1 << (bit % 8)
		want := link.ErrBadTag
		if bit/8 == 0 || binary.BigEndian.Uint64(bad[1:link.HeaderSize]) == 0 {
			want = link.ErrMalformed
		}
		if _, _, err := s.Open(nil, bad); !errors.Is(err, want) {
			t.Fatalf("bit %d flipped: %v, want %v", bit, err, want)
		}

		// The other direction's key never opens it.
		o, _ := link.NewSealer(l.EnvelopeKey(otherDirection(d)))
		if _, _, err := o.Open(nil, env); !errors.Is(err, link.ErrBadTag) {
			t.Fatalf("other key: %v", err)
		}
	})
}

func otherDirection(d link.Direction) link.Direction {
	if d == link.P2C {
		return link.C2P
	}
	return link.P2C
}

// FuzzOpen: opening arbitrary bytes never panics, and fails with exactly
// ErrMalformed or ErrBadTag, the same way for a Sealer, a Reader (which
// must then not change) and a SignalReceiver.
func FuzzOpen(f *testing.F) {
	var key [link.KeySize]byte
	s, err := link.NewSealer(key)
	if err != nil {
		f.Fatal(err)
	}
	good, _ := s.Seal(nil, 1, []byte("hello"))
	f.Add(good)
	f.Add([]byte{})
	f.Add(make([]byte, 24))
	f.Add(make([]byte, 25))
	f.Add(append([]byte{1, 0, 0, 0, 0, 0, 0, 0, 0}, make([]byte, 16)...))
	f.Add(append([]byte{2}, good[1:]...))
	f.Fuzz(func(t *testing.T, env []byte) {
		seq, pt, err := s.Open(nil, env)
		if err == nil {
			// Only a genuine envelope opens; the fuzzer will not forge one,
			// but it may rediscover a seed.
			if again, _ := s.Seal(nil, seq, pt); !bytes.Equal(again, env) {
				t.Fatalf("opened %x but it re-seals to %x", env, again)
			}
		} else if !errors.Is(err, link.ErrMalformed) && !errors.Is(err, link.ErrBadTag) {
			t.Fatalf("Open error %v is neither ErrMalformed nor ErrBadTag", err)
		}
		if (err == nil || errors.Is(err, link.ErrBadTag)) != (len(env) >= link.Overhead && env[0] == link.Version &&
			binary.BigEndian.Uint64(env[1:link.HeaderSize]) != 0) {
			t.Fatalf("%x: Open says %v, the outside says otherwise", env, err)
		}

		r, _ := link.NewReader(key, 0)
		if _, _, rerr := r.Accept(nil, env); !errors.Is(rerr, err) && (err != nil || rerr != nil) {
			t.Fatalf("Reader.Accept = %v, Open = %v", rerr, err)
		}
		if err != nil && r.Floor() != 0 {
			t.Fatalf("a refused envelope moved the floor to %d", r.Floor())
		}

		// The receiver's clock reads the counter, so only a counter
		// beyond the clock's int64 range may be stale.
		now := func() time.Time { return time.UnixMilli(int64(min(seq, math.MaxInt64))) }
		sr, _ := link.NewSignalReceiver(key, now)
		_, serr := sr.Open(nil, env)
		switch {
		case err != nil && !errors.Is(serr, err):
			t.Fatalf("SignalReceiver.Open = %v, Open = %v", serr, err)
		case err == nil && serr != nil && !(errors.Is(serr, link.ErrStale) && seq > math.MaxInt64):
			t.Fatalf("SignalReceiver.Open = %v for a genuine frame, counter %d", serr, seq)
		}
	})
}
