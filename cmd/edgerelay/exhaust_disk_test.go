package main

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"edgerelay/sdk/link"
	sdkmailbox "edgerelay/sdk/mailbox"
)

// diskReserve is the test's RELAY_DISK_RESERVE on a 64 MiB tmpfs: 16 MiB,
// of which 8 MiB are the ballast.
const diskReserve = 16 << 20

// promptly bounds an answer of a relay whose disk is full: far below a
// client's patience, far above a refusal's cost.
const promptly = 2 * time.Second

// diskFullRig is a relay on a small tmpfs of its own, and what the test
// needs to write to every service.
type diskFullRig struct {
	t        *testing.T
	s        *relayProc
	mount    string
	client   *http.Client // plain HTTP, bounded: a hang fails the test
	agent    *http.Client // TLS to the agent listener's development CA
	claimKey string       // channel claim key of host "box"
	pairKey  string       // agent pairing key of account "alice"
}

// mountTmpfs mounts a 64 MiB tmpfs for the data dir, or skips the test.
func mountTmpfs(t *testing.T) string {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("needs root to mount a small tmpfs as the data dir (CI runs as root)")
	}
	dir := filepath.Join(t.TempDir(), "data")
	if err := os.Mkdir(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	if out, err := exec.Command("mount", "-t", "tmpfs", "-o", "size=64m,mode=0700", "tmpfs", dir).CombinedOutput(); err != nil {
		t.Skipf("cannot mount a tmpfs (%v: %s); this test needs one", err, out)
	}
	// Registered before the relay's own clean-up, so it runs after the
	// process is gone.
	t.Cleanup(func() {
		if out, err := exec.Command("umount", "-l", dir).CombinedOutput(); err != nil {
			t.Errorf("umount %s: %v %s", dir, err, out)
		}
	})
	return dir
}

func startDiskFullRig(t *testing.T) *diskFullRig {
	t.Helper()
	r := &diskFullRig{t: t, mount: mountTmpfs(t), client: &http.Client{Timeout: 5 * time.Second}}
	env := []string{"RELAY_DATA_DIR=" + r.mount}
	r.claimKey = lastLine(cliOK(t, env, "keys", "channel", "add", "--host", "box"))
	cliOK(t, env, "keys", "agent", "account", "add", "alice")
	r.pairKey = lastLine(cliOK(t, env, "keys", "agent", "pair-key", "alice"))
	r.s = startServer(t, append(env, "RELAY_APPS=notes", "RELAY_PUSH_REGISTRATION=true",
		fmt.Sprintf("RELAY_DISK_RESERVE=%d", diskReserve), "RELAY_DRAIN_TIMEOUT=3s", quickRaceExit)...)
	caPEM, err := os.ReadFile(filepath.Join(r.mount, "tls", "ca.pem"))
	if err != nil {
		t.Fatal(err)
	}
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(caPEM)
	r.agent = &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS13}}}
	return r
}

// diskAnswer is one HTTP answer and how long it took.
type diskAnswer struct {
	status     int
	body       string
	retryAfter string
	took       time.Duration
}

func (r *diskFullRig) do(client *http.Client, method, url, bearer string, body []byte) (diskAnswer, error) {
	req, err := http.NewRequest(method, url, bytes.NewReader(body))
	if err != nil {
		return diskAnswer{}, err
	}
	if bearer != "" {
		req.Header.Set("Authorization", "Bearer "+bearer)
	}
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	begin := time.Now()
	resp, err := client.Do(req)
	if err != nil {
		return diskAnswer{}, fmt.Errorf("%s %s: %w", method, url, err)
	}
	b, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	return diskAnswer{resp.StatusCode, string(b), resp.Header.Get("Retry-After"), time.Since(begin)}, err
}

func (r *diskFullRig) must(client *http.Client, method, url, bearer string, body []byte) diskAnswer {
	r.t.Helper()
	a, err := r.do(client, method, url, bearer, body)
	if err != nil {
		r.t.Fatalf("%v\n%s", err, r.s.exitReport())
	}
	return a
}

