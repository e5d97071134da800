package e2e

// The Go agent runtime the JavaScript clients attach to: pairing an
// instance the way an operator and a runtime do (command line, then
// POST /v1/pair/redeem over TLS), and an echo runtime on the instance link
// dialed with agenttest, the connector that speaks the real runtime's
// bytes. Used by the Node tests (agent_node_test.go) and the browser tests.

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/fasthttp/websocket"

	"edgerelay/fastpath/agent/agenttest"
)

// instance is one paired agent instance and a client token of its
// account.
type instance struct{ ID, Token, ClientToken string }

// accountTokens remembers the client token of each account a test created,
// keyed by data dir and account name: an account is added once (a second
// `account add` of a name fails), and a relay restarted on the same data
// dir keeps its accounts.
var accountTokens sync.Map

// instanceSeq numbers instance names within the test process.
var instanceSeq atomic.Int64

// agentTLS is a TLS 1.3 client configuration trusting r's development CA.
func agentTLS(t *testing.T, r *relay) *tls.Config {
	t.Helper()
	pem, err := os.ReadFile(r.caPath())
	if err != nil {
		t.Fatalf("read the development CA: %v", err)
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(pem) {
		t.Fatalf("no certificate in %s", r.caPath())
	}
	return &tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS13, ServerName: "127.0.0.1"}
}

// pairInstance pairs a new instance of account (created on first use,
// with its client token) and returns its id, instance token and the
// account's client token.
func pairInstance(t *testing.T, r *relay, account string) *instance {
	t.Helper()
	key := r.dataDir + "\x00" + account
	tok, ok := accountTokens.Load(key)
	if !ok {
		tok = r.cli("keys", "agent", "account", "add", account)
		accountTokens.Store(key, tok)
	}
	pairKey := r.cli("keys", "agent", "pair-key", account)
	client := &http.Client{Timeout: 15 * time.Second, Transport: &http.Transport{TLSClientConfig: agentTLS(t, r)}}
	defer client.CloseIdleConnections()
	name := fmt.Sprintf("e2e-%s-%d", account, instanceSeq.Add(1))
	body, _ := json.Marshal(map[string]string{"key": pairKey, "instance_name": name})
	resp, err := client.Post(r.agentOrigin()+"/v1/pair/redeem", "application/json", bytes.NewReader(body))
	if err != nil {
		t.Fatalf("redeem a pairing key of %s: %v", account, err)
	}
	raw, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	var red struct {
		InstanceToken string `json:"instance_token"`
		InstanceID    string `json:"instance_id"`
	}
	if resp.StatusCode != http.StatusOK || json.Unmarshal(raw, &red) != nil || red.InstanceID == "" || red.InstanceToken == "" {
		t.Fatalf("redeem a pairing key of %s: %d %s", account, resp.StatusCode, raw)
	}
	return &instance{ID: red.InstanceID, Token: red.InstanceToken, ClientToken: tok.(string)}
}

// echoState is what an echo runtime counts.
type echoState struct {
	detaches atomic.Int64 // acp.detach frames received
	echoed   atomic.Int64 // requests answered
}

// echoes maps each *agenttest.Connector runEchoRuntime returned to its
// echoState.
var echoes sync.Map

func echoOf(c *agenttest.Connector) *echoState {
	s, ok := echoes.Load(c)
	if !ok {
		panic("e2e: connector not started by runEchoRuntime")
	}
	return s.(*echoState)
}

// detachCount is how many acp.detach frames the echo runtime c received.
func detachCount(c *agenttest.Connector) int { return int(echoOf(c).detaches.Load()) }

// echoCount is how many requests the echo runtime c answered.
func echoCount(c *agenttest.Connector) int { return int(echoOf(c).echoed.Load()) }

