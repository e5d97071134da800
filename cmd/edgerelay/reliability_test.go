package main

import (
	"bytes"
	"context"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"path"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/fasthttp/websocket"

	"edgerelay/internal/freeport"
	"edgerelay/push/pushtest"
	"edgerelay/sdk/link"
	sdkmailbox "edgerelay/sdk/mailbox"
)

// The reliability tests run the binary as an operator does and stop it the
// hard way (SIGKILL) or the clean way (SIGTERM) while clients keep it busy;
// after each restart on the same data dir, everything the relay
// acknowledged must still be there. `make soak` runs them soakScale times
// longer.

// reliabilityCycles is how many stops one reliability test goes through.
func reliabilityCycles(t *testing.T) int { return 3 * soakScale(t) }

// quickExit makes a race-built command exit at once: the race runtime
// otherwise sleeps a second at exit, and the tests run the command line
// many times. A build without -race ignores it.
const quickExit = "GORACE=atexit_sleep_ms=0"

// answer is one HTTP answer, read whole.
type answer struct {
	code   int
	header http.Header
	body   []byte
}

// request sends one request and reads the whole answer. A transport error
// is returned, not reported: in these tests the server may be gone, and a
// request without an answer is allowed to have done nothing.
func request(c *http.Client, method, url, bearer string, body []byte) (answer, error) {
	req, err := http.NewRequest(method, url, bytes.NewReader(body))
	if err != nil {
		return answer{}, fmt.Errorf("%s %s: %w", method, url, err)
	}
	if bearer != "" {
		req.Header.Set("Authorization", "Bearer "+bearer)
	}
	resp, err := c.Do(req)
	if err != nil {
		return answer{}, fmt.Errorf("%s %s: %w", method, url, err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		return answer{}, fmt.Errorf("%s %s: answer: %w", method, url, err)
	}
	return answer{resp.StatusCode, resp.Header, b}, nil
}

// untilStopped is one client of the load: it calls one until stop closes
// or one returns false (the server stopped answering, or answered what
// ends this client).
func untilStopped(stop <-chan struct{}, one func(*http.Client) bool) {
	client := &http.Client{Timeout: 10 * time.Second}
	for {
		select {
		case <-stop:
			return
		default:
		}
		if !one(client) {
			return
		}
	}
}

// ---- mailbox envelopes ----

// envelopeWriter streams envelope PUTs to one mailbox's p2c direction and
// keeps what the relay acknowledged.
type envelopeWriter struct {
	index int
	token string
	next  uint64 // the last sequence the relay holds or acknowledged
	count atomic.Int64
	mu    sync.Mutex
	acked map[uint64][]byte // 201, or 200 (the same bytes were stored)
}

func newEnvelopeWriter(t *testing.T, base string, index int) *envelopeWriter {
	t.Helper()
	w := &envelopeWriter{index: index, token: fmt.Sprintf("reliability-writer-%04d-0123456789", index), acked: map[uint64][]byte{}}
	if code := mailboxDo(t, "PUT", base+mailboxPath(index), w.token, nil); code != 201 {
		t.Fatalf("claim mailbox %d: %d", index, code)
	}
	return w
}

func (w *envelopeWriter) id() string { return path.Base(mailboxPath(w.index)) }

// run writes envelopes until stop closes or the server stops answering. A
// mailbox's write bucket (120, then 2 a second) lives in memory, so a
// writer that finds it empty waits for the next process rather than
// sleeping on it.
func (w *envelopeWriter) run(t *testing.T, base string, cycle int, stop <-chan struct{}) {
	untilStopped(stop, func(client *http.Client) bool {
		seq := w.next + 1
		e := sealedLike(seq, w.index, cycle)
		a, err := request(client, "PUT", fmt.Sprintf("%s%s/p2c/%d", base, mailboxPath(w.index), seq), w.token, e)
		if err != nil {
			return false // no answer: this write may or may not be stored
		}
		switch a.code {
		case 201, 200:
			w.mu.Lock()
			w.acked[seq] = e
			w.mu.Unlock()
			w.next = seq
			w.count.Add(1)
			return true
		case 429:
			<-stop
		default:
			t.Errorf("writer %d seq %d: %d %s", w.index, seq, a.code, a.body)
		}
		return false
	})
}

// resume sets the writer after the last envelope the relay holds: one
// sent but not answered may or may not be there.
func (w *envelopeWriter) resume(t *testing.T, base string) {
	t.Helper()
	w.next = headLast(t, base+mailboxPath(w.index)+"/p2c", w.token)
}

// stored is every envelope the relay holds in the writer's direction, by
// sequence, read in batches (one fetch each: the fetch bucket would not
// allow one GET per envelope).
func (w *envelopeWriter) stored(t *testing.T, base string) map[uint64][]byte {
	t.Helper()
	mb := (&sdkmailbox.Client{BaseURL: base, App: "notes"}).Mailbox(w.id(), w.token)
	out := map[uint64][]byte{}
	for after, more := uint64(0), true; more; {
		var envs [][]byte
		var err error
		envs, more, err = mb.Batch(context.Background(), link.P2C, after, 1000)
		if err != nil {
			t.Fatalf("writer %d: batch after %d: %v", w.index, after, err)
		}
		for _, e := range envs {
			after = binary.BigEndian.Uint64(e[1:9])
			out[after] = e
		}
	}
	return out
}

// checkHeld fails unless every envelope in want is stored byte for byte.
func (w *envelopeWriter) checkHeld(t *testing.T, stored, want map[uint64][]byte, what string) {
	t.Helper()
	for seq, e := range want {
		if got, ok := stored[seq]; !ok || !bytes.Equal(got, e) {
			t.Fatalf("writer %d seq %d was %s but is missing or changed after the restart (present: %v)", w.index, seq, what, ok)
		}
	}
}

// watcher reads one direction until the relay closes the socket, keeping
// what it received; closed gets the close code (0 for no close frame).
type watcher struct {
	received map[uint64][]byte
	closed   chan int
}

func watch(t *testing.T, base string, w *envelopeWriter) *watcher {
	t.Helper()
	mb := (&sdkmailbox.Client{BaseURL: base, App: "notes"}).Mailbox(w.id(), w.token)
	conn, err := mb.Watch(context.Background(), link.P2C, w.next, false)
	if err != nil {
		t.Fatalf("watch %d: %v", w.index, err)
	}
	t.Cleanup(func() { _ = conn.Close() })
	wt := &watcher{received: map[uint64][]byte{}, closed: make(chan int, 1)}
	go func() {
		for {
			e, err := conn.Next(context.Background())
			if err != nil {
				code, _ := sdkmailbox.CloseCode(err)
				wt.closed <- code
				return
			}
			wt.received[binary.BigEndian.Uint64(e[1:9])] = e
		}
	}()
	return wt
}

// TestReliabilitySIGTERMUnderLoad stops the relay with SIGTERM while
// writers stream envelopes and watchers are open, several times: the
// process must exit 0 within the drain bound, close every watcher with
// 1001, and, restarted on the same data dir, hold every envelope it
// acknowledged and every one a watcher was sent. A write without an answer
// may be missing; none that got 201 or 200 may be.
func TestReliabilitySIGTERMUnderLoad(t *testing.T) {
	const drain = 5 * time.Second
	// The exit follows the drain: Pebble's close and the process's end;
	// generous because the race detector slows both.
	const margin = 5 * time.Second
	env := []string{"RELAY_DATA_DIR=" + t.TempDir(), "RELAY_MAILBOX_LISTEN=" + freeport.TCP(t), "RELAY_APPS=notes", "RELAY_DRAIN_TIMEOUT=" + drain.String(), quickExit}
	s := startServer(t, env...)
	const writers = 6
	ws := make([]*envelopeWriter, writers)
	for i := range ws {
		ws[i] = newEnvelopeWriter(t, s.origin("mailbox"), i)
	}
	for cycle := range reliabilityCycles(t) {
		base := s.origin("mailbox")
		watchers := make([]*watcher, writers)
		for i, w := range ws {
			w.resume(t, base)
			watchers[i] = watch(t, base, w)
		}
		stop := make(chan struct{})
		var wg sync.WaitGroup
		for _, w := range ws {
			w.count.Store(0)
			wg.Go(func() { w.run(t, base, cycle, stop) })
		}
		// Stop once every writer is well into its stream, with writes in
		// flight.
		waitUntil(t, func() bool {
			for _, w := range ws {
				if w.count.Load() < 20 {
					return false
				}
			}
			return true
		})
		begin := time.Now()
		if code := s.signal(syscall.SIGTERM, drain+margin); code != 0 {
			t.Fatalf("cycle %d: exit %d after SIGTERM\n%s", cycle, code, s.stderr.String())
		}
		t.Logf("cycle %d: exited %v after SIGTERM", cycle, time.Since(begin).Round(time.Millisecond))
		close(stop)
		wg.Wait()
		for i, wt := range watchers {
			select {
			case code := <-wt.closed:
				if code != 1001 {
					t.Fatalf("cycle %d: watcher %d closed with %d, want 1001", cycle, i, code)
				}
			case <-time.After(10 * time.Second):
				t.Fatalf("cycle %d: watcher %d still open after the exit", cycle, i)
			}
		}
		s.start()
		for i, w := range ws {
			stored := w.stored(t, s.origin("mailbox"))
			w.checkHeld(t, stored, w.acked, "acknowledged")
			// A clean stop loses nothing a reader saw, acknowledged or not.
			w.checkHeld(t, stored, watchers[i].received, "sent to a watcher")
		}
	}
}

// holdRequest opens a connection to addr and sends head, a request the
// server is left in the middle of (its body, or its headers, never
// complete). The connection stays open until the test ends.
func holdRequest(t *testing.T, addr, head string) {
	t.Helper()
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatalf("hold %s: %v", addr, err)
	}
	t.Cleanup(func() { _ = c.Close() })
	if _, err := io.WriteString(c, head); err != nil {
		t.Fatalf("hold %s: %v", addr, err)
	}
}

