// Package pushgwbench measures the push gateway end to end: POST /send
// over loopback HTTP into the real handler (fastpath/pushgw) on a fasthttp
// listener configured as the relay runs it, delivered over HTTP/2 to the
// fake APNs of push/pushtest, which verifies every provider token and
// payload. Everything runs in one process, so the CPU figures include the
// load generator and the fake provider: they understate the gateway's own
// throughput.
//
// A rig runs either one mount on the single-node Pebble store or, given a
// test cluster (store/cluster/clustertest), one mount per node, each on
// its own cluster key store (store/cluster/pushkv) and its own provider
// client, as three edgerelay processes behind a balancer run it; requests
// then go to the mounts in turn. The cluster's nats-servers run in the
// same process too, so their CPU time and allocations count in the
// cluster's figures: on a box with fewer cores than nodes the servers and
// the rest share the same cores, which understates a real cluster of
// separate machines (CLUSTER.md §8.1).
package pushgwbench

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"strconv"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/valyala/fasthttp"

	"edgerelay/fastpath/pushgw"
	"edgerelay/push/apns"
	"edgerelay/push/pushtest"
	"edgerelay/store"
	"edgerelay/store/cluster/clustertest"
	"edgerelay/store/cluster/pushkv"
)

// Options shape a rig.
type Options struct {
	// Metered turns the daily budget on (with a budget that never runs
	// out), so that every send also draws from it.
	Metered bool
	// Tokens is how many distinct device tokens the sends cycle through
	// (each is claimed by its first send); 0 means 1024.
	Tokens int
	// Keys is how many API keys the rig creates; 0 means 1. Token t is
	// always sent with key t mod Keys: a token belongs to the first key
	// that sends to it, so a token sent with two keys would be refused.
	Keys int
	// Cluster, when set, runs one mount per node of this test cluster,
	// each on its own pushkv store; nil runs one mount on Pebble.
	Cluster *clustertest.Nodes
}

// Rig is a gateway deployment (one mount, or one per cluster node) with
// its fake APNs and a client per mount.
type Rig struct {
	APNs   *pushtest.FakeAPNs
	mounts []*mount
	auth   []string // "Bearer <key>" of each key
	bodies [][]byte // one per token
	next   atomic.Uint64
	spread atomic.Uint64 // the balancer's turn over the mounts
}

// mount is one node's gateway: the handler on its listener and the
// client that reaches it.
type mount struct {
	srv    *fasthttp.Server
	client *fasthttp.HostClient
	uri    string
	served atomic.Uint64
}

// NewRig starts a rig; it stops when tb ends (before the cluster's nodes,
// which were started first).
func NewRig(tb testing.TB, o Options) *Rig {
	tb.Helper()
	if o.Tokens <= 0 {
		o.Tokens = 1024
	}
	if o.Keys <= 0 {
		o.Keys = 1
	}
	const team, kid, topic = "TEAM123456", "KEY1234567", "com.example.mail"
	p8, priv := pushtest.NewAPNsKey(tb)
	fake := pushtest.NewAPNs(tb, team, kid, &priv.PublicKey)
	fake.RequireTopic(topic)
	keyFile := pushtest.WriteFile(tb, "AuthKey.p8", p8)
	stores := newStores(tb, o.Cluster)
	r := &Rig{APNs: fake}
	for _, st := range stores {
		// Each node has a provider client of its own, as each process does.
		ac, err := apns.New(apns.Config{KeyFile: keyFile, KeyID: kid, TeamID: team, BaseURL: fake.URL(), RootCAs: fake.RootCAs()})
		if err != nil {
			tb.Fatal(err)
		}
		h, err := pushgw.New(pushgw.Config{
			Provider: pushgw.ProviderAPNs, APNs: ac, APNsTopic: topic, Store: st,
			RatePerMinute: 1 << 30, Metered: o.Metered, DailyBudget: 1 << 40,
			// Production logging, written nowhere: its cost is part of a send.
			Log: slog.New(slog.NewJSONHandler(io.Discard, nil)),
		})
		if err != nil {
			tb.Fatal(err)
		}
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			tb.Fatal(err)
		}
		m := &mount{uri: "http://" + ln.Addr().String() + "/send"}
		m.srv = &fasthttp.Server{
			Handler: func(ctx *fasthttp.RequestCtx) {
				m.served.Add(1)
				h.ServeHTTP(ctx)
			},
			ErrorHandler: h.ServeError, MaxRequestBodySize: pushgw.MaxBodyBytes, StreamRequestBody: true, NoDefaultServerHeader: true,
		}
		go func() { _ = m.srv.Serve(ln) }()
		m.client = &fasthttp.HostClient{Addr: ln.Addr().String(), MaxConns: 512}
		r.mounts = append(r.mounts, m)
		tb.Cleanup(func() {
			_ = m.srv.Shutdown()
			_ = h.Drain(context.Background())
			ac.Close()
		})
	}
	// Keys are created through the first node; the others find them
	// through their mirrors (a miss waits for the mirror to catch up).
	for i := range o.Keys {
		nk, err := (&pushgw.Keys{Store: stores[0]}).Create("bench-"+strconv.Itoa(i), time.Time{})
		if err != nil {
			tb.Fatal(err)
		}
		r.auth = append(r.auth, "Bearer "+nk.Key)
	}
	for i := range o.Tokens {
		r.bodies = append(r.bodies, fmt.Appendf(nil,
			`{"token":"%064x","title":"New message","body":"Alice: lunch at noon?","data":{"messageId":"msg-%d","url":"/read"}}`, i+1, i))
	}
	return r
}

