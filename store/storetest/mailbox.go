package storetest

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"edgerelay/store"
)

// MailboxOptions select the optional parts of the mailbox contract. The
// zero value is the spec; each flag declares a departure a backend
// documents, and skips the strict case that would fail on it.
type MailboxOptions struct {
	// Concurrent: run the cases where calls race on one mailbox through
	// every handle at once (claims, same-seq puts, puts against the count
	// and burst bounds). A backend's answers must stay exact under them
	// (the cluster: writers on several nodes). Off for a backend whose
	// handler serializes a mailbox's calls before the store sees them.
	Concurrent bool
	// CoalescedHeartbeats: a 204 claim within TouchEvery of the stored
	// last activity writes nothing, so the idle timer runs from the stored
	// value and a mailbox can expire up to TouchEvery before RELAY_IDLE
	// has passed since its last claim (mailboxjs).
	CoalescedHeartbeats bool
	// HeadCaps: a direction whose stored sequences are spread widely is
	// full (507) before it holds MaxStored envelopes, because its stored
	// set has a byte cap (mailboxjs: 146 envelopes when each is 2^40 above
	// the last).
	HeadCaps bool
	// PerDirectionEnvelopeBucket: the envelope bucket is per direction
	// rather than per mailbox (mailboxjs keeps it in each direction's
	// head), so a mailbox whose two sides both write gets twice the rate.
	PerDirectionEnvelopeBucket bool
}

// MailboxEnvelope is a well-formed envelope of seq carrying body.
func MailboxEnvelope(seq uint64, body string) []byte {
	e := []byte{1}
	e = binary.BigEndian.AppendUint64(e, seq)
	e = append(e, body...)
	return append(e, make([]byte, 16)...) // the tag's room
}

// MailboxTestLimits are limits the contract runs fast with: the spec's,
// but with the stored bounds small enough to fill at their edge.
func MailboxTestLimits() store.MailboxLimits {
	l := store.DefaultMailboxLimits()
	l.MaxStored, l.MaxStoredBytes = 300, 2<<20
	return l.WithDefaults()
}

// mbxLarge is the size of the contract's large envelopes (the spec's
// largest envelope).
const mbxLarge = 64 << 10

// checkMailboxLimits refuses limits the cases cannot run at their edges
// in seconds.
func checkMailboxLimits(t *testing.T, l store.MailboxLimits) {
	t.Helper()
	switch {
	case l.MaxStored < 300 || l.MaxStored > 1000:
		t.Fatalf("storetest: MaxStored %d: the contract needs 300 to 1000", l.MaxStored)
	case l.MaxStoredBytes < 20*mbxLarge || l.MaxStoredBytes > 4<<20:
		t.Fatalf("storetest: MaxStoredBytes %d: the contract needs 1.25 to 4 MiB", l.MaxStoredBytes)
	case l.EnvelopeBurst > l.MaxStored || l.PushBurst > l.EnvelopeBurst:
		t.Fatalf("storetest: bursts %d and %d: the contract needs push <= envelope <= MaxStored", l.PushBurst, l.EnvelopeBurst)
	case l.TouchEvery < 2 || l.TouchEvery >= l.Idle:
		t.Fatalf("storetest: TouchEvery %v against Idle %v", l.TouchEvery, l.Idle)
	}
}

