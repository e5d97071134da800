package main

import (
	"bytes"
	"encoding/binary"
	"net/http"
	"testing"
	"time"

	"edgerelay/push/pushtest"
)

// TestMailboxPushThroughTheBinary configures the APNs module the way an
// operator does (key file, key id, team id, a base URL override, and the
// fake's CA through SSL_CERT_FILE) and checks the wake-up Apple receives.
func TestMailboxPushThroughTheBinary(t *testing.T) {
	p8, priv := pushtest.NewAPNsKey(t)
	fake := pushtest.NewAPNs(t, "TEAM123456", "KEY1234567", &priv.PublicKey)
	fake.RequireTopic("com.example.chat")
	s := startServer(t,
		"RELAY_MAILBOX_LISTEN=127.0.0.1:0", "RELAY_APPS=chat:push=com.example.chat",
		"RELAY_APNS_KEY_FILE="+pushtest.WriteFile(t, "AuthKey.p8", p8),
		"RELAY_APNS_KEY_ID=KEY1234567", "RELAY_APNS_TEAM_ID=TEAM123456",
		"RELAY_APNS_URL="+fake.URL(),
		"SSL_CERT_FILE="+pushtest.WriteFile(t, "ca.pem", fake.CertPEM()),
	)
	base := s.origin("mailbox") + "/v1/chat/mailbox/push-e2e-mailbox-0001"
	tok := "push-e2e-token-0123456789"
	if code := mailboxDo(t, "PUT", base, tok, nil); code != 201 {
		t.Fatalf("claim %d", code)
	}
	reg := []byte(`{"service":"apns","token":"` + string(bytes.Repeat([]byte("ab"), 32)) + `","environment":"production","tag":"e2eTag"}`)
	if code := mailboxDo(t, "PUT", base+"/p2c/push", tok, reg); code != 204 {
		t.Fatalf("register %d", code)
	}
	env := make([]byte, 30)
	env[0] = 1
	binary.BigEndian.PutUint64(env[1:9], 1)
	req, _ := http.NewRequest("PUT", base+"/p2c/1", bytes.NewReader(env))
	req.Header.Set("Authorization", "Bearer "+tok)
	req.Header.Set("X-Relay-Notify", "alert")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != 201 {
		t.Fatalf("put %d", resp.StatusCode)
	}
	got := fake.Wait(1, 20*time.Second)
	if len(got) != 1 || got[0].Problem != "" {
		t.Fatalf("pushes %d %+v", len(got), got)
	}
	want := `{"aps":{"alert":{"body":"New message"},"mutable-content":1,"sound":"default"},"zerobyte":{"tag":"e2eTag"}}`
	if string(got[0].Body) != want {
		t.Fatalf("payload %s", got[0].Body)
	}
}
