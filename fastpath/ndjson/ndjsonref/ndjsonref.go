// Package ndjsonref holds slow, obviously correct reference versions of
// package ndjson's operations, built on encoding/json, for the unit tests
// and the fuzz targets to compare the fast ones against. Nothing on a
// serving path imports it.
package ndjsonref

import (
	"bytes"
	"encoding/json"
	"strings"

	"edgerelay/fastpath/jsonstr/jsonstrref"
)

// Splice is ndjson.Splice done another way: encoding/json's Decoder finds
// the top-level members of line (a JSON object the caller knows to be
// valid), strings.EqualFold (the equivalence encoding/json's key folding
// makes) picks instance and session, each is removed with the separator
// before it (the first member alone), and the new members go in after the
// brace.
func Splice(line []byte, instance, session string) string {
	dec := json.NewDecoder(bytes.NewReader(line))
	if _, err := dec.Token(); err != nil {
		panic(err)
	}
	open := int(dec.InputOffset()) - 1
	type member struct {
		key        string
		start, end int
	}
	var ms []member
	for dec.More() {
		prev := int(dec.InputOffset())
		k, err := dec.Token()
		if err != nil {
			panic(err)
		}
		var raw json.RawMessage
		if err := dec.Decode(&raw); err != nil {
			panic(err)
		}
		ms = append(ms, member{k.(string), prev + bytes.IndexByte(line[prev:], '"'), int(dec.InputOffset())})
	}
	cut := func(k string) bool { return strings.EqualFold(k, "instance") || strings.EqualFold(k, "session") }
	out := string(line[:open+1]) + `"instance":` + jsonstrref.Quote(instance) + `,"session":` + jsonstrref.Quote(session)
	if len(ms) > 0 && !cut(ms[0].key) {
		out += ","
	}
	pos := open + 1
	for i, m := range ms {
		if cut(m.key) {
			start := m.start
			if i > 0 {
				start = ms[i-1].end
			}
			out += string(line[pos:start])
			pos = m.end
		}
	}
	return out + string(line[pos:])
}
