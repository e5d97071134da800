package e2e

// The web server of the browser tests: sdk/js's dist/, test/browser/pages/
// and examples/ served statically on a loopback port of their own, so that
// the pages are on another origin than the relay they call, as a web app
// on its own domain is. That is what the browser tests are about: CORS,
// WebSocket subprotocol bearers and WebRTC seen from a real page, not
// from Node, which applies none of a browser's rules.

import (
	"context"
	"crypto/sha256"
	"crypto/tls"
	"crypto/x509"
	"encoding/base64"
	"net"
	"net/http"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"testing"
	"time"
)

// servedPrefixes are the only paths the page server answers: the compiled
// SDK, the test pages and the example app. Everything else (src/, e2e/,
// node_modules/) is 404, so that a page cannot work by accident through a
// file it would not have in a deployment.
var servedPrefixes = []string{"/dist/", "/test/browser/pages/", "/examples/"}

// servePages serves sdk/js on a fresh port of 127.0.0.1 and returns the
// page origin, http://<host>:<port>. host is how the pages' URLs name the
// server ("localhost", or "127.0.0.1" for a second origin): the origin is
// what the browser sends in Origin and what RELAY_CORS_ORIGINS lists. Both
// are secure contexts for Chromium (loopback), which crypto.subtle needs.
func servePages(t *testing.T, host string) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	files := http.FileServer(http.Dir(sdkDir))
	srv := &http.Server{
		ReadHeaderTimeout: 10 * time.Second,
		Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			ok := false
			for _, p := range servedPrefixes {
				ok = ok || strings.HasPrefix(r.URL.Path, p)
			}
			if !ok || strings.Contains(r.URL.Path, "..") {
				http.NotFound(w, r)
				return
			}
			// Each test builds dist/ afresh: never let Chromium keep
			// an older module.
			w.Header().Set("Cache-Control", "no-store")
			files.ServeHTTP(w, r)
		}),
	}
	go func() { _ = srv.Serve(ln) }()
	t.Cleanup(func() { _ = srv.Close() })
	_, port, _ := net.SplitHostPort(ln.Addr().String())
	return "http://" + host + ":" + port
}

// agentSPKI is the base64 SHA-256 of the agent listener's leaf
// certificate's SubjectPublicKeyInfo, what Chromium's
// --ignore-certificate-errors-spki-list takes: the browser then trusts
// that one key (the development certificate, whose CA it does not know)
// and still refuses any other certificate error. The chain is verified
// here against the development CA first, so the pin is the relay's own.
func agentSPKI(t *testing.T, r *relay) string {
	t.Helper()
	conn, err := tls.DialWithDialer(&net.Dialer{Timeout: 10 * time.Second}, "tcp", r.addrs["agent"], agentTLS(t, r))
	if err != nil {
		t.Fatalf("TLS to the agent listener: %v", err)
	}
	defer conn.Close()
	certs := conn.ConnectionState().PeerCertificates
	if len(certs) == 0 {
		t.Fatal("agent listener sent no certificate")
	}
	var leaf *x509.Certificate = certs[0]
	sum := sha256.Sum256(leaf.RawSubjectPublicKeyInfo)
	return base64.StdEncoding.EncodeToString(sum[:])
}

// browserTimeout bounds one run of test/browser/run.mjs (Chromium's start
// included); run.mjs bounds each of its waits far below it.
const browserTimeout = 3 * time.Minute

// runBrowser runs test/browser/run.mjs for one scenario with env added,
// and fails t with everything it printed unless it exits 0 having printed
// "PASS <scenario>" (so that a driver that skipped the scenario does not
// pass). Chromium is run.mjs's child: on the timeout the whole process
// group is killed, so no browser outlives the test.
func runBrowser(t *testing.T, scenario string, env ...string) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), browserTimeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, "node", "--experimental-websocket", "--no-warnings", "test/browser/run.mjs")
	cmd.Dir = sdkDir
	cmd.Env = append(cleanEnv(), append([]string{"BROWSER_SCENARIO=" + scenario}, env...)...)
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	cmd.Cancel = func() error { return syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL) }
	cmd.WaitDelay = 10 * time.Second
	var out lockedBuffer
	cmd.Stdout, cmd.Stderr = &out, &out
	err := cmd.Run()
	if ctx.Err() != nil {
		t.Fatalf("browser scenario %s: no end within %v\n%s", scenario, browserTimeout, out.String())
	}
	if err != nil {
		t.Fatalf("browser scenario %s: %v\n%s", scenario, err, out.String())
	}
	if !strings.Contains(out.String(), "PASS "+scenario+"\n") {
		t.Fatalf("browser scenario %s: exited 0 without PASS\n%s", scenario, out.String())
	}
	t.Logf("run.mjs %s:\n%s", scenario, out.String())
	return out.String()
}

// chromiumPath is the browser the tests drive (Debian's chromium package).
const chromiumPath = "/usr/bin/chromium"

// needChromium fails (not skips: CI installs it, and a skipped browser
// test would hide that it stopped running) when Chromium is missing.
func needChromium(t *testing.T) {
	t.Helper()
	if _, err := os.Stat(chromiumPath); err != nil {
		t.Fatalf("the browser tests need Chromium at %s (Debian package chromium): %v", chromiumPath, err)
	}
	if _, err := os.Stat(sdkDir + "/node_modules/playwright-core"); err != nil {
		t.Fatalf("the browser tests need playwright-core in sdk/js/node_modules (npm ci): %v", err)
	}
}
