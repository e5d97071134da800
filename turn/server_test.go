package turn

import (
	"bytes"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	pionturn "github.com/pion/turn/v4"
	"github.com/prometheus/client_golang/prometheus"

	"edgerelay/fastpath/tlsconf/tlstest"
	"edgerelay/internal/freeport"
	"edgerelay/turn/turntest"
)

const (
	testSecret = "test-secret"
	testRealm  = "edgerelay.test"
)

// testServer starts a server on loopback with loopback peers allowed (the
// default denies them) and a registry of its own.
func testServer(t *testing.T, mutate func(*Config)) (*Server, *prometheus.Registry) {
	t.Helper()
	reg := prometheus.NewRegistry()
	cfg := Config{
		Listen:     "127.0.0.1:0",
		Secret:     testSecret,
		Realm:      testRealm,
		AllowPeers: []netip.Prefix{netip.MustParsePrefix("127.0.0.0/8")},
		Metrics:    reg,
	}
	if mutate != nil {
		mutate(&cfg)
	}
	s, err := Start(cfg)
	if err != nil {
		t.Fatalf("Start: %v", err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
		defer cancel()
		_ = s.Shutdown(ctx)
	})
	return s, reg
}

func serverAddr(s *Server) netip.AddrPort { return addrPort(s.Addr()) }

func creds(label string) (string, string) {
	return Credentials(testSecret, label, time.Hour, time.Now())
}

func echoPeer(t *testing.T) *turntest.EchoPeer {
	t.Helper()
	p, err := turntest.NewEchoPeer("127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = p.Close() })
	return p
}

// pionClient is a pion TURN client over conn (a UDP socket, or a stream
// wrapped in pion's STUNConn).
func pionClient(t *testing.T, conn net.PacketConn, server, user, pass string) *pionturn.Client {
	t.Helper()
	c, err := pionturn.NewClient(&pionturn.ClientConfig{
		TURNServerAddr: server,
		Username:       user,
		Password:       pass,
		Conn:           conn,
		LoggerFactory:  pionLogger{log: discardLog()},
	})
	if err != nil {
		t.Fatal(err)
	}
	if err := c.Listen(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Close)
	return c
}

func udpClient(t *testing.T, s *Server, user, pass string) *pionturn.Client {
	t.Helper()
	conn, err := net.ListenPacket("udp4", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = conn.Close() })
	return pionClient(t, conn, s.Addr().String(), user, pass)
}

// roundTrips sends count datagrams to the peer through relay and expects
// each echoed back. The first go as Send indications while pion binds a
// channel in the background; the later ones as ChannelData over our fast
// path.
func roundTrips(t *testing.T, relay net.PacketConn, peer net.Addr, count int) {
	t.Helper()
	buf := make([]byte, 2048)
	for i := range count {
		msg := []byte("datagram " + strings.Repeat("x", i))
		got := false
		for try := 0; try < 10 && !got; try++ {
			if _, err := relay.WriteTo(msg, peer); err != nil {
				t.Fatalf("WriteTo: %v", err)
			}
			_ = relay.SetReadDeadline(time.Now().Add(500 * time.Millisecond))
			for {
				n, from, err := relay.ReadFrom(buf)
				if err != nil {
					break // lost: send again
				}
				if from.String() != peer.String() {
					t.Fatalf("datagram from %v, want the peer %v", from, peer)
				}
				if bytes.Equal(buf[:n], msg) {
					got = true
					break
				}
			}
		}
		if !got {
			t.Fatalf("datagram %d never came back", i)
		}
		time.Sleep(5 * time.Millisecond)
	}
	_ = relay.SetReadDeadline(time.Time{})
}

// waitFor polls cond for up to 5 s.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	for deadline := time.Now().Add(5 * time.Second); time.Now().Before(deadline); time.Sleep(10 * time.Millisecond) {
		if cond() {
			return
		}
	}
	t.Fatalf("timed out waiting for %s", what)
}

// fastPathUsed reports whether the server's fast path has relayed
// ChannelData for some allocation (a channel is bound and packets passed
// both ways).
func fastPathUsed(s *Server) bool {
	s.relays.mu.RLock()
	defer s.relays.mu.RUnlock()
	for _, r := range s.relays.byPort {
		if rt := r.routes.Load(); rt != nil && len(rt.byNumber) > 0 && r.upPackets.Load() > 0 && r.downPackets.Load() > 0 {
			return true
		}
	}
	return false
}

