package turntest

import (
	"bytes"
	"net"
	"net/netip"
	"testing"
	"time"

	"github.com/pion/stun/v3"
)

// The helpers below fail the test at once: the TURN package's tests and
// the binary's black-box tests drive a server the same way.

// MustRequest sends an authenticated request and returns the answer's code
// (0 for a success) and the answer.
func MustRequest(t testing.TB, c *STUNClient, method stun.Method, attrs ...stun.Setter) (int, *stun.Message) {
	t.Helper()
	res, err := c.Request(method, true, attrs...)
	if err != nil {
		t.Fatalf("%v: %v", method, err)
	}
	return ErrorCodeOf(res), res
}

// MustAllocate allocates a UDP relay with attrs and returns the success.
func MustAllocate(t testing.TB, c *STUNClient, attrs ...stun.Setter) *stun.Message {
	t.Helper()
	code, res := MustRequest(t, c, stun.MethodAllocate, append([]stun.Setter{TransportUDP}, attrs...)...)
	if code != 0 {
		t.Fatalf("Allocate: %d", code)
	}
	return res
}

// LoopbackPeer is a UDP socket on 127.0.0.1 acting as a peer, closed when
// the test ends.
func LoopbackPeer(t testing.TB) *net.UDPConn {
	t.Helper()
	c, err := net.ListenUDP("udp4", net.UDPAddrFromAddrPort(netip.MustParseAddrPort("127.0.0.1:0")))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close() })
	return c
}

// ReadPeer waits up to 2 s for the next datagram at the peer.
func ReadPeer(t testing.TB, p *net.UDPConn) []byte {
	t.Helper()
	buf := make([]byte, 64<<10)
	_ = p.SetReadDeadline(time.Now().Add(2 * time.Second))
	n, _, err := p.ReadFromUDPAddrPort(buf)
	if err != nil {
		t.Fatalf("peer: %v", err)
	}
	return buf[:n]
}

// NextFromPeer waits up to 2 s a frame for the next ChannelData payload or
// Data indication data at the client, passing over any other frame.
func NextFromPeer(t testing.TB, c *STUNClient) []byte {
	t.Helper()
	return NextRelayed(t, c).Data
}

// Relayed is what a client got from a peer: ChannelData on Channel, or a
// Data indication (Channel 0) from Peer.
type Relayed struct {
	Channel uint16
	Peer    netip.AddrPort
	Data    []byte
}

// NextRelayed waits up to 2 s for the next ChannelData or Data indication
// at the client, passing over any other frame.
func NextRelayed(t testing.TB, c *STUNClient) Relayed {
	t.Helper()
	for {
		frame, err := c.ReadFrame(time.Now().Add(2 * time.Second))
		if err != nil {
			t.Fatalf("client: %v", err)
		}
		if frame[0]&0xC0 == 0x40 {
			n := int(frame[2])<<8 | int(frame[3])
			return Relayed{Channel: uint16(frame[0])<<8 | uint16(frame[1]), Data: frame[4 : 4+n]}
		}
		if peer, data, err := DataIndicationOf(frame); err == nil {
			return Relayed{Peer: peer, Data: data}
		}
	}
}

// MustBindPeers opens two loopback peers of c's allocation: channel ch is
// bound to the first, the second has a permission, for Send and Data
// indications.
func MustBindPeers(t testing.TB, c *STUNClient, ch uint16) (chPeer, indPeer *net.UDPConn) {
	t.Helper()
	chPeer, indPeer = LoopbackPeer(t), LoopbackPeer(t)
	chAddr, indAddr := chPeer.LocalAddr().(*net.UDPAddr).AddrPort(), indPeer.LocalAddr().(*net.UDPAddr).AddrPort()
	if code, _ := MustRequest(t, c, stun.MethodChannelBind, ChannelNumber(ch), PeerAddress(chAddr)); code != 0 {
		t.Fatalf("ChannelBind: %d", code)
	}
	if code, _ := MustRequest(t, c, stun.MethodCreatePermission, PeerAddress(indAddr)); code != 0 {
		t.Fatalf("CreatePermission: %d", code)
	}
	return chPeer, indPeer
}

// ExpectToClient writes a datagram of each of sizes from peer to relay and
// fails the test unless c gets each whole, as ChannelData or a Data
// indication. With drop > 0, a datagram of drop bytes (more than the leg
// carries) and then a marker follow, and the marker must be what arrives.
// leg names the leg in the messages.
func ExpectToClient(t testing.TB, c *STUNClient, peer *net.UDPConn, relay *net.UDPAddr, leg string, sizes []int, drop int) {
	t.Helper()
	for _, n := range sizes {
		want := bytes.Repeat([]byte{byte(n)}, n)
		if _, err := peer.WriteToUDP(want, relay); err != nil {
			t.Fatal(err)
		}
		if got := NextFromPeer(t, c); !bytes.Equal(got, want) {
			t.Fatalf("%s of %d bytes to the client: got %d bytes", leg, n, len(got))
		}
	}
	if drop > 0 {
		marker := []byte("marker")
		_, _ = peer.WriteToUDP(make([]byte, drop), relay)
		_, _ = peer.WriteToUDP(marker, relay)
		if got := NextFromPeer(t, c); !bytes.Equal(got, marker) {
			t.Errorf("%s of %d bytes reached the client (%d bytes), past what the leg carries", leg, drop, len(got))
		}
	}
}
