// Package ndjsonfuzz fuzzes the agent relay's NDJSON fast path,
// edgerelay/fastpath/ndjson: the scanner against encoding/json (the
// endpoints' decoder), the splicer against the slow splice of ndjsonref, built on
// encoding/json's Decoder, and the line reader against any chunking.
package ndjsonfuzz

import (
	"bytes"
	"encoding/json"
	"io"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"
	"testing/iotest"
	"unicode/utf8"

	"edgerelay/fastpath/ndjson"
	"edgerelay/fastpath/ndjson/ndjsonref"
)

// seeds are lines that reach every branch of the scanner: valid frames,
// every spelling of the keys, duplicates, wrong types, limits, bad JSON.
var seeds = []string{
	`{"type":"acp.message","instance":"i","session":"s","id":"1","seq":12,"trace":"t-1_X","payload":{"a":[1,2.5e-3,true,false,null,"x"]}}`,
	`{"type":"relay.hello","instance":"inst-a","id":"hello","payload":{"protocol_version":1,"instance":"inst-a","agent":"x/1","nonce":"AAECAwQFBgcICQoLDA0ODxAREhMUFRYXGBkaGxwdHh8="}}`,
	`{"type":"relay.heartbeat","id":"h1"}`,
	` { "Type" : "a" , "INSTANCE":"i","ſession":"s", "payload" : null } `,
	`{"typ\u0065":"a","\u0049nstance":"i","\u017fession":"s","ınstance":"x"}`,
	`{"type":"a","TYPE":"b","type":null,"seq":1,"Seq":null,"payload":1,"payload":[2]}`,
	`{"type":"a","id":"x","id":"","re":"r"}`,
	`{"type":5}`,
	`{"type":"a","seq":"1"}`,
	`{"type":"a","seq":18446744073709551615}`,
	`{"type":"a","seq":18446744073709551616}`,
	`{"type":"a","seq":-1}`,
	`{"type":"a","seq":1.0}`,
	`{"type":"a","seq":1e3}`,
	`{"type":"a","id":"1","re":"2"}`,
	`{"type":"a","session":"s"}`,
	`{"type":"a","trace":"a.b"}`,
	`{"type":"a\u001f"}`,
	"{\"type\":\"a\x7f\"}",
	`{"type":"\ud83d\ude00","instance":"\ud800"}`,
	"{\"type\":\"\xff\"}",
	`{"type":"a","x":{"y":[[[{"z":"\"\\\/\b\f\n\r\t\u00e9"}]]]}}`,
	`{"type":"a"} x`,
	`[{"type":"a"}]`,
	`{"type":"a",}`,
	`{"session":"1","instance":"2","session":"3","Instance":"4","SESSION":"5","type":"a","instance":"6"}`,
	`{"type":"` + strings.Repeat("a", 128) + `","instance":"` + strings.Repeat("b", 256) + `"}`,
	`{"type":"a","payload":` + strings.Repeat("[", 127) + strings.Repeat("]", 127) + `}`,
}

// envelope is the frame as the endpoints read it.
type envelope struct {
	Type     string          `json:"type"`
	Instance string          `json:"instance,omitempty"`
	Session  string          `json:"session,omitempty"`
	ID       string          `json:"id,omitempty"`
	Re       string          `json:"re,omitempty"`
	Seq      uint64          `json:"seq,omitempty"`
	Trace    string          `json:"trace,omitempty"`
	Payload  json.RawMessage `json:"payload,omitempty"`
}

// read decodes what Scan found, with the Field methods.
func read(line []byte, f ndjson.Frame) envelope {
	e := envelope{
		Type:     string(f.Type.AppendValue(nil, line)),
		Instance: string(f.Instance.AppendValue(nil, line)),
		Session:  string(f.Session.AppendValue(nil, line)),
		ID:       string(f.ID.AppendValue(nil, line)),
		Re:       string(f.Re.AppendValue(nil, line)),
		Seq:      f.Seq,
		Trace:    string(f.Trace.AppendValue(nil, line)),
	}
	if f.Payload.Len() > 0 {
		e.Payload = f.Payload.Bytes(line)
	}
	return e
}

func (e envelope) equal(o envelope) bool {
	return e.Type == o.Type && e.Instance == o.Instance && e.Session == o.Session && e.ID == o.ID &&
		e.Re == o.Re && e.Seq == o.Seq && e.Trace == o.Trace && bytes.Equal(e.Payload, o.Payload)
}