func TestRelayUDP(t *testing.T) {
	s, reg := testServer(t, nil)
	peer := echoPeer(t)
	user, pass := creds("alice")
	c := udpClient(t, s, user, pass)
	relay, err := c.Allocate()
	if err != nil {
		t.Fatalf("Allocate: %v", err)
	}
	defer relay.Close()
	if got := addrPort(relay.LocalAddr()).Addr(); got != netip.MustParseAddr("127.0.0.1") {
		t.Errorf("relayed address %v, want the listen IP", relay.LocalAddr())
	}
	roundTrips(t, relay, peer.Addr(), 40)
	waitFor(t, "the ChannelData fast path to carry traffic", func() bool { return fastPathUsed(s) })
	if got := metricValue(s.metrics.allocations); got != 1 {
		t.Errorf("allocations gauge %v, want 1", got)
	}
	n, err := seriesCount(reg, "edgerelay_turn_relayed_packets_total")
	if err != nil || n != 2 {
		t.Errorf("relayed packet series: %d, %v", n, err)
	}
	if err := relay.Close(); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the allocation to go", func() bool { return s.Allocations() == 0 })
	if got := metricValue(s.metrics.allocations); got != 0 {
		t.Errorf("allocations gauge %v after close, want 0", got)
	}
	if got := metricValue(s.metrics.allocationsTotal); got != 1 {
		t.Errorf("allocations total %v, want 1", got)
	}
	upP, upB, dnP, _ := s.relays.totals()
	if upP < 40 || dnP < 40 || upB == 0 {
		t.Errorf("relayed totals up %d (%d B), down %d; want at least 40 each way", upP, upB, dnP)
	}
}

