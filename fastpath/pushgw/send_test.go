package pushgw_test

import (
	"bufio"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"edgerelay/fastpath/pushgw"
	"edgerelay/push/pushtest"
)

func TestRoutesAndRequestIDs(t *testing.T) {
	f := newAPNsFake(t)
	g := startGateway(t, gwOpts{apns: f.client})
	health := `{"ok":true,"configured":true,"rateLimits":{"perMinute":10},"registrationEnabled":false}`
	seen := map[string]bool{}
	for _, tc := range []struct {
		method, path string
		status       int
		body         string
	}{
		{"GET", "/health", 200, health},
		{"GET", "/health/", 200, health},
		{"GET", "/health?x=1&y", 200, health},
		{"GET", "//health", 200, health}, // fasthttp normalizes the path
		{"HEAD", "/health", 404, ""},
		{"POST", "/health", 404, errBody("not found")},
		{"OPTIONS", "/send", 404, errBody("not found")},
		{"GET", "/send", 404, errBody("not found")},
		{"PUT", "/register", 404, errBody("not found")},
		{"GET", "/register", 404, errBody("not found")},
		{"GET", "/", 404, errBody("not found")},
		{"GET", "/admin/keys", 404, errBody("not found")},
		{"POST", "/send//", 401, errBody("missing api key")}, // normalized to /send/
		{"GET", "/Health", 404, errBody("not found")},
		{"POST", "/register", 403, errBody("self-registration is disabled")},
		{"POST", "/register/", 403, errBody("self-registration is disabled")},
		{"POST", "/send", 401, errBody("missing api key")},
		{"POST", "/send/?a=b", 401, errBody("missing api key")},
	} {
		a := g.do(tc.method, tc.path, map[string]string{"X-Request-Id": "caller-chosen"}, nil)
		what := tc.method + " " + tc.path
		if tc.method == "HEAD" {
			if a.status != 404 || !uuidV4.MatchString(a.rid()) {
				t.Errorf("%s: %d rid %q", what, a.status, a.rid())
			}
		} else {
			expect(t, what, a, tc.status, tc.body)
		}
		if seen[a.rid()] {
			t.Errorf("%s: request id %s reused", what, a.rid())
		}
		seen[a.rid()] = true
		if a.header.Get("Access-Control-Allow-Origin") != "" {
			t.Errorf("%s: CORS header", what)
		}
	}
}

func TestHealthConfigured(t *testing.T) {
	f := newAPNsFake(t)
	for _, tc := range []struct {
		env        string
		client     bool
		configured bool
	}{
		{"", true, true},
		{"production", true, true},
		{" Sandbox ", true, true},
		{"PRODUCTION", true, true},
		{"development", true, false}, // not the reference's word: never a guess
		{"prod", true, false},
		{"", false, false},
	} {
		o := gwOpts{apnsEnv: tc.env, registration: true, rate: 7}
		if tc.client {
			o.apns = f.client
		}
		g := startGateway(t, o)
		a := g.do("GET", "/health", nil, nil)
		want := fmt.Sprintf(`{"ok":true,"configured":%t,"rateLimits":{"perMinute":7},"registrationEnabled":true}`, tc.configured)
		expect(t, "health env "+tc.env, a, 200, want)
	}
	fc := newFCMFake(t)
	g := startGateway(t, gwOpts{provider: pushgw.ProviderFCM, fcm: fc.client})
	expect(t, "fcm health", g.do("GET", "/health", nil, nil), 200,
		`{"ok":true,"configured":true,"rateLimits":{"perMinute":10},"registrationEnabled":false}`)
	g = startGateway(t, gwOpts{provider: pushgw.ProviderFCM})
	expect(t, "fcm health unconfigured", g.do("GET", "/health", nil, nil), 200,
		`{"ok":true,"configured":false,"rateLimits":{"perMinute":10},"registrationEnabled":false}`)
}

