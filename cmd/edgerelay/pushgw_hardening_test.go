package main

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"edgerelay/push/pushtest"
)

// gatewayWithProviders starts the relay with both gateway mounts
// delivering, APNs and FCM to local fakes, registration open, and an API
// key minted offline; it returns the process, the fakes and the key.
func gatewayWithProviders(t *testing.T) (*relayProc, *pushtest.FakeAPNs, *pushtest.FakeGoogle, string) {
	t.Helper()
	p8, priv := pushtest.NewAPNsKey(t)
	apnsFake := pushtest.NewAPNs(t, "TEAM123456", "KEY1234567", &priv.PublicKey)
	apnsFake.RequireTopic("org.example.app")
	google, creds, _ := pushtest.NewGoogleWithAccount(t)
	dir := t.TempDir()
	env := []string{"RELAY_DATA_DIR=" + dir}
	key := lastLine(cliOK(t, env, "keys", "push", "create", "--label", "homeserver"))
	cas := append(append([]byte{}, apnsFake.CertPEM()...), google.CertPEM()...)
	s := startServer(t, append(env,
		"RELAY_PUSH_REGISTRATION=true",
		"RELAY_APNS_KEY_FILE="+pushtest.WriteFile(t, "AuthKey.p8", p8),
		"RELAY_APNS_KEY_ID=KEY1234567", "RELAY_APNS_TEAM_ID=TEAM123456", "RELAY_APNS_TOPIC=org.example.app",
		"RELAY_APNS_URL="+apnsFake.URL(),
		"RELAY_FCM_CREDENTIALS="+pushtest.WriteFile(t, "service-account.json", creds), "RELAY_FCM_URL="+google.URL(),
		"SSL_CERT_FILE="+pushtest.WriteFile(t, "ca.pem", cas))...)
	return s, apnsFake, google, key
}

