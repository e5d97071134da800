package ndjson

import (
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"testing"
	"unicode"
	"unicode/utf8"
)

// stdFrame is the envelope as the endpoints' reference decoder reads it:
// encoding/json into a struct with the spec's fields.
type stdFrame struct {
	Type     string          `json:"type"`
	Instance string          `json:"instance,omitempty"`
	Session  string          `json:"session,omitempty"`
	ID       string          `json:"id,omitempty"`
	Re       string          `json:"re,omitempty"`
	Seq      uint64          `json:"seq,omitempty"`
	Trace    string          `json:"trace,omitempty"`
	Payload  json.RawMessage `json:"payload,omitempty"`
}

// decoded is what Scan found, decoded, in the shape of stdFrame.
func decoded(line []byte, f Frame) stdFrame {
	s := stdFrame{
		Type:     string(f.Type.AppendValue(nil, line)),
		Instance: string(f.Instance.AppendValue(nil, line)),
		Session:  string(f.Session.AppendValue(nil, line)),
		ID:       string(f.ID.AppendValue(nil, line)),
		Re:       string(f.Re.AppendValue(nil, line)),
		Seq:      f.Seq,
		Trace:    string(f.Trace.AppendValue(nil, line)),
	}
	if f.Payload.Len() > 0 {
		s.Payload = json.RawMessage(f.Payload.Bytes(line))
	}
	return s
}

func (s stdFrame) String() string {
	return fmt.Sprintf("type=%q instance=%q session=%q id=%q re=%q seq=%d trace=%q payload=%q",
		s.Type, s.Instance, s.Session, s.ID, s.Re, s.Seq, s.Trace, s.Payload)
}

func (s stdFrame) equal(o stdFrame) bool {
	return s.Type == o.Type && s.Instance == o.Instance && s.Session == o.Session &&
		s.ID == o.ID && s.Re == o.Re && s.Seq == o.Seq && s.Trace == o.Trace &&
		string(s.Payload) == string(o.Payload)
}

// crossCheck scans line and decodes it with encoding/json: when Scan
// accepts, encoding/json must accept and read the same envelope; when
// encoding/json fails, Scan must have failed. It returns Scan's result.
func crossCheck(t *testing.T, line []byte) (Frame, error) {
	t.Helper()
	f, err := Scan(line)
	var ref stdFrame
	jerr := json.Unmarshal(line, &ref)
	if err != nil {
		return f, err
	}
	if jerr != nil {
		t.Errorf("Scan accepts %q, encoding/json fails: %v", line, jerr)
		return f, err
	}
	if got := decoded(line, f); !got.equal(ref) {
		t.Errorf("Scan and encoding/json read %q differently:\n  scan: %v\n  json: %v", line, got, ref)
	}
	return f, err
}

