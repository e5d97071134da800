package agentroute

import (
	"bytes"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"edgerelay/fastpath/ndjson"
)

func chunk(tag string, data []byte) *nats.Msg {
	m := &nats.Msg{Data: data, Header: nats.Header{}}
	m.Header.Set(hdrChunk, tag)
	return m
}

// TestReassemble: chunks of two publishers interleaved come back whole; a
// chunk out of order drops its line (and the rest of it); a line past the
// line limit, or past the bound on what one subscription holds, is
// dropped; a message without the header is a line as it is.
func TestReassemble(t *testing.T) {
	var ra reassembler
	if got := ra.add(&nats.Msg{Data: []byte("plain")}); string(got) != "plain" {
		t.Fatalf("plain message: %q", got)
	}
	for k, tag := range []string{"a/1/7/0/2", "b/1/7/0/2", "a/1/7/1/2"} {
		if got := ra.add(chunk(tag, []byte(tag[:1]))); (k == 2) != (got != nil) {
			t.Fatalf("chunk %s: %q", tag, got)
		} else if got != nil && string(got) != "aa" {
			t.Fatalf("a's line: %q", got)
		}
	}
	if got := ra.add(chunk("b/1/7/1/2", []byte("b"))); string(got) != "bb" {
		t.Fatalf("b's line: %q", got)
	}
	if ra.held != 0 || len(ra.parts) != 0 {
		t.Fatalf("%d bytes held in %d parts after whole lines", ra.held, len(ra.parts))
	}
	// Out of order: chunk 2 before 1.
	ra.add(chunk("c/1/1/0/3", []byte("c")))
	if got := ra.add(chunk("c/1/1/2/3", []byte("c"))); got != nil || len(ra.parts) != 0 {
		t.Fatalf("a chunk out of order: %q, %d parts kept", got, len(ra.parts))
	}
	if got := ra.add(chunk("c/1/1/1/3", []byte("c"))); got != nil {
		t.Fatalf("the rest of a dropped line: %q", got)
	}
	// The line limit: MaxLine bytes in two chunks is one byte too many.
	half := bytes.Repeat([]byte("x"), ndjson.MaxLine/2)
	ra.add(chunk("d/1/1/0/2", half))
	if got := ra.add(chunk("d/1/1/1/2", append(half[:len(half):len(half)], 'y'))); got != nil {
		t.Fatal("a line past the limit came through")
	}
	if got := ra.add(chunk("d/1/2/0/2", half)); got != nil {
		t.Fatal("half a line came through")
	}
	if got := ra.add(chunk("d/1/2/1/2", half[1:])); len(got) != ndjson.MaxLine-1 {
		t.Fatalf("the longest line: %d bytes", len(got))
	}
	// The bound: two publishers each halfway through the longest line, a
	// third's chunk does not fit.
	ra.add(chunk("e/1/1/0/2", half))
	ra.add(chunk("e/1/1/1/3", half)) // wrong n: dropped
	for _, p := range []string{"f", "g", "h", "i"} {
		ra.add(chunk(p+"/1/1/0/2", half))
	}
	if ra.held > maxPartial {
		t.Fatalf("%d bytes held, bound %d", ra.held, maxPartial)
	}
	if got := ra.add(chunk("j/1/1/0/2", half)); got != nil || ra.parts["j/1/1"] != nil {
		t.Fatal("a chunk past the bound was kept")
	}
	// A line whose publisher stopped halfway long ago gives its room up.
	ra.parts["f/1/1"].last = time.Now().Add(-staleAfter - time.Second)
	if ra.add(chunk("j/1/1/0/2", half)); ra.parts["j/1/1"] == nil || ra.parts["f/1/1"] != nil {
		t.Fatal("a stale line kept its room")
	}
	if got := ra.add(chunk("bad", nil)); got != nil {
		t.Fatal("a malformed tag came through")
	}
}
