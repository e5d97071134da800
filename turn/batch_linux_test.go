package turn

import (
	"bytes"
	"context"
	"fmt"
	"net"
	"net/netip"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"
	"unsafe"

	"github.com/pion/stun/v3"
	"golang.org/x/sys/unix"

	"edgerelay/turn/turntest"
)

// batchModes are the batched sender's two paths: GSO runs, and sendmmsg
// (as where the kernel refuses UDP_SEGMENT), forced by Config.noGSO.
var batchModes = []struct {
	name  string
	noGSO bool
}{{"gso", false}, {"sendmmsg", true}}

// burstItem is one datagram of a burst: which peer sends it and its size.
type burstItem struct {
	peer int // 0, 1: channel-bound peers (0x4000, 0x4001); 2: permission only
	size int
}

// burst is the schedule TestRelayBatched sends while the relay socket's
// reader is held, so that the reader finds it all queued and relays it
// in full batches: every size from 1 to 300; equal-size runs longer than
// a GSO send may carry (64), interleaving the two channels; runs ended by
// a shorter frame; frames at the biggest GSO segment and one past it;
// Data indications in the middle of runs; the biggest ChannelData a UDP
// client can get (65,503 bytes) and one past it, which is dropped.
func burst() (items []burstItem, tooBig int) {
	items = baseBurst(1, 300, 0)
	items = append(items, burstItem{0, 500}, burstItem{1, 500}, burstItem{1, 499})
	for range 3 {
		items = append(items, burstItem{0, gsoMaxSegment4 - 4}) // frames of the biggest segment
	}
	for range 3 {
		items = append(items, burstItem{1, gsoMaxSegment4 - 3}) // one past: one by one
	}
	tooBig = maxIPv4Datagram - 4 + 1
	items = append(items, burstItem{0, 9000}, burstItem{2, 9000}, burstItem{1, maxIPv4Datagram - 4},
		burstItem{0, tooBig}, burstItem{1, 7})
	for i := range 40 {
		items = append(items, burstItem{i % 3, 100 + i%2})
	}
	return items, tooBig
}

// TestRelayBatched relays a burst from three peers to a UDP client through
// a relay socket whose reader was held, on both batched paths: every
// datagram arrives whole, in order per peer (as ChannelData on its
// channel, or as a Data indication), the one too big for a UDP client is
// dropped, and the allocation's counters count exactly what was relayed.
// On the GSO path some frames went out as GSO runs; on the other, none.
func TestRelayBatched(t *testing.T) {
	for _, mode := range batchModes {
		t.Run(mode.name, func(t *testing.T) {
			s, c, hold, relay, peers := heldRelay(t, mode.noGSO, "batched")
			peer2 := peers[2]
			items, tooBig := burst()
			want := make([][]int, 3) // per peer: the sizes expected, in order
			var wantPackets, wantBytes uint64
			for _, it := range items {
				if _, err := peers[it.peer].WriteToUDPAddrPort(payload(it.size, byte(it.size)), relay); err != nil {
					t.Fatal(err)
				}
				if it.size == tooBig {
					continue
				}
				want[it.peer] = append(want[it.peer], it.size)
				wantPackets++
				wantBytes += uint64(it.size)
			}
			close(hold)

			got := make([][]int, 3)
			channelOf := map[uint16]int{0x4000: 0, 0x4001: 1}
			peer2Addr := peer2.LocalAddr().(*net.UDPAddr).AddrPort()
			for range wantPackets {
				frame, err := c.ReadFrame(time.Now().Add(3 * time.Second))
				if err != nil {
					t.Fatalf("after %v of %d datagrams: %v", lens(got), wantPackets, err)
				}
				from, data := -1, []byte(nil)
				if frame[0]&0xC0 == 0x40 {
					n := int(frame[2])<<8 | int(frame[3])
					if len(frame) != 4+n {
						t.Fatalf("ChannelData of %d bytes in a datagram of %d: segments merged or split", n, len(frame))
					}
					p, ok := channelOf[uint16(frame[0])<<8|uint16(frame[1])]
					if !ok {
						t.Fatalf("ChannelData on channel %x", frame[:2])
					}
					from, data = p, frame[4:]
				} else if addr, d, err := turntest.DataIndicationOf(frame); err == nil && addr == peer2Addr {
					from, data = 2, d
				} else {
					t.Fatalf("unexpected frame %x (%v)", frame[:min(len(frame), 24)], err)
				}
				if !bytes.Equal(data, payload(len(data), byte(len(data)))) {
					t.Fatalf("peer %d: a datagram of %d bytes came changed", from, len(data))
				}
				got[from] = append(got[from], len(data))
			}
			for p := range want {
				if fmt.Sprint(got[p]) != fmt.Sprint(want[p]) {
					t.Errorf("peer %d: got sizes\n%v\nwant\n%v", p, got[p], want[p])
				}
			}
			if extra, err := c.ReadFrame(time.Now().Add(100 * time.Millisecond)); err == nil {
				t.Errorf("a datagram more than sent: %d bytes", len(extra))
			}
			r := relayOf(t, s, relay.Port())
			settle(func() bool {
				return r.downPackets.Load() == wantPackets && r.downBytes.Load() == wantBytes && (mode.noGSO || r.downRuns.Load() > 0)
			})
			if p, b := r.downPackets.Load(), r.downBytes.Load(); p != wantPackets || b != wantBytes {
				t.Errorf("counted %d datagrams, %d bytes to the client; want %d, %d", p, b, wantPackets, wantBytes)
			}
			runs := r.downRuns.Load()
			if mode.noGSO != (runs == 0) {
				t.Errorf("%d GSO sends on the %s path", runs, mode.name)
			}
			if s.out.gso.on.Load() == mode.noGSO {
				t.Errorf("GSO on: %v, on the %s path", s.out.gso.on.Load(), mode.name)
			}
		})
	}
}

