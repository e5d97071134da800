package main

import (
	"bytes"
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"hash/fnv"
	"math/rand/v2"
	"net/http"
	"path"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"edgerelay/sdk/link"
	sdkmailbox "edgerelay/sdk/mailbox"
)

// The mailbox in cluster mode under faults (issue 15, "Faults"): nodes
// killed with SIGKILL while writers and watchers keep going through
// HAProxy, as clients we did not write would: a write is retried until it
// is acknowledged (through 503s, waiting Retry-After, and through
// connections cut by a dying node), a watch reconnects with after = the
// last envelope it holds. `make soak` runs them soakScale times longer.

// putOutcome is one answer (or none: status 0) a writer got.
type putOutcome struct {
	at     time.Time
	status int
	retry  string // Retry-After
}

// putLog is every outcome of a test's writers.
type putLog struct {
	mu  sync.Mutex
	all []putOutcome
}

func (l *putLog) add(o putOutcome) {
	l.mu.Lock()
	l.all = append(l.all, o)
	l.mu.Unlock()
}

// sorted is the log by time.
func (l *putLog) sorted() []putOutcome {
	l.mu.Lock()
	defer l.mu.Unlock()
	out := slices.Clone(l.all)
	slices.SortFunc(out, func(a, b putOutcome) int { return a.at.Compare(b.at) })
	return out
}

// retryAfter is a Retry-After in whole seconds as a pause (at least 1 s:
// the spec's floor).
func retryAfter(v string) time.Duration {
	s, err := strconv.Atoi(v)
	if err != nil || s < 1 {
		s = 1
	}
	return time.Duration(s) * time.Second
}

// putAcked writes envelopes 1, 2, 3 … of w's p2c through base, one at a
// time, each retried with the same bytes until the relay acknowledges it
// (201, or 200: it was stored by a try whose answer was lost), until stop
// closes; the envelope in hand when it does is still written to the end.
// Anything but 201, 200, 429 and 503 with Retry-After is a contract
// violation, returned.
func putAcked(w *envelopeWriter, base string, pace time.Duration, log *putLog, stop <-chan struct{}) error {
	for {
		select {
		case <-stop:
			return nil
		default:
		}
		seq := w.next + 1
		e := sealedLike(seq, w.index, 0)
		url := fmt.Sprintf("%s%s/p2c/%d", base, mailboxPath(w.index), seq)
		deadline := time.Now().Add(90 * time.Second)
		for {
			if time.Now().After(deadline) {
				return fmt.Errorf("writer %d: seq %d not acknowledged within 90 s", w.index, seq)
			}
			a, err := request(freshClient(nil), "PUT", url, w.token, e)
			o := putOutcome{at: time.Now()}
			if err == nil {
				o.status, o.retry = a.code, a.header.Get("Retry-After")
			}
			log.add(o)
			if err != nil { // no answer: a node died with it; stored or not, the retry says
				time.Sleep(50 * time.Millisecond)
				continue
			}
			if a.code == 201 || a.code == 200 {
				w.mu.Lock()
				w.acked[seq] = e
				w.mu.Unlock()
				w.next = seq
				w.count.Add(1)
				break
			}
			if (a.code == 503 || a.code == 429) && o.retry != "" {
				time.Sleep(retryAfter(o.retry))
				continue
			}
			return fmt.Errorf("writer %d: PUT p2c/%d: %d %s (Retry-After %q)", w.index, seq, a.code, a.body, o.retry)
		}
		time.Sleep(pace)
	}
}

// chaosWatcher watches one writer's direction through origin and
// reconnects, as a client does, with after = the last envelope it holds.
// Each envelope must arrive once, in order: as the writer writes 1, 2, 3
// … and never moves on before an acknowledgement, what a socket receives
// is exactly after+1, after+2, … byte for byte.
type chaosWatcher struct {
	w        *envelopeWriter
	mu       sync.Mutex
	last     uint64
	sockets  int
	closes   map[int]int // close code (0: the connection dropped) -> times
	refusals map[int]int // status of a refused reconnection -> times
	problems []string
}

