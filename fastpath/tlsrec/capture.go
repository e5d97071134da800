package tlsrec

import (
	"crypto/tls"
	"errors"
	"fmt"
	"reflect"
)

// captured is a TLS 1.3 connection's record state after its handshake:
// the suite and, per direction, the current traffic secret and the next
// record's sequence number.
type captured struct {
	suite      *suite
	in, out    half
	negotiated negotiated
}

// negotiated is what ConnectionState reports of a connection taken over,
// beside its version and suite.
type negotiated struct {
	serverName, alpn string
	didResume        bool
}

// errBusy: the *tls.Conn holds input not yet read (a partial record, or a
// record's data not yet returned); capture again once it has none.
var errBusy = errors.New("tlsrec: crypto/tls holds unread input")

// errNotTLS13: the connection did not negotiate TLS 1.3 (or its state is
// laid out unlike the crypto/tls this was written against); it is never
// taken over.
var errNotTLS13 = errors.New("tlsrec: not a TLS 1.3 connection")

// capture reads tc's record state out of crypto/tls. crypto/tls exports
// none of it, so this reads its unexported fields through reflect (read
// only: nothing in tc is changed); TestCaptureMatchesCryptoTLS fails
// should a Go release lay them out differently, and any field not found
// here makes capture refuse (errNotTLS13) rather than guess.
//
// The caller must own both directions of tc: no Read or Write of it may
// run, and none may follow, since records sealed by tc after this would
// reuse sequence numbers. Secrets are copied, so tc may be dropped.
func capture(tc *tls.Conn) (st captured, err error) {
	defer func() {
		// A layout this does not know (a field renamed or retyped)
		// panics in reflect: refuse the connection instead.
		if r := recover(); r != nil {
			st, err = captured{}, fmt.Errorf("%w: %v", errNotTLS13, r)
		}
	}()
	cs := tc.ConnectionState()
	if !cs.HandshakeComplete {
		return captured{}, errBusy // not yet
	}
	if cs.Version != tls.VersionTLS13 {
		return captured{}, errNotTLS13
	}
	v := reflect.ValueOf(tc).Elem()
	s := suiteByID(uint16(field(v, "cipherSuite").Uint()))
	if s == nil || !field(v, "quic").IsNil() {
		return captured{}, errNotTLS13
	}
	if field(v, "closeNotifySent").Bool() {
		return captured{}, errors.New("tlsrec: the connection is closing")
	}
	if bufferLen(field(v, "rawInput")) != 0 || bufferLen(field(v, "hand")) != 0 || readerLen(field(v, "input")) != 0 {
		return captured{}, errBusy
	}
	in, err := halfOf(field(v, "in"), s)
	if err != nil {
		return captured{}, fmt.Errorf("tlsrec: read side: %w", err)
	}
	out, err := halfOf(field(v, "out"), s)
	if err != nil {
		return captured{}, fmt.Errorf("tlsrec: write side: %w", err)
	}
	return captured{suite: s, in: in, out: out, negotiated: negotiated{cs.ServerName, cs.NegotiatedProtocol, cs.DidResume}}, nil
}

// field is v's field name; it panics (see capture's recover) when there
// is none.
func field(v reflect.Value, name string) reflect.Value {
	f := v.FieldByName(name)
	if !f.IsValid() {
		panic("crypto/tls.Conn has no field " + name)
	}
	return f
}

// halfOf is one of crypto/tls's halfConns as a half.
func halfOf(hc reflect.Value, s *suite) (half, error) {
	if !field(hc, "err").IsNil() {
		return half{}, errors.New("it has failed")
	}
	if !field(hc, "nextCipher").IsNil() {
		return half{}, errors.New("a key change is pending")
	}
	secret := field(hc, "trafficSecret").Bytes()
	if len(secret) != s.hash().Size() {
		return half{}, fmt.Errorf("traffic secret of %d bytes", len(secret))
	}
	seqBytes := field(hc, "seq")
	if seqBytes.Len() != 8 {
		return half{}, errors.New("sequence number is not 8 bytes")
	}
	var seq uint64
	for i := range 8 {
		seq = seq<<8 | seqBytes.Index(i).Uint()
	}
	return half{secret: append([]byte(nil), secret...), seq: seq}, nil
}

// bufferLen is the unread length of a bytes.Buffer.
func bufferLen(b reflect.Value) int {
	return field(b, "buf").Len() - int(field(b, "off").Int())
}

// readerLen is the unread length of a bytes.Reader.
func readerLen(r reflect.Value) int {
	return field(r, "s").Len() - int(field(r, "i").Int())
}
