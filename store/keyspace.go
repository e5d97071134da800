package store

// The keyspace. Every key starts with one byte naming the service, then one
// byte naming the record kind, then fixed-width binary fields, so that every
// collection is a contiguous prefix that Pebble can iterate or range-delete:
//
//	'c' 'k' <sha256 claim key>     channel claim key record (JSON channelKeyRecord)
//	'c' 'o' <sha256 owner token>   channel owner index -> sha256 claim key
//	'c' 'p' <sha256 phone token>   channel phone index -> sha256 claim key
//
// The other services' prefixes are printable letters too ('a', 'g', 'm');
// 0x00 'v' is the store's own format version (version.go), out of every
// service's reach.
//
// Hashes are raw 32-byte SHA-256 digests; no secret is ever a key or value.
const (
	serviceChannel = 'c'

	kindChannelKey   = 'k'
	kindChannelOwner = 'o'
	kindChannelPhone = 'p'
)

// HashLen is the length of the SHA-256 digests the store keeps instead of secrets.
const HashLen = 32

// Hash is a SHA-256 digest of a secret.
type Hash [HashLen]byte

func key2(service, kind byte, rest []byte) []byte {
	k := make([]byte, 0, 2+len(rest))
	k = append(k, service, kind)
	return append(k, rest...)
}