// Mailbox runs the contract of store.Mailboxes. handles are views of one
// shared state (single node: the same object N times; the cluster: one
// per node), all made with lim; the calls of each case go through the
// handles in turn and results are read back through every handle. Time
// is the suite's own (now starts at a fixed instant and moves only as a
// case says), so the backends must take every time from their callers.
// Every case uses its own mailbox names, so the state needs no reset;
// ExpireIdle runs last, as it erases every mailbox idle at its now.
//
// A cluster backend may learn of an erase or a takeover on another node a
// moment later (its caches): the cases that read such a change through
// another handle poll for it, with a deadline.
func Mailbox(t *testing.T, handles []store.Mailboxes, lim store.MailboxLimits, opt MailboxOptions) {
	lim = lim.WithDefaults()
	checkMailboxLimits(t, lim)
	s := &mbxSuite{r: &rotor[store.Mailboxes]{hs: handles}, hs: handles, n: len(handles), lim: lim, t0: time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC).UnixNano()}
	idle, touchEvery := int64(lim.Idle), int64(lim.TouchEvery)
	t0 := s.t0
	tokA, tokB := hash("mbx-token-a"), hash("mbx-token-b")
	body := mbxBody

	t.Run("ClaimAndOpen", func(t *testing.T) {
		c := s.box(t, "ct/claim1", tokA)
		for _, h := range s.hs {
			c.openIs(h, tokA, t0, store.ErrNotFound)
		}
		c.claimIs(s.r.next(), tokA, t0, store.ClaimCreated)
		for _, h := range s.hs {
			c.claimIs(h, tokA, t0+1, store.ClaimSame)
			c.claimIs(h, tokB, t0+1, store.ClaimTaken)
		}
		for _, h := range s.hs {
			c.openIs(h, tokA, t0+2, nil)
			c.openIs(h, tokB, t0+2, store.ErrForbidden)
			c.openIs(h, tokA, t0+2, nil) // a refused Open changed nothing
		}
		if got := c.open(s.r.next(), t0).Name(); got != "ct/claim1" {
			t.Fatalf("Name: %q", got)
		}
		// Names the relay never makes are no mailbox.
		for _, name := range []string{"ct", "ct/", "/x", "ct/a/b", "ct/a.b", "ct/a*"} {
			if _, err := s.r.next().Open(s.ctx(t), []byte(name), tokA, t0); !errors.Is(err, store.ErrNotFound) {
				t.Fatalf("Open of %q: %v", name, err)
			}
		}
		// The name may be the caller's scratch buffer.
		buf := []byte("ct/claim2")
		if o, err := s.r.next().Claim(s.ctx(t), buf, tokA, t0); err != nil || o != store.ClaimCreated {
			t.Fatalf("claim: %v %v", o, err)
		}
		h, err := s.r.next().Open(s.ctx(t), buf, tokA, t0)
		if err != nil {
			t.Fatal(err)
		}
		copy(buf, "xx/xxxxxx")
		if h.Name() != "ct/claim2" {
			t.Fatalf("Name after the caller's buffer changed: %q", h.Name())
		}
		h.Release()
	})

	t.Run("ClaimOfAnIdleMailbox", func(t *testing.T) {
		c := s.box(t, "ct/idle1", tokA)
		c.claimIs(s.r.next(), tokA, t0, store.ClaimCreated)
		writer := s.r.next() // it wrote, so it may keep the head
		c.putAt(writer, store.DirP2C, 1, body(1), t0, store.PutCreated)
		if err := c.open(s.r.next(), t0).SetPushRegistration(s.ctx(t), store.DirC2P, []byte("sealed")); err != nil {
			t.Fatal(err)
		}
		// At exactly idle it is alive; one nanosecond past it is gone.
		for _, h := range s.hs {
			c.openIs(h, tokA, t0+idle, nil)
		}
		c.claimIs(s.r.next(), tokB, t0+idle, store.ClaimTaken)
		for _, h := range s.hs {
			c.openIs(h, tokA, t0+idle+1, store.ErrNotFound)
			c.openIs(h, tokB, t0+idle+1, store.ErrNotFound)
		}
		c.claimIs(s.r.next(), tokB, t0+idle+1, store.ClaimCreated)
		c.tok = tokB
		for _, h := range s.hs {
			c.eventually(func() error { return c.openErr(h, tokA, t0+idle+1, store.ErrForbidden) })
			m := c.openAt(h, t0+idle+1)
			if got := c.scan(m, store.DirP2C, 0, nil); len(got) != 0 {
				t.Fatalf("the old holder's envelopes survived: %v", got)
			}
			if _, err := m.PushRegistration(s.ctx(t), store.DirC2P); !errors.Is(err, store.ErrNotFound) {
				t.Fatalf("the old holder's registration survived: %v", err)
			}
		}
		c.stateIs(store.DirP2C, store.DirectionState{})
		c.putAt(writer, store.DirP2C, 1, MailboxEnvelope(1, "new holder"), t0+idle+1, store.PutCreated)
		c.envelopeIs(store.DirP2C, 1, MailboxEnvelope(1, "new holder"))

		// Its own holder, back after idle, gets a new mailbox too.
		c = s.box(t, "ct/idle3", tokA)
		c.claimIs(s.r.next(), tokA, t0, store.ClaimCreated)
		c.putAt(writer, store.DirC2P, 1, body(1), t0, store.PutCreated)
		c.claimIs(s.r.next(), tokA, t0+idle+1, store.ClaimCreated)
		c.now = t0 + idle + 1
		c.envelopeIs(store.DirC2P, 1, nil)
		c.stateIs(store.DirC2P, store.DirectionState{})
		c.putAt(writer, store.DirC2P, 1, MailboxEnvelope(1, "again"), t0+idle+1, store.PutCreated)

		// A write keeps a mailbox alive, through every node.
		c = s.box(t, "ct/idle2", tokA)
		c.claimIs(s.r.next(), tokA, t0, store.ClaimCreated)
		c.putAt(s.r.next(), store.DirC2P, 1, body(1), t0+idle, store.PutCreated)
		c.claimIs(s.r.next(), tokB, t0+idle+1, store.ClaimTaken)
		for _, h := range s.hs {
			c.openIs(h, tokA, t0+2*idle, nil)
			c.openIs(h, tokA, t0+2*idle+1, store.ErrNotFound)
		}
		// A heartbeat TouchEvery after the write moves it on again.
		c.claimIs(s.r.next(), tokA, t0+idle+touchEvery, store.ClaimSame)
		for _, h := range s.hs {
			c.openIs(h, tokA, t0+2*idle+touchEvery, nil)
			c.openIs(h, tokA, t0+2*idle+touchEvery+1, store.ErrNotFound)
		}
	})

	t.Run("HeartbeatRestartsIdle", func(t *testing.T) {
		if opt.CoalescedHeartbeats {
			t.Skip("the backend coalesces heartbeats within TouchEvery")
		}
		// "204 … restarts the idle timer": idle runs from the last claim,
		// however soon after the one before it came.
		c := s.box(t, "ct/heartbeat1", tokA)
		c.claimIs(s.r.next(), tokA, t0, store.ClaimCreated)
		t1 := t0 + touchEvery/2
		c.claimIs(s.r.next(), tokA, t1, store.ClaimSame)
		for _, h := range s.hs {
			c.openIs(h, tokA, t1+idle, nil)
		}
		c.claimIs(s.r.next(), tokB, t1+idle, store.ClaimTaken)
		c.claimIs(s.r.next(), tokB, t1+idle+1, store.ClaimCreated)
	})

	t.Run("HeartbeatAtTouchEvery", func(t *testing.T) {
		// Even coalesced, a heartbeat TouchEvery after the claim moves the
		// idle timer, seen through every node.
		c := s.box(t, "ct/heartbeat2", tokA)
		c.claimIs(s.r.next(), tokA, t0, store.ClaimCreated)
		t1 := t0 + touchEvery
		c.claimIs(s.r.next(), tokA, t1, store.ClaimSame)
		for _, h := range s.hs {
			c.openIs(h, tokA, t1+idle, nil)
		}
		c.claimIs(s.r.next(), tokB, t1+idle, store.ClaimTaken)
		c.claimIs(s.r.next(), tokB, t1+idle+1, store.ClaimCreated)
	})

	t.Run("PutOutcomes", func(t *testing.T) {
		c := s.box(t, "ct/put1", tokA)
		c.claimIs(s.r.next(), tokA, t0, store.ClaimCreated)
		c.stateIs(store.DirP2C, store.DirectionState{})
		if res := c.put(s.r.next(), store.DirP2C, 1, body(1), store.PutCreated); res.Push {
			t.Fatal("a put without notify pushes")
		}
		for _, h := range s.hs {
			c.put(h, store.DirP2C, 1, body(1), store.PutRetry)
			c.put(h, store.DirP2C, 1, MailboxEnvelope(1, "other"), store.PutConflict)
		}
		c.envelopeIs(store.DirP2C, 1, body(1))
		c.stateIs(store.DirP2C, store.DirectionState{Count: 1, Bytes: mbxSizes(1), First: 1, Last: 1})
		// The other direction is its own.
		c.stateIs(store.DirC2P, store.DirectionState{})
		c.envelopeIs(store.DirC2P, 1, nil)
		c.put(s.r.next(), store.DirC2P, 1, MailboxEnvelope(1, "c2p"), store.PutCreated)
		c.envelopeIs(store.DirC2P, 1, MailboxEnvelope(1, "c2p"))
		c.envelopeIs(store.DirP2C, 1, body(1))
		// AppendEnvelope appends.
		out, ok, err := c.open(s.r.next(), t0).AppendEnvelope(s.ctx(t), []byte("prefix"), store.DirP2C, 1)
		if err != nil || !ok || !bytes.Equal(out, append([]byte("prefix"), body(1)...)) {
			t.Fatalf("AppendEnvelope: %q %v %v", out, ok, err)
		}
		out, ok, err = c.open(s.r.next(), t0).AppendEnvelope(s.ctx(t), []byte("prefix"), store.DirP2C, 2)
		if err != nil || ok || string(out) != "prefix" {
			t.Fatalf("AppendEnvelope of none: %q %v %v", out, ok, err)
		}
	})

	t.Run("OutOfOrder", func(t *testing.T) {
		c := s.box(t, "ct/ooo1", tokA)
		c.claimIs(s.r.next(), tokA, t0, store.ClaimCreated)
		for _, seq := range []uint64{1, 2, 5, 3} { // 3 below the max
			c.put(s.r.next(), store.DirC2P, seq, body(seq), store.PutCreated)
		}
		c.stateIs(store.DirC2P, store.DirectionState{Count: 4, Bytes: mbxSizes(1, 2, 3, 5), First: 1, Last: 5})
		c.envelopeIs(store.DirC2P, 3, body(3))
		c.envelopeIs(store.DirC2P, 4, nil)
		for _, h := range s.hs {
			if got := c.scan(c.open(h, t0), store.DirC2P, 0, nil); !slices.Equal(got, []uint64{1, 2, 3, 5}) {
				t.Fatalf("scan %v", got)
			}
		}
		c.put(s.r.next(), store.DirC2P, 3, body(3), store.PutRetry)
		c.put(s.r.next(), store.DirC2P, 3, MailboxEnvelope(3, "other"), store.PutConflict)
		c.put(s.r.next(), store.DirC2P, 4, body(4), store.PutCreated)
		c.stateIs(store.DirC2P, store.DirectionState{Count: 5, Bytes: mbxSizes(1, 2, 3, 4, 5), First: 1, Last: 5})
		if got := c.scan(c.open(s.r.next(), t0), store.DirC2P, 2, nil); !slices.Equal(got, []uint64{3, 4, 5}) {
			t.Fatalf("scan after 2: %v", got)
		}
		// A hole far below the max, then the max moves on.
		for _, seq := range []uint64{9, 7, 10} {
			c.put(s.r.next(), store.DirC2P, seq, body(seq), store.PutCreated)
		}
		if got := c.scan(c.open(s.r.next(), t0), store.DirC2P, 4, nil); !slices.Equal(got, []uint64{5, 7, 9, 10}) {
			t.Fatalf("scan after 4: %v", got)
		}
	})

	t.Run("Limits", func(t *testing.T) {
		// Count: at the bound stored, one past full and nothing stored.
		c := s.box(t, "ct/count1", tokA)
		c.claimIs(s.r.next(), tokA, t0, store.ClaimCreated)
		bound := uint64(lim.MaxStored)
		for seq := uint64(1); seq <= bound; seq++ {
			c.put(s.r.next(), store.DirP2C, seq, body(seq), store.PutCreated)
		}
		for _, h := range s.hs {
			c.put(h, store.DirP2C, bound+1, body(bound+1), store.PutFull)
		}
		c.stateIs(store.DirP2C, store.DirectionState{Count: lim.MaxStored, Bytes: mbxSizeRange(1, bound), First: 1, Last: bound})
		c.envelopeIs(store.DirP2C, bound+1, nil)
		// A full direction still answers retries and conflicts as such.
		c.put(s.r.next(), store.DirP2C, 2, body(2), store.PutRetry)
		c.put(s.r.next(), store.DirP2C, 2, MailboxEnvelope(2, "other"), store.PutConflict)
		// The other direction has its own bound.
		c.put(s.r.next(), store.DirC2P, 1, body(1), store.PutCreated)
		// A prune frees room: one more fits, then full again.
		c.prune(s.r.next(), store.DirP2C, 1)
		c.put(s.r.next(), store.DirP2C, 1, body(1), store.PutPruned) // the mark before 507
		c.put(s.r.next(), store.DirP2C, bound+1, body(bound+1), store.PutCreated)
		c.put(s.r.next(), store.DirP2C, bound+2, body(bound+2), store.PutFull)
		c.stateIs(store.DirP2C, store.DirectionState{Count: lim.MaxStored, Bytes: mbxSizeRange(2, bound+1), First: 2, Last: bound + 1, Pruned: 1})

		// Bytes: exactly at the bound stored; one byte past full (the
		// smallest envelope is 25 bytes, so 24 short of the bound).
		for _, room := range []int{0, 24} {
			c = s.box(t, fmt.Sprint("ct/bytes", room), tokA)
			c.claimIs(s.r.next(), tokA, t0, store.ClaimCreated)
			last := c.fill(store.DirC2P, lim.MaxStoredBytes-room)
			for _, h := range s.hs {
				c.put(h, store.DirC2P, last+1, mbxSized(last+1, 25), store.PutFull)
			}
			c.stateIs(store.DirC2P, store.DirectionState{Count: int(last), Bytes: lim.MaxStoredBytes - room, First: 1, Last: last})
			// A prune frees exactly what it removed.
			c.prune(s.r.next(), store.DirC2P, 1)
			first := mbxSized(1, min(mbxLarge, lim.MaxStoredBytes-room))
			c.put(s.r.next(), store.DirC2P, last+1, mbxSized(last+1, len(first)+room+1), store.PutFull)
			c.put(s.r.next(), store.DirC2P, last+1, mbxSized(last+1, len(first)+room), store.PutCreated)
			c.stateIs(store.DirC2P, store.DirectionState{Count: int(last), Bytes: lim.MaxStoredBytes, First: 2, Last: last + 1, Pruned: 1})
		}
	})

	t.Run("LimitsWhateverTheSpacing", func(t *testing.T) {
		if opt.HeadCaps {
			t.Skip("the backend caps the stored set's encoding")
		}
		// MaxStored envelopes fit however far apart their sequences are.
		c := s.box(t, "ct/spread1", tokA)
		c.claimIs(s.r.next(), tokA, t0, store.ClaimCreated)
		n, gap := uint64(lim.MaxStored), uint64(1)<<40
		for i := uint64(1); i <= n; i++ {
			c.put(s.r.next(), store.DirP2C, i*gap, body(i*gap), store.PutCreated)
		}
		c.put(s.r.next(), store.DirP2C, (n+1)*gap, body((n+1)*gap), store.PutFull)
		if st := c.state(s.r.next(), store.DirP2C); st.Count != lim.MaxStored || st.First != gap || st.Last != n*gap {
			t.Fatalf("state %+v", st)
		}
	})

	t.Run("Scan", func(t *testing.T) {
		c := s.box(t, "ct/scan1", tokA)
		c.claimIs(s.r.next(), tokA, t0, store.ClaimCreated)
		for seq := uint64(1); seq <= 12; seq++ {
			if seq != 6 {
				c.put(s.r.next(), store.DirP2C, seq, body(seq), store.PutCreated)
			}
		}
		c.put(s.r.next(), store.DirP2C, 6, body(6), store.PutCreated) // below the max
		all := []uint64{1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12}
		for _, after := range []uint64{0, 1, 5, 6, 11, 12, 100} {
			want := all[min(int(after), len(all)):]
			if got := c.scan(c.open(s.r.next(), t0), store.DirP2C, after, nil); !slices.Equal(got, want) {
				t.Fatalf("scan after %d: %v, want %v", after, got, want)
			}
		}
		// fn stops it at once.
		var got []uint64
		err := c.open(s.r.next(), t0).Scan(s.ctx(t), store.DirP2C, 2, func(seq uint64, env []byte) bool {
			got = append(got, seq)
			return len(got) < 3
		})
		if err != nil || !slices.Equal(got, []uint64{3, 4, 5}) {
			t.Fatalf("stopped scan: %v %v", got, err)
		}
		if got := c.scan(c.open(s.r.next(), t0), store.DirC2P, 0, nil); len(got) != 0 {
			t.Fatalf("empty direction: %v", got)
		}
		for _, seq := range []uint64{1, 6, 12} {
			c.hasIs(store.DirP2C, seq, true)
		}
		for _, seq := range []uint64{0, 13, 1 << 40} {
			c.hasIs(store.DirP2C, seq, false)
		}
	})

	t.Run("ScanLongAndLarge", func(t *testing.T) {
		// More envelopes than one read returns, and envelopes whose sum is
		// over a read's byte bound.
		c := s.box(t, "ct/scan2", tokA)
		c.claimIs(s.r.next(), tokA, t0, store.ClaimCreated)
		const many = 300
		want := make([]uint64, many)
		for i := range want {
			want[i] = uint64(i + 1)
			c.put(s.r.next(), store.DirP2C, want[i], body(want[i]), store.PutCreated)
		}
		for _, after := range []uint64{0, 255, 256, 299} {
			if got := c.scan(c.open(s.r.next(), t0), store.DirP2C, after, nil); !slices.Equal(got, want[after:]) {
				t.Fatalf("scan after %d: %d envelopes, want %d", after, len(got), many-int(after))
			}
		}
		large := func(seq uint64) []byte { return mbxSized(seq, mbxLarge) }
		for seq := uint64(1); seq <= 20; seq++ {
			c.put(s.r.next(), store.DirC2P, seq, large(seq), store.PutCreated)
		}
		c.stateIs(store.DirC2P, store.DirectionState{Count: 20, Bytes: 20 * mbxLarge, First: 1, Last: 20})
		if got := c.scan(c.open(s.r.next(), t0), store.DirC2P, 3, large); len(got) != 17 || got[0] != 4 || got[16] != 20 {
			t.Fatalf("scan of large envelopes: %v", got)
		}
	})

	t.Run("StateAndPrune", func(t *testing.T) {
		c := s.box(t, "ct/prune1", tokA)
		c.claimIs(s.r.next(), tokA, t0, store.ClaimCreated)
		for _, seq := range []uint64{1, 2, 3, 5, 6, 4} {
			c.put(s.r.next(), store.DirP2C, seq, body(seq), store.PutCreated)
		}
		c.stateIs(store.DirP2C, store.DirectionState{Count: 6, Bytes: mbxSizes(1, 2, 3, 4, 5, 6), First: 1, Last: 6})
		c.prune(s.r.next(), store.DirP2C, 0) // removes nothing
		c.stateIs(store.DirP2C, store.DirectionState{Count: 6, Bytes: mbxSizes(1, 2, 3, 4, 5, 6), First: 1, Last: 6})
		// Through 4: the out-of-order 4 and the in-order ones below it go.
		c.prune(s.r.next(), store.DirP2C, 4)
		c.stateIs(store.DirP2C, store.DirectionState{Count: 2, Bytes: mbxSizes(5, 6), First: 5, Last: 6, Pruned: 4})
		for _, h := range s.hs {
			if got := c.scan(c.open(h, t0), store.DirP2C, 0, nil); !slices.Equal(got, []uint64{5, 6}) {
				t.Fatalf("scan after prune: %v", got)
			}
		}
		for _, seq := range []uint64{1, 4} {
			c.envelopeIs(store.DirP2C, seq, nil)
			c.hasIs(store.DirP2C, seq, false)
			c.put(s.r.next(), store.DirP2C, seq, body(seq), store.PutPruned)
		}
		// A lower mark does not lower it.
		c.prune(s.r.next(), store.DirP2C, 2)
		c.stateIs(store.DirP2C, store.DirectionState{Count: 2, Bytes: mbxSizes(5, 6), First: 5, Last: 6, Pruned: 4})
		c.put(s.r.next(), store.DirP2C, 3, body(3), store.PutPruned)
		c.put(s.r.next(), store.DirP2C, 7, body(7), store.PutCreated)
		// Past the last: empty, and the mark holds above it.
		c.prune(s.r.next(), store.DirP2C, 100)
		c.stateIs(store.DirP2C, store.DirectionState{Pruned: 100})
		c.put(s.r.next(), store.DirP2C, 50, body(50), store.PutPruned)
		c.put(s.r.next(), store.DirP2C, 100, body(100), store.PutPruned)
		c.put(s.r.next(), store.DirP2C, 101, body(101), store.PutCreated)
		c.stateIs(store.DirP2C, store.DirectionState{Count: 1, Bytes: mbxSizes(101), First: 101, Last: 101, Pruned: 100})
		// A direction never written keeps a mark too.
		c.prune(s.r.next(), store.DirC2P, 5)
		c.stateIs(store.DirC2P, store.DirectionState{Pruned: 5})
		c.put(s.r.next(), store.DirC2P, 5, body(5), store.PutPruned)
		c.put(s.r.next(), store.DirC2P, 6, body(6), store.PutCreated)
		c.stateIs(store.DirC2P, store.DirectionState{Count: 1, Bytes: mbxSizes(6), First: 6, Last: 6, Pruned: 5})
	})

	t.Run("PruneSeenByTheWriter", func(t *testing.T) {
		// A handle that wrote (and may keep the head) answers from the
		// prune another handle made.
		c := s.box(t, "ct/stale1", tokA)
		c.claimIs(s.r.next(), tokA, t0, store.ClaimCreated)
		writer := s.r.next()
		for seq := uint64(1); seq <= 3; seq++ {
			c.put(writer, store.DirP2C, seq, body(seq), store.PutCreated)
		}
		c.prune(s.r.next(), store.DirP2C, 2)
		c.put(writer, store.DirP2C, 2, body(2), store.PutPruned)
		c.put(writer, store.DirP2C, 1, MailboxEnvelope(1, "other"), store.PutPruned)
		c.put(writer, store.DirP2C, 3, body(3), store.PutRetry)
		c.hasIs(store.DirP2C, 2, false)
	})

	t.Run("PruneKeepingAnOutOfOrderFirst", func(t *testing.T) {
		// The first envelope kept was written below the max: the bytes
		// freed still come out exact.
		c := s.box(t, "ct/prune2", tokA)
		c.claimIs(s.r.next(), tokA, t0, store.ClaimCreated)
		for _, seq := range []uint64{1, 2, 8, 3, 5, 4, 9} { // 3, 4, 5 out of order
			c.put(s.r.next(), store.DirC2P, seq, body(seq), store.PutCreated)
		}
		c.prune(s.r.next(), store.DirC2P, 2)
		c.stateIs(store.DirC2P, store.DirectionState{Count: 5, Bytes: mbxSizes(3, 4, 5, 8, 9), First: 3, Last: 9, Pruned: 2})
		c.prune(s.r.next(), store.DirC2P, 6) // through a hole
		c.stateIs(store.DirC2P, store.DirectionState{Count: 2, Bytes: mbxSizes(8, 9), First: 8, Last: 9, Pruned: 6})
		c.put(s.r.next(), store.DirC2P, 7, body(7), store.PutCreated)
		c.stateIs(store.DirC2P, store.DirectionState{Count: 3, Bytes: mbxSizes(7, 8, 9), First: 7, Last: 9, Pruned: 6})
		if got := c.scan(c.open(s.r.next(), t0), store.DirC2P, 0, nil); !slices.Equal(got, []uint64{7, 8, 9}) {
			t.Fatalf("scan: %v", got)
		}
		c.prune(s.r.next(), store.DirC2P, 8) // the out-of-order 7 and the in-order 8
		c.stateIs(store.DirC2P, store.DirectionState{Count: 1, Bytes: mbxSizes(9), First: 9, Last: 9, Pruned: 8})
	})

	t.Run("Erase", func(t *testing.T) {
		c := s.box(t, "ct/erase1", tokA)
		c.claimIs(s.r.next(), tokA, t0, store.ClaimCreated)
		writer := s.r.next() // it wrote last, so it may keep the head
		held := c.open(writer, t0)
		for seq := uint64(1); seq <= 3; seq++ {
			c.put(writer, store.DirP2C, seq, body(seq), store.PutCreated)
			c.put(writer, store.DirC2P, seq, body(seq), store.PutCreated)
		}
		c.prune(writer, store.DirC2P, 2)
		for _, dir := range []byte{store.DirP2C, store.DirC2P} {
			if err := held.SetPushRegistration(s.ctx(t), dir, []byte("sealed")); err != nil {
				t.Fatal(err)
			}
		}
		if err := c.open(s.r.next(), t0).Erase(s.ctx(t)); err != nil {
			t.Fatal(err)
		}
		// Through a handle opened before: nothing is there.
		for _, dir := range []byte{store.DirP2C, store.DirC2P} {
			if _, err := held.PushRegistration(s.ctx(t), dir); !errors.Is(err, store.ErrNotFound) {
				t.Fatalf("registration %c after erase: %v", dir, err)
			}
			if got := c.scan(held, dir, 0, nil); len(got) != 0 {
				t.Fatalf("scan %c after erase: %v", dir, got)
			}
			if st, err := held.State(s.ctx(t), dir); err != nil || st != (store.DirectionState{}) {
				t.Fatalf("state %c after erase: %+v %v", dir, st, err)
			}
			if ok, err := held.HasEnvelope(s.ctx(t), dir, 3); err != nil || ok {
				t.Fatalf("HasEnvelope %c after erase: %v %v", dir, ok, err)
			}
			for _, seq := range []uint64{1, 4} {
				if res, err := held.Put(s.ctx(t), dir, seq, body(seq), false, t0); err != nil || res.Outcome != store.PutNoMailbox {
					t.Fatalf("put %c %d after erase: %+v %v", dir, seq, res, err)
				}
			}
		}
		for _, h := range s.hs {
			c.eventually(func() error { return c.openErr(h, tokA, t0, store.ErrNotFound) })
		}
		if err := held.Erase(s.ctx(t)); err != nil {
			t.Fatalf("erase of an erased mailbox: %v", err)
		}
		// A new claim starts empty: no mark, no envelopes, any bytes.
		c.claimIs(s.r.next(), tokB, t0, store.ClaimCreated)
		c.tok = tokB
		fresh := func(seq uint64) []byte { return MailboxEnvelope(seq, "fresh") }
		c.put(writer, store.DirP2C, 1, fresh(1), store.PutCreated)
		c.put(writer, store.DirC2P, 1, fresh(1), store.PutCreated)
		c.envelopeIs(store.DirP2C, 1, fresh(1))
		c.stateIs(store.DirC2P, store.DirectionState{Count: 1, Bytes: len(fresh(1)), First: 1, Last: 1})
		if got := c.scan(c.open(s.r.next(), t0), store.DirP2C, 0, fresh); !slices.Equal(got, []uint64{1}) {
			t.Fatalf("scan after the new claim: %v", got)
		}
	})

	t.Run("PushRegistration", func(t *testing.T) {
		c := s.box(t, "ct/push1", tokA)
		c.claimIs(s.r.next(), tokA, t0, store.ClaimCreated)
		regIs := func(t *testing.T, dir byte, want string) {
			t.Helper()
			for _, h := range s.hs {
				got, err := c.open(h, t0).PushRegistration(s.ctx(t), dir)
				if want == "" {
					if !errors.Is(err, store.ErrNotFound) {
						t.Fatalf("registration %c: %q %v, want none", dir, got, err)
					}
					continue
				}
				if err != nil || string(got) != want {
					t.Fatalf("registration %c: %q %v, want %q", dir, got, err, want)
				}
			}
		}
		reg := func(dir byte, v string) {
			t.Helper()
			if err := c.open(s.r.next(), t0).SetPushRegistration(s.ctx(t), dir, []byte(v)); err != nil {
				t.Fatal(err)
			}
		}
		drop := func(dir byte, sent string, want bool) {
			t.Helper()
			if ok, err := c.open(s.r.next(), t0).DropPushRegistration(s.ctx(t), dir, []byte(sent)); err != nil || ok != want {
				t.Fatalf("drop %c of %q: %v %v, want %v", dir, sent, ok, err, want)
			}
		}
		regIs(t, store.DirC2P, "")
		for _, v := range []string{"one", "two"} { // the second replaces the first
			reg(store.DirC2P, v)
			regIs(t, store.DirC2P, v)
		}
		reg(store.DirP2C, "p")
		if err := c.open(s.r.next(), t0).DeletePushRegistration(s.ctx(t), store.DirC2P); err != nil {
			t.Fatal(err)
		}
		regIs(t, store.DirC2P, "")
		regIs(t, store.DirP2C, "p")
		if err := c.open(s.r.next(), t0).DeletePushRegistration(s.ctx(t), store.DirC2P); err != nil {
			t.Fatalf("delete of no registration: %v", err)
		}
		// Drop removes only what was sent: a newer registration stays.
		drop(store.DirC2P, "one", false) // none
		reg(store.DirC2P, "three")
		drop(store.DirC2P, "two", false)
		regIs(t, store.DirC2P, "three")
		drop(store.DirC2P, "three", true)
		regIs(t, store.DirC2P, "")
		drop(store.DirC2P, "three", false)
		reg(store.DirC2P, "four") // a registration after a drop
		regIs(t, store.DirC2P, "four")
		regIs(t, store.DirP2C, "p")
	})

	t.Run("RateBuckets", func(t *testing.T) {
		c := s.box(t, "ct/rate1", tokA)
		c.claimIs(s.r.next(), tokA, t0, store.ClaimCreated)
		burst, every := uint64(lim.EnvelopeBurst), lim.EnvelopeEvery
		pushes := 0
		for seq := uint64(1); seq <= burst; seq++ {
			res := c.putNotify(s.r.next(), store.DirP2C, seq, body(seq), true, t0, store.PutCreated)
			if res.Push {
				pushes++
			}
			if res.Push != (seq <= uint64(lim.PushBurst)) {
				t.Fatalf("seq %d: push %v with a push burst of %d", seq, res.Push, lim.PushBurst)
			}
		}
		for _, h := range s.hs {
			res := c.putNotify(h, store.DirP2C, burst+1, body(burst+1), true, t0, store.PutRateLimited)
			if res.RetryAfter <= 0 || res.RetryAfter > every {
				t.Fatalf("retry after %v, want (0, %v]", res.RetryAfter, every)
			}
		}
		c.stateIs(store.DirP2C, store.DirectionState{Count: int(burst), Bytes: mbxSizeRange(1, burst), First: 1, Last: burst})
		// One token back a moment before every is still none; at every,
		// one in each bucket.
		c.putNotify(s.r.next(), store.DirP2C, burst+1, body(burst+1), true, t0+int64(every)-1, store.PutRateLimited)
		if res := c.putNotify(s.r.next(), store.DirP2C, burst+1, body(burst+1), false, t0+int64(every), store.PutCreated); res.Push {
			t.Fatal("a put without notify pushes")
		}
		c.putNotify(s.r.next(), store.DirP2C, burst+2, body(burst+2), true, t0+int64(every), store.PutRateLimited)
		// The push bucket: at PushEvery one token back, taken by the first
		// notify only.
		tp := t0 + int64(lim.PushEvery) + int64(every)*2
		if res := c.putNotify(s.r.next(), store.DirP2C, burst+2, body(burst+2), true, tp, store.PutCreated); !res.Push {
			t.Fatal("no push with a token back")
		}
		// The other direction: its push bucket is its own; its envelope
		// bucket is the mailbox's (the spec) or its own (declared).
		if opt.PerDirectionEnvelopeBucket {
			if res := c.putNotify(s.r.next(), store.DirC2P, 1, body(1), true, t0, store.PutCreated); !res.Push {
				t.Fatal("c2p: no push from its own bucket")
			}
		} else {
			c.putNotify(s.r.next(), store.DirC2P, 1, body(1), true, t0, store.PutRateLimited)
		}
	})

	t.Run("Watch", func(t *testing.T) {
		c := s.box(t, "ct/watch1", tokA)
		c.claimIs(s.r.next(), tokA, t0, store.ClaimCreated)
		for seq := uint64(1); seq <= 3; seq++ {
			c.put(s.r.next(), store.DirP2C, seq, body(seq), store.PutCreated)
		}
		c.put(s.r.next(), store.DirC2P, 1, body(1), store.PutCreated) // not this watch's
		w := c.watch(c.open(s.r.next(), t0), store.DirP2C, 1, nil)
		w.waitFor(t, 2, 3)
		for seq := uint64(4); seq <= 6; seq++ {
			c.put(s.r.next(), store.DirP2C, seq, body(seq), store.PutCreated)
		}
		c.put(s.r.next(), store.DirP2C, 8, body(8), store.PutCreated)
		c.put(s.r.next(), store.DirP2C, 7, body(7), store.PutCreated) // below the max
		c.put(s.r.next(), store.DirP2C, 2, body(2), store.PutRetry)   // nothing new
		c.prune(s.r.next(), store.DirP2C, 3)                          // nothing to deliver
		c.put(s.r.next(), store.DirP2C, 9, body(9), store.PutCreated)
		w.waitFor(t, 2, 3, 4, 5, 6, 8, 7, 9)
		// Erased through another handle: the watch ends with ErrErased.
		if err := c.open(s.r.next(), t0).Erase(s.ctx(t)); err != nil {
			t.Fatal(err)
		}
		if err := w.end(t); !errors.Is(err, store.ErrErased) {
			t.Fatalf("watch after erase: %v", err)
		}
		w.is(t, 2, 3, 4, 5, 6, 8, 7, 9)
	})

	t.Run("WatchEnds", func(t *testing.T) {
		c := s.box(t, "ct/watch2", tokA)
		c.claimIs(s.r.next(), tokA, t0, store.ClaimCreated)
		c.put(s.r.next(), store.DirC2P, 1, body(1), store.PutCreated)
		// stop: nothing more is delivered, End is not called.
		w := c.watch(c.open(s.r.next(), t0), store.DirC2P, 0, nil)
		w.waitFor(t, 1)
		w.stop()
		c.put(s.r.next(), store.DirC2P, 2, body(2), store.PutCreated)
		c.watch(c.open(s.r.next(), t0), store.DirC2P, 1, nil).waitFor(t, 2)
		w.is(t, 1)
		select {
		case err := <-w.done:
			t.Fatalf("End after stop: %v", err)
		default:
		}
		// Deliver's error, for a stored envelope and for a live one.
		boom := errors.New("socket closed")
		for _, after := range []uint64{0, 2} {
			w = c.watch(c.open(s.r.next(), t0), store.DirC2P, after, func(env []byte) error { return boom })
			if after == 2 {
				c.put(s.r.next(), store.DirC2P, 3, body(3), store.PutCreated)
			}
			if err := w.end(t); !errors.Is(err, boom) {
				t.Fatalf("watch after %d with a failing Deliver: %v", after, err)
			}
		}
		// A mailbox erased since Open (and every node told): at once.
		gone := &goneLog{}
		for _, h := range s.hs {
			h.OnGone(gone.add)
		}
		held := c.open(s.r.next(), t0)
		if err := c.open(s.r.next(), t0).Erase(s.ctx(t)); err != nil {
			t.Fatal(err)
		}
		gone.wait(t, c.name, s.n)
		w = c.watch(held, store.DirC2P, 0, nil)
		if err := w.end(t); !errors.Is(err, store.ErrErased) {
			t.Fatalf("watch of an erased mailbox: %v", err)
		}
	})

	t.Run("JoinWatchers", func(t *testing.T) {
		c := s.box(t, "ct/watchers1", tokA)
		c.claimIs(s.r.next(), tokA, t0, store.ClaimCreated)
		var leaves []func()
		t.Cleanup(func() {
			for _, l := range leaves {
				l()
			}
		})
		join := func(h store.Mailboxes, dir byte, want error) {
			t.Helper()
			leave, err := c.open(h, t0).JoinWatchers(s.ctx(t), dir)
			if !errors.Is(err, want) {
				t.Fatalf("join %c with %d held: %v, want %v", dir, len(leaves), err, want)
			}
			if err == nil {
				leaves = append(leaves, leave)
			}
		}
		for range store.MaxWatchers {
			join(s.r.next(), store.DirP2C, nil)
		}
		for _, h := range s.hs {
			join(h, store.DirP2C, store.ErrTooManyWatchers)
		}
		join(s.r.next(), store.DirC2P, nil) // the other direction has its own places
		// leave frees one, once: a second call frees nothing more.
		leaves[3]()
		leaves[3]()
		leaves = slices.Delete(leaves, 3, 4)
		for _, h := range s.hs {
			join(h, store.DirP2C, nil)
			join(h, store.DirP2C, store.ErrTooManyWatchers)
			leaves[len(leaves)-1]()
			leaves = leaves[:len(leaves)-1]
		}
	})

	t.Run("Foreground", func(t *testing.T) {
		c := s.box(t, "ct/fg1", tokA)
		c.claimIs(s.r.next(), tokA, t0, store.ClaimCreated)
		fgIs := func(dir byte, now int64, want bool) {
			t.Helper()
			for _, h := range s.hs {
				m := c.open(h, t0)
				if want {
					// Another node may learn of the watcher a moment late.
					c.eventually(func() error {
						if !m.Foreground(s.ctx(t), dir, now) {
							return fmt.Errorf("%c not in the foreground at %d", dir, now)
						}
						return nil
					})
				} else if m.Foreground(s.ctx(t), dir, now) {
					t.Fatalf("%c in the foreground at %d", dir, now)
				}
			}
		}
		fgIs(store.DirP2C, t0, false)
		wh := s.r.next()
		watcher := c.open(wh, t0)
		leave, err := watcher.JoinWatchers(s.ctx(t), store.DirP2C)
		if err != nil {
			t.Fatal(err)
		}
		defer leave()
		fgIs(store.DirP2C, t0, false) // watching, not yet pinged
		until := t0 + int64(45*time.Second)
		watcher.SetForeground(store.DirP2C, until)
		fgIs(store.DirP2C, until-1, true)
		fgIs(store.DirP2C, until, false)
		fgIs(store.DirC2P, t0, false)
		// A notify through the watcher's node spends no push token while
		// the reader is in the foreground; from until on it pushes.
		if res := c.putNotify(wh, store.DirP2C, 1, body(1), true, until-1, store.PutCreated); !res.Foreground || res.Push {
			t.Fatalf("put for a reader in the foreground: %+v", res)
		}
		if res := c.putNotify(wh, store.DirP2C, 2, body(2), false, until-1, store.PutCreated); res.Foreground || res.Push {
			t.Fatalf("put without notify: %+v", res)
		}
		if res := c.putNotify(wh, store.DirP2C, 3, body(3), true, until, store.PutCreated); res.Foreground || !res.Push {
			t.Fatalf("put for a reader no longer in the foreground: %+v", res)
		}
		watcher.SetForeground(store.DirP2C, t0) // an older mark does not lower it
		fgIs(store.DirP2C, until-1, true)
	})

	t.Run("OnGone", func(t *testing.T) {
		gone := &goneLog{}
		for _, h := range handles {
			h.OnGone(gone.add)
		}
		want := func(name string) {
			t.Helper()
			gone.wait(t, name, len(handles))
		}
		// An erase.
		c := s.box(t, "ct/gone1", tokA)
		c.claimIs(s.r.next(), tokA, t0, store.ClaimCreated)
		c.put(s.r.next(), store.DirP2C, 1, body(1), store.PutCreated)
		if err := c.open(s.r.next(), t0).Erase(s.ctx(t)); err != nil {
			t.Fatal(err)
		}
		want("ct/gone1")
		// A takeover of an idle mailbox: its holder's sockets close too.
		c = s.box(t, "ct/gone2", tokA)
		c.claimIs(s.r.next(), tokA, t0, store.ClaimCreated)
		c.claimIs(s.r.next(), tokB, t0+idle+1, store.ClaimCreated)
		want("ct/gone2")
		if n := gone.count("ct/claim1"); n != 0 {
			t.Fatalf("OnGone of a live mailbox: %d", n)
		}
	})

	if opt.Concurrent {
		t.Run("Racing", func(t *testing.T) { s.racing(t, tokA) })
	}

	t.Run("ExpireIdle", func(t *testing.T) {
		// Last: it erases every mailbox idle at its now.
		gone := &goneLog{}
		s.r.next().OnGone(gone.add)
		te := t0 + 10*idle
		old := s.box(t, "ct/expire1", tokA)
		old.claimIs(s.r.next(), tokA, te-idle-1, store.ClaimCreated)
		edge := s.box(t, "ct/expire2", tokA)
		edge.claimIs(s.r.next(), tokA, te-idle, store.ClaimCreated)
		written := s.box(t, "ct/expire3", tokA)
		written.claimIs(s.r.next(), tokA, te-idle-1, store.ClaimCreated)
		written.putAt(s.r.next(), store.DirC2P, 1, body(1), te-idle, store.PutCreated)
		total := 0
		for _, h := range s.hs {
			n, err := h.ExpireIdle(s.ctx(t), te)
			if err != nil {
				t.Fatal(err)
			}
			total += n
		}
		if total < 1 {
			t.Fatalf("ExpireIdle erased %d", total)
		}
		for _, h := range s.hs {
			n, err := h.ExpireIdle(s.ctx(t), te)
			if err != nil || n != 0 {
				t.Fatalf("ExpireIdle again: %d %v", n, err)
			}
		}
		gone.wait(t, "ct/expire1", 1)
		if n := gone.count("ct/expire2") + gone.count("ct/expire3"); n != 0 {
			t.Fatalf("OnGone of live mailboxes: %d", n)
		}
		for _, h := range s.hs {
			// Gone for every node even at a time it would be alive.
			old.eventually(func() error { return old.openErr(h, tokA, te-idle, store.ErrNotFound) })
			edge.openIs(h, tokA, te, nil)
			written.openIs(h, tokA, te, nil)
		}
		old.claimIs(s.r.next(), tokB, te, store.ClaimCreated)
		old.tok = tokB
		old.stateIs(store.DirP2C, store.DirectionState{})
		written.tok = tokA
		written.now = te
		written.envelopeIs(store.DirC2P, 1, body(1))
	})
}

