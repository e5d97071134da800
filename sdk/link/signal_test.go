package link_test

import (
	"errors"
	"testing"
	"time"

	"edgerelay/sdk/link"
)

// clock is a settable time source for the signal tests.
type clock struct{ t time.Time }

func (c *clock) now() time.Time { return c.t }

func signalPair(t *testing.T, sendClock, recvClock *clock) (*link.SignalSender, *link.SignalReceiver) {
	t.Helper()
	l, _ := link.New()
	snd, err := link.NewSignalSender(l.SignalKey(link.P2C), sendClock.now)
	if err != nil {
		t.Fatal(err)
	}
	rcv, err := link.NewSignalReceiver(l.SignalKey(link.P2C), recvClock.now)
	if err != nil {
		t.Fatal(err)
	}
	return snd, rcv
}

func TestSignalCounterStrictlyIncreasing(t *testing.T) {
	c := &clock{time.UnixMilli(1_700_000_000_000)}
	// The receiver's clock stays put: the sender's is the one misbehaving.
	snd, rcv := signalPair(t, c, &clock{c.t})
	counter := func(frame []byte) uint64 {
		seq, ok := link.Sequence(frame)
		if !ok {
			t.Fatalf("frame %x has no counter", frame)
		}
		return seq
	}
	var last uint64
	step := func(what string, want uint64) {
		t.Helper()
		f := snd.Seal(nil, []byte(what))
		got := counter(f)
		if got != want || got <= last || snd.Last() != got {
			t.Fatalf("%s: counter %d (Last %d), want %d above %d", what, got, snd.Last(), want, last)
		}
		last = got
		if pt, err := rcv.Open(nil, f); err != nil || string(pt) != what {
			t.Fatalf("%s: Open = %q, %v", what, pt, err)
		}
	}
	step("first: the clock", 1_700_000_000_000)
	step("stalled clock", 1_700_000_000_001)
	step("still stalled", 1_700_000_000_002)
	c.t = c.t.Add(-time.Second)
	step("clock stepped back", 1_700_000_000_003)
	c.t = time.UnixMilli(1_700_000_000_010)
	step("clock ahead again", 1_700_000_000_010)
	c.t = time.UnixMilli(-5) // before 1970: counting still goes on
	step("clock before 1970", 1_700_000_000_011)
}

func TestSignalFirstCounterNeverZero(t *testing.T) {
	c := &clock{time.Unix(0, 0)}
	snd, _ := signalPair(t, c, c)
	if seq, ok := link.Sequence(snd.Seal(nil, nil)); !ok || seq != 1 {
		t.Fatalf("counter at the epoch = %d, %v; want 1", seq, ok)
	}
}

func TestSignalReceiverSkew(t *testing.T) {
	base := time.UnixMilli(1_700_000_000_000)
	for _, c := range []struct {
		name string
		skew time.Duration // sender's clock minus the receiver's
		want error
	}{
		{"same clock", 0, nil},
		{"5 min ahead", 5 * time.Minute, nil},
		{"5 min behind", -5 * time.Minute, nil},
		{"5 min 1 ms ahead", 5*time.Minute + time.Millisecond, link.ErrStale},
		{"5 min 1 ms behind", -5*time.Minute - time.Millisecond, link.ErrStale},
		{"a year behind", -365 * 24 * time.Hour, link.ErrStale},
	} {
		sc := &clock{base.Add(c.skew)}
		rc := &clock{base}
		snd, rcv := signalPair(t, sc, rc)
		f := snd.Seal(nil, []byte("x"))
		if _, err := rcv.Open(nil, f); !errors.Is(err, c.want) || (c.want == nil && err != nil) {
			t.Errorf("%s: Open = %v, want %v", c.name, err, c.want)
		}
		if c.want != nil && rcv.Last() != 0 {
			t.Errorf("%s: a stale frame moved Last to %d", c.name, rcv.Last())
		}
	}
}

func TestSignalReceiverReplay(t *testing.T) {
	c := &clock{time.UnixMilli(1_700_000_000_000)}
	snd, rcv := signalPair(t, c, c)
	f1 := snd.Seal(nil, []byte("1"))
	f2 := snd.Seal(nil, []byte("2"))
	f3 := snd.Seal(nil, []byte("3"))
	if _, err := rcv.Open(nil, f2); err != nil {
		t.Fatal(err)
	}
	if _, err := rcv.Open(nil, f2); !errors.Is(err, link.ErrReplay) {
		t.Fatalf("f2 again: %v, want ErrReplay", err)
	}
	// Signal frames are not reordered: one below the last accepted is dropped.
	if _, err := rcv.Open(nil, f1); !errors.Is(err, link.ErrReplay) {
		t.Fatalf("f1 after f2: %v, want ErrReplay", err)
	}
	bad := append([]byte(nil), f3...)
	bad[len(bad)-1] ^= 1
	if _, err := rcv.Open(nil, bad); !errors.Is(err, link.ErrBadTag) {
		t.Fatalf("bad tag: %v", err)
	}
	if pt, err := rcv.Open(nil, f3); err != nil || string(pt) != "3" {
		t.Fatalf("f3 after a forged f3: %q, %v", pt, err)
	}
	// A frame under the other direction's key does not open.
	l, _ := link.New()
	other, _ := link.NewSignalSender(l.SignalKey(link.C2P), c.now)
	c.t = c.t.Add(time.Second)
	if _, err := rcv.Open(nil, other.Seal(nil, []byte("x"))); !errors.Is(err, link.ErrBadTag) {
		t.Fatalf("other key: %v", err)
	}
}

func TestSignalAllocs(t *testing.T) {
	c := &clock{time.UnixMilli(1_700_000_000_000)}
	snd, rcv := signalPair(t, c, c)
	msg := make([]byte, 256)
	frame := make([]byte, 0, len(msg)+link.Overhead)
	out := make([]byte, 0, len(msg))
	if n := testing.AllocsPerRun(200, func() {
		frame = snd.Seal(frame[:0], msg)
		if _, err := rcv.Open(out[:0], frame); err != nil {
			t.Fatal(err)
		}
	}); n != 0 {
		t.Errorf("signal Seal+Open: %v allocs/op, want 0", n)
	}
}
