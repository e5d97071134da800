package main

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/fasthttp/websocket"

	"edgerelay/fastpath/agent/agenttest"
)

// TestAgentRelayThroughTheBinary is an operator's whole set-up: an
// account and a pairing key minted with the command line while the relay
// is stopped, the relay started with its development certificate, a
// runtime redeeming the key and dialing in over TLS 1.3 with the welcome
// verified against `keys agent relay-key`, and a browser attaching.
func TestAgentRelayThroughTheBinary(t *testing.T) {
	dir := t.TempDir()
	env := []string{"RELAY_DATA_DIR=" + dir}
	out, errOut, code := edgerelay(t, env, "keys", "agent", "account", "add", "alice")
	if code != 0 {
		t.Fatalf("account add: %d %s", code, errOut)
	}
	clientToken := lastLine(out)
	out, errOut, code = edgerelay(t, env, "keys", "agent", "pair-key", "alice")
	if code != 0 {
		t.Fatalf("pair-key: %d %s", code, errOut)
	}
	pairKey := lastLine(out)
	out, _, code = edgerelay(t, env, "keys", "agent", "relay-key")
	relayKey := lastLine(out)
	if code != 0 || len(relayKey) != 44 {
		t.Fatalf("relay-key: %d %q", code, relayKey)
	}

	s := startServer(t, append(env, "RELAY_AGENT_LISTEN=127.0.0.1:0")...)
	caPEM, err := os.ReadFile(filepath.Join(dir, "tls", "ca.pem"))
	if err != nil {
		t.Fatal(err)
	}
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(caPEM)
	client := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS13}}}
	origin := s.origin("agent")
	if !strings.HasPrefix(origin, "https://") {
		origin = "https://" + s.addrs["agent"]
	}
	redeemed := redeemPairKey(t, client, origin, pairKey, "build-box")
	if redeemed.RelayPublicKey != relayKey {
		t.Fatalf("redeem: relay key %q, want %q", redeemed.RelayPublicKey, relayKey)
	}
	// The key is single use.
	body, _ := json.Marshal(map[string]string{"key": pairKey, "instance_name": "build-box"})
	resp, err := client.Post(origin+"/v1/pair/redeem", "application/json", bytes.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != 403 {
		t.Fatalf("second redeem: %d", resp.StatusCode)
	}

	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	conn, err := agenttest.Dial(ctx, agenttest.Options{
		Addr: s.addrs["agent"], ServerName: "127.0.0.1", RootCAs: pool,
		Token: redeemed.InstanceToken, Instance: redeemed.InstanceID, RelayKey: relayKey,
		HeartbeatEvery: time.Second, HeartbeatTimeout: 2 * time.Second,
	})
	if err != nil {
		t.Fatalf("connector: %v", err)
	}
	defer conn.Close()

	d := websocket.Dialer{TLSClientConfig: &tls.Config{RootCAs: pool, ServerName: "127.0.0.1"}, Subprotocols: []string{"contenox-relay.v1", "bearer." + clientToken}}
	ws, wresp, err := d.Dial("wss://"+s.addrs["agent"]+"/v1/attach/"+redeemed.InstanceID, nil)
	if err != nil {
		t.Fatalf("attach: %v %v", err, wresp)
	}
	defer ws.Close()
	if err := ws.WriteMessage(websocket.TextMessage, []byte(`{"type":"ask.run","id":"r1","unknown_field":[1,2],"payload":{"q":"hi"}}`)); err != nil {
		t.Fatal(err)
	}
	var session string
	for session == "" {
		f, err := conn.Next(10 * time.Second)
		if err != nil {
			t.Fatalf("instance read: %v", err)
		}
		if f.Type == "ask.run" {
			if f.Instance != redeemed.InstanceID || f.Session == "" || !bytes.Contains(f.Raw, []byte(`"unknown_field":[1,2]`)) {
				t.Fatalf("routed line %s", f.Raw)
			}
			session = f.Session
		}
	}
	reply := `{"type":"ask.result","instance":"` + redeemed.InstanceID + `","session":"` + session + `","re":"r1","payload":{"a":"hello"}}`
	if err := conn.Send([]byte(reply)); err != nil {
		t.Fatal(err)
	}
	_ = ws.SetReadDeadline(time.Now().Add(10 * time.Second))
	_, msg, err := ws.ReadMessage()
	if err != nil || string(msg) != reply {
		t.Fatalf("client got %q %v", msg, err)
	}

	// Online: the instance shows connected; revoking it closes the link.
	adminEnv := append(env, "RELAY_ADMIN_LISTEN="+s.addrs["admin"])
	out, _, code = edgerelay(t, adminEnv, "keys", "agent", "instance", "list")
	if code != 0 || !strings.Contains(out, redeemed.InstanceID) || !regexpLine(out, redeemed.InstanceID+`\s+build-box\s+alice\s+false\s+true\s+1`) {
		t.Fatalf("instance list:\n%s", out)
	}
	if _, errOut, code := edgerelay(t, adminEnv, "keys", "agent", "instance", "revoke", redeemed.InstanceID); code != 0 {
		t.Fatalf("revoke: %s", errOut)
	}
	select {
	case <-conn.Done():
	case <-ctx.Done():
		t.Fatal("link still open after revoke")
	}
}

// pairRedemption is POST /v1/pair/redeem's answer.
type pairRedemption struct {
	InstanceToken  string `json:"instance_token"`
	InstanceID     string `json:"instance_id"`
	RelayPublicKey string `json:"relay_public_key"`
}

// redeemPairKey redeems a pairing key at the agent listener (origin is
// https://host:port) for an instance named name; anything but 200 fails t.
func redeemPairKey(t *testing.T, client *http.Client, origin, key, name string) pairRedemption {
	t.Helper()
	body, _ := json.Marshal(map[string]string{"key": key, "instance_name": name})
	resp, err := client.Post(origin+"/v1/pair/redeem", "application/json", bytes.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	raw, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	var redeemed pairRedemption
	if resp.StatusCode != 200 || json.Unmarshal(raw, &redeemed) != nil {
		t.Fatalf("redeem: %d %s", resp.StatusCode, raw)
	}
	return redeemed
}
