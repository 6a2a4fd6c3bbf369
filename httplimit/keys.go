package httplimit

import (
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/netip"
	"strings"
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

// ClientIP configures the KeyFunc ClientIPKey returns. The zero value keys
// by the peer's address, as RemoteAddrKey does.
type ClientIP struct {
	// TrustedProxies are the networks of the reverse proxies (load
	// balancers, CDNs) in front of the server, whose additions to Header
	// are believed: 10.0.0.0/8, say, or a CDN's published ranges. A
	// request whose peer is in none of them is keyed by the peer, and its
	// Header is ignored, so a client that reaches the server directly
	// cannot choose its key by sending the header itself. Write IPv4
	// networks in IPv4 form. Defaults to none.
	TrustedProxies []netip.Prefix
	// Header is the field the proxies append their peer's address to:
	// "X-Forwarded-For" (a comma-separated list of addresses) or
	// "Forwarded" (RFC 7239, the for= parameter of each element). Name the
	// one your proxies write: the other one is whatever the client sent.
	// Defaults to "X-Forwarded-For".
	Header string
	// IPv6Prefix is the length of the prefix an IPv6 client is keyed by:
	// every address in one prefix of that length shares one limit. It must
	// be between 1 and 128; 128 keys every address apart. IPv4 addresses
	// are keyed one by one. Defaults to 64.
	IPv6Prefix int
}

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
	bits := c.IPv6Prefix
	if bits == 0 {
		bits = 64
	}
	if bits < 1 || bits > 128 {
		return nil, fmt.Errorf("httplimit: ClientIP.IPv6Prefix is %d; it must be between 1 and 128 (or 0 for the default 64)", c.IPv6Prefix)
	}
	var forwarded bool
	switch {
	case c.Header == "" || strings.EqualFold(c.Header, "X-Forwarded-For"):
	case strings.EqualFold(c.Header, "Forwarded"):
		forwarded = true
	default:
		return nil, fmt.Errorf(`httplimit: ClientIP.Header is %q; it must be "X-Forwarded-For" or "Forwarded", the field your proxies append to`, c.Header)
	}
	trusted := make([]netip.Prefix, len(c.TrustedProxies))
	for i, p := range c.TrustedProxies {
		switch {
		case !p.IsValid():
			return nil, fmt.Errorf("httplimit: ClientIP.TrustedProxies[%d] is not a valid prefix; write it as netip.MustParsePrefix(\"10.0.0.0/8\")", i)
		case p.Addr().Is4In6():
			return nil, fmt.Errorf("httplimit: ClientIP.TrustedProxies[%d] is %s, an IPv4-mapped IPv6 prefix; write IPv4 networks in IPv4 form", i, p)
		}
		trusted[i] = p.Masked()
	}
	isTrusted := func(a netip.Addr) bool {
		for _, p := range trusted {
			if p.Contains(a) {
				return true
			}
		}
		return false
	}
	key := func(a netip.Addr) string {
		if a.Is4() || bits == 128 {
			return a.String()
		}
		p, _ := a.Prefix(bits) // cannot fail: a is IPv6 and bits in [1, 128]
		return p.String()
	}
	return func(r *http.Request) (string, error) {
		host := r.RemoteAddr
		if h, _, err := net.SplitHostPort(r.RemoteAddr); err == nil {
			host = h
		}
		client, err := netip.ParseAddr(host)
		if err != nil {
			return "", fmt.Errorf("httplimit: RemoteAddr %q holds no IP address: %w", r.RemoteAddr, err)
		}
		client = client.Unmap().WithZone("")
		if !isTrusted(client) {
			return key(client), nil
		}
		var hops []string
		if forwarded {
			hops, err = forwardedFor(r.Header.Values("Forwarded"))
			if err != nil {
				return "", err
			}
		} else {
			for _, v := range r.Header.Values("X-Forwarded-For") {
				for _, hop := range strings.Split(v, ",") {
					if hop = strings.TrimSpace(hop); hop != "" {
						hops = append(hops, hop)
					}
				}
			}
		}
		for i := len(hops) - 1; i >= 0; i-- {
			a, ok := parseNode(hops[i])
			if !ok {
				return "", fmt.Errorf("httplimit: %s entry %q, written by trusted proxy %s, is not an IP address", headerName(forwarded), hops[i], client)
			}
			client = a
			if !isTrusted(a) {
				break
			}
		}
		return key(client), nil
	}, nil
}

func headerName(forwarded bool) string {
	if forwarded {
		return "Forwarded"
	}
	return "X-Forwarded-For"
}

// parseNode parses an address as proxies write it: 192.0.2.1,
// 192.0.2.1:8080, 2001:db8::1, [2001:db8::1] or [2001:db8::1]:443. It
// returns the address unmapped and without a zone.
func parseNode(s string) (netip.Addr, bool) {
	a, err := netip.ParseAddr(s)
	if err != nil {
		ap, perr := netip.ParseAddrPort(s)
		if perr != nil {
			if len(s) < 2 || s[0] != '[' || s[len(s)-1] != ']' {
				return netip.Addr{}, false
			}
			if a, err = netip.ParseAddr(s[1 : len(s)-1]); err != nil || !a.Is6() {
				return netip.Addr{}, false
			}
		} else {
			a = ap.Addr()
		}
	}
	return a.Unmap().WithZone(""), true
}

// forwardedFor returns the for= value of each element of the Forwarded
// field values (RFC 7239), left to right, "" for an element without one.
func forwardedFor(values []string) ([]string, error) {
	var nodes []string
	for _, v := range values {
		node, inElement := "", false
		for i := 0; ; {
			for i < len(v) && (v[i] == ' ' || v[i] == '\t') {
				i++
			}
			if i == len(v) {
				break
			}
			switch v[i] {
			case ',':
				if inElement {
					nodes = append(nodes, node)
				}
				node, inElement = "", false
				i++
				continue
			case ';':
				i++
				continue
			}
			eq := strings.IndexByte(v[i:], '=')
			if eq < 0 {
				return nil, fmt.Errorf("httplimit: Forwarded %q: a parameter without '='", v)
			}
			name := strings.TrimSpace(v[i : i+eq])
			i += eq + 1
			var value string
			if i < len(v) && v[i] == '"' {
				var b strings.Builder
				for i++; i < len(v) && v[i] != '"'; i++ {
					if v[i] == '\\' && i+1 < len(v) {
						i++
					}
					b.WriteByte(v[i])
				}
				if i == len(v) {
					return nil, errors.New("httplimit: Forwarded: an unterminated quoted string")
				}
				i++
				value = b.String()
			} else {
				j := i
				for j < len(v) && v[j] != ';' && v[j] != ',' {
					j++
				}
				value = strings.TrimSpace(v[i:j])
				i = j
			}
			if strings.EqualFold(name, "for") {
				node = value
			}
			inElement = true
		}
		if inElement {
			nodes = append(nodes, node)
		}
	}
	return nodes, nil
}
