package clientip_test

import (
	"net/netip"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/txlimit/txlimit/clientip"
)

func keyer(t *testing.T, c clientip.Config) clientip.Keyer {
	t.Helper()
	k, err := clientip.NewKeyer(c)
	require.NoError(t, err)
	return k
}

func TestKeyerKey(t *testing.T) {
	t.Parallel()
	proxies := []netip.Prefix{
		netip.MustParsePrefix("10.0.0.0/8"),
		netip.MustParsePrefix("2001:db8:ffff::/48"),
	}
	xff := keyer(t, clientip.Config{TrustedProxies: proxies})
	fwd := keyer(t, clientip.Config{TrustedProxies: proxies, Header: "forwarded"})
	per48 := keyer(t, clientip.Config{TrustedProxies: proxies, IPv6Prefix: 48})
	each := keyer(t, clientip.Config{IPv6Prefix: 128})

	for _, c := range []struct {
		name       string
		key        clientip.Keyer
		peer       string
		values     []string
		want, fail string
	}{
		{name: "an untrusted peer's header is ignored", key: xff, peer: "198.51.100.7",
			values: []string{"203.0.113.9"}, want: "198.51.100.7"},
		{name: "Forwarded from an untrusted peer too", key: fwd, peer: "198.51.100.7",
			values: []string{"for=203.0.113.9"}, want: "198.51.100.7"},
		{name: "one proxy", key: xff, peer: "10.1.2.3",
			values: []string{"192.0.2.1"}, want: "192.0.2.1"},
		{name: "what the client wrote to the left is never read", key: xff, peer: "10.1.2.3",
			values: []string{"garbage, 1.1.1.1, 192.0.2.1"}, want: "192.0.2.1"},
		{name: "two proxies, two header lines, ports", key: xff, peer: "10.1.2.3",
			values: []string{"1.1.1.1, 192.0.2.1:4711", "10.9.9.9"}, want: "192.0.2.1"},
		{name: "an IPv6 client by its /64", key: xff, peer: "2001:db8:ffff::1",
			values: []string{"2001:db8:1:2:3:4:5:6"}, want: "2001:db8:1:2::/64"},
		{name: "an IPv6 client in brackets", key: xff, peer: "10.0.0.1",
			values: []string{"[2001:db8:1:2::9]:80"}, want: "2001:db8:1:2::/64"},
		{name: "IPv4-mapped IPv6 is IPv4, peer and hops", key: xff, peer: "::ffff:10.0.0.1",
			values: []string{"::ffff:192.0.2.1, ::ffff:10.0.0.2"}, want: "192.0.2.1"},
		{name: "an IPv6 zone is dropped", key: xff, peer: "fe80::1%eth0", want: "fe80::/64"},
		{name: "a request from a proxy itself", key: xff, peer: "10.0.0.1", want: "10.0.0.1"},
		{name: "every hop trusted: the leftmost", key: xff, peer: "10.0.0.1",
			values: []string{"10.0.0.7, 10.0.0.8"}, want: "10.0.0.7"},
		{name: "Forwarded, RFC 7239's example", key: fwd, peer: "10.0.0.1",
			values: []string{`for=192.0.2.60;proto=http;by=203.0.113.43, For="[2001:db8:cafe::17]:4711"`},
			want:   "2001:db8:cafe::/64"},
		{name: "Forwarded over lines, quoted commas, trusted hops", key: fwd, peer: "10.0.0.1",
			values: []string{`for=192.0.2.1;host="a,b"`, `for=10.0.0.5;proto=https`}, want: "192.0.2.1"},
		{name: "a /48", key: per48, peer: "10.0.0.1",
			values: []string{"2001:db8:1:2::9"}, want: "2001:db8:1::/48"},
		{name: "every IPv6 address apart", key: each, peer: "2001:db8::9", want: "2001:db8::9"},
		{name: "a trusted proxy wrote unknown", key: fwd, peer: "10.0.0.1",
			values: []string{"for=unknown"}, fail: `Forwarded entry "unknown", written by trusted proxy 10.0.0.1, is not an IP address`},
		{name: "a trusted proxy wrote garbage", key: xff, peer: "10.0.0.1",
			values: []string{"192.0.2.1, not-an-ip"}, fail: `X-Forwarded-For entry "not-an-ip"`},
		{name: "the proxy that wrote it is named", key: xff, peer: "10.0.0.1",
			values: []string{"not-an-ip, 10.0.0.2"}, fail: `X-Forwarded-For entry "not-an-ip", written by trusted proxy 10.0.0.2,`},
		{name: "an unterminated quoted string", key: fwd, peer: "10.0.0.1",
			values: []string{`for="192.0.2.1`}, fail: "unterminated"},
		{name: "a parameter without '='", key: fwd, peer: "10.0.0.1",
			values: []string{`for=192.0.2.1;secure`}, fail: "a parameter without '='"},
	} {
		got, err := c.key.Key(netip.MustParseAddr(c.peer), c.values)
		if c.fail != "" {
			require.ErrorContains(t, err, c.fail, c.name)
			continue
		}
		require.NoError(t, err, c.name)
		require.Equal(t, c.want, got, c.name)
	}
}

func TestNewKeyer(t *testing.T) {
	t.Parallel()
	for header, want := range map[string]string{
		"":                "X-Forwarded-For",
		"x-forwarded-for": "X-Forwarded-For",
		"forwarded":       "Forwarded",
		"Forwarded":       "Forwarded",
	} {
		require.Equal(t, want, keyer(t, clientip.Config{Header: header}).Header(), header)
	}

	for _, c := range []struct {
		cfg  clientip.Config
		fail string
	}{
		{clientip.Config{IPv6Prefix: 129}, "IPv6Prefix is 129; it must be between 1 and 128"},
		{clientip.Config{IPv6Prefix: -1}, "IPv6Prefix is -1"},
		{clientip.Config{Header: "X-Real-IP"}, `Header is "X-Real-IP"`},
		{clientip.Config{TrustedProxies: []netip.Prefix{{}}}, "TrustedProxies[0] is not a valid prefix"},
		{clientip.Config{TrustedProxies: []netip.Prefix{netip.MustParsePrefix("::ffff:10.0.0.0/104")}},
			"IPv4-mapped IPv6 prefix; write IPv4 networks in IPv4 form"},
	} {
		_, err := clientip.NewKeyer(c.cfg)
		require.ErrorContains(t, err, c.fail)
	}
}

func TestAddrKey(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		addr string
		bits int
		want string
	}{
		{"192.0.2.1", 64, "192.0.2.1"},
		{"192.0.2.1", 1, "192.0.2.1"},
		{"2001:db8:1:2::7", 64, "2001:db8:1:2::/64"},
		{"2001:db8:1:2::7", 56, "2001:db8:1::/56"},
		{"2001:db8:1:2::7", 128, "2001:db8:1:2::7"},
	} {
		require.Equal(t, c.want, clientip.AddrKey(netip.MustParseAddr(c.addr), c.bits), "%s/%d", c.addr, c.bits)
	}
}