func TestScanAccepts(t *testing.T) {
	long := func(n int) string { return strings.Repeat("a", n) }
	for _, tc := range []struct {
		line string
		want stdFrame
	}{
		{`{"type":"a"}`, stdFrame{Type: "a"}},
		{` 	{ "type" : "a" } 	`, stdFrame{Type: "a"}},
		{"{\"type\":\"a\"}\r", stdFrame{Type: "a"}},
		{`{"type":"acp.message","instance":"i","session":"s","id":"1","seq":12,"trace":"t-1_X","payload":{"a":[1,2.5e-3,true,false,null,"x"]}}`,
			stdFrame{Type: "acp.message", Instance: "i", Session: "s", ID: "1", Seq: 12, Trace: "t-1_X", Payload: json.RawMessage(`{"a":[1,2.5e-3,true,false,null,"x"]}`)}},
		{`{"type":"a","unknown":{"x":[{}, [], "\u00e9\ud83d\ude00"]},"payload":"p"}`, stdFrame{Type: "a", Payload: json.RawMessage(`"p"`)}},
		// Limits, at the limit.
		{`{"type":"` + long(128) + `"}`, stdFrame{Type: long(128)}},
		{`{"type":"a","instance":"` + long(256) + `","session":"` + long(256) + `"}`, stdFrame{Type: "a", Instance: long(256), Session: long(256)}},
		{`{"type":"a","id":"` + long(256) + `"}`, stdFrame{Type: "a", ID: long(256)}},
		{`{"type":"a","re":"` + long(256) + `"}`, stdFrame{Type: "a", Re: long(256)}},
		{`{"type":"a","trace":"` + long(128) + `"}`, stdFrame{Type: "a", Trace: long(128)}},
		{`{"type":"` + strings.Repeat(`\u0061`, 128) + `"}`, stdFrame{Type: long(128)}},         // decoded length counts
		{`{"type":"` + strings.Repeat("é", 64) + `"}`, stdFrame{Type: strings.Repeat("é", 64)}}, // bytes, not characters
		{`{"type":"a","trace":"azAZ09-_"}`, stdFrame{Type: "a", Trace: "azAZ09-_"}},
		{`{"type":"a","trace":"\u0041\u005f"}`, stdFrame{Type: "a", Trace: "A_"}},
		{`{"type":"a","trace":""}`, stdFrame{Type: "a"}},
		{`{"type":" ~"}`, stdFrame{Type: " ~"}}, // 0x20 and 0x7e are fine
		{`{"type":"\ud83d\ude00"}`, stdFrame{Type: "😀"}},
		{`{"type":"a\"b\\c\/d"}`, stdFrame{Type: `a"b\c/d`}},
		// seq.
		{`{"type":"a","seq":0}`, stdFrame{Type: "a"}},
		{`{"type":"a","seq":18446744073709551615}`, stdFrame{Type: "a", Seq: 18446744073709551615}},
		{`{"type":"a","seq":null}`, stdFrame{Type: "a"}},
		// Empty strings and null are absent.
		{`{"type":"a","id":"","re":"r"}`, stdFrame{Type: "a", Re: "r"}},
		{`{"type":"a","id":"i","re":null}`, stdFrame{Type: "a", ID: "i"}},
		{`{"type":"a","instance":null,"session":""}`, stdFrame{Type: "a"}},
		// Keys in any case, with escapes, and with the two non-ASCII runes
		// encoding/json folds onto ASCII letters.
		{`{"Type":"a","INSTANCE":"i","SeSsIoN":"s","Id":"1","SEQ":3,"tRACE":"t","PayLoad":1}`,
			stdFrame{Type: "a", Instance: "i", Session: "s", ID: "1", Seq: 3, Trace: "t", Payload: json.RawMessage(`1`)}},
		{`{"typ\u0065":"a","\u0049nstance":"i"}`, stdFrame{Type: "a", Instance: "i"}},
		{`{"type":"a","ſession":"s","instance":"i"}`, stdFrame{Type: "a", Instance: "i", Session: "s"}},
		{`{"type":"a","\u017fession":"s","instance":"i"}`, stdFrame{Type: "a", Instance: "i", Session: "s"}},
		{`{"type":"a","ınstance":"x","İnstance":"y"}`, stdFrame{Type: "a"}}, // dotless and dotted I do not fold to i
		{`{"type":"a","type_":"b","ty pe":"c","typ":"d","types":"e"}`, stdFrame{Type: "a"}},
		// The last duplicate wins, null excepted.
		{`{"type":"a","TYPE":"b"}`, stdFrame{Type: "b"}},
		{`{"type":"a","type":null}`, stdFrame{Type: "a"}},
		{`{"type":"a","seq":1,"Seq":null}`, stdFrame{Type: "a", Seq: 1}},
		{`{"type":"a","seq":1,"seq":0}`, stdFrame{Type: "a"}},
		{`{"type":"a","payload":1,"payload":[2]}`, stdFrame{Type: "a", Payload: json.RawMessage(`[2]`)}},
		{`{"type":"a","payload":1,"payload":null}`, stdFrame{Type: "a", Payload: json.RawMessage(`null`)}},
		{`{"type":"a","id":"x","id":"","re":"r"}`, stdFrame{Type: "a", Re: "r"}},
		{`{"type":"a","type":"\u0001","type":"b"}`, stdFrame{Type: "b"}}, // only the value that wins is checked
		{`{"type":"a","payload":` + strings.Repeat("[", 127) + strings.Repeat("]", 127) + `}`,
			stdFrame{Type: "a", Payload: json.RawMessage(strings.Repeat("[", 127) + strings.Repeat("]", 127))}},
	} {
		f, err := crossCheck(t, []byte(tc.line))
		if err != nil {
			t.Errorf("Scan(%q): %v", tc.line, err)
			continue
		}
		if got := decoded([]byte(tc.line), f); !got.equal(tc.want) {
			t.Errorf("Scan(%q):\n  got  %v\n  want %v", tc.line, got, tc.want)
		}
	}
}

