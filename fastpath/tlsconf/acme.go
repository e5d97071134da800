package tlsconf

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/pem"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"time"

	"golang.org/x/crypto/acme"
	"golang.org/x/crypto/acme/autocert"
)

// ACMEConfig configures certificates from an ACME CA (RFC 8555).
type ACMEConfig struct {
	// Domains are the host names certificates are obtained for, one
	// certificate each; a handshake for any other name fails. The first is
	// also served to a client that sends no server name (one that dials an
	// IP address), so that it gets a certificate it can at least pin.
	Domains []string
	// Email is the account's contact address; "" gives none.
	Email string
	// DirectoryURL is the CA's directory, e.g. Let's Encrypt's
	// https://acme-v02.api.letsencrypt.org/directory.
	DirectoryURL string
	// CacheDir keeps the account key and the certificates, in a
	// subdirectory per directory URL (see ACMECacheDir). It is made 0700.
	CacheDir string
	// RootCAs, when not nil, are the roots trusted for the directory's
	// HTTPS instead of the system's (a private CA such as pebble).
	RootCAs *x509.CertPool
	// Log receives what an operator needs to see: certificates stored
	// (obtained or renewed) and obtaining one failing.
	Log *slog.Logger
}

// ACME serves certificates that it obtains from an ACME CA and renews
// before they expire, while the listeners run: it answers TLS-ALPN-01
// challenges in the handshake of every listener whose tls.Config comes from
// ServerConfig, and HTTP-01 challenges through HTTPHandler.
//
// It is golang.org/x/crypto/acme/autocert's Manager with three things the
// relay needs around it: a cache kept apart per CA, a log line whenever a
// certificate is stored, and an ECDSA certificate for clients that speak
// only TLS 1.3 (autocert picks the key type from TLS 1.2 cipher suites).
// Renewal is autocert's: a third of the certificate's lifetime before it
// ends (30 days for Let's Encrypt's 90-day certificates), retried every
// half hour or so on failure; the certificate served until then is the old
// one, and open connections keep theirs.
type ACME struct {
	m   *autocert.Manager
	def string
	log *slog.Logger

	// failed holds, per domain, when obtaining its certificate last
	// failed: for acmeRetryAfter after that, handshakes for it fail at
	// once instead of each placing an order. autocert has no such pause,
	// and a CA counts failed validations (Let's Encrypt allows 5 per name
	// and hour) while clients keep connecting.
	mu     sync.Mutex
	failed map[string]failure
}

type failure struct {
	at  time.Time
	err error
}

// acmeRetryAfter is how long a domain whose certificate could not be
// obtained waits before the next handshake tries again.
const acmeRetryAfter = time.Minute

// NewACME makes the cache directory and returns the certificate source.
// Nothing is asked of the CA before the first handshake or Prefetch.
func NewACME(cfg ACMEConfig) (*ACME, error) {
	if len(cfg.Domains) == 0 {
		return nil, errors.New("tlsconf: ACME without domains")
	}
	dir, err := ACMECacheDir(cfg.CacheDir, cfg.DirectoryURL)
	if err != nil {
		return nil, err
	}
	// The cache holds the account key and every certificate's private key.
	for _, d := range []string{cfg.CacheDir, dir} {
		if err := os.MkdirAll(d, 0o700); err != nil {
			return nil, fmt.Errorf("tlsconf: ACME cache: %w", err)
		}
		if err := os.Chmod(d, 0o700); err != nil {
			return nil, fmt.Errorf("tlsconf: ACME cache: %w", err)
		}
	}
	log := cfg.Log
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	client := &acme.Client{DirectoryURL: cfg.DirectoryURL, UserAgent: "edgerelay"}
	if cfg.RootCAs != nil {
		tr := http.DefaultTransport.(*http.Transport).Clone()
		tr.TLSClientConfig = &tls.Config{RootCAs: cfg.RootCAs, MinVersion: tls.VersionTLS12}
		client.HTTPClient = &http.Client{Transport: tr, Timeout: time.Minute}
	}
	a := &ACME{def: cfg.Domains[0], log: log, failed: map[string]failure{}}
	a.m = &autocert.Manager{
		Prompt:     autocert.AcceptTOS,
		HostPolicy: hostPolicy(cfg.Domains),
		Cache:      loggingCache{DirCache: autocert.DirCache(dir), log: log},
		Email:      cfg.Email,
		Client:     client,
	}
	return a, nil
}