// racing: every handle at once, several calls each; the store's answers
// are exact as if they came one by one.
func (s *mbxSuite) racing(t *testing.T, tokA store.Hash) {
	t0, body := s.t0, mbxBody
	race := func(n int, call func(i int)) {
		var wg sync.WaitGroup
		for i := range n {
			wg.Go(func() { call(i) })
		}
		wg.Wait()
	}
	const racers = 6
	hs := make([]store.Mailboxes, racers)
	for i := range hs {
		hs[i] = s.r.next()
	}
	count := func(outs []store.PutOutcome, o store.PutOutcome) int {
		n := 0
		for _, x := range outs {
			if x == o {
				n++
			}
		}
		return n
	}
	// One claim wins.
	c := s.box(t, "ct/race1", tokA)
	claims := make([]store.ClaimOutcome, racers)
	race(racers, func(i int) {
		o, err := hs[i].Claim(s.ctx(t), []byte(c.name), hash(fmt.Sprint("race-token-", i)), t0)
		if err != nil {
			t.Errorf("claim %d: %v", i, err)
		}
		claims[i] = o
	})
	winner := slices.Index(claims, store.ClaimCreated)
	if winner < 0 {
		t.Fatalf("claims: %v", claims)
	}
	c.tok = hash(fmt.Sprint("race-token-", winner))
	for i, o := range claims {
		if i != winner && o != store.ClaimTaken {
			t.Fatalf("claims: %v", claims)
		}
	}
	for _, h := range s.hs {
		c.openIs(h, c.tok, t0, nil)
	}
	handles := make([]store.Mailbox, racers)
	for i := range handles {
		handles[i] = c.open(hs[i], t0)
	}
	racePut := func(dir byte, seqOf func(i, j int) uint64, envOf func(i int, seq uint64) []byte, each int, now func(i, j int) int64) []store.PutOutcome {
		outs := make([]store.PutOutcome, racers*each)
		race(racers, func(i int) {
			for j := range each {
				seq := seqOf(i, j)
				res, err := handles[i].Put(s.ctx(t), dir, seq, envOf(i, seq), false, now(i, j))
				if err != nil {
					t.Errorf("put %d: %v", seq, err)
				}
				outs[i*each+j] = res.Outcome
			}
		})
		return outs
	}
	at := func(i, j int) int64 { return t0 }
	// One seq, other bytes: one stored, the rest conflicts.
	outs := racePut(store.DirP2C, func(i, j int) uint64 { return 1 }, func(i int, seq uint64) []byte { return MailboxEnvelope(1, fmt.Sprint("racer", i)) }, 1, at)
	if count(outs, store.PutCreated) != 1 || count(outs, store.PutConflict) != racers-1 {
		t.Fatalf("racing puts of seq 1: %v", outs)
	}
	won := slices.Index(outs, store.PutCreated)
	c.envelopeIs(store.DirP2C, 1, MailboxEnvelope(1, fmt.Sprint("racer", won)))
	// The same bytes: one stored, the rest retries.
	outs = racePut(store.DirP2C, func(i, j int) uint64 { return 2 }, func(i int, seq uint64) []byte { return body(seq) }, 1, at)
	if count(outs, store.PutCreated) != 1 || count(outs, store.PutRetry) != racers-1 {
		t.Fatalf("racing retries of seq 2: %v", outs)
	}
	// Distinct seqs against the envelope burst, on a mailbox no put
	// charged yet: exactly the burst stored.
	c = s.box(t, "ct/race3", tokA)
	c.claimIs(s.r.next(), tokA, t0, store.ClaimCreated)
	for i := range handles {
		handles[i] = c.open(hs[i], t0)
	}
	burst := s.lim.EnvelopeBurst
	each := burst/racers + 2
	outs = racePut(store.DirC2P, func(i, j int) uint64 { return uint64(1 + i*each + j) }, func(i int, seq uint64) []byte { return body(seq) }, each, at)
	if count(outs, store.PutCreated) != burst || count(outs, store.PutRateLimited) != len(outs)-burst {
		t.Fatalf("racing puts against a burst of %d: %d created, %d limited of %d", burst, count(outs, store.PutCreated), count(outs, store.PutRateLimited), len(outs))
	}
	if st := c.state(s.r.next(), store.DirC2P); st.Count != burst {
		t.Fatalf("after racing puts: %+v", st)
	}
	// Distinct seqs against the count bound: the direction is filled to
	// 10 short of it, then racers put 3 each once the bucket is full
	// again: exactly 10 stored.
	c = s.box(t, "ct/race2", tokA)
	c.claimIs(s.r.next(), tokA, t0, store.ClaimCreated)
	bound := s.lim.MaxStored
	for seq := uint64(1); seq <= uint64(bound-10); seq++ {
		c.put(s.r.next(), store.DirP2C, seq, body(seq), store.PutCreated)
	}
	for i := range handles {
		handles[i] = c.open(hs[i], t0)
	}
	refilled := c.clock + int64(s.lim.EnvelopeBurst)*int64(s.lim.EnvelopeEvery)
	const each2 = 3
	outs = racePut(store.DirP2C, func(i, j int) uint64 { return uint64(bound + 1 + i*each2 + j) }, func(i int, seq uint64) []byte { return body(seq) }, each2,
		func(i, j int) int64 { return refilled })
	if count(outs, store.PutCreated) != 10 || count(outs, store.PutFull) != len(outs)-10 {
		t.Fatalf("racing puts against a bound of %d: %v", bound, outs)
	}
	var stored []uint64
	if err := c.open(s.r.next(), t0).Scan(s.ctx(t), store.DirP2C, 0, func(seq uint64, env []byte) bool {
		stored = append(stored, seq)
		return true
	}); err != nil {
		t.Fatal(err)
	}
	if st := c.state(s.r.next(), store.DirP2C); st.Count != bound || len(stored) != bound {
		t.Fatalf("after racing puts: state %+v, scan %d", st, len(stored))
	}
}

