package tlsrec

import (
	"bytes"
	"crypto/rand"
	"crypto/tls"
	"errors"
	"io"
	"net"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"edgerelay/fastpath/tlsconf/tlstest"
)

// tlsPair is a TLS 1.3 connection over loopback TCP: the server side
// wrapped in a Conn, the client a plain *tls.Conn, handshaken and past a
// first exchange each way (so that both sequence numbers have moved, the
// server's past its session tickets too).
func tlsPair(t *testing.T) (*Conn, *tls.Conn) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	cert := tlstest.SelfSigned(t)
	accepted := make(chan *tls.Conn, 1)
	go func() {
		defer close(accepted)
		raw, err := ln.Accept()
		if err != nil {
			return
		}
		sc := tls.Server(raw, &tls.Config{Certificates: []tls.Certificate{cert}})
		_ = sc.SetDeadline(time.Now().Add(20 * time.Second))
		if sc.Handshake() == nil {
			accepted <- sc
		}
	}()
	cc, err := tls.Dial("tcp", ln.Addr().String(), &tls.Config{InsecureSkipVerify: true, MinVersion: tls.VersionTLS13})
	if err != nil {
		t.Fatal(err)
	}
	sc, ok := <-accepted
	if !ok {
		t.Fatal("the server's handshake failed")
	}
	c := Wrap(sc)
	t.Cleanup(func() { _ = c.Close(); _ = cc.Close() })
	setDeadlines(t, c, cc)
	exchange(t, c, cc, []byte("hello from the client"), []byte("hello from the server"))
	return c, cc
}

func setDeadlines(t *testing.T, conns ...net.Conn) {
	t.Helper()
	for _, c := range conns {
		if err := c.SetDeadline(time.Now().Add(20 * time.Second)); err != nil {
			t.Fatal(err)
		}
	}
}

// exchange sends up from the client to the server and down back, both at
// once (neither side's writes may wait for the other's reads).
func exchange(t *testing.T, server *Conn, client net.Conn, up, down []byte) {
	t.Helper()
	errs := make(chan error, 2)
	go func() { _, err := client.Write(up); errs <- err }()
	go func() { _, err := server.Write(down); errs <- err }()
	gotUp := make([]byte, len(up))
	if _, err := io.ReadFull(server, gotUp); err != nil {
		t.Fatalf("server read: %v", err)
	}
	gotDown := make([]byte, len(down))
	if _, err := io.ReadFull(client, gotDown); err != nil {
		t.Fatalf("client read: %v", err)
	}
	for range 2 {
		if err := <-errs; err != nil {
			t.Fatalf("write: %v", err)
		}
	}
	if !bytes.Equal(gotUp, up) || !bytes.Equal(gotDown, down) {
		t.Fatalf("the bytes changed on the way: up %d/%d equal %v, down %d/%d equal %v",
			len(gotUp), len(up), bytes.Equal(gotUp, up), len(gotDown), len(down), bytes.Equal(gotDown, down))
	}
}

func random(t testing.TB, n int) []byte {
	b := make([]byte, n)
	if _, err := rand.Read(b); err != nil {
		t.Fatal(err)
	}
	return b
}

// takeOver idles c until it has taken the connection over.
func takeOver(t *testing.T, c *Conn) {
	t.Helper()
	c.Idle()
	if !c.TakenOver() {
		t.Fatal("Idle did not take over a quiet TLS 1.3 connection")
	}
}

