package main

import (
	"context"
	"fmt"
	"math/rand/v2"
	"net/http"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"edgerelay/fastpath/admin"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// addChannelKeys mints n claim keys (hosts prefix0..prefix<n-1>) through
// the admin listeners of the nodes in turn, as `keys channel add` does but
// without a process per key (the command line itself is tested elsewhere).
func addChannelKeys(t *testing.T, c *relayCluster, prefix string, n int) []string {
	t.Helper()
	keys := make([]string, n)
	for i := range keys {
		node := c.nodes[i%len(c.nodes)]
		var resp admin.AddKeyResponse
		err := admin.Call(node.addrs["admin"], filepath.Join(node.dataDir, adminTokenFile), http.MethodPost, "/v1/keys/channel",
			admin.AddKeyRequest{Host: fmt.Sprintf("%s%d", prefix, i)}, http.StatusCreated, &resp)
		if err != nil {
			t.Fatalf("add claim key %d: %v", i, err)
		}
		keys[i] = resp.Key
	}
	return keys
}

// claimThrough sends one channel claim through the balancer, retrying
// what a client retries (503, a connection cut by a dying node) until the
// relay answers for good or the deadline passes.
func claimThrough(addr, key, owner, phone string, deadline time.Time) int {
	body := fmt.Sprintf(`{"ownerToken":%q,"phoneToken":%q}`, owner, phone)
	for time.Now().Before(deadline) {
		req, _ := http.NewRequest("POST", "http://"+addr+"/claim", strings.NewReader(body))
		req.Header.Set("Authorization", "Bearer "+key)
		resp, err := freshClient(nil).Do(req)
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode != http.StatusServiceUnavailable {
				return resp.StatusCode
			}
		}
		time.Sleep(50 * time.Millisecond)
	}
	return 0
}

// ownerWorks reports whether an owner token is known through one node.
func ownerWorks(t *testing.T, addr, owner string) bool {
	t.Helper()
	for range 100 {
		req, _ := http.NewRequest("GET", "http://"+addr+"/status", nil)
		req.Header.Set("Authorization", "Bearer "+owner)
		resp, err := freshClient(nil).Do(req)
		if err == nil {
			resp.Body.Close()
			switch resp.StatusCode {
			case http.StatusOK:
				return true
			case http.StatusForbidden, http.StatusNotFound, http.StatusUnauthorized:
				return false
			}
		}
		time.Sleep(100 * time.Millisecond)
	}
	t.Fatalf("status through %s never answered", addr)
	return false
}

// TestSIGKILLClusterNodesDuringRacingClaims: three nodes behind HAProxy,
// two clients racing for each of many claim keys while a random node is
// killed with SIGKILL every couple of seconds and restarted. After the
// healing, no key was won twice: at most one racer was answered 200, and
// exactly one racer's owner token holds the key, through every node (a
// racer whose 200 was lost with its node finds its token working, the
// other's refused).
func TestSIGKILLClusterNodesDuringRacingClaims(t *testing.T) {
	c := startRelayCluster(t, 3, []string{"channel"})
	lb := startHAProxy(t, c, "channel")
	nKeys := 24 * soakScale(t)
	keys := addChannelKeys(t, c, "box", nKeys)

	type racer struct {
		owner, phone string
		status       int
	}
	races := make([][2]racer, nKeys)
	var wg sync.WaitGroup
	stop := time.Now().Add(time.Duration(12*soakScale(t)) * time.Second)
	next := make(chan int)
	for range 8 {
		wg.Go(func() {
			for i := range next {
				var inner sync.WaitGroup
				for j := range 2 {
					races[i][j] = racer{owner: randHex(t), phone: randHex(t)}
					inner.Go(func() {
						races[i][j].status = claimThrough(lb.addrs["channel"], keys[i], races[i][j].owner, races[i][j].phone, time.Now().Add(60*time.Second))
					})
				}
				inner.Wait()
			}
		})
	}
	go func() {
		for i := range keys {
			next <- i
			time.Sleep(time.Duration(12*soakScale(t)) * time.Second / time.Duration(nKeys))
		}
		close(next)
	}()
	kills := 0
	for time.Now().Before(stop) {
		n := c.nodes[rand.IntN(3)]
		time.Sleep(time.Second)
		n.kill()
		kills++
		n.start()
	}
	wg.Wait()
	t.Logf("%d keys raced by 2 clients each, %d nodes killed with SIGKILL and restarted", nKeys, kills)

	for _, n := range c.nodes {
		waitReadyz(t, n, http.StatusOK, 30*time.Second)
	}
	for i, race := range races {
		won := 0
		for _, r := range race {
			switch r.status {
			case http.StatusOK:
				won++
			case http.StatusConflict:
			default:
				t.Fatalf("key %d: a racer got %d (want 200 or 409)", i, r.status)
			}
		}
		if won > 1 {
			t.Fatalf("key %d was won twice", i)
		}
		holders := 0
		for j, r := range race {
			works := ownerWorks(t, c.nodes[(i+j)%3].addrs["channel"], r.owner)
			if works {
				holders++
				for _, n := range c.nodes { // and through every node
					if !ownerWorks(t, n.addrs["channel"], r.owner) {
						t.Fatalf("key %d: its owner token works on one node, not on %s", i, n.addrs["channel"])
					}
				}
			}
			if r.status == http.StatusOK && !works {
				t.Fatalf("key %d: a racer answered 200 does not hold it", i)
			}
		}
		if holders != 1 {
			t.Fatalf("key %d: %d racers hold it, want exactly 1", i, holders)
		}
	}
}

