// Package tlsrec is a TLS 1.3 record layer that takes a connection over
// from crypto/tls once its handshake is done, so that an idle connection
// keeps only its traffic secrets and sequence numbers.
//
// Why: a parked WebSocket under crypto/tls keeps about 6.5 KiB that
// nothing outside crypto/tls can release (docs/parking.md): a record
// buffer and a handshake buffer that never shrink, and an expanded AES-GCM
// key and GHASH table per direction. A Conn wraps the *tls.Conn and uses
// it until the first Idle at which the *tls.Conn holds nothing unread;
// then it reads the connection's record state out of it (capture.go),
// drops it, and carries the records itself: AES-GCM or ChaCha20-Poly1305
// sealed records (RFC 8446 5.2), KeyUpdate both ways (4.6.3), alerts (6).
// From then on Idle gives back the read buffer and both AEADs, which are
// rebuilt from the secrets at the next record (a few microseconds).
//
// The handshake, certificates, session tickets and TLS 1.2 stay
// crypto/tls's: a connection that negotiated TLS 1.2 is never taken over.
package tlsrec
