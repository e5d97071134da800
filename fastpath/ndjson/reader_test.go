package ndjson

import (
	"bytes"
	"errors"
	"io"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"
	"testing/iotest"
)

// readAll returns the lines Next returns (copied) and the error that ended
// them.
func readAll(r *Reader) ([]string, error) {
	var lines []string
	for {
		line, err := r.Next()
		if err != nil {
			return lines, err
		}
		lines = append(lines, string(line))
	}
}

// chunked delivers data in chunks of random sizes from 1 to max.
type chunked struct {
	data []byte
	rng  *rand.Rand
	max  int
}

func (c *chunked) Read(p []byte) (int, error) {
	if len(c.data) == 0 {
		return 0, io.EOF
	}
	n := min(len(p), len(c.data), 1+c.rng.IntN(c.max))
	copy(p, c.data[:n])
	c.data = c.data[n:]
	return n, nil
}

// chunkings are the ways the tests deliver a stream: whole, a byte at a
// time, in halves, with the last data and io.EOF together, in random chunks.
func chunkings(data []byte) map[string]io.Reader {
	return map[string]io.Reader{
		"whole":   bytes.NewReader(data),
		"onebyte": iotest.OneByteReader(bytes.NewReader(data)),
		"half":    iotest.HalfReader(bytes.NewReader(data)),
		"dataerr": iotest.DataErrReader(bytes.NewReader(data)),
		"random":  &chunked{data: data, rng: rand.New(rand.NewPCG(1, 2)), max: 7},
	}
}

func TestReaderLines(t *testing.T) {
	for _, tc := range []struct {
		in    string
		lines []string
		err   error
	}{
		{"", nil, io.EOF},
		{"a\n", []string{"a"}, io.EOF},
		{"a\nb\n", []string{"a", "b"}, io.EOF},
		{"a\r\nb\r\n", []string{"a", "b"}, io.EOF},
		{"a\r\r\n", []string{"a\r"}, io.EOF}, // one carriage return is stripped
		{"\n\n\r\n  \n\t\r\n\r\r\na\n \t \n", []string{"a"}, io.EOF},
		{" a \n", []string{" a "}, io.EOF}, // not blank: Scan's business
		{"a\rb\n", []string{"a\rb"}, io.EOF},
		{"\f\n", []string{"\f"}, io.EOF}, // not JSON whitespace, so not blank
		{"a\nb", []string{"a"}, ErrTruncated},
		{"a\n{\"type\":\"x\"}", []string{"a"}, ErrTruncated},
		{"a\n  \t", []string{"a"}, io.EOF}, // blank without its line feed is nothing
		{"a\n\r", []string{"a"}, io.EOF},
		{"x", nil, ErrTruncated},
	} {
		for name, src := range chunkings([]byte(tc.in)) {
			for _, size := range []int{0, 1, 16, 17} {
				lines, err := readAll(NewReader(src, size))
				if !slices.Equal(lines, tc.lines) || err != tc.err {
					t.Errorf("%q %s/%d: %q, %v; want %q, %v", tc.in, name, size, lines, err, tc.lines, tc.err)
				}
				src = chunkings([]byte(tc.in))[name] // a fresh one for the next size
			}
		}
	}
}

// TestReaderEOFAfterTruncated: the truncated frame is reported once, then
// the stream is over.
func TestReaderEOFAfterTruncated(t *testing.T) {
	r := NewReader(strings.NewReader("a\nb"), 0)
	for _, want := range []error{nil, ErrTruncated, io.EOF, io.EOF} {
		if _, err := r.Next(); err != want {
			t.Fatalf("got %v, want %v", err, want)
		}
	}
}

// TestReaderChunking reads the same stream of many lines of many sizes in
// every chunking and with several starting buffer sizes, which must not
// change what comes out.
func TestReaderChunking(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 4))
	var data []byte
	var want []string
	for i := range 500 {
		n := rng.IntN(300)
		if i%50 == 0 {
			n = 5000 + rng.IntN(70000) // now and then one bigger than the buffer
		}
		line := make([]byte, n)
		for j := range line {
			line[j] = "ab{}\" \t\r"[rng.IntN(8)]
		}
		if rng.IntN(2) == 0 {
			line = append(line, '\r')
		}
		data = append(data, line...)
		data = append(data, '\n')
		if l := strings.TrimSuffix(string(line), "\r"); strings.Trim(l, " \t\r") != "" {
			want = append(want, l)
		}
	}
	for name, src := range chunkings(data) {
		for _, size := range []int{16, 4096, 1 << 20} {
			lines, err := readAll(NewReader(src, size))
			if err != io.EOF || !slices.Equal(lines, want) {
				t.Errorf("%s/%d: %d lines and %v, want %d lines", name, size, len(lines), err, len(want))
			}
			src = chunkings(data)[name]
		}
	}
}

// line returns a JSON frame of exactly n bytes, ending in end ("\n" or
// "\r\n"), that Scan accepts.
func frameOfLen(n int, end string) []byte {
	head, tail := `{"type":"big","payload":"`, `"}`+end
	b := make([]byte, 0, n)
	b = append(b, head...)
	b = append(b, bytes.Repeat([]byte("x"), n-len(head)-len(tail))...)
	return append(b, tail...)
}

