// Package freeport reserves loopback ports for tests whose servers must be
// told their address before they bind it (cluster routes configured up
// front, a server restarted on its old address, a binary started with
// --listen).
//
// A port found free is closed again before the server binds it, so two
// kinds of neighbour could take it in that moment:
//   - the kernel, for listeners on port 0 and the source ports of outgoing
//     connections (the tests make thousands): it picks from the ephemeral
//     range, so freeport picks below it;
//   - another freeport caller, in this test process or in another
//     package's test binary running beside it: each port handed out is
//     locked with flock(2) on a file named after it until the test ends,
//     and a port whose lock is held is never handed out.
//
// Only a program outside the tests binding a fixed port in that range can
// still collide, and the tests own this machine while they run.
package freeport

import (
	"fmt"
	"math/rand/v2"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
)

// Floor is the lowest port handed out: above the well-known and most
// registered services' ports.
const Floor = 10000

// TCP is "127.0.0.1:<port>" with the port free for TCP.
func TCP(t testing.TB) string {
	t.Helper()
	return reserve(t, 1, "tcp")
}

// TCPAndUDP is "127.0.0.1:<port>" with the port free for both TCP and UDP
// (a STUN/TURN listener takes both).
func TCPAndUDP(t testing.TB) string {
	t.Helper()
	return reserve(t, 1, "tcp", "udp")
}

// UDPPair is a port p with p and p+1 both free for UDP (a relay port range
// of two).
func UDPPair(t testing.TB) int {
	t.Helper()
	_, port, _ := net.SplitHostPort(reserve(t, 2, "udp"))
	p, _ := strconv.Atoi(port)
	return p
}

// reserve finds n consecutive ports free on every network given, locks
// them until the test ends and returns the first as a loopback address.
func reserve(t testing.TB, n int, networks ...string) string {
	t.Helper()
	return reserveIn(t, Floor, ephemeralLow(), n, networks)
}

// reserveIn is reserve among the ports [lo, hi). It starts at a random
// port, so that callers seldom try the same ports, and goes on from there
// through the whole range.
func reserveIn(t testing.TB, lo, hi, n int, networks []string) string {
	t.Helper()
	dir := filepath.Join(os.TempDir(), "edgerelay-freeport")
	if err := os.MkdirAll(dir, 0o700); err != nil {
		t.Fatalf("freeport: %v", err)
	}
	span := hi - lo - n + 1
	start := rand.IntN(span)
	for i := range span {
		first := lo + (start+i)%span
		locks, ok := lockRun(dir, first, n)
		if !ok {
			continue
		}
		if freeOn(first, n, networks) {
			t.Cleanup(func() {
				for _, f := range locks {
					_ = f.Close() // closing the file drops its lock
				}
			})
			return net.JoinHostPort("127.0.0.1", strconv.Itoa(first))
		}
		for _, f := range locks {
			_ = f.Close()
		}
	}
	t.Fatalf("freeport: no %d free port(s) between %d and %d", n, lo, hi)
	return ""
}

// lockRun takes the locks of ports first..first+n-1, or none.
func lockRun(dir string, first, n int) ([]*os.File, bool) {
	var locks []*os.File
	for p := first; p < first+n; p++ {
		f, err := os.OpenFile(filepath.Join(dir, strconv.Itoa(p)), os.O_CREATE|os.O_RDWR, 0o600)
		if err == nil {
			// Locks belong to the open file, so a second open in this
			// process is refused as well as one in another.
			err = syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB)
			if err != nil {
				_ = f.Close()
			}
		}
		if err != nil {
			for _, l := range locks {
				_ = l.Close()
			}
			return nil, false
		}
		locks = append(locks, f)
	}
	return locks, true
}

// freeOn reports whether every port of the run can be bound on every
// network right now.
func freeOn(first, n int, networks []string) bool {
	for p := first; p < first+n; p++ {
		addr := net.JoinHostPort("127.0.0.1", strconv.Itoa(p))
		for _, nw := range networks {
			if err := tryBind(nw, addr); err != nil {
				return false
			}
		}
	}
	return true
}

func tryBind(network, addr string) error {
	switch network {
	case "tcp":
		l, err := net.Listen("tcp4", addr)
		if err != nil {
			return err
		}
		return l.Close()
	case "udp":
		c, err := net.ListenPacket("udp4", addr)
		if err != nil {
			return err
		}
		return c.Close()
	}
	return fmt.Errorf("freeport: unknown network %q", network)
}

// ephemeralLow is the start of the kernel's ephemeral port range (Linux's
// default where it cannot be read).
func ephemeralLow() int {
	low := 32768
	if b, err := os.ReadFile("/proc/sys/net/ipv4/ip_local_port_range"); err == nil {
		if f := strings.Fields(string(b)); len(f) == 2 {
			if n, err := strconv.Atoi(f[0]); err == nil && n > Floor+1000 {
				low = n
			}
		}
	}
	return low
}
