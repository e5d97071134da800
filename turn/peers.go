package turn

import "net/netip"

// peerPolicy decides which peer addresses a client may relay to. A TURN
// server is an open UDP proxy to whoever holds credentials; without this
// filter a device with a minted credential could reach the operator's
// loopback services, its private network, its carrier's shared space or a
// cloud metadata endpoint (169.254.169.254, 100.100.100.200) from inside.
//
// The default is that only globally reachable addresses are peers: every
// block that IANA's special-purpose address registries mark "Globally
// Reachable: False" is denied (table below), and so is every IPv6 address
// outside global unicast 2000::/3. Addresses that carry an IPv4 address
// (IPv4-mapped, NAT64, 6to4, Teredo) are judged by the IPv4 address they
// lead to. Config.AllowPeers opens prefixes despite all of it.
type peerPolicy struct {
	allow  []netip.Prefix
	blocks []peerBlock
	global netip.Prefix // IPv6 global unicast, 2000::/3 (RFC 4291 §2.4)
}

// peerReach is what the policy does with a block.
type peerReach uint8

const (
	reachDenied   peerReach = iota // never a peer
	reachGlobal                    // a peer, as any global address
	reachEmbedded                  // judged by the IPv4 address inside it
)

type peerBlock struct {
	prefix netip.Prefix
	reach  peerReach
}

func block(prefix string, reach peerReach) peerBlock {
	return peerBlock{netip.MustParsePrefix(prefix), reach}
}

// specialBlocks is IANA's IPv4 and IPv6 Special-Purpose Address Registries
// (iana-ipv4-special-registry, iana-ipv6-special-registry, as of 2025:
// RFC 6890 and the RFCs named per row), by the "Globally Reachable"
// column, plus multicast and the limited broadcast. The most specific
// block that contains an address decides. Where we differ from the
// column, the row says why.
func specialBlocks() []peerBlock {
	return []peerBlock{
		// IPv4
		block("0.0.0.0/8", reachDenied),          // "this network" (RFC 791); Linux sends 0.0.0.0 to loopback
		block("10.0.0.0/8", reachDenied),         // private use (RFC 1918)
		block("100.64.0.0/10", reachDenied),      // shared address space, carrier-grade NAT (RFC 6598); 100.100.100.200 is a cloud metadata service
		block("127.0.0.0/8", reachDenied),        // loopback
		block("169.254.0.0/16", reachDenied),     // link local (RFC 3927); 169.254.169.254 is cloud metadata
		block("172.16.0.0/12", reachDenied),      // private use
		block("192.0.0.0/24", reachDenied),       // IETF protocol assignments (RFC 6890), incl. DS-Lite 192.0.0.0/29, dummy 192.0.0.8, NAT64 discovery 192.0.0.170-171
		block("192.0.0.9/32", reachDenied),       // PCP anycast (RFC 7723): registry True, denied: it reaches the PCP server of the relay's own network, which opens mappings on its NAT
		block("192.0.0.10/32", reachDenied),      // TURN anycast (RFC 8155): registry True, denied: it reaches another TURN server of the relay's own network (relay loops, a way past its policy)
		block("192.0.2.0/24", reachDenied),       // documentation TEST-NET-1 (RFC 5737)
		block("192.31.196.0/24", reachGlobal),    // AS112-v4 (RFC 7535): True
		block("192.52.193.0/24", reachGlobal),    // AMT (RFC 7450): True
		block("192.88.99.0/24", reachDenied),     // deprecated 6to4 relay anycast (RFC 7526): no longer routed as such; nothing a media peer uses
		block("192.168.0.0/16", reachDenied),     // private use
		block("192.175.48.0/24", reachGlobal),    // AS112 direct delegation (RFC 7534): True
		block("198.18.0.0/15", reachDenied),      // benchmarking (RFC 2544)
		block("198.51.100.0/24", reachDenied),    // documentation TEST-NET-2
		block("203.0.113.0/24", reachDenied),     // documentation TEST-NET-3
		block("224.0.0.0/4", reachDenied),        // multicast: a permission is for one host
		block("240.0.0.0/4", reachDenied),        // reserved (RFC 1112)
		block("255.255.255.255/32", reachDenied), // limited broadcast (RFC 919)

		// IPv6. Outside 2000::/3 everything is denied anyway (see allowed);
		// the rows there name what the registry says and the exceptions.
		block("::/128", reachDenied),            // unspecified; Linux sends :: to loopback
		block("::1/128", reachDenied),           // loopback
		block("::ffff:0:0/96", reachEmbedded),   // IPv4-mapped (RFC 4291): False as such, judged as the IPv4 address
		block("::/96", reachDenied),             // IPv4-compatible (deprecated, RFC 4291): a sit tunnel sends them to the IPv4 address inside
		block("64:ff9b::/96", reachEmbedded),    // NAT64 well-known prefix (RFC 6052): True, judged by the IPv4 address it translates to
		block("64:ff9b:1::/48", reachDenied),    // NAT64 local use (RFC 8215)
		block("100::/64", reachDenied),          // discard only (RFC 6666)
		block("100:0:0:1::/64", reachDenied),    // dummy IPv6 prefix (RFC 9780)
		block("2001::/23", reachDenied),         // IETF protocol assignments (RFC 2928), but for the rows below
		block("2001::/32", reachEmbedded),       // Teredo (RFC 4380): N/A, judged by the client's IPv4 address inside
		block("2001:1::1/128", reachDenied),     // PCP anycast (RFC 7723): True, denied as 192.0.0.9
		block("2001:1::2/128", reachDenied),     // TURN anycast (RFC 8155): True, denied as 192.0.0.10
		block("2001:1::3/128", reachDenied),     // DNS-SD service registration anycast (RFC 9665): True, denied: a service of the relay's own network
		block("2001:2::/48", reachDenied),       // benchmarking (RFC 5180)
		block("2001:3::/32", reachGlobal),       // AMT (RFC 7450): True
		block("2001:4:112::/48", reachGlobal),   // AS112-v6 (RFC 7535): True
		block("2001:10::/28", reachDenied),      // deprecated ORCHID (RFC 4843)
		block("2001:20::/28", reachGlobal),      // ORCHIDv2 (RFC 7343): True
		block("2001:30::/28", reachGlobal),      // drone remote ID DETs (RFC 9374): True
		block("2001:db8::/32", reachDenied),     // documentation (RFC 3849)
		block("2002::/16", reachEmbedded),       // 6to4 (RFC 3056): N/A, judged by the IPv4 address inside
		block("2620:4f:8000::/48", reachGlobal), // AS112 direct delegation (RFC 7534): True
		block("3fff::/20", reachDenied),         // documentation (RFC 9637)
		block("5f00::/16", reachDenied),         // SRv6 SIDs (RFC 9602)
		block("fc00::/7", reachDenied),          // unique local (RFC 4193)
		block("fe80::/10", reachDenied),         // link-local unicast
		block("ff00::/8", reachDenied),          // multicast
	}
}

