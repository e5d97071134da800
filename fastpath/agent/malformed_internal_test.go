package agent

import (
	"strings"
	"testing"

	"edgerelay/fastpath/ndjson"
)

func TestRequestID(t *testing.T) {
	for _, tc := range []struct{ msg, id string }{
		{`{"type":"a","id":"x"}`, "x"},
		{`  {"id" : "x" }  `, "x"},
		{"{\"type\":\"a\",\r\n\"id\":\"x\"}", "x"},
		{`{"Id":"a","iD":"b"}`, "b"},                  // any case, the last wins
		{`{"\u0069d":"esc"}`, "esc"},                  // an escaped name
		{`{"id":"a\"b\\c\u00e9"}`, "a\"b\\cé"},        // decoded as the scanner decodes
		{`{"payload":"]]}}[[{{","id":"x"}`, "x"},      // brackets in strings are not counted
		{`{"payload":{"s":"\"}"},"id":"x"}`, "x"},     // nor escaped quotes
		{`{"payload":{"id":"inner"},"type":"a"}`, ""}, // only the top level counts
		{`{"id":5}`, ""},                              // not a string
		{`{"id":"x","id":5}`, "x"},                    // a number leaves it, as in encoding/json
		{`{"id":null}`, ""},                           //
		{`{"id":""}`, ""},                             //
		{`{"n":-1.5e3,"b":true,"id":"x"}`, "x"},       // literals and numbers skipped
		{`{"id":"x"}{"id":"y"}`, "x"},                 // the first object only
		{`{"id":"x","payload":}`, "x"},                // broken after the id
		{`{"payload":,"id":"x"}`, "x"},                // a missing value is passed over
		{`{"id":"x`, ""},                              // an id never closed
		{`{"id":"a` + "\n" + `b"}`, ""},               // a raw line break inside: no valid string
		{`[{"id":"x"}]`, ""},                          // not an object
		{`"id"`, ""},                                  //
		{``, ""},                                      //
		{`{"x":` + strings.Repeat(`[`, 50_000) + `,"id":"unclosed"}`, ""}, // never closed: the rest is inside it
		{`{"x":` + strings.Repeat(`[`, 50_000) + strings.Repeat(`]`, 50_000) + `,"id":"deep"}`, "deep"},
	} {
		if got := string(requestID([]byte(tc.msg))); got != tc.id {
			t.Errorf("requestID(%.60q) = %q, want %q", tc.msg, got, tc.id)
		}
	}
}

// FuzzRequestID: never a panic, and on every message the scanner takes,
// the id the scanner reads.
func FuzzRequestID(f *testing.F) {
	for _, s := range []string{`{"type":"a","id":"x"}`, `{"ID":"\u0078","payload":[{"id":"y"}]}`, `{"id":"x","id":"y"}`, `{"a":"\\\"","id":"z"}`} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, msg []byte) {
		got := requestID(msg)
		fr, err := ndjson.ScanMessage(msg)
		if err != nil {
			return
		}
		if want := fr.ID.AppendValue(nil, msg); string(got) != string(want) {
			t.Fatalf("requestID(%q) = %q, the scanner reads %q", msg, got, want)
		}
	})
}