func newChaosWatcher(w *envelopeWriter) *chaosWatcher {
	return &chaosWatcher{w: w, closes: map[int]int{}, refusals: map[int]int{}}
}

func (cw *chaosWatcher) held() uint64 {
	cw.mu.Lock()
	defer cw.mu.Unlock()
	return cw.last
}

// run watches until stop closes.
func (cw *chaosWatcher) run(origin string, stop <-chan struct{}) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go func() { <-stop; cancel() }()
	mb := (&sdkmailbox.Client{BaseURL: origin, App: "notes", HTTP: freshClient(nil)}).Mailbox(path.Base(mailboxPath(cw.w.index)), cw.w.token)
	for ctx.Err() == nil {
		dial, done := context.WithTimeout(ctx, 10*time.Second)
		watch, err := mb.Watch(dial, link.P2C, cw.held(), false)
		done()
		if err != nil {
			pause := 200 * time.Millisecond
			var e *sdkmailbox.Error
			if errors.As(err, &e) {
				cw.mu.Lock()
				cw.refusals[e.Status]++
				cw.mu.Unlock()
				if e.RetryAfter > 0 {
					pause = e.RetryAfter
				}
			}
			select {
			case <-ctx.Done():
			case <-time.After(pause):
			}
			continue
		}
		cw.mu.Lock()
		cw.sockets++
		cw.mu.Unlock()
		for {
			env, err := watch.Next(ctx)
			if err != nil {
				if ctx.Err() == nil {
					code, _ := sdkmailbox.CloseCode(err)
					cw.mu.Lock()
					cw.closes[code]++
					cw.mu.Unlock()
				}
				break
			}
			cw.mu.Lock()
			want := cw.last + 1
			seq := uint64(0)
			if len(env) >= 9 {
				seq = binary.BigEndian.Uint64(env[1:9])
			}
			switch {
			case seq != want:
				cw.problems = append(cw.problems, fmt.Sprintf("socket %d (after %d) received %d, want %d", cw.sockets, cw.last, seq, want))
			case !bytes.Equal(env, sealedLike(seq, cw.w.index, 0)):
				cw.problems = append(cw.problems, fmt.Sprintf("envelope %d differs from the one written", seq))
			}
			cw.last = max(cw.last, seq)
			cw.mu.Unlock()
		}
		_ = watch.Close()
	}
}

// caughtUp waits until every watcher holds its writer's last acknowledged
// envelope, then fails on anything a watcher received out of turn.
func caughtUp(t *testing.T, watchers []*chaosWatcher, within time.Duration) {
	t.Helper()
	deadline := time.Now().Add(within)
	for _, cw := range watchers {
		for cw.held() < cw.w.next {
			if time.Now().After(deadline) {
				t.Fatalf("writer %d's watcher holds %d of %d acknowledged envelopes %s after the writes ended (sockets %d, closes %v, refusals %v)",
					cw.w.index, cw.held(), cw.w.next, within, cw.sockets, cw.closes, cw.refusals)
			}
			time.Sleep(20 * time.Millisecond)
		}
		cw.mu.Lock()
		problems := slices.Clone(cw.problems)
		cw.mu.Unlock()
		if len(problems) > 0 {
			t.Fatalf("writer %d's watcher: %s", cw.w.index, strings.Join(problems, "; "))
		}
	}
}

// allHeld reads every writer's direction back through every node: each
// holds exactly what was acknowledged, byte for byte.
func allHeld(t *testing.T, c *relayCluster, writers []*envelopeWriter) {
	t.Helper()
	for i, n := range c.nodes {
		for _, w := range writers {
			stored := w.stored(t, n.origin("mailbox"))
			w.checkHeld(t, stored, w.acked, fmt.Sprintf("acknowledged (read through node %d)", i))
			if len(stored) != len(w.acked) {
				t.Fatalf("writer %d: node %d holds %d envelopes, %d were acknowledged (the writer never moves on unacknowledged)", w.index, i, len(stored), len(w.acked))
			}
		}
	}
}