func TestNewRefusesBadConfig(t *testing.T) {
	g := startGateway(t, gwOpts{})
	for _, cfg := range []pushgw.Config{
		{Provider: "gcm", Store: g.store, RatePerMinute: 10},
		{Provider: "apns", RatePerMinute: 10},
		{Provider: "apns", Store: g.store, RatePerMinute: 0},
		{Provider: "apns", Store: g.store, RatePerMinute: 10, Metered: true, DailyBudget: -1},
	} {
		if _, err := pushgw.New(cfg); err == nil {
			t.Errorf("New(%+v) accepted", cfg)
		}
	}
}

func TestAuthErrors(t *testing.T) {
	f := newAPNsFake(t)
	g := startGateway(t, gwOpts{apns: f.client})
	_, key := g.newKey("server")
	body := `{"token":"abc"}`
	for _, tc := range []struct {
		name, auth string
		status     int
		want       string
	}{
		{"no header", "", 401, errBody("missing api key")},
		{"basic", "Basic " + key, 401, errBody("missing api key")},
		{"empty bearer", "Bearer ", 401, errBody("missing api key")},
		{"bearer spaces", "Bearer    ", 401, errBody("missing api key")},
		{"unknown", "Bearer 0000000000000000000000000000000000000000000000000000000000000000", 401, errBody("invalid api key")},
		{"lowercase scheme", "bearer " + key, 200, `{"ok":true}`},
		{"upper scheme", "BEARER " + key, 200, `{"ok":true}`},
	} {
		h := map[string]string{}
		if tc.auth != "" {
			h["Authorization"] = tc.auth
		}
		expect(t, tc.name, g.do("POST", "/send", h, strings.NewReader(body)), tc.status, tc.want)
	}

	// Disabled, then expired.
	id, key2 := g.newKey("other")
	if err := g.keys.Disable(id); err != nil {
		t.Fatal(err)
	}
	expect(t, "disabled", g.send(key2, body), 401, errBody("invalid api key"))
	exp := g.clock.Now().Add(time.Hour)
	nk, err := g.keys.Create("expiring", exp)
	if err != nil {
		t.Fatal(err)
	}
	expect(t, "not yet expired", g.send(nk.Key, `{"token":"def"}`), 200, `{"ok":true}`)
	g.clock.Advance(time.Hour)
	expect(t, "expired", g.send(nk.Key, body), 401,
		`{"error":"api key expired","requestId":"{rid}","expiresAt":"2026-03-01T13:00:00.000Z"}`)
	// Auth comes before the body: an expired key with a bad body is 401.
	expect(t, "expired bad body", g.send(nk.Key, `nonsense`), 401,
		`{"error":"api key expired","requestId":"{rid}","expiresAt":"2026-03-01T13:00:00.000Z"}`)
	expect(t, "no key bad body", g.send("", `nonsense`), 401, errBody("missing api key"))
}

