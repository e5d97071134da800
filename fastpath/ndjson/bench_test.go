package ndjson

import (
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"strings"
	"testing"
)

// typicalFrame is a client request of about 300 bytes, the common case.
var typicalFrame = []byte(`{"type":"acp.message","id":"req-42","seq":1234,"trace":"4bf92f3577b34da6a3ce929d0e0e4736",` +
	`"payload":{"jsonrpc":"2.0","id":42,"method":"session/prompt","params":{"sessionId":"sess_abc123",` +
	`"prompt":[{"type":"text","text":"List the files in the repository and summarise the README, please."}]}}}`)

// bigFrame returns a frame whose payload carries about 64 KiB of model
// output: prose with the line breaks and quotes that come escaped.
func bigFrame() []byte {
	var text strings.Builder
	for i := 0; text.Len() < 64<<10; i++ {
		fmt.Fprintf(&text, `Paragraph %d of the answer says \"something\" about the code, and then goes on.\n`, i)
	}
	return []byte(`{"type":"acp.message","instance":"inst-7f3a9c","session":"att-01J9Z3","re":"req-42","seq":99,` +
		`"payload":{"jsonrpc":"2.0","method":"session/update","params":{"sessionId":"sess_abc123",` +
		`"update":{"sessionUpdate":"agent_message_chunk","content":{"type":"text","text":"` + text.String() + `"}}}}}`)
}

func benchFrames() []struct {
	name string
	line []byte
} {
	return []struct {
		name string
		line []byte
	}{{"typical", typicalFrame}, {"64KiB", bigFrame()}}
}

var (
	benchInstance = []byte("inst-7f3a9c")
	benchSession  = []byte("att-01J9Z3QX8M")
)

// BenchmarkScan: validate a line and find its envelope.
func BenchmarkScan(b *testing.B) {
	for _, fr := range benchFrames() {
		b.Run(fr.name, func(b *testing.B) {
			b.ReportAllocs()
			b.SetBytes(int64(len(fr.line)))
			for b.Loop() {
				if _, err := Scan(fr.line); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// BenchmarkStdDecode is the baseline for BenchmarkScan: encoding/json into
// the envelope struct, as the reference relay reads a line.
func BenchmarkStdDecode(b *testing.B) {
	for _, fr := range benchFrames() {
		b.Run(fr.name, func(b *testing.B) {
			b.ReportAllocs()
			b.SetBytes(int64(len(fr.line)))
			for b.Loop() {
				var f stdFrame
				if err := json.Unmarshal(fr.line, &f); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// BenchmarkSplice: the whole client path, Scan then Splice into a reused
// buffer.
func BenchmarkSplice(b *testing.B) {
	for _, fr := range benchFrames() {
		b.Run(fr.name, func(b *testing.B) {
			b.ReportAllocs()
			b.SetBytes(int64(len(fr.line)))
			dst := make([]byte, 0, len(fr.line)+128)
			for b.Loop() {
				f, err := Scan(fr.line)
				if err != nil {
					b.Fatal(err)
				}
				dst = Splice(dst[:0], fr.line, f, benchInstance, benchSession)
			}
		})
	}
}

// BenchmarkSpliceOnly: Splice alone, given the Frame.
func BenchmarkSpliceOnly(b *testing.B) {
	for _, fr := range benchFrames() {
		b.Run(fr.name, func(b *testing.B) {
			b.ReportAllocs()
			b.SetBytes(int64(len(fr.line)))
			dst := make([]byte, 0, len(fr.line)+128)
			f, err := Scan(fr.line)
			if err != nil {
				b.Fatal(err)
			}
			for b.Loop() {
				dst = Splice(dst[:0], fr.line, f, benchInstance, benchSession)
			}
		})
	}
}

// BenchmarkStdDecodeEncode is the baseline for BenchmarkSplice: the
// reference relay's client path, decode, set instance and session, encode.
func BenchmarkStdDecodeEncode(b *testing.B) {
	for _, fr := range benchFrames() {
		b.Run(fr.name, func(b *testing.B) {
			b.ReportAllocs()
			b.SetBytes(int64(len(fr.line)))
			for b.Loop() {
				var f stdFrame
				if err := json.Unmarshal(fr.line, &f); err != nil {
					b.Fatal(err)
				}
				f.Instance, f.Session = string(benchInstance), string(benchSession)
				if _, err := json.Marshal(&f); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// repeatReader serves the same bytes forever.
type repeatReader struct {
	data []byte
	off  int
}

func (r *repeatReader) Read(p []byte) (int, error) {
	n := copy(p, r.data[r.off:])
	r.off = (r.off + n) % len(r.data)
	return n, nil
}

// BenchmarkReader: cutting a stream of typical lines, beside bufio.Reader's
// ReadSlice, which does the least a line reader can.
func BenchmarkReader(b *testing.B) {
	stream := bytes.Repeat(append(typicalFrame[:len(typicalFrame):len(typicalFrame)], '\n'), 64)
	b.Run("ndjson", func(b *testing.B) {
		b.ReportAllocs()
		b.SetBytes(int64(len(typicalFrame) + 1))
		r := NewReader(&repeatReader{data: stream}, 0)
		for b.Loop() {
			if _, err := r.Next(); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("bufio", func(b *testing.B) {
		b.ReportAllocs()
		b.SetBytes(int64(len(typicalFrame) + 1))
		r := bufio.NewReaderSize(&repeatReader{data: stream}, DefaultBufSize)
		for b.Loop() {
			if _, err := r.ReadSlice('\n'); err != nil && err != io.EOF {
				b.Fatal(err)
			}
		}
	})
}