// mbxSuite is the suite's shared state.
type mbxSuite struct {
	r   *rotor[store.Mailboxes]
	hs  []store.Mailboxes
	n   int
	lim store.MailboxLimits
	t0  int64
}

func (s *mbxSuite) ctx(t *testing.T) context.Context {
	c, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	t.Cleanup(cancel)
	return c
}

// box is one mailbox of a case: its name, the token its handles open
// with, the time they open at, and the case's clock for puts (each put a
// token of the envelope bucket after the one before, so that only the
// cases about the bucket meet it).
func (s *mbxSuite) box(t *testing.T, name string, tok store.Hash) *mbxBox {
	return &mbxBox{s: s, t: t, name: name, tok: tok, now: s.t0, clock: s.t0}
}

type mbxBox struct {
	s     *mbxSuite
	t     *testing.T
	name  string
	tok   store.Hash
	now   int64 // Open's now for reads
	clock int64 // the next put's now
}

func mbxBody(seq uint64) []byte { return MailboxEnvelope(seq, fmt.Sprint("m", seq)) }

// mbxSized is an envelope of seq of exactly size bytes (at least 25).
func mbxSized(seq uint64, size int) []byte {
	return MailboxEnvelope(seq, strings.Repeat(fmt.Sprint(seq%10), size-25))
}

