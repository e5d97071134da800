// Package link holds the client side of a mailbox link: the keys both devices
// derive from the link key, and the sealing of envelopes and signal frames
// (spec/mailbox.md, sections Keys and Envelope layout).
//
// Everything here runs on the devices. The relay never needs any of it: it
// sees only the access token (and stores only its SHA-256) and checks only
// the outside of an envelope (length, version byte, sequence).
//
// The sealing types (Sealer, Reader, SignalSender, SignalReceiver) append into
// a caller-supplied buffer and allocate nothing per call, so a client can seal
// and open a stream of messages without garbage. To keep that promise they
// hold per-call scratch space and are not safe for concurrent use; see Sealer.
package link

import (
	"crypto/hkdf"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"fmt"
)

// HKDF labels (the info parameter) of spec/mailbox.md. They keep the
// "zerobyte" prefix so that existing clients derive the same keys.
const (
	labelAccess    = "zerobyte-access-v1"
	labelP2C       = "zerobyte-p2c-v1"
	labelC2P       = "zerobyte-c2p-v1"
	labelSignalP2C = "zerobyte-signal-p2c-v1"
	labelSignalC2P = "zerobyte-signal-c2p-v1"
)

// KeySize is the size of the link key and of every key derived from it.
const KeySize = 32

// idBytes is how many random bytes a link id encodes; base64url without
// padding turns 16 bytes into the 22 characters the spec names.
const idBytes = 16

// Link is the pairing of one primary and one companion. Both devices hold the
// same Link, exchanged out of band (a QR code); Key never leaves them.
type Link struct {
	// Key is the link key: 32 random bytes.
	Key [KeySize]byte
	// ID is the link id, which is also the mailbox id: base64url without
	// padding of 16 random bytes (22 characters). It salts every derivation,
	// so two links that somehow shared a key would still not share keys.
	ID string
}

// New returns a fresh link with a random key and a random id.
func New() (Link, error) {
	var l Link
	if _, err := rand.Read(l.Key[:]); err != nil {
		return Link{}, fmt.Errorf("link: random key: %w", err)
	}
	var id [idBytes]byte
	if _, err := rand.Read(id[:]); err != nil {
		return Link{}, fmt.Errorf("link: random id: %w", err)
	}
	l.ID = base64.RawURLEncoding.EncodeToString(id[:])
	return l, nil
}

// AccessToken is the bearer both devices present to the relay: 32 bytes of
// HKDF-SHA256 under the label zerobyte-access-v1, as base64url without
// padding (43 characters). It is derived rather than random so that the two
// devices agree on it without another exchange, and it is a separate HKDF
// output so that the relay learning it reveals nothing about the envelope or
// signal keys.
func (l Link) AccessToken() string {
	raw := l.derive(labelAccess)
	return base64.RawURLEncoding.EncodeToString(raw[:])
}

// Direction says which device writes and which reads.
type Direction string

const (
	// P2C: the primary writes, the companion reads.
	P2C Direction = "p2c"
	// C2P: the companion writes, the primary reads.
	C2P Direction = "c2p"
)

// Valid reports whether d is P2C or C2P.
func (d Direction) Valid() bool { return d == P2C || d == C2P }

// EnvelopeKey is the AES-256-GCM key of envelopes stored in direction d.
// Each direction has its own key because each writer numbers its envelopes
// from 1: under one shared key the two writers would reuse nonces.
//
// It panics if d is not P2C or C2P: there is no key for any other direction,
// and returning one would hide the mistake.
func (l Link) EnvelopeKey(d Direction) [KeySize]byte {
	switch d {
	case P2C:
		return l.derive(labelP2C)
	case C2P:
		return l.derive(labelC2P)
	}
	panic(fmt.Sprintf("link: EnvelopeKey of invalid direction %q", string(d)))
}

// SignalKey is the AES-256-GCM key of signal frames sent in direction d
// (p2c: sent by the primary). Signal frames number themselves with a clock,
// envelopes with a counter; separate keys keep the two nonce spaces apart.
//
// It panics if d is not P2C or C2P, like EnvelopeKey.
func (l Link) SignalKey(d Direction) [KeySize]byte {
	switch d {
	case P2C:
		return l.derive(labelSignalP2C)
	case C2P:
		return l.derive(labelSignalC2P)
	}
	panic(fmt.Sprintf("link: SignalKey of invalid direction %q", string(d)))
}

// derive is HKDF-SHA256 with ikm = the link key, salt = the link id's ASCII
// bytes and info = label, 32 bytes.
func (l Link) derive(label string) [KeySize]byte {
	k, err := hkdf.Key(sha256.New, l.Key[:], []byte(l.ID), label, KeySize)
	if err != nil {
		// hkdf.Key fails only for lengths over 255 hash sizes or in FIPS
		// mode for keys under 112 bits; neither applies to 32 bytes out
		// of a 32-byte key.
		panic(fmt.Sprintf("link: hkdf: %v", err))
	}
	return [KeySize]byte(k)
}