// openConns is the relay's gauge of open connections on service's listener.
func openConns(t *testing.T, s *relayProc, service string) int {
	t.Helper()
	_, body := get(t, s.origin("admin")+"/metrics")
	prefix := `edgerelay_listener_open_connections{service="` + service + `"} `
	for _, l := range strings.Split(body, "\n") {
		if v, ok := strings.CutPrefix(l, prefix); ok {
			n, err := strconv.Atoi(v)
			if err != nil {
				t.Fatalf("%s%s: %v", prefix, v, err)
			}
			return n
		}
	}
	return 0
}

// TestReliabilitySIGTERMDrainBound holds things open that a drain cannot
// finish (a mailbox PUT and a push-gateway send whose bodies never end,
// half a request's headers, a watcher that never reads its close frame)
// and checks that SIGTERM stops accepting at once, still ends the process
// within RELAY_DRAIN_TIMEOUT plus a margin with exit 0, and leaves a store
// that opens again with every acknowledged write.
func TestReliabilitySIGTERMDrainBound(t *testing.T) {
	const drain = 2 * time.Second
	const margin = 3 * time.Second
	dir := t.TempDir()
	out, errOut, code := edgerelay(t, []string{"RELAY_DATA_DIR=" + dir, quickExit}, "keys", "push", "create", "--label", "held")
	if code != 0 {
		t.Fatalf("create push key: %d %s", code, errOut)
	}
	apiKey := lastLine(out)
	// The header timeout outlasts the drain, so only the drain bound can
	// end the held requests.
	s := startServer(t, "RELAY_DATA_DIR="+dir, "RELAY_APPS=notes", quickExit,
		"RELAY_DRAIN_TIMEOUT="+drain.String(), "RELAY_HEADER_TIMEOUT=60s")
	base := s.origin("mailbox")
	w := newEnvelopeWriter(t, base, 0)
	acked := sealedLike(1, 0, 0)
	if code := mailboxDo(t, "PUT", base+mailboxPath(0)+"/p2c/1", w.token, acked); code != 201 {
		t.Fatalf("put: %d", code)
	}
	w.next = 1
	held := map[string]int{"mailbox": 2, "push-apns": 1, "channel": 1}
	before := map[string]int{}
	for svc := range held {
		before[svc] = openConns(t, s, svc)
	}
	holdRequest(t, s.addrs["mailbox"], fmt.Sprintf("PUT %s/p2c/2 HTTP/1.1\r\nHost: relay\r\nAuthorization: Bearer %s\r\nContent-Length: 225\r\n\r\n\x01", mailboxPath(0), w.token))
	holdRequest(t, s.addrs["push-apns"], "POST /send HTTP/1.1\r\nHost: relay\r\nAuthorization: Bearer "+apiKey+"\r\nContent-Type: application/json\r\nContent-Length: 200\r\n\r\n{\"token\":")
	holdRequest(t, s.addrs["channel"], "GET /health HTTP/1.1\r\nHost: rel")
	// A watcher that never reads, so never answers the close frame.
	d := websocket.Dialer{Subprotocols: []string{sdkmailbox.Subprotocol}}
	silent, _, err := d.Dial("ws://"+s.addrs["mailbox"]+mailboxPath(0)+"/p2c/watch?after=1", http.Header{"Authorization": {"Bearer " + w.token}})
	if err != nil {
		t.Fatalf("silent watcher: %v", err)
	}
	defer silent.Close()
	// Every held connection must be accepted before the signal: one still
	// in the backlog would be refused, not held.
	waitUntil(t, func() bool {
		for svc, n := range held {
			if openConns(t, s, svc) < before[svc]+n {
				return false
			}
		}
		return true
	})
	begin := time.Now()
	if err := s.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	// Draining stops accepting at once, while the held requests keep the
	// process alive.
	waitUntil(t, func() bool {
		c, err := net.Dial("tcp", s.addrs["mailbox"])
		if err == nil {
			c.Close()
		}
		return err != nil
	})
	select {
	case <-s.exited:
		t.Fatalf("exited %v after SIGTERM, before the drain bound: nothing was held", time.Since(begin))
	default:
	}
	select {
	case <-s.exited:
	case <-time.After(drain + margin):
		t.Fatalf("no exit within %v after SIGTERM", drain+margin)
	}
	t.Logf("exited %v after SIGTERM", time.Since(begin).Round(time.Millisecond))
	// A drain cut short at its bound is still a clean stop (README: exit 0
	// within RELAY_DRAIN_TIMEOUT): the store closed with everything
	// acknowledged in it.
	if code := s.cmd.ProcessState.ExitCode(); code != 0 {
		t.Fatalf("exit %d\n%s", code, s.stderr.String())
	}
	s.start()
	w.checkHeld(t, w.stored(t, s.origin("mailbox")), map[uint64][]byte{1: acked}, "acknowledged")
}

