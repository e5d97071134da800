package mailbox_test

import (
	"bytes"
	"encoding/json"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/fasthttp/websocket"

	"edgerelay/push/apns"
	"edgerelay/push/fcm"
	"edgerelay/push/pushtest"
)

const (
	apnsToken = "a1b2c3d4e5f60718293a4b5c6d7e8f90a1b2c3d4e5f60718293a4b5c6d7e8f90"
	fcmToken  = "fcm-registration-token:APA91bHx_0123456789-abcdefghij"
	pushTag   = "Zq3k8r2mT1u0wQ"
)

// providers starts the fake APNs and Google and clients that trust them.
func providers(t *testing.T) (*pushtest.FakeAPNs, *pushtest.FakeGoogle, mailboxPushers) {
	t.Helper()
	p8, priv := pushtest.NewAPNsKey(t)
	fake := pushtest.NewAPNs(t, "TEAM123456", "KEY1234567", &priv.PublicKey)
	keyFile := pushtest.WriteFile(t, "AuthKey.p8", p8)
	ac, err := apns.New(apns.Config{KeyFile: keyFile, KeyID: "KEY1234567", TeamID: "TEAM123456", BaseURL: fake.URL(), RootCAs: fake.RootCAs()})
	if err != nil {
		t.Fatal(err)
	}
	g, creds, _ := pushtest.NewGoogleWithAccount(t)
	fc, err := fcm.New(fcm.Config{CredentialsFile: pushtest.WriteFile(t, "sa.json", creds), BaseURL: g.URL(), RootCAs: g.RootCAs()})
	if err != nil {
		t.Fatal(err)
	}
	return fake, g, mailboxPushers{APNs: ac, FCM: fc}
}

func registrationBody(fields map[string]any) []byte {
	b, _ := json.Marshal(fields)
	return b
}

func apnsRegistration(alert string) []byte {
	f := map[string]any{"service": "apns", "token": apnsToken, "environment": "production", "tag": pushTag}
	if alert != "" {
		f["alert"] = alert
	}
	return registrationBody(f)
}

func TestPushRegistrationRules(t *testing.T) {
	r := start(t, opts{apps: "notes;chat:push=com.example.chat"})
	r.claim("chat")
	r.claim("notes")
	path := mb("chat") + "/p2c/push"
	expect(t, r.do("PUT", mb("notes")+"/p2c/push", token, apnsRegistration("")), 404, "not_found")
	expect(t, r.do("PUT", path, token, apnsRegistration("")), 204, "")
	expect(t, r.do("PUT", path, token, apnsRegistration(strings.Repeat("é", 160))), 204, "")
	good := map[string]any{"service": "apns", "token": apnsToken, "environment": "development", "tag": pushTag}
	with := func(k string, v any) []byte {
		m := map[string]any{}
		for kk, vv := range good {
			m[kk] = vv
		}
		if v == nil {
			delete(m, k)
		} else {
			m[k] = v
		}
		return registrationBody(m)
	}
	bad := map[string][]byte{
		"not json":          []byte("{"),
		"array":             []byte("[]"),
		"service missing":   with("service", nil),
		"service upper":     with("service", "APNS"),
		"service digit":     with("service", "1push"),
		"service 17":        with("service", strings.Repeat("a", 17)),
		"tag missing":       with("tag", nil),
		"tag 65":            with("tag", strings.Repeat("t", 65)),
		"tag charset":       with("tag", "a.b"),
		"alert 161":         with("alert", strings.Repeat("x", 161)),
		"alert number":      with("alert", 5),
		"token missing":     with("token", nil),
		"token upper":       with("token", strings.ToUpper(apnsToken)),
		"token odd":         with("token", apnsToken[:63]),
		"token 31 bytes":    with("token", apnsToken[:62]),
		"token 101 bytes":   with("token", strings.Repeat("ab", 101)),
		"environment bogus": with("environment", "staging"),
		"unknown field":     with("badge", "1"),
		"fcm environment":   registrationBody(map[string]any{"service": "fcm", "token": fcmToken, "tag": pushTag, "environment": "production"}),
		"fcm token short":   registrationBody(map[string]any{"service": "fcm", "token": strings.Repeat("a", 31), "tag": pushTag}),
		"fcm token charset": registrationBody(map[string]any{"service": "fcm", "token": strings.Repeat("a", 31) + "/", "tag": pushTag}),
		"generic 9 fields":  registrationBody(map[string]any{"service": "unifiedpush", "tag": pushTag, "a": "1", "b": "2", "c": "3", "d": "4", "e": "5", "f": "6", "g": "7", "h": "8", "i": "9"}),
		"generic long":      registrationBody(map[string]any{"service": "unifiedpush", "tag": pushTag, "endpoint": strings.Repeat("u", 257)}),
		"generic number":    registrationBody(map[string]any{"service": "unifiedpush", "tag": pushTag, "n": 1}),
	}
	for name, body := range bad {
		t.Run(name, func(t *testing.T) {
			r.clock.advance(time.Minute) // the registration bucket
			expect(t, r.do("PUT", path, token, body), 400, "bad_request")
		})
	}
	r.clock.advance(time.Hour)
	expect(t, r.do("PUT", path, token, with("token", strings.Repeat("ab", 100))), 204, "") // 100 bytes
	expect(t, r.do("PUT", path, token, registrationBody(map[string]any{"service": "fcm", "token": fcmToken, "tag": pushTag})), 204, "")
	expect(t, r.do("PUT", path, token, registrationBody(map[string]any{"service": "unifiedpush", "tag": pushTag, "a": "1", "b": "2", "c": "3", "d": "4", "e": "5", "f": "6", "g": "7", "endpoint": strings.Repeat("u", 256)})), 204, "")
	expect(t, r.do("PUT", path, other, apnsRegistration("")), 403, "forbidden")
	expect(t, r.do("DELETE", path, token, nil), 204, "")
}

