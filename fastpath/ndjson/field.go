package ndjson

import (
	"bytes"
	"unicode/utf16"
	"unicode/utf8"

	"edgerelay/fastpath/jsonlex"
)

// Span is a byte range of a line: line[Start:End].
type Span struct {
	Start, End int
}

// Bytes returns the span's bytes of line, the line the span was found in.
func (s Span) Bytes(line []byte) []byte { return line[s.Start:s.End] }

// Len is the span's length in bytes.
func (s Span) Len() int { return s.End - s.Start }

// Field is where a string member of the envelope is in its line: the bytes
// between the quotes, still escaped if Escaped is set.
//
// Most routing needs only the raw bytes: a string without escapes (the
// usual case) is its own value. When Escaped is set the raw bytes are not
// the value the endpoint decodes, and one value may be written many ways
// ("s1" and "s\u0031"), so a router looking a session up must compare with
// Equal or decode with AppendValue, never use the raw bytes as the key.
//
// The zero Field is an absent one; an empty string and null are absent too,
// as the spec and encoding/json have it.
type Field struct {
	Start, End int  // the raw value is line[Start:End], without the quotes
	Escaped    bool // the raw value holds at least one backslash escape
}

// Present reports whether the field has a non-empty value. Every escape
// decodes to at least one byte, so a field is empty exactly when its raw
// bytes are.
func (f Field) Present() bool { return f.End > f.Start }

// Raw returns the field's raw bytes in line (escapes as written).
func (f Field) Raw(line []byte) []byte { return line[f.Start:f.End] }

// AppendValue appends the field's decoded value to dst. Scan has checked the
// envelope fields, so the value is valid UTF-8 without lone surrogates.
func (f Field) AppendValue(dst, line []byte) []byte {
	raw := line[f.Start:f.End]
	if !f.Escaped {
		return append(dst, raw...)
	}
	for i := 0; i < len(raw); {
		var r rune
		r, i = decodeNext(raw, i)
		if r == loneSurrogate {
			r = utf8.RuneError // what encoding/json makes of it
		}
		dst = utf8.AppendRune(dst, r)
	}
	return dst
}

// Equal reports whether the field's decoded value is s, without allocating.
func (f Field) Equal(line []byte, s string) bool {
	raw := line[f.Start:f.End]
	if !f.Escaped {
		return string(raw) == s
	}
	return decodedHasPrefix(raw, s, true)
}

// HasPrefix reports whether the field's decoded value begins with prefix
// ("relay." marks a control frame), without allocating.
func (f Field) HasPrefix(line []byte, prefix string) bool {
	raw := line[f.Start:f.End]
	if !f.Escaped {
		return len(raw) >= len(prefix) && string(raw[:len(prefix)]) == prefix
	}
	return decodedHasPrefix(raw, prefix, false)
}

// decodedHasPrefix compares the decoded value of raw with s: equal to it if
// whole, or beginning with it.
func decodedHasPrefix(raw []byte, s string, whole bool) bool {
	var enc [utf8.UTFMax]byte
	j := 0 // bytes of s matched
	for i := 0; i < len(raw); {
		if j == len(s) {
			return !whole
		}
		var r rune
		r, i = decodeNext(raw, i)
		if r == loneSurrogate {
			r = utf8.RuneError
		}
		n := utf8.EncodeRune(enc[:], r)
		if len(s)-j < n || string(enc[:n]) != s[j:j+n] {
			return false
		}
		j += n
	}
	return j == len(s)
}

// loneSurrogate is what decodeNext returns for a \u escape of a UTF-16
// surrogate without its partner. encoding/json decodes it as U+FFFD; an
// envelope field holding one is refused.
const loneSurrogate = -1

// decodeNext decodes the character at raw[i], where raw is the body of a
// string scanString accepted, and returns it and the offset after it.
// A surrogate pair written as two \u escapes is one character, as in
// encoding/json.
func decodeNext(raw []byte, i int) (rune, int) {
	c := raw[i]
	if c != '\\' {
		if c < utf8.RuneSelf {
			return rune(c), i + 1
		}
		r, n := utf8.DecodeRune(raw[i:])
		return r, i + n
	}
	switch raw[i+1] {
	case 'u':
		r, n := jsonlex.DecodeU(raw[i:])
		if utf16.IsSurrogate(r) {
			return loneSurrogate, i + n
		}
		return r, i + n
	case 'b':
		return '\b', i + 2
	case 'f':
		return '\f', i + 2
	case 'n':
		return '\n', i + 2
	case 'r':
		return '\r', i + 2
	case 't':
		return '\t', i + 2
	default: // '"', '\\', '/'
		return rune(raw[i+1]), i + 2
	}
}