// ---- private channel claims ----

// channelHost is what the test knows of one computer's claim key: only
// what the relay or the command line acknowledged.
type channelHost struct {
	name, key    string
	owner, phone string // the tokens of the claim that got 200
	released     bool   // DELETE /claim got 200
	revoked      bool   // `keys channel revoke` exited 0
	unsure       bool   // a claim or release got no answer: the tokens' state is unknown
}

// operator runs the command line as an operator does: through the running
// relay's admin listener, or on the store when none runs.
type operator struct {
	t   *testing.T
	env []string
}

// run runs one command, which must succeed, and returns its output.
func (o operator) run(args ...string) string {
	o.t.Helper()
	out, errOut, code := edgerelay(o.t, o.env, args...)
	if code != 0 {
		o.t.Fatalf("%s: exit %d: %s", strings.Join(args, " "), code, errOut)
	}
	return out
}

// table runs a list command and returns its rows by first column.
func (o operator) table(args ...string) map[string][]string {
	o.t.Helper()
	rows := map[string][]string{}
	for _, l := range strings.Split(strings.TrimSpace(o.run(args...)), "\n")[1:] {
		f := strings.Fields(l)
		rows[f[0]] = f
	}
	return rows
}

func (o operator) addHost(name string) *channelHost {
	o.t.Helper()
	return &channelHost{name: name, key: lastLine(o.run("keys", "channel", "add", "--host", name))}
}

