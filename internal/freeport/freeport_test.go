package freeport

import (
	"net"
	"os"
	"path/filepath"
	"strconv"
	"syscall"
	"testing"
)

// TestHandedOutOncePerLock: ports are below the ephemeral range, bindable,
// and never handed out twice while their test holds them.
func TestHandedOutOncePerLock(t *testing.T) {
	seen := map[string]bool{}
	for range 200 {
		addr := TCPAndUDP(t)
		if seen[addr] {
			t.Fatalf("%s handed out twice", addr)
		}
		seen[addr] = true
		_, port, _ := net.SplitHostPort(addr)
		p, _ := strconv.Atoi(port)
		if p < Floor || p >= ephemeralLow() {
			t.Fatalf("port %d outside [%d, %d)", p, Floor, ephemeralLow())
		}
		l, err := net.Listen("tcp4", addr)
		if err != nil {
			t.Fatalf("TCP on %s: %v", addr, err)
		}
		u, err := net.ListenPacket("udp4", addr)
		if err != nil {
			t.Fatalf("UDP on %s: %v", addr, err)
		}
		_ = l.Close()
		_ = u.Close()
	}
}

// TestLockedPortSkipped: a port whose lock another holder has (another
// test binary) is not handed out.
func TestLockedPortSkipped(t *testing.T) {
	dir := filepath.Join(os.TempDir(), "edgerelay-freeport")
	// Lock every port of a small range but one, as other processes
	// would; the one left is what reserveIn must find.
	if err := os.MkdirAll(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	low := Floor + 64
	want := Floor + 37
	var held []*os.File
	defer func() {
		for _, f := range held {
			_ = f.Close()
		}
	}()
	for p := Floor; p < low; p++ {
		if p == want {
			continue
		}
		f, err := os.OpenFile(filepath.Join(dir, strconv.Itoa(p)), os.O_CREATE|os.O_RDWR, 0o600)
		if err != nil {
			t.Fatal(err)
		}
		held = append(held, f)
		_ = syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB)
	}
	got := reserveIn(t, Floor, low, 1, []string{"tcp"})
	if got != net.JoinHostPort("127.0.0.1", strconv.Itoa(want)) {
		t.Fatalf("got %s, want the one unlocked port %d", got, want)
	}
}

// TestUDPPair: both ports of a pair bind.
func TestUDPPair(t *testing.T) {
	p := UDPPair(t)
	for _, port := range []int{p, p + 1} {
		c, err := net.ListenPacket("udp4", net.JoinHostPort("127.0.0.1", strconv.Itoa(port)))
		if err != nil {
			t.Fatalf("UDP %d: %v", port, err)
		}
		_ = c.Close()
	}
}