// waitDetaches waits until the echo runtime c has received n acp.detach
// frames (at least), failing t after 15 s.
func waitDetaches(t *testing.T, c *agenttest.Connector, n int) {
	t.Helper()
	deadline := time.Now().Add(15 * time.Second)
	for detachCount(c) < n {
		if time.Now().After(deadline) {
			t.Fatalf("echo runtime: %d acp.detach frames, want %d", detachCount(c), n)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// echoLine is the echo runtime's answer to f: type echo, the instance and
// session the relay routes on, re = the request's id, and the request's
// payload bytes exactly as they arrived (encoding/json's RawMessage keeps
// them; the line is written by hand because json.Marshal would compact
// them).
func echoLine(f agenttest.Frame) []byte {
	q := func(s string) []byte { b, _ := json.Marshal(s); return b }
	var b bytes.Buffer
	b.WriteString(`{"type":"echo","instance":`)
	b.Write(q(f.Instance))
	b.WriteString(`,"session":`)
	b.Write(q(f.Session))
	b.WriteString(`,"re":`)
	b.Write(q(f.ID))
	if len(f.Payload) > 0 {
		b.WriteString(`,"payload":`)
		b.Write(f.Payload)
	}
	b.WriteByte('}')
	return b.Bytes()
}

// runEchoRuntime dials in's instance link at r (TLS 1.3 against the
// development CA, the welcome verified against the relay's published key)
// and answers every cargo frame that has a session and an id with
// echoLine, until the test ends or the link drops (a relay restart: call
// it again for the new process). acp.detach frames are counted
// (detachCount). Heartbeats every 2 s with a 5 s timeout, so that a dead
// relay is noticed quickly.
//
// The instance field is set in the echo because the relay drops a frame
// whose session has no instance (spec/agent-relay.md, Validation).
func runEchoRuntime(t *testing.T, r *relay, in *instance) *agenttest.Connector {
	t.Helper()
	cfg := agentTLS(t, r)
	relayKey := r.cli("keys", "agent", "relay-key")
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	c, err := agenttest.Dial(ctx, agenttest.Options{
		Addr: r.addrs["agent"], ServerName: cfg.ServerName, RootCAs: cfg.RootCAs,
		Token: in.Token, Instance: in.ID, RelayKey: relayKey, Agent: "e2e-echo/1",
		HeartbeatEvery: 2 * time.Second, HeartbeatTimeout: 5 * time.Second,
	})
	if err != nil {
		t.Fatalf("echo runtime: dial the instance link of %s: %v", in.ID, err)
	}
	st := &echoState{}
	echoes.Store(c, st)
	t.Cleanup(func() { _ = c.Close(); echoes.Delete(c) })
	go func() {
		for {
			f, err := c.Next(time.Minute)
			if err != nil {
				select {
				case <-c.Done():
					return
				default:
					continue // no frame within the minute: keep waiting
				}
			}
			switch {
			case f.Type == "acp.detach":
				st.detaches.Add(1)
			case f.Session != "" && f.ID != "":
				if c.Send(echoLine(f)) == nil {
					st.echoed.Add(1)
				}
			}
		}
	}()
	return c
}

// TestAgentEchoRuntime checks the runtime the JavaScript tests rely on,
// with a Go WebSocket client: the echo carries the request's payload
// bytes unchanged (spacing, big numbers, duplicate keys) and a client
// going away is counted as an acp.detach.
func TestAgentEchoRuntime(t *testing.T) {
	r := startRelay(t)
	in := pairInstance(t, r, "echo-acct")
	c := runEchoRuntime(t, r, in)
	d := websocket.Dialer{TLSClientConfig: agentTLS(t, r), Subprotocols: []string{"contenox-relay.v1", "bearer." + in.ClientToken}}
	ws, resp, err := d.Dial("wss://"+r.addrs["agent"]+"/v1/attach/"+in.ID, nil)
	if err != nil {
		t.Fatalf("attach: %v %v", err, resp)
	}
	payload := `{ "n": 12345678901234567890, "N": 1, "n": [1 ,2], "s":"\u00e9" }`
	if err := ws.WriteMessage(websocket.TextMessage, []byte(`{"type":"ask","id":"q1","payload":`+payload+`}`)); err != nil {
		t.Fatal(err)
	}
	_ = ws.SetReadDeadline(time.Now().Add(10 * time.Second))
	_, msg, err := ws.ReadMessage()
	if err != nil {
		t.Fatalf("read the echo: %v", err)
	}
	f, err := agenttest.DecodeFrame(msg)
	if err != nil || f.Type != "echo" || f.Re != "q1" || f.Instance != in.ID || f.Session == "" ||
		!bytes.HasSuffix(msg, []byte(`,"payload":`+payload+`}`)) {
		t.Fatalf("echo %s (%v)", msg, err)
	}
	if echoCount(c) != 1 {
		t.Fatalf("echoed %d, want 1", echoCount(c))
	}
	ws.Close()
	waitDetaches(t, c, 1)
}