// heldRelay starts a server whose relay readers wait until hold is
// closed, on the GSO or the sendmmsg path, and a UDP client (label) with
// an allocation and threePeers, every socket with room for a whole burst.
func heldRelay(t *testing.T, noGSO bool, label string) (s *Server, c *turntest.STUNClient, hold chan struct{}, relay netip.AddrPort, peers []*net.UDPConn) {
	t.Helper()
	hold = make(chan struct{})
	s, _ = testServer(t, func(c *Config) { c.SocketBuffer, c.holdRelayReads, c.noGSO = 4<<20, hold, noGSO })
	c = rawClient(t, s, "udp", label)
	if err := c.Conn().(*net.UDPConn).SetReadBuffer(4 << 20); err != nil {
		t.Fatal(err)
	}
	relay, peers = threePeers(t, c)
	return s, c, hold, relay, peers
}

func lens(got [][]int) []int { return []int{len(got[0]), len(got[1]), len(got[2])} }

// TestRelayBatchedStream: a stream client's frames keep the stream path
// (padded ChannelData, Data indications in the order read) when the reader
// relays a whole batch at once, over TCP and TLS, and the batch's
// ChannelData frames leave in few writes: one per run of frames between
// indications, not one per frame.
func TestRelayBatchedStream(t *testing.T) {
	for _, network := range []string{"tcp", "tls"} {
		t.Run(network, func(t *testing.T) {
			hold := make(chan struct{})
			s, _ := testServer(t, func(c *Config) {
				c.SocketBuffer, c.holdRelayReads = 4<<20, hold
				withTLS(t, c)
			})
			c := rawClient(t, s, network, "batched-stream")
			relay, err := turntest.RelayedAddressOf(turntest.MustAllocate(t, c))
			if err != nil {
				t.Fatal(err)
			}
			chPeer, indPeer := turntest.MustBindPeers(t, c, 0x4000)
			var sizes []int
			for i := range 200 {
				sizes = append(sizes, 1+i*7%1500)
			}
			// The biggest datagram a stream carries as ChannelData (its
			// length field's 65,535 bytes past what UDP carries), between
			// two small ones, all in one batch.
			sizes = append(sizes, 3, maxIPv4Datagram, 5)
			channelFrames := 0
			for i, n := range sizes {
				p := chPeer
				if i%5 == 4 && i < 200 {
					p = indPeer
				} else {
					channelFrames++
				}
				if _, err := p.WriteToUDPAddrPort(payload(n, byte(n)), relay); err != nil {
					t.Fatal(err)
				}
			}
			close(hold)
			for i, n := range sizes {
				if got := turntest.NextFromPeer(t, c); !bytes.Equal(got, payload(n, byte(n))) {
					t.Fatalf("datagram %d: %d bytes, want %d", i, len(got), n)
				}
			}
			r := relayOf(t, s, relay.Port())
			settle(func() bool { return r.downPackets.Load() == uint64(len(sizes)) && r.downRuns.Load() > 0 })
			if got := r.downPackets.Load(); got != uint64(len(sizes)) {
				t.Errorf("counted %d datagrams to a stream client, want %d", got, len(sizes))
			}
			if writes := r.downRuns.Load(); writes == 0 || writes > uint64(channelFrames)/2 {
				t.Errorf("%d stream writes carried %d ChannelData frames: not batched", writes, channelFrames)
			}
		})
	}
}

// TestRelayBatchAllocs: a burst of ChannelData both ways, read and sent in
// batches (GSO runs, or sendmmsg), allocates nothing per datagram.
func TestRelayBatchAllocs(t *testing.T) {
	if raceEnabled {
		t.Skip("the race detector allocates on its own; make test runs this without it")
	}
	for _, mode := range batchModes {
		t.Run(mode.name, func(t *testing.T) {
			s, _ := testServer(t, func(c *Config) { c.noGSO = mode.noGSO })
			peer := echoPeer(t)
			u, p := creds("batch-allocs")
			a, err := turntest.Allocate(serverAddr(s), u, p)
			if err != nil {
				t.Fatal(err)
			}
			defer a.Close()
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			if _, err := a.BindChannel(ctx, peer.Addr()); err != nil {
				t.Fatal(err)
			}
			const burst = 32
			back := make(chan struct{}, burst)
			a.Conn.OnData(func([]byte) { back <- struct{}{} })
			frame := make([]byte, 4+1200)
			timeout := time.NewTimer(time.Hour)
			roundTrip := func() {
				for range burst {
					if err := a.Conn.Send(frame); err != nil {
						t.Fatal(err)
					}
				}
				timeout.Reset(time.Second)
				for range burst {
					select {
					case <-back:
					case <-timeout.C:
						t.Fatal("a datagram was lost on loopback")
					}
				}
			}
			for range 50 {
				roundTrip()
			}
			if allocs := testing.AllocsPerRun(200, roundTrip); allocs != 0 {
				t.Errorf("%v allocations per burst of %d round trips, want 0", allocs, burst)
			}
		})
	}
}