func TestPushRegistrationBucket(t *testing.T) {
	r := start(t, opts{apps: "chat:push=com.example.chat"})
	r.claim("chat")
	for range 10 {
		expect(t, r.do("PUT", mb("chat")+"/c2p/push", token, apnsRegistration("")), 204, "")
	}
	a := r.do("PUT", mb("chat")+"/c2p/push", token, apnsRegistration(""))
	expect(t, a, 429, "rate_limited")
	if a.header.Get("Retry-After") != "60" {
		t.Fatalf("Retry-After %q", a.header.Get("Retry-After"))
	}
}

// TestRegistrationSealedAtRest reads the raw Pebble files after a
// registration: neither the device token nor the tag is there in any form.
func TestRegistrationSealedAtRest(t *testing.T) {
	dir := t.TempDir()
	r := start(t, opts{apps: "chat:push=com.example.chat", dataDir: dir})
	r.claim("chat")
	expect(t, r.do("PUT", mb("chat")+"/p2c/push", token, apnsRegistration("Secret alert text")), 204, "")
	if err := r.db.Flush(); err != nil {
		t.Fatal(err)
	}
	needles := [][]byte{[]byte(apnsToken), []byte(pushTag), []byte("Secret alert text"), []byte(token)}
	err := filepath.WalkDir(dir, func(path string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		raw, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		for _, n := range needles {
			if bytes.Contains(raw, n) {
				t.Errorf("%s holds %q", path, n)
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}

func TestAPNsPushes(t *testing.T) {
	fake, _, pushers := providers(t)
	fake.RequireTopic("com.example.chat")
	r := start(t, opts{apps: "chat:push=com.example.chat", push: pushers.Pushers()})
	r.claim("chat")
	// The companion reads p2c: it registers there.
	expect(t, r.do("PUT", mb("chat")+"/p2c/push", token, apnsRegistration("")), 204, "")
	expect(t, r.put("chat", "p2c", 1, envelope(1, 5, 1), "X-Relay-Notify", "alert"), 201, "")
	got := fake.Wait(1, 10*time.Second)
	if len(got) != 1 {
		t.Fatalf("pushes %d", len(got))
	}
	req := got[0]
	if req.Problem != "" || req.DeviceToken != apnsToken {
		t.Fatalf("fake refused: %s (%s)", req.Problem, req.DeviceToken)
	}
	wantBody := `{"aps":{"alert":{"body":"New message"},"mutable-content":1,"sound":"default"},"zerobyte":{"tag":"Zq3k8r2mT1u0wQ"}}`
	if string(req.Body) != wantBody || req.Header.Get("apns-push-type") != "alert" || req.Header.Get("apns-priority") != "10" || req.Header.Get("apns-topic") != "com.example.chat" {
		t.Fatalf("alert push: %s %v", req.Body, req.Header)
	}
	// An identical retry pushes nothing; a silent push is background/5.
	expect(t, r.put("chat", "p2c", 1, envelope(1, 5, 1), "X-Relay-Notify", "alert"), 200, "")
	expect(t, r.put("chat", "p2c", 2, envelope(2, 5, 1), "X-Relay-Notify", "silent"), 201, "")
	got = fake.Wait(2, 10*time.Second)
	if len(got) != 2 {
		t.Fatalf("pushes %d", len(got))
	}
	if string(got[1].Body) != `{"aps":{"content-available":1},"zerobyte":{"tag":"Zq3k8r2mT1u0wQ"}}` || got[1].Header.Get("apns-push-type") != "background" || got[1].Header.Get("apns-priority") != "5" {
		t.Fatalf("silent push: %s %v", got[1].Body, got[1].Header)
	}
	// No header: no push. The custom alert text is used.
	expect(t, r.put("chat", "p2c", 3, envelope(3, 5, 1)), 201, "")
	r.clock.advance(time.Hour)
	expect(t, r.do("PUT", mb("chat")+"/p2c/push", token, apnsRegistration(`Tap "here" & see <it>`)), 204, "")
	expect(t, r.put("chat", "p2c", 4, envelope(4, 5, 1), "X-Relay-Notify", "alert"), 201, "")
	got = fake.Wait(3, 10*time.Second)
	if len(got) != 3 || !bytes.Contains(got[2].Body, []byte(`"body":"Tap \"here\" & see <it>"`)) {
		t.Fatalf("custom alert: %d %s", len(got), got[len(got)-1].Body)
	}
	// The other direction has no registration: nothing is sent.
	expect(t, r.put("chat", "c2p", 1, envelope(1, 5, 1), "X-Relay-Notify", "alert"), 201, "")
	expect(t, r.put("chat", "p2c", 5, envelope(5, 5, 1), "X-Relay-Notify", "silent"), 201, "")
	if got = fake.Wait(4, 10*time.Second); len(got) != 4 || got[3].Header.Get("apns-push-type") != "background" {
		t.Fatalf("pushes %d", len(got))
	}
}

func TestAPNsStaleRegistrationRemoved(t *testing.T) {
	for _, tc := range []struct {
		status int
		reason string
	}{{410, "Unregistered"}, {400, "BadDeviceToken"}} {
		t.Run(tc.reason, func(t *testing.T) {
			fake, _, pushers := providers(t)
			fake.Answer(apnsToken, tc.status, tc.reason)
			r := start(t, opts{apps: "chat:push=com.example.chat", push: pushers.Pushers()})
			r.claim("chat")
			expect(t, r.do("PUT", mb("chat")+"/p2c/push", token, apnsRegistration("")), 204, "")
			expect(t, r.put("chat", "p2c", 1, envelope(1, 5, 1), "X-Relay-Notify", "alert"), 201, "")
			fake.Wait(1, 10*time.Second)
			waitNoRegistration(t, r, "p2c")
		})
	}
}

func waitNoRegistration(t *testing.T, r *relay, dir string) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for r.h.HasRegistration(mbName("chat"), dir, []byte(token)) {
		if time.Now().After(deadline) {
			t.Fatal("stale registration kept")
		}
		time.Sleep(5 * time.Millisecond)
	}
}

func mbName(app string) string { return app + "/" + id }

func TestFCMPushesAndStale(t *testing.T) {
	_, g, pushers := providers(t)
	r := start(t, opts{apps: "chat:push=com.example.chat", push: pushers.Pushers()})
	r.claim("chat")
	reg := registrationBody(map[string]any{"service": "fcm", "token": fcmToken, "tag": pushTag, "alert": "Neue Nachricht"})
	expect(t, r.do("PUT", mb("chat")+"/c2p/push", token, reg), 204, "")
	expect(t, r.put("chat", "c2p", 1, envelope(1, 5, 1), "X-Relay-Notify", "alert"), 201, "")
	expect(t, r.put("chat", "c2p", 2, envelope(2, 5, 1), "X-Relay-Notify", "silent"), 201, "")
	sends := g.WaitSends(2, 10*time.Second)
	if len(sends) != 2 {
		t.Fatalf("sends %d", len(sends))
	}
	bodies := map[string]bool{string(sends[0].Body): true, string(sends[1].Body): true}
	alert := `{"message":{"token":"` + fcmToken + `","data":{"zerobyte_tag":"Zq3k8r2mT1u0wQ","zerobyte_notify":"alert","zerobyte_alert":"Neue Nachricht"},"android":{"priority":"high","ttl":"604800s"}}}`
	silent := `{"message":{"token":"` + fcmToken + `","data":{"zerobyte_tag":"Zq3k8r2mT1u0wQ","zerobyte_notify":"silent"},"android":{"priority":"normal","ttl":"3600s"}}}`
	if !bodies[alert] || !bodies[silent] {
		t.Fatalf("fcm bodies:\n%s\n%s", sends[0].Body, sends[1].Body)
	}
	g.Answer(fcmToken, pushtest.FCMUnregistered())
	expect(t, r.put("chat", "c2p", 3, envelope(3, 5, 1), "X-Relay-Notify", "alert"), 201, "")
	g.WaitSends(3, 10*time.Second)
	deadline := time.Now().Add(10 * time.Second)
	for r.h.HasRegistration(mbName("chat"), "c2p", []byte(token)) {
		if time.Now().After(deadline) {
			t.Fatal("UNREGISTERED registration kept")
		}
		time.Sleep(5 * time.Millisecond)
	}
}

func TestNoPushWhileReaderInForeground(t *testing.T) {
	fake, _, pushers := providers(t)
	r := start(t, opts{apps: "chat:push=com.example.chat", push: pushers.Pushers()})
	r.claim("chat")
	expect(t, r.do("PUT", mb("chat")+"/p2c/push", token, apnsRegistration("")), 204, "")
	w := r.watch("chat", "p2c", "")
	if err := w.WriteMessage(websocket.TextMessage, []byte("ping")); err != nil {
		t.Fatal(err)
	}
	if op, b := readFrame(t, w); op != websocket.TextMessage || string(b) != "pong" {
		t.Fatalf("pong %q", b)
	}
	expect(t, r.put("chat", "p2c", 1, envelope(1, 5, 1), "X-Relay-Notify", "alert"), 201, "")
	r.clock.advance(44 * time.Second)
	expect(t, r.put("chat", "p2c", 2, envelope(2, 5, 1), "X-Relay-Notify", "alert"), 201, "")
	r.clock.advance(2 * time.Second) // 46 s after the ping
	expect(t, r.put("chat", "p2c", 3, envelope(3, 5, 1), "X-Relay-Notify", "silent"), 201, "")
	got := fake.Wait(1, 10*time.Second)
	if len(got) != 1 || got[0].Header.Get("apns-push-type") != "background" {
		t.Fatalf("pushes %d", len(got))
	}
	if n := len(fake.Requests()); n != 1 {
		t.Fatalf("pushed while in the foreground: %d", n)
	}
}

func TestPushBucketSkipsButWritesSucceed(t *testing.T) {
	fake, _, pushers := providers(t)
	r := start(t, opts{apps: "chat:push=com.example.chat", push: pushers.Pushers()})
	r.claim("chat")
	expect(t, r.do("PUT", mb("chat")+"/p2c/push", token, apnsRegistration("")), 204, "")
	for seq := uint64(1); seq <= 25; seq++ {
		expect(t, r.put("chat", "p2c", seq, envelope(seq, 5, 1), "X-Relay-Notify", "silent"), 201, "")
	}
	r.clock.advance(2 * time.Second) // one more token
	expect(t, r.put("chat", "p2c", 26, envelope(26, 5, 1), "X-Relay-Notify", "silent"), 201, "")
	if got := fake.Wait(21, 10*time.Second); len(got) != 21 {
		t.Fatalf("pushes %d, want 20 + 1", len(got))
	}
	if n := len(fake.Requests()); n != 21 {
		t.Fatalf("pushes %d", n)
	}
}

func TestPushWithoutModuleAcceptedAndIgnored(t *testing.T) {
	r := start(t, opts{apps: "chat:push=com.example.chat"})
	r.claim("chat")
	expect(t, r.do("PUT", mb("chat")+"/p2c/push", token, apnsRegistration("")), 204, "")
	expect(t, r.put("chat", "p2c", 1, envelope(1, 5, 1), "X-Relay-Notify", "alert"), 201, "")
}
