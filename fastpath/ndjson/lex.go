package ndjson

import (
	"encoding/binary"
	"math/bits"
	"unicode/utf8"
)

// The lexer works on the line and a byte offset: every function takes the
// offset where its token starts and returns the offset just past it, so the
// only state is the offset itself and nothing escapes to the heap.

// skipWS returns the offset of the first byte at or after i that is not
// whitespace. A line feed is not whitespace here: a line never holds one, and
// a message that does would become two lines on the link.
func skipWS(b []byte, i int) int {
	for i < len(b) && (b[i] == ' ' || b[i] == '\t' || b[i] == '\r') {
		i++
	}
	return i
}

// SWAR helpers: eight bytes of a string are tested at once.
const (
	lsb = 0x0101010101010101
	msb = 0x8080808080808080
)

// hasLess reports (as a non-zero word) whether any byte of x is below n, for
// n <= 128. Which bits are set is not exact; whether any is, is.
func hasLess(x uint64, n byte) uint64 { return (x - lsb*uint64(n)) & ^x & msb }

// special8 flags (in the top bit of its byte) every byte of x that a string
// scanner must look at: '"', '\\', a control byte, or a non-ASCII byte.
// Flags above the lowest one may be wrong (a borrow runs upward), but the
// lowest one is exact, so it locates the first such byte.
func special8(x uint64) uint64 {
	return x&msb | hasLess(x, 0x20) | hasLess(x^(lsb*'"'), 1) | hasLess(x^(lsb*'\\'), 1)
}

// scanString validates the string whose opening quote is b[i] and returns the
// offset just past its closing quote, and whether it holds an escape (if not,
// its bytes are its value).
//
// It checks what RFC 8259 demands of a string (no raw control characters,
// only the defined escapes, four hex digits after \u) and, beyond the
// grammar, that the bytes are valid UTF-8: a line is forwarded to browsers as
// a WebSocket text message, which must be. Lone surrogate escapes are valid
// JSON and pass here; checkText refuses them in envelope fields.
//
// Eight bytes are tested at a time, and the scan jumps straight to the first
// one that needs a look: the closing quote of a short key, or the next
// escape in a long text.
func scanString(b []byte, i int) (end int, escaped bool, err error) {
	i++ // the opening quote
	for {
		if i+8 <= len(b) {
			m := special8(binary.LittleEndian.Uint64(b[i:]))
			if m == 0 {
				i += 8
				continue
			}
			i += bits.TrailingZeros64(m) >> 3
		} else if i >= len(b) {
			return i, escaped, ErrSyntax
		}
		switch c := b[i]; {
		case c == '"':
			return i + 1, escaped, nil
		case c == '\\':
			escaped = true
			if i+1 >= len(b) {
				return i, escaped, ErrSyntax
			}
			switch b[i+1] {
			case '"', '\\', '/', 'b', 'f', 'n', 'r', 't':
				i += 2
			case 'u':
				if i+6 > len(b) {
					return i, escaped, ErrSyntax
				}
				if _, ok := hex4(b[i+2 : i+6]); !ok {
					return i, escaped, ErrSyntax
				}
				i += 6
			default:
				return i, escaped, ErrSyntax
			}
		case c < 0x20:
			return i, escaped, ErrSyntax
		case c < utf8.RuneSelf: // only in the last seven bytes of b
			i++
		default:
			r, size := utf8.DecodeRune(b[i:])
			if r == utf8.RuneError && size == 1 {
				return i, escaped, ErrSyntax
			}
			i += size
		}
	}
}

