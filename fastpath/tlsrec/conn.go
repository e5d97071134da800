package tlsrec

import (
	"crypto/tls"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"slices"
	"sync"
	"sync/atomic"
	"time"
)

// The record layer's limits and codes (RFC 8446 5, 6, B).
const (
	recordHeaderLen = 5
	maxPlaintext    = 1 << 14
	maxCiphertext   = maxPlaintext + 256
	tagLen          = 16 // every TLS 1.3 AEAD's

	typeAlert     = 21
	typeHandshake = 22
	typeAppData   = 23

	msgKeyUpdate = 24
	keyUpdateLen = 5 // type, 24-bit length, request_update

	alertLevelWarning = 1
	alertLevelFatal   = 2

	alertCloseNotify      = 0
	alertUnexpected       = 10
	alertBadRecordMAC     = 20
	alertRecordOverflow   = 22
	alertIllegalParameter = 47
	alertDecodeError      = 50
	alertInternalError    = 80

	// maxUseless is how many records in a row may advance nothing (empty
	// data, KeyUpdates, handshake fragments) before the peer is taken for
	// hostile, as crypto/tls does.
	maxUseless = 16

	// recordsPerWrite is how many full records one Write seals before it
	// writes them to the socket in one call.
	recordsPerWrite = 4

	// rekeyAfter is how many records one write key seals before the
	// writer updates it: RFC 8446 5.5 allows 2^24.5 full-size records
	// under one AES-GCM key.
	rekeyAfter = 1 << 24

	// closeNotifyTimeout bounds the close_notify a Close writes.
	closeNotifyTimeout = 5 * time.Second
)

// readBuffers and writeBuffers hold record buffers between the reads and
// writes of every Conn: an idle Conn keeps neither.
var (
	readBuffers = sync.Pool{New: func() any {
		b := make([]byte, recordHeaderLen+maxCiphertext)
		return &b
	}}
	writeBuffers = sync.Pool{New: func() any {
		b := make([]byte, 0, recordsPerWrite*(recordHeaderLen+maxPlaintext+1+tagLen)+2*(recordHeaderLen+keyUpdateLen+1+tagLen))
		return &b
	}}
)

// A Conn is a TLS 1.3 server or client connection after its handshake:
// crypto/tls's until its first quiet Idle, then this package's record
// layer's. It is a net.Conn with one reader goroutine at a time (Read and
// Idle) and any number of writers.
type Conn struct {
	// tls is what the connection was given, until it is taken over (then
	// nil: dropped with all it holds). Loaded by Close from any goroutine.
	tls        atomic.Pointer[tlsSide]
	raw        net.Conn // the connection below TLS
	s          *suite   // set when taken over
	negotiated          // set when taken over

	// The reader's: Read and Idle, under rmu (a write may take the
	// connection over while no read runs: see Write).
	rmu     sync.Mutex
	in      half
	rbuf    *[]byte // raw input (*rbuf)[r0:r1]; nil while idle and empty
	r0, r1  int
	plain   []byte // a record's data not yet read (aliases rbuf)
	hand    [keyUpdateLen]byte
	handLen int // bytes of a handshake message in hand so far
	useless int // records in a row that advanced nothing
	never   bool
	rerr    error // why reading ended
	// deferred: an Idle found a write under way and left the takeover
	// to that write's end.
	deferred atomic.Bool

	// The writers': under wmu.
	wmu        sync.Mutex
	out        half
	werr       error // why writing ended
	rekeyAfter uint64
	closed     atomic.Bool
}

// tlsSide is the connection as crypto/tls serves it: nc is what the
// server had (the *tls.Conn or a wrapper of it), tc its *tls.Conn.
type tlsSide struct {
	nc net.Conn
	tc *tls.Conn
}

// Wrap is nc as a Conn when nc is TLS: a *tls.Conn (its handshake done
// or not), or a wrapper of a Conn with a TLSRecords method (that Conn).
// Nil for any other connection.
func Wrap(nc net.Conn) *Conn {
	var tc *tls.Conn
	switch v := nc.(type) {
	case *tls.Conn:
		tc = v
	case interface{ TLSRecords() *Conn }:
		return v.TLSRecords()
	default:
		return nil
	}
	c := &Conn{raw: tc.NetConn(), rekeyAfter: rekeyAfter}
	c.tls.Store(&tlsSide{nc: nc, tc: tc})
	return c
}

