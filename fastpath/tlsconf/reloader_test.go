package tlsconf

import (
	"crypto/tls"
	"crypto/x509"
	"io"
	"math/big"
	"net"
	"os"
	"strings"
	"sync"
	"testing"
	"time"
)

func TestHandshakeTLS13(t *testing.T) {
	p, r := devReloader(t)
	addr := startEchoServer(t, ServerConfig(r, false))

	for _, name := range []string{"localhost", "127.0.0.1"} {
		c := dial(t, addr, clientConfig(t, p, name))
		st := c.ConnectionState()
		if st.Version != tls.VersionTLS13 {
			t.Errorf("%s: version %x, want TLS 1.3", name, st.Version)
		}
		if st.NegotiatedProtocol != "http/1.1" {
			t.Errorf("%s: ALPN %q, want http/1.1", name, st.NegotiatedProtocol)
		}
		echo(t, c, "hello")
	}
}

func TestServerConfigAcceptsTLS12ByDefault(t *testing.T) {
	p, r := devReloader(t)
	addr := startEchoServer(t, ServerConfig(r, false))
	cfg := clientConfig(t, p, "localhost")
	cfg.MaxVersion = tls.VersionTLS12
	c := dial(t, addr, cfg)
	if v := c.ConnectionState().Version; v != tls.VersionTLS12 {
		t.Errorf("version %x, want TLS 1.2", v)
	}
	echo(t, c, "hello")
}

func TestServerConfigTLS13Only(t *testing.T) {
	p, r := devReloader(t)
	cfg := ServerConfig(r, true)
	if cfg.MinVersion != tls.VersionTLS13 {
		t.Fatalf("MinVersion %x", cfg.MinVersion)
	}
	addr := startEchoServer(t, cfg)

	old := clientConfig(t, p, "localhost")
	old.MaxVersion = tls.VersionTLS12
	c, err := tls.Dial("tcp", addr, old)
	if err == nil {
		c.Close()
		t.Fatal("TLS 1.2-only client was accepted by a TLS 1.3-only listener")
	}
	if !strings.Contains(err.Error(), "protocol version") {
		t.Fatalf("TLS 1.2-only client failed for another reason: %v", err)
	}

	c13 := dial(t, addr, clientConfig(t, p, "localhost"))
	if v := c13.ConnectionState().Version; v != tls.VersionTLS13 {
		t.Errorf("version %x, want TLS 1.3", v)
	}
	echo(t, c13, "hello")
}

func TestReloadSwapsCertificate(t *testing.T) {
	dataDir := t.TempDir()
	p, err := EnsureDevCert(dataDir, nil)
	if err != nil {
		t.Fatal(err)
	}
	r, err := NewReloader(p.Cert, p.Key)
	if err != nil {
		t.Fatal(err)
	}
	addr := startEchoServer(t, ServerConfig(r, false))

	before := dial(t, addr, clientConfig(t, p, "localhost"))
	echo(t, before, "before")
	oldSerial := peerSerial(before)
	if oldSerial.Cmp(r.Leaf().SerialNumber) != 0 {
		t.Fatal("Leaf does not describe the served certificate")
	}

	// A new host forces a new server certificate, same CA, written in place.
	if _, err := EnsureDevCert(dataDir, []string{"relay.test"}); err != nil {
		t.Fatal(err)
	}
	if err := r.Reload(); err != nil {
		t.Fatal(err)
	}

	after := dial(t, addr, clientConfig(t, p, "relay.test"))
	if peerSerial(after).Cmp(oldSerial) == 0 {
		t.Fatal("new handshake still sees the old certificate")
	}
	echo(t, after, "after")

	// The connection made before the reload is unaffected.
	echo(t, before, "still here")
	if peerSerial(before).Cmp(oldSerial) != 0 {
		t.Fatal("old connection's state changed")
	}
}

func TestReloadErrorKeepsOldCertificate(t *testing.T) {
	p, r := devReloader(t)
	addr := startEchoServer(t, ServerConfig(r, false))
	serial := peerSerial(dial(t, addr, clientConfig(t, p, "localhost")))

	if err := os.WriteFile(p.Cert, []byte("-----BEGIN CERTIFICATE-----\nbroken\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := r.Reload(); err == nil {
		t.Fatal("Reload accepted a broken certificate file")
	}
	c := dial(t, addr, clientConfig(t, p, "localhost"))
	if peerSerial(c).Cmp(serial) != 0 {
		t.Fatal("served certificate changed after a failed reload")
	}
	echo(t, c, "hello")

	if err := os.Remove(p.Key); err != nil {
		t.Fatal(err)
	}
	if err := r.Reload(); err == nil {
		t.Fatal("Reload accepted a missing key file")
	}
}

func TestNewReloaderErrors(t *testing.T) {
	p, _ := devReloader(t)
	other, err := EnsureDevCert(t.TempDir(), nil)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := NewReloader(p.Cert, other.Key); err == nil {
		t.Error("mismatched key accepted")
	}
	if _, err := NewReloader(p.Cert+".missing", p.Key); err == nil {
		t.Error("missing certificate accepted")
	}
}

func devReloader(t *testing.T) (DevPaths, *Reloader) {
	t.Helper()
	p, err := EnsureDevCert(t.TempDir(), nil)
	if err != nil {
		t.Fatal(err)
	}
	r, err := NewReloader(p.Cert, p.Key)
	if err != nil {
		t.Fatal(err)
	}
	return p, r
}

func clientConfig(t *testing.T, p DevPaths, serverName string) *tls.Config {
	t.Helper()
	roots := x509.NewCertPool()
	roots.AddCert(readCert(t, p.CA))
	return &tls.Config{RootCAs: roots, ServerName: serverName, NextProtos: []string{"http/1.1"}}
}

// startEchoServer serves cfg on a loopback port and echoes every connection
// back; everything is closed at the end of the test.
func startEchoServer(t *testing.T, cfg *tls.Config) string {
	t.Helper()
	ln, err := tls.Listen("tcp", "127.0.0.1:0", cfg)
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	var mu sync.Mutex
	var conns []net.Conn
	wg.Go(func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			mu.Lock()
			conns = append(conns, c)
			mu.Unlock()
			wg.Go(func() {
				defer c.Close()
				io.Copy(c, c)
			})
		}
	})
	t.Cleanup(func() {
		ln.Close()
		mu.Lock()
		for _, c := range conns {
			c.Close()
		}
		mu.Unlock()
		wg.Wait()
	})
	return ln.Addr().String()
}

func dial(t *testing.T, addr string, cfg *tls.Config) *tls.Conn {
	t.Helper()
	d := &net.Dialer{Timeout: 5 * time.Second}
	c, err := tls.DialWithDialer(d, "tcp", addr, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

func echo(t *testing.T, c *tls.Conn, msg string) {
	t.Helper()
	c.SetDeadline(time.Now().Add(5 * time.Second))
	if _, err := io.WriteString(c, msg); err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, len(msg))
	if _, err := io.ReadFull(c, buf); err != nil {
		t.Fatal(err)
	}
	if string(buf) != msg {
		t.Fatalf("echo %q, want %q", buf, msg)
	}
}

func peerSerial(c *tls.Conn) *big.Int {
	return c.ConnectionState().PeerCertificates[0].SerialNumber
}
