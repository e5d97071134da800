package turn

import (
	"crypto/hmac"
	"crypto/sha1" //nolint:gosec // STUN's MESSAGE-INTEGRITY is HMAC-SHA1 (RFC 8489 §14.5)
	"encoding/binary"
	"hash/crc32"
	"time"

	"github.com/pion/stun/v3"
)

// Allocation lifetimes (RFC 8656 §7.2, §7.3). A requested LIFETIME is
// clamped to [defaultLifetime, maxLifetime]; a Refresh with 0 deletes.
//
// pion reads LIFETIME literally below an hour: an Allocate with LIFETIME 0
// fails with 508 (it cannot make an allocation that lives 0 s), one with 30
// lives 30 s, and an hour or more falls back to 10 minutes. maxLifetime is
// an hour less a second because pion takes exactly 3600 s as "too long".
const (
	defaultLifetime = 10 * time.Minute
	maxLifetime     = time.Hour - time.Second
)

// grantedLifetime is the lifetime RFC 8656 grants for a requested one
// (seconds): the minimum of the request and the server's maximum, or the
// default if that is less; 0 on a Refresh stays 0 (the allocation ends).
func grantedLifetime(method stun.Method, requested uint32) uint32 {
	if method == stun.MethodRefresh && requested == 0 {
		return 0
	}
	return uint32(min(max(time.Duration(requested)*time.Second, defaultLifetime), maxLifetime) / time.Second)
}

// fixLifetime rewrites m's LIFETIME to the granted one, in m.Raw, and signs
// m again with key so that pion, which checks MESSAGE-INTEGRITY itself,
// accepts it. m has passed the integrity check with key, and is decoded
// from m.Raw (its attribute values are slices of it).
func fixLifetime(m *stun.Message, method stun.Method, key []byte) {
	v, err := m.Get(stun.AttrLifetime)
	if err != nil || len(v) != 4 {
		return // none: pion takes the default; malformed: pion answers 400
	}
	requested := binary.BigEndian.Uint32(v)
	granted := grantedLifetime(method, requested)
	if granted == requested {
		return
	}
	binary.BigEndian.PutUint32(v, granted) // v is a slice of m.Raw
	resign(m.Raw, key)
}

// resign recomputes MESSAGE-INTEGRITY and FINGERPRINT of the raw STUN
// message in place (RFC 8489 §14.5, §14.7): the HMAC covers the message up
// to the attribute, with the header's length counting up to its end; the
// CRC covers everything before FINGERPRINT.
func resign(raw []byte, key []byte) {
	integrity, fingerprint := -1, -1
	for off := 20; off+4 <= len(raw); {
		typ := stun.AttrType(binary.BigEndian.Uint16(raw[off:]))
		n := int(binary.BigEndian.Uint16(raw[off+2:]))
		switch typ {
		case stun.AttrMessageIntegrity:
			integrity = off
		case stun.AttrFingerprint:
			fingerprint = off
		}
		off += 4 + (n+3)&^3
	}
	if integrity < 0 || integrity+24 > len(raw) {
		return
	}
	length := binary.BigEndian.Uint16(raw[2:4])
	binary.BigEndian.PutUint16(raw[2:4], uint16(integrity+24-20))
	mac := hmac.New(sha1.New, key)
	mac.Write(raw[:integrity])
	copy(raw[integrity+4:integrity+24], mac.Sum(nil))
	binary.BigEndian.PutUint16(raw[2:4], length)
	if fingerprint > integrity && fingerprint+8 <= len(raw) {
		binary.BigEndian.PutUint32(raw[fingerprint+4:], crc32.ChecksumIEEE(raw[:fingerprint])^0x5354554e)
	}
}