func (o operator) revokeHost(h *channelHost) {
	o.t.Helper()
	o.run("keys", "channel", "revoke", "--host", h.name)
	h.revoked = true
}

// claimRace sends two competing claims with h's key; the winner (200)
// releases its claim at once when release is set. won gets h when a
// claim is acknowledged.
func claimRace(t *testing.T, origin string, h *channelHost, release bool, mu *sync.Mutex, won chan<- *channelHost) {
	var wg sync.WaitGroup
	client := &http.Client{Timeout: 10 * time.Second}
	for range 2 {
		wg.Go(func() {
			owner, phone := randHex(t), randHex(t)
			body := fmt.Appendf(nil, `{"ownerToken":%q,"phoneToken":%q}`, owner, phone)
			a, err := request(client, "POST", origin+"/claim", h.key, body)
			mu.Lock()
			defer mu.Unlock()
			switch {
			case err != nil:
				h.unsure = h.unsure || h.owner == ""
				return
			case a.code == 409:
				return
			case a.code != 200:
				t.Errorf("claim %s: %d %s", h.name, a.code, a.body)
				return
			case h.owner != "":
				t.Errorf("claim %s: two competing claims both got 200", h.name)
				return
			}
			h.owner, h.phone, h.unsure = owner, phone, false
			won <- h
			if !release {
				return
			}
			mu.Unlock()
			a, err = request(client, "DELETE", origin+"/claim", owner, nil)
			mu.Lock()
			switch {
			case err != nil:
				h.unsure = true
			case a.code == 200:
				h.released = true
			default:
				t.Errorf("release %s: %d %s", h.name, a.code, a.body)
			}
		})
	}
	wg.Wait()
}

// statusLoad asks for the status of every owner in turn until stop closes
// or the relay stops answering.
func statusLoad(t *testing.T, origin string, owners []string, stop <-chan struct{}) {
	i := 0
	untilStopped(stop, func(client *http.Client) bool {
		i++
		path, bearer := "/health", "" // before the first claim
		if len(owners) > 0 {
			path, bearer = "/status", owners[i%len(owners)]
		}
		a, err := request(client, "GET", origin+path, bearer, nil)
		if err != nil {
			return false
		}
		if a.code != 200 && a.code != 404 { // 404: revoked under the load
			t.Errorf("status under load: %d %s", a.code, a.body)
			return false
		}
		return true
	})
}

// check compares what the relay answers about h, and its row in `keys
// channel list`, with what was acknowledged before the kill.
func (h *channelHost) check(t *testing.T, origin string, rows map[string][]string) {
	t.Helper()
	var row [2]string // USED, CLAIMED
	r, listed := rows[h.name]
	if listed {
		row = [2]string{r[1], r[2]}
	}
	switch {
	case h.revoked:
		if st, _, _ := claim(t, origin, h.key); st != 403 || listed {
			t.Fatalf("%s revoked, then after the kill: claim %d, listed %v", h.name, st, listed)
		}
		if h.owner != "" {
			if st, _ := statusOf(t, origin, h.owner); st != 404 {
				t.Fatalf("%s revoked, then after the kill: status %d", h.name, st)
			}
		}
	case h.owner != "":
		if st, _, _ := claim(t, origin, h.key); st != 409 {
			t.Fatalf("%s used, then after the kill: claim %d", h.name, st)
		}
		if h.unsure {
			return
		}
		st, body := statusOf(t, origin, h.owner)
		wantRow := [2]string{"true", strconv.FormatBool(!h.released)}
		if h.released && st != 404 || !h.released && (st != 200 || !strings.Contains(body, `"host":"`+h.name+`"`)) || row != wantRow {
			t.Fatalf("%s (released %v) after the kill: status %d %s, list %v", h.name, h.released, st, body, row)
		}
	case !h.unsure:
		if row != [2]string{"false", "false"} {
			t.Fatalf("%s unused, then after the kill: list %v (listed %v)", h.name, row, listed)
		}
	}
}

