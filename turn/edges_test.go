package turn

import (
	"bytes"
	"crypto/tls"
	"net"
	"net/netip"
	"testing"
	"time"

	"github.com/pion/stun/v3"

	"edgerelay/turn/turntest"
)

// rawClient is a raw STUN client of s over network ("udp", "tcp", or
// "tls" to a server with a TLS listener).
func rawClient(t *testing.T, s *Server, network, label string) *turntest.STUNClient {
	t.Helper()
	user, pass := creds(label)
	var c *turntest.STUNClient
	if network == "tls" {
		conn, err := tls.Dial("tcp", s.TLSAddr().String(), &tls.Config{InsecureSkipVerify: true}) //nolint:gosec // a test certificate
		if err != nil {
			t.Fatal(err)
		}
		c = turntest.NewSTUNClient(conn, true, user, pass)
	} else {
		var err error
		if c, err = turntest.DialSTUN(network, s.Addr().String(), user, pass); err != nil {
			t.Fatal(err)
		}
	}
	t.Cleanup(func() { _ = c.Close() })
	return c
}

var transports = []string{"udp", "tcp"}

// TestNoAllocation437 sends every request but Allocate from a 5-tuple with
// no allocation: RFC 8656 §5 answers 437. pion answered nothing to
// CreatePermission and ChannelBind and 200 to a Refresh with LIFETIME 0.
func TestNoAllocation437(t *testing.T) {
	s, _ := testServer(t, nil)
	peer := turntest.PeerAddress(netip.MustParseAddrPort("127.0.0.1:9"))
	for _, network := range transports {
		c := rawClient(t, s, network, "mismatch")
		for _, r := range []struct {
			name   string
			method stun.Method
			authed bool
			attrs  []stun.Setter
		}{
			{"Refresh", stun.MethodRefresh, true, nil},
			{"Refresh LIFETIME 0", stun.MethodRefresh, true, []stun.Setter{turntest.Lifetime(0)}},
			{"Refresh LIFETIME 600", stun.MethodRefresh, true, []stun.Setter{turntest.Lifetime(600)}},
			{"CreatePermission", stun.MethodCreatePermission, true, []stun.Setter{peer}},
			{"ChannelBind", stun.MethodChannelBind, true, []stun.Setter{turntest.ChannelNumber(0x4000), peer}},
			{"unsigned Refresh", stun.MethodRefresh, false, nil},
			{"unsigned CreatePermission", stun.MethodCreatePermission, false, []stun.Setter{peer}},
			{"unsigned ChannelBind", stun.MethodChannelBind, false, []stun.Setter{turntest.ChannelNumber(0x4000), peer}},
		} {
			res, err := c.Request(r.method, r.authed, r.attrs...)
			if err != nil {
				t.Fatalf("%s %s: %v", network, r.name, err)
			}
			if code := turntest.ErrorCodeOf(res); code != 437 {
				t.Errorf("%s %s without an allocation: %d, want 437", network, r.name, code)
			}
		}
		turntest.MustAllocate(t, c)
		if code, _ := turntest.MustRequest(t, c, stun.MethodRefresh); code != 0 {
			t.Errorf("%s Refresh of the allocation: %d", network, code)
		}
		if code, _ := turntest.MustRequest(t, c, stun.MethodCreatePermission, peer); code != 0 {
			t.Errorf("%s CreatePermission on the allocation: %d", network, code)
		}
		if code, res := turntest.MustRequest(t, c, stun.MethodRefresh, turntest.Lifetime(0)); code != 0 || turntest.LifetimeOf(res) != 0 {
			t.Errorf("%s Refresh LIFETIME 0: %d, lifetime %d", network, code, turntest.LifetimeOf(res))
		}
		waitFor(t, "the allocation to go", func() bool { return s.Allocations() == 0 })
		if code, _ := turntest.MustRequest(t, c, stun.MethodRefresh); code != 437 {
			t.Errorf("%s Refresh after the deletion: %d, want 437", network, code)
		}
	}
}

