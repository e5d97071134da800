package clusterbench

import (
	"context"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"edgerelay/store"
	"edgerelay/store/cluster/clustertest"
	"edgerelay/store/cluster/mailboxjs"
	"edgerelay/store/mailboxlocal"
)

// envelopeSize is the payload of every write: 256 bytes, as in CLUSTER.md §8.
const envelopeSize = 256

const shards = 12

var unlimited = mailboxjs.Limits{MaxStored: 1 << 30, MaxStoredBytes: 1 << 40}

// benchLimits are the store.Mailboxes limits of the measured writes: the
// spec's idle time, the stored bounds and the envelope bucket lifted so
// that rounds of writes into one direction never fill or drain it (the
// checks still run on every write, in the head or in memory).
var benchLimits = store.MailboxLimits{
	Idle: 720 * time.Hour, MaxStored: 1 << 30, MaxStoredBytes: 1 << 40,
	EnvelopeBurst: 1 << 30, EnvelopeEvery: time.Nanosecond,
}.WithDefaults()

func envelope(seq uint64) []byte {
	e := make([]byte, envelopeSize)
	e[0] = 1
	binary.BigEndian.PutUint64(e[1:], seq)
	return e
}

// bench is one cluster shared by the sub-benchmarks (starting one takes
// seconds).
type bench struct {
	nodes  *clustertest.Nodes
	stores []*mailboxjs.Store
	// mbs are the nodes' store.Mailboxes (what the mailbox handler
	// calls), local the single node's over Pebble in the same process.
	mbs    []store.Mailboxes
	local  store.Mailboxes
	runs   atomic.Int64 // makes every sub-benchmark run's mailboxes new
	filled bool         // the reads' direction is written (fillForReads)
}

// BenchmarkCluster runs every figure on one cluster: our PUT beside raw
// publishes for 1 and 64 writers, the ADR-50 batch model of the same PUT,
// watch delivery latency across nodes beside raw JetStream's RePublish of
// the same bytes, then the reads.
//
// A -bench pattern picks cases and rounds: a repeated case is named with
// go test's "#NN" suffix, one per round after the first, so
// `-bench '^BenchmarkCluster$/^(raw|put|watch)$/^(writers=\d+|ours|raw)(#0[1])?$'`
// runs two rounds of PUT, raw and watch and skips the batch model and the
// reads (whose fill is then never written). make bench does that
// (bench/cmd/benchreport/mailboxcluster.go).
func BenchmarkCluster(b *testing.B) {
	nodes := clustertest.Start(b, 3)
	bc := &bench{nodes: nodes}
	for i := range 3 {
		s, err := mailboxjs.Open(clustertest.Context(b), nodes.Node(i), mailboxjs.Config{Shards: shards})
		if err != nil {
			b.Fatal(err)
		}
		bc.stores = append(bc.stores, s)
		m, err := mailboxjs.NewMailboxes(clustertest.Context(b), s, benchLimits, nil)
		if err != nil {
			b.Fatal(err)
		}
		b.Cleanup(func() { _ = m.Close() })
		bc.mbs = append(bc.mbs, m)
	}
	db, err := store.Open(b.TempDir(), nil)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _ = db.Close() })
	if bc.local, err = mailboxlocal.New(mailboxlocal.Config{Log: store.NewEnvelopeLog(db), Limits: benchLimits}); err != nil {
		b.Fatal(err)
	}
	// Rounds alternate the cases, so that a neighbour's load on a shared
	// box falls on all of them alike; compare medians (benchstat).
	for range rounds {
		for _, w := range []int{1, 64} {
			b.Run(fmt.Sprintf("raw/writers=%d", w), func(b *testing.B) { bc.run(b, w, bc.raw) })
			b.Run(fmt.Sprintf("put/writers=%d", w), func(b *testing.B) { bc.run(b, w, bc.put) })
			b.Run(fmt.Sprintf("pebble/writers=%d", w), func(b *testing.B) { bc.run(b, w, bc.put) })
			b.Run(fmt.Sprintf("batch-model/writers=%d", w), func(b *testing.B) { bc.run(b, w, bc.batchModel) })
		}
		b.Run("watch/ours", func(b *testing.B) { bc.watchLatency(b, bc.mbs[0], bc.mbs[2]) })
		b.Run("watch/raw", bc.watchRaw)
		b.Run("watch/pebble", func(b *testing.B) { bc.watchLatency(b, bc.local, bc.local) })
	}
	// Reads, once: GET by seq (binary search over the direction) and a
	// fetch of 100 (a Direct Get batch), on a direction of 1,000
	// envelopes written between 8 other writers' envelopes (written by
	// the first of them that runs).
	b.Run("get-by-seq", bc.getBySeq)
	b.Run("fetch-100", bc.fetch100)
}

