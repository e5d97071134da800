package turnbench

import (
	"net"
	"os"
	"testing"
	"time"
)

// TestProcessUDPDrops fills a socket of this process that nobody reads
// (its receive buffer at the kernel's minimum) and finds the kernel's
// drops in ProcessUDPDrops: exactly the datagrams that did not fit.
func TestProcessUDPDrops(t *testing.T) {
	before, err := ProcessUDPDrops(os.Getpid())
	if err != nil {
		t.Fatal(err)
	}
	c, err := net.ListenUDP("udp", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1)})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if err := c.SetReadBuffer(1); err != nil { // the kernel's minimum
		t.Fatal(err)
	}
	w, err := net.ListenUDP("udp", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1)})
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	// A socket closed between the readings does not make the count go
	// negative: this one has drops in before and is gone from after.
	gone, err := net.ListenUDP("udp", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1)})
	if err != nil {
		t.Fatal(err)
	}
	_ = gone.SetReadBuffer(1)
	for range 50 {
		_, _ = w.WriteToUDP(make([]byte, 1000), gone.LocalAddr().(*net.UDPAddr))
	}
	if before, err = ProcessUDPDrops(os.Getpid()); err != nil {
		t.Fatal(err)
	}
	if before.Total() == 0 {
		t.Fatal("no drops on the socket about to close")
	}
	_ = gone.Close()
	const sent = 100
	for range sent {
		if _, err := w.WriteToUDP(make([]byte, 1000), c.LocalAddr().(*net.UDPAddr)); err != nil {
			t.Fatal(err)
		}
	}
	after, err := ProcessUDPDrops(os.Getpid())
	if err != nil {
		t.Fatal(err)
	}
	// Count what was queued by reading it all.
	queued := 0
	buf := make([]byte, 2000)
	for {
		_ = c.SetReadDeadline(time.Now().Add(50 * time.Millisecond))
		if _, err := c.Read(buf); err != nil {
			break
		}
		queued++
	}
	if got := after.DropsSince(before); got != uint64(sent-queued) || got == 0 {
		t.Errorf("drops %d, want %d (%d sent, %d queued)", got, sent-queued, sent, queued)
	}
}
