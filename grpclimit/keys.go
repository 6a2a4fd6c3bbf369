package grpclimit

import (
	"context"
	"fmt"
	"net"
	"net/netip"
	"strings"
	"unicode/utf8"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/status"

	"github.com/txlimit/txlimit/clientip"
)

// maxKeyLen is the longest key, in bytes, a txlimit limit takes.
const maxKeyLen = 2048

// PeerKey keys a call by the IP address of its peer (the other end of the
// connection) and trusts no metadata. An IPv4 address is its own key (an
// IPv4 address mapped into IPv6 is written as IPv4), and an IPv6 address is
// keyed by its /64, which is what one host or one subscriber usually gets,
// so a client cannot multiply its limit by picking new addresses from its
// own network: 2001:db8:1:2::7 and 2001:db8:1:2::8 are both keyed
// "2001:db8:1:2::/64". PeerPrefixKey sets another prefix length. A peer
// without an IP address (a Unix socket, an in-memory listener) is an error,
// answered with codes.Internal. Behind a proxy every peer is the proxy: use
// ClientIPKey.
func PeerKey(ctx context.Context, fullMethod string, req any) (string, error) {
	return peerKey64(ctx, fullMethod, req)
}

var peerKey64, _ = PeerPrefixKey(64)

// PeerPrefixKey returns a KeyFunc that keys a call by its peer's IP address,
// as PeerKey does, with IPv6 addresses grouped by prefixes of ipv6Bits bits:
// 56 or 48 for a network per site, 128 to key every address apart. ipv6Bits
// must be between 1 and 128.
func PeerPrefixKey(ipv6Bits int) (KeyFunc, error) {
	if ipv6Bits < 1 || ipv6Bits > 128 {
		return nil, fmt.Errorf("grpclimit: PeerPrefixKey(%d): the IPv6 prefix length must be between 1 and 128 (64 is PeerKey's)", ipv6Bits)
	}
	return func(ctx context.Context, _ string, _ any) (string, error) {
		p, ok := peer.FromContext(ctx)
		if !ok || p.Addr == nil {
			return "", fmt.Errorf("grpclimit: the call's context has no peer; PeerKey runs in a server interceptor")
		}
		a, err := peerAddr(p.Addr)
		if err != nil {
			return "", err
		}
		return clientip.AddrKey(a, ipv6Bits), nil
	}, nil
}

// ClientIP configures the KeyFunc ClientIPKey returns, as it does
// httplimit.ClientIPKey for HTTP (see clientip.Config for the fields): it
// is the same type, so a server that answers HTTP and gRPC behind the same
// proxies configures both with one value. For gRPC, Header names the
// metadata key the proxies write (in any case: gRPC metadata keys are lower
// case). The zero value keys by the peer's address, as PeerKey does.
type ClientIP = clientip.Config

// ClientIPKey returns a KeyFunc that keys a call by the IP address of its
// client behind the trusted proxies in front of the server, as
// httplimit.ClientIPKey does for HTTP requests: when the peer is not one of
// c.TrustedProxies, the peer is the client and its metadata is ignored; when
// it is, the key function walks the x-forwarded-for metadata (or forwarded,
// when c.Header is "Forwarded") from the right and takes the first address
// that is not a trusted proxy; when every address is a trusted proxy, the
// leftmost one is the client. The key is written as PeerKey writes it, IPv6
// grouped by c.IPv6Prefix (default 64). An invalid ClientIP is an error that
// names the field; an entry a trusted proxy wrote that is not an IP address
// is an error, answered with codes.Internal.
func ClientIPKey(c ClientIP) (KeyFunc, error) {
	keyer, err := clientip.NewKeyer(c)
	if err != nil {
		return nil, fmt.Errorf("grpclimit: %w", err)
	}
	mdKey := strings.ToLower(keyer.Header())
	return func(ctx context.Context, _ string, _ any) (string, error) {
		p, ok := peer.FromContext(ctx)
		if !ok || p.Addr == nil {
			return "", fmt.Errorf("grpclimit: the call's context has no peer; ClientIPKey runs in a server interceptor")
		}
		a, err := peerAddr(p.Addr)
		if err != nil {
			return "", err
		}
		md, _ := metadata.FromIncomingContext(ctx)
		key, err := keyer.Key(a, md.Get(mdKey))
		if err != nil {
			return "", fmt.Errorf("grpclimit: %w", err)
		}
		return key, nil
	}, nil
}

// peerAddr returns the IP address of addr, unmapped and without a zone.
func peerAddr(addr net.Addr) (netip.Addr, error) {
	var a netip.Addr
	switch t := addr.(type) {
	case *net.TCPAddr:
		a = t.AddrPort().Addr()
	default:
		ap, err := netip.ParseAddrPort(addr.String())
		if err == nil {
			a = ap.Addr()
		} else if a, err = netip.ParseAddr(addr.String()); err != nil {
			return netip.Addr{}, fmt.Errorf("grpclimit: the peer's address %q (network %q) is not an IP address; key by something else than PeerKey", addr.String(), addr.Network())
		}
	}
	if !a.IsValid() {
		return netip.Addr{}, fmt.Errorf("grpclimit: the peer's address %q has no IP address", addr.String())
	}
	return a.Unmap().WithZone(""), nil
}

// MetadataKey returns a KeyFunc that keys a call by the value of the
// incoming metadata key name (a header the client sent, the name
// case-insensitive). Key only by metadata the server has verified (an API key
// your auth interceptor has checked, a tenant header your gateway sets):
// a client that chooses its key chooses its limit.
//
// A call without the key, with an empty value, with more than one value (the
// value to check would be ambiguous) or with a value that is no valid limit
// key (longer than maxKeyLen, 2048 bytes, not UTF-8, holding a NUL) ends
// with codes.InvalidArgument, naming the key.
func MetadataKey(name string) KeyFunc {
	name = strings.ToLower(name)
	return func(ctx context.Context, _ string, _ any) (string, error) {
		md, _ := metadata.FromIncomingContext(ctx)
		vals := md.Get(name)
		switch {
		case len(vals) == 0 || vals[0] == "":
			return "", status.Errorf(codes.InvalidArgument, "missing metadata %q, which the rate limit is keyed by", name)
		case len(vals) > 1:
			return "", status.Errorf(codes.InvalidArgument, "metadata %q is given %d times; the rate limit is keyed by one value", name, len(vals))
		case len(vals[0]) > maxKeyLen:
			return "", status.Errorf(codes.InvalidArgument, "metadata %q is %d bytes long; the rate limit takes at most %d", name, len(vals[0]), maxKeyLen)
		case !utf8.ValidString(vals[0]) || strings.IndexByte(vals[0], 0) >= 0:
			return "", status.Errorf(codes.InvalidArgument, "metadata %q is not valid UTF-8 text", name)
		}
		return vals[0], nil
	}
}