func TestScanRefuses(t *testing.T) {
	long := func(n int) string { return strings.Repeat("a", n) }
	for _, tc := range []struct {
		line string
		want error
	}{
		// Not one JSON object.
		{``, ErrNotObject},
		{`   `, ErrNotObject},
		{`[]`, ErrNotObject},
		{`"type"`, ErrNotObject},
		{`null`, ErrNotObject},
		{"\ufeff{\"type\":\"a\"}", ErrNotObject},
		{`{`, ErrSyntax},
		{`{"type":"a"`, ErrSyntax},
		{`{"type":"a",}`, ErrSyntax},
		{`{"type":"a"}}`, ErrSyntax},
		{`{"type":"a"} {"type":"b"}`, ErrSyntax},
		{`{"type":"a"}x`, ErrSyntax},
		{`{"type" "a"}`, ErrSyntax},
		{`{type:"a"}`, ErrSyntax},
		{`{'type':'a'}`, ErrSyntax},
		{"{\"type\":\"a\",\n\"id\":\"1\"}", ErrSyntax}, // a raw line feed would split the line
		{"{\"type\":\"a\"}\n", ErrSyntax},
		{"{\"type\":\"a\",\f\"id\":\"1\"}", ErrSyntax},
		{`{"type":"a","x":01}`, ErrSyntax},
		{`{"type":"a","x":1.}`, ErrSyntax},
		{`{"type":"a","x":.5}`, ErrSyntax},
		{`{"type":"a","x":+1}`, ErrSyntax},
		{`{"type":"a","x":1e}`, ErrSyntax},
		{`{"type":"a","x":tru}`, ErrSyntax},
		{`{"type":"a","x":nul}`, ErrSyntax},
		{`{"type":"a","x":[1,]}`, ErrSyntax},
		{`{"type":"a","x":[1 2]}`, ErrSyntax},
		{`{"type":"a","x":{"k"}}`, ErrSyntax},
		{`{"type":"a","x":{"k":1,}}`, ErrSyntax},
		{`{"type":"a","x":[}`, ErrSyntax},
		{`{"type":"a","x":{]}`, ErrSyntax},
		{`{"type":"a","x":"\x"}`, ErrSyntax},
		{`{"type":"a","x":"\u12"}`, ErrSyntax},
		{`{"type":"a","x":"\u12G4"}`, ErrSyntax},
		{"{\"type\":\"a\",\"x\":\"\x01\"}", ErrSyntax},         // raw control byte in a string
		{"{\"type\":\"a\",\"x\":\"\xff\"}", ErrSyntax},         // invalid UTF-8, even in cargo
		{"{\"type\":\"a\",\"x\":\"\xed\xa0\x80\"}", ErrSyntax}, // a surrogate encoded in UTF-8
		{"{\"type\":\"a\",\"x\xc3\":1}", ErrSyntax},
		{`{"type":"a","payload":` + strings.Repeat("[", 128) + strings.Repeat("]", 128) + `}`, ErrTooDeep},
		{`{"type":"a","payload":` + strings.Repeat(`{"a":`, 128) + "1" + strings.Repeat("}", 128) + `}`, ErrTooDeep},
		// type.
		{`{}`, ErrNoType},
		{`{"instance":"i"}`, ErrNoType},
		{`{"type":""}`, ErrNoType},
		{`{"type":null}`, ErrNoType},
		{`{"type":"a","type":""}`, ErrNoType},
		{`{"type":"` + long(129) + `"}`, ErrFieldLength},
		{`{"type":"` + strings.Repeat(`\u0061`, 129) + `"}`, ErrFieldLength},
		{`{"type":"` + strings.Repeat("é", 64) + `a"}`, ErrFieldLength},
		// instance, session, id, re: one past the limit.
		{`{"type":"a","instance":"` + long(257) + `"}`, ErrFieldLength},
		{`{"type":"a","instance":"i","session":"` + long(257) + `"}`, ErrFieldLength},
		{`{"type":"a","id":"` + long(257) + `"}`, ErrFieldLength},
		{`{"type":"a","re":"` + long(257) + `"}`, ErrFieldLength},
		// Control characters, DEL, lone surrogates in the five fields.
		{`{"type":"a\u001fb"}`, ErrFieldChars},
		{`{"type":"a\u0000"}`, ErrFieldChars},
		{`{"type":"a\nb"}`, ErrFieldChars},
		{`{"type":"a\tb"}`, ErrFieldChars},
		{"{\"type\":\"a\x7f\"}", ErrFieldChars},
		{`{"type":"a\u007f"}`, ErrFieldChars},
		{`{"type":"a\ud800"}`, ErrFieldChars},
		{`{"type":"a\udc00\ud800"}`, ErrFieldChars},
		{`{"type":"a","instance":"\u001f"}`, ErrFieldChars},
		{"{\"type\":\"a\",\"instance\":\"i\",\"session\":\"\x7f\"}", ErrFieldChars},
		{`{"type":"a","id":"\r"}`, ErrFieldChars},
		{`{"type":"a","re":"\ud83d"}`, ErrFieldChars},
		{"{\"type\":\"a\",\"id\":\"\xc3\x28\"}", ErrSyntax}, // invalid UTF-8 is invalid anywhere
		// trace.
		{`{"type":"a","trace":"` + long(129) + `"}`, ErrFieldLength},
		{`{"type":"a","trace":"a.b"}`, ErrTrace},
		{`{"type":"a","trace":"a b"}`, ErrTrace},
		{`{"type":"a","trace":"é"}`, ErrTrace},
		{`{"type":"a","trace":"\u002e"}`, ErrTrace},
		{`{"type":"a","trace":"a\/b"}`, ErrTrace},
		// Pairs.
		{`{"type":"a","id":"1","re":"2"}`, ErrIDAndRe},
		{`{"type":"a","session":"s"}`, ErrNoInstance},
		{`{"type":"a","session":"s","instance":""}`, ErrNoInstance},
		// seq.
		{`{"type":"a","seq":18446744073709551616}`, ErrSeq},
		{`{"type":"a","seq":99999999999999999999}`, ErrSeq},
		{`{"type":"a","seq":-1}`, ErrSeq},
		{`{"type":"a","seq":-0}`, ErrSeq},
		{`{"type":"a","seq":1.0}`, ErrSeq},
		{`{"type":"a","seq":1e3}`, ErrSeq},
		{`{"type":"a","seq":1E3}`, ErrSeq},
		{`{"type":"a","seq":0.5}`, ErrSeq},
		{`{"type":"a","seq":01}`, ErrSyntax},
		{`{"type":"a","seq":-}`, ErrSyntax},
		{`{"type":"a","seq":"1"}`, ErrFieldType},
		{`{"type":"a","seq":true}`, ErrFieldType},
		{`{"type":"a","seq":[1]}`, ErrFieldType},
		// Wrong JSON types, even when a later duplicate is right.
		{`{"type":5}`, ErrFieldType},
		{`{"type":true}`, ErrFieldType},
		{`{"type":{}}`, ErrFieldType},
		{`{"type":["a"]}`, ErrFieldType},
		{`{"type":"a","instance":1}`, ErrFieldType},
		{`{"type":"a","Session":false}`, ErrFieldType},
		{`{"type":"a","id":{}}`, ErrFieldType},
		{`{"type":"a","re":[]}`, ErrFieldType},
		{`{"type":"a","trace":0}`, ErrFieldType},
		{`{"type":5,"type":"a"}`, ErrFieldType},
		{`{"type":"a","seq":"1","seq":1}`, ErrFieldType},
	} {
		_, err := crossCheck(t, []byte(tc.line))
		if !errors.Is(err, tc.want) {
			t.Errorf("Scan(%q) = %v, want %v", tc.line, err, tc.want)
		}
		if fe := (*fieldError)(nil); errors.As(err, &fe) != errors.Is(err, ErrField) {
			t.Errorf("Scan(%q) = %v: a field error must match ErrField, nothing else", tc.line, err)
		}
	}
}