func TestFieldChecksInOrder(t *testing.T) {
	f := newAPNsFake(t)
	g := startGateway(t, gwOpts{apns: f.client, rate: 1000})
	_, key := g.newKey("server")
	long := func(n int) string { return strings.Repeat("x", n) }
	data17 := map[string]string{}
	for i := range 17 {
		data17[fmt.Sprint("k", i)] = "v"
	}
	d17, _ := json.Marshal(data17)
	data16 := map[string]string{}
	for i := range 16 {
		data16[fmt.Sprint("k", i)] = "v"
	}
	d16, _ := json.Marshal(data16)
	for _, tc := range []struct {
		body string
		want string // "" means accepted
	}{
		// Not a JSON object.
		{``, "invalid json body"},
		{`null`, "invalid json body"},
		{`[]`, "invalid json body"},
		{`[{"token":"a"}]`, "invalid json body"},
		{`1`, "invalid json body"},
		{`"token"`, "invalid json body"},
		{`true`, "invalid json body"},
		{`{`, "invalid json body"},
		{`{"token":"a",}`, "invalid json body"},
		{`{"token":"a"} x`, "invalid json body"},
		{`{"token":"a"}{}`, "invalid json body"},
		{`{'token':'a'}`, "invalid json body"},
		{`{"token":"a\x01"}`, "invalid json body"},
		{`{"token":"a","n":01}`, "invalid json body"},
		{`{"token":"a","n":1.}`, "invalid json body"},
		{`{"token":"a","n":NaN}`, "invalid json body"},
		{`{"token":"a","x":"\u12"}`, "invalid json body"},
		{`{"token":"a","x":"\q"}`, "invalid json body"},
		// A syntax error anywhere beats any field error.
		{`{"token":5,"x":[1,2,}`, "invalid json body"},
		// token
		{`{}`, "missing token"},
		{`{"token":null}`, "invalid token"}, // present and not a string: the reference refuses null too
		{`{"token":""}`, "missing token"},
		{`{"token":"   \t\n"}`, "missing token"},
		{`{"token":"\u00a0\ufeff"}`, "missing token"},
		{`{"token":5}`, "invalid token"},
		{`{"token":true}`, "invalid token"},
		{`{"token":["a"]}`, "invalid token"},
		{`{"token":{"a":"b"}}`, "invalid token"},
		{`{"token":"` + long(513) + `"}`, "invalid token"},
		{`{"token":"  ` + long(512) + `  "}`, ""},
		{`{"Token":"abc"}`, "missing token"}, // names match exactly
		{`{"token":5,"token":"abc"}`, ""},    // the last duplicate wins
		{`{"token":"abc","token":5}`, "invalid token"},
		// title, body
		{`{"token":"a","title":5}`, "invalid title"},
		{`{"token":"a","title":{}}`, "invalid title"},
		{`{"token":"a","title":null}`, "invalid title"},
		{`{"token":"a","title":"` + long(5000) + `"}`, ""},
		{`{"token":"a","body":false}`, "invalid body"},
		{`{"token":"a","body":[]}`, "invalid body"},
		{`{"token":"a","body":null}`, "invalid body"},
		{`{"token":null,"title":5}`, "invalid token"},
		{`{"token":"a","title":null,"body":5}`, "invalid title"},
		{`{"token":"a","body":null,"data":5}`, "invalid body"},
		// order: token before title before body before data
		{`{"data":1,"body":1,"title":1,"token":1}`, "invalid token"},
		{`{"data":1,"body":1,"title":1,"token":"a"}`, "invalid title"},
		{`{"data":1,"body":1,"title":"t","token":"a"}`, "invalid body"},
		{`{"data":1,"body":"b","title":"t","token":"a"}`, "invalid data"},
		// data
		{`{"token":"a","data":null}`, ""},
		{`{"token":"a","data":{}}`, ""},
		{`{"token":"a","data":[]}`, "invalid data"},
		{`{"token":"a","data":["x"]}`, "invalid data"},
		{`{"token":"a","data":"x"}`, "invalid data"},
		{`{"token":"a","data":3}`, "invalid data"},
		{`{"token":"a","data":` + string(d16) + `}`, ""},
		{`{"token":"a","data":` + string(d17) + `}`, "too many data entries"},
		{`{"token":"a","data":{"` + long(64) + `":"v"}}`, ""},
		{`{"token":"a","data":{"` + long(65) + `":"v"}}`, "invalid data key"},
		{`{"token":"a","data":{"k":1}}`, "invalid data value"},
		{`{"token":"a","data":{"k":null}}`, "invalid data value"},
		{`{"token":"a","data":{"k":{"x":"y"}}}`, "invalid data value"},
		{`{"token":"a","data":{"k":"` + long(5000) + `"}}`, ""},
		// count before keys and values
		{`{"token":"a","data":{"` + long(65) + `":1,` + string(d17)[1:] + `}`, "too many data entries"},
		// duplicate data keys count once and keep the last value
		{`{"token":"a","data":{"k":1,"k":"v"}}`, ""},
		{`{"token":"a","data":{"k":"v","k":1}}`, "invalid data value"},
		// entries are checked in JavaScript property order: index keys first
		{`{"token":"a","data":{"b":1,"7":"` + long(0) + `x","` + long(65) + `":"v"}}`, "invalid data value"},
		{`{"token":"a","data":{"b":"v","` + long(65) + `":1,"7":2}}`, "invalid data value"},
		{`{"token":"a","data":{"` + long(65) + `":1,"b":"v"}}`, "invalid data key"},
		// unknown fields are ignored, whatever they hold
		{`{"token":"a","platform":"android","extra":{"deep":[1,2,{"x":null}]},"n":-1.5e+10}`, ""},
		// a byte order mark is ignored, as the reference's decoder does
		{"\xef\xbb\xbf" + `{"token":"a"}`, ""},
		{"  \r\n\t" + `{"token":"a"}` + "\n", ""},
	} {
		a := g.send(key, tc.body)
		what := fmt.Sprintf("body %.80q", tc.body)
		if tc.want == "" {
			expect(t, what, a, 200, `{"ok":true}`)
		} else {
			expect(t, what, a, 400, errBody(tc.want))
		}
	}
}

