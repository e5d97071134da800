package pushgw_test

import (
	"encoding/json"
	"fmt"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"edgerelay/fastpath/jsonstr/jsonstrref"
)

var hex64 = regexp.MustCompile(`^[0-9a-f]{64}$`)

type registered struct {
	ID        string  `json:"id"`
	Label     string  `json:"label"`
	Key       string  `json:"key"`
	ExpiresAt *string `json:"expiresAt"`
}

// register posts body to /register from the address in the proxy header
// (when the gateway trusts one) and checks the 201 shape.
func (g *gateway) register(t *testing.T, ip, body string) (registered, answer) {
	t.Helper()
	h := map[string]string{}
	if ip != "" {
		h["X-Forwarded-For"] = ip
	}
	a := g.do("POST", "/register", h, strings.NewReader(body))
	var r registered
	if a.status == 201 {
		if err := json.Unmarshal([]byte(a.body), &r); err != nil {
			t.Fatalf("register answer %s: %v", a.body, err)
		}
		want := fmt.Sprintf(`{"id":"%s","label":%s,"key":"%s","expiresAt":null}`, r.ID, mustJSON(r.Label), r.Key)
		if a.body != want || !uuidV4.MatchString(r.ID) || !hex64.MatchString(r.Key) {
			t.Errorf("register answer %s", a.body)
		}
		if !uuidV4.MatchString(a.rid()) || a.header.Get("Content-Type") != "application/json" {
			t.Errorf("register headers %v", a.header)
		}
	}
	return r, a
}

// mustJSON is s as JSON.stringify writes it: encoding/json escapes
// <, >, &, U+2028 and U+2029, which JSON.stringify leaves alone.
func mustJSON(s string) string {
	return strings.NewReplacer(`\u2028`, "\u2028", `\u2029`, "\u2029").Replace(jsonstrref.Quote(s))
}

func TestRegisterMintsAWorkingKey(t *testing.T) {
	f := newAPNsFake(t)
	g := startGateway(t, gwOpts{apns: f.client, registration: true})
	r, a := g.register(t, "", `{"label":"  my server  "}`)
	if a.status != 201 || r.Label != "my server" {
		t.Fatalf("register: %d %s", a.status, a.body)
	}
	expect(t, "send with it", g.send(r.Key, `{"token":"t"}`), 200, `{"ok":true}`)
	list, _ := g.keys.List()
	if len(list) != 1 || list[0].ID != r.ID || list[0].Source != "self" || list[0].RegisteredIP == nil ||
		*list[0].RegisteredIP != "127.0.0.1" || list[0].ExpiresAt != nil || !list[0].Active {
		t.Fatalf("key record %+v", list)
	}
	// Only the hash is stored: the key's text appears nowhere in the store.
	if strings.Contains(g.logs.String(), r.Key) {
		t.Error("key in the log")
	}

	// Registering again from the same bucket supersedes the first key.
	r2, _ := g.register(t, "", ``)
	if r2.Label != "self-registered" {
		t.Errorf("default label %q", r2.Label)
	}
	expect(t, "old key", g.send(r.Key, `{"token":"t"}`), 401, errBody("invalid api key"))
	expect(t, "new key", g.send(r2.Key, `{"token":"u"}`), 200, `{"ok":true}`)
	sup := g.logs.events(t, "key.superseded")
	if len(sup) != 1 || sup[0]["keyId"] != r.ID || sup[0]["by"] != r2.ID {
		t.Errorf("key.superseded %v", sup)
	}
}

func TestRegisterLabels(t *testing.T) {
	g := startGateway(t, gwOpts{registration: true, proxyHeader: "X-Forwarded-For"})
	long := strings.Repeat("L", 63) + "\U0001F600"
	for i, tc := range []struct{ body, label string }{
		{``, "self-registered"},
		{`garbage`, "self-registered"},
		{`[]`, "self-registered"},
		{`null`, "self-registered"},
		{`{"label":5}`, "self-registered"},
		{`{"label":null}`, "self-registered"},
		{`{"label":"   "}`, "self-registered"},
		{`{"label":"ok"} trailing`, "self-registered"},
		{`{"Label":"x"}`, "self-registered"},
		{`{"label":"` + strings.Repeat("x", 70) + `"}`, strings.Repeat("x", 64)},
		{`{"label":"` + long + `"}`, strings.Repeat("L", 63)},
		{`{"label":"a \"quoted\" <label> & \u2028 x"}`, "a \"quoted\" <label> & \u2028 x"},
		{`{"label":" \u2028trimmed\ufeff "}`, "trimmed"},
	} {
		r, a := g.register(t, fmt.Sprintf("10.0.0.%d", i+1), tc.body)
		if a.status != 201 || r.Label != tc.label {
			t.Errorf("body %q: %d label %q, want %q", tc.body, a.status, r.Label, tc.label)
		}
	}
}

