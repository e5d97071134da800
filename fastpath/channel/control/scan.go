package control

import (
	"encoding/binary"
	"strconv"
	"unicode/utf16"
	"unicode/utf8"

	"edgerelay/fastpath/jsonlex"
)

// MaxDepth is the deepest nesting of objects and arrays that Parse accepts,
// counting the message object itself. Unknown keys may hold any JSON value,
// and Parse validates it; the bound keeps a hostile frame of 420 KB of
// brackets from costing a deep walk for nothing. encoding/json
// allows 10000 levels, so a frame nested 65 to 10000 deep is valid JSON that
// Parse still refuses (ErrTooDeep); no real encoder produces one.
const MaxDepth = 64

// SyntaxError reports a frame that is not valid JSON (RFC 8259). It matches
// ErrNotJSON under errors.Is; Offset and Msg are for the log line.
type SyntaxError struct {
	Offset int    // byte offset in the frame where the problem was found
	Msg    string // what was wrong there
}

func (e *SyntaxError) Error() string {
	return "control: invalid JSON at byte " + strconv.Itoa(e.Offset) + ": " + e.Msg
}

// Is makes errors.Is(err, ErrNotJSON) true for every syntax error.
func (e *SyntaxError) Is(target error) bool { return target == ErrNotJSON }

func syntaxError(offset int, msg string) error {
	return &SyntaxError{Offset: offset, Msg: msg}
}

// errEnd is the syntax error of a frame that stops in the middle of a value.
func errEnd(b []byte) error { return syntaxError(len(b), "unexpected end of frame") }

// The scanner is jsonlex with this package's choices: JSON's whitespace
// (a line feed included) and nesting at most MaxDepth deep. The helpers
// below map its errors to this package's at the boundary: a *SyntaxError
// with jsonlex's offset and message, or ErrTooDeep. Each takes the offset
// where its token starts and returns the offset just past it.

// lex is the lexer of a control frame.
func lex() jsonlex.Lexer { return jsonlex.Lexer{MaxDepth: MaxDepth} }

const _ uint = jsonlex.DepthLimit - MaxDepth // jsonlex supports MaxDepth

// lexError is e as this package's error; b is the frame.
func lexError(b []byte, e jsonlex.Error) error {
	switch e.Code {
	case jsonlex.TooDeep:
		return ErrTooDeep
	case jsonlex.End:
		return errEnd(b)
	case jsonlex.InvalidChar:
		return syntaxError(e.Offset, "invalid character "+strconv.QuoteRune(rune(b[e.Offset]))+" looking for a value")
	}
	return syntaxError(e.Offset, e.Msg())
}

// skipWS returns the offset of the first non-whitespace byte at or after i.
func skipWS(b []byte, i int) int { return lex().SkipWS(b, i) }

// skipValue validates the JSON value starting at b[i] and returns the offset
// just past it. depth is the nesting level an object or array starting at
// b[i] would have.
func skipValue(b []byte, i, depth int) (int, error) {
	end, e := lex().SkipValue(b, i, depth)
	if e.Failed() {
		return end, lexError(b, e)
	}
	return end, nil
}

// appendUnescaped appends to dst the value of raw, the body (without quotes)
// of a string that jsonlex.ScanString has accepted. It stops and reports false as
// soon as the value would grow beyond limit bytes; it never appends past that
// point, so a dst with room for limit more bytes is never reallocated.
//
// \uXXXX escapes become UTF-8. A high surrogate escape followed by a low
// surrogate escape becomes the one 4-byte character they encode. A surrogate
// escape without its partner becomes U+FFFD, which is what the reference relay
// ends up sending: JavaScript's JSON.parse keeps the lone UTF-16 unit and
// WebSocket.send encodes it as U+FFFD. encoding/json does the same.
//
// Runs between escapes are found eight bytes at a time and copied in bulk.
// The value of an escape is never longer than the escape, so the result is at
// most len(raw) bytes.
func appendUnescaped(dst, raw []byte, limit int) ([]byte, bool) {
	limit += len(dst)
	start := 0 // raw[start:i] has no escape and is not copied yet
	for i := 0; i < len(raw); {
		if i+8 <= len(raw) && !hasZeroByte(binary.LittleEndian.Uint64(raw[i:])^(lsb*'\\')) {
			i += 8
			continue
		}
		for stop := min(i+8, len(raw)); i < stop; {
			if raw[i] != '\\' {
				i++
				continue
			}
			if len(dst)+i-start > limit {
				return dst, false
			}
			dst = append(dst, raw[start:i]...)
			var c byte
			switch raw[i+1] { // jsonlex.ScanString saw a complete escape here
			case 'u':
				r, n := jsonlex.DecodeU(raw[i:])
				if utf16.IsSurrogate(r) {
					r = utf8.RuneError // a lone surrogate, see above
				}
				if len(dst)+utf8.RuneLen(r) > limit {
					return dst, false
				}
				dst = utf8.AppendRune(dst, r)
				i += n
				start = i
				continue
			case 'b':
				c = '\b'
			case 'f':
				c = '\f'
			case 'n':
				c = '\n'
			case 'r':
				c = '\r'
			case 't':
				c = '\t'
			default: // '"', '\\', '/'
				c = raw[i+1]
			}
			if len(dst)+1 > limit {
				return dst, false
			}
			dst = append(dst, c)
			i += 2
			start = i
		}
	}
	if len(dst)+len(raw)-start > limit {
		return dst, false
	}
	return append(dst, raw[start:]...), true
}
