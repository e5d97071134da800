package admin_test

import (
	"bytes"
	"encoding/json"
	"io"
	"log/slog"
	"net"
	"net/http"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/valyala/fasthttp"

	"edgerelay/fastpath/admin"
	"edgerelay/fastpath/channel"
	"edgerelay/fastpath/httpx"
	"edgerelay/store"
)

const token = "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef"

func start(t *testing.T) (string, *admin.Handler, *store.ChannelClaims) {
	t.Helper()
	db, err := store.Open(t.TempDir(), nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	claims := store.NewChannelClaims(db)
	reg := prometheus.NewRegistry()
	h := channel.New(channel.Config{Claims: claims, Metrics: channel.NewMetrics(reg)})
	a := admin.New(admin.Config{
		Gatherer: reg, TokenHash: httpx.Hash([]byte(token)),
		ChannelKeys: &channel.Keys{Claims: claims, Handler: h}, Log: slog.New(slog.DiscardHandler),
	})
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := &fasthttp.Server{Handler: a.ServeHTTP}
	go func() { _ = srv.Serve(ln) }()
	t.Cleanup(func() { _ = srv.Shutdown() })
	return "http://" + ln.Addr().String(), a, claims
}

func call(t *testing.T, method, url, bearer string, body any) (int, []byte) {
	t.Helper()
	var rd io.Reader
	if body != nil {
		b, _ := json.Marshal(body)
		rd = bytes.NewReader(b)
	}
	req, _ := http.NewRequest(method, url, rd)
	if bearer != "" {
		req.Header.Set("Authorization", "Bearer "+bearer)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	raw, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, raw
}

func TestHealthReadyMetrics(t *testing.T) {
	base, a, _ := start(t)
	if code, _ := call(t, "GET", base+"/healthz", "", nil); code != 200 {
		t.Fatalf("healthz %d", code)
	}
	if code, _ := call(t, "GET", base+"/readyz", "", nil); code != 503 {
		t.Fatalf("readyz before ready %d", code)
	}
	a.SetReady(true)
	if code, _ := call(t, "GET", base+"/readyz", "", nil); code != 200 {
		t.Fatalf("readyz %d", code)
	}
	a.SetReady(false)
	if code, _ := call(t, "GET", base+"/readyz", "", nil); code != 503 {
		t.Fatalf("readyz while draining %d", code)
	}
	code, body := call(t, "GET", base+"/metrics", "", nil)
	if code != 200 || !strings.Contains(string(body), "edgerelay_channel_claims_total") {
		t.Fatalf("metrics %d %s", code, body)
	}
}

func TestKeyEndpointsNeedTheAdminToken(t *testing.T) {
	base, _, _ := start(t)
	for _, tok := range []string{"", strings.Repeat("f", 64), token[:63]} {
		if code, _ := call(t, "GET", base+"/v1/keys/channel", tok, nil); code != 401 {
			t.Fatalf("token %q: %d", tok, code)
		}
		if code, _ := call(t, "POST", base+"/v1/keys/channel", tok, admin.AddKeyRequest{Host: "x"}); code != 401 {
			t.Fatalf("add with token %q: %d", tok, code)
		}
	}
}

func TestKeyEndpoints(t *testing.T) {
	base, _, claims := start(t)
	code, body := call(t, "POST", base+"/v1/keys/channel", token, admin.AddKeyRequest{Host: "alpha"})
	if code != 201 {
		t.Fatalf("add %d %s", code, body)
	}
	var added admin.AddKeyResponse
	if err := json.Unmarshal(body, &added); err != nil || added.Host != "alpha" || len(added.Key) != 64 {
		t.Fatalf("add answer %s", body)
	}
	// Only the hash is stored.
	if ok, _ := claims.HasKey(httpx.Hash([]byte(added.Key))); !ok {
		t.Fatal("key hash not stored")
	}
	if code, _ := call(t, "POST", base+"/v1/keys/channel", token, admin.AddKeyRequest{Host: "alpha"}); code != 409 {
		t.Fatalf("duplicate host %d", code)
	}
	for _, bad := range []string{"", "a b", strings.Repeat("h", 65), "ü"} {
		if code, _ := call(t, "POST", base+"/v1/keys/channel", token, admin.AddKeyRequest{Host: bad}); code != 400 {
			t.Fatalf("host %q: %d", bad, code)
		}
	}
	if code, _ := call(t, "POST", base+"/v1/keys/channel", token, nil); code != 400 {
		t.Fatalf("no body %d", code)
	}
	code, body = call(t, "GET", base+"/v1/keys/channel", token, nil)
	var list []channel.KeyInfo
	if code != 200 || json.Unmarshal(body, &list) != nil || len(list) != 1 || list[0].Host != "alpha" || list[0].Used {
		t.Fatalf("list %d %s", code, body)
	}
	if strings.Contains(string(body), added.Key) {
		t.Fatal("list shows the key")
	}
	if code, _ := call(t, "DELETE", base+"/v1/keys/channel/nobody", token, nil); code != 404 {
		t.Fatalf("revoke unknown %d", code)
	}
	if code, _ := call(t, "DELETE", base+"/v1/keys/channel/alpha", token, nil); code != 200 {
		t.Fatalf("revoke %d", code)
	}
	if ok, _ := claims.HasKey(httpx.Hash([]byte(added.Key))); ok {
		t.Fatal("revoked key still stored")
	}
}