// The record layer carries on where crypto/tls stopped, both ways, for
// every size of write (empty, one byte, one record exactly, one past it,
// many), and after each Idle has dropped its buffers and AEADs.
func TestTakeOverCarriesOnWithCryptoTLS(t *testing.T) {
	c, cc := tlsPair(t)
	takeOver(t, c)
	if c.s.id != tls.TLS_AES_128_GCM_SHA256 {
		t.Logf("suite %#x", c.s.id)
	}
	for _, n := range []int{1, 100, maxPlaintext, maxPlaintext + 1, 5*maxPlaintext + 7, 300_000} {
		exchange(t, c, cc, random(t, n), random(t, n))
		c.Idle()
		// plain is a slice of the read buffer: an empty one would still
		// hold the buffer's array after the pool let it go.
		if c.rbuf != nil || c.plain != nil || c.in.aead != nil || c.out.aead != nil {
			t.Fatalf("after %d bytes an idle Conn keeps its read buffer (%v, plaintext slice %v), read AEAD (%v) or write AEAD (%v)",
				n, c.rbuf != nil, c.plain != nil, c.in.aead != nil, c.out.aead != nil)
		}
	}
	if _, err := c.Write(nil); err != nil {
		t.Fatalf("empty write: %v", err)
	}
}

// ChaCha20-Poly1305, which crypto/tls picks on a machine without AES
// instructions: the test runs itself again with GODEBUG=cpu.aes=off.
func TestTakeOverChaCha20(t *testing.T) {
	if os.Getenv("TLSREC_CHACHA") == "1" {
		c, cc := tlsPair(t)
		takeOver(t, c)
		if c.s.id != tls.TLS_CHACHA20_POLY1305_SHA256 {
			t.Fatalf("negotiated suite %#x, want ChaCha20-Poly1305", c.s.id)
		}
		exchange(t, c, cc, random(t, 70_000), random(t, 70_000))
		return
	}
	cmd := exec.Command(os.Args[0], "-test.run=^TestTakeOverChaCha20$", "-test.v")
	cmd.Env = append(os.Environ(), "TLSREC_CHACHA=1", "GODEBUG=cpu.aes=off")
	out, err := cmd.CombinedOutput()
	if err != nil || !strings.Contains(string(out), "--- PASS: TestTakeOverChaCha20") {
		t.Fatalf("the run without AES instructions: %v\n%s", err, out)
	}
}

// While crypto/tls holds input the reader has not taken yet, Idle leaves
// the connection to it; it takes over at the first Idle after that input
// was read, and nothing is lost.
func TestTakeOverWaitsForInputInCryptoTLS(t *testing.T) {
	c, cc := tlsPair(t)
	msg := random(t, 3000)
	if _, err := cc.Write(msg); err != nil {
		t.Fatal(err)
	}
	got := make([]byte, len(msg))
	if _, err := io.ReadFull(c, got[:10]); err != nil {
		t.Fatal(err)
	}
	c.Idle()
	if c.TakenOver() {
		t.Fatal("took over while crypto/tls held 2,990 unread bytes")
	}
	if _, err := io.ReadFull(c, got[10:]); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, msg) {
		t.Fatal("the message changed")
	}
	takeOver(t, c)
	exchange(t, c, cc, random(t, 5000), random(t, 5000))
}

// A write key that has sealed rekeyAfter records is updated (a KeyUpdate
// record, then the new key), and crypto/tls follows it.
func TestWriterRekeys(t *testing.T) {
	c, cc := tlsPair(t)
	takeOver(t, c)
	c.rekeyAfter = c.out.seq + 3
	before := append([]byte(nil), c.out.secret...)
	exchange(t, c, cc, random(t, 10), random(t, 8*maxPlaintext))
	if bytes.Equal(before, c.out.secret) || c.out.seq >= 8 {
		t.Fatalf("no key update: secret changed %v, %d records under the key", !bytes.Equal(before, c.out.secret), c.out.seq)
	}
	exchange(t, c, cc, random(t, 10), random(t, 100))
}

