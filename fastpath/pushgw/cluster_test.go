package pushgw_test

import (
	"encoding/json"
	"fmt"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/valyala/fasthttp"

	"edgerelay/fastpath/pushgw"
	"edgerelay/store"
	"edgerelay/store/cluster/clustertest"
	"edgerelay/store/cluster/pushkv"
)

// clusterMount is one FCM mount on each of three cluster nodes, as three
// edgerelay processes behind a load balancer run it: the same handler,
// the cluster's key store.
func clusterMounts(t *testing.T, rate, budget int) []*pushgw.Handler {
	t.Helper()
	nodes := clustertest.Start(t, 3)
	fake := newFCMFake(t)
	hs := make([]*pushgw.Handler, nodes.Len())
	for i := range hs {
		st, err := pushkv.New(clustertest.Context(t), nodes.Node(i), store.PushScopeShared)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = st.Close() })
		h, err := pushgw.New(pushgw.Config{
			Provider: pushgw.ProviderFCM, FCM: fake.client, Store: st, Registration: true,
			RatePerMinute: rate, DailyBudget: budget, Metered: true, TrustedProxyHeader: "X-Forwarded-For",
		})
		if err != nil {
			t.Fatal(err)
		}
		hs[i] = h
	}
	return hs
}

// call serves one request on h, from ip (via the trusted proxy header).
func call(h *pushgw.Handler, path, ip, key, body string) (int, string) {
	var req fasthttp.Request
	req.Header.SetMethod("POST")
	req.SetRequestURI(path)
	req.Header.SetContentType("application/json")
	if ip != "" {
		req.Header.Set("X-Forwarded-For", ip)
	}
	if key != "" {
		req.Header.Set("Authorization", "Bearer "+key)
	}
	req.SetBodyString(body)
	var ctx fasthttp.RequestCtx
	ctx.Init(&req, &net.TCPAddr{IP: net.IPv4(127, 0, 0, 1), Port: 40000}, nil)
	h.ServeHTTP(&ctx)
	return ctx.Response.StatusCode(), string(ctx.Response.Body())
}

func sendBody(token string) string {
	return fmt.Sprintf(`{"token":%q,"title":"New message","body":"hello"}`, token)
}

// Requests spread over three nodes meet the limits as one node would: the
// per-key minute limit, the daily budget and the per-address registration
// limit are exact across the nodes, a superseded key is refused on every
// node, and a token claimed through one node is refused to another key
// through the next.
func TestClusterLimitsAcrossNodes(t *testing.T) {
	hs := clusterMounts(t, 3, 6)
	register := func(node int, ip string) string {
		t.Helper()
		status, body := call(hs[node%len(hs)], "/register", ip, "", `{"label":"srv"}`)
		if status != 201 {
			t.Fatalf("register from %s via node %d: %d %s", ip, node%len(hs), status, body)
		}
		var r struct{ Key string }
		if err := json.Unmarshal([]byte(body), &r); err != nil {
			t.Fatal(err)
		}
		return r.Key
	}
	send := func(node int, key, token string, want int, wantBody string) {
		t.Helper()
		status, body := call(hs[node%len(hs)], "/send", "", key, sendBody(token))
		if status != want || !strings.Contains(body, wantBody) {
			t.Fatalf("send via node %d: %d %s, want %d with %s", node%len(hs), status, body, want, wantBody)
		}
	}

	// One key per address: the second registration, through another node,
	// supersedes the first on every node.
	k1 := register(0, "198.51.100.1")
	k2 := register(1, "198.51.100.1")
	deadline := time.Now().Add(time.Second)
	for {
		// A body without a token: 400 while the key is still good on node 2
		// (after authorization, before anything is counted), 401 once the
		// supersede has reached it. A real send here would spend the
		// budget the test counts below whenever node 2 learns late.
		status, _ := call(hs[2], "/send", "", k1, `{}`)
		if status == 401 {
			break
		}
		if status != 400 {
			t.Fatalf("probe of the superseded key on node 2: %d, want 400 then 401", status)
		}
		if time.Now().After(deadline) {
			t.Fatalf("superseded key answers %d on node 2 after 1 s", status)
		}
		time.Sleep(5 * time.Millisecond)
	}

	// The minute limit (3): one send through each node, then the fourth
	// is refused wherever it arrives.
	for n := range 3 {
		send(n, k2, "tok-1", 200, `"ok":true`)
	}
	send(0, k2, "tok-1", 429, `"window":"minute"`)

	// The token is bound to k2: another key is refused through any node
	// (after its minute limit counted the attempt, as the spec orders).
	k3 := register(2, "198.51.100.2")
	send(0, k3, "tok-1", 403, "already bound")
	// The budget (6): three sends spent, three more through other keys and
	// nodes, then the day is spent for every key on every node.
	send(1, k3, "tok-2", 200, `"ok":true`)
	send(2, k3, "tok-2", 200, `"ok":true`)
	k4 := register(0, "198.51.100.3")
	send(0, k4, "tok-3", 200, `"ok":true`)
	send(1, k4, "tok-3", 429, "daily budget exhausted")

	// Registrations per address (5 a minute): one past the limit refused.
	for n := range 5 {
		register(n, "198.51.100.4")
	}
	if status, body := call(hs[2], "/register", "198.51.100.4", "", `{}`); status != 429 {
		t.Fatalf("sixth registration from one address: %d %s", status, body)
	}
}
