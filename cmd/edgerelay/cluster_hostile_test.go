package main

import (
	"bytes"
	"fmt"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/fasthttp/websocket"
)

// Back-pressure with the two ends of a flow on different nodes (issue 16):
// a frozen reader on node 1 (B) whose writer is on node 0 (A). Node B
// reads NATS on a goroutine that must never block on a socket, so the
// frozen socket is closed at its own queue bound with its protocol's code,
// and nothing else slows down: not another socket on B fed through the
// same NATS connection, not the publisher on A.

// Series of /metrics counting the sockets of each kind on a node.
const (
	signalSocketsSeries  = "edgerelay_mailbox_signal_sockets"
	controlSocketsSeries = "edgerelay_channel_control_sockets"
	phoneChannelsSeries  = "edgerelay_channel_phone_channels"
)

// liveStall bounds the wait between two frames of the live flow during a
// freeze. A node whose NATS read path blocked on the frozen socket would
// hold the live flow until the frozen one is cut, or for NATS's
// write_deadline (seconds: CLUSTER.md §5); a round trip of the flow takes
// milliseconds, and the bound leaves room for a loaded 2-core machine
// under -race.
const liveStall = 3 * time.Second

// TestClusterHostileFrozenReaders is TestHostileFrozenReaders with the
// frozen reader on node 1 and its writer on node 0: a signal side, a
// private-channel phone and a computer's control socket that stop reading
// are each closed at their own queue bound with their protocol's code,
// while a live socket on node 1 fed from node 0 gets every frame, in
// order and without a stall, during the freeze, and no other socket of
// the cluster is closed.
func TestClusterHostileFrozenReaders(t *testing.T) {
	t.Parallel()
	c := startSignalCluster(t, "channel")
	comps := ccClaim(t, c, addChannelKeys(t, c, "hf", 3))
	// A frozen socket's end waits out its close timeout (5 s: it reads
	// nothing, not even the close), so the signal freeze runs beside the
	// channel's; the channel's two share the gauges they check.
	t.Run("signal", func(t *testing.T) {
		t.Parallel()
		clusterFrozenSignal(t, c)
	})
	t.Run("channel", func(t *testing.T) {
		t.Parallel()
		t.Run("phone", func(t *testing.T) { clusterFrozenPhone(t, c, comps[0]) })
		t.Run("control socket", func(t *testing.T) { clusterFrozenControl(t, c, comps[1], comps[2]) })
	})
}

// nodeGauges is series on each node of c (/metrics).
func nodeGauges(t *testing.T, c *relayCluster, series string) []int {
	t.Helper()
	var out []int
	for _, n := range c.nodes {
		out = append(out, int(hostileMetric(t, n, series)))
	}
	return out
}

