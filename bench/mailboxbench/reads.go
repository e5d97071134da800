package mailboxbench

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"runtime"
	"strconv"
	"time"

	"github.com/valyala/fasthttp"

	"edgerelay/bench/abtest"
	"edgerelay/store"
)

// ReadOptions shape CompareReads. Zero fields take the defaults noted.
type ReadOptions struct {
	// Rounds per side; the first warms up and is not counted, so at
	// least 2. Default 6.
	Rounds int
	// RoundTime is how long one side answers one kind of request in one
	// round. Default 1 s.
	RoundTime time.Duration
	// Conns is the concurrent keep-alive connections, one request in
	// flight on each. Default 8.
	Conns int
	// Mailboxes is how many mailboxes the requests spread over, at least
	// one per connection (see readOp); Stored is the envelopes each one's
	// p2c direction holds, of EnvelopeSize bytes. Defaults 64, 100 and 1024.
	Mailboxes, Stored, EnvelopeSize int
	// DataDir holds the Pebble store both relays read; a temporary
	// directory (removed afterwards) when empty.
	DataDir string
	// Progress, when not nil, gets one line per measurement.
	Progress io.Writer
}

func (o ReadOptions) withDefaults() (ReadOptions, error) {
	if o.Rounds == 0 {
		o.Rounds = 6
	}
	if o.RoundTime == 0 {
		o.RoundTime = time.Second
	}
	if o.Conns == 0 {
		o.Conns = 8
	}
	if o.Mailboxes == 0 {
		o.Mailboxes = 64
	}
	if o.Stored == 0 {
		o.Stored = 100
	}
	if o.EnvelopeSize == 0 {
		o.EnvelopeSize = 1024
	}
	switch {
	case o.Rounds < 2:
		return o, fmt.Errorf("mailboxbench: Rounds %d: need at least 2 (the first is dropped)", o.Rounds)
	case o.Conns < 1 || o.Stored < 1:
		return o, errors.New("mailboxbench: Conns and Stored must be positive")
	case o.Mailboxes < o.Conns:
		return o, fmt.Errorf("mailboxbench: %d mailboxes for %d connections: each connection needs one of its own", o.Mailboxes, o.Conns)
	case o.EnvelopeSize < 25 || o.EnvelopeSize > 65536:
		return o, fmt.Errorf("mailboxbench: EnvelopeSize %d is not an envelope's (25 to 65,536 bytes)", o.EnvelopeSize)
	}
	return o, nil
}

// ReadFigure is one kind of request's outcome.
type ReadFigure struct {
	// Name says which request: "HEAD of a direction" or "GET of one envelope".
	Name string
	// Ours and Baseline hold the requests per second over loopback of
	// each counted round; the medians are theirs.
	Ours, Baseline             []float64
	OursMedian, BaselineMedian float64
	// Ratio is OursMedian / BaselineMedian; RoundRatio the median of the
	// per-round ratios.
	Ratio, RoundRatio float64
}

// ReadReport is the outcome of CompareReads.
type ReadReport struct {
	Options ReadOptions // defaults filled in
	Figures []ReadFigure
}

// The kinds of request, in the order of ReadReport.Figures.
const (
	kindHead         = iota // HEAD …/p2c
	kindGet                 // GET …/p2c/<seq>
	kindHeadEnvelope        // HEAD …/p2c/<seq>
	kindCount
)

var kindNames = [kindCount]string{"HEAD of a direction", "GET of one envelope", "HEAD of one envelope"}

// isHead reports whether a kind's requests are HEADs (no body answered).
func isHead(kind int) bool { return kind != kindGet }

