package turn

import (
	"bytes"
	"fmt"
	"net"
	"net/netip"
	"testing"

	"github.com/pion/stun/v3"

	"edgerelay/turn/turntest"
)

// hairpinPair is two clients of one server, each with an allocation:
// what two browsers relaying through the same TURN server are.
type hairpinPair struct {
	s      *Server
	a, b   *turntest.STUNClient
	ra, rb netip.AddrPort // their relayed addresses
}

func newHairpinPair(t *testing.T, noHairpin bool, networkA, networkB string) *hairpinPair {
	t.Helper()
	s, _ := testServer(t, func(c *Config) { c.NoHairpin = noHairpin; withTLS(t, c) })
	p := &hairpinPair{s: s, a: rawClient(t, s, networkA, "hairpin-a"), b: rawClient(t, s, networkB, "hairpin-b")}
	var err error
	if p.ra, err = turntest.RelayedAddressOf(turntest.MustAllocate(t, p.a)); err != nil {
		t.Fatal(err)
	}
	if p.rb, err = turntest.RelayedAddressOf(turntest.MustAllocate(t, p.b)); err != nil {
		t.Fatal(err)
	}
	return p
}

func mustOK(t *testing.T, c *turntest.STUNClient, method stun.Method, attrs ...stun.Setter) {
	t.Helper()
	if code, _ := turntest.MustRequest(t, c, method, attrs...); code != 0 {
		t.Fatalf("%v: %d", method, code)
	}
}

// nextFrame is the next ChannelData or Data indication at c, decoded:
// "ch <number> <payload>" or "data <peer> <payload>".
func nextFrame(t *testing.T, c *turntest.STUNClient) string {
	t.Helper()
	r := turntest.NextRelayed(t, c)
	if r.Channel != 0 {
		return fmt.Sprintf("ch %#x %q", r.Channel, r.Data)
	}
	return fmt.Sprintf("data %v %q", r.Peer, r.Data)
}

// Two allocations of one server reach each other by channel both ways,
// by Send indication into a channel, and into a permission only (a Data
// indication from the sender's relayed address): what the clients get is
// the same handed over in the process and sent through the kernel, and
// only the first hands over. Over UDP to UDP, and TCP and TLS on either
// side (the stream paths, batched and not, and a stream client's
// downstream).
func TestHairpinDeliversAsTheKernelWould(t *testing.T) {
	for _, nets := range [][2]string{{"udp", "udp"}, {"tcp", "udp"}, {"udp", "tls"}, {"tls", "tcp"}} {
		t.Run(nets[0]+"-"+nets[1], func(t *testing.T) {
			var got [2][]string
			for i, noHairpin := range []bool{false, true} {
				p := newHairpinPair(t, noHairpin, nets[0], nets[1])
				mustOK(t, p.a, stun.MethodChannelBind, turntest.ChannelNumber(0x4000), turntest.PeerAddress(p.rb))
				mustOK(t, p.b, stun.MethodChannelBind, turntest.ChannelNumber(0x4abc), turntest.PeerAddress(p.ra))
				var seen []string
				for _, msg := range []string{"a to b", "", "x"} {
					if err := p.a.Send(p.a.ChannelData(0x4000, []byte(msg))); err != nil {
						t.Fatal(err)
					}
					seen = append(seen, nextFrame(t, p.b))
				}
				if err := p.b.Send(p.b.ChannelData(0x4abc, []byte("b to a"))); err != nil {
					t.Fatal(err)
				}
				seen = append(seen, nextFrame(t, p.a))
				big := bytes.Repeat([]byte{7}, 1200)
				if err := p.b.Send(p.b.ChannelData(0x4abc, big)); err != nil {
					t.Fatal(err)
				}
				if f := nextFrame(t, p.a); f != fmt.Sprintf("ch 0x4000 %q", big) {
					t.Fatalf("1,200 bytes b to a: %.40s…", f)
				}
				// A Send indication from b lands in a's channel.
				if err := p.b.Send(turntest.SendIndication(p.ra, []byte("indicated"))); err != nil {
					t.Fatal(err)
				}
				seen = append(seen, nextFrame(t, p.a))
				// A third client with a permission only for a's relayed
				// address gets a Data indication naming it.
				c := rawClient(t, p.s, "udp", "hairpin-c")
				rc, err := turntest.RelayedAddressOf(turntest.MustAllocate(t, c))
				if err != nil {
					t.Fatal(err)
				}
				mustOK(t, c, stun.MethodCreatePermission, turntest.PeerAddress(p.ra))
				mustOK(t, p.a, stun.MethodChannelBind, turntest.ChannelNumber(0x4001), turntest.PeerAddress(rc))
				if err := p.a.Send(p.a.ChannelData(0x4001, []byte("to c"))); err != nil {
					t.Fatal(err)
				}
				f := nextFrame(t, c)
				seen = append(seen, f)
				if want := fmt.Sprintf("data %v %q", p.ra, "to c"); f != want {
					t.Fatalf("at a permission only: %s, want %s", f, want)
				}
				got[i] = seen

				ra, rb := relayOf(t, p.s, p.ra.Port()), relayOf(t, p.s, p.rb.Port())
				handed := ra.hairpins.Load() + rb.hairpins.Load()
				if noHairpin != (handed == 0) {
					t.Fatalf("NoHairpin %v: %d datagrams handed over in the process", noHairpin, handed)
				}
				if !noHairpin && (ra.hairpins.Load() != 4 || rb.hairpins.Load() != 3) {
					t.Fatalf("handed over: a %d, b %d; want 4 and 3", ra.hairpins.Load(), rb.hairpins.Load())
				}
				// Counted on both sides, as through the kernel (whose
				// path counts after its sends: a client may have read a
				// datagram before it is counted).
				settle(func() bool { return ra.upPackets.Load() == 4 && rb.downPackets.Load() == 3 })
				if up, down := ra.upPackets.Load(), rb.downPackets.Load(); up != 4 || down != 3 {
					t.Fatalf("a sent %d, b's client got %d; want 4 and 3", up, down)
				}
			}
			want := []string{`ch 0x4abc "a to b"`, `ch 0x4abc ""`, `ch 0x4abc "x"`, `ch 0x4000 "b to a"`, `ch 0x4000 "indicated"`}
			for i, w := range want {
				if got[0][i] != w || got[1][i] != w {
					t.Fatalf("frame %d: in the process %s, through the kernel %s; want %s", i, got[0][i], got[1][i], w)
				}
			}
		})
	}
}

