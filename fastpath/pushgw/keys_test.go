package pushgw_test

import (
	"bytes"
	"crypto/subtle"
	"errors"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/valyala/fasthttp"

	"edgerelay/fastpath/httpx"
	"edgerelay/fastpath/pushgw"
	"edgerelay/fastpath/pushgw/keycmd"
	"edgerelay/store"
)

func TestKeysManagement(t *testing.T) {
	f := newAPNsFake(t)
	g := startGateway(t, gwOpts{apns: f.client})
	k := g.keys
	for _, bad := range []string{"", "   ", strings.Repeat("x", 65)} {
		if _, err := k.Create(bad, time.Time{}); !errors.Is(err, pushgw.ErrBadLabel) {
			t.Errorf("label %q: %v", bad, err)
		}
	}
	if _, err := k.Create("past", g.clock.Now().Add(-time.Second)); !errors.Is(err, pushgw.ErrBadExpiry) {
		t.Errorf("past expiry: %v", err)
	}
	exp := g.clock.Now().Add(48 * time.Hour)
	nk, err := k.Create("  build server ", exp)
	if err != nil {
		t.Fatal(err)
	}
	if nk.Label != "build server" || !hex64.MatchString(nk.Key) || !uuidV4.MatchString(nk.ID) ||
		nk.Source != "admin" || nk.ExpiresAt == nil || !nk.ExpiresAt.Equal(exp) || nk.RegisteredIP != nil || !nk.Active {
		t.Fatalf("created %+v", nk)
	}
	expect(t, "works", g.send(nk.Key, `{"token":"t"}`), 200, `{"ok":true}`)
	if err := k.Disable(nk.ID); err != nil {
		t.Fatal(err)
	}
	list, _ := k.List()
	if len(list) != 1 || list[0].Enabled || list[0].Active {
		t.Fatalf("after disable %+v", list)
	}
	expect(t, "disabled", g.send(nk.Key, `{"token":"t"}`), 401, errBody("invalid api key"))
	if err := k.Enable(nk.ID); err != nil {
		t.Fatal(err)
	}
	expect(t, "enabled", g.send(nk.Key, `{"token":"t"}`), 200, `{"ok":true}`)
	if err := k.Revoke(nk.ID); err != nil {
		t.Fatal(err)
	}
	if err := k.Revoke(nk.ID); !errors.Is(err, pushgw.ErrUnknownKey) {
		t.Errorf("second revoke: %v", err)
	}
	expect(t, "revoked", g.send(nk.Key, `{"token":"t"}`), 401, errBody("invalid api key"))
}

