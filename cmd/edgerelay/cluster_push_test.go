package main

import (
	"fmt"
	"io"
	"net/http"
	"regexp"
	"strings"
	"testing"
	"time"

	"edgerelay/push/pushtest"
)

// pushIDLine is the key id in `keys push create`'s first line.
var pushIDLine = regexp.MustCompile(`push gateway key (\S+) `)

// TestClusterPushGatewayLimitsAcrossNodes: three nodes behind HAProxy share
// the push gateway's keys, its per-key minute limit, its daily budget and
// its revocations: sends spread over the nodes by the balancer are counted
// once, exactly, and a key revoked through one node's admin is refused by
// every node at once.
func TestClusterPushGatewayLimitsAcrossNodes(t *testing.T) {
	p8, priv := pushtest.NewAPNsKey(t)
	fake := pushtest.NewAPNs(t, "TEAM123456", "KEY1234567", &priv.PublicKey)
	fake.RequireTopic("org.example.app")
	c := startRelayCluster(t, 3, []string{"push-apns"},
		"RELAY_APNS_KEY_FILE="+pushtest.WriteFile(t, "AuthKey.p8", p8),
		"RELAY_APNS_KEY_ID=KEY1234567", "RELAY_APNS_TEAM_ID=TEAM123456", "RELAY_APNS_TOPIC=org.example.app",
		"RELAY_APNS_URL="+fake.URL(), "SSL_CERT_FILE="+pushtest.WriteFile(t, "ca.pem", fake.CertPEM()),
		"RELAY_PUSH_RATE_PER_MINUTE=3", "RELAY_PUSH_DAILY_BUDGET=5")
	lb := startHAProxy(t, c, "push-apns")
	send := func(origin, key string, device int) (int, string) {
		body := fmt.Sprintf(`{"token":"%064x","title":"Hi","body":"there"}`, device)
		req, _ := http.NewRequest("POST", "http://"+origin+"/send", strings.NewReader(body))
		req.Header.Set("Authorization", "Bearer "+key)
		req.Header.Set("Content-Type", "application/json")
		resp, err := freshClient(nil).Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}

	// The minute limit of one key, through the balancer: 3 sends, then 429.
	created := cliOK(t, c.nodeEnv(0), "keys", "push", "create", "--label", "first")
	first := lastLine(created)
	for i := range 3 {
		if st, body := send(lb.addrs["push-apns"], first, i); st != http.StatusOK {
			t.Fatalf("send %d of 3 through the balancer: %d %s", i+1, st, body)
		}
	}
	if st, body := send(lb.addrs["push-apns"], first, 3); st != http.StatusTooManyRequests || !strings.Contains(body, `"window":"minute"`) {
		t.Fatalf("4th send of a key limited to 3 a minute, over three nodes: %d %s", st, body)
	}

	// The daily budget (5) across keys and nodes: 3 spent, 2 left.
	second := lastLine(cliOK(t, c.nodeEnv(1), "keys", "push", "create", "--label", "second"))
	for i := range 2 {
		if st, body := send(lb.addrs["push-apns"], second, 10+i); st != http.StatusOK {
			t.Fatalf("budget send %d of 2: %d %s", i+1, st, body)
		}
	}
	if st, body := send(lb.addrs["push-apns"], second, 12); st != http.StatusTooManyRequests || !strings.Contains(body, `"window":"day"`) {
		t.Fatalf("6th send of a budget of 5, over three nodes: %d %s", st, body)
	}
	if got := fake.Wait(5, 20*time.Second); len(got) != 5 {
		t.Fatalf("APNs received %d pushes, want 5", len(got))
	}

	// A revocation through node 2 reaches every node: each node's key watch
	// delivers it in milliseconds on a calm machine (the time is logged);
	// the bound is generous because a loaded 2-core CI machine once took
	// over a second, and a latency goal belongs in a benchmark.
	m := pushIDLine.FindStringSubmatch(created)
	if m == nil {
		t.Fatalf("no key id in:\n%s", created)
	}
	cliOK(t, c.nodeEnv(2), "keys", "push", "revoke", "--id", m[1])
	start := time.Now()
	for i, n := range c.nodes {
		for {
			st, _ := send(n.addrs["push-apns"], first, 20+i)
			if st == http.StatusUnauthorized {
				break
			}
			if time.Since(start) > 15*time.Second {
				t.Fatalf("node %d still takes the revoked key after %s: %d", i, time.Since(start), st)
			}
			time.Sleep(10 * time.Millisecond)
		}
	}
	t.Logf("a revocation through node 2 refused by every node after %s", time.Since(start).Round(time.Millisecond))
}
