package main

import (
	"encoding/json"
	"errors"
	"net"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/fasthttp/websocket"

	"edgerelay/fastpath/agent/agenttest"
)

// The agent hardening suite (agent_hardening_test.go) with the runtime's
// link on one node and its clients on another: the bodies below take the
// link's site and the clients' site, which are the same on one node.

// site is the cluster seen through node i as the hardening suite's
// agentSite: links and clients made with it dial that node.
func (a *agentCluster) site(i int) *agentSite {
	n := a.c.nodes[i]
	return &agentSite{
		s: n, pool: a.pool, clientToken: a.token,
		instance: a.instance.InstanceID, token: a.instance.InstanceToken,
		relayKey: a.relayKey, origin: "https://" + n.addrs["agent"],
	}
}

// TestClusterAgentHardening: big frames up to the line limit from a link
// on node 0 to a client on node 1, a deep request from a client on node 2
// to the link on node 0, and the hello's nonce checks on node 1.
func TestClusterAgentHardening(t *testing.T) {
	t.Parallel()
	a := startAgentCluster(t)
	t.Run("BigFrames", func(t *testing.T) { agentBigFrames(t, a.site(0), a.site(1)) })
	t.Run("DeepRequest", func(t *testing.T) { agentDeepRequest(t, a.site(0), a.site(2)) })
	t.Run("HelloEmptyNonce", func(t *testing.T) { agentHelloEmptyNonce(t, a.site(1)) })
}

// TestClusterAgentInstanceQueueBytes: the instance's bound on its clients'
// queues holds on the clients' node for lines from a link on another.
func TestClusterAgentInstanceQueueBytes(t *testing.T) {
	t.Parallel()
	a := startAgentCluster(t, "RELAY_AGENT_INSTANCE_QUEUE_BYTES=33554432")
	agentInstanceQueueBytes(t, a.site(0), a.site(1))
}

// agentBigFrames: a client that reads gets a 6 MiB frame and then two
// lines at the 16,777,216-byte line limit, sent back to back.
func agentBigFrames(t *testing.T, link, client *agentSite) {
	c := link.connect(t)
	ws, sess := client.attach(t, c, "hi")
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
		if err := c.Send(link.cargo(sess, i, size)); err != nil {
			t.Fatal(err)
		}
	}
	if err := <-done; err != nil {
		t.Fatalf("the reading client: %v", err)
	}
}

// agentInstanceQueueBytes: with RELAY_AGENT_INSTANCE_QUEUE_BYTES at its
// least (32 MiB, one client's whole queue), two clients that stop reading,
// one sent twice as much as the other, reach the bound together although
// each is within its own queue: the one holding the most gets 1013 and the
// instance acp.detach; the other keeps every frame sent to it and stays
// attached.
func agentInstanceQueueBytes(t *testing.T, link, client *agentSite) {
	c := link.connect(t)
	big, bigSess := client.attach(t, c, "big")
	small, smallSess := client.attach(t, c, "small")

	sentSmall := 0
	var detached []string
	for i := 0; len(detached) == 0; i++ {
		if i > 100 { // 300 MiB
			t.Fatal("no client was closed")
		}
		for _, line := range [][]byte{link.cargo(bigSess, i, 1<<20), link.cargo(bigSess, i, 1<<20), link.cargo(smallSess, i, 1<<20)} {
			if err := c.Send(line); err != nil {
				t.Fatal(err)
			}
		}
		sentSmall++
		// The relay reads the link in order: the ack of this heartbeat
		// comes after whatever the frames before it caused on this node;
		// a detach from the clients' node may come a moment later.
		sync := "sync-" + strconv.Itoa(i)
		if err := c.Send([]byte(`{"type":"relay.heartbeat","instance":"` + link.instance + `","id":"` + sync + `"}`)); err != nil {
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
	if n := hostileMetric(t, client.s, `edgerelay_agent_slow_clients_closed_total{queue="instance"}`); n != 1 {
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
	for {
		f := agentNext(t, c)
		if f.Type == "acp.detach" && f.Session == bigSess {
			continue // from the clients' node, after the ack
		}
		if f.ID != "still-here" {
			t.Fatalf("instance got %.200s", f.Raw)
		}
		break
	}
}

// agentHelloEmptyNonce: "nonce":"" is a nonce of 0 bytes, refused with
// malformed_frame, as is a nonce of another JSON type; a null nonce is no
// nonce; one byte is the least that is signed.
func agentHelloEmptyNonce(t *testing.T, a *agentSite) {
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

// agentDeepRequest: a client request nested 20,000 levels deep (past every
// decoder's depth limit) is answered malformed_frame, as is one a level
// past the scanner's 128; one at 128 is routed.
func agentDeepRequest(t *testing.T, link, client *agentSite) {
	c := link.connect(t)
	ws, sess := client.attach(t, c, "hi")
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