func TestNotConfiguredAfterValidation(t *testing.T) {
	g := startGateway(t, gwOpts{})
	_, key := g.newKey("server")
	expect(t, "bad body", g.send(key, `{"token":1}`), 400, errBody("invalid token"))
	expect(t, "valid", g.send(key, `{"token":"abc"}`), 500, errBody("relay not configured"))
	if ev := g.logs.events(t, "request"); len(ev) == 0 || ev[len(ev)-1]["level"] != "ERROR" {
		t.Errorf("a 500 is not logged at error level: %v", ev)
	}
}

// apnsPayload is what the fake received for the last push.
func lastAPNs(t *testing.T, f *apnsFake) pushtest.APNsRequest {
	t.Helper()
	reqs := f.Requests()
	if len(reqs) == 0 {
		t.Fatal("APNs received nothing")
	}
	return reqs[len(reqs)-1]
}

func TestAPNsRequestAndClipping(t *testing.T) {
	f := newAPNsFake(t)
	g := startGateway(t, gwOpts{apns: f.client, rate: 100})
	_, key := g.newKey("server")
	a255 := strings.Repeat("a", 255)
	emoji := "\U0001F600" // a surrogate pair in UTF-16
	body := map[string]any{
		"token":    "  abcdef0123  ",
		"title":    a255 + emoji + "tail", // the pair would straddle 256: dropped whole
		"body":     strings.Repeat("é", 1030),
		"platform": "ios",
		"data": map[string]string{
			"messageId": "msg-123",
			"html":      "<b>&amp;</b>\u2028\"q\"\\\n\x01",
			"long":      strings.Repeat("b", 1023) + emoji,
			"aps":       "cannot replace aps",
			"10":        "ten",
			"2":         "two",
		},
	}
	raw, _ := json.Marshal(body)
	expect(t, "send", g.send(key, string(raw)), 200, `{"ok":true}`)
	req := lastAPNs(t, f)
	if req.Problem != "" {
		t.Fatalf("the fake refused the push: %s", req.Problem)
	}
	if req.DeviceToken != "abcdef0123" {
		t.Errorf("device token %q, want it trimmed", req.DeviceToken)
	}
	for k, want := range map[string]string{"apns-topic": topic, "apns-push-type": "alert", "apns-priority": "10"} {
		if got := req.Header.Get(k); got != want {
			t.Errorf("%s: %q, want %q", k, got, want)
		}
	}
	if !strings.HasPrefix(req.Header.Get("authorization"), "bearer ") {
		t.Errorf("authorization %q", req.Header.Get("authorization"))
	}
	want := `{"2":"two","10":"ten","html":"<b>&amp;</b>` + "\u2028" + `\"q\"\\\n\u0001",` +
		`"long":"` + strings.Repeat("b", 1023) + `","messageId":"msg-123",` +
		`"aps":{"alert":{"title":"` + a255 + `","body":"` + strings.Repeat("é", 1024) + `"},` +
		`"sound":"default","mutable-content":1,"category":"MAIL_NOTIFICATION"}}`
	if string(req.Body) != want {
		t.Errorf("payload\n%s\nwant\n%s", req.Body, want)
	}

	// Exactly 256 code units with the pair inside: kept whole.
	raw, _ = json.Marshal(map[string]any{"token": "t2", "title": strings.Repeat("a", 254) + emoji, "data": map[string]string{"type": "mfa_challenge"}})
	expect(t, "send 2", g.send(key, string(raw)), 200, `{"ok":true}`)
	want = `{"type":"mfa_challenge","aps":{"alert":{"title":"` + strings.Repeat("a", 254) + emoji + `","body":""},` +
		`"sound":"default","mutable-content":1,"category":"MFA_CHALLENGE"}}`
	if got := string(lastAPNs(t, f).Body); got != want {
		t.Errorf("payload\n%s\nwant\n%s", got, want)
	}

	// Escapes decode before counting: "\ud83d\ude00" is one pair, and a
	// lone surrogate becomes U+FFFD.
	expect(t, "send 3", g.send(key, `{"token":"t3","title":"\ud83d\ude00\ud800x","body":"\u00e9\/"}`), 200, `{"ok":true}`)
	want = `{"aps":{"alert":{"title":"` + emoji + "\uFFFDx" + `","body":"é/"},"sound":"default","mutable-content":1,"category":"MAIL_NOTIFICATION"}}`
	if got := string(lastAPNs(t, f).Body); got != want {
		t.Errorf("payload\n%s\nwant\n%s", got, want)
	}
}

