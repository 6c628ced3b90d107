package webhook

import (
	"fmt"
	"net"
	"net/netip"
	"syscall"
)

// BlockedError is a webhook target address refused by the address check.
type BlockedError struct {
	Addr netip.Addr
}

func (e *BlockedError) Error() string {
	return fmt.Sprintf("webhook target %s is a loopback, private, link-local or otherwise internal address", e.Addr)
}

// blocked are the address ranges webhooks may not reach by default: every
// range that is not the public internet, and the IPv6 ranges that embed or
// translate to IPv4 addresses (NAT64, 6to4, Teredo), which could reach
// the IPv4 ones.
var blocked = prefixes(
	"0.0.0.0/8",          // "this network"
	"10.0.0.0/8",         // private
	"100.64.0.0/10",      // carrier-grade NAT
	"127.0.0.0/8",        // loopback
	"169.254.0.0/16",     // link-local, cloud metadata (169.254.169.254)
	"172.16.0.0/12",      // private
	"192.0.0.0/24",       // IETF protocol assignments
	"192.0.2.0/24",       // documentation
	"192.88.99.0/24",     // 6to4 relay anycast
	"192.168.0.0/16",     // private
	"198.18.0.0/15",      // benchmarking
	"198.51.100.0/24",    // documentation
	"203.0.113.0/24",     // documentation
	"224.0.0.0/4",        // multicast
	"240.0.0.0/4",        // reserved
	"255.255.255.255/32", // limited broadcast
	"64:ff9b::/96",       // NAT64
	"64:ff9b:1::/48",     // local-use NAT64
	"100::/64",           // discard
	"2001::/23",          // IETF protocol assignments, Teredo among them
	"2001:db8::/32",      // documentation
	"2002::/16",          // 6to4
	"3fff::/20",          // documentation
	"fc00::/7",           // unique local
	"fec0::/10",          // site-local (deprecated)
	"fe80::/10",          // link-local
	"ff00::/8",           // multicast
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
	if !ip.IsValid() || ip.IsLoopback() || ip.IsPrivate() || ip.IsUnspecified() || ip.IsMulticast() ||
		ip.IsLinkLocalUnicast() || ip.IsLinkLocalMulticast() || ip.IsInterfaceLocalMulticast() {
		return true
	}
	if ip.Is6() && !globalUnicast.Contains(ip) {
		return true // IPv4-compatible, reserved and unassigned IPv6 space
	}
	for _, p := range blocked {
		if p.Contains(ip) {
			return true
		}
	}
	return false
}

// Control is a net.Dialer Control function that refuses blocked addresses
// (unless allowPrivate). It runs on the address about to be connected to,
// after DNS resolution, for every address tried: a name that resolves, or
// later re-resolves, to an internal address is refused all the same.
func Control(allowPrivate bool) func(network, address string, c syscall.RawConn) error {
	return func(network, address string, _ syscall.RawConn) error {
		if allowPrivate {
			return nil
		}
		host, _, err := net.SplitHostPort(address)
		if err != nil {
			return err
		}
		ip, err := netip.ParseAddr(host)
		if err != nil {
			return fmt.Errorf("webhook: dial to %q: not an IP address", host)
		}
		if Blocked(ip) {
			return &BlockedError{Addr: ip}
		}
		return nil
	}
}
