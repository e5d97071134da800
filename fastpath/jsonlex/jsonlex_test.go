package jsonlex

import (
	"encoding/binary"
	"encoding/json"
	"math/bits"
	"math/rand/v2"
	"strconv"
	"strings"
	"testing"
	"unicode/utf8"
)

var lex = Lexer{MaxDepth: 8}

// skipAll validates b as one value with only whitespace around it, the way
// the callers use the lexer.
func skipAll(l Lexer, b []byte) Error {
	i := l.SkipWS(b, 0)
	end, err := l.SkipValue(b, i, 1)
	if err.Failed() {
		return err
	}
	if end = l.SkipWS(b, end); end < len(b) {
		return Error{end, InvalidChar} // trailing data; any code will do here
	}
	return Error{}
}

func TestSkipValue(t *testing.T) {
	for _, tc := range []struct {
		in   string
		end  int // for a valid value: the offset just past it
		code Code
		off  int // for an error
	}{
		// literals
		{in: `true`, end: 4},
		{in: `false`, end: 5},
		{in: `null`, end: 4},
		{in: `nullx`, end: 4}, // what follows is the caller's business
		{in: `tru`, code: BadTrue},
		{in: `fals`, code: BadFalse},
		{in: `nul`, code: BadNull},
		{in: `nUll`, code: BadNull},
		{in: `x`, code: InvalidChar},
		{in: `}`, code: InvalidChar},
		{in: ``, code: End},
		// numbers
		{in: `0`, end: 1},
		{in: `-0`, end: 2},
		{in: `-0.0`, end: 4},
		{in: `1e5`, end: 3},
		{in: `1E+5`, end: 4},
		{in: `1e-05`, end: 5},
		{in: `-12.5E+3`, end: 8},
		{in: `123456789012345678901234567890`, end: 30},
		{in: `01`, end: 1}, // "01" fails in the caller, at '1'
		{in: `-01`, end: 2},
		{in: `-`, code: BadNumber, off: 1},
		{in: `-x`, code: BadNumber, off: 1},
		{in: `+1`, code: InvalidChar},
		{in: `.5`, code: InvalidChar},
		{in: `1.`, code: NoFractionDigit, off: 2},
		{in: `1.e5`, code: NoFractionDigit, off: 2},
		{in: `1e`, code: NoExponentDigit, off: 2},
		{in: `1e+`, code: NoExponentDigit, off: 3},
		{in: `1E-x`, code: NoExponentDigit, off: 3},
		// strings
		{in: `""`, end: 2},
		{in: `"\"\\\/\b\f\n\r\t"`, end: 18},
		{in: `"\u0041\u00e9\uD83D\uDE00\ud800\uFFFF"`, end: 38},
		{in: `"é漢😀"`, end: 2 + len("é漢😀")},
		{in: `"abcdefghijklmnopqrstuvwxyz0123456789"`, end: 38},
		{in: "\"a\x7fb\"", end: 5}, // DEL is allowed raw
		{in: `"\x"`, code: BadEscape, off: 1},
		{in: `"\'"`, code: BadEscape, off: 1},
		{in: `"\U0041"`, code: BadEscape, off: 1},
		{in: `"\u12G4"`, code: BadUnicodeEscape, off: 1},
		{in: `"abcdefgh\u123"`, code: BadUnicodeEscape, off: 9},
		{in: `"\u12`, code: End, off: 5},
		{in: `"\`, code: End, off: 2},
		{in: `"abc`, code: End, off: 4},
		{in: `"abcdefghijklmnop`, code: End, off: 17},
		{in: `"`, code: End, off: 1},
		{in: "\"\x00\"", code: ControlChar, off: 1},
		{in: "\"abcdefghij\x1f\"", code: ControlChar, off: 11},
		{in: "\"a\nb\"", code: ControlChar, off: 2},
		{in: "\"\t\"", code: ControlChar, off: 1},
		{in: "\"\xff\"", code: BadUTF8, off: 1},
		{in: "\"abcdefghij\xc3\x28\"", code: BadUTF8, off: 11},
		{in: "\"\xed\xa0\x80\"", code: BadUTF8, off: 1}, // a surrogate in UTF-8
		{in: "\"\xc3", code: BadUTF8, off: 1},
		// objects and arrays
		{in: `{}`, end: 2},
		{in: `[]`, end: 2},
		{in: `{ "a" : [ 1 , { } , [ ] ] , "b" : null }`, end: 40},
		{in: "{\n\"a\"\r:\t1\n}", end: 11},
		{in: `{`, code: End, off: 1},
		{in: `[`, code: End, off: 1},
		{in: `{"a"`, code: ExpectedColon, off: 4},
		{in: `{"a" 1}`, code: ExpectedColon, off: 5},
		{in: `{"a":`, code: End, off: 5},
		{in: `{"a":1`, code: End, off: 6},
		{in: `{"a":1,`, code: End, off: 7},
		{in: `{"a":1,}`, code: ExpectedKey, off: 7},
		{in: `{a:1}`, code: ExpectedKey, off: 1},
		{in: `{"a":1 "b":2}`, code: ExpectedCommaOrBrace, off: 7},
		{in: `{"a":1]`, code: ExpectedCommaOrBrace, off: 6},
		{in: `[1,]`, code: InvalidChar, off: 3},
		{in: `[1 2]`, code: ExpectedCommaOrBracket, off: 3},
		{in: `[1}`, code: ExpectedCommaOrBracket, off: 2},
		{in: `[1,`, code: End, off: 3},
		{in: `["\x"]`, code: BadEscape, off: 2},
		// depth: MaxDepth 8 counts the value itself (depth 1)
		{in: strings.Repeat("[", 8) + strings.Repeat("]", 8), end: 16},
		{in: strings.Repeat("[", 9) + strings.Repeat("]", 9), code: TooDeep, off: 8},
		{in: strings.Repeat(`{"a":`, 8) + "1" + strings.Repeat("}", 8), end: 8*5 + 1 + 8},
		{in: strings.Repeat(`{"a":`, 9) + "1" + strings.Repeat("}", 9), code: TooDeep, off: 40},
		{in: strings.Repeat("[", 9) + "x", code: TooDeep, off: 8},
		{in: strings.Repeat("[", 8) + "x", code: InvalidChar, off: 8},
		{in: "[x" + strings.Repeat("[", 9), code: InvalidChar, off: 1}, // the first error wins
	} {
		end, err := lex.SkipValue([]byte(tc.in), 0, 1)
		if tc.code == OK {
			if err.Failed() || end != tc.end {
				t.Errorf("SkipValue(%q) = %d, %v; want %d", tc.in, end, err, tc.end)
			}
			continue
		}
		want := Error{tc.off, tc.code}
		if tc.code == End {
			want.Offset = len(tc.in)
		}
		if err != want {
			t.Errorf("SkipValue(%q) = %d, %+v (%v); want %+v (%v)", tc.in, end, err, err.Msg(), want, want.Msg())
		}
	}
}

// TestAgainstEncodingJSON checks that the lexer accepts exactly what
// encoding/json does, for valid UTF-8 within the depth limit.
func TestAgainstEncodingJSON(t *testing.T) {
	for _, s := range []string{
		`0`, `-0`, `01`, `1.5e3`, `1e`, `.1`, `-`, `"\u00e9"`, `"\ud800"`, `"\z"`,
		`{"a":[1,2,{"b":null}]}`, `{"a":}`, `[,]`, `[1,]`, `{"a" 1}`, ` [ true , false ] `,
		"\"\t\"", "\"\x7f\"", "[\n1\r,\t2 ]", `"\/"`, `{"":""}`, `[[[[[[[[]]]]]]]]`, `nul`, `truefalse`,
	} {
		got := !skipAll(lex, []byte(s)).Failed()
		if want := json.Valid([]byte(s)) && utf8.ValidString(s); got != want {
			t.Errorf("%q: lexer accepts %v, encoding/json %v", s, got, want)
		}
	}
}

func TestNoLineFeed(t *testing.T) {
	nl := Lexer{MaxDepth: 8, NoLineFeed: true}
	if got := nl.SkipWS([]byte(" \t\r\n x"), 0); got != 3 {
		t.Errorf("SkipWS stopped at %d, want 3 (the line feed)", got)
	}
	if got := lex.SkipWS([]byte(" \t\r\n x"), 0); got != 5 {
		t.Errorf("SkipWS stopped at %d, want 5", got)
	}
	if _, err := nl.SkipValue([]byte("[1,\n2]"), 0, 1); err != (Error{3, InvalidChar}) {
		t.Errorf("a line feed in an array: %+v", err)
	}
	if _, err := nl.SkipValue([]byte("{\"a\"\n:1}"), 0, 1); err != (Error{4, ExpectedColon}) {
		t.Errorf("a line feed before a colon: %+v", err)
	}
	if end, err := nl.SkipValue([]byte("[1,\r2]"), 0, 1); err.Failed() || end != 6 {
		t.Errorf("a carriage return is whitespace: %d, %+v", end, err)
	}
}

func TestScanKey(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want int
		err  Error
	}{
		{`"a" : 1`, 6, Error{}},
		{`"a":`, 4, Error{}},
		{``, 0, Error{0, End}},
		{`a`, 0, Error{0, ExpectedKey}},
		{`"a" 1`, 4, Error{4, ExpectedColon}},
		{`"a`, 2, Error{2, End}},
	} {
		got, err := lex.ScanKey([]byte(tc.in), 0)
		if err != tc.err || !err.Failed() && got != tc.want {
			t.Errorf("ScanKey(%q) = %d, %+v; want %d, %+v", tc.in, got, err, tc.want, tc.err)
		}
	}
}

