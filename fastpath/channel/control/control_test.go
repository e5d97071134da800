package control_test

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"strings"
	"testing"
	"unicode/utf8"

	"edgerelay/fastpath/channel/control"
	"edgerelay/fastpath/jsonstr/jsonstrref"
)

const testID = "0123456789abcdef0123456789abcdef"

func mkID(s string) *control.ID {
	var id control.ID
	if copy(id[:], s) != control.IDLen {
		panic("bad test id " + s)
	}
	return &id
}

func TestAppendExact(t *testing.T) {
	id := mkID(testID)
	for _, tc := range []struct {
		name string
		got  []byte
		want string
	}{
		{"open", control.AppendOpen(nil, id), `{"type":"open","id":"0123456789abcdef0123456789abcdef"}`},
		{"close", control.AppendClose(nil, id), `{"type":"close","id":"0123456789abcdef0123456789abcdef"}`},
		{"data empty", control.AppendData(nil, id, nil), `{"type":"data","id":"0123456789abcdef0123456789abcdef","data":""}`},
		{"data plain", control.AppendData(nil, id, []byte("hello, world")),
			`{"type":"data","id":"0123456789abcdef0123456789abcdef","data":"hello, world"}`},
		{"data escapes", control.AppendData(nil, id, []byte("a\"b\\c/d\n\r\t\b\f\x00\x01\x1f\x7f<>&")),
			`{"type":"data","id":"0123456789abcdef0123456789abcdef","data":"a\"b\\c/d\n\r\t\b\f\u0000\u0001\u001f` + "\x7f<>&" + `"}`},
		{"data non-ASCII", control.AppendData(nil, id, []byte("é€😀漢字\u2028\u2029")),
			`{"type":"data","id":"0123456789abcdef0123456789abcdef","data":"é€😀漢字` + "\u2028\u2029" + `"}`},
		{"data invalid UTF-8 passes through", control.AppendData(nil, id, []byte("\xff\xfe\xed\xa0\x80")),
			`{"type":"data","id":"0123456789abcdef0123456789abcdef","data":"` + "\xff\xfe\xed\xa0\x80" + `"}`},
		{"appends after prefix", control.AppendClose([]byte("prefix:"), id),
			`prefix:{"type":"close","id":"0123456789abcdef0123456789abcdef"}`},
		{"string", control.AppendString(nil, []byte(`say "hi"`)), `"say \"hi\""`},
	} {
		if string(tc.got) != tc.want {
			t.Errorf("%s:\n got %q\nwant %q", tc.name, tc.got, tc.want)
		}
	}
}

