// Package jsonlex validates and skips JSON tokens (RFC 8259) in a byte slice
// without allocating. It is the one lexer under the relay's hand-written
// codecs: the private-channel control frames and the agent relay's NDJSON
// lines.
//
// Every function works on the input and a byte offset: it takes the offset
// where its token starts and returns the offset just past it, so the only
// state is the offset itself and nothing escapes to the heap. Whatever
// follows a token is the caller's business: "01" and "nullx" fail in the
// caller, at the byte after the token.
//
// Beyond the grammar, strings must be valid UTF-8 (both callers forward
// strings as WebSocket text). What the callers choose differently is in
// Lexer: how deep values may nest and whether a line feed is whitespace.
//
// Errors are an Error value, an offset and a Code with a constant message,
// so that reporting one allocates nothing; each caller maps it to its own
// error at its API.
package jsonlex

import (
	"encoding/binary"
	"math/bits"
	"strconv"
	"unicode/utf16"
	"unicode/utf8"
)

// Code says what was wrong at an Error's offset. The zero Code, OK, means
// no error.
type Code uint8

// The codes, with their messages (Code.String).
const (
	OK                     Code = iota
	End                         // unexpected end of input (the offset is the input's length)
	InvalidChar                 // invalid character looking for a value
	ExpectedKey                 // expected a string key
	ExpectedColon               // expected ':' after a key
	ExpectedCommaOrBrace        // expected ',' or '}' in an object
	ExpectedCommaOrBracket      // expected ',' or ']' in an array
	BadTrue                     // invalid literal, expected true
	BadFalse                    // invalid literal, expected false
	BadNull                     // invalid literal, expected null
	BadNumber                   // invalid number
	NoFractionDigit             // invalid number: no digit after '.'
	NoExponentDigit             // invalid number: no digit in exponent
	BadEscape                   // invalid escape in a string
	BadUnicodeEscape            // invalid \u escape
	ControlChar                 // control character in a string
	BadUTF8                     // invalid UTF-8 in a string
	TooDeep                     // nested too deeply
)

// String returns the constant message of c.
func (c Code) String() string {
	switch c {
	case OK:
		return "no error"
	case End:
		return "unexpected end of input"
	case InvalidChar:
		return "invalid character looking for a value"
	case ExpectedKey:
		return "expected a string key"
	case ExpectedColon:
		return "expected ':' after a key"
	case ExpectedCommaOrBrace:
		return "expected ',' or '}' in an object"
	case ExpectedCommaOrBracket:
		return "expected ',' or ']' in an array"
	case BadTrue:
		return "invalid literal, expected true"
	case BadFalse:
		return "invalid literal, expected false"
	case BadNull:
		return "invalid literal, expected null"
	case BadNumber:
		return "invalid number"
	case NoFractionDigit:
		return "invalid number: no digit after '.'"
	case NoExponentDigit:
		return "invalid number: no digit in exponent"
	case BadEscape:
		return "invalid escape in a string"
	case BadUnicodeEscape:
		return `invalid \u escape`
	case ControlChar:
		return "control character in a string"
	case BadUTF8:
		return "invalid UTF-8 in a string"
	case TooDeep:
		return "nested too deeply"
	}
	return "unknown error"
}

// Error is where the input stopped being acceptable, and why. It is a plain
// value: returning one allocates nothing. The zero Error is no error.
type Error struct {
	Offset int  // byte offset in the input where the problem was found
	Code   Code // what was wrong there; OK if nothing was
}

// Failed reports whether e is an error.
func (e Error) Failed() bool { return e.Code != OK }

// Msg returns the constant message of e's Code.
func (e Error) Msg() string { return e.Code.String() }

// Error formats e for a log line (which allocates; the hot path maps e to
// its own error instead).
func (e Error) Error() string {
	return "jsonlex: " + e.Code.String() + " at byte " + strconv.Itoa(e.Offset)
}

func fail(i int, c Code) Error { return Error{i, c} }

// endOf is the error of input b that stops in the middle of a token.
func endOf(b []byte) Error { return Error{len(b), End} }

// DepthLimit is the largest Lexer.MaxDepth that SkipValue supports.
const DepthLimit = 256

// Lexer holds what the relay's two JSON dialects choose differently. It is a
// small value, meant to be written as a literal where it is used.
type Lexer struct {
	// MaxDepth is the deepest nesting of objects and arrays SkipValue
	// accepts (at most DepthLimit); one deeper is TooDeep.
	MaxDepth int
	// NoLineFeed makes a line feed not whitespace, for a format where it
	// ends the message (NDJSON): a value that holds one is refused.
	NoLineFeed bool
}