// TestGSORefused: each way the kernel may refuse UDP_SEGMENT turns GSO off
// for the server (the run is sent again by sendmmsg, so nothing is lost);
// EINVAL for a segment bigger than every path carries only stops GSO for
// that size and up.
func TestGSORefused(t *testing.T) {
	for _, e := range []syscall.Errno{syscall.EINVAL, syscall.EIO, syscall.ENOPROTOOPT, syscall.EOPNOTSUPP} {
		o := &gsoState{log: discardLog()}
		o.on.Store(true)
		o.segCap.Store(gsoMaxSegment4)
		if !gsoRefusal(e) {
			t.Fatalf("%v is not taken for a refusal", e)
		}
		o.refused(e, gsoSafeSegment)
		if o.on.Load() {
			t.Errorf("%v at a %d-byte segment: GSO still on", e, gsoSafeSegment)
		}
	}
	o := &gsoState{log: discardLog()}
	o.on.Store(true)
	o.segCap.Store(gsoMaxSegment4)
	o.refused(syscall.EINVAL, gsoSafeSegment+1)
	if !o.on.Load() || o.segCap.Load() != gsoSafeSegment {
		t.Errorf("EINVAL at %d bytes: GSO %v, segment cap %d; want on, %d", gsoSafeSegment+1, o.on.Load(), o.segCap.Load(), gsoSafeSegment)
	}
	o.refused(syscall.EINVAL, 1400) // bigger than the cap already: no change
	if o.segCap.Load() != gsoSafeSegment {
		t.Errorf("segment cap raised to %d", o.segCap.Load())
	}
	for _, e := range []syscall.Errno{syscall.EMSGSIZE, syscall.EPERM, syscall.ENETUNREACH} {
		if gsoRefusal(e) {
			t.Errorf("%v taken for GSO refused; it refuses the datagrams", e)
		}
	}
}

// TestGSOFallbackLive has the kernel refuse a live GSO send on the
// listener socket (a run of 260 bytes in 1-byte segments is more than the
// 64 segments a send may carry: EINVAL): the run arrives anyway, sent
// again by sendmmsg, and GSO is off for good.
func TestGSOFallbackLive(t *testing.T) {
	s, _ := testServer(t, nil)
	if !s.out.gso.on.Load() {
		t.Skip("no UDP GSO in this kernel")
	}
	client := turntest.LoopbackPeer(t)
	b := s.relayBufs.Get().(*relayBatch)
	defer s.relayBufs.Put(b)
	q := &b.q
	q.start(s.out.rc, s.out.v6, s.out.gso, 4)
	frames := [][]byte{payload(100, 1), payload(100, 2), payload(60, 3)}
	for _, f := range frames {
		if !q.add(f, client.LocalAddr().(*net.UDPAddr).AddrPort()) {
			t.Fatal("a loopback IPv4 client is not batched")
		}
	}
	got := q.sendRun(0, 3, 1, 260)
	if got.packets != 3 || got.bytes != 260-12 || got.runs != 0 {
		t.Errorf("sent %+v; want 3 datagrams, %d bytes, no GSO sends", got, 260-12)
	}
	if s.out.gso.on.Load() {
		t.Error("GSO still on after the kernel refused it")
	}
	buf := make([]byte, 2048)
	for i, f := range frames {
		_ = client.SetReadDeadline(time.Now().Add(2 * time.Second))
		n, err := client.Read(buf)
		if err != nil {
			t.Fatalf("datagram %d: %v", i, err)
		}
		if !bytes.Equal(buf[:n], f) {
			t.Fatalf("datagram %d: %d bytes, want %d", i, n, len(f))
		}
	}
}

// upHold holds the UDP listener's reader between batches (through
// Config.beforeUpRead) so that a test can queue a burst for it.
type upHold struct {
	mu      sync.Mutex
	waiting atomic.Int64
}

func (h *upHold) before() {
	h.waiting.Add(1)
	h.mu.Lock()
	h.mu.Unlock() // only a gate: the test opens it
}

// shut closes the gate and waits until the listener's reader is held at
// it: c sends a frame on an unbound channel (dropped), which the reader
// reads and handles before it comes back to the gate.
func (h *upHold) shut(t *testing.T, c *turntest.STUNClient) {
	t.Helper()
	h.mu.Lock()
	before := h.waiting.Load()
	if err := c.Send(c.ChannelData(0x4FFF, payload(10, 1))); err != nil {
		t.Fatal(err)
	}
	for deadline := time.Now().Add(3 * time.Second); h.waiting.Load() == before; time.Sleep(time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("the listener's reader never came back to the gate")
		}
	}
}

// open lets the held reader go on.
func (h *upHold) open() { h.mu.Unlock() }

