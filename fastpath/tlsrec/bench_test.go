package tlsrec

import (
	"io"
	"testing"
)

// BenchmarkWakeRecord: what waking a parked TLS socket costs the record
// layer. One small record (a watch's delivery, 200 bytes) sealed by one
// side and opened by the other, on an active connection (keys kept) and
// on one that went idle before each record (both AEADs rebuilt from the
// secrets: the parked socket's case). Same run, so the ratio is the
// figure: go test -run X -bench WakeRecord -benchmem ./fastpath/tlsrec
func BenchmarkWakeRecord(b *testing.B) {
	for _, idle := range []bool{false, true} {
		name := "active"
		if idle {
			name = "idle-before-each"
		}
		b.Run(name, func(b *testing.B) {
			w, r := twinPair(b, &aes128GCM)
			msg, got := make([]byte, 200), make([]byte, 200)
			b.ReportAllocs()
			for b.Loop() {
				if idle {
					w.Idle()
					r.Idle()
				}
				if _, err := w.Write(msg); err != nil {
					b.Fatal(err)
				}
				if _, err := io.ReadFull(r, got); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
