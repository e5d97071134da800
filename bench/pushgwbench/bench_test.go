package pushgwbench

import (
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/valyala/fasthttp"

	"edgerelay/store/cluster/clustertest"
)

func TestRigDelivers(t *testing.T) {
	r := NewRig(t, Options{Metered: true, Tokens: 3})
	var req fasthttp.Request
	var resp fasthttp.Response
	for range 6 {
		if err := r.Send(&req, &resp); err != nil {
			t.Fatal(err)
		}
	}
	reqs := r.APNs.Requests()
	if len(reqs) != 6 {
		t.Fatalf("APNs received %d pushes, want 6", len(reqs))
	}
	for _, q := range reqs {
		if q.Problem != "" || q.Status != 200 {
			t.Fatalf("the fake refused a push: %s", q.Problem)
		}
	}
}

// BenchmarkSendAPNs is POST /send through the real handler to the fake
// APNs, with several concurrent senders. Besides ns/op and allocs/op
// (whole process: client, gateway, provider client and fake) it reports
// pushes/s (wall clock) and pushes/cpu-s (pushes per second of one
// core's CPU time, all of the process's work included).
func BenchmarkSendAPNs(b *testing.B) {
	for _, tc := range []struct {
		name    string
		metered bool
	}{{"unmetered", false}, {"metered", true}} {
		b.Run(tc.name, func(b *testing.B) {
			r := NewRig(b, Options{Metered: tc.metered})
			// Warm up: open the HTTP/2 connection, claim every token.
			var req fasthttp.Request
			var resp fasthttp.Response
			for range len(r.bodies) {
				if err := r.Send(&req, &resp); err != nil {
					b.Fatal(err)
				}
			}
			b.ReportAllocs()
			b.SetParallelism(8)
			cpu0, wall0 := CPUTime(), time.Now()
			b.ResetTimer()
			b.RunParallel(func(pb *testing.PB) {
				var req fasthttp.Request
				var resp fasthttp.Response
				for pb.Next() {
					if err := r.Send(&req, &resp); err != nil {
						b.Error(err)
						return
					}
				}
			})
			b.StopTimer()
			cpu, wall := CPUTime()-cpu0, time.Since(wall0)
			b.ReportMetric(float64(b.N)/wall.Seconds(), "pushes/s")
			b.ReportMetric(float64(b.N)/cpu.Seconds(), "pushes/cpu-s")
		})
	}
}

// TestClusterRigDelivers: the cluster rig's sends land on every node's
// mount in turn, are all delivered, and senders with keys of their own run
// side by side without a refusal (a token sent with a second key, or a
// key's minute limit, would answer 403 or 429).
func TestClusterRigDelivers(t *testing.T) {
	r := NewRig(t, Options{Metered: true, Tokens: 8, Keys: 4, Cluster: clustertest.Start(t, 3)})
	if r.Mounts() != 3 {
		t.Fatalf("%d mounts, want one per node", r.Mounts())
	}
	if err := r.WarmUp(4); err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	errs := make([]error, r.Keys())
	for k := range r.Keys() {
		wg.Go(func() {
			s := r.Sender(k)
			var req fasthttp.Request
			var resp fasthttp.Response
			for range 6 {
				if errs[k] = s.Send(&req, &resp); errs[k] != nil {
					return
				}
			}
		})
	}
	wg.Wait()
	for k, err := range errs {
		if err != nil {
			t.Fatalf("sender %d: %v", k, err)
		}
	}
	const total = 8 + 4*6
	reqs := r.APNs.Requests()
	if len(reqs) != total {
		t.Fatalf("APNs received %d pushes, want %d", len(reqs), total)
	}
	for _, q := range reqs {
		if q.Problem != "" || q.Status != 200 {
			t.Fatalf("the fake refused a push: %s", q.Problem)
		}
	}
	// Round robin: every mount answered a third.
	for i, n := range r.Served() {
		if n != total/3 && n != total/3+1 {
			t.Fatalf("mount %d served %d of %d requests: %v", i, n, total, r.Served())
		}
	}
}

