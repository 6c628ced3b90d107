package api

import (
	"net/http"
	"net/netip"
	"testing"
)

// The client address is the connection's unless it is a trusted proxy; then
// X-Forwarded-For is read from the right past trusted hops. IPv6 clients
// count by their /64.
func TestClientAddr(t *testing.T) {
	t.Parallel()
	trusted := []netip.Prefix{netip.MustParsePrefix("10.0.0.0/8"), netip.MustParsePrefix("fd00::/8")}
	for _, c := range []struct {
		remote string
		xff    []string
		want   string
	}{
		{"203.0.113.7:5000", nil, "203.0.113.7/32"},
		{"203.0.113.7:5000", []string{"198.51.100.1"}, "203.0.113.7/32"}, // not from a proxy: ignored
		{"10.0.0.2:5000", nil, "10.0.0.2/32"},                            // a proxy's own request
		{"10.0.0.2:5000", []string{"198.51.100.1"}, "198.51.100.1/32"},
		{"10.0.0.2:5000", []string{"192.0.2.9, 198.51.100.1, 10.0.0.3"}, "198.51.100.1/32"}, // the client's own claim, left, is ignored
		{"10.0.0.2:5000", []string{"192.0.2.9", "198.51.100.1, 10.0.0.3"}, "198.51.100.1/32"},
		{"10.0.0.2:5000", []string{"10.9.9.9, 10.0.0.3"}, "10.9.9.9/32"},         // only proxies: the left-most
		{"10.0.0.2:5000", []string{"198.51.100.1, garbage"}, "10.0.0.2/32"},      // the proxy passed garbage on
		{"10.0.0.2:5000", []string{"198.51.100.1:4711"}, "198.51.100.1/32"},      // with a port
		{"10.0.0.2:5000", []string{"[2001:db8:1:2::7]"}, "2001:db8:1:2::/64"},    // bracketed
		{"[fd00::1]:443", []string{"2001:db8:1:2:3:4:5:6"}, "2001:db8:1:2::/64"}, // an IPv6 proxy
		{"[2001:db8:aa:bb::1]:443", nil, "2001:db8:aa:bb::/64"},
		{"[::ffff:10.0.0.2]:5000", []string{"::ffff:198.51.100.1"}, "198.51.100.1/32"}, // IPv4-mapped is IPv4
	} {
		r := &http.Request{RemoteAddr: c.remote, Header: http.Header{}}
		for _, v := range c.xff {
			r.Header.Add("X-Forwarded-For", v)
		}
		if got := clientAddr(r, trusted).String(); got != c.want {
			t.Errorf("%s %q: %s, want %s", c.remote, c.xff, got, c.want)
		}
	}
}
