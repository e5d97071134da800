package mailbox_test

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"strconv"
	"sync/atomic"
	"testing"
)

// outsideVerdict is the spec's reading of an envelope PUT's outside, written
// independently of the handler: 413 over the size limit, 400 under 25
// bytes, with a version byte other than 0x01, a sequence that differs from
// the URL's, or an X-Relay-Notify other than absent, alert and silent; 0
// when the relay must go on to store it.
func outsideVerdict(urlSeq uint64, env []byte, notify string, maxEnvelope int) int {
	switch {
	case len(env) > maxEnvelope:
		return 413
	case len(env) < 25, env[0] != 0x01, binary.BigEndian.Uint64(env[1:9]) != urlSeq:
		return 400
	case notify != "" && notify != "alert" && notify != "silent":
		return 400
	}
	return 0
}

// FuzzEnvelopePut sends arbitrary envelope PUTs to a running relay and
// holds every answer to the spec: a refused envelope (400, 413) stores
// nothing, an accepted one reads back byte for byte, and a PUT of the
// already stored sequence 1 is 200 with the same bytes and 409 with others.
// Each input gets a mailbox of its own, holding only that envelope 1, so
// that a failing input reproduces alone.
func FuzzEnvelopePut(f *testing.F) {
	const maxEnvelope = 200
	r := start(f, opts{maxEnvelope: maxEnvelope})
	first := envelope(1, 8, 0xaa)
	good := func(seq uint64, n int) []byte { return envelope(seq, n, byte(seq)) }
	f.Add(uint64(2), good(2, 0), "")
	f.Add(uint64(2), good(2, 100), "alert")
	f.Add(uint64(3), good(3, 175), "silent") // exactly maxEnvelope
	f.Add(uint64(4), good(4, 176), "")       // one past
	f.Add(uint64(5), good(5, 0)[:24], "")    // one short
	f.Add(uint64(6), good(7, 10), "")        // sequence differs from the URL
	f.Add(uint64(8), append([]byte{2}, good(8, 10)[1:]...), "")
	f.Add(uint64(9), good(9, 10), "loud")
	f.Add(uint64(1), first, "")      // a retry
	f.Add(uint64(1), good(1, 8), "") // other bytes for a stored sequence
	f.Add(uint64(1<<64-1), good(1<<64-1, 3), "")

	var inputs atomic.Uint64
	f.Fuzz(func(t *testing.T, urlSeq uint64, env []byte, notify string) {
		if urlSeq == 0 {
			urlSeq = 1 // sequence 0 is a parse error, FuzzParseSeq's ground
		}
		// Header values with control bytes never reach a handler (the
		// client refuses to send them); they are not the outside checks.
		for _, c := range []byte(notify) {
			if c < 0x20 || c == 0x7f {
				return
			}
		}
		it := *r
		it.t = t
		box := fmt.Sprintf("/v1/notes/mailbox/fuzz-%016d", inputs.Add(1))
		expect(t, it.do("PUT", box, token, nil), 201, "")
		expect(t, it.do("PUT", box+"/p2c/1", token, first), 201, "")
		var hdr []string
		if notify != "" {
			hdr = []string{"X-Relay-Notify", notify}
		}
		a := it.do("PUT", box+"/p2c/"+strconv.FormatUint(urlSeq, 10), token, env, hdr...)
		switch want := outsideVerdict(urlSeq, env, notify, maxEnvelope); {
		case want == 413:
			expect(t, a, 413, "too_large")
		case want == 400:
			expect(t, a, 400, "bad_request")
		case urlSeq == 1 && bytes.Equal(env, first):
			expect(t, a, 200, "")
		case urlSeq == 1:
			expect(t, a, 409, "conflict")
		default:
			expect(t, a, 201, "")
		}
		head := it.do("HEAD", box+"/p2c", token, nil)
		wantCount, wantLast := "1", "1"
		if a.status == 201 {
			wantCount, wantLast = "2", strconv.FormatUint(urlSeq, 10)
		}
		if c, l := head.header.Get("X-Relay-Count"), head.header.Get("X-Relay-Last"); c != wantCount || l != wantLast {
			t.Fatalf("after answer %d: count %s last %s, want %s %s", a.status, c, l, wantCount, wantLast)
		}
		back := it.do("GET", box+"/p2c/"+strconv.FormatUint(urlSeq, 10), token, nil)
		switch {
		case a.status == 201 && (back.status != 200 || !bytes.Equal(back.body, env)):
			t.Fatalf("GET %d after 201: %d, %d bytes; want the %d stored", urlSeq, back.status, len(back.body), len(env))
		case urlSeq == 1 && (back.status != 200 || !bytes.Equal(back.body, first)):
			t.Fatalf("GET 1 after answer %d: %d; the first envelope changed", a.status, back.status)
		case a.status != 201 && urlSeq != 1 && back.status != 404:
			t.Fatalf("GET %d of a refused envelope: %d", urlSeq, back.status)
		}
	})
}