func TestScanStringEscaped(t *testing.T) {
	for in, want := range map[string]bool{`"abc"`: false, `"a\nb"`: true, `"\u0041"`: true, `"é"`: false} {
		if _, escaped, err := ScanString([]byte(in), 0); err.Failed() || escaped != want {
			t.Errorf("ScanString(%q): escaped %v, %+v; want %v", in, escaped, err, want)
		}
	}
}

func TestDecodeU(t *testing.T) {
	for _, tc := range []struct {
		in string
		r  rune
		n  int
	}{
		{`\u0041`, 'A', 6},
		{`\u00E9x`, 'é', 6},
		{`\ud83d\ude00`, '😀', 12},
		{`\ud800`, 0xd800, 6},
		{`\ud800\u0041`, 0xd800, 6},
		{`\ude00\ud83d`, 0xde00, 6},
		{`\ud800\ud800`, 0xd800, 6},
		{`\ud800x\udc00`, 0xd800, 6},
	} {
		if r, n := DecodeU([]byte(tc.in)); r != tc.r || n != tc.n {
			t.Errorf("DecodeU(%q) = %U, %d; want %U, %d", tc.in, r, n, tc.r, tc.n)
		}
	}
}

func TestHex4(t *testing.T) {
	for in, want := range map[string]rune{"0000": 0, "abcd": 0xabcd, "ABCD": 0xabcd, "09aF": 0x09af} {
		if r, ok := Hex4([]byte(in)); !ok || r != want {
			t.Errorf("Hex4(%q) = %x, %v", in, r, ok)
		}
	}
	for _, in := range []string{"000g", "-001", " 001", "0x01"} {
		if _, ok := Hex4([]byte(in)); ok {
			t.Errorf("Hex4(%q) accepted", in)
		}
	}
}

