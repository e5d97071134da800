// Package tlsconf provides TLS for the relay's listeners: a development
// certificate authority kept in the data directory, a certificate holder that
// can be reloaded on SIGHUP without dropping connections, and the server
// tls.Config every listener uses.
package tlsconf

import (
	"crypto"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"fmt"
	"io/fs"
	"math/big"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"
)

const (
	// devCAValidity is long so that a developer trusts the CA once and keeps
	// trusting it; only the leaf is rotated.
	devCAValidity = 10 * 365 * 24 * time.Hour
	// devLeafValidity stays within what browsers and Apple platforms accept
	// for a server certificate (398 days).
	devLeafValidity = 365 * 24 * time.Hour
	// renewBefore regenerates a certificate that expires this soon, so a
	// server started shortly before expiry does not serve a certificate that
	// dies while it runs.
	renewBefore = 7 * 24 * time.Hour
	// backdate absorbs small clock differences between the relay and its
	// clients: a certificate made "now" is already valid on a client whose
	// clock is a little behind.
	backdate = time.Hour
)

// DevPaths are the files EnsureDevCert keeps in <data dir>/tls.
type DevPaths struct {
	// CA is the PEM certificate of the development CA: the file a client
	// (browser, agent runtime, SDK) is told to trust.
	CA string
	// Cert is the PEM server certificate, signed by the CA.
	Cert string
	// Key is the PEM (PKCS #8) private key of Cert, mode 0600.
	Key string
}

// EnsureDevCert makes sure <dataDir>/tls holds a development CA (ca.pem,
// ca-key.pem) and a server certificate signed by it (cert.pem, key.pem) for
// localhost, 127.0.0.1, ::1 and the extra hosts given (DNS names or IP
// addresses, without port). Keys are ECDSA P-256 and written with mode 0600.
//
// Existing files are reused as long as they are valid, so a developer who
// trusted ca.pem once keeps a working set-up across restarts. The server
// certificate is regenerated when it is unreadable, not signed by the CA,
// expires within 7 days or lacks one of the hosts; the CA is regenerated
// (and with it the server certificate) only when it is missing, unusable or
// expires within 7 days. Files are replaced atomically (write, then rename).
//
// A host that is neither an IP address nor a DNS name is an error, and then
// nothing is written.
func EnsureDevCert(dataDir string, hosts []string) (DevPaths, error) {
	return ensureDevCert(dataDir, hosts, time.Now())
}

// ensureDevCert is EnsureDevCert at a given time, so that tests can move the
// clock past a certificate's renewal point.
func ensureDevCert(dataDir string, extraHosts []string, now time.Time) (DevPaths, error) {
	if dataDir == "" {
		return DevPaths{}, errors.New("tlsconf: dev cert: empty data dir")
	}
	// Every development certificate covers loopback: the relay listens there
	// by default, and clients reach it by any of these names.
	hosts := append([]string{"localhost", "127.0.0.1", "::1"}, extraHosts...)
	want, err := parseHosts(hosts)
	if err != nil {
		return DevPaths{}, err
	}

	dir := filepath.Join(dataDir, "tls")
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return DevPaths{}, fmt.Errorf("tlsconf: dev cert: %w", err)
	}
	paths := DevPaths{
		CA:   filepath.Join(dir, "ca.pem"),
		Cert: filepath.Join(dir, "cert.pem"),
		Key:  filepath.Join(dir, "key.pem"),
	}
	caKeyPath := filepath.Join(dir, "ca-key.pem")

	ca, caKey, err := loadCA(paths.CA, caKeyPath, now)
	if err != nil {
		return DevPaths{}, err
	}
	if ca == nil {
		if ca, caKey, err = createCA(paths.CA, caKeyPath, now); err != nil {
			return DevPaths{}, err
		}
	}

	ok, err := leafUsable(paths.Cert, paths.Key, ca, want, now)
	if err != nil {
		return DevPaths{}, err
	}
	if !ok {
		if err := createLeaf(paths.Cert, paths.Key, ca, caKey, want, now); err != nil {
			return DevPaths{}, err
		}
	}
	return paths, nil
}