// TakenOver tells whether the record layer is this package's now.
func (c *Conn) TakenOver() bool { return c.tls.Load() == nil }

// Idle is for the reader, when it is about to wait with nothing to read
// (its reads have found nothing buffered: a read with a deadline already
// past returned a timeout). The first time crypto/tls then holds nothing
// unread, the Conn takes the connection over; from then on Idle gives
// back what the record layer can rebuild: its read buffer when it holds
// no partial record, and both AEADs (the write one unless a write is
// under way). An Idle that finds a write under way before the takeover
// leaves the takeover to that write's end: a parked socket may not wake
// again for a long while.
func (c *Conn) Idle() {
	c.rmu.Lock()
	defer c.rmu.Unlock()
	if c.tls.Load() != nil {
		if c.never {
			return
		}
		// A write under way (a slow peer's) must not hold the reader:
		// the write takes the connection over when it is done.
		if !c.wmu.TryLock() {
			c.deferred.Store(true)
			return
		}
		taken := c.takeOverLocked()
		c.wmu.Unlock()
		if !taken {
			return
		}
	}
	if c.rbuf != nil && c.r0 == c.r1 && len(c.plain) == 0 {
		readBuffers.Put(c.rbuf)
		// plain, empty, is still a slice of the buffer: it would keep
		// the buffer's array alive once the pool drops it.
		c.rbuf, c.r0, c.r1, c.plain = nil, 0, 0, nil
	}
	c.in.idle()
	if c.wmu.TryLock() {
		c.out.idle()
		c.wmu.Unlock()
	}
}

// IdleWrite gives back the write AEAD (rebuilt at the next record), for
// a writer whose queue is empty while its reader waits; a write under
// way keeps it.
func (c *Conn) IdleWrite() {
	if c.wmu.TryLock() {
		c.out.idle()
		c.wmu.Unlock()
	}
}

// WriteKeysHeld tells whether the write AEAD is built (for tests of the
// callers that idle it).
func (c *Conn) WriteKeysHeld() bool {
	c.wmu.Lock()
	defer c.wmu.Unlock()
	return c.out.aead != nil
}

// takeOverLocked captures the connection's record state from crypto/tls
// and drops crypto/tls (rmu and wmu held: no read or write can run);
// false when it cannot now (input is buffered there, the connection is
// closing) or ever (then never is set).
func (c *Conn) takeOverLocked() bool {
	c.deferred.Store(false)
	if c.closed.Load() {
		return false
	}
	st, err := capture(c.tls.Load().tc)
	if err != nil {
		c.never = !errors.Is(err, errBusy)
		return false
	}
	c.s, c.in, c.out, c.negotiated = st.suite, st.in, st.out, st.negotiated
	c.tls.Store(nil)
	return true
}

// Read reads application data.
func (c *Conn) Read(p []byte) (int, error) {
	c.rmu.Lock()
	defer c.rmu.Unlock()
	if t := c.tls.Load(); t != nil {
		return t.nc.Read(p)
	}
	for len(c.plain) == 0 {
		if c.rerr != nil {
			return 0, c.rerr
		}
		if len(p) == 0 {
			return 0, nil
		}
		if err := c.readRecord(); err != nil {
			return 0, err
		}
	}
	n := copy(p, c.plain)
	c.plain = c.plain[n:]
	return n, nil
}