// TestRelayBatchedUp relays a burst from a UDP client, queued while the
// listener's reader was held, on both batched paths: ChannelData on two
// channels (empty to the biggest a client's IPv4 datagram carries, runs
// past 64, interleaved) and Send indications between them reach their
// peers whole and in order, frames for an unbound channel are dropped, and
// the counters count exactly what was relayed.
func TestRelayBatchedUp(t *testing.T) {
	for _, mode := range batchModes {
		t.Run(mode.name, func(t *testing.T) {
			hold := &upHold{}
			s, _ := testServer(t, func(c *Config) { c.SocketBuffer, c.noGSO, c.beforeUpRead = 4<<20, mode.noGSO, hold.before })
			c := rawClient(t, s, "udp", "batched-up")
			relay, peers := threePeers(t, c)
			items := baseBurst(0, 300, 1)
			items = append(items, burstItem{1, 600}, burstItem{0, 9000}, burstItem{1, maxIPv4Datagram - 4},
				burstItem{0, gsoMaxSegment4}, burstItem{0, gsoMaxSegment4}, burstItem{0, gsoMaxSegment4 + 1}, burstItem{1, 3})

			// Hold the reader: it reads a first datagram (dropped: an
			// unbound channel), handles it and waits at the gate.
			hold.shut(t, c)
			frames, want := upFrames(c, peers, items)
			for _, f := range frames {
				if err := c.Send(f); err != nil {
					t.Fatal(err)
				}
			}
			hold.open()

			r := relayOf(t, s, relay.Port())
			expectAtPeers(t, r, peers, want)
			settle(func() bool { return mode.noGSO || r.upRuns.Load() > 0 })
			if runs := r.upRuns.Load(); mode.noGSO != (runs == 0) {
				t.Errorf("%d GSO sends to peers on the %s path", runs, mode.name)
			}
		})
	}
}

// TestRelayBatchedStreamUp: the same burst written at once by a TCP or TLS
// client (the biggest ChannelData a UDP peer can get, and one past it,
// which is dropped, instead of the UDP leg's limits) reaches the peers
// whole and in order, counted exactly. From TCP, runs of equal frames
// leave as GSO sends (what one read brings is sent on in batches); from
// TLS, a record at a time, one by one.
func TestRelayBatchedStreamUp(t *testing.T) {
	for _, network := range []string{"tcp", "tls"} {
		t.Run(network, func(t *testing.T) {
			s, _ := testServer(t, func(c *Config) { c.SocketBuffer = 4 << 20; withTLS(t, c) })
			if !s.out.gso.on.Load() {
				t.Skip("no UDP GSO in this kernel")
			}
			c := rawClient(t, s, network, "batched-stream-up")
			relay, peers := threePeers(t, c)
			items := append(baseBurst(0, 200, 1), burstItem{0, 9000}, burstItem{1, maxIPv4Datagram}, burstItem{0, 3})
			frames, want := upFrames(c, peers, items)
			var stream []byte
			for _, f := range frames {
				stream = append(stream, f...)
			}
			// Past what a UDP peer can get: dropped, the stream goes on.
			stream = append(stream, c.ChannelData(0x4000, payload(maxIPv4Datagram+1, 1))...)
			stream = append(stream, c.ChannelData(0x4000, payload(5, 5))...)
			want[0] = append(want[0], 5)
			if err := c.Send(stream); err != nil {
				t.Fatal(err)
			}
			r := relayOf(t, s, relay.Port())
			expectAtPeers(t, r, peers, want)
			settle(func() bool { return network != "tcp" || r.upRuns.Load() > 0 })
			if runs := r.upRuns.Load(); (network == "tcp") != (runs > 0) {
				t.Errorf("%d GSO sends to peers from %s", runs, network)
			}
		})
	}
}

// threePeers allocates for c and binds peer 0 to channel 0x4000 and peer 1 to
// 0x4001; peer 2 has a permission only. Each can queue a whole burst.
func threePeers(t *testing.T, c *turntest.STUNClient) (netip.AddrPort, []*net.UDPConn) {
	t.Helper()
	relay, err := turntest.RelayedAddressOf(turntest.MustAllocate(t, c))
	if err != nil {
		t.Fatal(err)
	}
	peer0, peer2 := turntest.MustBindPeers(t, c, 0x4000)
	peer1 := turntest.LoopbackPeer(t)
	if code, _ := turntest.MustRequest(t, c, stun.MethodChannelBind, turntest.ChannelNumber(0x4001),
		turntest.PeerAddress(peer1.LocalAddr().(*net.UDPAddr).AddrPort())); code != 0 {
		t.Fatalf("ChannelBind: %d", code)
	}
	peers := []*net.UDPConn{peer0, peer1, peer2}
	for _, p := range peers {
		if err := p.SetReadBuffer(4 << 20); err != nil {
			t.Fatal(err)
		}
	}
	return relay, peers
}

