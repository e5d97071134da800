// Package pushtest holds local fakes of the push providers for tests: an
// APNs provider endpoint (HTTP/2 over TLS) and Google's OAuth2 token
// endpoint together with FCM HTTP v1. They speak the real protocols, verify
// the credentials the way the providers do (signatures included, with the
// public half of the keys the test generated), answer with the providers'
// real status codes and bodies, and record byte for byte what they received.
//
// Each fake runs on an httptest TLS server. In-process clients trust it
// through RootCAs; a relay started as a separate process trusts it through
// SSL_CERT_FILE pointing at a file holding CertPEM.
//
// The fakes are stricter than the real services in one way only: they
// refuse what the real service documents as wrong but might let through
// (a missing apns-push-type, priority 10 on a background push), so that a
// test catches the mistake.
package pushtest

import (
	"crypto/rand"
	"crypto/x509"
	"encoding/hex"
	"encoding/pem"
	"net/http/httptest"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"
)

// WriteFile writes data to a file named name in a fresh temporary directory
// of t and returns its path: a .p8 key, a service-account JSON, a CA file
// for SSL_CERT_FILE.
func WriteFile(t testing.TB, name string, data []byte) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), name)
	if err := os.WriteFile(path, data, 0o600); err != nil {
		t.Fatalf("pushtest: %v", err)
	}
	return path
}

// tlsServer is what both fakes share: the server and how to trust it.
type tlsServer struct {
	srv *httptest.Server
}

// URL is the server's base URL (https://127.0.0.1:port).
func (s *tlsServer) URL() string { return s.srv.URL }

// Certificate is the server's self-signed certificate.
func (s *tlsServer) Certificate() *x509.Certificate { return s.srv.Certificate() }

// RootCAs is a pool that trusts the server, for in-process clients.
func (s *tlsServer) RootCAs() *x509.CertPool {
	pool := x509.NewCertPool()
	pool.AddCert(s.srv.Certificate())
	return pool
}

// CertPEM is the server's certificate in PEM, for SSL_CERT_FILE.
func (s *tlsServer) CertPEM() []byte {
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: s.srv.Certificate().Raw})
}

// Close stops the server. The test's cleanup also does it.
func (s *tlsServer) Close() { s.srv.Close() }

// recorder keeps what a fake received and wakes waiters when more arrives.
type recorder[T any] struct {
	mu      sync.Mutex
	items   []T
	changed chan struct{} // closed and replaced on every add
}

func (r *recorder[T]) add(item T) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.items = append(r.items, item)
	if r.changed != nil {
		close(r.changed)
		r.changed = nil
	}
}

func (r *recorder[T]) all() []T {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]T(nil), r.items...)
}

// wait returns the records once there are at least n, or whatever there is
// when timeout passes.
func (r *recorder[T]) wait(n int, timeout time.Duration) []T {
	deadline := time.NewTimer(timeout)
	defer deadline.Stop()
	for {
		r.mu.Lock()
		if len(r.items) >= n {
			items := append([]T(nil), r.items...)
			r.mu.Unlock()
			return items
		}
		if r.changed == nil {
			r.changed = make(chan struct{})
		}
		changed := r.changed
		r.mu.Unlock()
		select {
		case <-changed:
		case <-deadline.C:
			return r.all()
		}
	}
}

// answers holds programmed answers keyed by device or registration token:
// one-shot answers are used first, in order, then the sticky one.
type answers[A any] struct {
	once   map[string][]A
	sticky map[string]A
}

func (a *answers[A]) setOnce(token string, answer A) {
	if a.once == nil {
		a.once = make(map[string][]A)
	}
	a.once[token] = append(a.once[token], answer)
}

func (a *answers[A]) setSticky(token string, answer A) {
	if a.sticky == nil {
		a.sticky = make(map[string]A)
	}
	a.sticky[token] = answer
}

func (a *answers[A]) next(token string) (A, bool) {
	if q := a.once[token]; len(q) > 0 {
		if len(q) == 1 {
			delete(a.once, token)
		} else {
			a.once[token] = q[1:]
		}
		return q[0], true
	}
	answer, ok := a.sticky[token]
	return answer, ok
}

// randomHex returns n random bytes in hex.
func randomHex(n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

// newUUID returns a random (version 4) UUID, the shape of apns-id.
func newUUID() string {
	var b [16]byte
	_, _ = rand.Read(b[:])
	b[6] = b[6]&0x0f | 0x40
	b[8] = b[8]&0x3f | 0x80
	h := hex.EncodeToString(b[:])
	return h[0:8] + "-" + h[8:12] + "-" + h[12:16] + "-" + h[16:20] + "-" + h[20:32]
}
