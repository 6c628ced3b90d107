package webhook

import (
	"fmt"
	"net"
	"net/netip"
	"syscall"

	"github.com/llmq/llmq/internal/netguard"
)

// BlockedError is a webhook target address refused by the address check.
type BlockedError struct {
	Addr netip.Addr
}

func (e *BlockedError) Error() string {
	return fmt.Sprintf("webhook target %s is a loopback, private, link-local or otherwise internal address", e.Addr)
}

// Blocked reports whether ip is an address webhooks may not reach unless
// the operator allows internal targets (netguard.Blocked).
func Blocked(ip netip.Addr) bool { return netguard.Blocked(ip) }

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
