package main

import (
	"bufio"
	"context"
	"crypto/tls"
	"crypto/x509"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/fasthttp/websocket"

	"edgerelay/fastpath/agent/agenttest"
)

// agentSite is a running relay with one account and one paired instance.
type agentSite struct {
	s                *relayProc
	pool             *x509.CertPool
	clientToken      string
	instance, token  string
	relayKey, origin string
}

// startAgentSite mints an account and a pairing key with the command line,
// starts serve with env, and redeems the key as a runtime would.
func startAgentSite(t *testing.T, env ...string) *agentSite {
	t.Helper()
	dir := t.TempDir()
	base := []string{"RELAY_DATA_DIR=" + dir}
	site := &agentSite{clientToken: lastLine(cliOK(t, base, "keys", "agent", "account", "add", "alice"))}
	pairKey := lastLine(cliOK(t, base, "keys", "agent", "pair-key", "alice"))
	site.relayKey = lastLine(cliOK(t, base, "keys", "agent", "relay-key"))
	site.s = startServer(t, append(base, env...)...)
	caPEM, err := os.ReadFile(filepath.Join(dir, "tls", "ca.pem"))
	if err != nil {
		t.Fatal(err)
	}
	site.pool = x509.NewCertPool()
	site.pool.AppendCertsFromPEM(caPEM)
	site.origin = "https://" + site.s.addrs["agent"]
	client := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{TLSClientConfig: site.tlsConfig()}}
	redeemed := redeemPairKey(t, client, site.origin, pairKey, "build-box")
	site.instance, site.token = redeemed.InstanceID, redeemed.InstanceToken
	return site
}

func (a *agentSite) tlsConfig() *tls.Config {
	return &tls.Config{RootCAs: a.pool, ServerName: "127.0.0.1", MinVersion: tls.VersionTLS13}
}

// connect dials the instance link with the test connector (welcome
// verified against the published key).
func (a *agentSite) connect(t *testing.T) *agenttest.Connector {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	c, err := agenttest.Dial(ctx, agenttest.Options{
		Addr: a.s.addrs["agent"], ServerName: "127.0.0.1", RootCAs: a.pool,
		Token: a.token, Instance: a.instance, RelayKey: a.relayKey,
		HeartbeatEvery: time.Minute, HeartbeatTimeout: 10 * time.Second,
	})
	if err != nil {
		t.Fatalf("connector: %v", err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// attach attaches a client, has it send one frame, and returns it with
// the session the instance saw.
func (a *agentSite) attach(t *testing.T, c *agenttest.Connector, probe string) (*websocket.Conn, string) {
	t.Helper()
	d := websocket.Dialer{TLSClientConfig: a.tlsConfig(), Subprotocols: []string{"contenox-relay.v1", "bearer." + a.clientToken}}
	ws, resp, err := d.Dial("wss://"+a.s.addrs["agent"]+"/v1/attach/"+a.instance, nil)
	if err != nil {
		t.Fatalf("attach: %v %v", err, resp)
	}
	t.Cleanup(func() { ws.Close() })
	if err := ws.WriteMessage(websocket.TextMessage, []byte(`{"type":"acp.message","id":"`+probe+`"}`)); err != nil {
		t.Fatal(err)
	}
	f, err := c.Next(20 * time.Second)
	if err != nil {
		// What the client heard says why: relay.error unknown_instance
		// means its node took the link for offline.
		_ = ws.SetReadDeadline(time.Now().Add(2 * time.Second))
		_, msg, rerr := ws.ReadMessage()
		t.Fatalf("instance: %v; the client got %.300s %v", err, msg, rerr)
	}
	if f.ID != probe || f.Session == "" {
		t.Fatalf("instance got %.200s", f.Raw)
	}
	return ws, f.Session
}

func agentNext(t *testing.T, c *agenttest.Connector) agenttest.Frame {
	t.Helper()
	f, err := c.Next(20 * time.Second)
	if err != nil {
		t.Fatalf("instance: %v", err)
	}
	return f
}

// cargo is a frame from the instance to session of size bytes, numbered n.
func (a *agentSite) cargo(session string, n, size int) []byte {
	head := `{"type":"acp.message","instance":"` + a.instance + `","session":"` + session + `","n":` + strconv.Itoa(n) + `,"pad":"`
	return []byte(head + strings.Repeat("p", size-len(head)-len(`"}`)) + `"}`)
}

// TestAgentBigFramesThroughTheBinary: a client that reads gets a 6 MiB
// frame and then two lines at the 16,777,216-byte line limit, sent back to
// back (with a 4 MiB queue the first one closed it with 1013).
func TestAgentBigFramesThroughTheBinary(t *testing.T) {
	a := startAgentSite(t)
	agentBigFrames(t, a, a)
}

// TestAgentInstanceQueueBytesThroughTheBinary: with
// RELAY_AGENT_INSTANCE_QUEUE_BYTES at its least (32 MiB, one client's whole
// queue), two clients that stop reading, one sent twice as much as the
// other, reach the bound together although each is within its own queue:
// the one holding the most gets 1013 and the instance acp.detach; the other
// keeps every frame sent to it and stays attached.
func TestAgentInstanceQueueBytesThroughTheBinary(t *testing.T) {
	a := startAgentSite(t, "RELAY_AGENT_INSTANCE_QUEUE_BYTES=33554432")
	agentInstanceQueueBytes(t, a, a)
}

// rawAgentHello upgrades a link by hand, sends line as the hello and
// returns the relay's answer.
func (a *agentSite) rawHello(t *testing.T, line string) agenttest.Frame {
	t.Helper()
	conn, err := tls.Dial("tcp", a.s.addrs["agent"], a.tlsConfig())
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	_ = conn.SetDeadline(time.Now().Add(20 * time.Second))
	req := "GET /v1/connect HTTP/1.1\r\nHost: " + a.s.addrs["agent"] + "\r\nUpgrade: contenox-relay/1\r\nConnection: Upgrade\r\nAuthorization: Bearer " + a.token + "\r\n\r\n"
	if _, err := conn.Write([]byte(req)); err != nil {
		t.Fatal(err)
	}
	br := bufio.NewReader(conn)
	resp, err := http.ReadResponse(br, nil)
	if err != nil || resp.StatusCode != http.StatusSwitchingProtocols {
		t.Fatalf("upgrade: %v %v", resp, err)
	}
	if _, err := conn.Write([]byte(line + "\n")); err != nil {
		t.Fatal(err)
	}
	raw, err := br.ReadBytes('\n')
	if err != nil {
		t.Fatalf("no answer to the hello: %v", err)
	}
	f, err := agenttest.DecodeFrame(raw[:len(raw)-1])
	if err != nil {
		t.Fatal(err)
	}
	return f
}

// TestAgentHelloEmptyNonceThroughTheBinary: "nonce":"" is a nonce of 0
// bytes, refused with malformed_frame (it got a welcome without sig), as
// is a nonce of another JSON type; a null nonce is no nonce; one byte is
// the least that is signed.
func TestAgentHelloEmptyNonceThroughTheBinary(t *testing.T) {
	agentHelloEmptyNonce(t, startAgentSite(t))
}

// TestAgentDeepRequestThroughTheBinary: a client request nested 20,000
// levels deep (past every decoder's depth limit) is answered
// malformed_frame, as is one a level past the scanner's 128; one at 128 is
// routed.
func TestAgentDeepRequestThroughTheBinary(t *testing.T) {
	a := startAgentSite(t)
	agentDeepRequest(t, a, a)
}