func mbxSizes(seqs ...uint64) int {
	n := 0
	for _, s := range seqs {
		n += len(mbxBody(s))
	}
	return n
}

func mbxSizeRange(from, to uint64) int {
	n := 0
	for s := from; s <= to; s++ {
		n += len(mbxBody(s))
	}
	return n
}

func (c *mbxBox) claimIs(h store.Mailboxes, tok store.Hash, now int64, want store.ClaimOutcome) {
	c.t.Helper()
	o, err := h.Claim(c.s.ctx(c.t), []byte(c.name), tok, now)
	if err != nil || o != want {
		c.t.Fatalf("claim %s at %+d: %v %v, want %v", c.name, now-c.s.t0, o, err, want)
	}
}

func (c *mbxBox) openErr(h store.Mailboxes, tok store.Hash, now int64, want error) error {
	m, err := h.Open(c.s.ctx(c.t), []byte(c.name), tok, now)
	if err == nil {
		m.Release()
	}
	if !errors.Is(err, want) || (want == nil && err != nil) {
		return fmt.Errorf("open %s at %+d: %v, want %v", c.name, now-c.s.t0, err, want)
	}
	return nil
}

func (c *mbxBox) openIs(h store.Mailboxes, tok store.Hash, now int64, want error) {
	c.t.Helper()
	if err := c.openErr(h, tok, now, want); err != nil {
		c.t.Fatal(err)
	}
}