// CompareReads measures HEAD of a direction, GET and HEAD of one envelope on our
// handler and on the net/http baseline, both serving the same Pebble store
// on loopback, driven by the same minimal client with Conns requests in
// flight.
//
// On a small machine the load generator and the kernel's loopback share
// the cores with the server, so this ratio understates the handlers' own
// difference; BenchmarkServeHTTP calls them directly for the other bound.
func CompareReads(ctx context.Context, o ReadOptions) (rep ReadReport, err error) {
	o, err = o.withDefaults()
	if err != nil {
		return ReadReport{}, err
	}
	dir := o.DataDir
	if dir == "" {
		if dir, err = os.MkdirTemp("", "mailboxbench-reads-"); err != nil {
			return ReadReport{}, err
		}
		defer func() { err = errors.Join(err, os.RemoveAll(dir)) }()
	}
	rig, err := newReadRig(dir, o)
	if err != nil {
		return ReadReport{}, err
	}
	defer func() { err = errors.Join(err, rig.close()) }()

	// One round runs every kind on one side, so each side's HEAD and GET
	// figures come from the same stretch of machine time.
	runs, err := abtest.Alternate(o.Rounds, 1, func(side, round int) ([kindCount]float64, error) {
		var rates [kindCount]float64
		for kind := range rates {
			runtime.GC()
			rate, err := load(ctx, o.RoundTime, o.Conns, func(w int) func() error { return rig.op(side, kind, w) })
			if err != nil {
				return rates, fmt.Errorf("mailboxbench: %s, round %d, %s: %w", kindNames[kind], round, rig.relays[side].name, err)
			}
			progress(o.Progress, round, fmt.Sprintf("%-19s %-8s", kindNames[kind], rig.relays[side].name), rate, "requests/s")
			rates[kind] = rate
		}
		return rates, nil
	})
	if err != nil {
		return ReadReport{}, err
	}
	rep.Options = o
	for kind := range kindCount {
		f := ReadFigure{Name: kindNames[kind]}
		for i := range runs[0] {
			f.Ours = append(f.Ours, runs[0][i][kind])
			f.Baseline = append(f.Baseline, runs[1][i][kind])
		}
		f.OursMedian, f.BaselineMedian = abtest.Median(f.Ours), abtest.Median(f.Baseline)
		f.Ratio = f.OursMedian / f.BaselineMedian
		f.RoundRatio = abtest.RoundRatio(f.Ours, f.Baseline)
		rep.Figures = append(rep.Figures, f)
	}
	return rep, nil
}

// readRig is the read comparison's set-up: one seeded store, both relays
// serving it on loopback, and Conns keep-alive connections to each.
type readRig struct {
	o      ReadOptions
	db     *store.DB
	relays [2]*relay // ours, baseline
	// Each relay keeps its connections for the rig's whole life, as the
	// clients of a busy relay keep theirs alive.
	conns [2][]*rawClient
}

func newReadRig(dir string, o ReadOptions) (rig *readRig, err error) {
	rig = &readRig{o: o}
	defer func() {
		if err != nil {
			err = errors.Join(err, rig.close())
		}
	}()
	if rig.db, err = store.Open(dir, nil); err != nil {
		return rig, err
	}
	log := store.NewEnvelopeLog(rig.db)
	clock := newStepClock()
	if err := seed(log, clock.Now, o.Mailboxes, o.Stored, o.EnvelopeSize); err != nil {
		return rig, err
	}
	if rig.relays[0], _, err = startOurs(loopback, log, clock.Now, 0); err != nil {
		return rig, err
	}
	if rig.relays[1], _, err = startBaseline(loopback, log, clock.Now); err != nil {
		return rig, err
	}
	if err := sameAnswers(rig.relays, o); err != nil {
		return rig, err
	}
	for side, r := range rig.relays {
		for range o.Conns {
			c, err := dialRaw(r.addr)
			if err != nil {
				return rig, err
			}
			rig.conns[side] = append(rig.conns[side], c)
		}
	}
	return rig, nil
}

func (r *readRig) close() error {
	var err error
	for _, cs := range r.conns {
		for _, c := range cs {
			err = errors.Join(err, c.close())
		}
	}
	for _, rl := range r.relays {
		if rl != nil {
			err = errors.Join(err, rl.close())
		}
	}
	if r.db != nil {
		err = errors.Join(err, r.db.Close())
	}
	return err
}

// op is connection w's next request of one kind to one side (0 ours, 1
// the baseline) over loopback.
func (r *readRig) op(side, kind, w int) func() error {
	return readOp(r.conns[side][w], r.relays[side].addr, kind, w, 1, r.o)
}

