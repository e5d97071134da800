package turn

import (
	"context"
	"io"
	"testing"
	"time"

	"github.com/pion/stun/v3"

	"edgerelay/turn/turntest"
)

// TestRelayAllocs proves the ChannelData fast path allocates nothing per
// datagram in steady state: client to peer through the listener socket,
// peer to client through the relay socket, over real loopback sockets. The
// count is process-wide, so the test's own client and echo peer are
// allocation-free too (turntest's raw ChannelData path).
func TestRelayAllocs(t *testing.T) {
	if raceEnabled {
		t.Skip("the race detector allocates on its own; make test runs this without it")
	}
	for _, size := range []int{120, 1200} {
		s, _ := testServer(t, nil)
		peer := echoPeer(t)
		u, p := creds("allocs")
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
		back := make(chan struct{}, 1)
		a.Conn.OnData(func([]byte) { back <- struct{}{} })
		frame := make([]byte, 4+size)
		timeout := time.NewTimer(time.Hour) // time.After would allocate per call
		roundTrip := func() {
			timeout.Reset(time.Second)
			if err := a.Conn.Send(frame); err != nil {
				t.Fatal(err)
			}
			select {
			case <-back:
			case <-timeout.C:
				t.Fatal("a datagram was lost on loopback")
			}
		}
		for range 100 { // warm up: pools, maps, the scheduler
			roundTrip()
		}
		if allocs := testing.AllocsPerRun(2000, roundTrip); allocs != 0 {
			t.Errorf("%d B payload: %v allocations per relayed round trip, want 0", size, allocs)
		}
	}
}

// TestIndicationAllocs proves the same of Send and Data indications (a
// client that has not bound a channel): client to peer as a Send
// indication, peer to client as a Data indication, both built and parsed
// by our code rather than pion's.
func TestIndicationAllocs(t *testing.T) {
	if raceEnabled {
		t.Skip("the race detector allocates on its own; make test runs this without it")
	}
	s, _ := testServer(t, nil)
	peer := echoPeer(t)
	c := rawClient(t, s, "udp", "indication-allocs")
	turntest.MustAllocate(t, c)
	peerAddr := peer.Addr().AddrPort()
	if code, _ := turntest.MustRequest(t, c, stun.MethodCreatePermission, turntest.PeerAddress(peerAddr)); code != 0 {
		t.Fatalf("CreatePermission: %d", code)
	}
	send := turntest.SendIndication(peerAddr, make([]byte, 1200))
	conn := c.Conn()
	_ = conn.SetReadDeadline(time.Now().Add(time.Minute)) // once: a deadline per read would allocate
	buf := make([]byte, 2048)
	roundTrip := func() {
		if _, err := conn.Write(send); err != nil {
			t.Fatal(err)
		}
		n, err := conn.Read(buf)
		if err != nil {
			t.Fatal(err)
		}
		if n < 20 || buf[0] != 0x00 || buf[1] != 0x17 {
			t.Fatalf("got %x, want a Data indication", buf[:min(n, 20)])
		}
	}
	for range 100 {
		roundTrip()
	}
	if allocs := testing.AllocsPerRun(2000, roundTrip); allocs != 0 {
		t.Errorf("%v allocations per relayed round trip of indications, want 0", allocs)
	}
}

// TestStreamRelayAllocs proves the same of a TCP client's ChannelData: up
// through the stream's queue to the peer, back as a stream write of the
// relay socket's batch. (Over TLS crypto/tls allocates once per socket
// read of its own; the relay's code does not.)
func TestStreamRelayAllocs(t *testing.T) {
	if raceEnabled {
		t.Skip("the race detector allocates on its own; make test runs this without it")
	}
	for _, size := range []int{120, 1200} {
		s, _ := testServer(t, nil)
		peer := echoPeer(t)
		c := rawClient(t, s, "tcp", "stream-allocs")
		turntest.MustAllocate(t, c)
		if code, _ := turntest.MustRequest(t, c, stun.MethodChannelBind, turntest.ChannelNumber(0x4000),
			turntest.PeerAddress(peer.Addr().AddrPort())); code != 0 {
			t.Fatalf("ChannelBind: %d", code)
		}
		frame := c.ChannelData(0x4000, make([]byte, size))
		back := make([]byte, len(frame))
		conn := c.Conn()
		_ = conn.SetDeadline(time.Now().Add(time.Minute)) // once: a deadline per call would allocate
		roundTrip := func() {
			if _, err := conn.Write(frame); err != nil {
				t.Fatal(err)
			}
			if _, err := io.ReadFull(conn, back); err != nil {
				t.Fatal(err)
			}
		}
		for range 100 {
			roundTrip()
		}
		if back[0] != 0x40 || back[1] != 0x00 {
			t.Fatalf("got %x, want ChannelData on 0x4000", back[:4])
		}
		if allocs := testing.AllocsPerRun(2000, roundTrip); allocs != 0 {
			t.Errorf("%d B payload: %v allocations per relayed round trip over TCP, want 0", size, allocs)
		}
	}
}
