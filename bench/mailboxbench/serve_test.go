package mailboxbench

import (
	"fmt"
	"net/http"
	"testing"

	"github.com/valyala/fasthttp"

	baseline "edgerelay/bench/baseline/mailbox"
	"edgerelay/fastpath/mailbox"
	"edgerelay/store"
)

// The handlers called directly, without a server: the hot path's own
// cost, and its allocations.

// storedPerFixture is how many envelopes the direct fixture's mailbox holds.
const storedPerFixture = 10

// directFixture is the handlers called directly, over one store.
type directFixture struct {
	ours *mailbox.Handler
	// uncached is ours with the envelope cache off: every GET of one
	// envelope takes Pebble's read path, as a first read does.
	uncached *mailbox.Handler
	baseline *baseline.Handler
}

// newDirectFixture opens a store with mailbox 0 claimed and holding
// envelopes 1..storedPerFixture of 1 KiB in p2c, and returns the
// handlers over it.
func newDirectFixture(tb testing.TB) directFixture {
	tb.Helper()
	db, err := store.Open(tb.TempDir(), nil)
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() {
		if err := db.Close(); err != nil {
			tb.Error(err)
		}
	})
	log := store.NewEnvelopeLog(db)
	clock := newStepClock()
	if err := seed(log, clock.Now, 1, storedPerFixture, 1024); err != nil {
		tb.Fatal(err)
	}
	h, err := ourHandler(log, clock.Now, 0)
	if err != nil {
		tb.Fatal(err)
	}
	uncached, err := ourHandler(log, clock.Now, -1)
	if err != nil {
		tb.Fatal(err)
	}
	return directFixture{ours: h, uncached: uncached, baseline: baseline.New(baseline.Config{Store: log, Apps: []string{app}, Now: clock.Now})}
}

var kindSlugs = [kindCount]string{"head-direction", "get-envelope", "head-envelope"}

// ourCall is one request to our handler called directly, with one
// RequestCtx reused as fasthttp's server reuses one per connection: the
// request is set once, the response reset before each call.
type ourCall struct {
	h   *mailbox.Handler
	ctx fasthttp.RequestCtx
}

func newOurCall(h *mailbox.Handler, kind int, uri string) *ourCall {
	c := &ourCall{h: h}
	c.ctx.Request.SetRequestURI(uri)
	c.ctx.Request.Header.Set("Authorization", "Bearer "+token)
	if isHead(kind) {
		c.ctx.Request.Header.SetMethod(fasthttp.MethodHead)
	}
	return c
}

func (c *ourCall) do() error {
	c.ctx.Response.Reset()
	c.h.ServeHTTP(&c.ctx)
	if c.ctx.Response.StatusCode() != fasthttp.StatusOK {
		return fmt.Errorf("%d %s", c.ctx.Response.StatusCode(), c.ctx.Response.Body())
	}
	return nil
}

// baselineDirectOp calls the baseline's ServeHTTP with one reused request
// and a response writer that keeps nothing: what net/http's server adds
// per request (its own request, response and header maps) is left out, so
// this is the handler alone, like ourCall.
func baselineDirectOp(h *baseline.Handler, kind int, uri string) func() error {
	method := http.MethodGet
	if isHead(kind) {
		method = http.MethodHead
	}
	req, _ := http.NewRequest(method, "http://bench"+uri, nil) // a path of ours: cannot fail
	req.Header.Set("Authorization", "Bearer "+token)
	w := &discardWriter{header: make(http.Header)}
	return func() error {
		clear(w.header)
		w.status = 0
		h.ServeHTTP(w, req)
		if w.status != http.StatusOK {
			return fmt.Errorf("status %d", w.status)
		}
		return nil
	}
}

// discardWriter is an http.ResponseWriter that records the status only.
type discardWriter struct {
	header http.Header
	status int
}

func (w *discardWriter) Header() http.Header { return w.header }

func (w *discardWriter) WriteHeader(status int) {
	if w.status == 0 {
		w.status = status
	}
}

func (w *discardWriter) Write(p []byte) (int, error) {
	w.WriteHeader(http.StatusOK)
	return len(p), nil
}

// BenchmarkServeHTTP calls each handler directly for HEAD of a direction,
// GET of one envelope and HEAD of one envelope: ours with a reused
// RequestCtx, as fasthttp's server reuses one per connection; the
// baseline with a reused request and a writer that keeps nothing
// (net/http's own per-request cost left out). get-envelope-uncached is
// ours with the envelope cache off, what a first read costs; the report
// sets it beside get-envelope/baseline. The report reads ns/op and
// allocs/op from here.
func BenchmarkServeHTTP(b *testing.B) {
	f := newDirectFixture(b)
	for kind, slug := range kindSlugs {
		uri := readURI(kind, 0, 1)
		b.Run(slug+"/ours", func(b *testing.B) { benchOp(b, newOurCall(f.ours, kind, uri).do) })
		b.Run(slug+"/baseline", func(b *testing.B) { benchOp(b, baselineDirectOp(f.baseline, kind, uri)) })
	}
	uri := readURI(kindGet, 0, 1)
	b.Run("get-envelope-uncached/ours", func(b *testing.B) { benchOp(b, newOurCall(f.uncached, kindGet, uri).do) })
}

func benchOp(b *testing.B, op func() error) {
	b.ReportAllocs()
	for b.Loop() {
		if err := op(); err != nil {
			b.Fatal(err)
		}
	}
}

// HEAD of a direction is answered from memory: once the mailbox is
// loaded, nothing is allocated, whatever fasthttp, the bucket set and the
// answer's headers do.
func TestHeadDirectionAllocatesNothing(t *testing.T) {
	if raceEnabled {
		t.Skip("allocation counts are not meaningful under -race; `make test` runs this test without it")
	}
	c := newOurCall(newDirectFixture(t).ours, kindHead, readURI(kindHead, 0, 1))
	var failed error
	head := func() {
		if err := c.do(); err != nil {
			failed = err
		}
	}
	for range 100 { // warm-up: the mailbox is loaded, fasthttp's buffers grow
		head()
	}
	allocs := testing.AllocsPerRun(1000, head)
	if failed != nil {
		t.Fatal(failed)
	}
	hdr := &c.ctx.Response.Header
	got := fmt.Sprintf("%s %s %s", hdr.Peek("X-Relay-First"), hdr.Peek("X-Relay-Last"), hdr.Peek("X-Relay-Count"))
	if want := fmt.Sprintf("1 %d %d", storedPerFixture, storedPerFixture); got != want {
		t.Fatalf("HEAD answered first, last, count %q, want %q", got, want)
	}
	if allocs != 0 {
		t.Errorf("%v allocations per HEAD of a direction, want 0", allocs)
	}
}

// The baseline must answer what ours answers, or the comparison measures
// two different things.
func TestDirectCallsAnswerAlike(t *testing.T) {
	f := newDirectFixture(t)
	for kind := range kindSlugs {
		uri := readURI(kind, 0, 1)
		for name, h := range map[string]*mailbox.Handler{"ours": f.ours, "ours uncached": f.uncached} {
			c := newOurCall(h, kind, uri)
			if err := c.do(); err != nil {
				t.Errorf("%s, %s: %v", name, kindNames[kind], err)
			}
			if kind == kindGet && string(c.ctx.Response.Body()) != string(envelope(nil, 1, 1024)) {
				t.Errorf("%s, %s: other bytes", name, kindNames[kind])
			}
		}
		if err := baselineDirectOp(f.baseline, kind, uri)(); err != nil {
			t.Errorf("baseline, %s: %v", kindNames[kind], err)
		}
	}
}
