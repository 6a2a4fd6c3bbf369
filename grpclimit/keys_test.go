package grpclimit_test

import (
	"context"
	"database/sql"
	"net"
	"testing"

	"github.com/stretchr/testify/require"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
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
// the client is keyed "127.0.0.1", and its third call is denied.
func TestPeerKeyLoopback(t *testing.T) {
	limiter := sqliteLimiter(t, migrated, map[string]txlimit.Config{"api": perMinute(2)}, &txlimit.Options{Clock: frozen})
	testPeerLoopback(t, limiter, "tcp4", "127.0.0.1:0", "127.0.0.1")
	lis, err := net.Listen("tcp6", "[::1]:0")
	if err != nil {
		t.Logf("no IPv6 loopback (%v): the IPv6 half is not run", err)
		return
	}
	_ = lis.Close()
	testPeerLoopback(t, limiter, "tcp6", "[::1]:0", "::/64")
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
	snap, err := limiter.Value(context.Background(), "api", wantKey)
	require.NoError(t, err)
	require.InDelta(t, 0, snap.Value, 1e-9, "the key is not %q", wantKey)
}
