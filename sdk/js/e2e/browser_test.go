package e2e

// The SDK in a real browser: headless Chromium driven by playwright-core
// (test/browser/run.mjs) loads pages from a page server on its own origin
// (pages_test.go) that import the compiled SDK from /dist/ and talk to a
// relay on 127.0.0.1: the mailbox with CORS, WebSocket bearers in
// subprotocols, WebRTC through our TURN, the agent listener over TLS.
// Each test runs one scenario (test/browser/scenarios/<name>.mjs, whose
// comment says what it asserts) in a browser of its own.
//
// Run: go test -count=1 -run Browser -v ./sdk/js/e2e/

import (
	"io"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"testing"
	"time"
)

// browserRig is a relay and the page servers of one browser test.
type browserRig struct {
	r *relay
	// page is the origin the relay lists in RELAY_CORS_ORIGINS
	// (http://localhost:<port>); other serves the same files on an
	// origin it does not list (http://127.0.0.1:<port>: same host as the
	// relay, another port, so another origin).
	page, other string
}

// startBrowserRig serves the pages and starts a relay that allows the
// page origin, and checks the pages are cross-origin to the relay (the
// point of these tests: a same-origin page would need no CORS at all).
func startBrowserRig(t *testing.T, env ...string) *browserRig {
	t.Helper()
	needChromium(t)
	b := &browserRig{page: servePages(t, "localhost"), other: servePages(t, "127.0.0.1")}
	b.r = startRelay(t, append([]string{"RELAY_CORS_ORIGINS=" + b.page}, env...)...)
	for _, o := range []string{b.page, b.other} {
		pu, _ := url.Parse(o)
		for _, relayOrigin := range []string{b.r.mailboxOrigin(), b.r.agentOrigin()} {
			ru, _ := url.Parse(relayOrigin)
			if pu.Host == ru.Host {
				t.Fatalf("page origin %s is the relay's %s", o, relayOrigin)
			}
		}
	}
	return b
}

// env is what every scenario reads (run.mjs lists it).
func (b *browserRig) env() []string {
	return []string{
		"PAGE_ORIGIN=" + b.page,
		"OTHER_ORIGIN=" + b.other,
		"RELAY_ORIGIN=" + b.r.mailboxOrigin(),
		"AGENT_ORIGIN=" + b.r.agentOrigin(),
		"TURN_ADDR=" + b.r.addrs["turn"],
		"CHROMIUM=" + chromiumPath,
	}
}

// TestBrowserCORS is scenario 4: from an origin not in RELAY_CORS_ORIGINS
// every fetch of the mailbox and of pair/redeem rejects with TypeError and
// a preflighted one never reaches the relay (the same claim and the same
// single-use pairing key then succeed from the listed origin); the listed
// origin reads statuses, JSON bodies and the exposed headers.
func TestBrowserCORS(t *testing.T) {
	b := startBrowserRig(t)
	b.r.cli("keys", "agent", "account", "add", "browser-cors")
	pairKey := b.r.cli("keys", "agent", "pair-key", "browser-cors")
	runBrowser(t, "cors", append(b.env(), "AGENT_SPKI="+agentSPKI(t, b.r), "PAIR_KEYS="+pairKey)...)
}

// TestBrowserMailbox is scenario 1: two pages are the primary and the
// companion of one link (made in page A, passed to page B as its code),
// claim the mailbox, store sealed envelopes both ways and watch each
// other: stored envelopes first, then live ones, in order, each once.
func TestBrowserMailbox(t *testing.T) {
	b := startBrowserRig(t)
	runBrowser(t, "mailbox", b.env()...)
}

// TestBrowserRelayOnly is scenario 2: connect() with relayOnly in both
// pages; getStats' selected pair is relay on both ends through our TURN
// listener, and 3 MiB cross (2 one way, 1 the other) with equal hashes.
// The relay's own counters then show the bytes went through its TURN
// server: at least those 3 MiB relayed in each direction of an
// allocation (to the peer from one, to the client from the other).
func TestBrowserRelayOnly(t *testing.T) {
	b := startBrowserRig(t)
	runBrowser(t, "rtc", b.env()...)
	const moved = 3 << 20
	for _, dir := range []string{"to_peer", "to_client"} {
		if got := adminMetric(t, b.r, `edgerelay_turn_relayed_bytes_total{direction="`+dir+`"}`); got < moved {
			t.Errorf("TURN relayed %v bytes %s, want at least %d", got, dir, moved)
		}
	}
	if got := adminMetric(t, b.r, "edgerelay_turn_allocations_total"); got < 2 {
		t.Errorf("TURN allocations %v, want at least 2 (one per page)", got)
	}
}

// TestBrowserAgent is scenario 3: a page attaches to a paired instance
// running the Go echo runtime and round-trips frames with AgentClient
// over wss (the development certificate trusted by its SPKI pin only).
// The runtime answered exactly the page's three cargo requests and saw
// the page's close as one acp.detach.
func TestBrowserAgent(t *testing.T) {
	b := startBrowserRig(t)
	in := pairInstance(t, b.r, "browser")
	c := runEchoRuntime(t, b.r, in)
	runBrowser(t, "agent", append(b.env(),
		"AGENT_SPKI="+agentSPKI(t, b.r), "AGENT_INSTANCE="+in.ID, "AGENT_TOKEN="+in.ClientToken)...)
	waitDetaches(t, c, 1)
	if n := echoCount(c); n != 3 {
		t.Errorf("echo runtime answered %d requests, want 3", n)
	}
}

// TestBrowserChat is scenario 5: the example app in two pages, a line
// each way over the data channel (nothing stored), then in two pages
// without RTCPeerConnection a line each way as sealed envelopes (one
// stored per direction).
func TestBrowserChat(t *testing.T) {
	b := startBrowserRig(t)
	runBrowser(t, "chat", b.env()...)
}

// adminMetric reads one sample of the relay's /metrics (name with its
// labels exactly as exposed, e.g. `x_total{direction="to_peer"}`); 0
// when absent.
func adminMetric(t *testing.T, r *relay, sample string) float64 {
	t.Helper()
	client := &http.Client{Timeout: 10 * time.Second}
	resp, err := client.Get("http://" + r.addrs["admin"] + "/metrics")
	if err != nil {
		t.Fatalf("GET /metrics: %v", err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	for _, line := range strings.Split(string(body), "\n") {
		if v, ok := strings.CutPrefix(line, sample+" "); ok {
			f, err := strconv.ParseFloat(strings.TrimSpace(v), 64)
			if err != nil {
				t.Fatalf("metric %s: %q: %v", sample, v, err)
			}
			return f
		}
	}
	return 0
}
