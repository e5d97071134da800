package pushtest

import (
	"crypto"
	"crypto/ecdsa"
	"crypto/rsa"
	"crypto/sha256"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"math/big"
	"strings"
)

// The fakes verify JWTs by hand rather than with a JWT library: the
// clients sign with golang-jwt (APNs, via apns2) and x/oauth2's jws (FCM),
// and a verifier that shares no code with them cannot share their bugs.

// jwtHeader is the part of a JOSE header the fakes look at.
type jwtHeader struct {
	Alg string `json:"alg"`
	Kid string `json:"kid"`
	Typ string `json:"typ"`
}

// parsedJWT is a compact JWS split into its parts.
type parsedJWT struct {
	header jwtHeader
	claims []byte // the JSON of the claims
	signed []byte // "<header>.<claims>" as sent, the signing input
	sig    []byte
}

func parseJWT(s string) (*parsedJWT, error) {
	parts := strings.Split(s, ".")
	if len(parts) != 3 {
		return nil, errors.New("not a compact JWS (want three dot-separated parts)")
	}
	dec := base64.RawURLEncoding
	head, err := dec.DecodeString(parts[0])
	if err != nil {
		return nil, fmt.Errorf("header is not unpadded base64url: %v", err)
	}
	claims, err := dec.DecodeString(parts[1])
	if err != nil {
		return nil, fmt.Errorf("claims are not unpadded base64url: %v", err)
	}
	sig, err := dec.DecodeString(parts[2])
	if err != nil {
		return nil, fmt.Errorf("signature is not unpadded base64url: %v", err)
	}
	p := &parsedJWT{claims: claims, sig: sig, signed: []byte(parts[0] + "." + parts[1])}
	if err := json.Unmarshal(head, &p.header); err != nil {
		return nil, fmt.Errorf("header is not JSON: %v", err)
	}
	return p, nil
}

// verifyES256 checks an ES256 signature: the 64-byte r||s of ECDSA P-256
// over SHA-256 of the signing input (RFC 7518 section 3.4).
func (p *parsedJWT) verifyES256(pub *ecdsa.PublicKey) error {
	if p.header.Alg != "ES256" {
		return fmt.Errorf("alg %q, want ES256", p.header.Alg)
	}
	if len(p.sig) != 64 {
		return fmt.Errorf("ES256 signature of %d bytes, want 64", len(p.sig))
	}
	digest := sha256.Sum256(p.signed)
	r := new(big.Int).SetBytes(p.sig[:32])
	s := new(big.Int).SetBytes(p.sig[32:])
	if !ecdsa.Verify(pub, digest[:], r, s) {
		return errors.New("ES256 signature does not verify with the team's key")
	}
	return nil
}

// verifyRS256 checks an RS256 signature: RSASSA-PKCS1-v1_5 with SHA-256.
func (p *parsedJWT) verifyRS256(pub *rsa.PublicKey) error {
	if p.header.Alg != "RS256" {
		return fmt.Errorf("alg %q, want RS256", p.header.Alg)
	}
	digest := sha256.Sum256(p.signed)
	if err := rsa.VerifyPKCS1v15(pub, crypto.SHA256, digest[:], p.sig); err != nil {
		return errors.New("RS256 signature does not verify with the service account's key")
	}
	return nil
}
