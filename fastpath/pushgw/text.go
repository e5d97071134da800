package pushgw

import (
	"unicode/utf8"

	"edgerelay/fastpath/jsonstr"
)

// The reference gateway is JavaScript: its lengths are UTF-16 code units,
// its trim is String.prototype.trim, its output is JSON.stringify. The
// helpers here reproduce those on UTF-8 text. Every string they see was
// decoded by the parser, which guarantees valid UTF-8 (invalid input and
// lone surrogates became U+FFFD, as the reference's decoding does).

// utf16Len is the length of s in UTF-16 code units: one per rune, two for
// a rune outside the Basic Multilingual Plane (a surrogate pair).
func utf16Len(s []byte) int {
	n := 0
	for _, c := range s {
		switch {
		case c < 0x80, c&0xC0 == 0xC0 && c < 0xF0:
			n++ // ASCII, or the lead byte of a 2- or 3-byte rune
		case c >= 0xF0:
			n += 2 // the lead byte of a 4-byte rune: a surrogate pair
		}
	}
	return n
}

// clip16 returns the longest prefix of s of at most max UTF-16 code units
// that ends on a rune boundary. A rune outside the BMP is kept or dropped
// whole, so the result never holds half a surrogate pair.
func clip16(s []byte, max int) []byte { return clipRunes(s, max, utf16RuneLen) }

// utf16RuneLen is the length of rune r in UTF-16 code units.
func utf16RuneLen(r []byte) int {
	if r[0] >= 0xF0 {
		return 2 // a rune outside the BMP: a surrogate pair
	}
	return 1
}

// isJSSpace reports whether r is WhiteSpace or LineTerminator in
// ECMAScript, the set String.prototype.trim removes. It differs from
// unicode.IsSpace: U+FEFF is in, U+0085 is out.
func isJSSpace(r rune) bool {
	switch r {
	case '\t', '\n', '\v', '\f', '\r', ' ', 0xA0, 0x1680, 0x2028, 0x2029, 0x202F, 0x205F, 0x3000, 0xFEFF:
		return true
	}
	return r >= 0x2000 && r <= 0x200A
}

// jsTrim is String.prototype.trim.
func jsTrim(s []byte) []byte {
	for len(s) > 0 {
		r, size := utf8.DecodeRune(s)
		if !isJSSpace(r) {
			break
		}
		s = s[size:]
	}
	for len(s) > 0 {
		r, size := utf8.DecodeLastRune(s)
		if !isJSSpace(r) {
			break
		}
		s = s[:len(s)-size]
	}
	return s
}

// appendJSONString appends s as a JSON string the way JSON.stringify
// writes it: only '"', '\\' and control characters are escaped (\b \f \n
// \r \t by name, the rest as \u00xx); '<', '>', '&', U+2028 and U+2029 go
// out as they are, unlike encoding/json. That is jsonstr.AppendRaw, which
// matches JSON.stringify for the valid UTF-8 the parser guarantees.
func appendJSONString(dst, s []byte) []byte {
	return jsonstr.AppendRaw(dst, s)
}

// arrayIndex reports whether key is a canonical array index ("0" or a
// decimal without leading zero, at most 2^32-2) and its value. JavaScript
// enumerates such keys of an object first, in numeric order, before the
// other keys in insertion order; the data entries follow that order.
func arrayIndex(key []byte) (uint32, bool) {
	if len(key) == 0 || len(key) > 10 || (key[0] == '0' && len(key) > 1) {
		return 0, false
	}
	var v uint64
	for _, c := range key {
		if c < '0' || c > '9' {
			return 0, false
		}
		v = v*10 + uint64(c-'0')
	}
	if v > 1<<32-2 {
		return 0, false
	}
	return uint32(v), true
}
