package turn

import (
	"net/netip"
	"testing"
)

// TestPeerPolicyDefaultDeny walks every block of IANA's special-purpose
// registries at its edges: the first and last address inside, and the
// neighbours just outside, which are global. Addresses that carry an IPv4
// address are judged by it.
func TestPeerPolicyDefaultDeny(t *testing.T) {
	p := newPeerPolicy(nil)
	cases := []struct {
		addr string
		want bool
	}{
		// 0.0.0.0/8
		{"0.0.0.0", false}, {"0.255.255.255", false}, {"1.0.0.0", true},
		// 10.0.0.0/8
		{"9.255.255.255", true}, {"10.0.0.0", false}, {"10.255.255.255", false}, {"11.0.0.0", true},
		// 100.64.0.0/10, with a cloud metadata service inside
		{"100.63.255.255", true}, {"100.64.0.0", false}, {"100.64.0.1", false}, {"100.100.100.200", false},
		{"100.127.255.255", false}, {"100.128.0.0", true},
		// 127.0.0.0/8
		{"126.255.255.255", true}, {"127.0.0.0", false}, {"127.0.0.1", false}, {"127.255.255.255", false}, {"128.0.0.0", true},
		// 169.254.0.0/16
		{"169.253.255.255", true}, {"169.254.0.0", false}, {"169.254.169.254", false}, {"169.254.255.255", false}, {"169.255.0.0", true},
		// 172.16.0.0/12
		{"172.15.255.255", true}, {"172.16.0.0", false}, {"172.31.255.255", false}, {"172.32.0.0", true},
		// 192.0.0.0/24, its anycast exceptions denied too
		{"191.255.255.255", true}, {"192.0.0.0", false}, {"192.0.0.1", false}, {"192.0.0.7", false}, {"192.0.0.8", false},
		{"192.0.0.9", false}, {"192.0.0.10", false}, {"192.0.0.170", false}, {"192.0.0.171", false}, {"192.0.0.255", false},
		{"192.0.1.0", true},
		// 192.0.2.0/24
		{"192.0.1.255", true}, {"192.0.2.0", false}, {"192.0.2.255", false}, {"192.0.3.0", true},
		// globally reachable blocks: AS112, AMT, AS112 direct delegation
		{"192.31.196.0", true}, {"192.31.196.255", true}, {"192.52.193.0", true}, {"192.52.193.255", true},
		{"192.175.48.0", true}, {"192.175.48.255", true},
		// 192.88.99.0/24
		{"192.88.98.255", true}, {"192.88.99.0", false}, {"192.88.99.1", false}, {"192.88.99.255", false}, {"192.88.100.0", true},
		// 192.168.0.0/16
		{"192.167.255.255", true}, {"192.168.0.0", false}, {"192.168.255.255", false}, {"192.169.0.0", true},
		// 198.18.0.0/15
		{"198.17.255.255", true}, {"198.18.0.0", false}, {"198.18.0.1", false}, {"198.19.255.255", false}, {"198.20.0.0", true},
		// 198.51.100.0/24
		{"198.51.99.255", true}, {"198.51.100.0", false}, {"198.51.100.255", false}, {"198.51.101.0", true},
		// 203.0.113.0/24
		{"203.0.112.255", true}, {"203.0.113.0", false}, {"203.0.113.255", false}, {"203.0.114.0", true},
		// multicast 224.0.0.0/4, reserved 240.0.0.0/4, limited broadcast
		{"223.255.255.255", true}, {"224.0.0.0", false}, {"239.255.255.255", false},
		{"240.0.0.0", false}, {"240.0.0.1", false}, {"255.255.255.254", false}, {"255.255.255.255", false},
		{"8.8.8.8", true}, {"1.1.1.1", true},

		// ::/128, ::1/128, IPv4-compatible ::/96 (all of it)
		{"::", false}, {"::1", false}, {"::2", false}, {"::8.8.8.8", false}, {"::127.0.0.1", false}, {"::ffff:ffff", false},
		// IPv4-mapped ::ffff:0:0/96
		{"::ffff:8.8.8.8", true}, {"::ffff:0.0.0.0", false}, {"::ffff:127.0.0.1", false}, {"::ffff:10.0.0.1", false},
		{"::ffff:100.100.100.200", false}, {"::ffff:192.0.0.1", false}, {"::ffff:198.18.0.1", false},
		{"::ffff:240.0.0.1", false}, {"::ffff:255.255.255.255", false},
		// NAT64 64:ff9b::/96 and its local-use 64:ff9b:1::/48
		{"64:ff9b::8.8.8.8", true}, {"64:ff9b::127.0.0.1", false}, {"64:ff9b::10.0.0.1", false},
		{"64:ff9b::169.254.169.254", false}, {"64:ff9b::100.100.100.200", false}, {"64:ff9b::0.0.0.0", false},
		{"64:ff9b::255.255.255.255", false}, {"64:ff9b::1:0:808:808", false},
		{"64:ff9b:1::", false}, {"64:ff9b:1::8.8.8.8", false}, {"64:ff9b:1:ffff:ffff:ffff:ffff:ffff", false},
		// discard-only 100::/64, dummy 100:0:0:1::/64
		{"100::", false}, {"100::ffff:ffff:ffff:ffff", false}, {"100:0:0:1::", false}, {"100:0:0:1:ffff:ffff:ffff:ffff", false},
		// 2001::/23 and its rows
		{"2000::", true}, {"2000:ffff:ffff:ffff:ffff:ffff:ffff:ffff", true},
		{"2001:1::1", false}, {"2001:1::2", false}, {"2001:1::3", false}, {"2001:1::4", false},
		{"2001:2::", false}, {"2001:2:0:ffff:ffff:ffff:ffff:ffff", false}, {"2001:2:1::", false},
		{"2001:3::", true}, {"2001:3:ffff:ffff:ffff:ffff:ffff:ffff", true},
		{"2001:4:112::", true}, {"2001:4:112:ffff:ffff:ffff:ffff:ffff", true}, {"2001:4:113::", false},
		{"2001:10::", false}, {"2001:1f:ffff:ffff:ffff:ffff:ffff:ffff", false},
		{"2001:20::", true}, {"2001:2f:ffff:ffff:ffff:ffff:ffff:ffff", true},
		{"2001:30::", true}, {"2001:3f:ffff:ffff:ffff:ffff:ffff:ffff", true},
		{"2001:40::", false}, {"2001:1ff:ffff:ffff:ffff:ffff:ffff:ffff", false}, {"2001:200::", true},
		// Teredo 2001::/32: the client's IPv4 address, inverted, at the end
		{"2001:0:4136:e378:8000:63bf:f7f7:f7f7", true},  // 8.8.8.8
		{"2001:0:4136:e378:8000:63bf:80ff:fffe", false}, // 127.0.0.1
		{"2001:0:4136:e378:8000:63bf:f5ff:fffe", false}, // 10.0.0.1
		{"2001:0:4136:e378:8000:63bf:9b9b:9b37", false}, // 100.100.100.200
		// 2001:db8::/32
		{"2001:db7:ffff:ffff:ffff:ffff:ffff:ffff", true}, {"2001:db8::", false},
		{"2001:db8:ffff:ffff:ffff:ffff:ffff:ffff", false}, {"2001:db9::", true},
		// 6to4 2002::/16: the IPv4 address in bits 16-47
		{"2002:808:808::1", true}, {"2002:7f00:1::1", false}, {"2002:a00:1::1", false}, {"2002:c0a8:101::", false},
		{"2002:6464:64c8::1", false}, {"2002:a9fe:a9fe::", false}, {"2002:e000:1::", false}, {"2002::", false},
		{"2002:ffff:ffff:ffff:ffff:ffff:ffff:ffff", false}, {"2003::", true}, {"2001:ffff:ffff:ffff:ffff:ffff:ffff:ffff", true},
		// AS112 direct delegation
		{"2620:4f:8000::", true}, {"2620:4f:8000:ffff:ffff:ffff:ffff:ffff", true},
		// documentation 3fff::/20
		{"3ffe:ffff:ffff:ffff:ffff:ffff:ffff:ffff", true}, {"3fff::", false},
		{"3fff:fff:ffff:ffff:ffff:ffff:ffff:ffff", false}, {"3fff:1000::", true},
		// outside 2000::/3: SRv6 5f00::/16 and the unassigned rest
		{"1fff:ffff:ffff:ffff:ffff:ffff:ffff:ffff", false}, {"3fff:ffff:ffff:ffff:ffff:ffff:ffff:ffff", true}, {"4000::", false},
		{"5f00::", false}, {"5f00:ffff:ffff:ffff:ffff:ffff:ffff:ffff", false},
		// unique local fc00::/7, link local fe80::/10, multicast ff00::/8
		{"fbff:ffff:ffff:ffff:ffff:ffff:ffff:ffff", false}, {"fc00::", false}, {"fd00::1", false},
		{"fdff:ffff:ffff:ffff:ffff:ffff:ffff:ffff", false}, {"fe80::", false}, {"fe80::1%eth0", false},
		{"febf:ffff:ffff:ffff:ffff:ffff:ffff:ffff", false}, {"ff02::1", false}, {"ffff:ffff:ffff:ffff:ffff:ffff:ffff:ffff", false},
		{"2606:4700:4700::1111", true}, {"2a00:1450:4001:82a::200e", true},
	}
	for _, c := range cases {
		if got := p.allowed(netip.MustParseAddr(c.addr)); got != c.want {
			t.Errorf("allowed(%s) = %v, want %v", c.addr, got, c.want)
		}
	}
	if p.allowed(netip.Addr{}) {
		t.Error("the zero address is allowed")
	}
}