// phoneReachesComputer connects h's computer and one phone: the phone token
// still admits a phone to that computer.
func phoneReachesComputer(t *testing.T, addr string, h *channelHost) {
	t.Helper()
	ctl, _, err := websocket.DefaultDialer.Dial("ws://"+addr+"/host", http.Header{"Authorization": {"Bearer " + h.owner}})
	if err != nil {
		t.Fatalf("%s control socket after the kill: %v", h.name, err)
	}
	defer ctl.Close()
	ph, _, err := websocket.DefaultDialer.Dial("ws://"+addr+"/botharness-device/channel", http.Header{"Authorization": {"Bearer " + h.phone}})
	if err != nil {
		t.Fatalf("%s phone after the kill: %v", h.name, err)
	}
	defer ph.Close()
	_ = ctl.SetReadDeadline(time.Now().Add(10 * time.Second))
	if _, msg, err := ctl.ReadMessage(); err != nil || !strings.Contains(string(msg), `"type":"open"`) {
		t.Fatalf("%s: no open after the phone connected: %s %v", h.name, msg, err)
	}
}

// TestReliabilityChannelClaimsSurviveSIGKILL kills the channel relay with
// SIGKILL in the middle of a burst of competing claims and releases, while
// readers poll /status and after the operator added and revoked keys
// online, several times. After each restart every acknowledged fact holds:
// a claimed key stays used (409) and its tokens keep working (status,
// phone admission), a released key stays used and its tokens forgotten, a
// revoked key stays unknown (403), and a key added online is there, unused,
// and claimable. TestClaimsSurviveHardRestart covers one quiet claim.
func TestReliabilityChannelClaimsSurviveSIGKILL(t *testing.T) {
	env := []string{"RELAY_DATA_DIR=" + t.TempDir(), "RELAY_CHANNEL_LISTEN=" + freeport.TCP(t), "RELAY_ADMIN_LISTEN=" + freeport.TCP(t), quickExit}
	s := startServer(t, env...)
	ops := operator{t: t, env: env}
	var mu sync.Mutex // guards every channelHost while racers run
	var hosts, unused []*channelHost
	var claimedOwners []string
	for cycle := range reliabilityCycles(t) {
		origin := s.origin("channel")
		stop := make(chan struct{})
		var wg sync.WaitGroup
		owners := claimedOwners
		for range 2 {
			wg.Go(func() { statusLoad(t, origin, owners, stop) })
		}
		// The operator works online under that load: a batch of new keys,
		// one revoked unused, one claimed computer revoked.
		for i := range 12 {
			h := ops.addHost(fmt.Sprintf("c%d-host%d", cycle, i))
			hosts, unused = append(hosts, h), append(unused, h)
		}
		ops.revokeHost(unused[len(unused)-1])
		for _, h := range hosts {
			if h.owner != "" && !h.released && !h.revoked && !h.unsure {
				ops.revokeHost(h)
				break
			}
		}
		// One new key stays unused until the next cycle: a key added
		// online before a kill must be claimable after it.
		burst, keep := unused[:len(unused)-2], unused[len(unused)-2]
		unused = []*channelHost{keep}
		won := make(chan *channelHost, len(burst))
		for i, h := range burst {
			wg.Go(func() { claimRace(t, origin, h, i%3 == 0, &mu, won) })
		}
		for range len(burst) / 2 {
			<-won
		}
		s.kill()
		close(stop)
		wg.Wait()
		s.start()
		rows := ops.table("keys", "channel", "list")
		phoneChecked := false
		claimedOwners = nil
		for _, h := range hosts {
			h.check(t, origin, rows)
			if h.owner != "" && !h.released && !h.revoked && !h.unsure {
				claimedOwners = append(claimedOwners, h.owner)
				if !phoneChecked {
					phoneReachesComputer(t, s.addrs["channel"], h)
					phoneChecked = true
				}
			}
		}
		if !phoneChecked {
			t.Fatalf("cycle %d: no claim was acknowledged", cycle)
		}
	}
}

// ---- push gateway: keys, device-token claims, daily budget ----

// pushGatewayEnv is a relay whose APNs gateway mount delivers to a fake
// APNs, with the gateway and admin listeners on ports that stay across
// restarts (the command line reaches the admin listener).
func pushGatewayEnv(t *testing.T, extra ...string) ([]string, *pushtest.FakeAPNs) {
	t.Helper()
	p8, priv := pushtest.NewAPNsKey(t)
	fake := pushtest.NewAPNs(t, "TEAM123456", "KEY1234567", &priv.PublicKey)
	env := []string{
		"RELAY_DATA_DIR=" + t.TempDir(), "RELAY_PUSH_APNS_LISTEN=" + freeport.TCP(t), "RELAY_ADMIN_LISTEN=" + freeport.TCP(t), quickExit,
		"RELAY_APNS_KEY_FILE=" + pushtest.WriteFile(t, "AuthKey.p8", p8), "RELAY_APNS_KEY_ID=KEY1234567", "RELAY_APNS_TEAM_ID=TEAM123456",
		"RELAY_APNS_TOPIC=org.example.app", "RELAY_APNS_URL=" + fake.URL(), "SSL_CERT_FILE=" + pushtest.WriteFile(t, "ca.pem", fake.CertPEM()),
		// The load sends far more than the default 10 a minute per key.
		"RELAY_PUSH_RATE_PER_MINUTE=1000000",
	}
	return append(env, extra...), fake
}

