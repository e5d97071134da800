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
//   - It relays ChannelData itself (udp.go, tcp.go, relay.go). pion's
//     per-packet path formats log lines, builds a five-tuple fingerprint and
//     allocates a ChannelData frame per datagram; ours looks the channel up
//     in a copy-on-write table mirrored from pion's events and moves the
//     bytes from one socket to the other without allocating. Send and Data
//     indications (clients that have not bound a channel yet) still go
//     through pion.
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
