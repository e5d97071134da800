package tlsconf

import (
	"bytes"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/x509"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

func TestEnsureDevCertCreatesFiles(t *testing.T) {
	dataDir := t.TempDir()
	p, err := EnsureDevCert(dataDir, nil)
	if err != nil {
		t.Fatal(err)
	}
	dir := filepath.Join(dataDir, "tls")
	if p.CA != filepath.Join(dir, "ca.pem") || p.Cert != filepath.Join(dir, "cert.pem") || p.Key != filepath.Join(dir, "key.pem") {
		t.Fatalf("paths = %+v", p)
	}
	for name, want := range map[string]os.FileMode{
		"ca.pem": 0o644, "ca-key.pem": 0o600, "cert.pem": 0o644, "key.pem": 0o600,
	} {
		st, err := os.Stat(filepath.Join(dir, name))
		if err != nil {
			t.Fatal(err)
		}
		if st.Mode().Perm() != want {
			t.Errorf("%s: mode %v, want %v", name, st.Mode().Perm(), want)
		}
	}
	if st, err := os.Stat(dir); err != nil || st.Mode().Perm() != 0o700 {
		t.Errorf("tls dir: %v, %v; want mode 0700", st.Mode().Perm(), err)
	}
	if entries, _ := os.ReadDir(dir); len(entries) != 4 {
		t.Errorf("tls dir holds %d entries, want 4 (no temporary files left)", len(entries))
	}

	ca, leaf := readCert(t, p.CA), readCert(t, p.Cert)
	for _, c := range []*x509.Certificate{ca, leaf} {
		pub, ok := c.PublicKey.(*ecdsa.PublicKey)
		if !ok || pub.Curve != elliptic.P256() {
			t.Errorf("%s: key %T, want ECDSA P-256", c.Subject.CommonName, c.PublicKey)
		}
	}
	if !ca.IsCA {
		t.Error("CA certificate is not a CA")
	}
	if d := ca.NotAfter.Sub(time.Now()); d < 9*365*24*time.Hour {
		t.Errorf("CA valid for %v, want about 10 years", d)
	}
	if d := leaf.NotAfter.Sub(time.Now()); d < 360*24*time.Hour || d > 366*24*time.Hour {
		t.Errorf("server cert valid for %v, want about 1 year", d)
	}
	for _, host := range []string{"localhost", "127.0.0.1", "::1"} {
		verifyFor(t, p, host)
	}
}

func TestEnsureDevCertReusesFiles(t *testing.T) {
	dataDir := t.TempDir()
	p, err := EnsureDevCert(dataDir, []string{"relay.test"})
	if err != nil {
		t.Fatal(err)
	}
	before := readAll(t, p)
	// Same hosts, differently spelled: still nothing to do.
	p2, err := EnsureDevCert(dataDir, []string{"Relay.Test.", " 127.0.0.1 "})
	if err != nil {
		t.Fatal(err)
	}
	if p2 != p {
		t.Fatalf("paths changed: %+v then %+v", p, p2)
	}
	for name, b := range readAll(t, p) {
		if !bytes.Equal(b, before[name]) {
			t.Errorf("%s was rewritten", name)
		}
	}
}

func TestEnsureDevCertTightensReusedKeyMode(t *testing.T) {
	dataDir := t.TempDir()
	p, err := EnsureDevCert(dataDir, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(p.Key, 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := EnsureDevCert(dataDir, nil); err != nil {
		t.Fatal(err)
	}
	if st, _ := os.Stat(p.Key); st.Mode().Perm() != 0o600 {
		t.Errorf("key mode %v after reuse, want 0600", st.Mode().Perm())
	}
}

func TestEnsureDevCertNewHostRenewsLeafOnly(t *testing.T) {
	dataDir := t.TempDir()
	p, err := EnsureDevCert(dataDir, nil)
	if err != nil {
		t.Fatal(err)
	}
	before := readAll(t, p)
	if _, err := EnsureDevCert(dataDir, []string{"relay.test", "10.1.2.3"}); err != nil {
		t.Fatal(err)
	}
	after := readAll(t, p)
	if !bytes.Equal(before["ca.pem"], after["ca.pem"]) || !bytes.Equal(before["ca-key.pem"], after["ca-key.pem"]) {
		t.Error("CA changed; only the server certificate should")
	}
	if bytes.Equal(before["cert.pem"], after["cert.pem"]) || bytes.Equal(before["key.pem"], after["key.pem"]) {
		t.Error("server certificate not renewed for the new hosts")
	}
	for _, host := range []string{"relay.test", "10.1.2.3", "localhost", "127.0.0.1"} {
		verifyFor(t, p, host)
	}
}

func TestEnsureDevCertRenewsExpiringLeaf(t *testing.T) {
	dataDir := t.TempDir()
	p, err := EnsureDevCert(dataDir, nil)
	if err != nil {
		t.Fatal(err)
	}
	leaf := readCert(t, p.Cert)

	// 8 days before expiry: still reused.
	if _, err := ensureDevCert(dataDir, nil, leaf.NotAfter.Add(-8*24*time.Hour)); err != nil {
		t.Fatal(err)
	}
	if got := readCert(t, p.Cert); got.SerialNumber.Cmp(leaf.SerialNumber) != 0 {
		t.Fatal("leaf renewed 8 days before expiry")
	}

	// 6 days before expiry: renewed, CA kept.
	caBefore := readAll(t, p)["ca.pem"]
	later := leaf.NotAfter.Add(-6 * 24 * time.Hour)
	if _, err := ensureDevCert(dataDir, nil, later); err != nil {
		t.Fatal(err)
	}
	renewed := readCert(t, p.Cert)
	if renewed.SerialNumber.Cmp(leaf.SerialNumber) == 0 {
		t.Fatal("leaf not renewed 6 days before expiry")
	}
	if !renewed.NotAfter.After(leaf.NotAfter) {
		t.Errorf("renewed leaf expires %v, not after the old %v", renewed.NotAfter, leaf.NotAfter)
	}
	if !bytes.Equal(caBefore, readAll(t, p)["ca.pem"]) {
		t.Error("CA changed on leaf renewal")
	}
}

func TestEnsureDevCertReplacesBrokenCA(t *testing.T) {
	dataDir := t.TempDir()
	p, err := EnsureDevCert(dataDir, nil)
	if err != nil {
		t.Fatal(err)
	}
	oldCA := readCert(t, p.CA)
	if err := os.WriteFile(filepath.Join(dataDir, "tls", "ca-key.pem"), []byte("garbage"), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := EnsureDevCert(dataDir, nil); err != nil {
		t.Fatal(err)
	}
	if readCert(t, p.CA).SerialNumber.Cmp(oldCA.SerialNumber) == 0 {
		t.Fatal("CA with a broken key was kept")
	}
	// The leaf signed by the old CA no longer verifies, so it must have been
	// reissued by the new one.
	verifyFor(t, p, "localhost")
}

func TestEnsureDevCertRejectsBadHost(t *testing.T) {
	for _, host := range []string{"localhost:8443", "https://relay.test", "relay test", "-bad.test", "fe80::1%eth0"} {
		dataDir := t.TempDir()
		_, err := EnsureDevCert(dataDir, []string{host})
		if err == nil || !strings.Contains(err.Error(), host) {
			t.Errorf("host %q: err = %v, want an error naming it", host, err)
		}
		if _, err := os.Stat(filepath.Join(dataDir, "tls")); !os.IsNotExist(err) {
			t.Errorf("host %q: tls dir created despite the error", host)
		}
	}
}

func TestEnsureDevCertAcceptsHostForms(t *testing.T) {
	dataDir := t.TempDir()
	p, err := EnsureDevCert(dataDir, []string{"[2001:db8::1]", "*.relay.test", "::ffff:10.0.0.1", ""})
	if err != nil {
		t.Fatal(err)
	}
	for _, host := range []string{"2001:db8::1", "a.relay.test", "10.0.0.1"} {
		verifyFor(t, p, host)
	}
}

// verifyFor checks that the server certificate in p chains to p's CA for host.
func verifyFor(t *testing.T, p DevPaths, host string) {
	t.Helper()
	roots := x509.NewCertPool()
	roots.AddCert(readCert(t, p.CA))
	if _, err := readCert(t, p.Cert).Verify(x509.VerifyOptions{
		Roots:     roots,
		DNSName:   host,
		KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	}); err != nil {
		t.Errorf("verify for %s: %v", host, err)
	}
}

func readCert(t *testing.T, path string) *x509.Certificate {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	c, err := parseCertPEM(b)
	if err != nil {
		t.Fatalf("%s: %v", path, err)
	}
	return c
}

func readAll(t *testing.T, p DevPaths) map[string][]byte {
	t.Helper()
	out := map[string][]byte{}
	for _, name := range []string{"ca.pem", "ca-key.pem", "cert.pem", "key.pem"} {
		b, err := os.ReadFile(filepath.Join(filepath.Dir(p.CA), name))
		if err != nil {
			t.Fatal(err)
		}
		out[name] = b
	}
	return out
}
