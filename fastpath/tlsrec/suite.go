package tlsrec

import (
	"crypto/aes"
	"crypto/cipher"
	"crypto/hkdf"
	"crypto/sha256"
	"crypto/sha512"
	"crypto/tls"
	"errors"
	"fmt"
	"hash"

	"golang.org/x/crypto/chacha20poly1305"
)

// A suite is what the record layer needs of a TLS 1.3 cipher suite: its
// hash (for HKDF) and its AEAD.
type suite struct {
	id     uint16
	hash   func() hash.Hash
	keyLen int
	aead   func(key []byte) (cipher.AEAD, error)
}

var (
	aes128GCM = suite{tls.TLS_AES_128_GCM_SHA256, sha256.New, 16, newGCM}
	aes256GCM = suite{tls.TLS_AES_256_GCM_SHA384, sha512.New384, 32, newGCM}
	chacha20  = suite{tls.TLS_CHACHA20_POLY1305_SHA256, sha256.New, chacha20poly1305.KeySize, chacha20poly1305.New}
)

// suiteByID is the suite with TLS 1.3 cipher suite id, nil for any other.
func suiteByID(id uint16) *suite {
	switch id {
	case aes128GCM.id:
		return &aes128GCM
	case aes256GCM.id:
		return &aes256GCM
	case chacha20.id:
		return &chacha20
	}
	return nil
}

func newGCM(key []byte) (cipher.AEAD, error) {
	block, err := aes.NewCipher(key)
	if err != nil {
		return nil, err
	}
	return cipher.NewGCM(block)
}

// nonceLen is the length of every TLS 1.3 AEAD's nonce (RFC 8446 5.3).
const nonceLen = 12

// expandLabel is HKDF-Expand-Label (RFC 8446 7.1) with an empty context.
func (s *suite) expandLabel(secret []byte, label string, n int) ([]byte, error) {
	const prefix = "tls13 "
	if len(prefix)+len(label) > 255 || n > 0xffff {
		return nil, errors.New("tlsrec: label too long")
	}
	info := make([]byte, 0, 4+len(prefix)+len(label))
	info = append(info, byte(n>>8), byte(n), byte(len(prefix)+len(label)))
	info = append(info, prefix...)
	info = append(info, label...)
	info = append(info, 0) // the context: empty
	out, err := hkdf.Expand(s.hash, secret, string(info), n)
	if err != nil {
		return nil, fmt.Errorf("tlsrec: expand %q: %w", label, err)
	}
	return out, nil
}

// A half is one direction's record protection: its traffic secret (kept
// for KeyUpdate), the next record's sequence number, the key and IV
// derived from the secret (kept: a wake then only expands the key, with
// no HKDF), and the AEAD made of them, nil while idle.
type half struct {
	secret   []byte
	key      []byte
	seq      uint64
	aead     cipher.AEAD
	iv       [nonceLen]byte
	nonceBuf [nonceLen]byte // nonce's result: a local array passed to the AEAD would escape
}

// ready makes the AEAD, unless it has it, deriving the key and IV from
// the secret first when it has not yet.
func (h *half) ready(s *suite) error {
	if h.aead != nil {
		return nil
	}
	if h.key == nil {
		key, err := s.expandLabel(h.secret, "key", s.keyLen)
		if err != nil {
			return err
		}
		iv, err := s.expandLabel(h.secret, "iv", nonceLen)
		if err != nil {
			return err
		}
		h.key = key
		copy(h.iv[:], iv)
	}
	aead, err := s.aead(h.key)
	if err != nil {
		return fmt.Errorf("tlsrec: cipher: %w", err)
	}
	h.aead = aead
	return nil
}

// nonce is the next record's nonce: the IV XORed with the sequence number
// (RFC 8446 5.3). It aliases h until the next call.
func (h *half) nonce() []byte {
	h.nonceBuf = h.iv
	for i := range 8 {
		h.nonceBuf[nonceLen-1-i] ^= byte(h.seq >> (8 * i))
	}
	return h.nonceBuf[:]
}

// next moves to the next record; a sequence number never wraps (RFC 8446
// 5.3: rekey first, which the writer does long before).
func (h *half) next() error {
	if h.seq == ^uint64(0) {
		return errors.New("tlsrec: sequence number exhausted")
	}
	h.seq++
	return nil
}

// update moves to the next traffic secret (RFC 8446 7.2, KeyUpdate).
func (h *half) update(s *suite) error {
	next, err := s.expandLabel(h.secret, "traffic upd", len(h.secret))
	if err != nil {
		return err
	}
	h.secret, h.key, h.seq, h.aead = next, nil, 0, nil
	return nil
}

// idle drops the AEAD; ready rebuilds it.
func (h *half) idle() { h.aead = nil }