// rounds of every case in one run.
const rounds = 5

func (bc *bench) claim(b *testing.B, node int, name string) {
	if _, err := bc.stores[node].Claim(context.Background(), name, store.Hash{1}, time.Now().UnixNano(), time.Hour, 720*time.Hour); err != nil {
		b.Fatal(err)
	}
}

// writer is one writer's state: its mailbox and what it needs between ops.
type writer struct {
	node    int
	name    string        // <app>/<id> of its mailbox
	h       store.Mailbox // put and pebble: the handle the handler would hold
	shard   int           // of name, found from the store's first write
	seq     uint64
	headRev uint64 // batch model: the revision its head CAS expects
	msg     *nats.Msg
}

// op performs one write of w.
type op func(ctx context.Context, w *writer) error

// run measures writers concurrent writers, each on its own direction,
// spread over the three nodes as an L4 balancer would spread clients (the
// pebble case: on the single node's store, the sub-benchmark's name says
// which).
func (bc *bench) run(b *testing.B, writers int, do op) {
	pebble := strings.Contains(b.Name(), "/pebble/")
	run := bc.runs.Add(1)
	ws := make([]*writer, writers)
	// The claims and first writes (not timed) place the mailboxes, all
	// writers at once: one after the other they would take longer than a
	// short -benchtime's measured part (each of b.N's ramp-up runs places
	// its own).
	var setup sync.WaitGroup
	for i := range ws {
		ws[i] = &writer{node: i % 3, name: fmt.Sprintf("bench/r%dw%d-mailbox00000000", run, i), seq: 1}
		ws[i].shard = shardOf(b, bc.stores[0], ws[i].name)
		setup.Go(func() {
			w := ws[i]
			mbs := bc.mbs[w.node]
			if pebble {
				mbs = bc.local
			}
			ctx, now := context.Background(), time.Now().UnixNano()
			if _, err := mbs.Claim(ctx, []byte(w.name), store.Hash{1}, now); err != nil {
				b.Error(err)
				return
			}
			h, err := mbs.Open(ctx, []byte(w.name), store.Hash{1}, now)
			if err != nil {
				b.Error(err)
				return
			}
			w.h = h
			if _, err := h.Put(ctx, 'p', 1, envelope(1), false, now); err != nil {
				b.Error(err)
			}
		})
	}
	setup.Wait()
	defer func() {
		for _, w := range ws {
			if w.h != nil {
				w.h.Release()
			}
		}
	}()
	if b.Failed() {
		return
	}
	lat := make([][]time.Duration, writers)
	per := (b.N + writers - 1) / writers
	b.ReportAllocs()
	b.ResetTimer()
	start := time.Now()
	var wg sync.WaitGroup
	for i, w := range ws {
		lat[i] = make([]time.Duration, 0, per)
		wg.Go(func() {
			for range per {
				t0 := time.Now()
				ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
				err := do(ctx, w)
				cancel()
				if err != nil {
					b.Error(err)
					return
				}
				lat[i] = append(lat[i], time.Since(t0))
			}
		})
	}
	wg.Wait()
	elapsed := time.Since(start)
	b.StopTimer()
	all := slices.Concat(lat...)
	slices.Sort(all)
	if len(all) == 0 {
		return
	}
	b.ReportMetric(float64(len(all))/elapsed.Seconds(), "ops/s")
	b.ReportMetric(float64(all[len(all)/2].Microseconds())/1000, "p50-ms")
	b.ReportMetric(float64(all[len(all)*99/100].Microseconds())/1000, "p99-ms")
}