// A KeyUpdate asking crypto/tls to update too: crypto/tls answers with
// its own, which the reader follows.
func TestPeerKeyUpdate(t *testing.T) {
	c, cc := tlsPair(t)
	takeOver(t, c)
	inBefore := append([]byte(nil), c.in.secret...)
	requestKeyUpdate(t, c)
	// The client reads the update when it reads data, and answers it
	// before its next write.
	exchange(t, c, cc, random(t, 10), random(t, 10))
	exchange(t, c, cc, random(t, 20_000), random(t, 10))
	if bytes.Equal(inBefore, c.in.secret) {
		t.Fatal("the read key did not follow crypto/tls's KeyUpdate")
	}
}

// requestKeyUpdate sends a KeyUpdate asking c's peer for one of its own.
func requestKeyUpdate(t *testing.T, c *Conn) {
	t.Helper()
	c.wmu.Lock()
	err := c.rekeyLocked(1)
	c.wmu.Unlock()
	if err != nil {
		t.Fatal(err)
	}
}

// Two record layers, one each side, for the paths crypto/tls cannot be
// made to take: every suite, and a peer's KeyUpdate asking for ours.
func twinPair(t testing.TB, s *suite) (a, b *Conn) {
	t.Helper()
	pa, pb := tcpPair(t)
	k1, k2 := random(t, s.hash().Size()), random(t, s.hash().Size())
	a = &Conn{raw: pa, s: s, rekeyAfter: rekeyAfter, in: half{secret: k1}, out: half{secret: k2}}
	b = &Conn{raw: pb, s: s, rekeyAfter: rekeyAfter, in: half{secret: append([]byte(nil), k2...)}, out: half{secret: append([]byte(nil), k1...)}}
	t.Cleanup(func() { _ = pa.Close(); _ = pb.Close() })
	return a, b
}

// tcpPair is two ends of a loopback TCP connection (unlike net.Pipe's,
// a write does not wait for the peer's read).
func tcpPair(t testing.TB) (net.Conn, net.Conn) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	a, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	b, err := ln.Accept()
	if err != nil {
		t.Fatal(err)
	}
	return a, b
}

func TestTwinsEverySuite(t *testing.T) {
	for _, s := range []*suite{&aes128GCM, &aes256GCM, &chacha20} {
		a, b := twinPair(t, s)
		exchange(t, a, b, random(t, 40_000), random(t, 40_000))
		// b asks a to update: a answers, and both directions move on.
		aIn, aOut := append([]byte(nil), a.in.secret...), append([]byte(nil), a.out.secret...)
		requestKeyUpdate(t, b)
		exchange(t, a, b, random(t, 100), random(t, 100))
		if bytes.Equal(aIn, a.in.secret) || bytes.Equal(aOut, a.out.secret) {
			t.Fatalf("suite %#x: a requested KeyUpdate moved in %v, out %v", s.id, !bytes.Equal(aIn, a.in.secret), !bytes.Equal(aOut, a.out.secret))
		}
		exchange(t, a, b, random(t, 3*maxPlaintext), random(t, 3*maxPlaintext))
	}
}

// close_notify both ways: a Close ends the peer's input with io.EOF.
func TestCloseNotify(t *testing.T) {
	c, cc := tlsPair(t)
	takeOver(t, c)
	if err := cc.Close(); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Read(make([]byte, 10)); err != io.EOF {
		t.Fatalf("after the client's close_notify: %v, want io.EOF", err)
	}

	c, cc = tlsPair(t)
	takeOver(t, c)
	if err := c.Close(); err != nil {
		t.Fatal(err)
	}
	if _, err := cc.Read(make([]byte, 10)); err != io.EOF {
		t.Fatalf("the client after our close_notify: %v, want io.EOF", err)
	}
	if err := c.Close(); !errors.Is(err, net.ErrClosed) {
		t.Fatalf("second Close: %v", err)
	}
}