// readRecord reads and opens the next record: its data becomes plain, or
// it is handled (alert, KeyUpdate).
func (c *Conn) readRecord() error {
	if err := c.fill(recordHeaderLen); err != nil {
		return err
	}
	hdr := (*c.rbuf)[c.r0 : c.r0+recordHeaderLen]
	// legacy_record_version is ignored (RFC 8446 5.1); the AEAD covers it.
	n := int(binary.BigEndian.Uint16(hdr[3:]))
	switch {
	case hdr[0] != typeAppData:
		return c.fatal(alertUnexpected, fmt.Errorf("tls: unprotected record of type %d", hdr[0]))
	case n > maxCiphertext:
		return c.fatal(alertRecordOverflow, fmt.Errorf("tls: record of %d bytes", n))
	}
	if err := c.fill(recordHeaderLen + n); err != nil {
		return err
	}
	rec := (*c.rbuf)[c.r0 : c.r0+recordHeaderLen+n]
	c.r0 += recordHeaderLen + n
	if err := c.in.ready(c.s); err != nil {
		return c.fatal(alertInternalError, err)
	}
	inner, err := c.in.aead.Open(rec[recordHeaderLen:recordHeaderLen], c.in.nonce(), rec[recordHeaderLen:], rec[:recordHeaderLen])
	if err != nil {
		return c.fatal(alertBadRecordMAC, errors.New("tls: bad record MAC"))
	}
	if err := c.in.next(); err != nil {
		return c.fatal(alertInternalError, err)
	}
	if len(inner) > maxPlaintext+1 {
		return c.fatal(alertRecordOverflow, fmt.Errorf("tls: plaintext of %d bytes", len(inner)))
	}
	i := len(inner) - 1 // the content type follows the data, then zero padding
	for i >= 0 && inner[i] == 0 {
		i--
	}
	if i < 0 {
		return c.fatal(alertUnexpected, errors.New("tls: record without a content type"))
	}
	typ, data := inner[i], inner[:i]
	if c.handLen > 0 && typ != typeHandshake {
		return c.fatal(alertUnexpected, errors.New("tls: handshake message interleaved with other records"))
	}
	switch typ {
	case typeAppData:
		if len(data) == 0 {
			return c.advancedNothing()
		}
		c.useless = 0
		c.plain = data
		return nil
	case typeAlert:
		return c.alert(data)
	case typeHandshake:
		return c.handshake(data)
	}
	return c.fatal(alertUnexpected, fmt.Errorf("tls: record of content type %d", typ))
}

// fill reads until at least n bytes of raw input are buffered.
func (c *Conn) fill(n int) error {
	if c.rbuf == nil {
		c.rbuf = readBuffers.Get().(*[]byte)
		c.r0, c.r1 = 0, 0
	}
	buf := *c.rbuf
	if c.r0+n > len(buf) {
		c.r1 = copy(buf, buf[c.r0:c.r1])
		c.r0 = 0
	}
	for c.r1-c.r0 < n {
		m, err := c.raw.Read(buf[c.r1:])
		c.r1 += m
		switch {
		case c.r1-c.r0 >= n:
			return nil
		case err == nil:
		case isTimeout(err):
			return err // the caller may read again
		case errors.Is(err, io.EOF) && c.r0 == c.r1:
			c.rerr = io.EOF // crypto/tls's answer too: an end without close_notify, at a record boundary
			return c.rerr
		case errors.Is(err, io.EOF):
			c.rerr = io.ErrUnexpectedEOF
			return c.rerr
		default:
			c.rerr = err
			return err
		}
	}
	return nil
}

func isTimeout(err error) bool {
	var ne net.Error
	return errors.As(err, &ne) && ne.Timeout()
}

// advancedNothing counts a record that carried no data.
func (c *Conn) advancedNothing() error {
	c.useless++
	if c.useless > maxUseless {
		return c.fatal(alertUnexpected, errors.New("tls: too many records without data"))
	}
	return nil
}

// alert handles the peer's alert: close_notify ends the input, any other
// ends the connection (in TLS 1.3 every alert but close_notify is fatal).
func (c *Conn) alert(data []byte) error {
	if len(data) != 2 {
		return c.fatal(alertDecodeError, errors.New("tls: malformed alert"))
	}
	if data[1] == alertCloseNotify {
		c.rerr = io.EOF
		return c.rerr
	}
	c.rerr = fmt.Errorf("tls: the peer sent alert %d", data[1])
	return c.rerr
}

