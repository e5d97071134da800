package agent

import (
	"crypto/ed25519"
	"crypto/rand"
	"crypto/x509"
	"encoding/pem"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
)

// KeyFile is where the relay's signing key lives, relative to the data dir.
const KeyFile = "agent/relay.key"

// LoadOrCreateKey returns the relay's Ed25519 signing key from
// <dataDir>/agent/relay.key, generating it on first use.
//
// The key is long-lived: every paired runtime pins its public half, so
// losing or replacing it unpairs them all. It is written once, as PKCS #8
// PEM with mode 0600 in a 0700 directory, and never rewritten. Creation is
// race-free: the key is written to a temporary file and linked into place,
// which fails if another process got there first, and then that process's
// key is read instead. A key file that others can read is tightened back
// to 0600.
func LoadOrCreateKey(dataDir string) (ed25519.PrivateKey, error) {
	if dataDir == "" {
		return nil, errors.New("agent: relay key: empty data dir")
	}
	path := filepath.Join(dataDir, KeyFile)
	key, err := readKey(path)
	if err == nil || !errors.Is(err, fs.ErrNotExist) {
		return key, err
	}
	data, err := NewKeyPEM()
	if err != nil {
		return nil, err
	}
	if err := InstallKey(dataDir, data); err != nil && !errors.Is(err, fs.ErrExist) {
		return nil, err
	}
	// Ours, or another process's that got there first.
	return readKey(path)
}

// NewKeyPEM generates a signing key, encoded as the key file holds it
// (PKCS #8 PEM).
func NewKeyPEM() ([]byte, error) {
	_, priv, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		return nil, fmt.Errorf("agent: relay key: generate: %w", err)
	}
	der, err := x509.MarshalPKCS8PrivateKey(priv)
	if err != nil {
		return nil, fmt.Errorf("agent: relay key: encode: %w", err)
	}
	return pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: der}), nil
}

// KeyPEM returns the bytes of <dataDir>/agent/relay.key, or nil when there
// is no key file: what a cluster node compares with the cluster's key.
func KeyPEM(dataDir string) ([]byte, error) {
	data, err := os.ReadFile(filepath.Join(dataDir, KeyFile))
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("agent: relay key: %w", err)
	}
	return data, nil
}

// InstallKey writes data (a PEM key, as NewKeyPEM makes) as the key file,
// failing with fs.ErrExist when there is one already: a cluster node that
// has none adopts the cluster's key this way, and keeps it.
func InstallKey(dataDir string, data []byte) error {
	path := filepath.Join(dataDir, KeyFile)
	if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
		return fmt.Errorf("agent: relay key: %w", err)
	}
	return createExclusive(path, data)
}

// readKey reads and parses the key file, tightening its mode.
func readKey(path string) (ed25519.PrivateKey, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("agent: relay key: %w", err)
	}
	st, err := os.Stat(path)
	if err != nil {
		return nil, fmt.Errorf("agent: relay key: %w", err)
	}
	if st.Mode().Perm()&0o077 != 0 {
		if err := os.Chmod(path, 0o600); err != nil {
			return nil, fmt.Errorf("agent: relay key: %w", err)
		}
	}
	block, _ := pem.Decode(data)
	if block == nil || block.Type != "PRIVATE KEY" {
		return nil, fmt.Errorf("agent: relay key %s: not a PEM private key", path)
	}
	parsed, err := x509.ParsePKCS8PrivateKey(block.Bytes)
	if err != nil {
		return nil, fmt.Errorf("agent: relay key %s: %w", path, err)
	}
	key, ok := parsed.(ed25519.PrivateKey)
	if !ok {
		return nil, fmt.Errorf("agent: relay key %s: not an Ed25519 key", path)
	}
	return key, nil
}

// createExclusive writes data to a synced temporary file and links it to
// path, failing with fs.ErrExist when path exists.
func createExclusive(path string, data []byte) error {
	f, err := os.CreateTemp(filepath.Dir(path), ".relay.key.tmp*")
	if err != nil {
		return fmt.Errorf("agent: relay key: %w", err)
	}
	tmp := f.Name()
	defer os.Remove(tmp)
	// CreateTemp makes the file 0600 already; Chmod makes sure of it
	// before a byte of the key is written.
	if err := f.Chmod(0o600); err != nil {
		f.Close()
		return fmt.Errorf("agent: relay key: %w", err)
	}
	if _, err := f.Write(data); err != nil {
		f.Close()
		return fmt.Errorf("agent: relay key: %w", err)
	}
	if err := f.Sync(); err != nil {
		f.Close()
		return fmt.Errorf("agent: relay key: %w", err)
	}
	if err := f.Close(); err != nil {
		return fmt.Errorf("agent: relay key: %w", err)
	}
	if err := os.Link(tmp, path); err != nil {
		return fmt.Errorf("agent: relay key: %w", err)
	}
	if d, err := os.Open(filepath.Dir(path)); err == nil {
		_ = d.Sync() // the link survives a crash
		d.Close()
	}
	return nil
}
