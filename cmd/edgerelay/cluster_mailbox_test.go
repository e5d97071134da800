package main

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/fasthttp/websocket"

	"edgerelay/push/pushtest"
	"edgerelay/sdk/link"
	sdkmailbox "edgerelay/sdk/mailbox"
)

// The mailbox in cluster mode, black-box: three nodes, each addressed
// directly (so that which node serves a request is the test's choice),
// behave for every request of spec/mailbox.md like one relay.

// clusterLink is one mailbox of a test and its bearer.
type clusterLink struct{ app, id, token string }

func newClusterLink(t *testing.T, app string) clusterLink {
	t.Helper()
	l, err := link.New()
	if err != nil {
		t.Fatal(err)
	}
	return clusterLink{app: app, id: l.ID, token: l.AccessToken()}
}

// url is the mailbox's URL on origin, with suffix ("", "/p2c/3", ...).
func (l clusterLink) url(origin, suffix string) string {
	return origin + "/v1/" + l.app + "/mailbox/" + l.id + suffix
}

// on is the SDK's view of the mailbox through origin, a new connection
// per request (behind a balancer, consecutive requests reach other nodes).
func (l clusterLink) on(origin string) *sdkmailbox.Mailbox {
	return (&sdkmailbox.Client{BaseURL: origin, App: l.app, HTTP: freshClient(nil)}).Mailbox(l.id, l.token)
}

// do sends one request with the link's bearer (token overrides it when
// not empty) and reads the whole answer.
func (l clusterLink) do(t *testing.T, method, url string, body []byte, token string) answer {
	t.Helper()
	if token == "" {
		token = l.token
	}
	a, err := request(freshClient(nil), method, url, token, body)
	if err != nil {
		t.Fatalf("%v", err)
	}
	return a
}

// wantAnswer fails unless a has status, and, when code is not empty (an
// error answer with a body: not a HEAD's), the spec's JSON body with code,
// as application/json and no-store.
func wantAnswer(t *testing.T, what string, a answer, status int, code string) {
	t.Helper()
	if a.code != status {
		t.Fatalf("%s: %d %s, want %d %s", what, a.code, a.body, status, code)
	}
	if code == "" {
		return
	}
	want := fmt.Sprintf(`{"error":%q,"status":%d}`, code, status)
	if got := string(bytes.TrimSpace(a.body)); got != want {
		t.Fatalf("%s: body %s, want %s", what, got, want)
	}
	if ct, cc := a.header.Get("Content-Type"), a.header.Get("Cache-Control"); ct != "application/json" || cc != "no-store" {
		t.Fatalf("%s: Content-Type %q, Cache-Control %q, want application/json and no-store", what, ct, cc)
	}
}

// clusterEnvelope is an envelope with the right outside: size bytes in
// all, its body filled with fill.
func clusterEnvelope(seq uint64, size int, fill byte) []byte {
	e := bytes.Repeat([]byte{fill}, max(size, 25))
	e[0] = 1
	binary.BigEndian.PutUint64(e[1:9], seq)
	return e
}

// clusterWatcher is one watch socket and what it received, in order.
type clusterWatcher struct {
	after uint64
	w     *sdkmailbox.Watch
	mu    sync.Mutex
	envs  [][]byte
	ended chan error // why the socket ended, once
}

// openWatcher opens a watch of dir above after through origin and reads it
// until the relay ends it.
func openWatcher(t *testing.T, l clusterLink, origin string, dir link.Direction, after uint64) *clusterWatcher {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
	defer cancel()
	w, err := l.on(origin).Watch(ctx, dir, after, false)
	if err != nil {
		t.Fatalf("watch %s after %d through %s: %v", dir, after, origin, err)
	}
	t.Cleanup(func() { _ = w.Close() })
	cw := &clusterWatcher{after: after, w: w, ended: make(chan error, 1)}
	go func() {
		for {
			env, err := w.Next(context.Background())
			if err != nil {
				cw.ended <- err
				return
			}
			cw.mu.Lock()
			cw.envs = append(cw.envs, env)
			cw.mu.Unlock()
		}
	}()
	return cw
}

func (cw *clusterWatcher) received() [][]byte {
	cw.mu.Lock()
	defer cw.mu.Unlock()
	return append([][]byte(nil), cw.envs...)
}

