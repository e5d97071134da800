package main

import (
	"bytes"
	"net"
	"net/netip"
	"testing"
	"time"

	"github.com/pion/stun/v3"

	"edgerelay/internal/freeport"
	"edgerelay/turn"
	"edgerelay/turn/turntest"
)

const hardeningSecret = "turn-hardening-secret"

// startHardenedTURN runs the binary with TURN on a free loopback port, loopback
// peers open (the tests' peers live there) and extra env.
func startHardenedTURN(t *testing.T, env ...string) string {
	t.Helper()
	addr := freeport.TCPAndUDP(t)
	startServer(t, append([]string{"RELAY_TURN_LISTEN=" + addr, "RELAY_TURN_SECRET=" + hardeningSecret,
		"RELAY_TURN_ALLOW_PEERS=127.0.0.0/8"}, env...)...)
	return addr
}

// hardenedClient is a raw STUN client of the binary's TURN listener.
func hardenedClient(t *testing.T, network, addr, label string) *turntest.STUNClient {
	t.Helper()
	user, pass := turn.Credentials(hardeningSecret, label, time.Hour, time.Now())
	c, err := turntest.DialSTUN(network, addr, user, pass)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close() })
	return c
}

// TestTURNDeniesPeersNotGloballyReachable: CreatePermission and ChannelBind
// to any address IANA's special-purpose registries mark not globally
// reachable, in any IPv6 form that leads to one, answer 403;
// RELAY_TURN_ALLOW_PEERS opens exactly what it lists. (Permissions only:
// no datagram is sent to any of these addresses.)
func TestTURNDeniesPeersNotGloballyReachable(t *testing.T) {
	addr := startHardenedTURN(t, "RELAY_TURN_ALLOW_PEERS=127.0.0.0/8,100.64.0.0/16")
	c := hardenedClient(t, "udp", addr, "peers")
	turntest.MustAllocate(t, c)
	denied := []string{
		"100.100.100.200", "100.65.0.1", "100.127.255.255", "192.0.0.1", "192.0.0.9", "192.0.0.10", "192.0.2.1",
		"192.88.99.1", "198.18.0.1", "198.19.255.255", "198.51.100.1", "203.0.113.1", "240.0.0.1",
		"255.255.255.255", "224.0.0.1", "0.0.0.0", "10.0.0.1", "169.254.169.254", "172.16.0.1", "192.168.0.1",
		"::ffff:100.100.100.200", "::ffff:169.254.169.254", "::127.0.0.2", "64:ff9b::a9fe:a9fe", "64:ff9b:1::808:808",
		"2002:c612:1::", "2002:a00:1::", "2001:0:4136:e378:8000:63bf:f5ff:fffe", "2001:db8::1", "2001:2::1",
		"3fff::1", "5f00::1", "100::1", "fd00::1", "fe80::1", "ff02::1", "::", "::1", "4000::1",
	}
	for _, a := range denied {
		peer := turntest.PeerAddress(netip.AddrPortFrom(netip.MustParseAddr(a), 9))
		if code, _ := turntest.MustRequest(t, c, stun.MethodCreatePermission, peer); code != 403 {
			t.Errorf("CreatePermission to %s: %d, want 403", a, code)
		}
	}
	if code, _ := turntest.MustRequest(t, c, stun.MethodChannelBind, turntest.ChannelNumber(0x4000),
		turntest.PeerAddress(netip.MustParseAddrPort("100.100.100.200:80"))); code != 403 {
		t.Errorf("ChannelBind to 100.100.100.200: %d, want 403", code)
	}
	for _, a := range []string{"100.64.0.1", "100.64.255.255", "::ffff:100.64.0.1", "64:ff9b::6440:1", "8.8.8.8", "2606:4700::1111"} {
		peer := turntest.PeerAddress(netip.AddrPortFrom(netip.MustParseAddr(a), 9))
		if code, _ := turntest.MustRequest(t, c, stun.MethodCreatePermission, peer); code != 0 {
			t.Errorf("CreatePermission to %s: %d, want a success", a, code)
		}
	}
}