// hex4 decodes four hex digits, either case.
func hex4(h []byte) (rune, bool) {
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

// scanLiteral validates that the word (true, false or null) starts at b[i].
// Whatever follows is the caller's business, so "nullx" fails there.
func scanLiteral(b []byte, i int, word string) (int, error) {
	if len(b)-i < len(word) || string(b[i:i+len(word)]) != word {
		return i, ErrSyntax
	}
	return i + len(word), nil
}

// scanNumber validates the number starting at b[i]:
// -? (0 | [1-9][0-9]*) (. [0-9]+)? ([eE] [+-]? [0-9]+)?
// Whatever follows is the caller's business, so "01" fails there, at '1'.
func scanNumber(b []byte, i int) (int, error) {
	if b[i] == '-' {
		i++
	}
	switch {
	case i < len(b) && b[i] == '0':
		i++
	case i < len(b) && b[i] >= '1' && b[i] <= '9':
		i = skipDigits(b, i+1)
	default:
		return i, ErrSyntax
	}
	if i < len(b) && b[i] == '.' {
		i++
		if i >= len(b) || !isDigit(b[i]) {
			return i, ErrSyntax
		}
		i = skipDigits(b, i)
	}
	if i < len(b) && (b[i] == 'e' || b[i] == 'E') {
		i++
		if i < len(b) && (b[i] == '+' || b[i] == '-') {
			i++
		}
		if i >= len(b) || !isDigit(b[i]) {
			return i, ErrSyntax
		}
		i = skipDigits(b, i)
	}
	return i, nil
}

func isDigit(c byte) bool { return c >= '0' && c <= '9' }

func skipDigits(b []byte, i int) int {
	for i < len(b) && isDigit(b[i]) {
		i++
	}
	return i
}

// scanUint reads the number starting at b[i] the way encoding/json stores a
// number into a uint64 (strconv.ParseUint(text, 10, 64)): decimal digits
// only, no sign, fraction or exponent, at most 2^64-1. A valid JSON number
// that is not such an integer is ErrSeq: the endpoint's decoder fails on it.
func scanUint(b []byte, i int) (v uint64, end int, err error) {
	start := i
	if b[i] == '0' {
		i++
	} else if b[i] >= '1' && b[i] <= '9' {
		for ; i < len(b) && isDigit(b[i]); i++ {
			d := uint64(b[i] - '0')
			if v > (^uint64(0)-d)/10 {
				return 0, i, ErrSeq
			}
			v = v*10 + d
		}
	} else { // '-'
		if _, err := scanNumber(b, start); err != nil {
			return 0, i, err
		}
		return 0, i, ErrSeq
	}
	if i < len(b) && (b[i] == '.' || b[i] == 'e' || b[i] == 'E') {
		if _, err := scanNumber(b, start); err != nil {
			return 0, i, err
		}
		return 0, i, ErrSeq
	}
	return v, i, nil
}

// scanKey validates the member name starting at b[i] and the colon after it,
// and returns the offset of the member's value.
func scanKey(b []byte, i int) (int, error) {
	if i >= len(b) || b[i] != '"' {
		return i, ErrSyntax
	}
	i, _, err := scanString(b, i)
	if err != nil {
		return i, err
	}
	if i = skipWS(b, i); i >= len(b) || b[i] != ':' {
		return i, ErrSyntax
	}
	return skipWS(b, i+1), nil
}

// skipValue validates the JSON value that starts at b[i] and returns the
// offset just past it. depth is the nesting level an object or array
// starting at b[i] would have; one deeper than MaxDepth is ErrTooDeep.
//
// The walk is a loop, not a recursion: a bit per open container (set for an
// array) says which closing bracket and which separator rules apply.
func skipValue(b []byte, i, depth int) (int, error) {
	var stack [MaxDepth/64 + 1]uint64
	open := 0 // containers opened by this walk and not yet closed
	for {
		// b[i] is the first byte of a value.
		if i >= len(b) {
			return i, ErrSyntax
		}
		var err error
		switch c := b[i]; c {
		case '"':
			i, _, err = scanString(b, i)
		case '{', '[':
			if depth+open > MaxDepth {
				return i, ErrTooDeep
			}
			i = skipWS(b, i+1)
			if i < len(b) && b[i] == c+2 { // '{'+2 is '}', '['+2 is ']'
				i++ // empty: a complete value, see below
				break
			}
			if c == '[' {
				stack[open/64] |= 1 << (open % 64)
			} else {
				stack[open/64] &^= 1 << (open % 64)
				if i, err = scanKey(b, i); err != nil {
					return i, err
				}
			}
			open++
			continue
		case 't':
			i, err = scanLiteral(b, i, "true")
		case 'f':
			i, err = scanLiteral(b, i, "false")
		case 'n':
			i, err = scanLiteral(b, i, "null")
		default:
			if c != '-' && !isDigit(c) {
				return i, ErrSyntax
			}
			i, err = scanNumber(b, i)
		}
		if err != nil {
			return i, err
		}
		// A value ended at i: close what it ends, or find the next one.
		for {
			if open == 0 {
				return i, nil
			}
			if i = skipWS(b, i); i >= len(b) {
				return i, ErrSyntax
			}
			array := stack[(open-1)/64]&(1<<((open-1)%64)) != 0
			c := b[i]
			if c == ',' {
				i = skipWS(b, i+1)
				if !array {
					if i, err = scanKey(b, i); err != nil {
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
			return i, ErrSyntax
		}
	}
}