// SkipWS returns the offset of the first byte at or after i that is not
// whitespace: space, tab, carriage return, and line feed unless NoLineFeed.
func (l Lexer) SkipWS(b []byte, i int) int {
	for i < len(b) {
		switch b[i] {
		case ' ', '\t', '\r':
			i++
		case '\n':
			if l.NoLineFeed {
				return i
			}
			i++
		default:
			return i
		}
	}
	return i
}

// ScanKey validates the member name starting at b[i] and the colon after
// it, and returns the offset of the member's value (after whitespace).
func (l Lexer) ScanKey(b []byte, i int) (int, Error) {
	if i >= len(b) {
		return i, endOf(b)
	}
	if b[i] != '"' {
		return i, fail(i, ExpectedKey)
	}
	i, _, err := ScanString(b, i)
	if err.Code != OK {
		return i, err
	}
	if i = l.SkipWS(b, i); i >= len(b) || b[i] != ':' {
		return i, fail(i, ExpectedColon)
	}
	return l.SkipWS(b, i+1), Error{}
}

// SkipValue validates the JSON value that starts at b[i] and returns the
// offset just past it. depth (at least 1) is the nesting level an object or
// array starting at b[i] would have; one deeper than MaxDepth is TooDeep, at
// the offset of its opening bracket.
//
// The walk is a loop, not a recursion, so even a hostile input costs no
// stack: a bit per open container (set for an array) says which closing
// bracket and which separator rules apply.
func (l Lexer) SkipValue(b []byte, i, depth int) (int, Error) {
	var stack [DepthLimit / 64]uint64
	open := 0 // containers opened by this walk and not yet closed
	for {
		// b[i] is the first byte of a value.
		if i >= len(b) {
			return i, endOf(b)
		}
		var err Error
		switch c := b[i]; c {
		case '"':
			i, _, err = ScanString(b, i)
		case '{', '[':
			if depth+open > l.MaxDepth {
				return i, fail(i, TooDeep)
			}
			i = l.SkipWS(b, i+1)
			if i < len(b) && b[i] == c+2 { // '{'+2 is '}', '['+2 is ']'
				i++ // empty: a complete value, see below
				break
			}
			if c == '[' {
				stack[open/64] |= 1 << (open % 64)
			} else {
				stack[open/64] &^= 1 << (open % 64)
				if i, err = l.ScanKey(b, i); err.Code != OK {
					return i, err
				}
			}
			open++
			continue
		case 't':
			i, err = ScanLiteral(b, i, "true")
		case 'f':
			i, err = ScanLiteral(b, i, "false")
		case 'n':
			i, err = ScanLiteral(b, i, "null")
		default:
			if c != '-' && !isDigit(c) {
				return i, fail(i, InvalidChar)
			}
			i, err = ScanNumber(b, i)
		}
		if err.Code != OK {
			return i, err
		}
		// A value ended at i: close what it ends, or find the next one.
		for {
			if open == 0 {
				return i, Error{}
			}
			if i = l.SkipWS(b, i); i >= len(b) {
				return i, endOf(b)
			}
			array := stack[(open-1)/64]&(1<<((open-1)%64)) != 0
			c := b[i]
			if c == ',' {
				i = l.SkipWS(b, i+1)
				if !array {
					if i, err = l.ScanKey(b, i); err.Code != OK {
						return i, err
					}
				}
				break
			}
			if array && c == ']' || !array && c == '}' {
				i++
				open--
				continue
			}
			if array {
				return i, fail(i, ExpectedCommaOrBracket)
			}
			return i, fail(i, ExpectedCommaOrBrace)
		}
	}
}

// ScanLiteral validates that word (true, false or null) starts at b[i].
func ScanLiteral(b []byte, i int, word string) (int, Error) {
	if len(b)-i < len(word) || string(b[i:i+len(word)]) != word {
		code := BadNull
		switch word {
		case "true":
			code = BadTrue
		case "false":
			code = BadFalse
		}
		return i, fail(i, code)
	}
	return i + len(word), Error{}
}

// ScanNumber validates the number starting at b[i], which is '-' or a digit:
// -? (0 | [1-9][0-9]*) (. [0-9]+)? ([eE] [+-]? [0-9]+)?
func ScanNumber(b []byte, i int) (int, Error) {
	if b[i] == '-' {
		i++
	}
	switch {
	case i < len(b) && b[i] == '0':
		i++
	case i < len(b) && b[i] >= '1' && b[i] <= '9':
		i = skipDigits(b, i+1)
	default:
		return i, fail(i, BadNumber)
	}
	if i < len(b) && b[i] == '.' {
		i++
		if i >= len(b) || !isDigit(b[i]) {
			return i, fail(i, NoFractionDigit)
		}
		i = skipDigits(b, i)
	}
	if i < len(b) && (b[i] == 'e' || b[i] == 'E') {
		i++
		if i < len(b) && (b[i] == '+' || b[i] == '-') {
			i++
		}
		if i >= len(b) || !isDigit(b[i]) {
			return i, fail(i, NoExponentDigit)
		}
		i = skipDigits(b, i)
	}
	return i, Error{}
}