// open opens the mailbox through h with the box's token at now, released
// when the case ends.
func (c *mbxBox) open(h store.Mailboxes, now int64) store.Mailbox {
	c.t.Helper()
	m, err := h.Open(c.s.ctx(c.t), []byte(c.name), c.tok, now)
	if err != nil {
		c.t.Fatalf("open %s at %+d: %v", c.name, now-c.s.t0, err)
	}
	c.t.Cleanup(m.Release)
	return m
}

func (c *mbxBox) openAt(h store.Mailboxes, now int64) store.Mailbox { return c.open(h, now) }

func (c *mbxBox) putNotify(h store.Mailboxes, dir byte, seq uint64, env []byte, notify bool, now int64, want store.PutOutcome) store.PutResult {
	c.t.Helper()
	m := c.open(h, max(now, c.now))
	res, err := m.Put(c.s.ctx(c.t), dir, seq, env, notify, now)
	if err != nil {
		c.t.Fatalf("put %s %c %d: %v", c.name, dir, seq, err)
	}
	if res.Outcome != want {
		c.t.Fatalf("put %s %c %d: %v, want %v", c.name, dir, seq, res.Outcome, want)
	}
	if res.Outcome != store.PutCreated && res.Push {
		c.t.Fatalf("put %s %c %d: %v pushes", c.name, dir, seq, res.Outcome)
	}
	return res
}

