package main

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"edgerelay/internal/freeport"
)

// The tests in this file run the relay against a real ACME server:
// letsencrypt/pebble, built from the module (a tool dependency in go.mod),
// started on loopback with a configuration of the test's. Pebble validates
// for real: its VA connects to the name it validates, which a tiny DNS
// server of the test resolves to 127.0.0.1, on the port its configuration
// names (tlsPort for TLS-ALPN-01, httpPort for HTTP-01), where the relay's
// listener is. PEBBLE_VA_ALWAYS_VALID is not set.

// acmeDomain is the name the relay gets certificates for. autocert wants
// two labels at least, so "localhost" cannot be it; .test is reserved
// (RFC 2606) and resolved only by the test's DNS server.
const acmeDomain = "relay.test"

var pebbleBuild struct {
	once   sync.Once
	bin    string // the pebble binary
	module string // pebble's module directory: its test certificates
	err    error
}

// pebbleBinary builds pebble once per test process, next to the relay's
// binary. After `go mod download` it needs no network.
func pebbleBinary(t *testing.T) (bin, module string) {
	t.Helper()
	b := &pebbleBuild
	b.once.Do(func() {
		b.bin = filepath.Join(filepath.Dir(binaryPath), "pebble")
		build := exec.Command("go", "build", "-o", b.bin, "github.com/letsencrypt/pebble/v2/cmd/pebble")
		if out, err := build.CombinedOutput(); err != nil {
			b.err = fmt.Errorf("go build pebble: %v\n%s", err, out)
			return
		}
		// After the build: `go list -m` names no directory for a module
		// not yet in the module cache, and the build fetches it.
		out, err := exec.Command("go", "list", "-m", "-f", "{{.Dir}}", "github.com/letsencrypt/pebble/v2").Output()
		if b.module = strings.TrimSpace(string(out)); err != nil || b.module == "" {
			b.err = fmt.Errorf("go list pebble: %q, %v", b.module, err)
		}
	})
	if b.err != nil {
		t.Fatal(b.err)
	}
	return b.bin, b.module
}

// startDNS serves DNS over TCP on loopback (pebble's -dnsserver asks over
// TCP): every A question is answered 127.0.0.1, every other type with no
// record. It returns the address.
func startDNS(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go serveDNS(c)
		}
	}()
	return ln.Addr().String()
}

// serveDNS answers the length-prefixed queries of one TCP connection.
func serveDNS(c net.Conn) {
	defer c.Close()
	for {
		_ = c.SetDeadline(time.Now().Add(10 * time.Second))
		var n [2]byte
		if _, err := io.ReadFull(c, n[:]); err != nil {
			return
		}
		q := make([]byte, binary.BigEndian.Uint16(n[:]))
		if _, err := io.ReadFull(c, q); err != nil || len(q) < 12 {
			return
		}
		// The question: labels up to the root label, then type and class.
		end := 12
		for end < len(q) && q[end] != 0 {
			end += int(q[end]) + 1
		}
		end += 5
		if end > len(q) {
			return
		}
		qtype := binary.BigEndian.Uint16(q[end-4:])
		resp := append([]byte(nil), q[:2]...)                                // ID
		resp = binary.BigEndian.AppendUint16(resp, 0x8400|uint16(q[2]&1)<<8) // QR, AA, RD as asked
		answers := uint16(0)
		if qtype == 1 { // A
			answers = 1
		}
		resp = binary.BigEndian.AppendUint16(resp, 1)
		resp = binary.BigEndian.AppendUint16(resp, answers)
		resp = append(resp, 0, 0, 0, 0) // no authority, no additional
		resp = append(resp, q[12:end]...)
		if answers == 1 {
			// The name by pointer to the question, A, IN, TTL 0, 127.0.0.1.
			resp = append(resp, 0xc0, 12, 0, 1, 0, 1, 0, 0, 0, 0, 0, 4, 127, 0, 0, 1)
		}
		out := binary.BigEndian.AppendUint16(nil, uint16(len(resp)))
		if _, err := c.Write(append(out, resp...)); err != nil {
			return
		}
	}
}

// pebbleCA is one running pebble.
type pebbleCA struct {
	t         *testing.T
	cmd       *exec.Cmd
	out       *lockedBuffer
	exited    chan struct{}
	directory string // the ACME directory URL
	mgmt      string // management API address
	minica    string // the root of pebble's own HTTPS certificate (RELAY_ACME_CA)
}

