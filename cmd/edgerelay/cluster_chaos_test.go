package main

import (
	"fmt"
	"math/rand/v2"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"
)

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
	keys := make([]string, nKeys)
	for i := range keys {
		keys[i] = lastLine(cliOK(t, c.nodeEnv(i%3), "keys", "channel", "add", "--host", fmt.Sprintf("box%d", i)))
	}

	type racer struct {
		owner, phone string
		status       int
	}
	races := make([][2]racer, nKeys)
	var wg sync.WaitGroup
	stop := time.Now().Add(time.Duration(8*soakScale(t)) * time.Second)
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
			time.Sleep(time.Duration(8*soakScale(t)) * time.Second / time.Duration(nKeys))
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