func (c *mbxBox) putAt(h store.Mailboxes, dir byte, seq uint64, env []byte, now int64, want store.PutOutcome) store.PutResult {
	c.t.Helper()
	return c.putNotify(h, dir, seq, env, false, now, want)
}

// put stores at the box's clock, which then moves one token on.
func (c *mbxBox) put(h store.Mailboxes, dir byte, seq uint64, env []byte, want store.PutOutcome) store.PutResult {
	c.t.Helper()
	now := c.clock
	c.clock += int64(c.s.lim.EnvelopeEvery)
	return c.putAt(h, dir, seq, env, now, want)
}

// fill stores envelopes 1.. in dir whose sizes sum to exactly total (at
// least 25 bytes) and returns the last seq.
func (c *mbxBox) fill(dir byte, total int) uint64 {
	c.t.Helper()
	var sizes []int
	for rest := total; rest > 0; {
		size := min(mbxLarge, rest)
		if r := rest - size; r > 0 && r < 25 {
			size -= 25 // the last one needs room for its header and tag
		}
		sizes = append(sizes, size)
		rest -= size
	}
	for i, size := range sizes {
		seq := uint64(i + 1)
		c.put(c.s.r.next(), dir, seq, mbxSized(seq, size), store.PutCreated)
	}
	return uint64(len(sizes))
}

