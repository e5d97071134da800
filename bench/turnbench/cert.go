package turnbench

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"fmt"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"time"
)

// benchCert is a self-signed certificate for 127.0.0.1 that both servers
// serve turns: with, written as PEM files, and the client configuration
// that trusts it.
type benchCert struct {
	certFile, keyFile string
	client            *tls.Config
}

// writeBenchCert makes a P-256 certificate (the cheapest handshake both
// OpenSSL and Go serve alike) valid for a day, in dir.
func writeBenchCert(dir string) (benchCert, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return benchCert{}, fmt.Errorf("turnbench: certificate key: %w", err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1),
		Subject:      pkix.Name{CommonName: "turnbench"},
		NotBefore:    time.Now().Add(-time.Hour),
		NotAfter:     time.Now().Add(24 * time.Hour),
		IPAddresses:  []net.IP{net.IPv4(127, 0, 0, 1)},
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		return benchCert{}, fmt.Errorf("turnbench: certificate: %w", err)
	}
	keyDER, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		return benchCert{}, fmt.Errorf("turnbench: certificate key: %w", err)
	}
	c := benchCert{certFile: filepath.Join(dir, "cert.pem"), keyFile: filepath.Join(dir, "key.pem")}
	if err := os.WriteFile(c.certFile, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), 0o600); err != nil {
		return benchCert{}, err
	}
	if err := os.WriteFile(c.keyFile, pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: keyDER}), 0o600); err != nil {
		return benchCert{}, err
	}
	leaf, err := x509.ParseCertificate(der)
	if err != nil {
		return benchCert{}, err
	}
	roots := x509.NewCertPool()
	roots.AddCert(leaf)
	// One suite for both servers, so that a record costs them alike: left
	// to negotiate, coturn 4.6.1 takes TLS 1.2 with AES-256-GCM and ours
	// TLS 1.3 with AES-128-GCM.
	c.client = &tls.Config{RootCAs: roots, ServerName: "127.0.0.1",
		MinVersion: tls.VersionTLS12, MaxVersion: tls.VersionTLS12,
		CipherSuites: []uint16{tls.TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256}}
	return c, nil
}
