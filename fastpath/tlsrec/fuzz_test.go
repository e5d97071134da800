package tlsrec

import (
	"bytes"
	"io"
	"net"
	"testing"
	"time"
)

// inputConn is a net.Conn whose input is a fixed stream and whose output
// is dropped: the fuzzers' socket.
type inputConn struct {
	net.Conn // nil: only what the record layer calls is implemented
	r        *bytes.Reader
}

func (c *inputConn) Read(p []byte) (int, error)       { return c.r.Read(p) }
func (c *inputConn) Write(p []byte) (int, error)      { return len(p), nil }
func (c *inputConn) Close() error                     { return nil }
func (c *inputConn) SetWriteDeadline(time.Time) error { return nil }

// fuzzKey is the fixed read secret the fuzzers' records are sealed with.
var fuzzKey = bytes.Repeat([]byte{7}, 32)

// sealedStream is records as a peer under fuzzKey would send them.
func sealedStream(t testing.TB, records ...[]byte) []byte {
	sealer := &Conn{s: &aes128GCM, out: half{secret: fuzzKey}, rekeyAfter: rekeyAfter}
	var out []byte
	for _, r := range records {
		var err error
		if out, err = sealer.seal(out, r[len(r)-1], r[:len(r)-1]); err != nil {
			t.Fatal(err)
		}
	}
	return out
}

// Any byte stream ends in data or a clean error: no panic, no data that
// was not in it, and nothing held past the stream.
func FuzzReadRecords(f *testing.F) {
	f.Add(sealedStream(f, []byte("hello\x17")))
	f.Add(sealedStream(f, []byte("\x17"), []byte("a\x17"), []byte{msgKeyUpdate, 0, 0, 1, 1, typeHandshake}))
	f.Add(sealedStream(f, []byte{msgKeyUpdate, 0, typeHandshake}, []byte{0, 1, 0, typeHandshake}))
	f.Add(sealedStream(f, []byte{1, 0, typeAlert}))
	f.Add([]byte{typeAppData, 3, 3, 0x41, 0x01})
	f.Fuzz(func(t *testing.T, stream []byte) {
		c := &Conn{raw: &inputConn{r: bytes.NewReader(stream)}, s: &aes128GCM, in: half{secret: fuzzKey}, out: half{secret: fuzzKey}, rekeyAfter: rekeyAfter}
		total := 0
		buf := make([]byte, 1000)
		for {
			n, err := c.Read(buf)
			total += n
			if total > len(stream) {
				t.Fatalf("read %d bytes of data from a stream of %d", total, len(stream))
			}
			if err != nil {
				if _, again := c.Read(buf); again == nil {
					t.Fatalf("a read after %v succeeded", err)
				}
				return
			}
		}
	})
}

// Whatever the writes, the reader gets the same bytes.
func FuzzTwinsCarryBytes(f *testing.F) {
	f.Add([]byte{1, 2, 3}, uint16(1))
	f.Add(bytes.Repeat([]byte{0xa5}, 40_000), uint16(maxPlaintext))
	f.Fuzz(func(t *testing.T, data []byte, chunk uint16) {
		if chunk == 0 {
			chunk = 1
		}
		a, b := twinPair(t, &aes128GCM)
		a.rekeyAfter = 3 // and key updates on the way
		errs := make(chan error, 1)
		go func() {
			for rest := data; len(rest) > 0; {
				n := min(len(rest), int(chunk))
				if _, err := a.Write(rest[:n]); err != nil {
					errs <- err
					return
				}
				rest = rest[n:]
			}
			errs <- a.Close()
		}()
		got, err := io.ReadAll(b)
		if err != nil {
			t.Fatal(err)
		}
		if err := <-errs; err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(got, data) {
			t.Fatalf("read %d bytes, wrote %d, equal %v", len(got), len(data), bytes.Equal(got, data))
		}
	})
}