// hostSet is the set of names a server certificate must cover, split the way
// X.509 stores them.
type hostSet struct {
	dns []string
	ips []netip.Addr
}

// parseHosts splits hosts into DNS names and IP addresses, lower-cased and
// without duplicates, and rejects anything else (a port, a scheme, a path)
// with an error naming the offending host.
func parseHosts(hosts []string) (hostSet, error) {
	var hs hostSet
	for _, h := range hosts {
		h = strings.TrimSpace(h)
		if h == "" {
			continue
		}
		if ip, err := netip.ParseAddr(strings.TrimSuffix(strings.TrimPrefix(h, "["), "]")); err == nil {
			if ip.Zone() != "" {
				return hostSet{}, fmt.Errorf("tlsconf: dev cert host %q: an IPv6 zone cannot go in a certificate", h)
			}
			ip = ip.Unmap()
			if !slices.Contains(hs.ips, ip) {
				hs.ips = append(hs.ips, ip)
			}
			continue
		}
		name := strings.ToLower(strings.TrimSuffix(h, "."))
		if !validDNSName(name) {
			return hostSet{}, fmt.Errorf("tlsconf: dev cert host %q: not a DNS name or IP address (give it without port or scheme)", h)
		}
		if !slices.Contains(hs.dns, name) {
			hs.dns = append(hs.dns, name)
		}
	}
	return hs, nil
}

// validDNSName accepts a lower-case host name of letters, digits and hyphens,
// optionally starting with a "*." wildcard label.
func validDNSName(name string) bool {
	name = strings.TrimPrefix(name, "*.")
	if name == "" || len(name) > 253 {
		return false
	}
	for label := range strings.SplitSeq(name, ".") {
		if label == "" || len(label) > 63 || label[0] == '-' || label[len(label)-1] == '-' {
			return false
		}
		for _, c := range []byte(label) {
			if !('a' <= c && c <= 'z' || '0' <= c && c <= '9' || c == '-') {
				return false
			}
		}
	}
	return true
}

// loadCA returns the CA in certPath/keyPath if it can sign for the coming
// days. A missing, corrupt, mismatched or expiring CA yields (nil, nil, nil):
// the caller makes a new one. Only an I/O error other than "does not exist"
// is returned as an error, so that a permission problem is reported instead
// of being "fixed" by replacing a CA the developer already trusts.
func loadCA(certPath, keyPath string, now time.Time) (*x509.Certificate, crypto.Signer, error) {
	certPEM, err := readOptional(certPath)
	if err != nil || certPEM == nil {
		return nil, nil, err
	}
	keyPEM, err := readOptional(keyPath)
	if err != nil || keyPEM == nil {
		return nil, nil, err
	}
	cert, err := parseCertPEM(certPEM)
	if err != nil {
		return nil, nil, nil
	}
	key, err := parseKeyPEM(keyPEM)
	if err != nil {
		return nil, nil, nil
	}
	pub, ok := key.Public().(interface{ Equal(crypto.PublicKey) bool })
	if !ok || !pub.Equal(cert.PublicKey) {
		return nil, nil, nil
	}
	if !cert.IsCA || cert.KeyUsage&x509.KeyUsageCertSign == 0 ||
		now.Before(cert.NotBefore) || now.Add(renewBefore).After(cert.NotAfter) {
		return nil, nil, nil
	}
	if err := tightenKeyMode(keyPath); err != nil {
		return nil, nil, err
	}
	return cert, key, nil
}

