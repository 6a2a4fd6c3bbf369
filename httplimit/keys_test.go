package httplimit_test

import (
	"net/http"
	"net/http/httptest"
	"net/netip"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/txlimit/txlimit/httplimit"
)

func TestClientIPKey(t *testing.T) {
	t.Parallel()
	proxies := []netip.Prefix{
		netip.MustParsePrefix("10.0.0.0/8"),
		netip.MustParsePrefix("2001:db8:ffff::/48"),
	}
	xff, err := httplimit.ClientIPKey(httplimit.ClientIP{TrustedProxies: proxies})
	require.NoError(t, err)
	fwd, err := httplimit.ClientIPKey(httplimit.ClientIP{TrustedProxies: proxies, Header: "forwarded"})
	require.NoError(t, err)
	per48, err := httplimit.ClientIPKey(httplimit.ClientIP{TrustedProxies: proxies, IPv6Prefix: 48})
	require.NoError(t, err)
	each, err := httplimit.ClientIPKey(httplimit.ClientIP{IPv6Prefix: 128})
	require.NoError(t, err)

	for _, c := range []struct {
		name       string
		key        httplimit.KeyFunc
		peer       string
		xff, fwd   []string
		want, fail string
	}{
		{name: "an untrusted peer's header is ignored", key: xff, peer: "198.51.100.7:5000",
			xff: []string{"203.0.113.9"}, want: "198.51.100.7"},
		{name: "Forwarded from an untrusted peer too", key: fwd, peer: "198.51.100.7:5000",
			fwd: []string{"for=203.0.113.9"}, want: "198.51.100.7"},
		{name: "one proxy", key: xff, peer: "10.1.2.3:80",
			xff: []string{"192.0.2.1"}, want: "192.0.2.1"},
		{name: "what the client wrote to the left is never read", key: xff, peer: "10.1.2.3:80",
			xff: []string{"garbage, 1.1.1.1, 192.0.2.1"}, want: "192.0.2.1"},
		{name: "two proxies, two header lines, ports", key: xff, peer: "10.1.2.3:80",
			xff: []string{"1.1.1.1, 192.0.2.1:4711", "10.9.9.9"}, want: "192.0.2.1"},
		{name: "an IPv6 client by its /64", key: xff, peer: "[2001:db8:ffff::1]:443",
			xff: []string{"2001:db8:1:2:3:4:5:6"}, want: "2001:db8:1:2::/64"},
		{name: "an IPv6 client in brackets", key: xff, peer: "10.0.0.1:80",
			xff: []string{"[2001:db8:1:2::9]:80"}, want: "2001:db8:1:2::/64"},
		{name: "IPv4-mapped IPv6 is IPv4, peer and hops", key: xff, peer: "[::ffff:10.0.0.1]:80",
			xff: []string{"::ffff:192.0.2.1, ::ffff:10.0.0.2"}, want: "192.0.2.1"},
		{name: "a request from a proxy itself", key: xff, peer: "10.0.0.1:80", want: "10.0.0.1"},
		{name: "every hop trusted: the leftmost", key: xff, peer: "10.0.0.1:80",
			xff: []string{"10.0.0.7, 10.0.0.8"}, want: "10.0.0.7"},
		{name: "Forwarded, RFC 7239's example", key: fwd, peer: "10.0.0.1:80",
			fwd:  []string{`for=192.0.2.60;proto=http;by=203.0.113.43, For="[2001:db8:cafe::17]:4711"`},
			want: "2001:db8:cafe::/64"},
		{name: "Forwarded ignores X-Forwarded-For", key: fwd, peer: "10.0.0.1:80",
			xff: []string{"203.0.113.9"}, fwd: []string{"for=192.0.2.60"}, want: "192.0.2.60"},
		{name: "X-Forwarded-For ignores Forwarded", key: xff, peer: "10.0.0.1:80",
			xff: []string{"192.0.2.60"}, fwd: []string{"for=203.0.113.9"}, want: "192.0.2.60"},
		{name: "Forwarded over lines, quoted commas, trusted hops", key: fwd, peer: "10.0.0.1:80",
			fwd: []string{`for=192.0.2.1;host="a,b"`, `for=10.0.0.5;proto=https`}, want: "192.0.2.1"},
		{name: "a /48", key: per48, peer: "10.0.0.1:80",
			xff: []string{"2001:db8:1:2::9"}, want: "2001:db8:1::/48"},
		{name: "every IPv6 address apart", key: each, peer: "[2001:db8::9]:80", want: "2001:db8::9"},
		{name: "a trusted proxy wrote unknown", key: fwd, peer: "10.0.0.1:80",
			fwd: []string{"for=unknown"}, fail: `Forwarded entry "unknown", written by trusted proxy 10.0.0.1, is not an IP address`},
		{name: "a trusted proxy wrote garbage", key: xff, peer: "10.0.0.1:80",
			xff: []string{"192.0.2.1, not-an-ip"}, fail: `X-Forwarded-For entry "not-an-ip"`},
		{name: "an unterminated quoted string", key: fwd, peer: "10.0.0.1:80",
			fwd: []string{`for="192.0.2.1`}, fail: "unterminated"},
		{name: "no IP address in RemoteAddr", key: xff, peer: "example.com:80", fail: "holds no IP address"},
	} {
		req := httptest.NewRequest(http.MethodGet, "/", nil)
		req.RemoteAddr = c.peer
		for _, v := range c.xff {
			req.Header.Add("X-Forwarded-For", v)
		}
		for _, v := range c.fwd {
			req.Header.Add("Forwarded", v)
		}
		got, err := c.key(req)
		if c.fail != "" {
			require.ErrorContains(t, err, c.fail, c.name)
			continue
		}
		require.NoError(t, err, c.name)
		require.Equal(t, c.want, got, c.name)
	}

	for _, c := range []struct {
		cfg  httplimit.ClientIP
		fail string
	}{
		{httplimit.ClientIP{IPv6Prefix: 129}, "IPv6Prefix is 129; it must be between 1 and 128"},
		{httplimit.ClientIP{IPv6Prefix: -1}, "IPv6Prefix is -1"},
		{httplimit.ClientIP{Header: "X-Real-IP"}, `Header is "X-Real-IP"`},
		{httplimit.ClientIP{TrustedProxies: []netip.Prefix{{}}}, "TrustedProxies[0] is not a valid prefix"},
		{httplimit.ClientIP{TrustedProxies: []netip.Prefix{netip.MustParsePrefix("::ffff:10.0.0.0/104")}},
			"IPv4-mapped IPv6 prefix; write IPv4 networks in IPv4 form"},
	} {
		_, err := httplimit.ClientIPKey(c.cfg)
		require.ErrorContains(t, err, c.fail)
	}
}
