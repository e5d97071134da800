package pushgw

import (
	"bytes"
	"encoding/json"
	"strings"
	"testing"
	"unicode/utf8"
)

func TestUTF16Helpers(t *testing.T) {
	emoji := "\U0001F600"
	for _, tc := range []struct {
		s    string
		n    int
		clip int
		want string
	}{
		{"", 0, 5, ""},
		{"abc", 3, 2, "ab"},
		{"é€", 2, 1, "é"},
		{"a" + emoji, 3, 2, "a"}, // the pair does not fit: dropped whole
		{"a" + emoji, 3, 3, "a" + emoji},
		{emoji + emoji, 4, 3, emoji},
		{"\uFFFD", 1, 1, "\uFFFD"},
	} {
		if got := utf16Len([]byte(tc.s)); got != tc.n {
			t.Errorf("utf16Len(%q) = %d, want %d", tc.s, got, tc.n)
		}
		if got := string(clip16([]byte(tc.s), tc.clip)); got != tc.want {
			t.Errorf("clip16(%q, %d) = %q, want %q", tc.s, tc.clip, got, tc.want)
		}
	}
	for in, want := range map[string]string{
		" \t\n\r\v\f a b \u00a0":    "a b",
		"\ufeff\u2028x\u2029\u3000": "x",
		"\u0085x\u0085":             "\u0085x\u0085", // NEL is not JavaScript whitespace
		"\u200bx":                   "\u200bx",       // nor is a zero-width space
	} {
		if got := string(jsTrim([]byte(in))); got != want {
			t.Errorf("jsTrim(%q) = %q, want %q", in, got, want)
		}
	}
	for key, want := range map[string]bool{"0": true, "7": true, "4294967294": true, "4294967295": false, "01": false, "-1": false, "1a": false, "": false} {
		if _, got := arrayIndex([]byte(key)); got != want {
			t.Errorf("arrayIndex(%q) = %v", key, got)
		}
	}
}

// Invalid UTF-8 inside strings becomes U+FFFD per maximal invalid
// subsequence, as the WHATWG decoder the reference runs does.
func TestInvalidUTF8Replacement(t *testing.T) {
	var p parser
	for in, want := range map[string]string{
		"a\xffb":         "a\uFFFDb",
		"\xe2\x82x":      "\uFFFDx",            // a truncated 3-byte rune: one replacement
		"\xed\xa0\x80":   "\uFFFD\uFFFD\uFFFD", // an encoded surrogate: three
		"\xf0\x9f\x98":   "\uFFFD",             // a truncated 4-byte rune
		"\xc0\xaf":       "\uFFFD\uFFFD",       // an overlong encoding
		"ok\xf4\x90\x80": "ok\uFFFD\uFFFD\uFFFD",
	} {
		var msg sendMessage
		_, emsg := p.parseSend([]byte(`{"token":"t","title":"`+in+`"}`), nil, &msg)
		if emsg != "" || string(msg.title) != want {
			t.Errorf("%q: %q %q, want %q", in, emsg, msg.title, want)
		}
	}
}

// FuzzParseSend checks the parser against encoding/json: the same inputs
// are valid JSON objects, and for valid UTF-8 the same fields come out.
func FuzzParseSend(f *testing.F) {
	for _, s := range []string{
		`{"token":"abc","title":"t","body":"b","data":{"a":"1","2":"x"}}`,
		`{"token":"  x ","data":null,"platform":"android"}`,
		`{"token":"\ud83d\ude00\u00e9","title":"\"\\\/\b\f\n\r\t"}`,
		`{"token":1}`, `{"data":[1,{"a":[true,false,null,-0.5e+3]}]}`, `[]`, ``, `{`, `{"a":"\ud800"}`,
		"\xef\xbb\xbf{\"token\":\"bom\"}",
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, body []byte) {
		var p parser
		var msg sendMessage
		_, emsg := p.parseSend(body, nil, &msg)
		doc := bytes.TrimPrefix(body, []byte("\xef\xbb\xbf"))
		trimmed := bytes.TrimLeft(doc, " \t\r\n")
		valid := json.Valid(doc) && len(trimmed) > 0 && trimmed[0] == '{'
		if !valid {
			if emsg != errInvalidJSON {
				t.Fatalf("invalid %q accepted: %q", body, emsg)
			}
			return
		}
		if emsg == errInvalidJSON {
			t.Fatalf("valid %q refused as invalid JSON", body)
		}
		if emsg != "" || !utf8.Valid(body) {
			return
		}
		var ref struct {
			Token string            `json:"token"`
			Title string            `json:"title"`
			Body  string            `json:"body"`
			Data  map[string]string `json:"data"`
		}
		// Field names in encoding/json match case-insensitively; compare
		// only documents whose keys are all lower case.
		if bytes.ContainsAny(body, "ABCDEFGHIJKLMNOPQRSTUVWXYZ\\") {
			return
		}
		if err := json.Unmarshal(doc, &ref); err != nil {
			return
		}
		if got, want := string(msg.token), string(jsTrim([]byte(ref.Token))); got != want {
			t.Fatalf("token %q, want %q", got, want)
		}
		if got, want := string(msg.title), string(clip16([]byte(ref.Title), maxTitle)); got != want {
			t.Fatalf("title %q, want %q", got, want)
		}
		if got, want := string(msg.body), string(clip16([]byte(ref.Body), maxBody)); got != want {
			t.Fatalf("body %q, want %q", got, want)
		}
		if len(msg.data) != len(ref.Data) {
			t.Fatalf("%d data entries, want %d", len(msg.data), len(ref.Data))
		}
		for _, e := range msg.data {
			if want := string(clip16([]byte(ref.Data[string(e.key)]), maxDataValue)); string(e.val) != want {
				t.Fatalf("data %q = %q, want %q", e.key, e.val, want)
			}
		}
	})
}

func TestParseDeepNesting(t *testing.T) {
	var p parser
	var msg sendMessage
	deep := `{"token":"t","x":` + strings.Repeat("[", 8000) + strings.Repeat("]", 8000) + `}`
	if _, emsg := p.parseSend([]byte(deep), nil, &msg); emsg != "" {
		t.Fatalf("deep nesting: %q", emsg)
	}
	if _, emsg := p.parseSend([]byte(deep[:len(deep)-2]), nil, &msg); emsg != errInvalidJSON {
		t.Fatalf("truncated deep nesting: %q", emsg)
	}
}