// readURI is the URI path of one request: HEAD of mailbox i's p2c
// direction, or GET or HEAD of its envelope seq.
func readURI(kind, i, seq int) string {
	p := mailboxPath(i) + "/p2c"
	if kind != kindHead {
		p += "/" + strconv.Itoa(seq)
	}
	return p
}

// readOp is one connection's loop body: the next HEAD or GET, checked.
//
// Connection w reads only the mailboxes w, w+Conns, w+2·Conns, …, so no
// two requests in flight share a mailbox. A request takes from its
// mailbox's rate-limit bucket with the time it read from the clock when it
// began; on a shared mailbox, one held up by the scheduler in between
// would find the bucket already advanced by later requests, each of which
// moved the step clock a second on, and be refused. A mailbox's own
// requests, one after the other, always find it refilled; pipelined
// requests are too, since a server answers one connection's requests in
// turn.
//
// With depth above 1 the op pipelines: it writes depth requests in one
// write and then reads their depth answers, as HTTP/1.1 allows (and as
// TechEmpower's plaintext test loads servers, 16 deep), so that the
// kernel's cost of a round trip is shared by depth requests and what is
// left is each server's own cost per request. One op is then depth
// requests.
//
// The requests are made in advance so that the client allocates nothing.
func readOp(c *rawClient, addr string, kind, w, depth int, o ReadOptions) func() error {
	method := "HEAD"
	if !isHead(kind) {
		method = "GET"
	}
	var reqs [][]byte
	for seq := 1; seq <= o.Stored; seq++ {
		for i := w; i < o.Mailboxes; i += o.Conns {
			reqs = append(reqs, rawRequest(method, addr, readURI(kind, i, seq)))
		}
		if kind == kindHead {
			break
		}
	}
	// batches[j] is requests j·depth … j·depth+depth-1, wrapping round.
	var batches [][]byte
	for first := 0; first < len(reqs); first += depth {
		var b []byte
		for k := range depth {
			b = append(b, reqs[(first+k)%len(reqs)]...)
		}
		batches = append(batches, b)
	}
	j := 0
	return func() error {
		batch := batches[j]
		j = (j + 1) % len(batches)
		if err := c.send(batch); err != nil {
			return err
		}
		for range depth {
			status, body, err := c.response(isHead(kind))
			switch {
			case err != nil:
				return err
			case status != 200:
				return fmt.Errorf("%.60s: %d %s", batch, status, body)
			case kind == kindGet && len(body) != o.EnvelopeSize:
				return fmt.Errorf("%.60s: %d bytes, want %d", batch, len(body), o.EnvelopeSize)
			}
		}
		return nil
	}
}

// sameAnswers checks that both relays answer each kind of read right, so
// that neither side is measured doing less than the spec asks.
func sameAnswers(relays [2]*relay, o ReadOptions) error {
	want := [kindCount]string{
		fmt.Sprintf("200 first=1 last=%d count=%d", o.Stored, o.Stored),
		fmt.Sprintf("200 type=application/octet-stream body=%x", envelope(nil, 1, o.EnvelopeSize)),
		"200 type=application/octet-stream body=",
	}
	for _, r := range relays {
		c := newClient(r.addr, 1)
		for kind := range kindCount {
			var req fasthttp.Request
			var resp fasthttp.Response
			req.SetRequestURI("http://" + c.Addr + readURI(kind, 0, 1))
			req.Header.Set("Authorization", "Bearer "+token)
			if isHead(kind) {
				req.Header.SetMethod(fasthttp.MethodHead)
			}
			if err := c.Do(&req, &resp); err != nil {
				return err
			}
			h := &resp.Header
			got := fmt.Sprintf("%d type=%s body=%x", resp.StatusCode(), h.ContentType(), resp.Body())
			if kind == kindHead {
				got = fmt.Sprintf("%d first=%s last=%s count=%s", resp.StatusCode(),
					h.Peek("X-Relay-First"), h.Peek("X-Relay-Last"), h.Peek("X-Relay-Count"))
			}
			if got != want[kind] {
				return fmt.Errorf("mailboxbench: %s on %s answered %.120s, want %.120s", kindNames[kind], r.name, got, want[kind])
			}
		}
		c.CloseIdleConnections()
	}
	return nil
}
