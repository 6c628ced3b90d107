package netguard

import (
	"net/netip"
	"testing"
)

func TestBlockedAddresses(t *testing.T) {
	t.Parallel()
	blocked := []string{"127.0.0.1", "127.8.9.1", "10.1.2.3", "172.16.0.1", "172.31.255.255", "192.168.1.1",
		"169.254.169.254", "100.64.0.1", "0.0.0.0", "224.0.0.1", "255.255.255.255", "198.18.0.1",
		"::1", "::", "fe80::1", "fc00::1", "fd12::1", "ff02::1", "::ffff:127.0.0.1", "::ffff:10.0.0.1",
		"64:ff9b::a00:1", "2002:a00:1::1", "2001::1", "2001:db8::1", "::127.0.0.1", "fe80::1%eth0"}
	public := []string{"1.1.1.1", "8.8.8.8", "93.184.216.34", "172.32.0.1", "100.128.0.1", "2606:4700::1111", "2a00:1450::1"}
	for _, s := range blocked {
		if !Blocked(netip.MustParseAddr(s)) {
			t.Errorf("%s is not blocked", s)
		}
	}
	for _, s := range public {
		if Blocked(netip.MustParseAddr(s)) {
			t.Errorf("%s is blocked", s)
		}
	}
}

// Literal reads every way a resolver writes an address, as inet_aton and
// browsers do, so none of them slips past as a "name".
func TestLiteral(t *testing.T) {
	t.Parallel()
	for host, want := range map[string]string{
		"127.0.0.1":         "127.0.0.1",
		"2130706433":        "127.0.0.1",
		"0x7f000001":        "127.0.0.1",
		"017700000001":      "127.0.0.1",
		"127.1":             "127.0.0.1",
		"0x7f.1":            "127.0.0.1",
		"0177.0.0.01":       "127.0.0.1",
		"127.0.0.1.":        "127.0.0.1",
		"10.1.65535":        "10.1.255.255",
		"169.254.169.254":   "169.254.169.254",
		"2852039166":        "169.254.169.254",
		"0":                 "0.0.0.0",
		"[::1]":             "::1",
		"::ffff:127.0.0.1":  "::ffff:127.0.0.1",
		"fe80::1%eth0":      "fe80::1%eth0",
		"93.184.216.34":     "93.184.216.34",
		"0x5d.0xb8.0xd8.34": "93.184.216.34",
	} {
		a, ok := Literal(host)
		if !ok || a.String() != want {
			t.Errorf("Literal(%q) = %v, %v; want %s", host, a, ok, want)
		}
	}
	for _, host := range []string{"example.com", "localhost", "1.2.3.4.5", "256.1.1.1", "1.2.3.256", "4294967296",
		"0x1g", "08.1.1.1", "", "1..2", "a.1", "xn--e1afmkfd.xn--p1ai"} {
		if a, ok := Literal(host); ok {
			t.Errorf("Literal(%q) = %v, want no address", host, a)
		}
	}
}
