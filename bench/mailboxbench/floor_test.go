package mailboxbench

import (
	"bytes"
	"fmt"
	"strconv"
	"testing"
	"time"

	"github.com/cockroachdb/pebble/v2"

	"edgerelay/store"
)

// TestFloorAnswersPipelinedRequests: the HEAD floor answers every request
// of a pipelined batch, in one write once none is left buffered.
func TestFloorAnswersPipelinedRequests(t *testing.T) {
	f, err := startFloor(loopback, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer func() {
		if err := f.close(); err != nil {
			t.Error(err)
		}
	}()
	c, err := dialRaw(f.addr())
	if err != nil {
		t.Fatal(err)
	}
	defer c.close()
	const depth = 5
	if err := c.send(bytes.Repeat(rawRequest("HEAD", f.addr(), "/x"), depth)); err != nil {
		t.Fatal(err)
	}
	for i := range depth {
		if status, _, err := c.response(true); err != nil || status != 200 {
			t.Fatalf("answer %d: %d, %v", i+1, status, err)
		}
	}
}

// TestPutFloorCommitsEachBody: the PUT floor answers 201 only after the
// body is in Pebble under the connection's next envelope key, and hangs
// up on a request whose length it cannot read.
func TestPutFloorCommitsEachBody(t *testing.T) {
	dir := t.TempDir()
	raw, err := pebble.Open(dir, &pebble.Options{Logger: quietPebble{}})
	if err != nil {
		t.Fatal(err)
	}
	defer func() {
		if err := raw.Close(); err != nil {
			t.Error(err)
		}
	}()
	f, err := startFloor(loopback, raw)
	if err != nil {
		t.Fatal(err)
	}
	c, err := dialRaw(f.addr())
	if err != nil {
		t.Fatal(err)
	}
	for seq := uint64(1); seq <= 2; seq++ {
		env := envelope(nil, seq, 100)
		req := fmt.Sprintf("PUT /x/%d HTTP/1.1\r\nHost: h\r\ncontent-LENGTH: %d\r\n\r\n%s", seq, len(env), env)
		if status, _, err := c.do([]byte(req), true); err != nil || status != 201 {
			t.Fatalf("PUT %d: %d, %v", seq, status, err)
		}
		got, closer, err := raw.Get(store.EnvelopeKey(nil, mailboxName(0), store.DirP2C, seq))
		if err != nil {
			t.Fatalf("envelope %d not committed before the 201: %v", seq, err)
		}
		if !bytes.Equal(got, env) {
			t.Errorf("envelope %d: committed %d bytes, not the body", seq, len(got))
		}
		closer.Close()
	}
	if _, _, err := c.do([]byte("PUT /x/3 HTTP/1.1\r\nContent-Length: many\r\n\r\n"), true); err == nil {
		t.Error("a bad Content-Length was answered; want the connection closed")
	}
	c.close()
	if err := f.close(); err != nil {
		t.Error(err)
	}
	if _, _, err := raw.Get(store.EnvelopeKey(nil, mailboxName(0), store.DirP2C, 3)); err != pebble.ErrNotFound {
		t.Errorf("envelope 3 of the refused request: %v, want not found", err)
	}
}

// TestSettleWaitsForQuiet: settle answers only once the store has been
// idle for settleQuiet after its last busy poll.
func TestSettleWaitsForQuiet(t *testing.T) {
	polls := 0
	busyPolls := 4
	ans, err := settleCommand(func() bool { polls++; return polls <= busyPolls })("")
	if err != nil {
		t.Fatal(err)
	}
	waited, err := strconv.ParseInt(ans, 10, 64)
	if err != nil {
		t.Fatalf("answer %q: %v", ans, err)
	}
	// The first poll is at once, so the busy ones span busyPolls-1 sleeps.
	if min := time.Duration(busyPolls-1)*settlePoll + settleQuiet; time.Duration(waited) < min {
		t.Errorf("settled after %v, want at least %v (%d busy polls, then %v quiet)", time.Duration(waited), min, busyPolls, settleQuiet)
	}
	if polls <= busyPolls {
		t.Errorf("answered after %d polls, while still busy", polls)
	}
}
