package link

import (
	"crypto/aes"
	"crypto/cipher"
	"encoding/binary"
	"errors"
	"fmt"
)

// Envelope layout (spec/mailbox.md):
//
//	offset 0      1 byte   version, 0x01
//	offset 1      8 bytes  sequence, unsigned big-endian, >= 1
//	offset 9      n bytes  AES-256-GCM ciphertext of the message
//	offset 9+n   16 bytes  GCM tag
//
// nonce = 4 zero bytes || the 8 sequence bytes; AAD = the first 9 bytes.
// A signal frame has the same layout with a millisecond counter in place of
// the sequence.
const (
	// Version is the first byte of every envelope and signal frame.
	Version = 0x01
	// HeaderSize is the version byte and the sequence: the AAD.
	HeaderSize = 1 + 8
	// TagSize is the size of the GCM tag that ends an envelope.
	TagSize = 16
	// Overhead is what sealing adds to a message; it is also the smallest
	// envelope (an empty message), the relay's lower bound of 25 bytes.
	Overhead = HeaderSize + TagSize
)

const nonceSize = 12

// Errors of opening. Each is returned as is (no wrapping, which would
// allocate), and each message says what failed.
var (
	// ErrMalformed: the envelope is too short, has another version or a
	// sequence of 0. Use errors.Is: the returned error says which.
	ErrMalformed = errors.New("link: malformed envelope")
	// ErrBadTag: the GCM tag does not verify. The envelope was sealed under
	// another key, or its header or body was changed.
	ErrBadTag = errors.New("link: envelope does not authenticate (bad tag)")
	// ErrZeroSeq: Seal was asked for sequence 0. Writers number from 1; the
	// relay refuses 0, and a reader would too.
	ErrZeroSeq = errors.New("link: sequence 0 is not allowed (envelopes are numbered from 1)")

	errShort   = fmt.Errorf("%w: shorter than %d bytes", ErrMalformed, Overhead)
	errVersion = fmt.Errorf("%w: version byte is not 0x01", ErrMalformed)
	errSeqZero = fmt.Errorf("%w: sequence 0", ErrMalformed)
)

// Sealer seals and opens envelopes under one key.
//
// It builds its cipher.AEAD once, so Seal and Open pay no key schedule, and it
// keeps the nonce in a field rather than on the stack: a slice handed to a
// method of the cipher.AEAD interface escapes, and a stack nonce would cost a
// heap allocation per call. That scratch field is why a Sealer is not safe for
// concurrent use; give each goroutine its own (NewSealer is cheap).
type Sealer struct {
	aead  cipher.AEAD
	nonce [nonceSize]byte
}

// NewSealer returns a Sealer for an AES-256-GCM key, such as
// Link.EnvelopeKey or Link.SignalKey.
func NewSealer(key [KeySize]byte) (*Sealer, error) {
	block, err := aes.NewCipher(key[:])
	if err != nil {
		return nil, fmt.Errorf("link: aes: %w", err)
	}
	aead, err := cipher.NewGCM(block)
	if err != nil {
		return nil, fmt.Errorf("link: gcm: %w", err)
	}
	return &Sealer{aead: aead}, nil
}

// Seal appends the envelope of plaintext with sequence seq to dst and returns
// the extended slice. With cap(dst)-len(dst) >= len(plaintext)+Overhead it
// does not allocate. The spare capacity of dst must not overlap plaintext:
// the header is written before the plaintext is read.
//
// The writer must never seal two messages with one sequence under one key:
// the nonce is the sequence, and a repeated GCM nonce gives the key away.
// Sequence 0 is refused with ErrZeroSeq (and dst is returned unchanged).
func (s *Sealer) Seal(dst []byte, seq uint64, plaintext []byte) ([]byte, error) {
	if seq == 0 {
		return dst, ErrZeroSeq
	}
	return s.seal(dst, seq, plaintext), nil
}

// seal is Seal without the check, for signal frames, whose counter is never 0.
func (s *Sealer) seal(dst []byte, seq uint64, plaintext []byte) []byte {
	n := len(dst)
	dst = append(dst, Version)
	dst = binary.BigEndian.AppendUint64(dst, seq)
	binary.BigEndian.PutUint64(s.nonce[4:], seq)
	return s.aead.Seal(dst, s.nonce[:], plaintext, dst[n:n+HeaderSize])
}

// Open checks an envelope and appends its plaintext to dst, returning the
// envelope's sequence and the extended slice. With enough capacity in dst it
// does not allocate. dst must not overlap envelope.
//
// Errors: ErrMalformed (wrapped by a more precise error: use errors.Is) for an
// envelope under Overhead bytes, another version or sequence 0; ErrBadTag when
// the tag does not verify. Open does not know which sequences were accepted
// before; Reader does.
func (s *Sealer) Open(dst, envelope []byte) (seq uint64, plaintext []byte, err error) {
	if len(envelope) < Overhead {
		return 0, nil, errShort
	}
	if envelope[0] != Version {
		return 0, nil, errVersion
	}
	seq = binary.BigEndian.Uint64(envelope[1:HeaderSize])
	if seq == 0 {
		return 0, nil, errSeqZero
	}
	binary.BigEndian.PutUint64(s.nonce[4:], seq)
	plaintext, err = s.aead.Open(dst, s.nonce[:], envelope[HeaderSize:], envelope[:HeaderSize])
	if err != nil {
		return 0, nil, ErrBadTag
	}
	return seq, plaintext, nil
}

// Sequence returns the sequence of an envelope without opening it, as the
// relay reads it: ok is false for an envelope that Open would call
// malformed. The sequence is not authenticated until Open succeeds.
func Sequence(envelope []byte) (seq uint64, ok bool) {
	if len(envelope) < Overhead || envelope[0] != Version {
		return 0, false
	}
	seq = binary.BigEndian.Uint64(envelope[1:HeaderSize])
	return seq, seq != 0
}
