package turnbench

import (
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"os"

	"edgerelay/fastpath/tlsconf"
)

// benchCert is the certificate for 127.0.0.1 that both servers serve
// turns: with, as PEM files, and the client configuration that trusts it.
type benchCert struct {
	certFile, keyFile string
	client            *tls.Config
}

// writeBenchCert makes the relay's development CA and a P-256 server
// certificate signed by it in dir (tlsconf.EnsureDevCert: the cheapest
// handshake both OpenSSL and Go serve alike), and a client configuration
// that trusts the CA.
func writeBenchCert(dir string) (benchCert, error) {
	paths, err := tlsconf.EnsureDevCert(dir, nil)
	if err != nil {
		return benchCert{}, fmt.Errorf("turnbench: certificate: %w", err)
	}
	ca, err := os.ReadFile(paths.CA)
	if err != nil {
		return benchCert{}, fmt.Errorf("turnbench: certificate: %w", err)
	}
	roots := x509.NewCertPool()
	if !roots.AppendCertsFromPEM(ca) {
		return benchCert{}, fmt.Errorf("turnbench: certificate: no CA in %s", paths.CA)
	}
	// One suite for both servers, so that a record costs them alike: left
	// to negotiate, coturn 4.6.1 takes TLS 1.2 with AES-256-GCM and ours
	// TLS 1.3 with AES-128-GCM.
	client := &tls.Config{RootCAs: roots, ServerName: "127.0.0.1",
		MinVersion: tls.VersionTLS12, MaxVersion: tls.VersionTLS12,
		CipherSuites: []uint16{tls.TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256}}
	return benchCert{certFile: paths.Cert, keyFile: paths.Key, client: client}, nil
}