// TestSenderKeepsToItsKey: a sender cycles through its own key's tokens
// only, and a second key's sender takes the others.
func TestSenderKeepsToItsKey(t *testing.T) {
	r := &Rig{auth: make([]string, 3), bodies: make([][]byte, 8)}
	for k, want := range [][]int{{0, 3, 6, 0, 3}, {1, 4, 7, 1}, {2, 5, 2}} {
		s := r.Sender(k + len(r.auth)) // the key number wraps
		for i, tok := range want {
			if got := s.nextToken(); got != tok {
				t.Fatalf("key %d, send %d: token %d, want %d", k, i, got, tok)
			}
		}
	}
}

// sendersCases are the concurrent senders of BenchmarkSendCluster, each
// with its own API key.
var sendersCases = []int{1, 16}

// clusterRounds is how many times BenchmarkSendCluster runs every case,
// the cases alternating.
const clusterRounds = 5

// BenchmarkSendCluster is POST /send through the real handler to the fake
// APNs (daily budget on), in cluster mode beside single node in the same
// run: the cluster rig spreads the sends over three nodes' mounts, each on
// its own pushkv store of a 3-node embedded cluster (R3); the single rig
// is one mount on Pebble. 1 and 16 concurrent senders, each with its own
// API key and tokens. Both rigs are built and warmed once; then every case
// runs clusterRounds times, single and cluster in ABBA order round by
// round, so a shared machine's drift falls on both alike (compare the
// medians of the repeated names, NAME and NAME#01...). Besides ns/op and
// allocs/op (whole process: client, gateways, provider clients, fake APNs
// and, in cluster mode, the three nats-servers) it reports sends/s (wall
// clock) and sends/cpu-s (sends per second of the process's CPU time,
// user plus system).
func BenchmarkSendCluster(b *testing.B) {
	keys := sendersCases[len(sendersCases)-1]
	tokens := 16 * keys
	single := NewRig(b, Options{Metered: true, Tokens: tokens, Keys: keys})
	cluster := NewRig(b, Options{Metered: true, Tokens: tokens, Keys: keys, Cluster: clustertest.Start(b, 3)})
	for _, r := range []*Rig{single, cluster} {
		if err := r.WarmUp(keys); err != nil {
			b.Fatal(err)
		}
	}
	sides := []struct {
		name string
		rig  *Rig
	}{{"single", single}, {"cluster", cluster}}
	for round := range clusterRounds {
		for _, n := range sendersCases {
			order := []int{0, 1}
			if round%2 == 1 {
				order = []int{1, 0}
			}
			for _, i := range order {
				b.Run(fmt.Sprintf("senders=%d/%s", n, sides[i].name), func(b *testing.B) { drive(b, sides[i].rig, n) })
			}
		}
	}
}

// drive runs b.N sends from n concurrent senders, sender i with key i.
func drive(b *testing.B, r *Rig, n int) {
	errs := make([]error, n)
	b.ReportAllocs()
	cpu0, wall0 := CPUTime(), time.Now()
	b.ResetTimer()
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() {
			s := r.Sender(i)
			var req fasthttp.Request
			var resp fasthttp.Response
			// Exactly b.N sends in all, for the per-op figures.
			for range b.N/n + btoi(i < b.N%n) {
				if errs[i] = s.Send(&req, &resp); errs[i] != nil {
					return
				}
			}
		})
	}
	wg.Wait()
	b.StopTimer()
	cpu, wall := CPUTime()-cpu0, time.Since(wall0)
	for _, err := range errs {
		if err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(float64(b.N)/wall.Seconds(), "sends/s")
	b.ReportMetric(float64(b.N)/cpu.Seconds(), "sends/cpu-s")
}

func btoi(b bool) int {
	if b {
		return 1
	}
	return 0
}
