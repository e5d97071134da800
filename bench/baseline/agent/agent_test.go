package agent

import (
	"context"
	"crypto/ed25519"
	"crypto/tls"
	"crypto/x509"
	"encoding/base64"
	"encoding/pem"
	"net"
	"net/http"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/fasthttp/websocket"

	"edgerelay/fastpath/agent/agenttest"
	"edgerelay/fastpath/tlsconf"
)

// The baseline speaks the protocol's routing path well enough for the test
// connector (TLS 1.3, the upgrade, the signed welcome) and a WebSocket
// client: frames go both ways, re-encoded.
func TestBaselineRoutes(t *testing.T) {
	dir := t.TempDir()
	paths, err := tlsconf.EnsureDevCert(dir, nil)
	if err != nil {
		t.Fatal(err)
	}
	rl, err := tlsconf.NewReloader(paths.Cert, paths.Key)
	if err != nil {
		t.Fatal(err)
	}
	pemCA, _ := os.ReadFile(paths.CA)
	block, _ := pem.Decode(pemCA)
	ca, _ := x509.ParseCertificate(block.Bytes)
	roots := x509.NewCertPool()
	roots.AddCert(ca)

	pub, key, _ := ed25519.GenerateKey(nil)
	h := New(key, Credentials{Instances: map[string]string{"itok": "inst-1"}, Clients: map[string][]string{"ctok": {"inst-1"}}})
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: h, ReadHeaderTimeout: 5 * time.Second}
	go func() { _ = srv.Serve(tls.NewListener(ln, tlsconf.ServerConfig(rl, true))) }()
	defer srv.Close()

	c, err := agenttest.Dial(context.Background(), agenttest.Options{
		Addr: ln.Addr().String(), RootCAs: roots, Token: "itok", Instance: "inst-1",
		RelayKey: base64.StdEncoding.EncodeToString(pub), HeartbeatEvery: time.Minute,
	})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	d := websocket.Dialer{TLSClientConfig: &tls.Config{RootCAs: roots, ServerName: "localhost"}, Subprotocols: []string{"contenox-relay.v1"}}
	ws, _, err := d.Dial("wss://"+ln.Addr().String()+"/v1/attach/inst-1", http.Header{"Authorization": {"Bearer ctok"}})
	if err != nil {
		t.Fatal(err)
	}
	defer ws.Close()
	if err := ws.WriteMessage(websocket.TextMessage, []byte(`{"type":"acp.message","id":"r1","session":"spoof","payload":{ "a" : 1 }}`)); err != nil {
		t.Fatal(err)
	}
	f, err := c.Next(5 * time.Second)
	if err != nil || f.Instance != "inst-1" || !strings.HasPrefix(f.Session, "att-") || string(f.Payload) != `{"a":1}` {
		t.Fatalf("instance got %s %v", f.Raw, err)
	}
	if err := c.Send([]byte(`{"type":"acp.message","instance":"inst-1","session":"` + f.Session + `","re":"r1","unknown":true}`)); err != nil {
		t.Fatal(err)
	}
	_ = ws.SetReadDeadline(time.Now().Add(5 * time.Second))
	_, msg, err := ws.ReadMessage()
	// The reference relay's re-encoding loses the field it does not know.
	if err != nil || string(msg) != `{"type":"acp.message","instance":"inst-1","session":"`+f.Session+`","re":"r1"}` {
		t.Fatalf("client got %s %v", msg, err)
	}
}