// startPebble runs pebble validating TLS-ALPN-01 on tlsPort and HTTP-01 on
// httpPort of 127.0.0.1, issuing certificates valid for validity.
func startPebble(t *testing.T, tlsPort, httpPort int, validity time.Duration) *pebbleCA {
	t.Helper()
	bin, module := pebbleBinary(t)
	p := &pebbleCA{t: t, out: &lockedBuffer{}, exited: make(chan struct{}), mgmt: freeport.TCP(t),
		minica: filepath.Join(module, "test/certs/pebble.minica.pem")}
	listen := freeport.TCP(t)
	p.directory = "https://" + listen + "/dir"
	conf := map[string]any{"pebble": map[string]any{
		"listenAddress":                  listen,
		"managementListenAddress":        p.mgmt,
		"certificate":                    filepath.Join(module, "test/certs/localhost/cert.pem"),
		"privateKey":                     filepath.Join(module, "test/certs/localhost/key.pem"),
		"httpPort":                       httpPort,
		"tlsPort":                        tlsPort,
		"ocspResponderURL":               "",
		"externalAccountBindingRequired": false,
		"keyAlgorithm":                   "ecdsa",
		"profiles": map[string]any{"default": map[string]any{
			"description": "the test's", "validityPeriod": int(validity / time.Second),
		}},
	}}
	raw, _ := json.Marshal(conf)
	path := filepath.Join(t.TempDir(), "pebble.json")
	if err := os.WriteFile(path, raw, 0o600); err != nil {
		t.Fatal(err)
	}
	p.cmd = exec.Command(bin, "-config", path, "-dnsserver", startDNS(t))
	// No sleep before validating, every nonce honoured, every order
	// validated anew (no reuse of an earlier authorization).
	p.cmd.Env = append(os.Environ(), "PEBBLE_VA_NOSLEEP=1", "PEBBLE_WFE_NONCEREJECT=0", "PEBBLE_AUTHZREUSE=0")
	p.cmd.Stdout, p.cmd.Stderr = p.out, p.out
	if err := p.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() { _ = p.cmd.Wait(); close(p.exited) }()
	t.Cleanup(p.stop)
	deadline := time.Now().Add(20 * time.Second)
	for {
		if _, err := p.get("https://" + listen + "/dir"); err == nil {
			return p
		}
		select {
		case <-p.exited:
			t.Fatalf("pebble exited:\n%s", p.out.String())
		default:
		}
		if time.Now().After(deadline) {
			t.Fatalf("pebble did not start:\n%s", p.out.String())
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// get fetches url from pebble's HTTPS, trusting its minica root.
func (p *pebbleCA) get(url string) ([]byte, error) {
	roots := x509.NewCertPool()
	pem, err := os.ReadFile(p.minica)
	if err != nil {
		return nil, err
	}
	roots.AppendCertsFromPEM(pem)
	c := &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: roots}}}
	resp, err := c.Get(url)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err == nil && resp.StatusCode != http.StatusOK {
		err = fmt.Errorf("GET %s: %s", url, resp.Status)
	}
	return body, err
}

