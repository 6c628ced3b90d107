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

// dialControl is a net.Dialer Control function that refuses the addresses
// netguard blocks. It runs on every address tried, after DNS resolution: a
// name that resolves, or later re-resolves, to an internal address is
// refused all the same.
func dialControl(network, address string, _ syscall.RawConn) error {
	host, _, err := net.SplitHostPort(address)
	if err != nil {
		return err
	}
	ip, err := netip.ParseAddr(host)
	if err != nil {
		return fmt.Errorf("webhook: dial to %q: not an IP address", host)
	}
	if netguard.Blocked(ip) {
		return &BlockedError{Addr: ip}
	}
	return nil
}