// Without a permission at the receiving allocation a datagram handed over
// is dropped, as its relay socket's reader would drop it; once the
// permission is there, the next one arrives. And a port of the relay IP
// with no allocation there goes to the kernel (another program's, maybe).
func TestHairpinNeedsThePermission(t *testing.T) {
	p := newHairpinPair(t, false, "udp", "udp")
	mustOK(t, p.a, stun.MethodChannelBind, turntest.ChannelNumber(0x4000), turntest.PeerAddress(p.rb))
	if err := p.a.Send(p.a.ChannelData(0x4000, []byte("refused"))); err != nil {
		t.Fatal(err)
	}
	// The listener's one reader handles a's datagram before b's request,
	// sent after it: the permission comes too late for it.
	mustOK(t, p.b, stun.MethodCreatePermission, turntest.PeerAddress(p.ra))
	if err := p.a.Send(p.a.ChannelData(0x4000, []byte("let in"))); err != nil {
		t.Fatal(err)
	}
	if f, want := nextFrame(t, p.b), fmt.Sprintf("data %v %q", p.ra, "let in"); f != want {
		t.Fatalf("first frame at b: %s, want %s", f, want)
	}
	if n := relayOf(t, p.s, p.ra.Port()).hairpins.Load(); n != 2 {
		t.Fatalf("%d handed over, want 2 (one dropped at b)", n)
	}

	// A plain UDP socket on the relay IP, on a port no allocation has.
	other := turntest.LoopbackPeer(t)
	op := other.LocalAddr().(*net.UDPAddr).AddrPort()
	mustOK(t, p.a, stun.MethodChannelBind, turntest.ChannelNumber(0x4001), turntest.PeerAddress(op))
	if err := p.a.Send(p.a.ChannelData(0x4001, []byte("to a program"))); err != nil {
		t.Fatal(err)
	}
	if got := turntest.ReadPeer(t, other); string(got) != "to a program" {
		t.Fatalf("the program on the relay IP got %q", got)
	}
}

// The biggest datagram a relay socket sends to a peer over IPv4 is handed
// over whole, and one byte more is dropped (the kernel refuses it), the
// same both ways: a marker behind it is what arrives. Over TCP on both
// sides, whose legs carry more than that.
func TestHairpinDatagramLimit(t *testing.T) {
	for _, noHairpin := range []bool{false, true} {
		p := newHairpinPair(t, noHairpin, "tcp", "tcp")
		mustOK(t, p.a, stun.MethodChannelBind, turntest.ChannelNumber(0x4000), turntest.PeerAddress(p.rb))
		mustOK(t, p.b, stun.MethodChannelBind, turntest.ChannelNumber(0x4001), turntest.PeerAddress(p.ra))
		edge := bytes.Repeat([]byte{1}, maxIPv4Datagram)
		for _, f := range [][]byte{edge, make([]byte, maxIPv4Datagram+1), []byte("marker")} {
			if err := p.a.Send(p.a.ChannelData(0x4000, f)); err != nil {
				t.Fatal(err)
			}
		}
		if got := nextFrame(t, p.b); got != fmt.Sprintf("ch 0x4001 %q", edge) {
			t.Fatalf("NoHairpin %v: the biggest IPv4 datagram: %.30s…", noHairpin, got)
		}
		if got := nextFrame(t, p.b); got != `ch 0x4001 "marker"` {
			t.Fatalf("NoHairpin %v: after one byte past the biggest: %.30s…, want the marker", noHairpin, got)
		}
	}
}