func TestFCMRequestAndClipping(t *testing.T) {
	fc := newFCMFake(t)
	g := startGateway(t, gwOpts{provider: pushgw.ProviderFCM, fcm: fc.client})
	_, key := g.newKey("server")
	emoji := "\U0001F600"
	raw, _ := json.Marshal(map[string]any{
		"token": "\tfcm-token-1 ", "title": "Hello", "body": "World",
		"data": map[string]string{"url": "/read", "v": strings.Repeat("c", 1023) + emoji + "z"},
	})
	expect(t, "send", g.send(key, string(raw)), 200, `{"ok":true}`)
	sends := fc.Sends()
	if len(sends) != 1 || sends[0].Problem != "" {
		t.Fatalf("sends %+v", sends)
	}
	want := `{"message":{"token":"fcm-token-1","data":{"url":"/read","v":"` + strings.Repeat("c", 1023) +
		`"},"android":{"priority":"HIGH"}}}`
	if string(sends[0].Body) != want {
		t.Errorf("message\n%s\nwant\n%s", sends[0].Body, want)
	}
	if sends[0].Project != pushtest.ServiceAccountProject {
		t.Errorf("project %q", sends[0].Project)
	}
	// An empty data object is sent as {}.
	expect(t, "send 2", g.send(key, `{"token":"fcm-token-2"}`), 200, `{"ok":true}`)
	if got := string(fc.Sends()[1].Body); got != `{"message":{"token":"fcm-token-2","data":{},"android":{"priority":"HIGH"}}}` {
		t.Errorf("message %s", got)
	}
}

// bodyOfSize is a valid /send body of exactly n bytes.
func bodyOfSize(t *testing.T, n int) string {
	t.Helper()
	head := `{"token":"size","pad":"`
	tail := `"}`
	pad := n - len(head) - len(tail)
	if pad < 0 {
		t.Fatal("too small")
	}
	return head + strings.Repeat("p", pad) + tail
}

// TestBodySizeLimit runs in the streaming mode the relay serves the
// gateway in. (Without streaming fasthttp refuses an oversized
// Content-Length before reading the body, and a net/http client still
// writing it may see a broken pipe instead of the 413; that mode is
// covered with a raw client below.)
func TestBodySizeLimit(t *testing.T) {
	for _, stream := range []bool{true} {
		t.Run(fmt.Sprint("stream=", stream), func(t *testing.T) {
			f := newAPNsFake(t)
			g := startGateway(t, gwOpts{apns: f.client, rate: 100, noStream: !stream})
			_, key := g.newKey("server")
			auth := map[string]string{"Authorization": "Bearer " + key}
			at := bodyOfSize(t, pushgw.MaxBodyBytes)
			past := bodyOfSize(t, pushgw.MaxBodyBytes+1)
			expect(t, "16384 with length", g.do("POST", "/send", auth, strings.NewReader(at)), 200, `{"ok":true}`)
			expect(t, "16385 with length", g.do("POST", "/send", auth, strings.NewReader(past)), 413, errBody("request body too large"))
			expect(t, "16384 chunked", g.do("POST", "/send", auth, chunked{strings.NewReader(at)}), 200, `{"ok":true}`)
			expect(t, "16385 chunked", g.do("POST", "/send", auth, chunked{strings.NewReader(past)}), 413, errBody("request body too large"))
			if stream {
				// The key is checked first (the spec's order), even for
				// an oversized body.
				expect(t, "16385 no key", g.do("POST", "/send", nil, strings.NewReader(past)), 401, errBody("missing api key"))
			}
		})
	}
}