func TestRelayTCP(t *testing.T) {
	s, _ := testServer(t, nil)
	peer := echoPeer(t)
	conn, err := net.Dial("tcp", s.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	user, pass := creds("bob")
	c := pionClient(t, pionturn.NewSTUNConn(conn), s.Addr().String(), user, pass)
	relay, err := c.Allocate()
	if err != nil {
		t.Fatalf("Allocate over TCP: %v", err)
	}
	roundTrips(t, relay, peer.Addr(), 40)
	waitFor(t, "the ChannelData fast path to carry traffic", func() bool { return fastPathUsed(s) })
	_ = relay.Close()
	waitFor(t, "the allocation to go", func() bool { return s.Allocations() == 0 })
}

func TestRelayTLS(t *testing.T) {
	cert := selfSigned(t)
	s, _ := testServer(t, func(c *Config) {
		c.TLS = &tls.Config{Certificates: []tls.Certificate{cert}, MinVersion: tls.VersionTLS12}
		c.TLSListen = "127.0.0.1:0"
	})
	peer := echoPeer(t)
	conn, err := tls.Dial("tcp", s.TLSAddr().String(), &tls.Config{InsecureSkipVerify: true}) //nolint:gosec // a test certificate
	if err != nil {
		t.Fatal(err)
	}
	user, pass := creds("carol")
	c := pionClient(t, pionturn.NewSTUNConn(conn), s.TLSAddr().String(), user, pass)
	relay, err := c.Allocate()
	if err != nil {
		t.Fatalf("Allocate over TLS: %v", err)
	}
	roundTrips(t, relay, peer.Addr(), 30)
	waitFor(t, "the ChannelData fast path to carry traffic", func() bool { return fastPathUsed(s) })
}

func TestSTUNBinding(t *testing.T) {
	s, _ := testServer(t, nil)
	c := udpClient(t, s, "", "")
	mapped, err := c.SendBindingRequestTo(s.Addr())
	if err != nil {
		t.Fatalf("Binding: %v", err)
	}
	if addrPort(mapped).Addr() != netip.MustParseAddr("127.0.0.1") {
		t.Errorf("mapped address %v", mapped)
	}
}

func TestWrongPassword(t *testing.T) {
	s, reg := testServer(t, nil)
	user, _ := creds("mallory")
	c := udpClient(t, s, user, "not-the-password")
	_, err := c.Allocate()
	if code := turntest.ErrorCode(err); code != 401 {
		t.Fatalf("Allocate with a wrong password: %v (code %d), want 401", err, code)
	}
	// A credential minted with another secret fails alike.
	u2, p2 := Credentials("other-secret", "mallory", time.Hour, time.Now())
	c2 := udpClient(t, s, u2, p2)
	if _, err := c2.Allocate(); turntest.ErrorCode(err) != 401 {
		t.Fatalf("Allocate with another secret's credential: %v, want 401", err)
	}
	// So does a username that is not "<expiry>:<label>".
	c3 := udpClient(t, s, "mallory", "whatever")
	if _, err := c3.Allocate(); turntest.ErrorCode(err) != 401 {
		t.Fatalf("Allocate with a malformed username: %v, want 401", err)
	}
	if got := metricValue(s.metrics.authFailures.WithLabelValues(authBadCredentials)); got != 2 {
		t.Errorf("bad credential failures %v, want 2", got)
	}
	if got := metricValue(s.metrics.authFailures.WithLabelValues(authMalformed)); got != 1 {
		t.Errorf("malformed failures %v, want 1", got)
	}
	if s.Allocations() != 0 {
		t.Errorf("%d allocations after refusals", s.Allocations())
	}
	// No username may appear in the metrics.
	mfs, _ := reg.Gather()
	for _, mf := range mfs {
		if strings.Contains(mf.String(), "mallory") {
			t.Errorf("metric %s carries a username", mf.GetName())
		}
	}
}

func TestExpiredCredentials(t *testing.T) {
	var offset atomic.Int64 // the server's clock runs this far ahead
	s, _ := testServer(t, func(c *Config) {
		c.Now = func() time.Time { return time.Now().Add(time.Duration(offset.Load())) }
	})
	peer := echoPeer(t)
	user, pass := Credentials(testSecret, "dave", time.Minute, time.Now())

	// Still valid: the allocation is made.
	c := udpClient(t, s, user, pass)
	relay, err := c.Allocate()
	if err != nil {
		t.Fatalf("Allocate with a valid credential: %v", err)
	}

	// Two minutes later the credential has expired.
	offset.Store(int64(2 * time.Minute))
	c2 := udpClient(t, s, user, pass)
	if _, err := c2.Allocate(); turntest.ErrorCode(err) != 401 {
		t.Fatalf("new Allocate with an expired credential: %v, want 401", err)
	}
	if got := metricValue(s.metrics.authFailures.WithLabelValues(authExpired)); got != 1 {
		t.Errorf("expired failures %v, want 1", got)
	}
	// The existing allocation runs on, as in coturn: its permissions and
	// channel bindings are still granted and data flows.
	if err := c.CreatePermission(peer.Addr()); err != nil {
		t.Fatalf("CreatePermission on the existing allocation after expiry: %v", err)
	}
	roundTrips(t, relay, peer.Addr(), 20)
}

func TestDeniedPeer(t *testing.T) {
	s, reg := testServer(t, func(c *Config) { c.AllowPeers = nil })
	peer := echoPeer(t)
	user, pass := creds("erin")
	c := udpClient(t, s, user, pass)
	relay, err := c.Allocate()
	if err != nil {
		t.Fatalf("Allocate: %v", err)
	}
	defer relay.Close()
	err = c.CreatePermission(peer.Addr())
	if code := turntest.ErrorCode(err); code != 403 {
		t.Fatalf("CreatePermission to loopback: %v (code %d), want 403", err, code)
	}
	for _, a := range []string{"10.1.2.3:9", "192.168.1.1:9", "172.20.0.1:9", "169.254.169.254:80", "0.0.0.0:9",
		"100.64.0.1:9", "100.100.100.200:80", "192.0.0.1:9", "198.18.0.1:9", "240.0.0.1:9", "[64:ff9b::7f00:1]:9", "[2002:7f00:1::1]:9"} {
		ap := net.UDPAddrFromAddrPort(netip.MustParseAddrPort(a))
		if code := turntest.ErrorCode(c.CreatePermission(ap)); code != 403 {
			t.Errorf("CreatePermission to %s: code %d, want 403", a, code)
		}
	}
	// Writing to the peer fails (the permission is refused) and nothing
	// reaches it.
	if _, err := relay.WriteTo([]byte("x"), peer.Addr()); err == nil {
		t.Error("WriteTo a denied peer succeeded")
	}
	time.Sleep(50 * time.Millisecond)
	if peer.Received() != 0 {
		t.Errorf("denied peer received %d datagrams", peer.Received())
	}
	if got, _ := seriesCount(reg, "edgerelay_turn_peer_refusals_total"); got != 1 {
		t.Errorf("peer refusal series %d", got)
	}
	if got := metricValue(s.metrics.peerRefusals); got < 13 {
		t.Errorf("peer refusals %v, want at least 13", got)
	}
}

// allocateN makes n allocations (each from its own socket) and expects
// them to succeed.
func allocateN(t *testing.T, s *Server, n int, label func(i int) string) []net.PacketConn {
	t.Helper()
	var relays []net.PacketConn
	for i := range n {
		u, p := creds(label(i))
		r, err := udpClient(t, s, u, p).Allocate()
		if err != nil {
			t.Fatalf("allocation %d of %d: %v", i+1, n, err)
		}
		relays = append(relays, r)
	}
	return relays
}

func TestQuotaPerUser(t *testing.T) {
	s, _ := testServer(t, func(c *Config) { c.MaxPerUser = 3 })
	relays := allocateN(t, s, 3, func(int) string { return "frank" })
	// A fourth, even under a credential with a fresh expiry, is past the
	// quota: it counts by label.
	u, p := Credentials(testSecret, "frank", 2*time.Hour, time.Now())
	if _, err := udpClient(t, s, u, p).Allocate(); turntest.ErrorCode(err) != 486 {
		t.Fatalf("4th allocation for one user: %v, want 486", err)
	}
	// Others are not affected.
	allocateN(t, s, 1, func(int) string { return "grace" })
	// Ending one makes room again.
	_ = relays[0].Close()
	waitFor(t, "the allocation to go", func() bool { return s.Allocations() == 3 })
	allocateN(t, s, 1, func(int) string { return "frank" })
	if got := metricValue(s.metrics.quotaRefusals.WithLabelValues(quotaUser)); got != 1 {
		t.Errorf("user quota refusals %v, want 1", got)
	}
}

func TestQuotaPerIP(t *testing.T) {
	s, _ := testServer(t, func(c *Config) { c.MaxPerIP = 2 })
	allocateN(t, s, 2, func(i int) string { return "ip-user-" + string(rune('a'+i)) })
	u, p := creds("ip-user-z")
	if _, err := udpClient(t, s, u, p).Allocate(); turntest.ErrorCode(err) != 486 {
		t.Fatalf("3rd allocation from one IP: %v, want 486", err)
	}
	if got := metricValue(s.metrics.quotaRefusals.WithLabelValues(quotaIP)); got != 1 {
		t.Errorf("IP quota refusals %v, want 1", got)
	}
}

func TestQuotaTotal(t *testing.T) {
	s, _ := testServer(t, func(c *Config) { c.MaxAllocations = 4 })
	allocateN(t, s, 4, func(i int) string { return "total-" + string(rune('a'+i)) })
	u, p := creds("total-z")
	if _, err := udpClient(t, s, u, p).Allocate(); turntest.ErrorCode(err) != 486 {
		t.Fatalf("5th allocation in total: %v, want 486", err)
	}
	if got := metricValue(s.metrics.quotaRefusals.WithLabelValues(quotaTotal)); got != 1 {
		t.Errorf("total quota refusals %v, want 1", got)
	}
}

func TestRelayPortsExhausted(t *testing.T) {
	port := freeport.UDPPair(t)
	s, _ := testServer(t, func(c *Config) { c.RelayPortMin, c.RelayPortMax = port, port+1 })
	relays := allocateN(t, s, 2, func(i int) string { return "port-" + string(rune('a'+i)) })
	for _, r := range relays {
		if p := int(addrPort(r.LocalAddr()).Port()); p != port && p != port+1 {
			t.Errorf("relay port %d outside %d-%d", p, port, port+1)
		}
	}
	u, p := creds("port-z")
	c := udpClient(t, s, u, p)
	if _, err := c.Allocate(); turntest.ErrorCode(err) != 508 {
		t.Fatalf("3rd allocation on a 2-port range: %v, want 508", err)
	}
	if got := metricValue(s.metrics.quotaRefusals.WithLabelValues(quotaPorts)); got != 1 {
		t.Errorf("port refusals %v, want 1", got)
	}
	// The refused allocation took no quota slot, and a freed port is
	// found again.
	_ = relays[1].Close()
	waitFor(t, "the allocation to go", func() bool { return s.Allocations() == 1 })
	u2, p2 := creds("port-y")
	if _, err := udpClient(t, s, u2, p2).Allocate(); err != nil {
		t.Fatalf("allocation after a port was freed: %v", err)
	}
	s.quotas.mu.Lock()
	total, pending := s.quotas.total, len(s.quotas.pending)
	s.quotas.mu.Unlock()
	if total != 2 || pending != 0 {
		t.Errorf("quota counts total %d pending %d, want 2 and 0", total, pending)
	}
}

func TestDrain(t *testing.T) {
	s, _ := testServer(t, nil)
	peer := echoPeer(t)
	u, p := creds("henry")
	c := udpClient(t, s, u, p)
	relay, err := c.Allocate()
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	go func() { done <- s.Shutdown(ctx) }()
	waitFor(t, "draining", s.draining.Load)
	// New allocations are refused; the live one keeps relaying.
	u2, p2 := creds("ivy")
	if _, err := udpClient(t, s, u2, p2).Allocate(); turntest.ErrorCode(err) != 508 {
		t.Errorf("Allocate while draining: %v, want 508", err)
	}
	if _, err := net.DialTimeout("tcp", s.Addr().String(), time.Second); err == nil {
		t.Error("a TCP connection was accepted while draining")
	}
	roundTrips(t, relay, peer.Addr(), 5)
	// The drain ends when the last allocation does.
	_ = relay.Close()
	select {
	case err := <-done:
		if err != nil {
			t.Errorf("Shutdown: %v", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("Shutdown did not return after the last allocation ended")
	}
}

func TestDrainDeadline(t *testing.T) {
	s, _ := testServer(t, nil)
	u, p := creds("jack")
	if _, err := udpClient(t, s, u, p).Allocate(); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
	defer cancel()
	start := time.Now()
	err := s.Shutdown(ctx)
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("Shutdown with a live allocation: %v, want the deadline", err)
	}
	// serve reports this error as it is (issue 14 found "turn: turn:").
	if msg := fmt.Sprint(err); !strings.HasPrefix(msg, "turn: drain cut short with 1 allocations") || strings.Count(msg, "turn:") != 1 {
		t.Errorf("Shutdown's error %q, want one \"turn: \" prefix", msg)
	}
	if d := time.Since(start); d > 3*time.Second {
		t.Errorf("Shutdown took %v", d)
	}
	if s.Allocations() != 0 {
		t.Errorf("%d allocations after shutdown", s.Allocations())
	}
}

func TestCredentials(t *testing.T) {
	now := time.Unix(1_700_000_000, 0)
	u, p := Credentials("secret", "label", time.Hour, now)
	if u != "1700003600:label" {
		t.Errorf("username %q", u)
	}
	// base64(HMAC-SHA1("secret", "1700003600:label")), as coturn computes it.
	if p != restPassword("secret", u) || len(p) != 28 {
		t.Errorf("password %q", p)
	}
	if exp, ok := restExpiry(u); !ok || exp != 1700003600 {
		t.Errorf("restExpiry(%q) = %d, %v", u, exp, ok)
	}
	for _, bad := range []string{"", "label", ":label", "-5:x", "12a:x", "99999999999999999999:x"} {
		if _, ok := restExpiry(bad); ok {
			t.Errorf("restExpiry(%q) accepted", bad)
		}
	}
	if restLabel(u) != "label" || restLabel("1700003600") != "1700003600" {
		t.Error("restLabel")
	}
}

func TestStartErrors(t *testing.T) {
	for name, cfg := range map[string]Config{
		"no secret":   {Listen: "127.0.0.1:0", Realm: "r"},
		"no realm":    {Listen: "127.0.0.1:0", Secret: "s"},
		"bad range":   {Listen: "127.0.0.1:0", Secret: "s", Realm: "r", RelayPortMin: 10, RelayPortMax: 5},
		"half range":  {Listen: "127.0.0.1:0", Secret: "s", Realm: "r", RelayPortMin: 10},
		"unspecified": {Listen: "0.0.0.0:0", Secret: "s", Realm: "r"},
		"bad listen":  {Listen: "nonsense", Secret: "s", Realm: "r"},
	} {
		s, err := Start(cfg)
		if err == nil {
			_ = s.Shutdown(context.Background())
			t.Errorf("%s: Start succeeded", name)
			continue
		}
		// serve returns these as they are: they name the service once.
		if msg := err.Error(); !strings.HasPrefix(msg, "turn: ") || strings.Count(msg, "turn:") != 1 {
			t.Errorf("%s: %q, want one \"turn: \" prefix", name, msg)
		}
	}
}

func selfSigned(t *testing.T) tls.Certificate { return tlstest.SelfSigned(t) }