func shardOf(b *testing.B, s *mailboxjs.Store, name string) int {
	k, err := s.Shard(name)
	if err != nil {
		b.Fatal(err)
	}
	return k
}

func cutName(name string) (string, string, bool) {
	for i := range name {
		if name[i] == '/' {
			return name[:i], name[i+1:], true
		}
	}
	return name, "", false
}

// put is our PUT through store.Mailboxes, as the mailbox handler makes it
// (the cluster's or, in the pebble case, the single node's).
func (bc *bench) put(ctx context.Context, w *writer) error {
	w.seq++
	r, err := w.h.Put(ctx, 'p', w.seq, envelope(w.seq), false, time.Now().UnixNano())
	if err == nil && r.Outcome != store.PutCreated {
		err = fmt.Errorf("put %d: %v", w.seq, r.Outcome)
	}
	return err
}

// raw is the floor: a plain publish of the same bytes to the same shard
// stream, waiting for its ack, no headers, no compare-and-set. Its subject
// matches the stream's RePublish like an envelope's, so the servers do
// the same work per message apart from what the layout adds.
func (bc *bench) raw(ctx context.Context, w *writer) error {
	w.seq++
	app, id, _ := cutName(w.name)
	_, err := bc.nodes.Node(w.node).JetStream().Publish(ctx, fmt.Sprintf("mbx.%d.%s.%s.raw.e", w.shard, app, id), envelope(w.seq))
	return err
}

// batchModel is the alternative layout: an ADR-50 atomic batch of the
// envelope on its direction subject and the head on its own subject,
// rolled up, with a compare-and-set on the head (CLUSTER.md §4.1 step 4).
// nats.go has no client API for batches: raw headers, the commit through
// RequestMsg.
func (bc *bench) batchModel(ctx context.Context, w *writer) error {
	w.seq++
	app, id, _ := cutName(w.name)
	base := fmt.Sprintf("mbx.%d.%s.%s.bm", w.shard, app, id)
	nc := bc.nodes.Node(w.node).Conn()
	for round := 0; ; round++ {
		// A head write whose predecessor the leader has acknowledged but
		// not yet applied is refused (10164, "wrong last sequence"):
		// retried as Put retries its compare-and-set.
		err := bc.batchOnce(ctx, nc, w, base, round)
		if err == nil || !strings.Contains(err.Error(), "wrong last sequence") || round == 16 {
			return err
		}
		time.Sleep(time.Duration(round+1) * 100 * time.Microsecond)
	}
}

func (bc *bench) batchOnce(ctx context.Context, nc *nats.Conn, w *writer, base string, round int) error {
	_, id, _ := cutName(w.name)
	batch := fmt.Sprintf("%s-%d-%d", id, w.seq, round) // unique per writer and try (at most 64 bytes)
	env := nats.NewMsg(base + ".e")
	env.Data = envelope(w.seq)
	env.Header.Set("Nats-Batch-Id", batch)
	env.Header.Set("Nats-Batch-Sequence", "1")
	if err := nc.PublishMsg(env); err != nil {
		return err
	}
	head := nats.NewMsg(base + ".h")
	head.Data = []byte("AQoKgBAA2K7o5eOb_hjYruj_lLKm2hsBAQMBAgMBAQA") // a head's size
	head.Header.Set("Nats-Batch-Id", batch)
	head.Header.Set("Nats-Batch-Sequence", "2")
	head.Header.Set("Nats-Batch-Commit", "1")
	head.Header.Set("Nats-Rollup", "sub")
	head.Header.Set("Nats-Expected-Last-Subject-Sequence", strconv.FormatUint(w.headRev, 10))
	resp, err := nc.RequestMsgWithContext(ctx, head)
	if err != nil {
		return err
	}
	var ack struct {
		Seq   uint64 `json:"seq"`
		Error *struct {
			Desc string `json:"description"`
		} `json:"error"`
	}
	if err := json.Unmarshal(resp.Data, &ack); err != nil {
		return err
	}
	if ack.Error != nil {
		return fmt.Errorf("batch: %s", ack.Error.Desc)
	}
	w.headRev = ack.Seq
	return nil
}

