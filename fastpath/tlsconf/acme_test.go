package tlsconf

import (
	"bytes"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"log/slog"
	"math/big"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"
)

// The ACME flow itself (orders, challenges, renewal) is tested against a
// real CA, pebble, in cmd/edgerelay/acme_test.go. These tests cover what
// this package adds around autocert.

func TestACMECacheDirPerCA(t *testing.T) {
	for url, want := range map[string]string{
		"https://acme-v02.api.letsencrypt.org/directory":         "acme-v02.api.letsencrypt.org_directory",
		"https://acme-staging-v02.api.letsencrypt.org/directory": "acme-staging-v02.api.letsencrypt.org_directory",
		"https://127.0.0.1:14000/dir":                            "127.0.0.1_14000_dir",
		"https://ca.example/":                                    "ca.example",
		"https://ca.example/../../etc":                           "ca.example_.._.._etc",
	} {
		got, err := ACMECacheDir("/data/acme", url)
		if err != nil || got != filepath.Join("/data/acme", want) {
			t.Errorf("%s: %q %v, want %q", url, got, err, want)
		}
	}
	for _, bad := range []string{"", "directory", "/dir", "%zz"} {
		if got, err := ACMECacheDir("/data/acme", bad); err == nil {
			t.Errorf("%q: %q, want an error", bad, got)
		}
	}
}

func TestACMECacheIs0700(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "acme")
	if err := os.Mkdir(dir, 0o755); err != nil { // made by hand, too open
		t.Fatal(err)
	}
	const url = "https://ca.example/dir"
	if _, err := NewACME(ACMEConfig{Domains: []string{"relay.example.com"}, DirectoryURL: url, CacheDir: dir}); err != nil {
		t.Fatal(err)
	}
	sub, _ := ACMECacheDir(dir, url)
	for _, d := range []string{dir, sub} {
		if fi, err := os.Stat(d); err != nil || fi.Mode().Perm() != 0o700 {
			t.Errorf("%s: %v %v, want 0700", d, fi.Mode(), err)
		}
	}
	if _, err := NewACME(ACMEConfig{DirectoryURL: url, CacheDir: dir}); err == nil {
		t.Error("NewACME without domains: no error")
	}
}

