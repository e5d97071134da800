package turn

import "net/netip"

// peerPolicy decides which peer addresses a client may relay to. A TURN
// server is an open UDP proxy to whoever holds credentials; without this
// filter a device with a minted credential could reach the operator's
// loopback services, its private network or a cloud metadata endpoint
// (169.254.169.254) from inside.
type peerPolicy struct {
	allow []netip.Prefix
	deny  []netip.Prefix
}

// newPeerPolicy denies the ranges that address the server's own host and
// networks: loopback, RFC 1918 private, link-local, unique-local, and the
// unspecified "this host" ranges (on Linux, sending to 0.0.0.0 or :: reaches
// loopback). allow opens prefixes despite that, and wins over the deny
// list.
func newPeerPolicy(allow []netip.Prefix) peerPolicy {
	deny := []netip.Prefix{
		netip.MustParsePrefix("0.0.0.0/8"),
		netip.MustParsePrefix("127.0.0.0/8"),
		netip.MustParsePrefix("10.0.0.0/8"),
		netip.MustParsePrefix("172.16.0.0/12"),
		netip.MustParsePrefix("192.168.0.0/16"),
		netip.MustParsePrefix("169.254.0.0/16"),
		netip.MustParsePrefix("::/128"),
		netip.MustParsePrefix("::1/128"),
		netip.MustParsePrefix("fc00::/7"),
		netip.MustParsePrefix("fe80::/10"),
	}
	a := make([]netip.Prefix, 0, len(allow))
	for _, p := range allow {
		a = append(a, p.Masked())
	}
	return peerPolicy{allow: a, deny: deny}
}

// allowed reports whether ip may be a peer. IPv4-mapped IPv6 addresses are
// judged as the IPv4 address they carry, so ::ffff:127.0.0.1 is loopback.
// Multicast and broadcast are never peers: a TURN permission is for one
// host.
func (p peerPolicy) allowed(ip netip.Addr) bool {
	ip = ip.Unmap()
	if !ip.IsValid() {
		return false
	}
	for _, pre := range p.allow {
		if pre.Contains(ip) {
			return true
		}
	}
	if ip.IsMulticast() || ip == netip.AddrFrom4([4]byte{255, 255, 255, 255}) {
		return false
	}
	for _, pre := range p.deny {
		if pre.Contains(ip) {
			return false
		}
	}
	return true
}