func TestMessagesAreConstant(t *testing.T) {
	for c := OK; c <= TooDeep; c++ {
		if c.String() == "unknown error" || c > OK && c.String() == Code(0).String() {
			t.Errorf("code %d has no message", c)
		}
	}
	if got := (Error{57, ExpectedColon}).Error(); got != "jsonlex: expected ':' after a key at byte 57" {
		t.Errorf("Error() = %q", got)
	}
}

func TestAllocsNothing(t *testing.T) {
	in := []byte(`{"type":"data","x":[1,-2.5e3,true,false,null,{"y":"\u00e9\n"}],"data":"` +
		strings.Repeat("abcdefgh", 20) + `"}`)
	bad := []byte(`{"a":[1,2,"\q"]}`)
	if n := testing.AllocsPerRun(100, func() {
		lex.SkipValue(in, 0, 1)
		lex.SkipValue(bad, 0, 1)
	}); n != 0 {
		t.Errorf("SkipValue allocates %v times", n)
	}
}

func BenchmarkSkipValue(b *testing.B) {
	in := []byte(`{"type":"data","x":[1,-2.5e3,true,false,null,{"y":"\u00e9\n"}],"data":"` +
		strings.Repeat("abcdefgh", 20) + `"}`)
	b.SetBytes(int64(len(in)))
	b.ReportAllocs()
	for b.Loop() {
		lex.SkipValue(in, 0, 1)
	}
}

func BenchmarkScanString(b *testing.B) {
	for _, n := range []int{16, 256, 16384} {
		s := make([]byte, 0, n+2)
		s = append(s, '"')
		for len(s) < n+1 {
			s = append(s, "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/"[len(s)%64])
		}
		s = append(s, '"')
		b.Run(strconv.Itoa(n), func(b *testing.B) {
			b.SetBytes(int64(len(s)))
			for b.Loop() {
				ScanString(s, 0)
			}
		})
	}
}

// TestSpecial8 checks that the lowest flag special8 sets is the first byte
// that needs a look, for words made of the bytes around every boundary.
func TestSpecial8(t *testing.T) {
	interesting := []byte{0x00, 0x01, 0x1f, 0x20, 0x21, '"' - 1, '"', '"' + 1, '\\' - 1, '\\', '\\' + 1, 'a', 0x7e, 0x7f, 0x80, 0x81, 0xc3, 0xdf, 0xe0, 0xfe, 0xff}
	needs := func(c byte) bool { return c < 0x20 || c == '"' || c == '\\' || c >= 0x80 }
	r := rand.New(rand.NewPCG(1, 2))
	for n := 0; n < 1_000_000; n++ {
		var w [8]byte
		for k := range w {
			if r.IntN(4) == 0 {
				w[k] = byte(r.Uint32())
			} else {
				w[k] = interesting[r.IntN(len(interesting))]
			}
		}
		first := 8
		for k, c := range w {
			if needs(c) {
				first = k
				break
			}
		}
		m := special8(binary.LittleEndian.Uint64(w[:]))
		got := 8
		if m != 0 {
			got = bits.TrailingZeros64(m) >> 3
		}
		if got != first {
			t.Fatalf("special8(% x): first flag at %d, want %d", w, got, first)
		}
	}
}