// Hostile records written raw under the client's TLS: each ends the input
// with an error naming it, the client hears the matching alert, and
// nothing of the record is read as data.
func TestBadRecords(t *testing.T) {
	for _, tc := range []struct {
		name   string
		record func(p *peer) []byte
		err    string
		alert  string
	}{
		{"unprotected handshake", func(*peer) []byte { return []byte{typeHandshake, 3, 3, 0, 1, 0} }, "unprotected record of type 22", "unexpected message"},
		{"change cipher spec", func(*peer) []byte { return []byte{20, 3, 3, 0, 1, 1} }, "unprotected record of type 20", "unexpected message"},
		{"too long", func(*peer) []byte {
			return []byte{typeAppData, 3, 3, byte((maxCiphertext + 1) >> 8), byte((maxCiphertext + 1) & 0xff)}
		}, "record of 16641 bytes", "record overflow"},
		{"forged", func(*peer) []byte { return append([]byte{typeAppData, 3, 3, 0, 40}, make([]byte, 40)...) }, "bad record MAC", "bad record MAC"},
		{"shorter than a tag", func(*peer) []byte { return []byte{typeAppData, 3, 3, 0, 3, 1, 2, 3} }, "bad record MAC", "bad record MAC"},
		{"no content type", func(p *peer) []byte { return p.record(nil, 0, 0, 0) }, "without a content type", "unexpected message"},
		{"unknown content type", func(p *peer) []byte { return p.record(nil, 99) }, "content type 99", "unexpected message"},
		{"new session ticket", func(p *peer) []byte { return p.record([]byte{4, 0, 0, 1, 0}, typeHandshake) }, "handshake message of type 4", "unexpected message"},
		{"key update then more", func(p *peer) []byte { return p.record([]byte{msgKeyUpdate, 0, 0, 1, 0, 23}, typeHandshake) }, "does not end its record", "unexpected message"},
		{"key update of two bytes", func(p *peer) []byte { return p.record([]byte{msgKeyUpdate, 0, 0, 2, 0}, typeHandshake) }, "malformed KeyUpdate", "error decoding message"},
		{"key update request 2", func(p *peer) []byte { return p.record([]byte{msgKeyUpdate, 0, 0, 1, 2}, typeHandshake) }, "request_update other than 0 or 1", "illegal parameter"},
		{"empty handshake", func(p *peer) []byte { return p.record(nil, typeHandshake) }, "empty handshake record", "unexpected message"},
		{"malformed alert", func(p *peer) []byte { return p.record([]byte{2}, typeAlert) }, "malformed alert", "error decoding message"},
		{"plaintext one past 16 KiB", func(p *peer) []byte { return p.record(make([]byte, maxPlaintext), typeAppData, 0) }, "plaintext of 16386 bytes", "record overflow"},
		{"17 empty records", func(p *peer) []byte {
			var b []byte
			for range maxUseless + 1 {
				b = append(b, p.record(nil, typeAppData)...)
			}
			return b
		}, "too many records without data", "unexpected message"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c, cc := tlsPair(t)
			takeOver(t, c)
			if _, err := cc.NetConn().Write(tc.record(&peer{t: t, c: c})); err != nil {
				t.Fatal(err)
			}
			n, err := c.Read(make([]byte, 100))
			if err == nil || !strings.Contains(err.Error(), tc.err) || n != 0 {
				t.Fatalf("read %d bytes, %v; want an error with %q", n, err, tc.err)
			}
			if _, again := c.Read(make([]byte, 100)); again != err {
				t.Fatalf("the next read: %v, want the same error", again)
			}
			if _, err := cc.Read(make([]byte, 10)); err == nil || !strings.Contains(err.Error(), tc.alert) {
				t.Fatalf("the client heard %v, want the alert %q", err, tc.alert)
			}
			if _, err := c.Write([]byte("x")); err == nil {
				t.Fatal("a write after a fatal alert succeeded")
			}
		})
	}
}

// A peer seals records as c's client would, under c's read key from its
// next sequence number on: the test's stand-in for a hostile client.
type peer struct {
	t      *testing.T
	c      *Conn
	sealed uint64
}