// watchLatency: a write through from (node 0), its delivery to a watcher
// on to (node 2; the pebble case: the same single node), one write at a
// time; the time from the start of the Put to Deliver.
func (bc *bench) watchLatency(b *testing.B, from, to store.Mailboxes) {
	name := []byte(fmt.Sprintf("bench/watch%d-mailbox0000000", bc.runs.Add(1)))
	ctx, now := context.Background(), time.Now().UnixNano()
	if _, err := from.Claim(ctx, name, store.Hash{1}, now); err != nil {
		b.Fatal(err)
	}
	writer, err := from.Open(ctx, name, store.Hash{1}, now)
	if err != nil {
		b.Fatal(err)
	}
	defer writer.Release()
	reader, err := to.Open(ctx, name, store.Hash{1}, now)
	if err != nil {
		b.Fatal(err)
	}
	defer reader.Release()
	var mu sync.Mutex
	sent := make(map[uint64]time.Time)
	got := make(chan time.Duration, 1)
	stop, err := reader.Watch(ctx, 'p', store.WatchConfig{
		Deliver: func(_ context.Context, env []byte, _ bool) error {
			mu.Lock()
			t0 := sent[envelopeSeqOf(env)]
			mu.Unlock()
			got <- time.Since(t0)
			return nil
		},
		End: func(err error) { b.Errorf("watch ended: %v", err) },
	})
	if err != nil {
		b.Fatal(err)
	}
	defer stop()
	lat := make([]time.Duration, 0, b.N)
	b.ReportAllocs()
	b.ResetTimer()
	for i := range b.N {
		seq := uint64(i + 1)
		mu.Lock()
		sent[seq] = time.Now()
		mu.Unlock()
		if _, err := writer.Put(ctx, 'p', seq, envelope(seq), false, time.Now().UnixNano()); err != nil {
			b.Fatal(err)
		}
		select {
		case d := <-got:
			lat = append(lat, d)
		case <-time.After(10 * time.Second):
			b.Fatalf("envelope %d not delivered", seq)
		}
	}
	b.StopTimer()
	slices.Sort(lat)
	b.ReportMetric(float64(lat[len(lat)/2].Microseconds())/1000, "p50-ms")
	b.ReportMetric(float64(lat[len(lat)*99/100].Microseconds())/1000, "p99-ms")
}

// watchRaw is watchLatency's floor: a raw publish of the same bytes
// through node 0 to the same shard stream (as raw does), received on node
// 2 from the stream's RePublish by a plain subscription: what JetStream
// itself takes from a write to its delivery on another node, without the
// mailbox's compare-and-set, head header or Watch's ordering.
func (bc *bench) watchRaw(b *testing.B) {
	name := fmt.Sprintf("bench/rawwatch%d-mailbox000000", bc.runs.Add(1))
	app, id, _ := cutName(name)
	subject := fmt.Sprintf("mbx.%d.%s.%s.raw.e", shardOf(b, bc.stores[0], name), app, id)
	var mu sync.Mutex
	var t0 time.Time
	got := make(chan time.Duration, 1)
	nc := bc.nodes.Node(2).Conn()
	sub, err := nc.Subscribe(fmt.Sprintf("er.w.%s.%s.raw.>", app, id), func(*nats.Msg) {
		mu.Lock()
		d := time.Since(t0)
		mu.Unlock()
		select {
		case got <- d:
		default: // a warm-up publish's late copy
		}
	})
	if err != nil {
		b.Fatal(err)
	}
	defer sub.Unsubscribe()
	if err := nc.Flush(); err != nil {
		b.Fatal(err)
	}
	js := bc.nodes.Node(0).JetStream()
	// The subscription's interest reaches the stream leader's server over
	// the routes after the flush: publish until one arrives, untimed.
	for deadline := time.Now().Add(10 * time.Second); ; {
		if _, err := js.Publish(context.Background(), subject, envelope(0)); err != nil {
			b.Fatal(err)
		}
		select {
		case <-got:
		case <-time.After(50 * time.Millisecond):
			if time.Now().After(deadline) {
				b.Fatal("no republished message on node 2 in 10 s")
			}
			continue
		}
		break
	}
	lat := make([]time.Duration, 0, b.N)
	b.ReportAllocs()
	b.ResetTimer()
	for i := range b.N {
		mu.Lock()
		t0 = time.Now()
		mu.Unlock()
		if _, err := js.Publish(context.Background(), subject, envelope(uint64(i+1))); err != nil {
			b.Fatal(err)
		}
		select {
		case d := <-got:
			lat = append(lat, d)
		case <-time.After(10 * time.Second):
			b.Fatalf("message %d not republished to node 2", i+1)
		}
	}
	b.StopTimer()
	reportLatency(b, lat)
}

