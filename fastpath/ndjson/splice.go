package ndjson

import "edgerelay/fastpath/jsonstr"

// Splice appends to dst a copy of line in which the top-level instance and
// session are the given values, and returns the extended buffer. f must be
// what Scan (or ScanMessage) returned for line without an error.
//
// Every top-level member whose key reads as instance or session (any case,
// any escapes, every duplicate) is removed, with the separator before it,
// and "instance":…,"session":… is inserted right after the opening brace.
// Every other byte is copied as it was: unknown members, the payload, the
// whitespace inside other members. Removing every occurrence rather than
// editing one is what makes the result mean the same to every reader:
// encoding/json takes the last duplicate, other decoders the first.
//
// The values are written with AppendString. An empty value is written as
// "" and so reads as absent. Nothing is allocated when dst has room for
// len(line) + 27 bytes plus the two escaped values (at most 6 bytes
// per byte of value).
func Splice(dst, line []byte, f Frame, instance, session []byte) []byte {
	dst = append(dst, line[:f.open+1]...)
	dst = append(dst, `"instance":`...)
	dst = AppendString(dst, instance)
	dst = append(dst, `,"session":`...)
	dst = AppendString(dst, session)
	if f.firstKept {
		dst = append(dst, ',')
	}
	if f.nCuts > len(f.cuts) {
		return spliceSlow(dst, line, f.open)
	}
	// Each cut is the separator before a removed member plus the member,
	// or the first member alone. If the first member is removed, the
	// separator after it stays and follows the inserted members; if it is
	// kept, the comma appended above separates it from them.
	pos := f.open + 1
	for _, c := range f.cuts[:f.nCuts] {
		dst = append(dst, line[pos:c.Start]...)
		pos = c.End
	}
	return append(dst, line[pos:]...)
}

// spliceSlow is the rest of Splice for a line with more instance and session
// members than Frame keeps cuts for: it walks the validated line again and
// applies the same cuts as it finds them.
func spliceSlow(dst, line []byte, open int) []byte {
	b := line
	pos := open + 1 // b[pos:i] is still to be copied
	i := skipWS(b, open+1)
	if b[i] == '}' {
		return append(dst, b[pos:]...)
	}
	valueEnd := 0
	for member := 0; ; member++ {
		keyStart := i
		end, _, _ := scanString(b, i)
		key := matchKey(b[keyStart+1 : end-1])
		i, _ = scanKey(b, i)
		i, _ = skipValue(b, i, 2)
		if key == keyInstance || key == keySession {
			cutStart := valueEnd
			if member == 0 {
				cutStart = keyStart
			}
			dst = append(dst, b[pos:cutStart]...)
			pos = i
		}
		valueEnd = i
		if i = skipWS(b, i); b[i] == '}' {
			return append(dst, b[pos:]...)
		}
		i = skipWS(b, i+1) // past the comma
	}
}

// AppendString appends s to dst as a JSON string, quotes included.
//
// It escapes what JSON requires ('"', '\\' and bytes below 0x20, the common
// ones as \n, \r, \t, \b, \f) and replaces invalid UTF-8 with \ufffd, as
// encoding/json does, so the result is always valid JSON and valid UTF-8.
//
// U+2028 and U+2029 are escaped too, again as encoding/json does: JSON
// allows them raw, but JavaScript before ES2019 took them for line ends
// inside a string, and the escape costs nothing on the ASCII ids the relay
// writes. '<', '>' and '&' are left alone: the lines are never embedded in
// HTML. DEL (0x7f) is left alone: JSON allows it. The result is what
// encoding/json's Encoder writes with SetEscapeHTML(false).
func AppendString(dst, s []byte) []byte {
	return jsonstr.AppendLikeEncodingJSON(dst, s)
}