// baseBurst is the start of a burst: every size from first to last on the
// two channels by turns, 150 of 1,200 bytes interleaved with a Data or
// Send indication now and then, and 70 more from runPeer (runs past a GSO
// send's 64).
func baseBurst(first, last, runPeer int) []burstItem {
	var items []burstItem
	for n := first; n <= last; n++ {
		items = append(items, burstItem{n % 2, n})
	}
	for i := range 150 {
		p := i % 2
		if i%37 == 36 {
			p = 2
		}
		items = append(items, burstItem{p, 1200})
	}
	for range 70 {
		items = append(items, burstItem{runPeer, 1200})
	}
	return items
}

// upFrames are the client's frames for items (ChannelData to peers 0 and
// 1, Send indications to peer 2), with a frame for an unbound channel now
// and then, and the sizes each peer is to get, in order.
func upFrames(c *turntest.STUNClient, peers []*net.UDPConn, items []burstItem) (frames [][]byte, want [][]int) {
	peer2 := peers[2].LocalAddr().(*net.UDPAddr).AddrPort()
	want = make([][]int, len(peers))
	for i, it := range items {
		data := payload(it.size, byte(it.size))
		frame := c.ChannelData(0x4000+uint16(it.peer), data)
		if it.peer == 2 {
			frame = turntest.SendIndication(peer2, data)
		}
		frames = append(frames, frame)
		if i%50 == 0 {
			frames = append(frames, c.ChannelData(0x4FFF, data)) // unbound: dropped
		}
		want[it.peer] = append(want[it.peer], it.size)
	}
	return frames, want
}

// expectAtPeers reads from each peer the datagrams of the sizes it is to
// get, in order and whole, then nothing more, and checks that r counted
// exactly them.
func expectAtPeers(t *testing.T, r *relayConn, peers []*net.UDPConn, want [][]int) {
	t.Helper()
	var wantPackets, wantBytes uint64
	buf := make([]byte, 64<<10)
	for p, conn := range peers {
		for k, size := range want[p] {
			_ = conn.SetReadDeadline(time.Now().Add(3 * time.Second))
			n, _, err := conn.ReadFromUDPAddrPort(buf)
			if err != nil {
				t.Fatalf("peer %d, datagram %d of %d: %v", p, k, len(want[p]), err)
			}
			if !bytes.Equal(buf[:n], payload(size, byte(size))) {
				t.Fatalf("peer %d, datagram %d: %d bytes, want %d", p, k, n, size)
			}
			wantPackets++
			wantBytes += uint64(size)
		}
		_ = conn.SetReadDeadline(time.Now().Add(50 * time.Millisecond))
		if n, _, err := conn.ReadFromUDPAddrPort(buf); err == nil {
			t.Errorf("peer %d: a datagram more than sent: %d bytes", p, n)
		}
	}
	// The counters are added after the sends: the last may lag the peers.
	settle(func() bool { return r.upPackets.Load() == wantPackets && r.upBytes.Load() == wantBytes })
	if p := r.upPackets.Load(); p != wantPackets {
		t.Errorf("counted %d datagrams to peers; want %d", p, wantPackets)
	}
	if b := r.upBytes.Load(); b != wantBytes {
		t.Errorf("counted %d bytes to peers; want %d", b, wantBytes)
	}
}

// sendGSO sends frames (equal sizes, the last possibly shorter) from conn
// as one GSO send to to (zero: conn is connected).
func sendGSO(t *testing.T, conn *net.UDPConn, to netip.AddrPort, frames [][]byte) {
	t.Helper()
	oob := make([]byte, unix.CmsgSpace(2))
	h := (*unix.Cmsghdr)(unsafe.Pointer(&oob[0]))
	h.Level, h.Type = unix.SOL_UDP, unix.UDP_SEGMENT
	h.SetLen(unix.CmsgLen(2))
	*(*uint16)(unsafe.Pointer(&oob[unix.CmsgLen(0)])) = uint16(len(frames[0]))
	if _, _, err := conn.WriteMsgUDPAddrPort(bytes.Join(frames, nil), oob, to); err != nil {
		t.Fatalf("GSO send: %v", err)
	}
}

