package control

import (
	"encoding/binary"
	"strconv"
	"unicode/utf16"
	"unicode/utf8"
)

// MaxDepth is the deepest nesting of objects and arrays that Parse accepts,
// counting the message object itself. Unknown keys may hold any JSON value,
// and the validating skipper recurses into them; the bound keeps a hostile
// frame from turning 420 KB of brackets into a deep stack. encoding/json
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

// The scanner below works on the frame and a byte offset. Every function
// takes the offset where its token starts and returns the offset just past
// it, so the only state is the offset itself.

// skipWS returns the offset of the first non-whitespace byte at or after i.
func skipWS(b []byte, i int) int {
	for i < len(b) {
		switch b[i] {
		case ' ', '\t', '\n', '\r':
			i++
		default:
			return i
		}
	}
	return i
}

// skipValue validates the JSON value starting at b[i] and returns the offset
// just past it. depth is the nesting level an object or array starting at
// b[i] would have.
func skipValue(b []byte, i, depth int) (int, error) {
	if i >= len(b) {
		return i, errEnd(b)
	}
	switch c := b[i]; {
	case c == '"':
		end, _, err := scanString(b, i)
		return end, err
	case c == '{':
		return skipObject(b, i, depth)
	case c == '[':
		return skipArray(b, i, depth)
	case c == 't':
		return scanLiteral(b, i, "true")
	case c == 'f':
		return scanLiteral(b, i, "false")
	case c == 'n':
		return scanLiteral(b, i, "null")
	case c == '-' || c >= '0' && c <= '9':
		return scanNumber(b, i)
	default:
		return i, syntaxError(i, "invalid character "+strconv.QuoteRune(rune(c))+" looking for a value")
	}
}

// skipObject validates the object starting at b[i] == '{'.
func skipObject(b []byte, i, depth int) (int, error) {
	if depth > MaxDepth {
		return i, ErrTooDeep
	}
	i = skipWS(b, i+1)
	if i < len(b) && b[i] == '}' {
		return i + 1, nil
	}
	for {
		if i >= len(b) {
			return i, errEnd(b)
		}
		if b[i] != '"' {
			return i, syntaxError(i, "expected a string key")
		}
		var err error
		if i, _, err = scanString(b, i); err != nil {
			return i, err
		}
		if i = skipWS(b, i); i >= len(b) || b[i] != ':' {
			return i, syntaxError(i, "expected ':' after a key")
		}
		if i, err = skipValue(b, skipWS(b, i+1), depth+1); err != nil {
			return i, err
		}
		if i = skipWS(b, i); i >= len(b) {
			return i, errEnd(b)
		}
		switch b[i] {
		case ',':
			i = skipWS(b, i+1)
		case '}':
			return i + 1, nil
		default:
			return i, syntaxError(i, "expected ',' or '}' in an object")
		}
	}
}

// skipArray validates the array starting at b[i] == '['.
func skipArray(b []byte, i, depth int) (int, error) {
	if depth > MaxDepth {
		return i, ErrTooDeep
	}
	i = skipWS(b, i+1)
	if i < len(b) && b[i] == ']' {
		return i + 1, nil
	}
	for {
		var err error
		if i, err = skipValue(b, i, depth+1); err != nil {
			return i, err
		}
		if i = skipWS(b, i); i >= len(b) {
			return i, errEnd(b)
		}
		switch b[i] {
		case ',':
			i = skipWS(b, i+1)
		case ']':
			return i + 1, nil
		default:
			return i, syntaxError(i, "expected ',' or ']' in an array")
		}
	}
}

// scanLiteral validates that the literal word (true, false or null) starts at b[i].
func scanLiteral(b []byte, i int, word string) (int, error) {
	if len(b)-i < len(word) || string(b[i:i+len(word)]) != word {
		return i, syntaxError(i, "invalid literal, expected "+word)
	}
	return i + len(word), nil
}

