package agent

import (
	"crypto/ed25519"
	"encoding/base64"
	"errors"
	"fmt"
	"strconv"
	"strings"
)

// The relay's side of the welcome signature (spec "Handshake", point 3).
// The layout must match librelay's byte for byte: real connectors verify
// it with librelay.VerifyWelcome against the key they pinned at pairing.

// SigningDomain is the domain-separation tag every welcome signature starts
// with, so that a signature can never be replayed into another context
// that signs with the same key.
const SigningDomain = "contenox-relay/welcome/v1"

// Nonce bounds: connectors send NonceSize bytes; the relay signs at most
// MaxNonceBytes, which bounds the work one unauthenticated hello can ask for.
const (
	NonceSize     = 32
	MaxNonceBytes = 64
)

// Errors of SigningInput.
var (
	ErrNonceSize = errors.New("agent: nonce is empty or longer than 64 bytes")
	ErrNulByte   = errors.New("agent: instance holds a NUL byte")
)

// SigningInput is the byte string a welcome signature covers:
//
//	SigningDomain 0x00 base64url-unpadded(nonce) 0x00 decimal(version) 0x00 instance
//
// The nonce travels as padded standard base64 in the hello but is signed
// as unpadded base64url. The NUL separators make the parse unambiguous,
// which is why an instance holding a NUL is refused rather than signed.
// The version is the one the relay selected, not the one it was offered.
func SigningInput(nonce []byte, version int, instance string) ([]byte, error) {
	if len(nonce) == 0 || len(nonce) > MaxNonceBytes {
		return nil, fmt.Errorf("%w: %d bytes", ErrNonceSize, len(nonce))
	}
	if strings.IndexByte(instance, 0) >= 0 {
		return nil, ErrNulByte
	}
	enc := base64.RawURLEncoding
	buf := make([]byte, 0, len(SigningDomain)+enc.EncodedLen(len(nonce))+len(instance)+24)
	buf = append(buf, SigningDomain...)
	buf = append(buf, 0)
	buf = enc.AppendEncode(buf, nonce)
	buf = append(buf, 0)
	buf = strconv.AppendInt(buf, int64(version), 10)
	buf = append(buf, 0)
	return append(buf, instance...), nil
}

// SignWelcome signs the welcome for nonce, the selected version and the
// instance with the relay's key.
func SignWelcome(key ed25519.PrivateKey, nonce []byte, version int, instance string) ([]byte, error) {
	if len(key) != ed25519.PrivateKeySize {
		return nil, errors.New("agent: sign welcome: not an Ed25519 private key")
	}
	input, err := SigningInput(nonce, version, instance)
	if err != nil {
		return nil, err
	}
	return ed25519.Sign(key, input), nil
}

// PublicKeyString is the relay's public key as it is published and pinned:
// padded standard base64, 44 characters, no whitespace.
func PublicKeyString(pub ed25519.PublicKey) string {
	return base64.StdEncoding.EncodeToString(pub)
}