// leafUsable reports whether certPath/keyPath hold a matching pair signed by
// ca that covers every wanted host and stays valid beyond renewBefore. As in
// loadCA, only unexpected I/O errors are errors.
func leafUsable(certPath, keyPath string, ca *x509.Certificate, want hostSet, now time.Time) (bool, error) {
	certPEM, err := readOptional(certPath)
	if err != nil || certPEM == nil {
		return false, err
	}
	keyPEM, err := readOptional(keyPath)
	if err != nil || keyPEM == nil {
		return false, err
	}
	pair, err := tls.X509KeyPair(certPEM, keyPEM) // also checks that key matches cert
	if err != nil {
		return false, nil
	}
	leaf, err := x509.ParseCertificate(pair.Certificate[0])
	if err != nil {
		return false, nil
	}
	roots := x509.NewCertPool()
	roots.AddCert(ca)
	if _, err := leaf.Verify(x509.VerifyOptions{
		Roots:       roots,
		CurrentTime: now,
		KeyUsages:   []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	}); err != nil {
		return false, nil
	}
	if now.Add(renewBefore).After(leaf.NotAfter) {
		return false, nil
	}
	for _, name := range want.dns {
		if !slices.ContainsFunc(leaf.DNSNames, func(n string) bool { return strings.EqualFold(n, name) }) {
			return false, nil
		}
	}
	for _, ip := range want.ips {
		if !slices.ContainsFunc(leaf.IPAddresses, func(have net.IP) bool { return have.Equal(ip.AsSlice()) }) {
			return false, nil
		}
	}
	if err := tightenKeyMode(keyPath); err != nil {
		return false, err
	}
	return true, nil
}

// createCA makes a new self-signed CA and writes it, key first: should the
// process die in between, the next run finds a key that does not match the
// certificate and starts over instead of using a half-written pair.
func createCA(certPath, keyPath string, now time.Time) (*x509.Certificate, crypto.Signer, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, nil, fmt.Errorf("tlsconf: dev CA key: %w", err)
	}
	serial, err := randomSerial()
	if err != nil {
		return nil, nil, err
	}
	// The host name in the subject tells apart the CAs of several machines
	// once a developer has trusted more than one.
	cn := "edgerelay development CA"
	if h, err := os.Hostname(); err == nil && h != "" {
		cn += " (" + h + ")"
	}
	tmpl := &x509.Certificate{
		SerialNumber:          serial,
		Subject:               pkix.Name{Organization: []string{"edgerelay development"}, CommonName: cn},
		NotBefore:             now.Add(-backdate),
		NotAfter:              now.Add(devCAValidity),
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageCRLSign | x509.KeyUsageDigitalSignature,
		BasicConstraintsValid: true,
		IsCA:                  true,
		MaxPathLenZero:        true, // signs leaves only, never another CA
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, key.Public(), key)
	if err != nil {
		return nil, nil, fmt.Errorf("tlsconf: dev CA certificate: %w", err)
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		return nil, nil, fmt.Errorf("tlsconf: dev CA certificate: %w", err)
	}
	if err := writeKeyAndCert(certPath, keyPath, der, key); err != nil {
		return nil, nil, err
	}
	return cert, key, nil
}

// createLeaf issues a server certificate for want, signed by ca, and writes
// it key first (see createCA). Its validity never outlasts the CA's.
func createLeaf(certPath, keyPath string, ca *x509.Certificate, caKey crypto.Signer, want hostSet, now time.Time) error {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return fmt.Errorf("tlsconf: dev server key: %w", err)
	}
	serial, err := randomSerial()
	if err != nil {
		return err
	}
	notAfter := now.Add(devLeafValidity)
	if notAfter.After(ca.NotAfter) {
		notAfter = ca.NotAfter
	}
	ips := make([]net.IP, len(want.ips))
	for i, ip := range want.ips {
		ips[i] = ip.AsSlice()
	}
	tmpl := &x509.Certificate{
		SerialNumber:          serial,
		Subject:               pkix.Name{Organization: []string{"edgerelay development"}, CommonName: "edgerelay development server"},
		NotBefore:             now.Add(-backdate),
		NotAfter:              notAfter,
		KeyUsage:              x509.KeyUsageDigitalSignature,
		ExtKeyUsage:           []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
		BasicConstraintsValid: true,
		DNSNames:              want.dns,
		IPAddresses:           ips,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca, key.Public(), caKey)
	if err != nil {
		return fmt.Errorf("tlsconf: dev server certificate: %w", err)
	}
	return writeKeyAndCert(certPath, keyPath, der, key)
}

