package main

import (
	"crypto/hmac"
	"crypto/sha1"
	"encoding/base64"
	"encoding/json"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// demoDir is a stand-in for a built sdk/js: dist/index.js and the chat
// example's page, and a file beside the directory that must never be
// served.
func demoDir(t *testing.T) string {
	t.Helper()
	root := t.TempDir()
	dir := filepath.Join(root, "js")
	for name, body := range map[string]string{
		"dist/index.js":             "export const demo = 1;\n",
		"examples/chat/index.html":  "<!doctype html><title>chat</title>\n",
		"../outside-the-demo.txt":   "private\n",
		"examples/chat/../note.txt": "note\n",
	} {
		p := filepath.Join(dir, name)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return dir
}

var turnLine = regexp.MustCompile(`^turn:\s+listening on udp\+tcp (\S+),`)

// TestDemoServesEveryServiceOnFirstStart: RELAY_DEMO alone gives a
// newcomer a mailbox app with signal and ice, a TURN server whose secret
// was generated into the data dir (0600, kept across restarts), ice
// credentials that name TURN's real port and verify under that secret,
// CORS for the demo origin, and the example app on its own origin.
func TestDemoServesEveryServiceOnFirstStart(t *testing.T) {
	dir := demoDir(t)
	s := startServer(t, "RELAY_DEMO=true", "RELAY_DEMO_DIR="+dir, "RELAY_DEMO_LISTEN=127.0.0.1:0", "RELAY_TURN_LISTEN=127.0.0.1:0")

	secretPath := filepath.Join(s.dataDir, "turn.secret")
	st, err := os.Stat(secretPath)
	if err != nil {
		t.Fatalf("no generated TURN secret: %v", err)
	}
	if st.Mode().Perm() != 0o600 {
		t.Fatalf("turn.secret mode %v, want 0600", st.Mode().Perm())
	}
	raw, _ := os.ReadFile(secretPath)
	secret := strings.TrimSpace(string(raw))
	if !regexp.MustCompile(`^[0-9a-f]{64}$`).MatchString(secret) {
		t.Fatalf("turn.secret %q is not 32 bytes of hex", secret)
	}
	var turnAddr string
	for _, line := range s.stdout {
		if m := turnLine.FindStringSubmatch(line); m != nil {
			turnAddr = m[1]
		}
	}
	if turnAddr == "" || strings.HasSuffix(turnAddr, ":0") {
		t.Fatalf("no TURN address in the start-up lines: %v", s.stdout)
	}

	// The demo app, with ice naming TURN's port and a credential under
	// the generated secret.
	base := s.origin("mailbox") + "/v1/demo/mailbox/demo-e2e-mailbox-000001"
	tok := "demo-e2e-token-0123456789"
	if code := mailboxDo(t, "PUT", base, tok, nil); code != 201 {
		t.Fatalf("claim in the demo app: %d", code)
	}
	body, code := mailboxGet(t, base+"/ice", tok)
	if code != 200 {
		t.Fatalf("ice: %d %s", code, body)
	}
	var ice iceAnswer
	if err := json.Unmarshal(body, &ice); err != nil || len(ice.ICEServers) != 2 {
		t.Fatalf("ice answer %s", body)
	}
	turnSrv := ice.ICEServers[1]
	if turnSrv.URLs[0] != "turn:"+turnAddr+"?transport=udp" {
		t.Fatalf("ice names %v, TURN listens on %s", turnSrv.URLs, turnAddr)
	}
	mac := hmac.New(sha1.New, []byte(secret))
	mac.Write([]byte(turnSrv.Username))
	if want := base64.StdEncoding.EncodeToString(mac.Sum(nil)); turnSrv.Credential != want {
		t.Fatalf("credential %q is not HMAC-SHA1(turn.secret, username) %q", turnSrv.Credential, want)
	}

	// CORS: the demo origin is allowed, another is not.
	demoOrigin := "http://" + s.addrs["demo"]
	if got := preflight(t, base, demoOrigin); got != demoOrigin {
		t.Fatalf("preflight from the demo origin: Access-Control-Allow-Origin %q", got)
	}
	if got := preflight(t, base, "http://127.0.0.1:1"); got != "" {
		t.Fatalf("preflight from an unlisted origin allowed: %q", got)
	}

	// The demo origin serves the SDK's directory and nothing outside it.
	noRedirect := &http.Client{CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
	resp, err := noRedirect.Get(demoOrigin + "/")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusFound || !strings.HasSuffix(resp.Header.Get("Location"), "/examples/chat/") {
		t.Fatalf("GET / answered %d Location %q", resp.StatusCode, resp.Header.Get("Location"))
	}
	got, ctype, code := getFile(t, demoOrigin+"/dist/index.js")
	if code != 200 || got != "export const demo = 1;\n" || !strings.Contains(ctype, "javascript") {
		t.Fatalf("GET /dist/index.js: %d %q %q", code, ctype, got)
	}
	if got, _, code := getFile(t, demoOrigin+"/examples/chat/"); code != 200 || !strings.Contains(got, "<title>chat</title>") {
		t.Fatalf("GET /examples/chat/: %d %q", code, got)
	}
	for _, path := range []string{"/../outside-the-demo.txt", "/%2e%2e/outside-the-demo.txt", "/..%2foutside-the-demo.txt"} {
		if got, _, _ := getFile(t, demoOrigin+path); strings.Contains(got, "private") {
			t.Fatalf("GET %s served a file outside the demo directory", path)
		}
	}

	// A restart keeps the secret: credentials minted before stay valid.
	s.kill()
	s.start()
	again, _ := os.ReadFile(secretPath)
	if string(again) != string(raw) {
		t.Fatal("a restart replaced the generated TURN secret")
	}
}

// TestDemoRefusedOffLoopback: the demo lets TURN relay to loopback
// addresses and serves a development tree, so a listener reachable from
// elsewhere refuses the start (exit 2, naming the setting).
func TestDemoRefusedOffLoopback(t *testing.T) {
	for _, kv := range []string{"RELAY_MAILBOX_LISTEN=0.0.0.0:0", "RELAY_DEMO_LISTEN=:8088", "RELAY_TURN_LISTEN=0.0.0.0:3478"} {
		env := []string{"RELAY_DATA_DIR=" + t.TempDir(), "RELAY_DEMO=1", "RELAY_DEMO_DIR=" + demoDir(t), kv}
		_, stderr, code := edgerelay(t, env, "serve")
		name, _, _ := strings.Cut(kv, "=")
		if code != 2 || !strings.Contains(stderr, name) || !strings.Contains(stderr, "not a loopback address") {
			t.Fatalf("%s: exit %d\n%s", kv, code, stderr)
		}
	}
}

// TestDemoWithoutBuiltSDK: the relay runs, and says how to build the app.
func TestDemoWithoutBuiltSDK(t *testing.T) {
	s := startServer(t, "RELAY_DEMO=1", "RELAY_DEMO_DIR="+t.TempDir(), "RELAY_DEMO_LISTEN=127.0.0.1:0")
	if !hasLine(s.stdout, "demo:", "make js") {
		t.Fatalf("no demo line naming make js: %v", s.stdout)
	}
	if !hasLine(s.stdout, "mailbox:", "apps demo") {
		t.Fatalf("the demo app is not served: %v", s.stdout)
	}
}

// TestNoDemoByDefault: without RELAY_DEMO nothing of it happens: no apps,
// no TURN without a secret, no secret file, no demo listener.
func TestNoDemoByDefault(t *testing.T) {
	s := startServer(t, "RELAY_TURN_LISTEN=127.0.0.1:0", "RELAY_DEMO_DIR="+demoDir(t), "RELAY_DEMO_LISTEN=127.0.0.1:0")
	if _, err := os.Stat(filepath.Join(s.dataDir, "turn.secret")); err == nil {
		t.Fatal("a TURN secret was generated without RELAY_DEMO")
	}
	if !hasLine(s.stdout, "mailbox:", "no apps") || !hasLine(s.stdout, "turn:", "off: set RELAY_TURN_SECRET") {
		t.Fatalf("production defaults changed: %v", s.stdout)
	}
	if s.addrs["demo"] != "" || hasLine(s.stdout, "demo:", "") {
		t.Fatalf("a demo listener without RELAY_DEMO: %v", s.stdout)
	}
}

func hasLine(lines []string, prefix, part string) bool {
	for _, l := range lines {
		if strings.HasPrefix(l, prefix) && strings.Contains(l, part) {
			return true
		}
	}
	return false
}

// preflight sends a CORS preflight for a claim and returns the answer's
// Access-Control-Allow-Origin.
func preflight(t *testing.T, url, origin string) string {
	t.Helper()
	req, _ := http.NewRequest("OPTIONS", url, nil)
	req.Header.Set("Origin", origin)
	req.Header.Set("Access-Control-Request-Method", "PUT")
	req.Header.Set("Access-Control-Request-Headers", "authorization")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	return resp.Header.Get("Access-Control-Allow-Origin")
}
