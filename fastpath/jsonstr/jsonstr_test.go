package jsonstr_test

import (
	"encoding/json"
	"strings"
	"testing"
	"unicode/utf8"

	"edgerelay/fastpath/jsonstr"
	"edgerelay/fastpath/jsonstr/jsonstrref"
)

// cases is every byte alone and at every offset within and across an
// eight-byte block, plus the interesting strings.
func cases() [][]byte {
	out := [][]byte{
		nil, []byte(""), []byte("a"), []byte(`"`), []byte(`\`), []byte("/"), []byte("<>&"),
		[]byte("\x7f"), []byte("é"), []byte("😀"), []byte("emoji 😀👍🏽 mixed\twith\ttabs"),
		[]byte("\u2028"), []byte("\u2029"), []byte("\u2027\u202a"), []byte("line\u2028sep\u2029para"),
		[]byte("\xff"), []byte("a\xc3"), []byte("\xc3"), []byte("\xed\xa0\x80"), []byte("\xf4\x90\x80\x80"),
		[]byte("\xe2\x80"), []byte("1234567\xe2\x80\xa8"), []byte("\xf0\x9f\x98"), []byte("\xc0\xaf"),
		[]byte("0123456789abcdef\n0123456789abcdef\""), []byte(`say "hi" \ bye`),
		[]byte("\x00\x01\x02\x03\x04\x05\x06\x07\x08\x09\x0a\x0b\x0c\x0d\x0e\x0f\x10\x11\x12\x13\x14\x15\x16\x17\x18\x19\x1a\x1b\x1c\x1d\x1e\x1f"),
		[]byte(strings.Repeat("plain ascii ", 20) + "\t"),
		[]byte(strings.Repeat("{\"k\":\"v\\u00e9\",\n\t\"漢\":[1,\"😀\"]} ", 10)),
	}
	for c := range 256 {
		out = append(out, []byte(string(rune(c))))
		for pre := range 10 {
			for _, post := range []int{0, 1, 7, 9} {
				s := []byte(strings.Repeat("x", pre) + string([]byte{byte(c)}) + strings.Repeat("y", post))
				out = append(out, s)
			}
		}
	}
	for _, r := range []rune{0x2028, 0x2029, 0xfffd, 0x1f600, 0xe9} {
		for pre := range 10 {
			out = append(out, []byte(strings.Repeat("x", pre)+string(r)+"tail"))
		}
	}
	return out
}

func TestAppendLikeEncodingJSON(t *testing.T) {
	for _, s := range cases() {
		got := string(jsonstr.AppendLikeEncodingJSON([]byte("pre"), s))
		if want := "pre" + jsonstrref.Quote(string(s)); got != want {
			t.Errorf("AppendLikeEncodingJSON(%q) = %s, encoding/json: %s", s, got, want)
		}
	}
}

func TestAppendRaw(t *testing.T) {
	for _, s := range cases() {
		got := string(jsonstr.AppendRaw([]byte("pre"), s))
		if want := "pre" + jsonstrref.Naive(s); got != want {
			t.Errorf("AppendRaw(%q) = %s, want %s", s, got, want)
		}
		if !utf8.Valid(s) {
			continue
		}
		// For valid UTF-8, AppendRaw is encoding/json minus the U+2028 and
		// U+2029 escapes, and decodes back to s.
		want := jsonstrref.Quote(string(s))
		want = strings.ReplaceAll(want, `\u2028`, "\u2028")
		want = strings.ReplaceAll(want, `\u2029`, "\u2029")
		if got[3:] != want {
			t.Errorf("AppendRaw(%q) = %s, encoding/json without U+2028/9 escapes: %s", s, got[3:], want)
		}
		var back string
		if err := json.Unmarshal([]byte(got[3:]), &back); err != nil || back != string(s) {
			t.Errorf("AppendRaw(%q) = %s decodes to %q, %v", s, got[3:], back, err)
		}
	}
}

func FuzzAppend(f *testing.F) {
	for _, s := range cases() {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s []byte) {
		if got, want := string(jsonstr.AppendLikeEncodingJSON(nil, s)), jsonstrref.Quote(string(s)); got != want {
			t.Errorf("AppendLikeEncodingJSON(%q) = %s, encoding/json: %s", s, got, want)
		}
		if got, want := string(jsonstr.AppendRaw(nil, s)), jsonstrref.Naive(s); got != want {
			t.Errorf("AppendRaw(%q) = %s, want %s", s, got, want)
		}
	})
}

func TestAppendAllocatesNothing(t *testing.T) {
	inputs := [][]byte{
		[]byte(strings.Repeat("base64+/AZaz09=", 100)),
		[]byte(strings.Repeat("{\"k\":\"v\\u00e9\",\n\t\"漢\":[1,\"😀\"]}\u2028\xff ", 50)),
	}
	buf := make([]byte, 0, 6*2000+2)
	for _, in := range inputs {
		for name, fn := range map[string]func(dst, s []byte) []byte{
			"AppendRaw":              jsonstr.AppendRaw,
			"AppendLikeEncodingJSON": jsonstr.AppendLikeEncodingJSON,
		} {
			if n := testing.AllocsPerRun(100, func() { buf = fn(buf[:0], in) }); n != 0 {
				t.Errorf("%s(%d bytes) allocates %v times per run, want 0", name, len(in), n)
			}
		}
	}
}

func BenchmarkAppend(b *testing.B) {
	payloads := []struct {
		name string
		data []byte
	}{
		{"ascii-256B", []byte(strings.Repeat("QUJDREVGR0hJSktMTU5PUFFSU1RVVldYWVo0123456789+/", 6)[:256])},
		{"text-256B", []byte(strings.Repeat("{\"k\":\"v\\u00e9\",\n\t\"漢\":[1,\"😀\"]} ", 10)[:256])},
		{"ascii-16KiB", []byte(strings.Repeat("QUJDREVGR0hJSktMTU5PUFFSU1RVVldYWVo0123456789+/", 350)[:16<<10])},
		{"text-16KiB", []byte(strings.Repeat("{\"k\":\"v\\u00e9\",\n\t\"漢\":[1,\"😀\"]} ", 600)[:16<<10])},
	}
	for _, p := range payloads {
		buf := make([]byte, 0, 6*len(p.data)+2)
		b.Run(p.name+"/Raw", func(b *testing.B) {
			b.SetBytes(int64(len(p.data)))
			b.ReportAllocs()
			for b.Loop() {
				buf = jsonstr.AppendRaw(buf[:0], p.data)
			}
		})
		b.Run(p.name+"/LikeEncodingJSON", func(b *testing.B) {
			b.SetBytes(int64(len(p.data)))
			b.ReportAllocs()
			for b.Loop() {
				buf = jsonstr.AppendLikeEncodingJSON(buf[:0], p.data)
			}
		})
	}
}