// pushKey is what the test knows of one API key: what the command line
// acknowledged.
type pushKey struct {
	id, key  string
	disabled bool
	revoked  bool
}

func (o operator) createPushKey(label string) *pushKey {
	o.t.Helper()
	out := o.run("keys", "push", "create", "--label", label)
	// "push gateway key <id> …" then the key alone on the last line.
	return &pushKey{id: strings.Fields(out)[3], key: lastLine(out)}
}

// setPushKey runs disable, enable or revoke on k.
func (o operator) setPushKey(k *pushKey, verb string) {
	o.t.Helper()
	o.run("keys", "push", verb, "--id", k.id)
	k.disabled, k.revoked = verb == "disable", verb == "revoke"
}

// deviceTokens hands out fresh APNs device tokens (64 hex), one claim each.
type deviceTokens struct{ n atomic.Int64 }

func (d *deviceTokens) next() string { return fmt.Sprintf("%064x", d.n.Add(1)) }

func pushSend(c *http.Client, origin, key, token string) (answer, error) {
	return request(c, "POST", origin+"/send", key, fmt.Appendf(nil, `{"token":%q,"title":"t","body":"b"}`, token))
}

// mustSend is pushSend from the test goroutine, where no answer is a failure.
func mustSend(t *testing.T, origin, key, token string) answer {
	t.Helper()
	a, err := pushSend(http.DefaultClient, origin, key, token)
	if err != nil {
		t.Fatal(err)
	}
	return a
}

// sendLoad sends from key, each time to a fresh device token, until stop
// closes, the relay stops answering or judge, which sees every answer,
// returns false.
func sendLoad(origin, key string, tokens *deviceTokens, stop <-chan struct{}, judge func(token string, a answer) bool) {
	untilStopped(stop, func(client *http.Client) bool {
		tok := tokens.next()
		a, err := pushSend(client, origin, key, tok)
		return err == nil && judge(tok, a)
	})
}

// isError reports whether a is status code with the gateway's error body
// {"error":msg,…}.
func isError(a answer, code int, msg string) bool {
	return a.code == code && bytes.HasPrefix(a.body, fmt.Appendf(nil, `{"error":%q,`, msg))
}

// check compares what the gateway answers k after the kill with what the
// command line acknowledged before it.
func (k *pushKey) check(t *testing.T, origin string, rows map[string][]string, tokens *deviceTokens) {
	t.Helper()
	a := mustSend(t, origin, k.key, tokens.next())
	var row string // ENABLED
	r, listed := rows[k.id]
	if listed {
		row = r[3]
	}
	switch {
	case k.revoked:
		if !isError(a, 401, "invalid api key") || listed {
			t.Fatalf("key %s revoked, then after the kill: %d %s, listed %v", k.id, a.code, a.body, listed)
		}
	case k.disabled:
		if !isError(a, 401, "invalid api key") || row != "false" {
			t.Fatalf("key %s disabled, then after the kill: %d %s, list %q", k.id, a.code, a.body, row)
		}
	default:
		if a.code != 200 || row != "true" {
			t.Fatalf("key %s active, then after the kill: %d %s, list %q", k.id, a.code, a.body, row)
		}
	}
}

// TestReliabilityPushKeysSurviveSIGKILL changes API keys online (create,
// disable, enable, revoke through the admin listener) while other keys
// send under load, then kills the relay with SIGKILL, several times. After
// each restart every key is as the command line last acknowledged: an
// active key sends (200), a disabled or revoked one is refused with 401
// "invalid api key", and the list agrees.
func TestReliabilityPushKeysSurviveSIGKILL(t *testing.T) {
	env, _ := pushGatewayEnv(t)
	ops := operator{t: t, env: env}
	// The load's keys, made on the stopped store; nobody changes them.
	load := []*pushKey{ops.createPushKey("load-0"), ops.createPushKey("load-1")}
	s := startServer(t, env...)
	var tokens deviceTokens
	var keys []*pushKey
	for cycle := range reliabilityCycles(t) {
		origin := s.origin("push-apns")
		stop := make(chan struct{})
		var wg sync.WaitGroup
		for _, k := range load {
			for range 2 {
				wg.Go(func() {
					sendLoad(origin, k.key, &tokens, stop, func(_ string, a answer) bool {
						if a.code != 200 {
							t.Errorf("load key %s: %d %s", k.id, a.code, a.body)
						}
						return a.code == 200
					})
				})
			}
		}
		// Keys of earlier cycles change: a disabled one comes back, an
		// active one is disabled, another revoked.
		var active []*pushKey
		for _, k := range keys {
			switch {
			case k.disabled:
				ops.setPushKey(k, "enable")
			case !k.revoked:
				active = append(active, k)
			}
		}
		if len(active) >= 2 {
			ops.setPushKey(active[0], "disable")
			ops.setPushKey(active[1], "revoke")
		}
		// New keys: one stays active, one is disabled, one revoked.
		for i := range 3 {
			keys = append(keys, ops.createPushKey(fmt.Sprintf("c%d-key%d", cycle, i)))
		}
		n := len(keys)
		ops.setPushKey(keys[n-2], "disable")
		ops.setPushKey(keys[n-1], "revoke")
		s.kill()
		close(stop)
		wg.Wait()
		s.start()
		rows := ops.table("keys", "push", "list")
		for _, k := range append(keys, load...) {
			k.check(t, s.origin("push-apns"), rows, &tokens)
		}
	}
}

