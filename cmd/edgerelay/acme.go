package main

import (
	"crypto/x509"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strings"

	"edgerelay/cmd/edgerelay/config"
	"edgerelay/fastpath/tlsconf"
)

// acmeService names the HTTP-01 listener (RELAY_ACME_HTTP_LISTEN) in
// start-up lines, logs and metrics.
const acmeService config.Service = "acme"

// acmeCacheDir is where certificates from the ACME CA are kept, inside the
// data dir: the account key and every certificate's private key, 0700.
const acmeCacheDir = "acme"

// newACME is the certificate source of the listeners that take theirs from
// the ACME CA (docs/acme.md). RELAY_ACME_CA, when set, replaces the system
// roots for the CA's HTTPS with the system roots plus its certificates.
func newACME(cfg config.Config, log *slog.Logger) (*tlsconf.ACME, error) {
	ac := tlsconf.ACMEConfig{
		Domains: cfg.ACME.Domains, Email: cfg.ACME.Email, DirectoryURL: cfg.ACME.Directory,
		CacheDir: filepath.Join(cfg.DataDir, acmeCacheDir), Log: log.With("service", "acme"),
	}
	if f := cfg.ACME.CAFile; f != "" {
		pem, err := os.ReadFile(f)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", config.EnvACMECA, err)
		}
		pool, err := x509.SystemCertPool()
		if err != nil {
			pool = x509.NewCertPool()
		}
		if !pool.AppendCertsFromPEM(pem) {
			return nil, fmt.Errorf("%s: %s holds no PEM certificate", config.EnvACMECA, f)
		}
		ac.RootCAs = pool
	}
	a, err := tlsconf.NewACME(ac)
	if err != nil {
		return nil, err
	}
	var using []string
	for _, s := range config.Services() {
		if l := cfg.Listeners[s]; l.On() && l.ACME {
			using = append(using, string(s))
		}
	}
	log.Info("acme on", "domains", cfg.ACME.Domains, "directory", cfg.ACME.Directory, "listeners", strings.Join(using, ","),
		"http01", cfg.ACME.HTTPListen != "", "cache", ac.CacheDir)
	return a, nil
}