// roots is the pool of pebble's issuing root, from its management API
// (regenerated at every start of pebble).
func (p *pebbleCA) roots() *x509.CertPool {
	p.t.Helper()
	pem, err := p.get("https://" + p.mgmt + "/roots/0")
	if err != nil {
		p.t.Fatal(err)
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(pem) {
		p.t.Fatalf("pebble's root is not PEM: %q", pem)
	}
	return pool
}

func (p *pebbleCA) stop() {
	select {
	case <-p.exited:
	default:
		_ = p.cmd.Process.Kill()
		<-p.exited
	}
}

// acmeEnv is the relay's environment for pebble p: every listener off but
// the ones a test turns on.
func acmeEnv(p *pebbleCA, more ...string) []string {
	return append([]string{
		"RELAY_ACME_DOMAINS=" + acmeDomain,
		"RELAY_ACME_DIRECTORY=" + p.directory,
		"RELAY_ACME_CA=" + p.minica,
		"RELAY_ACME_EMAIL=ops@relay.test",
		"RELAY_CHANNEL_LISTEN=", "RELAY_PUSH_FCM_LISTEN=", "RELAY_PUSH_APNS_LISTEN=", "RELAY_AGENT_LISTEN=",
	}, more...)
}

// served is the certificate the listener at addr serves for name, verified
// against roots (so it is also unexpired); the handshake waits while the
// relay obtains it.
func served(t *testing.T, addr, name string, roots *x509.CertPool) *x509.Certificate {
	t.Helper()
	c, err := dialACME(addr, name, roots)
	if err != nil {
		t.Fatalf("TLS to %s for %s: %v", addr, name, err)
	}
	defer c.Close()
	return c.ConnectionState().PeerCertificates[0]
}

func dialACME(addr, name string, roots *x509.CertPool) (*tls.Conn, error) {
	d := &net.Dialer{Timeout: 30 * time.Second}
	return tls.DialWithDialer(d, "tcp", addr, &tls.Config{ServerName: name, RootCAs: roots, NextProtos: []string{"h2", "http/1.1"}})
}

// port is the port of host:port.
func port(t *testing.T, addr string) int {
	t.Helper()
	_, p, err := net.SplitHostPort(addr)
	if err != nil {
		t.Fatal(err)
	}
	n, _ := strconv.Atoi(p)
	return n
}

var turnsLine = regexp.MustCompile(`turns: on (\S+)`)

// TestACMECertificateIssuedForEveryListener: the agent listener (TLS 1.3
// only) answers pebble's TLS-ALPN-01 challenge, and the certificate pebble
// issues is served by every listener that takes ACME's: the agent, the
// mailbox and TURN's turns:; it verifies against pebble's issuing root for
// relay.test. A listener set out of ACME stays plain, the cache is 0700.
func TestACMECertificateIssuedForEveryListener(t *testing.T) {
	t.Parallel()
	agentAddr := freeport.TCP(t)
	p := startPebble(t, port(t, agentAddr), port(t, freeport.TCP(t)), 90*24*time.Hour)
	s := startServer(t, acmeEnv(p,
		"RELAY_AGENT_LISTEN="+agentAddr,
		"RELAY_CHANNEL_LISTEN=127.0.0.1:0", "RELAY_CHANNEL_TLS_CERT=", // kept out: plain
		"RELAY_TURN_LISTEN=127.0.0.1:0", "RELAY_TURN_SECRET=acme-turn-secret",
	)...)
	roots := p.roots()

	leaf := served(t, s.addrs["agent"], acmeDomain, roots)
	if len(leaf.DNSNames) != 1 || leaf.DNSNames[0] != acmeDomain {
		t.Fatalf("certificate for %q, want [%s]", leaf.DNSNames, acmeDomain)
	}
	if life := leaf.NotAfter.Sub(leaf.NotBefore); life < 89*24*time.Hour {
		t.Fatalf("certificate valid for %v: not pebble's", life)
	}
	c, err := dialACME(s.addrs["agent"], acmeDomain, roots)
	if err != nil {
		t.Fatal(err)
	}
	if st := c.ConnectionState(); st.Version != tls.VersionTLS13 || st.NegotiatedProtocol != "http/1.1" {
		t.Fatalf("agent listener: TLS %x, ALPN %q", st.Version, st.NegotiatedProtocol)
	}
	c.Close()
	// The agent listener stays TLS 1.3 only for clients.
	if c, err := tls.Dial("tcp", s.addrs["agent"], &tls.Config{ServerName: acmeDomain, RootCAs: roots, MaxVersion: tls.VersionTLS12}); err == nil {
		c.Close()
		t.Fatal("agent listener accepted TLS 1.2")
	}

	var turns string
	for _, line := range s.stdout {
		if m := turnsLine.FindStringSubmatch(line); m != nil {
			turns = m[1]
		}
	}
	if turns == "" {
		t.Fatalf("no turns: listener in\n%s", strings.Join(s.stdout, "\n"))
	}
	for name, addr := range map[string]string{"mailbox": s.addrs["mailbox"], "turns": turns} {
		if got := served(t, addr, acmeDomain, roots); !got.Equal(leaf) {
			t.Errorf("%s serves serial %x, the agent %x", name, got.SerialNumber, leaf.SerialNumber)
		}
	}
	// HTTP goes on over the ACME listeners (acme-tls/1 is only offered
	// beside http/1.1).
	hc := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{
		TLSClientConfig: &tls.Config{ServerName: acmeDomain, RootCAs: roots},
		DialContext: func(ctx context.Context, network, _ string) (net.Conn, error) {
			return (&net.Dialer{}).DialContext(ctx, network, s.addrs["mailbox"])
		},
	}}
	resp, err := hc.Get("https://" + acmeDomain + "/no-such-path")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusNotFound || resp.Proto != "HTTP/1.1" {
		t.Fatalf("mailbox over ACME TLS: %s %s, want 404 HTTP/1.1", resp.Proto, resp.Status)
	}

	// A name not listed gets no certificate (and no order).
	if c, err := dialACME(s.addrs["mailbox"], "other.test", nil); err == nil {
		c.Close()
		t.Fatal("handshake for other.test succeeded")
	}
	// A client without a server name (it dialed an IP address) gets the
	// first domain's.
	c, err = tls.Dial("tcp", s.addrs["mailbox"], &tls.Config{InsecureSkipVerify: true})
	if err != nil {
		t.Fatal(err)
	}
	if got := c.ConnectionState().PeerCertificates[0]; !got.Equal(leaf) {
		t.Errorf("without SNI: serial %x, want %x", got.SerialNumber, leaf.SerialNumber)
	}
	c.Close()

	// The listener set out of ACME is plain HTTP.
	if !slicesContainsPrefix(s.stdout, "channel:  listening on http://") {
		t.Errorf("channel not plain:\n%s", strings.Join(s.stdout, "\n"))
	}
	for _, dir := range []string{filepath.Join(s.dataDir, "acme"), acmeCache(t, s.dataDir)} {
		if fi, err := os.Stat(dir); err != nil || fi.Mode().Perm() != 0o700 {
			t.Errorf("%s: %v %v, want 0700", dir, fi.Mode(), err)
		}
	}
	if _, err := os.Stat(filepath.Join(acmeCache(t, s.dataDir), acmeDomain)); err != nil {
		t.Errorf("certificate not cached: %v", err)
	}
	if !strings.Contains(s.stderr.String(), `"msg":"acme: certificate stored"`) {
		t.Errorf("no log line for the certificate:\n%s", s.stderr.String())
	}
}

