package httplimit

import (
	"fmt"
	"net"
	"net/http"
	"net/netip"

	"github.com/txlimit/txlimit/clientip"
)

// KeyFunc returns the limit key of a request. An error stops the request:
// Options.Error answers it.
type KeyFunc func(r *http.Request) (string, error)

// RemoteAddrKey keys a request by the IP address of its peer, the host of
// r.RemoteAddr, and trusts no header. It is ClientIPKey with no trusted
// proxies and the default prefix: an IPv4 address is its own key (an IPv4
// address mapped into IPv6 is written as IPv4), and an IPv6 address is keyed
// by its /64, which is what one host or one subscriber usually gets, so a
// client cannot multiply its limit by picking new addresses from its own
// network. Behind a reverse proxy every peer is the proxy: use ClientIPKey.
func RemoteAddrKey(r *http.Request) (string, error) {
	return remoteAddrKey(r)
}

var remoteAddrKey, _ = ClientIPKey(ClientIP{})

// ClientIP configures the KeyFunc ClientIPKey returns: the trusted proxies,
// the header they write and the IPv6 prefix a client is keyed by (see
// clientip.Config for the fields). grpclimit.ClientIP is the same type. The
// zero value keys by the peer's address, as RemoteAddrKey does.
type ClientIP = clientip.Config

// ClientIPKey returns a KeyFunc that keys a request by the IP address of its
// client, found through the trusted proxies in front of the server.
//
// When the peer (the host of r.RemoteAddr) is not a trusted proxy, the peer
// is the client. When it is, the key function walks the addresses in Header
// from the right (the last one was added by the proxy nearest the server) and
// takes the first that is not a trusted proxy: every address to its right was
// written by a proxy that is trusted, and the ones to its left were written
// by the client or by proxies nobody vouches for, so they are never read.
// When every address is a trusted proxy (a request from a proxy itself, or
// no header), the leftmost one is the client. An address a trusted proxy
// wrote that is not an IP address ("unknown", an obfuscated node of RFC
// 7239) is an error.
//
// The key is the client's address, IPv4-mapped IPv6 written as IPv4 and an
// IPv6 zone dropped, with IPv6 addresses grouped by IPv6Prefix: for the
// default /64, 2001:db8:1:2::7 and 2001:db8:1:2::8 are both keyed
// "2001:db8:1:2::/64". An IPv4 key is the address alone ("192.0.2.1").
//
// An invalid ClientIP is an error that names the field.
func ClientIPKey(c ClientIP) (KeyFunc, error) {
	keyer, err := clientip.NewKeyer(c)
	if err != nil {
		return nil, fmt.Errorf("httplimit: %w", err)
	}
	header := keyer.Header()
	return func(r *http.Request) (string, error) {
		host := r.RemoteAddr
		if h, _, err := net.SplitHostPort(r.RemoteAddr); err == nil {
			host = h
		}
		peer, err := netip.ParseAddr(host)
		if err != nil {
			return "", fmt.Errorf("httplimit: RemoteAddr %q holds no IP address: %w", r.RemoteAddr, err)
		}
		key, err := keyer.Key(peer, r.Header.Values(header))
		if err != nil {
			return "", fmt.Errorf("httplimit: %w", err)
		}
		return key, nil
	}, nil
}
