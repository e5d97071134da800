package turn

import (
	"context"
	"testing"
	"time"

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