func slicesContainsPrefix(lines []string, prefix string) bool {
	for _, l := range lines {
		if strings.HasPrefix(l, prefix) {
			return true
		}
	}
	return false
}

// acmeCache is the one CA directory under <data dir>/acme.
func acmeCache(t *testing.T, dataDir string) string {
	t.Helper()
	entries, err := os.ReadDir(filepath.Join(dataDir, "acme"))
	if err != nil || len(entries) != 1 {
		t.Fatalf("acme cache: %v %v", entries, err)
	}
	return filepath.Join(dataDir, "acme", entries[0].Name())
}

// TestACMERenewsWithoutRestart: with certificates pebble makes valid for
// 12 s, the relay renews (a third of the lifetime before the end) while it
// runs: the mailbox listener serves a new serial, each certificate
// verified and unexpired when served.
func TestACMERenewsWithoutRestart(t *testing.T) {
	t.Parallel()
	mailboxAddr := freeport.TCP(t)
	p := startPebble(t, port(t, mailboxAddr), port(t, freeport.TCP(t)), 12*time.Second)
	s := startServer(t, acmeEnv(p, "RELAY_MAILBOX_LISTEN="+mailboxAddr)...)
	roots := p.roots()
	first := served(t, mailboxAddr, acmeDomain, roots)
	if life := first.NotAfter.Sub(first.NotBefore); life > 12*time.Second {
		t.Fatalf("certificate valid for %v, want at most 12s", life)
	}
	// An open connection keeps its certificate across the renewal.
	old, err := dialACME(mailboxAddr, acmeDomain, roots)
	if err != nil {
		t.Fatal(err)
	}
	defer old.Close()
	deadline := time.Now().Add(25 * time.Second)
	for {
		got := served(t, mailboxAddr, acmeDomain, roots) // fails on an expired one
		if !got.Equal(first) {
			if !got.NotBefore.After(first.NotBefore) && !got.NotAfter.After(first.NotAfter) {
				t.Fatalf("renewed certificate %v..%v is not newer than %v..%v", got.NotBefore, got.NotAfter, first.NotBefore, first.NotAfter)
			}
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("no renewal within 25 s:\n%s", s.stderr.String())
		}
		time.Sleep(100 * time.Millisecond)
	}
	if n := strings.Count(s.stderr.String(), `"msg":"acme: certificate stored"`); n < 2 {
		t.Errorf("%d certificates stored, want 2 at least", n)
	}
	if got := old.ConnectionState().PeerCertificates[0]; !got.Equal(first) {
		t.Error("the open connection's certificate changed")
	}
}

