package main

import (
	"bytes"
	"context"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"encoding/hex"
	"encoding/json"
	"errors"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/fasthttp/websocket"

	"edgerelay/fastpath/tlsconf"
	"edgerelay/internal/freeport"
	"edgerelay/sdk/channelcheck"
)

func randHex(t *testing.T) string {
	t.Helper()
	var b [32]byte
	if _, err := rand.Read(b[:]); err != nil {
		t.Fatal(err)
	}
	return hex.EncodeToString(b[:])
}

func claim(t *testing.T, origin, key string) (status int, owner, phone string) {
	t.Helper()
	owner, phone = randHex(t), randHex(t)
	body, _ := json.Marshal(map[string]string{"ownerToken": owner, "phoneToken": phone})
	req, _ := http.NewRequest("POST", origin+"/claim", bytes.NewReader(body))
	req.Header.Set("Authorization", "Bearer "+key)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	return resp.StatusCode, owner, phone
}

func statusOf(t *testing.T, origin, owner string) (int, string) {
	t.Helper()
	req, _ := http.NewRequest("GET", origin+"/status", nil)
	req.Header.Set("Authorization", "Bearer "+owner)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var b bytes.Buffer
	_, _ = b.ReadFrom(resp.Body)
	return resp.StatusCode, b.String()
}

// TestDefaultConfigurationAnswersHealth is `make run`: no setting but the
// data dir, so every listener takes its documented default address.
func TestDefaultConfigurationAnswersHealth(t *testing.T) {
	dir := t.TempDir()
	s := &relayProc{t: t, env: []string{"RELAY_DATA_DIR=" + dir}, dataDir: dir}
	s.start()
	t.Cleanup(s.kill)
	if s.addrs["channel"] != "127.0.0.1:8081" || s.addrs["admin"] != "127.0.0.1:9090" {
		t.Fatalf("default addresses %v", s.addrs)
	}
	joined := strings.Join(s.stdout, "\n")
	if !strings.Contains(joined, "edgerelay keys channel add --host NAME") {
		t.Fatalf("start-up lines do not say how to add a claim key:\n%s", joined)
	}
	code, body := get(t, "http://127.0.0.1:8081/health")
	if code != 200 || !strings.Contains(body, `"botharness-private-v2"`) {
		t.Fatalf("health %d %s", code, body)
	}
	for _, p := range []string{"/healthz", "/readyz", "/metrics"} {
		if code, _ := get(t, "http://127.0.0.1:9090"+p); code != 200 {
			t.Fatalf("%s: %d", p, code)
		}
	}
	if code := s.signal(syscall.SIGTERM, 10*time.Second); code != 0 {
		t.Fatalf("exit %d", code)
	}
}

func TestKeysCommandsOnlineAndOffline(t *testing.T) {
	dir := t.TempDir()
	env := []string{"RELAY_DATA_DIR=" + dir}

	// Stopped server: the command opens the store itself.
	out, errOut, code := edgerelay(t, env, "keys", "channel", "add", "--host", "alpha")
	if code != 0 {
		t.Fatalf("offline add: %d %s", code, errOut)
	}
	keyA := lastLine(out)
	if len(keyA) != 64 || strings.Trim(keyA, "0123456789abcdef") != "" {
		t.Fatalf("last line is not a claim key: %q", keyA)
	}
	if _, _, code := edgerelay(t, env, "keys", "channel", "add", "--host", "alpha"); code == 0 {
		t.Fatal("duplicate host accepted")
	}
	if _, _, code := edgerelay(t, env, "keys", "channel", "add", "--host", "bad host!"); code == 0 {
		t.Fatal("bad host name accepted")
	}

	s := startServer(t, env...)
	adminEnv := append(env, "RELAY_ADMIN_LISTEN="+s.addrs["admin"])
	out, errOut, code = edgerelay(t, adminEnv, "keys", "channel", "add", "--host", "beta")
	if code != 0 {
		t.Fatalf("online add: %d %s", code, errOut)
	}
	keyB := lastLine(out)
	if len(keyB) != 64 {
		t.Fatalf("online key %q", keyB)
	}
	origin := s.origin("channel")
	if st, _, _ := claim(t, origin, keyA); st != 200 {
		t.Fatalf("claim A: %d", st)
	}
	st, ownerB, _ := claim(t, origin, keyB)
	if st != 200 {
		t.Fatalf("claim B: %d", st)
	}
	ctl, _, err := websocket.DefaultDialer.Dial("ws://"+s.addrs["channel"]+"/host", http.Header{"Authorization": {"Bearer " + ownerB}})
	if err != nil {
		t.Fatal(err)
	}
	defer ctl.Close()

	out, _, code = edgerelay(t, adminEnv, "keys", "channel", "list")
	if code != 0 || !strings.Contains(out, "alpha") || !strings.Contains(out, "beta") {
		t.Fatalf("list: %d\n%s", code, out)
	}
	if !regexpLine(out, `beta\s+true\s+true\s+true`) {
		t.Fatalf("list does not show beta used, claimed and connected:\n%s", out)
	}
	if strings.Contains(out, keyA) || strings.Contains(out, keyB) {
		t.Fatal("list shows a key")
	}

	// Revoking online disconnects the computer and forgets its tokens.
	if _, errOut, code := edgerelay(t, adminEnv, "keys", "channel", "revoke", "--host", "beta"); code != 0 {
		t.Fatalf("revoke: %s", errOut)
	}
	_ = ctl.SetReadDeadline(time.Now().Add(10 * time.Second))
	if _, _, err := ctl.ReadMessage(); !websocket.IsCloseError(err, 1000) {
		t.Fatalf("control socket after revoke: %v", err)
	}
	if st, _ := statusOf(t, origin, ownerB); st != 404 {
		t.Fatalf("status after revoke: %d", st)
	}
	if _, _, code := edgerelay(t, adminEnv, "keys", "channel", "revoke", "--host", "nobody"); code == 0 {
		t.Fatal("revoking an unknown host succeeded")
	}
	// The server's log never holds a key.
	if strings.Contains(s.stderr.String(), keyA) || strings.Contains(s.stderr.String(), keyB) {
		t.Fatal("a claim key reached the log")
	}

	if code := s.signal(syscall.SIGTERM, 10*time.Second); code != 0 {
		t.Fatalf("exit %d", code)
	}
	out, _, code = edgerelay(t, env, "keys", "channel", "list")
	if code != 0 || !strings.Contains(out, "alpha") || strings.Contains(out, "beta") {
		t.Fatalf("offline list after stop: %d\n%s", code, out)
	}
}

