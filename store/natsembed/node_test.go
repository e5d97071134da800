package natsembed_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"edgerelay/internal/freeport"
	"edgerelay/store/natsembed"
)

// testLog keeps the servers' warnings in the test output (shown on failure or -v).
func testLog(t *testing.T) *slog.Logger {
	return slog.New(slog.NewTextHandler(t.Output(), &slog.HandlerOptions{Level: slog.LevelWarn}))
}

// routeErrCounter counts nats-server's "Error trying to connect to route
// (attempt N)" records: first attempts and later ones, passing every record on.
type routeErrCounter struct {
	slog.Handler
	mu           *sync.Mutex
	first, later *int
}

func (h routeErrCounter) Handle(ctx context.Context, r slog.Record) error {
	if strings.Contains(r.Message, "Error trying to connect to route (attempt ") {
		h.mu.Lock()
		if strings.Contains(r.Message, "(attempt 1)") {
			*h.first++
		} else {
			*h.later++
		}
		h.mu.Unlock()
	}
	return h.Handler.Handle(ctx, r)
}

func (h routeErrCounter) WithAttrs(as []slog.Attr) slog.Handler {
	h.Handler = h.Handler.WithAttrs(as)
	return h
}

// eventually polls f until it returns nil or the deadline passes.
func eventually(t *testing.T, d time.Duration, what string, f func() error) {
	t.Helper()
	deadline := time.Now().Add(d)
	for {
		err := f()
		if err == nil {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: not within %s: %v", what, d, err)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// cluster is a set of embedded nodes on loopback; cfgs keep each node's bound
// ports so a stopped node restarts on the same addresses with the same store.
type cluster struct {
	t     *testing.T
	log   *slog.Logger
	cfgs  []natsembed.Config
	nodes []*natsembed.Node
}

// startCluster starts n nodes logging to log (nil: testLog).
func startCluster(t *testing.T, n int, log *slog.Logger) *cluster {
	t.Helper()
	if log == nil {
		log = testLog(t)
	}
	c := &cluster{t: t, log: log}
	// JetStream needs configured routes from the start, so the route ports are
	// picked first; every node gets the same list, itself included, as an
	// operator would configure it.
	var routes []string
	for range n {
		routes = append(routes, "nats-route://"+freeport.TCP(t))
	}
	for i := range n {
		cfg := natsembed.Config{
			NodeName:      fmt.Sprintf("n%d", i),
			ClientListen:  "127.0.0.1:0",
			ClusterListen: strings.TrimPrefix(routes[i], "nats-route://"),
			Routes:        routes,
			StoreDir:      t.TempDir(),
			Replicas:      n,
		}
		node := c.start(cfg)
		cfg.ClientListen = node.ClientAddr()
		c.cfgs = append(c.cfgs, cfg)
		c.nodes = append(c.nodes, node)
	}
	t.Cleanup(func() {
		for _, node := range c.nodes {
			if node != nil {
				node.Close()
			}
		}
	})
	return c
}

func (c *cluster) start(cfg natsembed.Config) *natsembed.Node {
	c.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	node, err := natsembed.Start(ctx, cfg, c.log)
	if err != nil {
		c.t.Fatal(err)
	}
	return node
}

func (c *cluster) stop(i int) {
	c.nodes[i].Close()
	c.nodes[i] = nil
}

// restart starts node i again with its old config: same ports, same store.
func (c *cluster) restart(i int) {
	c.nodes[i] = c.start(c.cfgs[i])
}

// js opens an in-process connection to node i and its JetStream context.
func (c *cluster) js(i int) jetstream.JetStream {
	c.t.Helper()
	nc, err := c.nodes[i].Connect()
	if err != nil {
		c.t.Fatal(err)
	}
	c.t.Cleanup(nc.Close)
	js, err := jetstream.New(nc)
	if err != nil {
		c.t.Fatal(err)
	}
	return js
}

func ctxFor(d time.Duration) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	_ = cancel // released by the timeout; a test call is short
	return ctx
}

// createStream creates an R3 file stream once the JetStream cluster has a meta
// leader and knows all three servers (both take a moment after start).
func createStream(t *testing.T, js jetstream.JetStream) jetstream.Stream {
	t.Helper()
	var s jetstream.Stream
	eventually(t, 20*time.Second, "create R3 stream", func() error {
		var err error
		s, err = js.CreateStream(ctxFor(2*time.Second), jetstream.StreamConfig{
			Name: "T", Subjects: []string{"t.>"}, Storage: jetstream.FileStorage, Replicas: 3,
		})
		return err
	})
	return s
}

func TestClusterReplicatesAcrossNodes(t *testing.T) {
	c := startCluster(t, 3, nil)
	createStream(t, c.js(0))
	ack, err := c.js(0).Publish(ctxFor(5*time.Second), "t.a", []byte("hello"))
	if err != nil {
		t.Fatalf("publish: %v", err)
	}
	s, err := c.js(1).Stream(ctxFor(5*time.Second), "T")
	if err != nil {
		t.Fatal(err)
	}
	info, err := s.Info(ctxFor(5 * time.Second))
	if err != nil {
		t.Fatal(err)
	}
	if info.Config.Replicas != 3 || info.Cluster == nil || len(info.Cluster.Replicas) != 2 {
		t.Fatalf("stream not R3 on three servers: config %d, cluster %+v", info.Config.Replicas, info.Cluster)
	}
	m, err := s.GetMsg(ctxFor(5*time.Second), ack.Sequence)
	if err != nil {
		t.Fatalf("read back through n1: %v", err)
	}
	if string(m.Data) != "hello" || m.Subject != "t.a" {
		t.Fatalf("read back %q on %q", m.Data, m.Subject)
	}
}

// publishUntilAcked retries one message (same Nats-Msg-Id, so a retry of a
// stored message is a duplicate, not a second copy) until it is acknowledged.
func publishUntilAcked(t *testing.T, js jetstream.JetStream, id string, within time.Duration) (*jetstream.PubAck, time.Duration) {
	t.Helper()
	start := time.Now()
	var ack *jetstream.PubAck
	eventually(t, within, "publish "+id, func() error {
		var err error
		ack, err = js.Publish(ctxFor(time.Second), "t."+id, []byte(id), jetstream.WithMsgID(id))
		return err
	})
	return ack, time.Since(start)
}

func TestClusterSurvivesQuorumLossAndRecovers(t *testing.T) {
	var mu sync.Mutex
	var firstErrs, laterErrs int
	c := startCluster(t, 3, slog.New(routeErrCounter{testLog(t).Handler(), &mu, &firstErrs, &laterErrs}))
	js0 := c.js(0)
	createStream(t, js0)
	s, err := js0.Stream(ctxFor(5*time.Second), "T")
	if err != nil {
		t.Fatal(err)
	}
	var leader string
	eventually(t, 10*time.Second, "stream leader", func() error {
		info, err := s.Info(ctxFor(time.Second))
		if err != nil {
			return err
		}
		if info.Cluster == nil || info.Cluster.Leader == "" {
			return errors.New("no leader yet")
		}
		leader = info.Cluster.Leader
		return nil
	})
	// The client stays on a node that is never stopped; the stream leader
	// goes first (the failover case), then one more node (quorum lost).
	li := int(leader[1] - '0')
	stay := (li + 1) % 3
	second := (li + 2) % 3
	js := c.js(stay)

	acked := map[uint64]string{}
	next := 0
	publish := func(within time.Duration) time.Duration {
		id := fmt.Sprintf("m%d", next)
		next++
		// A retry whose first try was stored but not acknowledged is
		// acknowledged as a duplicate carrying the first copy's sequence.
		ack, took := publishUntilAcked(t, js, id, within)
		if prev, ok := acked[ack.Sequence]; ok {
			t.Fatalf("%s acknowledged at seq %d, which holds %s", id, ack.Sequence, prev)
		}
		acked[ack.Sequence] = id
		return took
	}
	for range 5 {
		publish(5 * time.Second)
	}

	c.stop(li)
	t.Logf("stream leader %s stopped; next ack after %s", leader, publish(20*time.Second))
	for range 5 {
		publish(5 * time.Second)
	}

	c.stop(second)
	start := time.Now()
	ack, err := js.Publish(ctxFor(3*time.Second), "t.noquorum", []byte("x"), jetstream.WithMsgID("noquorum"))
	if err == nil {
		t.Fatalf("publish with 1 of 3 servers acknowledged at seq %d", ack.Sequence)
	}
	if took := time.Since(start); took > 4*time.Second {
		t.Fatalf("publish without quorum took %s to fail", took)
	}
	t.Logf("without quorum the publish failed after %s: %v", time.Since(start).Round(time.Millisecond), err)

	c.restart(second)
	t.Logf("%s restarted; next ack after %s", c.cfgs[second].NodeName, publish(30*time.Second))
	for range 5 {
		publish(5 * time.Second)
	}

	// Nothing acknowledged is lost, read through both running nodes.
	for _, i := range []int{stay, second} {
		rs, err := c.js(i).Stream(ctxFor(5*time.Second), "T")
		if err != nil {
			t.Fatal(err)
		}
		for seq, id := range acked {
			var m *jetstream.RawStreamMsg
			eventually(t, 10*time.Second, fmt.Sprintf("read seq %d on n%d", seq, i), func() error {
				var err error
				m, err = rs.GetMsg(ctxFor(time.Second), seq)
				return err
			})
			if string(m.Data) != id {
				t.Fatalf("seq %d on n%d: %q, want %q", seq, i, m.Data, id)
			}
		}
	}
	// Peers were down for seconds, redialled every second by each route
	// connection: only each connection's first failure is a warning in the
	// first minute (nats-server's default reports every one: 41 in one run).
	mu.Lock()
	defer mu.Unlock()
	t.Logf("route redial warnings: %d first attempts, %d later", firstErrs, laterErrs)
	if firstErrs == 0 || laterErrs != 0 {
		t.Fatalf("route redial warnings: %d first attempts, %d later; want some first, no later", firstErrs, laterErrs)
	}
}

func TestClusterKVCreateOneWinner(t *testing.T) {
	c := startCluster(t, 3, nil)
	js0, js1 := c.js(0), c.js(1)
	var kv0 jetstream.KeyValue
	eventually(t, 20*time.Second, "create R3 bucket", func() error {
		var err error
		kv0, err = js0.CreateKeyValue(ctxFor(2*time.Second), jetstream.KeyValueConfig{
			Bucket: "claims", Storage: jetstream.FileStorage, Replicas: 3,
		})
		return err
	})
	kv1, err := js1.KeyValue(ctxFor(5*time.Second), "claims")
	if err != nil {
		t.Fatal(err)
	}
	const keys = 20
	for k := range keys {
		key := fmt.Sprintf("k%d", k)
		var wg sync.WaitGroup
		var won [2]bool
		var errs [2]error
		for i, kv := range []jetstream.KeyValue{kv0, kv1} {
			wg.Go(func() {
				_, err := kv.Create(ctxFor(5*time.Second), key, []byte{byte('0' + i)})
				won[i], errs[i] = err == nil, err
			})
		}
		wg.Wait()
		if won[0] == won[1] {
			t.Fatalf("%s: won %v, errors %v", key, won, errs)
		}
		loser := 0
		if won[0] {
			loser = 1
		}
		if !errors.Is(errs[loser], jetstream.ErrKeyExists) {
			t.Fatalf("%s: loser's error %v, want ErrKeyExists", key, errs[loser])
		}
		e, err := kv1.Get(ctxFor(5*time.Second), key)
		if err != nil {
			t.Fatal(err)
		}
		if want := byte('0' + 1 - loser); e.Value()[0] != want || e.Revision() == 0 {
			t.Fatalf("%s holds %q rev %d, want the winner's %q", key, e.Value(), e.Revision(), want)
		}
	}
}

func TestStartConfigValidation(t *testing.T) {
	self := freeport.TCP(t)
	good := natsembed.Config{
		NodeName: "a", ClientListen: "127.0.0.1:0", ClusterListen: self,
		Routes: []string{"nats-route://" + self}, StoreDir: t.TempDir(), Replicas: 1,
	}
	for _, tc := range []struct {
		name string
		mod  func(*natsembed.Config)
		want string
	}{
		{"empty node name", func(c *natsembed.Config) { c.NodeName = "" }, "node name is empty"},
		{"space in node name", func(c *natsembed.Config) { c.NodeName = "a b" }, "spaces"},
		{"empty store dir", func(c *natsembed.Config) { c.StoreDir = "" }, "store dir is empty"},
		{"replicas 0", func(c *natsembed.Config) { c.Replicas = 0 }, "replicas 0"},
		{"replicas -1", func(c *natsembed.Config) { c.Replicas = -1 }, "replicas -1"},
		{"client listen without port", func(c *natsembed.Config) { c.ClientListen = "127.0.0.1" }, "client listen"},
		{"client listen port 65536", func(c *natsembed.Config) { c.ClientListen = "127.0.0.1:65536" }, "0 to 65535"},
		{"cluster listen empty", func(c *natsembed.Config) { c.ClusterListen = "" }, "cluster listen"},
		{"no routes", func(c *natsembed.Config) { c.Routes = nil }, "no routes"},
		{"route scheme", func(c *natsembed.Config) { c.Routes = []string{"http://h:6222"} }, "scheme"},
		{"route without port", func(c *natsembed.Config) { c.Routes = []string{"nats-route://h"} }, "host:port"},
		{"route without host", func(c *natsembed.Config) { c.Routes = []string{"nats-route://:6222"} }, "host:port"},
		{"route with path", func(c *natsembed.Config) { c.Routes = []string{"nats-route://h:6222/x"} }, "host:port"},
		{"route with credentials", func(c *natsembed.Config) { c.Routes = []string{"nats-route://u:secret@h:6222"} }, "credentials"},
		{"route unparsable", func(c *natsembed.Config) { c.Routes = []string{"nats-route://h:6222\x7f"} }, "route"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg := good
			tc.mod(&cfg)
			n, err := natsembed.Start(context.Background(), cfg, testLog(t))
			if err == nil {
				n.Close()
				t.Fatal("started")
			}
			if !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("error %q, want it to mention %q", err, tc.want)
			}
			if strings.Contains(err.Error(), "secret") {
				t.Fatalf("error %q shows the route password", err)
			}
		})
	}

	// The edges that are valid: replicas 1, ports 65535 and 0, both route schemes.
	t.Run("valid edges", func(t *testing.T) {
		cfg := good
		cfg.Routes = append(cfg.Routes, "nats-route://127.0.0.1:65535", "nats://localhost:1")
		n, err := natsembed.Start(ctxFor(10*time.Second), cfg, testLog(t))
		if err != nil {
			t.Fatal(err)
		}
		defer n.Close()
		if n.Replicas() != 1 || n.Name() != "a" || strings.HasSuffix(n.ClientAddr(), ":0") {
			t.Fatalf("node %s replicas %d client %s", n.Name(), n.Replicas(), n.ClientAddr())
		}
		nc, err := n.Connect(nats.Timeout(5 * time.Second))
		if err != nil {
			t.Fatal(err)
		}
		defer nc.Close()
		if err := nc.Flush(); err != nil {
			t.Fatal(err)
		}
	})

	// A port already taken fails Start with the server's reason, not a hang.
	t.Run("client port in use", func(t *testing.T) {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		defer l.Close()
		cfg := good
		cfg.StoreDir = t.TempDir()
		cfg.ClientListen = l.Addr().String()
		start := time.Now()
		n, err := natsembed.Start(ctxFor(10*time.Second), cfg, testLog(t))
		if err == nil {
			n.Close()
			t.Fatal("started on a taken port")
		}
		if time.Since(start) > 5*time.Second {
			t.Fatalf("took %s to fail: %v", time.Since(start), err)
		}
		t.Logf("taken port: %v", err)
	})

	t.Run("context ends", func(t *testing.T) {
		ctx, cancel := context.WithCancel(context.Background())
		cancel()
		cfg := good
		cfg.StoreDir = t.TempDir()
		n, err := natsembed.Start(ctx, cfg, testLog(t))
		if err == nil {
			n.Close()
			t.Fatal("started with an ended context")
		}
		if !errors.Is(err, context.Canceled) {
			t.Fatalf("error %v, want context.Canceled", err)
		}
	})
}