// progressed waits until every writer has n more acknowledged writes than
// in from.
func progressed(t *testing.T, writers []*envelopeWriter, from []int64, n int64, within time.Duration, what string) {
	t.Helper()
	deadline := time.Now().Add(within)
	for i, w := range writers {
		for w.count.Load() < from[i]+n {
			if time.Now().After(deadline) {
				t.Fatalf("%s: writer %d made %d acknowledged writes in %s, want %d", what, w.index, w.count.Load()-from[i], within, n)
			}
			time.Sleep(20 * time.Millisecond)
		}
	}
}

func counts(writers []*envelopeWriter) []int64 {
	out := make([]int64, len(writers))
	for i, w := range writers {
		out[i] = w.count.Load()
	}
	return out
}

// claimRacer is one of two clients claiming one mailbox id with their own
// tokens through the balancer, retrying what a client retries.
type claimRacer struct {
	id, token string
	answers   []int // every final or refused answer, in order (0: none)
}

// race claims until the relay answers for good: 201, 204 (a retry of a
// claim whose 201 was lost) or 409.
func (r *claimRacer) race(base string, deadline time.Time) {
	url := base + "/v1/notes/mailbox/" + r.id
	for time.Now().Before(deadline) {
		a, err := request(freshClient(nil), "PUT", url, r.token, nil)
		if err != nil {
			r.answers = append(r.answers, 0)
			time.Sleep(50 * time.Millisecond)
			continue
		}
		r.answers = append(r.answers, a.code)
		switch a.code {
		case 201, 204, 409:
			return
		case 503, 429:
			time.Sleep(retryAfter(a.header.Get("Retry-After")))
		default:
			return // judged after the healing
		}
	}
}

func (r *claimRacer) final() int {
	if len(r.answers) == 0 {
		return -1
	}
	return r.answers[len(r.answers)-1]
}

// holds reports whether r's token holds the id, asked through origin with
// a heartbeat claim (204 for the holder, 409 for anyone else).
func (r *claimRacer) holds(t *testing.T, origin string) bool {
	t.Helper()
	a, err := request(freshClient(nil), "PUT", origin+"/v1/notes/mailbox/"+r.id, r.token, nil)
	if err != nil {
		t.Fatal(err)
	}
	switch a.code {
	case 204:
		return true
	case 409:
		return false
	}
	t.Fatalf("heartbeat claim of %s through %s: %d %s", r.id, origin, a.code, a.body)
	return false
}

