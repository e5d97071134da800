package main

import (
	"bufio"
	"bytes"
	"crypto/tls"
	"encoding/binary"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"
)

// TestCORSThroughTheBinary: with RELAY_CORS_ORIGINS set, a client sending
// Origin as a browser page does is let through the preflights of a claim
// and an envelope PUT, and reads both answers; another origin gets no CORS
// header; the agent listener answers the preflight of a redeem; and a
// malformed origin refuses to start.
func TestCORSThroughTheBinary(t *testing.T) {
	t.Parallel()
	const page = "https://app.example.com"
	site := startAgentSite(t, "RELAY_APPS=notes", "RELAY_CORS_ORIGINS=http://localhost:3000, "+page,
		"RELAY_CHANNEL_LISTEN=", "RELAY_PUSH_FCM_LISTEN=", "RELAY_PUSH_APNS_LISTEN=")
	s := site.s
	client := &http.Client{Timeout: 10 * time.Second}
	send := func(c *http.Client, method, url string, body []byte, hdr ...string) *http.Response {
		t.Helper()
		req, err := http.NewRequest(method, url, bytes.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		for i := 0; i+1 < len(hdr); i += 2 {
			req.Header.Set(hdr[i], hdr[i+1])
		}
		resp, err := c.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		return resp
	}
	allowOrigin := func(r *http.Response) string { return r.Header.Get("Access-Control-Allow-Origin") }

	const token = "0EYRkGol3d-VPLYMV3HgU6CKew_tXpQRFjkC_sk3fCE"
	box := s.origin("mailbox") + "/v1/notes/mailbox/AAECAwQFBgcICQoLDA0ODw"
	// Preflight of the claim, then the claim.
	resp := send(client, "OPTIONS", box, nil, "Origin", page, "Access-Control-Request-Method", "PUT",
		"Access-Control-Request-Headers", "authorization")
	if resp.StatusCode != 204 || allowOrigin(resp) != page || !strings.Contains(resp.Header.Get("Access-Control-Allow-Headers"), "Authorization") ||
		resp.Header.Get("Access-Control-Max-Age") == "" {
		t.Fatalf("claim preflight: %d %v", resp.StatusCode, resp.Header)
	}
	resp = send(client, "PUT", box, nil, "Origin", page, "Authorization", "Bearer "+token)
	if resp.StatusCode != 201 || allowOrigin(resp) != page || resp.Header.Get("Vary") != "Origin" ||
		!strings.Contains(resp.Header.Get("Access-Control-Expose-Headers"), "Retry-After") {
		t.Fatalf("claim: %d %v", resp.StatusCode, resp.Header)
	}
	// Preflight of an envelope PUT with X-Relay-Notify, then the PUT.
	resp = send(client, "OPTIONS", box+"/p2c/1", nil, "Origin", page, "Access-Control-Request-Method", "PUT",
		"Access-Control-Request-Headers", "authorization,content-type,x-relay-notify")
	if resp.StatusCode != 204 || allowOrigin(resp) != page {
		t.Fatalf("PUT preflight: %d %v", resp.StatusCode, resp.Header)
	}
	env := make([]byte, 25)
	env[0] = 0x01
	binary.BigEndian.PutUint64(env[1:9], 1)
	resp = send(client, "PUT", box+"/p2c/1", env, "Origin", page, "Authorization", "Bearer "+token,
		"Content-Type", "application/octet-stream", "X-Relay-Notify", "silent")
	if resp.StatusCode != 201 || allowOrigin(resp) != page {
		t.Fatalf("PUT: %d %v", resp.StatusCode, resp.Header)
	}
	resp = send(client, "HEAD", box+"/p2c", nil, "Origin", "http://localhost:3000", "Authorization", "Bearer "+token)
	if resp.StatusCode != 200 || allowOrigin(resp) != "http://localhost:3000" || resp.Header.Get("X-Relay-Count") != "1" ||
		!strings.Contains(resp.Header.Get("Access-Control-Expose-Headers"), "X-Relay-Count") {
		t.Fatalf("HEAD: %d %v", resp.StatusCode, resp.Header)
	}
	// Another origin: answered as ever, with no CORS header.
	resp = send(client, "OPTIONS", box+"/p2c/1", nil, "Origin", "https://evil.example.com", "Access-Control-Request-Method", "PUT",
		"Access-Control-Request-Headers", "authorization")
	if resp.StatusCode != 204 || allowOrigin(resp) != "" {
		t.Fatalf("unlisted preflight: %d %v", resp.StatusCode, resp.Header)
	}

	// The agent listener's redeem, over its TLS.
	resp = send(freshClient(site.tlsConfig()), "OPTIONS", site.origin+"/v1/pair/redeem", nil, "Origin", page,
		"Access-Control-Request-Method", "POST", "Access-Control-Request-Headers", "content-type")
	if resp.StatusCode != 204 || allowOrigin(resp) != page || resp.Header.Get("Access-Control-Allow-Methods") != "POST" {
		t.Fatalf("redeem preflight: %d %v", resp.StatusCode, resp.Header)
	}

	// A redeem the listener refuses before the handler (a body declared
	// over its 64 KiB, answered before the body is read) still tells the
	// page why. The body is not sent: the answer comes at once, and a
	// client still writing would meet the closed connection's reset.
	conn, err := tls.Dial("tcp", strings.TrimPrefix(site.origin, "https://"), site.tlsConfig())
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	_ = conn.SetDeadline(time.Now().Add(10 * time.Second))
	fmt.Fprintf(conn, "POST /v1/pair/redeem HTTP/1.1\r\nHost: relay\r\nOrigin: %s\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n", page, 64<<10+1)
	resp, err = http.ReadResponse(bufio.NewReader(conn), nil)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != 413 || allowOrigin(resp) != page {
		t.Fatalf("redeem over the limit: %d %v", resp.StatusCode, resp.Header)
	}

	// A malformed origin refuses to start, saying why.
	_, errOut, code := edgerelay(t, []string{"RELAY_DATA_DIR=" + t.TempDir(), "RELAY_CORS_ORIGINS=" + page + "/"}, "serve")
	if code == 0 || !strings.Contains(errOut, "RELAY_CORS_ORIGINS") || !strings.Contains(errOut, "has a path") {
		t.Fatalf("origin with a path: exit %d: %s", code, errOut)
	}
}