func (r *diskFullRig) readyz() int {
	return r.must(r.client, "GET", r.s.origin("admin")+"/readyz", "", nil).status
}

// refusedGauge is the value of edgerelay_store_writes_refused.
func (r *diskFullRig) refusedGauge() string {
	r.t.Helper()
	_, body := get(r.t, r.s.origin("admin")+"/metrics")
	for _, l := range strings.Split(body, "\n") {
		if v, ok := strings.CutPrefix(l, "edgerelay_store_writes_refused "); ok {
			return v
		}
	}
	return ""
}

// fill writes a file into the data dir's filesystem until it is full and
// returns its path.
func (r *diskFullRig) fill() string {
	r.t.Helper()
	path := filepath.Join(r.mount, "filler")
	f, err := os.Create(path)
	if err != nil {
		r.t.Fatal(err)
	}
	defer f.Close()
	chunk := make([]byte, 1<<20)
	for {
		if _, err := f.Write(chunk); err != nil {
			if !errors.Is(err, syscall.ENOSPC) {
				r.t.Fatalf("filler: %v", err)
			}
			return path
		}
	}
}

// storeRefusals checks that every service answers a write with its own
// 503 shape, promptly, with Retry-After.
func (r *diskFullRig) storeRefusals(round int) {
	r.t.Helper()
	checks := []struct {
		what   string
		client *http.Client
		method string
		url    string
		bearer string
		body   []byte
		want   func(body string) bool
	}{
		{"mailbox claim", r.client, "PUT", r.s.origin("mailbox") + fmt.Sprintf("/v1/notes/mailbox/full-disk-claim-%04d", round), "full-claim-token-0123456789", nil,
			func(b string) bool { return b == `{"error":"storage_unavailable","status":503}` }},
		{"channel claim", r.client, "POST", r.s.origin("channel") + "/claim", r.claimKey,
			[]byte(`{"ownerToken":"` + strings.Repeat("a", 64) + `","phoneToken":"` + strings.Repeat("b", 64) + `"}`),
			func(b string) bool { return b == `{"error":"storage unavailable"}` }},
		{"agent pairing", r.agent, "POST", "https://" + r.s.addrs["agent"] + "/v1/pair/redeem", "",
			[]byte(`{"key":"` + r.pairKey + `","instance_name":"build-box"}`),
			func(b string) bool { return b == `{"error":{"message":"storage unavailable"}}` }},
		{"push-gateway registration", r.client, "POST", r.s.origin("push-fcm") + "/register", "", []byte(`{"label":"full"}`),
			func(b string) bool {
				var m map[string]any
				return json.Unmarshal([]byte(b), &m) == nil && m["error"] == "storage unavailable" && m["requestId"] != nil
			}},
	}
	if round > 0 {
		// The claim key and the pairing key are spent by round 0's
		// recovery, and /register allows 5 a minute: later rounds check
		// the mailbox alone.
		checks = checks[:1]
	}
	for _, c := range checks {
		a := r.must(c.client, c.method, c.url, c.bearer, c.body)
		if a.status != 503 || !c.want(a.body) || a.retryAfter == "" || a.took > promptly {
			r.t.Fatalf("round %d, %s on a full disk: %d %s, Retry-After %q, in %v; want its 503 shape with Retry-After within %v",
				round, c.what, a.status, a.body, a.retryAfter, a.took, promptly)
		}
	}
}