// TestACMECachedCertificateSurvivesRestart: the certificate obtained is
// served again after a restart with the CA gone, so without a new order.
func TestACMECachedCertificateSurvivesRestart(t *testing.T) {
	t.Parallel()
	mailboxAddr := freeport.TCP(t)
	p := startPebble(t, port(t, mailboxAddr), port(t, freeport.TCP(t)), 90*24*time.Hour)
	s := startServer(t, acmeEnv(p, "RELAY_MAILBOX_LISTEN="+mailboxAddr)...)
	roots := p.roots()
	first := served(t, mailboxAddr, acmeDomain, roots)

	p.stop()
	if code := s.signal(syscall.SIGTERM, 10*time.Second); code != 0 {
		t.Fatalf("SIGTERM: exit %d\n%s", code, s.stderr.String())
	}
	s.start()
	if got := served(t, mailboxAddr, acmeDomain, roots); !got.Equal(first) {
		t.Fatalf("after the restart serial %x, want %x", got.SerialNumber, first.SerialNumber)
	}
	for _, msg := range []string{"acme: certificate stored", "acme: no certificate"} {
		if strings.Contains(s.stderr.String(), msg) {
			t.Errorf("after the restart the log says %q:\n%s", msg, s.stderr.String())
		}
	}
}

// TestACMEHTTP01: with nothing on pebble's TLS-ALPN-01 port, the
// certificate comes through HTTP-01, answered on RELAY_ACME_HTTP_LISTEN;
// other requests there are redirected to https.
func TestACMEHTTP01(t *testing.T) {
	t.Parallel()
	httpAddr := freeport.TCP(t)
	nothing := freeport.TCP(t) // handed out once and never listened on
	p := startPebble(t, port(t, nothing), port(t, httpAddr), 90*24*time.Hour)
	s := startServer(t, acmeEnv(p, "RELAY_ACME_HTTP_LISTEN="+httpAddr)...)
	if s.addrs["acme"] != httpAddr {
		t.Fatalf("acme listener at %q, want %s:\n%s", s.addrs["acme"], httpAddr, strings.Join(s.stdout, "\n"))
	}
	roots := p.roots()
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("relay:\n%s\npebble:\n%s", s.stderr.String(), p.out.String())
		}
	})
	leaf := served(t, s.addrs["mailbox"], acmeDomain, roots)
	if len(leaf.DNSNames) != 1 || leaf.DNSNames[0] != acmeDomain {
		t.Fatalf("certificate for %q", leaf.DNSNames)
	}
	want := fmt.Sprintf("Attempting to validate w/ HTTP: http://%s:%d/.well-known/acme-challenge/", acmeDomain, port(t, httpAddr))
	if !strings.Contains(p.out.String(), want) {
		t.Errorf("pebble did not validate over HTTP-01:\n%s", p.out.String())
	}

	noRedirect := &http.Client{Timeout: 5 * time.Second, CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
	resp, err := noRedirect.Get("http://" + httpAddr + "/v1/x?y=1")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusFound || resp.Header.Get("Location") != "https://127.0.0.1:443/v1/x?y=1" {
		t.Fatalf("GET: %s Location %q", resp.Status, resp.Header.Get("Location"))
	}
	resp, err = noRedirect.Post("http://"+httpAddr+"/v1/x", "text/plain", strings.NewReader("x"))
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusBadRequest {
		t.Fatalf("POST: %s, want 400", resp.Status)
	}
	// A challenge path: for a name not listed 403, an unknown token 404.
	for host, want := range map[string]int{"127.0.0.1": http.StatusForbidden, acmeDomain: http.StatusNotFound} {
		req, _ := http.NewRequest(http.MethodGet, "http://"+httpAddr+"/.well-known/acme-challenge/unknown", nil)
		req.Host = host
		resp, err = noRedirect.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != want {
			t.Errorf("challenge path for host %s: %s, want %d", host, resp.Status, want)
		}
	}
}