// TestRelayGRO: runs a client and a peer send as one GSO send each (which
// loopback hands a UDP_GRO socket coalesced) are split back into their
// datagrams, both ways, in order and counted exactly; with UDP_GRO off the
// kernel splits them itself. The relay both ways is GSO on the way out.
func TestRelayGRO(t *testing.T) {
	for _, mode := range []struct {
		name  string
		noGRO bool
	}{{"gro", false}, {"no-gro", true}} {
		t.Run(mode.name, func(t *testing.T) {
			s, _ := testServer(t, func(c *Config) { c.NoGRO = mode.noGRO })
			if !s.out.gso.on.Load() {
				t.Skip("no UDP GSO in this kernel")
			}
			c := rawClient(t, s, "udp", "gro")
			relay, err := turntest.RelayedAddressOf(turntest.MustAllocate(t, c))
			if err != nil {
				t.Fatal(err)
			}
			peer, _ := turntest.MustBindPeers(t, c, 0x4000)
			r := relayOf(t, s, relay.Port())

			// Client to peer: 20 frames of 1,000 bytes and one of 500.
			var up [][]byte
			var upBytes uint64
			for i := range 21 {
				n := 1000
				if i == 20 {
					n = 500
				}
				up = append(up, c.ChannelData(0x4000, payload(n, byte(i))))
				upBytes += uint64(n)
			}
			sendGSO(t, c.Conn().(*net.UDPConn), netip.AddrPort{}, up)
			for i, f := range up {
				if got := turntest.ReadPeer(t, peer); !bytes.Equal(got, f[4:]) {
					t.Fatalf("datagram %d to the peer: %d bytes (fill %d), want %d", i, len(got), got[0], len(f)-4)
				}
			}

			// Peer to client: 30 datagrams of 1,200 bytes and one of 700.
			var down [][]byte
			var downBytes uint64
			for i := range 31 {
				n := 1200
				if i == 30 {
					n = 700
				}
				down = append(down, payload(n, byte(i)))
				downBytes += uint64(n)
			}
			sendGSO(t, peer, relay, down)
			for i, want := range down {
				if got := turntest.NextFromPeer(t, c); !bytes.Equal(got, want) {
					t.Fatalf("datagram %d to the client: %d bytes (%x...), want %d bytes of %x", i, len(got), got[:min(len(got), 4)], len(want), want[0])
				}
			}
			settle(func() bool {
				return r.upPackets.Load() == 21 && r.upBytes.Load() == upBytes && r.downPackets.Load() == 31 && r.downBytes.Load() == downBytes
			})
			if p, b := r.upPackets.Load(), r.upBytes.Load(); p != 21 || b != upBytes {
				t.Errorf("to the peer: counted %d datagrams, %d bytes; want 21, %d", p, b, upBytes)
			}
			if p, b := r.downPackets.Load(), r.downBytes.Load(); p != 31 || b != downBytes {
				t.Errorf("to the client: counted %d datagrams, %d bytes; want 31, %d", p, b, downBytes)
			}
			listenerGRO, relayGRO := s.udpConn.groReads.Load(), r.reader.groReads.Load()
			if mode.noGRO != (listenerGRO == 0) || mode.noGRO != (relayGRO == 0) {
				t.Errorf("coalesced reads: listener %d, relay %d, with UDP_GRO %v", listenerGRO, relayGRO, !mode.noGRO)
			}
		})
	}
}

// TestHairpinBatched: a burst from client a to the relayed addresses of
// two other allocations of the server, queued while the listener's reader
// was held, is handed over from the listener's batch: b (a channel bound
// to a's relayed address) gets every datagram in order, framed with its
// own channel number, as GSO runs from the listener (one by one by
// sendmmsg without GSO); c (a permission only) gets Data indications naming
// a's relayed address, framed in a copy; both allocations count exactly
// what was handed over.
func TestHairpinBatched(t *testing.T) {
	for _, mode := range batchModes {
		t.Run(mode.name, func(t *testing.T) {
			hold := &upHold{}
			s, _ := testServer(t, func(c *Config) { c.SocketBuffer, c.noGSO, c.beforeUpRead = 4<<20, mode.noGSO, hold.before })
			a, b, c := rawClient(t, s, "udp", "batched-a"), rawClient(t, s, "udp", "batched-b"), rawClient(t, s, "udp", "batched-c")
			var relayed [3]netip.AddrPort
			for i, cl := range []*turntest.STUNClient{a, b, c} {
				var err error
				if relayed[i], err = turntest.RelayedAddressOf(turntest.MustAllocate(t, cl)); err != nil {
					t.Fatal(err)
				}
				if err := cl.Conn().(*net.UDPConn).SetReadBuffer(4 << 20); err != nil {
					t.Fatal(err)
				}
			}
			mustOK(t, a, stun.MethodChannelBind, turntest.ChannelNumber(0x4000), turntest.PeerAddress(relayed[1]))
			mustOK(t, a, stun.MethodChannelBind, turntest.ChannelNumber(0x4001), turntest.PeerAddress(relayed[2]))
			mustOK(t, b, stun.MethodChannelBind, turntest.ChannelNumber(0x4abc), turntest.PeerAddress(relayed[0]))
			mustOK(t, c, stun.MethodCreatePermission, turntest.PeerAddress(relayed[0]))

			hold.shut(t, a)
			var toB, toC [][]byte
			for i := range 90 {
				size := 1200
				if i%10 == 9 {
					size = 300 + i // a run ends, shorter
				}
				toB = append(toB, payload(size, byte(i)))
				if err := a.Send(a.ChannelData(0x4000, toB[i])); err != nil {
					t.Fatal(err)
				}
				if i%30 == 0 {
					toC = append(toC, payload(50+i, byte(i)))
					if err := a.Send(a.ChannelData(0x4001, toC[len(toC)-1])); err != nil {
						t.Fatal(err)
					}
				}
			}
			hold.open()

			for i, want := range toB {
				if r := turntest.NextRelayed(t, b); r.Channel != 0x4abc || !bytes.Equal(r.Data, want) {
					t.Fatalf("datagram %d at b: channel %#x, %d bytes; want 0x4abc, %d bytes", i, r.Channel, len(r.Data), len(want))
				}
			}
			for i, want := range toC {
				if r := turntest.NextRelayed(t, c); r.Peer != relayed[0] || !bytes.Equal(r.Data, want) {
					t.Fatalf("datagram %d at c: from %v, %d bytes; want a Data indication from %v, %d bytes", i, r.Peer, len(r.Data), relayed[0], len(want))
				}
			}
			ra, rb, rc := relayOf(t, s, relayed[0].Port()), relayOf(t, s, relayed[1].Port()), relayOf(t, s, relayed[2].Port())
			n := uint64(len(toB) + len(toC))
			settle(func() bool {
				return rb.downPackets.Load() == uint64(len(toB)) && rc.downPackets.Load() == uint64(len(toC))
			})
			if ra.hairpins.Load() != n || ra.upPackets.Load() != n || rb.downPackets.Load() != uint64(len(toB)) || rc.downPackets.Load() != uint64(len(toC)) {
				t.Fatalf("handed over %d, sent %d, b's client got %d, c's %d; want %d, %d, %d, %d",
					ra.hairpins.Load(), ra.upPackets.Load(), rb.downPackets.Load(), rc.downPackets.Load(), n, n, len(toB), len(toC))
			}
			if runs := rb.downRuns.Load(); mode.noGSO != (runs == 0) {
				t.Errorf("%d GSO sends to b's client on the %s path", runs, mode.name)
			}
		})
	}
}