// TestPeerPolicyAllow checks that RELAY_TURN_ALLOW_PEERS opens what it
// names, in every form that leads there, and nothing beside it.
func TestPeerPolicyAllow(t *testing.T) {
	p := newPeerPolicy([]netip.Prefix{
		netip.MustParsePrefix("10.9.0.0/16"), netip.MustParsePrefix("100.64.0.0/10"),
		netip.MustParsePrefix("fd00::/8"), netip.MustParsePrefix("192.0.0.10/32"),
	})
	for addr, want := range map[string]bool{
		"10.9.0.0": true, "10.9.255.255": true, "10.8.255.255": false, "10.10.0.0": false,
		"::ffff:10.9.1.1": true, "64:ff9b::10.9.1.1": true, "2002:a09:101::": true, "::ffff:10.10.0.1": false,
		"100.64.0.0": true, "100.100.100.200": true, "100.127.255.255": true, "100.128.0.0": true,
		"192.0.0.10": true, "192.0.0.9": false,
		"fd00::1": true, "fdff:ffff:ffff:ffff:ffff:ffff:ffff:ffff": true, "fc00::1": false, "fe00::": false,
		"127.0.0.1": false, "8.8.8.8": true,
	} {
		if got := p.allowed(netip.MustParseAddr(addr)); got != want {
			t.Errorf("allowed(%s) = %v, want %v", addr, got, want)
		}
	}
}