// waitFor polls until the watcher holds n envelopes (or more).
func (cw *clusterWatcher) waitFor(t *testing.T, what string, n int) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for len(cw.received()) < n {
		if time.Now().After(deadline) {
			t.Fatalf("%s: %d envelopes within 20 s, want %d", what, len(cw.received()), n)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// closedWith waits for the relay to end the socket and returns its close
// code (0: no close frame).
func (cw *clusterWatcher) closedWith(t *testing.T, what string) int {
	t.Helper()
	select {
	case err := <-cw.ended:
		code, _ := sdkmailbox.CloseCode(err)
		return code
	case <-time.After(15 * time.Second):
		t.Fatalf("%s: still open 15 s after the erase", what)
		return 0
	}
}

// wantExactly fails unless the watcher received exactly the envelopes of
// stored above its after, ascending, each once, byte for byte.
func (cw *clusterWatcher) wantExactly(t *testing.T, what string, stored map[uint64][]byte, last uint64) {
	t.Helper()
	got := cw.received()
	var want []uint64
	for s := cw.after + 1; s <= last; s++ {
		want = append(want, s)
	}
	seqs := make([]uint64, len(got))
	for i, e := range got {
		seqs[i] = binary.BigEndian.Uint64(e[1:9])
	}
	if fmt.Sprint(seqs) != fmt.Sprint(want) {
		t.Fatalf("%s (after %d) received %v, want %v (each once, ascending)", what, cw.after, seqs, want)
	}
	for i, e := range got {
		if !bytes.Equal(e, stored[seqs[i]]) {
			t.Fatalf("%s: envelope %d differs from the stored one", what, seqs[i])
		}
	}
}

// watchRefused opens a watch that the relay must refuse before the
// upgrade, and returns its answer.
func watchRefused(t *testing.T, l clusterLink, origin string, dir link.Direction) *sdkmailbox.Error {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
	defer cancel()
	w, err := l.on(origin).Watch(ctx, dir, 0, false)
	if err == nil {
		_ = w.Close()
		t.Fatalf("a watch through %s was upgraded, want a refusal", origin)
	}
	var e *sdkmailbox.Error
	if !errors.As(err, &e) {
		t.Fatalf("watch through %s: %v, want an answer", origin, err)
	}
	return e
}

// headDir is HEAD …/<dir>: X-Relay-First, -Last, -Count.
func headDir(t *testing.T, l clusterLink, origin string, dir link.Direction) string {
	t.Helper()
	first, last, count, err := l.on(origin).Head(context.Background(), dir)
	if err != nil {
		t.Fatalf("HEAD %s through %s: %v", dir, origin, err)
	}
	return fmt.Sprintf("first %d last %d count %d", first, last, count)
}

// batchSeqs is one batch's sequences (the bytes checked against stored).
func batchSeqs(t *testing.T, l clusterLink, origin string, dir link.Direction, after uint64, limit int, stored map[uint64][]byte) (string, bool) {
	t.Helper()
	envs, more, err := l.on(origin).Batch(context.Background(), dir, after, limit)
	if err != nil {
		t.Fatalf("batch %s after %d through %s: %v", dir, after, origin, err)
	}
	seqs := make([]uint64, len(envs))
	for i, e := range envs {
		seqs[i] = binary.BigEndian.Uint64(e[1:9])
		if !bytes.Equal(e, stored[seqs[i]]) {
			t.Fatalf("batch through %s: envelope %d differs from the stored one", origin, seqs[i])
		}
	}
	return fmt.Sprint(seqs), more
}

// TestClusterMailboxAcrossNodes: claims, envelopes, reads, watches,
// prune, erase, the watcher limit and the storage limits of one mailbox,
// each request sent to the node the test picks: a claim on one node is
// seen by the others, a write through one is read and watched through
// the others (each envelope once, in order, also while writes race a
// watch's replay), a prune and an erase through one hold on all (no
// node serves what it cached before), and the limits count once for the
// cluster, not once per node.
func TestClusterMailboxAcrossNodes(t *testing.T) {
	c := startRelayCluster(t, 3, []string{"mailbox"}, clusterMailboxEnv...)
	for _, n := range c.nodes {
		waitReadyz(t, n, http.StatusOK, 30*time.Second)
	}
	mailboxAcrossNodes(t, c)
}

// The storage limits of TestClusterMailboxAcrossNodes, small enough to
// reach in a few requests.
const clusterMaxStored, clusterMaxStoredBytes = 16, 16000

var clusterMailboxEnv = []string{"RELAY_APPS=notes;talk:signal",
	"RELAY_MAX_STORED=" + strconv.Itoa(clusterMaxStored), "RELAY_MAX_STORED_BYTES=" + strconv.Itoa(clusterMaxStoredBytes)}

// mailboxAcrossNodes is TestClusterMailboxAcrossNodes on c's nodes (run
// with clusterMailboxEnv).
func mailboxAcrossNodes(t *testing.T, c *relayCluster) {
	node := func(i int) string { return c.nodes[i].origin("mailbox") }

	l := newClusterLink(t, "notes")
	other := newClusterLink(t, "notes").token
	// Claim on node 0, heartbeat on node 1, another token on node 2.
	wantAnswer(t, "claim on node 0", l.do(t, "PUT", l.url(node(0), ""), nil, ""), 201, "")
	wantAnswer(t, "heartbeat on node 1", l.do(t, "PUT", l.url(node(1), ""), nil, ""), 204, "")
	wantAnswer(t, "another token's claim on node 2", l.do(t, "PUT", l.url(node(2), ""), nil, other), 409, "taken")
	wantAnswer(t, "another token's read on node 1", l.do(t, "GET", l.url(node(1), "/p2c/1"), nil, other), 403, "forbidden")
	stranger := newClusterLink(t, "notes")
	wantAnswer(t, "a mailbox never claimed, on node 2", stranger.do(t, "GET", stranger.url(node(2), "/p2c"), nil, ""), 404, "not_found")

	before := openWatcher(t, l, node(2), link.P2C, 0)
	stored := map[uint64][]byte{}
	put := func(i int, seq uint64, env []byte, status int, code string) {
		t.Helper()
		wantAnswer(t, fmt.Sprintf("PUT p2c/%d on node %d", seq, i), l.do(t, "PUT", l.url(node(i), fmt.Sprintf("/p2c/%d", seq)), env, ""), status, code)
		if status == 201 {
			stored[seq] = env
		}
	}
	put(1, 1, clusterEnvelope(1, 100, 'a'), 201, "")
	put(2, 1, clusterEnvelope(1, 100, 'a'), 200, "")
	put(0, 1, clusterEnvelope(1, 100, 'b'), 409, "conflict")
	put(0, 2, clusterEnvelope(2, 100, 'a'), 201, "")
	// A watcher on node 0 and another on node 2 open while envelopes 3 to
	// 12 are written through nodes 0 and 1: their replays race the writes.
	const last = 12
	done := make(chan struct{}) // stored is the writer's until done closes
	go func() {
		defer close(done)
		for seq := uint64(3); seq <= last; seq++ {
			env := clusterEnvelope(seq, 100+int(seq), 'a')
			a, err := request(freshClient(nil), "PUT", l.url(node(int(seq%2)), fmt.Sprintf("/p2c/%d", seq)), l.token, env)
			if err != nil || a.code != 201 {
				t.Errorf("PUT p2c/%d on node %d: %v %d %s", seq, seq%2, err, a.code, a.body)
				return
			}
			stored[seq] = env
		}
	}()
	after := openWatcher(t, l, node(2), link.P2C, 2)
	watcher0 := openWatcher(t, l, node(0), link.P2C, 0)
	<-done
	if t.Failed() {
		t.FailNow()
	}
	for _, w := range []struct {
		name string
		w    *clusterWatcher
	}{{"the watcher on node 2 opened before", before}, {"the watcher on node 2 opened during the writes", after}, {"the watcher on node 0", watcher0}} {
		w.w.waitFor(t, w.name, last-int(w.w.after))
	}

	// Reads through every node: GET, HEAD one, HEAD the direction,
	// batches. Every envelope is read through every node first, so that
	// a node's envelope cache holds them for the prune and erase below.
	for i := range c.nodes {
		for seq := uint64(1); seq <= last; seq++ {
			a := l.do(t, "GET", l.url(node(i), fmt.Sprintf("/p2c/%d", seq)), nil, "")
			wantAnswer(t, fmt.Sprintf("GET p2c/%d on node %d", seq, i), a, 200, "")
			if !bytes.Equal(a.body, stored[seq]) || a.header.Get("Content-Type") != "application/octet-stream" {
				t.Fatalf("GET p2c/%d on node %d: %d bytes as %q, not the stored envelope", seq, i, len(a.body), a.header.Get("Content-Type"))
			}
		}
		wantAnswer(t, "GET of a sequence never written", l.do(t, "GET", l.url(node(i), "/p2c/13"), nil, ""), 404, "not_found")
		if a := l.do(t, "HEAD", l.url(node(i), "/p2c/5"), nil, ""); a.code != 200 || len(a.body) != 0 {
			t.Fatalf("HEAD p2c/5 on node %d: %d with %d bytes", i, a.code, len(a.body))
		}
		if a := l.do(t, "HEAD", l.url(node(i), "/p2c/13"), nil, ""); a.code != 404 {
			t.Fatalf("HEAD p2c/13 on node %d: %d", i, a.code)
		}
		if got := headDir(t, l, node(i), link.P2C); got != "first 1 last 12 count 12" {
			t.Fatalf("HEAD p2c on node %d: %s", i, got)
		}
		if got, more := batchSeqs(t, l, node(i), link.P2C, 0, 0, stored); got != "[1 2 3 4 5 6 7 8 9 10 11 12]" || more {
			t.Fatalf("batch p2c on node %d: %s more %v", i, got, more)
		}
		if got, more := batchSeqs(t, l, node(i), link.P2C, 3, 5, stored); got != "[4 5 6 7 8]" || !more {
			t.Fatalf("batch p2c after 3 limit 5 on node %d: %s more %v", i, got, more)
		}
	}
	// c2p written out of order through three nodes reads back ascending.
	c2p := map[uint64][]byte{}
	for i, seq := range []uint64{3, 1, 2} {
		c2p[seq] = clusterEnvelope(seq, 60, 'c')
		wantAnswer(t, fmt.Sprintf("PUT c2p/%d on node %d", seq, i), l.do(t, "PUT", l.url(node(i), fmt.Sprintf("/c2p/%d", seq)), c2p[seq], ""), 201, "")
	}
	for i := range c.nodes {
		if got, _ := batchSeqs(t, l, node(i), link.C2P, 0, 0, c2p); got != "[1 2 3]" {
			t.Fatalf("batch c2p on node %d: %s", i, got)
		}
		if got := headDir(t, l, node(i), link.C2P); got != "first 1 last 3 count 3" {
			t.Fatalf("HEAD c2p on node %d: %s", i, got)
		}
	}

	// Prune through node 0, seen through node 2 (and node 1).
	wantAnswer(t, "prune p2c through 5 on node 0", l.do(t, "DELETE", l.url(node(0), "/p2c?through=5"), nil, ""), 204, "")
	for _, i := range []int{2, 1} {
		if got := headDir(t, l, node(i), link.P2C); got != "first 6 last 12 count 7" {
			t.Fatalf("HEAD p2c on node %d after a prune on node 0: %s", i, got)
		}
		wantAnswer(t, fmt.Sprintf("GET of a pruned envelope on node %d", i), l.do(t, "GET", l.url(node(i), "/p2c/3"), nil, ""), 404, "not_found")
		if a := l.do(t, "HEAD", l.url(node(i), "/p2c/5"), nil, ""); a.code != 404 {
			t.Fatalf("HEAD of a pruned envelope on node %d: %d", i, a.code)
		}
		if got, _ := batchSeqs(t, l, node(i), link.P2C, 0, 0, stored); got != "[6 7 8 9 10 11 12]" {
			t.Fatalf("batch p2c on node %d after a prune on node 0: %s", i, got)
		}
	}
	put(2, 5, stored[5], 409, "conflict") // at the pruned mark, even with its old bytes
	put(1, 4, clusterEnvelope(4, 30, 'z'), 409, "conflict")

	// Erase through node 1: the watchers on nodes 0 and 2 close with 1000,
	// having received each envelope above their after exactly once.
	wantAnswer(t, "erase on node 1", l.do(t, "DELETE", l.url(node(1), ""), nil, ""), 204, "")
	for _, w := range []struct {
		name string
		w    *clusterWatcher
	}{{"the watcher on node 2 opened before", before}, {"the watcher on node 2 opened during the writes", after}, {"the watcher on node 0", watcher0}} {
		if code := w.w.closedWith(t, w.name); code != 1000 {
			t.Fatalf("%s: closed with %d after an erase on node 1, want 1000", w.name, code)
		}
		w.w.wantExactly(t, w.name, stored, last)
	}
	for i := range c.nodes {
		for _, r := range []struct{ method, suffix string }{
			{"GET", "/p2c/12"}, {"GET", "/p2c"}, {"HEAD", "/p2c"}, {"HEAD", "/c2p/1"}, {"PUT", "/p2c/13"}, {"DELETE", "/p2c?through=12"}, {"DELETE", ""},
		} {
			var body []byte
			if r.method == "PUT" {
				body = clusterEnvelope(13, 30, 'a')
			}
			a := l.do(t, r.method, l.url(node(i), r.suffix), body, "")
			code := "not_found"
			if r.method == "HEAD" {
				code = ""
			}
			wantAnswer(t, fmt.Sprintf("%s %s on node %d after the erase", r.method, r.suffix, i), a, 404, code)
		}
		if e := watchRefused(t, l, node(i), link.P2C); e.Status != 404 {
			t.Fatalf("watch on node %d after the erase: %v", i, e)
		}
	}
	// The id is free again: another token claims it on node 2; the old
	// token is refused on node 0, which held its claim before; nothing of
	// the old mailbox is left (its envelope 1 and its mark 5 neither).
	wantAnswer(t, "claim of the erased id by another token on node 2", l.do(t, "PUT", l.url(node(2), ""), nil, other), 201, "")
	wantAnswer(t, "the old token on node 0", l.do(t, "GET", l.url(node(0), "/p2c/1"), nil, ""), 403, "forbidden")
	reborn := clusterLink{app: l.app, id: l.id, token: other}
	fresh := clusterEnvelope(1, 40, 'n')
	wantAnswer(t, "PUT p2c/1 of the new holder on node 0", reborn.do(t, "PUT", reborn.url(node(0), "/p2c/1"), fresh, ""), 201, "")
	for i := range c.nodes {
		if a := reborn.do(t, "GET", reborn.url(node(i), "/p2c/1"), nil, ""); a.code != 200 || !bytes.Equal(a.body, fresh) {
			t.Fatalf("GET p2c/1 on node %d after the erase and a new write: %d, %d bytes (a node served its old copy?)", i, a.code, len(a.body))
		}
		if got := headDir(t, reborn, node(i), link.P2C); got != "first 1 last 1 count 1" {
			t.Fatalf("HEAD p2c on node %d of the new holder: %s", i, got)
		}
		if got := headDir(t, reborn, node(i), link.C2P); got != "first 0 last 0 count 0" {
			t.Fatalf("HEAD c2p on node %d of the new holder: %s", i, got)
		}
	}

	t.Run("EraseClosesSignalSocketsAcrossNodes", func(t *testing.T) { clusterEraseSignal(t, c) })
	t.Run("RacingClaimsAndWritesAcrossNodes", func(t *testing.T) { clusterRaces(t, c) })
	t.Run("WatcherLimitAcrossNodes", func(t *testing.T) { clusterWatcherLimit(t, c) })
	t.Run("StoredLimitsAcrossNodes", func(t *testing.T) { clusterStoredLimits(t, c, clusterMaxStored, clusterMaxStoredBytes) })
	t.Run("EnvelopeBucketAcrossNodes", func(t *testing.T) { clusterEnvelopeBucket(t, c) })
}

// clusterEraseSignal: an erase through node 1 closes the mailbox's signal
// sockets on nodes 0 and 2 with 1000, as it closes its watch sockets.
// (Which frames the two sides exchange across nodes is part 2 of cluster
// mode; the erase is part 1's.)
func clusterEraseSignal(t *testing.T, c *relayCluster) {
	node := func(i int) string { return c.nodes[i].origin("mailbox") }
	l := newClusterLink(t, "talk")
	wantAnswer(t, "claim", l.do(t, "PUT", l.url(node(0), ""), nil, ""), 201, "")
	sides := map[string]*websocket.Conn{
		"the primary on node 0":   mailboxConn(t, l, node(0), "/signal/primary", websocket.DefaultDialer),
		"the companion on node 2": mailboxConn(t, l, node(2), "/signal/companion", websocket.DefaultDialer),
	}
	// Both sockets are open at their nodes before the erase.
	sockets := func(i int) float64 { return hostileMetric(t, c.nodes[i], "edgerelay_mailbox_signal_sockets") }
	waitUntil(t, func() bool {
		if c.nodes[0] == c.nodes[2] { // one node standing for three
			return sockets(0) >= 2
		}
		return sockets(0) >= 1 && sockets(2) >= 1
	})
	wantAnswer(t, "erase on node 1", l.do(t, "DELETE", l.url(node(1), ""), nil, ""), 204, "")
	for name, conn := range sides {
		_ = conn.SetReadDeadline(time.Now().Add(15 * time.Second))
		for {
			typ, msg, err := conn.ReadMessage()
			if err == nil {
				if typ != websocket.TextMessage || !strings.HasPrefix(string(msg), "peer ") {
					t.Fatalf("%s: frame %q before the close", name, msg)
				}
				continue
			}
			if code, _ := sdkmailbox.CloseCode(err); code != 1000 {
				t.Fatalf("%s after an erase through node 1: %v, want close 1000", name, err)
			}
			break
		}
	}
}

// clusterRaces: six tokens claiming one id at once through three nodes:
// one 201, five 409 taken. Two writers of each sequence at once through
// two nodes: with other bytes one 201 and one 409 conflict, and every
// node serves the winner's bytes; with the same bytes one 201 and one 200,
// and a watcher on the third node gets each envelope once.
func clusterRaces(t *testing.T, c *relayCluster) {
	node := func(i int) string { return c.nodes[i].origin("mailbox") }
	l := newClusterLink(t, "notes")
	codes := make(chan int, 6)
	var wg sync.WaitGroup
	for i := range 6 {
		racer := clusterLink{app: l.app, id: l.id, token: newClusterLink(t, "notes").token}
		wg.Go(func() {
			a, err := request(freshClient(nil), "PUT", racer.url(node(i%3), ""), racer.token, nil)
			if err != nil {
				t.Errorf("racing claim on node %d: %v", i%3, err)
			}
			codes <- a.code
		})
	}
	wg.Wait()
	close(codes)
	got := map[int]int{}
	for code := range codes {
		got[code]++
	}
	if got[201] != 1 || got[409] != 5 {
		t.Fatalf("six racing claims of one id over three nodes: %v, want one 201 and five 409", got)
	}
	// The writes race in a mailbox of their own.
	l = newClusterLink(t, "notes")
	wantAnswer(t, "claim", l.do(t, "PUT", l.url(node(2), ""), nil, ""), 201, "")
	w := openWatcher(t, l, node(2), link.C2P, 0)
	const n = 8
	same := map[uint64][]byte{}
	for seq := uint64(1); seq <= n; seq++ {
		type result struct {
			node int
			env  []byte
			code int
		}
		results := make(chan result, 4)
		for i := range 2 {
			other, twin := clusterEnvelope(seq, 40, byte('a'+i)), clusterEnvelope(seq, 40, 's')
			wg.Go(func() {
				a, err := request(freshClient(nil), "PUT", l.url(node(i), fmt.Sprintf("/p2c/%d", seq)), l.token, other)
				if err != nil {
					t.Errorf("racing PUT p2c/%d on node %d: %v", seq, i, err)
				}
				results <- result{i, other, a.code}
			})
			wg.Go(func() {
				a, err := request(freshClient(nil), "PUT", l.url(node(i), fmt.Sprintf("/c2p/%d", seq)), l.token, twin)
				if err != nil {
					t.Errorf("racing PUT c2p/%d on node %d: %v", seq, i, err)
				}
				results <- result{-1, twin, a.code}
			})
		}
		wg.Wait()
		close(results)
		var winner []byte
		got := map[string]int{}
		for r := range results {
			dir := "p2c"
			if r.node < 0 {
				dir = "c2p"
			}
			got[fmt.Sprintf("%s %d", dir, r.code)]++
			if r.node >= 0 && r.code == 201 {
				winner = r.env
			}
			if r.node < 0 {
				same[seq] = r.env
			}
		}
		if fmt.Sprint(got) != "map[c2p 200:1 c2p 201:1 p2c 201:1 p2c 409:1]" {
			t.Fatalf("seq %d raced through nodes 0 and 1: %v, want one 201 and one 409 with other bytes, one 201 and one 200 with the same", seq, got)
		}
		for i := range c.nodes {
			if a := l.do(t, "GET", l.url(node(i), fmt.Sprintf("/p2c/%d", seq)), nil, ""); a.code != 200 || !bytes.Equal(a.body, winner) {
				t.Fatalf("GET p2c/%d on node %d: %d, not the bytes answered 201", seq, i, a.code)
			}
		}
	}
	w.waitFor(t, "the watcher of c2p on node 2", n)
	wantAnswer(t, "erase", l.do(t, "DELETE", l.url(node(0), ""), nil, ""), 204, "")
	if code := w.closedWith(t, "the watcher of c2p on node 2"); code != 1000 {
		t.Fatalf("the watcher of c2p closed with %d after the erase", code)
	}
	w.wantExactly(t, "the watcher of c2p on node 2", same, n)
}

// clusterWatcherLimit: 8 watchers of one direction spread over three
// nodes; a 9th on any node is refused 429 too_many_watchers; once one
// closes, a new one is admitted on another node, and the 9th is refused
// again.
func clusterWatcherLimit(t *testing.T, c *relayCluster) {
	node := func(i int) string { return c.nodes[i].origin("mailbox") }
	l := newClusterLink(t, "notes")
	wantAnswer(t, "claim", l.do(t, "PUT", l.url(node(1), ""), nil, ""), 201, "")
	var ws []*clusterWatcher
	for i := range 8 {
		ws = append(ws, openWatcher(t, l, node(i%3), link.P2C, 0))
	}
	for i := range c.nodes {
		if e := watchRefused(t, l, node(i), link.P2C); e.Status != 429 || e.Code != "too_many_watchers" {
			t.Fatalf("a 9th watcher on node %d: %v, want 429 too_many_watchers", i, e)
		}
	}
	// The other direction has its own 8.
	openWatcher(t, l, node(2), link.C2P, 0)

	sockets := func() float64 { return hostileMetric(t, c.nodes[0], "edgerelay_mailbox_watch_sockets") }
	open := sockets()
	_ = ws[0].w.Close() // node 0's
	waitUntil(t, func() bool { return sockets() == open-1 })
	// Node 0 has let go of the place; node 2 admits a watcher once it
	// sees that. Each refused try costs a token of node 2's connection
	// bucket (20): a few tries with growing pauses.
	var admitted *sdkmailbox.Watch
	for try, pause := 0, 50*time.Millisecond; admitted == nil; try, pause = try+1, pause*2 {
		ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
		w, err := l.on(node(2)).Watch(ctx, link.P2C, 0, false)
		cancel()
		var e *sdkmailbox.Error
		switch {
		case err == nil:
			admitted = w
		case errors.As(err, &e) && e.Code == "too_many_watchers" && try < 7:
			time.Sleep(pause)
		default:
			t.Fatalf("a watcher on node 2 after one closed on node 0 (try %d): %v", try+1, err)
		}
	}
	defer admitted.Close()
	if e := watchRefused(t, l, node(1), link.P2C); e.Status != 429 || e.Code != "too_many_watchers" {
		t.Fatalf("a 9th watcher on node 1 after the swap: %v, want 429 too_many_watchers", e)
	}
}

// clusterStoredLimits: RELAY_MAX_STORED and RELAY_MAX_STORED_BYTES count
// the direction once for the cluster: the last envelope that fits is
// stored through one node, the next one refused 507 through another; a
// prune through a third makes room for exactly one more.
func clusterStoredLimits(t *testing.T, c *relayCluster, maxStored, maxBytes int) {
	node := func(i int) string { return c.nodes[i].origin("mailbox") }
	l := newClusterLink(t, "notes")
	wantAnswer(t, "claim", l.do(t, "PUT", l.url(node(0), ""), nil, ""), 201, "")
	putOn := func(i int, dir string, seq uint64, env []byte, status int, code string) {
		t.Helper()
		wantAnswer(t, fmt.Sprintf("PUT %s/%d on node %d", dir, seq, i%3), l.do(t, "PUT", l.url(node(i%3), fmt.Sprintf("/%s/%d", dir, seq)), env, ""), status, code)
	}
	for seq := uint64(1); seq <= uint64(maxStored); seq++ {
		putOn(int(seq), "p2c", seq, clusterEnvelope(seq, 25, 'a'), 201, "")
	}
	putOn(maxStored+2, "p2c", uint64(maxStored+1), clusterEnvelope(uint64(maxStored+1), 25, 'a'), 507, "mailbox_full")
	wantAnswer(t, "prune through 1", l.do(t, "DELETE", l.url(node((maxStored+3)%3), "/p2c?through=1"), nil, ""), 204, "")
	putOn(maxStored+4, "p2c", uint64(maxStored+1), clusterEnvelope(uint64(maxStored+1), 25, 'a'), 201, "")
	putOn(maxStored+5, "p2c", uint64(maxStored+2), clusterEnvelope(uint64(maxStored+2), 25, 'a'), 507, "mailbox_full")

	// Bytes: four envelopes make exactly maxBytes, the smallest one more
	// is refused.
	size := maxBytes / 4
	for seq := uint64(1); seq <= 4; seq++ {
		putOn(int(seq), "c2p", seq, clusterEnvelope(seq, size, 'b'), 201, "")
	}
	putOn(6, "c2p", 5, clusterEnvelope(5, 25, 'b'), 507, "mailbox_full")
	if got := headDir(t, l, node(2), link.C2P); got != "first 1 last 4 count 4" {
		t.Fatalf("HEAD c2p after the refusal: %s", got)
	}
}

// clusterEnvelopeBucket: the envelope bucket (burst 120, 2 a second) is
// one for the cluster: writes spread over three nodes are refused 429
// after about 120, not after three times as many.
func clusterEnvelopeBucket(t *testing.T, c *relayCluster) {
	node := func(i int) string { return c.nodes[i].origin("mailbox") }
	l := newClusterLink(t, "notes")
	wantAnswer(t, "claim", l.do(t, "PUT", l.url(node(2), ""), nil, ""), 201, "")
	start := time.Now()
	stored := 0
	for seq := uint64(1); ; seq++ {
		if seq > 400 {
			t.Fatal("400 writes over three nodes, none refused: the bucket is counted per node")
		}
		a := l.do(t, "PUT", l.url(node(int(seq%3)), fmt.Sprintf("/p2c/%d", seq)), clusterEnvelope(seq, 25, 'r'), "")
		if a.code == 429 {
			wantAnswer(t, fmt.Sprintf("PUT p2c/%d on node %d", seq, seq%3), a, 429, "rate_limited")
			if s, err := strconv.Atoi(a.header.Get("Retry-After")); err != nil || s < 1 {
				t.Fatalf("429 with Retry-After %q, want whole seconds >= 1", a.header.Get("Retry-After"))
			}
			break
		}
		wantAnswer(t, fmt.Sprintf("PUT p2c/%d on node %d", seq, seq%3), a, 201, "")
		stored++
		if seq%12 == 0 { // stay under RELAY_MAX_STORED
			wantAnswer(t, "prune", l.do(t, "DELETE", l.url(node(int(seq/12%3)), fmt.Sprintf("/p2c?through=%d", seq)), nil, ""), 204, "")
		}
	}
	elapsed := time.Since(start)
	// The burst, plus what refilled meanwhile (2 a second), plus one.
	bound := 120 + int(2*elapsed.Seconds()) + 1
	t.Logf("%d writes over three nodes stored before the first 429, in %s", stored, elapsed.Round(time.Millisecond))
	if stored < 120 || stored > bound {
		t.Fatalf("%d writes stored before a 429 in %s, want 120 to %d", stored, elapsed, bound)
	}
}

// TestClusterMailboxPushForegroundAcrossNodes: the 45 s foreground rule
// sees a watch on another node. A reader whose watch socket on node 0 sent
// ping gets no push for writes with X-Relay-Notify through any node; a
// reader whose watch is open but sent no ping, and one with no watch at
// all, get theirs, sealed registrations opened on the writing node; a
// registration deleted through another node is gone for every node. The
// cluster also runs the slow reader case (it has the default storage
// limits).
func TestClusterMailboxPushForegroundAcrossNodes(t *testing.T) {
	fake, env := mailboxPushEnv(t)
	c := startRelayCluster(t, 3, []string{"mailbox"}, env...)
	for _, n := range c.nodes {
		waitReadyz(t, n, http.StatusOK, 30*time.Second)
	}
	pushForegroundAcrossNodes(t, c, fake)
	// The same cluster has the default storage limits, room for a few MiB.
	t.Run("SlowReaderAcrossNodes", func(t *testing.T) { slowReaderAcrossNodes(t, c) })
}

// watchSocket dials a raw watch socket of l's p2c above 0 through origin.
func watchSocket(t *testing.T, l clusterLink, origin string, d *websocket.Dialer) *websocket.Conn {
	t.Helper()
	return mailboxConn(t, l, origin, "/p2c/watch?after=0", d)
}

// mailboxConn dials a raw WebSocket of l's (path: "/p2c/watch?after=0",
// "/signal/primary") through origin.
func mailboxConn(t *testing.T, l clusterLink, origin, path string, d *websocket.Dialer) *websocket.Conn {
	t.Helper()
	dd := *d
	dd.Subprotocols = []string{sdkmailbox.Subprotocol}
	u := "ws" + strings.TrimPrefix(l.url(origin, path), "http")
	conn, resp, err := dd.Dial(u, http.Header{"Authorization": {"Bearer " + l.token}})
	if err != nil {
		t.Fatalf("watch through %s: %v %v", origin, err, resp)
	}
	t.Cleanup(func() { conn.Close() })
	return conn
}

// slowReaderAcrossNodes: a watcher on node 2 that stops reading is closed
// with 1013 once it is 1 MiB behind, while another watcher on the same
// node (the same node's delivery of that direction) and one on node 1
// get every envelope written through node 0, in order.
func slowReaderAcrossNodes(t *testing.T, c *relayCluster) {
	node := func(i int) string { return c.nodes[i].origin("mailbox") }
	l := newClusterLink(t, "chat")
	wantAnswer(t, "claim", l.do(t, "PUT", l.url(node(0), ""), nil, ""), 201, "")
	sockets := func() float64 { return hostileMetric(t, c.nodes[2], "edgerelay_mailbox_watch_sockets") }
	before := sockets()
	frozen := watchSocket(t, l, node(2), frozenDialer(nil))
	live := watchSocket(t, l, node(2), websocket.DefaultDialer)
	other := watchSocket(t, l, node(1), websocket.DefaultDialer)
	onTwo := 2.0 // node 2's sockets of the three
	if c.nodes[1] == c.nodes[2] {
		onTwo = 3 // one node standing for three
	}
	waitUntil(t, func() bool { return sockets() == before+onTwo })

	const size = 60000
	n := frozenBytes(1<<20) / size // about 105: within the burst of 120 writes
	check := func(i int, msg []byte) error {
		if len(msg) != size || binary.BigEndian.Uint64(msg[1:9]) != uint64(i+1) {
			return fmt.Errorf("got %d bytes, want envelope %d", len(msg), i+1)
		}
		return nil
	}
	progress := make(chan int, n)
	liveDone := liveReader(live, n, progress, check)
	otherDone := liveReader(other, n, make(chan int, n), check)
	mb := l.on(node(0))
	pace(t, n, 4, progress, liveDone, func(i int) error {
		ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
		defer cancel()
		_, err := mb.Put(ctx, link.P2C, uint64(i+1), clusterEnvelope(uint64(i+1), size, byte(i)), "")
		return err
	})
	if err := <-otherDone; err != nil {
		t.Fatalf("the watcher on node 1: %v", err)
	}
	waitUntil(t, func() bool { return sockets() == before+onTwo-1 })
	expectCutOff(t, frozen, websocket.CloseTryAgainLater, n)
}

// TestClusterMailboxScenariosOnOneNode runs the scenarios of the cluster
// tests above against one node (as if it were three): a cluster answers
// exactly what a single node answers, so the single node must pass them
// too, and a test that asked for something else would show here.
func TestClusterMailboxScenariosOnOneNode(t *testing.T) {
	s := startServer(t, clusterMailboxEnv...)
	mailboxAcrossNodes(t, &relayCluster{t: t, nodes: []*relayProc{s, s, s}})
	fake, env := mailboxPushEnv(t)
	s = startServer(t, env...)
	one := &relayCluster{t: t, nodes: []*relayProc{s, s, s}}
	pushForegroundAcrossNodes(t, one, fake)
	slowReaderAcrossNodes(t, one)
	s = startServer(t, clusterIdleEnv...)
	idleExpiryAcrossNodes(t, &relayCluster{t: t, nodes: []*relayProc{s, s, s}})
}

// TestClusterMailboxIdleExpiryAcrossNodes: RELAY_IDLE counts a mailbox's
// claims and writes through any node, never its reads: a mailbox written
// through one node and read through another expires one idle time after
// the write (not before), the watcher on a third node is closed with
// 1000, every node answers 404 and the id can be claimed again; a mailbox
// kept alive by heartbeats through the nodes in turn outlives it.
func TestClusterMailboxIdleExpiryAcrossNodes(t *testing.T) {
	c := startRelayCluster(t, 3, []string{"mailbox"}, clusterIdleEnv...)
	for _, n := range c.nodes {
		waitReadyz(t, n, http.StatusOK, 30*time.Second)
	}
	idleExpiryAcrossNodes(t, c)
}

const clusterIdle = 3 * time.Second

var clusterIdleEnv = []string{"RELAY_APPS=notes", "RELAY_IDLE=" + clusterIdle.String()}

// idleExpiryAcrossNodes is TestClusterMailboxIdleExpiryAcrossNodes on c's
// nodes (run with clusterIdleEnv).
func idleExpiryAcrossNodes(t *testing.T, c *relayCluster) {
	node := func(i int) string { return c.nodes[i].origin("mailbox") }
	gone, kept := newClusterLink(t, "notes"), newClusterLink(t, "notes")
	wantAnswer(t, "claim", gone.do(t, "PUT", gone.url(node(0), ""), nil, ""), 201, "")
	wantAnswer(t, "claim", kept.do(t, "PUT", kept.url(node(1), ""), nil, ""), 201, "")
	env := clusterEnvelope(1, 50, 'i')
	written := time.Now()
	wantAnswer(t, "PUT p2c/1 on node 1", gone.do(t, "PUT", gone.url(node(1), "/p2c/1"), env, ""), 201, "")
	acked := time.Now()
	w := openWatcher(t, gone, node(2), link.P2C, 0)
	w.waitFor(t, "the watcher on node 2", 1)

	// Reads of gone through node 2 until it is gone; a heartbeat of kept
	// through the nodes in turn every quarter of the idle time.
	var expired time.Time
	for i := 0; expired.IsZero() || time.Since(written) < 2*clusterIdle; i++ {
		if time.Since(acked) > clusterIdle+15*time.Second {
			t.Fatalf("a mailbox last written %s ago still answers", time.Since(acked))
		}
		a := gone.do(t, "GET", gone.url(node(2), "/p2c/1"), nil, "")
		switch {
		case a.code == 200 && expired.IsZero():
		case a.code == 404 && expired.IsZero():
			expired = time.Now()
			if expired.Sub(written) < clusterIdle {
				t.Fatalf("expired %s after its write, before RELAY_IDLE=%s", expired.Sub(written), clusterIdle)
			}
			wantAnswer(t, "GET of an expired mailbox", a, 404, "not_found")
		case a.code == 404:
		default:
			t.Fatalf("GET of a mailbox %s after its write (expired at %v): %d %s", time.Since(written), expired, a.code, a.body)
		}
		if i%8 == 0 {
			wantAnswer(t, fmt.Sprintf("heartbeat on node %d", i/8%3), kept.do(t, "PUT", kept.url(node(i/8%3), ""), nil, ""), 204, "")
		}
		time.Sleep(clusterIdle / 32) // the clients' pace
	}
	t.Logf("a mailbox read through another node expired %s after its write (RELAY_IDLE=%s)", expired.Sub(written).Round(10*time.Millisecond), clusterIdle)
	if code := w.closedWith(t, "the watcher on node 2 of the expired mailbox"); code != 1000 {
		t.Fatalf("the watcher on node 2 of the expired mailbox closed with %d, want 1000", code)
	}
	w.wantExactly(t, "the watcher on node 2 of the expired mailbox", map[uint64][]byte{1: env}, 1)
	for i := range c.nodes {
		wantAnswer(t, fmt.Sprintf("HEAD p2c of the expired mailbox on node %d", i), gone.do(t, "HEAD", gone.url(node(i), "/p2c"), nil, ""), 404, "")
		if got := headDir(t, kept, node(i), link.P2C); got != "first 0 last 0 count 0" {
			t.Fatalf("HEAD p2c of the mailbox kept alive, on node %d: %s", i, got)
		}
	}
	taker := clusterLink{app: gone.app, id: gone.id, token: newClusterLink(t, "notes").token}
	wantAnswer(t, "claim of the expired id by another token on node 1", taker.do(t, "PUT", taker.url(node(1), ""), nil, ""), 201, "")
	for i := range c.nodes {
		if got := headDir(t, taker, node(i), link.P2C); got != "first 0 last 0 count 0" {
			t.Fatalf("HEAD p2c of the new holder on node %d: %s (the old envelope survived the expiry)", i, got)
		}
	}
}

// mailboxPushEnv is a fake APNs and the environment of a relay whose app
// chat pushes through it.
func mailboxPushEnv(t *testing.T) (*pushtest.FakeAPNs, []string) {
	t.Helper()
	p8, priv := pushtest.NewAPNsKey(t)
	fake := pushtest.NewAPNs(t, "TEAM123456", "KEY1234567", &priv.PublicKey)
	fake.RequireTopic("com.example.chat")
	return fake, []string{"RELAY_APPS=chat:push=com.example.chat",
		"RELAY_APNS_KEY_FILE=" + pushtest.WriteFile(t, "AuthKey.p8", p8),
		"RELAY_APNS_KEY_ID=KEY1234567", "RELAY_APNS_TEAM_ID=TEAM123456",
		"RELAY_APNS_URL=" + fake.URL(), "SSL_CERT_FILE=" + pushtest.WriteFile(t, "ca.pem", fake.CertPEM())}
}

// pushForegroundAcrossNodes is TestClusterMailboxPushForegroundAcrossNodes
// on c's nodes, pushing to fake.
func pushForegroundAcrossNodes(t *testing.T, c *relayCluster, fake *pushtest.FakeAPNs) {
	node := func(i int) string { return c.nodes[i].origin("mailbox") }
	register := func(l clusterLink, i int, tag string, device int) {
		t.Helper()
		wantAnswer(t, "claim", l.do(t, "PUT", l.url(node(i), ""), nil, ""), 201, "")
		reg := fmt.Sprintf(`{"service":"apns","token":"%064x","environment":"production","tag":%q}`, device, tag)
		wantAnswer(t, "register on node "+strconv.Itoa(i), l.do(t, "PUT", l.url(node(i), "/p2c/push"), []byte(reg), ""), 204, "")
	}
	putNotify := func(l clusterLink, i int, seq uint64) {
		t.Helper()
		ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
		defer cancel()
		if stored, err := l.on(node(i)).Put(ctx, link.P2C, seq, clusterEnvelope(seq, 40, 'p'), sdkmailbox.NotifyAlert); err != nil || !stored {
			t.Fatalf("PUT p2c/%d on node %d with X-Relay-Notify: %v %v", seq, i, stored, err)
		}
	}
	fg, open, none := newClusterLink(t, "chat"), newClusterLink(t, "chat"), newClusterLink(t, "chat")
	register(fg, 1, "foreground", 1)
	register(open, 2, "open", 2)
	register(none, 0, "none", 3)

	// The reader in the foreground: its watch on node 0 sent ping, and the
	// relay answered (so node 0 has marked it).
	w := openWatcher(t, fg, node(0), link.P2C, 0)
	if err := w.w.Ping(); err != nil {
		t.Fatal(err)
	}
	select {
	case <-w.w.Pongs():
	case <-time.After(10 * time.Second):
		t.Fatal("no pong")
	}
	openWatcher(t, open, node(0), link.P2C, 0) // open, never pings
	for i := range c.nodes {
		putNotify(fg, i, uint64(i+1)) // through node 1 and 2: another node's watch; node 0: its own
	}
	putNotify(open, 1, 1)
	putNotify(none, 2, 1)
	// Each push is sent after its write was answered; the foreground
	// writes were answered first, so by the time both other pushes have
	// arrived, theirs would have too.
	got := fake.Wait(2, 20*time.Second)
	if len(got) != 2 {
		t.Fatalf("APNs received %d pushes, want 2 (the reader without a ping, the one without a watch)", len(got))
	}
	tags := map[string]int{}
	for _, r := range got {
		if r.Problem != "" {
			t.Fatalf("push refused by the fake: %s", r.Problem)
		}
		for _, tag := range []string{"foreground", "open", "none"} {
			if strings.Contains(string(r.Body), `"tag":"`+tag+`"`) {
				tags[tag]++
			}
		}
	}
	if tags["foreground"] != 0 || tags["open"] != 1 || tags["none"] != 1 {
		t.Fatalf("pushes by tag %v: want none for the reader in the foreground on another node, one each for the others", tags)
	}
	// One more write for each: nothing for the reader in the foreground,
	// nothing for the one whose registration was deleted through another
	// node, one more for the reader without a ping.
	wantAnswer(t, "delete the registration on node 1", none.do(t, "DELETE", none.url(node(1), "/p2c/push"), nil, ""), 204, "")
	putNotify(fg, 1, 4)
	putNotify(none, 2, 2)
	putNotify(open, 0, 2)
	if got := fake.Wait(3, 20*time.Second); len(got) != 3 || !strings.Contains(string(got[2].Body), `"tag":"open"`) {
		t.Fatalf("APNs received %d pushes after one more write each, want 3, the last for the reader without a ping", len(got))
	}
}
