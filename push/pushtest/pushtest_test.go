package pushtest

import (
	"crypto"
	"crypto/ecdsa"
	"crypto/rand"
	"crypto/sha256"
	"crypto/tls"
	"encoding/base64"
	"encoding/json"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"
)

// signES256 makes a provider token by hand, so that the fake's checks can
// be driven one claim at a time.
func signES256(t *testing.T, priv *ecdsa.PrivateKey, kid, iss string, iat time.Time) string {
	t.Helper()
	enc := base64.RawURLEncoding
	head, _ := json.Marshal(map[string]string{"alg": "ES256", "kid": kid})
	claims, _ := json.Marshal(map[string]any{"iss": iss, "iat": iat.Unix()})
	input := enc.EncodeToString(head) + "." + enc.EncodeToString(claims)
	digest := sha256.Sum256([]byte(input))
	r, s, err := ecdsa.Sign(rand.Reader, priv, digest[:])
	if err != nil {
		t.Fatal(err)
	}
	sig := make([]byte, 64)
	r.FillBytes(sig[:32])
	s.FillBytes(sig[32:])
	return input + "." + enc.EncodeToString(sig)
}

func TestFakeAPNsChecks(t *testing.T) {
	_, priv := NewAPNsKey(t)
	_, other := NewAPNsKey(t)
	f := NewAPNs(t, "TEAM", "KID", &priv.PublicKey)
	f.RequireTopic("com.example.app")

	h2 := &http.Client{Transport: &http.Transport{
		TLSClientConfig: &tls.Config{RootCAs: f.RootCAs()}, ForceAttemptHTTP2: true,
	}}
	var h1proto http.Protocols
	h1proto.SetHTTP1(true)
	h1 := &http.Client{Transport: &http.Transport{
		TLSClientConfig: &tls.Config{RootCAs: f.RootCAs()}, Protocols: &h1proto,
	}}

	good := signES256(t, priv, "KID", "TEAM", time.Now())
	base := map[string]string{
		"authorization":  "bearer " + good,
		"apns-topic":     "com.example.app",
		"apns-push-type": "alert",
		"apns-priority":  "10",
	}
	with := func(k, v string) map[string]string {
		m := map[string]string{}
		for a, b := range base {
			m[a] = b
		}
		if v == "" {
			delete(m, k)
		} else {
			m[k] = v
		}
		return m
	}
	cases := []struct {
		name    string
		client  *http.Client
		method  string
		path    string
		headers map[string]string
		body    string
		status  int
		reason  string
	}{
		{"valid", h2, "POST", "/3/device/abc", base, `{"aps":{}}`, 200, ""},
		{"GET", h2, "GET", "/3/device/abc", base, ``, 405, "MethodNotAllowed"},
		{"bad path", h2, "POST", "/2/device/abc", base, `{}`, 404, "BadPath"},
		{"HTTP/1.1", h1, "POST", "/3/device/abc", base, `{}`, 505, ""},
		{"no auth", h2, "POST", "/3/device/abc", with("authorization", ""), `{}`, 403, "MissingProviderToken"},
		{"garbage token", h2, "POST", "/3/device/abc", with("authorization", "bearer abc.def"), `{}`, 403, "InvalidProviderToken"},
		{"wrong kid", h2, "POST", "/3/device/abc", with("authorization", "bearer "+signES256(t, priv, "OTHER", "TEAM", time.Now())), `{}`, 403, "InvalidProviderToken"},
		{"wrong team", h2, "POST", "/3/device/abc", with("authorization", "bearer "+signES256(t, priv, "KID", "OTHER", time.Now())), `{}`, 403, "InvalidProviderToken"},
		{"wrong key", h2, "POST", "/3/device/abc", with("authorization", "bearer "+signES256(t, other, "KID", "TEAM", time.Now())), `{}`, 403, "InvalidProviderToken"},
		{"old token", h2, "POST", "/3/device/abc", with("authorization", "bearer "+signES256(t, priv, "KID", "TEAM", time.Now().Add(-61*time.Minute))), `{}`, 403, "ExpiredProviderToken"},
		{"future token", h2, "POST", "/3/device/abc", with("authorization", "bearer "+signES256(t, priv, "KID", "TEAM", time.Now().Add(time.Hour))), `{}`, 403, "InvalidProviderToken"},
		{"no topic", h2, "POST", "/3/device/abc", with("apns-topic", ""), `{}`, 400, "MissingTopic"},
		{"other topic", h2, "POST", "/3/device/abc", with("apns-topic", "com.example.other"), `{}`, 400, "DeviceTokenNotForTopic"},
		{"no push type", h2, "POST", "/3/device/abc", with("apns-push-type", ""), `{}`, 400, "InvalidPushType"},
		{"bad priority", h2, "POST", "/3/device/abc", with("apns-priority", "7"), `{}`, 400, "BadPriority"},
		{"background at 10", h2, "POST", "/3/device/abc", with("apns-push-type", "background"), `{}`, 400, "BadPriority"},
		{"bad expiration", h2, "POST", "/3/device/abc", with("apns-expiration", "tomorrow"), `{}`, 400, "BadExpirationDate"},
		{"empty payload", h2, "POST", "/3/device/abc", base, ``, 400, "PayloadEmpty"},
		{"payload at limit", h2, "POST", "/3/device/abc", base, strings.Repeat(" ", 4096), 200, ""},
		{"payload past limit", h2, "POST", "/3/device/abc", base, strings.Repeat(" ", 4097), 413, "PayloadTooLarge"},
	}
	for _, tc := range cases {
		req, _ := http.NewRequest(tc.method, f.URL()+tc.path, strings.NewReader(tc.body))
		for k, v := range tc.headers {
			req.Header.Set(k, v)
		}
		resp, err := tc.client.Do(req)
		if err != nil {
			t.Errorf("%s: %v", tc.name, err)
			continue
		}
		var answer struct{ Reason string }
		_ = json.NewDecoder(resp.Body).Decode(&answer)
		resp.Body.Close()
		if resp.StatusCode != tc.status || answer.Reason != tc.reason {
			t.Errorf("%s: %d %q, want %d %q", tc.name, resp.StatusCode, answer.Reason, tc.status, tc.reason)
		}
		if resp.Header.Get("apns-id") == "" {
			t.Errorf("%s: no apns-id", tc.name)
		}
	}
	got := f.Requests()
	if len(got) != len(cases) {
		t.Fatalf("recorded %d requests, want %d", len(got), len(cases))
	}
	for i, r := range got {
		if (r.Problem == "") != (cases[i].status == 200) {
			t.Errorf("%s: recorded problem %q with status %d", cases[i].name, r.Problem, r.Status)
		}
		if r.Status != cases[i].status {
			t.Errorf("%s: recorded status %d", cases[i].name, r.Status)
		}
	}
}