// A Content-Length over the limit is refused without reading the body:
// the answer arrives although the client sends only the first 8 KiB of a
// megabyte (fasthttp's streaming mode reads that much ahead before the
// handler runs; without streaming it reads nothing at all).
func TestOversizedContentLengthAnsweredWithoutBody(t *testing.T) {
	for _, stream := range []bool{true, false} {
		t.Run(fmt.Sprint("stream=", stream), func(t *testing.T) {
			f := newAPNsFake(t)
			g := startGateway(t, gwOpts{apns: f.client, noStream: !stream})
			_, key := g.newKey("server")
			conn, err := net.Dial("tcp", g.addr)
			if err != nil {
				t.Fatal(err)
			}
			defer conn.Close()
			fmt.Fprintf(conn, "POST /send HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer %s\r\nContent-Type: application/json\r\nContent-Length: 1000000\r\n\r\n", key)
			if stream {
				_, _ = conn.Write([]byte(strings.Repeat(" ", 8<<10)))
			}
			_ = conn.SetReadDeadline(time.Now().Add(5 * time.Second))
			resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
			if err != nil {
				t.Fatal(err)
			}
			defer resp.Body.Close()
			var b strings.Builder
			_, _ = bufio.NewReader(resp.Body).WriteTo(&b)
			expect(t, "huge length", answer{status: resp.StatusCode, header: resp.Header, body: b.String()}, 413, errBody("request body too large"))
		})
	}
}

func TestRateLimitPerKey(t *testing.T) {
	f := newAPNsFake(t)
	g := startGateway(t, gwOpts{apns: f.client, rate: 3})
	_, k1 := g.newKey("one")
	_, k2 := g.newKey("two")
	// Refused validation spends no quota.
	for range 5 {
		expect(t, "bad", g.send(k1, `{"token":""}`), 400, errBody("missing token"))
	}
	for i := range 3 {
		expect(t, fmt.Sprint("send ", i), g.send(k1, `{"token":"r1"}`), 200, `{"ok":true}`)
	}
	a := g.send(k1, `{"token":"r1"}`)
	expect(t, "fourth", a, 429, `{"error":"rate limit exceeded","requestId":"{rid}","window":"minute","limit":3,"retryAfterSeconds":60}`)
	if ra := a.header.Get("Retry-After"); ra != "60" {
		t.Errorf("Retry-After %q", ra)
	}
	// Another key has its own limit.
	expect(t, "other key", g.send(k2, `{"token":"r2"}`), 200, `{"ok":true}`)
	// The limit refills with time: one token every 20 s at 3 a minute.
	g.clock.Advance(20 * time.Second)
	expect(t, "refilled", g.send(k1, `{"token":"r1"}`), 200, `{"ok":true}`)
	expect(t, "empty again", g.send(k1, `{"token":"r1"}`), 429,
		`{"error":"rate limit exceeded","requestId":"{rid}","window":"minute","limit":3,"retryAfterSeconds":60}`)
	if n := len(f.Requests()); n != 5 {
		t.Errorf("APNs saw %d pushes, want 5", n)
	}
}