// adminServer serves pushgw.Admin behind an admin-token check, as the
// admin listener does, and writes the token where the command finds it.
func adminServer(t *testing.T, dataDir string, a *pushgw.Admin) (addr, tokenFile string) {
	t.Helper()
	token := "admin-token-for-tests"
	tokenFile = filepath.Join(dataDir, "admin.token")
	if err := os.WriteFile(tokenFile, []byte(token+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	want := httpx.Hash([]byte(token))
	srv := &fasthttp.Server{Handler: func(ctx *fasthttp.RequestCtx) {
		got := httpx.Hash(httpx.Bearer(ctx))
		if subtle.ConstantTimeCompare(got[:], want[:]) != 1 {
			httpx.Error(ctx, 401, "admin token required")
			return
		}
		a.ServeHTTP(ctx)
	}}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go func() { _ = srv.Serve(ln) }()
	t.Cleanup(func() { _ = srv.Shutdown() })
	return ln.Addr().String(), tokenFile
}

func runCmd(t *testing.T, cfg keycmd.Config, args ...string) (code int, stdout, stderr string) {
	t.Helper()
	var out, errb bytes.Buffer
	code = keycmd.Run(args, cfg, &out, &errb)
	return code, out.String(), errb.String()
}

// Online: the command goes through the running server's admin listener
// (the store is locked by the server, so it could not do otherwise).
func TestKeyCommandOnline(t *testing.T) {
	f := newAPNsFake(t)
	g := startGateway(t, gwOpts{apns: f.client})
	admin := pushgw.NewAdmin(map[string]*pushgw.Keys{pushgw.ProviderAPNs: g.keys})
	addr, tokenFile := adminServer(t, g.dataDir, admin)
	cfg := keycmd.Config{DataDir: g.dataDir, AdminAddr: addr, AdminTokenFile: tokenFile}

	code, out, errOut := runCmd(t, cfg, "create", "--label", "ci runner", "--expires", "720h")
	if code != 0 {
		t.Fatalf("create: %d %s", code, errOut)
	}
	lines := strings.Split(strings.TrimSpace(out), "\n")
	key := lines[len(lines)-1]
	if !hex64.MatchString(key) {
		t.Fatalf("last line %q is not the key", key)
	}
	expect(t, "created online", g.send(key, `{"token":"t"}`), 200, `{"ok":true}`)

	code, out, _ = runCmd(t, cfg, "list")
	if code != 0 || !strings.Contains(out, "ci runner") || strings.Contains(out, key) {
		t.Fatalf("list: %d\n%s", code, out)
	}
	list, _ := g.keys.List()
	id := list[0].ID
	if code, _, errOut := runCmd(t, cfg, "disable", "--id", id); code != 0 {
		t.Fatalf("disable: %s", errOut)
	}
	expect(t, "disabled online", g.send(key, `{"token":"t"}`), 401, errBody("invalid api key"))
	if code, _, _ := runCmd(t, cfg, "enable", id); code != 0 {
		t.Fatal("enable")
	}
	if code, out, _ := runCmd(t, cfg, "revoke", id); code != 0 || !strings.Contains(out, "revoked") {
		t.Fatalf("revoke: %s", out)
	}
	expect(t, "revoked online", g.send(key, `{"token":"t"}`), 401, errBody("invalid api key"))
	if code, _, errOut := runCmd(t, cfg, "revoke", id); code != 1 || !strings.Contains(errOut, "unknown key") {
		t.Errorf("revoke unknown: %d %s", code, errOut)
	}
	if code, _, _ := runCmd(t, cfg, "create"); code != 2 {
		t.Error("create without label is not a usage error")
	}
	if code, _, _ := runCmd(t, cfg, "create", "--label", "x", "--expires", "tomorrow"); code != 2 {
		t.Error("bad expiry is not a usage error")
	}
}

// Offline: no server runs, the command opens the store; the server then
// starts and finds the keys.
func TestKeyCommandOffline(t *testing.T) {
	dir := t.TempDir()
	cfg := keycmd.Config{DataDir: dir, AdminAddr: "127.0.0.1:1", AdminTokenFile: filepath.Join(dir, "admin.token")}
	code, out, errOut := runCmd(t, cfg, "create", "--label", "offline", "--expires", "2099-01-01T00:00:00Z")
	if code != 0 {
		t.Fatalf("create: %s", errOut)
	}
	lines := strings.Split(strings.TrimSpace(out), "\n")
	key := lines[len(lines)-1]
	code, out, _ = runCmd(t, cfg, "list")
	if code != 0 || !strings.Contains(out, "offline") || !strings.Contains(out, "2099-01-01T00:00:00Z") {
		t.Fatalf("list: %s", out)
	}

	f := newAPNsFake(t)
	g := startGateway(t, gwOpts{apns: f.client, dataDir: dir})
	expect(t, "offline key", g.send(key, `{"token":"t"}`), 200, `{"ok":true}`)
	list, _ := g.keys.List()
	g.stop()
	if code, _, errOut := runCmd(t, cfg, "revoke", "--id", list[0].ID); code != 0 {
		t.Fatalf("revoke offline: %s", errOut)
	}
	// A stale token file of a killed server: nothing listens, so offline.
	if err := os.WriteFile(cfg.AdminTokenFile, []byte("stale\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if code, out, errOut := runCmd(t, cfg, "list"); code != 0 || strings.Contains(out, "offline") {
		t.Fatalf("list after revoke: %d %s %s", code, out, errOut)
	}
}

// Separate key stores: a key of one mount is unknown to the other, and
// the command names the mount.
func TestSeparateKeyStores(t *testing.T) {
	dir := t.TempDir()
	db, err := store.Open(dir, nil)
	if err != nil {
		t.Fatal(err)
	}
	fcmStore, _ := store.NewPushGateway(db, store.PushScopeFCM)
	apnsStore, _ := store.NewPushGateway(db, store.PushScopeAPNs)
	fc := newFCMFake(t)
	af := newAPNsFake(t)
	clk := newClock()
	gf := startGateway(t, gwOpts{provider: pushgw.ProviderFCM, fcm: fc.client, db: db, store: fcmStore, clock: clk})
	ga := startGateway(t, gwOpts{apns: af.client, db: db, store: apnsStore, clock: clk})
	admin := pushgw.NewAdmin(map[string]*pushgw.Keys{pushgw.ProviderFCM: gf.keys, pushgw.ProviderAPNs: ga.keys})
	addr, tokenFile := adminServer(t, dir, admin)
	cfg := keycmd.Config{DataDir: dir, AdminAddr: addr, AdminTokenFile: tokenFile, Separate: true}

	if code, _, errOut := runCmd(t, cfg, "create", "--label", "x"); code != 1 || !strings.Contains(errOut, "mount") {
		t.Errorf("create without mount: %d %s", code, errOut)
	}
	code, out, errOut := runCmd(t, cfg, "create", "--label", "fcm only", "--mount", "fcm")
	if code != 0 {
		t.Fatal(errOut)
	}
	lines := strings.Split(strings.TrimSpace(out), "\n")
	key := lines[len(lines)-1]
	expect(t, "fcm mount", gf.send(key, `{"token":"t"}`), 200, `{"ok":true}`)
	expect(t, "apns mount", ga.send(key, `{"token":"t"}`), 401, errBody("invalid api key"))
	list, _ := gf.keys.List()
	if code, _, errOut := runCmd(t, cfg, "revoke", list[0].ID); code != 0 {
		t.Fatalf("revoke without mount: %s", errOut)
	}
	expect(t, "revoked", gf.send(key, `{"token":"t"}`), 401, errBody("invalid api key"))
	gf.stop()
	ga.stop()
	_ = ga.h.Drain(t.Context())
	if err := db.Close(); err != nil {
		t.Fatal(err)
	}
}

// Shared key store: one key works on both mounts, and a token claimed on
// one mount is pinned on the other too.
func TestSharedKeyStore(t *testing.T) {
	fc := newFCMFake(t)
	af := newAPNsFake(t)
	ga := startGateway(t, gwOpts{apns: af.client, metered: true, budget: 2})
	gf := startGateway(t, gwOpts{provider: pushgw.ProviderFCM, fcm: fc.client, db: ga.db, store: ga.store, clock: ga.clock, metered: true, budget: 2})
	_, key := ga.newKey("both")
	expect(t, "apns", ga.send(key, `{"token":"a"}`), 200, `{"ok":true}`)
	expect(t, "fcm", gf.send(key, `{"token":"f"}`), 200, `{"ok":true}`)
	// One budget for the whole gateway.
	expect(t, "budget shared", gf.send(key, `{"token":"f"}`), 429,
		`{"error":"relay daily budget exhausted","requestId":"{rid}","window":"day","limit":2,"retryAfterSeconds":43200}`)
}

func TestAdminErrors(t *testing.T) {
	g := startGateway(t, gwOpts{})
	other, err := store.NewPushGateway(g.db, store.PushScopeFCM)
	if err != nil {
		t.Fatal(err)
	}
	separate := pushgw.NewAdmin(map[string]*pushgw.Keys{pushgw.ProviderAPNs: g.keys, pushgw.ProviderFCM: {Store: other}})
	shared := pushgw.NewAdmin(map[string]*pushgw.Keys{pushgw.ProviderAPNs: g.keys, pushgw.ProviderFCM: g.keys})
	off := pushgw.NewAdmin(nil)
	call := func(a *pushgw.Admin, method, uri, body string) (int, string) {
		var ctx fasthttp.RequestCtx
		ctx.Request.Header.SetMethod(method)
		ctx.Request.SetRequestURI(uri)
		ctx.Request.SetBodyString(body)
		a.ServeHTTP(&ctx)
		return ctx.Response.StatusCode(), string(ctx.Response.Body())
	}
	for _, tc := range []struct {
		a            *pushgw.Admin
		method, uri  string
		body         string
		status       int
		bodyContains string
	}{
		{off, "GET", "/v1/keys/push", "", 404, "push gateway is off"},
		{separate, "GET", "/v1/keys/push", "", 400, "mount=fcm"},
		{separate, "GET", "/v1/keys/push?mount=gcm", "", 400, "mount is fcm or apns"},
		{separate, "GET", "/v1/keys/push?mount=fcm", "", 200, "[]"},
		{shared, "GET", "/v1/keys/push", "", 200, "[]"},
		{shared, "GET", "/v1/keys/pushy", "", 404, "not found"},
		{shared, "POST", "/v1/keys/push", "not json", 400, "body must be"},
		{shared, "POST", "/v1/keys/push", `{"label":""}`, 400, "label"},
		{shared, "POST", "/v1/keys/push", `{"label":"x","expiresAt":"2000-01-01T00:00:00Z"}`, 400, "expiry"},
		{shared, "POST", "/v1/keys/push", `{"label":"x"}`, 201, `"key":"`},
		{shared, "PUT", "/v1/keys/push", "", 405, "method"},
		{shared, "DELETE", "/v1/keys/push/nope", "", 404, "unknown key"},
		{shared, "POST", "/v1/keys/push/nope/disable", "", 404, "unknown key"},
		{shared, "GET", "/v1/keys/push/nope", "", 405, "method"},
	} {
		status, body := call(tc.a, tc.method, tc.uri, tc.body)
		if status != tc.status || !strings.Contains(body, tc.bodyContains) {
			t.Errorf("%s %s: %d %s", tc.method, tc.uri, status, body)
		}
	}
}