// TestReliabilityPushTokenClaimsSurviveSIGKILL: a key sends to fresh device
// tokens under load (each first send is a durable claim) and the relay is
// killed with SIGKILL mid-stream, several times. After each restart every
// token whose send was acknowledged is still bound to that key: another
// active key is refused (403, the spec's message) while the owner still
// delivers.
func TestReliabilityPushTokenClaimsSurviveSIGKILL(t *testing.T) {
	env, _ := pushGatewayEnv(t)
	ops := operator{t: t, env: env}
	owner, other := ops.createPushKey("owner"), ops.createPushKey("other")
	s := startServer(t, env...)
	var tokens deviceTokens
	var claimed []string // tokens whose send by owner got 200
	for cycle := range reliabilityCycles(t) {
		origin := s.origin("push-apns")
		var mu sync.Mutex // guards claimed
		from := len(claimed)
		stop := make(chan struct{})
		var wg sync.WaitGroup
		for range 4 {
			wg.Go(func() {
				sendLoad(origin, owner.key, &tokens, stop, func(tok string, a answer) bool {
					if a.code != 200 {
						t.Errorf("owner's send: %d %s", a.code, a.body)
						return false
					}
					mu.Lock()
					defer mu.Unlock()
					claimed = append(claimed, tok)
					return true
				})
			})
		}
		waitUntil(t, func() bool {
			mu.Lock()
			defer mu.Unlock()
			return len(claimed)-from >= 40
		})
		s.kill()
		close(stop)
		wg.Wait()
		s.start()
		origin = s.origin("push-apns")
		// The other key works: its refusals below are about the claims.
		if a := mustSend(t, origin, other.key, tokens.next()); a.code != 200 {
			t.Fatalf("other key on a fresh token: %d %s", a.code, a.body)
		}
		for i, tok := range claimed {
			if a := mustSend(t, origin, other.key, tok); !isError(a, 403, "token is already bound to a different active api key") {
				t.Fatalf("cycle %d: token %d claimed before the kill, then another key got %d %s", cycle, i, a.code, a.body)
			}
			if i < from {
				continue // the owner's own sends were checked in their cycle
			}
			if a := mustSend(t, origin, owner.key, tok); a.code != 200 {
				t.Fatalf("cycle %d: the owner of token %d after the kill: %d %s", cycle, i, a.code, a.body)
			}
		}
	}
}

// skipNearUTCMidnight skips a budget test that could run into the next UTC
// day, when the gateway's daily budget starts afresh.
func skipNearUTCMidnight(t *testing.T, within time.Duration) {
	t.Helper()
	now := time.Now().UTC()
	if next := now.Truncate(24 * time.Hour).Add(24 * time.Hour); next.Sub(now) < within {
		t.Skipf("%v to UTC midnight: the daily budget would restart mid-test", next.Sub(now).Round(time.Second))
	}
}

// isBudgetExhausted reports whether a is the spec's refusal of a spent
// daily budget of limit: 429 with window "day" and Retry-After equal to
// retryAfterSeconds, at least 1.
func isBudgetExhausted(a answer, limit int) bool {
	var body struct {
		Error      string `json:"error"`
		Window     string `json:"window"`
		Limit      int    `json:"limit"`
		RetryAfter int    `json:"retryAfterSeconds"`
	}
	if a.code != 429 || json.Unmarshal(a.body, &body) != nil {
		return false
	}
	return body.Error == "relay daily budget exhausted" && body.Window == "day" && body.Limit == limit &&
		body.RetryAfter >= 1 && a.header.Get("Retry-After") == strconv.Itoa(body.RetryAfter)
}

// budgetRig is a gateway with a daily budget of limit, its fake APNs and
// two keys, and what was acknowledged over all its process lives.
type budgetRig struct {
	t        *testing.T
	s        *relayProc
	fake     *pushtest.FakeAPNs
	keys     []*pushKey
	limit    int
	tokens   deviceTokens
	sent     atomic.Int64 // sends acknowledged (200)
	answered atomic.Int64 // sends answered, acknowledged or refused
}

