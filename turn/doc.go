// Package turn is edgerelay's built-in STUN/TURN server (RFC 8489, RFC
// 8656) with coturn-compatible TURN REST credentials.
//
// pion/turn runs the control plane: it parses and answers STUN requests,
// keeps allocations, permissions and channel bindings and their timers.
// This package wraps every socket pion is handed and does three things in
// front of it:
//
//   - It screens authenticated requests before pion sees them (gate.go).
//     pion answers bad credentials with 400 and has no notion of the REST
//     expiry or of a refused peer address; coturn-speaking clients expect
//     401 for wrong or expired credentials and 403 for a peer they may not
//     reach, so the gate gives those answers itself.
//   - It relays the data path itself (udp.go, tcp.go, relay.go):
//     ChannelData, Send indications from clients and Data indications to
//     them. pion's per-packet path formats log lines, builds a five-tuple
//     fingerprint and allocates per datagram, and reads into 1,600-byte
//     buffers that drop anything bigger; ours looks the channel or
//     permission up in a copy-on-write table mirrored from pion's events
//     and moves datagrams of any size a leg can carry from one socket to
//     the other without allocating. On Linux it does so in batches
//     (udpread_linux.go, relayread_linux.go, gso_linux.go): a socket's
//     reader drains up to 64 queued datagrams (UDP_GRO-coalesced runs
//     split back), and the datagrams for one destination socket go out as
//     GSO runs (UDP_SEGMENT: one send for up to 64 equal-size datagrams),
//     or as one sendmmsg where the kernel refuses GSO. The kernel's send
//     path, most of a relay's CPU, then runs once per run.
//   - It answers the RFC 8656 edges pion gets wrong (gate.go, lifetime.go):
//     437 without an allocation, LIFETIME clamped to what the RFC grants,
//     channel numbers outside 0x4000-0x7FFF.
//   - It counts: allocations, relayed packets and bytes, refusals
//     (metrics.go), and it enforces the quotas (quota.go).
//
// The security default is that only globally reachable peers can be
// reached through the relay: every block IANA's special-purpose registries
// mark not globally reachable is denied, and IPv6 forms that carry an IPv4
// address are judged by it (peers.go), so the server cannot be used to
// reach into the operator's own network, its carrier's or its cloud's;
// Config.AllowPeers opens what an operator needs.
package turn