// record seals content of type typ with padding zeros after the type; a
// typ of 0 leaves the type out (only padding).
func (p *peer) record(content []byte, typ byte, padding ...byte) []byte {
	t, c := p.t, p.c
	t.Helper()
	sealer := &Conn{s: c.s, out: half{secret: c.in.secret, seq: c.in.seq + p.sealed}}
	p.sealed++
	inner := append(append([]byte(nil), content...), typ)
	if typ == 0 {
		inner = append([]byte(nil), padding...)
	} else {
		inner = append(inner, padding...)
	}
	if err := sealer.out.ready(sealer.s); err != nil {
		t.Fatal(err)
	}
	n := len(inner) + tagLen
	hdr := []byte{typeAppData, 3, 3, byte(n >> 8), byte(n)}
	return append(hdr, sealer.out.aead.Seal(nil, sealer.out.nonce(), inner, hdr)...)
}

// A record split across reads, padding after the content type, an empty
// data record and a KeyUpdate in fragments are all read as they should.
func TestGoodOddRecords(t *testing.T) {
	c, cc := tlsPair(t)
	takeOver(t, c)
	p := &peer{t: t, c: c}
	var stream []byte
	stream = append(stream, p.record([]byte("padded"), typeAppData, 0, 0, 0, 0)...)
	stream = append(stream, p.record(nil, typeAppData)...)
	stream = append(stream, p.record([]byte{msgKeyUpdate, 0}, typeHandshake)...)
	stream = append(stream, p.record([]byte{0, 1, 0}, typeHandshake)...)
	raw := cc.NetConn()
	go func() {
		for i := range stream { // byte by byte: every record split
			if _, err := raw.Write(stream[i : i+1]); err != nil {
				return
			}
		}
	}()
	got := make([]byte, 6)
	if _, err := io.ReadFull(c, got); err != nil || string(got) != "padded" {
		t.Fatalf("read %q, %v", got, err)
	}
	inBefore := append([]byte(nil), c.in.secret...)
	// The empty record and the fragmented KeyUpdate follow: a read past
	// them ends at its deadline, the client's key followed.
	_ = c.SetReadDeadline(time.Now().Add(2 * time.Second))
	if n, err := c.Read(make([]byte, 1)); !isTimeout(err) {
		t.Fatalf("read %d bytes, %v; want the deadline", n, err)
	}
	if bytes.Equal(inBefore, c.in.secret) || c.in.seq != 0 {
		t.Fatal("the fragmented KeyUpdate was not followed")
	}
	// A record under the new key reads, the timeout having lost nothing.
	_ = c.SetReadDeadline(time.Now().Add(10 * time.Second))
	next := &peer{t: t, c: c}
	if _, err := raw.Write(next.record([]byte("after"), typeAppData)); err != nil {
		t.Fatal(err)
	}
	got = make([]byte, 5)
	if _, err := io.ReadFull(c, got); err != nil || string(got) != "after" {
		t.Fatalf("read %q, %v", got, err)
	}
}

// In steady state an active connection allocates nothing per record.
func TestNoAllocationsPerRecord(t *testing.T) {
	a, b := twinPair(t, &aes128GCM)
	msg, got := random(t, 1000), make([]byte, 1000)
	done := make(chan struct{})
	defer close(done)
	step := func() {
		go func() { _, _ = a.Write(msg) }()
		if _, err := io.ReadFull(b, got); err != nil {
			t.Fatal(err)
		}
	}
	step()
	allocs := testing.AllocsPerRun(200, step)
	// The goroutine that writes costs its own allocation; the records none.
	if allocs > 1 {
		t.Fatalf("%.1f allocations per record, want the goroutine's 1 at most", allocs)
	}
}