// handshake handles a handshake record. After the handshake a server can
// receive only KeyUpdate (RFC 8446 4.6.3; no client certificates are
// asked for after it), which may come in fragments and must end its
// record.
func (c *Conn) handshake(data []byte) error {
	if len(data) == 0 {
		return c.fatal(alertUnexpected, errors.New("tls: empty handshake record"))
	}
	if c.handLen == 0 && data[0] != msgKeyUpdate {
		return c.fatal(alertUnexpected, fmt.Errorf("tls: handshake message of type %d after the handshake", data[0]))
	}
	if c.handLen+len(data) > keyUpdateLen {
		return c.fatal(alertUnexpected, errors.New("tls: a KeyUpdate does not end its record"))
	}
	c.handLen += copy(c.hand[c.handLen:], data)
	if c.handLen >= 4 && (c.hand[1] != 0 || c.hand[2] != 0 || c.hand[3] != 1) {
		return c.fatal(alertDecodeError, errors.New("tls: malformed KeyUpdate"))
	}
	if c.handLen < keyUpdateLen {
		return c.advancedNothing()
	}
	c.handLen = 0
	switch c.hand[4] {
	case 0:
	case 1: // update_requested: answer with ours, under the old key
		c.wmu.Lock()
		err := c.rekeyLocked(0)
		c.wmu.Unlock()
		if err != nil {
			return c.failRead(err)
		}
	default:
		return c.fatal(alertIllegalParameter, errors.New("tls: KeyUpdate with request_update other than 0 or 1"))
	}
	if err := c.in.update(c.s); err != nil {
		return c.fatal(alertInternalError, err)
	}
	return c.advancedNothing()
}

// fatal sends alert and ends the input with err.
func (c *Conn) fatal(alert byte, err error) error {
	c.wmu.Lock()
	if c.werr == nil && !c.closed.Load() {
		_ = c.writeRecordLocked(typeAlert, []byte{alertLevelFatal, alert})
		c.werr = fmt.Errorf("tlsrec: alert %d sent: %w", alert, err)
	}
	c.wmu.Unlock()
	return c.failRead(err)
}

func (c *Conn) failRead(err error) error {
	c.rerr = err
	return err
}

// Write writes p as application data: records of up to 16 KiB, sealed
// recordsPerWrite at a time into one write to the socket.
func (c *Conn) Write(p []byte) (int, error) {
	c.wmu.Lock()
	defer c.wmu.Unlock()
	if t := c.tls.Load(); t != nil {
		n, err := t.nc.Write(p)
		// The takeover an Idle left to this write, unless a read runs
		// now (the next Idle then takes over).
		if c.deferred.Load() && c.rmu.TryLock() {
			if !c.never {
				c.takeOverLocked()
			}
			c.rmu.Unlock()
		}
		return n, err
	}
	if c.werr != nil {
		return 0, c.werr
	}
	bp := writeBuffers.Get().(*[]byte)
	defer writeBuffers.Put(bp)
	done := 0
	for done < len(p) {
		buf, n := (*bp)[:0], done
		var err error
		for k := 0; k < recordsPerWrite && n < len(p); k++ {
			chunk := min(len(p)-n, maxPlaintext)
			if buf, err = c.sealData(buf, p[n:n+chunk]); err != nil {
				return done, err
			}
			n += chunk
		}
		*bp = buf[:0] // keep what sealing grew it to
		if _, err := c.raw.Write(buf); err != nil {
			c.werr = err // records may be half written: nothing can follow
			return done, err
		}
		done = n
	}
	return done, nil
}

// sealData appends data's record to buf, rekeying first when the write
// key has sealed rekeyAfter records.
func (c *Conn) sealData(buf, data []byte) ([]byte, error) {
	if c.out.seq >= c.rekeyAfter {
		var err error
		if buf, err = c.sealKeyUpdate(buf, 0); err != nil {
			return buf, err
		}
	}
	return c.seal(buf, typeAppData, data)
}

// sealKeyUpdate appends a KeyUpdate and moves the write key on.
func (c *Conn) sealKeyUpdate(buf []byte, request byte) ([]byte, error) {
	buf, err := c.seal(buf, typeHandshake, []byte{msgKeyUpdate, 0, 0, 1, request})
	if err != nil {
		return buf, err
	}
	if err := c.out.update(c.s); err != nil {
		c.werr = err
		return buf, err
	}
	return buf, nil
}

