package main

import (
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"edgerelay/internal/freeport"

	"github.com/fasthttp/websocket"
)

// relayCluster is n `edgerelay serve` processes in cluster mode, each
// embedding a nats-server on loopback, routed to each other.
type relayCluster struct {
	t     *testing.T
	nodes []*relayProc
	// nats are the embedded servers' client addresses, for nodes that
	// join as external clients.
	nats []string
}

// clusterNodeEnv turns off the services that do not share their state
// across nodes yet (serve refuses them in cluster mode).
var clusterNodeEnv = []string{
	"RELAY_MAILBOX_LISTEN=", "RELAY_CHANNEL_LISTEN=", "RELAY_AGENT_LISTEN=",
	"RELAY_PUSH_FCM_LISTEN=", "RELAY_PUSH_APNS_LISTEN=",
}

// startRelayCluster launches n nodes together (each waits for a quorum of
// the others before it serves) and waits until every one has started.
// The services named listen on ports fixed for the test (a restarted node
// comes back where the balancer expects it); the others are off.
func startRelayCluster(t *testing.T, n int, services []string, env ...string) *relayCluster {
	t.Helper()
	c := &relayCluster{t: t}
	var routes []string
	for range n {
		c.nats = append(c.nats, freeport.TCP(t))
		routes = append(routes, "nats-route://"+freeport.TCP(t))
	}
	var started []<-chan string
	for i := range n {
		s := &relayProc{}
		nodeEnv := append(append([]string(nil), clusterNodeEnv...),
			fmt.Sprintf("RELAY_NODE_NAME=node%d", i),
			"RELAY_ADMIN_LISTEN="+freeport.TCP(t),
			"RELAY_NATS_EMBED_LISTEN="+c.nats[i],
			"RELAY_NATS_EMBED_CLUSTER_LISTEN="+strings.TrimPrefix(routes[i], "nats-route://"),
			"RELAY_NATS_EMBED_ROUTES="+strings.Join(routes, ","),
		)
		for _, svc := range services {
			nodeEnv = append(nodeEnv, "RELAY_"+strings.ToUpper(strings.ReplaceAll(svc, "-", "_"))+"_LISTEN="+freeport.TCP(t))
		}
		prepare(t, s, append(nodeEnv, env...)...)
		c.nodes = append(c.nodes, s)
		started = append(started, s.launch())
	}
	for i, s := range c.nodes {
		s.awaitStart(started[i])
	}
	// A failed cluster test shows what the nodes logged past their start
	// (peers judged gone, fences, refusals): the likely why of a timing.
	t.Cleanup(func() {
		if !t.Failed() {
			return
		}
		for i, s := range c.nodes {
			t.Logf("node%d's log:\n%s", i, tailLines(s.stderr.String(), 40))
		}
	})
	c.awaitPeersHeard()
	return c
}

// awaitPeersHeard waits until every running node hears every other one's
// beats. A node judges only the peers it has heard: one killed or stalled
// before that (the servers' routes form a moment after the nodes serve,
// later on a busy machine) is judged only when the start's grace ends
// (10 s), which a test of the judgement (within 2 s) must not meet.
func (c *relayCluster) awaitPeersHeard() {
	c.t.Helper()
	others := float64(len(c.nodes) - 1)
	deadline := time.Now().Add(30 * time.Second)
	for i, s := range c.nodes {
		for {
			n := hostileMetric(c.t, s, "edgerelay_cluster_peers")
			if n == others {
				break
			}
			if time.Now().After(deadline) {
				c.t.Fatalf("node%d hears %v other nodes after 30 s, want %v", i, n, others)
			}
			time.Sleep(20 * time.Millisecond)
		}
	}
}

// tailLines is the last n lines of s.
func tailLines(s string, n int) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	return strings.Join(lines[max(0, len(lines)-n):], "\n")
}

// readyz returns a node's /readyz status (0 when its admin listener does
// not answer).
func readyz(s *relayProc) int {
	resp, err := http.Get("http://" + s.addrs["admin"] + "/readyz")
	if err != nil {
		return 0
	}
	resp.Body.Close()
	return resp.StatusCode
}

// waitReadyz polls until a node's /readyz answers want.
func waitReadyz(t *testing.T, s *relayProc, want int, within time.Duration) time.Duration {
	t.Helper()
	start := time.Now()
	for readyz(s) != want {
		if time.Since(start) > within {
			t.Fatalf("/readyz of %s not %d within %s (last %d)\n%s", s.addrs["admin"], want, within, readyz(s), s.stderr.String())
		}
		time.Sleep(50 * time.Millisecond)
	}
	return time.Since(start)
}

