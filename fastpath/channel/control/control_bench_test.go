package control_test

import (
	"encoding/base64"
	"encoding/json"
	"math/rand/v2"
	"strings"
	"testing"

	"edgerelay/fastpath/channel/control"
)

// wireMessage is what encoding/json would use for the same messages: the
// baseline each benchmark runs beside.
type wireMessage struct {
	Type string `json:"type"`
	ID   string `json:"id"`
	Data string `json:"data"`
}

// benchPayloads are phone frames of the two sizes the benchmarks use, in two
// flavours: base64 text, the shape of Noise ciphertext in a text frame (no
// escapes, the common case), and JSON-ish text with quotes, newlines and
// non-ASCII (escapes on every few bytes, the worst realistic case).
func benchPayloads() []struct {
	name string
	data []byte
} {
	rng := rand.New(rand.NewPCG(7, 8))
	var out []struct {
		name string
		data []byte
	}
	for _, size := range []struct {
		name string
		n    int
	}{{"256B", 256}, {"16KiB", 16 << 10}} {
		raw := make([]byte, size.n)
		for i := range raw {
			raw[i] = byte(rng.Uint32())
		}
		b64 := []byte(base64.StdEncoding.EncodeToString(raw))[:size.n]
		text := []byte(strings.Repeat("{\"k\":\"v\\u00e9\",\n\t\"漢\":[1,\"😀\"]} ", size.n/30+1))[:size.n]
		out = append(out,
			struct {
				name string
				data []byte
			}{"base64-" + size.name, b64},
			struct {
				name string
				data []byte
			}{"text-" + size.name, text})
	}
	return out
}

func BenchmarkAppendData(b *testing.B) {
	id := mkID(testID)
	for _, p := range benchPayloads() {
		b.Run(p.name+"/control", func(b *testing.B) {
			buf := make([]byte, 0, 8*len(p.data)+64) // a pooled buffer
			b.SetBytes(int64(len(p.data)))
			b.ReportAllocs()
			for b.Loop() {
				buf = control.AppendData(buf[:0], id, p.data)
			}
		})
		b.Run(p.name+"/encoding_json", func(b *testing.B) {
			// Generous to the baseline: the []byte-to-string copy of the
			// data is done once, outside the loop.
			m := wireMessage{Type: "data", ID: testID, Data: string(p.data)}
			b.SetBytes(int64(len(p.data)))
			b.ReportAllocs()
			for b.Loop() {
				if _, err := json.Marshal(&m); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

func BenchmarkParse(b *testing.B) {
	id := mkID(testID)
	for _, p := range benchPayloads() {
		frame := control.AppendData(nil, id, p.data)
		b.Run(p.name+"/control", func(b *testing.B) {
			scratch := make([]byte, 0, control.MaxData)
			b.SetBytes(int64(len(p.data)))
			b.ReportAllocs()
			for b.Loop() {
				msg, s, err := control.Parse(frame, scratch)
				if err != nil || len(msg.Data) != len(p.data) {
					b.Fatal(err)
				}
				scratch = s
			}
		})
		b.Run(p.name+"/encoding_json", func(b *testing.B) {
			var m wireMessage
			b.SetBytes(int64(len(p.data)))
			b.ReportAllocs()
			for b.Loop() {
				if err := json.Unmarshal(frame, &m); err != nil || len(m.Data) != len(p.data) {
					b.Fatal(err)
				}
			}
		})
	}
}
