//go:build linux

package turn

import (
	"bufio"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/pion/stun/v3"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"edgerelay/turn/turntest"
)

// sysctlInt reads an integer from /proc/sys.
func sysctlInt(t *testing.T, name string) int {
	t.Helper()
	raw, err := os.ReadFile("/proc/sys/" + strings.ReplaceAll(name, ".", "/"))
	if err != nil {
		t.Fatal(err)
	}
	n, err := strconv.Atoi(strings.TrimSpace(string(raw)))
	if err != nil {
		t.Fatal(err)
	}
	return n
}

func sockopt(t *testing.T, c *net.UDPConn, opt int) int {
	t.Helper()
	rc, err := c.SyscallConn()
	if err != nil {
		t.Fatal(err)
	}
	var v int
	var gerr error
	if err := rc.Control(func(fd uintptr) { v, gerr = syscall.GetsockoptInt(int(fd), syscall.SOL_SOCKET, opt) }); err != nil {
		t.Fatal(err)
	}
	if gerr != nil {
		t.Fatal(gerr)
	}
	return v
}

// wantBuffer is what getsockopt reports for a buffer of size asked for:
// the kernel doubles the value; without CAP_NET_ADMIN (SO_RCVBUFFORCE
// refused) it is capped at the sysctl limit first.
func wantBuffer(t *testing.T, size int, limit string) int {
	if os.Geteuid() != 0 {
		size = min(size, sysctlInt(t, limit))
	}
	return 2 * size
}

// TestSocketBuffer: the setting is applied to the listener and to a live
// allocation's relay socket, receive and send; unset, the default is.
func TestSocketBuffer(t *testing.T) {
	for _, size := range []int{0, 256 << 10, 3 << 20} {
		t.Run(strconv.Itoa(size), func(t *testing.T) {
			s, _ := testServer(t, func(c *Config) { c.SocketBuffer = size })
			asked := size
			if asked == 0 {
				asked = DefaultSocketBuffer
			}
			c := rawClient(t, s, "udp", "sockbuf")
			relay, err := turntest.RelayedAddressOf(turntest.MustAllocate(t, c))
			if err != nil {
				t.Fatal(err)
			}
			for name, conn := range map[string]*net.UDPConn{"listener": s.udp, "relay": relayOf(t, s, relay.Port()).UDPConn} {
				if got, want := sockopt(t, conn, syscall.SO_RCVBUF), wantBuffer(t, asked, "net.core.rmem_max"); got != want {
					t.Errorf("%s SO_RCVBUF %d, want %d (asked %d)", name, got, want, asked)
				}
				if got, want := sockopt(t, conn, syscall.SO_SNDBUF), wantBuffer(t, asked, "net.core.wmem_max"); got != want {
					t.Errorf("%s SO_SNDBUF %d, want %d (asked %d)", name, got, want, asked)
				}
			}
		})
	}
}

// scrapeDrops reads edgerelay_turn_socket_drops_total{socket=...} through
// a real /metrics handler, as Prometheus would.
func scrapeDrops(t *testing.T, reg *prometheus.Registry) map[string]float64 {
	t.Helper()
	srv := httptest.NewServer(promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))
	defer srv.Close()
	res, err := http.Get(srv.URL)
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	got := map[string]float64{}
	sc := bufio.NewScanner(res.Body)
	for sc.Scan() {
		var socket string
		var v float64
		if _, err := fmt.Sscanf(sc.Text(), "edgerelay_turn_socket_drops_total{socket=%q} %g", &socket, &v); err == nil {
			got[socket] = v
		}
	}
	return got
}

// TestSocketDrops floods a relay socket whose reader is held: the
// datagrams the kernel could not queue show in /metrics as relay drops,
// exactly (every datagram is either relayed to the client once the reader
// goes or counted dropped), and the count stays after the allocation
// closes. The series exist at 0 before anything is dropped.
func TestSocketDrops(t *testing.T) {
	hold := make(chan struct{})
	s, reg := testServer(t, func(c *Config) { c.SocketBuffer, c.holdRelayReads = 32<<10, hold })
	if got := scrapeDrops(t, reg); len(got) != 2 || got["listener"] != 0 || got["relay"] != 0 {
		t.Fatalf("drops at start: %v, want listener 0 and relay 0", got)
	}

	c := rawClient(t, s, "udp", "drops")
	relay, err := turntest.RelayedAddressOf(turntest.MustAllocate(t, c))
	if err != nil {
		t.Fatal(err)
	}
	peer, _ := turntest.MustBindPeers(t, c, 0x4000)
	const sent = 300
	payload := make([]byte, 1000)
	for range sent {
		if _, err := peer.WriteToUDPAddrPort(payload, relay); err != nil {
			t.Fatal(err)
		}
	}
	// 64 KiB of receive buffer (32 KiB doubled) holds a few dozen 1,000-byte
	// datagrams (each counts its whole allocation, over 2 KiB on loopback).
	drops := scrapeDrops(t, reg)["relay"]
	if drops < sent/2 || drops >= sent {
		t.Fatalf("relay drops %v with the reader held after %d datagrams, want at least %d and fewer than %d", drops, sent, sent/2, sent)
	}
	close(hold)
	r := relayOf(t, s, relay.Port())
	for deadline := time.Now().Add(3 * time.Second); r.downPackets.Load()+uint64(drops) < sent; {
		if time.Now().After(deadline) {
			t.Fatalf("relayed %d + dropped %v of %d datagrams", r.downPackets.Load(), drops, sent)
		}
		time.Sleep(5 * time.Millisecond)
	}
	if got := r.downPackets.Load() + uint64(drops); got != sent {
		t.Errorf("relayed %d + dropped %v = %d, want %d", r.downPackets.Load(), drops, got, sent)
	}
	if got := scrapeDrops(t, reg); got["relay"] != drops || got["listener"] != 0 {
		t.Errorf("drops after the reader caught up: %v, want relay %v, listener 0", got, drops)
	}

	// Closed, the socket's count is kept in the total.
	if code, _ := turntest.MustRequest(t, c, stun.MethodRefresh, turntest.Lifetime(0)); code != 0 {
		t.Fatalf("Refresh to 0: %d", code)
	}
	for deadline := time.Now().Add(3 * time.Second); s.Allocations() > 0; {
		if time.Now().After(deadline) {
			t.Fatal("allocation still live")
		}
		time.Sleep(5 * time.Millisecond)
	}
	for deadline := time.Now().Add(3 * time.Second); ; {
		s.relays.mu.RLock()
		open := len(s.relays.byPort)
		s.relays.mu.RUnlock()
		if open == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("relay socket still open")
		}
		time.Sleep(5 * time.Millisecond)
	}
	if got := scrapeDrops(t, reg)["relay"]; got != drops {
		t.Errorf("relay drops after the allocation closed: %v, want %v", got, drops)
	}
}