// waitStderr polls until a process's log contains text.
func waitStderr(t *testing.T, s *relayProc, text string, within time.Duration) {
	t.Helper()
	deadline := time.Now().Add(within)
	for !strings.Contains(s.stderr.String(), text) {
		if time.Now().After(deadline) {
			t.Fatalf("log has no %q within %s:\n%s", text, within, s.stderr.String())
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// TestClusterNodesStartTogetherAndAgree: a node that cannot reach NATS
// waits without serving anything; three embedded nodes start together;
// the waiting node then serves as their client; a node whose shared
// settings differ refuses to start naming the setting; losing the quorum
// makes /readyz 503 on the survivor and a returning node heals it.
func TestClusterNodesStartTogetherAndAgree(t *testing.T) {
	nats0 := freeport.TCP(t)
	// An external-client node first: its NATS does not exist yet.
	waiting := &relayProc{}
	waitingAdmin := freeport.TCP(t)
	prepare(t, waiting, append(append([]string(nil), clusterNodeEnv...),
		"RELAY_NODE_NAME=client", "RELAY_ADMIN_LISTEN="+waitingAdmin, "RELAY_NATS_URL=nats://"+nats0)...)
	waiting.launch()
	waitStderr(t, waiting, "cluster store not reachable yet, retrying", 30*time.Second)
	if conn, err := net.DialTimeout("tcp", waitingAdmin, time.Second); err == nil {
		conn.Close()
		t.Fatal("a node without its cluster opened its admin listener: it would serve on its own")
	}

	c := startRelayCluster(t, 3, nil, "RELAY_TURN_SECRET=shared-secret")
	for _, s := range c.nodes {
		waitReadyz(t, s, http.StatusOK, 30*time.Second)
	}
	t.Log("the three nodes are ready")

	// The waiting node keeps waiting (its port never gets a server); a
	// client of node 0's embedded server joins and serves.
	joined := &relayProc{}
	prepare(t, joined, append(append([]string(nil), clusterNodeEnv...),
		"RELAY_NODE_NAME=joined", "RELAY_ADMIN_LISTEN=127.0.0.1:0", "RELAY_NATS_URL=nats://"+c.nats[0],
		"RELAY_TURN_SECRET=shared-secret")...)
	joined.start()
	waitReadyz(t, joined, http.StatusOK, 30*time.Second)
	if conn, err := net.DialTimeout("tcp", waitingAdmin, 200*time.Millisecond); err == nil {
		conn.Close()
		t.Fatal("the node whose NATS never came up serves")
	}

	// Differing shared settings: refused, naming the setting, not its value.
	for _, tc := range []struct{ env, name string }{
		{"RELAY_TURN_SECRET=another-secret", "RELAY_TURN_SECRET"},
		{"RELAY_MAX_STORED=4097", "RELAY_MAX_STORED"},
	} {
		env := append(append(cleanEnv(), clusterNodeEnv...),
			"RELAY_DATA_DIR="+t.TempDir(), "RELAY_NODE_NAME=odd", "RELAY_ADMIN_LISTEN=127.0.0.1:0",
			"RELAY_TURN_LISTEN=", "RELAY_NATS_URL=nats://"+c.nats[1], "RELAY_TURN_SECRET=shared-secret", tc.env)
		_, stderr, code := edgerelay(t, env, "serve")
		if code != 1 || !strings.Contains(stderr, tc.name+" differs") {
			t.Fatalf("%s: exit %d, want 1 naming %s:\n%s", tc.env, code, tc.name, stderr)
		}
		if strings.Contains(stderr, "another-secret") || strings.Contains(stderr, "shared-secret") {
			t.Fatalf("the refusal logs a secret:\n%s", stderr)
		}
	}

	// Changing a shared setting: forget the record, then a node with the
	// new value starts (and records it).
	forgetEnv := []string{"RELAY_NATS_URL=nats://" + c.nats[2]}
	if out := cliOK(t, forgetEnv, "cluster", "forget-setting", "RELAY_MAX_STORED"); !strings.Contains(out, "forgot RELAY_MAX_STORED") {
		t.Fatalf("forget-setting: %s", out)
	}
	if _, stderr, code := edgerelay(t, forgetEnv, "cluster", "forget-setting", "RELAY_DATA_DIR"); code != 2 || !strings.Contains(stderr, "not a setting the nodes must agree on") {
		t.Fatalf("forget-setting of a per-node setting: exit %d %s", code, stderr)
	}
	changed := &relayProc{}
	prepare(t, changed, append(append([]string(nil), clusterNodeEnv...),
		"RELAY_NODE_NAME=changed", "RELAY_ADMIN_LISTEN=127.0.0.1:0", "RELAY_NATS_URL=nats://"+c.nats[1],
		"RELAY_TURN_SECRET=shared-secret", "RELAY_MAX_STORED=4097")...)
	changed.start()
	changed.kill()
	// Back to the old value for the nodes' restarts below.
	cliOK(t, forgetEnv, "cluster", "forget-setting", "RELAY_MAX_STORED")

	// Quorum lost: 2 of 3 embedded servers killed.
	c.nodes[1].kill()
	c.nodes[2].kill()
	lost := waitReadyz(t, c.nodes[0], http.StatusServiceUnavailable, 20*time.Second)
	waitReadyz(t, joined, http.StatusServiceUnavailable, 20*time.Second)
	t.Logf("quorum lost: /readyz 503 after %s", lost.Round(100*time.Millisecond))
	back := time.Now()
	c.nodes[1].start() // returns once node 1 has a quorum again
	waitReadyz(t, c.nodes[0], http.StatusOK, 60*time.Second)
	healed := time.Since(back)
	waitReadyz(t, joined, http.StatusOK, 30*time.Second)
	t.Logf("a node back: /readyz 200 on the survivor after %s", healed.Round(100*time.Millisecond))
}

// nodeEnv is the environment of a key command run against node i's admin
// listener, with the cluster settings (so that it never falls back to the
// data dir's own store).
func (c *relayCluster) nodeEnv(i int) []string {
	return []string{"RELAY_DATA_DIR=" + c.nodes[i].dataDir, "RELAY_ADMIN_LISTEN=" + c.nodes[i].addrs["admin"], "RELAY_NATS_URL=nats://" + c.nats[i]}
}

// freshClient opens a new connection per request, so that behind the
// round-robin balancer consecutive requests reach different nodes.
func freshClient(tlsCfg *tls.Config) *http.Client {
	return &http.Client{Timeout: 15 * time.Second, Transport: &http.Transport{DisableKeepAlives: true, TLSClientConfig: tlsCfg}}
}

// TestClusterChannelAndAgentKeysAcrossNodes: the durable state of the
// private channel and the agent relay is one across three nodes behind
// HAProxy: keys minted through one node's admin listener work through
// every node, a claim key raced through the balancer is won once, a
// pairing key is redeemed once, every node signs with the one agent key,
// and key commands never fall back to a data dir's own store.
func TestClusterChannelAndAgentKeysAcrossNodes(t *testing.T) {
	c := startRelayCluster(t, 3, []string{"channel", "agent"})
	lb := startHAProxy(t, c, "channel", "agent")

	// Channel: a key added through node 0, claimed by 6 racing clients.
	key := lastLine(cliOK(t, c.nodeEnv(0), "keys", "channel", "add", "--host", "box"))
	type claimed struct {
		status       int
		owner, phone string
	}
	results := make(chan claimed, 6)
	for range 6 {
		go func() {
			owner, phone := randHex(t), randHex(t)
			body := fmt.Sprintf(`{"ownerToken":%q,"phoneToken":%q}`, owner, phone)
			req, _ := http.NewRequest("POST", "http://"+lb.addrs["channel"]+"/claim", strings.NewReader(body))
			req.Header.Set("Authorization", "Bearer "+key)
			resp, err := freshClient(nil).Do(req)
			if err != nil {
				results <- claimed{status: -1}
				return
			}
			resp.Body.Close()
			results <- claimed{resp.StatusCode, owner, phone}
		}()
	}
	var won claimed
	for range 6 {
		r := <-results
		switch r.status {
		case http.StatusOK:
			if won.status != 0 {
				t.Fatal("one claim key was won twice through the balancer")
			}
			won = r
		case http.StatusConflict:
		default:
			t.Fatalf("racing claim: %d, want 200 once and 409 for the rest", r.status)
		}
	}
	if won.status != http.StatusOK {
		t.Fatal("no racing claim won")
	}
	// The owner token works through every node.
	for i, n := range c.nodes {
		req, _ := http.NewRequest("GET", "http://"+n.addrs["channel"]+"/status", nil)
		req.Header.Set("Authorization", "Bearer "+won.owner)
		resp, err := freshClient(nil).Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			t.Fatalf("status with the owner token through node %d: %d", i, resp.StatusCode)
		}
	}
	if out := cliOK(t, c.nodeEnv(2), "keys", "channel", "list"); !strings.Contains(out, "box") {
		t.Fatalf("keys channel list through node 2:\n%s", out)
	}
	// The computer's control socket on node 1; its key revoked through
	// node 0's admin: node 1 closes the socket (1000), as one node does.
	ctl, _, err := websocket.DefaultDialer.Dial("ws://"+c.nodes[1].addrs["channel"]+"/host", http.Header{"Authorization": {"Bearer " + won.owner}})
	if err != nil {
		t.Fatalf("control socket on node 1: %v", err)
	}
	defer ctl.Close()
	cliOK(t, c.nodeEnv(0), "keys", "channel", "revoke", "--host", "box")
	_ = ctl.SetReadDeadline(time.Now().Add(10 * time.Second))
	for {
		if _, _, err := ctl.ReadMessage(); err != nil {
			if !websocket.IsCloseError(err, websocket.CloseNormalClosure) {
				t.Fatalf("control socket after a revocation through another node: %v, want close 1000", err)
			}
			break
		}
	}

	// Agent: one relay key on every node; an account through node 1, its
	// pairing key through node 2, redeemed by 3 racing runtimes.
	relayKey := lastLine(cliOK(t, c.nodeEnv(0), "keys", "agent", "relay-key"))
	for i := 1; i < 3; i++ {
		if k := lastLine(cliOK(t, c.nodeEnv(i), "keys", "agent", "relay-key")); k != relayKey {
			t.Fatalf("node %d signs with %s, node 0 with %s", i, k, relayKey)
		}
	}
	cliOK(t, c.nodeEnv(1), "keys", "agent", "account", "add", "alice")
	pairKey := lastLine(cliOK(t, c.nodeEnv(2), "keys", "agent", "pair-key", "alice"))
	pool := x509.NewCertPool()
	for _, n := range c.nodes { // each node has its own development certificate
		caPEM, err := os.ReadFile(filepath.Join(n.dataDir, "tls", "ca.pem"))
		if err != nil {
			t.Fatal(err)
		}
		pool.AppendCertsFromPEM(caPEM)
	}
	tlsCfg := &tls.Config{RootCAs: pool, ServerName: "127.0.0.1", MinVersion: tls.VersionTLS13}
	codes := make(chan int, 3)
	for range 3 {
		go func() {
			body := fmt.Sprintf(`{"key":%q,"instance_name":"box"}`, pairKey)
			resp, err := freshClient(tlsCfg).Post("https://"+lb.addrs["agent"]+"/v1/pair/redeem", "application/json", strings.NewReader(body))
			if err != nil {
				codes <- -1
				return
			}
			resp.Body.Close()
			codes <- resp.StatusCode
		}()
	}
	redeemed := 0
	for range 3 {
		switch code := <-codes; code {
		case http.StatusOK:
			redeemed++
		case http.StatusForbidden:
		default:
			t.Fatalf("racing redeem: %d", code)
		}
	}
	if redeemed != 1 {
		t.Fatalf("a pairing key raced through the balancer was redeemed %d times", redeemed)
	}
	out := cliOK(t, c.nodeEnv(0), "keys", "agent", "instance", "list")
	if !strings.Contains(out, "box") {
		t.Fatalf("instance list through node 0:\n%s", out)
	}

	// No node answering: the key commands refuse instead of writing to
	// the data dir's own store.
	env := []string{"RELAY_DATA_DIR=" + t.TempDir(), "RELAY_ADMIN_LISTEN=" + freeport.TCP(t), "RELAY_NATS_URL=nats://" + c.nats[0]}
	for _, args := range [][]string{{"keys", "channel", "list"}, {"keys", "agent", "account", "list"}, {"keys", "push", "list"}} {
		_, stderr, code := edgerelay(t, env, args...)
		if code != 1 || !strings.Contains(stderr, "cluster mode: no node answered") {
			t.Fatalf("%v without a node: exit %d\n%s", args, code, stderr)
		}
	}
}