// gwPost posts body to a gateway mount with key ("" sends none).
func gwPost(t *testing.T, s *relayProc, mount, path, key, body string) (int, string) {
	t.Helper()
	req, _ := http.NewRequest("POST", s.origin(mount)+path, strings.NewReader(body))
	if key != "" {
		req.Header.Set("Authorization", "Bearer "+key)
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

// errorOf is the "error" member of an error body.
func errorOf(body string) string {
	var e struct {
		Error string `json:"error"`
	}
	_ = json.Unmarshal([]byte(body), &e)
	return e.Error
}

// rawHead sends the head of one request and no byte of its body, and
// returns the first answer within 2 s: far below the listener's 10 s
// header timeout, so an answer that waits for the body fails.
func rawHead(t *testing.T, addr, head string) (status int, errMsg string, closes bool, conn net.Conn) {
	t.Helper()
	conn, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	if _, err := io.WriteString(conn, head); err != nil {
		t.Fatal(err)
	}
	_ = conn.SetReadDeadline(time.Now().Add(2 * time.Second))
	start := time.Now()
	resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
	if err != nil {
		t.Fatalf("no answer within 2 s (%v) to headers without their body:\n%s%v", time.Since(start).Round(time.Millisecond), head, err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, errorOf(string(b)), resp.Close, conn
}

func reqHead(path string, length int, lines ...string) string {
	h := "POST " + path + " HTTP/1.1\r\nHost: gw\r\nContent-Type: application/json\r\n"
	for _, l := range lines {
		h += l + "\r\n"
	}
	return h + fmt.Sprintf("Content-Length: %d\r\n\r\n", length)
}

// Refusals the headers decide (no key, a wrong key, a Content-Length over
// the limit, on /send and /register) are answered before any body byte
// arrives, and an Expect: 100-continue gets the refusal, not 100 Continue.
// At the limit the body is wanted: 100 Continue.
func TestPushGatewayRefusesFromHeadersThroughTheBinary(t *testing.T) {
	s, _, _, key := gatewayWithProviders(t)
	bearer := "Authorization: Bearer " + key
	for _, mount := range []string{"push-apns", "push-fcm"} {
		addr := s.addrs[mount]
		for _, tc := range []struct {
			name   string
			head   string
			status int
			msg    string
		}{
			{"send 16385 bytes", reqHead("/send", 16385, bearer), 413, "request body too large"},
			{"send a megabyte", reqHead("/send", 1<<20, bearer), 413, "request body too large"},
			{"send without key", reqHead("/send", 200), 401, "missing api key"},
			{"send without key, oversized", reqHead("/send", 1<<20), 401, "missing api key"},
			{"send with a wrong key", reqHead("/send", 200, "Authorization: Bearer "+strings.Repeat("f", 64)), 401, "invalid api key"},
			{"register 4097 bytes", reqHead("/register", 4097), 413, "request body too large"},
			{"unknown route", reqHead("/admin/keys", 200, bearer), 404, "not found"},
		} {
			for _, expect := range []string{"", "Expect: 100-continue\r\n"} {
				head := strings.Replace(tc.head, "\r\n\r\n", "\r\n"+expect+"\r\n", 1)
				status, msg, closes, _ := rawHead(t, addr, head)
				what := fmt.Sprintf("%s %s (expect %v)", mount, tc.name, expect != "")
				if status != tc.status || msg != tc.msg || !closes {
					t.Errorf("%s: %d %q close=%v, want %d %q and Connection: close", what, status, msg, closes, tc.status, tc.msg)
				}
			}
		}
		for _, tc := range []struct{ path, auth string }{{"/send", bearer}, {"/register", "X-Edge: 1"}} {
			limit := map[string]int{"/send": 16384, "/register": 4096}[tc.path]
			status, _, _, _ := rawHead(t, addr, reqHead(tc.path, limit, tc.auth, "Expect: 100-continue"))
			if status != 100 {
				t.Errorf("%s %s at the limit with Expect: %d, want 100 Continue", mount, tc.path, status)
			}
		}
	}
}

// Every present field of the wrong type is refused as the reference
// refuses it: null is not a string (only data reads null as {}).
func TestPushGatewayNullFieldsThroughTheBinary(t *testing.T) {
	s, apnsFake, _, key := gatewayWithProviders(t)
	device := strings.Repeat("ab", 32)
	for _, tc := range []struct {
		body   string
		status int
		msg    string
	}{
		{`{"token":null}`, 400, "invalid token"},
		{`{"token":null,"title":"t"}`, 400, "invalid token"},
		{`{"token":"` + device + `","title":null}`, 400, "invalid title"},
		{`{"token":"` + device + `","body":null}`, 400, "invalid body"},
		{`{"token":"` + device + `","data":{"k":null}}`, 400, "invalid data value"},
		{`{}`, 400, "missing token"},
		{`{"token":"` + device + `","data":null}`, 200, ""},
	} {
		status, body := gwPost(t, s, "push-apns", "/send", key, tc.body)
		if status != tc.status || errorOf(body) != tc.msg {
			t.Errorf("%s: %d %s, want %d %q", tc.body, status, body, tc.status, tc.msg)
		}
	}
	if got := apnsFake.Wait(1, 10*time.Second); len(got) != 1 {
		t.Fatalf("APNs received %d pushes, want the one valid send", len(got))
	}
}

// With the shared key store (the default), the real KyPost server
// registers on the FCM mount, then on the APNs mount, from one address:
// both keys keep working, as with the reference's two deployments. A new
// registration on one mount supersedes only that mount's key.
func TestPushGatewayRegistersOnBothMountsThroughTheBinary(t *testing.T) {
	s, _, _, _ := gatewayWithProviders(t)
	register := func(mount string) string {
		t.Helper()
		status, body := gwPost(t, s, mount, "/register", "", `{"label":"kypost"}`)
		var r struct{ Key string }
		if err := json.Unmarshal([]byte(body), &r); status != 201 || err != nil || len(r.Key) != 64 {
			t.Fatalf("register on %s: %d %s", mount, status, body)
		}
		return r.Key
	}
	works := func(mount, key string) bool {
		t.Helper()
		// A body the validation refuses: 400 when the key is accepted.
		status, body := gwPost(t, s, mount, "/send", key, `{}`)
		if status != 400 && status != 401 {
			t.Fatalf("%s: %d %s", mount, status, body)
		}
		return status == 400
	}
	fcmKey := register("push-fcm")
	apnsKey := register("push-apns")
	if !works("push-fcm", fcmKey) {
		t.Fatal("the APNs registration revoked the FCM mount's key: Android push would stay dead")
	}
	if !works("push-apns", apnsKey) {
		t.Fatal("APNs key refused")
	}
	fcmKey2 := register("push-fcm")
	if works("push-fcm", fcmKey) || !works("push-fcm", fcmKey2) || !works("push-apns", apnsKey) {
		t.Fatal("a second FCM registration must supersede the first FCM key and only it")
	}
}

// A push whose translated payload would exceed the provider's limit is
// clipped to fit and delivered, not refused (Apple answers 413 past 4,096
// bytes): KyPost repeats the subject in several data values.
func TestPushGatewayClipsToProviderLimitsThroughTheBinary(t *testing.T) {
	s, apnsFake, google, key := gatewayWithProviders(t)
	subject := strings.Repeat("Re: quarterly figures and the plan for next year ", 15)[:700]
	data := map[string]string{
		"messageId": "msg-123", "type": "new_mail", "senderName": "Alice Example",
		"emailSubject": subject, "subject": subject, "Keywords": subject, "preview": subject, "snippet": subject,
	}
	body, _ := json.Marshal(map[string]any{"token": strings.Repeat("ab", 32), "title": "Alice Example", "body": subject, "data": data})
	if status, answer := gwPost(t, s, "push-apns", "/send", key, string(body)); status != 200 {
		t.Fatalf("APNs send: %d %s", status, answer)
	}
	got := apnsFake.Wait(1, 10*time.Second)
	if len(got) != 1 || got[0].Problem != "" || len(got[0].Body) > 4096 {
		t.Fatalf("APNs received %+v", got)
	}
	var payload map[string]any
	if err := json.Unmarshal(got[0].Body, &payload); err != nil || payload["messageId"] != "msg-123" || payload["aps"] == nil {
		t.Fatalf("payload %s: %v", got[0].Body, err)
	}

	data["more"], data["evenMore"] = subject, subject
	body, _ = json.Marshal(map[string]any{"token": "fcm-device-token", "data": data})
	if status, answer := gwPost(t, s, "push-fcm", "/send", key, string(body)); status != 200 {
		t.Fatalf("FCM send: %d %s", status, answer)
	}
	if sends := google.WaitSends(1, 10*time.Second); len(sends) != 1 || sends[0].Problem != "" {
		t.Fatalf("FCM received %+v", sends)
	}
	deadline := time.Now().Add(5 * time.Second)
	for strings.Count(s.stderr.String(), `"event":"send.clipped"`) < 2 {
		if time.Now().After(deadline) {
			t.Fatalf("no send.clipped lines for both mounts:\n%s", s.stderr.String())
		}
		time.Sleep(20 * time.Millisecond)
	}
}
