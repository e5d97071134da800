package turnbench

import (
	"encoding/binary"
	"sync/atomic"
	"testing"
	"time"
)

// fakeClient records the sends a stream makes.
type fakeClient struct {
	runs   []int    // frames per send
	frames [][]byte // every frame sent, copied
}

func (f *fakeClient) channel() uint16        { return 0x4001 }
func (f *fakeClient) stride(payload int) int { return 4 + payload }
func (f *fakeClient) start(func([]byte))     {}
func (f *fakeClient) close()                 {}
func (f *fakeClient) send(buf []byte, n, stride int) error {
	f.runs = append(f.runs, n)
	for i := range n {
		f.frames = append(f.frames, append([]byte(nil), buf[i*stride:(i+1)*stride]...))
	}
	return nil
}

// echo hands frame's payload back to the stream as the server would.
func echo(s *stream, frame []byte) { s.onEcho(frame[4:]) }

// TestStreamSendsWholeRuns: with GSO runs of 4 and a window of 8, the
// window goes as two runs; freed slots wait until 4 are free and go as
// one run; a lost datagram is sent again with the slots waiting beside it,
// as a shorter run, and its stale echo is ignored.
func TestStreamSendsWholeRuns(t *testing.T) {
	f := &fakeClient{}
	var back atomic.Uint64
	s := newStream(f, LoadOptions{Window: 8, GSO: 4, Payload: 16}, &back)
	s.running.Store(true)
	s.fill()
	if len(f.runs) != 2 || f.runs[0] != 4 || f.runs[1] != 4 {
		t.Fatalf("fill sent runs %v, want [4 4]", f.runs)
	}
	for i, fr := range f.frames {
		if ch, n := binary.BigEndian.Uint16(fr[0:2]), binary.BigEndian.Uint16(fr[2:4]); ch != 0x4001 || n != 16 {
			t.Fatalf("frame %d: channel %#x length %d", i, ch, n)
		}
	}
	first := f.frames
	for _, fr := range first[:3] {
		echo(s, fr)
	}
	if len(f.runs) != 2 {
		t.Fatalf("3 free slots sent %v; want to wait for a 4th", f.runs[2:])
	}
	echo(s, first[3])
	if len(f.runs) != 3 || f.runs[2] != 4 {
		t.Fatalf("4 free slots: runs %v, want a third of 4", f.runs)
	}
	if back.Load() != 4 {
		t.Fatalf("back %d, want 4", back.Load())
	}
	// 4, 5 and 6 echo and wait for a fourth; 7 is lost, and so are
	// slots 0-3 of the third run (no echo within the timeout): the
	// ticker frees them in slot order, 0 fills the run with 4-6 and
	// 1, 2, 3 and 7 make another.
	for _, fr := range first[4:7] {
		echo(s, fr)
	}
	s.resendLost(time.Now().Add(2 * lossTimeout))
	if got := f.runs[3:]; len(got) != 2 || got[0] != 4 || got[1] != 4 || s.lost.Load() != 5 {
		t.Fatalf("after the losses: runs %v, lost %d; want [4 4] more, 5 lost", got, s.lost.Load())
	}
	// One lost alone, with nothing waiting: sent again at once, a run of 1.
	sent := len(f.runs)
	s.mu.Lock()
	for slot := range s.sent {
		if slot != 2 {
			s.sent[slot] = time.Now().Add(time.Hour) // not due
		}
	}
	s.mu.Unlock()
	s.resendLost(time.Now().Add(4 * lossTimeout)) // past the last resend's due time
	if got := f.runs[sent:]; len(got) != 1 || got[0] != 1 {
		t.Fatalf("one loss: runs %v, want [1]", got)
	}
	echo(s, first[7]) // stale: slot 7 was sent again
	if back.Load() != 7 {
		t.Fatalf("back %d after a stale echo, want 7", back.Load())
	}
}

// TestStreamOneAtATime: without GSO every freed slot is sent at once.
func TestStreamOneAtATime(t *testing.T) {
	f := &fakeClient{}
	var back atomic.Uint64
	s := newStream(f, LoadOptions{Window: 4, GSO: 1, Payload: 16}, &back)
	s.running.Store(true)
	s.fill()
	echo(s, f.frames[2])
	if len(f.runs) != 5 {
		t.Fatalf("runs %v, want 5 single sends", f.runs)
	}
	for _, n := range f.runs {
		if n != 1 {
			t.Fatalf("runs %v, want single sends", f.runs)
		}
	}
}