// TestSIGKILLClusterMailboxRandomNodes: three nodes behind HAProxy, 64
// writers each streaming acknowledged PUTs into its own mailbox, a watcher
// on half of them reconnecting through the balancer, and pairs of clients
// racing for fresh mailbox ids, while a random node is killed with SIGKILL
// and restarted, again and again. Between the kills every writer goes on,
// with a node down and with it back. After the healing every acknowledged
// envelope reads back byte for byte through every node, every watcher
// received each envelope once and in order (across its reconnections),
// and no mailbox id was claimed by two tokens.
func TestSIGKILLClusterMailboxRandomNodes(t *testing.T) {
	c := startRelayCluster(t, 3, []string{"mailbox"}, "RELAY_APPS=notes")
	lb := startHAProxy(t, c, "mailbox")
	base := "http://" + lb.addrs["mailbox"]
	writers := make([]*envelopeWriter, 64)
	for i := range writers {
		writers[i] = newEnvelopeWriter(t, base, 5000+i)
	}
	stop := make(chan struct{})
	var log putLog
	errs := make(chan error, len(writers))
	var wg sync.WaitGroup
	for _, w := range writers {
		wg.Go(func() {
			if err := putAcked(w, base, 100*time.Millisecond, &log, stop); err != nil {
				errs <- err
			}
		})
	}
	var watchers []*chaosWatcher
	stopWatch := make(chan struct{})
	var watchWG sync.WaitGroup
	for i := 0; i < len(writers); i += 2 {
		cw := newChaosWatcher(writers[i])
		watchers = append(watchers, cw)
		watchWG.Go(func() { cw.run(base, stopWatch) })
	}
	defer func() { close(stopWatch); watchWG.Wait() }()
	// Racing claims for fresh ids, spread over the kills.
	racers := make([][2]*claimRacer, 12*soakScale(t))
	var raceWG sync.WaitGroup
	raceStop := make(chan struct{})
	raceWG.Go(func() {
		for i := range racers {
			id := newClusterLink(t, "notes").id
			for j := range racers[i] {
				racers[i][j] = &claimRacer{id: id, token: newClusterLink(t, "notes").token}
				r := racers[i][j]
				raceWG.Go(func() { r.race(base, time.Now().Add(60*time.Second)) })
			}
			select {
			case <-raceStop:
				return
			case <-time.After(time.Second):
			}
		}
	})

	progressed(t, writers, make([]int64, len(writers)), 3, 30*time.Second, "before the first kill")
	cycles := 3 * soakScale(t)
	for cycle := range cycles {
		i := rand.IntN(3)
		c.nodes[i].kill()
		progressed(t, writers, counts(writers), 2, 40*time.Second, fmt.Sprintf("cycle %d, node %d down", cycle, i))
		c.nodes[i].start()
		waitReadyz(t, c.nodes[i], http.StatusOK, 30*time.Second)
		progressed(t, writers, counts(writers), 2, 40*time.Second, fmt.Sprintf("cycle %d, node %d back", cycle, i))
		t.Logf("cycle %d: node %d killed with SIGKILL, writes went on, restarted", cycle, i)
	}
	close(stop)
	close(raceStop)
	wg.Wait()
	raceWG.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	for _, n := range c.nodes {
		waitReadyz(t, n, http.StatusOK, 30*time.Second)
	}

	var acked, noAnswer, refused int
	for _, o := range log.sorted() {
		switch o.status {
		case 201, 200:
			acked++
		case 0:
			noAnswer++
		case 503:
			refused++
		}
	}
	caughtUp(t, watchers, 30*time.Second)
	allHeld(t, c, writers)
	sockets := 0
	closes := map[int]int{}
	for _, cw := range watchers {
		sockets += cw.sockets
		for code, n := range cw.closes {
			closes[code] += n
		}
	}
	t.Logf("%d cycles: %d acknowledged PUTs by %d writers (%d answered 503, %d unanswered), read back through 3 nodes; %d watchers over %d sockets (closes by code %v) each got every envelope once",
		cycles, acked, len(writers), refused, noAnswer, len(watchers), sockets, closes)

	for i, pair := range racers {
		if pair[0] == nil {
			continue // not started: the kills were over
		}
		created, holders := 0, 0
		for _, r := range pair {
			switch r.final() {
			case 201, 204, 409:
			default:
				t.Fatalf("racing claim %d: answers %v, want 201, 204 or 409 at the end", i, r.answers)
			}
			for _, a := range r.answers {
				if a == 201 {
					created++
				}
			}
			on := c.nodes[rand.IntN(3)].origin("mailbox")
			holds := r.holds(t, on)
			for _, n := range c.nodes {
				if r.holds(t, n.origin("mailbox")) != holds {
					t.Fatalf("racing claim %d: nodes disagree on who holds it", i)
				}
			}
			if holds {
				holders++
			}
			if got := r.final(); (got == 409) == holds {
				t.Fatalf("racing claim %d: a racer answered %v holds it: %v", i, r.answers, holds)
			}
		}
		if created > 1 || holders != 1 {
			t.Fatalf("racing claim %d: %d answers 201, %d holders (answers %v and %v), want at most one 201 and one holder", i, created, holders, pair[0].answers, pair[1].answers)
		}
	}
}

// shardOf is the shard of a mailbox name (<app>/<id>) as
// docs/cluster-mailbox.md says: FNV-1a mod the number of shard streams.
func shardOf(name string, shards int) uint32 {
	h := fnv.New32a()
	_, _ = h.Write([]byte(name))
	return h.Sum32() % uint32(shards)
}

// mailboxShard is the ER_MBX_<k> stream of a mailbox. It checks that the
// mailbox's claim record is there, so that a change of the layout fails
// here rather than making a test kill the wrong leader.
func mailboxShard(t *testing.T, natsAddr, app, id string) string {
	t.Helper()
	k := shardOf(app+"/"+id, shardCount(t, natsAddr))
	stream := fmt.Sprintf("ER_MBX_%d", k)
	js := natsJetStream(t, natsAddr)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	s, err := js.Stream(ctx, stream)
	if err != nil {
		t.Fatalf("stream %s: %v", stream, err)
	}
	if _, err := s.GetLastMsgForSubject(ctx, fmt.Sprintf("mbx.%d.%s.%s.c", k, app, id)); err != nil {
		t.Fatalf("the claim of %s/%s is not in %s: %v", app, id, stream, err)
	}
	return stream
}