// storeWrites checks that every service writes again; the channel claim
// key and the pairing key were not spent by the refusals.
func (r *diskFullRig) storeWrites(round int) {
	r.t.Helper()
	a := r.must(r.client, "PUT", r.s.origin("mailbox")+fmt.Sprintf("/v1/notes/mailbox/full-disk-claim-%04d", round), "full-claim-token-0123456789", nil)
	if a.status != 201 {
		r.t.Fatalf("round %d, mailbox claim after recovery: %d %s", round, a.status, a.body)
	}
	if round > 0 {
		return // the channel claim key and the pairing key are used once
	}
	a = r.must(r.client, "POST", r.s.origin("channel")+"/claim", r.claimKey,
		[]byte(`{"ownerToken":"`+strings.Repeat("a", 64)+`","phoneToken":"`+strings.Repeat("b", 64)+`"}`))
	if a.status != 200 {
		r.t.Fatalf("channel claim after recovery: %d %s (the refusal must not spend the key)", a.status, a.body)
	}
	a = r.must(r.agent, "POST", "https://"+r.s.addrs["agent"]+"/v1/pair/redeem", "", []byte(`{"key":"`+r.pairKey+`","instance_name":"build-box"}`))
	if a.status != 200 {
		r.t.Fatalf("agent pairing after recovery: %d %s (the refusal must not spend the key)", a.status, a.body)
	}
	a = r.must(r.client, "POST", r.s.origin("push-fcm")+"/register", "", []byte(`{"label":"back"}`))
	if a.status != 201 {
		r.t.Fatalf("push-gateway registration after recovery: %d %s", a.status, a.body)
	}
}

// floodClaims claims fresh mailboxes from 8 clients for d on a full
// disk; each claim must be refused promptly with 503. It returns how many
// were.
func (r *diskFullRig) floodClaims(round int, d time.Duration) int64 {
	r.t.Helper()
	var n atomic.Int64
	var bad atomic.Pointer[string]
	end := time.Now().Add(d)
	var wg sync.WaitGroup
	for c := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; time.Now().Before(end); i++ {
				url := r.s.origin("mailbox") + fmt.Sprintf("/v1/notes/mailbox/flood-%d-%d-%06d", round, c, i)
				a, err := r.do(r.client, "PUT", url, "flood-token-0123456789", nil)
				if err == nil && (a.status != 503 || a.body != `{"error":"storage_unavailable","status":503}` || a.took > promptly) {
					err = fmt.Errorf("claim on a full disk: %d %s in %v", a.status, a.body, a.took)
				}
				if err != nil {
					msg := err.Error()
					bad.CompareAndSwap(nil, &msg)
					return
				}
				n.Add(1)
			}
		}()
	}
	wg.Wait()
	if b := bad.Load(); b != nil {
		r.t.Fatalf("round %d: %s\n%s", round, *b, r.s.exitReport())
	}
	return n.Load()
}

// diskWriter writes envelopes to one mailbox in sequence, moving to the
// next sequence only on 201: what a client does.
type diskWriter struct {
	id, token string
	mu        sync.Mutex
	acked     map[uint64][]byte // acknowledged (201) envelopes
	next      uint64
	sent      map[uint64][]byte // every envelope sent, acknowledged or not
}

func (w *diskWriter) url(origin string) string { return origin + "/v1/notes/mailbox/" + w.id }