func TestFakeAPNsWaitAndAnswers(t *testing.T) {
	_, priv := NewAPNsKey(t)
	f := NewAPNs(t, "TEAM", "KID", &priv.PublicKey)
	f.Answer("dead", http.StatusGone, "Unregistered")
	f.AnswerOnce("dead", http.StatusServiceUnavailable, "ServiceUnavailable")

	bearer := signES256(t, priv, "KID", "TEAM", time.Now())
	client := &http.Client{Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: f.RootCAs()}, ForceAttemptHTTP2: true}}
	post := func() (int, map[string]any) {
		req, _ := http.NewRequest("POST", f.URL()+"/3/device/dead", strings.NewReader(`{"aps":{}}`))
		req.Header.Set("authorization", "bearer "+bearer)
		req.Header.Set("apns-topic", "t")
		req.Header.Set("apns-push-type", "alert")
		resp, err := client.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		var m map[string]any
		_ = json.NewDecoder(resp.Body).Decode(&m)
		return resp.StatusCode, m
	}
	go func() {
		time.Sleep(50 * time.Millisecond)
		post()
	}()
	if got := f.Wait(1, 5*time.Second); len(got) != 1 || got[0].Status != 503 {
		t.Fatalf("Wait: %+v", got)
	}
	status, body := post()
	if status != 410 || body["reason"] != "Unregistered" || body["timestamp"] == nil {
		t.Errorf("sticky answer: %d %v", status, body)
	}
	if got := f.Wait(5, 10*time.Millisecond); len(got) != 2 {
		t.Errorf("Wait past its timeout returned %d requests, want the 2 there are", len(got))
	}
}