// TestWrongCredentials441: a request on an allocation under another
// username than the allocation's is refused (RFC 8656 §5).
func TestWrongCredentials441(t *testing.T) {
	s, _ := testServer(t, nil)
	for _, network := range transports {
		c := rawClient(t, s, network, "owner")
		turntest.MustAllocate(t, c)
		other := c.As(creds("intruder"))
		if code, _ := turntest.MustRequest(t, other, stun.MethodRefresh); code != 441 {
			t.Errorf("%s Refresh under another username: %d, want 441", network, code)
		}
		if code, _ := turntest.MustRequest(t, c, stun.MethodRefresh); code != 0 {
			t.Errorf("%s Refresh by the owner: %d", network, code)
		}
	}
}

// TestAllocationLifetime: RFC 8656 §7.2/§7.3 grant the requested lifetime
// clamped to the default (600 s) and the server's maximum (3599 s here);
// an Allocate with LIFETIME 0 gets the default (pion failed it with 508).
func TestAllocationLifetime(t *testing.T) {
	s, _ := testServer(t, nil)
	for _, network := range transports {
		for _, c := range []struct {
			requested int64 // -1: no LIFETIME
			granted   int
		}{
			{-1, 600}, {0, 600}, {1, 600}, {599, 600}, {600, 600}, {601, 601}, {3599, 3599}, {3600, 3599}, {86400, 3599}, {1<<32 - 1, 3599},
		} {
			cl := rawClient(t, s, network, "lifetime")
			var attrs []stun.Setter
			if c.requested >= 0 {
				attrs = append(attrs, turntest.Lifetime(uint32(c.requested)))
			}
			res := turntest.MustAllocate(t, cl, attrs...)
			if got := turntest.LifetimeOf(res); got != c.granted {
				t.Errorf("%s Allocate LIFETIME %d: granted %d, want %d", network, c.requested, got, c.granted)
			}
		}
		cl := rawClient(t, s, network, "refresh")
		turntest.MustAllocate(t, cl)
		for _, c := range []struct{ requested, granted int }{{1, 600}, {1200, 1200}, {7200, 3599}} {
			code, res := turntest.MustRequest(t, cl, stun.MethodRefresh, turntest.Lifetime(uint32(c.requested)))
			if got := turntest.LifetimeOf(res); code != 0 || got != c.granted {
				t.Errorf("%s Refresh LIFETIME %d: %d, granted %d, want %d", network, c.requested, code, got, c.granted)
			}
		}
	}
}

// TestChannelBindRange: channel numbers are 0x4000-0x7FFF (RFC 5766; RFC
// 8656's 0x4FFF would refuse what Chrome and coturn's client pick, see
// channelNumberValid); pion bound any number, 0x0000 included.
func TestChannelBindRange(t *testing.T) {
	s, _ := testServer(t, nil)
	for _, network := range transports {
		c := rawClient(t, s, network, "channels")
		turntest.MustAllocate(t, c)
		port := uint16(9)
		for _, ch := range []struct {
			number uint16
			code   int
		}{{0x0000, 400}, {0x0001, 400}, {0x3FFF, 400}, {0x4000, 0}, {0x4001, 0}, {0x4FFF, 0}, {0x5000, 0}, {0x7FFF, 0}, {0x8000, 400}, {0xFFFF, 400}} {
			port++
			peer := turntest.PeerAddress(netip.AddrPortFrom(netip.MustParseAddr("127.0.0.1"), port))
			if code, _ := turntest.MustRequest(t, c, stun.MethodChannelBind, turntest.ChannelNumber(ch.number), peer); code != ch.code {
				t.Errorf("%s ChannelBind %#04x: %d, want %d", network, ch.number, code, ch.code)
			}
		}
		if code, _ := turntest.MustRequest(t, c, stun.MethodChannelBind, turntest.PeerAddress(netip.MustParseAddrPort("127.0.0.1:9"))); code != 400 {
			t.Errorf("%s ChannelBind without CHANNEL-NUMBER: %d, want 400", network, code)
		}
	}
}