// TestExhaustDiskFullRefusesWritesAndRecovers fills the data dir's
// filesystem (a 64 MiB tmpfs) while mailbox writers run. Every service
// must then refuse writes promptly with its own 503 and Retry-After while
// reads of what was acknowledged go on, /readyz says 503, the process
// stays up and logs a bounded number of lines; once the filler is
// deleted the relay writes again without a restart. A last fill is held
// through SIGTERM, which must exit within the drain bound; after a
// restart every acknowledged envelope is there and no refused one is
// stored in part.
func TestExhaustDiskFullRefusesWritesAndRecovers(t *testing.T) {
	r := startDiskFullRig(t)
	origin := r.s.origin("mailbox")
	writers := make([]*diskWriter, 4)
	for i := range writers {
		w := &diskWriter{id: fmt.Sprintf("disk-full-mailbox-%02d", i), token: fmt.Sprintf("disk-full-token-%02d-0123456789", i),
			acked: map[uint64][]byte{}, sent: map[uint64][]byte{}, next: 1}
		if a := r.must(r.client, "PUT", w.url(origin), w.token, nil); a.status != 201 {
			t.Fatalf("claim %s: %d %s", w.id, a.status, a.body)
		}
		writers[i] = w
	}
	if a := r.must(r.client, "POST", r.s.origin("push-fcm")+"/register", "", []byte(`{"label":"before"}`)); a.status != 201 {
		t.Fatalf("registration before the fill: %d %s", a.status, a.body)
	}

	var refused, stuck atomic.Int64
	var failure atomic.Pointer[string]
	fail := func(format string, args ...any) {
		msg := fmt.Sprintf(format, args...)
		failure.CompareAndSwap(nil, &msg)
	}
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for i, w := range writers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				select {
				case <-stop:
					return
				default:
				}
				w.mu.Lock()
				seq := w.next
				env := sealedLike(seq, i, 0) // a retry sends the same bytes
				w.sent[seq] = env
				w.mu.Unlock()
				req, _ := http.NewRequest("PUT", fmt.Sprintf("%s/p2c/%d", w.url(origin), seq), bytes.NewReader(env))
				req.Header.Set("Authorization", "Bearer "+w.token)
				req.Header.Set("Content-Type", "application/octet-stream")
				begin := time.Now()
				resp, err := r.client.Do(req)
				if err != nil {
					stuck.Add(1)
					fail("writer %d, seq %d: %v (no answer)", i, seq, err)
					return
				}
				b, _ := io.ReadAll(resp.Body)
				resp.Body.Close()
				switch {
				case resp.StatusCode == 201 || resp.StatusCode == 200:
					w.mu.Lock()
					w.acked[seq] = env
					w.next++
					w.mu.Unlock()
				case resp.StatusCode == 503 && string(b) == `{"error":"storage_unavailable","status":503}` && resp.Header.Get("Retry-After") != "":
					refused.Add(1)
					if took := time.Since(begin); took > promptly {
						fail("writer %d, seq %d: 503 after %v", i, seq, took)
					}
				case resp.StatusCode == 429:
					// The mailbox's write bucket (2 a second after a burst
					// of 120; refused writes spend it too): back off as a
					// client would.
					time.Sleep(100 * time.Millisecond)
				default:
					fail("writer %d, seq %d: %d %s", i, seq, resp.StatusCode, b)
					return
				}
			}
		}()
	}
	stopWriters := func() {
		close(stop)
		wg.Wait()
		if f := failure.Load(); f != nil {
			t.Fatalf("%s\n%s", *f, r.s.exitReport())
		}
	}
	ackedNow := func() (n int) {
		for _, w := range writers {
			w.mu.Lock()
			n += len(w.acked)
			w.mu.Unlock()
		}
		return n
	}
	waitUntil := func(what string, within time.Duration, ok func() bool) {
		t.Helper()
		deadline := time.Now().Add(within)
		for !ok() {
			if f := failure.Load(); f != nil {
				t.Fatalf("%s\n%s", *f, r.s.exitReport())
			}
			if rep := r.s.exitReport(); rep != "" {
				t.Fatalf("waiting for %s: %s", what, rep)
			}
			if time.Now().After(deadline) {
				t.Fatalf("no %s within %v\n%s", what, within, r.s.stderr.String())
			}
			time.Sleep(10 * time.Millisecond)
		}
	}
	// Reads of what was acknowledged before the fill.
	// readBack reads each acknowledged envelope once, in the first round
	// after its answer: read again every round, the envelopes of many
	// rounds (make soak) would empty the mailbox's fetch bucket (240, 4/s)
	// and be answered 429. After the restart the test checks them all.
	readDone := make(map[string]map[uint64]bool, len(writers))
	readBack := func(round int) {
		t.Helper()
		for _, w := range writers {
			done := readDone[w.id]
			if done == nil {
				done = map[uint64]bool{}
				readDone[w.id] = done
			}
			w.mu.Lock()
			acked := make(map[uint64][]byte, len(w.acked))
			for seq, env := range w.acked {
				if !done[seq] {
					acked[seq] = env
				}
			}
			w.mu.Unlock()
			for seq, env := range acked {
				done[seq] = true
				a := r.must(r.client, "GET", fmt.Sprintf("%s/p2c/%d", w.url(origin), seq), w.token, nil)
				if a.status != 200 || a.body != string(env) {
					t.Fatalf("round %d: GET of acknowledged %s seq %d on a full disk: %d (%d bytes), want 200 and its bytes", round, w.id, seq, a.status, len(a.body))
				}
			}
		}
	}

	ballast := func() int64 {
		fi, err := os.Stat(filepath.Join(r.mount, "ballast"))
		if err != nil {
			return 0
		}
		return fi.Size()
	}
	rounds := soakScale(t)
	for round := range rounds {
		if got := ballast(); got != diskReserve/2 {
			t.Fatalf("round %d: ballast of %d bytes before the fill, want half the reserve", round, got)
		}
		before := ackedNow()
		waitUntil("writes before the fill", 20*time.Second, func() bool { return ackedNow() >= before+8 })
		filler := r.fill()
		filled := time.Now()
		refusedAt := refused.Load()
		waitUntil("503 storage_unavailable after the fill", promptly, func() bool { return refused.Load() > refusedAt })
		t.Logf("round %d: first 503 %v after the disk was full", round, time.Since(filled).Round(time.Millisecond))
		if code := r.readyz(); code != 503 {
			t.Fatalf("round %d: /readyz %d on a full disk, want 503", round, code)
		}
		if m := r.refusedGauge(); m != "1" {
			t.Fatalf("round %d: edgerelay_store_writes_refused %q on a full disk, want 1", round, m)
		}
		if code, _ := get(t, r.s.origin("admin")+"/healthz"); code != 200 {
			t.Fatalf("round %d: /healthz %d on a full disk, want 200", round, code)
		}
		r.storeRefusals(round)
		readBack(round)
		// The filler took the last byte: the ballast gives Pebble its room.
		waitUntil("the ballast released", promptly, func() bool { return ballast() == 0 })

		// Hammered while full, the log stays bounded.
		linesBefore := strings.Count(r.s.stderr.String(), "\n")
		refusedBefore := refused.Load()
		n := r.floodClaims(round, 2*time.Second) + refused.Load() - refusedBefore
		lines := strings.Count(r.s.stderr.String(), "\n") - linesBefore
		t.Logf("round %d: %d writes refused in 2 s of a full disk, %d log lines", round, n, lines)
		if n < 100 {
			t.Fatalf("round %d: only %d writes refused in 2 s: the check below would mean nothing", round, n)
		}
		if lines > 60 {
			all := strings.Split(r.s.stderr.String(), "\n")
			t.Fatalf("round %d: %d log lines for %d refused writes in 2 s, want at most 60; the last ones:\n%s",
				round, lines, n, strings.Join(all[max(0, len(all)-20):], "\n"))
		}
		if rep := r.s.exitReport(); rep != "" {
			t.Fatalf("round %d: the relay did not stay up on a full disk: %s", round, rep)
		}

		if err := os.Remove(filler); err != nil {
			t.Fatal(err)
		}
		freed, after := time.Now(), ackedNow()
		waitUntil("writes after the filler is gone", 5*time.Second, func() bool { return ackedNow() > after })
		t.Logf("round %d: first write acknowledged %v after the filler was deleted", round, time.Since(freed).Round(time.Millisecond))
		waitUntil("/readyz 200 after the filler is gone", 5*time.Second, func() bool { return r.readyz() == 200 })
		if m := r.refusedGauge(); m != "0" {
			t.Fatalf("round %d: edgerelay_store_writes_refused %q after recovery, want 0", round, m)
		}
		waitUntil("the ballast taken back", 5*time.Second, func() bool { return ballast() == diskReserve/2 })
		r.storeWrites(round)
	}

	// A last fill, held through SIGTERM.
	before := ackedNow()
	waitUntil("writes before the last fill", 20*time.Second, func() bool { return ackedNow() >= before+8 })
	filler := r.fill()
	refusedAt := refused.Load()
	waitUntil("503 after the last fill", promptly, func() bool { return refused.Load() > refusedAt })
	stopWriters()
	if n := stuck.Load(); n != 0 {
		t.Fatalf("%d writes got no answer", n)
	}
	begin := time.Now()
	code := r.s.signal(syscall.SIGTERM, 3*time.Second+3*time.Second)
	t.Logf("SIGTERM on a full disk: exit %d in %v", code, time.Since(begin))
	if code != 0 {
		t.Fatalf("exit %d after SIGTERM on a full disk:\n%s", code, r.s.stderr.String())
	}
	if err := os.Remove(filler); err != nil {
		t.Fatal(err)
	}

	r.s.start()
	origin = r.s.origin("mailbox")
	for _, w := range writers {
		var last uint64
		for seq := range w.acked {
			last = max(last, seq)
		}
		stored := headLast(t, w.url(origin)+"/p2c", w.token)
		// A refused sequence was sent again until it was acknowledged, so
		// at most the last one sent can be stored without an answer;
		// when it is, it is whole.
		if stored < last || stored > last+1 {
			t.Fatalf("%s: last stored %d, last acknowledged %d", w.id, stored, last)
		}
		// In batches: one GET per envelope would run into the fetch
		// bucket (240, 4/s) once a soak has acknowledged more.
		got := map[uint64][]byte{}
		mb := (&sdkmailbox.Client{BaseURL: origin, App: "notes"}).Mailbox(w.id, w.token)
		for after, more := uint64(0), true; more; {
			envs, m, err := mb.Batch(context.Background(), link.P2C, after, 1000)
			if err != nil {
				t.Fatalf("%s: batch after %d after the restart: %v", w.id, after, err)
			}
			for _, e := range envs {
				after = binary.BigEndian.Uint64(e[1:9])
				got[after] = e
			}
			more = m
		}
		for seq := uint64(1); seq <= stored; seq++ {
			want, ok := w.acked[seq]
			if !ok {
				want = w.sent[seq]
			}
			if !bytes.Equal(got[seq], want) {
				t.Fatalf("%s seq %d after the restart: %d bytes, want the %d bytes sent (acknowledged: %v)",
					w.id, seq, len(got[seq]), len(want), ok)
			}
		}
		t.Logf("%s: %d acknowledged, all there after the restart", w.id, len(w.acked))
	}
}