// A Conn wrapped before its handshake (a listener's) waits for it: an
// Idle before it leaves the connection to crypto/tls without giving up
// on it, and after the takeover ConnectionState still tells the TLS.
func TestIdleBeforeTheHandshake(t *testing.T) {
	a, b := tcpPair(t)
	c := Wrap(tls.Server(b, &tls.Config{Certificates: []tls.Certificate{tlstest.SelfSigned(t)}, NextProtos: []string{"http/1.1"}}))
	c.Idle()
	if c.TakenOver() || c.never {
		t.Fatalf("an Idle before the handshake: taken over %v, given up %v", c.TakenOver(), c.never)
	}
	cc := tls.Client(a, &tls.Config{InsecureSkipVerify: true, ServerName: "relay.test", NextProtos: []string{"http/1.1"}})
	setDeadlines(t, c, cc)
	errs := make(chan error, 1)
	go func() { errs <- cc.Handshake() }()
	if err := c.Handshake(); err != nil {
		t.Fatal(err)
	}
	if err := <-errs; err != nil {
		t.Fatal(err)
	}
	before := c.ConnectionState()
	takeOver(t, c)
	after := c.ConnectionState()
	if err := c.Handshake(); err != nil {
		t.Fatalf("Handshake after the takeover: %v", err)
	}
	if after.Version != before.Version || after.CipherSuite != before.CipherSuite || after.ServerName != "relay.test" ||
		after.NegotiatedProtocol != "http/1.1" || !after.HandshakeComplete || after.DidResume != before.DidResume {
		t.Fatalf("ConnectionState after the takeover %+v, before %+v", after, before)
	}
	exchange(t, c, cc, random(t, 100), random(t, 100))
}

// An Idle while a write is under way (a signal socket parks as its "peer
// up" goes out) leaves the takeover to that write: the socket may stay
// parked, with no Idle to come, for a whole ping interval.
func TestTakeOverDeferredToTheWrite(t *testing.T) {
	c, cc := tlsPair(t)
	c.wmu.Lock() // a write under way
	c.Idle()
	c.wmu.Unlock()
	if c.TakenOver() {
		t.Fatal("took over under a write")
	}
	down := random(t, 300)
	if _, err := c.Write(down); err != nil {
		t.Fatal(err)
	}
	if !c.TakenOver() {
		t.Fatal("the write did not take over the connection its Idle left to it")
	}
	got := make([]byte, len(down))
	if _, err := io.ReadFull(cc, got); err != nil || !bytes.Equal(got, down) {
		t.Fatalf("read %d bytes, %v", len(got), err)
	}
	exchange(t, c, cc, random(t, 5000), random(t, 5000))
}

// IdleWrite drops the write AEAD; the next write rebuilds it.
func TestIdleWriteDropsTheWriteKeys(t *testing.T) {
	c, cc := tlsPair(t)
	takeOver(t, c)
	exchange(t, c, cc, random(t, 10), random(t, 10))
	if c.out.aead == nil {
		t.Fatal("no write AEAD after a write")
	}
	c.IdleWrite()
	if c.out.aead != nil {
		t.Fatal("IdleWrite kept the write AEAD")
	}
	exchange(t, c, cc, random(t, 10), random(t, 20_000))
}

// The limits at their edges: 16 records in a row without data, then a
// record of a full 16 KiB of data, are read.
func TestRecordLimitsAtTheEdge(t *testing.T) {
	c, cc := tlsPair(t)
	takeOver(t, c)
	p := &peer{t: t, c: c}
	var stream []byte
	for range maxUseless {
		stream = append(stream, p.record(nil, typeAppData)...)
	}
	full := random(t, maxPlaintext)
	stream = append(stream, p.record(full, typeAppData)...)
	if _, err := cc.NetConn().Write(stream); err != nil {
		t.Fatal(err)
	}
	got := make([]byte, len(full))
	if _, err := io.ReadFull(c, got); err != nil || !bytes.Equal(got, full) {
		t.Fatalf("read %d bytes, %v", len(got), err)
	}
}