// TestScanFoldsLikeEncodingJSON spells every envelope key in many ways
// (cases, escapes, the folding runes, near misses) and checks that Scan
// reads each line as encoding/json does.
func TestScanFoldsLikeEncodingJSON(t *testing.T) {
	spellings := func(name string) []string {
		out := []string{name, strings.ToUpper(name), strings.ToUpper(name[:1]) + name[1:],
			name + "x", name[1:], "_" + name, name + " "}
		alt := []byte(name)
		for i := range alt {
			if i%2 == 0 {
				alt[i] -= 'a' - 'A'
			}
		}
		out = append(out, string(alt))
		var esc strings.Builder
		for _, c := range name {
			fmt.Fprintf(&esc, `\u%04X`, c)
		}
		out = append(out, esc.String())
		out = append(out, strings.ReplaceAll(name, "s", "ſ"), strings.ReplaceAll(name, "s", `\u017f`),
			strings.ReplaceAll(name, "s", `\u017F`), strings.ReplaceAll(name, "i", "ı"),
			strings.ReplaceAll(name, "i", "İ"), strings.ReplaceAll(name, "e", "é"),
			strings.ReplaceAll(name, "k", "K"), strings.ReplaceAll(name, "a", "\u0430")) // Cyrillic a
		return out
	}
	values := map[string][]string{
		"type":     {`"t1"`, `"t2"`, `null`, `5`},
		"instance": {`"i1"`, `"i2"`, `null`},
		"session":  {`"s1"`, `""`, `null`},
		"id":       {`"d1"`, `null`},
		"re":       {`"r1"`, `null`},
		"seq":      {`7`, `8`, `null`, `"9"`},
		"trace":    {`"tr"`, `null`},
		"payload":  {`{"p":1}`, `null`, `"x"`},
	}
	n := 0
	for name, vals := range values {
		for _, sp := range spellings(name) {
			for _, v := range vals {
				for _, base := range []string{
					`{"type":"base","instance":"inst",%s}`,
					`{%s,"type":"base","instance":"inst"}`,
					`{"type":"base",%s,"instance":"inst","Type":"last"}`,
				} {
					member := fmt.Sprintf(`"%s":%s`, sp, v)
					crossCheck(t, []byte(fmt.Sprintf(base, member)))
					n++
				}
			}
		}
	}
	t.Logf("%d lines cross-checked", n)
}