// seal appends one record of content type typ to buf (wmu held).
func (c *Conn) seal(buf []byte, typ byte, data []byte) ([]byte, error) {
	if err := c.out.ready(c.s); err != nil {
		c.werr = err
		return buf, err
	}
	start := len(buf)
	n := len(data) + 1 + tagLen
	buf = slices.Grow(buf, recordHeaderLen+n)
	buf = append(buf, typeAppData, 3, 3, byte(n>>8), byte(n))
	buf = append(buf, data...)
	buf = append(buf, typ)
	inner := buf[start+recordHeaderLen:]
	sealed := c.out.aead.Seal(inner[:0], c.out.nonce(), inner, buf[start:start+recordHeaderLen])
	if err := c.out.next(); err != nil {
		c.werr = err
		return buf, err
	}
	return buf[:start+recordHeaderLen+len(sealed)], nil
}

// writeRecordLocked seals and writes one record (wmu held).
func (c *Conn) writeRecordLocked(typ byte, data []byte) error {
	var small [64]byte
	return c.writeSealed(c.seal(small[:0], typ, data))
}

// rekeyLocked writes a KeyUpdate and moves the write key on (wmu held);
// request 1 asks the peer to update its key too.
func (c *Conn) rekeyLocked(request byte) error {
	if c.werr != nil {
		return c.werr
	}
	var small [64]byte
	return c.writeSealed(c.sealKeyUpdate(small[:0], request))
}

// writeSealed writes the records sealed into buf, unless sealing failed.
func (c *Conn) writeSealed(buf []byte, sealErr error) error {
	if sealErr != nil {
		return sealErr
	}
	if _, err := c.raw.Write(buf); err != nil {
		c.werr = err
		return err
	}
	return nil
}

// Close sends close_notify (unless a write is under way or has failed)
// and closes the connection.
func (c *Conn) Close() error {
	if c.closed.Swap(true) {
		return net.ErrClosed
	}
	if t := c.tls.Load(); t != nil {
		return t.nc.Close()
	}
	if c.wmu.TryLock() {
		if c.werr == nil {
			_ = c.raw.SetWriteDeadline(time.Now().Add(closeNotifyTimeout))
			_ = c.writeRecordLocked(typeAlert, []byte{alertLevelWarning, alertCloseNotify})
		}
		c.werr = net.ErrClosed
		c.wmu.Unlock()
	}
	return c.raw.Close()
}

// Handshake runs crypto/tls's handshake unless it has run (it has, once
// the connection is taken over).
func (c *Conn) Handshake() error {
	if t := c.tls.Load(); t != nil {
		return t.tc.Handshake()
	}
	return nil
}

// ConnectionState is crypto/tls's until the connection is taken over;
// after, what was negotiated: version, suite, server name, ALPN protocol
// and resumption (the peer's certificates and the exporter are not kept:
// no server here asks for either after the first request).
func (c *Conn) ConnectionState() tls.ConnectionState {
	if t := c.tls.Load(); t != nil {
		return t.tc.ConnectionState()
	}
	return tls.ConnectionState{
		Version:            tls.VersionTLS13,
		HandshakeComplete:  true,
		DidResume:          c.didResume,
		CipherSuite:        c.s.id,
		NegotiatedProtocol: c.alpn,
		ServerName:         c.serverName,
	}
}

// NetConn is the connection below TLS.
func (c *Conn) NetConn() net.Conn { return c.raw }

func (c *Conn) LocalAddr() net.Addr                { return c.raw.LocalAddr() }
func (c *Conn) RemoteAddr() net.Addr               { return c.raw.RemoteAddr() }
func (c *Conn) SetDeadline(t time.Time) error      { return c.raw.SetDeadline(t) }
func (c *Conn) SetReadDeadline(t time.Time) error  { return c.raw.SetReadDeadline(t) }
func (c *Conn) SetWriteDeadline(t time.Time) error { return c.raw.SetWriteDeadline(t) }