// checkText applies the spec's rule for type, instance, session, id and re
// to a field's decoded value: at most limit bytes, valid UTF-8, no byte below
// 0x20 and no 0x7f. scanString has already refused raw control bytes and
// invalid UTF-8, so an unescaped value needs only its length and DEL looked
// at.
func checkText(line []byte, f Field, limit int) error {
	raw := line[f.Start:f.End]
	if !f.Escaped {
		if len(raw) > limit {
			return ErrFieldLength
		}
		if bytes.IndexByte(raw, 0x7f) >= 0 {
			return ErrFieldChars
		}
		return nil
	}
	n := 0
	for i := 0; i < len(raw); {
		var r rune
		r, i = decodeNext(raw, i)
		if r < 0x20 || r == 0x7f { // loneSurrogate is < 0x20 too
			return ErrFieldChars
		}
		if n += utf8.RuneLen(r); n > limit {
			return ErrFieldLength
		}
	}
	return nil
}

// checkTrace applies the spec's rule for trace: at most MaxTraceLen bytes of
// A-Z a-z 0-9 - _ once decoded.
func checkTrace(line []byte, f Field) error {
	raw := line[f.Start:f.End]
	if !f.Escaped {
		if len(raw) > MaxTraceLen {
			return ErrFieldLength
		}
		for _, c := range raw {
			if !isTraceChar(rune(c)) {
				return ErrTrace
			}
		}
		return nil
	}
	n := 0
	for i := 0; i < len(raw); {
		var r rune
		r, i = decodeNext(raw, i)
		if !isTraceChar(r) {
			return ErrTrace
		}
		if n++; n > MaxTraceLen {
			return ErrFieldLength
		}
	}
	return nil
}

func isTraceChar(r rune) bool {
	return r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || r == '-' || r == '_'
}

// The envelope keys Scan looks for, and keyOther for every other key.
const (
	keyOther = iota
	keyType
	keyInstance
	keySession
	keyID
	keyRe
	keySeq
	keyTrace
	keyPayload
)

// matchKey says which envelope field a member name (the raw body of the key
// string) names, as encoding/json matches a key to a struct field: the key is
// unescaped, then compared with the field names under encoding/json's case
// folding (fold.go). ASCII letters fold to each other; a non-ASCII rune folds
// to the smallest rune of its unicode.SimpleFold orbit, and only two of them
// land on ASCII letters: U+017F (ſ) on s and U+212A (Kelvin sign) on k. Every
// envelope name is made of letters, so any other character means keyOther.
func matchKey(raw []byte) int {
	if k := exactKey(raw); k != keyOther {
		return k // the usual spelling
	}
	const longest = len("instance")
	var name [longest]byte // the key folded to lower case
	n := 0
	for i := 0; i < len(raw); {
		var r rune
		r, i = decodeNext(raw, i)
		c, ok := foldLetter(r)
		if !ok || n == longest {
			return keyOther
		}
		name[n] = c
		n++
	}
	return exactKey(name[:n])
}

// exactKey says which envelope field the lower-case name is.
func exactKey(name []byte) int {
	switch string(name) { // compared in place, not converted
	case "type":
		return keyType
	case "instance":
		return keyInstance
	case "session":
		return keySession
	case "id":
		return keyID
	case "re":
		return keyRe
	case "seq":
		return keySeq
	case "trace":
		return keyTrace
	case "payload":
		return keyPayload
	}
	return keyOther
}

// foldLetter returns the lower-case ASCII letter r folds to under
// encoding/json's key folding, if it folds to one.
func foldLetter(r rune) (byte, bool) {
	switch {
	case r >= 'a' && r <= 'z':
		return byte(r), true
	case r >= 'A' && r <= 'Z':
		return byte(r + 'a' - 'A'), true
	case r == 0x17f: // LATIN SMALL LETTER LONG S
		return 's', true
	case r == 0x212a: // KELVIN SIGN
		return 'k', true
	}
	return 0, false
}