// groBurst is what TestRelayGROQueued queues on each leg: coalesced runs
// (the last segment shorter, one of the most segments the kernel
// coalesces) between single datagrams, so that one read brings several
// runs at once.
func groBurst() [][]int {
	run := func(k, size, last int) []int {
		r := make([]int, k, k+1)
		for i := range r {
			r[i] = size
		}
		if last > 0 {
			r = append(r, last)
		}
		return r
	}
	return [][]int{run(10, 1000, 0), {300}, run(maxBatch, 100, 0), {20}, run(4, 1200, 700), {5}, run(3, 50, 49), run(2, 1300, 0), {1}}
}

// TestRelayGROQueued: coalesced runs and single datagrams queued together
// while the readers are held, both ways, so that a read brings several
// runs (each spread into its own datagrams) and single datagrams in one
// go: every datagram arrives whole and in order, and the counters count
// exactly what was relayed.
func TestRelayGROQueued(t *testing.T) {
	holdDown, holdUp := make(chan struct{}), &upHold{}
	s, _ := testServer(t, func(c *Config) { c.SocketBuffer, c.holdRelayReads, c.beforeUpRead = 4<<20, holdDown, holdUp.before })
	if !s.out.gso.on.Load() {
		t.Skip("no UDP GSO in this kernel")
	}
	c := rawClient(t, s, "udp", "gro-queued")
	if err := c.Conn().(*net.UDPConn).SetReadBuffer(4 << 20); err != nil {
		t.Fatal(err)
	}
	relay, err := turntest.RelayedAddressOf(turntest.MustAllocate(t, c))
	if err != nil {
		t.Fatal(err)
	}
	peer, _ := turntest.MustBindPeers(t, c, 0x4000)
	if err := peer.SetReadBuffer(4 << 20); err != nil {
		t.Fatal(err)
	}
	r := relayOf(t, s, relay.Port())

	// Queue both legs: the relay socket's reader waits for holdDown, the
	// listener's at holdUp's gate once it has handled a first datagram
	// (dropped: an unbound channel).
	holdUp.shut(t, c)
	var up, down [][]byte
	var upBytes, downBytes uint64
	for _, sizes := range groBurst() {
		var frames, datagrams [][]byte
		for _, n := range sizes {
			p := payload(n, byte(len(up)+len(frames)))
			frames = append(frames, c.ChannelData(0x4000, p))
			datagrams = append(datagrams, p)
			upBytes += uint64(n)
			downBytes += uint64(n)
		}
		sendGSO(t, c.Conn().(*net.UDPConn), netip.AddrPort{}, frames)
		sendGSO(t, peer, relay, datagrams)
		up, down = append(up, datagrams...), append(down, datagrams...)
	}
	holdUp.open()
	close(holdDown)

	for i, want := range up {
		if got := turntest.ReadPeer(t, peer); !bytes.Equal(got, want) {
			t.Fatalf("datagram %d to the peer: %d bytes (fill %x), want %d of %x", i, len(got), got[:min(len(got), 1)], len(want), want[:min(len(want), 1)])
		}
	}
	for i, want := range down {
		if got := turntest.NextFromPeer(t, c); !bytes.Equal(got, want) {
			t.Fatalf("datagram %d to the client: %d bytes (fill %x), want %d of %x", i, len(got), got[:min(len(got), 1)], len(want), want[:min(len(want), 1)])
		}
	}
	n := uint64(len(up))
	settle(func() bool {
		return r.upPackets.Load() == n && r.upBytes.Load() == upBytes && r.downPackets.Load() == n && r.downBytes.Load() == downBytes
	})
	if p, b := r.upPackets.Load(), r.upBytes.Load(); p != n || b != upBytes {
		t.Errorf("to the peer: counted %d datagrams, %d bytes; want %d, %d", p, b, n, upBytes)
	}
	if p, b := r.downPackets.Load(), r.downBytes.Load(); p != n || b != downBytes {
		t.Errorf("to the client: counted %d datagrams, %d bytes; want %d, %d", p, b, n, downBytes)
	}
	if s.udpConn.groReads.Load() == 0 || r.reader.groReads.Load() == 0 {
		t.Errorf("coalesced reads: listener %d, relay %d", s.udpConn.groReads.Load(), r.reader.groReads.Load())
	}
}

