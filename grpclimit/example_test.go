package grpclimit_test

import (
	"context"
	"database/sql"
	"fmt"
	"log"
	"net"
	"os"
	"path/filepath"
	"time"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/grpc/test/bufconn"
	_ "modernc.org/sqlite"

	"github.com/txlimit/txlimit"
	"github.com/txlimit/txlimit/grpclimit"
	"github.com/txlimit/txlimit/migrations"
	"github.com/txlimit/txlimit/sqlitestore"
)

// exampleLimiter opens a limiter on a new SQLite file with limits. Its clock
// stands still so that the output is the same on every run; in production,
// leave Options.Clock unset.
func exampleLimiter(limits map[string]txlimit.Config) (*txlimit.Limiter[*sql.Tx], func()) {
	dir, err := os.MkdirTemp("", "grpclimit-example")
	if err != nil {
		log.Fatal(err)
	}
	db, err := sql.Open("sqlite", "file:"+filepath.Join(dir, "app.db")+
		"?_pragma=busy_timeout(5000)&_pragma=journal_mode(WAL)&_txlock=immediate")
	if err != nil {
		log.Fatal(err)
	}
	if err := migrations.Up(context.Background(), db, migrations.SQLite); err != nil {
		log.Fatal(err)
	}
	limiter, err := txlimit.New(sqlitestore.New(db), limits, &txlimit.Options{
		Clock: func() time.Time { return time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC) },
	})
	if err != nil {
		log.Fatal(err)
	}
	return limiter, func() { _ = db.Close(); _ = os.RemoveAll(dir) }
}

// exampleServer serves the health service with opts in memory and returns a
// client of it.
func exampleServer(opts ...grpc.ServerOption) (healthpb.HealthClient, func()) {
	lis := bufconn.Listen(1 << 20)
	srv := grpc.NewServer(opts...)
	healthpb.RegisterHealthServer(srv, health.NewServer())
	go func() { _ = srv.Serve(lis) }()
	conn, err := grpc.NewClient("passthrough:///bufconn",
		grpc.WithContextDialer(func(ctx context.Context, _ string) (net.Conn, error) { return lis.DialContext(ctx) }),
		grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		log.Fatal(err)
	}
	return healthpb.NewHealthClient(conn), func() { _ = conn.Close(); srv.Stop() }
}

// A limit of 3 calls a minute per tenant, keyed by the x-tenant metadata (in
// production, metadata your auth interceptor has verified). The fourth call
// is denied with ResourceExhausted, a RetryInfo detail and a retry-after
// trailer.
func ExampleNew() {
	limiter, done := exampleLimiter(map[string]txlimit.Config{
		"api": {Kind: txlimit.TokenBucket, Rate: 3, Period: time.Minute},
	})
	defer done()

	lim, err := grpclimit.New(limiter, "api", grpclimit.MetadataKey("x-tenant"), nil)
	if err != nil {
		log.Fatal(err)
	}
	client, stop := exampleServer(
		grpc.ChainUnaryInterceptor(lim.UnaryServerInterceptor()),
		grpc.ChainStreamInterceptor(lim.StreamServerInterceptor()),
	)
	defer stop()

	ctx := metadata.AppendToOutgoingContext(context.Background(), "x-tenant", "acme")
	for i := 1; i <= 4; i++ {
		var trailer metadata.MD
		_, err := client.Check(ctx, &healthpb.HealthCheckRequest{}, grpc.Trailer(&trailer))
		if err == nil {
			fmt.Printf("call %d: OK\n", i)
			continue
		}
		st := status.Convert(err)
		fmt.Printf("call %d: %s: %s\n", i, st.Code(), st.Message())
		for _, d := range st.Details() {
			switch d := d.(type) {
			case *errdetails.RetryInfo:
				fmt.Println("  RetryInfo: retry in", d.GetRetryDelay().AsDuration())
			case *errdetails.QuotaFailure:
				for _, v := range d.GetViolations() {
					fmt.Printf("  QuotaFailure: %s: %s\n", v.GetSubject(), v.GetDescription())
				}
			}
		}
		fmt.Println("  trailer retry-after:", trailer.Get("retry-after"))
	}
	// Output:
	// call 1: OK
	// call 2: OK
	// call 3: OK
	// call 4: ResourceExhausted: rate limit exceeded (api); retry after 20 seconds
	//   RetryInfo: retry in 20s
	//   QuotaFailure: api: rate limit "api" exceeded; retry after 20s
	//   trailer retry-after: [20]
}

// Limits chosen per method: writes cost more than reads, and health checks
// are not limited at all. Every call is also counted against a per-tenant
// limit, all or none.
func ExampleNewAll() {
	limiter, done := exampleLimiter(map[string]txlimit.Config{
		"checks":    {Kind: txlimit.TokenBucket, Rate: 2, Period: time.Minute},
		"lists":     {Kind: txlimit.TokenBucket, Rate: 10, Period: time.Minute},
		"perTenant": {Kind: txlimit.TokenBucket, Rate: 100, Period: time.Minute},
	})
	defer done()

	tenant := grpclimit.MetadataKey("x-tenant")
	lim, err := grpclimit.NewAll(limiter, []grpclimit.Rule{
		{
			Method: func(fullMethod string) string {
				switch fullMethod {
				case "/grpc.health.v1.Health/Check":
					return "checks"
				case "/grpc.health.v1.Health/List":
					return "lists"
				}
				return "" // Watch: no limit of its own
			},
			Key: tenant,
		},
		{Name: "perTenant", Key: tenant},
	}, nil)
	if err != nil {
		log.Fatal(err)
	}
	client, stop := exampleServer(grpc.ChainUnaryInterceptor(lim.UnaryServerInterceptor()))
	defer stop()

	ctx := metadata.AppendToOutgoingContext(context.Background(), "x-tenant", "acme")
	for i := 1; i <= 3; i++ {
		_, err := client.Check(ctx, &healthpb.HealthCheckRequest{})
		fmt.Printf("Check %d: %s\n", i, status.Code(err))
		_, err = client.List(ctx, &healthpb.HealthListRequest{})
		fmt.Printf("List %d: %s\n", i, status.Code(err))
	}
	state, err := limiter.Check(context.Background(), "perTenant", "acme", txlimit.Count(0))
	if err != nil {
		log.Fatal(err)
	}
	fmt.Printf("perTenant: %g of 100 left (the denied Check took nothing)\n", state.Remaining)
	// Output:
	// Check 1: OK
	// List 1: OK
	// Check 2: OK
	// List 2: OK
	// Check 3: ResourceExhausted
	// List 3: OK
	// perTenant: 95 of 100 left (the denied Check took nothing)
}