// checkSpans fails unless every span of f lies inside the line, and every
// field without escapes is its own value.
func checkSpans(t *testing.T, line []byte, f ndjson.Frame) {
	for _, s := range []ndjson.Span{f.Payload,
		{Start: f.Type.Start, End: f.Type.End}, {Start: f.Instance.Start, End: f.Instance.End},
		{Start: f.Session.Start, End: f.Session.End}, {Start: f.ID.Start, End: f.ID.End},
		{Start: f.Re.Start, End: f.Re.End}, {Start: f.Trace.Start, End: f.Trace.End}} {
		if s.Start < 0 || s.End < s.Start || s.End > len(line) {
			t.Fatalf("span %+v outside the line of %d bytes", s, len(line))
		}
	}
}

// FuzzScan: Scan never panics and never reports a span outside the line;
// whenever it accepts a line, the line is valid JSON and UTF-8 and
// encoding/json reads the same envelope from it, and every envelope rule of
// the spec holds.
func FuzzScan(f *testing.F) {
	for _, s := range seeds {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, line []byte) {
		fr, err := ndjson.Scan(line)
		checkSpans(t, line, fr)
		if m, merr := ndjson.ScanMessage(line); bytes.IndexByte(line, '\r') < 0 && (merr != err || m != fr) {
			t.Fatalf("ScanMessage and Scan differ on %q: %v, %v", line, merr, err)
		}
		var ref envelope
		jerr := json.Unmarshal(line, &ref)
		if err != nil {
			// Scan may refuse what encoding/json takes only for the reasons
			// it documents: the envelope breaks the spec, invalid UTF-8, a
			// raw line feed, nesting beyond MaxDepth, a lone surrogate in an
			// envelope field (which encoding/json reads as U+FFFD).
			if jerr == nil && validEnvelope(ref) && utf8.Valid(line) && bytes.IndexByte(line, '\n') < 0 &&
				nesting(line) <= ndjson.MaxDepth &&
				!strings.ContainsRune(ref.Type+ref.Instance+ref.Session+ref.ID+ref.Re, utf8.RuneError) {
				t.Fatalf("Scan refuses %q (%v), which encoding/json reads as a valid frame %+v", line, err, ref)
			}
			return
		}
		if jerr != nil {
			t.Fatalf("Scan accepts %q, encoding/json: %v", line, jerr)
		}
		if !utf8.Valid(line) || bytes.IndexByte(line, '\n') >= 0 {
			t.Fatalf("Scan accepts %q: invalid UTF-8 or a line feed", line)
		}
		got := read(line, fr)
		if !got.equal(ref) {
			t.Fatalf("Scan and encoding/json read %q differently:\n  scan %+v\n  json %+v", line, got, ref)
		}
		if !validEnvelope(ref) {
			t.Fatalf("Scan accepts %q, whose envelope breaks the spec: %+v", line, ref)
		}
		for _, fl := range []ndjson.Field{fr.Type, fr.Instance, fr.Session, fr.ID, fr.Re, fr.Trace} {
			if !fl.Escaped && !bytes.Equal(fl.AppendValue(nil, line), fl.Raw(line)) {
				t.Fatalf("unescaped field %q reads as something else", fl.Raw(line))
			}
		}
		if fr.IsControl(line) != strings.HasPrefix(ref.Type, "relay.") {
			t.Fatalf("IsControl(%q) = %v", line, fr.IsControl(line))
		}
	})
}