func writeKeyAndCert(certPath, keyPath string, certDER []byte, key *ecdsa.PrivateKey) error {
	keyDER, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		return fmt.Errorf("tlsconf: encode key %s: %w", keyPath, err)
	}
	if err := writeFileAtomic(keyPath, pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: keyDER}), 0o600); err != nil {
		return err
	}
	return writeFileAtomic(certPath, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: certDER}), 0o644)
}

// writeFileAtomic writes data to a temporary file next to path and renames it
// over path, so that a reader (a Reloader, a client reading ca.pem) sees the
// old content or the new one, never a partial file.
func writeFileAtomic(path string, data []byte, perm fs.FileMode) error {
	f, err := os.CreateTemp(filepath.Dir(path), "."+filepath.Base(path)+".tmp*")
	if err != nil {
		return fmt.Errorf("tlsconf: write %s: %w", path, err)
	}
	tmp := f.Name()
	fail := func(err error) error {
		f.Close()
		os.Remove(tmp)
		return fmt.Errorf("tlsconf: write %s: %w", path, err)
	}
	// CreateTemp makes the file 0600 already; Chmod sets the final mode
	// before any byte is written, so a key is never readable by others.
	if err := f.Chmod(perm); err != nil {
		return fail(err)
	}
	if _, err := f.Write(data); err != nil {
		return fail(err)
	}
	if err := f.Sync(); err != nil {
		return fail(err)
	}
	if err := f.Close(); err != nil {
		os.Remove(tmp)
		return fmt.Errorf("tlsconf: write %s: %w", path, err)
	}
	if err := os.Rename(tmp, path); err != nil {
		os.Remove(tmp)
		return fmt.Errorf("tlsconf: write %s: %w", path, err)
	}
	return nil
}

// tightenKeyMode sets a reused key file back to 0600 if someone widened it:
// it holds the private key of a CA the developer's machine trusts.
func tightenKeyMode(path string) error {
	st, err := os.Stat(path)
	if err != nil {
		return fmt.Errorf("tlsconf: %w", err)
	}
	if st.Mode().Perm()&0o077 != 0 {
		if err := os.Chmod(path, 0o600); err != nil {
			return fmt.Errorf("tlsconf: %w", err)
		}
	}
	return nil
}

// readOptional reads path; a file that does not exist is (nil, nil).
func readOptional(path string) ([]byte, error) {
	b, err := os.ReadFile(path)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("tlsconf: %w", err)
	}
	return b, nil
}

func parseCertPEM(data []byte) (*x509.Certificate, error) {
	for {
		var block *pem.Block
		block, data = pem.Decode(data)
		if block == nil {
			return nil, errors.New("tlsconf: no CERTIFICATE block")
		}
		if block.Type == "CERTIFICATE" {
			return x509.ParseCertificate(block.Bytes)
		}
	}
}

// parseKeyPEM accepts the PKCS #8 keys this package writes and the SEC 1
// ("EC PRIVATE KEY") form openssl produces, so a hand-made CA works too.
func parseKeyPEM(data []byte) (crypto.Signer, error) {
	for {
		var block *pem.Block
		block, data = pem.Decode(data)
		if block == nil {
			return nil, errors.New("tlsconf: no private key block")
		}
		switch block.Type {
		case "PRIVATE KEY":
			k, err := x509.ParsePKCS8PrivateKey(block.Bytes)
			if err != nil {
				return nil, err
			}
			s, ok := k.(crypto.Signer)
			if !ok {
				return nil, fmt.Errorf("tlsconf: key type %T cannot sign", k)
			}
			return s, nil
		case "EC PRIVATE KEY":
			return x509.ParseECPrivateKey(block.Bytes)
		}
	}
}

// randomSerial returns a positive 128-bit serial number: unique enough that
// a browser never sees two certificates with the same issuer and serial.
func randomSerial() (*big.Int, error) {
	n, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 128))
	if err != nil {
		return nil, fmt.Errorf("tlsconf: serial number: %w", err)
	}
	return n.Add(n, big.NewInt(1)), nil
}