func regexpLine(text, pattern string) bool {
	for _, l := range strings.Split(text, "\n") {
		if ok, _ := regexpMatch(pattern, l); ok {
			return true
		}
	}
	return false
}

func TestClaimsSurviveHardRestart(t *testing.T) {
	dir := t.TempDir()
	env := []string{"RELAY_DATA_DIR=" + dir, "RELAY_CHANNEL_LISTEN=" + freeport.TCP(t)}
	out, _, _ := edgerelay(t, env, "keys", "channel", "add", "--host", "alpha")
	key := lastLine(out)
	s := startServer(t, env...)
	origin := s.origin("channel")
	st, owner, _ := claim(t, origin, key)
	if st != 200 {
		t.Fatalf("claim %d", st)
	}
	for range 3 {
		s.restartHard()
		if st, _, _ := claim(t, origin, key); st != 409 {
			t.Fatalf("claim after restart: %d", st)
		}
		if st, body := statusOf(t, origin, owner); st != 200 || !strings.Contains(body, `"host":"alpha"`) {
			t.Fatalf("status after restart: %d %s", st, body)
		}
	}
}

func TestBootstrapSecretIsTheDefaultComputer(t *testing.T) {
	dir := t.TempDir()
	key := randHex(t)
	if err := os.WriteFile(filepath.Join(dir, "bootstrap.secret"), []byte(key+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	s := startServer(t, "RELAY_DATA_DIR="+dir)
	origin := s.origin("channel")
	st, owner, _ := claim(t, origin, key)
	if st != 200 {
		t.Fatalf("claim with bootstrap key: %d", st)
	}
	if _, body := statusOf(t, origin, owner); !strings.Contains(body, `"host":"default"`) {
		t.Fatalf("status %s", body)
	}
	// A restart with the same file keeps the key used.
	s.restartHard()
	if st, _, _ := claim(t, s.origin("channel"), key); st != 409 {
		t.Fatalf("after restart: %d", st)
	}
}

func TestSIGTERMDrainsWebSocketsWith1001(t *testing.T) {
	dir := t.TempDir()
	env := []string{"RELAY_DATA_DIR=" + dir}
	out, _, _ := edgerelay(t, env, "keys", "channel", "add", "--host", "alpha")
	key := lastLine(out)
	s := startServer(t, env...)
	_, owner, phone := claim(t, s.origin("channel"), key)
	ws := "ws://" + s.addrs["channel"]
	ctl, _, err := websocket.DefaultDialer.Dial(ws+"/host", http.Header{"Authorization": {"Bearer " + owner}})
	if err != nil {
		t.Fatal(err)
	}
	defer ctl.Close()
	ph, _, err := websocket.DefaultDialer.Dial(ws+"/botharness-device/channel", http.Header{"Authorization": {"Bearer " + phone}})
	if err != nil {
		t.Fatal(err)
	}
	defer ph.Close()
	_ = ctl.SetReadDeadline(time.Now().Add(10 * time.Second))
	if _, msg, err := ctl.ReadMessage(); err != nil || !strings.Contains(string(msg), `"open"`) {
		t.Fatalf("open: %s %v", msg, err)
	}
	if err := s.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	for _, c := range []*websocket.Conn{ctl, ph} {
		_ = c.SetReadDeadline(time.Now().Add(10 * time.Second))
		for {
			_, _, err := c.ReadMessage()
			if err == nil {
				continue // the phone's close notice may come first
			}
			if !websocket.IsCloseError(err, 1001) {
				t.Fatalf("want close 1001, got %v", err)
			}
			break
		}
	}
	select {
	case <-s.exited:
	case <-time.After(10 * time.Second):
		t.Fatal("no exit after drain")
	}
	if code := s.cmd.ProcessState.ExitCode(); code != 0 {
		t.Fatalf("exit %d\n%s", code, s.stderr.String())
	}
	if _, err := os.Stat(filepath.Join(dir, "admin.token")); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("admin token left behind: %v", err)
	}
}

func TestSIGHUPReloadsCertificate(t *testing.T) {
	dir := t.TempDir()
	certDir := t.TempDir()
	paths, err := tlsconf.EnsureDevCert(certDir, nil)
	if err != nil {
		t.Fatal(err)
	}
	s := startServer(t, "RELAY_DATA_DIR="+dir, "RELAY_CHANNEL_TLS_CERT="+paths.Cert, "RELAY_CHANNEL_TLS_KEY="+paths.Key)
	pool := x509.NewCertPool()
	caPEM, _ := os.ReadFile(paths.CA)
	pool.AppendCertsFromPEM(caPEM)
	dial := func() (*tls.Conn, string) {
		c, err := tls.Dial("tcp", s.addrs["channel"], &tls.Config{RootCAs: pool, ServerName: "127.0.0.1"})
		if err != nil {
			t.Fatal(err)
		}
		return c, c.ConnectionState().PeerCertificates[0].SerialNumber.String()
	}
	old, serial1 := dial()
	defer old.Close()
	if v := old.ConnectionState().Version; v != tls.VersionTLS13 {
		t.Fatalf("TLS version %x", v)
	}
	// A new leaf for the same CA: force regeneration by asking for a new host.
	if _, err := tlsconf.EnsureDevCert(certDir, []string{"relay.test"}); err != nil {
		t.Fatal(err)
	}
	if err := s.cmd.Process.Signal(syscall.SIGHUP); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(10 * time.Second)
	for {
		c, serial2 := dial()
		c.Close()
		if serial2 != serial1 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("certificate not reloaded")
		}
		time.Sleep(20 * time.Millisecond)
	}
	// The connection opened before the reload still works.
	if _, err := old.Write([]byte("GET /health HTTP/1.1\r\nHost: x\r\n\r\n")); err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, 12)
	_ = old.SetReadDeadline(time.Now().Add(5 * time.Second))
	if _, err := old.Read(buf); err != nil || string(buf) != "HTTP/1.1 200" {
		t.Fatalf("old connection: %q %v", buf, err)
	}
}

