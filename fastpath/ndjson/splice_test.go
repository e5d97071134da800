package ndjson

import (
	"bytes"
	"encoding/json"
	"strings"
	"testing"
	"unicode/utf8"

	"edgerelay/fastpath/jsonstr/jsonstrref"
	"edgerelay/fastpath/ndjson/ndjsonref"
)

// checkSplice splices line and checks the result against ndjsonref.Splice, and
// that it scans to the new instance and session with every other field as
// it was.
func checkSplice(t *testing.T, line, instance, session string) string {
	t.Helper()
	f, err := Scan([]byte(line))
	if err != nil {
		t.Fatalf("Scan(%q): %v", line, err)
	}
	got := string(Splice(nil, []byte(line), f, []byte(instance), []byte(session)))
	if want := ndjsonref.Splice([]byte(line), instance, session); got != want {
		t.Errorf("Splice(%q):\n  got  %s\n  want %s", line, got, want)
	}
	g, err := crossCheck(t, []byte(got))
	if err != nil {
		t.Fatalf("Scan(Splice(%q)) = %q: %v", line, got, err)
	}
	before, after := decoded([]byte(line), f), decoded([]byte(got), g)
	before.Instance, before.Session = instance, session
	if !before.equal(after) {
		t.Errorf("Splice(%q) = %q reads\n  %v\nwant\n  %v", line, got, after, before)
	}
	return got
}

func TestSplice(t *testing.T) {
	for _, tc := range []struct{ line, want string }{
		{`{"type":"a"}`, `{"instance":"I","session":"S","type":"a"}`},
		{` { "type" : "a" } `, ` {"instance":"I","session":"S", "type" : "a" } `},
		{`{"instance":"x","type":"a"}`, `{"instance":"I","session":"S","type":"a"}`},
		{`{"type":"a","instance":"x"}`, `{"instance":"I","session":"S","type":"a"}`},
		{`{"type":"a","instance":"x","session":"y"}`, `{"instance":"I","session":"S","type":"a"}`},
		{`{"instance":"x","session":"y","type":"a"}`, `{"instance":"I","session":"S","type":"a"}`},
		{`{ "instance" : "x" , "session":"y" ,"type":"a"}`, `{"instance":"I","session":"S"  ,"type":"a"}`},
		{`{"type":"a","INSTANCE":"x","x":1,"Session":"y","ſession":"z","instance":null}`, `{"instance":"I","session":"S","type":"a","x":1}`},
		{`{"\u0069nstance":"x","type":"a","sessio\u006e":null}`, `{"instance":"I","session":"S","type":"a"}`},
		// Everything else stays byte for byte: unknown members, whitespace
		// inside members, escapes, the payload.
		{`{"type":"acp.message","zz":{"instance":"inner","k":[1, 2 ,3]},"id":"q\u0031","payload": {"session":"inner"} ,"seq":9}`,
			`{"instance":"I","session":"S","type":"acp.message","zz":{"instance":"inner","k":[1, 2 ,3]},"id":"q\u0031","payload": {"session":"inner"} ,"seq":9}`},
		// More duplicates than Frame keeps cuts for: the slow path.
		{`{"session":"1","type":"a","instance":"2","session":"3","x":0,"Instance":"4","SESSION":"5","instance":"6"}`,
			`{"instance":"I","session":"S","type":"a","x":0}`},
		{`{"session":"1","instance":"2","session":"3","Instance":"4","SESSION":"5","type":"a"}`,
			`{"instance":"I","session":"S","type":"a"}`},
	} {
		if got := checkSplice(t, tc.line, "I", "S"); got != tc.want {
			t.Errorf("Splice(%q)\n  = %s\n  want %s", tc.line, got, tc.want)
		}
	}
}

// TestSpliceValues: the values are escaped, and re-scan to what was given.
func TestSpliceValues(t *testing.T) {
	for _, v := range []string{"inst-a", `a"b\c`, "é😀", "a/b", "\u2028x\u2029", strings.Repeat("z", 256)} {
		checkSplice(t, `{"type":"a","instance":"old","session":"old"}`, v, v)
	}
	// What the spec does not allow still makes valid JSON on one line.
	line := []byte(`{"type":"a"}`)
	f, _ := Scan(line)
	out := Splice(nil, line, f, []byte("a\nb\x00\xff"), nil)
	if bytes.ContainsAny(out, "\n\r") || !utf8.Valid(out) || !json.Valid(out) {
		t.Errorf("Splice with control characters: %q", out)
	}
	if _, err := Scan(out); err != ErrFieldChars {
		t.Errorf("Scan(%q) = %v", out, err)
	}
}

// TestSpliceEveryPosition puts instance and session members, in several
// spellings, at every position among other members, including more than
// Frame keeps cuts for.
func TestSpliceEveryPosition(t *testing.T) {
	others := []string{`"type":"t"`, ` "x" : [1,{"instance":2}] `, `"payload":{"a":"b"}`, `"id":"i"`}
	cuts := []string{`"instance":"a"`, ` "Session" : "b" `, `"ſession":null`, `"INSTANCE":"c"`, `"session":"d"`, `"instance":"e"`}
	for n := 0; n <= len(cuts); n++ {
		for mask := 0; mask < 1<<(len(others)+n); mask++ {
			// mask picks, position by position, an instance/session member
			// (bit set) or the next other member, while both last.
			var ms []string
			o, c := 0, 0
			for pos := 0; o < len(others) || c < n; pos++ {
				if c < n && (mask>>pos&1 == 1 || o == len(others)) {
					ms = append(ms, cuts[c])
					c++
				} else {
					ms = append(ms, others[o])
					o++
				}
			}
			checkSplice(t, "{"+strings.Join(ms, ",")+"}", "inst", "sess")
		}
	}
}

func TestAppendString(t *testing.T) {
	cases := []string{"", "a", `"`, `\`, "/", "<>&", "\x7f", "é", "😀", "\u2028", "\u2029", "\u2027\u202a",
		"\xff", "a\xc3", "\xed\xa0\x80", "\xf4\x90\x80\x80", "0123456789abcdef\n0123456789abcdef\"",
		strings.Repeat("plain ascii ", 20) + "\t"}
	for c := range 256 {
		cases = append(cases, string(rune(c)), string([]byte{byte(c)}), "abcdefg"+string([]byte{byte(c)})+"xyz")
	}
	for _, s := range cases {
		got := string(AppendString([]byte("pre"), []byte(s)))
		if want := "pre" + jsonstrref.Quote(s); got != want {
			t.Errorf("AppendString(%q) = %s, encoding/json: %s", s, got, want)
		}
	}
}