// natsJetStream is JetStream through one node's embedded server, its
// connection closed at the test's end.
func natsJetStream(t *testing.T, natsAddr string) jetstream.JetStream {
	t.Helper()
	nc, err := nats.Connect("nats://" + natsAddr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	return js
}

// streamLeader names the node that leads a JetStream stream, asked through
// one node's embedded server.
func streamLeader(t *testing.T, natsAddr, stream string) string {
	t.Helper()
	js := natsJetStream(t, natsAddr)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	s, err := js.Stream(ctx, stream)
	if err != nil {
		t.Fatal(err)
	}
	info, err := s.Info(ctx)
	if err != nil || info.Cluster == nil || info.Cluster.Leader == "" {
		t.Fatalf("stream %s: no leader (%v)", stream, err)
	}
	return info.Cluster.Leader
}

// TestSIGKILLClusterStreamLeaderDuringClaims: the node leading the stream
// of the channel's claim keys is killed with SIGKILL while clients claim
// keys through HAProxy without pause. Claims answer 503 with Retry-After
// (or lose their connection with the dying node) for at most the election
// time, then go on; every claim answered 200 holds, through every node.
func TestSIGKILLClusterStreamLeaderDuringClaims(t *testing.T) {
	c := startRelayCluster(t, 3, []string{"channel"})
	lb := startHAProxy(t, c, "channel")
	const nKeys = 120
	keys := addChannelKeys(t, c, "box", nKeys)
	type outcome struct {
		at     time.Time
		status int
		retry  string
		owner  string
	}
	var mu sync.Mutex
	var outcomes []outcome
	var wg sync.WaitGroup
	next := make(chan int, nKeys)
	for i := range keys {
		next <- i
	}
	close(next)
	killed := make(chan struct{})
	for range 4 {
		wg.Go(func() {
			for i := range next {
				owner := randHex(t)
				body := fmt.Sprintf(`{"ownerToken":%q,"phoneToken":%q}`, owner, randHex(t))
				for {
					req, _ := http.NewRequest("POST", "http://"+lb.addrs["channel"]+"/claim", strings.NewReader(body))
					req.Header.Set("Authorization", "Bearer "+keys[i])
					resp, err := freshClient(nil).Do(req)
					o := outcome{at: time.Now(), owner: owner}
					if err == nil {
						resp.Body.Close()
						o.status, o.retry = resp.StatusCode, resp.Header.Get("Retry-After")
					}
					mu.Lock()
					outcomes = append(outcomes, o)
					mu.Unlock()
					if o.status == http.StatusOK || o.status == http.StatusConflict {
						break
					}
					time.Sleep(50 * time.Millisecond)
				}
				// Pace the claims so that they span the election.
				select {
				case <-killed:
					time.Sleep(50 * time.Millisecond)
				default:
					time.Sleep(100 * time.Millisecond)
				}
			}
		})
	}
	time.Sleep(time.Second)
	leader := streamLeader(t, c.nats[0], "KV_er_chan_keys")
	var victim *relayProc
	for i, n := range c.nodes {
		if fmt.Sprintf("node%d", i) == leader {
			victim = n
		}
	}
	if victim == nil {
		t.Fatalf("leader %q is none of the nodes", leader)
	}
	killedAt := time.Now()
	victim.kill()
	close(killed)
	wg.Wait()
	victim.start()

	// The longest stretch without a 200 after the kill, and what the
	// clients saw meanwhile.
	slices.SortFunc(outcomes, func(a, b outcome) int { return a.at.Compare(b.at) })
	var last200 time.Time
	var gap time.Duration
	refused := 0
	for _, o := range outcomes {
		switch {
		case o.status == http.StatusOK:
			if o.at.After(killedAt) {
				from := killedAt
				if last200.After(from) {
					from = last200
				}
				gap = max(gap, o.at.Sub(from))
			}
			last200 = o.at
		case o.status == http.StatusServiceUnavailable:
			refused++
			if o.retry == "" {
				t.Fatal("a 503 without Retry-After")
			}
		case o.status == 0, o.status == http.StatusConflict:
		default:
			t.Fatalf("a claim answered %d during the election", o.status)
		}
	}
	t.Logf("leader %s killed: longest time without an acknowledged claim %s, %d answers 503", leader, gap.Round(10*time.Millisecond), refused)
	if gap > 15*time.Second {
		t.Fatalf("claims stopped for %s after the leader died (the election takes 4-9 s)", gap)
	}
	for _, n := range c.nodes {
		waitReadyz(t, n, http.StatusOK, 30*time.Second)
	}
	for _, o := range outcomes {
		if o.status == http.StatusOK && !ownerWorks(t, lb.addrs["channel"], o.owner) {
			t.Fatal("an acknowledged claim was lost with the leader")
		}
	}
}

// TestSIGKILLClusterQuorumLostAnswers503: with two of three nodes killed,
// the survivor refuses every write 503 with Retry-After, answers a read
// while it can (a stream leader keeps serving its reads until it steps
// down, about ten seconds later) and 503 after, never a 403 or 404 that
// would make a client throw away a good token or key, and serves again by
// itself once a node returns. Credential lookups are leader reads: once
// no leader is left they are refused rather than answered from a replica
// that may not know of a revocation.
func TestSIGKILLClusterQuorumLostAnswers503(t *testing.T) {
	c := startRelayCluster(t, 3, []string{"channel"})
	keys := addChannelKeys(t, c, "q", 2)
	survivor := "http://" + c.nodes[0].addrs["channel"]
	status, owner, _ := claim(t, survivor, keys[0])
	if status != http.StatusOK {
		t.Fatalf("claim before the loss: %d", status)
	}
	c.nodes[1].kill()
	c.nodes[2].kill()
	waitReadyz(t, c.nodes[0], http.StatusServiceUnavailable, 20*time.Second)

	statusReq := func() (int, string) {
		req, _ := http.NewRequest("GET", survivor+"/status", nil)
		req.Header.Set("Authorization", "Bearer "+owner)
		resp, err := freshClient(nil).Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		return resp.StatusCode, resp.Header.Get("Retry-After")
	}
	// Reads: served while the leader lasts, then 503, never a refusal.
	lost := time.Now()
	for refused := false; !refused; {
		switch st, retry := statusReq(); {
		case st == http.StatusOK:
		case st == http.StatusServiceUnavailable && retry != "":
			refused = true
			t.Logf("reads served for %s after the quorum was lost, then 503", time.Since(lost).Round(100*time.Millisecond))
		default:
			t.Fatalf("status with a good owner token without quorum: %d (Retry-After %q), want 200 or 503 with Retry-After", st, retry)
		}
		if time.Since(lost) > 40*time.Second {
			t.Fatal("the lone leader kept serving reads for 40 s without a quorum")
		}
		time.Sleep(100 * time.Millisecond)
	}
	body := fmt.Sprintf(`{"ownerToken":%q,"phoneToken":%q}`, randHex(t), randHex(t))
	req, _ := http.NewRequest("POST", survivor+"/claim", strings.NewReader(body))
	req.Header.Set("Authorization", "Bearer "+keys[1])
	resp, err := freshClient(nil).Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusServiceUnavailable || resp.Header.Get("Retry-After") == "" {
		t.Fatalf("claim without quorum: %d (Retry-After %q), want 503 with Retry-After", resp.StatusCode, resp.Header.Get("Retry-After"))
	}

	c.nodes[1].start()
	waitReadyz(t, c.nodes[0], http.StatusOK, 60*time.Second)
	// /status asks the computer's lease (cluster-wide), whose bucket may
	// still be electing a leader when /readyz turns 200: 503 until then.
	for deadline := time.Now().Add(20 * time.Second); ; {
		st, retry := statusReq()
		if st == http.StatusOK {
			break
		}
		if st != http.StatusServiceUnavailable || retry == "" || time.Now().After(deadline) {
			t.Fatalf("status after a node returned: %d (Retry-After %q), want 200 (503 with Retry-After while a bucket elects)", st, retry)
		}
		time.Sleep(100 * time.Millisecond)
	}
	if st, _, _ := claim(t, survivor, keys[1]); st != http.StatusOK {
		t.Fatalf("the refused claim, retried after the quorum returned: %d", st)
	}
}