// TestResign checks the in-place rewrite against pion's own checks.
func TestResign(t *testing.T) {
	user, _ := creds("resign")
	key := longTermKey(testSecret, user, testRealm)
	for _, fp := range []bool{true, false} {
		setters := []stun.Setter{stun.TransactionID, stun.NewType(stun.MethodAllocate, stun.ClassRequest),
			turntest.TransportUDP, turntest.Lifetime(0), stun.NewUsername(user), stun.NewRealm(testRealm),
			stun.NewNonce("nonce"), stun.MessageIntegrity(key)}
		if fp {
			setters = append(setters, stun.Fingerprint)
		}
		// As screen does: decoded, so attribute values are slices of Raw.
		m := &stun.Message{Raw: stun.MustBuild(setters...).Raw}
		if err := m.Decode(); err != nil {
			t.Fatal(err)
		}
		fixLifetime(m, stun.MethodAllocate, key)
		check := &stun.Message{Raw: append([]byte(nil), m.Raw...)}
		if err := check.Decode(); err != nil {
			t.Fatal(err)
		}
		if got := turntest.LifetimeOf(check); got != 600 {
			t.Errorf("LIFETIME %d after the rewrite, want 600", got)
		}
		if err := stun.MessageIntegrity(key).Check(check); err != nil {
			t.Errorf("MESSAGE-INTEGRITY after the rewrite: %v", err)
		}
		if fp {
			if err := stun.Fingerprint.Check(check); err != nil {
				t.Errorf("FINGERPRINT after the rewrite: %v", err)
			}
		}
	}
}

// withTLS gives the server a turns: listener on a self-signed certificate.
func withTLS(t *testing.T, c *Config) {
	c.TLS = &tls.Config{Certificates: []tls.Certificate{selfSigned(t)}, MinVersion: tls.VersionTLS12}
	c.TLSListen = "127.0.0.1:0"
}

// settle waits, at most five seconds, for counters that the relay adds
// after its sends: a peer or client may have read a batch before they
// are. The caller then checks them, with their values in its errors.
func settle(cond func() bool) {
	for deadline := time.Now().Add(5 * time.Second); !cond() && time.Now().Before(deadline); {
		time.Sleep(time.Millisecond)
	}
}

// relayOf finds the live allocation's relay socket by its relayed port.
func relayOf(t *testing.T, s *Server, port uint16) *relayConn {
	t.Helper()
	s.relays.mu.RLock()
	defer s.relays.mu.RUnlock()
	r := s.relays.byPort[int(port)]
	if r == nil {
		t.Fatalf("no relay socket on port %d", port)
	}
	return r
}

func payload(n int, fill byte) []byte { return bytes.Repeat([]byte{fill}, n) }

// TestBigDatagrams relays datagrams up to what each leg can carry, both
// ways, as ChannelData and as Send and Data indications, over UDP, TCP and TLS,
// and checks that the first size past each leg's limit is dropped (the
// next datagram, a small marker, is what arrives). pion's 1,600-byte
// buffers dropped everything from 1,596 bytes up.
func TestBigDatagrams(t *testing.T) {
	cert := selfSigned(t)
	s, _ := testServer(t, func(c *Config) {
		c.TLS = &tls.Config{Certificates: []tls.Certificate{cert}, MinVersion: tls.VersionTLS12}
		c.TLSListen = "127.0.0.1:0"
	})
	marker := []byte("marker")
	for _, network := range []string{"udp", "tcp", "tls"} {
		// Over UDP a frame to the client is at most 65,507 bytes; a stream
		// frame's length field allows 65,535 and the peer's IPv4 socket
		// caps a datagram at 65,507.
		channelMax, indicationMax := maxIPv4Datagram-4, maxIPv4Datagram-36-3 // the data padded to 4
		if network != "udp" {
			channelMax, indicationMax = maxIPv4Datagram, maxIPv4Datagram
		}
		c := rawClient(t, s, network, "big")
		res := turntest.MustAllocate(t, c)
		relay, err := turntest.RelayedAddressOf(res)
		if err != nil {
			t.Fatal(err)
		}
		relayAddr := net.UDPAddrFromAddrPort(relay)
		chPeer, indPeer := turntest.MustBindPeers(t, c, 0x4001)
		indAddr := indPeer.LocalAddr().(*net.UDPAddr).AddrPort()

		// Peer to client, as ChannelData and as Data indications.
		for _, leg := range []struct {
			name string
			peer *net.UDPConn
			max  int
		}{{"ChannelData", chPeer, channelMax}, {"Data indication", indPeer, indicationMax}} {
			drop := 0
			if leg.max < maxIPv4Datagram {
				drop = leg.max + 1
			}
			turntest.ExpectToClient(t, c, leg.peer, relayAddr, network+" "+leg.name, []int{1595, 1596, 1600, 9000, leg.max}, drop)
		}

		// Client to peer, as ChannelData and as Send indications.
		upMax := min(channelMax, maxIPv4Datagram)
		for _, n := range []int{1595, 1596, 1600, 9000, upMax} {
			want := payload(n, byte(n))
			if err := c.Send(c.ChannelData(0x4001, want)); err != nil {
				t.Fatal(err)
			}
			if got := turntest.ReadPeer(t, chPeer); !bytes.Equal(got, want) {
				t.Fatalf("%s ChannelData of %d bytes to the peer: got %d", network, n, len(got))
			}
		}
		sendMax := maxIPv4Datagram - 36 - 3 // the Send indication's own header and padding, over UDP
		if network != "udp" {
			sendMax = maxIPv4Datagram
		}
		for _, n := range []int{1595, 1600, 9000, sendMax} {
			want := payload(n, byte(n))
			if err := c.Send(turntest.SendIndication(indAddr, want)); err != nil {
				t.Fatal(err)
			}
			if got := turntest.ReadPeer(t, indPeer); !bytes.Equal(got, want) {
				t.Fatalf("%s Send indication of %d bytes to the peer: got %d", network, n, len(got))
			}
		}
		if network != "udp" {
			// 65,508 bytes fit a stream frame but no IPv4 datagram.
			_ = c.Send(c.ChannelData(0x4001, payload(maxIPv4Datagram+1, 1)))
			_ = c.Send(c.ChannelData(0x4001, marker))
			if got := turntest.ReadPeer(t, chPeer); !bytes.Equal(got, marker) {
				t.Errorf("tcp ChannelData of %d bytes reached the peer (%d bytes)", maxIPv4Datagram+1, len(got))
			}
		}
	}
}