const readName, readEnvelopes = "bench/reads-mailbox00000000", 1000

// fillForReads writes readEnvelopes to one direction while 8 writers
// write their own directions on the same nodes, so that the direction's
// envelopes are spread over its shard stream as on a busy node.
func (bc *bench) fillForReads(b *testing.B) {
	if bc.filled {
		return
	}
	bc.filled = true
	bc.claim(b, 0, readName)
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for w := range 8 {
		other := fmt.Sprintf("bench/readsnoise%d-mailbox000", w)
		bc.claim(b, w%3, other)
		wg.Go(func() {
			for seq := uint64(1); ; seq++ {
				select {
				case <-stop:
					return
				default:
				}
				if _, err := bc.stores[w%3].Put(context.Background(), other, 'p', seq, envelope(seq), unlimited, time.Now().UnixNano()); err != nil {
					b.Error(err)
					return
				}
			}
		})
	}
	for seq := uint64(1); seq <= readEnvelopes; seq++ {
		if _, err := bc.stores[0].Put(context.Background(), readName, 'p', seq, envelope(seq), unlimited, time.Now().UnixNano()); err != nil {
			b.Fatal(err)
		}
	}
	close(stop)
	wg.Wait()
}

func (bc *bench) getBySeq(b *testing.B) {
	bc.fillForReads(b)
	lat := make([]time.Duration, 0, b.N)
	b.ReportAllocs()
	b.ResetTimer()
	for i := range b.N {
		seq := uint64(i*7919%readEnvelopes + 1)
		t0 := time.Now()
		env, ok, err := bc.stores[2].Envelope(context.Background(), readName, 'p', seq)
		if err != nil || !ok || envelopeSeqOf(env) != seq {
			b.Fatalf("envelope %d: %v %v", seq, ok, err)
		}
		lat = append(lat, time.Since(t0))
	}
	b.StopTimer()
	reportLatency(b, lat)
}

func (bc *bench) fetch100(b *testing.B) {
	bc.fillForReads(b)
	lat := make([]time.Duration, 0, b.N)
	b.ReportAllocs()
	b.ResetTimer()
	for i := range b.N {
		after := uint64(i * 7919 % (readEnvelopes - 100))
		n := 0
		t0 := time.Now()
		err := bc.stores[1].Scan(context.Background(), readName, 'p', after, 100*(envelopeSize+4), func(seq uint64, env []byte) bool {
			n++
			return n < 100
		})
		if err != nil || n != 100 {
			b.Fatalf("fetch after %d: %d envelopes, %v", after, n, err)
		}
		lat = append(lat, time.Since(t0))
	}
	b.StopTimer()
	reportLatency(b, lat)
}

func envelopeSeqOf(env []byte) uint64 { return binary.BigEndian.Uint64(env[1:9]) }

func reportLatency(b *testing.B, lat []time.Duration) {
	slices.Sort(lat)
	b.ReportMetric(float64(lat[len(lat)/2].Microseconds())/1000, "p50-ms")
	b.ReportMetric(float64(lat[len(lat)*99/100].Microseconds())/1000, "p99-ms")
}