// newStores opens the key store of every mount: one Pebble store, or one
// pushkv store per node of nodes. They close when tb ends.
func newStores(tb testing.TB, nodes *clustertest.Nodes) []store.PushGatewayStore {
	tb.Helper()
	if nodes == nil {
		db, err := store.Open(tb.TempDir(), nil)
		if err != nil {
			tb.Fatal(err)
		}
		tb.Cleanup(func() { _ = db.Close() })
		st, err := store.NewPushGateway(db, store.PushScopeShared)
		if err != nil {
			tb.Fatal(err)
		}
		return []store.PushGatewayStore{st}
	}
	var stores []store.PushGatewayStore
	for i := range nodes.Len() {
		g, err := pushkv.New(clustertest.Context(tb), nodes.Node(i), store.PushScopeShared)
		if err != nil {
			tb.Fatal(err)
		}
		tb.Cleanup(func() { _ = g.Close() })
		stores = append(stores, g)
	}
	return stores
}

// Mounts is how many gateways the rig spreads requests over.
func (r *Rig) Mounts() int { return len(r.mounts) }

// Keys is how many API keys the rig sends with.
func (r *Rig) Keys() int { return len(r.auth) }

// Served is how many requests each mount has answered so far.
func (r *Rig) Served() []uint64 {
	n := make([]uint64, len(r.mounts))
	for i, m := range r.mounts {
		n[i] = m.served.Load()
	}
	return n
}

// Send posts one push, cycling through the tokens (each with its key),
// and checks that it was delivered.
func (r *Rig) Send(req *fasthttp.Request, resp *fasthttp.Response) error {
	t := int(r.next.Add(1) % uint64(len(r.bodies)))
	return r.send(req, resp, t%len(r.auth), t)
}

// WarmUp sends to every token once, with its key, from up to senders
// goroutines: it claims every token and opens every connection, so that
// what a benchmark times afterwards is the steady state.
func (r *Rig) WarmUp(senders int) error {
	senders = max(1, min(senders, len(r.bodies)))
	errs := make(chan error, senders)
	for s := range senders {
		go func() {
			var req fasthttp.Request
			var resp fasthttp.Response
			var err error
			for t := s; t < len(r.bodies) && err == nil; t += senders {
				err = r.send(&req, &resp, t%len(r.auth), t)
			}
			errs <- err
		}()
	}
	var err error
	for range senders {
		err = errors.Join(err, <-errs)
	}
	return err
}

// Sender is one sender's stream of requests: always the same API key and
// only that key's tokens, so that senders with keys of their own never
// meet on a key's minute limit or a token's claim. Not for concurrent use.
type Sender struct {
	r     *Rig
	key   int
	token int // the next one, t ≡ key (mod Keys)
}

// Sender is a sender with key k mod Keys.
func (r *Rig) Sender(k int) *Sender {
	k %= len(r.auth)
	return &Sender{r: r, key: k, token: k}
}

// Send posts the sender's next push and checks that it was delivered.
func (s *Sender) Send(req *fasthttp.Request, resp *fasthttp.Response) error {
	return s.r.send(req, resp, s.key, s.nextToken())
}

// nextToken is the sender's next token: its key's tokens in turn.
func (s *Sender) nextToken() int {
	t := s.token
	if s.token += len(s.r.auth); s.token >= len(s.r.bodies) {
		s.token = s.key
	}
	return t
}

// send posts token t's push with key k to the next mount in turn, as a
// round-robin balancer in front of the nodes would.
func (r *Rig) send(req *fasthttp.Request, resp *fasthttp.Response, k, t int) error {
	m := r.mounts[0]
	if len(r.mounts) > 1 {
		m = r.mounts[r.spread.Add(1)%uint64(len(r.mounts))]
	}
	req.Reset()
	req.Header.SetMethod("POST")
	req.SetRequestURI(m.uri)
	req.Header.Set("Authorization", r.auth[k])
	req.Header.SetContentType("application/json")
	req.SetBodyRaw(r.bodies[t])
	if err := m.client.Do(req, resp); err != nil {
		return fmt.Errorf("pushgwbench: %w", err)
	}
	if resp.StatusCode() != 200 {
		return fmt.Errorf("pushgwbench: status %s: %s", strconv.Itoa(resp.StatusCode()), resp.Body())
	}
	return nil
}

// CPUTime is the process's user plus system CPU time so far, all its
// threads (the cluster's nats-servers included).
func CPUTime() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