// TestRelayIPv6 runs the relay on IPv6 loopback: relay sockets read IPv6
// senders, and Data indications and Send indications carry IPv6
// XOR-PEER-ADDRESSes (XORed with the transaction ID, not the cookie
// alone), as ChannelData still flows.
func TestRelayIPv6(t *testing.T) {
	probe, err := net.ListenPacket("udp6", "[::1]:0")
	if err != nil {
		t.Skipf("no IPv6 loopback: %v", err)
	}
	_ = probe.Close()
	s, _ := testServer(t, func(c *Config) {
		c.Listen = "[::1]:0"
		c.AllowPeers = []netip.Prefix{netip.MustParsePrefix("::1/128")}
	})
	peer, err := net.ListenUDP("udp6", net.UDPAddrFromAddrPort(netip.MustParseAddrPort("[::1]:0")))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = peer.Close() })
	peerAddr := peer.LocalAddr().(*net.UDPAddr).AddrPort()
	for _, network := range transports {
		c := rawClient(t, s, network, "ipv6")
		relay, err := turntest.RelayedAddressOf(turntest.MustAllocate(t, c))
		if err != nil {
			t.Fatal(err)
		}
		if code, _ := turntest.MustRequest(t, c, stun.MethodCreatePermission, turntest.PeerAddress(peerAddr)); code != 0 {
			t.Fatalf("%s CreatePermission to %v: %d", network, peerAddr, code)
		}
		want := payload(3001, 6)
		if err := c.Send(turntest.SendIndication(peerAddr, want)); err != nil {
			t.Fatal(err)
		}
		if got := turntest.ReadPeer(t, peer); !bytes.Equal(got, want) {
			t.Fatalf("%s Send indication to an IPv6 peer: %d bytes", network, len(got))
		}
		if _, err := peer.WriteToUDPAddrPort(want, relay); err != nil {
			t.Fatal(err)
		}
		frame, err := c.ReadFrame(time.Now().Add(2 * time.Second))
		if err != nil {
			t.Fatal(err)
		}
		from, got, err := turntest.DataIndicationOf(frame)
		if err != nil || from != peerAddr || !bytes.Equal(got, want) {
			t.Fatalf("%s Data indication from an IPv6 peer: from %v (want %v), %d bytes, %v", network, from, peerAddr, len(got), err)
		}
	}
}
