package agent_test

import (
	"bytes"
	"crypto/ed25519"
	"encoding/base64"
	"encoding/hex"
	"errors"
	"os"
	"path/filepath"
	"sync"
	"testing"

	"edgerelay/fastpath/agent"
	"edgerelay/fastpath/agent/agenttest"
)

// The two test vectors of the spec ("Handshake"): the signed bytes and the
// signature, byte for byte, with RFC 8032's first test key.
func TestSigningVectors(t *testing.T) {
	seed, _ := hex.DecodeString("9d61b19deffd5a60ba844af492ec2cc44449c5697b326919703bac031cae7f60")
	key := ed25519.NewKeyFromSeed(seed)
	if got := agent.PublicKeyString(key.Public().(ed25519.PublicKey)); got != "11qYAYKxCrfVS/7TyWQHOg7hcvPapiMlrwIaaPcHURo=" {
		t.Fatalf("public key %q", got)
	}
	seq := make([]byte, 32)
	for i := range seq {
		seq[i] = byte(i)
	}
	vectors := []struct {
		name   string
		nonce  []byte
		input  []byte
		sigB64 string
	}{
		{
			name:   "nonce 0x00..0x1f",
			nonce:  seq,
			input:  mustHex(t, "636f6e74656e6f782d72656c61792f77656c636f6d652f76310041414543417751464267634943516f4c4441304f4478415245684d554652595847426b6147787764486838003100696e73742d61"),
			sigB64: "BpDNckIQUJtLKlN6Wyg7KP5IZP19gcekPg+9aBx1vuQS86Og0lG2/EINgZl6GCO5npD5x5pWVQtj1lFcdPUUBw==",
		},
		{
			name:   "nonce aabb",
			nonce:  []byte{0xaa, 0xbb},
			input:  []byte("contenox-relay/welcome/v1\x00qrs\x001\x00inst-a"),
			sigB64: "zfjhAjfsmhaLyK/Z63pJuZC5YMyInX9QgAbay31z3yvs43DW28se42LoHvGimR7PUg9dNHAZTFS2pVAWKlcOAQ==",
		},
	}
	for _, v := range vectors {
		t.Run(v.name, func(t *testing.T) {
			in, err := agent.SigningInput(v.nonce, 1, "inst-a")
			if err != nil {
				t.Fatal(err)
			}
			if !bytes.Equal(in, v.input) {
				t.Fatalf("signing input\n got %x\nwant %x", in, v.input)
			}
			sig, err := agent.SignWelcome(key, v.nonce, 1, "inst-a")
			if err != nil {
				t.Fatal(err)
			}
			if got := base64.StdEncoding.EncodeToString(sig); got != v.sigB64 {
				t.Fatalf("sig %s, want %s", got, v.sigB64)
			}
			// The test connector's independent verifier agrees.
			if err := agenttest.Verify("11qYAYKxCrfVS/7TyWQHOg7hcvPapiMlrwIaaPcHURo=", v.nonce, 1, "inst-a", sig); err != nil {
				t.Fatal(err)
			}
		})
	}
}

func mustHex(t *testing.T, s string) []byte {
	t.Helper()
	b, err := hex.DecodeString(s)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func TestSigningInputRefusals(t *testing.T) {
	if _, err := agent.SigningInput(nil, 1, "i"); !errors.Is(err, agent.ErrNonceSize) {
		t.Errorf("empty nonce: %v", err)
	}
	if _, err := agent.SigningInput(make([]byte, 65), 1, "i"); !errors.Is(err, agent.ErrNonceSize) {
		t.Errorf("65-byte nonce: %v", err)
	}
	if _, err := agent.SigningInput(make([]byte, 64), 1, "i"); err != nil {
		t.Errorf("64-byte nonce: %v", err)
	}
	if _, err := agent.SigningInput(make([]byte, 32), 1, "a\x00b"); !errors.Is(err, agent.ErrNulByte) {
		t.Errorf("NUL in instance: %v", err)
	}
}

func TestRelayKeyFile(t *testing.T) {
	dir := t.TempDir()
	key, err := agent.LoadOrCreateKey(dir)
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(dir, agent.KeyFile)
	st, err := os.Stat(path)
	if err != nil {
		t.Fatal(err)
	}
	if st.Mode().Perm() != 0o600 {
		t.Errorf("key file mode %v, want 0600", st.Mode().Perm())
	}
	if dst, _ := os.Stat(filepath.Dir(path)); dst.Mode().Perm() != 0o700 {
		t.Errorf("key dir mode %v, want 0700", dst.Mode().Perm())
	}
	pub := agent.PublicKeyString(key.Public().(ed25519.PublicKey))
	if len(pub) != 44 || pub[43] != '=' {
		t.Errorf("published key %q is not 44 characters of padded base64", pub)
	}

	// The key is kept: a restart signs with the same key.
	if err := os.Chmod(path, 0o644); err != nil {
		t.Fatal(err)
	}
	again, err := agent.LoadOrCreateKey(dir)
	if err != nil {
		t.Fatal(err)
	}
	if !key.Equal(again) {
		t.Fatal("second load returned another key")
	}
	if st, _ := os.Stat(path); st.Mode().Perm() != 0o600 {
		t.Errorf("widened key file left at %v", st.Mode().Perm())
	}

	// Racing first starts agree on one key.
	dir2 := t.TempDir()
	keys := make([]ed25519.PrivateKey, 8)
	var wg sync.WaitGroup
	for i := range keys {
		wg.Go(func() {
			k, err := agent.LoadOrCreateKey(dir2)
			if err != nil {
				t.Error(err)
			}
			keys[i] = k
		})
	}
	wg.Wait()
	for _, k := range keys[1:] {
		if !k.Equal(keys[0]) {
			t.Fatal("concurrent first loads made different keys")
		}
	}

	bad := t.TempDir()
	_ = os.MkdirAll(filepath.Join(bad, "agent"), 0o700)
	_ = os.WriteFile(filepath.Join(bad, agent.KeyFile), []byte("not a key"), 0o600)
	if _, err := agent.LoadOrCreateKey(bad); err == nil {
		t.Fatal("a corrupt key file was accepted")
	}
}