// newPeerPolicy makes the policy; allow opens prefixes despite the default
// deny, and wins over it.
func newPeerPolicy(allow []netip.Prefix) peerPolicy {
	a := make([]netip.Prefix, 0, len(allow))
	for _, p := range allow {
		a = append(a, p.Masked())
	}
	// Outside IPv6's global unicast space everything is unassigned,
	// reserved or special, and never a peer by default.
	return peerPolicy{allow: a, blocks: specialBlocks(), global: netip.MustParsePrefix("2000::/3")}
}

// allowed reports whether ip may be a peer.
func (p peerPolicy) allowed(ip netip.Addr) bool {
	// A zone would make every Prefix.Contains false, and so open
	// fe80::1%eth0; a peer address on the wire has none anyway.
	ip = ip.WithZone("")
	if !ip.IsValid() {
		return false
	}
	for _, pre := range p.allow {
		if pre.Contains(ip) {
			return true
		}
	}
	var (
		reach = reachGlobal
		bits  = -1
	)
	for _, b := range p.blocks {
		if b.prefix.Bits() > bits && b.prefix.Contains(ip) {
			reach, bits = b.reach, b.prefix.Bits()
		}
	}
	switch reach {
	case reachDenied:
		return false
	case reachEmbedded:
		v4, ok := embeddedIPv4(ip)
		return ok && p.allowed(v4)
	}
	return ip.Is4() || p.global.Contains(ip)
}

// embeddedIPv4 is the IPv4 address an IPv6 address of a reachEmbedded block
// leads to.
func embeddedIPv4(ip netip.Addr) (netip.Addr, bool) {
	b := ip.As16()
	switch {
	case ip.Is4In6():
		return ip.Unmap(), true
	case b[0] == 0x20 && b[1] == 0x02: // 6to4: 2002:AABB:CCDD::/48
		return netip.AddrFrom4([4]byte{b[2], b[3], b[4], b[5]}), true
	case b[0] == 0x20 && b[1] == 0x01 && b[2] == 0 && b[3] == 0: // Teredo: the client's address, inverted, in the last 32 bits
		return netip.AddrFrom4([4]byte{^b[12], ^b[13], ^b[14], ^b[15]}), true
	case b[0] == 0 && b[1] == 0x64 && b[2] == 0xff && b[3] == 0x9b: // NAT64 64:ff9b::/96
		return netip.AddrFrom4([4]byte{b[12], b[13], b[14], b[15]}), true
	}
	return netip.Addr{}, false
}
