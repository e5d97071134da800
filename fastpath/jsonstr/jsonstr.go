// Package jsonstr writes byte strings as quoted JSON strings, without
// encoding/json and without allocating when the destination has room.
//
// It is the one copy of the hot escaping loop shared by the relay's
// hand-written codecs. The loop skips eight bytes at a time while none of
// them needs attention (SWAR: eight bytes packed in a uint64) and copies
// plain runs in bulk, so the common case (ASCII without quotes) is close to
// a memcpy.
//
// Two variants differ only in what counts as needing attention:
//
//   - AppendRaw escapes exactly what RFC 8259 requires and copies every
//     other byte through untouched. For valid UTF-8 this is also what
//     JavaScript's JSON.stringify writes.
//   - AppendLikeEncodingJSON additionally escapes U+2028 and U+2029 and
//     replaces invalid UTF-8 with \ufffd, byte-for-byte what encoding/json's
//     Encoder writes with SetEscapeHTML(false).
//
// Both write '"' and '\\' as \" and \\, the control characters \b, \f, \n,
// \r and \t by name and the other ones below 0x20 as \u00xx (lowercase hex).
// Neither escapes '<', '>', '&' or DEL (0x7f).
package jsonstr

import (
	"encoding/binary"
	"slices"
	"unicode/utf8"
)

// AppendRaw appends s to dst as a quoted JSON string, escaping exactly what
// RFC 8259 requires: '"', '\\' and the control characters below 0x20.
// Everything else, including DEL, U+2028/U+2029 and all non-ASCII bytes
// (valid UTF-8 or not), is copied through untouched.
//
// The output is a valid JSON string whenever s is valid UTF-8, and then it
// is also exactly what JSON.stringify writes for s. Invalid UTF-8 passes
// through as it is.
func AppendRaw(dst, s []byte) []byte {
	return appendString(dst, s, false)
}

// AppendLikeEncodingJSON appends s to dst as a quoted JSON string,
// byte-for-byte as encoding/json's Encoder with SetEscapeHTML(false) writes
// it: what AppendRaw escapes, plus U+2028 and U+2029 as \u2028 and \u2029,
// and every byte of invalid UTF-8 replaced with \ufffd. The output is always
// valid JSON and valid UTF-8.
func AppendLikeEncodingJSON(dst, s []byte) []byte {
	return appendString(dst, s, true)
}

const hexDigits = "0123456789abcdef"

// appendString is both variants. checkUTF8 selects AppendLikeEncodingJSON:
// it makes every non-ASCII byte stop the eight-byte skip, so that runes are
// decoded and checked; without it non-ASCII bytes are plain.
func appendString(dst, s []byte, checkUTF8 bool) []byte {
	var stop uint64 // the high bits that also stop the eight-byte skip
	plain := &plainRaw
	if checkUTF8 {
		stop = msb
		plain = &plainUTF8
	}
	// Grow once for the common case of nothing to escape; escapes grow
	// further. The output is never shorter than len(s)+2, so this never
	// allocates where the appends below would not have.
	dst = slices.Grow(dst, len(s)+2)
	dst = append(dst, '"')
	start := 0 // s[start:i] is plain and not copied yet
	for i := 0; i < len(s); {
		// Skip eight bytes at a time while none of them needs attention…
		if i+8 <= len(s) {
			if w := binary.LittleEndian.Uint64(s[i:]); w&stop == 0 && !needsEscape8(w) {
				i += 8
				continue
			}
		}
		// …otherwise look at those eight one by one (a rune may end past them).
		for end := min(i+8, len(s)); i < end; {
			c := s[i]
			if plain[c] {
				i++
				continue
			}
			if c < utf8.RuneSelf {
				dst = append(dst, s[start:i]...)
				dst = appendEscape(dst, c)
				i++
				start = i
				continue
			}
			r, size := utf8.DecodeRune(s[i:])
			switch {
			case r == utf8.RuneError && size == 1:
				dst = append(dst, s[start:i]...)
				dst = append(dst, `\ufffd`...)
			case r == '\u2028' || r == '\u2029':
				dst = append(dst, s[start:i]...)
				dst = append(dst, '\\', 'u', '2', '0', '2', hexDigits[r&0xf])
			default:
				i += size
				continue
			}
			i += size
			start = i
		}
	}
	dst = append(dst, s[start:]...)
	return append(dst, '"')
}

// plainRaw and plainUTF8 tell, for each byte, whether the variant copies it
// through as it is (without it being part of a rune that needs checking).
var plainRaw, plainUTF8 = func() (raw, utf [256]bool) {
	for c := range 256 {
		raw[c] = c >= 0x20 && c != '"' && c != '\\'
		utf[c] = raw[c] && c < utf8.RuneSelf
	}
	return raw, utf
}()

// appendEscape appends the escape of c, which is '"', '\\' or below 0x20.
func appendEscape(dst []byte, c byte) []byte {
	switch c {
	case '"', '\\':
		return append(dst, '\\', c)
	case '\n':
		return append(dst, '\\', 'n')
	case '\r':
		return append(dst, '\\', 'r')
	case '\t':
		return append(dst, '\\', 't')
	case '\b':
		return append(dst, '\\', 'b')
	case '\f':
		return append(dst, '\\', 'f')
	}
	return append(dst, '\\', 'u', '0', '0', hexDigits[c>>4], hexDigits[c&0xf])
}

// SWAR helpers: each looks at eight bytes packed little-endian into a
// uint64. The expressions are the classic exact "does any byte …" tests:
// they may misreport which byte matched, but never whether one did.
const (
	lsb = 0x0101010101010101
	msb = 0x8080808080808080
)

// hasZeroByte reports whether any byte of w is 0.
func hasZeroByte(w uint64) bool { return (w-lsb)&^w&msb != 0 }

// hasLess reports whether any byte of w is below n (n ≤ 0x80).
func hasLess(w uint64, n uint64) bool { return (w-lsb*n)&^w&msb != 0 }

// needsEscape8 reports whether any of the eight bytes must be escaped in a
// JSON string: a control character, '"' or '\\'.
func needsEscape8(w uint64) bool {
	return hasLess(w, 0x20) || hasZeroByte(w^(lsb*'"')) || hasZeroByte(w^(lsb*'\\'))
}