func TestACMEServerConfig(t *testing.T) {
	a, err := NewACME(ACMEConfig{Domains: []string{"relay.example.com"}, DirectoryURL: "https://ca.example/dir", CacheDir: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	challenge := &tls.ClientHelloInfo{ServerName: "relay.example.com", SupportedProtos: []string{"acme-tls/1"}}
	client := &tls.ClientHelloInfo{ServerName: "relay.example.com", SupportedProtos: []string{"h2", "http/1.1", "acme-tls/1"}}

	cfg := a.ServerConfig(false)
	if cfg.MinVersion != tls.VersionTLS12 || !slices.Equal(cfg.NextProtos, []string{"http/1.1", "acme-tls/1"}) || cfg.GetConfigForClient != nil {
		t.Errorf("ServerConfig(false): min %x, ALPN %q", cfg.MinVersion, cfg.NextProtos)
	}
	cfg = a.ServerConfig(true)
	if cfg.MinVersion != tls.VersionTLS13 || !slices.Equal(cfg.NextProtos, []string{"http/1.1", "acme-tls/1"}) {
		t.Fatalf("ServerConfig(true): min %x, ALPN %q", cfg.MinVersion, cfg.NextProtos)
	}
	ch, err := cfg.GetConfigForClient(challenge)
	if err != nil || ch == nil || ch.MinVersion != tls.VersionTLS12 || !slices.Equal(ch.NextProtos, []string{"acme-tls/1"}) {
		t.Fatalf("challenge config %+v %v", ch, err)
	}
	if other, err := cfg.GetConfigForClient(client); other != nil || err != nil {
		t.Fatalf("a client offering acme-tls/1 among others got %+v %v", other, err)
	}

	// Over the wire: a TLS 1.2 challenge handshake reaches the certificate
	// lookup (which has no token here: internal error), a TLS 1.2 client
	// is refused the protocol version before it.
	addr := startEchoServer(t, cfg)
	_, err = tls.Dial("tcp", addr, &tls.Config{ServerName: "relay.example.com", MaxVersion: tls.VersionTLS12, NextProtos: []string{"acme-tls/1"}, InsecureSkipVerify: true})
	if err == nil || !strings.Contains(err.Error(), "internal error") {
		t.Errorf("TLS 1.2 challenge handshake: %v, want the server's internal error (no token)", err)
	}
	_, err = tls.Dial("tcp", addr, &tls.Config{ServerName: "relay.example.com", MaxVersion: tls.VersionTLS12, NextProtos: []string{"http/1.1"}, InsecureSkipVerify: true})
	if err == nil || !strings.Contains(err.Error(), "protocol version") {
		t.Errorf("TLS 1.2 client: %v, want a protocol version alert", err)
	}
}

// TestACMEServesCachedCertificate: a certificate in the cache is served
// without asking the CA (which does not exist here), to a client without a
// server name (the first domain's), and to a TLS 1.3-only client offering
// no ECDSA TLS 1.2 cipher suite (the ECDSA one, not a new RSA order).
func TestACMEServesCachedCertificate(t *testing.T) {
	var logs bytes.Buffer
	dir := t.TempDir()
	const url = "https://127.0.0.1:1/dir" // nothing listens on port 1
	a, err := NewACME(ACMEConfig{Domains: []string{"relay.example.com", "other.example.com"}, DirectoryURL: url, CacheDir: dir,
		Log: slog.New(slog.NewTextHandler(&logs, nil))})
	if err != nil {
		t.Fatal(err)
	}
	sub, _ := ACMECacheDir(dir, url)
	serial := cacheCert(t, sub, "relay.example.com")

	cfg := a.ServerConfig(true)
	addr := startEchoServer(t, cfg)
	for _, c := range []*tls.Config{
		{ServerName: "relay.example.com", MinVersion: tls.VersionTLS13, InsecureSkipVerify: true},
		{InsecureSkipVerify: true}, // no server name
	} {
		conn, err := tls.Dial("tcp", addr, c)
		if err != nil {
			t.Fatalf("%q: %v", c.ServerName, err)
		}
		if got := conn.ConnectionState().PeerCertificates[0].SerialNumber; got.Cmp(serial) != 0 {
			t.Errorf("%q: serial %v, want the cached %v", c.ServerName, got, serial)
		}
		conn.Close()
	}
	if logs.Len() != 0 {
		t.Errorf("logged: %s", logs.String())
	}

	// A name not listed: refused, and not logged (scanners).
	if _, err := a.GetCertificate(&tls.ClientHelloInfo{ServerName: "stranger.example.com"}); err == nil || !strings.Contains(err.Error(), "not configured") {
		t.Errorf("unlisted name: %v", err)
	}
	if logs.Len() != 0 {
		t.Errorf("logged for an unlisted name: %s", logs.String())
	}
	// A listed name without a certificate, the CA unreachable: the error
	// is logged with the domain.
	if _, err := a.GetCertificate(&tls.ClientHelloInfo{ServerName: "other.example.com", CipherSuites: []uint16{tls.TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256}}); err == nil {
		t.Error("other.example.com: a certificate without a CA")
	}
	if got := logs.String(); !strings.Contains(got, `msg="acme: no certificate" domain=other.example.com`) {
		t.Errorf("log %q", got)
	}
	// Within the minute after, handshakes for it fail at once, without an
	// order and without a log line; the cached one is still served.
	_, err = a.GetCertificate(&tls.ClientHelloInfo{ServerName: "Other.Example.com."})
	if err == nil || !strings.Contains(err.Error(), "acme: no certificate for other.example.com (next try 1m0s after the last failure)") {
		t.Errorf("second try: %v", err)
	}
	if n := strings.Count(logs.String(), "acme: no certificate"); n != 1 {
		t.Errorf("%d log lines, want 1: %s", n, logs.String())
	}
	if c, err := a.GetCertificate(&tls.ClientHelloInfo{ServerName: "relay.example.com", CipherSuites: []uint16{tls.TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256}}); err != nil || c.Leaf.SerialNumber.Cmp(serial) != 0 {
		t.Errorf("relay.example.com after other's failure: %v", err)
	}
}

// cacheCert writes a self-signed ECDSA certificate for domain into an
// autocert cache directory, as autocert stores one (key, then chain), and
// returns its serial.
func cacheCert(t *testing.T, dir, domain string) *big.Int {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	serial := big.NewInt(424242)
	tmpl := &x509.Certificate{
		SerialNumber: serial, Subject: pkix.Name{CommonName: domain}, DNSNames: []string{domain},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(90 * 24 * time.Hour),
		KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	kder, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	var b bytes.Buffer
	_ = pem.Encode(&b, &pem.Block{Type: "EC PRIVATE KEY", Bytes: kder})
	_ = pem.Encode(&b, &pem.Block{Type: "CERTIFICATE", Bytes: der})
	if err := os.WriteFile(filepath.Join(dir, domain), b.Bytes(), 0o600); err != nil {
		t.Fatal(err)
	}
	return serial
}