func newBudgetRig(t *testing.T, limit int) *budgetRig {
	t.Helper()
	env, fake := pushGatewayEnv(t, fmt.Sprintf("RELAY_PUSH_DAILY_BUDGET=%d", limit))
	ops := operator{t: t, env: env}
	r := &budgetRig{t: t, fake: fake, limit: limit, keys: []*pushKey{ops.createPushKey("a"), ops.createPushKey("b")}}
	r.s = startServer(t, env...)
	return r
}

// stopUnderLoad runs senders until atLeast more sends are answered, stops
// the relay with stop while they still send, and starts it again. Every
// answer is 200 or the spent budget's refusal.
func (r *budgetRig) stopUnderLoad(atLeast int64, stop func()) {
	r.t.Helper()
	from := r.answered.Load()
	done := make(chan struct{})
	var wg sync.WaitGroup
	for _, k := range r.keys {
		for range 4 {
			wg.Go(func() {
				sendLoad(r.s.origin("push-apns"), k.key, &r.tokens, done, func(_ string, a answer) bool {
					r.answered.Add(1)
					switch {
					case a.code == 200:
						r.sent.Add(1)
					case !isBudgetExhausted(a, r.limit):
						r.t.Errorf("send under load: %d %s", a.code, a.body)
						return false
					}
					return true
				})
			})
		}
	}
	waitUntil(r.t, func() bool { return r.answered.Load()-from >= atLeast })
	stop()
	close(done)
	wg.Wait()
	r.s.start()
}

// drain sends one at a time until the budget refuses, and returns how many
// were acknowledged.
func (r *budgetRig) drain() int {
	r.t.Helper()
	for n := 0; n <= r.limit; n++ {
		a := mustSend(r.t, r.s.origin("push-apns"), r.keys[0].key, r.tokens.next())
		if isBudgetExhausted(a, r.limit) {
			return n
		}
		if a.code != 200 {
			r.t.Fatalf("send %d of the drain: %d %s", n, a.code, a.body)
		}
	}
	r.t.Fatalf("more than the budget of %d acknowledged in one drain", r.limit)
	return 0
}

// TestReliabilityPushBudgetSurvivesSIGKILL kills the gateway with SIGKILL
// while senders spend its daily budget, several times, then spends the
// rest: over all the process lives, no more sends are acknowledged, or
// reach APNs, than the budget (a kill never gives back what was counted;
// it may forfeit what was reserved). An exhausted budget stays exhausted
// across a kill under load.
func TestReliabilityPushBudgetSurvivesSIGKILL(t *testing.T) {
	cycles := reliabilityCycles(t)
	skipNearUTCMidnight(t, time.Duration(cycles)*time.Minute)
	// Each cycle acknowledges a few dozen sends and a kill may forfeit up
	// to one reservation block (64) more: room for all, and a rest.
	r := newBudgetRig(t, 150*cycles+100)
	for range cycles {
		r.stopUnderLoad(30, r.s.kill)
	}
	rest := r.drain()
	total, reached := int(r.sent.Load())+rest, len(r.fake.Requests())
	if total > r.limit || reached > r.limit {
		t.Fatalf("budget %d, but %d sends acknowledged and %d reached APNs across the kills", r.limit, total, reached)
	}
	t.Logf("budget %d: %d acknowledged under load, %d in the final drain, %d reached APNs", r.limit, r.sent.Load(), rest, reached)
	// Spent, under load, killed: still spent.
	before := r.sent.Load()
	r.stopUnderLoad(20, r.s.kill)
	if a := mustSend(t, r.s.origin("push-apns"), r.keys[1].key, r.tokens.next()); !isBudgetExhausted(a, r.limit) || r.sent.Load() != before {
		t.Fatalf("spent budget after a kill: %d %s (%d acknowledged while spent)", a.code, a.body, r.sent.Load()-before)
	}
}

// TestReliabilityPushBudgetExactAcrossSIGTERM stops the gateway with
// SIGTERM while senders spend its budget, several times, then spends the
// rest: a clean stop forfeits nothing, so exactly the budget is
// acknowledged over all the process lives, and exactly that many sends
// reach APNs.
func TestReliabilityPushBudgetExactAcrossSIGTERM(t *testing.T) {
	cycles := reliabilityCycles(t)
	skipNearUTCMidnight(t, time.Duration(cycles)*time.Minute)
	r := newBudgetRig(t, 60*cycles+40)
	for range cycles {
		r.stopUnderLoad(20, func() {
			if code := r.s.signal(syscall.SIGTERM, 15*time.Second); code != 0 {
				t.Fatalf("exit %d after SIGTERM\n%s", code, r.s.stderr.String())
			}
		})
	}
	rest := r.drain()
	if total, reached := int(r.sent.Load())+rest, len(r.fake.Requests()); total != r.limit || reached != r.limit {
		t.Fatalf("budget %d, but %d sends acknowledged (%d under load, %d after) and %d reached APNs across clean stops",
			r.limit, total, r.sent.Load(), rest, reached)
	}
}