// Only APNs 410 deletes a device; every other refusal is 502 with the
// provider's text kept out of the answer.
func TestAPNsStaleTable(t *testing.T) {
	f := newAPNsFake(t)
	g := startGateway(t, gwOpts{apns: f.client, rate: 100})
	_, key := g.newKey("server")
	for _, tc := range []struct {
		status int
		reason string
		want   int
	}{
		{410, "Unregistered", 410},
		{410, "ExpiredToken", 410},
		{400, "BadDeviceToken", 502},
		{400, "DeviceTokenNotForTopic", 502},
		{403, "BadCertificateEnvironment", 502},
		{404, "BadPath", 502},
		{413, "PayloadTooLarge", 502},
		{429, "TooManyRequests", 502},
		{500, "InternalServerError", 502},
		{503, "ServiceUnavailable", 502},
	} {
		tok := fmt.Sprintf("dev-%d-%s", tc.status, tc.reason)
		f.AnswerOnce(tok, tc.status, tc.reason)
		a := g.send(key, `{"token":"`+tok+`"}`)
		what := fmt.Sprint(tc.status, " ", tc.reason)
		if tc.want == 410 {
			expect(t, what, a, 410, `{"stale":true,"requestId":"{rid}"}`)
		} else {
			expect(t, what, a, 502, errBody("push delivery failed"))
		}
	}
	failed := g.logs.events(t, "send.apns_failed")
	if len(failed) != 8 || failed[0]["reason"] != "BadDeviceToken" || failed[0]["providerStatus"] != float64(400) {
		t.Errorf("send.apns_failed lines: %v", failed)
	}
	if n := len(g.logs.events(t, "send.stale")); n != 2 {
		t.Errorf("%d send.stale lines", n)
	}
}

// Only FCM 404 with UNREGISTERED deletes a device.
func TestFCMStaleTable(t *testing.T) {
	fc := newFCMFake(t)
	g := startGateway(t, gwOpts{provider: pushgw.ProviderFCM, fcm: fc.client, rate: 100})
	_, key := g.newKey("server")
	for i, tc := range []struct {
		answer pushtest.FCMAnswer
		want   int
	}{
		{pushtest.FCMUnregistered(), 410},
		{pushtest.FCMAnswer{Code: 404, Status: "NOT_FOUND", Message: "Requested entity was not found."}, 502},
		{pushtest.FCMAnswer{Code: 400, Status: "INVALID_ARGUMENT", ErrorCode: "UNREGISTERED"}, 502},
		{pushtest.FCMInvalidArgument(), 502},
		{pushtest.FCMSenderIDMismatch(), 502},
		{pushtest.FCMQuotaExceeded(time.Minute), 502},
		{pushtest.FCMUnavailable(), 502},
		{pushtest.FCMInternal(), 502},
	} {
		tok := fmt.Sprint("fcm-", i)
		fc.AnswerOnce(tok, tc.answer)
		a := g.send(key, `{"token":"`+tok+`"}`)
		what := fmt.Sprint(tc.answer.Code, " ", tc.answer.ErrorCode)
		if tc.want == 410 {
			expect(t, what, a, 410, `{"stale":true,"requestId":"{rid}"}`)
		} else {
			expect(t, what, a, 502, errBody("push delivery failed"))
			if strings.Contains(a.body, tc.answer.Message) && tc.answer.Message != "" {
				t.Errorf("%s: provider text in the answer", what)
			}
		}
	}
	if n := len(g.logs.events(t, "send.fcm_failed")); n != 7 {
		t.Errorf("%d send.fcm_failed lines, want 7", n)
	}
}

// Improvement over the reference: a refused provider token is replaced
// and the push retried once, instead of failing for up to 29 minutes.
func TestFreshProviderTokenAfterExpired(t *testing.T) {
	f := newAPNsFake(t)
	g := startGateway(t, gwOpts{apns: f.client})
	_, key := g.newKey("server")
	expect(t, "first", g.send(key, `{"token":"dev1"}`), 200, `{"ok":true}`)
	f.ExpireProviderTokens()
	expect(t, "after expiry", g.send(key, `{"token":"dev1"}`), 200, `{"ok":true}`)
	reqs := f.Requests()
	if len(reqs) != 3 || reqs[1].Reason != "ExpiredProviderToken" || reqs[2].Status != 200 || reqs[1].Bearer == reqs[2].Bearer {
		t.Fatalf("requests: %+v", reqs)
	}
}