// scanNumber validates the number starting at b[i]:
// -? (0 | [1-9][0-9]*) (. [0-9]+)? ([eE] [+-]? [0-9]+)?
// Whatever follows it is the caller's business, so "01" fails there, at '1'.
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
		return i, syntaxError(i, "invalid number")
	}
	if i < len(b) && b[i] == '.' {
		i++
		if i >= len(b) || !isDigit(b[i]) {
			return i, syntaxError(i, "invalid number: no digit after '.'")
		}
		i = skipDigits(b, i)
	}
	if i < len(b) && (b[i] == 'e' || b[i] == 'E') {
		i++
		if i < len(b) && (b[i] == '+' || b[i] == '-') {
			i++
		}
		if i >= len(b) || !isDigit(b[i]) {
			return i, syntaxError(i, "invalid number: no digit in exponent")
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

// scanString validates the string starting at b[i] == '"' and returns the
// offset just past its closing quote, and whether it contains any escape (if
// not, its bytes are its value and can be used in place).
//
// It checks everything RFC 8259 demands of a string (no raw control
// characters, only the defined escapes, four hex digits after \u) and, beyond
// JSON's grammar, that the bytes are valid UTF-8: a control frame is a
// websocket text frame, so anything else is a broken peer. Escaped lone
// surrogates (\ud800) are valid JSON and accepted; see appendUnescaped.
//
// Plain ASCII runs, the bulk of a base64 or hex ciphertext, are skipped eight
// bytes per step.
func scanString(b []byte, i int) (end int, escaped bool, err error) {
	i++ // opening quote
	for {
		if i+8 <= len(b) && plainASCII8(binary.LittleEndian.Uint64(b[i:])) {
			i += 8
			continue
		}
		// Something in the next eight bytes needs a closer look. Look at
		// them one by one before trying eight at a time again, which would
		// only fail again in dense text.
		for stop := min(i+8, len(b)); i < stop; {
			switch c := b[i]; {
			case c == '"':
				return i + 1, escaped, nil
			case c == '\\':
				escaped = true
				if i+1 >= len(b) {
					return i, escaped, errEnd(b)
				}
				switch b[i+1] {
				case '"', '\\', '/', 'b', 'f', 'n', 'r', 't':
					i += 2
				case 'u':
					if i+6 > len(b) {
						return i, escaped, errEnd(b)
					}
					if _, ok := hex4(b[i+2 : i+6]); !ok {
						return i, escaped, syntaxError(i, `invalid \u escape`)
					}
					i += 6
				default:
					return i, escaped, syntaxError(i, "invalid escape in a string")
				}
			case c < 0x20:
				return i, escaped, syntaxError(i, "control character in a string")
			case c < utf8.RuneSelf:
				i++
			default:
				r, size := utf8.DecodeRune(b[i:])
				if r == utf8.RuneError && size <= 1 {
					return i, escaped, syntaxError(i, "invalid UTF-8 in a string")
				}
				i += size
			}
		}
		if i >= len(b) {
			return i, escaped, errEnd(b)
		}
	}
}

// hex4 decodes four hex digits (either case).
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

// appendUnescaped appends to dst the value of raw, the body (without quotes)
// of a string that scanString has accepted. It stops and reports false as
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
			switch raw[i+1] { // scanString saw a complete escape here
			case 'u':
				r, n := decodeU(raw[i:])
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

// decodeU decodes the validated \uXXXX escape at the start of raw, pairing a
// high surrogate with an immediately following low surrogate escape. It
// returns the character and how many bytes of raw it used (6 or 12).
func decodeU(raw []byte) (rune, int) {
	r, _ := hex4(raw[2:6])
	if !utf16.IsSurrogate(r) {
		return r, 6
	}
	if r < 0xdc00 && len(raw) >= 12 && raw[6] == '\\' && raw[7] == 'u' {
		if r2, _ := hex4(raw[8:12]); r2 >= 0xdc00 && r2 < 0xe000 {
			return utf16.DecodeRune(r, r2), 12
		}
	}
	return utf8.RuneError, 6
}