// TestReaderLineLimit: 16,777,216 bytes with the line feed (and a carriage
// return before it) pass, one more fails, and the failure is terminal.
func TestReaderLineLimit(t *testing.T) {
	for _, end := range []string{"\n", "\r\n"} {
		small := []byte(`{"type":"a"}` + end)
		ok := frameOfLen(MaxLine, end)
		over := frameOfLen(MaxLine+1, end)
		// Passes, after a short line so that the big one starts mid-buffer.
		r := NewReader(bytes.NewReader(slices.Concat(small, ok, small)), 0)
		for i := range 3 {
			line, err := r.Next()
			if err != nil {
				t.Fatalf("%q: line %d: %v", end, i, err)
			}
			if _, err := Scan(line); err != nil {
				t.Fatalf("%q: line %d: Scan: %v", end, i, err)
			}
			if i == 1 && len(line) != MaxLine-len(end) {
				t.Fatalf("%q: the big line has %d bytes", end, len(line))
			}
		}
		if _, err := r.Next(); err != io.EOF {
			t.Fatalf("%q: end: %v", end, err)
		}
		// Fails, and keeps failing.
		r = NewReader(bytes.NewReader(slices.Concat(small, over, small)), 0)
		if _, err := r.Next(); err != nil {
			t.Fatal(err)
		}
		for range 2 {
			if _, err := r.Next(); err != ErrLineTooLong {
				t.Fatalf("%q: one byte over: %v", end, err)
			}
		}
	}
}

// endless is a stream of x without a line feed.
type endless struct{ n int }

func (e *endless) Read(p []byte) (int, error) {
	for i := range p {
		p[i] = 'x'
	}
	e.n += len(p)
	return len(p), nil
}

// TestReaderLineLimitNoLineFeed: a line that never ends fails as soon as it
// is over the limit, without reading on.
func TestReaderLineLimitNoLineFeed(t *testing.T) {
	src := &endless{}
	if _, err := NewReader(src, 0).Next(); err != ErrLineTooLong {
		t.Fatalf("got %v", err)
	}
	if src.n != MaxLine {
		t.Errorf("read %d bytes before giving up, want %d", src.n, MaxLine)
	}
	// MaxLine bytes then the end: with its line feed it would be too long.
	r := NewReader(bytes.NewReader(bytes.Repeat([]byte("x"), MaxLine)), 0)
	if _, err := r.Next(); err != ErrLineTooLong {
		t.Fatalf("got %v", err)
	}
}

func TestReaderErrors(t *testing.T) {
	boom := errors.New("boom")
	r := NewReader(io.MultiReader(strings.NewReader("a\nb\nc"), iotest.ErrReader(boom)), 0)
	lines, err := readAll(r)
	if !slices.Equal(lines, []string{"a", "b"}) || err != boom {
		t.Errorf("got %q, %v", lines, err)
	}
	if _, err := r.Next(); err != boom {
		t.Errorf("then %v", err)
	}
	r = NewReader(iotest.TimeoutReader(strings.NewReader("a\nb\n")), 0)
	if lines, err := readAll(r); len(lines) != 2 || err != iotest.ErrTimeout {
		t.Errorf("timeout: %q, %v", lines, err)
	}
	if _, err := NewReader(emptyReads{}, 0).Next(); err != io.ErrNoProgress {
		t.Errorf("empty reads: %v", err)
	}
}

type emptyReads struct{}

func (emptyReads) Read([]byte) (int, error) { return 0, nil }

// TestReaderShrinks: the buffer grows for a big line and goes back to its
// starting size after shrinkAfter small lines, but not before.
func TestReaderShrinks(t *testing.T) {
	var data []byte
	data = append(data, frameOfLen(10000, "\n")...)
	for range shrinkAfter + 2 {
		data = append(data, `{"type":"a"}`+"\n"...)
	}
	r := NewReader(iotest.OneByteReader(bytes.NewReader(data)), 64)
	sizes := []int{}
	for {
		if _, err := r.Next(); err != nil {
			break
		}
		sizes = append(sizes, len(r.buf))
	}
	if sizes[0] < 10000 {
		t.Fatalf("the buffer did not grow: %d", sizes[0])
	}
	for i, n := range sizes[1 : shrinkAfter+1] {
		if n != sizes[0] {
			t.Errorf("after %d small lines the buffer is %d bytes, want it kept", i, n)
		}
	}
	if n := sizes[len(sizes)-1]; n != 64 {
		t.Errorf("after %d small lines the buffer is %d bytes, want 64", len(sizes)-1, n)
	}
}

// liar claims to have read more than it was given room for.
type liar struct{}

func (liar) Read(p []byte) (int, error) { return len(p) + 1, nil }

func TestReaderInvalidCount(t *testing.T) {
	if _, err := NewReader(liar{}, 0).Next(); err != errInvalidRead {
		t.Errorf("got %v", err)
	}
}