// TestExhaustDiskFullWithoutReserveKeepsServing turns the guard off
// (RELAY_DISK_RESERVE=0), so that a full disk reaches Pebble: its log
// write fails and Pebble calls Fatalf, which ended the process. Now the
// store is marked failed: writes answer 503 promptly, acknowledged
// envelopes are still read, /readyz is 503, the process stays up (also
// once space is back: Pebble cannot resume, a restart is needed), SIGTERM
// exits within the drain bound, and the restart finds every acknowledged
// envelope and takes writes. One writer: a commit racing the failure
// inside Pebble can be left waiting (see README, Disk full).
func TestExhaustDiskFullWithoutReserveKeepsServing(t *testing.T) {
	mount := mountTmpfs(t)
	client := &http.Client{Timeout: 5 * time.Second}
	s := startServer(t, "RELAY_DATA_DIR="+mount, "RELAY_APPS=notes", "RELAY_DISK_RESERVE=0", "RELAY_DRAIN_TIMEOUT=3s", quickRaceExit)
	r := &diskFullRig{t: t, s: s, mount: mount, client: client}
	w := &diskWriter{id: "disk-full-noreserve", token: "disk-full-noreserve-token-0123", acked: map[uint64][]byte{}}
	put := func(seq uint64) diskAnswer {
		t.Helper()
		// Large envelopes, so that the room Pebble's log file holds in
		// advance runs out in a few dozen writes.
		env := make([]byte, 60<<10)
		copy(env, sealedLike(seq, 0, 0))
		for {
			a := r.must(client, "PUT", fmt.Sprintf("%s/p2c/%d", w.url(s.origin("mailbox")), seq), w.token, env)
			if a.status == 429 { // the mailbox's write bucket: back off as a client would
				time.Sleep(500 * time.Millisecond)
				continue
			}
			if a.status == 201 {
				w.acked[seq] = env
			}
			return a
		}
	}
	if a := r.must(client, "PUT", w.url(s.origin("mailbox")), w.token, nil); a.status != 201 {
		t.Fatalf("claim: %d %s", a.status, a.body)
	}
	seq := uint64(1)
	for ; seq <= 20; seq++ {
		if a := put(seq); a.status != 201 {
			t.Fatalf("seq %d before the fill: %d %s", seq, a.status, a.body)
		}
	}
	filler := r.fill()
	// Pebble's log has room left in its last page: write until it fails.
	var a diskAnswer
	for ; ; seq++ {
		if a = put(seq); a.status != 201 {
			break
		}
		if seq > 20+200 {
			t.Fatalf("200 writes of 60 KiB acknowledged on a full disk")
		}
	}
	if a.status != 503 || a.body != `{"error":"storage_unavailable","status":503}` || a.retryAfter == "" || a.took > promptly {
		t.Fatalf("write on a full disk without the guard: %d %s, Retry-After %q, in %v", a.status, a.body, a.retryAfter, a.took)
	}
	for range soakScale(t) * 5 {
		if a := put(seq); a.status != 503 || a.took > promptly {
			t.Fatalf("write after Pebble failed: %d %s in %v", a.status, a.body, a.took)
		}
	}
	for got, env := range w.acked {
		if a := r.must(client, "GET", fmt.Sprintf("%s/p2c/%d", w.url(s.origin("mailbox")), got), w.token, nil); a.status != 200 || a.body != string(env) {
			t.Fatalf("GET of acknowledged seq %d after Pebble failed: %d (%d bytes)", got, a.status, len(a.body))
		}
	}
	if err := os.Remove(filler); err != nil {
		t.Fatal(err)
	}
	if code := r.readyz(); code != 503 {
		t.Fatalf("/readyz %d with Pebble failed, want 503 until a restart", code)
	}
	if a := put(seq); a.status != 503 {
		t.Fatalf("write with Pebble failed and space back: %d %s, want 503 until a restart", a.status, a.body)
	}
	if !strings.Contains(s.stderr.String(), "pebble failed; writes refused until restart") {
		t.Fatalf("no log line saying that Pebble failed:\n%s", s.stderr.String())
	}
	if rep := s.exitReport(); rep != "" {
		t.Fatal(rep)
	}
	begin := time.Now()
	code := s.signal(syscall.SIGTERM, 3*time.Second+3*time.Second)
	// 1: the store could not close cleanly (its log write had failed).
	t.Logf("SIGTERM with Pebble failed: exit %d in %v", code, time.Since(begin))
	if code != 0 && code != 1 {
		t.Fatalf("exit %d after SIGTERM with Pebble failed", code)
	}

	s.start()
	for got, env := range w.acked {
		if a := r.must(client, "GET", fmt.Sprintf("%s/p2c/%d", w.url(s.origin("mailbox")), got), w.token, nil); a.status != 200 || a.body != string(env) {
			t.Fatalf("acknowledged seq %d after the restart: %d (%d bytes)", got, a.status, len(a.body))
		}
	}
	if last := headLast(t, w.url(s.origin("mailbox"))+"/p2c", w.token); last != uint64(len(w.acked)) {
		t.Fatalf("last stored %d after the restart, %d acknowledged: a refused write was stored", last, len(w.acked))
	}
	if a := put(uint64(len(w.acked)) + 1); a.status != 201 {
		t.Fatalf("write after the restart: %d %s", a.status, a.body)
	}
	t.Logf("%d acknowledged, all there after the restart", len(w.acked))
}