// TestSIGKILLClusterMailboxStreamLeader: the node leading the shard stream
// of eight mailboxes is killed with SIGKILL while their writers go on
// through HAProxy and a watcher of each reconnects through it. Writes
// answer 503 with Retry-After (or lose their connection with the dying
// node) for at most the election time, then go on; nothing acknowledged
// is lost, through any node; every watcher got each envelope once, in
// order. The dead node held all eight watcher places of another
// mailbox's direction: they come back by themselves.
func TestSIGKILLClusterMailboxStreamLeader(t *testing.T) {
	c := startRelayCluster(t, 3, []string{"mailbox"}, "RELAY_APPS=notes")
	lb := startHAProxy(t, c, "mailbox")
	base := "http://" + lb.addrs["mailbox"]
	// Eight mailboxes of one shard: the first writer's claim says which.
	first := newEnvelopeWriter(t, base, 6000)
	shards := shardCount(t, c.nats[0])
	stream := mailboxShard(t, c.nats[0], "notes", first.id())
	writers := []*envelopeWriter{first}
	for i := 6001; len(writers) < 8; i++ {
		if fmt.Sprintf("ER_MBX_%d", shardOf("notes/"+path.Base(mailboxPath(i)), shards)) != stream {
			continue
		}
		w := newEnvelopeWriter(t, base, i)
		if s := mailboxShard(t, c.nats[0], "notes", w.id()); s != stream {
			t.Fatalf("mailbox %s in %s, want %s", w.id(), s, stream)
		}
		writers = append(writers, w)
	}

	stop := make(chan struct{})
	var log putLog
	errs := make(chan error, len(writers))
	var wg sync.WaitGroup
	for _, w := range writers {
		wg.Go(func() {
			if err := putAcked(w, base, 100*time.Millisecond, &log, stop); err != nil {
				errs <- err
			}
		})
	}
	var watchers []*chaosWatcher
	stopWatch := make(chan struct{})
	var watchWG sync.WaitGroup
	for _, w := range writers {
		cw := newChaosWatcher(w)
		watchers = append(watchers, cw)
		watchWG.Go(func() { cw.run(base, stopWatch) })
	}
	defer func() { close(stopWatch); watchWG.Wait() }()
	progressed(t, writers, make([]int64, len(writers)), 5, 30*time.Second, "before the kill")

	leader := streamLeader(t, c.nats[0], stream)
	var victim *relayProc
	for i, n := range c.nodes {
		if fmt.Sprintf("node%d", i) == leader {
			victim = n
		}
	}
	if victim == nil {
		t.Fatalf("leader %q of %s is none of the nodes", leader, stream)
	}
	// Eight watchers of another mailbox on the doomed node hold every
	// place of their direction.
	pinned := newClusterLink(t, "notes")
	wantAnswer(t, "claim", pinned.do(t, "PUT", pinned.url(victim.origin("mailbox"), ""), nil, ""), 201, "")
	for range 8 {
		openWatcher(t, pinned, victim.origin("mailbox"), link.P2C, 0)
	}
	var survivors []*relayProc
	for _, n := range c.nodes {
		if n != victim {
			survivors = append(survivors, n)
		}
	}
	if e := watchRefused(t, pinned, survivors[0].origin("mailbox"), link.P2C); e.Status != 429 || e.Code != "too_many_watchers" {
		t.Fatalf("a 9th watcher: %v, want 429 too_many_watchers", e)
	}
	killedAt := time.Now()
	victim.kill()
	progressed(t, writers, counts(writers), 5, 40*time.Second, "after the leader's death")
	// The dead node's places come back by themselves: a watcher through a
	// survivor is admitted (one try a second, within the survivors'
	// connection buckets).
	for try := 0; ; try++ {
		ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
		w, err := pinned.on(survivors[try%2].origin("mailbox")).Watch(ctx, link.P2C, 0, false)
		cancel()
		if err == nil {
			_ = w.Close()
			t.Logf("the dead node's watcher places were free again %s after the kill", time.Since(killedAt).Round(100*time.Millisecond))
			break
		}
		var e *sdkmailbox.Error
		if !errors.As(err, &e) || (e.Code != "too_many_watchers" && e.Status != 503) || time.Since(killedAt) > 40*time.Second {
			t.Fatalf("a watcher through a survivor %s after the node holding every place died: %v", time.Since(killedAt).Round(time.Second), err)
		}
		time.Sleep(time.Second)
	}
	victim.start()
	waitReadyz(t, victim, http.StatusOK, 30*time.Second)
	close(stop)
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}

	// The longest stretch without an acknowledgement after the kill.
	var lastAck time.Time
	var gap time.Duration
	refused := 0
	for _, o := range log.sorted() {
		switch o.status {
		case 201, 200:
			if o.at.After(killedAt) {
				from := killedAt
				if lastAck.After(from) {
					from = lastAck
				}
				gap = max(gap, o.at.Sub(from))
			}
			lastAck = o.at
		case 503:
			if o.at.After(killedAt) {
				refused++
			}
		}
	}
	t.Logf("leader %s of %s killed: longest time without an acknowledged PUT %s, %d answers 503 with Retry-After", leader, stream, gap.Round(10*time.Millisecond), refused)
	if gap > 15*time.Second {
		t.Fatalf("writes stopped for %s after the leader died (the election takes 4-9 s)", gap)
	}
	for _, n := range c.nodes {
		waitReadyz(t, n, http.StatusOK, 30*time.Second)
	}
	caughtUp(t, watchers, 30*time.Second)
	allHeld(t, c, writers)
}

