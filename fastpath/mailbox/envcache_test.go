package mailbox_test

import (
	"bytes"
	"strconv"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"edgerelay/fastpath/mailbox"
	"edgerelay/fastpath/promtest"
)

// The envelope cache answers reads of recent envelopes from memory. These
// tests read envelopes (so that they are cached), then end their lives
// every way the protocol has, and check that no read answers them again.

func (r *relay) getOne(dir string, seq uint64, tok string) answer {
	r.t.Helper()
	return r.do("GET", mb("notes")+"/"+dir+"/"+strconv.FormatUint(seq, 10), tok, nil)
}

func (r *relay) headOne(dir string, seq uint64, tok string) int {
	r.t.Helper()
	return r.do("HEAD", mb("notes")+"/"+dir+"/"+strconv.FormatUint(seq, 10), tok, nil).status
}

// writeAndRead stores envelopes 1..n filled with fill and reads each back.
func (r *relay) writeAndRead(tok string, n uint64, fill byte) {
	r.t.Helper()
	for seq := uint64(1); seq <= n; seq++ {
		env := envelope(seq, 40, fill)
		if a := r.do("PUT", mb("notes")+"/p2c/"+strconv.FormatUint(seq, 10), tok, env); a.status != 201 {
			r.t.Fatalf("put %d: %d %s", seq, a.status, a.body)
		}
		if a := r.getOne("p2c", seq, tok); a.status != 200 || !bytes.Equal(a.body, env) {
			r.t.Fatalf("get %d: %d, other bytes %v", seq, a.status, !bytes.Equal(a.body, env))
		}
	}
}

func TestCachedEnvelopesDoNotOutliveTheirMailbox(t *testing.T) {
	for _, end := range []struct {
		name string
		// end ends the mailbox's life and returns the token that claims it next.
		end func(r *relay) string
	}{
		{"erase", func(r *relay) string {
			expect(t, r.do("DELETE", mb("notes"), token, nil), 204, "")
			return token
		}},
		{"expiry swept", func(r *relay) string {
			r.clock.advance(2 * time.Hour)
			if n := r.h.ExpireIdle(r.clock.now().UnixNano()); n != 1 {
				t.Fatalf("expired %d", n)
			}
			return other
		}},
		{"expired, claimed before the sweep", func(r *relay) string {
			r.clock.advance(2 * time.Hour)
			return other
		}},
	} {
		t.Run(end.name, func(t *testing.T) {
			r := start(t, opts{idle: time.Hour})
			r.claim("notes")
			r.writeAndRead(token, 3, 'a')
			next := end.end(r)
			expect(t, r.do("PUT", mb("notes"), next, nil), 201, "")
			for seq := uint64(1); seq <= 3; seq++ {
				expect(t, r.getOne("p2c", seq, next), 404, "not_found")
				if s := r.headOne("p2c", seq, next); s != 404 {
					t.Fatalf("HEAD %d of the new mailbox: %d", seq, s)
				}
			}
			// The same sequences with other bytes are the new mailbox's.
			r.writeAndRead(next, 3, 'b')
		})
	}
}

func TestPrunedEnvelopesAreNotRead(t *testing.T) {
	r := start(t, opts{})
	r.claim("notes")
	r.writeAndRead(token, 5, 'a')
	expect(t, r.do("DELETE", mb("notes")+"/p2c?through=3", token, nil), 204, "")
	for seq := uint64(1); seq <= 5; seq++ {
		want := 200
		if seq <= 3 {
			want = 404
		}
		if a := r.getOne("p2c", seq, token); a.status != want {
			t.Errorf("GET %d after prune through 3: %d, want %d", seq, a.status, want)
		}
		if s := r.headOne("p2c", seq, token); s != want {
			t.Errorf("HEAD %d after prune through 3: %d, want %d", seq, s, want)
		}
	}
	expect(t, r.put("notes", "p2c", 2, envelope(2, 40, 'a')), 409, "conflict")
}

// TestGapsAreNotFound: a reader may skip sequences; what lies between the
// first and the last stored is not all stored.
func TestGapsAreNotFound(t *testing.T) {
	r := start(t, opts{})
	r.claim("notes")
	for _, seq := range []uint64{2, 3, 6} {
		expect(t, r.put("notes", "p2c", seq, envelope(seq, 10, 'g')), 201, "")
	}
	for seq, want := range map[uint64]int{1: 404, 2: 200, 3: 200, 4: 404, 5: 404, 6: 200, 7: 404} {
		if s := r.headOne("p2c", seq, token); s != want {
			t.Errorf("HEAD %d: %d, want %d", seq, s, want)
		}
		if a := r.getOne("p2c", seq, token); a.status != want {
			t.Errorf("GET %d: %d, want %d", seq, a.status, want)
		}
	}
	expect(t, r.put("notes", "p2c", 4, envelope(4, 10, 'g')), 201, "")
	if s := r.headOne("p2c", 4, token); s != 200 {
		t.Errorf("HEAD 4 once written: %d", s)
	}
}

// TestReadsAfterRestartComeFromTheStore: a new process starts with an
// empty cache; reads, retries and conflicts are answered from the store,
// and a read fills the cache.
func TestReadsAfterRestartComeFromTheStore(t *testing.T) {
	dir := t.TempDir()
	first := start(t, opts{dataDir: dir})
	first.claim("notes")
	first.writeAndRead(token, 3, 'a')
	first.stop()

	reg := prometheus.NewRegistry()
	r := start(t, opts{dataDir: dir, metrics: mailbox.NewMetrics(reg)})
	counter := func(name string) float64 { return promtest.Must(t, reg, name, nil) }
	env := envelope(2, 40, 'a')
	for i := range 2 { // the first read misses and fills, the second hits
		if a := r.getOne("p2c", 2, token); a.status != 200 || !bytes.Equal(a.body, env) {
			t.Fatalf("read %d after restart: %d", i, a.status)
		}
	}
	if h, m := counter("edgerelay_mailbox_envelope_cache_hits_total"), counter("edgerelay_mailbox_envelope_cache_misses_total"); h != 1 || m != 1 {
		t.Errorf("hits %v misses %v, want 1 and 1", h, m)
	}
	if b := counter("edgerelay_mailbox_envelope_cache_bytes"); b != float64(len(env)) {
		t.Errorf("cache holds %v bytes, want %d", b, len(env))
	}
	expect(t, r.put("notes", "p2c", 1, envelope(1, 40, 'a')), 200, "")         // a retry, from the store
	expect(t, r.put("notes", "p2c", 3, envelope(3, 40, 'z')), 409, "conflict") // other bytes
	expect(t, r.put("notes", "p2c", 2, envelope(2, 40, 'z')), 409, "conflict") // other bytes, cached
}

// TestWithoutTheCache: RELAY_ENVELOPE_CACHE=0 (negative here) serves
// every read from the store, with the same answers.
func TestWithoutTheCache(t *testing.T) {
	reg := prometheus.NewRegistry()
	r := start(t, opts{envelopeCache: -1, metrics: mailbox.NewMetrics(reg)})
	r.claim("notes")
	r.writeAndRead(token, 3, 'a')
	expect(t, r.put("notes", "p2c", 1, envelope(1, 40, 'a')), 200, "")
	expect(t, r.put("notes", "p2c", 1, envelope(1, 40, 'b')), 409, "conflict")
	for _, name := range []string{"edgerelay_mailbox_envelope_cache_hits_total", "edgerelay_mailbox_envelope_cache_bytes"} {
		if v := promtest.Must(t, reg, name, nil); v != 0 {
			t.Errorf("%s = %v without a cache", name, v)
		}
	}
}