func TestConformanceAgainstOurRelay(t *testing.T) {
	dir := t.TempDir()
	env := []string{"RELAY_DATA_DIR=" + dir, "RELAY_CHANNEL_LISTEN=" + freeport.TCP(t)}
	var keys [4]string
	for i := range keys {
		out, _, _ := edgerelay(t, env, "keys", "channel", "add", "--host", "host"+string(rune('a'+i)))
		keys[i] = lastLine(out)
	}
	s := startServer(t, env...)

	// The command, as an operator runs it.
	ka, kb := filepath.Join(dir, "a.secret"), filepath.Join(dir, "b.secret")
	_ = os.WriteFile(ka, []byte(keys[0]+"\n"), 0o600)
	_ = os.WriteFile(kb, []byte(keys[1]+"\n"), 0o600)
	out, errOut, code := edgerelay(t, nil, "conformance", "channel", "--origin", s.origin("channel"), "--key-a-file", ka, "--key-b-file", kb)
	if code != 0 || lastLine(out) != "conformance: pass" {
		t.Fatalf("conformance: exit %d\n%s\n%s", code, out, errOut)
	}
	// Run again with the same keys: now both are used, so it must fail.
	out, _, code = edgerelay(t, nil, "conformance", "channel", "--origin", s.origin("channel"), "--key-a-file", ka, "--key-b-file", kb)
	if code == 0 || !strings.Contains(out, "conformance: fail") {
		t.Fatalf("used keys passed: %d\n%s", code, out)
	}

	// The checker with a relay restart in the middle.
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	rep := channelcheck.Run(ctx, channelcheck.Options{
		Origin: s.origin("channel"), KeyA: keys[2], KeyB: keys[3],
		Restart: func(context.Context) error { s.restartHard(); return nil },
	})
	if !rep.Passed() {
		for _, c := range rep.Checks {
			t.Logf("%s: %v", c.Name, c.Err)
		}
		t.Fatal("conformance with restart failed")
	}
}