// TestFoldLetter checks foldLetter against encoding/json's rule (fold.go)
// for every rune: an ASCII letter folds to itself in either case, any other
// rune to the smallest rune of its unicode.SimpleFold orbit.
func TestFoldLetter(t *testing.T) {
	for r := rune(0); r <= unicode.MaxRune; r++ {
		want := r
		if r >= utf8.RuneSelf {
			for { // fold.go's foldRune
				r2 := unicode.SimpleFold(want)
				if r2 <= want {
					want = r2
					break
				}
				want = r2
			}
		}
		var wantOK bool
		if want >= 'A' && want <= 'Z' || want >= 'a' && want <= 'z' {
			want, wantOK = want|0x20, true
		}
		got, ok := foldLetter(r)
		if ok != wantOK || ok && rune(got) != want {
			t.Errorf("foldLetter(%U) = %q, %v; encoding/json folds it to %q", r, got, ok, want)
		}
	}
}

// TestScanSpans checks that the offsets are into the line itself.
func TestScanSpans(t *testing.T) {
	line := []byte(`{"type":"a\"b","instance":"inst","payload": {"x": 1} ,"seq":5}`)
	f, err := Scan(line)
	if err != nil {
		t.Fatal(err)
	}
	if got := string(f.Type.Raw(line)); got != `a\"b` || !f.Type.Escaped {
		t.Errorf("type raw %q escaped %v", got, f.Type.Escaped)
	}
	if got := string(f.Instance.Raw(line)); got != "inst" || f.Instance.Escaped {
		t.Errorf("instance raw %q escaped %v", got, f.Instance.Escaped)
	}
	if got := string(f.Payload.Bytes(line)); got != `{"x": 1}` {
		t.Errorf("payload %q", got)
	}
	if f.Session.Present() || f.ID.Present() || f.Re.Present() || f.Trace.Present() {
		t.Errorf("absent fields present: %+v", f)
	}
	if !f.Type.Equal(line, `a"b`) || f.Type.Equal(line, `a"`) || f.Type.Equal(line, `a"bc`) {
		t.Error("Equal")
	}
	if !f.Instance.Equal(line, "inst") || f.Instance.Equal(line, "ins") {
		t.Error("Equal unescaped")
	}
	if !f.Type.HasPrefix(line, `a"`) || !f.Type.HasPrefix(line, ``) || f.Type.HasPrefix(line, `a"bc`) {
		t.Error("HasPrefix")
	}
}