// Improvement over the reference: an FCM 401 drops the cached OAuth token
// and fetches a new one.
func TestFreshOAuthTokenAfterFCM401(t *testing.T) {
	fc := newFCMFake(t)
	g := startGateway(t, gwOpts{provider: pushgw.ProviderFCM, fcm: fc.client})
	_, key := g.newKey("server")
	expect(t, "first", g.send(key, `{"token":"f1"}`), 200, `{"ok":true}`)
	fc.RevokeTokens()
	expect(t, "after revoke", g.send(key, `{"token":"f1"}`), 200, `{"ok":true}`)
	grants := fc.Grants()
	sends := fc.Sends()
	if len(grants) != 2 || len(sends) != 3 || sends[1].Status != 401 || sends[2].Status != 200 ||
		sends[2].AccessToken != grants[1].AccessToken {
		t.Fatalf("grants %d, sends %+v", len(grants), sends)
	}
}

// One JSON line per request with the spec's fields, and never a key or a
// device token anywhere in the log.
func TestLogLines(t *testing.T) {
	f := newAPNsFake(t)
	g := startGateway(t, gwOpts{apns: f.client, registration: true})
	id, key := g.newKey("server")
	const device = "devicetoken-secret-0123456789"
	expect(t, "ok", g.send(key, `{"token":"`+device+`"}`), 200, `{"ok":true}`)
	f.AnswerOnce("dead-"+device, 410, "Unregistered")
	expect(t, "stale", g.send(key, `{"token":"dead-`+device+`"}`), 410, `{"stale":true,"requestId":"{rid}"}`)
	f.AnswerOnce("bad-"+device, 400, "BadDeviceToken")
	expect(t, "failed", g.send(key, `{"token":"bad-`+device+`"}`), 502, errBody("push delivery failed"))
	reg := g.do("POST", "/register", nil, strings.NewReader(`{"label":"x"}`))
	var minted struct{ Key string }
	_ = json.Unmarshal([]byte(reg.body), &minted)
	g.send("wrong-key-material", `{"token":"x"}`)

	text := g.logs.String()
	for _, secret := range []string{key, device, minted.Key, "wrong-key-material"} {
		if secret == "" || strings.Contains(text, secret) {
			t.Errorf("log holds a secret %q", secret)
		}
	}
	reqLines := g.logs.events(t, "request")
	if len(reqLines) != 5 {
		t.Fatalf("%d request lines, want 5", len(reqLines))
	}
	first := reqLines[0]
	for _, k := range []string{"ts", "requestId", "level", "event", "method", "path", "status", "durationMs"} {
		if _, ok := first[k]; !ok {
			t.Errorf("request line lacks %s: %v", k, first)
		}
	}
	if first["method"] != "POST" || first["path"] != "/send" || first["status"] != float64(200) || first["level"] != "INFO" {
		t.Errorf("request line %v", first)
	}
	ok := g.logs.events(t, "send.ok")
	if len(ok) != 1 || ok[0]["keyId"] != id || ok[0]["requestId"] != first["requestId"] {
		t.Errorf("send.ok %v", ok)
	}
	if len(g.logs.events(t, "key.created")) != 1 {
		t.Error("no key.created line")
	}
}

// fasthttp's own refusals come in the gateway's shape too.
func TestServeErrorShapes(t *testing.T) {
	g := startGateway(t, gwOpts{})
	conn, err := net.Dial("tcp", g.addr)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	fmt.Fprintf(conn, "GET /health HTTP/1.1\r\nHost: x\r\nX-Big: %s\r\n\r\n", strings.Repeat("b", 8000))
	_ = conn.SetReadDeadline(time.Now().Add(5 * time.Second))
	resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var b strings.Builder
	_, _ = bufio.NewReader(resp.Body).WriteTo(&b)
	expect(t, "huge header", answer{status: resp.StatusCode, header: resp.Header, body: b.String()}, 431, errBody("request headers too large"))
}
