package main

import (
	"bufio"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"errors"
	"net"
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
	f := agentNext(t, c)
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
	c := a.connect(t)
	ws, sess := a.attach(t, c, "hi")
	sizes := []int{6 << 20, 16<<20 - 1, 16<<20 - 1}
	done := make(chan error, 1)
	go func() {
		for i, size := range sizes {
			_ = ws.SetReadDeadline(time.Now().Add(30 * time.Second))
			_, msg, err := ws.ReadMessage()
			if err != nil {
				done <- err
				return
			}
			if len(msg) != size || !strings.Contains(string(msg[:300]), `"n":`+strconv.Itoa(i)+`,`) {
				done <- errors.New("frame " + strconv.Itoa(i) + ": " + strconv.Itoa(len(msg)) + " bytes")
				return
			}
		}
		done <- nil
	}()
	for i, size := range sizes {
		if err := c.Send(a.cargo(sess, i, size)); err != nil {
			t.Fatal(err)
		}
	}
	if err := <-done; err != nil {
		t.Fatalf("the reading client: %v", err)
	}
}

// TestAgentInstanceQueueBytesThroughTheBinary: with
// RELAY_AGENT_INSTANCE_QUEUE_BYTES at its least (32 MiB, one client's whole
// queue), two clients that stop reading, one sent twice as much as the
// other, reach the bound together although each is within its own queue:
// the one holding the most gets 1013 and the instance acp.detach; the other
// keeps every frame sent to it and stays attached.
func TestAgentInstanceQueueBytesThroughTheBinary(t *testing.T) {
	a := startAgentSite(t, "RELAY_AGENT_INSTANCE_QUEUE_BYTES=33554432")
	c := a.connect(t)
	big, bigSess := a.attach(t, c, "big")
	small, smallSess := a.attach(t, c, "small")

	sentSmall := 0
	var detached []string
	for i := 0; len(detached) == 0; i++ {
		if i > 100 { // 300 MiB
			t.Fatal("no client was closed")
		}
		for _, line := range [][]byte{a.cargo(bigSess, i, 1<<20), a.cargo(bigSess, i, 1<<20), a.cargo(smallSess, i, 1<<20)} {
			if err := c.Send(line); err != nil {
				t.Fatal(err)
			}
		}
		sentSmall++
		// The relay reads the link in order: the ack of this heartbeat
		// comes after whatever the frames before it caused.
		sync := "sync-" + strconv.Itoa(i)
		if err := c.Send([]byte(`{"type":"relay.heartbeat","instance":"` + a.instance + `","id":"` + sync + `"}`)); err != nil {
			t.Fatal(err)
		}
		for {
			f := agentNext(t, c)
			if f.Type == "relay.ack" && f.Re == sync {
				break
			}
			if f.Type != "acp.detach" {
				t.Fatalf("instance got %.200s", f.Raw)
			}
			detached = append(detached, f.Session)
		}
	}
	if len(detached) != 1 || detached[0] != bigSess {
		t.Fatalf("detached %v, want only the client holding the most (%s)", detached, bigSess)
	}
	if n := hostileMetric(t, a.s, `edgerelay_agent_slow_clients_closed_total{queue="instance"}`); n != 1 {
		t.Fatalf("%v clients closed for the instance's bound", n)
	}
	_ = big.SetReadDeadline(time.Now().Add(20 * time.Second))
	for {
		_, _, err := big.ReadMessage()
		if err == nil {
			continue
		}
		var ce *websocket.CloseError
		if !errors.As(err, &ce) || ce.Code != 1013 {
			t.Fatalf("the client holding the most: %v, want close 1013", err)
		}
		break
	}
	_ = small.SetReadDeadline(time.Now().Add(20 * time.Second))
	for i := range sentSmall {
		_, msg, err := small.ReadMessage()
		if err != nil || !strings.Contains(string(msg[:300]), `"session":"`+smallSess+`","n":`+strconv.Itoa(i)+`,`) {
			t.Fatalf("frame %d to the other client: %.200s %v", i, msg, err)
		}
	}
	if err := small.WriteMessage(websocket.TextMessage, []byte(`{"type":"acp.message","id":"still-here"}`)); err != nil {
		t.Fatal(err)
	}
	if f := agentNext(t, c); f.ID != "still-here" {
		t.Fatalf("instance got %.200s", f.Raw)
	}
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
	a := startAgentSite(t)
	hello := func(nonce string) string {
		return `{"type":"relay.hello","instance":"` + a.instance + `","id":"hello","payload":{"protocol_version":1,"instance":"` + a.instance + `","agent":"raw/1","nonce":` + nonce + `}}`
	}
	for _, tc := range []struct {
		nonce, want string // want: an error code, "sig" or "no sig"
	}{
		{`""`, "malformed_frame"},
		{`[1,2,3]`, "malformed_frame"},
		{`null`, "no sig"},
		{`"AA=="`, "sig"},
	} {
		f := a.rawHello(t, hello(tc.nonce))
		var p struct {
			Code string `json:"code"`
			Sig  []byte `json:"sig"`
		}
		_ = json.Unmarshal(f.Payload, &p)
		ok := f.Re == "hello"
		switch tc.want {
		case "sig":
			ok = ok && f.Type == "relay.welcome" && len(p.Sig) == 64
		case "no sig":
			ok = ok && f.Type == "relay.welcome" && !strings.Contains(string(f.Raw), `"sig"`)
		default:
			ok = ok && f.Type == "relay.error" && p.Code == tc.want
		}
		if !ok {
			t.Errorf("nonce %s: got %s, want %s", tc.nonce, f.Raw, tc.want)
		}
	}
}

// TestAgentDeepRequestThroughTheBinary: a client request nested 20,000
// levels deep (past every decoder's depth limit) is answered
// malformed_frame, as is one a level past the scanner's 128; one at 128 is
// routed.
func TestAgentDeepRequestThroughTheBinary(t *testing.T) {
	a := startAgentSite(t)
	c := a.connect(t)
	ws, sess := a.attach(t, c, "hi")
	nested := func(id string, depth int) []byte {
		return []byte(`{"type":"acp.message","id":"` + id + `","payload":` + strings.Repeat("[", depth) + strings.Repeat("]", depth) + `}`)
	}
	if err := ws.WriteMessage(websocket.TextMessage, nested("at-limit", 127)); err != nil {
		t.Fatal(err)
	}
	if f := agentNext(t, c); f.ID != "at-limit" {
		t.Fatalf("instance got %.200s", f.Raw)
	}
	for _, tc := range []struct {
		id    string
		depth int
	}{{"past-limit", 128}, {"very-deep", 20_000}} {
		if err := ws.WriteMessage(websocket.TextMessage, nested(tc.id, tc.depth)); err != nil {
			t.Fatal(err)
		}
		_ = ws.SetReadDeadline(time.Now().Add(10 * time.Second))
		_, msg, err := ws.ReadMessage()
		if err != nil {
			var ne net.Error
			if errors.As(err, &ne) && ne.Timeout() {
				t.Fatalf("%s: no answer", tc.id)
			}
			t.Fatal(err)
		}
		f, err := agenttest.DecodeFrame(msg)
		if err != nil || f.Type != "relay.error" || f.Re != tc.id || f.Session != sess || !strings.Contains(string(f.Payload), `"code":"malformed_frame"`) {
			t.Fatalf("%s: answered %s", tc.id, msg)
		}
	}
}
