package main

import (
	"crypto/tls"
	"crypto/x509"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
)

// TestClusterImportMovesASingleNode is how an operator outgrows one
// machine: a single node's channel keys (claimed, unused) and agent
// records (account, instance, unused pairing key, signing key) move into a
// three-node cluster with `edgerelay cluster import`, refused while the
// single node runs, idempotent when run twice, and then serve through
// every node.
func TestClusterImportMovesASingleNode(t *testing.T) {
	single := startServer(t, "RELAY_MAILBOX_LISTEN=", "RELAY_PUSH_FCM_LISTEN=")
	adminEnv := []string{"RELAY_DATA_DIR=" + single.dataDir, "RELAY_ADMIN_LISTEN=" + single.addrs["admin"]}
	claimedKey := lastLine(cliOK(t, adminEnv, "keys", "channel", "add", "--host", "claimed"))
	unusedKey := lastLine(cliOK(t, adminEnv, "keys", "channel", "add", "--host", "unused"))
	status, owner, _ := claim(t, single.origin("channel"), claimedKey)
	if status != http.StatusOK {
		t.Fatalf("claim on the single node: %d", status)
	}
	cliOK(t, adminEnv, "keys", "agent", "account", "add", "alice")
	pairKey := lastLine(cliOK(t, adminEnv, "keys", "agent", "pair-key", "alice"))
	unusedPair := lastLine(cliOK(t, adminEnv, "keys", "agent", "pair-key", "alice"))
	relayKey := lastLine(cliOK(t, adminEnv, "keys", "agent", "relay-key"))
	pushKey := lastLine(cliOK(t, adminEnv, "keys", "push", "create", "--label", "homeserver"))
	caPEM, err := os.ReadFile(filepath.Join(single.dataDir, "tls", "ca.pem"))
	if err != nil {
		t.Fatal(err)
	}
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(caPEM)
	agentClient := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool}}}
	redeemed := redeemPairKey(t, agentClient, "https://"+single.addrs["agent"], pairKey, "build-box")

	c := startRelayCluster(t, 3, []string{"channel", "push-apns"})
	importEnv := []string{"RELAY_NATS_URL=nats://" + c.nats[0]}
	if _, stderr, code := edgerelay(t, importEnv, "cluster", "import", "--from", single.dataDir); code != 1 || !strings.Contains(stderr, "still running") {
		t.Fatalf("import while the single node runs: exit %d\n%s", code, stderr)
	}
	if code := single.signal(syscall.SIGTERM, 15*time.Second); code != 0 {
		t.Fatalf("single node stop: exit %d", code)
	}
	want := "channel: 2 claim keys\nagent: 1 accounts\nagent: 1 instances\nagent: 2 pairing keys\npush gateway: 1 API keys\n"
	for round := range 2 { // the second run finds everything in place
		out := cliOK(t, importEnv, "cluster", "import", "--from", single.dataDir)
		if !strings.HasPrefix(out, want) {
			t.Fatalf("import round %d:\n%s\nwant it to start with:\n%s", round, out, want)
		}
	}

	// Channel: the claimed computer's owner token works through every
	// node, its key stays used, the unused key is claimed once.
	for i, n := range c.nodes {
		if !ownerWorks(t, n.addrs["channel"], owner) {
			t.Fatalf("the imported owner token is refused through node %d", i)
		}
	}
	if s, _, _ := claim(t, "http://"+c.nodes[1].addrs["channel"], claimedKey); s != http.StatusConflict {
		t.Fatalf("claiming the used key again: %d, want 409", s)
	}
	if s, _, _ := claim(t, "http://"+c.nodes[2].addrs["channel"], unusedKey); s != http.StatusOK {
		t.Fatalf("claiming the imported unused key: %d, want 200", s)
	}
	if s, _, _ := claim(t, "http://"+c.nodes[0].addrs["channel"], unusedKey); s != http.StatusConflict {
		t.Fatalf("claiming it a second time: %d, want 409", s)
	}

	// Push gateway: the imported key is listed by every node and known to
	// its /send (an unconfigured provider answers 500 after the key check;
	// an unknown key would be 401).
	for i, n := range c.nodes {
		if out := cliOK(t, c.nodeEnv(i), "keys", "push", "list"); !strings.Contains(out, "homeserver") {
			t.Fatalf("keys push list through node %d:\n%s", i, out)
		}
		req, _ := http.NewRequest("POST", "http://"+n.addrs["push-apns"]+"/send", strings.NewReader(`{"token":"`+strings.Repeat("ab", 32)+`"}`))
		req.Header.Set("Authorization", "Bearer "+pushKey)
		req.Header.Set("Content-Type", "application/json")
		resp, err := freshClient(nil).Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode == http.StatusUnauthorized {
			t.Fatalf("node %d refuses the imported push key", i)
		}
	}

	// Agent: a node turning the agent relay on signs with the single
	// node's key and knows its instance and its unused pairing key.
	agentNode := &relayProc{}
	prepare(t, agentNode, append(append([]string(nil), clusterNodeEnv...),
		"RELAY_NODE_NAME=agents", "RELAY_ADMIN_LISTEN=127.0.0.1:0", "RELAY_AGENT_LISTEN=127.0.0.1:0",
		"RELAY_NATS_URL=nats://"+c.nats[1])...)
	agentNode.start()
	env := []string{"RELAY_DATA_DIR=" + agentNode.dataDir, "RELAY_ADMIN_LISTEN=" + agentNode.addrs["admin"], "RELAY_NATS_URL=nats://" + c.nats[1]}
	if k := lastLine(cliOK(t, env, "keys", "agent", "relay-key")); k != relayKey {
		t.Fatalf("the cluster signs with %s, the single node signed with %s", k, relayKey)
	}
	if out := cliOK(t, env, "keys", "agent", "instance", "list"); !strings.Contains(out, redeemed.InstanceID) {
		t.Fatalf("instance list:\n%s", out)
	}
	nodeCA, err := os.ReadFile(filepath.Join(agentNode.dataDir, "tls", "ca.pem"))
	if err != nil {
		t.Fatal(err)
	}
	pool.AppendCertsFromPEM(nodeCA)
	again := redeemPairKey(t, agentClient, "https://"+agentNode.addrs["agent"], unusedPair, "second-box")
	if again.RelayPublicKey != relayKey {
		t.Fatalf("redeem through the cluster: relay key %s, want %s", again.RelayPublicKey, relayKey)
	}
}