func isDigit(c byte) bool { return c >= '0' && c <= '9' }

func skipDigits(b []byte, i int) int {
	for i < len(b) && isDigit(b[i]) {
		i++
	}
	return i
}

// SWAR helpers: eight bytes of a string are tested at once.
const (
	lsb = 0x0101010101010101
	msb = 0x8080808080808080
)

// special8 flags (in the top bit of its byte) every byte of x that a string
// scanner must look at: '"', '\\', a control byte, or a non-ASCII byte.
// Flags above the lowest one may be wrong, but the lowest one is exact, so
// it locates the first such byte.
//
// Each subtraction sets the top bit of a byte below 0x20, or equal to '"' or
// '\\', and x itself that of a non-ASCII byte. No other byte gets a top bit
// from them unless a lower byte borrowed, and a byte borrows only when it is
// one of those, so flagged itself. (The textbook "has a byte less than n"
// also masks with ^x, which only matters for bytes of 0x80 and above, and
// those are flagged anyway.)
func special8(x uint64) uint64 {
	return (x | (x - lsb*0x20) | (x ^ (lsb * '"') - lsb) | (x ^ (lsb * '\\') - lsb)) & msb
}

// ScanString validates the string whose opening quote is b[i] and returns
// the offset just past its closing quote, and whether it holds an escape (if
// not, its bytes are its value and can be used in place).
//
// It checks what RFC 8259 demands of a string (no raw control characters,
// only the defined escapes, four hex digits after \u) and, beyond the
// grammar, that the bytes are valid UTF-8. Escaped lone surrogates (\ud800)
// are valid JSON and pass; see DecodeU.
//
// Eight bytes are tested at a time, and the scan jumps straight to the first
// one that needs a look: the closing quote of a short key, or the next
// escape in a long text.
func ScanString(b []byte, i int) (end int, escaped bool, err Error) {
	i++ // the opening quote
	for {
		for i+8 <= len(b) {
			if m := special8(binary.LittleEndian.Uint64(b[i:])); m != 0 {
				i += bits.TrailingZeros64(m) >> 3
				break
			}
			i += 8
		}
		// b[i] needs a look, or fewer than eight bytes are left. Look at
		// the next eight one by one before testing eight at a time again,
		// which would only stop again soon in dense text.
		for stop := min(i+8, len(b)); i < stop; {
			switch c := b[i]; {
			case c == '"':
				return i + 1, escaped, Error{}
			case c == '\\':
				escaped = true
				if i+1 >= len(b) {
					return i, escaped, endOf(b)
				}
				switch b[i+1] {
				case '"', '\\', '/', 'b', 'f', 'n', 'r', 't':
					i += 2
				case 'u':
					if i+6 > len(b) {
						return i, escaped, endOf(b)
					}
					if _, ok := Hex4(b[i+2 : i+6]); !ok {
						return i, escaped, fail(i, BadUnicodeEscape)
					}
					i += 6
				default:
					return i, escaped, fail(i, BadEscape)
				}
			case c < 0x20:
				return i, escaped, fail(i, ControlChar)
			case c < utf8.RuneSelf:
				i++
			default:
				r, size := utf8.DecodeRune(b[i:])
				if r == utf8.RuneError && size == 1 {
					return i, escaped, fail(i, BadUTF8)
				}
				i += size
			}
		}
		if i >= len(b) {
			return i, escaped, endOf(b)
		}
	}
}

// Hex4 decodes four hex digits, either case.
func Hex4(h []byte) (rune, bool) {
	var r rune
	for _, c := range h[:4] {
		switch {
		case c >= '0' && c <= '9':
			c -= '0'
		case c >= 'a' && c <= 'f':
			c -= 'a' - 10
		case c >= 'A' && c <= 'F':
			c -= 'A' - 10
		default:
			return 0, false
		}
		r = r<<4 | rune(c)
	}
	return r, true
}

// DecodeU decodes the \uXXXX escape at the start of raw, part of a string
// ScanString accepted, and returns the character and how many bytes of raw
// it used: 12 for a high surrogate escape followed by a low surrogate
// escape, which together are one character (as in encoding/json), else 6.
// A surrogate without its partner comes back as itself (utf16.IsSurrogate
// tells); what it becomes is the caller's choice.
func DecodeU(raw []byte) (rune, int) {
	r, _ := Hex4(raw[2:6])
	if !utf16.IsSurrogate(r) {
		return r, 6
	}
	if r < 0xdc00 && len(raw) >= 12 && raw[6] == '\\' && raw[7] == 'u' {
		if r2, _ := Hex4(raw[8:12]); r2 >= 0xdc00 && r2 < 0xe000 {
			return utf16.DecodeRune(r, r2), 12
		}
	}
	return r, 6
}