// TestTURNProtocolEdges: the RFC 8656 answers a client gets where pion's
// differ, over UDP and TCP.
func TestTURNProtocolEdges(t *testing.T) {
	addr := startHardenedTURN(t)
	peer := turntest.PeerAddress(netip.MustParseAddrPort("127.0.0.1:9"))
	for _, network := range []string{"udp", "tcp"} {
		// Without an allocation: 437 (pion answered nothing, or 200 to a
		// Refresh with LIFETIME 0).
		c := hardenedClient(t, network, addr, "edges")
		for _, r := range []struct {
			method stun.Method
			attrs  []stun.Setter
		}{
			{stun.MethodRefresh, nil}, {stun.MethodRefresh, []stun.Setter{turntest.Lifetime(0)}},
			{stun.MethodCreatePermission, []stun.Setter{peer}},
			{stun.MethodChannelBind, []stun.Setter{turntest.ChannelNumber(0x4000), peer}},
		} {
			if code, _ := turntest.MustRequest(t, c, r.method, r.attrs...); code != 437 {
				t.Errorf("%s %v without an allocation: %d, want 437", network, r.method, code)
			}
		}
		// LIFETIME 0 on an Allocate: the default lifetime (pion: 508).
		res := turntest.MustAllocate(t, c, turntest.Lifetime(0))
		if got := turntest.LifetimeOf(res); got != 600 {
			t.Errorf("%s Allocate LIFETIME 0: lifetime %d, want 600", network, got)
		}
		// Channel numbers: 0x4000-0x7FFF bind, others are 400 (pion bound
		// any number).
		port := uint16(100)
		for _, ch := range []struct {
			number uint16
			code   int
		}{{0x0001, 400}, {0x3FFF, 400}, {0x4000, 0}, {0x7FFF, 0}, {0x8000, 400}, {0xFFFF, 400}} {
			port++
			p := turntest.PeerAddress(netip.AddrPortFrom(netip.MustParseAddr("127.0.0.1"), port))
			if code, _ := turntest.MustRequest(t, c, stun.MethodChannelBind, turntest.ChannelNumber(ch.number), p); code != ch.code {
				t.Errorf("%s ChannelBind %#04x: %d, want %d", network, ch.number, code, ch.code)
			}
		}
	}
}

// TestTURNRelaysDatagramsUpToTheLegsMaximum: peer datagrams and ChannelData
// up to what each leg carries are relayed both ways (pion's 1,600-byte
// buffers dropped everything from 1,596 bytes up, silently); over UDP the
// first byte past the client leg's maximum is dropped, and the marker
// datagram sent after it is what arrives.
func TestTURNRelaysDatagramsUpToTheLegsMaximum(t *testing.T) {
	addr := startHardenedTURN(t)
	const maxIPv4 = 65535 - 20 - 8 // UDP payload over IPv4
	for _, network := range []string{"udp", "tcp"} {
		channelMax, indicationMax := maxIPv4-4, maxIPv4-36-3 // headers; a Data indication pads to 4
		if network == "tcp" {
			channelMax, indicationMax = maxIPv4, maxIPv4
		}
		c := hardenedClient(t, network, addr, "big")
		relay, err := turntest.RelayedAddressOf(turntest.MustAllocate(t, c))
		if err != nil {
			t.Fatal(err)
		}
		relayAddr := net.UDPAddrFromAddrPort(relay)
		chPeer, indPeer := turntest.MustBindPeers(t, c, 0x4001)
		indAddr := indPeer.LocalAddr().(*net.UDPAddr).AddrPort()
		for _, leg := range []struct {
			name string
			peer *net.UDPConn
			max  int
		}{{"ChannelData", chPeer, channelMax}, {"Data indication", indPeer, indicationMax}} {
			drop := 0
			if leg.max < maxIPv4 {
				drop = leg.max + 1
			}
			turntest.ExpectToClient(t, c, leg.peer, relayAddr, network+" "+leg.name, []int{1595, 1596, 1600, leg.max}, drop)
		}
		for _, n := range []int{1595, 1600, min(channelMax, maxIPv4)} {
			want := bytes.Repeat([]byte{byte(n)}, n)
			if err := c.Send(c.ChannelData(0x4001, want)); err != nil {
				t.Fatal(err)
			}
			if got := turntest.ReadPeer(t, chPeer); !bytes.Equal(got, want) {
				t.Fatalf("%s ChannelData of %d bytes to the peer: got %d", network, n, len(got))
			}
		}
		for _, n := range []int{1595, 1600, indicationMax} {
			want := bytes.Repeat([]byte{byte(n)}, n)
			if err := c.Send(turntest.SendIndication(indAddr, want)); err != nil {
				t.Fatal(err)
			}
			if got := turntest.ReadPeer(t, indPeer); !bytes.Equal(got, want) {
				t.Fatalf("%s Send indication of %d bytes to the peer: got %d", network, n, len(got))
			}
		}
	}
}
