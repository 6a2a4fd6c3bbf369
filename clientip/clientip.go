// Package clientip finds the IP address of a client behind trusted reverse
// proxies and turns it into a limit key for httplimit and grpclimit, whose
// ClientIP is this Config: one value configures both.
package clientip

import (
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"strings"
)

// Config says which proxies are trusted and how clients are keyed. The zero
// value keys by the peer's address.
type Config struct {
	// TrustedProxies are the networks of the reverse proxies (load
	// balancers, CDNs, Envoy) in front of the server, whose additions to
	// Header are believed: 10.0.0.0/8, say, or a CDN's published ranges. A
	// request whose peer is in none of them is keyed by the peer, and its
	// Header is ignored, so a client that reaches the server directly
	// cannot choose its key by sending the header itself. Write IPv4
	// networks in IPv4 form. Defaults to none.
	TrustedProxies []netip.Prefix
	// Header is the field (for gRPC, the metadata key, in any case) the
	// proxies append their peer's address to: "X-Forwarded-For" (a
	// comma-separated list of addresses) or "Forwarded" (RFC 7239, the
	// for= parameter of each element). Name the one your proxies write:
	// the other one is whatever the client sent. Defaults to
	// "X-Forwarded-For".
	Header string
	// IPv6Prefix is the length of the prefix an IPv6 client is keyed by:
	// every address in one prefix of that length shares one limit. It must
	// be between 1 and 128; 128 keys every address apart. IPv4 addresses
	// are keyed one by one. Defaults to 64.
	IPv6Prefix int
}

// Keyer keys a client by its address behind the trusted proxies of a
// Config. It is immutable and safe for concurrent use.
type Keyer struct {
	trusted   []netip.Prefix // masked
	forwarded bool           // RFC 7239 Forwarded, else X-Forwarded-For
	ipv6Bits  int            // in [1, 128]
}

// NewKeyer checks c and returns its Keyer. An invalid Config is an error
// naming the field as "ClientIP.Field".
func NewKeyer(c Config) (Keyer, error) {
	bits := c.IPv6Prefix
	if bits == 0 {
		bits = 64
	}
	if bits < 1 || bits > 128 {
		return Keyer{}, fmt.Errorf("ClientIP.IPv6Prefix is %d; it must be between 1 and 128 (or 0 for the default 64)", c.IPv6Prefix)
	}
	var forwarded bool
	switch {
	case c.Header == "" || strings.EqualFold(c.Header, "X-Forwarded-For"):
	case strings.EqualFold(c.Header, "Forwarded"):
		forwarded = true
	default:
		return Keyer{}, fmt.Errorf(`ClientIP.Header is %q; it must be "X-Forwarded-For" or "Forwarded", the field your proxies append to`, c.Header)
	}
	trusted := make([]netip.Prefix, len(c.TrustedProxies))
	for i, p := range c.TrustedProxies {
		switch {
		case !p.IsValid():
			return Keyer{}, fmt.Errorf("ClientIP.TrustedProxies[%d] is not a valid prefix; write it as netip.MustParsePrefix(\"10.0.0.0/8\")", i)
		case p.Addr().Is4In6():
			return Keyer{}, fmt.Errorf("ClientIP.TrustedProxies[%d] is %s, an IPv4-mapped IPv6 prefix; write IPv4 networks in IPv4 form", i, p)
		}
		trusted[i] = p.Masked()
	}
	return Keyer{trusted: trusted, forwarded: forwarded, ipv6Bits: bits}, nil
}

// Header is the field whose values Key walks, in its canonical form.
func (k Keyer) Header() string {
	if k.forwarded {
		return "Forwarded"
	}
	return "X-Forwarded-For"
}

// Key returns the key of the client of a request from peer (the other end
// of the connection) whose Header field has the values given, one per field
// line, in the order received. Values are read only when peer is a trusted
// proxy, and then from the right, up to the first address that is not a
// trusted proxy; when every address is one, the leftmost is the client. An
// address a trusted proxy wrote that is not an IP address, or a Forwarded
// value that cannot be parsed, is an error.
func (k Keyer) Key(peer netip.Addr, values []string) (string, error) {
	client := peer.Unmap().WithZone("")
	if !k.isTrusted(client) {
		return AddrKey(client, k.ipv6Bits), nil
	}
	var hops []string
	if k.forwarded {
		var err error
		if hops, err = forwardedFor(values); err != nil {
			return "", err
		}
	} else {
		for _, v := range values {
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
			return "", fmt.Errorf("%s entry %q, written by trusted proxy %s, is not an IP address", k.Header(), hops[i], client)
		}
		client = a
		if !k.isTrusted(a) {
			break
		}
	}
	return AddrKey(client, k.ipv6Bits), nil
}

func (k Keyer) isTrusted(a netip.Addr) bool {
	return slices.ContainsFunc(k.trusted, func(p netip.Prefix) bool { return p.Contains(a) })
}

// AddrKey is the key of the address a, unmapped and without a zone: an IPv4
// address alone ("192.0.2.1"), an IPv6 address by its prefix of ipv6Bits
// bits ("2001:db8:1:2::/64"), or alone when ipv6Bits is 128. ipv6Bits must
// be between 1 and 128.
func AddrKey(a netip.Addr, ipv6Bits int) string {
	if a.Is4() || ipv6Bits == 128 {
		return a.String()
	}
	p, _ := a.Prefix(ipv6Bits) // cannot fail: a is IPv6 and ipv6Bits in [1, 128]
	return p.String()
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
				return nil, fmt.Errorf("a Forwarded value has a parameter without '=': %q", v)
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
					return nil, errors.New("a Forwarded value has an unterminated quoted string")
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
