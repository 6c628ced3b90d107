// Package netguard knows which addresses a tenant's URL (a webhook's) may
// not reach: every range that is not the public internet. The API refuses
// such a URL at submit when its host is an address written out in any form
// a resolver accepts; the webhook dialer checks every address a name
// resolves to.
package netguard

import (
	"net/netip"
	"slices"
	"strconv"
	"strings"
)

// blocked are the IPv4 and public IPv6 ranges webhooks may not reach by
// default; the rest of IPv6 (loopback, NAT64, unique and link local,
// multicast…) is outside globalUnicast and blocked whole.
var blocked = prefixes(
	"0.0.0.0/8",       // "this network"
	"10.0.0.0/8",      // private
	"100.64.0.0/10",   // carrier-grade NAT
	"127.0.0.0/8",     // loopback
	"169.254.0.0/16",  // link-local, cloud metadata (169.254.169.254)
	"172.16.0.0/12",   // private
	"192.0.0.0/24",    // IETF protocol assignments
	"192.0.2.0/24",    // documentation
	"192.88.99.0/24",  // 6to4 relay anycast
	"192.168.0.0/16",  // private
	"198.18.0.0/15",   // benchmarking
	"198.51.100.0/24", // documentation
	"203.0.113.0/24",  // documentation
	"224.0.0.0/4",     // multicast
	"240.0.0.0/4",     // reserved, limited broadcast
	"2001::/23",       // IETF protocol assignments, Teredo among them
	"2001:db8::/32",   // documentation
	"2002::/16",       // 6to4
	"3fff::/20",       // documentation
)

// globalUnicast is where every public IPv6 address is.
var globalUnicast = netip.MustParsePrefix("2000::/3")

func prefixes(ss ...string) []netip.Prefix {
	out := make([]netip.Prefix, len(ss))
	for i, s := range ss {
		out[i] = netip.MustParsePrefix(s)
	}
	return out
}

// Blocked reports whether ip is an address webhooks may not reach unless
// the operator allows internal targets.
func Blocked(ip netip.Addr) bool {
	ip = ip.WithZone("").Unmap() // an IPv4-mapped IPv6 address is its IPv4 address
	if !ip.IsValid() || ip.Is6() && !globalUnicast.Contains(ip) {
		return true
	}
	return slices.ContainsFunc(blocked, func(p netip.Prefix) bool { return p.Contains(ip) })
}

// Literal returns the address a URL host names without DNS: an IP address,
// or an IPv4 address in any form inet_aton reads (2130706433, 0x7f.1 and
// 017700000001 are all 127.0.0.1).
func Literal(host string) (netip.Addr, bool) {
	h := strings.TrimSuffix(strings.TrimPrefix(host, "["), "]")
	if a, err := netip.ParseAddr(h); err == nil {
		return a, true
	}
	parts := strings.Split(strings.TrimSuffix(h, "."), ".")
	if len(parts) > 4 {
		return netip.Addr{}, false
	}
	vals := make([]uint64, len(parts))
	for i, p := range parts {
		v, err := parsePart(p)
		if err != nil {
			return netip.Addr{}, false
		}
		vals[i] = v
	}
	// The last part fills the bytes the others leave: a.b.c.d, a.b.cd,
	// a.bcd, abcd.
	last := vals[len(vals)-1]
	if last >= 1<<(8*(5-len(vals))) {
		return netip.Addr{}, false
	}
	var n uint64
	for _, v := range vals[:len(vals)-1] {
		if v > 255 {
			return netip.Addr{}, false
		}
		n = n<<8 | v
	}
	n = n<<(8*(5-len(vals))) | last
	return netip.AddrFrom4([4]byte{byte(n >> 24), byte(n >> 16), byte(n >> 8), byte(n)}), true
}

func parsePart(p string) (uint64, error) {
	switch {
	case p == "":
		return 0, strconv.ErrSyntax
	case strings.HasPrefix(p, "0x") || strings.HasPrefix(p, "0X"):
		if len(p) == 2 {
			return 0, nil // "0x" alone is 0 to inet_aton
		}
		return strconv.ParseUint(p[2:], 16, 32)
	case len(p) > 1 && p[0] == '0':
		return strconv.ParseUint(p[1:], 8, 32)
	}
	return strconv.ParseUint(p, 10, 32)
}
