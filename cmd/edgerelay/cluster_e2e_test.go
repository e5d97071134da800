package main

import (
	"fmt"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"
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
func startRelayCluster(t *testing.T, n int, env ...string) *relayCluster {
	t.Helper()
	c := &relayCluster{t: t}
	var routes []string
	for range n {
		c.nats = append(c.nats, freePort(t))
		routes = append(routes, "nats-route://"+freePort(t))
	}
	var started []<-chan string
	for i := range n {
		s := &relayProc{}
		nodeEnv := append(append([]string(nil), clusterNodeEnv...),
			fmt.Sprintf("RELAY_NODE_NAME=node%d", i),
			"RELAY_ADMIN_LISTEN="+freePort(t),
			"RELAY_NATS_EMBED_LISTEN="+c.nats[i],
			"RELAY_NATS_EMBED_CLUSTER_LISTEN="+strings.TrimPrefix(routes[i], "nats-route://"),
			"RELAY_NATS_EMBED_ROUTES="+strings.Join(routes, ","),
		)
		prepare(t, s, append(nodeEnv, env...)...)
		c.nodes = append(c.nodes, s)
		started = append(started, s.launch())
	}
	for i, s := range c.nodes {
		s.awaitStart(started[i])
	}
	return c
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
	nats0 := freePort(t)
	// An external-client node first: its NATS does not exist yet.
	waiting := &relayProc{}
	waitingAdmin := freePort(t)
	prepare(t, waiting, append(append([]string(nil), clusterNodeEnv...),
		"RELAY_NODE_NAME=client", "RELAY_ADMIN_LISTEN="+waitingAdmin, "RELAY_NATS_URL=nats://"+nats0)...)
	waiting.launch()
	waitStderr(t, waiting, "cluster store not reachable yet, retrying", 30*time.Second)
	if conn, err := net.DialTimeout("tcp", waitingAdmin, time.Second); err == nil {
		conn.Close()
		t.Fatal("a node without its cluster opened its admin listener: it would serve on its own")
	}

	c := startRelayCluster(t, 3, "RELAY_TURN_SECRET=shared-secret")
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