// TestSendIndicationsBatched: Send indications a UDP client queued while
// the listener's reader was held, or a TCP client wrote at once, leave for
// their peer like ChannelData, as GSO runs, whole, in order (empty data
// too) and counted exactly, with ChannelData between them in its place.
func TestSendIndicationsBatched(t *testing.T) {
	for _, network := range []string{"udp", "tcp"} {
		t.Run(network, func(t *testing.T) {
			hold := &upHold{}
			s, _ := testServer(t, func(c *Config) { c.SocketBuffer, c.beforeUpRead = 4<<20, hold.before })
			if !s.out.gso.on.Load() {
				t.Skip("no UDP GSO in this kernel")
			}
			c := rawClient(t, s, network, "send-batched")
			relay, peers := threePeers(t, c)
			var items []burstItem
			for i := range 70 {
				items = append(items, burstItem{2, 1000})
				if i == 30 {
					items = append(items, burstItem{0, 10}, burstItem{1, 20})
				}
			}
			items = append(items, burstItem{2, 500}, burstItem{2, 0}, burstItem{2, 7})
			frames, want := upFrames(c, peers, items)
			if network == "udp" {
				hold.shut(t, c)
				for _, f := range frames {
					if err := c.Send(f); err != nil {
						t.Fatal(err)
					}
				}
				hold.open()
			} else if err := c.Send(bytes.Join(frames, nil)); err != nil {
				t.Fatal(err)
			}
			r := relayOf(t, s, relay.Port())
			expectAtPeers(t, r, peers, want)
			settle(func() bool { return r.upRuns.Load() > 0 })
			if r.upRuns.Load() == 0 {
				t.Error("no GSO send to the peers: the indications went one by one")
			}
		})
	}
}

// TestDataIndicationsBatched: datagrams from a peer with only a permission,
// queued while the relay socket's reader was held, reach the UDP client as
// Data indications framed in place and sent batched (GSO runs, or one
// sendmmsg without GSO), whole, in order (empty ones too), with
// ChannelData between them in its place, and counted exactly.
func TestDataIndicationsBatched(t *testing.T) {
	for _, mode := range batchModes {
		t.Run(mode.name, func(t *testing.T) {
			s, c, hold, relay, peers := heldRelay(t, mode.noGSO, "data-batched")
			peer2 := peers[2].LocalAddr().(*net.UDPAddr).AddrPort()
			type datagram struct {
				peer int
				data []byte
			}
			var burst []datagram
			for i := range 70 {
				burst = append(burst, datagram{2, payload(1000, byte(i))})
				if i == 30 {
					burst = append(burst, datagram{0, payload(10, 1)}, datagram{1, payload(20, 2)})
				}
			}
			burst = append(burst, datagram{2, payload(501, 3)}, datagram{2, nil}, datagram{2, payload(7, 4)})
			var wantBytes uint64
			for _, d := range burst {
				if _, err := peers[d.peer].WriteToUDPAddrPort(d.data, relay); err != nil {
					t.Fatal(err)
				}
				wantBytes += uint64(len(d.data))
			}
			close(hold)

			// The socket reads its queue in order; peer 2's datagrams come
			// in order among themselves, the channels' at their place.
			var got []datagram
			for range burst {
				frame, err := c.ReadFrame(time.Now().Add(3 * time.Second))
				if err != nil {
					t.Fatalf("after %d of %d datagrams: %v", len(got), len(burst), err)
				}
				if frame[0]&0xC0 == 0x40 {
					got = append(got, datagram{int(frame[1]), frame[4:]})
					continue
				}
				from, data, err := turntest.DataIndicationOf(frame)
				if err != nil || from != peer2 {
					t.Fatalf("frame %x...: from %v (%v), want a Data indication from %v", frame[:min(len(frame), 24)], from, err, peer2)
				}
				if len(frame)%4 != 0 {
					t.Fatalf("a Data indication of %d bytes: not padded to 4", len(frame))
				}
				got = append(got, datagram{2, data})
			}
			for i, want := range burst {
				if got[i].peer != want.peer || !bytes.Equal(got[i].data, want.data) {
					t.Fatalf("datagram %d: from peer %d, %d bytes; want peer %d, %d bytes", i, got[i].peer, len(got[i].data), want.peer, len(want.data))
				}
			}
			r := relayOf(t, s, relay.Port())
			settle(func() bool {
				return r.downPackets.Load() == uint64(len(burst)) && r.downBytes.Load() == wantBytes && (mode.noGSO || r.downRuns.Load() > 0)
			})
			if p, b := r.downPackets.Load(), r.downBytes.Load(); p != uint64(len(burst)) || b != wantBytes {
				t.Errorf("counted %d datagrams, %d bytes to the client; want %d, %d", p, b, len(burst), wantBytes)
			}
			if runs := r.downRuns.Load(); mode.noGSO != (runs == 0) {
				t.Errorf("%d GSO sends on the %s path", runs, mode.name)
			}
		})
	}
}
