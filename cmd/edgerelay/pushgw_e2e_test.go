package main

import (
	"strings"
	"testing"
	"time"

	"edgerelay/push/pushtest"
)

// TestPushGatewayThroughTheBinary mints an API key with the command line
// against the stopped store, starts the relay with the APNs module and the
// gateway's APNs mount, sends through /send and finds the push at the fake.
// A second key is minted online, through the admin listener.
func TestPushGatewayThroughTheBinary(t *testing.T) {
	p8, priv := pushtest.NewAPNsKey(t)
	fake := pushtest.NewAPNs(t, "TEAM123456", "KEY1234567", &priv.PublicKey)
	fake.RequireTopic("org.example.app")
	dir := t.TempDir()
	env := []string{"RELAY_DATA_DIR=" + dir}
	key := lastLine(cliOK(t, env, "keys", "push", "create", "--label", "homeserver"))
	s := startServer(t, append(env,
		"RELAY_APNS_KEY_FILE="+pushtest.WriteFile(t, "AuthKey.p8", p8),
		"RELAY_APNS_KEY_ID=KEY1234567", "RELAY_APNS_TEAM_ID=TEAM123456", "RELAY_APNS_TOPIC=org.example.app",
		"RELAY_APNS_URL="+fake.URL(), "SSL_CERT_FILE="+pushtest.WriteFile(t, "ca.pem", fake.CertPEM()))...)
	send := func(k, body string) (int, string) { return gwPost(t, s, "push-apns", "/send", k, body) }
	device := strings.Repeat("ab", 32)
	if st, body := send(key, `{"token":"`+device+`","title":"Hi","body":"there"}`); st != 200 {
		t.Fatalf("send: %d %s", st, body)
	}
	got := fake.Wait(1, 20*time.Second)
	if len(got) != 1 || got[0].Problem != "" || got[0].DeviceToken != device {
		t.Fatalf("apns received %+v", got)
	}
	if st, body := send("wrong-key", `{"token":"`+device+`"}`); st != 401 {
		t.Fatalf("wrong key: %d %s", st, body)
	}
	adminEnv := append(env, "RELAY_ADMIN_LISTEN="+s.addrs["admin"])
	out, errOut, code := edgerelay(t, adminEnv, "keys", "push", "create", "--label", "second")
	if code != 0 || len(lastLine(out)) < 16 {
		t.Fatalf("online create: %d %s %s", code, out, errOut)
	}
	out, _, code = edgerelay(t, adminEnv, "keys", "push", "list")
	if code != 0 || !strings.Contains(out, "homeserver") || !strings.Contains(out, "second") || strings.Contains(out, key) {
		t.Fatalf("list: %d\n%s", code, out)
	}
}