// hostPolicy allows the listed names alone. Unlike autocert's
// HostWhitelist it ignores a port: the HTTP-01 handler checks the request's
// Host, which carries one when the listener is not on port 80 (behind a
// port forward, or pebble's configurable httpPort).
func hostPolicy(domains []string) autocert.HostPolicy {
	allowed := autocert.HostWhitelist(domains...)
	return func(ctx context.Context, host string) error {
		if h, _, err := net.SplitHostPort(host); err == nil {
			host = h
		}
		return allowed(ctx, host)
	}
}

// ACMECacheDir is the directory under cacheDir that keeps the account and
// certificates of one CA: its directory URL's host, port and path, made a
// file name. A relay moved from Let's Encrypt's staging CA to production
// must not go on serving the staging certificates, which no client trusts.
func ACMECacheDir(cacheDir, directoryURL string) (string, error) {
	u, err := url.Parse(directoryURL)
	if err != nil || u.Host == "" {
		return "", fmt.Errorf("tlsconf: ACME directory URL %q is not an absolute URL", directoryURL)
	}
	name := strings.Map(func(r rune) rune {
		switch {
		case r >= 'a' && r <= 'z', r >= 'A' && r <= 'Z', r >= '0' && r <= '9', r == '.', r == '-':
			return r
		}
		return '_'
	}, strings.TrimSuffix(u.Host+u.Path, "/"))
	return filepath.Join(cacheDir, name), nil
}

// GetCertificate is meant for tls.Config.GetCertificate: the challenge
// certificate for a CA's TLS-ALPN-01 handshake, else the certificate of
// the client's server name, obtained first if need be (the handshake waits
// for it).
func (a *ACME) GetCertificate(hello *tls.ClientHelloInfo) (*tls.Certificate, error) {
	h := *hello
	if h.ServerName == "" {
		h.ServerName = a.def
	}
	// autocert gives an ECDSA certificate only to a client offering an
	// ECDSA TLS 1.2 cipher suite; a TLS 1.3-only client offers none and
	// would get RSA, a second certificate and order. In TLS 1.3 the
	// signature schemes decide.
	if slices.Contains(h.SupportedVersions, tls.VersionTLS13) && slices.Contains(h.SignatureSchemes, tls.ECDSAWithP256AndSHA256) {
		h.CipherSuites = append(slices.Clip(h.CipherSuites), tls.TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256)
	}
	if isChallenge(&h) || !a.isOurs(h.ServerName) {
		return a.m.GetCertificate(&h)
	}
	name := strings.ToLower(strings.TrimSuffix(h.ServerName, "."))
	a.mu.Lock()
	f, failed := a.failed[name]
	a.mu.Unlock()
	if failed && time.Since(f.at) < acmeRetryAfter {
		return nil, fmt.Errorf("acme: no certificate for %s (next try %s after the last failure): %w", name, acmeRetryAfter, f.err)
	}
	cert, err := a.m.GetCertificate(&h)
	a.mu.Lock()
	if err != nil {
		a.failed[name] = failure{at: time.Now(), err: err}
	} else {
		delete(a.failed, name)
	}
	a.mu.Unlock()
	if err != nil {
		// Obtaining the certificate failed (the CA unreachable, a
		// challenge that did not validate): the operator must see why.
		// Names not listed are scanners and stay out of the log.
		a.log.Warn("acme: no certificate", "domain", name, "err", err, "next_try", acmeRetryAfter.String())
	}
	return cert, err
}