// nesting returns how deeply the objects and arrays of a valid JSON text
// nest.
func nesting(b []byte) int {
	depth, deepest, inString := 0, 0, false
	for i := 0; i < len(b); i++ {
		switch c := b[i]; {
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

// validEnvelope applies the spec's rules to a decoded envelope.
func validEnvelope(e envelope) bool {
	text := func(s string, limit int) bool {
		if len(s) > limit || !utf8.ValidString(s) {
			return false
		}
		for i := range len(s) {
			if s[i] < 0x20 || s[i] == 0x7f {
				return false
			}
		}
		return true
	}
	const traceChars = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_"
	return e.Type != "" && text(e.Type, 128) && text(e.Instance, 256) && text(e.Session, 256) &&
		text(e.ID, 256) && text(e.Re, 256) &&
		len(e.Trace) <= 128 && strings.Trim(e.Trace, traceChars) == "" &&
		!(e.ID != "" && e.Re != "") && !(e.Session != "" && e.Instance == "")
}

// FuzzSplice: for any line Scan accepts and any values, the spliced line is
// byte for byte what ndjsonref.Splice makes (so everything outside the
// removed members is unchanged), is one line of valid JSON, and when the
// values are valid for the spec it scans to them with every other field as
// it was.
func FuzzSplice(f *testing.F) {
	for i, s := range seeds {
		f.Add([]byte(s), []byte("inst-a"), []byte("att-"+strings.Repeat("x", i)))
	}
	f.Add([]byte(`{"type":"a"}`), []byte(""), []byte(""))
	f.Add([]byte(`{"type":"a","instance":"x"}`), []byte("\u2028\"\\\x00é"), []byte("\xff"))
	f.Fuzz(func(t *testing.T, line, instance, session []byte) {
		fr, err := ndjson.Scan(line)
		if err != nil {
			return
		}
		dst := make([]byte, 0, len(line)+27+6*(len(instance)+len(session)))
		out := ndjson.Splice(dst, line, fr, instance, session)
		if want := ndjsonref.Splice(line, string(instance), string(session)); string(out) != want {
			t.Fatalf("Splice(%q, %q, %q):\n  got  %q\n  want %q", line, instance, session, out, want)
		}
		if &out[0] != &dst[:1][0] {
			t.Fatalf("Splice reallocated a buffer with room")
		}
		if !json.Valid(out) || !utf8.Valid(out) || bytes.ContainsAny(out, "\n") {
			t.Fatalf("Splice made %q", out)
		}
		after, err := ndjson.Scan(out)
		if !utf8.Valid(instance) || !utf8.Valid(session) {
			return // replaced by U+FFFD, as encoding/json would
		}
		want := read(line, fr)
		want.Instance, want.Session = string(instance), string(session)
		if valid := validEnvelope(want); valid != (err == nil) {
			t.Fatalf("Scan(Splice(%q, %q, %q)) = Scan(%q): %v, but the spec says valid=%v", line, instance, session, out, err, valid)
		}
		if err == nil {
			if got := read(out, after); !got.equal(want) {
				t.Fatalf("Splice(%q) = %q reads\n  %+v\nwant\n  %+v", line, out, got, want)
			}
		}
	})
}

// readAll returns the lines a Reader cuts from src and the error that ends
// them.
func readAll(src io.Reader, bufSize int) ([]string, error) {
	r := ndjson.NewReader(src, bufSize)
	var lines []string
	for {
		line, err := r.Next()
		if err != nil {
			return lines, err
		}
		lines = append(lines, string(line))
	}
}

// chunked delivers data in chunks of random sizes.
type chunked struct {
	data []byte
	rng  *rand.Rand
}

func (c *chunked) Read(p []byte) (int, error) {
	if len(c.data) == 0 {
		return 0, io.EOF
	}
	n := min(len(p), len(c.data), 1+c.rng.IntN(64))
	copy(p, c.data[:n])
	c.data = c.data[n:]
	return n, nil
}

// FuzzReader: however the stream is chunked and whatever the starting
// buffer, the Reader returns the same lines and ends the same way as
// splitting the stream at line feeds does.
func FuzzReader(f *testing.F) {
	f.Add([]byte("a\nb\r\n\n  \n\t\r\n\r\r\nc"), uint64(1), uint8(16))
	f.Add([]byte(strings.Join(seeds, "\n")+"\n"), uint64(2), uint8(1))
	f.Add([]byte("{\"type\":\"a\"}\r\n \r\n"), uint64(3), uint8(255))
	f.Fuzz(func(t *testing.T, data []byte, seed uint64, bufSize uint8) {
		// The reference: split at line feeds, strip one carriage return,
		// skip blank lines; a non-blank remainder is a truncated frame.
		var want []string
		wantErr := io.EOF
		parts := strings.Split(string(data), "\n")
		for i, p := range parts {
			if i == len(parts)-1 {
				if strings.Trim(p, " \t\r") != "" {
					wantErr = ndjson.ErrTruncated
				}
				break
			}
			if p = strings.TrimSuffix(p, "\r"); strings.Trim(p, " \t\r") != "" {
				want = append(want, p)
			}
		}
		for name, src := range map[string]io.Reader{
			"whole":   bytes.NewReader(data),
			"onebyte": iotest.OneByteReader(bytes.NewReader(data)),
			"half":    iotest.HalfReader(bytes.NewReader(data)),
			"dataerr": iotest.DataErrReader(bytes.NewReader(data)),
			"random":  &chunked{data: data, rng: rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15))},
		} {
			lines, err := readAll(src, int(bufSize))
			if err != wantErr || !slices.Equal(lines, want) {
				t.Fatalf("%s/%d: %q, %v; want %q, %v", name, bufSize, lines, err, want, wantErr)
			}
		}
	})
}
