package grpclimit_test

import (
	"context"
	"database/sql"
	"fmt"
	"net"
	"net/netip"
	"testing"

	"github.com/stretchr/testify/require"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/status"

	"github.com/txlimit/txlimit"
	"github.com/txlimit/txlimit/grpclimit"
)

// TestPeerKeys: IPv4 addresses key alone, IPv4-mapped IPv6 as IPv4, IPv6
// by /64 (or the prefix given), zones dropped; a peer without an IP address
// is an error.
func TestPeerKeys(t *testing.T) {
	key56, err := grpclimit.PeerPrefixKey(56)
	require.NoError(t, err)
	key128, err := grpclimit.PeerPrefixKey(128)
	require.NoError(t, err)
	for _, tc := range []struct {
		addr              net.Addr
		want, want56, all string
	}{
		{&net.TCPAddr{IP: net.ParseIP("192.0.2.1"), Port: 4711}, "192.0.2.1", "192.0.2.1", "192.0.2.1"},
		{&net.TCPAddr{IP: net.ParseIP("::ffff:192.0.2.1"), Port: 4711}, "192.0.2.1", "192.0.2.1", "192.0.2.1"},
		{&net.TCPAddr{IP: net.ParseIP("2001:db8:1:2::7"), Port: 443}, "2001:db8:1:2::/64", "2001:db8:1::/56", "2001:db8:1:2::7"},
		{&net.TCPAddr{IP: net.ParseIP("2001:db8:1:2:ffff::8"), Port: 443}, "2001:db8:1:2::/64", "2001:db8:1::/56", "2001:db8:1:2:ffff::8"},
		{&net.TCPAddr{IP: net.ParseIP("fe80::1"), Zone: "eth0"}, "fe80::/64", "fe80::/56", "fe80::1"},
		{&net.UDPAddr{IP: net.ParseIP("2001:db8::1"), Port: 53}, "2001:db8::/64", "2001:db8::/56", "2001:db8::1"},
	} {
		ctx := peer.NewContext(context.Background(), &peer.Peer{Addr: tc.addr})
		for kf, want := range map[*grpclimit.KeyFunc]string{nil: tc.want, &key56: tc.want56, &key128: tc.all} {
			f := grpclimit.KeyFunc(grpclimit.PeerKey)
			if kf != nil {
				f = *kf
			}
			got, err := f(ctx, checkMethod, nil)
			require.NoError(t, err, tc.addr)
			require.Equal(t, want, got, tc.addr)
		}
	}

	_, err = grpclimit.PeerKey(context.Background(), checkMethod, nil)
	require.ErrorContains(t, err, "the call's context has no peer")
	unix := peer.NewContext(context.Background(), &peer.Peer{Addr: &net.UnixAddr{Name: "/run/app.sock", Net: "unix"}})
	_, err = grpclimit.PeerKey(unix, checkMethod, nil)
	require.ErrorContains(t, err, `the peer's address "/run/app.sock" (network "unix") is not an IP address`)

	for _, bits := range []int{0, -1, 129} {
		_, err := grpclimit.PeerPrefixKey(bits)
		require.ErrorContains(t, err, "between 1 and 128")
	}
}

// TestPeerKeyLoopback runs a server on a loopback TCP port keyed by PeerKey:
// the client is keyed by its address ("127.0.0.1", and "::/64" over IPv6),
// and its third call is denied. The IPv6 half runs wherever an up loopback
// interface holds ::1, and fails there like any other test; it skips, saying
// so, only on a machine without IPv6 loopback.
func TestPeerKeyLoopback(t *testing.T) {
	limiter := sqliteLimiter(t, migrated, map[string]txlimit.Config{"api": perMinute(2)}, &txlimit.Options{Clock: frozen})
	t.Run("IPv4", func(t *testing.T) {
		testPeerLoopback(t, limiter, "tcp4", "127.0.0.1:0", "127.0.0.1")
	})
	t.Run("IPv6", func(t *testing.T) {
		if why := noIPv6Loopback(); why != "" {
			t.Skipf("SKIPPING the IPv6 half: %s (on Linux, sysctl net.ipv6.conf.lo.disable_ipv6=0 gives lo its ::1)", why)
		}
		testPeerLoopback(t, limiter, "tcp6", "[::1]:0", "::/64")
	})
}

// noIPv6Loopback says why the machine has no IPv6 loopback address, or ""
// when an up loopback interface holds ::1.
func noIPv6Loopback() string {
	ifaces, err := net.Interfaces()
	if err != nil {
		return fmt.Sprintf("the network interfaces cannot be listed: %v", err)
	}
	for _, iface := range ifaces {
		if iface.Flags&net.FlagLoopback == 0 || iface.Flags&net.FlagUp == 0 {
			continue
		}
		addrs, err := iface.Addrs()
		if err != nil {
			return fmt.Sprintf("the addresses of %s cannot be listed: %v", iface.Name, err)
		}
		for _, a := range addrs {
			if ipnet, ok := a.(*net.IPNet); ok && ipnet.IP.Equal(net.IPv6loopback) {
				return ""
			}
		}
	}
	return "no up loopback interface holds ::1"
}

