package mailbox_test

import (
	"bytes"
	"fmt"
	"net/http"
	"strconv"
	"sync"
	"testing"
	"time"

	"edgerelay/store"
)

// call is one request of sendAll.
type call struct {
	method, path string
	body         []byte
}

// sendAll sends the calls at once (each from its own goroutine, released
// together) and returns their statuses in order.
func sendAll(t *testing.T, r *relay, calls []call) []int {
	t.Helper()
	statuses := make([]int, len(calls))
	errs := make(chan error, len(calls))
	// A client of their own, whose connections are closed after: the
	// server's shutdown at cleanup would wait for them.
	tr := &http.Transport{MaxIdleConnsPerHost: len(calls)}
	defer tr.CloseIdleConnections()
	client := &http.Client{Transport: tr}
	var wg sync.WaitGroup
	start := make(chan struct{})
	for i, c := range calls {
		req, err := http.NewRequest(c.method, r.base+c.path, bytes.NewReader(c.body))
		if err != nil {
			t.Fatal(err)
		}
		req.Header.Set("Authorization", "Bearer "+token)
		wg.Go(func() {
			<-start
			resp, err := client.Do(req)
			if err != nil {
				errs <- fmt.Errorf("%s %s: %w", c.method, c.path, err)
				return
			}
			resp.Body.Close()
			statuses[i] = resp.StatusCode
		})
	}
	close(start)
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	return statuses
}

// writes returns PUTs of sequences from, from+1, … n of them.
func writes(from uint64, n int) []call {
	calls := make([]call, n)
	for i := range calls {
		seq := from + uint64(i)
		calls[i] = call{"PUT", mb("notes") + "/p2c/" + strconv.FormatUint(seq, 10), envelope(seq, 100, byte(seq))}
	}
	return calls
}

// TestConcurrentWritesOfOneSequence: writers of one sequence at once, half
// with one set of bytes and half with another. Exactly one stores (201),
// and the others wait for it to settle and compare: the same bytes are a
// retry (200), other bytes a conflict (409). The watcher gets each envelope
// once. Whether a writer comes while another's sync runs depends on the
// scheduling, so the race is run for many sequences (with the check for a
// write in flight removed, all 24 writers of a sequence store in some of
// them, and the test fails).
func TestConcurrentWritesOfOneSequence(t *testing.T) {
	r := start(t, opts{})
	r.claim("notes")
	w := r.watch("notes", "p2c", "")
	const writers, sequences = 24, 40
	for seq := uint64(1); seq <= sequences; seq++ {
		r.clock.advance(time.Minute) // refills the write bucket
		a, b := envelope(seq, 200, 0xaa), envelope(seq, 200, 0xbb)
		calls := make([]call, writers)
		for i := range calls {
			calls[i] = call{"PUT", mb("notes") + "/p2c/" + strconv.FormatUint(seq, 10), a}
			if i%2 == 1 {
				calls[i].body = b
			}
		}
		statuses := sendAll(t, r, calls)
		winner := -1
		for i, s := range statuses {
			if s == 201 {
				if winner >= 0 {
					t.Fatalf("sequence %d: two writers stored it, %d and %d (statuses %v)", seq, winner, i, statuses)
				}
				winner = i
			}
		}
		if winner < 0 {
			t.Fatalf("sequence %d: no writer stored it (statuses %v)", seq, statuses)
		}
		for i, s := range statuses {
			want := 409
			switch {
			case i == winner:
				want = 201
			case bytes.Equal(calls[i].body, calls[winner].body):
				want = 200
			}
			if s != want {
				t.Fatalf("sequence %d: writer %d got %d, want %d (statuses %v)", seq, i, s, want, statuses)
			}
		}
		got := r.do("GET", calls[winner].path, token, nil)
		expect(t, got, 200, "")
		if !bytes.Equal(got.body, calls[winner].body) {
			t.Fatalf("sequence %d: the stored bytes are not the winner's", seq)
		}
		env := nextEnvelope(t, w)
		if seqOf(env) != seq || !bytes.Equal(env, calls[winner].body) {
			t.Fatalf("watch delivered sequence %d (or other bytes), want %d once", seqOf(env), seq)
		}
	}
}

// TestEraseWaitsForWritesInFlight: an erase sent together with writes
// answers once the writes that were in flight have settled, and removes
// them all: no write's sync lands after the erase and leaves an envelope
// behind. The race is run many times over, as above; the window a missing
// wait would open is only the few microseconds between a write's reserving
// and its batch entering Pebble's commit pipeline, so without the wait this
// test fails in about one run of ten.
func TestEraseWaitsForWritesInFlight(t *testing.T) {
	r := start(t, opts{})
	log := store.NewEnvelopeLog(r.db)
	const writers, rounds = 16, 30
	for round := range rounds {
		r.clock.advance(time.Minute) // refills the buckets
		r.claim("notes")
		calls := append(writes(1, writers), call{"DELETE", mb("notes"), nil})
		statuses := sendAll(t, r, calls)
		// A write answered 201 came before the erase and was erased with
		// it; one answered 404 came after it and stored nothing.
		for i, s := range statuses[:writers] {
			if s != 201 && s != 404 {
				t.Fatalf("round %d: write %d during the erase got %d, want 201 or 404", round, i, s)
			}
		}
		if s := statuses[writers]; s != 204 {
			t.Fatalf("round %d: erase got %d, want 204", round, s)
		}
		left := 0
		if err := log.Scan("notes/"+id, store.DirP2C, 0, func(uint64, []byte) bool {
			left++
			return true
		}); err != nil {
			t.Fatal(err)
		}
		if left != 0 {
			t.Fatalf("round %d: %d envelopes left after the erase (statuses %v)", round, left, statuses)
		}
	}
}
