// Package control is the hand-written codec of private-channel control-socket
// messages (see spec/private-channel.md, "Control socket messages").
//
// Every phone frame crosses the control socket wrapped in
// {"type":"data","id":…,"data":…}, so this codec sits on the relay's hot path.
// It never uses encoding/json and allocates nothing in steady state: encoders
// append into a caller-provided (pooled) buffer, and Parse unescapes into a
// caller-provided scratch buffer that it only grows when it is too small.
//
// Parse is strict where the spec is strict (the whole frame must be valid JSON,
// the id exact, data bounded) and lenient where JSON is (keys in any order,
// escapes, whitespace, unknown keys), because the computer is free to use any
// JSON encoder.
package control

import "edgerelay/fastpath/jsonstr"

const (
	// IDLen is the length of a channel id: 32 lowercase hex characters.
	IDLen = 32
	// MaxData is the largest phone frame, in bytes, that a data message may
	// carry. For Parse it applies after unescaping.
	MaxData = 70000
	// ReadLimit is a read limit for control sockets that admits every data
	// message Parse accepts as written by a sane encoder: MaxData bytes escaped
	// as \u00XX each (six times larger, the worst case), plus room for the
	// envelope. The spec asks relays to accept at least 6 x 70,000 bytes.
	ReadLimit = 6*MaxData + 4096
)

// ID is a channel id as it appears on the wire: 32 lowercase hex characters.
// It is an array rather than a string so that it can be kept in routing
// tables and written into frames without allocating.
type ID [IDLen]byte

// String returns the id as text, for logs.
func (id ID) String() string { return string(id[:]) }

// AppendOpen appends {"type":"open","id":"<id>"} to dst.
//
// The id is written verbatim: ids are chosen by the relay and are lowercase
// hex, which never needs escaping.
func AppendOpen(dst []byte, id *ID) []byte {
	dst = append(dst, `{"type":"open","id":"`...)
	dst = append(dst, id[:]...)
	return append(dst, `"}`...)
}

// AppendClose appends {"type":"close","id":"<id>"} to dst.
func AppendClose(dst []byte, id *ID) []byte {
	dst = append(dst, `{"type":"close","id":"`...)
	dst = append(dst, id[:]...)
	return append(dst, `"}`...)
}

// AppendData appends {"type":"data","id":"<id>","data":<data as a JSON
// string>} to dst.
//
// It does not enforce MaxData: the caller has already refused larger phone
// frames (close 1009), and the encoder has no reason to fail.
func AppendData(dst []byte, id *ID, data []byte) []byte {
	dst = append(dst, `{"type":"data","id":"`...)
	dst = append(dst, id[:]...)
	dst = append(dst, `","data":`...)
	dst = AppendString(dst, data)
	return append(dst, '}')
}

// AppendString appends s to dst as a quoted JSON string, escaping exactly what
// RFC 8259 requires: '"', '\\' and the control characters below 0x20 (as \b,
// \f, \n, \r, \t, or \u00xx with lowercase hex). Everything else, including
// DEL, U+2028/U+2029 and all non-ASCII bytes, is copied through untouched, so
// the common case (ASCII ciphertext without quotes) is a bulk copy.
//
// Unlike encoding/json it neither escapes <, > and & (the output is never
// embedded in HTML) nor replaces invalid UTF-8. Phone frames are websocket
// text frames, which the websocket layer has already validated as UTF-8, so
// invalid input cannot occur in practice; if it does, the bytes pass through
// and nothing panics.
func AppendString(dst []byte, s []byte) []byte {
	return jsonstr.AppendRaw(dst, s)
}

// SWAR ("SIMD within a register") helpers for appendUnescaped (the encoder's
// copies live in jsonstr, the scanner's in jsonlex): each looks at eight bytes
// packed little-endian into a uint64. The expression is the classic exact
// "does any byte …" test: it may misreport which byte matched, but never
// whether one did.
const (
	lsb = 0x0101010101010101
	msb = 0x8080808080808080
)

// hasZeroByte reports whether any byte of w is 0.
func hasZeroByte(w uint64) bool { return (w-lsb)&^w&msb != 0 }