// wantGauges waits until series is want on each node of c, in node order
// (a closed socket is counted out once its handler has ended).
func wantGauges(t *testing.T, c *relayCluster, series string, want ...int) {
	t.Helper()
	var got []int
	deadline := time.Now().Add(10 * time.Second)
	for got = nodeGauges(t, c, series); !slices.Equal(got, want); got = nodeGauges(t, c, series) {
		if time.Now().After(deadline) {
			t.Fatalf("%s per node: %v, want %v", series, got, want)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// crossFreeze is one frozen reader on node 1 with its writer on node 0,
// and a live socket on node 1 fed from node 0 beside it.
type crossFreeze struct {
	bound    int               // the frozen socket's queue bound, in bytes
	frame    int               // the bytes of each frame to the frozen socket
	toFrozen func() error      // writes one frame for the frozen socket
	toLive   func(i int) error // writes the live socket's frame i
	live     *websocket.Conn
	liveWant func(i int) string // the live socket's frame i, to the byte
	// gone gets nil when the writer's side hears that the frozen socket
	// was dropped (the spec's notice), its error otherwise.
	gone <-chan error
}

// freezeWindow is how many frames the live socket may be behind in a
// freeze: a few small frames, far below its bound, and enough for the
// rounds not to wait on each hop's round trip.
const freezeWindow = 8

// run sends rounds of a frame to the frozen socket and one to the live
// socket until the frozen socket's bound is far exceeded, keeping the live
// socket at most freezeWindow frames behind (pace), and checks that the frozen
// socket was dropped no sooner than its bound and the live flow went on
// meanwhile. It returns how many frames were sent to the frozen socket.
func (f crossFreeze) run(t *testing.T) int {
	t.Helper()
	n := frozenBytes(f.bound) / f.frame
	arrivals := make([]time.Time, n) // written by the live reader only, read after it ends
	progress := make(chan int, n)
	liveDone := liveReader(f.live, n, progress, func(i int, msg []byte) error {
		arrivals[i] = time.Now()
		if want := f.liveWant(i); string(msg) != want {
			return fmt.Errorf("got %.80q, want %q", msg, want)
		}
		return nil
	})

	type notice struct {
		at   time.Time
		sent int64 // frames sent to the frozen socket by then
		err  error
	}
	var sent atomic.Int64
	var dropped atomic.Bool
	noticed := make(chan notice, 1)
	go func() {
		err := <-f.gone
		dropped.Store(true)
		noticed <- notice{time.Now(), sent.Load(), err}
	}()
	begin := time.Now()
	pace(t, n, freezeWindow, progress, liveDone, func(i int) error {
		if err := f.toFrozen(); err != nil && !dropped.Load() {
			return fmt.Errorf("to the frozen socket: %w", err)
		}
		sent.Add(1)
		return f.toLive(i)
	})
	var nt notice
	select {
	case nt = <-noticed:
	case <-time.After(30 * time.Second):
		t.Fatalf("no notice of the frozen socket's drop within 30 s of the last of %d frames", n)
	}
	if nt.err != nil {
		t.Fatalf("waiting for the notice of the frozen socket's drop: %v", nt.err)
	}
	if got := int(nt.sent) * f.frame; got < f.bound {
		t.Fatalf("the frozen socket was dropped once %d bytes were sent to it, before its %d-byte bound", got, f.bound)
	}

	// The live flow while the frozen socket was held: what arrived before
	// the notice, and the longest wait between two of those frames.
	during, prev, stall := 0, begin, time.Duration(0)
	for _, at := range arrivals {
		if at.After(nt.at) {
			break
		}
		stall = max(stall, at.Sub(prev))
		during, prev = during+1, at
	}
	t.Logf("the notice of the frozen socket's drop came after %d of %d frames (%d bytes) sent to it, %v in; the live socket got %d frames meanwhile, at most %v apart",
		nt.sent, n, int(nt.sent)*f.frame, nt.at.Sub(begin).Round(time.Millisecond), during, stall.Round(time.Millisecond))
	// The frozen socket held a bound's worth before its drop, and the live
	// socket got as many frames meanwhile, but for the pace's window and
	// one in flight either side of the notice.
	if least := f.bound/f.frame - freezeWindow - 2; during < least {
		t.Fatalf("the live socket got %d frames while the frozen one was held, want at least %d", during, least)
	}
	if stall > liveStall {
		t.Fatalf("the live flow stalled %v during the freeze, want under %v", stall, liveStall)
	}
	return n
}

// readUntil reads c on its own goroutine until done says a frame is the
// one awaited (then nil on the channel) or the read fails (its error).
func readUntil(c *websocket.Conn, done func(typ int, msg []byte) bool) <-chan error {
	gone := make(chan error, 1)
	go func() {
		_ = c.SetReadDeadline(time.Now().Add(time.Minute))
		for {
			typ, msg, err := c.ReadMessage()
			if err != nil {
				gone <- err
				return
			}
			if done(typ, msg) {
				gone <- nil
				return
			}
		}
	}()
	return gone
}

// clusterFrozenSignal: a companion on node 1 that stops reading while its
// primary on node 0 sends is closed at 1 MiB behind (1013) and the primary
// hears peer 0; the pair of another mailbox, on the same two nodes, gets
// every frame meanwhile and both its sides stay.
func clusterFrozenSignal(t *testing.T, c *relayCluster) {
	a, b := c.nodes[0].origin("mailbox"), c.nodes[1].origin("mailbox")
	wantGauges(t, c, signalSocketsSeries, 0, 0, 0)
	sender, frozen := signalPair(t, talkMailbox(t, c), a, b, frozenDialer(nil))
	liveSender, live := signalPair(t, talkMailbox(t, c), a, b, websocket.DefaultDialer)
	wantGauges(t, c, signalSocketsSeries, 2, 2, 0)

	big := bytes.Repeat([]byte{0xa5}, 60000)
	n := crossFreeze{
		bound: 1 << 20, frame: len(big), // about 105 frames: within the burst of 400
		toFrozen: func() error { return sender.WriteMessage(websocket.BinaryMessage, big) },
		toLive: func(i int) error {
			return liveSender.WriteMessage(websocket.BinaryMessage, []byte(strconv.Itoa(i)))
		},
		live: live, liveWant: strconv.Itoa,
		gone: readUntil(sender, func(typ int, msg []byte) bool { return typ == websocket.TextMessage && string(msg) == "peer 0" }),
	}.run(t)
	expectCutOff(t, frozen, websocket.CloseTryAgainLater, n)
	wantGauges(t, c, signalSocketsSeries, 2, 1, 0)

	// The other pair still works both ways, and nothing else was closed.
	signalBothWays(t, "after the freeze", liveSender, live)
	wantGauges(t, c, signalSocketsSeries, 2, 1, 0)
}

// clusterFrozenPhone: a phone on node 1 that stops reading while its
// computer on node 0 sends is dropped at its 2 MiB queue (1008) and the
// computer told; another phone of the same computer on node 1 gets every
// frame meanwhile, and it and the control socket stay.
func clusterFrozenPhone(t *testing.T, c *relayCluster, comp ccComputer) {
	wantGauges(t, c, phoneChannelsSeries, 0, 0, 0)
	pair := &hostileChannel{s: c.nodes[1], tok: comp.phone, ctl: ccHost(t, c.nodes[0].addrs["channel"], comp.owner)}
	frozen, frozenID := pair.phone(t, frozenDialer(nil))
	live, liveID := pair.phone(t, nil)
	wantGauges(t, c, phoneChannelsSeries, 0, 2, 0)
	wantGauges(t, c, controlSocketsSeries, 1, 0, 0)

	big := strings.Repeat("z", 60000)
	// The computer hears that the frozen phone left (nothing else comes
	// on its control socket meanwhile: the phones only read).
	closeMsg := `{"type":"close","id":"` + frozenID + `"}`
	gone := readUntil(pair.ctl, func(_ int, msg []byte) bool { return string(msg) == closeMsg })
	n := crossFreeze{
		bound: 2 << 20, frame: len(big),
		toFrozen: func() error { return pair.send(frozenID, big) },
		toLive:   func(i int) error { return pair.send(liveID, "live "+strconv.Itoa(i)) },
		live:     live,
		liveWant: func(i int) string { return "live " + strconv.Itoa(i) },
		gone:     gone,
	}.run(t)
	expectCutOff(t, frozen, websocket.ClosePolicyViolation, n)
	wantGauges(t, c, phoneChannelsSeries, 0, 1, 0)
	pair.roundTrip(t, live, liveID, "still here")
	wantGauges(t, c, phoneChannelsSeries, 0, 1, 0)
	wantGauges(t, c, controlSocketsSeries, 1, 0, 0)
}

// clusterFrozenControl: a computer's control socket on node 1 that stops
// reading while its phone on node 0 sends is dropped at its 2 MiB queue
// (1008), which closes that phone (1001, as when the computer leaves);
// another computer's control socket on node 1 gets every frame of its
// phone on node 0 meanwhile, and both stay.
func clusterFrozenControl(t *testing.T, c *relayCluster, comp, other ccComputer) {
	a, b := c.nodes[0].addrs["channel"], c.nodes[1].addrs["channel"]
	wantGauges(t, c, phoneChannelsSeries, 0, 0, 0)
	wantGauges(t, c, controlSocketsSeries, 0, 0, 0)
	frozenCtl, resp, err := frozenDialer(nil).Dial("ws://"+b+"/host", http.Header{"Authorization": {"Bearer " + comp.owner}})
	if err != nil {
		t.Fatalf("frozen control socket: %v %v", err, resp)
	}
	t.Cleanup(func() { frozenCtl.Close() })
	writer, _ := ccPhone(t, a, comp.phone, frozenCtl)
	liveCtl := ccHost(t, b, other.owner)
	livePhone, liveID := ccPhone(t, a, other.phone, liveCtl)
	wantGauges(t, c, controlSocketsSeries, 0, 2, 0)
	wantGauges(t, c, phoneChannelsSeries, 2, 0, 0)

	big := strings.Repeat("z", 60000)
	// The writing phone hears its computer is gone: the relay closes it
	// with 1001. (It stops writing once it heard; a write in flight then
	// may fail.)
	gone := make(chan error, 1)
	go func() {
		if code, err := ccCloseErr(writer, time.Minute); code != websocket.CloseGoingAway {
			gone <- fmt.Errorf("the phone of the frozen computer ended with %d (%v), want 1001", code, err)
			return
		}
		gone <- nil
	}()
	n := crossFreeze{
		bound: 2 << 20, frame: len(big),
		toFrozen: func() error { return writer.WriteMessage(websocket.TextMessage, []byte(big)) },
		toLive: func(i int) error {
			return livePhone.WriteMessage(websocket.TextMessage, []byte("live "+strconv.Itoa(i)))
		},
		live: liveCtl,
		// The relay's own wrapping (spec/private-channel.md), field order
		// and all.
		liveWant: func(i int) string {
			return `{"type":"data","id":"` + liveID + `","data":"live ` + strconv.Itoa(i) + `"}`
		},
		gone: gone,
	}.run(t)
	expectCutOff(t, frozenCtl, websocket.ClosePolicyViolation, n)
	wantGauges(t, c, controlSocketsSeries, 0, 1, 0)
	wantGauges(t, c, phoneChannelsSeries, 1, 0, 0)

	// The other computer and its phone still talk both ways.
	ccSendCtl(t, liveCtl, "data", liveID, "still here")
	if got := ccReadText(t, livePhone); got != "still here" {
		t.Fatalf("the other computer's phone got %q", got)
	}
	ccSend(t, livePhone, "and back")
	if m := ccRead(t, liveCtl); m.Type != "data" || m.ID != liveID || m.Data != "and back" {
		t.Fatalf("the other computer got %+v", m)
	}
	wantGauges(t, c, controlSocketsSeries, 0, 1, 0)
	wantGauges(t, c, phoneChannelsSeries, 1, 0, 0)
}