func TestFakeGoogleTokenChecks(t *testing.T) {
	g, creds, priv := NewGoogleWithAccount(t)
	var account struct {
		PrivateKeyID string `json:"private_key_id"`
		TokenURI     string `json:"token_uri"`
	}
	if err := json.Unmarshal(creds, &account); err != nil || account.TokenURI != g.TokenURL() {
		t.Fatalf("account JSON: %v %q", err, account.TokenURI)
	}
	client := &http.Client{Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: g.RootCAs()}, ForceAttemptHTTP2: true}}
	now := time.Now()
	claims := func(mod func(map[string]any)) map[string]any {
		c := map[string]any{"iss": ServiceAccountEmail, "aud": g.TokenURL(), "scope": fcmScope, "iat": now.Unix(), "exp": now.Add(time.Hour).Unix()}
		if mod != nil {
			mod(c)
		}
		return c
	}
	_, stranger, _ := NewServiceAccount(t, g.TokenURL())
	cases := []struct {
		name   string
		grant  string
		jwt    string
		status int
	}{
		{"valid", jwtBearerGrant, signRS256(t, priv, "RS256", claims(nil)), 200},
		{"wrong grant", "client_credentials", signRS256(t, priv, "RS256", claims(nil)), 400},
		{"wrong key", jwtBearerGrant, signRS256(t, stranger, "RS256", claims(nil)), 400},
		{"wrong alg", jwtBearerGrant, signRS256(t, priv, "RS384", claims(nil)), 400},
		{"wrong aud", jwtBearerGrant, signRS256(t, priv, "RS256", claims(func(c map[string]any) { c["aud"] = "https://oauth2.googleapis.com/token" })), 400},
		{"wrong scope", jwtBearerGrant, signRS256(t, priv, "RS256", claims(func(c map[string]any) { c["scope"] = "https://www.googleapis.com/auth/cloud-platform" })), 400},
		{"unknown iss", jwtBearerGrant, signRS256(t, priv, "RS256", claims(func(c map[string]any) { c["iss"] = "x@y.iam.gserviceaccount.com" })), 400},
		{"long-lived", jwtBearerGrant, signRS256(t, priv, "RS256", claims(func(c map[string]any) { c["exp"] = now.Add(2 * time.Hour).Unix() })), 400},
		{"expired", jwtBearerGrant, signRS256(t, priv, "RS256", claims(func(c map[string]any) {
			c["iat"], c["exp"] = now.Add(-2*time.Hour).Unix(), now.Add(-time.Hour).Unix()
		})), 400},
	}
	for _, tc := range cases {
		resp, err := client.PostForm(g.TokenURL(), map[string][]string{"grant_type": {tc.grant}, "assertion": {tc.jwt}})
		if err != nil {
			t.Fatal(err)
		}
		var body map[string]any
		_ = json.NewDecoder(resp.Body).Decode(&body)
		resp.Body.Close()
		if resp.StatusCode != tc.status {
			t.Errorf("%s: %d %v, want %d", tc.name, resp.StatusCode, body, tc.status)
		}
		if tc.status == 200 && (body["token_type"] != "Bearer" || body["expires_in"] != float64(3600) || !strings.HasPrefix(body["access_token"].(string), "ya29.")) {
			t.Errorf("%s: token answer %v", tc.name, body)
		}
		if tc.status != 200 && body["error"] == nil {
			t.Errorf("%s: error answer %v", tc.name, body)
		}
	}
	if grants := g.Grants(); len(grants) != len(cases) || grants[0].AccessToken == "" || grants[1].Problem == "" {
		t.Errorf("grants recorded: %d", len(grants))
	}
}

func signRS256(t *testing.T, priv crypto.Signer, alg string, claims map[string]any) string {
	t.Helper()
	enc := base64.RawURLEncoding
	head, _ := json.Marshal(map[string]string{"alg": alg, "typ": "JWT", "kid": strconv.Itoa(1)})
	body, _ := json.Marshal(claims)
	input := enc.EncodeToString(head) + "." + enc.EncodeToString(body)
	digest := sha256.Sum256([]byte(input))
	sig, err := priv.Sign(rand.Reader, digest[:], crypto.SHA256)
	if err != nil {
		t.Fatal(err)
	}
	return input + "." + enc.EncodeToString(sig)
}