func (c *mbxBox) prune(h store.Mailboxes, dir byte, through uint64) {
	c.t.Helper()
	if err := c.open(h, c.now).Prune(c.s.ctx(c.t), dir, through); err != nil {
		c.t.Fatalf("prune %s %c through %d: %v", c.name, dir, through, err)
	}
}

func (c *mbxBox) state(h store.Mailboxes, dir byte) store.DirectionState {
	c.t.Helper()
	st, err := c.open(h, c.now).State(c.s.ctx(c.t), dir)
	if err != nil {
		c.t.Fatalf("state %s %c: %v", c.name, dir, err)
	}
	return st
}

// stateIs checks a direction's state through every handle.
func (c *mbxBox) stateIs(dir byte, want store.DirectionState) {
	c.t.Helper()
	for _, h := range c.s.hs {
		if st := c.state(h, dir); st != want {
			c.t.Fatalf("state of %s %c: %+v, want %+v", c.name, dir, st, want)
		}
	}
}

// envelopeIs checks one envelope (nil: not stored) through every handle.
func (c *mbxBox) envelopeIs(dir byte, seq uint64, want []byte) {
	c.t.Helper()
	for _, h := range c.s.hs {
		got, ok, err := c.open(h, c.now).AppendEnvelope(c.s.ctx(c.t), nil, dir, seq)
		if err != nil {
			c.t.Fatalf("envelope %s %c %d: %v", c.name, dir, seq, err)
		}
		if ok != (want != nil) || !bytes.Equal(got, want) {
			c.t.Fatalf("envelope %s %c %d: %q %v, want %q", c.name, dir, seq, got, ok, want)
		}
		c.hasIs1(h, dir, seq, want != nil)
	}
}

func (c *mbxBox) hasIs1(h store.Mailboxes, dir byte, seq uint64, want bool) {
	c.t.Helper()
	if ok, err := c.open(h, c.now).HasEnvelope(c.s.ctx(c.t), dir, seq); err != nil || ok != want {
		c.t.Fatalf("HasEnvelope %s %c %d: %v %v, want %v", c.name, dir, seq, ok, err, want)
	}
}

func (c *mbxBox) hasIs(dir byte, seq uint64, want bool) {
	c.t.Helper()
	for _, h := range c.s.hs {
		c.hasIs1(h, dir, seq, want)
	}
}

// scan lists the sequences above after, checking each envelope's bytes
// against want (nil: mbxBody).
func (c *mbxBox) scan(m store.Mailbox, dir byte, after uint64, want func(uint64) []byte) []uint64 {
	c.t.Helper()
	if want == nil {
		want = mbxBody
	}
	var seqs []uint64
	err := m.Scan(c.s.ctx(c.t), dir, after, func(seq uint64, env []byte) bool {
		seqs = append(seqs, seq)
		// Checked during the call: env is valid only then.
		if !bytes.Equal(env, want(seq)) {
			c.t.Errorf("scan %s %c: envelope %d has other bytes", c.name, dir, seq)
		}
		return true
	})
	if err != nil {
		c.t.Fatalf("scan %s %c after %d: %v", c.name, dir, after, err)
	}
	if c.t.Failed() {
		c.t.FailNow()
	}
	return seqs
}

// eventually retries check until it passes (a cluster node learns of a
// change made through another a moment later), at most 10 s.
func (c *mbxBox) eventually(check func() error) {
	c.t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		err := check()
		if err == nil {
			return
		}
		if time.Now().After(deadline) {
			c.t.Fatal(err)
		}
		time.Sleep(2 * time.Millisecond)
	}
}

// mbxWatch is one running Watch and what it delivered.
type mbxWatch struct {
	stop func()
	done chan error // End's reason, or Watch's error
	mu   sync.Mutex
	got  []uint64
	envs [][]byte
}

// watch starts m.Watch; fail, when set, is Deliver's answer.
func (c *mbxBox) watch(m store.Mailbox, dir byte, after uint64, fail func(env []byte) error) *mbxWatch {
	w := &mbxWatch{stop: func() {}, done: make(chan error, 2)}
	stop, err := m.Watch(c.t.Context(), dir, store.WatchConfig{
		After: after,
		Deliver: func(ctx context.Context, env []byte, replayed bool) error {
			if fail != nil {
				return fail(env)
			}
			w.mu.Lock()
			w.got = append(w.got, binary.BigEndian.Uint64(env[1:9]))
			w.envs = append(w.envs, bytes.Clone(env))
			w.mu.Unlock()
			return nil
		},
		End: func(err error) { w.done <- err },
	})
	if err != nil {
		w.done <- err
		return w
	}
	w.stop = stop
	c.t.Cleanup(stop)
	return w
}

// waitFor waits until the watch delivered at least len(want) envelopes,
// then checks they are want, in order, each with its bytes.
func (w *mbxWatch) waitFor(t *testing.T, want ...uint64) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		w.mu.Lock()
		n := len(w.got)
		w.mu.Unlock()
		if n >= len(want) {
			break
		}
		select {
		case err := <-w.done:
			t.Fatalf("watch ended with %v after %d of %d", err, n, len(want))
		default:
		}
		if time.Now().After(deadline) {
			t.Fatalf("watch delivered %d of %d", n, len(want))
		}
		time.Sleep(time.Millisecond)
	}
	w.is(t, want...)
}

func (w *mbxWatch) is(t *testing.T, want ...uint64) {
	t.Helper()
	w.mu.Lock()
	defer w.mu.Unlock()
	if !slices.Equal(w.got, want) {
		t.Fatalf("watch delivered %v, want %v (each once)", w.got, want)
	}
	for i, seq := range w.got {
		if !bytes.Equal(w.envs[i], mbxBody(seq)) {
			t.Fatalf("watch delivered other bytes for %d", seq)
		}
	}
}

// end waits for the watch to end by itself (or Watch's error).
func (w *mbxWatch) end(t *testing.T) error {
	t.Helper()
	select {
	case err := <-w.done:
		return err
	case <-time.After(10 * time.Second):
		t.Fatal("watch did not end")
		return nil
	}
}

// goneLog records OnGone calls.
type goneLog struct {
	mu    sync.Mutex
	names map[string]int
}

func (g *goneLog) add(name string) {
	g.mu.Lock()
	if g.names == nil {
		g.names = map[string]int{}
	}
	g.names[name]++
	g.mu.Unlock()
}

// wait waits until name was reported n times.
func (g *goneLog) wait(t *testing.T, name string, n int) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for g.count(name) < n {
		if time.Now().After(deadline) {
			t.Fatalf("OnGone of %s: %d calls, want %d (one per handle)", name, g.count(name), n)
		}
		time.Sleep(time.Millisecond)
	}
}

func (g *goneLog) count(name string) int {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.names[name]
}
