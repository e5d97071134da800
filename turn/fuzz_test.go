package turn

import (
	"bytes"
	"net/netip"
	"testing"
	"time"

	"github.com/pion/stun/v3"

	"edgerelay/turn/turntest"
)

// FuzzScreen feeds arbitrary datagrams to the gate, which parses STUN from
// any client before authentication: it must never panic, and it must
// never answer a message that is not a request of the four methods it
// screens; one without MESSAGE-INTEGRITY only with 437 (no allocation).
func FuzzScreen(f *testing.F) {
	user, pass := Credentials(testSecret, "fuzz", 1<<40, time.Unix(0, 0))
	seed := func(method stun.Method, extra ...stun.Setter) []byte {
		setters := append([]stun.Setter{stun.TransactionID, stun.NewType(method, stun.ClassRequest)}, extra...)
		setters = append(setters, stun.NewUsername(user), stun.NewRealm(testRealm), stun.NewNonce("n"),
			stun.NewLongTermIntegrity(user, testRealm, pass), stun.Fingerprint)
		return stun.MustBuild(setters...).Raw
	}
	f.Add(seed(stun.MethodAllocate))
	f.Add(seed(stun.MethodCreatePermission, &stun.XORMappedAddress{IP: []byte{10, 0, 0, 1}, Port: 9}))
	f.Add(seed(stun.MethodChannelBind))
	f.Add(stun.MustBuild(stun.TransactionID, stun.BindingRequest).Raw)
	f.Add([]byte{0x40, 0x00, 0x00, 0x04, 1, 2, 3, 4})
	f.Add([]byte{})

	s, err := Start(Config{Listen: "127.0.0.1:0", Secret: testSecret, Realm: testRealm})
	if err != nil {
		f.Fatal(err)
	}
	f.Cleanup(func() { _ = s.Shutdown(canceled()) })
	t := tuple{client: netip.MustParseAddrPort("192.0.2.1:5000")}
	f.Fuzz(func(t2 *testing.T, raw []byte) {
		var reply []byte
		answered := s.screen(t, raw, func(b []byte) { reply = b })
		if !answered || len(raw) < 20 {
			if answered {
				t2.Fatalf("answered a %d-byte message", len(raw))
			}
			return
		}
		var m stun.Message
		m.Raw = append([]byte(nil), raw...)
		if m.Decode() != nil || m.Type.Class != stun.ClassRequest {
			t2.Fatalf("answered %x, which is no request", raw)
		}
		if !m.Contains(stun.AttrMessageIntegrity) {
			var res stun.Message
			res.Raw = reply
			var code stun.ErrorCodeAttribute
			if m.Type.Method == stun.MethodAllocate || res.Decode() != nil || code.GetFrom(&res) != nil || code.Code != stun.CodeAllocMismatch {
				t2.Fatalf("answered %x, which is no authenticated request, with %x", raw, reply)
			}
		}
	})
}

// FuzzParseSend feeds arbitrary bytes to the Send indication parser, which
// reads what any client sends: it must never panic, and what it finds must
// be what pion's own decoder finds in a message that decodes.
func FuzzParseSend(f *testing.F) {
	f.Add(turntest.SendIndication(netip.MustParseAddrPort("127.0.0.1:9"), []byte("data")))
	f.Add(turntest.SendIndication(netip.MustParseAddrPort("[2001:db8::1]:9"), make([]byte, 1201)))
	f.Add([]byte{0x00, 0x16, 0x00, 0x08, 0x21, 0x12, 0xa4, 0x42, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 0x00, 0x13, 0x00, 0x09})
	f.Fuzz(func(t *testing.T, raw []byte) {
		peer, at, n, ok := parseSend(raw)
		if !ok {
			return
		}
		if at < 24 || at+n > len(raw) {
			t.Fatalf("DATA at %d, %d bytes, in a message of %d: no room for its header or past the end", at, n, len(raw))
		}
		data := raw[at : at+n]
		m := &stun.Message{Raw: append([]byte(nil), raw...)}
		if m.Decode() != nil {
			return // we are more lenient than a full decode (e.g. a short header length)
		}
		var a stun.XORMappedAddress
		want, err := m.Get(stun.AttrData)
		if err != nil || a.GetFromAs(m, stun.AttrXORPeerAddress) != nil {
			return
		}
		ip, _ := netip.AddrFromSlice(a.IP)
		if peer != netip.AddrPortFrom(ip.Unmap(), uint16(a.Port)) {
			t.Errorf("peer %v, pion decodes %v:%d", peer, a.IP, a.Port)
		}
		if !bytes.Equal(data, want) {
			t.Errorf("DATA of %d bytes, pion decodes %d", len(data), len(want))
		}
	})
}