func TestRegisterLimits(t *testing.T) {
	g := startGateway(t, gwOpts{registration: true, proxyHeader: "X-Forwarded-For"})
	// Body: 4096 bytes accepted, 4097 refused.
	pad := func(n int) string {
		head, tail := `{"label":"p","pad":"`, `"}`
		return head + strings.Repeat("p", n-len(head)-len(tail)) + tail
	}
	if _, a := g.register(t, "192.0.2.1", pad(4096)); a.status != 201 {
		t.Fatalf("4096 bytes: %d %s", a.status, a.body)
	}
	_, a := g.register(t, "192.0.2.2", pad(4097))
	expect(t, "4097 bytes", a, 413, errBody("request body too large"))

	// Five a minute per bucket.
	for i := range 5 {
		if _, a := g.register(t, "198.51.100.7", `{}`); a.status != 201 {
			t.Fatalf("registration %d: %d %s", i, a.status, a.body)
		}
	}
	_, a = g.register(t, "198.51.100.7", `{}`)
	expect(t, "sixth", a, 429, `{"error":"too many registration attempts, try again later","requestId":"{rid}","window":"minute","retryAfterSeconds":60}`)
	if a.header.Get("Retry-After") != "60" {
		t.Errorf("Retry-After %q", a.header.Get("Retry-After"))
	}
	if _, a := g.register(t, "198.51.100.8", `{}`); a.status != 201 {
		t.Errorf("another IPv4 address shares the bucket: %d", a.status)
	}
	g.clock.Advance(12 * time.Second)
	if _, a := g.register(t, "198.51.100.7", `{}`); a.status != 201 {
		t.Errorf("after 12 s: %d", a.status)
	}

	// IPv6 by /64: addresses of one /64 share a bucket and a key.
	var first registered
	for i := range 5 {
		r, a := g.register(t, fmt.Sprintf("2001:db8:aa:bb::%x", i+1), `{}`)
		if a.status != 201 {
			t.Fatalf("v6 %d: %d", i, a.status)
		}
		if i == 0 {
			first = r
		}
	}
	_, a = g.register(t, "2001:db8:aa:bb:ffff:ffff:ffff:ffff", `{}`)
	expect(t, "sixth in the /64", a, 429, `{"error":"too many registration attempts, try again later","requestId":"{rid}","window":"minute","retryAfterSeconds":60}`)
	if _, a := g.register(t, "2001:db8:aa:bc::1", `{}`); a.status != 201 {
		t.Errorf("next /64: %d", a.status)
	}
	var buckets []string
	list, _ := g.keys.List()
	for _, k := range list {
		if k.ID == first.ID {
			t.Error("the /64's first key survived its successors")
		}
		if k.RegisteredIP != nil {
			buckets = append(buckets, *k.RegisteredIP)
		}
	}
	joined := strings.Join(buckets, " ")
	for _, want := range []string{"2001:db8:aa:bb::/64", "2001:db8:aa:bc::/64", "198.51.100.7", "198.51.100.8"} {
		if strings.Count(joined, want) != 1 {
			t.Errorf("bucket %s: %d keys (buckets %v)", want, strings.Count(joined, want), buckets)
		}
	}

	// The last element of the header is the proxy's word; missing or
	// garbage fails closed.
	if _, a := g.register(t, "203.0.113.9, 192.0.2.50", `{}`); a.status != 201 {
		t.Errorf("list header: %d", a.status)
	}
	for _, ip := range []string{"", "not-an-ip", "192.0.2.50, ", "0.0.0.0", "::"} {
		_, a := g.register(t, ip, `{}`)
		expect(t, "header "+ip, a, 503, errBody("registration is temporarily unavailable"))
	}
}

// Racing registrations from one bucket leave exactly one working key.
func TestRacingRegistrationsLeaveOneKey(t *testing.T) {
	f := newAPNsFake(t)
	g := startGateway(t, gwOpts{apns: f.client, registration: true, rate: 100})
	var wg sync.WaitGroup
	keys := make([]string, 5)
	for i := range keys {
		wg.Add(1)
		go func() {
			defer wg.Done()
			r, a := g.register(t, "", fmt.Sprintf(`{"label":"racer %d"}`, i))
			if a.status != 201 {
				t.Errorf("racer %d: %d %s", i, a.status, a.body)
			}
			keys[i] = r.Key
		}()
	}
	wg.Wait()
	working := 0
	for i, k := range keys {
		switch a := g.send(k, fmt.Sprintf(`{"token":"race-%d"}`, i)); a.status {
		case 200:
			working++
		case 401:
		default:
			t.Errorf("key %d: %d %s", i, a.status, a.body)
		}
	}
	list, _ := g.keys.List()
	if working != 1 || len(list) != 1 {
		t.Fatalf("%d keys work, %d stored; want exactly one", working, len(list))
	}
}