// TestAppendStringBytes checks every byte value at every offset of an
// eight-byte word (the escaper skips eight bytes at a time), and random byte
// strings, against the naive reference.
func TestAppendStringBytes(t *testing.T) {
	check := func(s []byte) {
		t.Helper()
		if got, want := string(control.AppendString(nil, s)), jsonstrref.Naive(s); got != want {
			t.Fatalf("AppendString(%q) = %q, want %q", s, got, want)
		}
	}
	for c := 0; c < 256; c++ {
		for pre := 0; pre < 10; pre++ {
			for post := 0; post < 10; post++ {
				s := []byte(strings.Repeat("x", pre) + string([]byte{byte(c)}) + strings.Repeat("y", post))
				check(s)
			}
		}
	}
	rng := rand.New(rand.NewPCG(1, 2))
	for range 5000 {
		s := make([]byte, rng.IntN(80))
		for i := range s {
			switch rng.IntN(4) {
			case 0:
				s[i] = byte(rng.IntN(0x20))
			case 1:
				s[i] = `"\`[rng.IntN(2)]
			default:
				s[i] = byte(rng.IntN(256))
			}
		}
		check(s)
	}
}

// dataCases are phone frames that must survive the trip to the computer.
func dataCases() []string {
	cases := []string{
		"", "a", "hello", `"`, `\`, `\\"\"`, `"quoted" and \back\slashed`, "/", "</script>",
		"line\nbreak", "\r\n", "tab\there", "\b\f", "\x00", "\x7f",
		"\u2028\u2029", "é", "€", "😀", "👩‍👩‍👧", "漢字かなカナ", "\ufffd", "\U0010ffff",
		"mixed \"é\" \\ 😀 \n\u2028 漢",
		strings.Repeat("A", 70000),
		strings.Repeat("\x01", 1000),
		strings.Repeat("😀", 100),
	}
	var all strings.Builder
	for c := range 0x20 {
		cases = append(cases, string(rune(c)), "a"+string(rune(c))+"b")
		all.WriteByte(byte(c))
	}
	cases = append(cases, all.String())
	rng := rand.New(rand.NewPCG(3, 4))
	alphabet := []rune("aZ09 \"\\/\n\t\x00\x1f\x7fé€😀漢\u2028\u2029\ufffd")
	for range 500 {
		r := make([]rune, rng.IntN(40))
		for i := range r {
			r[i] = alphabet[rng.IntN(len(alphabet))]
		}
		cases = append(cases, string(r))
	}
	return cases
}

func TestAppendDataUnmarshal(t *testing.T) {
	id := mkID(testID)
	for _, s := range dataCases() {
		frame := control.AppendData(nil, id, []byte(s))
		var v struct {
			Type, ID, Data string
		}
		if err := json.Unmarshal(frame, &v); err != nil {
			t.Fatalf("json.Unmarshal(%q): %v", frame, err)
		}
		if v.Type != "data" || v.ID != testID || v.Data != s {
			t.Fatalf("json.Unmarshal(%q) = %+v, want data %q", frame, v, s)
		}
	}
}

func TestRoundTrip(t *testing.T) {
	id := mkID("ffffffffffffffff0000000000000000")
	var scratch []byte
	for _, s := range dataCases() {
		frame := control.AppendData(nil, id, []byte(s))
		msg, sc, err := control.Parse(frame, scratch)
		scratch = sc
		if err != nil {
			t.Fatalf("Parse(%q): %v", frame, err)
		}
		if msg.Type != control.TypeData || msg.ID != *id || string(msg.Data) != s {
			t.Fatalf("Parse(AppendData(%q)) = %v %s %q", s, msg.Type, msg.ID, msg.Data)
		}
	}
	msg, _, err := control.Parse(control.AppendClose(nil, id), nil)
	if err != nil || msg.Type != control.TypeClose || msg.ID != *id || msg.Data != nil {
		t.Fatalf("Parse(AppendClose) = %+v, %v", msg, err)
	}
	if _, _, err := control.Parse(control.AppendOpen(nil, id), nil); !errors.Is(err, control.ErrUnknownType) {
		t.Fatalf("Parse(AppendOpen) error = %v, want ErrUnknownType", err)
	}
}

func TestParseAccepts(t *testing.T) {
	const id = `"` + testID + `"`
	for _, tc := range []struct {
		name, frame string
		typ         control.Type
		data        string
	}{
		{"canonical data", `{"type":"data","id":` + id + `,"data":"xyz"}`, control.TypeData, "xyz"},
		{"canonical close", `{"type":"close","id":` + id + `}`, control.TypeClose, ""},
		{"keys reordered", `{"data":"xyz","id":` + id + `,"type":"data"}`, control.TypeData, "xyz"},
		{"whitespace everywhere", " \t\r\n{ \"type\" :\n\"data\" ,\t\"id\"\r:" + id + " , \"data\" : \"x y\" } \n", control.TypeData, "x y"},
		{"escaped keys", `{"typ\u0065":"data","\u0069\u0064":` + id + `,"\u0064\u0061\u0074\u0061":"k"}`, control.TypeData, "k"},
		{"escaped type value", `{"type":"\u0063lose","id":` + id + `}`, control.TypeClose, ""},
		{"escaped id", `{"type":"close","id":"\u0030123456789abcdef0123456789abcde\u0066"}`, control.TypeClose, ""},
		{"escaped slash", `{"type":"data","id":` + id + `,"data":"a\/b"}`, control.TypeData, "a/b"},
		{"all simple escapes", `{"type":"data","id":` + id + `,"data":"\"\\\/\b\f\n\r\t"}`, control.TypeData, "\"\\/\b\f\n\r\t"},
		{"u escapes", `{"type":"data","id":` + id + `,"data":"\u0000\u001F\u00e9\u20AC\u2028"}`, control.TypeData, "\x00\x1fé€\u2028"},
		{"surrogate pair", `{"type":"data","id":` + id + `,"data":"\ud83d\ude00!"}`, control.TypeData, "😀!"},
		{"surrogate pair upper hex", `{"type":"data","id":` + id + `,"data":"\uD834\uDD1E"}`, control.TypeData, "𝄞"},
		{"lone high surrogate", `{"type":"data","id":` + id + `,"data":"a\ud800b"}`, control.TypeData, "a\ufffdb"},
		{"lone low surrogate", `{"type":"data","id":` + id + `,"data":"\udc00"}`, control.TypeData, "\ufffd"},
		{"high then non-surrogate escape", `{"type":"data","id":` + id + `,"data":"\ud800\u0041"}`, control.TypeData, "\ufffdA"},
		{"two highs then low", `{"type":"data","id":` + id + `,"data":"\ud800\ud83d\ude00"}`, control.TypeData, "\ufffd😀"},
		{"high at end", `{"type":"data","id":` + id + `,"data":"\ud83d"}`, control.TypeData, "\ufffd"},
		{"raw non-ASCII", `{"type":"data","id":` + id + `,"data":"漢字😀\u2029"}`, control.TypeData, "漢字😀\u2029"},
		{"empty data", `{"type":"data","id":` + id + `,"data":""}`, control.TypeData, ""},
		{"unknown keys", `{"v":2,"type":"data","x":{"a":[1,-2.5e+3,true,false,null,"s\u00e9",{}],"b":[]},"id":` + id + `,"data":"d","z":0}`, control.TypeData, "d"},
		{"duplicate type last wins", `{"type":"open","type":"data","id":` + id + `,"data":"d"}`, control.TypeData, "d"},
		{"duplicate type last wins 2", `{"type":"data","type":"close","id":` + id + `,"data":"d"}`, control.TypeClose, ""},
		{"duplicate id last wins", `{"type":"close","id":"bad","id":` + id + `}`, control.TypeClose, ""},
		{"duplicate data last wins", `{"type":"data","id":` + id + `,"data":1,"data":"second"}`, control.TypeData, "second"},
		{"duplicate data escaped first", `{"type":"data","id":` + id + `,"data":"\n","data":"second"}`, control.TypeData, "second"},
		{"duplicate data escaped last", `{"type":"data","id":` + id + `,"data":"first","data":"\t"}`, control.TypeData, "\t"},
		{"too long data replaced", `{"type":"data","id":` + id + `,"data":"` + strings.Repeat("x", 70001) + `","data":"ok"}`, control.TypeData, "ok"},
		{"close ignores data", `{"type":"close","id":` + id + `,"data":"x"}`, control.TypeClose, ""},
		{"close ignores non-string data", `{"type":"close","id":` + id + `,"data":{"a":1}}`, control.TypeClose, ""},
		{"close ignores long data", `{"type":"close","id":` + id + `,"data":"` + strings.Repeat("x", 70001) + `"}`, control.TypeClose, ""},
		{"key that merely starts like ours", `{"types":1,"ids":2,"datas":3,"typ":4,"type":"close","id":` + id + `}`, control.TypeClose, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			msg, _, err := control.Parse([]byte(tc.frame), nil)
			if err != nil {
				t.Fatalf("Parse(%q): %v", tc.frame, err)
			}
			if msg.Type != tc.typ || msg.ID != *mkID(testID) || string(msg.Data) != tc.data {
				t.Fatalf("Parse(%q) = %v %s %q, want %v %q", tc.frame, msg.Type, msg.ID, msg.Data, tc.typ, tc.data)
			}
			if tc.typ == control.TypeClose && msg.Data != nil {
				t.Fatalf("close message carries data %q", msg.Data)
			}
			if !json.Valid([]byte(tc.frame)) {
				t.Fatalf("test frame is not valid JSON")
			}
		})
	}
}

func TestParseRejects(t *testing.T) {
	const id = `"` + testID + `"`
	deep := func(n int) string {
		return `{"type":"close","id":` + id + `,"x":` + strings.Repeat("[", n) + strings.Repeat("]", n) + `}`
	}
	for _, tc := range []struct {
		name, frame string
		want        error
	}{
		{"empty", ``, control.ErrNotJSON},
		{"whitespace only", " \n", control.ErrNotJSON},
		{"not JSON", `hello`, control.ErrNotJSON},
		{"truncated", `{"type":"data","id":` + id + `,"data":"x`, control.ErrNotJSON},
		{"truncated after value", `{"type":"close","id":` + id, control.ErrNotJSON},
		{"truncated escape", `{"type":"data","id":` + id + `,"data":"\u00`, control.ErrNotJSON},
		{"truncated backslash", `{"type":"data","id":` + id + `,"data":"\`, control.ErrNotJSON},
		{"trailing garbage", `{"type":"close","id":` + id + `}x`, control.ErrNotJSON},
		{"trailing second object", `{"type":"close","id":` + id + `}{}`, control.ErrNotJSON},
		{"trailing comma", `{"type":"close","id":` + id + `,}`, control.ErrNotJSON},
		{"missing colon", `{"type" "close","id":` + id + `}`, control.ErrNotJSON},
		{"missing comma", `{"type":"close" "id":` + id + `}`, control.ErrNotJSON},
		{"single quotes", `{'type':'close','id':` + id + `}`, control.ErrNotJSON},
		{"unquoted key", `{type:"close","id":` + id + `}`, control.ErrNotJSON},
		{"raw newline in string", "{\"type\":\"data\",\"id\":" + id + ",\"data\":\"a\nb\"}", control.ErrNotJSON},
		{"raw tab in string", "{\"type\":\"data\",\"id\":" + id + ",\"data\":\"a\tb\"}", control.ErrNotJSON},
		{"raw NUL in key", "{\"ty\x00pe\":\"close\",\"id\":" + id + "}", control.ErrNotJSON},
		{"bad escape", `{"type":"data","id":` + id + `,"data":"\x41"}`, control.ErrNotJSON},
		{"bad u escape", `{"type":"data","id":` + id + `,"data":"\u12G4"}`, control.ErrNotJSON},
		{"invalid UTF-8", "{\"type\":\"data\",\"id\":" + id + ",\"data\":\"\xff\"}", control.ErrNotJSON},
		{"UTF-8 surrogate", "{\"type\":\"data\",\"id\":" + id + ",\"data\":\"\xed\xa0\x80\"}", control.ErrNotJSON},
		{"overlong UTF-8", "{\"type\":\"data\",\"id\":" + id + ",\"data\":\"\xc0\xaf\"}", control.ErrNotJSON},
		{"truncated UTF-8", "{\"type\":\"data\",\"id\":" + id + ",\"data\":\"\xe2\x82\"}", control.ErrNotJSON},
		{"BOM", "\ufeff{\"type\":\"close\",\"id\":" + id + "}", control.ErrNotJSON},
		{"bad nested number", `{"type":"close","id":` + id + `,"x":01}`, control.ErrNotJSON},
		{"bad nested number 2", `{"type":"close","id":` + id + `,"x":1.}`, control.ErrNotJSON},
		{"bad nested number 3", `{"type":"close","id":` + id + `,"x":-}`, control.ErrNotJSON},
		{"bad nested number 4", `{"type":"close","id":` + id + `,"x":1e}`, control.ErrNotJSON},
		{"bad nested number 5", `{"type":"close","id":` + id + `,"x":+1}`, control.ErrNotJSON},
		{"bad nested literal", `{"type":"close","id":` + id + `,"x":tru}`, control.ErrNotJSON},
		{"bad nested literal 2", `{"type":"close","id":` + id + `,"x":True}`, control.ErrNotJSON},
		{"bad nested array", `{"type":"close","id":` + id + `,"x":[1,]}`, control.ErrNotJSON},
		{"bad nested object", `{"type":"close","id":` + id + `,"x":{"a"}}`, control.ErrNotJSON},
		{"unclosed nested", `{"type":"close","id":` + id + `,"x":[{}}`, control.ErrNotJSON},
		{"bad string in nested", `{"type":"close","id":` + id + `,"x":["\q"]}`, control.ErrNotJSON},
		{"NaN", `{"type":"close","id":` + id + `,"x":NaN}`, control.ErrNotJSON},
		{"syntax error wins over content", `{"type":"foo","id":"x"`, control.ErrNotJSON},
		{"deep nesting", deep(control.MaxDepth), control.ErrTooDeep},
		{"very deep nesting", deep(1_000_000), control.ErrTooDeep},
		{"array", `[{"type":"close","id":` + id + `}]`, control.ErrNotObject},
		{"string", `"close"`, control.ErrNotObject},
		{"number", ` 42 `, control.ErrNotObject},
		{"null", `null`, control.ErrNotObject},
		{"array with trailing garbage", `[] x`, control.ErrNotJSON},
		{"empty object", `{}`, control.ErrMissingType},
		{"missing type", `{"id":` + id + `,"data":"x"}`, control.ErrMissingType},
		{"type open", `{"type":"open","id":` + id + `}`, control.ErrUnknownType},
		{"type foo", `{"type":"foo","id":` + id + `}`, control.ErrUnknownType},
		{"type uppercase", `{"type":"DATA","id":` + id + `,"data":"x"}`, control.ErrUnknownType},
		{"type empty", `{"type":"","id":` + id + `}`, control.ErrUnknownType},
		{"type too long escaped", `{"type":"clos\u0065s","id":` + id + `}`, control.ErrUnknownType},
		{"type not a string", `{"type":1,"id":` + id + `}`, control.ErrUnknownType},
		{"type null", `{"type":null,"id":` + id + `}`, control.ErrUnknownType},
		{"type replaced by a bad one", `{"type":"close","type":"foo","id":` + id + `}`, control.ErrUnknownType},
		{"key case matters", `{"Type":"close","id":` + id + `}`, control.ErrMissingType},
		{"missing id", `{"type":"close"}`, control.ErrMissingID},
		{"missing id data", `{"type":"data","data":"x"}`, control.ErrMissingID},
		{"id 31", `{"type":"close","id":"` + testID[:31] + `"}`, control.ErrBadID},
		{"id 33", `{"type":"close","id":"` + testID + `0"}`, control.ErrBadID},
		{"id 33 escaped", `{"type":"close","id":"` + testID + `\u0030"}`, control.ErrBadID},
		{"id uppercase", `{"type":"close","id":"` + strings.ToUpper(testID) + `"}`, control.ErrBadID},
		{"id one uppercase", `{"type":"close","id":"0123456789abcdef0123456789abcdeF"}`, control.ErrBadID},
		{"id non-hex", `{"type":"close","id":"0123456789abcdef0123456789abcdeg"}`, control.ErrBadID},
		{"id non-ASCII", `{"type":"close","id":"0123456789abcdef0123456789abcdé"}`, control.ErrBadID},
		{"id escaped non-hex", `{"type":"close","id":"0123456789abcdef0123456789abcde\u0047"}`, control.ErrBadID},
		{"id number", `{"type":"close","id":1234}`, control.ErrBadID},
		{"id null", `{"type":"close","id":null}`, control.ErrBadID},
		{"id array", `{"type":"close","id":[` + id + `]}`, control.ErrBadID},
		{"id replaced by a bad one", `{"type":"close","id":` + id + `,"id":"x"}`, control.ErrBadID},
		{"data missing", `{"type":"data","id":` + id + `}`, control.ErrMissingData},
		{"data number", `{"type":"data","id":` + id + `,"data":1}`, control.ErrDataNotString},
		{"data null", `{"type":"data","id":` + id + `,"data":null}`, control.ErrDataNotString},
		{"data object", `{"type":"data","id":` + id + `,"data":{"a":"b"}}`, control.ErrDataNotString},
		{"data array", `{"type":"data","id":` + id + `,"data":["x"]}`, control.ErrDataNotString},
		{"data bool", `{"type":"data","id":` + id + `,"data":true}`, control.ErrDataNotString},
		{"data replaced by a number", `{"type":"data","id":` + id + `,"data":"x","data":2}`, control.ErrDataNotString},
		{"data too long", `{"type":"data","id":` + id + `,"data":"` + strings.Repeat("x", 70001) + `"}`, control.ErrDataTooLong},
		{"data replaced by a long one", `{"type":"data","id":` + id + `,"data":"x","data":"` + strings.Repeat("x", 70001) + `"}`, control.ErrDataTooLong},
	} {
		t.Run(tc.name, func(t *testing.T) {
			msg, _, err := control.Parse([]byte(tc.frame), nil)
			if !errors.Is(err, tc.want) {
				t.Fatalf("Parse(%.200q) = %+v, %v; want %v", tc.frame, msg, err, tc.want)
			}
			if msg.Type != 0 || msg.Data != nil {
				t.Fatalf("failed Parse returned a message: %+v", msg)
			}
		})
	}
}

// TestParseDataLimit checks the 70000-byte limit on the unescaped data, with
// the data written plainly, with escapes (which make the frame up to six
// times larger than the data) and with 4-byte characters from surrogate pairs.
func TestParseDataLimit(t *testing.T) {
	frame := func(body string) []byte {
		return []byte(`{"type":"data","id":"` + testID + `","data":"` + body + `"}`)
	}
	for _, tc := range []struct {
		name    string
		ok, bad []byte // data of exactly MaxData bytes, and one byte more
	}{
		{"plain", frame(strings.Repeat("a", 70000)), frame(strings.Repeat("a", 70001))},
		{"u escapes", frame(strings.Repeat(`\u0041`, 70000)), frame(strings.Repeat(`\u0041`, 70001))},
		{"u escapes after a plain run", frame(strings.Repeat("a", 69999) + `\u0041`), frame(strings.Repeat("a", 70000) + `\u0041`)},
		{"plain run after escapes", frame(`\n` + strings.Repeat("a", 69999)), frame(`\n` + strings.Repeat("a", 70000))},
		{"3-byte u escapes", frame(strings.Repeat(`\u20ac`, 23332) + `\u00e9ab`), frame(strings.Repeat(`\u20ac`, 23332) + `\u00e9abc`)},
		{"surrogate pairs", frame(strings.Repeat(`\ud83d\ude00`, 70000/4)), frame(strings.Repeat(`\ud83d\ude00`, 70000/4) + "a")},
		{"pair crossing the limit", frame(strings.Repeat("a", 69996) + `\ud83d\ude00`), frame(strings.Repeat("a", 69997) + `\ud83d\ude00`)},
		{"lone surrogates", frame(strings.Repeat("a", 69997) + `\ud800`), frame(strings.Repeat("a", 69998) + `\ud800`)},
		{"AppendData of control chars", control.AppendData(nil, mkID(testID), bytes.Repeat([]byte{1}, 70000)),
			control.AppendData(nil, mkID(testID), bytes.Repeat([]byte{1}, 70001))},
	} {
		t.Run(tc.name, func(t *testing.T) {
			for _, scratch := range [][]byte{nil, make([]byte, 0, 10), make([]byte, 0, control.MaxData)} {
				msg, _, err := control.Parse(tc.ok, scratch)
				if err != nil || len(msg.Data) != control.MaxData {
					t.Fatalf("%d-byte frame: got %d bytes of data, err %v; want %d bytes", len(tc.ok), len(msg.Data), err, control.MaxData)
				}
				if _, _, err := control.Parse(tc.bad, scratch); !errors.Is(err, control.ErrDataTooLong) {
					t.Fatalf("%d-byte frame: err %v, want ErrDataTooLong", len(tc.bad), err)
				}
			}
		})
	}
}

func TestParseDepth(t *testing.T) {
	// The message object is level 1, so n brackets inside it reach level n+1.
	nested := func(n int) []byte {
		inner := "0"
		if n%2 == 1 {
			inner = "[]"
		}
		return []byte(`{"type":"close","id":"` + testID + `","x":` +
			strings.Repeat(`[{"a":`, n/2) + inner + strings.Repeat(`}]`, n/2) + `}`)
	}
	for n := control.MaxDepth - 3; n <= control.MaxDepth+3; n++ {
		frame := nested(n)
		if !json.Valid(frame) {
			t.Fatalf("depth %d: test frame is not valid JSON", n+1)
		}
		_, _, err := control.Parse(frame, nil)
		if n+1 <= control.MaxDepth && err != nil {
			t.Errorf("depth %d: %v", n+1, err)
		}
		if n+1 > control.MaxDepth && !errors.Is(err, control.ErrTooDeep) {
			t.Errorf("depth %d: err %v, want ErrTooDeep", n+1, err)
		}
	}
}

func TestSyntaxError(t *testing.T) {
	_, _, err := control.Parse([]byte(`{"type":"close","id":"`+testID+`"} x`), nil)
	var se *control.SyntaxError
	if !errors.As(err, &se) || se.Offset != 57 || !errors.Is(err, control.ErrNotJSON) {
		t.Fatalf("err = %#v, want a *SyntaxError at offset 57", err)
	}
	if !strings.Contains(err.Error(), "57") {
		t.Errorf("error text %q does not name the offset", err)
	}
}

// TestParseScratch checks the scratch contract: escaped data lands in
// scratch, which grows when needed and is handed back; plain data aliases
// the frame.
func TestParseScratch(t *testing.T) {
	id := mkID(testID)
	escaped := control.AppendData(nil, id, []byte(strings.Repeat("a\n", 1000)))
	msg, scratch, err := control.Parse(escaped, nil)
	if err != nil || len(msg.Data) != 2000 {
		t.Fatalf("Parse: %d bytes, %v", len(msg.Data), err)
	}
	if cap(scratch) < 2000 || &scratch[:1][0] != &msg.Data[0] {
		t.Fatalf("Data does not alias the returned scratch (cap %d)", cap(scratch))
	}
	small := make([]byte, 0, 16)
	if _, s, _ := control.Parse(control.AppendData(nil, id, []byte("\n")), small); &s[:1][0] != &small[:1][0] {
		t.Fatalf("scratch with enough room was replaced")
	}
	if _, s, _ := control.Parse([]byte("nope"), small); cap(s) != cap(small) {
		t.Fatalf("failed Parse lost the scratch")
	}
	plain := control.AppendData(nil, id, []byte("plain"))
	msg, _, _ = control.Parse(plain, scratch)
	if string(msg.Data) != "plain" || &msg.Data[0] != &plain[bytes.Index(plain, []byte("plain"))] {
		t.Fatalf("plain data does not alias the frame")
	}
}

// TestAllocs proves the steady state allocates nothing: encoding into a
// buffer with room, and parsing with a scratch of MaxData.
func TestAllocs(t *testing.T) {
	id := mkID(testID)
	payloads := [][]byte{
		bytes.Repeat([]byte("QUJD"), 4096),
		[]byte(strings.Repeat("\"quoted\"\n\\ 漢字😀\x01", 500)),
		nil,
	}
	buf := make([]byte, 0, 8*control.MaxData)
	scratch := make([]byte, 0, control.MaxData)
	for _, p := range payloads {
		if n := testing.AllocsPerRun(100, func() {
			buf = control.AppendData(buf[:0], id, p)
			buf = control.AppendOpen(buf, id)
			buf = control.AppendClose(buf, id)
		}); n != 0 {
			t.Errorf("Append* of %d bytes: %v allocs per run", len(p), n)
		}
		frame := control.AppendData(nil, id, p)
		if n := testing.AllocsPerRun(100, func() {
			msg, s, err := control.Parse(frame, scratch)
			if err != nil || len(msg.Data) != len(p) {
				t.Fatalf("Parse: %v", err)
			}
			scratch = s
		}); n != 0 {
			t.Errorf("Parse of %d bytes of data: %v allocs per run", len(p), n)
		}
	}
	odd := []byte(`{ "\u0064ata" : "\ud83d\ude00\n", "x":[{"y":[1,2.5e-3,null]}], "id":"` + testID + `", "typ\u0065":"dat\u0061" }`)
	if n := testing.AllocsPerRun(100, func() {
		if _, _, err := control.Parse(odd, scratch); err != nil {
			t.Fatalf("Parse: %v", err)
		}
	}); n != 0 {
		t.Errorf("Parse of escaped keys: %v allocs per run", n)
	}
}

// oracle decides a frame the slow way, with encoding/json, by the rules Parse
// documents. Beyond json.Valid it demands valid UTF-8 and nesting within
// MaxDepth, Parse's two deliberate extra limits.
func oracle(frame []byte) (typ control.Type, id, data string, ok bool) {
	if !utf8.Valid(frame) || !json.Valid(frame) || nestingDepth(frame) > control.MaxDepth {
		return 0, "", "", false
	}
	var v any
	d := json.NewDecoder(bytes.NewReader(frame))
	d.UseNumber() // 1e999 is valid JSON but no float64
	if err := d.Decode(&v); err != nil {
		panic(fmt.Sprintf("json.Valid(%q) but Decode: %v", frame, err))
	}
	m, isObject := v.(map[string]any) // duplicate keys: the last one wins
	if !isObject {
		return 0, "", "", false
	}
	switch m["type"] {
	case "data":
		typ = control.TypeData
	case "close":
		typ = control.TypeClose
	default:
		return 0, "", "", false
	}
	id, isString := m["id"].(string)
	if !isString || len(id) != control.IDLen || strings.Trim(id, "0123456789abcdef") != "" {
		return 0, "", "", false
	}
	if typ == control.TypeClose {
		return typ, id, "", true
	}
	data, isString = m["data"].(string)
	if !isString || len(data) > control.MaxData {
		return 0, "", "", false
	}
	return typ, id, data, true
}

// nestingDepth is the deepest nesting of objects and arrays in a valid JSON text.
func nestingDepth(frame []byte) int {
	depth, deepest, inString := 0, 0, false
	for i := 0; i < len(frame); i++ {
		switch c := frame[i]; {
		case inString && c == '\\':
			i++
		case c == '"':
			inString = !inString
		case inString:
		case c == '{' || c == '[':
			depth++
			deepest = max(deepest, depth)
		case c == '}' || c == ']':
			depth--
		}
	}
	return deepest
}

// TestParseCrossCheck mutates well-formed frames in many small ways and checks
// that Parse accepts exactly the frames the encoding/json oracle accepts, with
// the same content.
func TestParseCrossCheck(t *testing.T) {
	const id = `"` + testID + `"`
	bases := []string{
		`{"type":"data","id":` + id + `,"data":"hello"}`,
		`{"type":"close","id":` + id + `}`,
		` { "data" : "a\"b\\c\/\n\u00e9\ud83d\ude00" , "id" : ` + id + ` , "type" : "data" } `,
		`{"typ\u0065":"data","\u0069d":` + id + `,"data":"x","data":"y"}`,
		`{"type":"data","id":` + id + `,"x":{"a":[1,-0.5,2e10,true,false,null,{}],"b":[[]]},"data":"z"}`,
		`{"type":"close","id":` + id + `,"data":[1,{"2":"3"}],"n":-12.5E+3}`,
		`{"type":"data","id":"0123456789ABCDEF0123456789abcdef","data":"q"}`,
		`["type","data"]`,
		`{"type":"data","id":` + id + `,"data":"é漢😀\u2028"}`,
	}
	for _, s := range dataCases()[:60] {
		if len(s) > 100 {
			continue // mutating every byte of a long frame is slow and adds nothing
		}
		bases = append(bases, string(control.AppendData(nil, mkID(testID), []byte(s))))
	}
	alphabet := []byte("{}[]\":,\\ \t\n/0123456789-+.eEubfnrtadlsyp\x00\x1f\x7f\xc3\xa9\xff")

	var scratch []byte
	accepted, rejected := 0, 0
	check := func(frame []byte) {
		t.Helper()
		msg, sc, err := control.Parse(frame, scratch)
		scratch = sc
		typ, wantID, data, ok := oracle(frame)
		if ok != (err == nil) {
			t.Fatalf("Parse(%q): err %v, oracle accepts: %v", frame, err, ok)
		}
		if !ok {
			rejected++
			return
		}
		accepted++
		if msg.Type != typ || string(msg.ID[:]) != wantID || string(msg.Data) != data {
			t.Fatalf("Parse(%q) = %v %s %q, oracle %v %s %q", frame, msg.Type, msg.ID, msg.Data, typ, wantID, data)
		}
	}
	rng := rand.New(rand.NewPCG(5, 6))
	for _, base := range bases {
		b := []byte(base)
		check(b)
		for i := range b {
			check(b[:i])                                  // truncated
			check(append(bytes.Clone(b[:i]), b[i+1:]...)) // one byte deleted
		}
		for range 3000 {
			m := bytes.Clone(b)
			for range 1 + rng.IntN(3) {
				pos := rng.IntN(len(m) + 1)
				c := alphabet[rng.IntN(len(alphabet))]
				switch {
				case pos == len(m) || rng.IntN(2) == 0:
					m = append(m[:pos], append([]byte{c}, m[pos:]...)...)
				default:
					m[pos] = c
				}
			}
			check(m)
		}
	}
	t.Logf("%d frames accepted, %d rejected", accepted, rejected)
	if accepted < 1000 || rejected < 1000 {
		t.Errorf("mutations too lopsided to mean much: %d accepted, %d rejected", accepted, rejected)
	}
}

// TestReadLimit checks that the worst-case escaping of a maximal phone frame
// fits the suggested read limit.
func TestReadLimit(t *testing.T) {
	worst := control.AppendData(nil, mkID(testID), bytes.Repeat([]byte{0x1f}, control.MaxData))
	if len(worst) > control.ReadLimit || len(worst) < 6*control.MaxData {
		t.Fatalf("worst-case frame is %d bytes, ReadLimit %d", len(worst), control.ReadLimit)
	}
}