func (a *ACME) isOurs(name string) bool {
	return a.m.HostPolicy(context.Background(), strings.ToLower(strings.TrimSuffix(name, "."))) == nil
}

// isChallenge reports whether hello is a CA's TLS-ALPN-01 validation,
// which offers acme-tls/1 alone (RFC 8737).
func isChallenge(hello *tls.ClientHelloInfo) bool {
	return len(hello.SupportedProtos) == 1 && hello.SupportedProtos[0] == acme.ALPNProto
}

// Prefetch obtains (or loads from the cache) the certificate of every
// domain, so that the first client does not wait for the CA, and failures
// show in the log at start. It returns when all are done or ctx ends.
func (a *ACME) Prefetch(ctx context.Context, domains []string) {
	done := make(chan struct{}, len(domains))
	for _, d := range domains {
		go func() {
			defer func() { done <- struct{}{} }()
			// An ECDSA P-256 client, as Go's and browsers are.
			_, _ = a.GetCertificate(&tls.ClientHelloInfo{
				ServerName:        d,
				SupportedVersions: []uint16{tls.VersionTLS13, tls.VersionTLS12},
				SignatureSchemes:  []tls.SignatureScheme{tls.ECDSAWithP256AndSHA256},
				SupportedCurves:   []tls.CurveID{tls.X25519, tls.CurveP256},
				CipherSuites:      []uint16{tls.TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256},
			})
		}()
	}
	for range domains {
		select {
		case <-done:
		case <-ctx.Done():
			return
		}
	}
}

// HTTPHandler answers HTTP-01 challenges; any other GET or HEAD request is
// redirected to https on port 443, anything else answered 400. It must be
// reachable on port 80 of every domain.
func (a *ACME) HTTPHandler() http.Handler { return a.m.HTTPHandler(nil) }

// ServerConfig is the package's ServerConfig for a listener serving a's
// certificates, with acme-tls/1 added to its ALPN protocols for TLS-ALPN-01.
// A listener that is TLS 1.3 only (minVersion13) still lets a CA's
// validation handshake use TLS 1.2: that handshake serves the challenge
// certificate alone and carries no data, and a CA is free to speak 1.2.
func (a *ACME) ServerConfig(minVersion13 bool) *tls.Config {
	cfg := ServerConfig(a, minVersion13)
	cfg.NextProtos = append(cfg.NextProtos, acme.ALPNProto)
	if minVersion13 {
		challenge := cfg.Clone()
		challenge.MinVersion = tls.VersionTLS12
		challenge.NextProtos = []string{acme.ALPNProto}
		cfg.GetConfigForClient = func(hello *tls.ClientHelloInfo) (*tls.Config, error) {
			if isChallenge(hello) {
				return challenge, nil
			}
			return nil, nil
		}
	}
	return cfg
}

// loggingCache is autocert's directory cache that logs every certificate
// it stores: one line per certificate obtained or renewed, with its expiry.
type loggingCache struct {
	autocert.DirCache
	log *slog.Logger
}

// Put stores data under name, and logs it when it is a certificate: the
// account key is "acme_account+key", challenge material ends in "+token"
// or "+http-01", and everything else is a domain's key and chain in PEM.
func (c loggingCache) Put(ctx context.Context, name string, data []byte) error {
	err := c.DirCache.Put(ctx, name, data)
	if name == "acme_account+key" || strings.HasSuffix(name, "+token") || strings.HasSuffix(name, "+http-01") {
		return err
	}
	if err != nil {
		c.log.Error("acme: certificate not cached; it is served, but a restart orders a new one", "name", name, "err", err)
		return err
	}
	for rest := data; ; {
		var b *pem.Block
		if b, rest = pem.Decode(rest); b == nil {
			break
		}
		if b.Type != "CERTIFICATE" {
			continue
		}
		if leaf, err := x509.ParseCertificate(b.Bytes); err == nil {
			c.log.Info("acme: certificate stored", "name", name, "serial", leaf.SerialNumber.Text(16), "not_after", leaf.NotAfter)
		}
		break
	}
	return nil
}
