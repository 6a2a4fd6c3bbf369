package httplimit_test

import (
	"net/http"
	"net/http/httptest"
	"net/netip"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/txlimit/txlimit/httplimit"
)

// TestClientIPKey: the key function reads the peer from r.RemoteAddr and
// the addresses from the header field it was configured with. The walk
// through the proxies and the checks of a ClientIP are clientip's,
// tested there.
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

	for _, c := range []struct {
		name       string
		key        httplimit.KeyFunc
		peer       string
		xff, fwd   []string
		want, fail string
	}{
		{name: "an untrusted peer's header is ignored", key: xff, peer: "198.51.100.7:5000",
			xff: []string{"203.0.113.9"}, want: "198.51.100.7"},
		{name: "two proxies, two header lines, ports", key: xff, peer: "10.1.2.3:80",
			xff: []string{"1.1.1.1, 192.0.2.1:4711", "10.9.9.9"}, want: "192.0.2.1"},
		{name: "an IPv6 peer", key: xff, peer: "[2001:db8:ffff::1]:443",
			xff: []string{"2001:db8:1:2:3:4:5:6"}, want: "2001:db8:1:2::/64"},
		{name: "IPv4-mapped IPv6 is IPv4, peer and hops", key: xff, peer: "[::ffff:10.0.0.1]:80",
			xff: []string{"::ffff:192.0.2.1, ::ffff:10.0.0.2"}, want: "192.0.2.1"},
		{name: "a RemoteAddr without a port", key: xff, peer: "198.51.100.7", want: "198.51.100.7"},
		{name: "Forwarded ignores X-Forwarded-For", key: fwd, peer: "10.0.0.1:80",
			xff: []string{"203.0.113.9"}, fwd: []string{"for=192.0.2.60"}, want: "192.0.2.60"},
		{name: "X-Forwarded-For ignores Forwarded", key: xff, peer: "10.0.0.1:80",
			xff: []string{"192.0.2.60"}, fwd: []string{"for=203.0.113.9"}, want: "192.0.2.60"},
		{name: "a trusted proxy wrote unknown", key: fwd, peer: "10.0.0.1:80",
			fwd: []string{"for=unknown"}, fail: `httplimit: Forwarded entry "unknown", written by trusted proxy 10.0.0.1, is not an IP address`},
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

	_, err = httplimit.ClientIPKey(httplimit.ClientIP{IPv6Prefix: 129})
	require.ErrorContains(t, err, "httplimit: ClientIP.IPv6Prefix is 129; it must be between 1 and 128")
}