func TestIsControl(t *testing.T) {
	for line, want := range map[string]bool{
		`{"type":"relay.hello"}`:        true,
		`{"type":"\u0072elay.hello"}`:   true,
		`{"type":"relay."}`:             true,
		`{"type":"relay"}`:              false,
		`{"type":"Relay.hello"}`:        false,
		`{"type":"acp.message"}`:        false,
		`{"type":"relay\u002ehello"}`:   true,
		`{"type":"relax.hello"}`:        false,
		`{"type":"r\u00e9lay.hello"}`:   false,
		`{"TYPE":"relay.heartbeat"}`:    true,
		`{"type":"relay.x","type":"a"}`: false,
	} {
		f, err := Scan([]byte(line))
		if err != nil {
			t.Fatalf("Scan(%q): %v", line, err)
		}
		if got := f.IsControl([]byte(line)); got != want {
			t.Errorf("IsControl(%q) = %v", line, got)
		}
	}
}

func TestScanMessage(t *testing.T) {
	for line, want := range map[string]error{
		`{"type":"a"}`:                   nil,
		"{\"type\":\"a\"}\r":             ErrSyntax,
		"{\"type\":\"a\",\r\"x\":1}":     ErrSyntax,
		"{\"type\":\"a\",\n\"x\":1}":     ErrSyntax,
		"{\"type\":\"a\",\"x\":\"\\r\"}": nil, // an escaped one is fine
	} {
		if _, err := ScanMessage([]byte(line)); err != want {
			t.Errorf("ScanMessage(%q) = %v, want %v", line, err, want)
		}
	}
	if _, err := Scan([]byte("{\"type\":\"a\",\r\"x\":1}\r")); err != nil {
		t.Errorf("Scan refuses a raw carriage return: %v", err)
	}
}

func TestAppendValue(t *testing.T) {
	line := []byte(`{"type":"\u00e9\ud83d\ude00\n\t\"\\\/\b\fx"}`)
	// Scan refuses control characters in type; scan, before the checks,
	// still says where the field is.
	f, err := scan(line)
	if !errors.Is(err, ErrFieldChars) {
		t.Fatalf("Scan: %v", err)
	}
	want := "é😀\n\t\"\\/\b\fx"
	if got := string(f.Type.AppendValue([]byte("pre:"), line)); got != "pre:"+want {
		t.Errorf("AppendValue = %q", got)
	}
	var ref struct{ Type string }
	json.Unmarshal(line, &ref)
	if ref.Type != want {
		t.Errorf("encoding/json reads %q", ref.Type)
	}
	// A lone surrogate decodes to U+FFFD, as in encoding/json.
	lone := []byte(`{"type":"a\ud800b"}`)
	f, _ = scan(lone)
	if got := string(f.Type.AppendValue(nil, lone)); got != "a\ufffdb" {
		t.Errorf("lone surrogate: %q", got)
	}
}
