package tlsconf

import (
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"sync/atomic"
)

// Reloader holds the certificate a listener serves and lets it be replaced
// while the listener runs: the operator renews the files and sends SIGHUP,
// and new handshakes get the new certificate while established connections,
// which no longer need it, carry on untouched.
//
// The certificate is kept in an atomic.Pointer, so GetCertificate, called on
// every handshake, takes no lock.
type Reloader struct {
	certFile, keyFile string
	cert              atomic.Pointer[tls.Certificate]
}

// NewReloader loads certFile and keyFile (PEM) and returns a Reloader serving
// them. It fails if they cannot be read, do not parse or do not match, so a
// misconfigured listener fails at start rather than on the first handshake.
func NewReloader(certFile, keyFile string) (*Reloader, error) {
	r := &Reloader{certFile: certFile, keyFile: keyFile}
	if err := r.Reload(); err != nil {
		return nil, err
	}
	return r, nil
}

// Reload reads the files again and, if they hold a valid matching pair,
// serves them from the next handshake on. On error the certificate served so
// far stays in place: a half-renewed or mistyped file must not take the
// listener down.
func (r *Reloader) Reload() error {
	cert, err := tls.LoadX509KeyPair(r.certFile, r.keyFile)
	if err != nil {
		return fmt.Errorf("tlsconf: load %s and %s: %w", r.certFile, r.keyFile, err)
	}
	// LoadX509KeyPair fills Leaf since Go 1.23 unless GODEBUG
	// x509keypairleaf=0 turns that off; Leaf saves parsing it per handshake.
	if cert.Leaf == nil {
		if cert.Leaf, err = x509.ParseCertificate(cert.Certificate[0]); err != nil {
			return fmt.Errorf("tlsconf: parse %s: %w", r.certFile, err)
		}
	}
	r.cert.Store(&cert)
	return nil
}

// GetCertificate returns the current certificate; it is meant for
// tls.Config.GetCertificate and ignores the ClientHello.
func (r *Reloader) GetCertificate(*tls.ClientHelloInfo) (*tls.Certificate, error) {
	return r.cert.Load(), nil
}

// Leaf returns the parsed current certificate, for logging what is served
// (subject, names, expiry) after a start or a reload.
func (r *Reloader) Leaf() *x509.Certificate {
	return r.cert.Load().Leaf
}

// CertSource gives a listener its certificate per handshake: a Reloader
// (files) or an ACME (a CA).
type CertSource interface {
	GetCertificate(*tls.ClientHelloInfo) (*tls.Certificate, error)
}

// ServerConfig returns the server TLS configuration for a listener serving
// r's certificates. It accepts TLS 1.2 and 1.3 (1.3 preferred, as crypto/tls
// does), or TLS 1.3 only when minVersion13 is set: the agent connector
// demands 1.3 and its listener refuses anything older. It offers ALPN
// "http/1.1", the only HTTP version fasthttp speaks.
//
// Each call returns a new Config, so a caller may adjust its copy.
func ServerConfig(r CertSource, minVersion13 bool) *tls.Config {
	minVersion := uint16(tls.VersionTLS12)
	if minVersion13 {
		minVersion = tls.VersionTLS13
	}
	return &tls.Config{
		MinVersion:     minVersion,
		GetCertificate: r.GetCertificate,
		NextProtos:     []string{"http/1.1"},
	}
}
