// Package providerhttp builds the outgoing HTTP clients of the push provider
// modules and tells whether a request ever left the process.
package providerhttp

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"io"
	"net"
	"net/http"
	"net/http/httptrace"
	"sync/atomic"
	"time"
)

// DefaultTimeout bounds one request to a provider (connect, TLS, request,
// response) when the caller configures none. Providers answer in
// milliseconds; a hung connection must not hold a send for longer than this.
const DefaultTimeout = 10 * time.Second

// NewClient returns an HTTP client for one provider.
//
// roots nil means the system roots, so that SSL_CERT_FILE can point the
// relay at a test fake; a pool replaces them (for in-process tests).
// http2Only refuses to fall back to HTTP/1.1: APNs speaks nothing else, and
// a fake that silently downgraded would hide a broken transport.
//
// One client is meant to live as long as the module: its transport keeps the
// HTTP/2 connection open and multiplexes concurrent sends over it (Apple
// treats rapid reconnecting as a denial-of-service attack) and pings an idle
// connection to notice a dead one.
func NewClient(roots *x509.CertPool, http2Only bool, timeout time.Duration) *http.Client {
	if timeout <= 0 {
		timeout = DefaultTimeout
	}
	var protocols http.Protocols
	protocols.SetHTTP2(true)
	protocols.SetHTTP1(!http2Only)
	// Without a limit, a burst of sends on a cold client dials one
	// connection per send (the transport keeps one and closes the rest).
	// With a limit of one, the burst waits for the single dial; for
	// HTTP/2 the transport still opens another connection when the
	// server's stream limit is reached. Only HTTP/2-only clients get it:
	// over HTTP/1.1 it would serialize every request.
	maxConns := 0
	if http2Only {
		maxConns = 1
	}
	dialer := &net.Dialer{Timeout: timeout, KeepAlive: 30 * time.Second}
	transport := &http.Transport{
		Proxy:               http.ProxyFromEnvironment,
		DialContext:         dialer.DialContext,
		TLSClientConfig:     &tls.Config{RootCAs: roots, MinVersion: tls.VersionTLS12},
		TLSHandshakeTimeout: timeout,
		ForceAttemptHTTP2:   true,
		Protocols:           &protocols,
		MaxIdleConnsPerHost: 4,
		MaxConnsPerHost:     maxConns,
		IdleConnTimeout:     15 * time.Minute,
		HTTP2: &http.HTTP2Config{
			SendPingTimeout: 30 * time.Second,
			PingTimeout:     15 * time.Second,
		},
	}
	return &http.Client{
		Transport: transport,
		Timeout:   timeout,
		// Providers never redirect; following one would send the
		// credential somewhere unexpected. A 3xx comes back as an answer.
		CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse },
	}
}

// WriteTracker records whether the headers of a request were handed to the
// connection. Until they are, the provider cannot have seen the request, so
// a failure is safe to report as "not sent".
type WriteTracker struct {
	wrote atomic.Bool
	trace httptrace.ClientTrace
}

// Track returns a context that marks the tracker once the request's headers
// are written, and the tracker.
func Track(ctx context.Context) (context.Context, *WriteTracker) {
	w := &WriteTracker{}
	w.trace.WroteHeaders = w.markWrote
	return httptrace.WithClientTrace(ctx, &w.trace), w
}

func (w *WriteTracker) markWrote() { w.wrote.Store(true) }

// Wrote reports whether the request's headers were written.
func (w *WriteTracker) Wrote() bool { return w.wrote.Load() }

// ReadBody reads at most limit bytes of a response body and closes it after
// draining a bounded remainder, so that the connection stays reusable.
func ReadBody(body io.ReadCloser, limit int64) ([]byte, error) {
	defer body.Close()
	b, err := io.ReadAll(io.LimitReader(body, limit))
	if err == nil {
		_, _ = io.Copy(io.Discard, io.LimitReader(body, 64<<10))
	}
	return b, err
}