func testPeerLoopback(t *testing.T, limiter *txlimit.Limiter[*sql.Tx], network, addr, wantKey string) {
	t.Helper()
	lim, err := grpclimit.New(limiter, "api", grpclimit.PeerKey, nil)
	require.NoError(t, err)
	lis, err := net.Listen(network, addr)
	require.NoError(t, err)
	srv := grpc.NewServer(interceptors(lim)...)
	healthpb.RegisterHealthServer(srv, health.NewServer())
	go func() { _ = srv.Serve(lis) }()
	defer srv.Stop()
	conn, err := grpc.NewClient(lis.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	require.NoError(t, err)
	defer conn.Close()
	client := healthpb.NewHealthClient(conn)
	for i := range 3 {
		_, err := client.Check(context.Background(), &healthpb.HealthCheckRequest{})
		if i < 2 {
			require.NoError(t, err)
			continue
		}
		require.Equal(t, codes.ResourceExhausted, status.Code(err), "%v", err)
	}
	read, err := limiter.Check(context.Background(), "api", wantKey, txlimit.Count(0))
	require.NoError(t, err)
	require.InDelta(t, 0, read.Remaining, 1e-9, "the key is not %q", wantKey)
}

// TestClientIPKey: behind trusted proxies the client is the first address
// from the right of x-forwarded-for (or forwarded) that is not a proxy; a
// peer that is not a proxy is the client, whatever its metadata says.
func TestClientIPKey(t *testing.T) {
	proxies := []netip.Prefix{netip.MustParsePrefix("10.0.0.0/8"), netip.MustParsePrefix("2001:db8:ffff::/48")}
	xff, err := grpclimit.ClientIPKey(grpclimit.ClientIP{TrustedProxies: proxies})
	require.NoError(t, err)
	fwd, err := grpclimit.ClientIPKey(grpclimit.ClientIP{TrustedProxies: proxies, Header: "Forwarded", IPv6Prefix: 56})
	require.NoError(t, err)
	call := func(peerAddr string, md ...string) context.Context {
		ctx := peer.NewContext(context.Background(), &peer.Peer{Addr: net.TCPAddrFromAddrPort(netip.MustParseAddrPort(peerAddr))})
		return metadata.NewIncomingContext(ctx, metadata.Pairs(md...))
	}
	for _, tc := range []struct {
		key  grpclimit.KeyFunc
		ctx  context.Context
		want string
	}{
		{xff, call("10.1.1.1:5000", "x-forwarded-for", "198.51.100.1, 203.0.113.9, 10.2.2.2"), "203.0.113.9"},
		{xff, call("10.1.1.1:5000", "x-forwarded-for", "198.51.100.1", "x-forwarded-for", "2001:db8:1:2::7, [2001:db8:ffff::1]:443"), "2001:db8:1:2::/64"},
		{xff, call("10.1.1.1:5000"), "10.1.1.1"}, // the proxy itself: a health check
		{xff, call("192.0.2.7:5000", "x-forwarded-for", "203.0.113.9"), "192.0.2.7"},
		{fwd, call("[2001:db8:ffff::2]:443", "forwarded", `for=192.0.2.60;proto=http, for="[2001:db8:1:2::7]"`), "2001:db8:1::/56"},
		{fwd, call("10.1.1.1:5000", "x-forwarded-for", "203.0.113.9"), "10.1.1.1"},
	} {
		got, err := tc.key(tc.ctx, checkMethod, nil)
		require.NoError(t, err)
		require.Equal(t, tc.want, got)
	}
	_, err = xff(call("10.1.1.1:5000", "x-forwarded-for", "unknown"), checkMethod, nil)
	require.ErrorContains(t, err, `"unknown"`)
	_, err = grpclimit.ClientIPKey(grpclimit.ClientIP{IPv6Prefix: 200})
	require.ErrorContains(t, err, "grpclimit: ClientIP.IPv6Prefix is 200")
}

// TestClientIPKeyLoopback: metadata a client sends through a trusted proxy
// (here the loopback network stands for it) reaches the key function.
func TestClientIPKeyLoopback(t *testing.T) {
	limiter := sqliteLimiter(t, migrated, map[string]txlimit.Config{"api": perMinute(2)}, &txlimit.Options{Clock: frozen})
	key, err := grpclimit.ClientIPKey(grpclimit.ClientIP{TrustedProxies: []netip.Prefix{netip.MustParsePrefix("127.0.0.0/8")}})
	require.NoError(t, err)
	lim, err := grpclimit.New(limiter, "api", key, nil)
	require.NoError(t, err)
	lis, err := net.Listen("tcp4", "127.0.0.1:0")
	require.NoError(t, err)
	srv := grpc.NewServer(interceptors(lim)...)
	healthpb.RegisterHealthServer(srv, health.NewServer())
	go func() { _ = srv.Serve(lis) }()
	defer srv.Stop()
	conn, err := grpc.NewClient(lis.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	require.NoError(t, err)
	defer conn.Close()
	ctx := metadata.AppendToOutgoingContext(context.Background(), "x-forwarded-for", "198.51.100.7")
	_, err = healthpb.NewHealthClient(conn).Check(ctx, &healthpb.HealthCheckRequest{})
	require.NoError(t, err)
	read, err := limiter.Check(context.Background(), "api", "198.51.100.7", txlimit.Count(0))
	require.NoError(t, err)
	require.InDelta(t, 1, read.Remaining, 1e-9)
}
