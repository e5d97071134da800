// Package jsonstrref holds the slow, obviously correct JSON string
// escapers that the tests of the fast ones (package jsonstr, the channel
// codec, the NDJSON splicer) compare against. Nothing on a serving path
// imports it.
package jsonstrref

import (
	"bytes"
	"encoding/json"
	"fmt"
	"strings"
)

// Quote is encoding/json's Encoder with SetEscapeHTML(false): what
// encoding/json writes for s, invalid UTF-8 replaced and U+2028/U+2029
// escaped.
func Quote(s string) string {
	var b bytes.Buffer
	enc := json.NewEncoder(&b)
	enc.SetEscapeHTML(false)
	if err := enc.Encode(s); err != nil {
		panic(err)
	}
	return strings.TrimSuffix(b.String(), "\n")
}

// Naive escapes byte by byte exactly what RFC 8259 requires (the quote,
// the backslash and the control characters, with the short escapes where
// JSON has them) and passes every other byte through as it is.
func Naive(s []byte) string {
	var b strings.Builder
	b.WriteByte('"')
	for _, c := range s {
		switch c {
		case '"':
			b.WriteString(`\"`)
		case '\\':
			b.WriteString(`\\`)
		case '\n':
			b.WriteString(`\n`)
		case '\r':
			b.WriteString(`\r`)
		case '\t':
			b.WriteString(`\t`)
		case '\b':
			b.WriteString(`\b`)
		case '\f':
			b.WriteString(`\f`)
		default:
			if c < 0x20 {
				fmt.Fprintf(&b, `\u%04x`, c)
			} else {
				b.WriteByte(c)
			}
		}
	}
	b.WriteByte('"')
	return b.String()
}