func TestServeHelpAndBadSettings(t *testing.T) {
	out, _, code := edgerelay(t, nil, "serve", "--help")
	if code != 0 {
		t.Fatalf("help exit %d", code)
	}
	for _, name := range []string{"RELAY_CHANNEL_LISTEN", "--channel-listen", "RELAY_ADMIN_LISTEN", "RELAY_TURN_SECRET", "RELAY_DATA_DIR"} {
		if !strings.Contains(out, name) {
			t.Fatalf("help lacks %s", name)
		}
	}
	_, errOut, code := edgerelay(t, []string{"RELAY_MAX_CONNS=lots"}, "serve")
	if code != 2 || !strings.Contains(errOut, "RELAY_MAX_CONNS") {
		t.Fatalf("bad setting: exit %d: %s", code, errOut)
	}
	_, errOut, code = edgerelay(t, []string{"RELAY_DATA_DIR=" + t.TempDir(), "RELAY_APPS=notes;Bad_App:signal", "RELAY_CHANNEL_LISTEN=", "RELAY_ADMIN_LISTEN=", "RELAY_MAILBOX_LISTEN=127.0.0.1:0"}, "serve")
	if code == 0 || !strings.Contains(errOut, `RELAY_APPS entry "Bad_App:signal"`) {
		t.Fatalf("bad RELAY_APPS: exit %d: %s", code, errOut)
	}
	out, _, code = edgerelay(t, nil, "version")
	if code != 0 || !strings.HasPrefix(out, "edgerelay ") {
		t.Fatalf("version: %d %q", code, out)
	}
	if _, _, code := edgerelay(t, nil, "frobnicate"); code != 2 {
		t.Fatalf("unknown command exit %d", code)
	}
}

func TestListenerLimitsRefuseAndCount(t *testing.T) {
	s := startServer(t, "RELAY_MAX_CONNS=2", "RELAY_MAX_CONNS_PER_IP=2")
	// Caps this low fit any open-files limit: no warning about it.
	if logs := s.stderr.String(); strings.Contains(logs, "open-files limit") {
		t.Fatalf("open-files warning with caps of 2:\n%s", logs)
	}
	var held []net.Conn
	for range 2 {
		c, err := net.Dial("tcp", s.addrs["channel"])
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		held = append(held, c)
	}
	// Wait until the server has accepted both (the gauge says so).
	metric := func(name string) string {
		_, body := get(t, s.origin("admin")+"/metrics")
		for _, l := range strings.Split(body, "\n") {
			if strings.HasPrefix(l, name+" ") {
				return strings.TrimPrefix(l, name+" ")
			}
		}
		return ""
	}
	waitUntil(t, func() bool { return metric(`edgerelay_listener_open_connections{service="channel"}`) == "2" })
	third, err := net.Dial("tcp", s.addrs["channel"])
	if err != nil {
		t.Fatal(err)
	}
	defer third.Close()
	_ = third.SetReadDeadline(time.Now().Add(5 * time.Second))
	if n, err := third.Read(make([]byte, 1)); n != 0 || err == nil {
		t.Fatalf("third connection was served: %d %v", n, err)
	}
	if got := metric(`edgerelay_listener_refused_total{reason="total",service="channel"}`); got != "1" {
		t.Fatalf("refusals counted: %q", got)
	}
	held[0].Close()
	waitUntil(t, func() bool { return metric(`edgerelay_listener_open_connections{service="channel"}`) == "1" })
	if code, _ := get(t, s.origin("channel")+"/health"); code != 200 {
		t.Fatalf("health after a slot freed: %d", code)
	}

	// The admin listener has the same caps: the scrapes above hold one
	// keep-alive connection, one more fills it, the next is refused.
	adminHeld, err := net.Dial("tcp", s.addrs["admin"])
	if err != nil {
		t.Fatal(err)
	}
	defer adminHeld.Close()
	waitUntil(t, func() bool { return metric(`edgerelay_listener_open_connections{service="admin"}`) == "2" })
	over, err := net.Dial("tcp", s.addrs["admin"])
	if err != nil {
		t.Fatal(err)
	}
	defer over.Close()
	_ = over.SetReadDeadline(time.Now().Add(5 * time.Second))
	if n, err := over.Read(make([]byte, 1)); n != 0 || err == nil {
		t.Fatalf("third admin connection was served: %d %v", n, err)
	}
	if got := metric(`edgerelay_listener_refused_total{reason="total",service="admin"}`); got != "1" {
		t.Fatalf("admin refusals counted: %q", got)
	}
}

func waitUntil(t *testing.T, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatal("condition not met in time")
		}
		time.Sleep(10 * time.Millisecond)
	}
}