// TestACMERefusals: ACME and a certificate file for one listener, a name
// the CA cannot validate, and ACME settings without domains stop serve
// with exit 2 and a message naming the settings.
func TestACMERefusals(t *testing.T) {
	t.Parallel()
	base := []string{"RELAY_DATA_DIR=" + t.TempDir(), "RELAY_ADMIN_LISTEN=", "RELAY_CHANNEL_LISTEN=", "RELAY_PUSH_FCM_LISTEN=",
		"RELAY_PUSH_APNS_LISTEN=", "RELAY_AGENT_LISTEN=", "RELAY_TURN_LISTEN=", "RELAY_MAILBOX_LISTEN=127.0.0.1:0"}
	for _, c := range []struct {
		env  []string
		want []string
	}{
		{[]string{"RELAY_ACME_DOMAINS=relay.test", "RELAY_MAILBOX_TLS_CERT=/m.crt", "RELAY_MAILBOX_TLS_KEY=/m.key"},
			[]string{"RELAY_ACME_DOMAINS and RELAY_MAILBOX_TLS_CERT both give the mailbox listener its certificate"}},
		{[]string{"RELAY_ACME_DOMAINS=relay.test", "RELAY_TLS_CERT=/a.crt", "RELAY_TLS_KEY=/a.key"},
			[]string{"RELAY_ACME_DOMAINS and RELAY_TLS_CERT both give the", "mailbox"}},
		{[]string{"RELAY_ACME_DOMAINS=localhost"}, []string{`RELAY_ACME_DOMAINS: "localhost" has one label`}},
		{[]string{"RELAY_ACME_DOMAINS=*.relay.test"}, []string{`RELAY_ACME_DOMAINS: "*.relay.test" is a wildcard`}},
		{[]string{"RELAY_ACME_HTTP_LISTEN=:80"}, []string{"RELAY_ACME_HTTP_LISTEN apply to RELAY_ACME_DOMAINS, which is not set"}},
		{[]string{"RELAY_ACME_DOMAINS=relay.test", "RELAY_MAILBOX_TLS_CERT="}, []string{"RELAY_ACME_DOMAINS is set but no listener takes its certificates"}},
	} {
		_, errOut, code := edgerelay(t, mergeEnv(base, c.env), "serve")
		if code != 2 {
			t.Errorf("%q: exit %d, want 2: %s", c.env, code, errOut)
			continue
		}
		for _, w := range c.want {
			if !strings.Contains(errOut, w) {
				t.Errorf("%q: %q lacks %q", c.env, errOut, w)
			}
		}
	}
	// A RELAY_ACME_CA that holds no certificate stops the start (exit 1,
	// like any other start-up failure) before any listener opens.
	bad := filepath.Join(t.TempDir(), "ca.pem")
	if err := os.WriteFile(bad, []byte("not a certificate"), 0o600); err != nil {
		t.Fatal(err)
	}
	_, errOut, code := edgerelay(t, mergeEnv(base, []string{"RELAY_ACME_DOMAINS=relay.test", "RELAY_ACME_CA=" + bad}), "serve")
	if code != 1 || !strings.Contains(errOut, "RELAY_ACME_CA: "+bad+" holds no PEM certificate") {
		t.Errorf("bad RELAY_ACME_CA: exit %d: %s", code, errOut)
	}
}

// TestACMETurnsListenPort: the turns: port keeps the standard ports'
// distance from TURN's, up to the last port that leaves room for it.
func TestACMETurnsListenPort(t *testing.T) {
	for addr, want := range map[string]string{
		"127.0.0.1:3478": "127.0.0.1:5349",
		":3479":          ":5350",
		"[::1]:0":        "[::1]:0",
		"0.0.0.0:63664":  "0.0.0.0:65535",
		"0.0.0.0:1000":   "0.0.0.0:2871",
	} {
		if got, err := turnsListen(addr); err != nil || got != want {
			t.Errorf("%s: %q %v, want %s", addr, got, err, want)
		}
	}
	if got, err := turnsListen("0.0.0.0:63665"); err == nil || !strings.Contains(err.Error(), "RELAY_TURN_LISTEN=0.0.0.0:63665: its turns: port would be 65536") {
		t.Errorf("63665: %q %v", got, err)
	}
}