// shardCount is how many ER_MBX_ streams the cluster has, asked through
// one node's NATS.
func shardCount(t *testing.T, natsAddr string) int {
	t.Helper()
	js := natsJetStream(t, natsAddr)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	n := 0
	names := js.StreamNames(ctx)
	for name := range names.Name() {
		if strings.HasPrefix(name, "ER_MBX_") {
			n++
		}
	}
	if err := names.Err(); err != nil {
		t.Fatal(err)
	}
	return n
}

// TestSIGKILLClusterMailboxQuorumLost: with two of three nodes killed, the
// survivor's /readyz answers 503; every write (an envelope, a new claim)
// answers 503 with Retry-After, never a 4xx that would make a client give
// up a good mailbox; a read answers what is stored or 503 with
// Retry-After. When one node returns, the cluster serves by itself again:
// the refused writes succeed when retried, everything reads back through
// both nodes, and the survivor's watcher gets each envelope once.
func TestSIGKILLClusterMailboxQuorumLost(t *testing.T) {
	c := startRelayCluster(t, 3, []string{"mailbox"}, "RELAY_APPS=notes")
	survivor := c.nodes[0].origin("mailbox")
	for _, n := range c.nodes {
		waitReadyz(t, n, http.StatusOK, 30*time.Second)
	}
	w := newEnvelopeWriter(t, survivor, 7000)
	for seq := uint64(1); seq <= 3; seq++ {
		e := sealedLike(seq, w.index, 0)
		if code := mailboxDo(t, "PUT", fmt.Sprintf("%s%s/p2c/%d", survivor, mailboxPath(w.index), seq), w.token, e); code != 201 {
			t.Fatalf("PUT p2c/%d: %d", seq, code)
		}
		w.acked[seq], w.next = e, seq
	}
	cw := newChaosWatcher(w)
	stopWatch := make(chan struct{})
	var watchWG sync.WaitGroup
	watchWG.Go(func() { cw.run(survivor, stopWatch) })
	defer func() { close(stopWatch); watchWG.Wait() }()
	caughtUp(t, []*chaosWatcher{cw}, 20*time.Second)

	c.nodes[1].kill()
	c.nodes[2].kill()
	lost := waitReadyz(t, c.nodes[0], http.StatusServiceUnavailable, 20*time.Second)
	t.Logf("quorum lost: /readyz 503 after %s", lost.Round(100*time.Millisecond))

	// unavailable fails unless a is 503 with Retry-After and the spec's
	// JSON shape.
	unavailable := func(what string, a answer) {
		t.Helper()
		var body struct {
			Error  string `json:"error"`
			Status int    `json:"status"`
		}
		if a.code != 503 || a.header.Get("Retry-After") == "" || json.Unmarshal(a.body, &body) != nil || body.Status != 503 || body.Error == "" {
			t.Fatalf("%s without quorum: %d %s (Retry-After %q), want 503 with Retry-After and a JSON error", what, a.code, a.body, a.header.Get("Retry-After"))
		}
	}
	l := clusterLink{app: "notes", id: w.id(), token: w.token}
	fourth := sealedLike(4, w.index, 0)
	start := time.Now()
	unavailable("PUT p2c/4", l.do(t, "PUT", l.url(survivor, "/p2c/4"), fourth, ""))
	t.Logf("PUT without quorum answered 503 after %s", time.Since(start).Round(10*time.Millisecond))
	newcomer := newClusterLink(t, "notes")
	unavailable("a new claim", newcomer.do(t, "PUT", newcomer.url(survivor, ""), nil, ""))
	// Reads: what is stored, or 503; never a 404 or 403.
	for round := range 3 {
		for _, r := range []struct {
			method, suffix string
			ok             func(a answer) bool
		}{
			{"GET", "/p2c/2", func(a answer) bool { return bytes.Equal(a.body, w.acked[2]) }},
			{"HEAD", "/p2c", func(a answer) bool { return a.header.Get("X-Relay-Last") == "3" }},
			{"GET", "/p2c?after=0", func(a answer) bool { return len(a.body) == 3*(4+len(w.acked[1])) }},
			{"PUT", "", func(a answer) bool { return a.code == 204 }}, // a heartbeat
		} {
			a := l.do(t, r.method, l.url(survivor, r.suffix), nil, "")
			switch {
			case a.code == 503 && a.header.Get("Retry-After") != "":
			case a.code >= 200 && a.code < 300 && r.ok(a):
			default:
				t.Fatalf("round %d: %s %s without quorum: %d %q (Retry-After %q), want what is stored or 503 with Retry-After", round, r.method, r.suffix, a.code, a.body, a.header.Get("Retry-After"))
			}
		}
	}

	back := time.Now()
	c.nodes[1].start()
	waitReadyz(t, c.nodes[0], http.StatusOK, 60*time.Second)
	t.Logf("a node back: /readyz 200 on the survivor after %s", time.Since(back).Round(100*time.Millisecond))
	// The refused writes, retried as a client would.
	retry := func(what string, do func() answer, want ...int) {
		t.Helper()
		deadline := time.Now().Add(30 * time.Second)
		for {
			a := do()
			if slices.Contains(want, a.code) {
				return
			}
			if a.code != 503 || a.header.Get("Retry-After") == "" || time.Now().After(deadline) {
				t.Fatalf("%s after the quorum returned: %d %s", what, a.code, a.body)
			}
			time.Sleep(retryAfter(a.header.Get("Retry-After")))
		}
	}
	retry("PUT p2c/4", func() answer { return l.do(t, "PUT", l.url(survivor, "/p2c/4"), fourth, "") }, 201, 200)
	w.acked[4], w.next = fourth, 4
	retry("the new claim", func() answer { return newcomer.do(t, "PUT", newcomer.url(survivor, ""), nil, "") }, 201, 204)
	caughtUp(t, []*chaosWatcher{cw}, 30*time.Second)
	for i := range 2 {
		stored := w.stored(t, c.nodes[i].origin("mailbox"))
		w.checkHeld(t, stored, w.acked, fmt.Sprintf("acknowledged (read through node %d)", i))
		if len(stored) != 4 {
			t.Fatalf("node %d holds %d envelopes, want 4", i, len(stored))
		}
	}
	t.Logf("the survivor's watcher: %d sockets, closes %v, refusals %v", cw.sockets, cw.closes, cw.refusals)
}
