package main

import (
	"encoding/json"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"edgerelay/internal/freeport"

	"github.com/pion/logging"
	pionturn "github.com/pion/turn/v4"
)

// TestICECredentialsWorkOnTheBuiltInTURN asks the mailbox ice endpoint for
// credentials and allocates with them on the built-in TURN server, both
// from one binary sharing RELAY_TURN_SECRET; a peer datagram comes back.
func TestICECredentialsWorkOnTheBuiltInTURN(t *testing.T) {
	turnAddr := freeport.TCPAndUDP(t)
	s := startServer(t, "RELAY_MAILBOX_LISTEN=127.0.0.1:0", "RELAY_APPS=chat:ice",
		"RELAY_TURN_LISTEN="+turnAddr, "RELAY_TURN_SECRET=shared-rest-secret", "RELAY_TURN_ALLOW_PEERS=127.0.0.0/8")
	base := s.origin("mailbox") + "/v1/chat/mailbox/ice-e2e-mailbox-00001"
	tok := "ice-e2e-token-0123456789"
	if code := mailboxDo(t, "PUT", base, tok, nil); code != 201 {
		t.Fatalf("claim %d", code)
	}
	req, _ := http.NewRequest("GET", base+"/ice", nil)
	req.Header.Set("Authorization", "Bearer "+tok)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	raw, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	var ice iceAnswer
	if err := json.Unmarshal(raw, &ice); err != nil || len(ice.ICEServers) != 2 {
		t.Fatalf("ice %d %s", resp.StatusCode, raw)
	}
	srv := ice.ICEServers[1]
	if srv.URLs[0] != "turn:"+turnAddr+"?transport=udp" {
		t.Fatalf("turn url %v", srv.URLs)
	}

	peer, err := net.ListenPacket("udp4", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer peer.Close()
	go func() { // an echo peer
		buf := make([]byte, 1500)
		for {
			n, from, err := peer.ReadFrom(buf)
			if err != nil {
				return
			}
			_, _ = peer.WriteTo(buf[:n], from)
		}
	}()
	conn, err := net.ListenPacket("udp4", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	client, err := pionturn.NewClient(&pionturn.ClientConfig{
		TURNServerAddr: turnAddr, Username: srv.Username, Password: srv.Credential,
		Conn: conn, LoggerFactory: logging.NewDefaultLoggerFactory(),
	})
	if err != nil {
		t.Fatal(err)
	}
	defer client.Close()
	if err := client.Listen(); err != nil {
		t.Fatal(err)
	}
	relayConn, err := client.Allocate()
	if err != nil {
		t.Fatalf("allocate with the ice credentials: %v", err)
	}
	defer relayConn.Close()
	buf := make([]byte, 1500)
	for try := 0; ; try++ {
		if _, err := relayConn.WriteTo([]byte("through the relay"), peer.LocalAddr()); err != nil {
			t.Fatal(err)
		}
		_ = relayConn.SetReadDeadline(time.Now().Add(500 * time.Millisecond))
		n, _, err := relayConn.ReadFrom(buf)
		if err == nil && string(buf[:n]) == "through the relay" {
			break
		}
		if try == 10 {
			t.Fatalf("no echo through the relay: %v", err)
		}
	}
	// A credential under another secret is refused.
	bad, err := pionturn.NewClient(&pionturn.ClientConfig{
		TURNServerAddr: turnAddr, Username: srv.Username, Password: strings.Repeat("A", 28),
		Conn: mustUDP(t), LoggerFactory: logging.NewDefaultLoggerFactory(),
	})
	if err != nil {
		t.Fatal(err)
	}
	defer bad.Close()
	if err := bad.Listen(); err != nil {
		t.Fatal(err)
	}
	if _, err := bad.Allocate(); err == nil {
		t.Fatal("a wrong credential allocated")
	}
}

// iceAnswer is the mailbox ice endpoint's answer, as a WebRTC client reads it.
type iceAnswer struct {
	ICEServers []struct {
		URLs       []string `json:"urls"`
		Username   string   `json:"username"`
		Credential string   `json:"credential"`
	} `json:"iceServers"`
}

func mustUDP(t *testing.T) net.PacketConn {
	t.Helper()
	c, err := net.ListenPacket("udp4", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}
